"""BEIR loading (real SciFact) and pytrec_eval scoring rules."""

from __future__ import annotations

import os

import pytest

from htp_retrieval.eval.data import load_beir, subsample
from htp_retrieval.eval.metrics import evaluate_run

SCIFACT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "beir", "scifact"))

pytestmark = pytest.mark.skipif(not os.path.isdir(SCIFACT), reason="../shared/data missing")


def test_scifact_counts_match_beir() -> None:
    test = load_beir(SCIFACT, "test")
    assert len(test.corpus) == 5183
    assert len(test.queries) == 300
    assert sum(len(r) for r in test.qrels.values()) == 339  # every relevant doc kept
    train = load_beir(SCIFACT, "train")
    assert len(train.queries) == 809 and sum(len(r) for r in train.qrels.values()) == 919
    assert not set(train.queries) & set(test.queries)


def test_subsample_keeps_all_relevant_docs() -> None:
    data = subsample(load_beir(SCIFACT, "test"), n_queries=30, n_docs=200, seed=0)
    assert len(data.queries) == 30 and len(data.corpus) == 200
    for rel in data.qrels.values():
        assert set(rel) <= set(data.corpus)
    again = subsample(load_beir(SCIFACT, "test"), n_queries=30, n_docs=200, seed=0)
    assert list(again.corpus) == list(data.corpus)


def test_all_relevant_documents_count() -> None:
    qrels = {"q1": {"a": 1, "b": 1}}
    only_a = evaluate_run(qrels, {"q1": {"a": 0.9, "x": 0.8, "y": 0.7}})
    both = evaluate_run(qrels, {"q1": {"a": 0.9, "b": 0.8, "y": 0.7}})
    assert both["NDCG@10"] == pytest.approx(100.0)
    assert only_a["NDCG@10"] < both["NDCG@10"]
    assert only_a["Recall@100"] == pytest.approx(50.0)


def test_identical_ids_are_ignored_as_beir_does() -> None:
    qrels = {"q1": {"d1": 1}}
    run = {"q1": {"q1": 0.99, "d1": 0.5}}
    assert evaluate_run(qrels, run)["NDCG@10"] == pytest.approx(100.0)
    assert evaluate_run(qrels, run, ignore_identical_ids=False)["NDCG@10"] < 100.0


def test_missing_queries_score_zero() -> None:
    qrels = {"q1": {"d1": 1}, "q2": {"d2": 1}}
    assert evaluate_run(qrels, {"q1": {"d1": 1.0}})["NDCG@10"] == pytest.approx(50.0)


def test_no_queries_scores_zero_and_rows_average_to_scores() -> None:
    from htp_retrieval.eval.metrics import evaluate_per_query, mean_scores

    assert evaluate_run({}, {})["NDCG@10"] == 0.0
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}}
    run = {"q1": {"a": 0.9, "b": 0.1}, "q2": {"a": 0.9, "b": 0.1}}
    rows = evaluate_per_query(qrels, run)
    assert rows["q1"]["NDCG@10"] == pytest.approx(100.0) and rows["q2"]["MRR"] == 50.0
    assert mean_scores(rows) == pytest.approx(evaluate_run(qrels, run))
