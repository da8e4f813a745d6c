"""The compared method minus the baseline by weight dtype: one row per table, a column per
dtype.

``dtype="auto"`` gives float32 on a CPU without native bf16 matrix instructions and
bfloat16 on a CPU with them and on CUDA (:func:`htp_retrieval.dtypes.resolve_dtype`), so
which scores a user gets depends on the device. This table puts the shipped method's lead
in each dtype side by side (rows from :func:`htp_retrieval.eval.report.comparisons`; only rows that run
the shipped settings, :func:`htp_retrieval.eval.report.is_shipped`, count).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from htp_retrieval.eval.report import Comparison, ResultSet

DTYPES: tuple[str, ...] = ("float32", "bfloat16")
"""The dtypes compared, in column order (what ``dtype="auto"`` picks on CPUs)."""


def signed_cell(d: float) -> str:
    """A signed difference in points, bold unless it is positive (a loss or a tie)."""
    return f"{d:+.2f}" if d > 0 else f"**{d:+.2f}**"


def _cell(c: Comparison | None) -> tuple[str, str]:
    """``(scores, Δ)`` cells: ``"50.00 / 28.00"`` and ``"+22.00"`` (bold unless ahead), with
    the NDCG@10 difference in brackets where the main score is another metric."""
    if c is None:
        return "not run", ""
    delta = signed_cell(round(c.diff, 2) + 0.0)
    if c.ndcg is not None:
        dn = round(c.ndcg[0] - c.ndcg[1], 2) + 0.0
        delta += f" (NDCG@10 {dn:+.2f})"
    return f"{c.value:.2f} / {c.base_value:.2f}", delta


def shipped_choice(comps: Sequence[Comparison], dtypes: Sequence[str] | None = None
                   ) -> list[Comparison]:
    """One shipped comparison per table and dtype, in the order the comparisons come: the
    first such row, a plain run before one that also added centred scores
    (:attr:`~htp_retrieval.eval.report.Comparison.score_only`), so adding a centred run (or
    a repeat) of the same settings never changes or duplicates a row that had a plain run.

    Args:
        comps: Comparisons (:func:`htp_retrieval.eval.report.comparisons`).
        dtypes: Keep only these dtypes; ``None`` keeps every dtype.
    """
    chosen: dict[tuple[int, str], Comparison] = {}
    for c in comps:
        if not c.shipped or (dtypes is not None and c.dtype not in dtypes):
            continue
        key = (id(c.set), str(c.dtype))
        have = chosen.get(key)
        if have is None or (have.score_only and not c.score_only):
            chosen[key] = c
    return list(chosen.values())


def dtype_table_rows(comps: Sequence[Comparison], dtypes: Sequence[str] = DTYPES
                     ) -> list[tuple[ResultSet, dict[str, Comparison]]]:
    """Shipped comparisons grouped by table: ``[(ResultSet, {dtype: Comparison})]`` in the
    order the sets first appear, keeping tables with a shipped row in at least one of
    ``dtypes``; per dtype the row :func:`shipped_choice` picks."""
    rows: dict[int, tuple[ResultSet, dict[str, Comparison]]] = {}
    for c in shipped_choice(comps, dtypes):
        _, by = rows.setdefault(id(c.set), (c.set, {}))
        by[str(c.dtype)] = c
    return list(rows.values())


def format_dtype_table(comps: Sequence[Comparison], *, compare: str, baseline: str,
                       dtypes: Sequence[str] = DTYPES) -> str | None:
    """A Markdown table of ``compare`` against ``baseline`` per dtype, with a closing line
    counting the tables where ``compare`` does not win in each dtype.

    Args:
        comps: Every comparison of the report (:func:`htp_retrieval.eval.report.comparisons`).
        compare: The compared method's name (column headings).
        baseline: The baseline's name.
        dtypes: Dtypes shown as columns, in order.

    Returns:
        The table and its summary line, or ``None`` where fewer than two of ``dtypes`` have
        a shipped row (nothing to put side by side).
    """
    rows = dtype_table_rows(comps, dtypes)
    if len({d for _, by in rows for d in by}) < 2:
        return None
    head = ["model", "data", "length", "subset", "score"]
    for d in dtypes:
        head += [f"{d}: {compare} / {baseline}", f"Δ {d}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rs, by in rows:
        any_c = next(iter(by.values()))
        sub = "full" if rs.subset is None else f"`{rs.subset.tag}`"
        cells = [rs.model, f"{rs.dataset} ({rs.split})", str(rs.length or "n/a"), sub,
                 any_c.score]
        for d in dtypes:
            cells += list(_cell(by.get(d)))
        lines.append("| " + " | ".join(cells) + " |")
    counts = []
    for d in dtypes:
        have = [by[d] for _, by in rows if d in by]
        lost = sum(1 for c in have if round(c.diff, 2) <= 0)
        counts.append(f"{d}: {compare} does not beat {baseline} in {lost} of {len(have)} "
                      f"tables")
    return "\n".join(lines) + "\n\n" + "; ".join(counts) + " (main score)."


__all__ = ["DTYPES", "dtype_table_rows", "format_dtype_table", "shipped_choice", "signed_cell"]
