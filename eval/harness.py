"""Eval runs over datasets and sweeps: what ``htp-retrieval eval`` and the parity commands run.

A run is a set of :class:`DataItem` (a BEIR/LongEmbed split, a synthetic task at one context
length, or an STS split) times a set of :class:`RunPoint` (method x max length x K x N). Each
pair gives one results JSON, ``<output>/<model>/<dataset>-<split>/<method>__<digest>.json``,
the digest a hash of the run (:func:`point_run`: the resolved config, dtype and data
settings; :mod:`htp_retrieval.eval.naming`); an existing file is reused unless ``overwrite``.

Sweeps follow the paper: max length (Fig. 5: NDCG@10 against context length), K (Table 12:
1, 2, 4, 8, 12, 20, 32, 64) and sentence vs fixed-token blocks (Fig. 7: ``htp-fixed-tokens``
with N = ``auto``, i.e. text tokens // sentences per document).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from htp_retrieval.config import HTPConfig
from htp_retrieval.dtypes import resolve_dtype
from htp_retrieval.eval.chunk_eval import (
    IN_DOC,
    SpanData,
    has_spans,
    load_spans,
    run_chunk_retrieval,
    spans_from_synthetic,
)
from htp_retrieval.eval.data import BeirData, load_beir, subsample
from htp_retrieval.eval.longembed import LONGEMBED_HUB, load_longembed
from htp_retrieval.eval.naming import data_settings, result_file_name, run_identity, run_label
from htp_retrieval.eval.retrieval import (
    CHECKPOINT_CHARS,
    CHECKPOINT_DOCS,
    RetrievalResult,
    run_retrieval,
)
from htp_retrieval.eval.sts import StsData, load_sts, run_sts, sts_file
from htp_retrieval.eval.synthetic import (
    DEFAULT_CONTEXT_LENGTHS,
    GENERATOR_VERSION,
    SYNTHETIC_TASKS,
    SyntheticData,
    generate_all,
    synthetic_query_meta,
)
from htp_retrieval.methods import METHODS, MethodSpec, get_method
from htp_retrieval.models import DEFAULT_MODEL

DataKind = Literal["retrieval", "sts", "spans"]
"""``retrieval``: corpus/queries/qrels scored by pytrec_eval; ``sts``: sentence pairs."""
BlockSize = int | Literal["auto"]
SYNTHETIC_METRICS = ("ndcg_cut_10", "recall_100", "map_cut_10", "recip_rank", "P_1")
"""Metrics for needle/passkey: ``P_1`` is reported as ``Acc@1`` (one relevant document per
query, so precision@1 = accuracy@1 = LongEmbed's nDCG@1)."""
K_ABLATION = (1, 2, 4, 8, 12, 20, 32, 64)
"""The paper's Table 12 K values."""


@dataclass
class DataItem:
    """One split to evaluate.

    Attributes:
        kind: :data:`DataKind`.
        name: Dataset name (results folder ``<name>-<split>``).
        split: Split name.
        data: :class:`BeirData` (retrieval), :class:`StsData` or
            :class:`~htp_retrieval.eval.chunk_eval.SpanData` (chunk-level retrieval).
        context_length: Synthetic tasks: the generated length in tokens.
    """

    kind: DataKind
    name: str
    split: str
    data: BeirData | StsData | SpanData
    context_length: int | None = None

    @property
    def documents(self) -> BeirData:
        """The split's documents and queries as :class:`BeirData` (an evidence-span split:
        its whole documents and document-level qrels).

        Raises:
            ValueError: for STS data, which has sentence pairs and no documents.
        """
        if isinstance(self.data, StsData):
            raise ValueError(f"{self.name}: STS data (sentence pairs) has no documents")
        return self.data.beir if isinstance(self.data, SpanData) else self.data


@dataclass(frozen=True)
class RunPoint:
    """One encoder setting of a sweep.

    Attributes:
        method: The method.
        max_length: Max text tokens; ``None`` for a synthetic task means "cover the context
            length" (at least the longest document in the model's tokens).
        k: Sentences per block (``None``: the method's default, or not used by it).
        n: Tokens per block for fixed-token blocks, an int or ``"auto"``.
    """

    method: MethodSpec
    max_length: int | None = 512
    k: int | None = None
    n: BlockSize | None = None


@dataclass
class EvalSettings:
    """Everything about a run except the data.

    Attributes:
        model: Packaged name, ``.gguf``, local dir or hub id.
        methods: Method names/aliases or specs.
        max_lengths: Max text tokens to sweep (``None``: 512, and for synthetic tasks the
            context length).
        ks: K values (``[None]``: the method default).
        ns: N values, ints or ``"auto"`` (``[None]``: the method default).
        tp_start, tp_exit, output_layer: Layer overrides (``None``: the model preset).
        segmenter: Sentence segmenter name.
        max_blocks: Adaptive K budget (:func:`htp_retrieval.layout.adaptive_k`): at most
            this many blocks per document; ``None`` keeps the method's default (``htp``: 32;
            :attr:`~htp_retrieval.methods.MethodSpec.max_blocks`), ``0`` forces fixed K.
        min_block_tokens: Adaptive K's density cap T (at most one block per T text tokens);
            ``None`` keeps the method's default, ``0`` turns the cap off.
        long_budget: Adaptive K's long-text budget ``(L, B_L)``: at most B_L blocks past L
            text tokens; ``None`` keeps the method's default (``htp``: ``(1024, 8)``),
            ``0`` turns it off.
        short_budget: Adaptive K's short-text budget ``(S, B_S)``: at most B_S blocks up
            to S text tokens; ``None`` keeps the default (the model family's,
            :func:`htp_retrieval.models.default_short_budget`; the Llama family's is
            ``(256, 1)``), ``0`` turns it off.
        device, dtype, padding_side, batch_size, max_tokens_per_batch: Encoder settings
            (``dtype="auto"``: :func:`htp_retrieval.dtypes.resolve_dtype` for the device).
        output: Results root folder.
        overwrite: Recompute existing results.
        command: The command line recorded in each result (``config["command"]``); empty:
            ``run_eval (Python API) <time> pid <pid>``. Cost ratios pair results with the
            same command (timed by one call).
        show_progress_bar: tqdm bars.
        chunk_size: Documents per corpus checkpoint chunk at most.
        chunk_chars: Characters per corpus checkpoint chunk at most (``None``: no limit;
            :func:`~htp_retrieval.eval.retrieval.encode_corpus`).
        max_queries, max_docs, seed: Subsampling (and synthetic generation) settings; part
            of the result name.
        synthetic_tokenizer: Tokenizer that measured synthetic lengths (``None``: default).
        verbose: Print the placeholder layout of one input per encoder.
        preset: Calibration preset JSON (``htp-retrieval calibrate``) passed to every
            encoder (:class:`~htp_retrieval.HTPEncoder` ``preset=``); part of the result
            name (``preset-<file stem>``).
        chunkings: Evidence-span data only: chunk embeddings to compare
            (:data:`~htp_retrieval.eval.chunk_eval.CHUNK_VARIANTS`); part of the result name
            (``chunk-<chunking><tokens>``).
        chunk_tokens: Evidence-span data: chunk size in tokens.
        chunk_overlap: Evidence-span data: overlap of consecutive chunks in tokens
            (``-o<overlap>`` in the name when not 0).
        late_window: Late chunking: text tokens per forward pass (``None``: the encoder's
            ``max_length``, the model's window; ``-w<tokens>`` in the name when set).
        center_queries: Also score every result with centred vectors
            (:mod:`htp_retrieval.eval.centred`): a ``DIR:SPLIT`` of a BEIR-format dataset
            (or, for STS, of an STS folder), a query (sentence) file, or ``crossfit``;
            ``cen-<label>`` in the result name.
        config: A resolved :class:`~htp_retrieval.config.HTPConfig` to evaluate exactly as
            it is (its method, ``max_length`` and ``overflow`` included); ``methods`` must
            be ``[config.method]`` and the sweep and setting fields above their defaults.
            The result is named ``<method>__cfg-<digest>`` plus the data tags.
    """

    model: str = DEFAULT_MODEL
    methods: Sequence[str | MethodSpec] = ("vanilla-mean", "htp")
    max_lengths: Sequence[int] | None = None
    ks: Sequence[int | None] = (None,)
    ns: Sequence[BlockSize | None] = (None,)
    tp_start: int | None = None
    tp_exit: int | None = None
    output_layer: int | None = None
    segmenter: str = "sentencizer"
    max_blocks: int | None = None
    min_block_tokens: int | None = None
    long_budget: tuple[int, int] | Literal[0] | None = None
    short_budget: tuple[int, int] | Literal[0] | None = None
    device: str = "auto"
    dtype: str = "auto"
    padding_side: str = "right"
    batch_size: int = 32
    max_tokens_per_batch: int = 16384
    output: str | Path = "results"
    overwrite: bool = False
    command: str = ""
    show_progress_bar: bool = True
    chunk_size: int = CHECKPOINT_DOCS
    chunk_chars: int | None = CHECKPOINT_CHARS
    max_queries: int = 0
    max_docs: int = 0
    seed: int = 0
    synthetic_tokenizer: str | None = None
    verbose: bool = False
    preset: str | None = None
    chunkings: Sequence[str] = ("naive",)
    chunk_tokens: int = 256
    chunk_overlap: int = 0
    late_window: int | None = None
    extra_config: dict[str, Any] = field(default_factory=dict)
    center_queries: str | None = None
    config: HTPConfig | None = None


def parse_list(text: str | None, *, allow_auto: bool = False) -> list[Any] | None:
    """Parse ``"512,1024"`` into ``[512, 1024]`` (``"auto"`` kept if allowed).

    Raises:
        ValueError: naming the bad item.
    """
    if text is None:
        return None
    out: list[Any] = []
    for item in str(text).split(","):
        item = item.strip()
        if not item:
            continue
        if allow_auto and item == "auto":
            out.append("auto")
            continue
        try:
            out.append(int(item))
        except ValueError:
            want = "an integer or 'auto'" if allow_auto else "an integer"
            raise ValueError(f"{item!r} in {text!r} is not {want}") from None
    if not out:
        raise ValueError(f"empty list: {text!r}")
    return out


def _spec_uses_k(spec: MethodSpec) -> bool:
    return spec.placeholders in ("local", "hierarchical") and spec.blocks == "sentence"


def _spec_uses_n(spec: MethodSpec) -> bool:
    return spec.placeholders in ("local", "hierarchical") and spec.blocks == "tokens"


def sweep_points(
    methods: Sequence[str | MethodSpec],
    *,
    max_lengths: Sequence[int | None] = (512,),
    ks: Sequence[int | None] = (None,),
    ns: Sequence[BlockSize | None] = (None,),
) -> list[RunPoint]:
    """The settings to run: each method at each max length, K and N that apply to it.

    K applies to sentence-block methods (``tp-sentence``, ``htp``) and to
    ``htp-fixed-tokens`` with N = ``auto`` (N is derived from the K-sentence blocks); N
    applies to fixed-token methods only. Other methods run once per max length, so a K
    sweep reuses one vanilla-mean run as its cost baseline.

    Raises:
        ValueError: for an unknown method name.
    """
    points: list[RunPoint] = []
    for m in methods:
        spec = get_method(m)
        for length in max_lengths:
            if _spec_uses_n(spec):
                for n in ns:
                    for k in (ks if n == "auto" else (None,)):
                        points.append(RunPoint(spec, length, k, n))
            elif _spec_uses_k(spec):
                points.extend(RunPoint(spec, length, k, None) for k in ks)
            else:
                points.append(RunPoint(spec, length, None, None))
    return list(dict.fromkeys(points))


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)


