"""Ray Data ingestion: a local 2-CPU Ray cluster, 2 embedding actors, a ``chroma run`` server.

Every document must arrive exactly once (count and ids), a rerun must add nothing, the
stored vectors must equal single-process embeddings, and bad documents must be reported by
id without blocking the others.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("chromadb")
pytest.importorskip("ray")

from htp_retrieval.integrations.chroma import (  # noqa: E402
    HTPEmbeddingFunction,
    SourceDoc,
    make_client,
)
from htp_retrieval.integrations.ray_ingest import EmbedWriter, ingest_ray  # noqa: E402

TOPICS = ["bees", "rust", "tea", "volcanoes", "chess", "jazz", "tides", "bridges", "comets",
          "bread", "owls", "glaciers", "lichens", "kites", "salt"]


@pytest.fixture(scope="module")
def ray_cluster():  # noqa: ANN201
    """A local Ray cluster with 2 CPUs (two actors), shut down after the module."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=150 * 2**20,
             runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                                       "ANONYMIZED_TELEMETRY": "False"}})
    try:
        yield ray
    finally:
        ray.shutdown()
    assert not ray.is_initialized()


def _corpus(path: Path, n: int = 30) -> tuple[Path, list[str]]:
    rows = [json.dumps({"_id": f"d{i:02d}", "title": f"Note {i}",
                        "text": f"A short note about {TOPICS[i % len(TOPICS)]}. It is number {i}."})
            for i in range(n)]
    good = [f"d{i:02d}" for i in range(n)]
    rows.insert(5, json.dumps({"_id": "e1", "title": "", "text": "   "}))   # line 6: empty
    rows.insert(9, "{not json")                                              # line 10
    rows.insert(12, json.dumps({"_id": "d03", "text": "a duplicate id"}))    # line 13
    rows.insert(20, json.dumps({"text": "no id at all"}))                    # line 21
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path, good


def _ef(model_dir: str, **kw: Any) -> HTPEmbeddingFunction:
    return HTPEmbeddingFunction(model_dir, "htp", dtype="float32", device="cpu", batch_size=8,
                                **kw)


def test_ray_ingest_every_document_exactly_once(
    ray_cluster: Any, chroma_server: str, tiny_model_dir: str, tmp_path: Path
) -> None:
    corpus, good = _corpus(tmp_path / "corpus.jsonl")
    kw = dict(db=chroma_server, collection="ray-docs", embedding_function=_ef(tiny_model_dir),
              batch_size=4, concurrency=2, num_cpus=0.5, threads=1, show_progress=False)
    r1 = ingest_ray(corpus, **kw)
    assert (r1.seen, r1.added, r1.updated, r1.unchanged) == (34, 30, 0, 0)
    assert r1.workers == 2, "both actors of the pool wrote documents"
    assert {(r.id, r.reason.split(" ")[0]) for r in r1.rejected} == {
        ("e1", "empty"), ("line 10", "invalid"), ("d03", "duplicate"), ("line 21", "no")}
    col = make_client(chroma_server).get_collection("ray-docs")
    got = col.get(include=["embeddings", "documents"])
    assert len(got["ids"]) == len(set(got["ids"])) == 30 == r1.count == col.count()
    assert sorted(got["ids"]) == good
    # the vectors are those of a single-process encoder (d03 kept its first text)
    by_id = dict(zip(got["ids"], got["embeddings"]))
    texts = dict(zip(got["ids"], got["documents"]))
    assert texts["d03"].startswith("Note 3 A short note")
    ref = _ef(tiny_model_dir).embed_documents_array([texts["d03"], texts["d17"]])
    np.testing.assert_allclose(np.stack([by_id["d03"], by_id["d17"]]), ref, atol=1e-5)

    r2 = ingest_ray(corpus, **kw)  # a rerun adds nothing
    assert (r2.added, r2.updated, r2.unchanged, r2.count, len(r2.rejected)) == (0, 0, 30, 30, 4)
    assert sorted(col.get(include=[])["ids"]) == good


