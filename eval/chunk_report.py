"""Report tables and plots for chunk-level results (:mod:`~htp_retrieval.eval.chunk_eval`).

A chunk-level result carries ``config["chunking"]``; its scores are NDCG@10 and Recall@10
in-corpus and in-document. One table per model, dataset and subset: a row per method,
chunking and chunk size, the differences against ``naive`` chunks with ``vanilla-mean``
(the plain RAG baseline), and the encode cost per 1,000 chunks.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from htp_retrieval.eval.chunk_eval import CHUNK_VARIANTS, IN_DOC
from htp_retrieval.eval.retrieval import timed_on_one_machine

BASELINE = ("vanilla-mean", "naive")
"""``(method, chunking)`` of the rows every other row is compared with."""


def is_chunk_record(record: Any) -> bool:
    """Whether a :class:`~htp_retrieval.eval.report.ResultRecord` is a chunk-level result."""
    return bool(record.config.get("chunking"))


def _key(r: Any) -> tuple:
    c = r.config
    order = CHUNK_VARIANTS.index(c["chunking"]) if c["chunking"] in CHUNK_VARIANTS else 99
    return (int(c.get("chunk_tokens") or 0), order, r.method, int(c.get("chunk_overlap") or 0),
            int(c.get("window_tokens") or 0))


def _label(r: Any) -> str:
    c = r.config
    parts = [str(c["chunking"]), f"{c.get('chunk_tokens')} tok"]
    if c.get("chunk_overlap"):
        parts.append(f"overlap {c['chunk_overlap']}")
    if c.get("window_tokens"):
        parts.append(f"window {c['window_tokens']}")
    return ", ".join(parts)


def _diff(v: float | None, base: float | None) -> str:
    if v is None or base is None:
        return "n/a"
    d = v - base
    return f"{d:+.2f}" if d > 0 else f"**{d:+.2f}**"


def format_chunk_table(records: Sequence[Any]) -> str:
    """One Markdown table of chunk-level results of one model, dataset and subset.

    Columns: method (with any layers off its family preset,
    :func:`~htp_retrieval.eval.report.method_cell`), chunk embedding, NDCG@10 and
    Recall@10 in-corpus and in-document, the NDCG@10 differences against ``naive`` chunks
    of the same size with ``vanilla-mean`` (bold where not ahead), and encode seconds per
    1,000 chunks (``n/a`` where the chunks were timed on more than one machine: a
    checkpoint resumed elsewhere).
    """
    from htp_retrieval.eval.report import method_cell  # report imports this module

    base = {int(r.config.get("chunk_tokens") or 0): r for r in records
            if (r.method, r.config["chunking"]) == BASELINE
            and not r.config.get("chunk_overlap")}
    rows = ["| method | chunks | NDCG@10 in-corpus | Recall@10 in-corpus | NDCG@10 in-doc | "
            "Recall@10 in-doc | Δ in-corpus | Δ in-doc | s / 1,000 chunks |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(records, key=_key):
        s = r.scores
        b = base.get(int(r.config.get("chunk_tokens") or 0))
        bs = b.scores if b is not None else {}
        cost = r.cost.get("seconds_per_1000_chunks")
        if not timed_on_one_machine(r.cost):
            cost = None
        same = b is r
        d_corpus = "-" if same else _diff(s.get("NDCG@10"), bs.get("NDCG@10"))
        d_doc = "-" if same else _diff(s.get("NDCG@10" + IN_DOC), bs.get("NDCG@10" + IN_DOC))
        cells = [method_cell(r, ()), _label(r), f"{s.get('NDCG@10', 0):.2f}",
                 f"{s.get('Recall@10', 0):.2f}", f"{s.get('NDCG@10' + IN_DOC, 0):.2f}",
                 f"{s.get('Recall@10' + IN_DOC, 0):.2f}", d_corpus, d_doc,
                 f"{cost:,.0f}" if cost is not None else "n/a"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def plot_chunk_scores(records: Sequence[Any], path: Path) -> Path | None:
    """Bars of NDCG@10 in-corpus and in-document per method and chunk embedding.

    Returns:
        The PNG path, or ``None`` for fewer than two records.
    """
    from htp_retrieval.eval.report import _pyplot_free_figure, _save

    recs = sorted(records, key=_key)
    if len(recs) < 2:
        return None
    fig, (ax_c, ax_d) = _pyplot_free_figure((max(6.0, 0.7 * len(recs) + 3), 3.6), 1, 2)
    labels = [f"{r.method}\n{r.config['chunking']} {r.config.get('chunk_tokens')}"
              + (f" w{r.config['window_tokens']}" if r.config.get("window_tokens") else "")
              for r in recs]
    for ax, key, title in ((ax_c, "NDCG@10", "in-corpus"), (ax_d, "NDCG@10" + IN_DOC,
                                                              "in-document")):
        vals = [r.scores.get(key, 0.0) for r in recs]
        colors = ["tab:gray" if r.config["chunking"] == "naive" else "tab:blue" for r in recs]
        ax.bar(range(len(recs)), vals, color=colors)
        ax.set_xticks(range(len(recs)))
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("NDCG@10")
        ax.set_title(f"{title} (gray: naive chunks)", fontsize=9)
    return _save(fig, path)


__all__ = ["is_chunk_record", "format_chunk_table", "plot_chunk_scores", "BASELINE"]