def point_config(settings: EvalSettings, point: RunPoint, item: DataItem, *,
                 max_length: int | None = None) -> HTPConfig:
    """The resolved :class:`~htp_retrieval.config.HTPConfig` one sweep point runs with on
    one data item (no weights loaded: :func:`htp_retrieval.encoder.resolve_config`).

    ``settings.config`` is used as it is. Otherwise the point's method, K, N and max
    length and the settings' layers, segmenter, block budgets (sentence-block methods
    only) and preset resolve on the model. Max length: the point's, else ``max_length``
    (a synthetic task's covering length, :func:`encode_length`), else for evidence-span
    data the model's window (``overflow="error"``: the chunk eval cuts documents into
    windows) and for other data 512 tokens (``overflow="truncate"``).

    Raises:
        ValueError: for an invalid setting (as :meth:`HTPConfig.for_model`).
    """
    if settings.config is not None:
        return settings.config
    from htp_retrieval.encoder import resolve_config

    spec = point.method
    blocks = _spec_uses_k(spec)
    if item.kind == "spans":
        length: dict[str, Any] = {"max_length": point.max_length or max_length,
                                  "overflow": "error"}
    else:
        length = {"max_length": point.max_length or max_length or item.context_length or 512,
                  "overflow": "truncate"}
    return resolve_config(
        settings.model, spec, preset=settings.preset, k=point.k, tokens_per_block=point.n,
        segmenter=settings.segmenter,
        max_blocks=settings.max_blocks if blocks else None,
        min_block_tokens=settings.min_block_tokens if blocks else None,
        long_budget=settings.long_budget if blocks else None,
        short_budget=settings.short_budget if blocks else None,
        tp_start=settings.tp_start, tp_exit=settings.tp_exit,
        output_layer=settings.output_layer, **length)


