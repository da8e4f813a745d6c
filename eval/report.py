"""Results report: Markdown tables and PNG plots from a folder of results JSONs.

Reads every results JSON (the shared schema of :class:`~htp_retrieval.eval.retrieval.
RetrievalResult`: ``dataset``, ``split``, ``config``, ``scores``, ``cost``, ``counts``) under
one or more folders or files and writes:

* one Markdown table per **set** (model, dataset, split, subset, context length): method,
  the dataset's scores, encode seconds, text tokens/s, peak MiB and the time and memory
  ratios to the baseline method of the same set, with the command(s) that made it;
* a score-by-length table when a (model, dataset, subset) has several lengths;
* PNG plots (matplotlib, Agg): main score vs context length per method (the paper's Fig. 5,
  and needle/passkey Acc@1 per length), the K ablation (Table 12), sentence vs fixed-token
  blocks (Fig. 7) and cost ratios per method;
* a plain statement, per set, of where HTP does not beat the baseline, in points.

Nothing is hard-coded per dataset: rows differ by whatever config keys vary inside a set,
and those keys become columns. Subsampled runs (``--max-queries``/``--max-docs``, recorded in
each file's ``run``) are kept
apart from full runs and labelled as subsets. Output is sorted and carries no timestamps,
so re-running on the same files gives the same Markdown.
"""

from __future__ import annotations

import json
import math
import os
import re
import textwrap
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from htp_retrieval.eval.chunk_report import format_chunk_table, is_chunk_record, plot_chunk_scores
from htp_retrieval.eval.dtype_report import format_dtype_table, shipped_choice, signed_cell
from htp_retrieval.eval.naming import subset_of_run
from htp_retrieval.eval.retrieval import timed_on_one_machine
from htp_retrieval.methods import METHODS, MethodSpec
from htp_retrieval.models import (
    PACKAGED,
    default_long_budget,
    default_short_budget,
    layer_preset,
)

SCORE_ORDER: tuple[str, ...] = ("Acc@1", "NDCG@10", "Recall@100", "Spearman", "Pearson")
"""Score labels shown in tables, in this order, when a set has them."""
MAIN_SCORE_ORDER: tuple[str, ...] = ("Acc@1", "Spearman", "NDCG@10")
"""The first of these a set has is its main score (plots, HTP-vs-baseline lines)."""
IGNORED_KEYS: frozenset[str] = frozenset(
    {"command", "model", "method", "exit_layer", "n_layers", "max_blocks_recorded",
     "long_budget_recorded", "short_budget_recorded"}
)
"""Config keys never used to tell rows apart (``exit_layer``/``n_layers`` follow from the
model and ``output_layer``; ``command`` is printed above the table)."""
_REQUIRED = ("dataset", "split", "config", "scores")


# --------------------------------------------------------------------------- records
@dataclass(frozen=True)
class Subset:
    """A subsampled run: ``--max-queries``/``--max-docs``/``--seed`` (0 = all)."""

    max_queries: int
    max_docs: int
    seed: int

    @property
    def tag(self) -> str:
        """The file-name tag, ``q30d200s0``."""
        return f"q{self.max_queries}d{self.max_docs}s{self.seed}"


@dataclass
class ResultRecord:
    """One results JSON.

    Attributes:
        path: The file it came from.
        dataset: Dataset name (lower case).
        split: Split name.
        config: Encoder config plus ``command``, instructions, ``context_length`` ...
        scores: Metric label -> percent.
        cost: Cost fields (seconds, bytes, tokens/s); may be empty.
        counts: ``n_docs``, ``n_queries`` ... ; may be empty.
        subset: The subsample, or ``None`` for a full run.
        per_query: Query id -> metric label -> percent (runs since per-query rows were
            recorded); may be empty.
        label: The run's readable label (the method and the settings given explicitly).
        versions: Package versions and the machine that ran it (CPU, cores, device); may
            be empty.
    """

    path: Path
    dataset: str
    split: str
    config: dict[str, Any]
    scores: dict[str, float]
    cost: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, Any] = field(default_factory=dict)
    subset: Subset | None = None
    per_query: dict[str, dict[str, float]] = field(default_factory=dict)
    label: str = ""
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def model(self) -> str:
        """Model name from the config (``?`` if missing)."""
        return str(self.config.get("model", "?"))

    @property
    def method(self) -> str:
        """Method name from the config (``?`` if missing)."""
        return str(self.config.get("method", "?"))

    @property
    def adds_score_only(self) -> bool:
        """Whether the run also set something that only adds scores beside the plain ones
        (:data:`SCORE_ONLY_KEYS`, e.g. ``eval --center-queries``)."""
        return any(self.config.get(k) for k in SCORE_ONLY_KEYS)

    @property
    def length_key(self) -> str:
        """``context_length`` for synthetic tasks, else ``max_length``."""
        return "context_length" if self.config.get("context_length") is not None else "max_length"

    @property
    def length(self) -> int | None:
        """Context length in tokens (``context_length`` or ``max_length``)."""
        v = self.config.get(self.length_key)
        return int(v) if v is not None else None


def _subset_of(raw: dict[str, Any], config: dict[str, Any]) -> Subset | None:
    """The subsample of a results JSON: its ``run`` (:func:`~htp_retrieval.eval.naming.
    subset_of_run`), else ``max_queries``/``max_docs``/``seed`` in its config."""
    found = subset_of_run(raw.get("run") or {})
    if found:
        return Subset(*found)
    q, d = config.get("max_queries") or 0, config.get("max_docs") or 0
    if q or d:
        return Subset(int(q), int(d), int(config.get("seed") or 0))
    return None


MTEB_SKIP_REASON = "mteb output (htp-retrieval mteb), not the results schema"


def _is_mteb_file(raw: Any) -> bool:
    """An mteb ``TaskResult`` JSON or its ``model_meta.json``."""
    return isinstance(raw, dict) and (
        ("task_name" in raw and "mteb_version" in raw)
        or ("loader" in raw and "framework" in raw and "experiment_kwargs" in raw))


def default_long_budget_of(spec: MethodSpec, model: object) -> tuple[int, int] | None:
    """The long-text budget ``spec`` runs with by default on the model a record names.

    Args:
        spec: The record's method.
        model: ``config["model"]``; a packaged name gives its family
            (:attr:`~htp_retrieval.models.PackagedModel.model_type`), whose
            :class:`~htp_retrieval.models.LayerPreset` may set its own budget. Other models
            (paths, hub ids: the report loads no model config) count with the method's.

    Returns:
        ``(L, B_L)``, or ``None`` for a method without a long budget.
    """
    return default_long_budget(spec.long_budget, _family_of(model))


def _family_of(model: object) -> str | None:
    """``model_type`` of a packaged model name (``config["model"]``), else ``None`` (the
    report loads no model config)."""
    return PACKAGED[model].model_type if isinstance(model, str) and model in PACKAGED else None


