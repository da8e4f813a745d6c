"""Paired per-query comparison of results on the same queries, and splits by a query fact.

``python -m research paired BASE.json OTHER.json ...`` reads the per-query rows that
:func:`~htp_retrieval.eval.retrieval.run_retrieval` stores (``per_query``) and answers two
questions an average cannot:

* Is a difference larger than the query-to-query noise? The mean paired difference with
  a 95% bootstrap interval over queries (``scipy.stats.bootstrap``), wins/losses/ties,
  and the two-sided Wilcoxon signed-rank p-value (``scipy.stats.wilcoxon``).
* Where does it come from? Scores split into bins of a per-query fact from
  ``query_meta``, e.g. where the needle sits in its document (``position``, 0..1) for
  needle and passkey results.

STS results have no per-query rows; ``--metric Spearman`` (or ``"Spearman centred"``)
compares them pair by pair instead, from the per-pair cosines that
:func:`~htp_retrieval.eval.sts.run_sts` stores (``per_pair``): the Spearman difference with
a 95% bootstrap interval over resampled sentence pairs.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from htp_retrieval.eval.retrieval import RetrievalResult

AXIS_LABELS = {
    "position": "where the needle/key starts (fraction of the document)",
    "depth": "seeded needle/key depth (0..1)",
    "n_tokens": "document length (tokens)",
}


@dataclass
class PairedComparison:
    """One variant against the baseline on the queries both were scored on.

    Attributes:
        variant: The variant's label.
        metric: Metric label (``NDCG@10``, ``Acc@1``, ...), values in percent.
        n: Number of queries.
        baseline_mean: Mean of the baseline over the queries.
        variant_mean: Mean of the variant over the queries.
        mean_diff: ``variant - baseline``, averaged over queries (points).
        ci_low: Lower end of the 95% percentile bootstrap interval of ``mean_diff``.
        ci_high: Upper end of that interval.
        wins: Queries where the variant does better (higher score, or lower ``rank``).
        losses: Queries where it does worse.
        ties: Queries with equal scores.
        p_value: Two-sided Wilcoxon signed-rank p-value; ``None`` when every query ties.
    """

    variant: str
    metric: str
    n: int
    baseline_mean: float
    variant_mean: float
    mean_diff: float
    ci_low: float
    ci_high: float
    wins: int
    losses: int
    ties: int
    p_value: float | None


def load_per_query(path: str | Path) -> RetrievalResult:
    """Read a results JSON that has per-query rows.

    Args:
        path: A file written by ``htp-retrieval eval`` or ``python -m research ablate``.

    Returns:
        The :class:`~htp_retrieval.eval.retrieval.RetrievalResult`.

    Raises:
        FileNotFoundError: if the file is missing.
        ValueError: if it has no per-query rows (an STS result, or one written before they
            were recorded; the message names the file and what to do instead).
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such results file")
    res = RetrievalResult.load(p)
    if not res.per_query:
        if "Spearman" in res.scores:
            raise ValueError(f"{p}: an STS result has no per-query scores (Spearman is one "
                             "number over all pairs); compare STS results pair by pair "
                             "with --metric Spearman")
        raise ValueError(f"{p}: no per-query scores (written before they were recorded); "
                         "rerun its command with --overwrite")
    return res


RANK = "rank"
"""Pseudo-metric: rank of the first relevant document, ``100 / MRR`` (lower is better)."""


def _column(res: RetrievalResult, qids: Sequence[str], metric: str, label: str) -> np.ndarray:
    key = "MRR" if metric == RANK else metric
    try:
        col = np.array([res.per_query[q][key] for q in qids], dtype=np.float64)
    except KeyError as e:
        raise ValueError(f"{label}: no per-query {key!r} for query {e.args[0]!r}") from e
    if metric != RANK:
        return col
    if np.any(col <= 0):
        q = qids[int(np.argmax(col <= 0))]
        raise ValueError(f"{label}: query {q!r} has no relevant document in its run (MRR 0), "
                         "so it has no rank; use --metric MRR")
    return 100.0 / col


