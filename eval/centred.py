"""Centred scores beside plain ones in the harness (``htp-retrieval eval --center-queries``).

Every retrieval result can carry a second set of scores, named with the
:data:`CENTRED` suffix (``NDCG@10 centred``, ``NDCG@10 in-doc centred``), computed from the
same vectors after :class:`~htp_retrieval.centering.Centering`: documents (or chunks) on the
evaluated corpus's mean, queries on the mean of a query sample a deployment could have:

* ``DIR:SPLIT``: the queries of another split of a BEIR-format dataset (e.g.
  ``../shared/data/beir/scifact:train`` for SciFact test): never the evaluated queries (a
  sample text equal to an evaluated query is left out of the sample, with a warning, and
  counted in the result's ``n_sample_overlap_dropped``; SciFact train repeats two test
  claims);
* a file: one query per line, or a BEIR ``queries.jsonl``;
* ``crossfit``: the evaluated queries in two seeded halves, each centred on the mean of the
  other half: never a query's own statistic, but statistics of the evaluated split; use it
  on development splits (the QMSum evidence spans are one), and say so where it is used on
  a test split.

STS pairs have no query side: both sentences are centred on one mean
(:func:`score_sts_centred`), of an STS split's sentences (``../shared/data/sts/stsb:dev``
for STS-B test), of a file of sentences, or (``crossfit``) of the other half of the
evaluated pairs.

Why and the measured effect: docs/RAG.md (section "Centring").
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from htp_retrieval.centering import Centering, read_query_file
from htp_retrieval.eval.retrieval import unit_rows
from htp_retrieval.eval.sts import bootstrap_spearman_delta, load_sts, spearman_percent, sts_file

CENTRED = " centred"
"""Suffix of the centred scores' names."""
CROSSFIT = "crossfit"


def read_query_sample(spec: str) -> tuple[list[str] | str, str]:
    """The query sample named by a ``--center-queries`` value, and a short label for result
    names (``crossfit``, ``<dataset>-<split>``, ``<file stem>``). The sample of an STS
    split (``DIR:SPLIT`` of a folder of STS jsonl files) is its distinct sentences.

    Returns:
        ``(texts or "crossfit", label)``.

    Raises:
        FileNotFoundError: if the file or dataset split does not exist.
        ValueError: if it holds no query.
    """
    if spec == CROSSFIT:
        return CROSSFIT, CROSSFIT
    beir = _beir_split(spec)
    if beir is not None and sts_file(*beir) is not None:
        sts = load_sts(beir[0], split=beir[1])
        return list(dict.fromkeys(sts.sentence1 + sts.sentence2)), sample_label(spec)
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


def evaluated_texts(data: Any) -> list[str]:
    """The texts a centring sample must not consist of, for one evaluated split: the
    queries of a BEIR split or of an evidence-span split, the sentences of an STS split
    (``[]`` for anything else, e.g. a synthetic task generated later)."""
    from htp_retrieval.eval.data import BeirData
    from htp_retrieval.eval.sts import StsData

    beir = getattr(data, "beir", data)
    if isinstance(beir, BeirData):
        return list(beir.queries.values())
    if isinstance(data, StsData):
        return [*data.sentence1, *data.sentence2]
    return []


