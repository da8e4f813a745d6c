"""``htp-retrieval bench``: cost of each method against the raw forward pass, in one run.

For each length setting (SciFact documents truncated to 512 tokens, and long documents of
2k/8k/32k tokens built from real text), one process times, on the same texts and with the
same batching:

* ``raw``: the transformer body alone (``base_model(model)``, i.e. ``model.model``) on
  the vanilla-mean token batches (right padding), with its layer list cut to the methods'
  exit layer L' (no hooks, no pooling, ids already on the device, no padding mask: in a
  causal model real tokens never attend to the right padding after them, so this is the
  cheapest exact forward): the physical limit;
* ``raw-full``: the same at full depth (optional);
* ``raw-masked``: as ``raw`` with Hugging Face's padding mask (optional; what a plain
  ``model.model(input_ids, attention_mask)`` call costs);
* ``raw@<method>``: as ``raw`` on that method's own batches (placeholders and templates
  included; optional): the floor that its token count sets, so ``<method> / raw@<method>``
  is the implementation's own overhead;
* every requested method through :meth:`HTPEncoder.encode` (tokenization, segmentation,
  layout, forward, copies and pooling included).

Methods are warmed up, then interleaved (the order rotates every repeat) and the median of
the repeats is kept. Peak memory is measured per method in a fresh subprocess
(``--worker``), so allocator state never leaks from one method to the next. After loading
and a 200-character warm-up, on CPU it is the peak of the anonymous resident memory
(sampled every millisecond; memory-mapped weights left out) minus its level before the
run, with the kernel's ``VmHWM`` peak of the whole resident set kept beside it; on CUDA,
``torch.cuda.max_memory_allocated`` minus the allocation before the run.
Where time goes comes from :class:`~htp_retrieval.pipeline.EncodeStats` (tokenization,
segmentation, layout, forward, copy hooks, pooling) and, with ``--profile``, from
``torch.profiler`` (top operators and the ``htp.*`` regions).

The result is one JSON (config, versions, per-method figures, ratios, target checks) and a
plot of time and memory against length, written next to each other.

Source of the targets: HTP (Ding et al., ACL 2026) reports HTP at 1.18x vanilla time and
1.12x memory, Echo at 3.45x / 4.00x; this library's targets are HTP <= 1.05x / 1.10x, vanilla-mean
>= 0.95x the raw forward's throughput, Echo <= 2.1x, preparation < 5% and padding < 10%.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from htp_retrieval.dtypes import DTypeArg, resolve_dtype
from htp_retrieval.files import atomic_write
from htp_retrieval.models import pick_device

LongSource = Literal["scifact", "essays"]
"""Text of the long documents: concatenated SciFact documents or Paul Graham essays."""
RAW = "raw"
RAW_FULL = "raw-full"
RAW_MASKED = "raw-masked"
RAW_METHODS = (RAW, RAW_FULL, RAW_MASKED)
RAW_ON = "raw@"
"""``raw@<method>``: the raw forward on that method's own batches (its token floor)."""


ST_MEAN = "st-mean"
"""The sentence-transformers peer: ``SentenceTransformer([models.Transformer(same weights),
models.Pooling("mean")])`` over the same texts, what a user would run instead of
vanilla-mean (full depth, plain text without a chat template, its own padding mask)."""


VARIANT = "~"
"""``<method>~<options>``: the method with other speed-only settings (same vectors up to
batch-shape rounding): ``sync`` (no pipeline thread), ``pipe`` (pipeline thread),
``w<N>`` (``prepare_window=N``), ``wa`` (``prepare_window="auto"``), ``p<N>``
(``prepare_workers=N``: layout in N worker processes) and ``pa``
(``prepare_workers="auto"``); e.g. ``htp~pipewa``, ``htp~p8``."""

_VARIANT_OPTION = re.compile(r"sync|pipe|wa|w\d+|pa|p\d+")


def parse_variant(name: str) -> tuple[str, dict[str, Any]]:
    """Split an entry name into its method and the :class:`HTPEncoder` speed settings of
    its ``~`` options (:data:`VARIANT`).

    Returns:
        ``(method, settings)``, e.g. ``("htp", {"pipeline": True, "prepare_window": 64})``
        for ``htp~pipew64``; ``(name, {})`` without ``~``.

    Raises:
        ValueError: for an option that is not ``sync``, ``pipe``, ``w<N>``, ``wa``,
            ``p<N>`` or ``pa``.
    """
    if VARIANT not in name:
        return name, {}
    method, opts = name.split(VARIANT, 1)
    parts = _VARIANT_OPTION.findall(opts)
    if "".join(parts) != opts or not parts:
        raise ValueError(f"bench entry {name!r}: options after '~' are sync, pipe (the "
                         "pipeline thread), w<N> and wa (prepare_window), p<N> and pa "
                         "(prepare_workers), e.g. htp~pipewa or htp~p8")
    out: dict[str, Any] = {}
    for part in parts:
        if part in ("sync", "pipe"):
            out["pipeline"] = part == "pipe"
        elif part == "wa":
            out["prepare_window"] = "auto"
        elif part == "pa":
            out["prepare_workers"] = "auto"
        elif part.startswith("p"):
            out["prepare_workers"] = int(part[1:])
        else:
            out["prepare_window"] = int(part[1:])
    return method, out


def is_external(name: str) -> bool:
    """Whether ``name`` is a peer library's entry (not an :class:`HTPEncoder` method)."""
    return name == ST_MEAN


def is_raw(name: str) -> bool:
    """Whether ``name`` is a forward-only entry (``raw``, ``raw-full``, ``raw-masked``,
    ``raw@<method>``)."""
    return name in RAW_METHODS or name.startswith(RAW_ON)


def raw_source(name: str) -> str:
    """The method whose batches a raw entry runs on (vanilla-mean unless ``raw@<method>``)."""
    return name[len(RAW_ON):] if name.startswith(RAW_ON) else "vanilla-mean"
DEFAULT_METHODS = "raw,vanilla-mean,echo-mean,tp-mean,htp"
DEFAULT_DATA = "../shared/data/beir/scifact"
DEFAULT_ESSAYS = "../shared/data/haystack/paul_graham_essays"
SHORT_LENGTH = 512


# ----------------------------------------------------------------------------- texts
@dataclass
class Setting:
    """One length setting: the texts every method embeds.

    Attributes:
        length: Maximum text tokens per text (the encoders' ``max_length``).
        source: Where the texts come from (``scifact`` documents, or ``scifact``/``essays``
            concatenations for long settings).
        texts: The texts, ``[n_texts]``.
    """

    length: int
    source: str
    texts: list[str]


def scifact_documents(data: str | os.PathLike[str], limit: int | None = None) -> list[str]:
    """SciFact (BEIR) documents as ``title + " " + text``, in ``corpus.jsonl`` order.

    Args:
        data: BEIR folder holding ``corpus.jsonl`` (or the file itself).
        limit: Documents to read (``None``: all).

    Raises:
        FileNotFoundError: if ``corpus.jsonl`` is missing.
    """
    path = Path(data)
    if path.is_dir():
        path = path / "corpus.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"BEIR corpus not found: {path}")
    out: list[str] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            text = f"{row.get('title') or ''} {row.get('text') or ''}".strip()
            if text:
                out.append(text)
            if limit is not None and len(out) >= limit:
                break
    return out


