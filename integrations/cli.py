"""``htp-retrieval ingest | query | collections | drop`` subcommands (Chroma).

:func:`add_subcommands` adds them to the main parser's subparsers; each sets ``func`` to a
handler that takes the parsed arguments and returns the exit status. Expected failures
(missing source, unknown collection, model or method, invalid name, unreachable server,
conflicting settings) print one line naming the thing and the fix and exit 2; ``--debug``
shows the traceback instead.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from htp_retrieval.chunking import DEFAULT_CHUNK_TOKENS
from htp_retrieval.models import DEFAULT_MODEL

EXIT_USAGE = 2
"""Exit status of an expected failure (bad input or settings; nothing was written)."""

_FLAGS = {"model_name": "--model", "method": "--method", "query_instruction":
          "--query-instruction", "document_instruction": "--document-instruction",
          "max_length": "--max-length", "dtype": "--dtype", "overflow": "--overflow",
          "chunking": "--chunking", "chunk_size": "--chunk-size",
          "chunk_overlap": "--chunk-overlap", "config": "--config"}
_SHOWN = 20  # skipped files printed per reason before a count


def _expected_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [ValueError, LookupError, OSError, ImportError]
    try:
        from chromadb.errors import ChromaError

        errors.append(ChromaError)
    except ImportError:  # pragma: no cover - chromadb is required by these commands
        pass
    return tuple(errors)


def _one_line(e: BaseException) -> str:
    msg = " ".join(str(e).split()) or type(e).__name__
    return msg if len(msg) <= 600 else msg[:597] + "..."


def friendly_errors(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Wrap a command handler: an expected error prints one line and returns 2.

    The line is ``htp-retrieval COMMAND: error: MESSAGE`` on stderr; with ``--debug`` the
    exception propagates (full traceback). Unexpected errors always propagate.
    """

    @functools.wraps(fn)
    def wrapper(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except _expected_errors() as e:
            if getattr(args, "debug", False):
                raise
            print(f"htp-retrieval {args.cmd}: error: {_one_line(e)}", file=sys.stderr)
            return EXIT_USAGE

    return wrapper


def quiet_loading() -> None:
    """Silence the model-loading progress bars of transformers and huggingface_hub."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    try:
        from huggingface_hub.utils import disable_progress_bars
        from transformers.utils import logging as hf_logging

        disable_progress_bars()
        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover - both are core dependencies
        pass


def _add_db_args(p: argparse.ArgumentParser, *, collection: bool = True) -> None:
    p.add_argument("--db", default="chroma",
                   help="Chroma directory (embedded PersistentClient, default ./chroma) or "
                        "http://HOST:PORT of a 'chroma run' server")
    if collection:
        p.add_argument("--collection", default="htp",
                       help="collection name (3-512 chars of [a-zA-Z0-9._-]; default htp)")
    p.add_argument("--debug", action="store_true",
                   help="show the full traceback of an error instead of one line")


def _requested(args: argparse.Namespace) -> dict[str, Any]:
    """The collection settings given on the command line (the others are reused).

    Raises:
        FileNotFoundError, ValueError: for a ``--config`` file that is missing or holds no
            valid config, or ``--method``/``--max-length``/``--overflow`` values that differ
            from it (each message names the file).
    """
    got = {k: v for k, v in {"model_name": args.model, "method": args.method,
                             "max_length": args.max_length, "dtype": args.dtype,
                             "overflow": args.overflow, "chunking": args.chunking,
                             "chunk_size": args.chunk_size,
                             "chunk_overlap": args.chunk_overlap}.items()
           if v is not None}
    for key in ("query_instruction", "document_instruction"):
        value = getattr(args, key)
        if value is not None:  # '' asks for no instruction: stored as None
            got[key] = value or None
    if args.config is not None:
        cfg = _config_file(args.config)
        from htp_retrieval.methods import get_method

        for key in ("method", "max_length", "overflow"):
            value = got.get(key)
            if key == "method" and value is not None:
                value = get_method(value).name
            if value is not None and value != getattr(cfg, key):
                raise ValueError(f"{_FLAGS[key]} {got[key]} conflicts with --config "
                                 f"{args.config} ({key} {getattr(cfg, key)!r}): leave "
                                 f"{_FLAGS[key]} out (it follows the config)")
        got["config"] = cfg
    return got


def _config_file(path: str) -> Any:
    """The :class:`~htp_retrieval.config.HTPConfig` of a ``--config`` file.

    Raises:
        FileNotFoundError, ValueError: naming the file
            (:func:`~htp_retrieval.config.read_config_file`).
    """
    from htp_retrieval.config import read_config_file

    try:
        return read_config_file(path)
    except (OSError, ValueError) as e:
        raise type(e)(f"--config: {e}") from None


def _flag_names(msg: str) -> str:
    """A settings-conflict message with setting names replaced by their flags."""
    for key, flag in _FLAGS.items():
        msg = re.sub(rf"(?<![\w.]){key} stored", f"{flag} stored", msg)
    return msg.replace("leave them out", "leave those flags out")


def _print_skipped(report: Any) -> None:
    by_reason: dict[str, list[str]] = {}
    for s in report.skipped:
        kind = s.reason.split(" (")[0]
        by_reason.setdefault(kind, []).append(f"skipped {s.path}: {s.reason}")
    for kind, lines in by_reason.items():
        for line in lines[:_SHOWN]:
            print(line, file=sys.stderr)
        if len(lines) > _SHOWN:
            print(f"skipped {len(lines) - _SHOWN} more ({kind})", file=sys.stderr)
    if report.skipped:
        print("skipped files are not read: add --include PATTERN (e.g. --include '*.rst') "
              "to read them", file=sys.stderr)


@friendly_errors
def cmd_ingest(args: argparse.Namespace) -> int:
    """Run ``htp-retrieval ingest``: exit 0, 1 with ``--strict`` when documents were rejected,
    2 on an expected error (nothing written).

    Settings not given on the command line are those stored with an existing collection
    (or the defaults for a new one: ``--chunking naive``); a setting that differs from the
    stored one is refused. ``--config FILE`` gives a saved
    :class:`~htp_retrieval.config.HTPConfig` for a new collection (an existing one must
    have been made with it).
    With ``--ray`` the documents are read, embedded and written by a Ray Data job
    (:func:`htp_retrieval.integrations.ray_ingest.ingest_ray`) into a Chroma server.
    """
    if args.quiet:
        quiet_loading()
    from htp_retrieval.long_text import truncation_warnings_off

    # the encoder's warnings name batch indices; the ingest report names documents by id
    with truncation_warnings_off():
        return _ingest(args)


def _ingest(args: argparse.Namespace) -> int:
    """The body of :func:`cmd_ingest`."""
    from htp_retrieval.integrations._runtime import check_model
    from htp_retrieval.integrations.chroma import (
        HTPEmbeddingFunction,
        SettingsConflictError,
        check_collection_name,
        ingest,
        make_client,
        resolve_settings,
    )
    from htp_retrieval.integrations.sources import check_documents

    check_collection_name(args.collection)
    check_documents(args.source, args.include)
    if args.method is not None:
        from htp_retrieval.methods import get_method

        get_method(args.method)  # a misspelt name fails before torch is imported
    from htp_retrieval.centering import read_query_file

    queries = read_query_file(args.center_queries) if args.center_queries else None
    if args.ray and queries is not None:
        raise ValueError("--center-queries is not supported with --ray: ingest once without "
                         "--ray to create the centred collection")
    if args.ray and not str(args.db).startswith(("http://", "https://")):
        raise ValueError(f"--ray writes to a Chroma server: give --db http://HOST:PORT of a "
                         f"'chroma run' server, not {args.db!r}")
    if args.batch_size < 1 or args.embed_batch_size < 0 or args.threads < 0:
        raise ValueError("--batch-size must be >= 1, --embed-batch-size and --threads >= 0")
    if args.threads and not args.ray:
        import torch

        torch.set_num_threads(args.threads)
    from htp_retrieval.integrations._runtime import check_device
    from htp_retrieval.models import pick_device

    device = check_device(args.device)
    embed_batch = args.embed_batch_size or (16 if pick_device(device) != "cpu" or args.num_gpus
                                            else 1)
    requested = _requested(args)
    HTPEmbeddingFunction(**requested, device=device)  # method, dtype: before any write
    if args.model is not None:
        check_model(args.model)
    client = make_client(args.db)
    if "chunking" not in requested and args.collection not in {
            getattr(c, "name", c) for c in client.list_collections()}:
        requested["chunking"] = "naive"  # a new collection; an existing one keeps its own
        HTPEmbeddingFunction(**requested, device=device)  # e.g. late needs a mean method
    try:
        ef = resolve_settings(client, args.collection, requested, device=device,
                              batch_size=embed_batch)
    except SettingsConflictError as e:
        raise SettingsConflictError(_flag_names(str(e))) from e
    if args.ray:
        from htp_retrieval.integrations.ray_ingest import ingest_ray

        concurrency: int | tuple[int, int] = args.concurrency
        if args.max_concurrency:
            concurrency = (args.concurrency, args.max_concurrency)
        report = ingest_ray(args.source, db=args.db, collection=args.collection,
                            embedding_function=ef, batch_size=args.batch_size,
                            concurrency=concurrency, num_gpus=args.num_gpus,
                            num_cpus=args.num_cpus, threads=args.threads,
                            address=args.ray_address, show_progress=not args.quiet,
                            include=tuple(args.include), prune=args.prune)
    else:
        report = ingest(args.source, db=client, collection=args.collection,
                        embedding_function=ef, batch_size=args.batch_size,
                        show_progress=not args.quiet, include=tuple(args.include),
                        prune=args.prune, center_queries=queries,
                        refit_centering={"auto": None, "always": True,
                                         "never": False}[args.refit_centering],
                        query_source=Path(args.center_queries).name if queries else "")
    for r in report.rejected:
        print(f"rejected {r.id}: {r.reason}", file=sys.stderr)
    _print_skipped(report)
    for doc_id in report.pruned:
        print(f"pruned {doc_id}: source gone", file=sys.stderr)
    for doc_id in report.stale:
        print(f"stale {doc_id}: source gone (--prune removes it)", file=sys.stderr)
    if report.truncated and ef.chunking != "none":
        print(f"truncated a chunk of {len(report.truncated)} document(s) to --max-length "
              f"{ef.max_length} tokens (the splitter made it longer than --chunk-size "
              f"{ef.chunk_size}; a smaller --chunk-size avoids it; chunk metadata "
              f"'truncated'): {', '.join(report.truncated)}", file=sys.stderr)
    elif report.truncated:
        print(f"truncated {len(report.truncated)} document(s) to --max-length "
              f"{ef.max_length} tokens (--overflow truncate; --overflow window embeds them "
              f"whole): {', '.join(report.truncated)}", file=sys.stderr)
    print(report.summary())
    return 1 if args.strict and report.rejected else 0


@friendly_errors
def cmd_query(args: argparse.Namespace) -> int:
    """Run ``htp-retrieval query``: print the hits (text or JSON lines); 2 on an expected
    error (a missing database directory is never created). The query is embedded with the
    collection's stored config; ``--config FILE`` checks that it is that file's."""
    from htp_retrieval.integrations.chroma import query

    if args.quiet:
        quiet_loading()
    if args.n_results < 1 or args.snippet < 0:
        raise ValueError(f"-k/--n-results must be >= 1 and --snippet >= 0, got "
                         f"{args.n_results} and {args.snippet}")
    if args.config is not None:
        _check_collection_config(args)
    hits = query(args.text, db=args.db, collection=args.collection, n_results=args.n_results,
                 group_by_document=args.group_by_document)
    for rank, h in enumerate(hits, 1):
        span = h.span
        if args.json:
            row: dict[str, Any] = {"rank": rank, "id": h.id, "score": h.score,
                                   "parent_id": h.parent_id,
                                   "chunk_index": h.metadata.get("chunk_index"),
                                   "chunk_start": span[0] if span else None,
                                   "chunk_end": span[1] if span else None,
                                   "metadata": h.metadata, "document": h.document}
            print(json.dumps(row, ensure_ascii=False))
        else:
            where = (f"  [{h.parent_id} chars {span[0]}-{span[1]}]" if span is not None
                     else "")
            snippet = " ".join((h.document or "").split())[: args.snippet]
            print(f"{rank}. {h.id}  score {h.score:.4f}{where}\n   {snippet}")
    return 0


def _check_collection_config(args: argparse.Namespace) -> None:
    """Refuse ``query --config FILE`` on a collection stored with another config.

    Raises:
        SettingsConflictError: naming the file and each setting that differs.
    """
    from htp_retrieval.integrations.chroma import (
        SettingsConflictError,
        collection_embedding_function,
        config_diff,
        get_collection,
        make_client,
        stored_htp_config,
    )

    cfg = _config_file(args.config)
    col = get_collection(make_client(args.db, create=False), args.collection)
    diff = config_diff(stored_htp_config(collection_embedding_function(col).get_config()),
                       cfg)
    if diff:
        raise SettingsConflictError(f"collection {args.collection!r} was not made with "
                                    f"--config {args.config} ({'; '.join(diff)}): leave "
                                    "--config out to query with the stored config")


@friendly_errors
def cmd_collections(args: argparse.Namespace) -> int:
    """Run ``htp-retrieval collections``: one line (or JSON object) per collection."""
    from htp_retrieval.integrations.chroma import list_collections

    infos = list_collections(args.db)
    for c in infos:
        if args.json:
            print(json.dumps({"name": c.name, "count": c.count, "settings": c.settings},
                             ensure_ascii=False))
        elif c.settings is None:
            print(f"{c.name}  {c.count} vectors  (not made by htp-retrieval)")
        else:
            s = c.settings
            chunks = (f"  chunking {s.get('chunking', 'none')}" if s.get("chunking", "none")
                      == "none" else f"  chunking {s.get('chunking')} {s.get('chunk_size')}"
                      f"/{s.get('chunk_overlap')} tokens")
            cen = s.get("centering")
            centred = (f"  centred ({cen.get('n_documents')} document vectors, "
                       f"{cen.get('n_queries')} queries)" if cen else "")
            print(f"{c.name}  {c.count} vectors  model {s.get('model_name')}  method "
                  f"{s.get('method')}  dtype {s.get('dtype')}  max_length "
                  f"{s.get('max_length')}  overflow {s.get('overflow', 'truncate')}{chunks}  "
                  f"query_instruction {s.get('query_instruction')!r}{centred}")
    if not infos and not args.json:
        print(f"no collections in {args.db}", file=sys.stderr)
    return 0


@friendly_errors
def cmd_drop(args: argparse.Namespace) -> int:
    """Run ``htp-retrieval drop``: delete a collection (asks first unless ``--yes``)."""
    from htp_retrieval.integrations.chroma import (
        CollectionNotFoundError,
        drop_collection,
        make_client,
    )

    client = make_client(args.db, create=False)
    names = sorted(c.name for c in client.list_collections())
    if args.collection not in names:
        raise CollectionNotFoundError(f"collection {args.collection!r} not found (collections "
                                      f"here: {', '.join(names) or 'none'})")
    if not args.yes:
        if not sys.stdin.isatty():
            raise ValueError(f"refusing to drop {args.collection!r} without confirmation: "
                             "add --yes")
        count = client.get_collection(args.collection).count()
        answer = input(f"Drop collection {args.collection!r} ({count} vectors) from "
                       f"{args.db}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing dropped", file=sys.stderr)
            return 1
    n = drop_collection(args.db, args.collection)
    print(f"dropped {args.collection} ({n} vectors)")
    return 0


def add_subcommands(subparsers: Any) -> None:
    """Add ``ingest``, ``query``, ``collections`` and ``drop`` to an ``argparse`` subparsers
    object.

    Args:
        subparsers: What ``ArgumentParser.add_subparsers()`` returned.
    """
    from htp_retrieval.methods import DEFAULT_QUERY_INSTRUCTION

    p = subparsers.add_parser(
        "ingest", help="embed a folder of .txt/.md files or a BEIR corpus.jsonl into Chroma",
        description="Idempotent, resumable ingestion: stable ids, batched writes; documents "
                    "that cannot be used (empty, no content, undecodable) are listed with "
                    "their ids, and files not read (other extensions, hidden) are listed too. "
                    "Settings left out are those stored with an existing collection.")
    p.add_argument("source", help="folder of .txt/.md files, or a BEIR corpus.jsonl "
                                  "(or a folder holding one)")
    p.add_argument("--collection", default="htp",
                   help="collection name (3-512 chars of [a-zA-Z0-9._-]; default htp)")
    p.add_argument("--db", default="chroma",
                   help="Chroma directory (embedded PersistentClient, default ./chroma) or "
                        "http://HOST:PORT of a 'chroma run' server")
    p.add_argument("--debug", action="store_true",
                   help="show the full traceback of an error instead of one line")
    g = p.add_argument_group("collection settings",
                             "stored with a new collection; left out, a rerun reuses them")
    g.add_argument("--model", default=None,
                   help=f"packaged name, .gguf path, local dir or hub id (new: {DEFAULT_MODEL})")
    g.add_argument("--method", default=None, help="htp, vanilla-mean, ... (new: htp)")
    g.add_argument("--query-instruction", default=None,
                   help=f"instruction stored for queries ('' for none; new: "
                        f"{DEFAULT_QUERY_INSTRUCTION!r})")
    g.add_argument("--document-instruction", default=None,
                   help="instruction for documents ('' for none; new: none)")
    g.add_argument("--max-length", type=int, default=None,
                   help="text tokens per forward pass (new: the model's context window, "
                        "stored as a number)")
    g.add_argument("--overflow", default=None, choices=("window", "truncate", "error"),
                   help="a text longer than --max-length is embedded whole in overlapping "
                        "windows (window), cut with the document named in the report "
                        "(truncate) or refused (error) (new: window)")
    g.add_argument("--chunking", default=None, choices=("none", "naive", "late"),
                   help="one vector per document (none), per chunk embedded alone (naive) or "
                        "per chunk pooled from one pass over its document (late); chunk ids "
                        "are DOC_ID#cN (new: naive)")
    g.add_argument("--chunk-size", type=int, default=None,
                   help=f"chunk size in tokens (new: {DEFAULT_CHUNK_TOKENS})")
    g.add_argument("--chunk-overlap", type=int, default=None,
                   help="overlap of consecutive chunks in tokens (new: 0)")
    g.add_argument("--dtype", default=None,
                   help="auto, bfloat16, float16 or float32 (new: auto, resolved on this "
                        "machine and stored: bf16 on a GPU or a CPU where native bf16 "
                        "measured as fast as fp32, float32 otherwise)")
    g.add_argument("--config", default=None, metavar="FILE.json",
                   help="a saved HTPConfig (a JSON file of encoder.config.to_json(), or a "
                        "results JSON with an 'htp_config' key) for a new collection; "
                        "--method, --max-length and --overflow follow it (new: resolved from "
                        "the flags and the model; the whole config is stored either way)")
    g.add_argument("--center-queries", default=None, metavar="FILE",
                   help="centre vectors on the corpus mean and queries on the mean of these "
                        "sample queries (one per line, or a BEIR queries.jsonl): a new "
                        "collection is fitted and stores the centring; an existing centred "
                        "one refits only its query mean (see docs/RAG.md, Centring)")
    g.add_argument("--refit-centering", default="auto", choices=("auto", "always", "never"),
                   help="a centred collection's document mean after this ingest: refitted "
                        "on every stored vector (re-centred, nothing embedded again) when "
                        "the vector count changed by more than 25%% since the last fit "
                        "(auto), always, or never")
    p.add_argument("--include", action="append", default=[], metavar="PATTERN",
                   help="also read files matching this glob (repeatable), e.g. '*.rst'")
    p.add_argument("--prune", action="store_true",
                   help="remove stored documents whose source file or entry is gone")
    p.add_argument("--batch-size", type=int, default=16, help="documents per write")
    p.add_argument("--embed-batch-size", type=int, default=0,
                   help="documents per forward pass (0: 1 on CPU, where batching gains "
                        "nothing and the progress bar moves per document; 16 on a GPU)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N (not stored)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    p.add_argument("--strict", action="store_true", help="exit 1 if any document was rejected")
    p.add_argument("--quiet", action="store_true", help="no progress bars (model loading too)")
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
    p.add_argument("--group-by-document", action="store_true",
                   help="the best chunk of each of the top -k documents (chunked collections)")
    p.add_argument("--config", default=None, metavar="FILE.json",
                   help="check that the collection was made with this saved HTPConfig "
                        "(queries always use the stored config)")
    p.add_argument("--quiet", action="store_true", help="no model-loading progress bar")
    p.set_defaults(func=cmd_query)

    p = subparsers.add_parser("collections",
                              help="list the collections of a database with their settings")
    _add_db_args(p, collection=False)
    p.add_argument("--json", action="store_true", help="one JSON object per collection")
    p.set_defaults(func=cmd_collections)

    p = subparsers.add_parser("drop", help="delete a collection (asks first)")
    p.add_argument("collection", help="collection name")
    _add_db_args(p, collection=False)
    p.add_argument("--yes", action="store_true", help="do not ask")
    p.set_defaults(func=cmd_drop)


__all__ = ["EXIT_USAGE", "add_subcommands", "cmd_collections", "cmd_drop", "cmd_ingest",
           "cmd_query", "friendly_errors", "quiet_loading"]