def _check_queries(base: RetrievalResult, other: RetrievalResult, label: str) -> list[str]:
    qids = sorted(base.per_query)
    if set(other.per_query) != set(qids):
        missing = sorted(set(qids) - set(other.per_query))
        extra = sorted(set(other.per_query) - set(qids))
        parts = [f"{len(ids)} {what} (e.g. {ids[0]!r})"
                 for what, ids in (("baseline queries missing", missing), ("extra", extra)) if ids]
        raise ValueError(f"{label}: scored on other queries than the baseline: "
                         f"{', '.join(parts)}; compare results of the same data, split and seed")
    return qids


def paired_columns(
    base: Any, other: Any, *, metric: str = "NDCG@10", label: str = "variant",
) -> tuple[np.ndarray, np.ndarray]:
    """Per-query scores of two results, aligned on their (identical) query ids.

    Args:
        base: The baseline: anything with ``per_query`` (``query_id -> {metric: value}``),
            e.g. a :class:`~htp_retrieval.eval.retrieval.RetrievalResult` or a report
            record.
        other: The variant, scored on the same queries.
        metric: Metric label in the per-query rows, or ``"rank"`` (see :func:`compare`).
        label: Name of ``other`` in error messages.

    Returns:
        ``(baseline [n_queries], variant [n_queries])``, in sorted query-id order.

    Raises:
        ValueError: if the two were scored on different query sets or lack ``metric``.
    """
    qids = _check_queries(base, other, label)
    return _column(base, qids, metric, "baseline"), _column(other, qids, metric, label)


def compare(
    base: RetrievalResult,
    other: RetrievalResult,
    *,
    metric: str = "NDCG@10",
    label: str = "variant",
    n_resamples: int = 10_000,
    seed: int = 0,
) -> PairedComparison:
    """Paired comparison of ``other`` against ``base`` over their queries.

    Args:
        base: The baseline result (with ``per_query``).
        other: The variant, scored on the same queries.
        metric: Metric label in the per-query rows, or ``"rank"``: the rank of the
            relevant document (``100 / MRR``; exact with one relevant document per query,
            as in needle and passkey; lower is better, so a win is a lower rank).
        label: Name of ``other`` in the output and in error messages.
        n_resamples: Bootstrap resamples of the queries.
        seed: Bootstrap seed (the interval is deterministic for a seed).

    Returns:
        The :class:`PairedComparison` (points are percent, like the scores).

    Raises:
        ValueError: if the two were scored on different query sets or lack ``metric``.
    """
    from scipy import stats

    a, b = paired_columns(base, other, metric=metric, label=label)
    d = b - a
    sign = -1.0 if metric == RANK else 1.0  # a lower rank is a win
    _, lo, hi = seeds_ci([d], n_resamples=n_resamples, seed=seed) if len(d) else (0, 0.0, 0.0)
    p = float(stats.wilcoxon(d).pvalue) if np.any(d != 0) else None
    return PairedComparison(
        variant=label, metric=metric, n=len(d), baseline_mean=float(a.mean()),
        variant_mean=float(b.mean()), mean_diff=float(d.mean()), ci_low=lo, ci_high=hi,
        wins=int((sign * d > 0).sum()), losses=int((sign * d < 0).sum()),
        ties=int((d == 0).sum()),
        p_value=p)


