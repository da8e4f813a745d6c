"""Chroma: a registered HTP embedding function, resumable ingestion and querying.

* :class:`HTPEmbeddingFunction` is registered with ``chromadb`` under the name
  ``htp-retrieval``; its config is stored with the collection, so a persisted collection
  reopened in a new process (after ``import htp_retrieval.integrations.chroma``) embeds new
  documents and queries with the same model, method and instructions.
* :func:`ingest` loads a folder of ``.txt``/``.md`` files or a BEIR ``corpus.jsonl`` into a
  collection: stable ids, batched writes, progress bar, idempotent (a re-run adds nothing)
  and resumable (a killed run is completed by the next one, without duplicates). Documents
  it cannot use (empty, undecodable, malformed) are reported with their ids.
* :func:`query` searches a collection made by :func:`ingest`.

Chroma's default embedding function (which downloads a model) is never used, and telemetry
is off (``anonymized_telemetry=False``) for every client made here.

Example:
    >>> from htp_retrieval.integrations.chroma import ingest, query
    >>> report = ingest("essays/", db="chroma-db", collection="essays")  # doctest: +SKIP
    >>> hits = query("How do startups raise money?", db="chroma-db",
    ...              collection="essays", n_results=3)                   # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

import numpy as np

from htp_retrieval.integrations._runtime import EncoderConfig, shared_encoder
from htp_retrieval.methods import DEFAULT_QUERY_INSTRUCTION
from htp_retrieval.models import DEFAULT_MODEL

os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
try:
    import chromadb
    from chromadb.api.types import Documents, EmbeddingFunction
    from chromadb.api.types import Embeddings as ChromaEmbeddings
    from chromadb.config import Settings
    from chromadb.utils.embedding_functions import register_embedding_function
except ImportError as _e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f"the Chroma integration needs chromadb ({_e}): pip install \"htp-retrieval[chroma]\""
    ) from _e

EF_NAME = "htp-retrieval"
TEXT_SUFFIXES = (".txt", ".md")
_IDENTITY_KEYS = ("model_name", "method", "query_instruction", "document_instruction",
                  "normalize", "max_length", "dtype", "encoder_kwargs")


@register_embedding_function
class HTPEmbeddingFunction(EmbeddingFunction[Documents]):
    """Chroma embedding function backed by a shared :class:`~htp_retrieval.HTPEncoder`.

    Documents (``__call__``) get ``document_instruction``; queries (``embed_query``, used by
    ``collection.query(query_texts=...)``) get ``query_instruction``. The model loads on the
    first call and is shared with :class:`~htp_retrieval.integrations.HTPEmbeddings` objects
    that use the same settings.

    Args:
        model_name: Packaged model name, ``.gguf`` path, local directory or hub id.
        method: HTP method or alias (``htp``, ``vanilla-mean``, ...).
        query_instruction: Instruction before queries (``None``: none).
        document_instruction: Instruction before documents (default none).
        normalize: L2-normalize the vectors (default ``True``).
        max_length: Maximum text tokens per text.
        dtype: ``bfloat16``, ``float16`` or ``float32``.
        encoder_kwargs: Further :class:`~htp_retrieval.HTPEncoder` keyword arguments (must
            be JSON-serializable: they are stored in the collection config).
        device: ``auto``, ``cpu`` or ``cuda`` (not stored: a reopened collection uses
            ``auto``).
        batch_size: Maximum texts per forward pass (not stored).

    Raises:
        ValueError: if ``max_length`` or ``batch_size`` is not positive.
    """

    def __init__(
        self,
        model_name: str = DEFAULT_MODEL,
        method: str = "htp",
        *,
        query_instruction: str | None = DEFAULT_QUERY_INSTRUCTION,
        document_instruction: str | None = None,
        normalize: bool = True,
        max_length: int = 512,
        dtype: str = "bfloat16",
        encoder_kwargs: dict[str, Any] | None = None,
        device: str = "auto",
        batch_size: int = 16,
    ) -> None:
        if max_length < 1 or batch_size < 1:
            raise ValueError("max_length and batch_size must be >= 1")
        self.model_name = model_name
        self.method = method
        self.query_instruction = query_instruction
        self.document_instruction = document_instruction
        self.normalize = normalize
        self.max_length = max_length
        self.dtype = dtype
        self.encoder_kwargs = dict(encoder_kwargs or {})
        self.device = device
        self.batch_size = batch_size

    def _encode(self, texts: Sequence[str], instruction: str | None, progress: bool = False
                ) -> np.ndarray:
        cfg = EncoderConfig.create(self.model_name, self.method, self.max_length, self.device,
                                   self.dtype, self.encoder_kwargs)
        if len(texts) == 0:
            return np.zeros((0, 0), dtype=np.float32)
        return shared_encoder(cfg).encode(
            list(texts), instruction=instruction, normalize=self.normalize,
            batch_size=self.batch_size, show_progress_bar=progress,
        )

    def __call__(self, input: Documents) -> ChromaEmbeddings:
        """Embed documents: ``[n]`` texts -> ``n`` float32 vectors of ``hidden`` values.

        Raises:
            ValueError: if a text is empty or whitespace-only (its index is named).
        """
        return list(self._encode(input, self.document_instruction))

    def embed_query(self, input: Documents) -> ChromaEmbeddings:
        """Embed queries (``query_instruction``): ``[n]`` texts -> ``n`` vectors."""
        return list(self._encode(input, self.query_instruction))

    def embed_documents_array(self, texts: Sequence[str], *, show_progress_bar: bool = False
                              ) -> np.ndarray:
        """Embed documents as one ``[n, hidden]`` float32 array (used by :func:`ingest`)."""
        return self._encode(texts, self.document_instruction, show_progress_bar)

    @staticmethod
    def name() -> str:
        """Registered name, stored in the collection config."""
        return EF_NAME

    def default_space(self) -> str:  # type: ignore[override]
        """Cosine distance (the vectors are compared by angle)."""
        return "cosine"

    def supported_spaces(self) -> list[str]:  # type: ignore[override]
        """All of Chroma's spaces (vectors are normalized by default)."""
        return ["cosine", "l2", "ip"]

    def get_config(self) -> dict[str, Any]:
        """JSON config stored with the collection (device and batch size excluded)."""
        return {
            "model_name": self.model_name,
            "method": self.method,
            "query_instruction": self.query_instruction,
            "document_instruction": self.document_instruction,
            "normalize": self.normalize,
            "max_length": self.max_length,
            "dtype": self.dtype,
            "encoder_kwargs": self.encoder_kwargs,
        }

    @staticmethod
    def build_from_config(config: dict[str, Any]) -> HTPEmbeddingFunction:
        """Rebuild from :meth:`get_config` output (``HTP_RETRIEVAL_DEVICE`` picks the device)."""
        HTPEmbeddingFunction.validate_config(config)
        return HTPEmbeddingFunction(
            **{k: config[k] for k in _IDENTITY_KEYS if k in config},
            device=os.environ.get("HTP_RETRIEVAL_DEVICE", "auto"),
        )

    @staticmethod
    def validate_config(config: dict[str, Any]) -> None:
        """Reject configs with unknown keys or without a model.

        Raises:
            ValueError: on an unknown key or a missing ``model_name``.
        """
        unknown = set(config) - set(_IDENTITY_KEYS)
        if unknown:
            raise ValueError(f"unknown {EF_NAME} config keys: {sorted(unknown)}")
        if not config.get("model_name"):
            raise ValueError(f"{EF_NAME} config needs model_name")

    def validate_config_update(self, old_config: dict[str, Any], new_config: dict[str, Any]
                               ) -> None:
        """Refuse changes that would mix incompatible vectors in one collection.

        Raises:
            ValueError: if any setting that changes the vectors differs.
        """
        changed = [k for k in _IDENTITY_KEYS
                   if k in new_config and new_config[k] != old_config.get(k)]
        if changed:
            raise ValueError(f"cannot change {changed} of an existing collection: re-ingest "
                             "into a new collection instead")

    def __repr__(self) -> str:
        return f"HTPEmbeddingFunction({self.get_config()!r})"