def essay_documents(folder: str | os.PathLike[str]) -> list[str]:
    """The Paul Graham essays (``*.txt``), in sorted file-name order.

    Raises:
        FileNotFoundError: if the folder holds no ``.txt`` file.
    """
    files = sorted(Path(folder).glob("*.txt"))
    if not files:
        raise FileNotFoundError(f"no .txt essays in {folder}")
    return [t for t in (p.read_text(encoding="utf-8").strip() for p in files) if t]


def long_documents(
    pieces: Sequence[str], tokenizer: Any, *, length: int, n: int
) -> list[str]:
    """Build ``n`` documents of at least ``length`` tokens by concatenating ``pieces``.

    Deterministic: document ``j`` continues where document ``j - 1`` stopped, cycling
    through ``pieces`` (joined by blank lines). Each document gets pieces until the
    tokenizer counts at least ``length`` tokens; the encoder then truncates it to exactly
    ``length`` text tokens.

    Args:
        pieces: Source texts (SciFact documents or essays), in a fixed order.
        tokenizer: The model's tokenizer (tokens are counted with it).
        length: Target length in tokens.
        n: Number of documents.

    Raises:
        ValueError: if ``pieces`` is empty or ``length``/``n`` is below 1.
    """
    if not pieces or length < 1 or n < 1:
        raise ValueError("long_documents needs pieces, length >= 1 and n >= 1")
    counts = [len(ids) for ids in tokenizer(list(pieces), add_special_tokens=False).input_ids]
    docs: list[str] = []
    i = 0
    for _ in range(n):
        parts: list[str] = []
        total = 0
        while total < length + 16:  # a little slack: joining can merge tokens
            parts.append(pieces[i % len(pieces)])
            total += counts[i % len(pieces)] + 2
            i += 1
        docs.append("\n\n".join(parts))
    return docs


def build_settings(
    *,
    lengths: Sequence[int],
    tokenizer: Any,
    data: str | os.PathLike[str],
    n_docs: int,
    long_docs: int = 0,
    long_source: LongSource = "scifact",
    essays: str | os.PathLike[str] = DEFAULT_ESSAYS,
) -> list[Setting]:
    """The texts of every length setting.

    A length of at most 512 uses the first ``n_docs`` SciFact documents (truncated to the
    length by the encoder). Longer settings use ``long_docs`` documents built by
    :func:`long_documents`; ``long_docs = 0`` picks ``max(1, n_docs * 512 // length)``, so
    every setting holds about the same number of text tokens.

    Raises:
        ValueError: for a length below 1 or ``n_docs`` below 1.
        FileNotFoundError: if the data is missing.
    """
    if n_docs < 1 or any(length < 1 for length in lengths):
        raise ValueError("n_docs and every length must be >= 1")
    short = scifact_documents(data, n_docs)
    pieces: list[str] | None = None
    out = []
    for length in lengths:
        if length <= SHORT_LENGTH:
            out.append(Setting(length, "scifact", short))
            continue
        if pieces is None:
            pieces = (essay_documents(essays) if long_source == "essays"
                      else scifact_documents(data))
        n = long_docs or max(1, n_docs * SHORT_LENGTH // length)
        out.append(Setting(length, long_source, long_documents(pieces, tokenizer, length=length,
                                                               n=n)))
    return out


# ----------------------------------------------------------------------------- raw forward
def _sync(device: str) -> None:
    """Wait for every GPU (a ``device_map`` model may span several)."""
    if device.startswith("cuda"):
        import torch

        for i in range(torch.cuda.device_count()):
            torch.cuda.synchronize(i)


def raw_batches(encoder: Any, texts: Sequence[str]) -> list[tuple[Any, Any]]:
    """Padded ``(input_ids, attention_mask)`` batches, each ``[rows, width]``, on the device.

    The batches are those :meth:`HTPEncoder.encode` makes for ``encoder`` (a vanilla-mean
    encoder for ``raw``: BOS + text, right padding), so the raw forward sees exactly the
    same rows, widths and padding. Placeholder ids (outside the embedding matrix, whose
    weights are never resized) are clamped to its last row: the cost is the same.
    """
    import torch

    layouts = encoder.build_layouts(list(texts))
    lengths = [len(lay) for lay in layouts]
    batches = encoder._batches(lengths, encoder.batch_size,
                               max(encoder.max_tokens_per_batch, max(lengths)))
    emb = encoder.model.get_input_embeddings().weight
    dev, top = emb.device, emb.shape[0] - 1
    pad = encoder.tokenizer.pad_token_id or 0
    out = []
    for idx in batches:
        width = max(lengths[i] for i in idx)
        rows = [list(layouts[i].input_ids) for i in idx]
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.long)
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows],
                            dtype=torch.long)
        out.append((ids.clamp(max=top).to(dev), mask.to(dev)))
    return out


@contextlib.contextmanager
def cut_layers(model: Any, n_layers: int) -> Iterator[None]:
    """Temporarily keep only the first ``n_layers`` decoder layers of ``model``'s body."""
    from torch import nn

    from htp_retrieval.rewiring import base_model

    body = base_model(model)
    layers = body.layers
    body.layers = nn.ModuleList(list(layers)[:n_layers])
    try:
        yield
    finally:
        body.layers = layers


def raw_forward(
    model: Any, batches: Sequence[tuple[Any, Any]], *, n_layers: int, masked: bool = False
) -> None:
    """Run the body (``model.model``) on prepared batches, ``n_layers`` layers deep.

    No hooks, no placeholders, no pooling: the forward pass alone (the final norm runs
    too, as the body always applies it).

    Args:
        model: Causal LM or its body.
        batches: ``(input_ids, attention_mask)`` pairs, each ``[rows, width]``, right-padded.
        n_layers: Decoder layers to run.
        masked: Pass the padding mask (``False``: the plain causal mask, exact at every
            real position for right padding).
    """
    import torch

    from htp_retrieval.rewiring import base_model

    body = base_model(model)
    with torch.inference_mode(), cut_layers(model, n_layers), \
            torch.profiler.record_function("raw.forward"):
        for ids, mask in batches:
            body(input_ids=ids, attention_mask=mask if masked else None, use_cache=False)


