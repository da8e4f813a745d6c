"""Late chunking through LangChain (Chroma) and LlamaIndex, and HTPEmbeddings' overflow.

Runs on a tiny random Llama with SmolLM2's tokenizer (fast); the vectors are checked against
``HTPEncoder.encode_late_chunks`` on the same spans.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")
pytest.importorskip("langchain_chroma")
pytest.importorskip("llama_index.vector_stores.chroma")

from langchain_chroma import Chroma  # noqa: E402
from langchain_core.documents import Document  # noqa: E402
from langchain_core.stores import InMemoryStore  # noqa: E402

from htp_retrieval.chunking import Chunk, split_chunks  # noqa: E402
from htp_retrieval.integrations import HTPEmbeddings  # noqa: E402
from htp_retrieval.integrations.chroma import make_client  # noqa: E402
from htp_retrieval.integrations.late_chunking import (  # noqa: E402
    LateChunkEmbedding,
    LateChunkParentRetriever,
    add_late_chunked_documents,
    late_chunk_documents,
    late_chunk_nodes,
    token_splitter,
)

ESSAY_A = (
    "The company started in a garage in 1998. It sold one product, a small camera for "
    "birdwatchers.\n\nSales were slow at first. The founders drove to every birding club in "
    "the state and showed the camera to anyone who would look. After two years it had ten "
    "thousand customers.\n\nThen a larger firm copied the design. The founders did not sue; "
    "they shipped a better version every three months. The copy was discontinued in 2003, "
    "and the company was sold in 2010 for a price nobody disclosed."
)
ESSAY_B = (
    "Rust prevents data races at compile time. Ownership gives every value one owner, and "
    "borrowing lets code read a value without taking it. The borrow checker rejects a "
    "program that keeps a mutable reference alive while another reference exists. This "
    "costs some effort at first. It pays back when a concurrent program runs for months "
    "without a crash. Ownership also frees memory without a garbage collector, because the "
    "owner drops the value when it goes out of scope. Ownership is the idea everything else "
    "in the language builds on."
)


@pytest.fixture(scope="module")
def emb(tiny_model_dir: str) -> HTPEmbeddings:
    return HTPEmbeddings(model=tiny_model_dir, method="htp", device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def emb_mean(tiny_model_dir: str) -> HTPEmbeddings:
    # vanilla-mean, no query prompt: a document's first chunk embedded as a query matches
    # its late-chunked vector (causal attention, nothing before it)
    return HTPEmbeddings(model=tiny_model_dir, method="vanilla-mean", device="cpu",
                         dtype="float32", query_instruction=None)


def _docs() -> list[Document]:
    return [Document(page_content=ESSAY_A, id="a", metadata={"source": "a.txt"}),
            Document(page_content=ESSAY_B, id="b", metadata={"source": "b.txt"})]


def _store(tmp_path: Path, emb: HTPEmbeddings, name: str = "late") -> Chroma:
    return Chroma(collection_name=name, embedding_function=emb,
                  client=make_client(tmp_path / "db"))


def _reference(emb: HTPEmbeddings, texts: list[str], spans: list[list[tuple[int, int]]]
               ) -> list[np.ndarray]:
    chunks = [[Chunk(j, a, b) for j, (a, b) in enumerate(s)] for s in spans]
    return emb.encoder.encode_late_chunks(texts, chunks, normalize=True)


# ----------------------------------------------------------------------- LangChain
def test_chroma_chunks_round_trip_and_match_encode_late_chunks(
        emb: HTPEmbeddings, tmp_path: Path) -> None:
    store = _store(tmp_path, emb)
    parents = InMemoryStore()
    ids = add_late_chunked_documents(store, emb, _docs(), splitter=token_splitter(emb, 32),
                                     docstore=parents)
    got = store.get(ids=ids, include=["embeddings", "metadatas", "documents"])
    by_id = {i: (d, m, np.asarray(e)) for i, d, m, e in
             zip(got["ids"], got["documents"], got["metadatas"], got["embeddings"], strict=True)}
    texts = {"a": ESSAY_A, "b": ESSAY_B}
    spans: dict[str, list[tuple[int, int]]] = {"a": [], "b": []}
    for cid in ids:
        text, meta, _ = by_id[cid]
        pid = meta["parent_id"]
        assert cid == f"{pid}#c{meta['chunk_index']}" and meta["source"] == f"{pid}.txt"
        assert texts[pid][meta["start_index"]:meta["end_index"]] == text
        spans[pid].append((meta["start_index"], meta["end_index"]))
    tok = emb.encoder.tokenizer
    for pid, text in texts.items():  # the same boundaries as htp_retrieval's split_chunks
        assert spans[pid] == [(c.start, c.end) for c in split_chunks(text, tok, chunk_tokens=32)]
        assert len(spans[pid]) >= 3
    ref = _reference(emb, [ESSAY_A, ESSAY_B], [spans["a"], spans["b"]])
    for pid, r in zip("ab", ref, strict=True):
        vecs = np.stack([by_id[f"{pid}#c{j}"][2] for j in range(len(spans[pid]))])
        np.testing.assert_allclose(vecs, r, atol=1e-5)
    # contextual: a later chunk's vector is not the chunk embedded on its own
    alone = np.asarray(emb.embed_documents([by_id["a#c2"][0]])[0])
    assert float(alone @ by_id["a#c2"][2]) < 0.9999
    assert parents.mget(["a", "b"])[1].page_content == ESSAY_B


def test_parent_retriever_returns_parent_text(emb_mean: HTPEmbeddings, tmp_path: Path) -> None:
    store = _store(tmp_path, emb_mean, "parents")
    parents = InMemoryStore()
    done = late_chunk_documents(emb_mean, _docs(), chunk_size=32)
    ids = add_late_chunked_documents(store, emb_mean, _docs(), chunk_size=32, docstore=parents)
    assert ids == [i for d in done for i in d.ids]
    first_b = done[1].chunks[0].page_content
    hits = LateChunkParentRetriever(vectorstore=store, docstore=parents, k=2,
                                    fetch_k=50).invoke(first_b)
    assert [h.id for h in hits] == ["b", "a"]
    assert hits[0].page_content == ESSAY_B and hits[1].page_content == ESSAY_A
    assert hits[0].metadata["matched_chunks"][0] == 0 and hits[0].metadata["source"] == "b.txt"
    one = LateChunkParentRetriever(vectorstore=store, docstore=parents, k=1).invoke(first_b)
    assert [h.page_content for h in one] == [ESSAY_B]


def test_huggingface_tokenizer_splitter_and_re_add(emb: HTPEmbeddings, tmp_path: Path) -> None:
    from langchain_text_splitters import RecursiveCharacterTextSplitter

    splitter = RecursiveCharacterTextSplitter.from_huggingface_tokenizer(
        emb.encoder.tokenizer, chunk_size=40, chunk_overlap=10, add_start_index=True)
    store = _store(tmp_path, emb, "hf-split")
    ids = add_late_chunked_documents(store, emb, _docs()[:1], splitter=splitter)
    got = store.get(ids=ids, include=["embeddings", "metadatas", "documents"])
    spans = [(m["start_index"], m["end_index"]) for m in got["metadatas"]]
    assert [ESSAY_A[a:b] for a, b in spans] == got["documents"]
    # overlapping chunks (LangChain marks the overlapping one start_index=-1: placed here)
    assert len(spans) >= 3 and any(b[0] < a[1] for a, b in zip(spans, spans[1:]))
    ref = _reference(emb, [ESSAY_A], [spans])[0]
    np.testing.assert_allclose(np.asarray(got["embeddings"]), ref, atol=1e-5)
    # a shorter new version replaces the chunks of the old one
    short = Document(page_content=ESSAY_A[:150], id="a")
    add_late_chunked_documents(store, emb, [short], splitter=splitter)
    left = store.get(where={"parent_id": "a"})["ids"]
    assert sorted(left) == [f"a#c{j}" for j in range(len(left))] and len(left) < len(ids)


def test_langchain_errors_name_the_fix(emb: HTPEmbeddings, tmp_path: Path) -> None:
    from langchain_core.vectorstores import InMemoryVectorStore
    from langchain_text_splitters import RecursiveCharacterTextSplitter

    plain = RecursiveCharacterTextSplitter(chunk_size=200, chunk_overlap=0)
    with pytest.raises(ValueError, match="add_start_index=True"):
        late_chunk_documents(emb, _docs(), splitter=plain)

    class Shifted:
        def split_documents(self, docs: list[Document]) -> list[Document]:
            d = docs[0]
            return [Document(page_content=d.page_content[:50], metadata={"start_index": -1}),
                    Document(page_content="not in it", metadata={"start_index": 0})]

    with pytest.raises(ValueError, match="chunk 1 of document 'a' is not the document's text"):
        late_chunk_documents(emb, _docs(), splitter=Shifted())
    with pytest.raises(ValueError, match="two documents have the id 'a'"):
        late_chunk_documents(emb, [_docs()[0], _docs()[0]])
    with pytest.raises(TypeError, match="wrap it in a list"):
        late_chunk_documents(emb, _docs()[0])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="InMemoryVectorStore"):
        add_late_chunked_documents(InMemoryVectorStore(emb), emb, _docs())


# ---------------------------------------------------------------------- LlamaIndex
def _li_docs() -> list[Any]:
    from llama_index.core import Document as LIDocument

    return [LIDocument(text=ESSAY_A, id_="a"), LIDocument(text=ESSAY_B, id_="b")]


def _node_spans(nodes: list[Any]) -> dict[str, list[tuple[int, int]]]:
    spans: dict[str, list[tuple[int, int]]] = {}
    for n in nodes:
        spans.setdefault(n.ref_doc_id, []).append((n.start_char_idx, n.end_char_idx))
    return spans


def test_llamaindex_pipeline_sets_late_chunk_embeddings(emb: HTPEmbeddings,
                                                        tmp_path: Path) -> None:
    from llama_index.core import VectorStoreIndex
    from llama_index.core.ingestion import IngestionPipeline
    from llama_index.core.node_parser import SentenceSplitter
    from llama_index.vector_stores.chroma import ChromaVectorStore

    collection = make_client(tmp_path / "li").get_or_create_collection(
        "late", embedding_function=None)
    store = ChromaVectorStore(chroma_collection=collection)
    pipeline = IngestionPipeline(transformations=[
        SentenceSplitter(chunk_size=48, chunk_overlap=8), LateChunkEmbedding(embed_model=emb)],
        vector_store=store)
    docs = _li_docs()
    nodes = pipeline.run(documents=docs, source_texts={d.doc_id: d.text for d in docs})
    spans = _node_spans(nodes)
    assert len(spans["a"]) >= 3 and len(spans["b"]) >= 3
    ref = dict(zip("ab", _reference(emb, [ESSAY_A, ESSAY_B], [spans["a"], spans["b"]]),
                   strict=True))
    for doc_id, r in ref.items():
        vecs = np.asarray([n.embedding for n in nodes if n.ref_doc_id == doc_id])
        np.testing.assert_allclose(vecs, r, atol=1e-5)
    assert collection.count() == len(nodes)
    index = VectorStoreIndex.from_vector_store(store, embed_model=emb)
    assert len(index.as_retriever(similarity_top_k=2).retrieve("camera sales")) == 2

    # without source_texts the text is rebuilt from the nodes: exact for ESSAY_B (single
    # spaces only), paragraph breaks no chunk holds become spaces in ESSAY_A
    again = LateChunkEmbedding(embed_model=emb)(
        SentenceSplitter(chunk_size=48, chunk_overlap=8).get_nodes_from_documents(docs))
    vecs_b = np.asarray([n.embedding for n in again if n.ref_doc_id == "b"])
    np.testing.assert_allclose(vecs_b, ref["b"], atol=1e-5)

    exact = late_chunk_nodes(docs, emb, SentenceSplitter(chunk_size=48, chunk_overlap=8))
    np.testing.assert_allclose(np.asarray([n.embedding for n in exact if n.ref_doc_id == "a"]),
                               ref["a"], atol=1e-5)


def test_llamaindex_errors_name_the_fix(emb: HTPEmbeddings) -> None:
    from llama_index.core.node_parser import SentenceSplitter
    from llama_index.core.schema import TextNode

    with pytest.raises(ValueError, match="has no source document"):
        LateChunkEmbedding(embed_model=emb)([TextNode(text="alone", id_="n1")])
    nodes = SentenceSplitter(chunk_size=48, chunk_overlap=8).get_nodes_from_documents(_li_docs())
    nodes[1].start_char_idx += 1
    nodes[1].end_char_idx += 1
    with pytest.raises(ValueError, match="disagree at character"):
        LateChunkEmbedding(embed_model=emb)(nodes)
    nodes[1].start_char_idx = None
    with pytest.raises(ValueError, match="has no start_char_idx"):
        LateChunkEmbedding(embed_model=emb)(nodes)


# ------------------------------------------------------------------------ overflow
def test_overflow_truncate_warns_and_default_embeds_whole(
        tiny_model_dir: str, emb: HTPEmbeddings, caplog: pytest.LogCaptureFixture) -> None:
    long = ESSAY_A + "\n\n" + ESSAY_B
    assert emb.max_length is None and emb.overflow == "window"
    cut = HTPEmbeddings(model=tiny_model_dir, method="htp", device="cpu", dtype="float32",
                        max_length=32, overflow="truncate")
    with caplog.at_level(logging.WARNING, logger="htp_retrieval"):
        v_cut = np.asarray(cut.embed_documents(["short text.", long])[1])
    assert "truncated 1 of 2 texts to max_length=32 tokens: text 1" in caplog.text
    v_whole = np.asarray(emb.embed_documents([long])[0])
    assert float(v_cut @ v_whole) < 0.9999  # the default keeps the text past 32 tokens
    windowed = cut.model_copy(update={"overflow": "window"})
    assert windowed.encoder is not cut.encoder
    assert float(np.asarray(windowed.embed_documents([long])[0]) @ v_cut) < 0.9999
    with pytest.raises(ValueError, match="overflow='window'"):
        cut.model_copy(update={"overflow": "error"}).embed_documents([long])


def test_window_tokens_is_passed_through(emb: HTPEmbeddings) -> None:
    done = late_chunk_documents(emb, _docs(), chunk_size=32, window_tokens=64)
    spans = [[(c.metadata["start_index"], c.metadata["end_index"]) for c in d.chunks]
             for d in done]
    chunks = [[Chunk(j, a, b) for j, (a, b) in enumerate(s)] for s in spans]
    ref = emb.encoder.encode_late_chunks([ESSAY_A, ESSAY_B], chunks, normalize=True,
                                         window_tokens=64)
    whole = _reference(emb, [ESSAY_A, ESSAY_B], spans)
    for d, r in zip(done, ref, strict=True):
        np.testing.assert_allclose(d.vectors, r, atol=1e-5)
    assert not np.allclose(done[0].vectors, whole[0], atol=1e-4)  # more than one window
