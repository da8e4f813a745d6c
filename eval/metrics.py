"""IR metrics through pytrec_eval (no hand-written NDCG)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

DEFAULT_METRICS = ("ndcg_cut_10", "recall_100", "map_cut_10", "recip_rank")
LABELS = {"ndcg_cut_10": "NDCG@10", "recall_100": "Recall@100", "map_cut_10": "MAP@10",
          "recip_rank": "MRR"}


def evaluate_run(
    qrels: Mapping[str, Mapping[str, int]],
    run: Mapping[str, Mapping[str, float]],
    *,
    metrics: Iterable[str] = DEFAULT_METRICS,
    ignore_identical_ids: bool = True,
) -> dict[str, float]:
    """Score a run with pytrec_eval, averaged over queries, in percent (0-100).

    Args:
        qrels: ``query_id -> {doc_id: relevance}``; every relevant document counts.
        run: ``query_id -> {doc_id: score}``.
        metrics: pytrec_eval measure names (``ndcg_cut_10``, ``recall_100``, ...).
        ignore_identical_ids: Drop a retrieved document whose id equals the query id, as
            BEIR's ``EvaluateRetrieval`` does (ArguAna/Quora style self-matches).

    Returns:
        ``{label: value}`` with labels such as ``"NDCG@10"``; queries missing from the run
        score 0, as in BEIR.

    Raises:
        ImportError: if pytrec_eval is missing.
    """
    try:
        import pytrec_eval
    except ImportError as e:  # pragma: no cover
        raise ImportError("pip install pytrec-eval-terrier (htp-retrieval[eval])") from e
    metrics = list(metrics)
    if ignore_identical_ids:
        run = {q: {d: s for d, s in docs.items() if d != q} for q, docs in run.items()}
    qrels_ = {q: {d: int(r) for d, r in docs.items()} for q, docs in qrels.items()}
    run_ = {q: {d: float(s) for d, s in docs.items()} for q, docs in run.items() if q in qrels_}
    evaluator = pytrec_eval.RelevanceEvaluator(qrels_, set(metrics))
    per_query = evaluator.evaluate(run_)
    n = len(qrels_)
    out = {}
    for m in metrics:
        total = sum(per_query.get(q, {}).get(m, 0.0) for q in qrels_)
        out[LABELS.get(m, m)] = 100.0 * total / n if n else 0.0
    return out
