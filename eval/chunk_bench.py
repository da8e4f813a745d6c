"""``htp-retrieval bench-chunks``: seconds per 1,000 chunks, naive chunks against late chunking.

The same documents are cut into the same chunks (:func:`~htp_retrieval.chunking.split_chunks`)
and embedded two ways with each method, in one process:

* ``naive``: every chunk on its own, one batched :meth:`~htp_retrieval.HTPEncoder.encode`
  call over all chunks (what a LangChain or LlamaIndex pipeline does);
* ``late``: contextual chunk embeddings (late chunking, Günther et al. 2024,
  arXiv 2409.04701), :meth:`~htp_retrieval.HTPEncoder.encode_late_chunks`: one forward pass
  per window of whole chunks of a document, so the pass count follows the documents, not
  the chunks.

Each method is warmed up on a few chunks and one document, then the two chunkings are timed
alternately (``--repeats`` times each; the median is kept). The figures are what one
machine did: the JSON records the CPU or GPU, the dtype and the threads.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any, get_args

from htp_retrieval.dtypes import DTypeArg
from htp_retrieval.files import atomic_write

DEFAULT_DATA = "../shared/data/spans/qmsum"
"""QMSum meetings (about 53k characters each), the chunk-level eval's documents."""

CHUNKINGS = ("naive", "late")
"""The two chunk embeddings timed."""


def sample_documents(path: str | Path, n_docs: int, seed: int = 0) -> dict[str, str]:
    """A seeded sample of documents from ``corpus.jsonl`` of a BEIR-layout folder.

    Args:
        path: The folder (an evidence-span folder such as ``spans/qmsum`` is one).
        n_docs: Documents to keep (0: all).
        seed: Sampling seed (the eval's ``--max-docs``/``--seed`` sample of the same folder).

    Returns:
        ``doc_id -> text``, ids sorted.

    Raises:
        FileNotFoundError: if ``corpus.jsonl`` is missing (the path is named).
        ValueError: if no document has text.
    """
    from htp_retrieval.eval.data import read_jsonl

    corpus_file = Path(path) / "corpus.jsonl"
    if not corpus_file.exists():
        raise FileNotFoundError(f"no corpus.jsonl in {path}: give --data a BEIR-layout folder "
                                f"such as {DEFAULT_DATA}")
    docs = {str(r["_id"]): str(r.get("text") or "") for r in read_jsonl(corpus_file)}
    docs = {d: t for d, t in docs.items() if t.strip()}
    if not docs:
        raise ValueError(f"{corpus_file}: no document has text")
    ids = sorted(docs)
    if n_docs and n_docs < len(ids):
        ids = sorted(random.Random(seed).sample(ids, n_docs))
    return {d: docs[d] for d in ids}


