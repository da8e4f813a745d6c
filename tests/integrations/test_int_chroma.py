"""Chroma: embedding function config round-trip, ingestion (idempotent, resumable, rejects
reported), CLI, and a real ``chroma run`` server through ``HttpClient``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("chromadb")

from htp_retrieval.integrations.chroma import (  # noqa: E402
    HTPEmbeddingFunction,
    collection_embedding_function,
    ingest,
    make_client,
    query,
)

TOPICS = ["bees", "rust", "tea", "volcanoes", "chess", "jazz", "tides", "bridges", "comets",
          "bread", "owls", "glaciers"]


def _folder(root: Path, n: int = 8) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i, t in enumerate(TOPICS[:n]):
        sub = root / ("notes" if i % 2 else "")
        sub.mkdir(exist_ok=True)
        ext = ".md" if i % 3 == 0 else ".txt"
        (sub / f"{t}{ext}").write_text(f"A short note about {t}. It is note number {i}.\n",
                                       encoding="utf-8")
    (root / "empty.txt").write_text("  \n", encoding="utf-8")
    (root / "latin1.txt").write_bytes("caf\xe9 au lait".encode("latin-1"))
    (root / "ignored.pdf").write_bytes(b"%PDF")
    return root


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "ANONYMIZED_TELEMETRY": "False",
            "TOKENIZERS_PARALLELISM": "false"}


def test_folder_ingest_is_idempotent_and_reports_rejects(tmp_path: Path) -> None:
    src = _folder(tmp_path / "src")
    db = tmp_path / "db"
    r1 = ingest(src, db=db, collection="notes", batch_size=3, show_progress=False)
    assert (r1.seen, r1.added, r1.unchanged, r1.count) == (10, 8, 0, 8)
    assert {(r.id, r.reason.split(":")[0]) for r in r1.rejected} == {
        ("empty.txt", "empty"), ("latin1.txt", "undecodable")}
    r2 = ingest(src, db=db, collection="notes", batch_size=3, show_progress=False)
    assert (r2.added, r2.updated, r2.unchanged, r2.count) == (0, 0, 8, 8)
    (src / "tea.txt").write_text("Tea, rewritten: oolong is partly oxidized.", encoding="utf-8")
    r3 = ingest(src, db=db, collection="notes", batch_size=3, show_progress=False)
    assert (r3.added, r3.updated, r3.count) == (0, 1, 8)
    col = make_client(db).get_collection("notes")
    got = col.get(ids=["tea.txt", "notes/rust.txt"], include=["documents", "metadatas"])
    assert sorted(got["ids"]) == ["notes/rust.txt", "tea.txt"]
    assert col.configuration["hnsw"]["space"] == "cosine"
    hits = query("oolong tea oxidation", db=db, collection="notes", n_results=3)
    assert len(hits) == 3 and all(-1e-6 <= h.distance <= 2 for h in hits)
    with pytest.raises(ValueError, match="cannot change"):
        ingest(src, db=db, collection="notes", show_progress=False,
               embedding_function=HTPEmbeddingFunction(method="vanilla-mean"))


def test_beir_ingest_rejects_bad_lines(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    rows = [json.dumps({"_id": f"d{i}", "title": f"Title {i}", "text": f"Body about {t}."})
            for i, t in enumerate(TOPICS[:5])]
    rows += [json.dumps({"_id": "d0", "text": "duplicate"}), "{not json",
             json.dumps({"_id": "e1", "title": "", "text": "  "}), json.dumps({"text": "no id"})]
    corpus.write_bytes(("\n".join(rows) + "\n").encode() + b'{"_id": "x", "text": "\xff"}\n')
    r = ingest(tmp_path, db=tmp_path / "db", collection="beir-small", show_progress=False)
    assert (r.added, r.count) == (5, 5)
    reasons = {x.id: x.reason for x in r.rejected}
    assert reasons["d0"].startswith("duplicate") and reasons["e1"] == "empty"
    assert reasons["line 7"].startswith("invalid JSON") and reasons["line 9"] == "no _id"
    assert reasons["line 10"].startswith("undecodable")


def test_config_round_trip_in_new_process(tmp_path: Path) -> None:
    ef = HTPEmbeddingFunction(query_instruction="Find the note", max_length=128)
    assert HTPEmbeddingFunction.build_from_config(ef.get_config()).get_config() == ef.get_config()
    src = _folder(tmp_path / "src", n=4)
    ingest(src, db=tmp_path / "db", collection="round-trip", embedding_function=ef,
           show_progress=False)
    script = textwrap.dedent(f"""
        import json, chromadb
        from chromadb.config import Settings
        import htp_retrieval.integrations.chroma  # registers the embedding function
        c = chromadb.PersistentClient({str(tmp_path / "db")!r},
                                      settings=Settings(anonymized_telemetry=False))
        col = c.get_collection("round-trip")        # no embedding function passed
        ef = col.configuration["embedding_function"]
        col.add(ids=["new"], documents=["A fresh note about kites."])
        res = col.query(query_texts=["kites"], n_results=1)
        print(json.dumps({{"ef": type(ef).__name__, "config": ef.get_config(),
                          "top": res["ids"][0][0], "count": col.count()}}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=_env(), timeout=180, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["ef"] == "HTPEmbeddingFunction" and got["config"] == ef.get_config()
    assert got["count"] == 5 and got["top"] == "new"


def test_kill_and_resume(tmp_path: Path) -> None:
    src = _folder(tmp_path / "src", n=12)
    for i in range(12):
        (src / f"extra{i:02d}.txt").write_text(f"Extra document {i} about {TOPICS[i]}s.",
                                               encoding="utf-8")
    db = tmp_path / "db"
    script = textwrap.dedent(f"""
        import sys
        from htp_retrieval.integrations.chroma import ingest
        ingest({str(src)!r}, db={str(db)!r}, collection="resume", batch_size=2,
               show_progress=False,
               on_batch=lambda r: print("BATCH", r.added, flush=True))
        print("DONE", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=_env())
    try:
        batches = 0
        deadline = time.monotonic() + 180
        assert proc.stdout is not None
        while batches < 3 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            batches += line.startswith("BATCH")
            assert not line.startswith("DONE")
        assert batches == 3, "child did not write 3 batches"
        proc.send_signal(signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    r = ingest(src, db=db, collection="resume", batch_size=2, show_progress=False)
    assert r.unchanged >= 6 and r.added >= 1 and r.added + r.unchanged == 24
    got = make_client(db).get_collection("resume").get(include=[])
    expected = {p.relative_to(src).as_posix() for p in src.rglob("*")
                if p.suffix in (".txt", ".md") and p.name not in ("empty.txt", "latin1.txt")}
    assert len(got["ids"]) == len(set(got["ids"])) == 24
    assert set(got["ids"]) == expected


def test_cli_ingest_and_query(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from htp_retrieval.cli import main

    src = _folder(tmp_path / "src", n=3)
    db = str(tmp_path / "db")
    assert main(["ingest", str(src), "--db", db, "--collection", "cli-notes", "--quiet"]) == 0
    cap = capsys.readouterr()
    assert "3 added" in cap.out and "rejected latin1.txt: undecodable" in cap.err
    assert main(["ingest", str(src), "--db", db, "--collection", "cli-notes", "--quiet",
                 "--strict"]) == 1
    assert "0 added" in capsys.readouterr().out
    assert main(["query", "bees", "--db", db, "--collection", "cli-notes", "-k", "2",
                 "--json"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["rank"] for x in lines] == [1, 2]


def test_http_server(chroma_server: str, tmp_path: Path) -> None:
    src = _folder(tmp_path / "src", n=5)
    r1 = ingest(src, db=chroma_server, collection="served", batch_size=2, show_progress=False)
    r2 = ingest(src, db=chroma_server, collection="served", batch_size=2, show_progress=False)
    assert (r1.added, r2.added, r2.unchanged, r2.count) == (5, 0, 5, 5)
    hits = query("volcanoes", db=chroma_server, collection="served", n_results=2)
    assert len(hits) == 2
    col = make_client(chroma_server).get_collection("served")
    assert isinstance(collection_embedding_function(col), HTPEmbeddingFunction)