def read_result(path: str | Path) -> ResultRecord:
    """Read one results JSON.

    Raises:
        ValueError: if the file is not valid JSON or lacks a schema key (the message
            names the file and the key).
    """
    p = Path(path)
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{p}: not a JSON file ({e})") from e
    if not isinstance(raw, dict):
        raise ValueError(f"{p}: not a results JSON (top level is {type(raw).__name__})")
    if _is_mteb_file(raw):
        raise ValueError(f"{p}: {MTEB_SKIP_REASON}")
    for key in _REQUIRED:
        if key not in raw:
            raise ValueError(f"{p}: not a results JSON (no {key!r} key)")
    config = dict(raw["config"])
    cen = config.get("centering")
    if isinstance(cen, dict):  # a measurement record; rows differ only by its sample
        config["centering"] = cen.get("query_sample") or cen.get("sentence_sample") or "yes"
    return ResultRecord(
        path=p,
        dataset=str(raw["dataset"]),
        split=str(raw["split"]),
        config=config,
        scores={k: float(v) for k, v in raw["scores"].items() if _is_number(v)},
        cost=dict(raw.get("cost") or {}),
        counts=dict(raw.get("counts") or {}),
        subset=_subset_of(raw, config),
        per_query=dict(raw.get("per_query") or {}),
        label=str(raw.get("label") or ""),
        versions={k: str(v) for k, v in (raw.get("versions") or {}).items()},
    )


def load_results(
    paths: Iterable[str | Path],
) -> tuple[list[ResultRecord], list[tuple[Path, str]]]:
    """Read results JSONs from folders (recursively) and files.

    Files inside ``*.partial`` checkpoint folders are not results and are passed over.
    JSONs found in a folder that are not results files (e.g. mteb's own output) are
    skipped and listed; a file named explicitly must be a results JSON.

    Args:
        paths: Folders and/or files.

    Returns:
        ``(records sorted by path, [(skipped path, reason)])``.

    Raises:
        FileNotFoundError: if a path does not exist.
        ValueError: if an explicitly named file is not a results JSON.
    """
    records: dict[Path, ResultRecord] = {}
    skipped: list[tuple[Path, str]] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise FileNotFoundError(f"results path not found: {p}")
        if p.is_file():
            records[p.resolve()] = read_result(p)
            continue
        for f in sorted(p.rglob("*.json")):
            if any(part.endswith(".partial") for part in f.relative_to(p).parts[:-1]):
                continue
            try:
                records[f.resolve()] = read_result(f)
            except ValueError as e:
                skipped.append((f, str(e).split(": ", 1)[-1]))
    return sorted(records.values(), key=lambda r: str(r.path)), skipped


# --------------------------------------------------------------------------- grouping
def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def key_is_relevant(method: str, key: str) -> bool:
    """Whether a config key changes the embeddings of ``method``.

    K, the adaptive-K budget (``max_blocks``, ``min_block_tokens``, ``long_budget``,
    ``short_budget``) and the
    segmenter matter only for sentence blocks, N only for fixed-token blocks, the ``<PST>``
    summary only for block placeholders, the copy range and placeholder init only for
    methods with placeholders. Unknown methods and other keys: always relevant.
    """
    spec = METHODS.get(method)
    if spec is None:
        return True
    blocks = spec.placeholders in ("local", "hierarchical")
    if key in ("k", "segmenter", "max_blocks", "min_block_tokens", "long_budget",
               "short_budget"):
        return blocks and spec.blocks == "sentence"
    if key == "tokens_per_block":
        return blocks and spec.blocks == "tokens"
    if key == "summary":
        return blocks
    if key in ("tp_start", "tp_exit", "placeholder_init"):
        return spec.uses_rewiring
    return True


def _sort_value(v: Any) -> tuple[int, Any]:
    if v is None or v == "":  # "": an empty text setting (no bare prefix) reads as none
        return (2, "")
    if _is_number(v):
        return (0, float(v))
    return (1, json.dumps(v, sort_keys=True) if not isinstance(v, str) else v)


def _method_rank(method: str) -> tuple[int, str]:
    names = list(METHODS)
    return (names.index(method), "") if method in names else (len(names), method)


def varying_keys(records: Sequence[ResultRecord], *, exclude: Iterable[str] = ()) -> list[str]:
    """Config keys whose relevant values differ across ``records`` (sorted).

    A key counts only where it is relevant to the record's method
    (:func:`key_is_relevant`), so ``k`` varying among HTP rows makes a column while the
    ``k`` recorded for vanilla-mean does not.
    """
    skip = set(IGNORED_KEYS) | set(exclude)
    keys = sorted({k for r in records for k in r.config} - skip)
    out = []
    for k in keys:
        vals = {json.dumps(r.config.get(k), sort_keys=True) for r in records
                if key_is_relevant(r.method, k)}
        if len(vals) > 1:
            out.append(k)
    return out


def _spec_defaults(method: str, model: object = None) -> dict[str, Any]:
    """Config values of ``method``'s shipped defaults on ``model`` (``config["model"]``:
    the long budget may be its family's, :func:`default_long_budget_of`), for the keys a
    spec fixes, and for a packaged model the layers its family preset fixes
    (:data:`PRESET_LAYER_KEYS`)."""
    spec = METHODS.get(method)
    if spec is None:
        return {}
    long_budget = default_long_budget_of(spec, model)
    short_budget = default_short_budget(spec, _family_of(model))
    out = {"k": spec.sentences_per_block, "tokens_per_block": spec.tokens_per_block,
           "summary": spec.summary, "max_blocks": spec.max_blocks,
           "min_block_tokens": spec.min_block_tokens, "segmenter": "sentencizer",
           "long_budget": list(long_budget) if long_budget else None,
           "short_budget": list(short_budget) if short_budget else None}
    family = _family_of(model)
    if family is not None:  # a packaged model: its family preset fixes the layers
        pre = layer_preset(family)
        out.update(tp_start=pre.tp_start_for(spec), tp_exit=pre.tp_exit,
                   output_layer=pre.output_layer)
    return out


PRESET_LAYER_KEYS = ("tp_start", "tp_exit", "output_layer")
"""Settings a packaged model's family preset fixes (:class:`~htp_retrieval.models.LayerPreset`)."""

DEVICE_CHOSEN_KEYS = ("dtype",)
"""Settings whose shipped default (``dtype="auto"``) picks a value per device
(:func:`htp_retrieval.dtypes.resolve_dtype`): every recorded value is the default on some
device, so they never make a row off-default; tables still show them where they vary."""

SCORE_ONLY_KEYS = ("centering",)
"""Settings that add scores beside the plain ones without changing the vectors
(``eval --center-queries``, recorded as the query sample's label): they never make a row
off-default; tables and plot labels still show them where they vary."""


def off_preset_layers(record: ResultRecord, keys: Sequence[str] = ()) -> list[str]:
    """Layer settings of ``record`` that differ from its family preset as shipped today,
    leaving out ``keys`` (those a table already shows as columns).

    A result keeps the layers it ran with; when a family preset changes, the older results
    of that family are marked with these settings wherever they are shown, so a row of an
    earlier preset never reads as the shipped method.
    """
    defaults = _spec_defaults(record.method, record.config.get("model"))
    return [k for k in PRESET_LAYER_KEYS
            if k not in keys and k in defaults and key_is_relevant(record.method, k)
            and k in record.config and record.config.get(k) != defaults[k]]


def _settings(record: ResultRecord, keys: Sequence[str]) -> list[str]:
    """``key=value`` of each of ``keys`` in ``record``'s config, as labels show them."""
    return [f"{k}={_fmt_value(record.config.get(k))}" for k in keys]


def method_cell(record: ResultRecord, keys: Sequence[str]) -> str:
    """``method``, plus any layer settings off its family preset (:func:`off_preset_layers`)."""
    off = _settings(record, off_preset_layers(record, keys))
    return record.method + (f" ({', '.join(off)})" if off else "")