def test_ray_ingest_folder_and_cli(
    ray_cluster: Any, chroma_server: str, tiny_model_dir: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from htp_retrieval.cli import main

    src = tmp_path / "notes"
    (src / "sub").mkdir(parents=True)
    for i, t in enumerate(TOPICS[:6]):
        (src / ("sub" if i % 2 else "") / f"{t}.txt").write_text(f"About {t}. Fact {i}.",
                                                                 encoding="utf-8")
    (src / "empty.md").write_text(" \n", encoding="utf-8")
    (src / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (src / ".hidden.txt").write_text("never read", encoding="utf-8")
    long = " ".join(f"Sentence {k} about salt and the sea." for k in range(80))
    (src / "long.txt").write_text(long, encoding="utf-8")
    args = ["ingest", str(src), "--db", chroma_server, "--collection", "ray-notes", "--ray",
            "--concurrency", "2", "--num-cpus", "0.5", "--threads", "1", "--quiet",
            "--model", tiny_model_dir, "--dtype", "float32", "--device", "cpu",
            "--chunk-size", "64"]
    assert main(args) == 0
    cap = capsys.readouterr()
    assert "7 added" in cap.out and "2 rejected" in cap.out
    assert "rejected latin1.txt: undecodable" in cap.err and "rejected empty.md: empty" in cap.err
    got = make_client(chroma_server).get_collection("ray-notes").get(
        include=["documents", "metadatas"])
    # a new collection is chunked (naive): a short note is one chunk, DOC_ID#c0; the long
    # one has the chunks (ids and offsets) of the single-process ingestion
    chunks = _ef(tiny_model_dir, chunking="naive", chunk_size=64).split(long)
    assert len(chunks) > 3
    assert sorted(got["ids"]) == sorted([f"{d}#c0" for d in [
        "bees.txt", "sub/rust.txt", "tea.txt", "sub/volcanoes.txt", "chess.txt",
        "sub/jazz.txt"]] + [f"long.txt#c{c.index}" for c in chunks])
    for cid, text, meta in zip(got["ids"], got["documents"], got["metadatas"], strict=True):
        if meta["parent_id"] == "long.txt":
            c = chunks[meta["chunk_index"]]
            assert (meta["chunk_start"], meta["chunk_end"], meta["n_chunks"]) == (
                c.start, c.end, len(chunks))
            assert long[c.start : c.end] == text, cid
    assert main([*args, "--strict"]) == 1  # rejected documents -> exit 1; nothing added
    assert "0 added" in capsys.readouterr().out

    # late chunking through Ray: the same ids and offsets, the vectors of one process
    late = [("ray-late" if a == "ray-notes" else a) for a in args] + ["--chunking", "late"]
    assert main(late) == 0
    assert "7 added" in capsys.readouterr().out
    got = make_client(chroma_server).get_collection("ray-late").get(
        where={"parent_id": "long.txt"}, include=["metadatas", "embeddings"])
    order = np.argsort([m["chunk_index"] for m in got["metadatas"]])
    assert [got["ids"][i] for i in order] == [f"long.txt#c{c.index}" for c in chunks]
    want = _ef(tiny_model_dir, chunking="late", chunk_size=64).embed_chunks(long, chunks)
    np.testing.assert_allclose(np.asarray(got["embeddings"])[order], want, atol=1e-5)


class _Col:
    def __init__(self) -> None:
        self.rows: dict[str, Any] = {}

    def get(self, ids: list[str], include: list[str]) -> dict[str, Any]:
        have = [i for i in ids if i in self.rows]
        return {"ids": have, "metadatas": [self.rows[i] for i in have]}

    def upsert(self, ids: list[str], documents: list[str], metadatas: list[dict],
               embeddings: Any) -> None:
        self.rows.update(zip(ids, metadatas))


class _RefusingEF:
    def embed_documents_array(self, texts: list[str]) -> np.ndarray:
        if any("REFUSE" in t for t in texts):
            raise ValueError("text at index 0 produced no tokens")
        return np.ones((len(texts), 4), dtype=np.float32)


def test_embed_writer_isolates_a_refused_text() -> None:
    w = EmbedWriter.__new__(EmbedWriter)  # no model, no server: the batch logic alone
    w.col, w.ef = _Col(), _RefusingEF()
    docs = [SourceDoc("a", "fine text", {"source": "a", "title": ""}),
            SourceDoc("b", "REFUSE me", {"source": "b", "title": ""}),
            SourceDoc("c", None, {"source": "c", "title": ""}, "empty"),
            SourceDoc("d", "also fine", {"source": "d", "title": ""})]
    batch = {k: np.array([getattr(d, k) if k in ("id", "text", "error") else d.metadata[k]
                          for d in docs], dtype=object)
             for k in ("id", "text", "title", "source", "error")}
    out = w(batch)
    assert out["status"] == ["added", "rejected", "rejected", "added"]
    assert len(set(out["worker"])) == 1
    assert out["reason"][1].startswith("not embedded: text at index 0")
    assert out["reason"][2] == "empty"
    assert sorted(w.col.rows) == ["a", "d"]