# --------------------------------------------------------------------------- clients
def make_client(db: str | os.PathLike[str] | Any | None = None) -> Any:
    """A Chroma client with telemetry off.

    Args:
        db: A client object (returned as is), an ``http://host:port`` URL (``HttpClient``
            to a ``chroma run`` server), or a directory for the embedded
            ``PersistentClient`` (default ``./chroma``).

    Returns:
        The ``chromadb`` client.
    """
    if db is not None and not isinstance(db, (str, os.PathLike)):
        return db
    settings = Settings(anonymized_telemetry=False)
    target = str(db) if db is not None else "chroma"
    if target.startswith(("http://", "https://")):
        url = urlparse(target)
        return chromadb.HttpClient(
            host=url.hostname or "127.0.0.1",
            port=url.port or (443 if url.scheme == "https" else 8000),
            ssl=url.scheme == "https",
            settings=settings,
        )
    return chromadb.PersistentClient(path=target, settings=settings)


def open_collection(
    client: Any, collection: str, *, embedding_function: HTPEmbeddingFunction | None = None
) -> Any:
    """Get or create a collection that carries an :class:`HTPEmbeddingFunction`.

    Args:
        client: A Chroma client.
        collection: Collection name.
        embedding_function: For a new collection (default: :class:`HTPEmbeddingFunction`
            defaults). For an existing one it must match the stored config; ``None`` uses
            the stored one.

    Returns:
        The collection, whose embedding function is an :class:`HTPEmbeddingFunction`.

    Raises:
        ValueError: if the existing collection has another embedding function or a
            different HTP config.
    """
    existing = {c.name if hasattr(c, "name") else str(c) for c in client.list_collections()}
    if collection in existing:
        col = client.get_collection(collection)
        stored = collection_embedding_function(col)
        if embedding_function is not None and stored.get_config() != embedding_function.get_config():
            stored.validate_config_update(stored.get_config(), embedding_function.get_config())
        return client.get_collection(collection, embedding_function=stored)
    ef = embedding_function or HTPEmbeddingFunction()
    return client.get_or_create_collection(collection, embedding_function=ef)