def chunking_settings(settings: EvalSettings, chunking: str) -> dict[str, Any]:
    """The chunking part of an evidence-span run's identity: chunking, chunk size and
    overlap in tokens, and the late-chunking window when one is set."""
    out: dict[str, Any] = {"chunking": chunking, "chunk_tokens": settings.chunk_tokens,
                           "chunk_overlap": settings.chunk_overlap}
    if chunking.startswith("late") and settings.late_window:
        out["late_window"] = settings.late_window
    return out


def point_run(settings: EvalSettings, config: HTPConfig, item: DataItem, *,
              chunking: str | None = None, center_label: str = "") -> dict[str, Any]:
    """The identity of one result (:func:`htp_retrieval.eval.naming.run_identity`): the
    model, the resolved dtype, the padding side, ``config`` and the data settings."""
    data = data_settings(
        max_queries=settings.max_queries, max_docs=settings.max_docs, seed=settings.seed,
        context_length=item.context_length,
        synthetic_tokenizer=settings.synthetic_tokenizer if item.context_length else None,
        chunking=None if chunking is None else chunking_settings(settings, chunking),
        center_queries=center_label or None, extra=settings.extra_config)
    return run_identity(model=settings.model,
                        dtype=resolve_dtype(settings.dtype, settings.device),
                        padding_side=settings.padding_side, config=config, data=data)


