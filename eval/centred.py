"""Centred scores beside plain ones in the harness (``htp-retrieval eval --center-queries``).

Every retrieval result can carry a second set of scores, named with the
:data:`CENTRED` suffix (``NDCG@10 centred``, ``NDCG@10 in-doc centred``), computed from the
same vectors after :class:`~htp_retrieval.centering.Centering`: documents (or chunks) on the
evaluated corpus's mean, queries on the mean of a query sample a deployment could have:

* ``DIR:SPLIT``: the queries of another split of a BEIR-format dataset (e.g.
  ``../shared/data/beir/scifact:train`` for SciFact test): never the evaluated queries (an
  overlap is an error);
* a file: one query per line, or a BEIR ``queries.jsonl``;
* ``crossfit``: the evaluated queries in two seeded halves, each centred on the mean of the
  other half: never a query's own statistic, but statistics of the evaluated split; use it
  on development splits (the QMSum evidence spans are one), and say so where it is used on
  a test split.

Why and the measured effect: docs/RAG.md (section "Centring").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from htp_retrieval.centering import Centering, read_query_file
from htp_retrieval.eval.retrieval import unit_rows

CENTRED = " centred"
"""Suffix of the centred scores' names."""
CROSSFIT = "crossfit"


def read_query_sample(spec: str) -> tuple[list[str] | str, str]:
    """The query sample named by a ``--center-queries`` value, and a short label for result
    names (``crossfit``, ``<dataset>-<split>``, ``<file stem>``).

    Returns:
        ``(texts or "crossfit", label)``.

    Raises:
        FileNotFoundError: if the file or dataset split does not exist.
        ValueError: if it holds no query.
    """
    if spec == CROSSFIT:
        return CROSSFIT, CROSSFIT
    beir = _beir_split(spec)
    if beir is not None:
        from htp_retrieval.eval.data import load_beir

        data = load_beir(*beir)
        if not data.queries:
            raise ValueError(f"--center-queries {spec}: the {beir[1]} split has no query")
        return list(data.queries.values()), sample_label(spec)
    return read_query_file(spec), sample_label(spec)


def sample_label(spec: str) -> str:
    """The label :func:`read_query_sample` gives ``spec``, without reading it."""
    if spec == CROSSFIT:
        return CROSSFIT
    beir = _beir_split(spec)
    return f"{Path(beir[0]).resolve().name}-{beir[1]}" if beir else Path(spec).stem


def _beir_split(spec: str) -> tuple[str, str] | None:
    """``(folder, split)`` of a ``DIR:SPLIT`` spec whose folder exists, else ``None``."""
    path, _, split = spec.rpartition(":")
    return (path, split) if path and split and Path(path).is_dir() else None