def collection_embedding_function(col: Any) -> HTPEmbeddingFunction:
    """The :class:`HTPEmbeddingFunction` stored in a collection's config.

    Raises:
        ValueError: if the collection was not made with an :class:`HTPEmbeddingFunction`.
    """
    ef = (col.configuration or {}).get("embedding_function")
    if not isinstance(ef, HTPEmbeddingFunction):
        name = getattr(ef, "name", lambda: None)() if ef is not None else None
        raise ValueError(f"collection {col.name!r} has embedding function {name!r}, not "
                         f"{EF_NAME!r}: it was not created by htp-retrieval ingest")
    return ef


# --------------------------------------------------------------------------- sources
@dataclass
class SourceDoc:
    """One document read from a source.

    Attributes:
        id: Stable id (relative path for folders, ``_id`` for BEIR, ``line N`` when a
            BEIR line has no usable id).
        text: The text, or ``None`` when rejected.
        metadata: Chroma metadata (``source``, ``title``).
        error: Why the document was rejected, or ``None``.
    """

    id: str
    text: str | None
    metadata: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def _decode(data: bytes) -> str:
    return data.decode("utf-8-sig")


def _undecodable(e: UnicodeDecodeError) -> str:
    return f"undecodable: not UTF-8 (byte 0x{e.object[e.start]:02x} at offset {e.start})"


def _folder_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()
                  and p.suffix.lower() in TEXT_SUFFIXES
                  and not any(part.startswith(".") for part in p.relative_to(root).parts))