def point_label(point: RunPoint, settings: EvalSettings) -> str:
    """A readable label of a sweep point (logs, ``"label"`` in its results JSON): the
    method and the settings given explicitly (``len``, ``k``, ``n``, ``mb``, ``mbt``,
    ``lb``, ``sb``, ``tp``, ``out``, the segmenter, ``preset-<stem>``, ``cfg-<digest>``).
    The file a result goes to is decided by :func:`point_run`, never by this label."""
    tags: list[str] = []
    if settings.config is not None:
        return run_label(point.method.name, [f"cfg-{settings.config.digest()}"])
    for prefix, value in (("len", point.max_length), ("k", point.k), ("n", point.n)):
        if value is not None:
            tags.append(f"{prefix}{value}")
    if _spec_uses_k(point.method):
        for prefix, value in (("mb", settings.max_blocks), ("mbt", settings.min_block_tokens)):
            if value is not None:
                tags.append(f"{prefix}{value}")
        for prefix, value in (("lb", settings.long_budget), ("sb", settings.short_budget)):
            if value is not None:
                tags.append(f"{prefix}0" if not value else f"{prefix}{value[0]}-{value[1]}")
    if settings.tp_start is not None or settings.tp_exit is not None:
        a, b = ("" if v is None else v for v in (settings.tp_start, settings.tp_exit))
        tags.append(f"tp{a}-{b}")
    if settings.output_layer is not None:
        tags.append(f"out{settings.output_layer}")
    if settings.segmenter != "sentencizer":
        tags.append(settings.segmenter)
    if settings.preset:
        tags.append("preset-" + Path(settings.preset).stem)
    return run_label(point.method.name, tags)


