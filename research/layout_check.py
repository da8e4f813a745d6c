"""Whether other settings give a finished run exactly the same inputs: ``same-layouts``.

A K-policy setting (block budget B, long- or short-text budget) changes the embeddings only
where it changes some input's layout. Whether it does is a fact about the data: a short-text
budget of ``(256, 1)`` binds on SciFact's abstracts but on no needle document of 512 tokens
or more, nor on any needle query (all under 128 tokens, one block under T = 64 either way).
This module rebuilds a results record's data and encoder settings, lays out every document
and query both ways (tokenizer and segmenter only, no model forward) and counts the inputs
whose layouts differ. With none differing, ``--write`` adds a ``same_layouts`` entry to the
record and makes it the run of the values it was checked against (:func:`write_check`: the
config takes them, the value it was run with kept under ``<key>_recorded``, and the file
moves to the name ``eval`` gives those settings), so reports show it under those values
and ``eval`` with them reuses it.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from htp_retrieval.files import atomic_write
from htp_retrieval.layout import as_long_budget
from htp_retrieval.methods import METHODS

CHECKABLE_KEYS: tuple[str, ...] = ("max_blocks", "long_budget", "short_budget")
"""Settings a check may swap: the adaptive-K budgets (they change block counts only)."""


@dataclass(frozen=True)
class LayoutCheck:
    """One record checked against other settings.

    Attributes:
        path: The results JSON.
        settings: The swapped settings, as the record's config writes them
            (``{"short_budget": [256, 1]}``).
        documents: Documents laid out.
        documents_changed: Documents whose layout (token ids, placeholder positions, copy
            pairs) differs under ``settings``.
        queries: Queries laid out.
        queries_changed: Queries whose layout differs.
    """

    path: Path
    settings: dict[str, Any]
    documents: int
    documents_changed: int
    queries: int
    queries_changed: int

    @property
    def same(self) -> bool:
        """No input's layout changes."""
        return self.documents_changed == 0 and self.queries_changed == 0


def _encoder_kwargs(config: dict[str, Any]) -> dict[str, Any]:
    """:class:`~htp_retrieval.HTPEncoder` arguments that rebuild a record's layouts.

    A budget the record does not carry was off in that run (``HTPEncoder.config`` writes
    them only when set), so it is passed as ``0``, not left to today's default.
    """
    spec = METHODS[config["method"]]
    kw: dict[str, Any] = {
        "max_length": int(config["max_length"]),
        "overflow": "truncate",
        "segmenter": config.get("segmenter") or "sentencizer",
        "keep_sink": config.get("keep_sink", True),
        "max_blocks": config.get("max_blocks") or 0,
        "min_block_tokens": config.get("min_block_tokens") or 0,
        "long_budget": as_long_budget(config.get("long_budget")) or 0,
        "short_budget": as_long_budget(config.get("short_budget"), name="short_budget") or 0,
    }
    if config.get("summary"):
        kw["summary"] = config["summary"]
    if config.get("bare_prefix"):
        kw["bare_prefix"] = config["bare_prefix"]
    if config.get("k") not in (None, spec.sentences_per_block):
        kw["k"] = config["k"]
    if config.get("tokens_per_block") not in (None, spec.tokens_per_block):
        kw["tokens_per_block"] = config["tokens_per_block"]
    return kw