def _corpus_file(source: Path) -> Path | None:
    if source.is_file() and source.name.endswith(".jsonl"):
        return source
    if source.is_dir() and (source / "corpus.jsonl").is_file():
        return source / "corpus.jsonl"
    return None


def count_source(source: str | os.PathLike[str]) -> int:
    """Number of entries :func:`read_source` will yield (for progress totals)."""
    src = Path(source)
    corpus = _corpus_file(src)
    if corpus is not None:
        with open(corpus, "rb") as f:
            return sum(1 for line in f if line.strip())
    return len(_folder_files(src))


def read_source(source: str | os.PathLike[str]) -> Iterator[SourceDoc]:
    """Read documents from a folder of ``.txt``/``.md`` files or a BEIR ``corpus.jsonl``.

    A folder is read recursively in sorted order (hidden paths skipped); a document's id
    is its path relative to the folder. A BEIR corpus (the ``.jsonl`` file, or a folder
    holding ``corpus.jsonl``) gives ``_id`` ids and ``title + " " + text`` texts. Rejected
    entries (empty, undecodable, malformed JSON, missing or duplicate id) are yielded with
    ``error`` set, never skipped.

    Raises:
        FileNotFoundError: if ``source`` does not exist or holds no usable file type.
    """
    src = Path(source)
    if not src.exists():
        raise FileNotFoundError(f"source not found: {src}")
    corpus = _corpus_file(src)
    if corpus is not None:
        yield from _read_beir(corpus)
        return
    if not src.is_dir():
        raise FileNotFoundError(f"source must be a folder of .txt/.md files or a BEIR "
                                f"corpus.jsonl: {src}")
    for path in _folder_files(src):
        rel = path.relative_to(src).as_posix()
        try:
            data = path.read_bytes()
        except OSError as e:
            yield SourceDoc(rel, None, {"source": rel, "title": path.stem},
                            f"unreadable: {e.strerror or e}")
            continue
        yield file_doc(rel, data)


def file_doc(rel: str, data: bytes) -> SourceDoc:
    """One document from a file's bytes (id ``rel``; rejected if undecodable or empty).

    Args:
        rel: The file's path relative to the source folder (``/``-separated): its id.
        data: The file's contents.
    """
    meta = {"source": rel, "title": Path(rel).stem}
    try:
        text = _decode(data)
    except UnicodeDecodeError as e:
        return SourceDoc(rel, None, meta, _undecodable(e))
    if not text.strip():
        return SourceDoc(rel, None, meta, "empty")
    return SourceDoc(rel, text, meta)


def _read_beir(corpus: Path) -> Iterator[SourceDoc]:
    with open(corpus, "rb") as f:
        yield from read_beir_lines(f)


def read_beir_lines(lines: Iterable[bytes]) -> Iterator[SourceDoc]:
    """Documents from the lines of a BEIR ``corpus.jsonl`` (see :func:`read_source`).

    Args:
        lines: The file's raw lines, in order (line numbers count from 1, blank lines
            included); a bad line is yielded with ``error`` set and id ``line N``.
    """
    seen: set[str] = set()
    line_no = 0
    for raw in lines:
        line_no += 1
        if not raw.strip():
            continue
        where = f"line {line_no}"
        try:
            row = json.loads(_decode(raw))
        except UnicodeDecodeError as e:
            yield SourceDoc(where, None, {"source": where}, _undecodable(e))
            continue
        except json.JSONDecodeError as e:
            yield SourceDoc(where, None, {"source": where}, f"invalid JSON ({e.msg})")
            continue
        if not isinstance(row, dict) or row.get("_id") in (None, ""):
            yield SourceDoc(where, None, {"source": where}, "no _id")
            continue
        doc_id = str(row["_id"])
        title = row.get("title") or ""
        meta = {"source": where, "title": str(title)}
        if doc_id in seen:
            yield SourceDoc(doc_id, None, meta, f"duplicate id ({where})")
            continue
        seen.add(doc_id)
        text = f"{title} {row.get('text') or ''}".strip()
        if not text:
            yield SourceDoc(doc_id, None, meta, "empty")
            continue
        yield SourceDoc(doc_id, text, meta)


