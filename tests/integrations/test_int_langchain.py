"""HTPEmbeddings on the LangChain side: the standard test suite plus HTP-specific checks."""

from __future__ import annotations

import asyncio
import copy
import pickle
import time

import numpy as np
import pytest

pytest.importorskip("langchain_core")
pytest.importorskip("llama_index.core")
langchain_tests = pytest.importorskip("langchain_tests")

from langchain_core.embeddings import Embeddings  # noqa: E402
from langchain_tests.integration_tests import EmbeddingsIntegrationTests  # noqa: E402
from langchain_tests.unit_tests import EmbeddingsUnitTests  # noqa: E402

from htp_retrieval.integrations import HTPEmbeddings  # noqa: E402
from htp_retrieval.integrations._runtime import loaded_configs  # noqa: E402


def _cos(a: list[float], b: list[float]) -> float:
    x, y = np.asarray(a), np.asarray(b)
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


class TestHTPEmbeddingsStandardUnit(EmbeddingsUnitTests):
    @property
    def embeddings_class(self) -> type[HTPEmbeddings]:
        return HTPEmbeddings

    @property
    def embedding_model_params(self) -> dict:
        return {"model": "smollm2-135m-instruct"}


# pytest-asyncio runs in strict mode here: the class mark runs the suite's async tests
# (overriding them would fail the suite's own test_no_overrides_DO_NOT_OVERRIDE).
@pytest.mark.asyncio
@pytest.mark.filterwarnings("ignore:The test <Function test_:pytest.PytestWarning")
class TestHTPEmbeddingsStandardIntegration(EmbeddingsIntegrationTests):
    @property
    def embeddings_class(self) -> type[HTPEmbeddings]:
        return HTPEmbeddings

    @property
    def embedding_model_params(self) -> dict:
        return {"model": "smollm2-135m-instruct"}


@pytest.fixture(scope="module")
def emb() -> HTPEmbeddings:
    return HTPEmbeddings()


def test_is_both_frameworks_and_lazy() -> None:
    from llama_index.core.base.embeddings.base import BaseEmbedding

    e = HTPEmbeddings(model="smollm2-135m-instruct", max_length=77)
    assert isinstance(e, Embeddings) and isinstance(e, BaseEmbedding)
    assert e.model_name == "smollm2-135m-instruct"
    assert e.encoder_config not in loaded_configs()  # nothing loaded in __init__
    assert len(e.embed_query("lazy")) == 576
    assert e.encoder_config in loaded_configs()
    assert HTPEmbeddings.model_fields["query_instruction"].description
    assert HTPEmbeddings.model_fields["overflow"].description


def test_long_text_defaults_and_overflow_setting() -> None:
    e = HTPEmbeddings()
    assert e.max_length is None and e.overflow == "window"  # the model window, never cut
    assert e.encoder_config.overflow == "window" and e.encoder_config.max_length is None
    cut = HTPEmbeddings(max_length=64, overflow="truncate")
    assert cut.encoder_config.overflow == "truncate" and cut.encoder_config.max_length == 64
    with pytest.raises(ValueError, match="overflow"):
        HTPEmbeddings(overflow="cut")
    with pytest.raises(ValueError, match="max_length"):
        HTPEmbeddings(max_length=0)


def test_copies_share_the_encoder(emb: HTPEmbeddings) -> None:
    enc = emb.encoder
    assert emb.model_copy().encoder is enc
    assert copy.deepcopy(emb).encoder is enc
    assert pickle.loads(pickle.dumps(emb)).encoder is enc
    assert emb.model_copy(update={"method": "vanilla-mean"}).encoder is not enc


def test_query_and_document_instructions_are_separate(emb: HTPEmbeddings) -> None:
    text = "Startups need to grow fast."
    q = emb.embed_query(text)
    d = emb.embed_documents([text])[0]
    ref_q = emb.encoder.encode([text], instruction=emb.query_instruction, normalize=True)[0]
    ref_d = emb.encoder.encode([text], instruction=None, normalize=True)[0]
    assert _cos(q, ref_q) >= 0.9999 and _cos(d, ref_d) >= 0.9999
    assert _cos(q, d) < 0.9999  # the query prompt is not applied to documents
    assert abs(np.linalg.norm(q) - 1) < 1e-4


def test_text_is_passed_as_is(emb: HTPEmbeddings) -> None:
    a, b = emb.embed_documents(["first line\nsecond line", "first line second line"])
    assert _cos(a, b) < 0.99999


def test_empty_text_raises_with_index(emb: HTPEmbeddings) -> None:
    with pytest.raises(ValueError, match="index 1"):
        emb.embed_documents(["fine", "   "])
    assert emb.embed_documents([]) == []


@pytest.mark.asyncio
async def test_32_concurrent_aembed_query_keep_loop_responsive(emb: HTPEmbeddings) -> None:
    texts = [f"question {i}: why do startups fail?" for i in range(32)]
    expected = emb.embed_documents(texts[:4])  # warm up; documents differ from queries
    assert expected
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    try:
        results = await asyncio.gather(*(emb.aembed_query(t) for t in texts))
    finally:
        done.set()
        await tick
    for t, r in zip(texts, results, strict=True):
        assert _cos(r, emb.embed_query(t)) >= 0.9999
    assert len(gaps) >= 3
    assert max(gaps) < 0.25, f"event loop blocked for {max(gaps):.3f} s"


@pytest.mark.asyncio
async def test_async_errors_stay_with_their_call(emb: HTPEmbeddings) -> None:
    ok, bad = await asyncio.gather(emb.aembed_query("fine"), emb.aembed_query(" "),
                                   return_exceptions=True)
    assert isinstance(ok, list) and isinstance(bad, ValueError)
    docs = await emb.aembed_documents(["a", "b"])
    assert len(docs) == 2
