"""Move results JSONs written under the old naming scheme to ``<method>__<digest>.json``.

Before, a result's file name listed the settings that differed from defaults (``len512``,
``mbt64``, ``sb256-1``, ``q30d200s0``, ``cen-crossfit``, ``chunk-naive256`` ...), its
``config`` record left out settings at their historical defaults, and ``htp-retrieval
report`` filled those in and, where a block budget did not bind on the run, showed it as
the method's default. This script does that once, in the files, so the report reads them
as they are:

* ``config`` gets every setting (:meth:`HTPConfig.flat
  <htp_retrieval.config.HTPConfig.flat>`); a block budget that gives every document of up to
  the run's max length the same blocks as the method's default (or that a ``same_layouts``
  check written by ``python -m research same-layouts --write`` shows lays out the run's
  data as the default does) is recorded as the default, and the value the run was made
  with is kept under ``<key>_recorded``;
* ``htp_config`` is that config, ``run`` the identity
  (:func:`htp_retrieval.eval.naming.run_identity`: model, dtype, padding side, config,
  and the data settings the old name carried), ``label`` the old name less its data tags;
* the file moves to :func:`~htp_retrieval.eval.naming.result_file_name`, the name ``eval``
  gives the same run now, so a rerun of the recorded command reuses it (a research variant,
  ``config["variant"]``, keeps the name its command gave it).

Idempotent (files with a ``run`` are left alone). Two old files with one identity are an
error naming both. References to old file names in Markdown files are rewritten where the
path or a unique name identifies the file, and listed otherwise.

Usage:
    python scripts/migrate_results.py results research/results [--docs README.md docs research]
    python scripts/migrate_results.py results research/results --check
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from htp_retrieval.config import HTPConfig
from htp_retrieval.eval.naming import data_settings, result_file_name, run_identity
from htp_retrieval.eval.report import _family_of, default_long_budget_of
from htp_retrieval.layout import as_long_budget, same_block_budgets
from htp_retrieval.methods import METHODS
from htp_retrieval.models import default_short_budget

HISTORICAL_DEFAULTS: dict[str, Any] = {"summary": "last", "keep_sink": True,
                                       "long_budget": None, "short_budget": None}
"""Keys old records wrote only when they differed from these values."""
DATA_TAG = re.compile(
    r"^(ctx\d+|q\d+d\d+s\d+|seed\d+|tok-.+|float32|float16|cen-.+|chunk-.+)$")
"""Old name parts that described the data or the dtype, not the encoder settings."""


def show_unbound_budget_as_default(
    config: dict[str, Any], same_layouts: Sequence[dict[str, Any]] = (),
) -> None:
    """Record a block budget that does not bind on the run as the method's default.

    A record's budget is ``(B, T, long_budget, short_budget)``. Where swapping its B, or its
    long budget, for the method's default gives every document of up to its max length the
    same number of blocks (:func:`htp_retrieval.layout.same_block_budgets`), the layouts are
    exactly those the default gives. Where the record carries a ``same_layouts`` check
    showing that default values of B, the long and/or the short budget lay out every one of
    its documents and queries as the run did, the same holds for that data. Such a record
    gets the default value and keeps the one it was run with under ``<key>_recorded``. T is
    never swapped. The default budgets are the model family's where its preset sets one.
    """
    spec = METHODS.get(str(config.get("method")))
    length = config.get("max_length")
    if spec is None or spec.max_blocks is None or not isinstance(length, int) or length < 1:
        return
    b, t, lb = config.get("max_blocks"), config.get("min_block_tokens"), config.get("long_budget")
    default_lb = default_long_budget_of(spec, config.get("model"))
    default_sb = default_short_budget(spec, _family_of(config.get("model")))
    defaults = {"long_budget": list(default_lb) if default_lb else None,
                "short_budget": list(default_sb) if default_sb else None,
                "max_blocks": spec.max_blocks}
    swapped = set()
    for entry in same_layouts:  # checked on the data: every value the default's
        settings = entry.get("settings") if isinstance(entry, dict) else None
        if not settings or any(k not in defaults or v != defaults[k]
                               for k, v in settings.items()):
            continue
        for key, value in settings.items():
            if config.get(key) != value and key not in swapped:
                config[f"{key}_recorded"] = config.get(key)
                config[key] = value
                swapped.add(key)
    run_lb = as_long_budget(config.get("long_budget"))
    sb = as_long_budget(config.get("short_budget"), name="short_budget")
    if "long_budget" not in swapped and run_lb != default_lb and same_block_budgets(
            (b, t, run_lb, sb), (b, t, default_lb, sb), length):
        config["long_budget_recorded"] = lb
        config["long_budget"] = list(default_lb) if default_lb else None
        run_lb = default_lb
    if "max_blocks" not in swapped and b != spec.max_blocks and same_block_budgets(
            (b, t, run_lb, sb), (spec.max_blocks, t, run_lb, sb), length):
        config["max_blocks_recorded"] = b
        config["max_blocks"] = spec.max_blocks


def _old_subset(path: Path, config: dict[str, Any]) -> tuple[int, int, int] | None:
    found = list(re.finditer(r"__q(\d+)d(\d+)s(\d+)(?=__|$)", path.stem)) or list(
        re.finditer(r"-q(\d+)d(\d+)s(\d+)$", path.parent.name))
    if found:
        m = found[-1]
        return int(m.group(1)), int(m.group(2)), int(m.group(3))
    q, d = config.get("max_queries") or 0, config.get("max_docs") or 0
    if q or d:
        return int(q), int(d), int(config.get("seed") or 0)
    return None


def old_data_settings(path: Path, config: dict[str, Any]) -> dict[str, Any]:
    """The data settings an old file's name and config carry
    (:func:`htp_retrieval.eval.naming.data_settings`)."""
    parts = path.stem.split("__")[1:]
    tag = {p.split("-", 1)[0]: p.split("-", 1)[1] for p in parts if "-" in p
           and p.split("-", 1)[0] in ("tok", "cen", "chunk")}
    subset = _old_subset(path, config)
    ctx = config.get("context_length")
    synthetic = config.get("synthetic") if isinstance(config.get("synthetic"), dict) else {}
    seed = subset[2] if subset else int(synthetic.get("seed") or 0) if ctx is not None else 0
    chunking = None
    if config.get("chunking"):
        m = re.fullmatch(r"[a-z-]+?\d+(?:-o(\d+))?(?:-w(\d+))?", tag.get("chunk", ""))
        window = int(m.group(2)) if m and m.group(2) else None
        chunking = {"chunking": config["chunking"], "chunk_tokens": config["chunk_tokens"],
                    "chunk_overlap": config.get("chunk_overlap") or 0}
        if window:
            chunking["late_window"] = window
    return data_settings(
        max_queries=subset[0] if subset else 0, max_docs=subset[1] if subset else 0,
        seed=seed, context_length=ctx,
        synthetic_tokenizer=synthetic.get("tokenizer") if "tok" in tag else None,
        chunking=chunking, center_queries=tag.get("cen"),
        extra={k: config[k] for k in ("parity", "variant", "variant_spec") if k in config})


def migrate(path: Path) -> tuple[str, dict[str, Any] | None, Path]:
    """``(status, new content, new path)``: ``present`` (has a ``run``), ``skipped`` (not an
    encoder results JSON) or ``moved``.

    Raises:
        ValueError: naming the file, if its record is not a valid config.
    """
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return "skipped", None, path
    config = raw.get("config") if isinstance(raw, dict) else None
    if (not isinstance(config, dict) or "method" not in config or "scores" not in raw
            or "split" not in raw):
        return "skipped", None, path
    if "run" in raw:
        return "present", None, path
    config = dict(config)
    for k, v in HISTORICAL_DEFAULTS.items():
        config.setdefault(k, v)
    show_unbound_budget_as_default(config, raw.get("same_layouts") or ())
    try:
        cfg = HTPConfig.from_record(config)
        qcfg = (HTPConfig.from_record(config["query_config"])
                if isinstance(config.get("query_config"), dict) else None)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    config.update(cfg.flat())
    run = run_identity(model=config["model"], dtype=config.get("dtype", "bfloat16"),
                       padding_side=config.get("padding_side", "right"), config=cfg,
                       data=old_data_settings(path, config), query_config=qcfg)
    raw["config"] = config
    raw["htp_config"] = cfg.to_dict()
    if qcfg is not None:
        raw["query_htp_config"] = qcfg.to_dict()
    raw["run"] = run
    if "variant" in config:  # a research variant: its command chose the name
        raw["label"] = str(config["variant"])
        return "moved", raw, path
    raw["label"] = "__".join(p for p in path.stem.split("__") if not DATA_TAG.match(p))
    return "moved", raw, path.with_name(result_file_name(run))


def _results(roots: Sequence[str]) -> list[Path]:
    files: list[Path] = []
    for root in roots:
        for f in sorted(Path(root).rglob("*.json")):
            if not any(part.endswith(".partial") for part in f.parts):
                files.append(f)
    return files


def rewrite_references(docs: Sequence[str], moved: dict[Path, Path]) -> list[str]:
    """Replace old result file names in Markdown files under ``docs``; returns the
    references it could not resolve (``file: name``)."""
    by_name: dict[str, set[Path]] = {}
    for old, new in moved.items():
        by_name.setdefault(old.name, set()).add(new)
    name_re = re.compile(r"[A-Za-z0-9._/-]*?([A-Za-z0-9._-]+__[A-Za-z0-9._-]+\.json)")
    unresolved: list[str] = []
    files = [p for d in docs for p in ([Path(d)] if Path(d).is_file() else
                                       sorted(Path(d).rglob("*.md")))]
    for md in files:
        text = md.read_text(encoding="utf-8")

        def sub(m: re.Match[str], md: Path = md) -> str:
            whole, name = m.group(0), m.group(1)
            if name not in by_name:
                return whole
            full = Path(whole)
            for old, new in moved.items():  # a path that names the file
                if len(full.parts) > 1 and old.as_posix().endswith(full.as_posix()):
                    return whole[: len(whole) - len(name)] + new.name
            targets = by_name[name]
            if len(targets) == 1:
                return whole[: len(whole) - len(name)] + next(iter(targets)).name
            unresolved.append(f"{md}: {whole}")
            return whole

        new_text = name_re.sub(sub, text)
        if new_text != text:
            md.write_text(new_text, encoding="utf-8")
    return unresolved


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("roots", nargs="+", help="results folders (searched recursively)")
    p.add_argument("--docs", nargs="*", default=[],
                   help="Markdown files or folders whose references to old names to rewrite")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if any file is still in the old form")
    args = p.parse_args(argv)
    counts = {"moved": 0, "present": 0, "skipped": 0}
    plan: dict[Path, tuple[Path, dict[str, Any]]] = {}
    targets: dict[Path, Path] = {}
    for f in _results(args.roots):
        status, raw, new = migrate(f)
        counts[status] += 1
        if status != "moved":
            continue
        assert raw is not None
        if new in targets or (new.exists() and new != f):
            other = targets.get(new, new)
            raise SystemExit(f"{f} and {other} are one run ({new.name}): remove one first")
        targets[new] = f
        plan[f] = (new, raw)
    if args.check:
        print(f"{counts['moved']} files in the old form; {counts['present']} migrated; "
              f"{counts['skipped']} are not encoder results")
        return 1 if counts["moved"] else 0
    for old, (new, raw) in plan.items():
        new.write_text(json.dumps(raw, indent=2, sort_keys=True))
        if new != old:
            old.unlink()
    unresolved = rewrite_references(args.docs, {o: n for o, (n, _) in plan.items()})
    print(f"moved {counts['moved']} files; {counts['present']} were migrated; "
          f"{counts['skipped']} are not encoder results")
    for u in unresolved:
        print(f"unresolved reference: {u}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