# --------------------------------------------------------------------------- ingest
@dataclass
class Rejected:
    """A document :func:`ingest` did not store.

    Attributes:
        id: Its id (or ``line N`` for a BEIR line without a usable id).
        reason: ``empty``, ``undecodable: ...``, ``invalid JSON (...)``, ...
    """

    id: str
    reason: str


@dataclass
class IngestReport:
    """What :func:`ingest` did.

    Attributes:
        collection: Collection name.
        seen: Entries read from the source (rejected ones included).
        added: Documents embedded and written for the first time.
        updated: Documents whose text changed since they were stored (re-embedded).
        unchanged: Documents already stored with the same text (skipped).
        rejected: Documents not stored, with the reason.
        count: Documents in the collection afterwards.
    """

    collection: str
    seen: int = 0
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    rejected: list[Rejected] = field(default_factory=list)
    count: int = 0

    def summary(self) -> str:
        """One line, e.g. ``essays: 49 read, 47 added, 0 updated, 0 unchanged, 2 rejected``."""
        return (f"{self.collection}: {self.seen} read, {self.added} added, {self.updated} "
                f"updated, {self.unchanged} unchanged, {len(self.rejected)} rejected; "
                f"{self.count} in collection")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


WriteStatus = Literal["added", "updated", "unchanged"]
"""What :func:`write_batch` did with a document."""


def write_batch(
    col: Any, ef: HTPEmbeddingFunction, docs: Sequence[SourceDoc]
) -> list[WriteStatus]:
    """Write accepted documents to a collection, idempotently (upsert by id).

    The batch is looked up by id first; documents already stored with the same text
    (SHA-256 in the ``content_sha256`` metadata) are skipped, the rest are embedded with
    ``ef`` and upserted in one write. Used by :func:`ingest` and by the Ray ingestion.

    Args:
        col: The collection.
        ef: The collection's embedding function.
        docs: Documents with ``text`` set (no rejected ones), unique ids.

    Returns:
        One :data:`WriteStatus` per document, in order.
    """
    if not docs:
        return []
    ids = [d.id for d in docs]
    got = col.get(ids=ids, include=["metadatas"])
    stored = {i: (m or {}).get("content_sha256")
              for i, m in zip(got["ids"], got["metadatas"] or [None] * len(got["ids"]), strict=True)}
    statuses: list[WriteStatus] = []
    todo = []
    for d in docs:
        if d.text is None:
            raise ValueError(f"document {d.id!r} has no text (rejected: {d.error})")
        sha = _sha(d.text)
        if stored.get(d.id) == sha:
            statuses.append("unchanged")
        else:
            todo.append((d, sha))
            statuses.append("updated" if d.id in stored else "added")
    if todo:
        vecs = ef.embed_documents_array([d.text or "" for d, _ in todo])
        col.upsert(
            ids=[d.id for d, _ in todo],
            documents=[d.text or "" for d, _ in todo],
            metadatas=[{**d.metadata, "content_sha256": sha} for d, sha in todo],
            embeddings=vecs,
        )
    return statuses


