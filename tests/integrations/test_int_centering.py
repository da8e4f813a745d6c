"""Centring stored with a Chroma collection and applied by HTPEmbeddings.

A tiny random Llama saved as a local folder (the numbers are about consistency, not
quality): a centred collection stores vectors equal to the centring applied to the
uncentred ones; its queries (ours, and Chroma's own ``query_texts``) are centred on the
stored query mean, also in a new process and through a Chroma server; documents added later
are centred on the same document mean; a new query sample changes the query mean and no
stored vector.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("chromadb")

from htp_retrieval import Centering  # noqa: E402
from htp_retrieval.integrations.chroma import (  # noqa: E402
    REFIT_GROWTH,
    HTPEmbeddingFunction,
    SettingsConflictError,
    collection_embedding_function,
    ingest,
    make_client,
    query,
)

DOCS = {
    "bees.txt": "Bees make honey in hives. A colony has one queen and many workers. "
                "Workers gather nectar from flowers all summer long.",
    "rain.txt": "Rain fell over the harbour at dawn. Fishing boats stayed in port. "
                "By noon the storm had passed and the sky was clear.",
    "prices.txt": "Prices rose sharply in the third quarter. Analysts were surprised by "
                  "the jump in energy costs. Markets fell for a week.",
}
MORE = {"violin.txt": "The violin was tuned before the concert began. The hall was full.",
        "trains.txt": "Night trains cross the mountains twice a week. Tickets sell out.",
        "bread.txt": "Bakers rise before dawn to knead the dough. Loaves cool on racks.",
        "stars.txt": "On clear nights the old observatory opens its dome to visitors."}
QUERIES = ["Who lives in a hive?", "What happened to the weather?", "Why did prices rise?"]


def _folder(root: Path, docs: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in docs.items():
        (root / name).write_text(text)
    return root


def _ef(model: str, **kw) -> HTPEmbeddingFunction:
    return HTPEmbeddingFunction(model, method="htp", dtype="float32", chunking="naive",
                                chunk_size=16, **kw)


def _stored(col) -> dict[str, tuple[str, np.ndarray]]:
    got = col.get(include=["embeddings", "documents"])
    return {i: (d, np.asarray(e, dtype=np.float32))
            for i, d, e in zip(got["ids"], got["documents"], got["embeddings"], strict=True)}


def test_centred_collection_stores_and_queries_consistently(tiny_model_dir: str,
                                                            tmp_path: Path) -> None:
    db = str(tmp_path / "db")
    report = ingest(_folder(tmp_path / "a", DOCS), db=db, collection="centred",
                    embedding_function=_ef(tiny_model_dir), center_queries=QUERIES,
                    query_source="test queries", show_progress=False)
    col = make_client(db).get_collection("centred")
    ef = collection_embedding_function(col)
    cen = ef.centering
    assert cen is not None and cen.n_documents == report.count == col.count()
    assert cen.n_queries == 3 and cen.query_source == "test queries"
    assert "centred: document mean of" in report.summary()
    plain = _ef(tiny_model_dir)  # same settings, no centring: the raw vectors
    stored = _stored(col)
    raw = plain._encode([t for t, _ in stored.values()], None, "document")
    # the document mean is the mean of the stored chunks' raw vectors ...
    np.testing.assert_allclose(cen.document_mean, (raw / np.linalg.norm(
        raw, axis=1, keepdims=True)).mean(0), atol=1e-5)
    # ... and every stored vector is that raw vector centred
    np.testing.assert_allclose(np.stack([e for _, e in stored.values()]),
                               cen.apply(raw, "document"), atol=1e-5)
    # queries: ours and Chroma's own query_texts path are centred on the query mean
    q = cen.apply(plain.embed_query([QUERIES[0]]), "query")[0]
    hits = query(QUERIES[0], db=db, collection="centred", n_results=3)
    for h in hits:
        assert h.score == pytest.approx(float(q @ stored[h.id][1]), abs=1e-4)
    native = col.query(query_texts=[QUERIES[0]], n_results=3)
    assert native["ids"][0] == [h.id for h in hits]

    # a new process applies the same transform
    script = (
        "import json, htp_retrieval.integrations.chroma as c\n"
        f"hits = c.query({QUERIES[0]!r}, db={db!r}, collection='centred', n_results=3)\n"
        "print(json.dumps([[h.id, h.distance] for h in hits]))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300, check=True)
    again = json.loads(out.stdout.strip().splitlines()[-1])
    assert [i for i, _ in again] == [h.id for h in hits]
    np.testing.assert_allclose([d for _, d in again], [h.distance for h in hits], atol=1e-5)

    # documents added later (no refit): centred on the same, unchanged document mean
    ingest(_folder(tmp_path / "a", MORE), db=db, collection="centred", show_progress=False,
           refit_centering=False)
    col = make_client(db).get_collection("centred")
    after = collection_embedding_function(col).centering
    assert after == cen
    stored2 = _stored(col)
    new_ids = [i for i in stored2 if i not in stored]
    assert new_ids and all(np.array_equal(stored2[i][1], stored[i][1]) for i in stored)
    raw_new = plain._encode([stored2[i][0] for i in new_ids], None, "document")
    np.testing.assert_allclose(np.stack([stored2[i][1] for i in new_ids]),
                               cen.apply(raw_new, "document"), atol=1e-5)

    # the automatic refit (the count grew by more than REFIT_GROWTH): the mean a fresh fit
    # on every stored text gives, every vector re-centred on it, the query mean kept
    assert len(stored2) > (1 + REFIT_GROWTH) * cen.n_documents
    report = ingest(tmp_path / "a", db=db, collection="centred", show_progress=False)
    assert "document mean refitted on" in report.summary()
    col = make_client(db).get_collection("centred")
    refit = collection_embedding_function(col).centering
    raw_all = plain._encode([t for t, _ in stored2.values()], None, "document")
    fresh = Centering.fit(raw_all, np.ones((1, cen.hidden)))
    np.testing.assert_allclose(refit.document_mean, fresh.document_mean, atol=1e-5)
    np.testing.assert_array_equal(refit.query_mean, cen.query_mean)
    assert refit.n_documents == len(stored2) == col.count()
    stored2 = _stored(col)
    np.testing.assert_allclose(np.stack([e for _, e in stored2.values()]),
                               refit.apply(raw_all, "document"), atol=1e-4)
    cen = refit

    # a new query sample: only the query mean changes, no stored vector does
    report = ingest(tmp_path / "a", db=db, collection="centred", show_progress=False,
                    center_queries=QUERIES[:2], query_source="two", refit_centering=False)
    col = make_client(db).get_collection("centred")
    refit = collection_embedding_function(col).centering
    np.testing.assert_array_equal(refit.document_mean, cen.document_mean)
    assert refit.n_queries == 2 and refit.query_source == "two"
    assert not np.allclose(refit.query_mean, cen.query_mean)
    stored3 = _stored(col)
    assert all(np.array_equal(stored3[i][1], stored2[i][1]) for i in stored2)
    q2 = refit.apply(plain.embed_query([QUERIES[0]]), "query")[0]
    top = query(QUERIES[0], db=db, collection="centred", n_results=1)[0]
    assert top.score == pytest.approx(float(q2 @ stored3[top.id][1]), abs=1e-4)


def test_centring_refusals(tiny_model_dir: str, tmp_path: Path) -> None:
    db = str(tmp_path / "db")
    src = _folder(tmp_path / "a", DOCS)
    ingest(src, db=db, collection="plain", embedding_function=_ef(tiny_model_dir),
           show_progress=False)
    with pytest.raises(ValueError, match="made without centring"):
        ingest(src, db=db, collection="plain", center_queries=QUERIES, show_progress=False)
    with pytest.raises(ValueError, match="center_queries is empty"):
        ingest(src, db=db, collection="other", center_queries=[], show_progress=False)
    with pytest.raises(TypeError, match="not a string"):
        ingest(src, db=db, collection="other", center_queries="a query", show_progress=False)
    assert "other" not in [c.name for c in make_client(db).list_collections()]
    # a function with another document mean is refused by a centred collection
    ingest(src, db=db, collection="centred", embedding_function=_ef(tiny_model_dir),
           center_queries=QUERIES, show_progress=False)
    col = make_client(db).get_collection("centred")
    cen = collection_embedding_function(col).centering
    other = cen.replace(document_mean=cen.document_mean + 0.01)
    with pytest.raises(SettingsConflictError, match="document side differs"):
        ingest(src, db=db, collection="centred", show_progress=False,
               embedding_function=_ef(tiny_model_dir, centering=other))
    with pytest.raises(SettingsConflictError, match="centering stored none"):
        ingest(src, db=db, collection="plain", show_progress=False,
               embedding_function=_ef(tiny_model_dir, centering=cen))


def test_cli_and_server(tiny_model_dir: str, tmp_path: Path, chroma_server: str,
                        capsys: pytest.CaptureFixture[str]) -> None:
    src = _folder(tmp_path / "a", DOCS)
    qfile = tmp_path / "queries.txt"
    qfile.write_text("\n".join(QUERIES) + "\n\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "htp_retrieval.cli", "ingest", str(src), "--db",
           chroma_server, "--collection", "served", "--model", tiny_model_dir, "--dtype",
           "float32", "--chunk-size", "16", "--center-queries", str(qfile), "--quiet"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "centred: document mean of" in out.stdout and "query mean of 3 queries" in out.stdout
    from htp_retrieval.cli import main

    assert main(["collections", "--db", chroma_server]) == 0
    assert "centred (" in capsys.readouterr().out
    col = make_client(chroma_server).get_collection("served")
    cen = collection_embedding_function(col).centering
    assert cen.query_source == "queries.txt" and cen.n_queries == 3
    hits = query(QUERIES[2], db=chroma_server, collection="served", n_results=2)
    q = cen.apply(_ef(tiny_model_dir).embed_query([QUERIES[2]]), "query")[0]
    got = col.get(ids=[hits[0].id], include=["embeddings"])
    assert hits[0].score == pytest.approx(float(q @ np.asarray(got["embeddings"][0])),
                                          abs=1e-4)
    bad = tmp_path / "q.jsonl"
    bad.write_text('{"_id": "1"}\n')
    assert main([*cmd[3:-3], "--center-queries", str(bad)]) == 2
    assert "line 1: not a JSON object with a 'text'" in capsys.readouterr().err


def test_htp_embeddings_centring(tiny_model_dir: str, tmp_path: Path) -> None:
    from langchain_core.vectorstores import InMemoryVectorStore

    from htp_retrieval.integrations import HTPEmbeddings

    emb = HTPEmbeddings(model_name=tiny_model_dir, dtype="float32")
    docs = list(DOCS.values())
    cen = emb.fit_centering(docs, QUERIES, query_source="t")
    raw_q = np.asarray(emb.embed_query(QUERIES[1]))
    raw_d = np.asarray(emb.embed_documents(docs))
    path = cen.save(tmp_path / "centering.json")
    centred = HTPEmbeddings(model_name=tiny_model_dir, dtype="float32", centering=str(path))
    assert centred.centering == cen
    np.testing.assert_allclose(centred.embed_query(QUERIES[1]),
                               cen.apply(raw_q, "query")[0], atol=1e-5)
    np.testing.assert_allclose(centred.embed_documents(docs), cen.apply(raw_d, "document"),
                               atol=1e-5)
    store = InMemoryVectorStore.from_texts(docs, centred)
    (doc, score), = store.similarity_search_with_score(QUERIES[1], k=1)
    want = cen.apply(raw_d, "document") @ cen.apply(raw_q, "query")[0]
    assert doc.page_content == docs[int(np.argmax(want))]
    assert score == pytest.approx(float(want.max()), abs=1e-4)
    # LlamaIndex's model_dump round trip keeps it; another method refuses it
    assert HTPEmbeddings(**centred.model_dump()).centering == cen
    other = HTPEmbeddings(model_name=tiny_model_dir, dtype="float32", method="vanilla-mean",
                          centering=cen)
    with pytest.raises(ValueError, match="fitted with config method='htp'"):
        other.embed_query("x")
    assert isinstance(Centering.load(path), Centering)


def test_fitting_embeds_each_document_once(tiny_model_dir: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from htp_retrieval.encoder import HTPEncoder

    texts: list[str] = []
    encode = HTPEncoder.encode

    def counting(self, batch, **kw):  # noqa: ANN001, ANN202
        texts.extend(batch)
        return encode(self, batch, **kw)

    monkeypatch.setattr(HTPEncoder, "encode", counting)
    for chunking in ("none", "naive"):
        texts.clear()
        ef = HTPEmbeddingFunction(tiny_model_dir, dtype="float32", chunking=chunking,
                                  chunk_size=16)
        report = ingest(_folder(tmp_path / chunking, DOCS), db=str(tmp_path / f"db{chunking}"),
                        collection="once", embedding_function=ef, center_queries=QUERIES,
                        show_progress=False, batch_size=2)
        assert len(texts) == report.count + len(QUERIES)  # every vector and query, once
        assert ef._raw == {}


def test_refit_cut_short_is_finished_by_the_next_call(tiny_model_dir: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from htp_retrieval.integrations.chroma import refit_documents

    db = str(tmp_path / "db")
    src = _folder(tmp_path / "a", DOCS)
    ingest(src, db=db, collection="cut", embedding_function=_ef(tiny_model_dir),
           center_queries=QUERIES, show_progress=False)
    ingest(_folder(src, MORE), db=db, collection="cut", show_progress=False,
           refit_centering=False)
    col = make_client(db).get_collection("cut")
    cen = collection_embedding_function(col).centering
    texts = {i: t for i, (t, _) in _stored(col).items()}
    calls = {"n": 0}
    update = type(col).update

    def dying(self, *a, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("killed")
        return update(self, *a, **kw)

    monkeypatch.setattr(type(col), "update", dying)
    with pytest.raises(RuntimeError, match="killed"):
        refit_documents(col, page=3)  # the first page is re-centred, then the run dies
    monkeypatch.setattr(type(col), "update", update)
    col = make_client(db).get_collection("cut")
    assert collection_embedding_function(col).centering == cen  # not switched half-way
    assert json.loads(col.metadata["htp_refit_pending"])  # the target is recorded
    ingest(src, db=db, collection="cut", show_progress=False, refit_centering=False)
    col = make_client(db).get_collection("cut")
    done = collection_embedding_function(col).centering
    assert not col.metadata["htp_refit_pending"] and done.n_documents == len(texts)
    raw = _ef(tiny_model_dir)._encode(list(texts.values()), None, "document")
    fresh = Centering.fit(raw, np.ones((1, cen.hidden)))
    np.testing.assert_allclose(done.document_mean, fresh.document_mean, atol=1e-5)
    assert not np.allclose(done.document_mean, cen.document_mean, atol=1e-4)
    after = _stored(col)
    np.testing.assert_allclose(np.stack([after[i][1] for i in texts]),
                               done.apply(raw, "document"), atol=1e-4)
