"""Ingestion and integration a user cannot trip over: one-line errors with exit 2, nothing
created by a failed first ingest, stored settings reused, prune, collections and drop,
skipped and contentless files reported, and HTPEmbeddings never ignoring an argument.

The CLI runs in subprocesses as a user runs it, against a real embedded Chroma and a real
``chroma run`` server, with a tiny random Llama saved as a local model folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("chromadb")

from htp_retrieval.integrations.chroma import ingest, make_client  # noqa: E402


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "ANONYMIZED_TELEMETRY": "False",
            "TOKENIZERS_PARALLELISM": "false"}


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "htp_retrieval.cli", *args],
                          capture_output=True, text=True, env=_env(), cwd=cwd, timeout=300,
                          stdin=subprocess.DEVNULL)


def _cli_all(*calls: tuple[str, ...], cwd: Path) -> list[subprocess.CompletedProcess[str]]:
    """Independent CLI calls (none writes what another reads) run side by side, results in
    call order: each is a fresh interpreter, so this uses the cores a serial run leaves idle."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 2))) as pool:
        return list(pool.map(lambda args: _cli(*args, cwd=cwd), calls))


def _one_line_error(out: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and out.stdout == ""
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def _src(root: Path, names: tuple[str, ...] = ("a.txt", "b.txt")) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        (root / name).write_text(f"Note {i} about {name[:-4]}. Bees make honey in hives.",
                                 encoding="utf-8")
    return root


def _ids(db: Path | str, collection: str) -> set[str]:
    return set(make_client(str(db)).get_collection(collection).get(include=[])["ids"])


def _names(db: Path | str) -> list[str]:
    return [c.name for c in make_client(str(db)).list_collections()]


def test_expected_errors_are_one_line_and_create_nothing(tmp_path: Path,
                                                         tiny_model_dir: str) -> None:
    src = _src(tmp_path / "src")
    db = tmp_path / "db"
    base = ["ingest", str(src), "--db", str(db), "--collection", "notes", "--quiet"]
    method, missing, model, name, dtype = _cli_all(
        (*base, "--model", tiny_model_dir, "--method", "htpp"),
        ("ingest", str(tmp_path / "nope"), "--db", str(db)),
        (*base, "--model", "smollm2-135m-instruc"),
        ("ingest", str(src), "--db", str(db), "--collection", "a b!"),
        (*base, "--model", tiny_model_dir, "--dtype", "fp8"), cwd=tmp_path)
    _one_line_error(method, "htp-retrieval ingest: error:", "unknown method 'htpp'")
    _one_line_error(missing, "source not found", "nope")
    _one_line_error(model, "model 'smollm2-135m-instruc' not found", "did you mean")
    _one_line_error(name, "invalid collection name 'a b!'")
    _one_line_error(dtype, "dtype 'fp8'")
    assert not db.exists(), "a failed first ingest must create nothing"
    # a model folder whose weights cannot load: refused after the database opens, but
    # before the collection is created
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text(Path(tiny_model_dir, "config.json").read_text())
    out = _cli(*base, "--model", str(broken), cwd=tmp_path)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert _names(db) == []
    # the corrected command then succeeds
    ok = _cli(*base, "--model", tiny_model_dir, "--method", "htp", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr[-2000:]
    # a new collection is chunked (naive): a short note is one chunk, DOC_ID#c0
    assert "2 added" in ok.stdout and _ids(db, "notes") == {"a.txt#c0", "b.txt#c0"}
    assert "Loading weights" not in ok.stderr and "%|" not in ok.stderr  # --quiet
    # read-only commands never create a database; unknown names are one line
    nodb, unreachable = _cli_all(("query", "bees", "--db", str(tmp_path / "dbx")),
                                 ("query", "bees", "--db", "http://127.0.0.1:9"), cwd=tmp_path)
    _one_line_error(nodb, "no Chroma database at")
    assert not (tmp_path / "dbx").exists()
    _one_line_error(unreachable, "cannot reach the Chroma server")
    _one_line_error(_cli("query", "bees", "--db", str(db), "--collection", "other",
                         cwd=tmp_path), "collection 'other' not found", "notes")
    debug = _cli("query", "bees", "--db", str(db), "--collection", "other", "--debug",
                 cwd=tmp_path)
    assert debug.returncode != 0 and "Traceback" in debug.stderr


def test_rerun_reuses_stored_settings_prune_and_drop(tmp_path: Path,
                                                     tiny_model_dir: str) -> None:
    src = _src(tmp_path / "src", ("a.txt", "b.txt", "c.txt"))
    db = tmp_path / "db"
    base = ["ingest", str(src), "--db", str(db), "--collection", "kept", "--quiet"]
    first = _cli(*base, "--model", tiny_model_dir, "--method", "vanilla-mean", "--dtype",
                 "float32", "--max-length", "64", "--chunk-size", "48", cwd=tmp_path)
    assert first.returncode == 0 and "3 added" in first.stdout, first.stderr[-2000:]
    again = _cli(*base, cwd=tmp_path)  # no flags: the stored settings
    assert again.returncode == 0, again.stderr[-2000:]
    assert "0 added" in again.stdout and "3 unchanged" in again.stdout
    line = _one_line_error(_cli(*base, "--method", "htp", "--dtype", "bfloat16", cwd=tmp_path),
                           "cannot change")
    assert "--method stored 'vanilla-mean', requested 'htp'" in line
    assert "--dtype stored 'float32', requested 'bfloat16'" in line
    same = _cli(*base, "--method", "vanilla-mean", cwd=tmp_path)  # equal to the stored value
    assert same.returncode == 0, same.stderr[-2000:]

    (src / "b.txt").rename(src / "renamed.txt")
    (src / "c.txt").unlink()
    stale = _cli(*base, cwd=tmp_path)
    assert stale.returncode == 0 and "2 stale" in stale.stdout
    assert "stale b.txt" in stale.stderr and "stale c.txt" in stale.stderr
    assert _ids(db, "kept") == {"a.txt#c0", "b.txt#c0", "c.txt#c0", "renamed.txt#c0"}
    pruned = _cli(*base, "--prune", cwd=tmp_path)
    assert pruned.returncode == 0 and "2 pruned" in pruned.stdout, pruned.stderr[-2000:]
    assert _ids(db, "kept") == {"a.txt#c0", "renamed.txt#c0"}

    listed = _cli("collections", "--db", str(db), "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(x) for x in listed.stdout.splitlines()]
    assert [(r["name"], r["count"], r["settings"]["method"], r["settings"]["dtype"])
            for r in rows] == [("kept", 2, "vanilla-mean", "float32")]
    _one_line_error(_cli("drop", "kept", "--db", str(db), cwd=tmp_path), "add --yes")
    assert _names(db) == ["kept"]
    dropped = _cli("drop", "kept", "--db", str(db), "--yes", cwd=tmp_path)
    assert dropped.returncode == 0 and "dropped kept (2 vectors)" in dropped.stdout
    assert _names(db) == []
    _one_line_error(_cli("drop", "kept", "--db", str(db), "--yes", cwd=tmp_path),
                    "collection 'kept' not found")


def test_server_typo_then_corrected(chroma_server: str, tmp_path: Path,
                                    tiny_model_dir: str) -> None:
    src = _src(tmp_path / "src")
    base = ["ingest", str(src), "--db", chroma_server, "--collection", "served", "--quiet",
            "--model", tiny_model_dir]
    _one_line_error(_cli(*base, "--method", "htpp", cwd=tmp_path), "unknown method")
    assert make_client(chroma_server).list_collections() == []
    ok = _cli(*base, "--method", "htp", cwd=tmp_path)
    assert ok.returncode == 0 and "2 added" in ok.stdout, ok.stderr[-2000:]
    listed = _cli("collections", "--db", chroma_server, cwd=tmp_path)
    assert listed.returncode == 0 and listed.stdout.startswith("served  2 vectors")


def test_skipped_files_and_contentless_text_are_reported(tmp_path: Path,
                                                         tiny_model_dir: str) -> None:
    from htp_retrieval.integrations.chroma import HTPEmbeddingFunction

    src = _src(tmp_path / "src")
    (src / "nul.txt").write_bytes(b"\x00" * 1000)
    (src / "ctrl.md").write_text("\x01\x02 \x1b\u200b\n", encoding="utf-8")
    (src / "guide.rst").write_text("A reStructuredText guide about bees.", encoding="utf-8")
    (src / ".hidden.txt").write_text("hidden note", encoding="utf-8")
    (src / ".git").mkdir()
    (src / ".git" / "HEAD").write_text("ref", encoding="utf-8")
    ef = HTPEmbeddingFunction(tiny_model_dir, "htp", dtype="float32", device="cpu")
    db = tmp_path / "db"
    r = ingest(src, db=db, collection="files", embedding_function=ef, show_progress=False)
    assert (r.added, r.count) == (2, 2)
    reasons = {x.id: x.reason for x in r.rejected}
    assert set(reasons) == {"nul.txt", "ctrl.md"}
    assert all(v.startswith("no content") for v in reasons.values())
    assert {(s.path, s.reason) for s in r.skipped} == {
        ("guide.rst", "extension .rst"), (".hidden.txt", "hidden"),
        (".git/", "hidden folder (1 file)")}
    r2 = ingest(src, db=db, collection="files", show_progress=False, include=["*.rst"])
    assert r2.added == 1 and {s.path for s in r2.skipped} == {".hidden.txt", ".git/"}
    assert _ids(db, "files") == {"a.txt", "b.txt", "guide.rst"}
    # the CLI prints each rejected and skipped entry, and the summary counts them
    out = _cli("ingest", str(src), "--db", str(db), "--collection", "files", "--quiet",
               cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "rejected nul.txt: no content" in out.stderr
    assert "skipped guide.rst: extension .rst" in out.stderr and "--include" in out.stderr
    assert "2 rejected, 3 skipped" in out.stdout


def test_htpembeddings_never_ignores_an_argument(tiny_model_dir: str) -> None:
    pytest.importorskip("langchain_core")
    pytest.importorskip("llama_index.core")
    from htp_retrieval.integrations import HTPEmbeddings

    with pytest.raises(ValueError, match="unknown argument 'batch_size': use embed_batch_size"):
        HTPEmbeddings(model_name=tiny_model_dir, batch_size=4)
    with pytest.raises(ValueError, match="unknown argument 'normalize_embeddings'"):
        HTPEmbeddings(model_name=tiny_model_dir, normalize_embeddings=False)
    with pytest.raises(ValueError, match="dtype 'fp64' is not supported"):
        HTPEmbeddings(model_name=tiny_model_dir, dtype="fp64")
    with pytest.raises(ValueError, match="unknown method 'htpp'"):
        HTPEmbeddings(model_name=tiny_model_dir, method="htpp")
    with pytest.raises(ValueError, match="encode_kwargs key 'prompt'"):
        HTPEmbeddings(model_name=tiny_model_dir, encode_kwargs={"prompt": "x"})
    with pytest.raises(ValueError, match="trust_remote_code"):
        HTPEmbeddings(model_name=tiny_model_dir, model_kwargs={"trust_remote_code": True})
    with pytest.raises(ValueError, match="given twice"):
        HTPEmbeddings(model_name=tiny_model_dir, embed_batch_size=8,
                      encode_kwargs={"batch_size": 4})
    emb = HTPEmbeddings(model_name=tiny_model_dir, dtype="fp32",
                        model_kwargs={"device": "cpu", "k": 2},
                        encode_kwargs={"batch_size": 4, "normalize_embeddings": False})
    assert (emb.embed_batch_size, emb.normalize, emb.dtype, emb.device) == (4, False,
                                                                             "float32", "cpu")
    assert emb.encoder_kwargs == {"k": 2}
    texts = [f"Note {i} about bees. They make honey." for i in range(6)]  # one length
    vecs = emb.embed_documents(texts)
    assert len(vecs) == 6 and max(n for n, _ in emb.encoder.last_stats.batches) == 4
    assert abs(sum(x * x for x in vecs[0]) - 1.0) > 1e-3  # not normalized, as asked
    with pytest.raises(TypeError, match="single str"):
        emb.embed_documents("hello")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        emb.embed_query(["hello"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="index 1 is no content"):
        emb.embed_documents(["fine text", "\x00\x00\x00"])


def test_edge_cases_found_by_trying_it(tmp_path: Path, tiny_model_dir: str) -> None:
    src = _src(tmp_path / "src")
    (src / "guide.rst").write_text("A guide about bees.", encoding="utf-8")
    (src / "linked").symlink_to(tmp_path, target_is_directory=True)  # a cycle if followed
    db = tmp_path / "db"
    # a relative model path is stored absolute; an alias is stored by its canonical name
    rel = os.path.relpath(tiny_model_dir, tmp_path)
    out = _cli("ingest", str(src), "--db", str(db), "--collection", "edge", "--quiet",
               "--model", rel, "--method", "vanilla", "--query-instruction", "",
               "--include", "*.rst", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "skipped linked/: symbolic link to a folder (not followed)" in out.stderr
    settings = json.loads(_cli("collections", "--db", str(db), "--json",
                               cwd=tmp_path).stdout)["settings"]
    assert settings["model_name"] == str(Path(tiny_model_dir).resolve())
    assert settings["method"] == "vanilla-mean" and settings["query_instruction"] is None
    same = _cli("ingest", str(src), "--db", str(db), "--collection", "edge", "--quiet",
                "--model", tiny_model_dir + "/", "--method", "vanilla-mean", cwd=tmp_path)
    assert same.returncode == 0, same.stderr[-2000:]  # same settings, spelled otherwise
    # a file skipped by this run (no --include now) is not "gone": --prune keeps it
    kept = _cli("ingest", str(src), "--db", str(db), "--collection", "edge", "--quiet",
                "--prune", cwd=tmp_path)
    assert kept.returncode == 0 and "0 stale" in kept.stdout, kept.stdout
    assert _ids(db, "edge") == {"a.txt#c0", "b.txt#c0", "guide.rst#c0"}
    # an empty source is an error: it never creates a collection nor prunes one
    (tmp_path / "empty").mkdir()
    _one_line_error(_cli("ingest", str(tmp_path / "empty"), "--db", str(db), "--collection",
                         "edge", "--prune", cwd=tmp_path), "no documents in")
    _one_line_error(_cli("ingest", str(tmp_path / "empty"), "--db", str(db), "--collection",
                         "new-one", "--model", tiny_model_dir, cwd=tmp_path), "no documents")
    assert _ids(db, "edge") == {"a.txt#c0", "b.txt#c0", "guide.rst#c0"}
    assert "new-one" not in _names(db)
    # --db naming a file is one line; a collection made without htp-retrieval can be dropped
    (tmp_path / "dbfile").write_text("x")
    _one_line_error(_cli("ingest", str(src), "--db", str(tmp_path / "dbfile"), cwd=tmp_path),
                    "is a file")
    make_client(str(db)).create_collection("plain", embedding_function=None)
    _one_line_error(_cli("query", "bees", "--db", str(db), "--collection", "plain",
                         cwd=tmp_path), "not created by htp-retrieval", "htp-retrieval drop")
    dropped = _cli("drop", "plain", "--db", str(db), "--yes", cwd=tmp_path)
    assert dropped.returncode == 0 and "plain" not in _names(db)
    _one_line_error(_cli("ingest", str(src), "--db", str(db), "--collection", "edge",
                         "--threads", "-1", cwd=tmp_path), "--threads")


def test_llamaindex_batch_and_carried_over_names(tiny_model_dir: str) -> None:
    pytest.importorskip("llama_index.core")
    from htp_retrieval.integrations import HTPEmbeddings

    emb = HTPEmbeddings(model_name=tiny_model_dir, text_instruction="Represent the note",
                        dtype="float32")
    assert emb.document_instruction == "Represent the note"
    with pytest.raises(TypeError, match="single str"):
        emb.get_text_embedding_batch("hello")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="index 1 is int"):
        emb.embed_documents(["fine", 2])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="dtype 'junk'"):
        emb.dtype = "junk"  # assignments are validated too
    assert len(emb.get_text_embedding_batch(["one note", "another note"])) == 2


def test_eval_quiet_prints_no_bar(tmp_path: Path, tiny_model_dir: str) -> None:
    beir = tmp_path / "tiny-beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text("".join(
        json.dumps({"_id": f"d{i}", "title": "", "text": f"Note {i} about bees and honey."})
        + "\n" for i in range(4)), encoding="utf-8")
    (beir / "queries.jsonl").write_text(json.dumps({"_id": "q0", "text": "bees"}) + "\n",
                                        encoding="utf-8")
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td1\t1\n",
                                             encoding="utf-8")
    out = _cli("eval", "--data", str(beir), "--model", tiny_model_dir, "--methods",
               "vanilla-mean", "--output", str(tmp_path / "results"), "--quiet", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Loading weights" not in out.stderr and "%|" not in out.stderr, out.stderr
    assert "NDCG@10" in out.stdout + out.stderr
