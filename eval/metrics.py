"""IR metrics through pytrec_eval (no hand-written NDCG)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

DEFAULT_METRICS = ("ndcg_cut_10", "recall_100", "map_cut_10", "recip_rank")
LABELS = {"ndcg_cut_10": "NDCG@10", "recall_100": "Recall@100", "map_cut_10": "MAP@10",
          "recip_rank": "MRR", "P_1": "Acc@1", "recall_10": "Recall@10"}
"""pytrec_eval measure -> label in results (``P_1``, precision at 1, is top-1 accuracy)."""


def evaluate_per_query(
    qrels: Mapping[str, Mapping[str, int]],
    run: Mapping[str, Mapping[str, float]],
    *,
    metrics: Iterable[str] = DEFAULT_METRICS,
    ignore_identical_ids: bool = True,
) -> dict[str, dict[str, float]]:
    """Score a run with pytrec_eval, one row per query, in percent (0-100).

    Args:
        qrels: ``query_id -> {doc_id: relevance}``; every relevant document counts.
        run: ``query_id -> {doc_id: score}``.
        metrics: pytrec_eval measure names (``ndcg_cut_10``, ``recall_100``, ...).
        ignore_identical_ids: Drop a retrieved document whose id equals the query id, as
            BEIR's ``EvaluateRetrieval`` does (ArguAna/Quora style self-matches).

    Returns:
        ``{query_id: {label: value}}`` for every query in ``qrels`` (labels such as
        ``"NDCG@10"``); a query missing from the run scores 0 on every metric, as in BEIR.

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
    raw = evaluator.evaluate(run_)
    return {q: {LABELS.get(m, m): 100.0 * raw.get(q, {}).get(m, 0.0) for m in metrics}
            for q in qrels_}


def mean_scores(
    per_query: Mapping[str, Mapping[str, float]], *, metrics: Iterable[str] = DEFAULT_METRICS
) -> dict[str, float]:
    """Average :func:`evaluate_per_query` rows over queries.

    Args:
        per_query: ``{query_id: {label: value}}``.
        metrics: pytrec_eval names whose labels are returned as 0 when there are no rows
            (no queries in the qrels), as BEIR reports an empty split.

    Returns:
        ``{label: mean}`` in percent.
    """
    if not per_query:
        return {LABELS.get(m, m): 0.0 for m in metrics}
    labels = next(iter(per_query.values())).keys()
    n = len(per_query)
    return {m: sum(row[m] for row in per_query.values()) / n for m in labels}


def evaluate_run(
    qrels: Mapping[str, Mapping[str, int]],
    run: Mapping[str, Mapping[str, float]],
    *,
    metrics: Iterable[str] = DEFAULT_METRICS,
    ignore_identical_ids: bool = True,
) -> dict[str, float]:
    """Score a run with pytrec_eval, averaged over queries, in percent (0-100).

    Same arguments as :func:`evaluate_per_query`, whose rows it averages.

    Returns:
        ``{label: value}`` with labels such as ``"NDCG@10"``; queries missing from the run
        score 0, as in BEIR. With no queries in ``qrels`` every metric is 0.

    Raises:
        ImportError: if pytrec_eval is missing.
    """
    metrics = list(metrics)
    rows = evaluate_per_query(qrels, run, metrics=metrics,
                              ignore_identical_ids=ignore_identical_ids)
    return mean_scores(rows, metrics=metrics)
