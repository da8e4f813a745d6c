"""Chunk-level retrieval on evidence spans: loader, chunk relevance, scopes, harness wiring."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from htp_retrieval import HTPEncoder
from htp_retrieval.chunking import Chunk
from htp_retrieval.eval.chunk_eval import (
    IN_DOC,
    SpanData,
    chunk_qrels,
    load_spans,
    run_chunk_retrieval,
)
from htp_retrieval.eval.data import BeirData
from htp_retrieval.eval.harness import resolve_data
from htp_retrieval.eval.retrieval import timing_machine

SPANS = Path(__file__).resolve().parents[3] / "shared/data/spans/qmsum"
needs_data = pytest.mark.skipif(not SPANS.exists(), reason="../shared/data not beside checkout")


@needs_data
def test_load_spans_reads_the_qmsum_dev_layout() -> None:
    data = load_spans(SPANS, "dev")
    assert len(data.corpus) == 197
    assert len(data.queries) == 1332
    assert sum(len(s) for s in data.spans.values()) == 1454
    for q, spans in data.spans.items():
        for d, s, e in spans:
            assert d in data.beir.qrels[q]
            assert 0 <= s < e <= len(data.corpus[d]["text"])
    sub = load_spans(SPANS, "dev", max_docs=5, seed=3)
    assert len(sub.corpus) == 5
    assert all(d in sub.corpus for sp in sub.spans.values() for d, _, _ in sp)
    assert sub.corpus.keys() == load_spans(SPANS, "dev", max_docs=5, seed=3).corpus.keys()


def test_load_spans_names_a_bad_line(tmp_path: Path) -> None:
    (tmp_path / "qrels").mkdir()
    (tmp_path / "spans").mkdir()
    (tmp_path / "corpus.jsonl").write_text(json.dumps({"_id": "d", "text": "abc"}) + "\n")
    (tmp_path / "queries.jsonl").write_text(json.dumps({"_id": "q", "text": "x"}) + "\n")
    (tmp_path / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\nq\td\t1\n")
    (tmp_path / "spans" / "dev.jsonl").write_text(
        json.dumps({"query-id": "q", "corpus-id": "d", "start": 0, "end": 9}) + "\n")
    with pytest.raises(ValueError, match=r"dev.jsonl:1: span \[0, 9\) outside document 'd'"):
        load_spans(tmp_path, "dev")


def test_chunk_qrels_mark_chunks_that_overlap_a_span() -> None:
    beir = BeirData("t", {"d": {"title": "", "text": "x" * 100}}, {"q": "?"}, {"q": {"d": 1}})
    data = SpanData(beir, {"q": [("d", 25, 55)]})
    chunks = {"d": [Chunk(0, 0, 25), Chunk(1, 25, 50), Chunk(2, 50, 75), Chunk(3, 75, 100)]}
    assert chunk_qrels(data, chunks) == {"q": {"d#c1": 1, "d#c2": 1}}


def _toy(tmp_path: Path) -> Path:
    """Two documents; each query is one sentence of a document, its span that sentence."""
    docs = {
        "a": "\n".join(f"Alpha line {i} speaks of apples number {i}." for i in range(40)),
        "b": "\n".join(f"Beta line {i} speaks of boats number {i}." for i in range(40)),
    }
    (tmp_path / "qrels").mkdir(parents=True)
    (tmp_path / "spans").mkdir()
    with open(tmp_path / "corpus.jsonl", "w") as f:
        for d, t in docs.items():
            f.write(json.dumps({"_id": d, "title": "", "text": t}) + "\n")
    rows, qrels, spans = [], ["query-id\tcorpus-id\tscore"], []
    for d, t in docs.items():
        for i in (3, 30):
            line = t.split("\n")[i]
            s = t.index(line)
            q = f"{d}{i}"
            rows.append({"_id": q, "text": line})
            qrels.append(f"{q}\t{d}\t1")
            spans.append({"query-id": q, "corpus-id": d, "start": s, "end": s + len(line)})
    (tmp_path / "queries.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "qrels" / "dev.tsv").write_text("\n".join(qrels) + "\n")
    (tmp_path / "spans" / "dev.jsonl").write_text("\n".join(json.dumps(r) for r in spans) + "\n")
    return tmp_path


def test_run_chunk_retrieval_scores_both_scopes(tiny_llama, tmp_path: Path) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    data = load_spans(_toy(tmp_path), "dev")
    enc = HTPEncoder(model, "vanilla-mean", tokenizer=tok, max_length=1024)
    naive = run_chunk_retrieval(enc, data, chunking="naive", chunk_tokens=16,
                                query_instruction="", show_progress_bar=False)
    assert naive.counts["n_chunks"] > 10 and naive.counts["n_queries"] == 4
    # a 16-token chunk is one line: the query's own text embeds identically and ranks first
    assert naive.scores["NDCG@10"] == pytest.approx(100.0)
    assert naive.scores["NDCG@10" + IN_DOC] == pytest.approx(100.0)
    assert naive.config["chunking"] == "naive" and naive.config["chunk_tokens"] == 16
    late = run_chunk_retrieval(enc, data, chunking="late", chunk_tokens=16, window_tokens=128,
                               query_instruction="", show_progress_bar=False,
                               checkpoint_dir=tmp_path / "ckpt")
    assert set(late.scores) == {"NDCG@10", "Recall@10", "NDCG@10" + IN_DOC,
                                "Recall@10" + IN_DOC}
    assert all(0.0 <= v <= 100.0 for v in late.scores.values())
    assert late.scores["NDCG@10" + IN_DOC] >= late.scores["NDCG@10"]
    assert late.config["window_tokens"] == 128
    again = run_chunk_retrieval(enc, data, chunking="late", chunk_tokens=16, window_tokens=128,
                                query_instruction="", show_progress_bar=False,
                                checkpoint_dir=tmp_path / "ckpt")
    assert again.cost["cached"] == 1 and again.scores == late.scores  # the embedding cache
    mix = run_chunk_retrieval(enc, data, chunking="late-mix", chunk_tokens=16, window_tokens=128,
                              query_instruction="", show_progress_bar=False)
    assert mix.cost["cached"] == 2 and mix.config["chunking"] == "late-mix"
    assert mix.scores != late.scores
    # every cost names the machine it was timed on, through the checkpoint and the cache
    here = timing_machine("cpu")
    assert late.cost["machines"] == again.cost["machines"] == mix.cost["machines"] == [here]


def test_chunk_table_gives_no_time_for_chunks_timed_on_two_machines(
        tiny_llama, tmp_path: Path) -> None:  # noqa: ANN001
    """A chunk result resumed on another machine sums two machines' seconds: the table
    prints ``n/a`` instead of that sum."""
    from htp_retrieval.eval.chunk_report import format_chunk_table
    from htp_retrieval.eval.report import read_result

    model, tok = tiny_llama
    data = load_spans(_toy(tmp_path), "dev")
    enc = HTPEncoder(model, "vanilla-mean", tokenizer=tok, max_length=1024)
    res = run_chunk_retrieval(enc, data, chunking="naive", chunk_tokens=16,
                              query_instruction="", show_progress_bar=False)
    res.config["command"] = "pytest"
    res.save(tmp_path / "one.json")
    res.cost["machines"] = ["AMD EPYC x2", timing_machine("cpu")]
    res.save(tmp_path / "two.json")
    one, two = (format_chunk_table([read_result(tmp_path / f)]).splitlines()[-1]
                for f in ("one.json", "two.json"))
    assert not one.endswith("| n/a |") and two.endswith("| n/a |")


def test_resolve_data_and_cli_know_the_span_layout(tmp_path: Path) -> None:
    root = _toy(tmp_path / "toy")
    items = resolve_data(str(root), split="dev")
    assert [(it.kind, it.split) for it in items] == [("spans", "dev")]
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    for name in ("corpus.jsonl", "queries.jsonl"):
        (beir / name).write_text((root / name).read_text())
    (beir / "qrels" / "dev.tsv").write_text((root / "qrels" / "dev.tsv").read_text())
    out = subprocess.run([sys.executable, "-m", "htp_retrieval.cli", "eval", "--data", str(beir),
                          "--split", "dev", "--chunking", "late"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "apply to evidence-span data" in out.stderr


def test_corpus_checkpoint_flags_on_span_data_say_they_are_not_used(
        tiny_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--chunk-size`` cuts a retrieval corpus into checkpoints; on evidence-span data
    (checkpointed per 8 documents) the eval says it is not used, and runs."""
    from htp_retrieval.cli import main

    root = _toy(tmp_path / "toy")
    out = tmp_path / "out"
    assert main(["eval", "--model", tiny_dir, "--data", str(root), "--split", "dev",
                 "--methods", "vanilla-mean", "--chunk-size", "10", "--quiet", "--dtype",
                 "float32", "--output", str(out)]) == 0
    assert "--chunk-size not used" in capsys.readouterr().err
    assert len(list(out.rglob("vanilla-mean__*.json"))) == 1