def resolve_data(
    spec: str,
    *,
    split: str = "test",
    seed: int = 0,
    context_lengths: Sequence[int] | None = None,
    max_queries: int = 0,
    max_docs: int = 0,
    synthetic_tokenizer: str | None = None,
    haystack: str | Path | None = None,
) -> list[DataItem]:
    """Turn a ``--data`` value into the splits to evaluate.

    Args:
        spec: One of

            * a BEIR folder (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``);
            * such a folder with ``spans/<split>.jsonl`` evidence spans: chunk-level
              retrieval (:mod:`~htp_retrieval.eval.chunk_eval`; ``max_docs`` samples
              documents with their queries);
            * a LongEmbed folder (BEIR layout, or the hub's ``qrels.jsonl`` layout);
            * ``longembed:<task>``: the task from the hub dataset ``dwzhu/LongEmbed``;
            * ``needle`` or ``passkey``: generated (:mod:`~htp_retrieval.eval.synthetic`),
              one item per context length;
            * ``needle-spans`` or ``passkey-spans``: the same documents for chunk-level
              retrieval, the relevant chunk being the one holding the inserted text;
            * an STS jsonl file, or a folder holding ``<split>.jsonl`` in that form.
        split: Split name.
        seed: Subsampling and generation seed.
        context_lengths: Synthetic lengths (default 256 ... 8192).
        max_queries: Retrieval: subsample queries; synthetic: queries per length; STS: pairs
            (0: all / the default).
        max_docs: Retrieval: documents kept (relevant ones + distractors); synthetic:
            candidate documents per length (0: all / the default).
        synthetic_tokenizer: Tokenizer that measures synthetic lengths.
        haystack: Folder of Paul Graham essays (needle).

    Returns:
        The :class:`DataItem` list.

    Raises:
        FileNotFoundError: if ``spec`` is none of the above (the message says what was
            expected).
    """
    lengths = list(context_lengths or DEFAULT_CONTEXT_LENGTHS)
    key = spec.strip().lower()
    if key.endswith("-spans") and key[: -len("-spans")] in SYNTHETIC_TASKS:
        task = key[: -len("-spans")]
        n_docs = max_docs or 100
        gen = generate_all(task, lengths, seed=seed, n_docs=n_docs,  # type: ignore[arg-type]
                           n_queries=min(max_queries or 50, n_docs),
                           tokenizer=synthetic_tokenizer, haystack=haystack)
        return [DataItem("spans", key, "test", spans_from_synthetic(d), context_length=c)
                for c, d in gen.items()]
    if key in SYNTHETIC_TASKS:
        n_docs = max_docs or 100
        n_queries = min(max_queries or 50, n_docs)
        gen = generate_all(key, lengths, seed=seed, n_docs=n_docs, n_queries=n_queries,  # type: ignore[arg-type]
                           tokenizer=synthetic_tokenizer, haystack=haystack)
        return [DataItem("retrieval", key, "test", d, context_length=c) for c, d in gen.items()]
    if key.startswith("longembed:"):
        task = spec.split(":", 1)[1].strip()
        if task.lower() in SYNTHETIC_TASKS:
            return [DataItem("retrieval", f"{task.lower()}-longembed", "test",
                             load_longembed(LONGEMBED_HUB, task=task, context_length=c),
                             context_length=c) for c in lengths]
        data = load_longembed(LONGEMBED_HUB, task=task)
        return [DataItem("retrieval", data.name, split, _sub(data, max_queries, max_docs, seed))]
    path = Path(spec).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"--data {spec!r}: no such file or folder, and not one of: needle, passkey, "
            "longembed:<task>")
    sts = sts_file(path, split)
    if sts is not None:
        data_s = load_sts(sts, split=split)
        if max_queries:
            data_s = data_s.subsample(max_queries, seed=seed)
        return [DataItem("sts", data_s.name, data_s.split, data_s)]
    if path.is_dir() and has_spans(path, split):
        spans = load_spans(path, split, max_docs=max_docs, max_queries=max_queries, seed=seed)
        return [DataItem("spans", spans.name, split, spans)]
    if path.is_dir() and (path / "qrels" / f"{split}.tsv").exists():
        data = load_beir(path, split=split)
        return [DataItem("retrieval", data.name, split, _sub(data, max_queries, max_docs, seed))]
    if path.is_dir() and (path / "qrels.jsonl").exists():
        try:
            data = load_longembed(path, split=split)
        except ValueError as e:
            if "context_length=" not in str(e):
                raise
            return [DataItem("retrieval", path.name.lower(), "test",
                             load_longembed(path, context_length=c), context_length=c)
                    for c in lengths]
        return [DataItem("retrieval", data.name, split, _sub(data, max_queries, max_docs, seed))]
    raise FileNotFoundError(
        f"--data {spec!r}: expected a BEIR/LongEmbed folder (corpus.jsonl, queries.jsonl and "
        f"qrels/{split}.tsv or qrels.jsonl) or an STS jsonl file / folder with {split}.jsonl "
        "(rows with sentence1, sentence2, score)")


def _sub(data: BeirData, max_queries: int, max_docs: int, seed: int) -> BeirData:
    if max_queries or max_docs:
        return subsample(data, n_queries=max_queries or None, n_docs=max_docs or None, seed=seed)
    return data


def _log(msg: str) -> None:
    print(msg, file=sys.stderr)


def _short(text: str, max_chars: int = 240) -> str:
    """The first sentences of ``text`` up to ``max_chars`` characters (for layouts)."""
    if len(text) <= max_chars:
        return text
    cut = text[:max_chars]
    ends = [m.end() for m in re.finditer(r"[.!?][\"')\]]*\s", cut)]
    return cut[: ends[-1]].strip() if ends else cut


def print_layout(encoder: Any, item: DataItem, *, file: Any = None) -> None:
    """Print the placeholder layout of one input (like the paper's Appendix C example).

    Shows one document (retrieval; its first sentences) or one sentence (STS), and one
    query with its instruction.
    """
    from htp_retrieval.methods import task_instructions

    out = file or sys.stdout
    name = encoder.spec.name
    if isinstance(item.data, StsData):
        print(f"[{name}] layout of one STS sentence:", file=out)
        print(encoder.describe(_short(item.data.sentence1[0])), file=out)
        return
    data = item.data
    doc = _short(data.doc_text(next(iter(data.corpus))))
    print(f"[{name}] layout of one document (first sentences):", file=out)
    print(encoder.describe(doc), file=out)
    if data.queries:
        qi, _ = task_instructions(data.name)
        print(f"[{name}] layout of one query (instruction: {qi!r}):", file=out)
        print(encoder.describe(_short(next(iter(data.queries.values()))), instruction=qi),
              file=out)


def encode_length(encoder: Any, data: BeirData, *, max_length: int | None = None,
                  context_length: int | None = None) -> int:
    """Max text tokens per document that ``eval`` encodes a dataset with.

    Args:
        encoder: An :class:`~htp_retrieval.HTPEncoder` or a tokenizer (it measures the
            texts).
        data: The dataset.
        max_length: An explicit limit (``--max-length``); wins when given.
        context_length: Needle/passkey: the generated length in tokens. The documents were
            measured with the synthetic tokenizer, so in this model's tokens some may be
            longer: the result keeps every document whole (at least ``context_length``).

    Returns:
        ``max_length``, else the covering length of a synthetic set, else 512 tokens.
    """
    if max_length:
        return max_length
    if context_length is None:
        return 512
    tokenizer = getattr(encoder, "tokenizer", encoder)
    texts = [data.doc_text(d) for d in data.corpus]
    ids = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
    return max([context_length, *map(len, ids)])