def seeds_ci(
    diffs: Sequence[np.ndarray],
    *,
    n_resamples: int = 10_000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Mean over seeds of the per-seed mean paired difference, with a 95% interval.

    Each generator seed is its own query set (stratum). The statistic is the mean over
    seeds of ``mean(variant - baseline)`` over that seed's queries, the ``Δ mean`` of
    ``python -m research seeds``; the percentile bootstrap (``scipy.stats.bootstrap``)
    resamples the queries within each seed, so the interval covers query-to-query noise, not the spread
    between generator seeds.

    Args:
        diffs: Per seed, the per-query differences ``variant - baseline`` (points),
            each ``[n_queries]``.
        n_resamples: Bootstrap resamples.
        seed: Bootstrap seed (the interval is deterministic for a seed).

    Returns:
        ``(mean difference, interval low, interval high)`` in points; a degenerate input
        (every difference equal within each seed, or one query per seed) gives the mean
        three times.

    Raises:
        ValueError: if ``diffs`` is empty or a seed has no queries.
    """
    from scipy import stats

    if not diffs:
        raise ValueError("no seeds to compare")
    arrs = [np.asarray(d, dtype=np.float64) for d in diffs]
    for i, d in enumerate(arrs):
        if d.ndim != 1 or d.size == 0:
            raise ValueError(f"seed {i}: needs a 1-D array of per-query differences, "
                             f"got shape {d.shape}")

    def stat(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.mean([s.mean(axis=axis) for s in samples], axis=0)

    mean = float(stat(*arrs))
    if all(d.size < 2 or np.ptp(d) == 0 for d in arrs):
        return mean, mean, mean
    boot = stats.bootstrap(tuple(arrs), stat, n_resamples=n_resamples, vectorized=True,
                           confidence_level=0.95, method="percentile", random_state=seed)
    return mean, float(boot.confidence_interval.low), float(boot.confidence_interval.high)


def bin_edges(values: Sequence[float], bins: int) -> np.ndarray:
    """Edges for ``bins`` bins: equal width on [0, 1] for fractions, else quantiles.

    Args:
        values: The per-query fact (e.g. needle position 0..1, document tokens).
        bins: Number of bins (>= 1).

    Returns:
        ``bins + 1`` increasing edges.

    Raises:
        ValueError: if ``bins < 1`` or there are no values.
    """
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        raise ValueError("no values to bin")
    if v.min() >= 0.0 and v.max() <= 1.0:
        return np.linspace(0.0, 1.0, bins + 1)
    return np.unique(np.quantile(v, np.linspace(0.0, 1.0, bins + 1)))


def split_by(
    results: Mapping[str, RetrievalResult],
    *,
    key: str = "position",
    bins: int = 4,
    metric: str = "NDCG@10",
) -> tuple[list[str], list[int], dict[str, list[float]]]:
    """Mean score per bin of a per-query fact, for each result.

    Args:
        results: Label -> result, all on the same queries; the first supplies
            ``query_meta`` (needle/passkey results have ``position``, ``depth`` and
            ``n_tokens``).
        key: The ``query_meta`` field to bin by.
        bins: Number of bins (see :func:`bin_edges`).
        metric: Metric label in the per-query rows, or ``"rank"`` (see :func:`compare`).

    Returns:
        ``(bin labels, queries per bin, {label: mean per bin})``; an empty bin's mean is
        NaN.

    Raises:
        ValueError: if the first result has no ``query_meta[...][key]`` for a query (the
            message names the query), or the results' queries differ.
    """
    labels = list(results)
    first = results[labels[0]]
    qids = sorted(first.per_query)
    vals = []
    for q in qids:
        v = (first.query_meta.get(q) or {}).get(key)
        if v is None:
            raise ValueError(f"{labels[0]}: query {q!r} has no {key!r} in query_meta "
                             "(needle/passkey results record position, depth, n_tokens)")
        vals.append(float(v))
    x = np.array(vals)
    edges = bin_edges(x, bins)
    idx = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(edges) - 2)
    names = [f"{edges[i]:.2f}-{edges[i + 1]:.2f}" if edges[-1] <= 1.0
             else f"{edges[i]:.0f}-{edges[i + 1]:.0f}" for i in range(len(edges) - 1)]
    counts = [int((idx == i).sum()) for i in range(len(names))]
    means: dict[str, list[float]] = {}
    for lab in labels:
        res = results[lab]
        _check_queries(first, res, lab)
        col = _column(res, qids, metric, lab)
        means[lab] = [float(col[idx == i].mean()) if counts[i] else float("nan")
                      for i in range(len(names))]
    return names, counts, means


def paired_table(rows: Sequence[PairedComparison], *, baseline: str) -> str:
    """Markdown table of :func:`compare` rows against ``baseline``."""
    if not rows:
        return ""
    m = rows[0].metric
    out = [f"| variant | queries | {m} {baseline} | {m} variant | diff | 95% CI | "
           "wins / losses / ties | Wilcoxon p |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = "n/a" if r.p_value is None else f"{r.p_value:.3f}"
        out.append(f"| {r.variant} | {r.n} | {r.baseline_mean:.2f} | {r.variant_mean:.2f} | "
                   f"{r.mean_diff:+.2f} | [{r.ci_low:+.2f}, {r.ci_high:+.2f}] | "
                   f"{r.wins} / {r.losses} / {r.ties} | {p} |")
    return "\n".join(out)


def split_table(names: Sequence[str], counts: Sequence[int], means: Mapping[str, list[float]],
                *, key: str, metric: str) -> str:
    """Markdown table of :func:`split_by`: one row per bin, one column per result."""
    labs = list(means)
    out = [f"| {key} | queries | " + " | ".join(f"{metric} {lab}" for lab in labs) + " |",
           "|---|---|" + "---|" * len(labs)]
    for i, name in enumerate(names):
        cells = " | ".join("-" if np.isnan(means[lab][i]) else f"{means[lab][i]:.2f}"
                           for lab in labs)
        out.append(f"| {name} | {counts[i]} | {cells} |")
    return "\n".join(out)


def plot_split(names: Sequence[str], counts: Sequence[int], means: Mapping[str, list[float]],
               path: str | Path, *, key: str, metric: str, title: str = "") -> Path:
    """Line plot of :func:`split_by` (x: bins, y: mean score per result); returns the PNG.

    Raises:
        ImportError: if matplotlib is missing (the message says what to install).
    """
    from htp_retrieval.eval.report import _pyplot_free_figure, _save

    fig, (ax,) = _pyplot_free_figure((7, 4))
    x = np.arange(len(names))
    for lab, ys in means.items():
        ax.plot(x, ys, marker="o", label=lab)
    ax.set_xticks(x, [f"{n}\n(n={c})" for n, c in zip(names, counts, strict=True)], fontsize=8)
    ax.set_xlabel(AXIS_LABELS.get(key, key))
    ax.set_ylabel("rank of the relevant document (lower is better)" if metric == RANK
                  else metric)
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, Path(path))


def _label(path: Path, res: RetrievalResult) -> str:
    return str(res.config.get("variant") or path.stem)


def centred_view(result: RetrievalResult, metric: str) -> RetrievalResult:
    """A copy of ``result`` whose per-query ``metric`` is its ``metric + " centred"``
    (``htp-retrieval eval --center-queries`` stores both).

    Raises:
        ValueError: if the result has no centred per-query values for ``metric``.
    """
    import dataclasses

    key = metric + " centred"
    if not result.per_query or any(key not in row for row in result.per_query.values()):
        raise ValueError(f"no per-query {key!r}: run the eval with --center-queries")
    rows = {q: {**row, metric: row[key]} for q, row in result.per_query.items()}
    return dataclasses.replace(result, per_query=rows)


def sts_centred_table(results: list[RetrievalResult], labels: list[str]) -> str:
    """Markdown rows of STS results scored with ``eval --center-queries``: Spearman plain,
    centred, the gain and its 95% bootstrap interval over resampled pairs (stored by the
    eval in ``config["centering"]["spearman_delta_ci95"]``).

    Raises:
        ValueError: for a result without centred Spearman (named by its label).
    """
    lines = ["| result | sample | Spearman | Spearman centred | diff | 95% CI (pairs) |",
             "|---|---|---|---|---|---|"]
    for lab, r in zip(labels, results, strict=True):
        cen = r.config.get("centering") or {}
        if "Spearman centred" not in r.scores or "spearman_delta_ci95" not in cen:
            raise ValueError(f"{lab}: no centred Spearman: run the STS eval with "
                             "--center-queries")
        lo, hi = cen["spearman_delta_ci95"]
        plain, centred = r.scores["Spearman"], r.scores["Spearman centred"]
        lines.append(f"| {lab} | {cen['sentence_sample']} | {plain:.2f} | {centred:.2f} | "
                     f"{centred - plain:+.2f} | [{lo:+.2f}, {hi:+.2f}] |")
    return "\n".join(lines)


def _pair_column(res: RetrievalResult, metric: str, label: str) -> tuple[np.ndarray, np.ndarray]:
    key = {"Spearman": "cosine", "Spearman centred": "cosine centred"}[metric]
    if "Spearman" not in res.scores:
        raise ValueError(f"{label}: not an STS result (no Spearman); --metric {metric!r} "
                         "compares STS results")
    if not res.per_pair:
        raise ValueError(f"{label}: no per-pair cosines (an STS result written before they "
                         "were recorded); rerun its eval command with --overwrite")
    if key not in res.per_pair:
        raise ValueError(f"{label}: no per-pair {key!r}: run the STS eval with "
                         "--center-queries")
    return (np.asarray(res.per_pair[key], dtype=np.float64),
            np.asarray(res.per_pair["gold"], dtype=np.float64))


def sts_paired_table(results: Sequence[RetrievalResult], labels: Sequence[str], *,
                     metric: str = "Spearman", seed: int = 0, n_resamples: int = 1000) -> str:
    """Markdown rows of STS results against the first, pair by pair: each one's Spearman,
    the difference and its 95% bootstrap interval over resampled sentence pairs
    (:func:`~htp_retrieval.eval.sts.bootstrap_spearman_delta`), and the fraction of
    resamples in which the row is ahead.

    Args:
        results: STS results of the same pairs (``per_pair`` stored); the first is the
            baseline.
        labels: One name per result.
        metric: ``Spearman`` (plain cosines) or ``Spearman centred``.
        seed: Bootstrap seed.
        n_resamples: Bootstrap resamples.

    Raises:
        ValueError: for a result without per-pair cosines, or one scored on other pairs
            than the baseline (different gold scores), named by its label.
    """
    from htp_retrieval.eval.sts import bootstrap_spearman_delta, spearman_percent

    if metric not in ("Spearman", "Spearman centred"):
        raise ValueError(f"STS results compare on 'Spearman' or 'Spearman centred', "
                         f"not {metric!r}")
    base, gold = _pair_column(results[0], metric, labels[0])
    base_rho = spearman_percent(base, gold)
    lines = [f"baseline: {labels[0]}, {metric} {base_rho:.2f} over {len(gold)} pairs", "",
             f"| variant | {metric} | diff | 95% CI (pairs) | resamples ahead |",
             "|---|---|---|---|---|"]
    for lab, r in zip(labels[1:], results[1:], strict=True):
        cos, g = _pair_column(r, metric, lab)
        if len(g) != len(gold) or not np.array_equal(g, gold):
            raise ValueError(f"{lab}: scored on other sentence pairs than the baseline "
                             f"({len(g)} against {len(gold)}); compare results of the same "
                             "file, split and subsample")
        lo, hi, ahead = bootstrap_spearman_delta(base, cos, gold, seed=seed,
                                                 n_resamples=n_resamples)
        rho = spearman_percent(cos, gold)
        lines.append(f"| {lab} | {rho:.2f} | {rho - base_rho:+.2f} | [{lo:+.2f}, {hi:+.2f}] | "
                     f"{100 * ahead:.1f}% |")
    return "\n".join(lines)


def cmd_paired(args: argparse.Namespace) -> int:
    """``python -m research paired``: print the paired table (and the split, plot)."""
    try:
        paths = [Path(p) for p in args.results]
        sts = args.metric in ("Spearman", "Spearman centred")  # STS: per pair, not query
        loaded = [RetrievalResult.load(p) if sts else load_per_query(p) for p in paths]
        labels = (args.labels.split(",") if args.labels
                  else [_label(p, r) for p, r in zip(paths, loaded, strict=True)])
        if len(labels) != len(loaded) or len(set(labels)) != len(labels):
            raise ValueError(f"--labels: need {len(loaded)} distinct names, got {labels}")
        base, base_label = loaded[0], labels[0]
        if sts and args.split_by:
            raise ValueError("--split-by bins per-query rows; STS results have none (they "
                             "compare pair by pair)")
        if sts and args.centred and args.metric != "Spearman":
            raise ValueError("--centred compares each STS result's plain with its centred "
                             "Spearman: use --metric Spearman")
        if sts and args.centred:
            print(sts_centred_table(loaded, labels))
            return 0
        if sts:
            print(sts_paired_table(loaded, labels, metric=args.metric, seed=args.seed))
            return 0
        if args.centred:  # each result's centred scores against its own plain ones
            rows = [compare(r, centred_view(r, args.metric), metric=args.metric,
                            label=f"{lab} centred", seed=args.seed)
                    for lab, r in zip(labels, loaded, strict=True)]
            print(paired_table(rows, baseline="plain (each row's own)"))
            return 0
        rows = [compare(base, r, metric=args.metric, label=lab, seed=args.seed)
                for lab, r in zip(labels[1:], loaded[1:], strict=True)]
        print(paired_table(rows, baseline=base_label))
        if args.split_by:
            names, counts, means = split_by(dict(zip(labels, loaded, strict=True)),
                                            key=args.split_by, bins=args.bins,
                                            metric=args.metric)
            print()
            print(split_table(names, counts, means, key=args.split_by, metric=args.metric))
            if args.plot:
                out = plot_split(names, counts, means, args.plot, key=args.split_by,
                                 metric=args.metric, title=args.title or "")
                print(f"\nplot: {out}")
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"python -m research paired: {e}") from e
    return 0


def add_parser(asub: Any) -> None:
    """Register ``paired`` on the ``python -m research`` subparsers."""
    q = asub.add_parser("paired", help="per-query paired comparison against the first result "
                        "(bootstrap CI, Wilcoxon), optionally split by needle position")
    q.add_argument("results", nargs="+", help="results JSONs; the first is the baseline")
    q.add_argument("--metric", default="NDCG@10",
                   help="a per-query metric (NDCG@10, MRR, Acc@1, ...) or 'rank': the rank "
                   "of the relevant document, 100/MRR (one relevant document per query); for "
                   "STS results 'Spearman' or 'Spearman centred', compared pair by pair")
    q.add_argument("--labels", default=None, help="comma list, one name per result")
    q.add_argument("--split-by", default=None,
                   help="query_meta field to bin by, e.g. position, depth, n_tokens")
    q.add_argument("--bins", type=int, default=4)
    q.add_argument("--plot", default=None, help="PNG path for the split plot")
    q.add_argument("--title", default=None)
    q.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    q.add_argument("--centred", action="store_true",
                   help="compare each result's centred scores (eval --center-queries) with "
                   "its own plain ones instead")
    q.set_defaults(func=cmd_paired)


__all__ = ["PairedComparison", "load_per_query", "compare", "centred_view", "sts_centred_table",
           "sts_paired_table", "bin_edges", "split_by",
           "paired_table", "split_table", "plot_split", "cmd_paired"]
