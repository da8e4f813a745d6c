"""Distributed ingestion on Ray Data: read documents, embed on an actor pool, write to Chroma.

For corpora beyond one machine. The pipeline is one streaming Ray Data job:

1. **read**: a folder of ``.txt``/``.md`` files (``read_binary_files``, one row per file,
   id = path relative to the folder) or a BEIR ``corpus.jsonl`` (``read_binary_files`` and
   a line parser, ids from ``_id``, bad lines as ``line N``), with exactly the rules of the
   single-process :func:`~htp_retrieval.integrations.chroma.ingest`
   (:func:`~htp_retrieval.integrations.chroma.file_doc`,
   :func:`~htp_retrieval.integrations.chroma.read_beir_lines`);
2. **embed and write**: ``map_batches`` on an actor pool: each actor holds one
   :class:`~htp_retrieval.HTPEncoder` (through the collection's
   :class:`~htp_retrieval.integrations.chroma.HTPEmbeddingFunction`) and a Chroma
   ``HttpClient``; per batch it looks the ids up, skips documents stored with the same text,
   embeds the rest and upserts them by id
   (:func:`~htp_retrieval.integrations.chroma.write_batch`; a chunked collection's
   documents are cut and written as ``DOC_ID#cN`` chunks by
   :func:`~htp_retrieval.integrations.chroma.write_chunked`, as in the single-process
   ingestion), so a rerun adds nothing and a killed run is completed by the next one;
3. **report**: the driver streams the per-document statuses (``added``, ``updated``,
   ``unchanged``, ``rejected`` with the reason, truncated documents) into an
   :class:`~htp_retrieval.integrations.chroma.IngestReport`.

A rejected document (empty, undecodable, malformed line, duplicate id, or text the encoder
refuses) is reported by id and never blocks the others in its batch.

The Chroma store must be a server (``chroma run``; ``http://host:port``): several actors on
several machines write to it at once, which an embedded ``PersistentClient`` directory does
not support.

Example:
    >>> from htp_retrieval.integrations.ray_ingest import ingest_ray
    >>> report = ingest_ray("corpus.jsonl", db="http://10.0.0.5:8000", collection="docs",
    ...                     concurrency=4, num_gpus=1)          # doctest: +SKIP
    >>> print(report.summary())                                 # doctest: +SKIP
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from htp_retrieval.integrations.chroma import (
    HTPEmbeddingFunction,
    IngestReport,
    Rejected,
    SourceDoc,
    _names,
    finish_report,
    make_client,
    prepare_collection,
    write_batch,
)
from htp_retrieval.integrations.sources import (
    Skipped,
    check_documents,
    check_source,
    corpus_file,
    file_doc,
    list_folder,
    read_beir_lines,
)

try:
    import ray
    import ray.data
except ImportError as _e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f"the Ray ingestion needs ray[data] ({_e}): pip install \"htp-retrieval[ray]\""
    ) from _e

@dataclass
class RayIngestReport(IngestReport):
    """An :class:`IngestReport` plus ``workers``: the actor processes that wrote documents."""

    workers: int = 0

    def summary(self) -> str:
        """One line, e.g. ``docs: 34 read, 30 added, ...; 30 in collection; 2 workers``."""
        return f"{super().summary()}; {self.workers} workers"


COLUMNS = ("id", "text", "title", "source", "error")
"""Columns of the parsed dataset (``text`` is ``None`` and ``error`` set when rejected)."""
_ENV = {"TOKENIZERS_PARALLELISM": "false", "ANONYMIZED_TELEMETRY": "False"}


def _row(doc: SourceDoc) -> dict[str, Any]:
    return {"id": doc.id, "text": doc.text, "title": str(doc.metadata.get("title", "")),
            "source": str(doc.metadata.get("source", "")), "error": doc.error}


def _doc(row: dict[str, Any]) -> SourceDoc:
    return SourceDoc(str(row["id"]), row["text"],
                     {"source": row["source"], "title": row["title"]}, row["error"])


def _parse_corpus(row: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``flat_map``: one BEIR ``corpus.jsonl`` file (``bytes``) -> one row per line."""
    for doc in read_beir_lines(io.BytesIO(row["bytes"])):
        yield _row(doc)


def _parse_file(row: dict[str, Any], *, root: str) -> dict[str, Any]:
    """``map``: one ``.txt``/``.md`` file (``bytes``, ``path``) -> one document row."""
    path = Path(str(row["path"]))
    try:
        rel = path.relative_to(root).as_posix()
    except ValueError:
        rel = path.as_posix()
    return _row(file_doc(rel, row["bytes"]))