def _save_chunk_result(root: Path, method: str, chunking: str, corpus: float, doc: float,
                       dtype: str | None = None) -> None:
    """A chunk-level result of model ``m`` on qmsum dev under ``root``, as ``eval`` writes one."""
    from htp_retrieval.eval.retrieval import RetrievalResult

    config = {"model": "m", "method": method, "chunking": chunking, "chunk_tokens": 256,
              "chunk_overlap": 0, "window_tokens": 8064 if chunking != "naive" else None,
              "command": "htp-retrieval eval" + (f" --dtype {dtype}" if dtype else " ...")}
    if dtype:
        config["dtype"] = dtype
    RetrievalResult(
        dataset="qmsum", split="dev", config=config,
        scores={"NDCG@10": corpus, "Recall@10": 1.0, "NDCG@10" + IN_DOC: doc,
                "Recall@10" + IN_DOC: 2.0},
        cost={"seconds_per_1000_chunks": 100.0}, counts={"n_docs": 2, "n_queries": 3},
    ).save(root / "m" / "qmsum-dev" / f"{method}__chunk-{chunking}256{dtype or ''}.json")


def test_report_has_a_chunk_section(tmp_path: Path) -> None:
    from htp_retrieval.eval.report import build_report

    _save_chunk_result(tmp_path, "vanilla-mean", "naive", 10.0, 30.0)
    _save_chunk_result(tmp_path, "htp", "late", 12.5, 29.0)
    rep = build_report([tmp_path], output=tmp_path / "r.md", plots=True)
    md = rep.markdown
    assert "## Chunk-level retrieval (evidence spans)" in md
    row = next(line for line in md.splitlines() if line.startswith("| htp | late"))
    assert "| 12.50 |" in row and "| +2.50 | **-1.00** |" in row
    assert any(p.name.endswith("chunks.png") for p in rep.plots)
    assert rep.n_tables == 1 and "2 result files, 1 tables." in md


