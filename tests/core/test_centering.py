"""Centering: fitting, the transform, saving, and the encoder option (tiny random models)."""

from __future__ import annotations

import numpy as np
import pytest

from htp_retrieval import Centering, HTPEncoder, fit_centering
from htp_retrieval.chunking import split_chunks


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture
def clouds() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    docs = rng.normal(size=(40, 8)) + 5.0  # a narrow cone, as decoder embeddings are
    queries = rng.normal(size=(12, 8)) + np.linspace(3, 6, 8)
    return docs, queries


def test_fit_takes_means_of_unit_rows_and_apply_centres(clouds) -> None:
    docs, queries = clouds
    cen = Centering.fit(docs * 7.0, queries, query_source="sample")  # scale must not matter
    np.testing.assert_allclose(cen.document_mean, _unit(docs).mean(0), rtol=1e-5)
    np.testing.assert_allclose(cen.query_mean, _unit(queries).mean(0), rtol=1e-5)
    assert (cen.n_documents, cen.n_queries, cen.hidden) == (40, 12, 8)
    out = cen.apply(docs, "document")
    np.testing.assert_allclose(out, _unit(_unit(docs) - _unit(docs).mean(0)), atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-5)
    # the centred corpus has (up to normalisation) no common direction left
    raw_cos = (_unit(docs) @ _unit(docs).T).mean()
    centred_cos = (out @ out.T).mean()
    assert raw_cos > 0.9 and abs(centred_cos) < 0.1
    q = cen.apply(queries[0], "query")  # one vector is one row
    assert q.shape == (1, 8)
    assert cen.apply(np.zeros((0, 8)), "query").shape == (0, 8)


def test_with_queries_keeps_the_document_mean(clouds) -> None:
    docs, queries = clouds
    cen = Centering.fit(docs, queries)
    new = cen.with_queries(queries[:3], query_source="three served queries")
    np.testing.assert_array_equal(new.document_mean, cen.document_mean)
    np.testing.assert_allclose(new.query_mean, _unit(queries[:3]).mean(0), rtol=1e-5)
    assert new.n_queries == 3 and new.query_source == "three served queries"


def test_save_load_round_trip(tmp_path, clouds) -> None:
    docs, queries = clouds
    cen = Centering.fit(docs, queries, query_source="s", config={"layers": {"a": (1, 2)}},
                        model="m", query_instruction="Q:", document_instruction=None)
    back = Centering.load(cen.save(tmp_path / "c.json"))
    assert back == cen and back.config == {"layers": {"a": [1, 2]}}
    np.testing.assert_array_equal(back.apply(docs, "document"), cen.apply(docs, "document"))
    assert Centering.coerce(str(tmp_path / "c.json")) == cen
    assert Centering.coerce(cen.to_dict()) == cen


@pytest.mark.parametrize(("make", "match"), [
    (lambda d, q: Centering.fit(d, q[:, :4]), "dimensions"),
    (lambda d, q: Centering.fit(d[:0], q), "non-empty"),
    (lambda d, q: Centering.fit(np.vstack([d, np.zeros((1, 8))]), q), "row 40 has norm 0"),
    (lambda d, q: Centering.fit(d, q).apply(d, "passage"), "side"),
    (lambda d, q: Centering.fit(d, q).apply(d[:, :5], "query"), "another model"),
    (lambda d, q: Centering(np.ones(3), np.ones(4), 1, 1), "3 dimensions"),
    (lambda d, q: Centering(np.ones(3), np.full(3, np.nan), 1, 1), "finite"),
    (lambda d, q: Centering.from_dict({"document_mean": [1.0]}), "not a saved centring"),
])
def test_bad_input_is_named(clouds, make, match) -> None:
    with pytest.raises(ValueError, match=match):
        make(*clouds)


def test_load_names_the_file(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="no centring file"):
        Centering.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "other"}')
    with pytest.raises(ValueError, match="bad.json"):
        Centering.load(bad)
    with pytest.raises(TypeError, match="Centering"):
        Centering.coerce(3)


DOCS = ["The cat sat on the mat. It purred all day.", "Rain fell over the harbour at dawn.",
        "Prices rose sharply in the third quarter. Analysts were surprised.",
        "The violin was tuned before the concert began."]
QUERIES = ["Where did the cat sit?", "What happened to prices?", "When did it rain?"]


def test_encoder_option_matches_apply(tiny_llama) -> None:
    model, tok = tiny_llama
    enc = HTPEncoder(model, tokenizer=tok, method="htp", dtype="float32")
    cen = fit_centering(enc, DOCS, QUERIES, query_instruction="Find the passage.",
                        query_source="test queries")
    assert cen.model == enc.model_name and cen.config == enc.config.to_dict()
    raw = enc.encode(QUERIES, instruction="Find the passage.")
    got = enc.encode(QUERIES, instruction="Find the passage.", centering=cen, side="query")
    np.testing.assert_allclose(got, cen.apply(raw, "query"), rtol=1e-5, atol=1e-6)
    # the means themselves come from the same encoder: refitting on the returned raw vectors
    np.testing.assert_allclose(cen.query_mean, _unit(raw).mean(0), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="side="):
        enc.encode(QUERIES, centering=cen)
    with pytest.raises(ValueError, match="side="):
        enc.encode(QUERIES, side="query")
    other = HTPEncoder(model, tokenizer=tok, method="vanilla-mean", dtype="float32")
    with pytest.raises(ValueError, match="config method='htp'"):
        other.encode(QUERIES, centering=cen, side="query")


def test_late_chunks_are_centred_on_the_document_mean(tiny_llama) -> None:
    model, tok = tiny_llama
    enc = HTPEncoder(model, tokenizer=tok, method="htp", dtype="float32")
    text = " ".join(DOCS * 3)
    chunks = split_chunks(text, tok, chunk_tokens=24, chunk_overlap=0)
    raw = enc.encode_late_chunks([text], [chunks])[0]
    cen = Centering.fit(raw, enc.encode(QUERIES), config=enc.config.to_dict(),
                        model=enc.model_name)
    got = enc.encode_late_chunks([text], [chunks], centering=cen)[0]
    np.testing.assert_allclose(got, cen.apply(raw, "document"), rtol=1e-5, atol=1e-6)
