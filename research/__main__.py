"""python -m research: the research commands behind research/ANALYSIS.md.

Run from the repository root (default data and output paths are relative to it):
norms and drift (per-layer diagnosis), ablate and hubs (named encoder variants), table,
seeds, compare and paired (reading results), same-layouts (whether other K-policy settings
give a finished run the same inputs). research/README.md says which results each reads.
"""

from __future__ import annotations

import argparse

from htp_retrieval.cli import run_parsed, tokenizer_threads_on
from research.analysis import add_subcommands


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m research``."""
    tokenizer_threads_on()
    parser = argparse.ArgumentParser(prog="python -m research", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    add_subcommands(sub)
    return run_parsed(parser, sub, argv)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