def read_documents(
    source: str | os.PathLike[str], include: tuple[str, ...] = ()
) -> tuple[ray.data.Dataset, list[Skipped]]:
    """A Ray dataset of the documents in ``source`` (columns :data:`COLUMNS`), and the
    files of a folder source that are not read.

    Args:
        source: A folder of ``.txt``/``.md`` files (recursive, hidden paths skipped unless
            ``include`` names them), or a BEIR ``corpus.jsonl`` (or a folder holding one).
            Paths must be readable from every node (a shared file system).
        include: Extra glob patterns of files to read from a folder (see
            :func:`~htp_retrieval.integrations.sources.list_folder`).

    Raises:
        FileNotFoundError: if the source does not exist or holds no usable file.
    """
    src = check_source(source)
    corpus = corpus_file(src)
    if corpus is not None:
        return (ray.data.read_binary_files(str(corpus.resolve())).flat_map(_parse_corpus), [])
    listing = list_folder(src, include)
    files = [str(p.resolve()) for p in listing.files]
    if not files:
        raise FileNotFoundError(f"no .txt/.md file in {src} ({len(listing.skipped)} skipped; "
                                "--include PATTERN reads other files)")
    ds = ray.data.read_binary_files(files, include_paths=True).map(
        _parse_file, fn_kwargs={"root": str(src.resolve())})
    return ds, list(listing.skipped)


class EmbedWriter:
    """Ray actor: embeds batches with one shared encoder and writes them to Chroma.

    Args:
        ef_config: :meth:`HTPEmbeddingFunction.get_config` of the collection (its stored
            ``config`` is embedded with as is, :meth:`HTPEmbeddingFunction.from_stored`).
        db: ``http://host:port`` of the Chroma server.
        collection: Collection name.
        device: ``auto``, ``cpu`` or ``cuda`` for the encoder.
        batch_size: Texts per forward pass.
        threads: torch threads in this actor (0: torch's default).
    """

    def __init__(self, ef_config: dict[str, Any], db: str, collection: str, *,
                 device: str = "auto", batch_size: int = 16, threads: int = 0) -> None:
        for k, v in _ENV.items():
            os.environ.setdefault(k, v)
        if threads:
            import torch

            torch.set_num_threads(threads)
        # the stored config, as stored: its HTPConfig is used as is
        self.ef = HTPEmbeddingFunction.from_stored(ef_config, device=device,
                                                   batch_size=batch_size)
        self.col = make_client(db).get_collection(collection)

    def _write(self, docs: list[SourceDoc], truncated: list[str]) -> list[tuple[str, str]]:
        """``(status, reason)`` per document; a refused text is isolated and rejected. Ids
        of documents cut to ``max_length`` are appended to ``truncated``."""
        try:
            return [(s, "") for s in write_batch(self.col, self.ef, docs,
                                                  truncated=truncated)]
        except ValueError:
            if len(docs) == 1:
                raise
        out: list[tuple[str, str]] = []
        for d in docs:  # one bad text must not block the others: retry one by one
            try:
                out.append((write_batch(self.col, self.ef, [d], truncated=truncated)[0], ""))
            except ValueError as e:
                out.append(("rejected", f"not embedded: {e}"))
        return out

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        """``{column: values}`` batch -> ``{"id", "status", "reason", "worker",
        "truncated"}`` per document (``worker``: ``host:pid`` of this actor; ``truncated``:
        whether the text was cut to ``max_length``)."""
        rows = [dict(zip(batch, vals)) for vals in zip(*batch.values())]
        docs = [_doc(r) for r in rows]
        good = [d for d in docs if d.error is None and d.text is not None]
        written: dict[str, tuple[str, str]] = {}
        cut: list[str] = []
        if good:
            try:
                results = self._write(good, cut)
            except ValueError as e:  # the single remaining document was refused
                results = [("rejected", f"not embedded: {e}")]
            written = {d.id: r for d, r in zip(good, results)}
        ids, status, reason = [], [], []
        for d in docs:
            ids.append(d.id)
            if d.id in written and d.error is None:
                status.append(written[d.id][0])
                reason.append(written[d.id][1])
            else:
                status.append("rejected")
                reason.append(d.error or "no text")
        worker = f"{os.uname().nodename}:{os.getpid()}"
        cut_ids = set(cut)
        return {"id": ids, "status": status, "reason": reason, "worker": [worker] * len(ids),
                "truncated": [i in cut_ids for i in ids]}