def sentence_transformer(model: str, *, device: str, dtype: str, max_length: int) -> Any:
    """The sentence-transformers peer of vanilla-mean: the same weights, mean pooling.

    ``SentenceTransformer([models.Transformer(path), models.Pooling(dim, "mean")])`` on the
    model's local directory (a packaged model's converted safetensors), in ``dtype`` with
    SDPA attention, on plain text (no chat template), at full depth, truncating to
    ``max_length`` tokens.

    Raises:
        ImportError: if sentence-transformers is missing.
    """
    import torch

    from htp_retrieval.models import resolve_model_path

    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("the st-mean entry needs sentence-transformers: "
                          "pip install sentence-transformers") from e
    try:  # sentence-transformers >= 6
        from sentence_transformers.sentence_transformer import modules as models
    except ImportError:  # pragma: no cover - older releases
        from sentence_transformers import models  # type: ignore[no-redef]
    path, _ = resolve_model_path(model)
    kw: dict[str, Any] = {"model_kwargs": {"dtype": getattr(torch, dtype),
                                           "attn_implementation": "sdpa"},
                          "max_seq_length": max_length}
    try:  # sentence-transformers >= 6: plain text, not the chat template of an instruct model
        word = models.Transformer(
            path, modality_config={"text": {"method": "forward",
                                            "method_output_name": "last_hidden_state"}},
            module_output_name="token_embeddings", **kw)
        dim = word.get_embedding_dimension()
    except TypeError:  # pragma: no cover - sentence-transformers < 6
        word = models.Transformer(path, max_seq_length=max_length,
                                  model_args={"torch_dtype": getattr(torch, dtype),
                                              "attn_implementation": "sdpa"})
        dim = word.get_word_embedding_dimension()
    tok = word.tokenizer
    if getattr(tok, "pad_token", None) is None:  # pragma: no cover - model dependent
        tok.pad_token = tok.eos_token
    return SentenceTransformer(modules=[word, models.Pooling(dim, pooling_mode="mean")],
                               device=device).eval()


# ----------------------------------------------------------------------------- measurement
@dataclass
class Run:
    """One timed run of one method on one setting.

    Attributes:
        seconds: Wall time, in seconds.
        cpu_seconds: Process CPU time, in seconds.
        stats: The encoder's ``EncodeStats`` as a dict (empty for the raw forward).
    """

    seconds: float
    cpu_seconds: float
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass
class MethodFigures:
    """Figures of one method on one setting (medians over the repeats).

    Attributes:
        method: Method name (``raw``/``raw-full`` for the forward pass alone).
        seconds: Wall time of each repeat, in seconds.
        median_seconds: Median of ``seconds``.
        cpu_seconds: Median process CPU time, in seconds.
        text_tokens: Text tokens embedded (one copy per text).
        input_tokens: Tokens fed to the model (placeholders and templates included).
        padded_tokens: Slots of the padded batches (rows x width, summed).
        padding_fraction: ``1 - input_tokens / padded_tokens``.
        tokens_per_second: ``text_tokens / median_seconds``.
        breakdown: Median seconds of ``tokenize``, ``segment``, ``layout``, ``prepare``,
            ``forward``, ``copies``, ``pool``, ``inputs`` (batch tensors) and ``wait`` (the
            forward loop waiting for prepared batches) from ``EncodeStats``.
        n_batches: Batches per run.
        peak_memory_bytes: Peak memory above the post-load level, in bytes (``None`` when
            not measured).
        memory_probe: How memory was measured (``anon-rss-sampling``, ``VmHWM``,
            ``rss-sampling``, ``cuda``).
        rss_hwm_bytes: CPU only: the kernel's peak of the whole resident set (file-backed
            pages included) above the post-load level, in bytes.
        profile: ``--profile`` summary (regions and top operators), else empty.
    """

    method: str
    seconds: list[float]
    median_seconds: float
    cpu_seconds: float
    text_tokens: int
    input_tokens: int
    padded_tokens: int
    padding_fraction: float
    tokens_per_second: float
    breakdown: dict[str, float]
    n_batches: int
    peak_memory_bytes: int | None = None
    memory_probe: str = ""
    rss_hwm_bytes: int | None = None
    profile: dict[str, Any] = field(default_factory=dict)