def _swap(kw: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    out = dict(kw)
    for key, value in settings.items():
        if key == "max_blocks":
            out[key] = int(value or 0)
        else:
            out[key] = as_long_budget(value, name=key) or 0
    return out


def _record_data(raw: dict[str, Any], data: str | None, haystack: str | None) -> Any:
    """The :class:`~htp_retrieval.eval.harness.DataItem` a record was run on."""
    from htp_retrieval.eval.harness import resolve_data

    config, counts = raw["config"], raw.get("counts") or {}
    syn = config.get("synthetic")
    if syn:
        items = resolve_data(syn["task"], seed=int(syn.get("seed") or 0),
                             context_lengths=[int(config["context_length"])],
                             max_queries=int(counts.get("n_queries") or 0),
                             max_docs=int(counts.get("n_docs") or 0),
                             synthetic_tokenizer=syn.get("tokenizer"), haystack=haystack)
    else:
        if not data:
            raise ValueError(f"dataset {raw['dataset']!r} is not generated: pass --data "
                             "with its folder")
        items = resolve_data(data, split=str(raw["split"]), seed=int(config.get("seed") or 0),
                             max_queries=int(config.get("max_queries") or 0),
                             max_docs=int(config.get("max_docs") or 0))
    if len(items) != 1 or items[0].name != raw["dataset"]:
        raise ValueError(f"--data {data!r} is not the record's dataset {raw['dataset']!r}")
    return items[0]


def check_record(
    path: str | Path,
    settings: dict[str, Any],
    *,
    data: str | None = None,
    haystack: str | None = None,
    encoders: dict[str, Any] | None = None,
) -> LayoutCheck:
    """Lay out a record's documents and queries with its settings and with ``settings``.

    The data is rebuilt from the record: needle/passkey from its ``synthetic`` config
    (task, seed, context length, document and query counts, measuring tokenizer), other sets
    from ``data`` with the record's split and subsample (an STS split: its distinct
    sentences count as documents). The rebuilt corpus must give the record's text and input
    token counts (``cost.corpus_text_tokens`` and ``corpus_input_tokens``; STS:
    ``text_tokens``, ``input_tokens``) with its own settings, so a different corpus cannot
    pass.

    Args:
        path: A results JSON of a method with sentence blocks (``htp``, ``htp-last`` ...).
        settings: Values for :data:`CHECKABLE_KEYS`, as a config writes them
            (``{"short_budget": [256, 1]}``; ``None`` or ``0`` for off).
        data: The record's data folder (BEIR/LongEmbed); not needed for needle/passkey.
        haystack: Needle essays folder (default: the shared data's).
        encoders: Cache shared across calls: loaded encoders by model name (the tokenizer
            is all that is used; the model is loaded once per name) and rebuilt data.

    Returns:
        The :class:`LayoutCheck`.

    Raises:
        ValueError: if the file is not a results JSON, its method has no sentence blocks,
            it was run with a calibration preset or a query/document pairing, ``settings``
            names another key, the data is missing, or the rebuilt corpus does not match
            the record's token counts (each message names the file).
    """
    from htp_retrieval.encoder import HTPEncoder

    p = Path(path)
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
        config = raw["config"]
        method = config["method"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{p}: not a results JSON ({e})") from e
    bad = set(settings) - set(CHECKABLE_KEYS)
    if bad:
        raise ValueError(f"{p}: cannot check {sorted(bad)}; checkable: {list(CHECKABLE_KEYS)}")
    spec = METHODS.get(method)
    if spec is None or spec.blocks != "sentence" or spec.placeholders not in (
            "local", "hierarchical"):
        raise ValueError(f"{p}: method {method!r} has no sentence blocks; the budgets do not "
                         "apply to it")
    if config.get("preset") or config.get("query_config"):
        raise ValueError(f"{p}: runs with a calibration preset or a query/document pairing "
                         "are not checked")
    cache = encoders if encoders is not None else {}
    key = ("data", raw.get("dataset"), raw.get("split"), data, haystack,
           json.dumps({k: config.get(k) for k in ("synthetic", "context_length", "seed",
                                                   "max_queries", "max_docs")}, sort_keys=True),
           json.dumps(raw.get("counts"), sort_keys=True))
    try:
        if key not in cache:
            cache[key] = _record_data(raw, data, haystack)
        item = cache[key]
    except (FileNotFoundError, RuntimeError, ValueError) as e:
        raise ValueError(f"{p}: {e}") from e
    name = config["model"]
    if name not in cache:
        cache[name] = HTPEncoder(name, method, max_length=int(config["max_length"]),
                                 overflow="truncate")
    base = cache[name]
    kw = _encoder_kwargs(config)
    run = HTPEncoder(base.model, method, tokenizer=base.tokenizer, **kw)
    alt = HTPEncoder(base.model, method, tokenizer=base.tokenizer, **_swap(kw, settings))
    di, qi = config.get("document_instruction"), config.get("query_instruction")
    if item.kind == "sts":  # each distinct sentence once, as run_sts encodes them
        docs = list(dict.fromkeys(item.data.sentence1 + item.data.sentence2))
        queries: list[str] = []
    else:
        docs = [item.data.doc_text(d) for d in item.data.corpus]
        queries = [item.data.queries[q] for q in item.data.queries]
    d_run = run.build_layouts(docs, instruction=di)
    cost = raw.get("cost") or {}
    tokens = (sum(lay.n_text_tokens for lay in d_run), sum(len(lay) for lay in d_run))
    expected = (cost.get("corpus_text_tokens", cost.get("text_tokens")),
                cost.get("corpus_input_tokens", cost.get("input_tokens")))
    if expected[0] is not None and tokens != expected:
        raise ValueError(f"{p}: the rebuilt corpus gives {tokens[0]} text / {tokens[1]} input "
                         f"tokens with the run's settings, the record {expected[0]} / "
                         f"{expected[1]}: not the data it was run on")
    d_alt = alt.build_layouts(docs, instruction=di)
    q_run = run.build_layouts(queries, instruction=qi) if queries else []
    q_alt = alt.build_layouts(queries, instruction=qi) if queries else []
    return LayoutCheck(
        path=p, settings=dict(settings), documents=len(docs),
        documents_changed=sum(a != b for a, b in zip(d_run, d_alt, strict=True)),
        queries=len(queries),
        queries_changed=sum(a != b for a, b in zip(q_run, q_alt, strict=True)))


def write_check(check: LayoutCheck, *, command: str) -> Path:
    """Record ``check`` in its results JSON and make the record the checked settings' run.

    The entry goes to ``same_layouts`` (replacing one for the same settings); the config
    takes the checked values, keeping the ones the run was made with under
    ``<key>_recorded``; ``htp_config`` and ``run`` follow, and the file moves to the name
    ``eval`` gives the checked settings (:func:`~htp_retrieval.eval.naming.result_file_name`;
    a research variant, ``config["variant"]``, keeps its name), so that run reuses it.

    Returns:
        The record's path after the move.

    Raises:
        ValueError: if some layout differs (only a check with none differing is written),
            or if a result already sits at the new name.
    """
    from htp_retrieval.config import HTPConfig
    from htp_retrieval.eval.naming import result_file_name

    if not check.same:
        raise ValueError(f"{check.path}: {check.documents_changed} documents and "
                         f"{check.queries_changed} queries change; not written")
    raw = json.loads(check.path.read_text(encoding="utf-8"))
    entries = [e for e in raw.get("same_layouts") or [] if e.get("settings") != check.settings]
    entries.append({"settings": check.settings, "documents": check.documents,
                    "queries": check.queries, "command": command, "checked": time.time()})
    raw["same_layouts"] = entries
    config = raw["config"]
    for key, value in check.settings.items():
        if config.get(key) != value:
            config.setdefault(f"{key}_recorded", config.get(key))
            config[key] = value
    cfg = HTPConfig.from_record(config)
    config.update(cfg.flat())
    raw["htp_config"] = cfg.to_dict()
    raw["run"] = {**raw["run"], "htp_config": cfg.to_dict()}
    target = (check.path if "variant" in config
              else check.path.with_name(result_file_name(raw["run"])))
    if target != check.path and target.exists():
        raise ValueError(f"{check.path}: {target} already holds the run with "
                         f"{check.settings}; remove one of them")
    with atomic_write(target) as f:  # the harness's format
        f.write(json.dumps(raw, indent=2, sort_keys=True))
    if target != check.path:
        check.path.unlink()
    return target


def _settings_from_args(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if args.max_blocks is not None:
        out["max_blocks"] = args.max_blocks or None
    for key in ("long_budget", "short_budget"):
        value = getattr(args, key)
        if value is not None:
            out[key] = list(value) if value else None
    return out


def _command(args: argparse.Namespace) -> str:
    """The command line a written check records (canonical order)."""
    parts = ["python", "-m", "research", "same-layouts", *args.results]
    if args.max_blocks is not None:
        parts += ["--max-blocks", str(args.max_blocks)]
    for flag, value in (("--long-budget", args.long_budget),
                        ("--short-budget", args.short_budget)):
        if value is not None:
            parts += [flag, f"{value[0]}:{value[1]}" if value else "0"]
    for flag, value in (("--data", args.data), ("--haystack", args.haystack)):
        if value:
            parts += [flag, value]
    return " ".join(shlex.quote(str(x)) for x in [*parts, "--write"])


def cmd_same_layouts(args: argparse.Namespace) -> int:
    """``python -m research same-layouts``: one line per record; exit 1 if any differs."""
    from htp_retrieval.eval.report import load_results

    settings = _settings_from_args(args)
    if not settings:
        raise SystemExit("python -m research same-layouts: name a setting to check "
                         "(--max-blocks, --long-budget, --short-budget)")
    records, skipped = load_results(args.results)
    for path, why in skipped:
        print(f"skipped {path}: {why}", file=sys.stderr)
    command = _command(args)
    encoders: dict[str, Any] = {}
    print("| result | documents changed | queries changed | same layouts |\n|---|---|---|---|")
    rc = 0
    for rec in records:
        spec = METHODS.get(rec.method)
        if spec is None or spec.blocks != "sentence" or spec.placeholders not in (
                "local", "hierarchical"):
            continue
        try:
            check = check_record(rec.path, settings, data=args.data, haystack=args.haystack,
                                 encoders=encoders)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            rc = 2
            continue
        print(f"| {rec.path} | {check.documents_changed} of {check.documents} "
              f"| {check.queries_changed} of {check.queries} | {'yes' if check.same else 'no'} |")
        ran_with = json.loads(rec.path.read_text(encoding="utf-8"))["config"]
        if check.same and args.write and any(ran_with.get(k) != v for k, v in settings.items()):
            moved = write_check(check, command=command)
            print(f"wrote {moved}", file=sys.stderr)
        elif not check.same:
            rc = max(rc, 1)
    return rc


def add_parser(asub: Any) -> None:
    """Register ``same-layouts`` on the ``python -m research`` subparsers."""
    from htp_retrieval.cli import _long_budget, _short_budget

    q = asub.add_parser(
        "same-layouts", help="whether other K-policy settings would give finished runs the "
        "same inputs (documents and queries laid out both ways, no model forward)")
    q.add_argument("results", nargs="+", help="results JSONs or folders")
    q.add_argument("--max-blocks", type=int, default=None, help="block budget B (0: none)")
    q.add_argument("--long-budget", type=_long_budget, default=None, help="L:B_L, or 0")
    q.add_argument("--short-budget", type=_short_budget, default=None, help="S:B_S, or 0")
    q.add_argument("--data", default=None,
                   help="the records' data folder (BEIR/LongEmbed); needle/passkey records "
                   "are generated again from their config")
    q.add_argument("--haystack", default=None, help="needle essays folder")
    q.add_argument("--write", action="store_true",
                   help="record each check with no change in its results JSON "
                   "(same_layouts), so the report shows the run under the checked value "
                   "(not in records run with those values)")
    q.set_defaults(func=cmd_same_layouts)