def test_chunk_tables_split_by_dtype_each_against_its_own_baseline(tmp_path: Path) -> None:
    from htp_retrieval.eval.report import build_report

    for method, dtype, corpus in (("vanilla-mean", "float32", 10.0), ("htp", "float32", 9.0),
                                  ("vanilla-mean", "bfloat16", 20.0), ("htp", "bfloat16", 23.0)):
        _save_chunk_result(tmp_path, method, "naive", corpus, 30.0, dtype=dtype)
    rep = build_report([tmp_path], output=tmp_path / "r.md", plots=True)
    sections = rep.markdown.split("### ")[1:]
    assert [s.splitlines()[0].rsplit(", ", 1)[1] for s in sections] == ["bfloat16", "float32"]
    bf16, fp32 = ([line for line in s.splitlines() if line.startswith("| htp |")][0]
                  for s in sections)
    assert "| +3.00 |" in bf16 and "| **-1.00** |" in fp32
    assert sorted(p.name for p in rep.plots if p.name.endswith("chunks.png")) == [
        "m__qmsum-dev__bfloat16__chunks.png", "m__qmsum-dev__float32__chunks.png"]


def test_needle_spans_mark_the_chunk_holding_the_needle(tiny_llama, tmp_path: Path) -> None:  # noqa: ANN001
    essays = SPANS.parents[1] / "haystack/paul_graham_essays"
    if not essays.exists():
        pytest.skip("../shared/data is not beside this checkout")
    model, tok = tiny_llama
    items = resolve_data("needle-spans", context_lengths=[512], max_docs=4, max_queries=3,
                         haystack=essays)
    assert [(it.kind, it.context_length) for it in items] == [("spans", 512)]
    data = items[0].data
    assert isinstance(data, SpanData) and len(data.queries) == 3
    enc = HTPEncoder(model, "vanilla-mean", tokenizer=tok, max_length=1024)
    from htp_retrieval.chunking import split_chunks
    from htp_retrieval.eval.chunk_eval import chunk_qrels

    chunks = {d: split_chunks(v["text"], tok, chunk_tokens=64) for d, v in data.corpus.items()}
    qrels = chunk_qrels(data, chunks)
    for q, rel in qrels.items():
        (d, s, e), = data.spans[q]
        assert rel and all(cid.startswith(d + "#c") for cid in rel)
        needle = data.corpus[d]["text"][s:e]
        assert any(needle[:20] in c.text(data.corpus[d]["text"]) for c in chunks[d]
                   if f"{d}#c{c.index}" in rel)
    res = run_chunk_retrieval(enc, data, chunking="naive", chunk_tokens=64,
                              show_progress_bar=False)
    assert res.counts["n_docs"] == 4 and 0.0 <= res.scores["NDCG@10"] <= 100.0