def _tokenizer(model: str) -> Any:
    """The model's tokenizer alone (no weights), to measure synthetic documents."""
    from transformers import AutoTokenizer

    from htp_retrieval.models import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path(model)[0])


def _make_encoder(settings: EvalSettings, config: HTPConfig) -> Any:
    from htp_retrieval.encoder import HTPEncoder

    return HTPEncoder(
        settings.model, config, device=settings.device, dtype=settings.dtype,
        padding_side=settings.padding_side, batch_size=settings.batch_size,
        max_tokens_per_batch=settings.max_tokens_per_batch)


def check_config_settings(settings: EvalSettings) -> None:
    """Refuse sweep and setting fields beside a whole config (they would be ignored).

    Raises:
        ValueError: naming each field that is set, and the method mismatch if any.
    """
    assert settings.config is not None
    cfg = settings.config
    set_fields = [name for name in ("tp_start", "tp_exit", "output_layer", "max_blocks",
                                    "min_block_tokens", "long_budget", "short_budget",
                                    "preset", "max_lengths")
                  if getattr(settings, name) not in (None, [], ())]
    set_fields += [n for n, v in (("ks", settings.ks), ("ns", settings.ns))
                   if list(v) != [None]]
    if settings.segmenter != "sentencizer" and settings.segmenter != cfg.segmenter:
        set_fields.append("segmenter")
    if set_fields:
        raise ValueError(f"settings {set_fields} are given with a whole config: put them in "
                         "the config (htp-retrieval config ... --output FILE) instead")
    methods = [get_method(m).name for m in settings.methods]
    if methods != [cfg.method]:
        raise ValueError(f"methods {methods} differ from the config's method "
                         f"{cfg.method!r}: one config evaluates one method")


def result_paths(
    settings: EvalSettings, point: RunPoint, item: DataItem, *, tokenizer: Any = None,
    center_label: str = "",
) -> tuple[HTPConfig, list[tuple[str | None, dict[str, Any], Path]]]:
    """Where the results of one sweep point on one data item go, without running it.

    Args:
        settings: The run's settings.
        point: The sweep point.
        item: The data item (its kind, name, split and synthetic context length are read;
            a synthetic task without ``point.max_length`` needs ``tokenizer`` to measure
            its documents, :func:`encode_length`).
        tokenizer: The model's tokenizer, for that case.
        center_label: The centring sample's label, when scores are also centred.

    Returns:
        ``(config, [(chunking, run, path)])``: the resolved config and, per chunking
        (``None`` for data without evidence spans), the run identity
        (:func:`point_run`) and ``<output>/<model>/<dataset>-<split>/<method>__<digest>.json``.

    Raises:
        ValueError: for an invalid setting, or a synthetic task to measure without a
            tokenizer.
    """
    model_dir = settings.model.replace("/", "__")
    if model_dir.endswith(".gguf"):
        model_dir = Path(model_dir).stem
    out_dir = Path(settings.output) / _safe(model_dir) / f"{item.name}-{item.split}"
    covering = None
    if point.max_length is None and item.context_length is not None and settings.config is None:
        if tokenizer is None:
            raise ValueError(f"{item.name}: a synthetic task without --max-length needs the "
                             "model's tokenizer to measure its documents")
        covering = encode_length(tokenizer, item.documents, context_length=item.context_length)
    cfg = point_config(settings, point, item, max_length=covering)
    chunkings = list(settings.chunkings) if item.kind == "spans" else [None]
    planned = []
    for c in chunkings:
        run = point_run(settings, cfg, item, chunking=c, center_label=center_label)
        planned.append((c, run, out_dir / result_file_name(run)))
    return cfg, planned