def is_shipped(record: ResultRecord, keys: Sequence[str]) -> bool:
    """Whether ``record`` runs its method with the shipped settings for its model.

    Checked: every setting the method's spec fixes (the keys of :func:`_spec_defaults`,
    where the long budget may be the model family's), even where no other row of the table
    varies it, and every one of ``keys`` (the settings that vary where the record is
    shown); only keys that matter to the method (:func:`key_is_relevant`) count (a packaged
    model's preset layers where the record has them). So a lone
    off-default row (fixed K on a subset, the method's long budget on a family with its
    own) is not the shipped htp. Methods with no such key (vanilla-mean, say) are always
    shipped. On needle/passkey a ``max_length`` equal to the context length is the default
    too. Settings ``dtype="auto"`` picks per device (:data:`DEVICE_CHOSEN_KEYS`) and
    settings that only add scores (:data:`SCORE_ONLY_KEYS`) never count against a row.
    """
    spec_defaults = _spec_defaults(record.method, record.config.get("model"))
    defaults = dict(spec_defaults)
    if record.length_key == "context_length":  # needle/passkey: text cut at the context
        defaults["max_length"] = record.length
    checked = {*keys, *(k for k in spec_defaults
                        if k not in PRESET_LAYER_KEYS or k in record.config)}
    checked -= {*DEVICE_CHOSEN_KEYS, *SCORE_ONLY_KEYS}
    return all(k in defaults and record.config.get(k) == defaults[k]
               for k in checked if key_is_relevant(record.method, k))


def variant_label(record: ResultRecord, keys: Sequence[str]) -> str:
    """``method`` plus its relevant varying settings, e.g. ``htp (k=4)``.

    Where settings are listed and every one of them is the method's shipped default
    (:class:`~htp_retrieval.methods.MethodSpec`), the label says so:
    ``htp (min_block_tokens=64, default)``. A packaged model's copy and exit layers
    default to its family preset; a row whose layers differ from the preset shipped today
    lists them even where they do not vary (:func:`off_preset_layers`), e.g.
    ``htp (tp_start=1)``.
    """
    rel = [k for k in keys if key_is_relevant(record.method, k)]
    rel += off_preset_layers(record, rel)
    parts = _settings(record, rel)
    defaults = _spec_defaults(record.method, record.config.get("model"))
    fixed = [k for k in rel if k not in DEVICE_CHOSEN_KEYS and k not in SCORE_ONLY_KEYS]
    if fixed and all(k in defaults and record.config.get(k) == defaults[k] for k in fixed):
        parts.append("default")
    return record.method + (f" ({', '.join(parts)})" if parts else "")


def usual_device_values(records: Sequence[ResultRecord]) -> dict[str, Any]:
    """The most common value of each of :data:`DEVICE_CHOSEN_KEYS` among ``records`` (ties:
    the first in sorted order), for :func:`plot_label`'s ``usual``."""
    out: dict[str, Any] = {}
    for k in DEVICE_CHOSEN_KEYS:
        counts = Counter(json.dumps(r.config.get(k)) for r in records if k in r.config)
        if counts:
            out[k] = json.loads(min(counts, key=lambda v: (-counts[v], v)))
    return out


def plot_label(record: ResultRecord, keys: Sequence[str], *,
               usual: Mapping[str, Any] | None = None) -> str:
    """A short legend label: ``method`` plus only those of its relevant ``keys`` that are
    off the method's shipped default, e.g. ``htp (short_budget=none)``.

    Where none is off, the label is ``method (shipped)`` if the record runs the shipped
    settings (:func:`is_shipped`) and some setting varies in the plot, else ``method``.
    A setting the device picks (:data:`DEVICE_CHOSEN_KEYS`, the dtype) has no single default:
    it is listed where it differs from ``usual`` (the plot's most common value,
    :func:`usual_device_values`; ``None``: always listed), e.g. ``htp (dtype=float32,
    shipped)``. Two records that :func:`variant_label` tells apart get different plot
    labels (they differ in some listed key, so at least one of them is off its default or
    the usual value there), so a plot's colours and legend stay one per variant with a
    fraction of the text. A centring sample (:data:`SCORE_ONLY_KEYS`) is listed where the
    record has one, never as off-default.
    """
    rel = [k for k in keys if key_is_relevant(record.method, k)]
    defaults = _spec_defaults(record.method, record.config.get("model"))
    dev = [k for k in rel if k in DEVICE_CHOSEN_KEYS
           and (usual is None or k not in usual or record.config.get(k) != usual[k])]
    dev += [k for k in rel if k in SCORE_ONLY_KEYS and record.config.get(k) is not None]
    off = [k for k in rel if k not in DEVICE_CHOSEN_KEYS and k not in SCORE_ONLY_KEYS
           and (k not in defaults or record.config.get(k) != defaults[k])]
    off += off_preset_layers(record, rel)
    shipped = (any(k not in DEVICE_CHOSEN_KEYS and k not in SCORE_ONLY_KEYS for k in rel)
               and is_shipped(record, keys))
    if off or dev:
        parts = _settings(record, dev + off)
        if not off and shipped:
            parts.append("shipped")
        return f"{record.method} ({', '.join(parts)})"
    return record.method + (" (shipped)" if shipped else "")


def _row_sort_key(r: ResultRecord, keys: Sequence[str]) -> tuple:
    return (_method_rank(r.method),
            tuple(_sort_value(r.config.get(k) if key_is_relevant(r.method, k) else None)
                  for k in keys),
            str(r.path))


@dataclass
class ResultSet:
    """Results comparable with one another: same model, dataset, split, subset, length.

    Attributes:
        model: Model name.
        dataset: Dataset name.
        split: Split name.
        subset: The subsample (``None``: full split).
        length: Context length in tokens.
        length_key: ``context_length`` or ``max_length``.
        records: Rows, sorted by method (canonical order) then varying keys.
        keys: Config keys that vary inside the set (table columns).
    """

    model: str
    dataset: str
    split: str
    subset: Subset | None
    length: int | None
    length_key: str
    records: list[ResultRecord]
    keys: list[str]

    @property
    def scores(self) -> list[str]:
        """Score labels present, in :data:`SCORE_ORDER`, each followed by its centred
        score where there is one (``eval --center-queries``); else others sorted, at most
        4."""
        have = {s for r in self.records for s in r.scores}
        shown = [c for s in SCORE_ORDER for c in (s, s + " centred") if c in have]
        return shown or sorted(have)[:4]

    @property
    def main_score(self) -> str | None:
        """The set's main score label (see :data:`MAIN_SCORE_ORDER`)."""
        have = {s for r in self.records for s in r.scores}
        for s in MAIN_SCORE_ORDER:
            if s in have:
                return s
        return self.scores[0] if self.scores else None

    def baseline_for(self, record: ResultRecord, baseline: str, *,
                     same_run: bool = False) -> ResultRecord | None:
        """The baseline row a record is compared with: the set's ``baseline`` record whose
        method-independent varying settings match the record's most closely (first in
        table order on ties); ``None`` if the set has no baseline run.

        With ``same_run``, only a baseline measured by the same ``eval`` call (the same
        recorded command) counts: the cost ratios use that, since times from calls made
        under other load are not comparable."""
        bases = [r for r in self.records if r.method == baseline
                 and (not same_run or r is record or same_eval_call(r, record))]
        if not bases:
            return None

        def matches(b: ResultRecord) -> int:
            return sum(1 for k in self.keys
                       if key_is_relevant(baseline, k) and key_is_relevant(record.method, k)
                       and b.config.get(k) == record.config.get(k))

        return max(bases, key=lambda b: (matches(b), -bases.index(b)))


