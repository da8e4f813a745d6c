"""Late chunking in LangChain and LlamaIndex: contextual chunk vectors in a vector store.

Late chunking (Günther et al. 2024, "Late Chunking: Contextual Chunk Embeddings Using
Long-Context Embedding Models", arXiv 2409.04701) runs the whole document through the model
and pools each chunk's vector from its own tokens, so a chunk that says "it" or "the
company" is embedded with the text that tells which. Chunks are cut by an ordinary text
splitter; what the splitter must give is each chunk's character offset in its document.
The vectors come from :meth:`HTPEmbeddings.embed_late_chunks
<htp_retrieval.integrations.embeddings.HTPEmbeddings.embed_late_chunks>` (one pass per
window of whole chunks, at most ``max_length`` tokens; the default ``max_length`` is the
model's context window, 8064 tokens for SmolLM2). Queries are embedded as usual, with
``embed_query``.

LangChain (``langchain-chroma``)::

    from langchain_chroma import Chroma
    from langchain_core.documents import Document
    from langchain_core.stores import InMemoryStore
    from htp_retrieval.integrations import HTPEmbeddings
    from htp_retrieval.integrations.late_chunking import (
        LateChunkParentRetriever, add_late_chunked_documents, token_splitter)

    emb = HTPEmbeddings()
    store = Chroma(collection_name="essays", embedding_function=emb)
    parents = InMemoryStore()
    docs = [Document(page_content=text, id="essay-1", metadata={"source": "essay-1.txt"})]
    # any LangChain TextSplitter made with add_start_index=True works, e.g.
    # RecursiveCharacterTextSplitter.from_huggingface_tokenizer(emb.encoder.tokenizer,
    #     chunk_size=512, chunk_overlap=0, add_start_index=True)
    ids = add_late_chunked_documents(store, emb, docs, splitter=token_splitter(emb, 512),
                                     docstore=parents)
    chunks = store.similarity_search("Why do startups need to grow fast?", k=3)
    essays = LateChunkParentRetriever(vectorstore=store, docstore=parents, k=1).invoke(
        "Why do startups need to grow fast?")        # whole parent Documents

Each chunk is stored with the parent's metadata plus ``parent_id``, ``chunk_index``,
``start_index`` and ``end_index`` (characters; ``parent.page_content[start_index:end_index]``
is the chunk), under the id ``"{parent_id}#c{chunk_index}"`` (the ids and ``parent_id`` /
``chunk_index`` keys of ``htp-retrieval ingest --chunking late``), so adding a document again
replaces its chunks (a Chroma store also loses the chunks a shorter new version no longer
has).

LlamaIndex (``IngestionPipeline``)::

    from llama_index.core import Document, VectorStoreIndex
    from llama_index.core.ingestion import IngestionPipeline
    from llama_index.core.node_parser import SentenceSplitter
    from htp_retrieval.integrations import HTPEmbeddings
    from htp_retrieval.integrations.late_chunking import LateChunkEmbedding

    emb = HTPEmbeddings()
    pipeline = IngestionPipeline(transformations=[
        SentenceSplitter(chunk_size=512, chunk_overlap=32),   # sets start_char_idx
        LateChunkEmbedding(embed_model=emb),                  # sets node.embedding
    ], vector_store=vector_store)                             # e.g. a ChromaVectorStore
    nodes = pipeline.run(documents=[Document(text=text, id_="essay-1")])
    index = VectorStoreIndex.from_vector_store(vector_store, embed_model=emb)

``SentenceSplitter`` works offline (LlamaIndex ships the NLTK data it needs).
:class:`LateChunkEmbedding` embeds the document text, not the node text with metadata
(LlamaIndex's ``MetadataMode.EMBED``). Nodes carry their offsets but not their document's
text: the transform rebuilds each document from its nodes, which is exact where the chunks
cover the text (every splitter that keeps or overlaps the text between chunks) and puts
spaces for characters no chunk holds (the whitespace a splitter strips between chunks).
Pass the documents' texts for an exact result: ``pipeline.run(documents=docs,
source_texts={d.doc_id: d.text for d in docs})``, or use :func:`late_chunk_nodes`.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from htp_retrieval.chunking import DEFAULT_CHUNK_TOKENS
from htp_retrieval.integrations.embeddings import HTPEmbeddings

_PIP = 'pip install "htp-retrieval[langchain,llamaindex]"'
try:
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.stores import BaseStore
    from langchain_core.vectorstores import VectorStore
except ImportError as _e:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"late chunking needs langchain-core ({_e}); install the extras: {_PIP}"
                      ) from _e
try:
    from llama_index.core.bridge.pydantic import Field
    from llama_index.core.schema import BaseNode, MetadataMode, TransformComponent
except ImportError as _e:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"late chunking needs llama-index-core ({_e}); install the extras: "
                      f"{_PIP}") from _e

META_KEYS = ("parent_id", "chunk_index", "start_index", "end_index")
"""Metadata keys every late chunk carries (LangChain path)."""


# ====================================================================== LangChain
def token_splitter(embeddings: HTPEmbeddings, chunk_size: int = DEFAULT_CHUNK_TOKENS,
                   chunk_overlap: int = 0) -> Any:
    """A LangChain ``RecursiveCharacterTextSplitter`` in the model's tokens, with offsets.

    Separators are tried from paragraph to line, sentence end, clause, word and character
    (:data:`htp_retrieval.chunking.SEPARATORS`, the boundaries of
    :func:`~htp_retrieval.chunking.split_chunks`), chunks are whitespace-trimmed and carry
    ``metadata["start_index"]`` (``add_start_index=True``). Loads the model's tokenizer.

    Args:
        embeddings: The embeddings whose tokenizer measures the chunks.
        chunk_size: Chunk size in tokens (>= 16).
        chunk_overlap: Overlap between consecutive chunks in tokens (below half the size).

    Returns:
        A ``langchain_text_splitters.RecursiveCharacterTextSplitter``.

    Raises:
        ValueError: for invalid sizes.
        ImportError: without ``langchain-text-splitters``.
    """
    from htp_retrieval.chunking import text_splitter

    return text_splitter(embeddings.encoder.tokenizer, chunk_size, chunk_overlap,
                         add_start_index=True)


@dataclass
class LateChunkedDocument:
    """One parent document with its chunks and their contextual vectors.

    Attributes:
        parent_id: The parent's id (``Document.id``, or a new UUID when it has none).
        parent: The parent ``Document`` (``id`` set to ``parent_id``).
        chunks: ``[n_chunks]`` chunk ``Document`` s; metadata: the parent's plus
            ``parent_id``, ``chunk_index``, ``start_index``, ``end_index`` (characters).
        vectors: ``[n_chunks, hidden]`` float32 contextual chunk vectors.
    """

    parent_id: str
    parent: Document
    chunks: list[Document]
    vectors: np.ndarray

    @property
    def ids(self) -> list[str]:
        """Chunk ids, ``"{parent_id}#c{chunk_index}"``."""
        return [f"{self.parent_id}#c{i}" for i in range(len(self.chunks))]


def _spans(parent: Document, parent_id: str, pieces: list[Document]) -> list[tuple[int, int]]:
    """Character spans of the chunks, from ``start_index``, checked against the text.

    LangChain's splitters write ``start_index=-1`` for a chunk they could not place (with
    ``chunk_overlap`` measured in tokens, e.g. ``from_huggingface_tokenizer``, its search
    can start past the chunk); such a chunk, or one whose offset does not hold its text,
    is looked up in the document after the previous chunk's start.
    """
    text = parent.page_content
    spans: list[tuple[int, int]] = []
    for i, piece in enumerate(pieces):
        start = piece.metadata.get("start_index")
        if not isinstance(start, int):
            raise ValueError(f"chunk {i} of document {parent_id!r} has no start_index in its "
                             "metadata: create the text splitter with add_start_index=True")
        chunk = piece.page_content
        if start < 0 or text[start : start + len(chunk)] != chunk:
            start = text.find(chunk, spans[-1][0] + 1 if spans else 0)
            if start < 0:
                raise ValueError(f"chunk {i} of document {parent_id!r} is not the document's "
                                 "text: use a splitter that returns exact substrings (e.g. "
                                 "RecursiveCharacterTextSplitter with add_start_index=True) "
                                 "or token_splitter()")
        spans.append((start, start + len(chunk)))
    return spans


def split_documents(
    documents: Sequence[Document], splitter: Any
) -> list[tuple[Document, list[Document]]]:
    """Split LangChain documents into chunks with checked character offsets.

    Used for naive chunks (``vectorstore.add_documents(chunks)``) and by
    :func:`late_chunk_documents`, so both give the same chunks, ids and metadata.

    Args:
        documents: Parent documents; ``Document.id`` is the parent id (a new UUID when
            ``None``).
        splitter: A LangChain ``TextSplitter`` created with ``add_start_index=True``.

    Returns:
        ``(parent, chunks)`` per document with text, in input order; chunk ids are
        ``"{parent_id}#c{i}"`` and their metadata the parent's plus ``parent_id``,
        ``chunk_index``, ``start_index``, ``end_index`` (characters).

    Raises:
        TypeError: if ``documents`` is a single ``Document`` or holds something else.
        ValueError: for two documents with the same id, a blank document (named), or a
            chunk without ``start_index`` or whose text is not in the document.
    """
    if isinstance(documents, Document):
        raise TypeError("expected a list of Documents, got a single Document: wrap it in a "
                        "list, e.g. [doc]")
    out: list[tuple[Document, list[Document]]] = []
    seen: set[str] = set()
    for n, doc in enumerate(documents):
        if not isinstance(doc, Document):
            raise TypeError(f"document at index {n} is {type(doc).__name__}, not a "
                            "langchain_core Document")
        pid = str(doc.id) if doc.id is not None else str(uuid.uuid4())
        if not doc.page_content.strip():
            raise ValueError(f"document at index {n} ({pid!r}) has no text: drop it before "
                             "splitting")
        if pid in seen:
            raise ValueError(f"two documents have the id {pid!r}: give each document its "
                             "own Document.id")
        seen.add(pid)
        parent = doc.model_copy(update={"id": pid})
        pieces = splitter.split_documents([parent])
        spans = _spans(parent, pid, pieces)
        chunks = [Document(page_content=p.page_content, id=f"{pid}#c{i}",
                           metadata={**p.metadata, "parent_id": pid, "chunk_index": i,
                                     "start_index": a, "end_index": b})
                  for i, (p, (a, b)) in enumerate(zip(pieces, spans, strict=True))]
        out.append((parent, chunks))
    return out


def late_chunk_documents(
    embeddings: HTPEmbeddings,
    documents: Sequence[Document],
    *,
    splitter: Any = None,
    chunk_size: int = DEFAULT_CHUNK_TOKENS,
    chunk_overlap: int = 0,
    window_tokens: int | None = None,
) -> list[LateChunkedDocument]:
    """Split LangChain documents and embed their chunks in context (late chunking).

    Each document is split on its own (``splitter.split_documents([doc])``), every chunk's
    ``start_index`` is checked against the document text (a chunk LangChain could not place,
    ``start_index=-1``, or one at a wrong offset is looked up after the previous chunk), and
    the chunks get contextual vectors from
    :meth:`HTPEmbeddings.embed_late_chunks
    <htp_retrieval.integrations.embeddings.HTPEmbeddings.embed_late_chunks>`; the chunks
    are those of :func:`split_documents`.

    Args:
        embeddings: The embeddings (model, method, ``document_instruction``, ``normalize``).
        documents: Parent documents; ``Document.id`` is the parent id (a new UUID when
            ``None``; set it to make re-adding a document replace its chunks).
        splitter: A LangChain ``TextSplitter`` created with ``add_start_index=True``
            (default: :func:`token_splitter` with ``chunk_size`` and ``chunk_overlap``).
        chunk_size: Tokens per chunk for the default splitter.
        chunk_overlap: Overlap in tokens for the default splitter.
        window_tokens: Text tokens per forward pass (default and maximum: ``max_length``).

    Returns:
        One :class:`LateChunkedDocument` per non-blank document, in input order.

    Raises:
        TypeError: if ``documents`` is a single ``Document`` or holds something else.
        ValueError: for two documents with the same id, a blank document, a chunk
            without ``start_index`` or whose text is not in the document (all name the
            document and the fix), or invalid chunk sizes.
    """
    splitter = splitter if splitter is not None else token_splitter(
        embeddings, chunk_size, chunk_overlap)
    out = [LateChunkedDocument(str(parent.id), parent, chunks, np.zeros((0, 0), np.float32))
           for parent, chunks in split_documents(documents, splitter)]
    keep = [d for d in out if d.chunks]
    if keep:
        vecs = embeddings.embed_late_chunks(
            [d.parent.page_content for d in keep],
            [[(c.metadata["start_index"], c.metadata["end_index"]) for c in d.chunks]
             for d in keep],
            window_tokens=window_tokens)
        for d, v in zip(keep, vecs, strict=True):
            d.vectors = v
    return keep


def _is_chroma(vectorstore: Any) -> bool:
    return type(vectorstore).__module__.startswith("langchain_chroma") and hasattr(
        vectorstore, "_collection")


def _write(vectorstore: VectorStore, texts: list[str], vectors: list[list[float]],
           metadatas: list[dict[str, Any]], ids: list[str]) -> None:
    if hasattr(vectorstore, "add_embeddings"):  # FAISS and other stores with a public API
        vectorstore.add_embeddings(list(zip(texts, vectors, strict=True)),
                                   metadatas=metadatas, ids=ids)
    elif _is_chroma(vectorstore):
        # langchain-chroma 1.x has no public "add precomputed vectors": write through its
        # collection, exactly as Chroma.add_texts does after embedding.
        vectorstore._collection.upsert(ids=ids, embeddings=vectors,  # type: ignore[attr-defined]
                                       documents=texts, metadatas=metadatas)
    else:
        raise TypeError(f"cannot add precomputed vectors to {type(vectorstore).__name__}: "
                        "use a langchain_chroma.Chroma store or one with add_embeddings(), "
                        "or write LateChunkedDocument.vectors yourself "
                        "(late_chunk_documents)")


def add_late_chunked_documents(
    vectorstore: VectorStore,
    embeddings: HTPEmbeddings,
    documents: Sequence[Document],
    *,
    splitter: Any = None,
    chunk_size: int = DEFAULT_CHUNK_TOKENS,
    chunk_overlap: int = 0,
    docstore: BaseStore[str, Document] | None = None,
    window_tokens: int | None = None,
) -> list[str]:
    """Split documents, embed the chunks in context and add them to a vector store.

    See :func:`late_chunk_documents` for the splitting and embedding. Chunks are written
    with their contextual vectors under the ids ``"{parent_id}#c{chunk_index}"`` (an upsert:
    re-adding a document replaces its chunks; in a Chroma store the chunks of an earlier,
    longer version are deleted). The store's own embedding function is used only for
    queries, so create it with the same ``embeddings``.

    Args:
        vectorstore: A ``langchain_chroma.Chroma`` store (or any store with
            ``add_embeddings(text_embeddings, metadatas, ids)``).
        embeddings: The embeddings (the store's ``embedding_function``).
        documents: Parent documents (``Document.id``: parent id; new UUID when ``None``).
        splitter: A LangChain ``TextSplitter`` with ``add_start_index=True`` (default:
            :func:`token_splitter`).
        chunk_size: Tokens per chunk for the default splitter.
        chunk_overlap: Overlap in tokens for the default splitter.
        docstore: Where parent documents are kept, keyed by parent id (e.g.
            ``langchain_core.stores.InMemoryStore``), for :class:`LateChunkParentRetriever`.
        window_tokens: Text tokens per forward pass (default and maximum: ``max_length``).

    Returns:
        The ids of the chunks written, in order.

    Raises:
        TypeError: for a store that cannot take precomputed vectors.
        ValueError: as :func:`late_chunk_documents`.
    """
    if not hasattr(vectorstore, "add_embeddings") and not _is_chroma(vectorstore):
        _write(vectorstore, [], [], [], [])  # raises the TypeError before any work
    done = late_chunk_documents(embeddings, documents, splitter=splitter,
                                chunk_size=chunk_size, chunk_overlap=chunk_overlap,
                                window_tokens=window_tokens)
    ids: list[str] = []
    for d in done:
        if _is_chroma(vectorstore):
            old = vectorstore.get(where={"parent_id": d.parent_id}, include=[])["ids"]
            stale = sorted(set(old) - set(d.ids))
            if stale:
                vectorstore.delete(ids=stale)
        _write(vectorstore, [c.page_content for c in d.chunks], d.vectors.tolist(),
               [c.metadata for c in d.chunks], d.ids)
        ids.extend(d.ids)
    if docstore is not None and done:
        docstore.mset([(d.parent_id, d.parent) for d in done])
    return ids


class LateChunkParentRetriever(BaseRetriever):
    """Retrieve whole parent documents through their late-chunked chunks.

    Searches ``fetch_k`` chunks (``vectorstore.similarity_search``), keeps the parent ids in
    the order of each parent's best chunk, and returns the first ``k`` parents from
    ``docstore`` (as written by :func:`add_late_chunked_documents`). Each returned
    ``Document`` is the stored parent with ``metadata["matched_chunks"]``: the indexes of
    its chunks among the hits, best first. Parents missing from the docstore are skipped.
    """

    vectorstore: VectorStore
    """The store holding the chunks (metadata ``parent_id``)."""
    docstore: BaseStore[str, Document]
    """Parent documents keyed by parent id."""
    k: int = 4
    """Parent documents returned."""
    fetch_k: int = 20
    """Chunks searched to find them."""
    search_kwargs: dict[str, Any] = {}
    """Further keyword arguments for ``similarity_search`` (e.g. ``filter``)."""

    def _get_relevant_documents(self, query: str, *,
                                run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        hits = self.vectorstore.similarity_search(query, k=self.fetch_k, **self.search_kwargs)
        order: dict[str, list[int]] = {}
        for h in hits:
            pid = h.metadata.get("parent_id")
            if pid is not None:
                order.setdefault(str(pid), []).append(int(h.metadata.get("chunk_index", -1)))
        pids = list(order)
        out: list[Document] = []
        for pid, parent in zip(pids, self.docstore.mget(pids), strict=True):
            if parent is None:
                continue
            out.append(parent.model_copy(update={
                "metadata": {**parent.metadata, "matched_chunks": order[pid]}}))
            if len(out) == self.k:
                break
        return out


# ===================================================================== LlamaIndex
def _rebuild_text(doc_id: str, nodes: list[tuple[int, int, str]]) -> str:
    """The document text from its chunks' offsets and texts (gaps become spaces)."""
    length = max(end for _, end, _ in nodes)
    chars: list[str | None] = [None] * length
    for start, _end, text in nodes:
        for j, ch in enumerate(text):
            have = chars[start + j]
            if have is not None and have != ch:
                raise ValueError(
                    f"nodes of document {doc_id!r} disagree at character {start + j}: their "
                    "start_char_idx do not fit their texts; pass the texts, "
                    "source_texts={doc.doc_id: doc.text}, or use late_chunk_nodes()")
            chars[start + j] = ch
    return "".join(" " if c is None else c for c in chars)


class LateChunkEmbedding(TransformComponent):
    """LlamaIndex transform: contextual (late-chunked) embeddings for split nodes.

    Put it after a node parser that sets ``start_char_idx`` (``SentenceSplitter``,
    ``TokenTextSplitter``, ...). Nodes are grouped by their source document
    (``node.ref_doc_id``); each document runs through the model once per window of whole
    chunks, and ``node.embedding`` is set to the chunk's vector ``[hidden]`` (late chunking,
    Günther et al. 2024, arXiv 2409.04701). The document text is taken from
    ``source_texts`` (a keyword of the call, forwarded by ``IngestionPipeline.run``) or
    rebuilt from the nodes (exact where chunks cover the text; characters no chunk holds
    become spaces). The embedded text is the document's own text, without node metadata.

    Raises:
        ValueError: when called, for a node without a source document or without
            ``start_char_idx``/``end_char_idx``, a node whose text is not the document's text
            at its offsets, or nodes of one document whose offsets disagree (each names the
            node or document and the fix).
    """

    embed_model: HTPEmbeddings = Field(description="The HTP embeddings to use.")
    """The embeddings (model, method, ``document_instruction``, ``normalize``)."""
    window_tokens: int | None = Field(
        default=None, gt=0,
        description="Text tokens per forward pass (None: the model's max_length).")
    """Text tokens per forward pass (default and maximum: the embeddings' ``max_length``)."""

    @classmethod
    def class_name(cls) -> str:
        """LlamaIndex serialization name."""
        return "HTPLateChunkEmbedding"

    def __call__(self, nodes: Sequence[BaseNode], source_texts: dict[str, str] | None = None,
                 **kwargs: Any) -> Sequence[BaseNode]:
        """Set ``node.embedding`` for every node.

        Args:
            nodes: Split nodes of one or more documents, in any order.
            source_texts: Optional full text per document id (``ref_doc_id``).
            **kwargs: Ignored (other pipeline keywords).

        Returns:
            ``nodes``, each with ``embedding`` set (``hidden`` floats).
        """
        groups: dict[str, list[BaseNode]] = {}
        for node in nodes:
            doc_id = node.ref_doc_id
            if doc_id is None:
                raise ValueError(f"node {node.node_id!r} has no source document: put a node "
                                 "parser such as SentenceSplitter before LateChunkEmbedding")
            if node.start_char_idx is None or node.end_char_idx is None:  # type: ignore[attr-defined]
                raise ValueError(f"node {node.node_id!r} has no start_char_idx/end_char_idx: "
                                 "use a node parser that sets them (SentenceSplitter, "
                                 "TokenTextSplitter) or late_chunk_nodes()")
            groups.setdefault(doc_id, []).append(node)
        texts: list[str] = []
        spans: list[list[tuple[int, int]]] = []
        members: list[list[BaseNode]] = []
        for doc_id, group in groups.items():
            items = [(n.start_char_idx, n.end_char_idx,  # type: ignore[attr-defined]
                      n.get_content(metadata_mode=MetadataMode.NONE)) for n in group]
            for n, (a, b, t) in zip(group, items, strict=True):
                if b - a != len(t):
                    raise ValueError(f"node {n.node_id!r} of document {doc_id!r}: its offsets "
                                     f"[{a}, {b}) do not match its {len(t)} characters; use "
                                     "late_chunk_nodes() or a splitter that keeps the text")
            given = (source_texts or {}).get(doc_id)
            text = given if given is not None else _rebuild_text(doc_id, items)
            for n, (a, b, t) in zip(group, items, strict=True):
                if text[a:b] != t:
                    raise ValueError(f"node {n.node_id!r} is not the text of document "
                                     f"{doc_id!r} at [{a}, {b}): pass that document's text in "
                                     "source_texts")
            texts.append(text)
            spans.append([(a, b) for a, b, _ in items])
            members.append(group)
        if texts:
            vecs = self.embed_model.embed_late_chunks(texts, spans,
                                                      window_tokens=self.window_tokens)
            for group, v in zip(members, vecs, strict=True):
                for n, row in zip(group, v, strict=True):
                    n.embedding = row.tolist()
        return nodes

    async def acall(self, nodes: Sequence[BaseNode], **kwargs: Any) -> Sequence[BaseNode]:
        """Async :meth:`__call__` (runs on a worker thread)."""
        import asyncio

        return await asyncio.to_thread(self.__call__, nodes, **kwargs)


def late_chunk_nodes(documents: Sequence[Any], embed_model: HTPEmbeddings,
                     node_parser: Any = None) -> list[BaseNode]:
    """Split LlamaIndex documents and embed the nodes in context, from the exact texts.

    Args:
        documents: LlamaIndex ``Document`` s.
        embed_model: The embeddings.
        node_parser: A node parser that sets ``start_char_idx`` (default:
            ``SentenceSplitter(chunk_size=DEFAULT_CHUNK_TOKENS, chunk_overlap=0)``).

    Returns:
        The nodes, each with ``embedding`` set; ready for ``VectorStoreIndex(nodes, ...)``
        or ``vector_store.add(nodes)``.

    Raises:
        ValueError: as :class:`LateChunkEmbedding`.
    """
    if node_parser is None:
        from llama_index.core.node_parser import SentenceSplitter

        node_parser = SentenceSplitter(chunk_size=DEFAULT_CHUNK_TOKENS, chunk_overlap=0)
    nodes = node_parser.get_nodes_from_documents(list(documents))
    texts = {d.doc_id: d.text for d in documents}
    return list(LateChunkEmbedding(embed_model=embed_model)(nodes, source_texts=texts))


__all__ = ["token_splitter", "late_chunk_documents", "add_late_chunked_documents",
           "LateChunkedDocument", "LateChunkParentRetriever", "LateChunkEmbedding",
           "late_chunk_nodes", "META_KEYS"]
