"""Chunked ingestion into Chroma: ``DOC_ID#cN`` chunks with their parent and character
offsets, the whole document covered, idempotent reruns, a kill -9 in the middle of a long
document completed by the next run with no orphan or missing chunk, pruning by document,
truncation named in the report, old collections kept as they were, and query grouping.

The long document is more than 20,000 tokens of Paul Graham essays; the model is a tiny
random Llama saved as a local folder, so the numbers are about bookkeeping, not quality.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("chromadb")

from htp_retrieval.chunking import DEFAULT_CHUNK_TOKENS  # noqa: E402
from htp_retrieval.integrations.chroma import (  # noqa: E402
    CHUNK_WRITE,
    HTPEmbeddingFunction,
    chunk_id,
    ingest,
    make_client,
    query,
)

ESSAYS = Path(__file__).resolve().parents[3] / "shared" / "data" / "haystack" / \
    "paul_graham_essays"
SMALL = "Bees make honey in hives. A colony has one queen and many workers."


@pytest.fixture(scope="module")
def big_text(tiny_model_dir: str) -> str:
    """Essays concatenated until the text has more than 20,000 tokens."""
    from transformers import AutoTokenizer

    if not ESSAYS.is_dir():
        pytest.skip(f"essays not found at {ESSAYS}")
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = ""
    for f in sorted(ESSAYS.glob("*.txt")):
        text += f.read_text(encoding="utf-8") + "\n\n"
        if len(text) > 80_000 and len(tok(text).input_ids) > 20_000:
            return text
    pytest.skip("the essays hold fewer than 20,000 tokens")


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "ANONYMIZED_TELEMETRY": "False",
            "TOKENIZERS_PARALLELISM": "false"}


def _flags(model: str, chunking: str) -> list[str]:
    # 256-token chunks: the 20,000-token document spans more than one CHUNK_WRITE group
    return ["--model", model, "--chunking", chunking, "--chunk-size", "256", "--dtype",
            "float32", "--device", "cpu", "--embed-batch-size", "16", "--quiet"]


def _chunks(db: Path, collection: str) -> dict[str, list[tuple[str, str, dict[str, Any]]]]:
    """``parent_id -> [(id, text, metadata)]`` sorted by chunk index."""
    got = make_client(str(db)).get_collection(collection).get(
        include=["documents", "metadatas"])
    out: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for i, doc, meta in zip(got["ids"], got["documents"], got["metadatas"], strict=True):
        out.setdefault(meta["parent_id"], []).append((i, doc, dict(meta)))
    for rows in out.values():
        rows.sort(key=lambda r: r[2]["chunk_index"])
    return out


def _check_complete(db: Path, collection: str, texts: dict[str, str]) -> int:
    """Every document is stored as chunks 0..n-1 (no orphan, none missing), each chunk is
    ``text[start:end]`` of its document, and the chunks cover all its non-whitespace
    characters. Returns the number of chunks."""
    stored = _chunks(db, collection)
    assert set(stored) == set(texts), "a chunk whose document is not in the source"
    total = 0
    for doc_id, text in texts.items():
        rows = stored[doc_id]
        n = rows[0][2]["n_chunks"]
        assert [r[0] for r in rows] == [chunk_id(doc_id, k) for k in range(n)]
        covered = bytearray(len(text))
        for cid, chunk, meta in rows:
            a, b = meta["chunk_start"], meta["chunk_end"]
            assert text[a:b] == chunk, cid
            assert meta["n_chunks"] == n and meta["source"] == doc_id
            covered[a:b] = b"\x01" * (b - a)
        missed = [i for i, ch in enumerate(text) if not covered[i] and not ch.isspace()]
        assert not missed, f"{doc_id}: characters {missed[:5]} are in no chunk"
        total += n
    return total


def _kill_mid_document(src: Path, db: Path, collection: str, flags: list[str],
                       cwd: Path) -> None:
    """Run the CLI in a subprocess and SIGKILL it right after the first write of big.txt's
    chunks (chunks 0..CHUNK_WRITE-1 of more)."""
    script = textwrap.dedent("""
        import sys, time
        from chromadb.api.models.Collection import Collection
        upsert = Collection.upsert
        def paused(self, *a, **k):
            out = upsert(self, *a, **k)
            if any(i.startswith("big.txt#c") for i in k.get("ids", a[0] if a else [])):
                print("PARTIAL", flush=True)
                time.sleep(600)
            return out
        Collection.upsert = paused
        from htp_retrieval.cli import main
        sys.exit(main(sys.argv[1:]))
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", script, "ingest", str(src), "--db", str(db), "--collection",
         collection, *flags], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env=_env(), cwd=cwd)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 240
        line = ""
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line or line.startswith("PARTIAL"):
                break
        assert line.startswith("PARTIAL"), f"the child wrote no chunk of big.txt ({line!r})"
        proc.send_signal(signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL


@pytest.mark.parametrize("chunking", ["naive", "late"])
def test_chunked_ingest_survives_kill_and_reruns_add_nothing(
    chunking: str, big_text: str, tiny_model_dir: str, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from htp_retrieval.cli import main

    src = tmp_path / "src"
    src.mkdir()
    (src / "big.txt").write_text(big_text, encoding="utf-8")
    (src / "small.txt").write_text(SMALL, encoding="utf-8")
    db = tmp_path / "db"
    flags = _flags(tiny_model_dir, chunking)
    _kill_mid_document(src, db, "essays", flags, tmp_path)
    partial = _chunks(db, "essays")
    assert set(partial) == {"big.txt"}, "killed after the first write of big.txt"
    n_big = partial["big.txt"][0][2]["n_chunks"]
    assert len(partial["big.txt"]) == CHUNK_WRITE < n_big, "the kill left big.txt partial"

    args = ["ingest", str(src), "--db", str(db), "--collection", "essays"]
    assert main([*args, *flags]) == 0
    out = capsys.readouterr().out
    assert "2 added, 0 updated, 0 unchanged" in out, out
    texts = {"big.txt": big_text, "small.txt": SMALL}
    n = _check_complete(db, "essays", texts)
    assert n == n_big + 1 and f"; {n} in collection" in out
    assert main([*args, "--quiet"]) == 0  # no flags: the stored settings; nothing to do
    out = capsys.readouterr().out
    assert "0 added, 0 updated, 2 unchanged" in out and f"; {n} in collection" in out

    settings = make_client(str(db)).get_collection("essays").configuration[
        "embedding_function"].get_config()
    assert (settings["chunking"], settings["chunk_size"], settings["chunk_overlap"],
            settings["overflow"], settings["max_length"]) == (chunking, 256, 0, "window", 896)
    # a changed document replaces all its chunks; --prune removes every chunk of a gone one
    shorter = big_text[: len(big_text) // 3]
    (src / "big.txt").write_text(shorter, encoding="utf-8")
    (src / "small.txt").unlink()
    assert main([*args, "--quiet"]) == 0
    out = capsys.readouterr()
    assert "0 added, 1 updated" in out.out and "stale small.txt" in out.err
    n2 = _check_complete(db, "essays", {"big.txt": shorter, "small.txt": SMALL})
    assert n2 < n
    assert main([*args, "--quiet", "--prune"]) == 0
    assert "1 pruned" in capsys.readouterr().out
    assert _check_complete(db, "essays", {"big.txt": shorter}) == n2 - 1


def test_group_by_document_and_chunk_offsets_in_query(
    tiny_model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from htp_retrieval.cli import main

    src = tmp_path / "src"
    src.mkdir()
    topics = ["bees", "tides", "glaciers", "comets"]
    for t in topics:
        body = " ".join(f"Sentence {k} of a note about {t}, with a few more words in it."
                        for k in range(60))
        (src / f"{t}.txt").write_text(body, encoding="utf-8")
    db = tmp_path / "db"
    assert main(["ingest", str(src), "--db", str(db), "--collection", "notes",
                 *_flags(tiny_model_dir, "naive"), "--chunk-size", "64",
                 "--chunk-overlap", "8"]) == 0
    capsys.readouterr()
    every = query("comets", db=db, collection="notes", n_results=200)
    assert len({h.parent_id for h in every}) == 4 and len(every) > 8
    grouped = query("comets", db=db, collection="notes", n_results=3, group_by_document=True)
    assert len(grouped) == 3 == len({h.parent_id for h in grouped})
    first: dict[str, Any] = {}
    for h in every:
        first.setdefault(h.parent_id, h)
    assert [h.id for h in grouped] == [h.id for h in list(first.values())[:3]]
    for h in grouped:
        a, b = h.span or (-1, -1)
        assert (src / h.parent_id).read_text(encoding="utf-8")[a:b] == h.document
    assert main(["query", "comets", "--db", str(db), "--collection", "notes", "-k", "2",
                 "--group-by-document", "--json", "--quiet"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["id"] for r in rows] == [h.id for h in grouped[:2]]
    assert all(r["id"] == f"{r['parent_id']}#c{r['chunk_index']}" for r in rows)
    assert main(["query", "comets", "--db", str(db), "--collection", "notes", "-k", "1",
                 "--quiet"]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert re.search(r"#c\d+  score -?\d\.\d{4}  \[\w+\.txt chars \d+-\d+\]$", line), line


def test_truncation_is_named_and_old_collections_keep_their_settings(
    tiny_model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from htp_retrieval.cli import main

    src = tmp_path / "src"
    src.mkdir()
    (src / "long.txt").write_text(" ".join(f"Bees visit flower {k} for nectar." for k in
                                           range(60)), encoding="utf-8")
    (src / "short.txt").write_text(SMALL, encoding="utf-8")
    db = tmp_path / "db"
    base = ["ingest", str(src), "--db", str(db), "--quiet"]
    model = ["--model", tiny_model_dir, "--dtype", "float32", "--device", "cpu"]
    assert main([*base, "--collection", "cut", *model, "--chunking", "none", "--overflow",
                 "truncate", "--max-length", "64"]) == 0
    cap = capsys.readouterr()
    lines = [x for x in cap.err.splitlines() if x.startswith("truncated")]
    assert lines == ["truncated 1 document(s) to --max-length 64 tokens (--overflow "
                     "truncate; --overflow window embeds them whole): long.txt"], cap.err
    assert "1 truncated" in cap.out
    assert sorted(make_client(str(db)).get_collection("cut").get(include=[])["ids"]) == [
        "long.txt", "short.txt"]
    # --overflow error refuses the long document in one line; window embeds it whole
    assert main([*base, "--collection", "refused", *model, "--chunking", "none",
                 "--overflow", "error", "--max-length", "64"]) == 2
    assert "long.txt" not in capsys.readouterr().out
    assert "refused" not in [c.name for c in make_client(str(db)).list_collections()]
    assert main([*base, "--collection", "refused", *model, "--chunking", "none",
                 "--max-length", "64"]) == 0  # the failed settings were not kept
    capsys.readouterr()
    assert main([*base, "--collection", "whole", *model, "--chunking", "none",
                 "--max-length", "64"]) == 0
    assert "truncated" not in capsys.readouterr().err

    # a collection made before overflow and chunking existed: truncate at 512, no chunks
    old_keys = ("model_name", "method", "query_instruction", "document_instruction",
                "normalize", "max_length", "dtype", "encoder_kwargs")
    new_config = HTPEmbeddingFunction.get_config
    monkeypatch.setattr(HTPEmbeddingFunction, "get_config", lambda self: {
        k: v for k, v in new_config(self).items() if k in old_keys})
    ingest(src, db=db, collection="old", show_progress=False, embedding_function=
           HTPEmbeddingFunction(tiny_model_dir, dtype="float32", device="cpu",
                                max_length=512))  # overflow: stored as absent
    monkeypatch.undo()
    assert main([*base, "--collection", "old"]) == 0  # no flags: what it was made with
    assert "0 added, 0 updated, 2 unchanged" in capsys.readouterr().out
    ef = make_client(str(db)).get_collection("old").configuration["embedding_function"]
    assert (ef.max_length, ef.overflow, ef.chunking) == (512, "truncate", "none")
    assert main([*base, "--collection", "old", "--chunking", "naive"]) == 2
    err = capsys.readouterr().err
    assert "--chunking stored 'none', requested 'naive'" in err and len(
        err.strip().splitlines()) == 1


def test_a_chunk_that_does_not_fit_is_refused_and_a_cut_chunk_is_named(
    tiny_model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from htp_retrieval.chunking import Chunk
    from htp_retrieval.cli import main

    src = tmp_path / "src"
    src.mkdir()
    long = " ".join(f"Bees visit flower {k} for nectar." for k in range(60))
    (src / "long.txt").write_text(long, encoding="utf-8")
    (src / "short.txt").write_text(SMALL, encoding="utf-8")
    db = tmp_path / "db"
    base = ["ingest", str(src), "--db", str(db), "--quiet", "--model", tiny_model_dir,
            "--dtype", "float32", "--device", "cpu", "--max-length", "64"]
    for chunking in ("naive", "late"):  # default-size chunks cannot fit 64-token passes
        assert main([*base, "--collection", chunking, "--chunking", chunking]) == 2
        err = capsys.readouterr().err.strip()
        assert err.endswith(f"chunk size {DEFAULT_CHUNK_TOKENS} tokens does not fit "
                            "max_length 64 (at most 56 tokens a chunk): lower the chunk size "
                            "or raise max_length"), err
        assert len(err.splitlines()) == 1
    assert make_client(str(db)).list_collections() == []
    with pytest.raises(ValueError, match="does not fit max_length 64"):
        HTPEmbeddingFunction(tiny_model_dir, chunking="late", max_length=64).check_chunk_fits()

    # a chunk longer than the splitter promised (here: the whole document) is cut, and
    # named by document in the report and by chunk in the metadata, for both chunkings
    def one_chunk(self: HTPEmbeddingFunction, text: str) -> list[Chunk]:
        return [Chunk(0, 0, len(text))]

    monkeypatch.setattr(HTPEmbeddingFunction, "split", one_chunk)
    for chunking, extra in (("naive", ["--overflow", "truncate"]), ("late", [])):
        assert main([*base, "--collection", f"cut-{chunking}", "--chunking", chunking,
                     "--chunk-size", "48", *extra]) == 0
        cap = capsys.readouterr()
        lines = [x for x in cap.err.splitlines() if x.startswith("truncated")]
        assert lines == ["truncated a chunk of 1 document(s) to --max-length 64 tokens (the "
                         "splitter made it longer than --chunk-size 48; a smaller "
                         "--chunk-size avoids it; chunk metadata 'truncated'): long.txt"], (
            chunking, cap.err)
        assert "1 truncated" in cap.out
        got = make_client(str(db)).get_collection(f"cut-{chunking}").get(
            include=["metadatas"])
        cut = {i: m.get("truncated", False) for i, m in zip(got["ids"], got["metadatas"])}
        assert cut == {"long.txt#c0": True, "short.txt#c0": False}, chunking