def time_chunkings(encoder: Any, texts: list[str], chunks: list[list[Any]], *,
                   repeats: int = 2, window_tokens: int | None = None) -> dict[str, Any]:
    """Time naive and late chunk embeddings of the same chunks with one encoder.

    Args:
        encoder: An :class:`~htp_retrieval.HTPEncoder` with a mean-pooled method.
        texts: ``[n_docs]`` documents.
        chunks: ``[n_docs][n_chunks]`` their chunks.
        repeats: Timed runs of each chunking, alternating (median kept).
        window_tokens: Late chunking's text tokens per forward pass (default: the
            encoder's ``max_length``).

    Returns:
        Per chunking: ``seconds`` (median wall time, seconds), ``runs`` (every run),
        ``s_per_1000_chunks``, ``text_tokens``, ``forward_passes`` (texts or windows run
        through the model) and ``forward_seconds``; plus ``late_over_naive`` (time ratio).

    Raises:
        ValueError: as :meth:`~htp_retrieval.HTPEncoder.encode_late_chunks` (a method
            without mean pooling, ``window_tokens`` above ``max_length``).
    """
    from htp_retrieval.eval.bench import _sync

    device = str(getattr(encoder.model, "device", "cpu"))
    flat = [c.text(t) for t, cs in zip(texts, chunks, strict=True) for c in cs]
    n_chunks = len(flat)
    encoder.encode(flat[:32])  # warm-up: kernels, allocator, tokenizer
    encoder.encode_late_chunks(texts[:1], chunks[:1], window_tokens=window_tokens)

    def run(chunking: str) -> tuple[float, dict[str, Any]]:
        _sync(device)
        t = time.perf_counter()
        if chunking == "naive":
            encoder.encode(flat)
        else:
            encoder.encode_late_chunks(texts, chunks, window_tokens=window_tokens)
        _sync(device)
        seconds = time.perf_counter() - t
        st = encoder.last_stats
        passes = st.n_windows if chunking == "late" else n_chunks
        return seconds, {"text_tokens": st.text_tokens, "forward_passes": passes,
                         "forward_seconds": st.forward_seconds}

    runs: dict[str, list[float]] = {c: [] for c in CHUNKINGS}
    info: dict[str, dict[str, Any]] = {}
    for r in range(repeats):
        for chunking in (CHUNKINGS if r % 2 == 0 else CHUNKINGS[::-1]):
            seconds, info[chunking] = run(chunking)
            runs[chunking].append(seconds)
    out: dict[str, Any] = {}
    for chunking in CHUNKINGS:
        med = statistics.median(runs[chunking])
        out[chunking] = {"seconds": med, "runs": runs[chunking],
                         "s_per_1000_chunks": 1000 * med / n_chunks, **info[chunking]}
    out["late_over_naive"] = out["late"]["seconds"] / out["naive"]["seconds"]
    return out