#: ``versions`` keys that decide whether two timings are comparable: the machine, not the
#: package versions (those are recorded for the scores).
TIMING_KEYS: tuple[str, ...] = ("cpu", "cpu_count", "device", "gpu")


def same_eval_call(a: Any, b: Any) -> bool:
    """Whether two results were timed together, so that their times are comparable: one
    ``eval`` call (the same recorded ``command`` line) on one machine (the same
    :data:`TIMING_KEYS` in ``versions``), neither corpus resumed from chunks timed on
    another machine (``cost["machines"]`` of one entry, the same in both, where recorded),
    and neither resumed from a checkpoint at all (``cost["resumed_chunks"]`` zero): resumed
    chunks were timed by an earlier call under its own load, and a machine label such as
    ``AMD EPYC x2`` names a kind of machine, not one machine. A command rerun later, or a
    checkpoint resumed, gives results with the same command whose times are not comparable.

    Args:
        a: A result with ``config`` (needs ``command``), and optionally ``versions`` and
            ``cost`` (a :class:`ResultRecord` or a ``RetrievalResult``).
        b: Another result.
    """
    cmd = a.config.get("command")
    if not cmd or cmd != b.config.get("command"):
        return False
    va, vb = getattr(a, "versions", None) or {}, getattr(b, "versions", None) or {}
    if any(va.get(k) != vb.get(k) for k in TIMING_KEYS):
        return False
    ca, cb = getattr(a, "cost", None) or {}, getattr(b, "cost", None) or {}
    if not (timed_on_one_machine(ca) and timed_on_one_machine(cb)):
        return False
    if ca.get("resumed_chunks") or cb.get("resumed_chunks"):
        return False
    ma, mb = ca.get("machines"), cb.get("machines")
    return ma is None or mb is None or ma == mb


def group_results(records: Sequence[ResultRecord]) -> list[ResultSet]:
    """Split records into :class:`ResultSet` s, sorted by model, dataset, split, full
    before subset, then length."""
    groups: dict[tuple, list[ResultRecord]] = {}
    for r in records:
        groups.setdefault((r.model, r.dataset, r.split, r.subset, r.length), []).append(r)
    out = []
    for (model, dataset, split, subset, length), recs in groups.items():
        length_key = ("context_length" if any(r.length_key == "context_length" for r in recs)
                      else "max_length")
        keys = varying_keys(recs, exclude=[length_key])
        recs = sorted(recs, key=lambda r, k=keys: _row_sort_key(r, k))
        out.append(ResultSet(model, dataset, split, subset, length, length_key, recs, keys))
    return sorted(out, key=_set_sort_key)


def _set_sort_key(s: ResultSet) -> tuple:
    sub = (0, 0, 0, 0) if s.subset is None else (1, s.subset.max_queries, s.subset.max_docs,
                                                 s.subset.seed)
    return (s.model, s.dataset, s.split, sub, s.length if s.length is not None else -1)


# --------------------------------------------------------------------------- formatting
def _fmt_value(v: Any) -> str:
    if v is None or v == "":
        return "none"
    if isinstance(v, dict) and "seed" in v and "task" in v:  # a needle/passkey generator
        return f"seed {v['seed']}"
    if isinstance(v, list):  # a long budget (L, B_L)
        return ":".join(map(_fmt_value, v))
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _fmt(v: Any, spec: str) -> str:
    return format(v, spec) if _is_number(v) else "n/a"


def _fmt_seconds(v: Any) -> str:
    if not _is_number(v):
        return "n/a"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _ratio(num: Any, den: Any) -> str:
    if _is_number(num) and _is_number(den) and den > 0:
        return f"{num / den:.2f}"
    return "n/a"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "x"


def _length_label(length_key: str) -> str:
    return "context length" if length_key == "context_length" else "max length"


_COUNT_LABELS = (("n_queries", "queries"), ("n_docs", "documents"), ("n_pairs", "pairs"))


def _subset_label(subset: Subset | None, records: Sequence[ResultRecord]) -> str:
    sizes = []
    for key, noun in _COUNT_LABELS:
        vals = sorted({r.counts[key] for r in records if _is_number(r.counts.get(key))})
        if vals:
            sizes.append(f"{'/'.join(_fmt_value(v) for v in vals)} {noun}")
    size = ", ".join(sizes)
    if subset is None:
        return "full split" + (f" ({size})" if size else "")
    return f"subset `{subset.tag}`" + (f" ({size}, seed {subset.seed})" if size else "")


def _commands(records: Sequence[ResultRecord]) -> list[str]:
    return sorted({str(r.config.get("command") or "(no command recorded)") for r in records})