def ingest(
    source: str | os.PathLike[str],
    *,
    db: str | os.PathLike[str] | Any | None = None,
    collection: str = "htp",
    embedding_function: HTPEmbeddingFunction | None = None,
    batch_size: int = 16,
    show_progress: bool = True,
    on_batch: Callable[[IngestReport], None] | None = None,
) -> IngestReport:
    """Embed a folder of ``.txt``/``.md`` files or a BEIR corpus into a Chroma collection.

    Each batch is looked up by id first; documents already stored with the same text
    (SHA-256 in the ``content_sha256`` metadata) are skipped, the rest are embedded and
    upserted as one write. A re-run therefore adds nothing, and a run killed at any point
    is completed by the next one with no duplicates and nothing missing.

    Args:
        source: Folder (recursive, ``.txt``/``.md``) or BEIR ``corpus.jsonl`` (or a folder
            holding one).
        db: Directory for the embedded ``PersistentClient`` (default ``./chroma``), an
            ``http://host:port`` server URL, or a Chroma client.
        collection: Collection name (created with an :class:`HTPEmbeddingFunction`).
        embedding_function: Model settings for a new collection (default
            :class:`HTPEmbeddingFunction` defaults); must match an existing collection's.
        batch_size: Documents per write (and per embedding call).
        show_progress: tqdm bar over documents.
        on_batch: Called with the running report after each batch is written.

    Returns:
        The :class:`IngestReport` (rejected documents listed with their ids).

    Raises:
        FileNotFoundError: if the source does not exist.
        ValueError: if the collection exists with another embedding function or config,
            or ``batch_size`` < 1.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    from tqdm.auto import tqdm

    client = make_client(db)
    col = open_collection(client, collection, embedding_function=embedding_function)
    ef = collection_embedding_function(col)
    report = IngestReport(collection)
    total = count_source(source)
    batch: list[SourceDoc] = []

    def flush() -> None:
        if not batch:
            return
        statuses = write_batch(col, ef, batch)
        report.added += statuses.count("added")
        report.updated += statuses.count("updated")
        report.unchanged += statuses.count("unchanged")
        bar.update(len(batch))
        batch.clear()
        if on_batch is not None:
            on_batch(report)

    with tqdm(total=total, disable=not show_progress, desc=f"ingest {collection}",
              unit="doc") as bar:
        for doc in read_source(source):
            report.seen += 1
            if doc.error is not None:
                report.rejected.append(Rejected(doc.id, doc.error))
                bar.update(1)
                continue
            batch.append(doc)
            if len(batch) >= batch_size:
                flush()
        flush()
    report.count = col.count()
    return report


# --------------------------------------------------------------------------- query
@dataclass
class Hit:
    """One search result.

    Attributes:
        id: Document id.
        distance: Chroma distance (cosine distance for collections made by :func:`ingest`).
        document: Stored text.
        metadata: Stored metadata.
    """

    id: str
    distance: float
    document: str | None
    metadata: dict[str, Any]

    @property
    def score(self) -> float:
        """``1 - distance`` (cosine similarity for cosine collections)."""
        return 1.0 - self.distance


def query(
    text: str,
    *,
    db: str | os.PathLike[str] | Any | None = None,
    collection: str = "htp",
    n_results: int = 5,
    where: dict[str, Any] | None = None,
) -> list[Hit]:
    """Search a collection made by :func:`ingest` (the query gets the query instruction).

    Args:
        text: The query.
        db: As in :func:`ingest`.
        collection: Collection name.
        n_results: Hits returned (at most the collection size).
        where: Optional Chroma metadata filter.

    Returns:
        Hits, best first.

    Raises:
        ValueError: for an empty query, or a collection without an
            :class:`HTPEmbeddingFunction`.
        chromadb.errors.NotFoundError: if the collection does not exist.
    """
    if not text.strip():
        raise ValueError("query text is empty")
    col = make_client(db).get_collection(collection)
    ef = collection_embedding_function(col)
    q = ef.embed_query([text])
    res = col.query(query_embeddings=q, n_results=n_results, where=where,
                    include=["documents", "metadatas", "distances"])
    docs = (res.get("documents") or [[]])[0]
    metas = (res.get("metadatas") or [[]])[0]
    return [Hit(i, float(d), docs[j] if docs else None, dict(metas[j] or {}) if metas else {})
            for j, (i, d) in enumerate(zip(res["ids"][0], res["distances"][0], strict=True))]


__all__ = ["HTPEmbeddingFunction", "IngestReport", "Rejected", "Hit", "SourceDoc", "ingest",
           "query", "read_source", "make_client", "open_collection",
           "collection_embedding_function", "EF_NAME", "file_doc", "read_beir_lines",
           "write_batch"]
