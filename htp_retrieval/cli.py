"""Command line: ``htp-retrieval eval | layout | ingest | query``."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
from pathlib import Path

from htp_retrieval.methods import METHODS


def _result_name(args: argparse.Namespace, method: str) -> str:
    parts = [method, f"len{args.max_length}"]
    if args.k is not None:
        parts.append(f"k{args.k}")
    if args.tokens_per_block is not None:
        parts.append(f"n{args.tokens_per_block}")
    if args.tp_start is not None or args.tp_exit is not None:
        parts.append(f"tp{args.tp_start}-{args.tp_exit}")
    if args.output_layer is not None:
        parts.append(f"out{args.output_layer}")
    if args.segmenter != "sentencizer":
        parts.append(args.segmenter)
    if args.max_queries or args.max_docs:
        parts.append(f"q{args.max_queries}d{args.max_docs}s{args.seed}")
    return "__".join(parts) + ".json"


def format_table(results: list, *, baseline: str = "vanilla-mean") -> str:
    """Markdown table of retrieval results with cost ratios to ``baseline`` (same run set).

    Args:
        results: :class:`~htp_retrieval.eval.retrieval.RetrievalResult` objects.
        baseline: Method whose time and memory are the denominators.
    """
    base = next((r for r in results if r.config["method"] == baseline), None)
    head = ("| method | NDCG@10 | Recall@100 | encode s | text tokens/s | peak MiB "
            "| time x vanilla-mean | memory x vanilla-mean |")
    lines = [head, "|" + "---|" * 8]
    for r in results:
        c = r.cost
        t_ratio = m_ratio = "n/a"
        if base is not None:
            t_ratio = f"{c['encode_seconds'] / base.cost['encode_seconds']:.2f}"
            bm = base.cost["peak_memory_bytes"]
            m_ratio = f"{c['peak_memory_bytes'] / bm:.2f}" if bm > 0 else "n/a"
        lines.append(
            f"| {r.config['method']} | {r.scores['NDCG@10']:.2f} | {r.scores['Recall@100']:.2f} "
            f"| {c['encode_seconds']:.1f} | {c['tokens_per_second']:.0f} "
            f"| {c['peak_memory_bytes'] / 2**20:.0f} | {t_ratio} | {m_ratio} |"
        )
    return "\n".join(lines)


def cmd_eval(args: argparse.Namespace) -> int:
    import torch

    from htp_retrieval.encoder import HTPEncoder
    from htp_retrieval.eval.data import load_beir, subsample
    from htp_retrieval.eval.retrieval import RetrievalResult, run_retrieval

    if args.threads:
        torch.set_num_threads(args.threads)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    data = load_beir(args.data, split=args.split)
    if args.max_queries or args.max_docs:
        data = subsample(data, n_queries=args.max_queries or None,
                         n_docs=args.max_docs or None, seed=args.seed)
    print(f"{data.name} ({args.split}): {len(data.corpus)} documents, {len(data.queries)} "
          f"queries, model {args.model}", file=sys.stderr)
    out_dir = Path(args.output) / args.model.replace("/", "__") / f"{data.name}-{args.split}"
    results = []
    for method in methods:
        path = out_dir / _result_name(args, method)
        if path.exists() and not args.overwrite:
            print(f"[{method}] reusing {path} (--overwrite to recompute)", file=sys.stderr)
            results.append(RetrievalResult.load(path))
            continue
        enc = HTPEncoder(
            args.model, method, k=args.k, tokens_per_block=args.tokens_per_block,
            segmenter=args.segmenter, max_length=args.max_length, tp_start=args.tp_start,
            tp_exit=args.tp_exit, output_layer=args.output_layer, device=args.device,
            dtype=args.dtype, batch_size=args.batch_size,
            max_tokens_per_batch=args.max_tokens_per_batch,
        )
        print(f"[{method}] encoding ...", file=sys.stderr)
        ckpt = path.with_name(path.stem + ".partial")
        res = run_retrieval(enc, data, split=args.split, show_progress_bar=not args.quiet,
                            checkpoint_dir=ckpt, chunk_size=args.chunk_size)
        res.config["command"] = "htp-retrieval " + " ".join(shlex.quote(a) for a in sys.argv[1:])
        res.save(path)
        shutil.rmtree(ckpt, ignore_errors=True)
        print(f"[{method}] NDCG@10 {res.scores['NDCG@10']:.2f}  -> {path}", file=sys.stderr)
        results.append(res)
    print(format_table(results))
    return 0


def cmd_layout(args: argparse.Namespace) -> int:
    from htp_retrieval.encoder import HTPEncoder

    enc = HTPEncoder(args.model, args.method, k=args.k, max_length=args.max_length)
    print(enc.describe(args.text, instruction=args.instruction))
    return 0


def cmd_segmenters(args: argparse.Namespace) -> int:
    import time

    from htp_retrieval.eval.data import load_beir
    from htp_retrieval.segmentation import get_segmenter

    data = load_beir(args.data, split=args.split)
    texts = [data.doc_text(d) for d in data.corpus][: args.max_docs or None]
    print("| segmenter | seconds | ms/doc | sentences/doc |\n|---|---|---|---|")
    for name in args.names.split(","):
        seg = get_segmenter(name)  # type: ignore[arg-type]
        t0 = time.perf_counter()
        starts = seg.sentence_starts(texts)
        dt = time.perf_counter() - t0
        print(f"| {name} | {dt:.1f} | {1000 * dt / len(texts):.2f} "
              f"| {sum(map(len, starts)) / len(starts):.1f} |")
    return 0


def _add_encoder_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="packaged name, .gguf path, local dir or hub id")
    p.add_argument("--max-length", type=int, default=512, help="max text tokens per text")
    p.add_argument("--k", type=int, default=None, help="sentences per block (K)")
    p.add_argument("--tokens-per-block", type=int, default=None,
                   help="N for htp-fixed-tokens")
    p.add_argument("--tp-start", type=int, default=None)
    p.add_argument("--tp-exit", type=int, default=None)
    p.add_argument("--output-layer", type=int, default=None,
                   help="early exit as hidden_states[i], e.g. -2")
    p.add_argument("--segmenter", default="sentencizer",
                   choices=["sentencizer", "spacy", "pysbd", "regex"])
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-tokens-per-batch", type=int, default=16384)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``htp-retrieval`` command."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = argparse.ArgumentParser(prog="htp-retrieval", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("eval", help="retrieval eval on a BEIR folder (NDCG@10, cost)")
    p.add_argument("--data", required=True, help="BEIR folder (corpus.jsonl, queries, qrels)")
    p.add_argument("--split", default="test")
    p.add_argument("--methods", default="vanilla-mean,htp",
                   help="comma-separated; any of: " + ", ".join(METHODS))
    p.add_argument("--output", default="results", help="results folder")
    p.add_argument("--overwrite", action="store_true", help="recompute existing results")
    p.add_argument("--max-queries", type=int, default=0, help="subsample queries (0: all)")
    p.add_argument("--max-docs", type=int, default=0,
                   help="subsample documents: relevant ones + distractors (0: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--chunk-size", type=int, default=1024,
                   help="documents per corpus checkpoint chunk (an interrupted run resumes)")
    _add_encoder_args(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("layout", help="print the placeholder layout of one input")
    p.add_argument("text")
    p.add_argument("--method", default="htp")
    p.add_argument("--instruction", default=None)
    _add_encoder_args(p)
    p.set_defaults(func=cmd_layout)

    from htp_retrieval.integrations.cli import add_subcommands

    add_subcommands(sub)

    p = sub.add_parser("segmenters", help="time the sentence segmenters on a BEIR corpus")
    p.add_argument("--data", required=True)
    p.add_argument("--split", default="test")
    p.add_argument("--names", default="regex,sentencizer,pysbd,spacy")
    p.add_argument("--max-docs", type=int, default=0)
    p.set_defaults(func=cmd_segmenters)

    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