def run_eval(items: Sequence[DataItem], settings: EvalSettings) -> list[RetrievalResult]:
    """Evaluate every item at every sweep point; one results JSON each (reused if present).

    Retrieval items go through :func:`~htp_retrieval.eval.retrieval.run_retrieval` (with
    corpus checkpointing in ``<name>.partial/``), STS items through
    :func:`~htp_retrieval.eval.sts.run_sts`. Each saved result has ``config["command"]``,
    and synthetic ones ``config["context_length"]`` and ``config["synthetic"]`` (seed,
    tokenizer, generator version); needle/passkey scores include ``Acc@1``.

    Returns:
        The results in run order (loaded ones included).

    Raises:
        ValueError: before any model loads, for a ``--config`` that conflicts with the
            settings, or a ``--center-queries`` sample of only evaluated texts
            (:func:`~htp_retrieval.eval.centred.check_sample`).
    """
    if settings.config is not None:
        check_config_settings(settings)
    sample: list[str] | str | None = None
    center_label = ""
    if settings.center_queries:
        from htp_retrieval.eval.centred import check_sample, evaluated_texts, read_query_sample

        sample, center_label = read_query_sample(settings.center_queries)
        for item in items:
            check_sample(sample, evaluated_texts(item.data), spec=settings.center_queries,
                         split=f"{item.name} {item.split}")
    center = dict(center_queries=sample, center_label=center_label, seed=settings.seed)
    results: list[RetrievalResult] = []
    # recorded in each new result; one value per call, so that the cost ratios pair
    # results timed together (:func:`~htp_retrieval.eval.report.same_eval_call`)
    command = settings.command or (
        f"run_eval (Python API) {time.strftime('%Y-%m-%dT%H:%M:%S')} pid {os.getpid()}")
    shown: set[str] = set()
    tokenizer: Any = None
    for item in items:
        if settings.max_lengths:
            lengths: list[int | None] = list(settings.max_lengths)
        else:
            # synthetic tasks cover their context; chunk-level runs use the model's window
            lengths = ([None] if item.context_length is not None or item.kind == "spans"
                       else [512])
        for point in sweep_points(settings.methods, max_lengths=lengths, ks=settings.ks,
                                  ns=settings.ns):
            if (point.max_length is None and item.context_length is not None
                    and settings.config is None):
                tokenizer = tokenizer or _tokenizer(settings.model)
            cfg, planned = result_paths(settings, point, item, tokenizer=tokenizer,
                                        center_label=center_label)
            label = point_label(point, settings)
            enc = None
            if settings.verbose and point.method.name not in shown:
                shown.add(point.method.name)
                enc = _make_encoder(settings, cfg)
                print_layout(enc, item)
            for chunking, run, path in planned:
                tag = f"{label} [{chunking} chunks]" if chunking else label
                if path.exists() and not settings.overwrite:
                    _log(f"[{tag}] reusing {path} (--overwrite to recompute)")
                    results.append(RetrievalResult.load(path))
                    continue
                enc = enc or _make_encoder(settings, cfg)
                _log(f"[{tag}] {item.name}-{item.split}: encoding -> {path.name}")
                if chunking is not None:
                    res = _run_spans(enc, item, settings, chunking, path, center)
                elif isinstance(item.data, StsData):
                    res = run_sts(enc, item.data, show_progress_bar=settings.show_progress_bar,
                                  **center)
                else:
                    res = run_retrieval(
                        enc, item.data, split=item.split,
                        show_progress_bar=settings.show_progress_bar,
                        checkpoint_dir=path.with_name(path.stem + ".partial"),
                        chunk_size=settings.chunk_size, chunk_chars=settings.chunk_chars,
                        metrics=SYNTHETIC_METRICS if item.context_length is not None else None,
                        **center)
                    if isinstance(item.data, SyntheticData):
                        res.query_meta = synthetic_query_meta(item.data)
                res.dataset = item.name
                _save(res, path, run=run, label=label, command=command, item=item,
                      settings=settings)
                if chunking is not None:
                    s = res.scores
                    _log(f"[{tag}] NDCG@10 in-corpus {s['NDCG@10']:.2f}, in-document "
                         f"{s['NDCG@10' + IN_DOC]:.2f} -> {path}")
                else:
                    main_score = next(iter(res.scores.items()))
                    _log(f"[{tag}] {main_score[0]} {main_score[1]:.2f} -> {path}")
                results.append(res)
    return results


def _save(res: RetrievalResult, path: Path, *, run: dict[str, Any], label: str, command: str,
          item: DataItem, settings: EvalSettings) -> None:
    """Record the run, its label, the command and the data settings in ``res`` and write
    it; its checkpoint folder goes."""
    res.run = run
    res.label = label
    res.config["command"] = command
    res.config.update(settings.extra_config)
    if item.context_length is not None:
        res.config["context_length"] = item.context_length
        if isinstance(item.data, SyntheticData):
            res.config["synthetic"] = {
                "task": item.data.task, "seed": item.data.seed,
                "tokenizer": item.data.tokenizer, "generator_version": GENERATOR_VERSION}
        elif isinstance(item.data, SpanData):  # the needle variant of the chunk eval
            res.config["synthetic"] = {"task": item.name, "seed": settings.seed,
                                       "tokenizer": settings.synthetic_tokenizer,
                                       "generator_version": GENERATOR_VERSION}
    res.save(path)
    shutil.rmtree(path.with_name(path.stem + ".partial"), ignore_errors=True)