def test_chunk_scores_centred_with_crossfit(tiny_llama, tmp_path: Path) -> None:  # noqa: ANN001
    import numpy as np

    from htp_retrieval.chunking import split_chunks
    from htp_retrieval.eval.centred import CENTRED, centred_vectors
    from htp_retrieval.eval.chunk_eval import chunk_id, score_chunks

    model, tok = tiny_llama
    data = load_spans(_toy(tmp_path), "dev")
    enc = HTPEncoder(model, "vanilla-mean", tokenizer=tok, max_length=1024)
    res = run_chunk_retrieval(enc, data, chunking="naive", chunk_tokens=16,
                              query_instruction="Q:", show_progress_bar=False,
                              center_queries="crossfit", center_label="crossfit", seed=5)
    record = dict(res.config["centering"])
    assert set(record.pop("scale")) == {"plain", "centred"}
    assert record == {"query_sample": "crossfit", "n_sample_queries": None,
                      "n_sample_overlap_dropped": 0, "n_documents": res.counts["n_chunks"]}
    chunks = {d: split_chunks(v["text"], tok, chunk_tokens=16, chunk_overlap=0)
              for d, v in data.beir.corpus.items()}
    dids = sorted(chunks)
    cids = [chunk_id(d, c.index) for d in dids for c in chunks[d]]
    c = enc.encode([c.text(data.beir.corpus[d]["text"]) for d in dids for c in chunks[d]])
    qids = list(data.beir.queries)
    q = enc.encode([data.beir.queries[i] for i in qids], instruction="Q:")
    want, _ = score_chunks(*centred_vectors(q, c, "crossfit", seed=5), qids, cids, data,
                           chunks)
    for metric in ("NDCG@10", "NDCG@10" + IN_DOC):
        assert res.scores[metric + CENTRED] == pytest.approx(want[metric], abs=1e-6)
    assert np.isfinite(list(res.scores.values())).all()
