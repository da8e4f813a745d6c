"""Add the whole resolved ``htp_config`` to results JSONs written before results stored it.

Each file's ``config`` record (:meth:`htp_retrieval.HTPEncoder.record`) is read with
:meth:`htp_retrieval.config.HTPConfig.from_record`; ``config["query_config"]`` (a separate
query encoder) gives ``query_htp_config``. Scores, names and every other key stay as they
are, so reports regenerate unchanged. Idempotent: files that have the key are left alone.

Usage:
    python scripts/add_htp_config.py results research/results [--check]

``--check`` writes nothing and exits 1 when a file still lacks the key.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from htp_retrieval.config import HTPConfig


def migrate(path: Path, *, write: bool) -> str:
    """``added``, ``present`` or ``skipped`` (not an encoder results JSON) for one file.

    Raises:
        ValueError: naming the file, if its record is not a valid config.
    """
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return "skipped"
    config = raw.get("config") if isinstance(raw, dict) else None
    if not isinstance(config, dict) or "method" not in config or "scores" not in raw:
        return "skipped"
    if "htp_config" in raw:
        return "present"
    try:
        raw["htp_config"] = HTPConfig.from_record(config).to_dict()
        if isinstance(config.get("query_config"), dict):
            raw["query_htp_config"] = HTPConfig.from_record(config["query_config"]).to_dict()
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    if write:
        path.write_text(json.dumps(raw, indent=2, sort_keys=True))
    return "added"


def main(argv: list[str] | None = None) -> int:
    """Command line entry point; returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("roots", nargs="+", help="results folders (searched recursively)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if any lacks it")
    args = p.parse_args(argv)
    counts = {"added": 0, "present": 0, "skipped": 0}
    for root in args.roots:
        for path in sorted(Path(root).rglob("*.json")):
            counts[migrate(path, write=not args.check)] += 1
    verb = "would add" if args.check else "added"
    print(f"{verb} htp_config to {counts['added']} files; {counts['present']} had it; "
          f"{counts['skipped']} are not encoder results")
    return 1 if args.check and counts["added"] else 0


if __name__ == "__main__":
    sys.exit(main())