def _run_spans(enc: Any, item: DataItem, settings: EvalSettings, chunking: str, path: Path,
               center: dict[str, Any]) -> RetrievalResult:
    """One chunk-level result (checkpointed in ``<path>.partial/``)."""
    assert isinstance(item.data, SpanData)
    return run_chunk_retrieval(
        enc, item.data, split=item.split, chunking=chunking,
        chunk_tokens=settings.chunk_tokens, chunk_overlap=settings.chunk_overlap,
        window_tokens=settings.late_window,
        checkpoint_dir=path.with_name(path.stem + ".partial"),
        show_progress_bar=settings.show_progress_bar, **center)


def _score_columns(group: list[RetrievalResult]) -> list[str]:
    from htp_retrieval.eval.centred import CENTRED

    keys = set().union(*(r.scores for r in group))
    if "Spearman" in keys:
        return [c for c in ("Spearman", "Spearman" + CENTRED) if c in keys or c == "Spearman"]
    cols = ["Acc@1", "NDCG@10"] if "Acc@1" in keys else ["NDCG@10", "Recall@100"]
    if "NDCG@10 in-doc" in keys:
        cols = ["NDCG@10", "NDCG@10 in-doc"]
    return [c for col in cols for c in (col, col + CENTRED) if c in keys or c == col]


def _block_cells(config: dict[str, Any]) -> tuple[str, str]:
    spec = METHODS.get(config.get("method", ""))
    if spec is None:
        return str(config.get("k", "-")), str(config.get("tokens_per_block", "-"))
    uses_n = _spec_uses_n(spec)
    uses_k = _spec_uses_k(spec) or (uses_n and config.get("tokens_per_block") == "auto")
    return (str(config.get("k")) if uses_k else "-",
            str(config.get("tokens_per_block")) if uses_n else "-")


def format_results(results: Sequence[RetrievalResult], *, baseline: str = "vanilla-mean") -> str:
    """Markdown tables, one per dataset/split/context length/max length, with cost ratios.

    Each table lists every result of its group with the scores, encode time (s), text
    tokens/s, peak memory (MiB) and the time and memory ratios to ``baseline`` from the same
    group measured by the same ``eval`` call on the same machine
    (:func:`~htp_retrieval.eval.report.same_eval_call`; ``n/a`` without one: a result reused
    from an earlier call, or resumed from a checkpoint, was timed under other load).
    """
    from htp_retrieval.eval.report import same_eval_call

    groups: dict[tuple, list[RetrievalResult]] = {}
    for r in results:
        key = (r.dataset, r.split, r.config.get("context_length"), r.config.get("max_length"))
        groups.setdefault(key, []).append(r)
    blocks = []
    for (dataset, split, ctx, max_len), group in groups.items():
        cols = _score_columns(group)
        title = f"### {dataset} ({split})"
        if ctx is not None:
            title += f", context length {ctx} tokens"
        title += f", max length {max_len}"
        bases = [r for r in group if r.config.get("method") == baseline]
        head = ("| method | K | N | " + " | ".join(cols) + " | encode s | text tokens/s "
                f"| peak MiB | time x {baseline} | memory x {baseline} |")
        lines = [title, "", head, "|" + "---|" * (len(cols) + 8)]
        for r in group:
            c = r.cost
            t_ratio = m_ratio = "n/a"
            base = next((b for b in bases if b is r or same_eval_call(b, r)),
                        None)
            if base is not None:
                bt = base.cost.get("encode_seconds", 0.0)
                bm = base.cost.get("peak_memory_bytes", 0)
                t_ratio = f"{c['encode_seconds'] / bt:.2f}" if bt > 0 else "n/a"
                m_ratio = f"{c['peak_memory_bytes'] / bm:.2f}" if bm > 0 else "n/a"
            k, n = _block_cells(r.config)
            scores = " | ".join(f"{r.scores[s]:.2f}" if s in r.scores else "n/a" for s in cols)
            method = str(r.config.get("method"))
            if r.config.get("chunking"):  # chunk-level results: which chunk embedding
                method += f" [{r.config['chunking']} {r.config.get('chunk_tokens')}]"
            lines.append(
                f"| {method} | {k} | {n} | {scores} "
                f"| {c.get('encode_seconds', 0.0):.1f} | {c.get('tokens_per_second', 0.0):.0f} "
                f"| {c.get('peak_memory_bytes', 0) / 2**20:.0f} | {t_ratio} | {m_ratio} |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


__all__ = ["DataItem", "RunPoint", "EvalSettings", "parse_list", "sweep_points",
           "point_config", "point_run", "point_label", "chunking_settings", "result_paths", "resolve_data", "run_eval", "format_results", "print_layout",
           "K_ABLATION", "SYNTHETIC_METRICS"]