def format_set_table(rs: ResultSet, *, baseline: str = "vanilla-mean") -> str:
    """The Markdown table of one set (no heading, no commands).

    Columns: method, the varying config keys, the set's scores, ``encode s``,
    ``text tokens/s``, ``peak MiB``, and ``time x <baseline>`` / ``memory x <baseline>``
    (ratios of ``encode_seconds`` and ``peak_memory_bytes`` to the set's baseline run made
    by the same ``eval`` call; ``n/a`` without one). A key that does not affect a method
    shows ``–``.
    """
    head = ["method", *rs.keys, *rs.scores, "encode s", "text tokens/s", "peak MiB",
            f"time x {baseline}", f"memory x {baseline}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rs.records:
        base = rs.baseline_for(r, baseline, same_run=True)
        c, bc = r.cost, (base.cost if base is not None else {})
        mem = c.get("peak_memory_bytes")
        cells = [method_cell(r, rs.keys)]
        cells += [_fmt_value(r.config.get(k)) if key_is_relevant(r.method, k) else "–"
                  for k in rs.keys]
        cells += [_fmt(r.scores.get(s), ".2f") for s in rs.scores]
        cells += [_fmt_seconds(c.get("encode_seconds")), _fmt(c.get("tokens_per_second"), ".0f"),
                  _fmt(mem / 2**20 if _is_number(mem) else None, ".0f"),
                  _ratio(c.get("encode_seconds"), bc.get("encode_seconds")),
                  _ratio(mem, bc.get("peak_memory_bytes"))]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@dataclass(frozen=True)
class Comparison:
    """The compared method against the baseline in one set, on the set's main score."""

    set: ResultSet
    label: str
    score: str
    value: float
    base_value: float
    shipped: bool = False
    """Whether the compared row runs the method's shipped settings (:func:`is_shipped`)."""
    ndcg: tuple[float, float] | None = None
    """``(compared, baseline)`` NDCG@10 where the main score is another metric and both
    rows have it (needle/passkey report Acc@1 first)."""
    dtype: str | None = None
    """The compared row's weight dtype (``config["dtype"]``); its baseline has the same one
    where the set has it (:meth:`ResultSet.baseline_for`)."""
    score_only: bool = False
    """Whether the compared row also ran a setting that only adds scores
    (:data:`SCORE_ONLY_KEYS`, e.g. ``eval --center-queries``); its plain scores are what a
    run without it gives."""

    @property
    def diff(self) -> float:
        """``value - base_value`` in points."""
        return self.value - self.base_value

    def sentence(self, compare: str, baseline: str) -> str:
        """One line: the scores, and plainly whether the method beats the baseline."""
        d = round(self.diff, 2) + 0.0
        verdict = (f"{compare} beats {baseline} by {d:.2f} points" if d > 0 else
                   f"**{compare} does not beat {baseline}** ({d:+.2f} points)")
        return (f"{self.label} {self.value:.2f} vs {baseline} {self.base_value:.2f} "
                f"{self.score}: {verdict}.")


def comparisons(sets: Sequence[ResultSet], *, compare: str = "htp",
                baseline: str = "vanilla-mean") -> list[Comparison]:
    """Every ``compare`` row against its set's baseline row, on the main score."""
    out = []
    for rs in sets:
        score = rs.main_score
        if score is None:
            continue
        for r in rs.records:
            if r.method != compare or score not in r.scores:
                continue
            base = rs.baseline_for(r, baseline)
            if base is None or score not in base.scores:
                continue
            ndcg = None
            if score != "NDCG@10" and "NDCG@10" in r.scores and "NDCG@10" in base.scores:
                ndcg = (r.scores["NDCG@10"], base.scores["NDCG@10"])
            out.append(Comparison(rs, variant_label(r, rs.keys), score, r.scores[score],
                                  base.scores[score], is_shipped(r, rs.keys), ndcg,
                                  r.config.get("dtype"),
                                  r.adds_score_only))
    return out


def format_shipped_table(comps: Sequence[Comparison], *, compare: str, baseline: str
                         ) -> str | None:
    """One row per table (and dtype) where ``compare`` ran with its shipped settings (the
    run :func:`~htp_retrieval.eval.dtype_report.shipped_choice` picks where there are
    several): model, data, length, both main scores and the difference (and the NDCG@10
    difference where the main score is another metric); a ``dtype`` column where the rows
    have more than one. ``None`` if there is no such row."""
    rows = shipped_choice(comps)
    if not rows:
        return None
    by_dtype = len({c.dtype for c in rows}) > 1
    head = ["model", "data", "length", "subset", *(["dtype"] if by_dtype else []), "score",
            compare, baseline, "Δ", "Δ NDCG@10"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in rows:
        rs = c.set
        d = round(c.diff, 2) + 0.0
        cell = signed_cell(d)
        dn = ""
        if c.ndcg is not None:
            dn = signed_cell(round(c.ndcg[0] - c.ndcg[1], 2) + 0.0)
        elif c.score == "NDCG@10":
            dn = cell
        sub = "full" if rs.subset is None else f"`{rs.subset.tag}`"
        lines.append("| " + " | ".join([
            rs.model, f"{rs.dataset} ({rs.split})", str(rs.length or "n/a"), sub,
            *([str(c.dtype)] if by_dtype else []), c.score,
            f"{c.value:.2f}", f"{c.base_value:.2f}", cell, dn]) + " |")
    return "\n".join(lines)


def _set_title(rs: ResultSet) -> str:
    length = f"{_length_label(rs.length_key)} {rs.length} tokens" if rs.length else "length n/a"
    return f"{rs.model} / {rs.dataset} ({rs.split}), {length}, {_subset_label(rs.subset, rs.records)}"


# --------------------------------------------------------------------------- plots
def _pyplot_free_figure(figsize: tuple[float, float], nrows: int = 1,  # noqa: ANN202
                        ncols: int = 1, *, sharey: bool = False):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the report's plots need matplotlib: pip install matplotlib "
            "(or pip install 'htp-retrieval[eval]'), or pass --no-plots"
        ) from e
    fig = Figure(figsize=figsize, dpi=100)
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(nrows, ncols, sharey=sharey, squeeze=False).ravel())
    return fig, axes


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, format="png", metadata={"Software": None})
    return path


