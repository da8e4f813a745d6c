"""Hub documents (``python -m research hubs``): the report on constructed embeddings, and
the command on a generated needle task with a tiny model, sharing ``ablate``'s corpus."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from research.hubs import hub_report, hub_table

HAYSTACK = os.path.abspath(os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "shared", "data", "haystack",
    "paul_graham_essays"))


def _near_parallel(seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[str], list[str], dict]:
    """6 documents along one shared direction, each with a small own direction; 4 queries,
    query i relevant to document i, all queries sharing a component that document 5 has
    more of than the others (a hub)."""
    rng = np.random.default_rng(seed)
    dim = 32
    shared, query_common = np.zeros(dim), np.zeros(dim)
    shared[0], query_common[1] = 1.0, 1.0
    own = np.eye(dim)[2:8]  # one own direction per document
    d = 20.0 * shared + own + rng.normal(0, 0.01, (6, dim))
    d[5] += 0.6 * query_common  # the hub leans towards what every query shares
    q = 20.0 * shared + 3.0 * query_common + 0.5 * own[:4] + rng.normal(0, 0.01, (4, dim))
    dids = [f"d{i}" for i in range(6)]
    qids = [f"q{i}" for i in range(4)]
    qrels = {f"q{i}": {f"d{i}": 1} for i in range(4)}
    return q, d, qids, dids, qrels


def test_hub_report_finds_the_hub_and_centring_removes_it() -> None:
    q, d, qids, dids, qrels = _near_parallel()
    meta = {"d5": {"depth": 0.0, "char_offset": 0, "needle": "left out"}}
    r = hub_report(q, d, qids, dids, qrels, doc_meta=meta)
    assert r["doc_cosine_mean"] > 0.99  # nearly parallel
    assert r["rank1_docs"] == 1 and r["hubs"][0]["doc_id"] == "d5"
    hub = r["hubs"][0]
    assert hub["rank1_queries"] == 4 and hub["relevant_for"] == 0
    assert hub["rank1_query_ids"] == qids
    assert hub["farthest_rank"] == 1  # the document farthest from the corpus mean
    assert hub["cos_to_mean"] < r["cos_to_mean_median"]
    assert hub["char_offset"] == 0 and "needle" not in hub  # metadata, not the sentence
    assert r["scores"]["Acc@1"] == 0.0
    # each side minus its own mean: the shared directions go, each query finds its document
    assert r["scores_centered"]["Acc@1"] == 100.0 and r["rank1_docs_centered"] == 4
    assert r["scores_centered"]["NDCG@10"] > r["scores"]["NDCG@10"]
    table = hub_table([("variant-a", r)])
    assert "| variant-a | " in table and "d5: 4 of 4, 1 of 6" in table and "char_offset 0" in table


def test_hub_report_rejects_bad_shapes() -> None:
    q, d, qids, dids, qrels = _near_parallel()
    with pytest.raises(ValueError, match="3 query ids for 4 query embeddings"):
        hub_report(q, d, qids[:3], dids, qrels)
    with pytest.raises(ValueError, match="one hidden size"):
        hub_report(q[:, :8], d, qids, dids, qrels)
    with pytest.raises(ValueError, match="at least 2 documents"):
        hub_report(q, d[:1], qids, dids[:1], qrels)


@pytest.mark.skipif(not os.path.isdir(HAYSTACK), reason="essays missing")
def test_hubs_command_reuses_the_ablate_corpus(tiny_llama, tmp_path, capsys,  # noqa: ANN001
                                               monkeypatch) -> None:  # noqa: ANN001
    """``hubs`` after ``ablate`` on the same data: the corpus checkpoint is
    reused (not wiped), the scores agree, and a JSON per variant records the report."""
    from research.__main__ import main

    model, tok = tiny_llama
    mdir = tmp_path / "tiny"
    model.save_pretrained(mdir)
    tok.save_pretrained(mdir)
    out = tmp_path / "analysis"
    base = ["--model", str(mdir), "--data", "needle:64", "--seed", "2", "--max-docs", "6",
            "--max-queries", "4", "--quiet", "--output", str(out),
            "--variant", "vanilla:method=vanilla-mean", "--variant", "htp:method=htp",
            "--variant", "htp-q3:method=htp,query_tp_start=3"]
    assert main(["ablate", *base]) == 0
    folder = next(out.glob("*/needle-64-seed2-q4d6"))
    chunks = {p: p.stat().st_mtime_ns for p in folder.glob("corpus.partial/*/chunk_*.npz")}
    assert len(chunks) == 2  # htp-q3 differs on the query side only: htp's corpus
    capsys.readouterr()
    monkeypatch.setattr("sys.argv", ["research", "hubs", *base])
    assert main(["hubs", *base]) == 0
    table = capsys.readouterr().out
    assert "| vanilla | " in table and "| htp | " in table
    assert {p: p.stat().st_mtime_ns for p in folder.glob("corpus.partial/*/chunk_*.npz")} == chunks
    for name in ("vanilla", "htp", "htp-q3"):
        rec = json.loads((folder / "hubs" / f"{name}.json").read_text())
        ablated = json.loads((folder / f"{name}.json").read_text())
        assert rec["scores"]["NDCG@10"] == pytest.approx(ablated["scores"]["NDCG@10"])
        assert rec["rank1_docs"] == ablated["counts"]["rank1_docs"]
        assert rec["n_docs"] == 6 and rec["n_queries"] == 4
        assert 0.0 <= rec["scores_centered"]["NDCG@10"] <= 100.0
        assert {"depth", "char_offset"} <= set(rec["hubs"][0])  # the generator's metadata
        assert rec["config"]["method"] == ablated["config"]["method"]
        assert rec["command"].startswith("python -m research hubs")
    q3 = json.loads((folder / "hubs" / "htp-q3.json").read_text())
    assert q3["config"]["query_config"]["tp_start"] == 3 and q3["config"]["tp_start"] != 3
