"""Paul Graham essays in Chroma through LlamaIndex, chunked and embedded with HTPEmbeddings.

An ``IngestionPipeline`` splits the essays with ``SentenceSplitter`` (chunk size in the
model's own tokens), embeds every chunk on its own (default) or, with ``--chunking late``,
in the context of its whole essay with
:class:`~htp_retrieval.integrations.late_chunking.LateChunkEmbedding` (late chunking,
Günther et al. 2024, arXiv 2409.04701) and writes the nodes to a ``ChromaVectorStore``; a
``VectorStoreIndex`` over that store, with
:class:`~htp_retrieval.integrations.HTPEmbeddings` as ``embed_model``, answers the
question's retrieval. Runs offline.

Usage:
    python examples/llamaindex_chroma.py [ESSAYS_DIR] [--limit 5] [--chunk-size 512]
        [--chunking naive|late]
        [--question "..."]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from htp_retrieval.chunking import DEFAULT_CHUNK_TOKENS

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
    p.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_TOKENS,
                   help="model tokens per chunk")
    p.add_argument("--chunk-overlap", type=int, default=32, help="overlap in tokens")
    p.add_argument("--chunking", choices=["naive", "late"], default="naive",
                   help="naive: each chunk embedded alone (default; ahead on the QMSum "
                   "evidence spans, docs/RAG.md); late: contextual chunk vectors")
    args = p.parse_args(argv)

    from llama_index.core import Document, VectorStoreIndex
    from llama_index.core.ingestion import IngestionPipeline
    from llama_index.core.node_parser import SentenceSplitter
    from llama_index.vector_stores.chroma import ChromaVectorStore

    from htp_retrieval.integrations import HTPEmbeddings
    from htp_retrieval.integrations.chroma import make_client
    from htp_retrieval.integrations.late_chunking import LateChunkEmbedding

    files = sorted(Path(args.essays).glob("*.txt"))[: args.limit or None]
    if not files:
        raise FileNotFoundError(f"no .txt essays in {args.essays}: pass the essays folder")
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
    tok = embed_model.encoder.tokenizer

    def n_tokens(text: str) -> list[int]:
        return tok(text, add_special_tokens=False).input_ids

    pipeline = IngestionPipeline(
        transformations=[
            # sets each node's start_char_idx / end_char_idx in its essay
            SentenceSplitter(chunk_size=args.chunk_size, chunk_overlap=args.chunk_overlap,
                             tokenizer=n_tokens),
            # sets node.embedding: naive chunks (the embed model itself) or in context
            LateChunkEmbedding(embed_model=embed_model) if args.chunking == "late"
            else embed_model,
        ],
        vector_store=store,
    )
    # source_texts: the essays' exact texts (without it they are rebuilt from the nodes)
    nodes = pipeline.run(documents=docs, source_texts={d.doc_id: d.text for d in docs},
                         show_progress=True)
    longest = max(len(n_tokens(n.get_content())) for n in nodes)
    how = "late chunking" if args.chunking == "late" else "naive chunks"
    print(f"indexed {collection.count()} chunks from {len(docs)} essays ({how}, at "
          f"most {longest} tokens per chunk) in {db}")
    index = VectorStoreIndex.from_vector_store(store, embed_model=embed_model)
    for n in index.as_retriever(similarity_top_k=args.k).retrieve(args.question):
        print(f"{n.score:.4f} {n.node.metadata.get('essay')}: "
              f"{n.node.get_content()[:80]!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