def run_chunk_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark the parsed ``bench-chunks`` arguments describe.

    Returns:
        ``{"config", "versions", "n_docs", "n_chunks", "methods": {method: figures}}``
        (figures: :func:`time_chunkings`).

    Raises:
        ValueError: for bad arguments (named), a method without mean pooling.
        FileNotFoundError: if ``--data`` has no ``corpus.jsonl``.
    """
    import torch
    from tqdm.auto import tqdm

    from htp_retrieval import HTPEncoder
    from htp_retrieval.chunking import split_chunks
    from htp_retrieval.eval.retrieval import versions
    from htp_retrieval.methods import get_method

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in methods:
        if get_method(m).pooling != "mean":
            raise ValueError(f"--methods: {m!r} uses last-token pooling, which has no "
                             "per-chunk readout for late chunking: use vanilla-mean, tp-mean "
                             "or htp")
    if args.n_docs < 0 or args.repeats < 1 or args.threads < 0:
        raise ValueError("--n-docs must be >= 0, --repeats >= 1 and --threads >= 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    docs = sample_documents(args.data, args.n_docs, args.seed)
    out: dict[str, Any] = {"methods": {}}
    config: dict[str, Any] = {}
    texts = list(docs.values())
    chunks: list[list[Any]] = []
    for method in tqdm(methods, desc="bench-chunks", unit="method", disable=args.quiet):
        enc = HTPEncoder(args.model, method, dtype=args.dtype, device=args.device,
                         batch_size=args.batch_size)
        if not chunks:  # one model, one tokenizer: the same chunks for every method
            chunks = [split_chunks(t, enc.tokenizer, chunk_tokens=args.chunk_tokens,
                                   chunk_overlap=args.chunk_overlap) for t in texts]
        figs = time_chunkings(enc, texts, chunks, repeats=args.repeats,
                              window_tokens=args.window_tokens)
        out["methods"][method] = {**figs, "htp_config": enc.config.to_dict()}
        out["n_docs"], out["n_chunks"] = len(texts), sum(len(c) for c in chunks)
        config = {"model": args.model, "data": str(args.data), "seed": args.seed,
                  "chunk_tokens": args.chunk_tokens, "chunk_overlap": args.chunk_overlap,
                  "window_tokens": args.window_tokens or enc.max_length,
                  "dtype": str(enc.model.dtype).replace("torch.", ""),
                  "device": str(enc.model.device),
                  "threads": torch.get_num_threads(), "batch_size": args.batch_size,
                  "repeats": args.repeats,
                  "command": "htp-retrieval " + " ".join(shlex.quote(a) for a in args.argv)}
        del enc
    out["config"] = config
    out["versions"] = versions()
    out["created"] = time.time()
    return out


def format_chunk_bench(res: dict[str, Any]) -> str:
    """A markdown table of a :func:`run_chunk_bench` result."""
    c = res["config"]
    lines = [f"{res['n_docs']} documents, {res['n_chunks']} chunks of <= {c['chunk_tokens']} "
             f"tokens; late windows of {c['window_tokens']} tokens; {c['model']}, "
             f"{c['dtype']}, {c['device']}, {c['threads']} threads, "
             f"{res['versions'].get('cpu', '?')}",
             "",
             "| method | naive s | naive s / 1,000 chunks | late s | late s / 1,000 chunks "
             "| late / naive | forward passes naive / late |",
             "|---|---|---|---|---|---|---|"]
    for m, f in res["methods"].items():
        n, lt = f["naive"], f["late"]
        lines.append(f"| {m} | {n['seconds']:.2f} | {n['s_per_1000_chunks']:.1f} | "
                     f"{lt['seconds']:.2f} | {lt['s_per_1000_chunks']:.1f} | "
                     f"{f['late_over_naive']:.2f} | {n['forward_passes']} / "
                     f"{lt['forward_passes']} |")
    return "\n".join(lines)


def cmd_bench_chunks(args: argparse.Namespace) -> int:
    """Run ``htp-retrieval bench-chunks``: print the table, write the JSON."""
    res = run_chunk_bench(args)
    c = res["config"]
    model = str(c["model"]).replace("/", "__")
    out_dir = Path(args.output)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / (f"{model}__chunks__{c['device'].split(':')[0]}-{c['dtype']}-"
                      f"t{c['threads']}__d{res['n_docs']}__c{c['chunk_tokens']}.json")
    with atomic_write(path) as f:
        f.write(json.dumps(res, indent=2))
    print(format_chunk_bench(res))
    print(f"wrote {path}", file=sys.stderr)
    return 0


def add_subcommand(sub: argparse._SubParsersAction) -> None:
    """Register ``bench-chunks`` on the ``htp-retrieval`` subparsers ``sub``."""
    p = sub.add_parser(
        "bench-chunks", help="seconds per 1,000 chunks: naive chunks vs late chunking",
        description="Cuts the same documents into the same chunks and times embedding them "
                    "one by one (naive) and by late chunking (one pass per window of whole "
                    "chunks), per method, in one process; writes a JSON.")
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="packaged name, .gguf path, local dir or hub id")
    p.add_argument("--data", default=DEFAULT_DATA,
                   help="BEIR-layout folder; its corpus.jsonl documents are chunked")
    p.add_argument("--n-docs", type=int, default=24, help="seeded document sample (0: all)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--methods", default="vanilla-mean,htp",
                   help="comma-separated mean-pooled methods")
    p.add_argument("--chunk-tokens", type=int, default=256, help="chunk size in tokens")
    p.add_argument("--chunk-overlap", type=int, default=0, help="chunk overlap in tokens")
    p.add_argument("--window-tokens", type=int, default=None,
                   help="late chunking: text tokens per pass (default: max_length)")
    p.add_argument("--repeats", type=int, default=2, help="timed runs per chunking (median)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (0: default)")
    p.add_argument("--dtype", default="auto", choices=get_args(DTypeArg))
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--batch-size", type=int, default=32, help="texts or windows per batch")
    p.add_argument("--output", default="results/bench", help="folder for the JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_bench_chunks)


__all__ = ["DEFAULT_DATA", "add_subcommand", "format_chunk_bench", "run_chunk_bench",
           "sample_documents", "time_chunkings"]
