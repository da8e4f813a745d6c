"""Hub documents: a few documents at rank 1 for most queries (``python -m research hubs``).

On needle and passkey every document of one context length is the same filler text with
one short sentence changed, so mean-pooled embeddings of the documents are nearly
parallel (mean pairwise cosine above 0.99 on Qwen2.5 and SmolLM2) and rank 1 is decided
by small deviations from the shared direction. A document that deviates most in the
direction the queries share wins for every query: a hub. :func:`hub_report` measures it
(how parallel the documents are, which documents take rank 1, how far each lies from the
corpus mean, the generator's metadata of each) and scores the same embeddings once more
with each side centred on its own mean (queries minus the query-set mean, documents minus
the corpus mean) to show how much of a score the shared direction costs. The centred
score is a diagnosis, not a method: it reads the test queries' mean (transductive).
research/ANALYSIS.md section 15.8 has the runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from htp_retrieval.eval.calibrate import FIXED_LENGTH
from htp_retrieval.files import atomic_write


def hub_report(
    q_emb: np.ndarray,
    d_emb: np.ndarray,
    qids: Sequence[str],
    dids: Sequence[str],
    qrels: Mapping[str, Mapping[str, int]],
    *,
    doc_meta: Mapping[str, Mapping[str, Any]] | None = None,
    metrics: Sequence[str] = ("ndcg_cut_10", "P_1"),
    n_hubs: int = 3,
) -> dict[str, Any]:
    """How concentrated rank 1 is, why, and what centring each side changes.

    Args:
        q_emb: ``[n_queries, hidden]`` query embeddings.
        d_emb: ``[n_docs, hidden]`` document embeddings (``n_docs >= 2``).
        qids: Query ids, ``[n_queries]``.
        dids: Document ids, ``[n_docs]``.
        qrels: ``query_id -> {doc_id: relevance}``.
        doc_meta: Optional per-document metadata copied into each hub's row (needle and
            passkey: ``depth``, ``char_offset``; the inserted sentence is left out).
        metrics: pytrec_eval measures (``P_1`` is reported as ``Acc@1``).
        n_hubs: Hub documents listed (the most frequent rank-1 documents).

    Returns:
        ``scores``: metrics of the cosine run (percent); ``scores_centered``: the same after
        subtracting the query-set mean from every query and the corpus mean from every
        document; ``rank1_docs`` / ``rank1_docs_centered``: distinct rank-1 documents;
        ``doc_cosine_mean``: mean cosine over document pairs (1.0: all parallel);
        ``query_doc_cosine_mean``; ``cos_to_mean_median``: median cosine of a document to
        the corpus mean; ``hubs``: per hub ``doc_id``, ``rank1_queries`` (queries it takes
        rank 1 of) and their ids (``rank1_query_ids``), ``relevant_for`` (queries it is
        relevant to), ``cos_to_mean``,
        ``farthest_rank`` (1 = the document farthest from the corpus mean) and its
        metadata.

    Raises:
        ValueError: if the shapes and id lists disagree or there are fewer than 2 documents.
    """
    from htp_retrieval.eval.metrics import evaluate_run
    from htp_retrieval.eval.retrieval import rank1_documents, rank1_of, top_k_run, unit_rows

    if q_emb.ndim != 2 or d_emb.ndim != 2 or q_emb.shape[1] != d_emb.shape[1]:
        raise ValueError(f"embeddings must be [n, hidden] with one hidden size; got "
                         f"queries {q_emb.shape}, documents {d_emb.shape}")
    if len(qids) != q_emb.shape[0] or len(dids) != d_emb.shape[0]:
        raise ValueError(f"{len(qids)} query ids for {q_emb.shape[0]} query embeddings, "
                         f"{len(dids)} document ids for {d_emb.shape[0]} document embeddings")
    if len(dids) < 2:
        raise ValueError(f"need at least 2 documents, got {len(dids)}")
    q, d = unit_rows(q_emb.astype(np.float64)), unit_rows(d_emb.astype(np.float64))
    dd = d @ d.T
    n = len(dids)
    doc_cos = float((dd.sum() - np.trace(dd)) / (n * (n - 1)))
    to_mean = d @ unit_rows(d.mean(axis=0, keepdims=True))[0]
    farthest = np.empty(n, dtype=int)
    farthest[np.argsort(to_mean)] = np.arange(1, n + 1)
    qc = q_emb - q_emb.mean(axis=0, keepdims=True)
    dc = d_emb - d_emb.mean(axis=0, keepdims=True)
    run = top_k_run(q_emb, d_emb, list(qids), list(dids))
    run_c = top_k_run(qc, dc, list(qids), list(dids))
    first = rank1_of(run)
    top, top_c = Counter(first.values()), rank1_documents(run_c)
    relevant = Counter(doc for qid in qids for doc, rel in qrels.get(qid, {}).items() if rel > 0)
    index = {did: i for i, did in enumerate(dids)}
    hubs = []
    for did, count in top.most_common(n_hubs):
        meta = {k: v for k, v in (doc_meta or {}).get(did, {}).items() if k != "needle"}
        taken = sorted(q for q, top_doc in first.items() if top_doc == did)
        hubs.append({"doc_id": did, "rank1_queries": count, "rank1_query_ids": taken,
                     "relevant_for": relevant[did],
                     "cos_to_mean": round(float(to_mean[index[did]]), 4),
                     "farthest_rank": int(farthest[index[did]]), **meta})
    return {
        "scores": evaluate_run(qrels, run, metrics=metrics),
        "scores_centered": evaluate_run(qrels, run_c, metrics=metrics),
        "rank1_docs": len(top),
        "rank1_docs_centered": len(top_c),
        "doc_cosine_mean": round(doc_cos, 5),
        "query_doc_cosine_mean": round(float((q @ d.T).mean()), 5),
        "cos_to_mean_median": round(float(np.median(to_mean)), 4),
        "hubs": hubs,
        "n_queries": len(qids),
        "n_docs": n,
    }


def hub_table(rows: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """Markdown table of :func:`hub_report` results, one row per variant.

    Args:
        rows: ``(variant name, report)`` pairs.
    """
    acc = all("Acc@1" in r["scores"] for _, r in rows)
    lines = ["| variant | NDCG@10 | " + ("Acc@1 | " if acc else "")
             + "doc-doc cosine | rank-1 docs | top hub: queries at rank 1, distance rank, "
             "cosine to corpus mean (median) | NDCG@10, centred | "
             + ("Acc@1, centred | " if acc else "") + "rank-1 docs, centred |",
             "|" + "---|" * (8 if acc else 6)]
    for name, r in rows:
        s, sc = r["scores"], r["scores_centered"]
        hub = "–"
        if r["hubs"]:
            h = r["hubs"][0]
            extra = ", ".join(f"{k} {h[k]:.2f}" if isinstance(h[k], float) else f"{k} {h[k]}"
                              for k in ("depth", "char_offset") if k in h)
            hub = (f"{h['doc_id']}: {h['rank1_queries']} of {r['n_queries']}, "
                   f"{h['farthest_rank']} of {r['n_docs']}, {h['cos_to_mean']:.4f} "
                   f"({r['cos_to_mean_median']:.4f})" + (f"; {extra}" if extra else ""))
        lines.append(
            f"| {name} | {s['NDCG@10']:.2f} | " + (f"{s['Acc@1']:.0f} | " if acc else "")
            + f"{r['doc_cosine_mean']:.4f} | {r['rank1_docs']} | {hub} | "
            f"{sc['NDCG@10']:.2f} | " + (f"{sc['Acc@1']:.0f} | " if acc else "")
            + f"{r['rank1_docs_centered']} |")
    return "\n".join(lines)


def cmd_hubs(args: argparse.Namespace) -> int:
    """``python -m research hubs``: :func:`hub_report` per variant, a JSON each and a table.

    Corpus embeddings are shared with ``ablate`` (same folder and checkpoint key),
    so a variant ``ablate`` already ran re-encodes only its queries.
    """
    import torch

    from htp_retrieval.encoder import HTPEncoder
    from htp_retrieval.eval.harness import encode_length
    from htp_retrieval.eval.retrieval import encode_corpus, versions
    from htp_retrieval.methods import task_instructions
    from research.analysis import (
        _command,
        ablation_data,
        corpus_checkpoint,
        parse_variant,
        variant_specs,
    )

    if args.threads:
        torch.set_num_threads(args.threads)
    specs = variant_specs(args)
    data, synthetic, max_length, tag = ablation_data(args)
    out = Path(args.output) / args.model.replace("/", "__") / tag
    metrics = ("ndcg_cut_10", "P_1") if synthetic is not None else ("ndcg_cut_10",)
    # the order run_retrieval uses: the corpus checkpoint's fingerprint includes it
    qids, dids = list(data.queries), list(data.corpus)
    meta = getattr(data, "doc_meta", None)
    rows = []
    for spec in specs:
        name, ekw, rkw = parse_variant(spec)
        enc = HTPEncoder(args.model, **{**FIXED_LENGTH, **ekw})
        if "max_length" not in ekw:
            if max_length is None:
                max_length = encode_length(enc, data, context_length=synthetic[1])
            ekw["max_length"] = enc.max_length = max_length
        qsettings = rkw.pop("query_settings", {})
        qenc = HTPEncoder(args.model, **{**FIXED_LENGTH, **ekw, **qsettings}) if qsettings else enc
        qi, di = task_instructions(data.name)
        qi = rkw.get("query_instruction", qi)
        di = rkw.get("document_instruction", di)
        d_emb, _ = encode_corpus(enc, [data.doc_text(d) for d in dids], dids, instruction=di,
                                 checkpoint_dir=corpus_checkpoint(out, enc, di),
                                 chunk_size=args.chunk_size,
                                 show_progress_bar=not args.quiet)
        q_emb = qenc.encode([data.queries[q] for q in qids], instruction=qi,
                            show_progress_bar=not args.quiet)
        report = hub_report(q_emb, d_emb, qids, dids, data.qrels, doc_meta=meta,
                            metrics=metrics)
        record = {"variant": name, "variant_spec": spec, "dataset": data.name,
                  "config": {**enc.record(), "query_instruction": qi,
                             "document_instruction": di,
                             **({"query_config": qenc.record()} if qsettings else {})},
                  "command": _command(), "versions": versions(enc), **report}
        path = out / "hubs" / f"{name}.json"
        with atomic_write(path) as f:
            f.write(json.dumps(record, indent=1))
        rows.append((name, report))
        print(f"[{name}] NDCG@10 {report['scores']['NDCG@10']:.2f}, centred "
              f"{report['scores_centered']['NDCG@10']:.2f} -> {path}", file=sys.stderr)
    print(hub_table(rows))
    return 0