class Bench:
    """Encoders for every method on one shared model, and the raw forward.

    Args:
        model: Model reference (packaged name, path or hub id).
        methods: Method names (``raw``, ``raw-full`` and any :data:`METHODS` name).
        device: ``auto``, ``cpu``, ``cuda``.
        dtype: Weight dtype.
        batch_size: Maximum texts per batch.
        max_tokens_per_batch: Token budget per batch (rows x longest row).
        device_map: ``from_pretrained`` device map (e.g. ``auto``).
        max_padding: Padding cap per row (:class:`HTPEncoder`'s ``max_padding``).
    """

    def __init__(
        self,
        model: str,
        methods: Sequence[str],
        *,
        device: str = "auto",
        dtype: str = "bfloat16",
        batch_size: int = 32,
        max_tokens_per_batch: int = 16384,
        device_map: str | None = None,
        max_padding: float = 0.1,
        pipeline: bool | None = None,
        prepare_window: int | None = None,
    ) -> None:
        from htp_retrieval.encoder import HTPEncoder

        self.methods = list(methods)
        kw: dict[str, Any] = dict(device=device, dtype=dtype, batch_size=batch_size,
                                  max_tokens_per_batch=max_tokens_per_batch,
                                  device_map=device_map, max_padding=max_padding, overflow="truncate",
                                  pipeline=pipeline, prepare_window=prepare_window)
        self.batch_size = batch_size
        names = [m for m in self.methods if not is_raw(m) and not is_external(m)]
        for m in self.methods:  # the raw forwards use these methods' batches
            if is_raw(m) and raw_source(m) not in names:
                names.append(raw_source(m))
        if "vanilla-mean" not in names:
            names.append("vanilla-mean")
        self.encoders = {}
        for m in names:
            base, opts = parse_variant(m)
            self.encoders[m] = HTPEncoder(model, base, **{**kw, **opts})
        self.reference = self.encoders["vanilla-mean"]
        self.model = self.reference.model
        self.device = str(self.reference.model.get_input_embeddings().weight.device)
        self._raw: dict[tuple[str, int], list[tuple[Any, Any]]] = {}
        self.st: Any = None
        if ST_MEAN in self.methods:
            self.st = sentence_transformer(model, device=self.device,
                                           dtype=str(self.model.dtype).replace("torch.", ""),
                                           max_length=self.reference.max_length)

    def set_length(self, length: int) -> None:
        """Truncate every text to ``length`` text tokens from now on."""
        for enc in self.encoders.values():
            enc.max_length = length
        if self.st is not None:
            self.st.max_seq_length = length
        self._raw = {}

    def _raw_inputs(self, name: str, texts: Sequence[str]) -> list[tuple[Any, Any]]:
        key = (raw_source(name), id(texts))
        if key not in self._raw:
            self._raw[key] = raw_batches(self.encoders[key[0]], texts)
        return self._raw[key]

    def run(self, method: str, texts: Sequence[str]) -> Run:
        """Time one method on ``texts`` (raw: prepared batches, forward only)."""
        if is_raw(method):
            batches = self._raw_inputs(method, texts)
            depth = (self.reference.n_layers if method == RAW_FULL
                     else self.reference.exit_layer)
            _sync(self.device)
            c0, t0 = time.process_time(), time.perf_counter()
            raw_forward(self.model, batches, n_layers=depth, masked=method == RAW_MASKED)
            _sync(self.device)
            return Run(time.perf_counter() - t0, time.process_time() - c0)
        if is_external(method):
            _sync(self.device)
            c0, t0 = time.process_time(), time.perf_counter()
            self.st.encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True,
                           show_progress_bar=False)
            _sync(self.device)
            return Run(time.perf_counter() - t0, time.process_time() - c0)
        enc = self.encoders[method]
        _sync(self.device)
        c0, t0 = time.process_time(), time.perf_counter()
        enc.encode(list(texts))
        _sync(self.device)
        seconds = time.perf_counter() - t0
        st = asdict(enc.last_stats)
        return Run(seconds, time.process_time() - c0, st)

    def raw_counts(self, name: str, texts: Sequence[str]) -> dict[str, int]:
        """Token counts of a raw entry's batches (those of its source method); for the
        sentence-transformers peer, vanilla-mean's text tokens and its own inputs."""
        if is_external(name):
            feats = self.st.preprocess(list(texts))
            lens = feats["attention_mask"].sum(1).tolist()
            text = sum(lay.n_text_tokens for lay in self.reference.build_layouts(list(texts)))
            order = sorted(lens, reverse=True)  # ST sorts by length, pads per batch
            padded = sum(len(order[i:i + self.batch_size]) * order[i]
                         for i in range(0, len(order), self.batch_size))
            return {"text_tokens": text, "input_tokens": int(sum(lens)),
                    "padded_tokens": int(padded),
                    "n_batches": -(-len(order) // self.batch_size)}
        layouts = self.encoders[raw_source(name)].build_layouts(list(texts))
        batches = self._raw_inputs(name, texts)
        return {
            "text_tokens": sum(lay.n_text_tokens for lay in layouts),
            "input_tokens": sum(len(lay) for lay in layouts),
            "padded_tokens": sum(int(ids.numel()) for ids, _ in batches),
            "n_batches": len(batches),
        }

    def prepare(self, method: str, texts: Sequence[str]) -> Run:
        """Time the preparation alone (:meth:`HTPEncoder.build_layouts`: tokenize,
        segment, lay out) of ``method`` on ``texts``; ``stats`` holds the token counts and
        the per-step seconds."""
        from htp_retrieval.pipeline import EncodeStats

        enc = self.encoders[method]
        st = EncodeStats(n_texts=len(texts))
        c0, t0 = time.process_time(), time.perf_counter()
        layouts = enc.build_layouts(list(texts), stats=st)
        seconds = time.perf_counter() - t0
        cpu = time.process_time() - c0
        st.prepare_seconds = seconds
        st.text_tokens = sum(lay.n_text_tokens for lay in layouts)
        st.input_tokens = sum(len(lay) for lay in layouts)
        return Run(seconds, cpu, asdict(st))

    def warm_up(self, texts: Sequence[str], length: int) -> None:
        """Run every method once on up to two texts cut to ``min(length, 512)`` tokens."""
        short = list(texts[:2])
        for enc in self.encoders.values():
            enc.max_length = min(length, SHORT_LENGTH)
        try:
            for m in self.methods:
                self.run(m, short)
        finally:
            self.set_length(length)

    def profile(self, method: str, texts: Sequence[str], top: int = 12) -> dict[str, Any]:
        """One run under ``torch.profiler``: ``htp.*``/``raw.forward`` regions and top ops.

        Returns:
            ``{"regions": {name: seconds}, "top_ops": [{"name", "self_seconds",
            "calls"}]}``; seconds are CPU time (plus CUDA time on a GPU, under
            ``cuda_seconds``).
        """
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU]
        if self.device.startswith("cuda"):
            acts.append(ProfilerActivity.CUDA)
        with profile(activities=acts) as prof:
            self.run(method, texts)
        avgs = prof.key_averages()
        regions = {e.key: e.cpu_time_total / 1e6 for e in avgs
                   if e.key.startswith(("htp.", "raw."))}
        ops = sorted((e for e in avgs if not e.key.startswith(("htp.", "raw."))),
                     key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
        rows = []
        for e in ops:
            row = {"name": e.key, "self_seconds": e.self_cpu_time_total / 1e6,
                   "calls": e.count}
            if self.device.startswith("cuda"):
                row["cuda_seconds"] = getattr(e, "self_device_time_total", 0) / 1e6
            rows.append(row)
        return {"regions": regions, "top_ops": rows}


def _median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def figures(method: str, runs: Sequence[Run], counts: dict[str, int] | None = None
            ) -> MethodFigures:
    """Median figures of the repeats of one method."""
    secs = [r.seconds for r in runs]
    med = _median(secs)
    if is_raw(method) or is_external(method):
        assert counts is not None
        text, inp, padded, nb = (counts["text_tokens"], counts["input_tokens"],
                                 counts["padded_tokens"], counts["n_batches"])
        breakdown = {"forward": med} if is_raw(method) else {}
    else:
        st = runs[0].stats
        text, inp, padded, nb = (st["text_tokens"], st["input_tokens"], st["padded_tokens"],
                                 len(st["batches"]))
        keys = {"tokenize": "tokenize_seconds", "segment": "segment_seconds",
                "layout": "layout_seconds", "prepare": "prepare_seconds",
                "forward": "forward_seconds", "copies": "copy_seconds",
                "pool": "pool_seconds", "inputs": "inputs_seconds", "wait": "wait_seconds"}
        breakdown = {k: _median([r.stats.get(v, 0.0) for r in runs]) for k, v in keys.items()}
    return MethodFigures(
        method=method, seconds=secs, median_seconds=med,
        cpu_seconds=_median([r.cpu_seconds for r in runs]),
        text_tokens=text, input_tokens=inp, padded_tokens=padded,
        padding_fraction=(1 - inp / padded) if padded else 0.0,
        tokens_per_second=text / med if med > 0 else 0.0,
        breakdown=breakdown, n_batches=nb,
    )


# ----------------------------------------------------------------------------- memory
def _vm_kib(field_name: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:  # pragma: no cover - non-Linux
        return None
    return None


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak RSS (``VmHWM``) of this process; ``False`` where unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # pragma: no cover - non-Linux or restricted
        return False
    return _vm_kib("VmHWM") is not None


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def anon_rss_bytes() -> int:
    """Anonymous resident memory of this process (``resident - shared`` of
    ``/proc/self/statm``), in bytes; 0 where unavailable.

    File-backed pages (memory-mapped weights, libraries) are left out: the kernel may drop
    and re-read them at any time, which would add noise that has nothing to do with the
    method.
    """
    try:
        with open("/proc/self/statm") as f:
            fields = f.read().split()
        return (int(fields[1]) - int(fields[2])) * _PAGE
    except (OSError, IndexError, ValueError):  # pragma: no cover - non-Linux
        return 0


class AnonPeak:
    """Peak of :func:`anon_rss_bytes` above its level at entry, sampled by a thread.

    Args:
        interval: Sampling period in seconds.
    """

    def __init__(self, interval: float = 0.001) -> None:
        import threading

        self.interval = interval
        self.base = 0
        self.peak_bytes = 0
        self._max = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._max = max(self._max, anon_rss_bytes())
            time.sleep(self.interval)

    def __enter__(self) -> AnonPeak:
        self.base = self._max = anon_rss_bytes()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._max = max(self._max, anon_rss_bytes())
        self.peak_bytes = max(0, self._max - self.base)


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    """Measure one method's peak memory in this (fresh) process.

    The model is loaded, the method runs once on a 200-character text (so one-time lazy
    state such as the segmenter and the placeholder embedding is not counted), the heap is
    trimmed, then the peak is reset and the texts are embedded once.

    Args:
        spec: ``model``, ``method``, ``texts``, ``max_length``, ``device``, ``dtype``,
            ``threads``, ``batch_size``, ``max_tokens_per_batch``, ``device_map`` and
            optional ``encoder_kwargs`` (more :class:`HTPEncoder` arguments).

    Returns:
        ``{"peak_memory_bytes", "base_bytes", "seconds", "probe"}``.
    """
    import torch

    from htp_retrieval.encoder import HTPEncoder
    from htp_retrieval.eval.cost import PeakMemory, _trim_heap, rss_bytes

    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    method = spec["method"]
    base, opts = parse_variant(raw_source(method) if is_raw(method) else method)
    enc = HTPEncoder(spec["model"], base,
                     device=spec["device"], dtype=spec["dtype"],
                     batch_size=spec["batch_size"],
                     max_tokens_per_batch=spec["max_tokens_per_batch"],
                     device_map=spec.get("device_map"), max_length=spec["max_length"],
                     overflow="truncate",
                     max_padding=spec.get("max_padding", 0.1),
                     **{**spec.get("encoder_kwargs", {}), **opts})
    texts = spec["texts"]
    batches = raw_batches(enc, texts) if is_raw(method) else None
    depth = enc.n_layers if method == RAW_FULL else enc.exit_layer
    # One-time lazy state (segmenter, placeholder embedding, kernel caches) is created by
    # a 200-character warm-up before the baseline, so the peak is the method's working set.
    warm = [texts[0][:200]]
    if batches is not None:
        raw_forward(enc.model, raw_batches(enc, warm), n_layers=depth)
    else:
        enc.encode(warm)
    device = str(enc.model.get_input_embeddings().weight.device)

    def go() -> None:
        if batches is not None:
            raw_forward(enc.model, batches, n_layers=depth, masked=method == RAW_MASKED)
        else:
            enc.encode(texts)

    t0 = time.perf_counter()
    if device.startswith("cuda"):
        with PeakMemory(device) as mem:
            go()
        return {"peak_memory_bytes": int(mem.peak_bytes),
                "base_bytes": int(torch.cuda.memory_allocated()),
                "seconds": time.perf_counter() - t0, "probe": "cuda"}
    _trim_heap()
    base = rss_bytes()
    hwm = _reset_peak_rss()
    t0 = time.perf_counter()
    with AnonPeak() as anon:
        go()
    seconds = time.perf_counter() - t0
    out = {"base_bytes": base, "seconds": seconds}
    if anon.base > 0:
        out.update(peak_memory_bytes=anon.peak_bytes, probe="anon-rss-sampling",
                   anon_base_bytes=anon.base)
    if hwm:  # the whole resident set, file-backed pages included (noisier)
        out["rss_hwm_bytes"] = max(0, (_vm_kib("VmHWM") or 0) * 1024 - base)
        out.setdefault("peak_memory_bytes", out["rss_hwm_bytes"])
        out.setdefault("probe", "VmHWM")
    if "peak_memory_bytes" not in out:  # pragma: no cover - neither probe available
        with PeakMemory("cpu") as mem:
            go()
        out.update(peak_memory_bytes=int(mem.peak_bytes), probe="rss-sampling")
    return out


def measure_memory(spec: dict[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
    """Run :func:`worker` in a fresh Python process and return its result.

    Raises:
        RuntimeError: if the worker fails (its stderr tail is in the message).
    """
    # A fixed mmap threshold (which also turns off glibc's dynamic threshold) makes every
    # large tensor its own mapping, returned to the system when freed: RSS then follows
    # the live tensors instead of the allocator's history, and repeated runs agree.
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "MALLOC_MMAP_THRESHOLD_": "65536"}
    proc = subprocess.run(
        [sys.executable, "-m", "htp_retrieval.eval.bench", "--worker"],
        input=json.dumps(spec), capture_output=True, text=True, env=env, timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"memory worker for {spec['method']} failed "
                           f"({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- report
TARGETS = {
    "htp_time_vs_vanilla": 1.05,
    "htp_memory_vs_vanilla": 1.10,
    "vanilla_throughput_vs_raw": 0.95,
    "echo_time_vs_vanilla": 2.1,
    "prepare_share": 0.05,
    "padding_fraction": 0.10,
}

GPU_TARGETS = {
    "vanilla_throughput_vs_raw": 0.90,
    "htp_throughput_vs_raw": 0.85,
    "vanilla_vs_st": 1.0,
}
"""On CUDA these replace or join :data:`TARGETS`: vanilla-mean and htp text tokens/s over
the raw forward's, and vanilla-mean's text tokens/s over the sentence-transformers peer's
(at least as fast). The CPU-side preparation target (``prepare_share``) is not checked
there: the throughput ratios already count every second of preparation that the forward
pass does not hide."""


def ratios(methods: dict[str, MethodFigures]) -> dict[str, dict[str, float | None]]:
    """Per method: time and memory over vanilla-mean, time and throughput over raw, and
    time over ``raw@<method>`` (its own token floor) where that entry was run."""
    van = methods.get("vanilla-mean")
    raw = methods.get(RAW)
    out: dict[str, dict[str, float | None]] = {}
    for name, f in methods.items():
        r: dict[str, float | None] = {"time_vs_vanilla": None, "memory_vs_vanilla": None,
                                      "time_vs_raw": None, "throughput_vs_raw": None,
                                      "time_vs_own_raw": None}
        own = methods.get(RAW_ON + name)
        if own is not None and own.median_seconds > 0:
            r["time_vs_own_raw"] = f.median_seconds / own.median_seconds
        if van is not None and van.median_seconds > 0:
            r["time_vs_vanilla"] = f.median_seconds / van.median_seconds
            if f.peak_memory_bytes is not None and van.peak_memory_bytes:
                r["memory_vs_vanilla"] = f.peak_memory_bytes / van.peak_memory_bytes
        if raw is not None and raw.median_seconds > 0 and f.median_seconds > 0:
            r["time_vs_raw"] = f.median_seconds / raw.median_seconds
            r["throughput_vs_raw"] = f.tokens_per_second / raw.tokens_per_second
        out[name] = r
    return out


def check_targets(setting: dict[str, Any], device: str = "cpu") -> list[dict[str, Any]]:
    """Compare one setting's figures with :data:`TARGETS` (and :data:`GPU_TARGETS` when
    ``device`` is a CUDA device).

    Returns:
        ``{"target", "value", "limit", "ok"}`` per target whose figures exist.
    """
    m, r = setting["methods"], setting["ratios"]
    rows: list[dict[str, Any]] = []
    gpu = device.startswith("cuda")
    limits = {**TARGETS, **GPU_TARGETS} if gpu else TARGETS

    def add(name: str, value: float | None, upper: bool = True) -> None:
        if value is None:
            return
        limit = limits[name]
        rows.append({"target": name, "value": value, "limit": limit,
                     "ok": value <= limit if upper else value >= limit})

    if "htp" in r:
        add("htp_time_vs_vanilla", r["htp"]["time_vs_vanilla"])
        add("htp_memory_vs_vanilla", r["htp"]["memory_vs_vanilla"])
        h = m["htp"]
        if not gpu:
            add("prepare_share", h["breakdown"]["prepare"] / h["median_seconds"]
                if h["median_seconds"] else None)
        else:
            add("htp_throughput_vs_raw", r["htp"]["throughput_vs_raw"], upper=False)
    if "vanilla-mean" in r:
        add("vanilla_throughput_vs_raw", r["vanilla-mean"]["throughput_vs_raw"], upper=False)
        st = m.get(ST_MEAN)
        if gpu and st is not None and st["tokens_per_second"]:
            add("vanilla_vs_st", m["vanilla-mean"]["tokens_per_second"]
                / st["tokens_per_second"], upper=False)
    if "echo-mean" in r:
        add("echo_time_vs_vanilla", r["echo-mean"]["time_vs_vanilla"])
    worst = max((f["padding_fraction"] for k, f in m.items()
                 if not is_raw(k) and not is_external(k)), default=None)
    add("padding_fraction", worst)
    return rows


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "n/a" if x is None else format(x, spec)


def format_setting(setting: dict[str, Any]) -> str:
    """Markdown table of one setting (figures, ratios, breakdown) and its target checks."""
    lines = [
        f"### {setting['length']} tokens ({setting['n_texts']} texts from "
        f"{setting['source']}, {setting['text_tokens']} text tokens, load average "
        f"{setting['loadavg_start']:.1f} -> {setting['loadavg_end']:.1f}"
        + (", beyond the model's trained context" if setting["beyond_trained_context"]
           else "") + ")",
        "",
        "| method | s (median) | text tok/s | input tokens | peak MiB | x vanilla time "
        "| x vanilla mem | x raw time | x own raw | padding | prepare s | forward s "
        "| copies s | pool s | wait s |",
        "|" + "---|" * 15,
    ]
    for name, f in setting["methods"].items():
        r = setting["ratios"][name]
        b = f["breakdown"]
        mem = f["peak_memory_bytes"]
        lines.append(
            f"| {name} | {f['median_seconds']:.2f} | {f['tokens_per_second']:.0f} "
            f"| {f['input_tokens']} | {_fmt(None if mem is None else mem / 2**20, '.0f')} "
            f"| {_fmt(r['time_vs_vanilla'])} | {_fmt(r['memory_vs_vanilla'])} "
            f"| {_fmt(r['time_vs_raw'])} | {_fmt(r.get('time_vs_own_raw'))} "
            f"| {100 * f['padding_fraction']:.1f}% "
            f"| {_fmt(b.get('prepare'), '.3f')} | {_fmt(b.get('forward'), '.2f')} "
            f"| {_fmt(b.get('copies'), '.3f')} | {_fmt(b.get('pool'), '.3f')} "
            f"| {_fmt(b.get('wait'), '.3f')} |")
    if setting["targets"]:
        lines += ["", "| target | value | limit | |", "|---|---|---|---|"]
        for t in setting["targets"]:
            lines.append(f"| {t['target']} | {t['value']:.3f} | {t['limit']} "
                         f"| {'ok' if t['ok'] else 'MISS'} |")
    return "\n".join(lines)


def plot(results: Sequence[dict[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Plot seconds per text and peak memory against length, one line per method.

    Args:
        results: Bench results (this module's JSON), merged by length.
        path: PNG to write.

    Raises:
        ImportError: if matplotlib is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover
        raise ImportError("the bench plot needs matplotlib: pip install matplotlib") from e
    series: dict[str, dict[int, tuple[float, float | None]]] = {}
    for res in results:
        for s in res["settings"]:
            for name, f in s["methods"].items():
                mem = f["peak_memory_bytes"]
                series.setdefault(name, {})[s["length"]] = (
                    f["median_seconds"] / s["n_texts"], None if mem is None else mem / 2**20)
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, pts in series.items():
        xs = sorted(pts)
        ax_t.plot(xs, [pts[x][0] for x in xs], marker="o", label=name)
        mx = [x for x in xs if pts[x][1] is not None]
        if mx:
            ax_m.plot(mx, [pts[x][1] for x in mx], marker="o", label=name)
    for ax, label in ((ax_t, "seconds per document"), (ax_m, "peak memory above load (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("document length (text tokens)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    ax_t.legend(fontsize=8)
    cfg = results[0]["config"]
    fig.suptitle(f"{cfg['model']} ({cfg['device']}, {cfg['dtype']}, "
                 f"{cfg['threads']} threads)", fontsize=10)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


# ----------------------------------------------------------------------------- command
def _loadavg() -> float:
    """1-minute load average (0.0 where unavailable): a contended run shows here."""
    try:
        return float(os.getloadavg()[0])
    except (OSError, AttributeError):  # pragma: no cover
        return 0.0


def _cpu_matmul_record(device: str) -> dict[str, Any] | None:
    """What ``dtype="auto"`` measured on this CPU (:func:`htp_retrieval.dtypes.cpu_matmul_seconds`),
    for a CPU with native bf16 instructions; ``None`` elsewhere."""
    from htp_retrieval import dtypes

    if not str(device).startswith("cpu") or not dtypes.cpu_has_native_bf16():
        return None
    return dtypes.cpu_matmul_seconds()


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark described by the parsed ``bench`` arguments and return the result.

    Every setting cuts its texts to its length on purpose (the docs say so), so the
    encoder's per-call truncation warning is filtered while it runs (and only then).
    """
    from htp_retrieval.long_text import truncation_warnings_off

    with truncation_warnings_off():
        return _run_bench(args)


def _run_bench(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from tqdm.auto import tqdm

    from htp_retrieval.methods import METHODS, get_method

    if args.threads:
        torch.set_num_threads(args.threads)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in methods:
        if is_external(m):
            continue
        if not is_raw(m) or m.startswith(RAW_ON):
            # ValueError names valid methods, or the valid variant options
            get_method(parse_variant(raw_source(m) if is_raw(m) else m)[0])

    def canonical(m: str) -> str:
        base, _ = parse_variant(m)
        rest = m[len(base):]
        return (m if m in RAW_METHODS or m in METHODS or is_external(m)
                else RAW_ON + get_method(raw_source(m)).name if is_raw(m)
                else get_method(base).name + rest)

    methods = [canonical(m) for m in methods]
    if getattr(args, "prepare_only", False):
        methods = [m for m in methods if not is_raw(m) and not is_external(m)]
    lengths = _ints(args.lengths)
    # the concrete dtype goes into the config and the file name, never "auto"
    asked_dtype = args.dtype
    args.dtype = resolve_dtype(args.dtype,
                               pick_device(args.device) if args.device_map is None else "auto")
    pipeline = {"auto": None, "on": True, "off": False}[getattr(args, "pipeline", "auto")]
    window = getattr(args, "prepare_window", None) or None
    bench = Bench(args.model, methods, device=args.device, dtype=args.dtype,
                  batch_size=args.batch_size, max_tokens_per_batch=args.max_tokens_per_batch,
                  device_map=args.device_map, max_padding=args.max_padding,
                  pipeline=pipeline, prepare_window=window)
    ref = bench.reference
    max_pos = getattr(bench.model.config, "max_position_embeddings", None)
    settings = build_settings(lengths=lengths, tokenizer=ref.tokenizer, data=args.data,
                              n_docs=args.n_docs, long_docs=args.long_docs,
                              long_source=args.long_source, essays=args.essays)
    config = {
        "model": args.model, "device": bench.device, "dtype": args.dtype,
        "dtype_asked": asked_dtype, "cpu_matmul_seconds": _cpu_matmul_record(bench.device),
        "threads": torch.get_num_threads(),
        "tokenizers_parallelism": os.environ.get("TOKENIZERS_PARALLELISM", ""),
        "methods": methods, "lengths": lengths,
        "n_docs": args.n_docs, "long_docs": args.long_docs, "long_source": args.long_source,
        "repeats": args.repeats, "batch_size": args.batch_size,
        "max_tokens_per_batch": args.max_tokens_per_batch, "max_padding": args.max_padding,
        "device_map": args.device_map,
        "pipeline": ref.pipeline if pipeline is None else pipeline, "prepare_window": window,
        "prepare_only": bool(getattr(args, "prepare_only", False)),
        "n_layers": ref.n_layers, "exit_layer": ref.exit_layer, "tp_start": ref.tp_start,
        "tp_exit": ref.tp_exit, "max_position_embeddings": max_pos,
        "memory": "subprocess per method" if not args.no_memory else "not measured",
        "command": "htp-retrieval " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
    }
    from htp_retrieval.eval.retrieval import versions

    out: dict[str, Any] = {"config": config, "versions": versions(), "settings": [],
                           "created": time.time()}
    total = len(settings) * len(methods) * args.repeats
    with tqdm(total=total, desc="bench", unit="run", disable=args.quiet) as bar:
        for s in settings:
            load0 = _loadavg()
            bench.set_length(s.length)
            if config["prepare_only"]:
                out["settings"].append(_prepare_setting(bench, methods, s, args.repeats, bar,
                                                        load0))
                if not args.quiet:
                    tqdm.write(format_prepare(out["settings"][-1]) + "\n")
                continue
            bench.warm_up(s.texts, s.length)
            runs: dict[str, list[Run]] = {m: [] for m in methods}
            for rep in range(args.repeats):
                k = rep % len(methods)
                for m in methods[k:] + methods[:k]:  # rotate the order every repeat
                    bar.set_postfix_str(f"{s.length} {m}")
                    runs[m].append(bench.run(m, s.texts))
                    bar.update(1)
            figs = {m: figures(m, runs[m], bench.raw_counts(m, s.texts)
                               if is_raw(m) or is_external(m) else None)
                    for m in methods}
            text_tokens = bench.raw_counts(RAW, s.texts)["text_tokens"]
            if args.profile:
                for m in methods:
                    figs[m].profile = bench.profile(m, s.texts)
            if not args.no_memory:
                for m in methods:
                    if is_external(m):  # measured only in this process's timing run
                        continue
                    bar.set_postfix_str(f"{s.length} {m} memory")
                    res = measure_memory({
                        "model": args.model, "method": m, "texts": s.texts,
                        "max_length": s.length, "device": bench.device, "dtype": args.dtype,
                        "threads": torch.get_num_threads(), "batch_size": args.batch_size,
                        "max_tokens_per_batch": args.max_tokens_per_batch,
                        "device_map": args.device_map, "max_padding": args.max_padding,
                        "encoder_kwargs": {"pipeline": pipeline, "prepare_window": window},
                    })
                    figs[m].peak_memory_bytes = res["peak_memory_bytes"]
                    figs[m].memory_probe = res["probe"]
                    figs[m].rss_hwm_bytes = res.get("rss_hwm_bytes")
            longest = max((max(n for _, n in r.stats["batches"]) for rs in runs.values()
                           for r in rs if r.stats), default=0)
            setting = {
                "length": s.length, "source": s.source, "n_texts": len(s.texts),
                "text_tokens": text_tokens, "longest_input_tokens": longest,
                "beyond_trained_context": bool(max_pos and longest > max_pos),
                "loadavg_start": load0, "loadavg_end": _loadavg(),
                "methods": {m: asdict(f) for m, f in figs.items()},
                "ratios": ratios(figs),
            }
            setting["targets"] = check_targets(setting, bench.device)
            out["settings"].append(setting)
            if not args.quiet:
                tqdm.write(format_setting(setting) + "\n")
    return out


def _prepare_setting(bench: Bench, methods: Sequence[str], s: Setting, repeats: int,
                     bar: Any, load0: float) -> dict[str, Any]:
    """``--prepare-only``: time :meth:`Bench.prepare` of each method, interleaved.

    Returns:
        ``{"length", "source", "n_texts", "loadavg_start", "loadavg_end", "methods"}``,
        per method the median wall and process CPU seconds, text tokens, text tokens per
        second (wall, and per CPU second: the rate per core, as preparation runs on one
        thread), the median ``tokenize``/``segment``/``layout`` seconds, and the warm-up
        pass (``first_pass_seconds``; for the first method listed, the process's first
        pass over these texts, which pays for spaCy's new words and cold tokenizer
        caches).
    """
    # warm-up: segmenter, spaCy vocabulary, tokenizer caches. The first method's warm-up
    # is the process's first pass over these texts (every word new), kept as "first pass"
    for m in methods:  # load the sentence splitter outside every timing
        _ = bench.encoders[m].segmenter
    first = {m: bench.prepare(m, s.texts) for m in methods}
    runs: dict[str, list[Run]] = {m: [] for m in methods}
    for rep in range(repeats):
        k = rep % len(methods)
        for m in methods[k:] + methods[:k]:
            bar.set_postfix_str(f"{s.length} {m} prepare")
            runs[m].append(bench.prepare(m, s.texts))
            bar.update(1)
    figs = {}
    for m, rs in runs.items():
        sec = _median([r.seconds for r in rs])
        cpu = _median([r.cpu_seconds for r in rs])
        text = rs[0].stats["text_tokens"]
        figs[m] = {
            "seconds": [r.seconds for r in rs], "median_seconds": sec, "cpu_seconds": cpu,
            "text_tokens": text, "input_tokens": rs[0].stats["input_tokens"],
            "tokens_per_second": text / sec if sec else 0.0,
            "tokens_per_cpu_second": text / cpu if cpu else 0.0,
            "first_pass_seconds": first[m].seconds,
            "first_pass_tokens_per_second": (text / first[m].seconds
                                             if first[m].seconds else 0.0),
            "breakdown": {k: _median([r.stats[f"{k}_seconds"] for r in rs])
                          for k in ("tokenize", "segment", "layout")},
        }
    return {"length": s.length, "source": s.source, "n_texts": len(s.texts),
            "loadavg_start": load0, "loadavg_end": _loadavg(), "methods": figs}


def format_prepare(setting: dict[str, Any]) -> str:
    """Markdown table of one ``--prepare-only`` setting."""
    lines = [
        f"### preparation, {setting['length']} tokens ({setting['n_texts']} texts from "
        f"{setting['source']}, load average {setting['loadavg_start']:.1f} -> "
        f"{setting['loadavg_end']:.1f})", "",
        "| method | text tokens | s (median) | text tok/s | text tok per CPU s "
        "| first pass tok/s | tokenize s | segment s | layout s |", "|" + "---|" * 9]
    for name, f in setting["methods"].items():
        b = f["breakdown"]
        lines.append(f"| {name} | {f['text_tokens']} | {f['median_seconds']:.3f} "
                     f"| {f['tokens_per_second']:,.0f} | {f['tokens_per_cpu_second']:,.0f} "
                     f"| {f['first_pass_tokens_per_second']:,.0f} "
                     f"| {b['tokenize']:.3f} | {b['segment']:.3f} | {b['layout']:.3f} |")
    return "\n".join(lines)


def _stem(args: argparse.Namespace, device: str) -> str:
    model = args.model.replace("/", "__")
    return (f"{model}__{device.split(':')[0]}-{args.dtype}-t{args.threads or 'all'}"
            f"__len{'-'.join(str(x) for x in _ints(args.lengths))}"
            + ("__prepare" if getattr(args, "prepare_only", False) else ""))


def cmd_bench(args: argparse.Namespace) -> int:
    """Run ``htp-retrieval bench``: print tables, write the JSON and the plot."""
    if args.worker:
        print(json.dumps(worker(json.loads(sys.stdin.read()))))
        return 0
    result = run_bench(args)
    out_dir = Path(args.output)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = _stem(args, result["config"]["device"])
    path = out_dir / f"{stem}.json"
    with atomic_write(path) as f:
        f.write(json.dumps(result, indent=2))
    if result["config"].get("prepare_only"):
        for s in result["settings"]:
            print(format_prepare(s) + "\n")
        print(f"wrote {path}", file=sys.stderr)
        return 0
    png = plot([result], out_dir / f"{stem}.png")
    for s in result["settings"]:
        print(format_setting(s) + "\n")
    print(f"wrote {path} and {png}", file=sys.stderr)
    return 0


def cmd_bench_plot(args: argparse.Namespace) -> int:
    """Run ``htp-retrieval bench-plot``: one plot from several bench JSONs (by length)."""
    results = [json.loads(Path(p).read_text()) for p in args.results]
    models = {r["config"]["model"] for r in results}
    if len(models) > 1:
        raise SystemExit(f"bench-plot: results from several models {sorted(models)}")
    print(plot(results, args.output))
    return 0


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    """Register ``bench`` and ``bench-plot`` on the ``htp-retrieval`` subparsers ``sub``."""
    p = sub.add_parser(
        "bench", help="time and memory of each method against the raw forward pass",
        description="Times the raw forward pass and each method on the same texts in one "
                    "process (warm-up, interleaved repeats, median); peak memory per method "
                    "in a fresh subprocess; writes a JSON and a plot.")
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="packaged name, .gguf path, local dir or hub id")
    p.add_argument("--data", default=DEFAULT_DATA, help="BEIR folder with corpus.jsonl")
    p.add_argument("--n-docs", type=int, default=256,
                   help="SciFact documents for the 512-token setting")
    p.add_argument("--lengths", default="512,2048,8192,32768",
                   help="text tokens per document, comma-separated")
    p.add_argument("--long-docs", type=int, default=0,
                   help="documents per long setting (0: n_docs * 512 / length, at least 1)")
    p.add_argument("--long-source", default="scifact", choices=["scifact", "essays"],
                   help="text of long documents: concatenated SciFact documents or essays")
    p.add_argument("--essays", default=DEFAULT_ESSAYS, help="folder of the essays (.txt)")
    p.add_argument("--methods", default=DEFAULT_METHODS,
                   help="comma-separated; raw (forward to the exit layer), raw-full (full "
                        "depth), raw-masked (with the padding mask) and any method name")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats (median kept)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (0: default)")
    p.add_argument("--dtype", default="auto", choices=get_args(DTypeArg),
                   help="weight dtype; auto: bf16 on a GPU with bf16 or on a CPU with native "
                   "bf16 instructions where bf16 measured as fast as fp32, fp16 on an older "
                   "GPU, else fp32 (the file name and JSON record the resolved one)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--device-map", default=None,
                   help="from_pretrained device_map, e.g. auto (several GPUs)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-tokens-per-batch", type=int, default=16384,
                   help="token budget per batch (rows x longest row)")
    p.add_argument("--max-padding", type=float, default=0.1,
                   help="padding cap per row as a share of the batch width (1.0: no cap)")
    p.add_argument("--output", default="results/bench", help="folder for the JSON and plot")
    p.add_argument("--profile", action="store_true",
                   help="also run each method once under torch.profiler")
    p.add_argument("--no-memory", action="store_true", help="skip the memory subprocesses")
    p.add_argument("--pipeline", default="auto", choices=["auto", "on", "off"],
                   help="prepare batch n+1 in a background thread while batch n runs (auto: "
                   "the encoder default, off)")
    p.add_argument("--prepare-window", type=int, default=0,
                   help="lay out texts in windows of N texts so preparation overlaps the "
                   "forward pass (0: all texts at once, the default batching)")
    p.add_argument("--prepare-only", action="store_true",
                   help="time only the preparation (tokenize, segment, layout) of each method "
                   "and report text tokens/s per core; no model forward")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("bench-plot", help="plot several bench JSONs of one model together")
    p.add_argument("results", nargs="+", help="bench JSON files")
    p.add_argument("--output", required=True, help="PNG to write")
    p.set_defaults(func=cmd_bench_plot)


def _worker_main() -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    print(json.dumps(worker(json.loads(sys.stdin.read()))))
    return 0


__all__ = ["Bench", "GPU_TARGETS", "MethodFigures", "Setting", "TARGETS", "add_subcommands", "build_settings",
           "check_targets", "long_documents", "measure_memory", "plot", "raw_batches",
           "raw_forward", "run_bench", "scifact_documents", "worker"]

if __name__ == "__main__":  # pragma: no cover - the memory worker
    if sys.argv[1:] == ["--worker"]:
        raise SystemExit(_worker_main())
    from htp_retrieval.cli import main

    raise SystemExit(main(["bench", *sys.argv[1:]]))