def ingest_ray(
    source: str | os.PathLike[str],
    *,
    db: str,
    collection: str = "htp",
    embedding_function: HTPEmbeddingFunction | None = None,
    batch_size: int = 16,
    concurrency: int | tuple[int, int] = 1,
    num_gpus: float = 0.0,
    num_cpus: float = 1.0,
    threads: int = 0,
    address: str | None = None,
    show_progress: bool = True,
    include: tuple[str, ...] = (),
    prune: bool = False,
) -> RayIngestReport:
    """Embed a folder or a BEIR corpus into a Chroma server with Ray Data.

    Connects to a running Ray cluster (``address``, or ``RAY_ADDRESS``) or starts a local
    one when Ray is not initialised yet (and shuts that one down at the end). The
    collection is created (or checked against ``embedding_function``) on the driver; every
    actor then embeds with the collection's stored settings.

    Args:
        source: Folder of ``.txt``/``.md`` files or BEIR ``corpus.jsonl`` (see
            :func:`read_documents`).
        db: ``http://host:port`` of a Chroma server (``chroma run``).
        collection: Collection name.
        embedding_function: Model settings for a new collection (default
            :class:`HTPEmbeddingFunction` defaults); must match an existing collection's.
            Its ``device`` and ``batch_size`` are used by the actors.
        batch_size: Documents per actor batch (one lookup, one embedding call, one upsert).
        concurrency: Actors in the pool (one model each), or ``(min, max)`` to autoscale.
        num_gpus: GPUs per actor (e.g. 1; 0.5 packs two actors on a GPU).
        num_cpus: CPUs per actor.
        threads: torch threads per actor (0: ``num_cpus`` threads for CPU actors, torch's
            default for GPU actors).
        address: Ray cluster address (``auto``, ``ray://host:10001``); ``None`` uses
            ``RAY_ADDRESS`` or a new local cluster.
        show_progress: Ray Data progress bars.
        include: Extra glob patterns of files to read from a folder.
        prune: Delete stored documents whose source entry is gone (as
            :func:`~htp_retrieval.integrations.chroma.ingest`).

    Returns:
        The :class:`RayIngestReport`: counts, rejected documents with their ids and
        reasons, skipped files, stale or pruned ids, the collection size afterwards and the
        number of actors that wrote.

    Raises:
        ValueError: if ``db`` is not an ``http(s)://`` URL, ``batch_size`` < 1, a new
            collection's chunk size that does not fit ``max_length``, or the collection
            exists with another embedding function or config.
        FileNotFoundError: if the source does not exist.
        RuntimeError: (from Ray) if an actor fails, e.g. the Chroma server went away; a
            rerun resumes where the written documents end.
    """
    if not str(db).startswith(("http://", "https://")):
        raise ValueError(f"db must be the http://host:port of a Chroma server ('chroma run') "
                         f"for distributed ingestion, got {db!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    check_documents(source, include)
    client = make_client(db)
    if embedding_function is not None and collection not in _names(client):
        embedding_function.check_chunk_fits()  # a new collection's settings, before it exists
    device = embedding_function.device if embedding_function is not None else (
        "cuda" if num_gpus > 0 else "auto")
    encode_batch = embedding_function.batch_size if embedding_function is not None else 16
    if not threads and num_gpus == 0:
        threads = max(1, int(num_cpus))  # actors on one node must not oversubscribe it

    started = False
    if not ray.is_initialized():  # before the collection: an unreachable cluster creates none
        ray.init(address=address, runtime_env={"env_vars": dict(_ENV)},
                 log_to_driver=False, include_dashboard=False)
        started = True
    try:
        col, ef, _ = prepare_collection(client, collection,
                                        embedding_function=embedding_function)
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = show_progress
        # blocks of a few batches, so that every actor of the pool gets work
        docs, skipped = read_documents(source, include)
        docs = docs.repartition(target_num_rows_per_block=4 * batch_size)
        statuses = docs.map_batches(
            EmbedWriter,
            fn_constructor_kwargs={"ef_config": ef.get_config(), "db": str(db),
                                   "collection": collection, "device": device,
                                   "batch_size": encode_batch, "threads": threads},
            batch_size=batch_size, batch_format="numpy", concurrency=concurrency,
            num_gpus=num_gpus, num_cpus=num_cpus,
        )
        report = RayIngestReport(collection, skipped=skipped)
        seen_ids: set[str] = set()
        workers: set[str] = set()
        for batch in statuses.iter_batches(batch_size=4096, batch_format="numpy"):
            workers.update(str(w) for w in batch["worker"])
            for doc_id, status, reason, cut in zip(batch["id"], batch["status"],
                                                   batch["reason"], batch["truncated"]):
                report.seen += 1
                seen_ids.add(str(doc_id))
                if cut:
                    report.truncated.append(str(doc_id))
                if status == "rejected":
                    report.rejected.append(Rejected(str(doc_id), str(reason)))
                else:
                    setattr(report, str(status), getattr(report, str(status)) + 1)
    finally:
        if started:
            ray.shutdown()
    report.rejected.sort(key=lambda r: r.id)
    report.truncated.sort()
    report.workers = len(workers)
    return finish_report(report, col, seen_ids, prune=prune)


__all__ = ["COLUMNS", "EmbedWriter", "RayIngestReport", "ingest_ray", "read_documents"]
