"""``htp-retrieval ingest`` and ``htp-retrieval query`` subcommands (Chroma).

:func:`add_subcommands` adds both to the main parser's subparsers; each sets ``func`` to a
handler that takes the parsed arguments and returns the exit status.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from htp_retrieval.methods import DEFAULT_QUERY_INSTRUCTION
from htp_retrieval.models import DEFAULT_MODEL


def _add_db_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default="chroma",
                   help="Chroma directory (embedded PersistentClient, default ./chroma) or "
                        "http://HOST:PORT of a 'chroma run' server")
    p.add_argument("--collection", default="htp",
                   help="collection name (3-512 chars of [a-zA-Z0-9._-]; default htp)")


def cmd_ingest(args: argparse.Namespace) -> int:
    """Run ``htp-retrieval ingest``: exit 0, or 1 with ``--strict`` when documents were rejected.

    With ``--ray`` the documents are read, embedded and written by a Ray Data job
    (:func:`htp_retrieval.integrations.ray_ingest.ingest_ray`) into a Chroma server.
    """
    from htp_retrieval.integrations.chroma import HTPEmbeddingFunction, ingest

    if args.threads and not args.ray:
        import torch

        torch.set_num_threads(args.threads)
    ef = HTPEmbeddingFunction(
        args.model, args.method,
        query_instruction=args.query_instruction or None,
        document_instruction=args.document_instruction or None,
        max_length=args.max_length, dtype=args.dtype, device=args.device,
        batch_size=args.batch_size,
    )
    if args.ray:
        from htp_retrieval.integrations.ray_ingest import ingest_ray

        concurrency: int | tuple[int, int] = args.concurrency
        if args.max_concurrency:
            concurrency = (args.concurrency, args.max_concurrency)
        report = ingest_ray(args.source, db=args.db, collection=args.collection,
                            embedding_function=ef, batch_size=args.batch_size,
                            concurrency=concurrency, num_gpus=args.num_gpus,
                            num_cpus=args.num_cpus, threads=args.threads,
                            address=args.ray_address, show_progress=not args.quiet)
    else:
        report = ingest(args.source, db=args.db, collection=args.collection,
                        embedding_function=ef, batch_size=args.batch_size,
                        show_progress=not args.quiet)
    for r in report.rejected:
        print(f"rejected {r.id}: {r.reason}", file=sys.stderr)
    print(report.summary())
    return 1 if args.strict and report.rejected else 0


def cmd_query(args: argparse.Namespace) -> int:
    """Run ``htp-retrieval query``: print the hits (text or JSON lines)."""
    from htp_retrieval.integrations.chroma import query

    hits = query(args.text, db=args.db, collection=args.collection, n_results=args.n_results)
    for rank, h in enumerate(hits, 1):
        if args.json:
            row: dict[str, Any] = {"rank": rank, "id": h.id, "score": h.score,
                                   "metadata": h.metadata, "document": h.document}
            print(json.dumps(row, ensure_ascii=False))
        else:
            snippet = " ".join((h.document or "").split())[: args.snippet]
            print(f"{rank}. {h.id}  score {h.score:.4f}\n   {snippet}")
    return 0


def add_subcommands(subparsers: Any) -> None:
    """Add ``ingest`` and ``query`` to an ``argparse`` subparsers object.

    Args:
        subparsers: What ``ArgumentParser.add_subparsers()`` returned.
    """
    p = subparsers.add_parser(
        "ingest", help="embed a folder of .txt/.md files or a BEIR corpus.jsonl into Chroma",
        description="Idempotent, resumable ingestion: stable ids, batched writes; documents "
                    "that cannot be used (empty, undecodable) are listed with their ids.")
    p.add_argument("source", help="folder of .txt/.md files, or a BEIR corpus.jsonl "
                                  "(or a folder holding one)")
    _add_db_args(p)
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help="packaged name, .gguf path, local dir or hub id")
    p.add_argument("--method", default="htp", help="htp, vanilla-mean, ...")
    p.add_argument("--query-instruction", default=DEFAULT_QUERY_INSTRUCTION,
                   help="instruction stored for queries ('' for none)")
    p.add_argument("--document-instruction", default="",
                   help="instruction for documents (default none)")
    p.add_argument("--max-length", type=int, default=512, help="max text tokens per document")
    p.add_argument("--batch-size", type=int, default=16, help="documents per write")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    p.add_argument("--strict", action="store_true", help="exit 1 if any document was rejected")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    g = p.add_argument_group(
        "distributed (Ray Data)",
        "--ray reads, embeds and writes with a Ray Data job: one model per actor, writes to "
        "the Chroma server given by --db http://HOST:PORT (idempotent upserts by id)")
    g.add_argument("--ray", action="store_true", help="ingest with Ray Data")
    g.add_argument("--ray-address", default=None,
                   help="Ray cluster (auto, ray://HOST:10001; default: RAY_ADDRESS or a new "
                        "local cluster)")
    g.add_argument("--concurrency", type=int, default=1, help="actors (one model each)")
    g.add_argument("--max-concurrency", type=int, default=0,
                   help="autoscale the actor pool from --concurrency up to this (0: fixed)")
    g.add_argument("--num-gpus", type=float, default=0.0,
                   help="GPUs per actor (e.g. 1, or 0.5 for two actors per GPU)")
    g.add_argument("--num-cpus", type=float, default=1.0, help="CPUs per actor")
    p.set_defaults(func=cmd_ingest)

    p = subparsers.add_parser("query", help="search a collection made by 'ingest'")
    p.add_argument("text", help="the query")
    _add_db_args(p)
    p.add_argument("-k", "--n-results", type=int, default=5, help="hits to show")
    p.add_argument("--json", action="store_true", help="one JSON object per hit")
    p.add_argument("--snippet", type=int, default=200, help="characters of text shown")
    p.set_defaults(func=cmd_query)


__all__ = ["add_subcommands", "cmd_ingest", "cmd_query"]
