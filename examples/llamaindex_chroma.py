"""Paul Graham essays in Chroma through LlamaIndex (``ChromaVectorStore`` + ``VectorStoreIndex``)
with :class:`~htp_retrieval.integrations.HTPEmbeddings` as ``embed_model``. Runs offline.

Usage:
    python examples/llamaindex_chroma.py [ESSAYS_DIR] [--limit 5] [--question "..."]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

DEFAULT_ESSAYS = Path(__file__).resolve().parents[1] / "../shared/data/haystack/paul_graham_essays"


def main(argv: list[str] | None = None) -> int:
    """Index the essays and print the top chunks for a question."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("essays", nargs="?", default=str(DEFAULT_ESSAYS), help="folder of essays")
    p.add_argument("--limit", type=int, default=0, help="first N essays only (0: all)")
    p.add_argument("--question", default="Why do startups need to grow fast?")
    p.add_argument("--db", default=None, help="Chroma directory (default: a temp dir)")
    p.add_argument("--collection", default="pg-essays-li")
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--chunk-size", type=int, default=384, help="tokens per chunk")
    args = p.parse_args(argv)

    from llama_index.core import Document, StorageContext, VectorStoreIndex
    from llama_index.core.node_parser import SentenceSplitter
    from llama_index.vector_stores.chroma import ChromaVectorStore

    from htp_retrieval.integrations import HTPEmbeddings
    from htp_retrieval.integrations.chroma import make_client

    files = sorted(Path(args.essays).glob("*.txt"))[: args.limit or None]
    if not files:
        raise FileNotFoundError(f"no .txt essays in {args.essays}")
    docs = [Document(text=f.read_text(encoding="utf-8"), id_=f.stem,
                     metadata={"essay": f.stem}) for f in files]
    db = args.db or tempfile.mkdtemp(prefix="htp-li-chroma-")
    # embedding_function=None: LlamaIndex passes vectors, Chroma's default model is never used
    collection = make_client(db).get_or_create_collection(args.collection,
                                                          embedding_function=None)
    store = ChromaVectorStore(chroma_collection=collection)
    # One-line swap: HuggingFaceEmbedding(...) -> HTPEmbeddings(...)
    embed_model = HTPEmbeddings(
        query_instruction="Given a question, retrieve passages that answer the question",
        embed_batch_size=8,
    )
    index = VectorStoreIndex.from_documents(
        docs,
        storage_context=StorageContext.from_defaults(vector_store=store),
        embed_model=embed_model,
        transformations=[SentenceSplitter(chunk_size=args.chunk_size, chunk_overlap=32)],
        show_progress=True,
    )
    print(f"indexed {collection.count()} chunks from {len(docs)} essays in {db}")
    for n in index.as_retriever(similarity_top_k=args.k).retrieve(args.question):
        print(f"{n.score:.4f} {n.node.metadata.get('essay')}: "
              f"{n.node.get_content()[:80]!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