def centred_vectors(q_emb: np.ndarray, d_emb: np.ndarray, sample: np.ndarray | str, *,
                    seed: int = 0, folds: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Queries and documents centred for scoring.

    Args:
        q_emb: ``[n_queries, hidden]`` evaluated query vectors.
        d_emb: ``[n_docs, hidden]`` document (or chunk) vectors of the evaluated corpus.
        sample: ``[n_sample, hidden]`` vectors of the query sample, or ``"crossfit"``.
        seed: Seed of the cross-fitting halves.
        folds: Cross-fitting folds.

    Returns:
        ``(queries, documents)``, unit rows.

    Raises:
        ValueError: for cross-fitting with fewer queries than folds.
    """
    if isinstance(sample, str):
        if sample != CROSSFIT:
            raise ValueError(f"unknown query sample {sample!r}")
        if len(q_emb) < folds:
            raise ValueError(f"cross-fitting needs at least {folds} queries, got {len(q_emb)}")
        fold = np.random.default_rng(seed).permutation(len(q_emb)) % folds
        cen = Centering.fit(d_emb, q_emb)
        q = np.empty_like(cen.apply(q_emb, "query"))
        for f in range(folds):
            q[fold == f] = cen.with_queries(q_emb[fold != f]).apply(q_emb[fold == f], "query")
        return q, cen.apply(d_emb, "document")
    cen = Centering.fit(d_emb, sample)
    return cen.apply(q_emb, "query"), cen.apply(d_emb, "document")


def embed_sample(encoder: Any, sample: Sequence[str] | str, *, instruction: str | None,
                 evaluated: Sequence[str], show_progress_bar: bool = False
                 ) -> np.ndarray | str:
    """Query-sample vectors through the query path (``"crossfit"`` is passed through).

    Raises:
        ValueError: if the sample holds any evaluated query (by text): it would centre a
            query on its own statistic.
    """
    if isinstance(sample, str):
        return sample
    overlap = set(sample) & set(evaluated)
    if overlap:
        raise ValueError(f"the --center-queries sample holds {len(overlap)} of the evaluated "
                         "queries: take it from another split (e.g. DIR:train), or use "
                         "'crossfit'")
    return encoder.encode(list(sample), instruction=instruction,
                          show_progress_bar=show_progress_bar)


def add_centred(scores: dict[str, float], per_query: dict[str, dict[str, float]],
                c_scores: Mapping[str, float],
                c_per_query: Mapping[str, Mapping[str, float]]) -> None:
    """Merge centred scores (and per-query values) into the plain ones with the
    :data:`CENTRED` suffix."""
    scores.update({k + CENTRED: v for k, v in c_scores.items()})
    for q, vals in c_per_query.items():
        per_query.setdefault(q, {}).update({k + CENTRED: v for k, v in vals.items()})


def cosine_scale(q: np.ndarray, c: np.ndarray, qids: Sequence[str], dids: Sequence[str],
                 qrels: Mapping[str, Mapping[str, int]]) -> dict[str, float]:
    """What a cosine score means on a task: over every (query, document) pair of ``q``
    (``[n_queries, hidden]``) and ``c`` (``[n_docs, hidden]``), the mean cosine of relevant
    pairs (``qrels`` grade > 0), of the other pairs, and the other pairs' 50th/95th/99th
    percentiles; ``rel_above_p99``: the share of relevant pairs above that 99th percentile
    (a fraction)."""
    sims = unit_rows(q) @ unit_rows(c).T
    col = {d: j for j, d in enumerate(dids)}
    rel = np.zeros_like(sims, dtype=bool)
    for i, qid in enumerate(qids):
        for d, grade in qrels.get(qid, {}).items():
            if grade > 0 and d in col:
                rel[i, col[d]] = True
    other = sims[~rel]
    p50, p95, p99 = (float(np.percentile(other, p)) for p in (50, 95, 99))
    return {"relevant_mean": float(sims[rel].mean()), "other_mean": float(other.mean()),
            "other_p50": p50, "other_p95": p95, "other_p99": p99,
            "rel_above_p99": float((sims[rel] > p99).mean())}


def score_centred(
    encoder: Any, center_queries: Sequence[str] | str, q_emb: np.ndarray, d_emb: np.ndarray,
    score: Callable[[np.ndarray, np.ndarray], tuple[dict[str, float],
                                                    dict[str, dict[str, float]]]],
    *, instruction: str | None, evaluated: Sequence[str], label: str, seed: int,
    scores: dict[str, float], per_query: dict[str, dict[str, float]],
    qrels: Mapping[str, Mapping[str, int]] | None = None,
    ids: tuple[Sequence[str], Sequence[str]] | None = None,
    show_progress_bar: bool = False,
) -> dict[str, Any]:
    """Score centred vectors and add the scores beside the plain ones.

    Args:
        encoder: Embeds the query sample (the query encoder).
        center_queries: Query-sample texts or ``"crossfit"``.
        q_emb: ``[n_queries, hidden]`` evaluated query vectors.
        d_emb: ``[n_docs, hidden]`` document (or chunk) vectors.
        score: ``(queries, documents) -> (scores, per_query)``, the plain scoring.
        instruction: Query instruction (the sample is embedded with it).
        evaluated: The evaluated query texts (the sample must not hold any).
        label: Name of the sample, recorded.
        seed: Seed of the cross-fitting halves.
        scores, per_query: The plain scores, updated in place (:func:`add_centred`).
        qrels: With ``ids`` (``(query ids, document ids)``, the rows' order), the record
            also holds the cosine scale of both vector sets (:func:`cosine_scale`,
            ``scale: {"plain", "centred"}``).
        ids: See ``qrels``.
        show_progress_bar: tqdm bar while embedding the sample.

    Returns:
        The ``config["centering"]`` record: ``query_sample`` (label), ``n_sample_queries``
        (``None`` for cross-fitting), ``n_documents``, and ``scale`` with ``qrels``.

    Raises:
        ValueError: as :func:`embed_sample` and :func:`centred_vectors`.
    """
    sample = embed_sample(encoder, center_queries, instruction=instruction,
                          evaluated=evaluated, show_progress_bar=show_progress_bar)
    qc, dc = centred_vectors(q_emb, d_emb, sample, seed=seed)
    add_centred(scores, per_query, *score(qc, dc))
    record: dict[str, Any] = {
        "query_sample": label,
        "n_sample_queries": None if isinstance(sample, str) else int(len(sample)),
        "n_documents": int(len(d_emb))}
    if qrels is not None and ids is not None:
        record["scale"] = {"plain": cosine_scale(q_emb, d_emb, *ids, qrels),
                           "centred": cosine_scale(qc, dc, *ids, qrels)}
    return record


__all__ = ["CENTRED", "CROSSFIT", "read_query_sample", "sample_label", "cosine_scale", "centred_vectors", "embed_sample",
           "add_centred", "score_centred"]
