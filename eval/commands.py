"""``htp-retrieval report`` and ``htp-retrieval mteb``: results reports with plots, MTEB runs."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any


def _report_command(args: argparse.Namespace) -> str:
    """The ``htp-retrieval report`` command line equivalent to ``args`` (canonical order,
    defaults left out), so the report names the command that re-creates it."""
    parts = ["htp-retrieval", "report", *args.results, "--output", args.output]
    for flag, value, default in (("--plots-dir", args.plots_dir, None),
                                 ("--baseline", args.baseline, "vanilla-mean"),
                                 ("--compare", args.compare, "htp"),
                                 ("--title", args.title, "Results"),
                                 ("--notes", args.notes, None)):
        if value != default:
            parts += [flag, value]
    if args.no_plots:
        parts.append("--no-plots")
    return " ".join(shlex.quote(str(p)) for p in parts)


def cmd_report(args: argparse.Namespace) -> int:
    """Write the Markdown report (and PNGs) for results folders/files."""
    from htp_retrieval.eval.report import MTEB_SKIP_REASON, build_report, write_report

    to_stdout = args.output == "-"
    notes = Path(args.notes).read_text(encoding="utf-8") if args.notes else None
    report = build_report(
        args.results,
        output=None if to_stdout else args.output,
        plots_dir=args.plots_dir,
        baseline=args.baseline,
        compare=args.compare,
        title=args.title,
        command=_report_command(args) if not args.no_command else None,
        notes=notes,
        plots=not args.no_plots,
    )
    if to_stdout:
        sys.stdout.write(report.markdown)
    else:
        path = write_report(report, args.output)
        print(f"wrote {path}: {report.n_tables} tables, {len(report.plots)} plots, "
              f"{len(report.comparisons)} {args.compare}-vs-{args.baseline} comparisons",
              file=sys.stderr)
    n_mteb = sum(why == MTEB_SKIP_REASON for _, why in report.skipped)
    for p, why in report.skipped:
        if why != MTEB_SKIP_REASON:
            print(f"skipped {p}: {why}", file=sys.stderr)
    if n_mteb:
        print(f"skipped {n_mteb} mteb output files", file=sys.stderr)
    return 0


def _main_scores(results: Any) -> list[tuple[str, str, str, float]]:
    """``(task, split, hf_subset, main score 0-1)`` rows of an mteb ``ModelResult``."""
    rows = []
    for tr in results.task_results:
        for split, entries in sorted(tr.scores.items()):
            for e in entries:
                rows.append((tr.task_name, split, str(e.get("hf_subset", "default")),
                             float(e["main_score"])))
    return rows


def cmd_mteb(args: argparse.Namespace) -> int:
    """Run MTEB tasks (local or hub) with one method and print the main scores."""
    import mteb
    import torch

    from htp_retrieval.cli import _preset_arg
    from htp_retrieval.eval.mteb_model import HTPMtebEncoder
    from htp_retrieval.eval.mteb_tasks import resolve_tasks

    if args.threads:
        torch.set_num_threads(args.threads)
    names = [t for t in args.tasks.split(",") if t.strip()]
    tasks = resolve_tasks(names, data_root=args.data_root, max_queries=args.max_queries or None,
                          max_docs=args.max_docs or None, max_pairs=args.max_pairs or None,
                          seed=args.seed)
    main_names = {t.metadata.name: t.metadata.main_score for t in tasks}
    model = HTPMtebEncoder(
        args.model, None, device=args.device, method=args.method, on_empty=args.on_empty,
        k=args.k, tokens_per_block=args.tokens_per_block, segmenter=args.segmenter,
        max_length=args.max_length or 512, overflow=args.overflow, tp_start=args.tp_start,
        tp_exit=args.tp_exit,
        output_layer=args.output_layer, dtype=args.dtype, batch_size=args.batch_size,
        max_tokens_per_batch=args.max_tokens_per_batch, max_blocks=args.max_blocks,
        min_block_tokens=args.min_block_tokens, long_budget=args.long_budget,
        short_budget=args.short_budget, preset=_preset_arg(args, "mteb"),
    )
    try:
        results = mteb.evaluate(
            model, tasks, cache=mteb.ResultCache(cache_path=args.output_folder),
            overwrite_strategy="always" if args.overwrite else "only-missing",
            encode_kwargs={"batch_size": args.batch_size, "show_progress_bar": not args.quiet},
            show_progress_bar=not args.quiet,
        )
    except ConnectionError as e:
        raise ConnectionError(
            f"{e}. mteb task names download their data from the Hugging Face hub; without "
            f"network use local tasks: scifact-local, qmsum-local, stsb-local, "
            f"beir:PATH[@split], sts:PATH[@split]") from e
    meta = model.mteb_model_meta
    print(f"model {meta.name} ({meta.experiment_name}); results under {args.output_folder}",
          file=sys.stderr)
    print("| task | split | subset | score | value (x100) |\n|---|---|---|---|---|")
    for task, split, subset, value in _main_scores(results):
        print(f"| {task} | {split} | {subset} | {main_names.get(task, 'main_score')} "
              f"| {100 * value:.2f} |")
    if model.calls:
        secs = sum(c["seconds"] for c in model.calls)
        toks = sum(c["text_tokens"] for c in model.calls)
        print(f"encode: {secs:.1f} s, {toks} text tokens, {toks / max(secs, 1e-9):.0f} "
              f"text tokens/s", file=sys.stderr)
    for err in results.exceptions or []:
        print(f"task {err.task_name} failed: {err.exception}", file=sys.stderr)
    return 1 if results.exceptions else 0


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    """Register this module's ``htp-retrieval`` subcommands on ``sub``."""
    p = sub.add_parser(
        "report", help="Markdown tables and PNG plots from results JSONs",
        description="Read every results JSON under the given folders/files and write a "
        "Markdown report with tables (scores, cost, ratios to the baseline), the commands "
        "that made them, plots, and where the compared method does not beat the baseline.")
    p.add_argument("results", nargs="+", help="results folders (searched recursively) or files")
    p.add_argument("--output", default="docs/RESULTS.md", help="Markdown file ('-': stdout)")
    p.add_argument("--plots-dir", default=None,
                   help="folder for PNGs (default: plots/ next to --output)")
    p.add_argument("--baseline", default="vanilla-mean",
                   help="method the ratios divide by and the compared method is measured against")
    p.add_argument("--compare", default="htp", help="method checked against the baseline")
    p.add_argument("--title", default="Results", help="the report's heading")
    p.add_argument("--notes", default=None, help="Markdown file put after the introduction")
    p.add_argument("--no-plots", action="store_true", help="tables only (no matplotlib)")
    p.add_argument("--no-command", action="store_true",
                   help="do not print the report command under the title")
    p.set_defaults(func=cmd_report)

    from htp_retrieval.cli import _add_encoder_args

    p = sub.add_parser(
        "mteb", help="run MTEB tasks (local files or hub) with any method",
        description="Run mteb 2.x tasks with an HTPEncoder. Local tasks need no hub: "
        "scifact-local, qmsum-local, stsb-local (under --data-root), beir:PATH[@split], "
        "sts:PATH[@split]. Other names are mteb task names (SciFact, STSBenchmark, ...).")
    p.add_argument("--tasks", required=True, help="comma-separated task names")
    p.add_argument("--method", default="htp")
    p.add_argument("--output-folder", default="results/mteb",
                   help="mteb results cache folder (results/<model>/<revision>/...)")
    p.add_argument("--data-root", default=None,
                   help="root of the named local tasks (default $HTP_RETRIEVAL_DATA or "
                   "../shared/data)")
    p.add_argument("--max-queries", type=int, default=0, help="subsample local retrieval tasks")
    p.add_argument("--max-docs", type=int, default=0, help="subsample local retrieval tasks")
    p.add_argument("--max-pairs", type=int, default=0, help="first N pairs of local STS tasks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--on-empty", default="error", choices=["error", "zeros"],
                   help="empty texts: fail naming the index, or embed as zero vectors")
    p.add_argument("--overwrite", action="store_true", help="recompute cached mteb results")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    _add_encoder_args(p)
    p.set_defaults(func=cmd_mteb)