def _log2_axis(ax: Any, xs: Sequence[float]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([_fmt_value(x) for x in xs])
    ax.minorticks_off()


def series_colours(solid: Sequence[str], dashed: Sequence[str]) -> dict[str, tuple[float, ...]]:
    """Line colours (RGBA) for a length plot: shipped settings (``solid``, one per method and
    dtype) take tab10's colours, or tab20's when there are more than 10, and off-default
    variants (``dashed``) tab20b's, so no two solid lines share a colour up to 20 of them."""
    from matplotlib import colormaps

    palette, size = ("tab10", 10) if len(solid) <= 10 else ("tab20", 20)
    colour = {lb: tuple(colormaps[palette](i % size)) for i, lb in enumerate(solid)}
    colour.update({lb: tuple(colormaps["tab20b"](i % 20)) for i, lb in enumerate(dashed)})
    return colour


def plot_score_vs_length(sets: Sequence[ResultSet], path: Path) -> Path | None:
    """Main score vs context length, one line per method variant (paper Fig. 5; needle and
    passkey Acc@1 per length, with a second panel of NDCG@10 where the main score is another
    metric). Shipped settings are solid lines, off-default variants thin dashed ones.
    ``None`` if fewer than two lengths."""
    rs0 = sets[0] if sets else None
    main = (rs0.main_score or "") if rs0 else ""
    panels = [main] + (["NDCG@10"] if main != "NDCG@10" and any(
        "NDCG@10" in r.scores for rs in sets for r in rs.records) else [])
    label_of = partial(plot_label, usual=usual_device_values(
        [r for rs in sets for r in rs.records]))
    series_of = {score: _length_series(sets, score=score, label=label_of)
                 for score in panels}
    series = series_of[main]
    lengths = sorted({x for pts in series.values() for x, _ in pts})
    if len(lengths) < 2 or rs0 is None:
        return None
    fig, axes = _pyplot_free_figure((11, 4.5 * len(panels)), nrows=len(panels))
    labels = list(dict.fromkeys(lb for sc in panels for lb in series_of[sc]))
    shipped = _shipped_labels(sets, label=label_of)
    colour = series_colours([lb for lb in labels if lb in shipped],
                            [lb for lb in labels if lb not in shipped])
    for ax, score in zip(axes, panels):
        for label, pts in series_of[score].items():
            xs, ys = zip(*sorted(pts))
            # shipped settings solid; off-default variants (ablations) thin and dashed
            on = label in shipped
            ax.plot(xs, ys, marker="o" if on else ".", label=label, color=colour[label],
                    linestyle="-" if on else "--", linewidth=1.8 if on else 1.0,
                    alpha=1.0 if on else 0.7)
        _log2_axis(ax, lengths)
        ax.set_xlabel(f"{_length_label(rs0.length_key)} (tokens)")
        ax.set_ylabel(score)
        ax.set_title(f"{rs0.model} / {rs0.dataset}: {score} vs "
                     f"{_length_label(rs0.length_key)}", loc="left")
        ax.grid(True, alpha=0.3)
    # one legend for all panels (they share labels and colours), outside the axes so that
    # two dozen variants neither hide the lines nor run into the next panel
    axes[0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return _save(fig, path)


def _length_series(sets: Sequence[ResultSet], *, score: str | None = None,
                   label: Callable[[ResultRecord, Sequence[str]], str] = variant_label,
                   ) -> dict[str, list[tuple[int, float]]]:
    """``variant -> [(length, score)]`` over the sets of one (model, dataset, subset);
    ``score`` defaults to the sets' main score, ``label`` names a variant (the table's
    :func:`variant_label`, or the plots' shorter :func:`plot_label`).

    A plain score does not depend on a centring sample (:data:`SCORE_ONLY_KEYS`), so for
    plain scores runs with and without one form one series; where two runs of a series
    share a length, a plain run gives the point before one that also added centred scores
    (as :func:`~htp_retrieval.eval.dtype_report.shipped_choice` picks), then the first in
    row order."""
    if not sets:
        return {}
    recs = [r for rs in sets for r in rs.records]
    score = score or sets[0].main_score
    keys = _length_keys(recs, score)
    centred = (score or "").endswith(" centred")

    def order(r: ResultRecord) -> tuple:
        method, values, path = _row_sort_key(r, keys)
        added = not centred and r.adds_score_only
        return (method, values, added, path)

    series: dict[str, list[tuple[int, float]]] = {}
    for r in sorted(recs, key=order):
        if r.length is not None and score in r.scores:
            pts = series.setdefault(label(r, keys), [])
            if all(x != r.length for x, _ in pts):
                pts.append((r.length, r.scores[score]))
    return series


def _length_keys(recs: Sequence[ResultRecord], score: str | None) -> list[str]:
    """Settings that tell series apart across lengths: those that vary among ``recs``,
    less the centring sample unless ``score`` is a centred one."""
    keys = varying_keys(recs, exclude=["context_length", "max_length"])
    if not (score or "").endswith(" centred"):
        keys = [k for k in keys if k not in SCORE_ONLY_KEYS]
    return keys


def _shipped_labels(sets: Sequence[ResultSet], *,
                    label: Callable[[ResultRecord, Sequence[str]], str] = variant_label,
                    ) -> set[str]:
    """Labels (as :func:`_length_series` names them with ``label``) of the rows that run a
    method with its shipped settings (:func:`is_shipped`)."""
    recs = [r for rs in sets for r in rs.records]
    keys = _length_keys(recs, sets[0].main_score if sets else None)
    return {label(r, keys) for r in recs if is_shipped(r, keys)}


def format_length_table(sets: Sequence[ResultSet]) -> str | None:
    """Main score by length (rows: method variants, columns: lengths); ``None`` for fewer
    than two lengths."""
    series = _length_series(sets)
    lengths = sorted({x for pts in series.values() for x, _ in pts})
    if len(lengths) < 2:
        return None
    head = ["method", *[str(x) for x in lengths]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, pts in series.items():
        by = dict(pts)
        lines.append("| " + " | ".join([label, *[_fmt(by.get(x), ".2f") for x in lengths]])
                     + " |")
    return "\n".join(lines)


def plot_k_ablation(rs: ResultSet, path: Path, *, baseline: str) -> Path | None:
    """Score vs K per method with sentence blocks (paper Table 12); methods that K does not
    affect are drawn as horizontal lines. One panel for the main score, and a second for
    NDCG@10 where the main score is another (needle/passkey: Acc@1), as the paper's table
    and the quality targets are in NDCG@10. ``None`` unless some method has 2+ K values."""
    other = [k for k in rs.keys if k != "k"]
    usual = usual_device_values(rs.records)
    scores = [rs.main_score]
    if rs.main_score != "NDCG@10" and any("NDCG@10" in r.scores for r in rs.records):
        scores.append("NDCG@10")

    def series(score: str | None) -> tuple[dict[str, list[tuple[int, float]]],
                                            dict[str, float]]:
        lines: dict[str, list[tuple[int, float]]] = {}
        flat: dict[str, float] = {}
        for r in rs.records:
            if score not in r.scores:
                continue
            if key_is_relevant(r.method, "k") and _is_number(r.config.get("k")):
                lines.setdefault(plot_label(r, other, usual=usual), []).append(
                    (int(r.config["k"]), r.scores[score]))
            elif r.method == baseline or not any(key_is_relevant(r.method, k) for k in other):
                flat.setdefault(plot_label(r, other, usual=usual), r.scores[score])
        return {k: v for k, v in lines.items() if len({x for x, _ in v}) >= 2}, flat

    panels = [(score, *series(score)) for score in scores]
    if not panels[0][1]:
        return None
    ks = sorted({x for v in panels[0][1].values() for x, _ in v})
    n_labels = len(panels[0][1]) + len(panels[0][2])
    fig, axes = _pyplot_free_figure((7, 3.6 * len(panels) + 0.25 * n_labels), len(panels))
    for ax, (score, lines, flat) in zip(axes, panels):
        for i, (label, pts) in enumerate(lines.items()):
            xs, ys = zip(*sorted(pts))
            ax.plot(xs, ys, marker="o", label=label, color=f"C{i}")
        for j, (label, y) in enumerate(flat.items()):
            ax.axhline(y, linestyle="--", linewidth=1.2, label=label,
                       color="gray" if label == baseline else f"C{len(lines) + j}")
        _log2_axis(ax, ks)
        ax.set_ylabel(score or "")
        ax.set_title(f"{rs.model} / {rs.dataset}: {score} vs K")
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("K (sentences per block)")
    # below the last panel, so the legend never hides a point
    axes[-1].legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=1,
                    frameon=False)
    return _save(fig, path)


def plot_blocks(rs: ResultSet, path: Path, *, baseline: str) -> Path | None:
    """Sentence vs fixed-token blocks (paper Fig. 7): bars of the main score for every
    hierarchical-placeholder run, labelled with K or N. ``None`` unless both kinds exist."""
    score = rs.main_score
    bars: list[tuple[str, float]] = []
    kinds = set()
    extra = [k for k in rs.keys if k not in ("k", "tokens_per_block")]
    usual = usual_device_values(rs.records)
    for r in rs.records:
        spec = METHODS.get(r.method)
        if spec is None or spec.placeholders != "hierarchical" or score not in r.scores:
            continue
        kinds.add(spec.blocks)
        tag = (f"sentences, K={_fmt_value(r.config.get('k'))}" if spec.blocks == "sentence"
               else f"tokens, N={_fmt_value(r.config.get('tokens_per_block'))}")
        # wrapped, so labels listing several variant keys stay inside the figure
        label = textwrap.fill(plot_label(r, extra, usual=usual), width=26)
        bars.append((f"{label}\n{tag}", r.scores[score]))
    if kinds != {"sentence", "tokens"}:
        return None
    lines = max(b[0].count("\n") + 1 for b in bars)
    fig, (ax,) = _pyplot_free_figure((max(6.0, 1.9 * len(bars) + 1.5), 4.0 + 0.14 * lines))
    xs = range(len(bars))
    ax.bar(xs, [b[1] for b in bars], color=["C0" if "sentences" in b[0] else "C1" for b in bars])
    ax.set_xticks(list(xs))
    ax.set_xticklabels([b[0] for b in bars], fontsize=7)
    base = [r for r in rs.records if r.method == baseline and score in r.scores]
    vals = [b[1] for b in bars] + ([base[0].scores[score]] if base else [])
    if base:
        ax.axhline(base[0].scores[score], linestyle="--", color="gray", label=baseline)
        ax.legend(fontsize=8, loc="upper right")
    lo, hi = min(0.0, *vals), max(0.0, *vals)
    pad = 0.2 * (hi - lo) or 1.0
    ax.set_ylim(lo - (pad if lo < 0 else 0), hi + pad)
    ax.set_ylabel(score or "")
    ax.set_title(f"{rs.model} / {rs.dataset}: sentence vs fixed-token blocks")
    ax.grid(True, axis="y", alpha=0.3)
    return _save(fig, path)


def _cost_rows(sets: Sequence[ResultSet], baseline: str
               ) -> tuple[list[str], list[int | None], dict[tuple[str, int | None], tuple]]:
    recs = [r for rs in sets for r in rs.records]
    keys = varying_keys(recs, exclude=["context_length", "max_length"])
    usual = usual_device_values(recs)
    labels: list[str] = []
    lengths: list[int | None] = []
    vals: dict[tuple[str, int | None], tuple] = {}
    for rs in sets:
        for r in sorted(rs.records, key=lambda r: _row_sort_key(r, keys)):
            base = rs.baseline_for(r, baseline, same_run=True)
            if base is None:
                continue
            t = _ratio(r.cost.get("encode_seconds"), base.cost.get("encode_seconds"))
            m = _ratio(r.cost.get("peak_memory_bytes"), base.cost.get("peak_memory_bytes"))
            if t == "n/a" and m == "n/a":
                continue
            label = plot_label(r, keys, usual=usual)
            if label not in labels:
                labels.append(label)
            if rs.length not in lengths:
                lengths.append(rs.length)
            vals[(label, rs.length)] = (None if t == "n/a" else float(t),
                                        None if m == "n/a" else float(m))
    order = {lab: i for i, lab in enumerate(labels)}
    labels.sort(key=lambda lab: (_method_rank(lab.split(" ")[0]), order[lab]))
    return labels, sorted(lengths, key=lambda x: -1 if x is None else x), vals


def plot_cost_ratios(sets: Sequence[ResultSet], path: Path, *, baseline: str) -> Path | None:
    """Time and memory ratios to the baseline of the same ``eval`` call, per method variant:
    horizontal bars (variant labels can be long), one bar per length, time and memory side
    by side. ``None`` with fewer than two variants that have such a baseline and cost."""
    labels, lengths, vals = _cost_rows(sets, baseline)
    if len(labels) < 2:
        return None
    labels = [lab for lab in labels if lab != baseline]  # 1.0 by definition: the dashed line
    lengths = [n for n in lengths if any((lab, n) in vals for lab in labels)]
    has_mem = any(v[1] is not None for v in vals.values())
    n_panels = 2 if has_mem else 1
    height = 1.6 + 0.22 * len(labels) * max(1, len(lengths)) ** 0.5 + 0.25 * len(lengths)
    fig, axes = _pyplot_free_figure((6.0 + 4.0 * n_panels, max(3.0, height)), 1, n_panels,
                                    sharey=True)
    width = 0.8 / max(1, len(lengths))
    rows = range(len(labels))
    for ax, idx, what in zip(axes, (0, 1), ("time", "peak memory")):
        for j, length in enumerate(lengths):
            xs = [vals.get((lab, length), (None, None))[idx] for lab in labels]
            ys = [i + (j - (len(lengths) - 1) / 2) * width for i in rows]
            ax.barh([y for y, x in zip(ys, xs) if x is not None],
                    [x for x in xs if x is not None], height=width,
                    label=f"{_length_label(sets[0].length_key)} {length}")
        ax.axvline(1.0, color="gray", linestyle="--", linewidth=1)
        ax.set_xlabel(f"{what} x {baseline} (same eval call)")
        ax.set_title(f"{what} ratio to {baseline}")
        ax.grid(True, axis="x", alpha=0.3)
    axes[0].set_yticks(list(rows))
    axes[0].set_yticklabels(labels, fontsize=8)
    axes[0].invert_yaxis()
    if len(lengths) > 1:  # outside the axes, so it never covers a bar
        axes[-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                        borderaxespad=0)
    fig.suptitle(f"{sets[0].model} / {sets[0].dataset}: cost ratios")
    return _save(fig, path)


# --------------------------------------------------------------------------- report
@dataclass
class Report:
    """A generated report.

    Attributes:
        markdown: The Markdown text.
        plots: PNG files written.
        sets: The result sets tabulated.
        comparisons: The compared-method-vs-baseline lines.
        skipped: ``[(path, reason)]`` for JSONs that were not results files.
        n_tables: Tables in the Markdown: one per result set plus one per chunk-level
            group (model, dataset, split, subset).
    """

    markdown: str
    plots: list[Path]
    sets: list[ResultSet]
    comparisons: list[Comparison]
    skipped: list[tuple[Path, str]]
    n_tables: int = 0


def build_report(
    paths: Iterable[str | Path],
    *,
    output: str | Path | None = None,
    plots_dir: str | Path | None = None,
    baseline: str = "vanilla-mean",
    compare: str = "htp",
    title: str = "Results",
    command: str | None = None,
    notes: str | None = None,
    plots: bool = True,
) -> Report:
    """Build the Markdown report (and its PNG plots) from results JSONs.

    Args:
        paths: Results folders (searched recursively) and/or files.
        output: Where the Markdown will be written (only used to make the plot links
            relative to it; the caller writes the file). ``None``: links relative to the
            current directory.
        plots_dir: Folder for the PNGs (default: ``plots`` next to ``output``).
        baseline: Method whose time and memory are the ratio denominators and that
            ``compare`` is measured against.
        compare: Method checked against ``baseline`` on each set's main score.
        title: The report's ``#`` heading.
        command: The command that made the report, printed under the title.
        notes: Markdown put after the introduction (hand-written context).
        plots: Make PNG plots (needs matplotlib).

    Returns:
        The :class:`Report`.

    Raises:
        FileNotFoundError: if a path does not exist.
        ValueError: if no results JSON is found, or a named file is not one.
        ImportError: if ``plots`` is on and matplotlib is missing.
    """
    records, skipped = load_results(paths)
    if not records:
        raise ValueError("no results JSON found under: " + ", ".join(map(str, paths)))
    n_files = len(records)
    chunk_recs = [r for r in records if is_chunk_record(r)]
    records = [r for r in records if not is_chunk_record(r)]
    sets = group_results(records)
    md_dir = Path(output).parent if output is not None else Path(".")
    pdir = Path(plots_dir) if plots_dir is not None else md_dir / "plots"
    written: list[Path] = []

    def embed(p: Path | None, alt: str) -> list[str]:
        if p is None:
            return []
        written.append(p)
        rel = Path(os.path.relpath(p, md_dir)).as_posix()
        return [f"![{alt}]({rel})", ""]

    comps = comparisons(sets, compare=compare, baseline=baseline)
    out = [f"# {title}", ""]
    if command:
        out += ["Generated by:", "", "```bash", command, "```", ""]
    n_tables = len(sets) + len({(r.model, r.dataset, r.split, r.subset) for r in chunk_recs})
    out += [f"{n_files} result files, {n_tables} tables. Scores are percent; "
            f"`encode s` is corpus + query encode time in seconds, `text tokens/s` counts "
            f"text tokens only, `peak MiB` is peak memory above the level before encoding; "
            f"`time x {baseline}` and `memory x {baseline}` divide by the {baseline} run of "
            f"the same table (same model, dataset, length and subset) made by the same "
            f"`eval` call on the same machine, and are `n/a` where {baseline} came from "
            f"another call or machine, or either run was resumed from a checkpoint (its "
            f"chunks were timed by an earlier call: other load, maybe another machine of "
            f"the same kind; `encode s` then sums both calls; `htp-retrieval bench` "
            f"compares costs side by side). "
            f"Subset tables come "
            f"from subsampled runs (`--max-queries/--max-docs`) and are not comparable "
            f"with full-split numbers.", ""]
    if notes:
        out += [notes.strip(), ""]
    if sets:
        out += [f"## {compare} vs {baseline}", ""]
    if comps:
        shipped = shipped_choice(comps)  # the rows of the table below, chosen once
        table = format_shipped_table(shipped, compare=compare, baseline=baseline)
        if table:
            lost = sum(1 for c in shipped if round(c.diff, 2) <= 0)
            unit = ("rows, one per table and dtype" if len({c.dtype for c in shipped}) > 1
                    else "tables")
            out += [f"With its shipped settings, {compare} does not beat {baseline} in "
                    f"{lost} of {len(shipped)} {unit} (main score; a difference is bold where "
                    f"{compare} does not win, in the main score or in NDCG@10):",
                    "", table, ""]
        by_dtype = format_dtype_table(comps, compare=compare, baseline=baseline)
        if by_dtype:
            out += [f"### {compare} minus {baseline} by dtype", "",
                    f"`dtype=\"auto\"` picks float32 on a CPU without native bf16 matrix "
                    f"instructions and bfloat16 on a CPU with them and on CUDA, so a user "
                    f"gets one of these columns. Each cell: {compare} / {baseline} on the "
                    f"table's main score, and the difference (bold where {compare} does not "
                    f"win); shipped settings only; `not run` where that dtype has no shipped "
                    f"{compare} row with its {baseline}.", "", by_dtype, ""]
        earlier = [rs for rs in sets
                   if not any(r.method == compare and is_shipped(r, rs.keys) for r in rs.records)
                   and any(r.method == compare and off_preset_layers(r, rs.keys)
                           for r in rs.records)]
        if earlier:
            out += [f"{len(earlier)} tables have {compare} only with layers other than its "
                    f"model family's preset as shipped today (an earlier preset; their rows "
                    f"name those layers, e.g. `tp_start=1`), so they are not in the table "
                    f"above until rerun.", ""]
        losses = [c for c in comps if round(c.diff, 2) <= 0]
        out += [f"Every {compare} row, variants included: {compare} does not beat "
                f"{baseline} in {len(losses)} of {len(comps)} comparisons (main score of "
                f"each table).", ""]
        out += [f"- {_set_title(c.set)}: {c.sentence(compare, baseline)}" for c in comps]
    elif sets:
        out.append(f"No table has both a {compare} and a {baseline} result.")
    out.append("")

    by_model: dict[str, list[ResultSet]] = {}
    for rs in sets:
        by_model.setdefault(rs.model, []).append(rs)
    for model in sorted(by_model):
        out += [f"## {model}", ""]
        groups: dict[tuple, list[ResultSet]] = {}
        for rs in by_model[model]:
            groups.setdefault((rs.dataset, rs.split, rs.subset), []).append(rs)
        for (dataset, split, subset), gsets in groups.items():
            recs = [r for rs in gsets for r in rs.records]
            stem = "__".join([_slug(model), _slug(f"{dataset}-{split}")]
                             + ([subset.tag] if subset else []))
            out += [f"### {dataset} ({split}), {_subset_label(subset, recs)}", ""]
            length_table = format_length_table(gsets)
            if length_table:
                score = gsets[0].main_score
                out += [f"{score} by {_length_label(gsets[0].length_key)} (tokens):", "",
                        length_table, ""]
                if plots:
                    out += embed(plot_score_vs_length(gsets, pdir / f"{stem}__length.png"),
                                 f"{score} vs length")
            for rs in gsets:
                length = (f"{_length_label(rs.length_key)} {rs.length} tokens"
                          if rs.length is not None else "length not recorded")
                out += [f"#### {dataset}, {length}", ""]
                out += ["```bash", *_commands(rs.records), "```", ""]
                out += [format_set_table(rs, baseline=baseline), ""]
                loads = [v for r in rs.records for v in (r.cost.get("loadavg_start"),
                                                         r.cost.get("loadavg_end"))
                         if _is_number(v)]
                if loads:
                    out += [f"1-minute load average during these runs: {min(loads):.1f} to "
                            f"{max(loads):.1f} (times from runs under different load are "
                            f"not comparable).", ""]
                for c in comps:
                    if c.set is rs:
                        out += [c.sentence(compare, baseline), ""]
                if plots:
                    tag = f"{stem}__len{rs.length}"
                    out += embed(plot_k_ablation(rs, pdir / f"{tag}__k.png", baseline=baseline),
                                 "K ablation")
                    out += embed(plot_blocks(rs, pdir / f"{tag}__blocks.png", baseline=baseline),
                                 "sentence vs fixed-token blocks")
            if plots:
                out += embed(plot_cost_ratios(gsets, pdir / f"{stem}__cost.png",
                                              baseline=baseline), "cost ratios")
    if chunk_recs:
        out += _chunk_sections(chunk_recs, pdir, embed if plots else None)
    foreign = [(p, why) for p, why in skipped if why != MTEB_SKIP_REASON]
    n_mteb = len(skipped) - len(foreign)
    if foreign or n_mteb:
        out += ["## Files skipped", ""]
        out += [f"- `{p.as_posix()}`: {why}" for p, why in foreign]
        if n_mteb:
            out.append(f"- {n_mteb} mteb output files (`htp-retrieval mteb`; mteb reads them)")
        out.append("")
    markdown = "\n".join(out).rstrip() + "\n"
    return Report(markdown, written, sets, comps, skipped, n_tables)


def _chunk_sections(records: Sequence[ResultRecord], pdir: Path, embed: Any) -> list[str]:
    """The chunk-level sections: one table (and bar plot) per model, dataset, subset and
    weight dtype, so every row's Δ is against vanilla-mean naive chunks of its own dtype.
    The heading names the dtype; a plot's file name carries it only where the same model,
    dataset and subset have results in more than one dtype."""
    out = ["## Chunk-level retrieval (evidence spans)", "",
           "NDCG@10 and Recall@10 over chunks: a chunk is relevant when it overlaps an "
           "evidence span of the query; in-corpus ranks the chunks of every document, "
           "in-doc only those of the query's own document. Δ: NDCG@10 minus naive chunks "
           "of the same size with vanilla-mean (bold where not ahead). `s / 1,000 chunks` "
           "is corpus encode time; runs under different load are not comparable.", ""]
    groups: dict[tuple, list[ResultRecord]] = {}
    for r in records:
        groups.setdefault((r.model, r.dataset, r.split, r.subset,
                           r.config.get("context_length"), str(r.config.get("dtype") or "")),
                          []).append(r)
    n_dtypes = Counter(k[:5] for k in groups)
    for (model, dataset, split, subset, ctx, dtype), recs in sorted(
            groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2], str(kv[0][3]),
                                            kv[0][4] or 0, kv[0][5])):
        at = f", context length {ctx} tokens" if ctx else ""
        out += [f"### {model}: {dataset} ({split}{at}), {_subset_label(subset, recs)}"
                + (f", {dtype}" if dtype else ""), "",
                "```bash", *_commands(recs), "```", "", format_chunk_table(recs), ""]
        if embed is not None:
            by_dtype = dtype and n_dtypes[(model, dataset, split, subset, ctx)] > 1
            stem = "__".join([_slug(model), _slug(f"{dataset}-{split}")]
                             + ([subset.tag] if subset else [])
                             + ([f"ctx{ctx}"] if ctx else []) + ([dtype] if by_dtype else [])
                             + ["chunks"])
            out += embed(plot_chunk_scores(recs, pdir / f"{stem}.png"), "chunk-level NDCG@10")
    return out


def write_report(report: Report, output: str | Path) -> Path:
    """Write ``report.markdown`` to ``output`` (parents created); returns the path."""
    p = Path(output)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(report.markdown, encoding="utf-8")
    return p


__all__ = [
    "ResultRecord", "ResultSet", "Subset", "Report", "Comparison", "read_result",
    "load_results", "group_results", "varying_keys", "key_is_relevant", "variant_label",
    "plot_label", "format_set_table", "format_length_table", "comparisons", "build_report",
    "write_report", "format_shipped_table", "is_shipped", "plot_score_vs_length", "plot_k_ablation",
    "plot_blocks", "plot_cost_ratios",
]
