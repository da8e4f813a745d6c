"""Eval runs over datasets and sweeps: what ``htp-retrieval eval`` and the parity commands run.

A run is a set of :class:`DataItem` (a BEIR/LongEmbed split, a synthetic task at one context
length, or an STS split) times a set of :class:`RunPoint` (method x max length x K x N). Each
pair gives one results JSON, ``<output>/<model>/<dataset>-<split>/<name>.json``, whose name
encodes the point (:func:`result_name`); an existing file is reused unless ``overwrite``.

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
from htp_retrieval.eval.retrieval import RetrievalResult, run_retrieval
from htp_retrieval.eval.sts import StsData, load_sts, run_sts, sts_file
from htp_retrieval.eval.synthetic import (
    DEFAULT_CONTEXT_LENGTHS,
    GENERATOR_VERSION,
    SYNTHETIC_TASKS,
    SyntheticData,
    generate_all,
    synthetic_query_meta,
)
from htp_retrieval.layout import as_long_budget, same_block_budgets
from htp_retrieval.methods import METHODS, MethodSpec, get_method
from htp_retrieval.models import (
    DEFAULT_MODEL,
    default_long_budget,
    default_short_budget,
    model_type_of,
)

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
        chunk_size: Documents per corpus checkpoint chunk.
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
        center_queries: Also score every retrieval result with centred vectors
            (:mod:`htp_retrieval.eval.centred`): a ``DIR:SPLIT`` of a BEIR-format dataset,
            a query file, or ``crossfit``; ``cen-<label>`` in the result name. STS results
            are not centred (an error).
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
    chunk_size: int = 1024
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


def effective_min_block_tokens(spec: MethodSpec, settings: EvalSettings) -> int | None:
    """The density cap T a run of ``spec`` uses, as its result name records it.

    ``--min-block-tokens`` wins (``0``: no cap); else the method's default
    (:attr:`MethodSpec.min_block_tokens`, 64 for ``htp``). Under a calibration preset
    without the flag the preset decides and the name carries the preset instead.
    ``None`` for methods without sentence blocks and for uncapped runs, so results of
    ``htp`` made before T became its default (no cap) keep their names: they are the
    ``--min-block-tokens 0`` variant.
    """
    if not _spec_uses_k(spec):
        return None
    if settings.min_block_tokens is not None:
        return settings.min_block_tokens or None
    return None if settings.preset else spec.min_block_tokens


def explicit_max_blocks(spec: MethodSpec, settings: EvalSettings) -> int | None:
    """The block budget B a result name records: ``--max-blocks`` when it is not the default.

    ``None`` (no ``mb`` part) for methods without sentence blocks, without the flag, and
    when the flag equals the method's default (:attr:`MethodSpec.max_blocks`, 32 for
    ``htp``; ``0`` is fixed K), so ``--max-blocks 32`` and no flag share one result file.
    Under a calibration preset the flag always shows, as the preset's budget may differ.
    """
    if settings.max_blocks is None or not _spec_uses_k(spec):
        return None
    if not settings.preset and settings.max_blocks == (spec.max_blocks or 0):
        return None
    return settings.max_blocks


def explicit_long_budget(
    spec: MethodSpec, settings: EvalSettings, max_text_tokens: int, *,
    model_type: str | None = None,
) -> str | None:
    """The long-text budget a result name records: ``lb<L>-<B_L>``, or ``lb0`` for none.

    The budget is the flag's, else the model family's where its preset sets one
    (:func:`htp_retrieval.models.default_long_budget`, ``model_type``), and it is named
    relative to the method's own default. ``None`` (no ``lb`` part) for methods without
    sentence blocks, for the method's own budget, and for any budget that gives every
    document of up to ``max_text_tokens`` the same block budget as the method's default
    (:func:`htp_retrieval.layout.same_block_budgets`, with the run's B and T): at 512
    tokens, or with B = 8, ``(1024, 8)`` never binds, so such runs share their file with
    the default. Under a calibration preset the flag always shows, and without the flag
    the preset's name stands for its budget.
    """
    if not _spec_uses_k(spec):
        return None
    if settings.long_budget is None:
        if settings.preset:
            return None
        run = default_long_budget(spec.long_budget, model_type)
        if run == spec.long_budget:
            return None
    else:
        run = as_long_budget(settings.long_budget)
    tag = "lb0" if run is None else f"lb{run[0]}-{run[1]}"
    if settings.preset:
        return tag
    b = spec.max_blocks if settings.max_blocks is None else settings.max_blocks or None
    t = effective_min_block_tokens(spec, settings)
    if same_block_budgets((b, t, run), (b, t, spec.long_budget),  # type: ignore[arg-type]
                          max_text_tokens):
        return None
    return tag


def explicit_short_budget(
    spec: MethodSpec, settings: EvalSettings, max_text_tokens: int, *,
    model_type: str | None = None,
) -> str | None:
    """The short-text budget a result name records: ``sb<S>-<B_S>``.

    The budget is the flag's, else the model family's
    (:func:`htp_retrieval.models.default_short_budget`, ``model_type``). ``None`` (no ``sb``
    part) for methods without sentence blocks, for no short budget, and for one that gives
    no document of up to ``max_text_tokens`` fewer blocks than the run's other caps would
    (``(64, 1)`` with T = 64 never binds), so such runs share their file with runs made
    without it. Under a calibration preset without the flag, the preset's name stands for
    its budget.
    """
    if not _spec_uses_k(spec):
        return None
    if settings.short_budget is None:
        if settings.preset:
            return None
        run = default_short_budget(spec, model_type)
    else:
        run = as_long_budget(settings.short_budget, name="short_budget")
    if run is None:
        return None
    b = spec.max_blocks if settings.max_blocks is None else settings.max_blocks or None
    t = effective_min_block_tokens(spec, settings)
    lb = (default_long_budget(spec.long_budget, model_type) if settings.long_budget is None
          else as_long_budget(settings.long_budget))
    if same_block_budgets((b, t, lb, run), (b, t, lb, None), min(run[0], max_text_tokens)):
        return None
    return f"sb{run[0]}-{run[1]}"


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


def result_name(
    point: RunPoint,
    settings: EvalSettings,
    *,
    context_length: int | None = None,
    model_type: str | None = None,
) -> str:
    """File name of a result: ``<method>__len<L>[__ctx<C>][__k<K>][__n<N>][...].json``.

    The parts after the method appear only when set: ``len`` (max length; absent for a
    synthetic task that covers its context length), ``ctx`` (synthetic context length),
    ``k``, ``n``, ``mb<B>`` (adaptive-K block budget, for sentence-block methods, when it
    is not the method's default: :func:`explicit_max_blocks`), ``lb<L>-<B_L>`` (a
    long-text budget that differs from the method's default, the flag's or the family's
    of ``model_type``: :func:`explicit_long_budget`), ``sb<S>-<B_S>`` (a short-text
    budget that binds: :func:`explicit_short_budget`),
    ``mbt<T>`` (the density cap the run uses, :func:`effective_min_block_tokens`),
    ``tp<start>-<exit>``, ``out<layer>``, the segmenter (if not the default),
    ``preset-<stem>`` (a calibration preset),
    ``q<Q>d<D>s<seed>`` (subsampling), ``seed<S>`` (synthetic seed when not 0), ``tok-<name>``
    (non-default synthetic tokenizer), ``float32``/``float16`` (the weight dtype the run
    resolves to, when it is not bfloat16, so a result is never reused across dtypes).
    """
    parts = [_safe(point.method.name)]
    if settings.config is not None:
        parts.append(f"cfg-{settings.config.digest()}")
        point = RunPoint(point.method, None)  # the config holds every setting
    if point.max_length is not None:
        parts.append(f"len{point.max_length}")
    if context_length is not None:
        parts.append(f"ctx{context_length}")
    if point.k is not None:
        parts.append(f"k{point.k}")
    if point.n is not None:
        parts.append(f"n{point.n}")
    if settings.config is not None:
        return "__".join(parts + _data_tags(settings, context_length)) + ".json"
    mb = explicit_max_blocks(point.method, settings)
    if mb is not None:
        parts.append(f"mb{mb}")
    lb = explicit_long_budget(point.method, settings,
                              point.max_length or context_length or 512, model_type=model_type)
    if lb is not None:
        parts.append(lb)
    sb = explicit_short_budget(point.method, settings,
                               point.max_length or context_length or 512, model_type=model_type)
    if sb is not None:
        parts.append(sb)
    mbt = effective_min_block_tokens(point.method, settings)
    if mbt is not None:
        parts.append(f"mbt{mbt}")
    if settings.tp_start is not None or settings.tp_exit is not None:
        a, b = ("" if v is None else v for v in (settings.tp_start, settings.tp_exit))
        parts.append(f"tp{a}-{b}")  # an empty side is the model preset
    if settings.output_layer is not None:
        parts.append(f"out{settings.output_layer}")
    if settings.segmenter != "sentencizer":
        parts.append(settings.segmenter)
    if settings.preset:
        parts.append("preset-" + _safe(Path(settings.preset).stem))
    return "__".join(parts + _data_tags(settings, context_length)) + ".json"


def _data_tags(settings: EvalSettings, context_length: int | None) -> list[str]:
    """Name parts of the data and the dtype: subsample, synthetic seed and tokenizer,
    and the weight dtype when it is not bfloat16."""
    parts = []
    if settings.max_queries or settings.max_docs:
        parts.append(f"q{settings.max_queries}d{settings.max_docs}s{settings.seed}")
    elif context_length is not None and settings.seed:
        parts.append(f"seed{settings.seed}")
    if context_length is not None and settings.synthetic_tokenizer:
        parts.append("tok-" + _safe(settings.synthetic_tokenizer))
    dtype = resolve_dtype(settings.dtype, settings.device)
    if dtype != "bfloat16":
        parts.append(dtype)
    if settings.center_queries:
        from htp_retrieval.eval.centred import sample_label

        parts.append("cen-" + _safe(sample_label(settings.center_queries)))
    return parts


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
        encoder: An :class:`~htp_retrieval.HTPEncoder` (its tokenizer measures the texts).
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
    texts = [data.doc_text(d) for d in data.corpus]
    ids = encoder.tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
    return max([context_length, *map(len, ids)])


def _make_encoder(settings: EvalSettings, point: RunPoint, item: DataItem) -> Any:
    from htp_retrieval.encoder import HTPEncoder

    if settings.config is not None:  # evaluated exactly as configured
        return HTPEncoder(
            settings.model, settings.config, device=settings.device, dtype=settings.dtype,
            padding_side=settings.padding_side, batch_size=settings.batch_size,
            max_tokens_per_batch=settings.max_tokens_per_batch)
    enc = HTPEncoder(
        settings.model, point.method, k=point.k, tokens_per_block=point.n,
        segmenter=settings.segmenter,  # type: ignore[arg-type]
        max_blocks=settings.max_blocks if _spec_uses_k(point.method) else None,
        min_block_tokens=settings.min_block_tokens if _spec_uses_k(point.method) else None,
        long_budget=settings.long_budget if _spec_uses_k(point.method) else None,
        short_budget=settings.short_budget if _spec_uses_k(point.method) else None,
        **({"max_length": point.max_length, "overflow": "error"} if item.kind == "spans" else
           {"max_length": point.max_length or item.context_length or 512,
            "overflow": "truncate"}),
        tp_start=settings.tp_start, tp_exit=settings.tp_exit,
        output_layer=settings.output_layer, device=settings.device, dtype=settings.dtype,
        padding_side=settings.padding_side,  # type: ignore[arg-type]
        batch_size=settings.batch_size, max_tokens_per_batch=settings.max_tokens_per_batch,
        preset=settings.preset,
    )
    if point.max_length is None and item.context_length is not None:
        assert isinstance(item.data, BeirData)
        enc.max_length = encode_length(enc, item.data, context_length=item.context_length)
    return enc


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


def run_eval(items: Sequence[DataItem], settings: EvalSettings) -> list[RetrievalResult]:
    """Evaluate every item at every sweep point; one results JSON each (reused if present).

    Retrieval items go through :func:`~htp_retrieval.eval.retrieval.run_retrieval` (with
    corpus checkpointing in ``<name>.partial/``), STS items through
    :func:`~htp_retrieval.eval.sts.run_sts`. Each saved result has ``config["command"]``,
    and synthetic ones ``config["context_length"]`` and ``config["synthetic"]`` (seed,
    tokenizer, generator version); needle/passkey scores include ``Acc@1``.

    Returns:
        The results in run order (loaded ones included).
    """
    if settings.config is not None:
        check_config_settings(settings)
    sample: list[str] | str | None = None
    label = ""
    if settings.center_queries:
        from htp_retrieval.eval.centred import read_query_sample

        if any(isinstance(it.data, StsData) for it in items):
            raise ValueError("--center-queries applies to retrieval data; STS-B pairs have "
                             "no query side")
        sample, label = read_query_sample(settings.center_queries)
    center = dict(center_queries=sample, center_label=label, seed=settings.seed)
    results: list[RetrievalResult] = []
    # recorded in each new result; one value per call, so that the cost ratios pair
    # results timed together (:func:`~htp_retrieval.eval.report.same_eval_call`)
    command = settings.command or (
        f"run_eval (Python API) {time.strftime('%Y-%m-%dT%H:%M:%S')} pid {os.getpid()}")
    model_dir = settings.model.replace("/", "__")
    if model_dir.endswith(".gguf"):
        model_dir = Path(model_dir).stem
    shown: set[str] = set()
    # the family picks the default long budget a result name records (no weights loaded)
    model_type = model_type_of(settings.model) if any(
        get_method(m).long_budget is not None or get_method(m).min_block_tokens is not None
        for m in settings.methods) else None
    for item in items:
        out_dir = Path(settings.output) / _safe(model_dir) / f"{item.name}-{item.split}"
        if settings.max_lengths:
            lengths: list[int | None] = list(settings.max_lengths)
        else:
            # synthetic tasks cover their context; chunk-level runs use the model's window
            lengths = ([None] if item.context_length is not None or item.kind == "spans"
                       else [512])
        for point in sweep_points(settings.methods, max_lengths=lengths, ks=settings.ks,
                                  ns=settings.ns):
            path = out_dir / result_name(point, settings, context_length=item.context_length,
                                         model_type=model_type)
            label = path.stem
            enc = None
            if settings.verbose and point.method.name not in shown:
                shown.add(point.method.name)
                enc = _make_encoder(settings, point, item)
                print_layout(enc, item)
            if path.exists() and not settings.overwrite:
                _log(f"[{label}] reusing {path} (--overwrite to recompute)")
                results.append(RetrievalResult.load(path))
                continue
            enc = enc or _make_encoder(settings, point, item)
            _log(f"[{label}] {item.name}-{item.split}: encoding ...")
            if isinstance(item.data, SpanData):
                for chunking in settings.chunkings:
                    results.append(_run_spans(enc, item, settings, chunking, path, command,
                                              center))
                continue
            if isinstance(item.data, StsData):
                res = run_sts(enc, item.data, show_progress_bar=settings.show_progress_bar)
                ckpt = None
            else:
                ckpt = path.with_name(path.stem + ".partial")
                res = run_retrieval(
                    enc, item.data, split=item.split,
                    show_progress_bar=settings.show_progress_bar, checkpoint_dir=ckpt,
                    chunk_size=settings.chunk_size,
                    metrics=SYNTHETIC_METRICS if item.context_length is not None else None,
                    **center)
                if isinstance(item.data, SyntheticData):
                    res.query_meta = synthetic_query_meta(item.data)
            res.dataset = item.name
            res.config["command"] = command
            res.config.update(settings.extra_config)
            if item.context_length is not None:
                res.config["context_length"] = item.context_length
                if isinstance(item.data, SyntheticData):
                    res.config["synthetic"] = {
                        "task": item.data.task, "seed": item.data.seed,
                        "tokenizer": item.data.tokenizer, "generator_version": GENERATOR_VERSION}
            res.save(path)
            if ckpt is not None:
                shutil.rmtree(ckpt, ignore_errors=True)
            main_score = next(iter(res.scores.items()))
            _log(f"[{label}] {main_score[0]} {main_score[1]:.2f} -> {path}")
            results.append(res)
    return results


def chunk_result_path(path: Path, settings: EvalSettings, chunking: str) -> Path:
    """The result file of one chunking: ``<name>__chunk-<chunking><tokens>[-o<overlap>]
    [-w<window>].json`` beside the point's name."""
    tag = f"chunk-{chunking}{settings.chunk_tokens}"
    if settings.chunk_overlap:
        tag += f"-o{settings.chunk_overlap}"
    if chunking.startswith("late") and settings.late_window:
        tag += f"-w{settings.late_window}"
    return path.with_name(f"{path.stem}__{tag}.json")


def _run_spans(enc: Any, item: DataItem, settings: EvalSettings, chunking: str, path: Path,
               command: str, center: dict[str, Any]) -> RetrievalResult:
    """One chunk-level result (reused if its file exists and ``overwrite`` is off)."""
    assert isinstance(item.data, SpanData)
    out = chunk_result_path(path, settings, chunking)
    if out.exists() and not settings.overwrite:
        _log(f"[{out.stem}] reusing {out} (--overwrite to recompute)")
        return RetrievalResult.load(out)
    _log(f"[{out.stem}] {item.name}-{item.split}: {chunking} chunks ...")
    ckpt = out.with_name(out.stem + ".partial")
    res = run_chunk_retrieval(
        enc, item.data, split=item.split, chunking=chunking,
        chunk_tokens=settings.chunk_tokens, chunk_overlap=settings.chunk_overlap,
        window_tokens=settings.late_window, checkpoint_dir=ckpt,
        show_progress_bar=settings.show_progress_bar, **center)
    res.config["command"] = command
    res.config.update(settings.extra_config)
    if item.context_length is not None:
        res.config["context_length"] = item.context_length
        res.config["synthetic"] = {"task": item.name, "seed": settings.seed,
                                   "tokenizer": settings.synthetic_tokenizer,
                                   "generator_version": GENERATOR_VERSION}
    res.save(out)
    shutil.rmtree(ckpt, ignore_errors=True)
    s = res.scores
    _log(f"[{out.stem}] NDCG@10 in-corpus {s['NDCG@10']:.2f}, in-document "
         f"{s['NDCG@10' + IN_DOC]:.2f} -> {out}")
    return res


def _score_columns(group: list[RetrievalResult]) -> list[str]:
    from htp_retrieval.eval.centred import CENTRED

    keys = set().union(*(r.scores for r in group))
    if "Spearman" in keys:
        return ["Spearman"]
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
    group measured by the same ``eval`` call (``n/a`` without one: a result reused from an
    earlier call was timed under other load).
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
            base = next((b for b in bases if b is r or same_eval_call(b.config, r.config)),
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
           "result_name", "resolve_data", "run_eval", "format_results", "print_layout",
           "K_ABLATION", "SYNTHETIC_METRICS"]
