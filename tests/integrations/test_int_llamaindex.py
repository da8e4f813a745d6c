"""HTPEmbeddings on the LlamaIndex side: batching, progress, callbacks, async, indexes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("llama_index.core")
pytest.importorskip("langchain_core")

from llama_index.core import Settings, VectorStoreIndex  # noqa: E402
from llama_index.core.callbacks import CallbackManager  # noqa: E402
from llama_index.core.callbacks.base_handler import BaseCallbackHandler  # noqa: E402
from llama_index.core.callbacks.schema import CBEventType  # noqa: E402
from llama_index.core.schema import TextNode  # noqa: E402

from htp_retrieval.integrations import HTPEmbeddings  # noqa: E402


def _cos(a: list[float], b: list[float]) -> float:
    x, y = np.asarray(a), np.asarray(b)
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


class _Counter(BaseCallbackHandler):
    def __init__(self) -> None:
        super().__init__([], [])
        self.embedding_events = 0

    def on_event_start(self, event_type: CBEventType, payload: Any = None, event_id: str = "",
                       parent_id: str = "", **kwargs: Any) -> str:
        if event_type == CBEventType.EMBEDDING:
            self.embedding_events += 1
        return event_id

    def on_event_end(self, event_type: CBEventType, payload: Any = None, event_id: str = "",
                     **kwargs: Any) -> None:
        return None

    def start_trace(self, trace_id: str | None = None) -> None:
        return None

    def end_trace(self, trace_id: str | None = None, trace_map: Any = None) -> None:
        return None


def test_query_matches_langchain_side() -> None:
    emb = HTPEmbeddings()
    text = "How do founders pick a startup idea?"
    assert _cos(emb.embed_query(text), emb.get_query_embedding(text)) >= 0.9999
    assert _cos(emb.embed_documents([text])[0], emb.get_text_embedding(text)) >= 0.9999
    assert _cos(emb.get_query_embedding(text), emb.get_text_embedding(text)) < 0.9999


def test_text_embedding_batch_progress_and_callbacks(capsys: pytest.CaptureFixture[str]) -> None:
    counter = _Counter()
    emb = HTPEmbeddings(embed_batch_size=2, callback_manager=CallbackManager([counter]))
    texts = ["alpha one.", "beta two.", "gamma three.", "delta four.", "epsilon five."]
    vecs = emb.get_text_embedding_batch(texts, show_progress=True)
    assert len(vecs) == 5 and all(len(v) == 576 for v in vecs)
    assert counter.embedding_events == 3  # ceil(5 / embed_batch_size)
    assert "Generating embeddings" in capsys.readouterr().err
    ref = emb.embed_documents(texts)
    assert min(_cos(a, b) for a, b in zip(vecs, ref, strict=True)) >= 0.9999


@pytest.mark.asyncio
async def test_async_llamaindex_methods() -> None:
    emb = HTPEmbeddings(embed_batch_size=2)
    vecs = await emb.aget_text_embedding_batch(["one.", "two.", "three."])
    q = await emb.aget_query_embedding("one?")
    assert len(vecs) == 3 and len(q) == 576
    assert _cos(q, emb.get_query_embedding("one?")) >= 0.9999


def test_vector_store_index_build_and_retrieve() -> None:
    texts = {
        "bees": "Honey bees communicate the location of flowers with a waggle dance.",
        "rust": "Rust prevents data races at compile time through ownership and borrowing.",
        "tea": "Green tea is made from unoxidized leaves of Camellia sinensis.",
    }
    nodes = [TextNode(text=t, id_=k) for k, t in texts.items()]
    # query_instruction=None: a query equal to a document text must come back first
    emb = HTPEmbeddings(query_instruction=None, embed_batch_size=2)
    index = VectorStoreIndex(nodes, embed_model=emb)
    assert index._embed_model is emb  # used as is, not wrapped as a LangChain model
    hits = index.as_retriever(similarity_top_k=2).retrieve(texts["rust"])
    assert hits[0].node.node_id == "rust" and hits[0].score > 0.999

    old = Settings._embed_model
    try:
        Settings.embed_model = emb
        assert Settings.embed_model is emb
        index2 = VectorStoreIndex(nodes)
        assert index2.as_retriever(similarity_top_k=1).retrieve(texts["tea"])[0].node.node_id == "tea"
    finally:
        Settings._embed_model = old