def check_sample(sample: Sequence[str] | str, evaluated: Sequence[str], *, spec: str,
                 split: str) -> None:
    """Fail before any encoding where a ``--center-queries`` sample holds only evaluated
    texts (it would leave nothing to centre on; see :func:`embed_sample`).

    Raises:
        ValueError: naming ``spec`` and the evaluated ``split``.
    """
    if isinstance(sample, str) or not evaluated:
        return
    if set(sample) <= set(evaluated):
        raise ValueError(f"{spec} holds only texts of the evaluated {split} split: take the "
                         "sample from another split (e.g. DIR:train), or use 'crossfit'")


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
                 ) -> tuple[np.ndarray | str, int]:
    """Query-sample vectors through the query path (``"crossfit"`` is passed through).

    A sample text equal to an evaluated query is left out (it would centre that query on
    its own statistic), with a :class:`UserWarning` naming how many.

    Returns:
        ``(vectors [n_kept, hidden] or "crossfit", n_dropped)``.

    Raises:
        ValueError: if the sample holds only evaluated queries.
    """
    if isinstance(sample, str):
        return sample, 0
    evaluated_set = set(evaluated)
    kept = [t for t in sample if t not in evaluated_set]
    dropped = len(sample) - len(kept)
    if not kept:
        raise ValueError("the --center-queries sample holds only evaluated queries: take it "
                         "from another split (e.g. DIR:train), or use 'crossfit'")
    if dropped:
        warnings.warn(f"the --center-queries sample holds {dropped} of the evaluated queries: "
                      f"they are left out of it ({len(kept)} of {len(sample)} sample queries "
                      "used)", UserWarning, stacklevel=2)
    return encoder.encode(kept, instruction=instruction,
                          show_progress_bar=show_progress_bar), dropped


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
        evaluated: The evaluated query texts (left out of the sample).
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
        (the sample queries used; ``None`` for cross-fitting), ``n_sample_overlap_dropped``
        (sample texts left out as evaluated queries), ``n_documents``, and ``scale`` with
        ``qrels``.

    Raises:
        ValueError: as :func:`embed_sample` and :func:`centred_vectors`.
    """
    sample, dropped = embed_sample(encoder, center_queries, instruction=instruction,
                                   evaluated=evaluated, show_progress_bar=show_progress_bar)
    qc, dc = centred_vectors(q_emb, d_emb, sample, seed=seed)
    add_centred(scores, per_query, *score(qc, dc))
    record: dict[str, Any] = {
        "query_sample": label,
        "n_sample_queries": None if isinstance(sample, str) else int(len(sample)),
        "n_sample_overlap_dropped": dropped,
        "n_documents": int(len(d_emb))}
    if qrels is not None and ids is not None:
        record["scale"] = {"plain": cosine_scale(q_emb, d_emb, *ids, qrels),
                           "centred": cosine_scale(qc, dc, *ids, qrels)}
    return record


def sts_cosine_scale(cos: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    """What a cosine score means on STS: the mean cosine of similar pairs (gold >= 4 on
    STS-B's 0-5 scale), of unrelated pairs (gold <= 1) and of all pairs."""
    out = {"all_mean": float(cos.mean())}
    for name, mask in (("similar_mean", gold >= 4.0), ("unrelated_mean", gold <= 1.0)):
        out[name] = float(cos[mask].mean()) if mask.any() else float("nan")
    return out


def score_sts_centred(
    encoder: Any, sample: Sequence[str] | str, sentences: Sequence[str], emb: np.ndarray,
    pairs: np.ndarray, gold: np.ndarray, *, instruction: str | None, label: str, seed: int,
    show_progress_bar: bool = False,
) -> tuple[dict[str, float], dict[str, Any], np.ndarray]:
    """STS scores with both sentences of every pair centred on one mean.

    The mean is that of the sample's unit vectors (embedded as the evaluated sentences,
    with ``instruction``), or with ``"crossfit"`` of the distinct sentences of the other
    seeded half of the pairs, leaving out any sentence that also occurs in the scored half
    (a sentence is never centred on a mean that holds it). Sample sentences that are also
    evaluated sentences are left out of the sample (counted in the record).

    Args:
        encoder: Embeds the sample (the evaluated sentences' encoder).
        sample: Sample sentences, or ``"crossfit"``.
        sentences: ``[n_sentences]`` the evaluated distinct sentences (rows of ``emb``).
        emb: ``[n_sentences, hidden]`` their vectors.
        pairs: ``[n_pairs, 2]`` row indices into ``emb`` of each pair's two sentences.
        gold: ``[n_pairs]`` gold scores.
        instruction: Instruction of the evaluated sentences (none for STS).
        label: Name of the sample, recorded.
        seed: Seed of the cross-fitting halves.
        show_progress_bar: tqdm bar while embedding the sample.

    Returns:
        ``(scores, record, cosines)``: ``Spearman centred`` and ``Pearson centred`` (x100),
        the ``config["centering"]`` record: ``sentence_sample`` (label), ``n_sample_sentences``
        (``None`` for cross-fitting), ``n_sample_overlap_dropped``, ``scale``
        (:func:`sts_cosine_scale`, plain and centred) and ``spearman_delta_ci95``, the 95%
        bootstrap interval of the Spearman gain over resampled pairs; and the centred cosine
        of every pair, ``[n_pairs]``.

    Raises:
        ValueError: for an unknown sample string, cross-fitting with fewer than two pairs, or
            a sample left empty once evaluated sentences are taken out.
    """
    from scipy.stats import pearsonr

    u = unit_rows(emb)
    record: dict[str, Any] = {"sentence_sample": label, "n_sample_sentences": None,
                              "n_sample_overlap_dropped": 0}
    cos_c = np.empty(len(pairs))
    if isinstance(sample, str):
        if sample != CROSSFIT:
            raise ValueError(f"unknown sentence sample {sample!r}")
        if len(pairs) < 2:
            raise ValueError(f"cross-fitting needs at least 2 pairs, got {len(pairs)}")
        fold = np.random.default_rng(seed).permutation(len(pairs)) % 2
        for f in range(2):
            scored = pairs[fold == f]
            other = np.setdiff1d(np.unique(pairs[fold != f]), np.unique(scored))
            if not len(other):
                raise ValueError("cross-fitting: one half of the pairs shares every sentence "
                                 "with the other")
            cen = Centering.fit(u[other], u[other])
            x, y = cen.apply(u[scored[:, 0]], "document"), cen.apply(u[scored[:, 1]], "document")
            cos_c[fold == f] = (x * y).sum(axis=1)
    else:
        evaluated = set(sentences)
        kept = [s for s in sample if s not in evaluated]
        record["n_sample_overlap_dropped"] = len(sample) - len(kept)
        if not kept:
            raise ValueError(f"the sentence sample {label!r} holds only evaluated sentences")
        if len(kept) < len(sample):
            warnings.warn(f"the sentence sample {label!r} holds "
                          f"{len(sample) - len(kept)} of the evaluated sentences: they are "
                          f"left out of it ({len(kept)} of {len(sample)} used)", UserWarning,
                          stacklevel=2)
        s_emb = encoder.encode(kept, instruction=instruction,
                               show_progress_bar=show_progress_bar)
        record["n_sample_sentences"] = len(kept)
        centred = Centering.fit(s_emb, s_emb).apply(u, "document")
        cos_c = (centred[pairs[:, 0]] * centred[pairs[:, 1]]).sum(axis=1)
    cos = (u[pairs[:, 0]] * u[pairs[:, 1]]).sum(axis=1)
    lo, hi, _ = bootstrap_spearman_delta(cos, cos_c, gold, seed=seed, n_resamples=1000)
    record["spearman_delta_ci95"] = [lo, hi]
    scores = {"Spearman" + CENTRED: spearman_percent(cos_c, gold),
              "Pearson" + CENTRED: float(100.0 * pearsonr(cos_c.astype(np.float64),
                                                          gold).statistic)}
    record["scale"] = {"plain": sts_cosine_scale(cos, gold),
                       "centred": sts_cosine_scale(cos_c, gold)}
    return scores, record, cos_c


__all__ = ["CENTRED", "CROSSFIT", "read_query_sample", "sample_label", "cosine_scale",
           "centred_vectors", "embed_sample", "add_centred", "score_centred",
           "score_sts_centred", "sts_cosine_scale"]
