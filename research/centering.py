"""Centring query and chunk vectors on means a deployment has, on the QMSum evidence spans.

``python -m research center RESULT.json [...]``: for each finished chunk-retrieval result
(``htp-retrieval eval --data ../shared/data/spans/qmsum --chunking ...``), rebuild its
encoder from the result's ``htp_config``, take its chunk vectors from the chunk-embedding
cache (the same fingerprint, so nothing is re-embedded when the run is cached), embed the
queries, and score both scopes with:

* ``plain``: cosine of the vectors as stored (the result's own scores);
* ``corpus + cross-fitted queries``: every chunk minus the mean of all chunks (a
  deployment has its corpus), every query minus the mean of the queries of the *other*
  fold (queries split in two seeded halves): the statistic a deployment has once it has
  seen some real queries of the same kind, never the query's own;
* ``corpus + own queries``: the query side centred on the mean of all queries, itself
  included: not deployable, an upper reference;
* ``corpus only``: chunks centred, queries as they are.

Means are taken over unit vectors (the cache stores unit vectors). Differences against
``plain`` come with a paired bootstrap interval over queries (:func:`research.paired.compare`).
The question and the first sample measurements: docs/RAG.md and research/ANALYSIS.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from htp_retrieval.eval.centred import cosine_scale
from htp_retrieval.eval.retrieval import unit_rows as _unit

MODES = ("plain", "corpus + cross-fitted queries", "corpus + own queries", "corpus only")


def centred(q: np.ndarray, c: np.ndarray, mode: str, *, stat: np.ndarray | None = None,
            folds: int = 2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Query and chunk (or document) vectors ``[n, hidden]`` centred as ``mode`` says
    (:data:`MODES`, :data:`BEIR_MODES`); ``corpus + train queries`` centres the queries on
    the mean of ``stat`` (vectors of other queries of the task, e.g. its train split).

    Raises:
        ValueError: for an unknown mode, fewer queries than folds, or
            ``corpus + train queries`` without ``stat``.
    """
    q, c = _unit(q), _unit(c)
    if mode == "corpus + train queries":
        if stat is None or not len(stat):
            raise ValueError("'corpus + train queries' needs the train queries' vectors")
        return q - _unit(stat).mean(axis=0), c - c.mean(axis=0)
    if mode == "plain":
        return q, c
    c_mean = c.mean(axis=0)
    if mode == "corpus only":
        return q, c - c_mean
    if mode == "corpus + own queries":
        return q - q.mean(axis=0), c - c_mean
    if mode == "corpus + cross-fitted queries":
        if len(q) < folds:
            raise ValueError(f"cross-fitting needs at least {folds} queries, got {len(q)}")
        fold = np.random.default_rng(seed).permutation(len(q)) % folds
        out = np.empty_like(q)
        for f in range(folds):
            out[fold == f] = q[fold == f] - q[fold != f].mean(axis=0)
        return out, c - c_mean
    raise ValueError(f"unknown centring mode {mode!r}; choose from {', '.join(MODES)}")


def centre_result(path: str | Path, *, data_path: str, split: str = "dev", max_docs: int = 0,
                  max_queries: int = 0, seed: int = 0) -> dict[str, Any]:
    """Score one chunk-retrieval result's vectors under every :data:`MODES` entry.

    ``max_docs``, ``max_queries`` and ``seed`` must be the run's own (its name's
    ``q<queries>d<docs>s<seed>`` tag); a mismatch in the number of documents, queries or
    chunks is an error.

    Returns:
        ``{"result", "modes": {mode: scores}, "paired": {metric: markdown table},
        "seconds"}``.
    """
    from htp_retrieval.chunking import split_chunks
    from htp_retrieval.config import read_config_file
    from htp_retrieval.encoder import HTPEncoder
    from htp_retrieval.eval.chunk_eval import (
        cached_chunk_embeddings,
        chunk_id,
        chunk_qrels,
        load_spans,
        score_chunks,
    )
    from htp_retrieval.eval.retrieval import RetrievalResult
    from htp_retrieval.methods import task_instructions
    from research.paired import compare, paired_table

    t0 = time.perf_counter()
    res = json.loads(Path(path).read_text())
    cfg = res["config"]
    if not cfg.get("chunking"):
        raise ValueError(f"{path} is not a chunk-retrieval result (no 'chunking' in its config)")
    enc = HTPEncoder(cfg["model"], read_config_file(path), dtype=cfg.get("dtype", "auto"))
    data = load_spans(data_path, split, max_docs=max_docs, max_queries=max_queries, seed=seed)
    got = (len(data.beir.corpus), len(data.beir.queries))
    want = (res["counts"]["n_docs"], res["counts"]["n_queries"])
    if got != want:
        raise ValueError(f"{path} has {want[0]} documents and {want[1]} queries, the data "
                         f"{got[0]} and {got[1]}: pass the run's --max-docs, --max-queries "
                         "and --seed (its q<queries>d<docs>s<seed> name tag)")
    chunks = {d: split_chunks(v["text"], enc.tokenizer, chunk_tokens=cfg["chunk_tokens"],
                              chunk_overlap=cfg["chunk_overlap"])
              for d, v in data.beir.corpus.items() if v["text"].strip()}
    embs, cost = cached_chunk_embeddings(enc, data, chunks, chunking=cfg["chunking"],
                                         window_tokens=cfg.get("window_tokens"))
    dids = sorted(chunks)
    cids = [chunk_id(d, c.index) for d in dids for c in chunks[d]]
    c_emb = np.concatenate([embs[d] for d in dids])
    if len(cids) != res["counts"]["n_chunks"]:
        raise ValueError(f"{path} has {res['counts']['n_chunks']} chunks, this chunking "
                         f"{len(cids)}")
    qids = list(data.beir.queries)
    qi, _ = task_instructions(data.name)
    q_emb = enc.encode([data.beir.queries[q] for q in qids],
                       instruction=cfg.get("query_instruction", qi), show_progress_bar=True)
    qrels = chunk_qrels(data, chunks)
    out: dict[str, Any] = {"result": str(path), "cached_chunks": bool(cost["cached"]),
                           "modes": {}}
    per: dict[str, RetrievalResult] = {}
    for mode in MODES:
        q, c = centred(q_emb, c_emb, mode)
        scores, per_query = score_chunks(q, c, qids, cids, data, chunks, qrels)
        out["modes"][mode] = scores
        per[mode] = RetrievalResult(dataset=data.name, split=split, config={}, scores=scores,
                                    cost={}, counts={}, versions={}, created=0.0,
                                    per_query=per_query)
    out["paired"] = {}
    for metric in ("NDCG@10", "NDCG@10 in-doc"):
        rows = [compare(per["plain"], per[m], metric=metric, label=m) for m in MODES[1:]]
        out["paired"][metric] = paired_table(rows, baseline="plain")
    out["seconds"] = time.perf_counter() - t0
    out["_per_mode"] = per  # RetrievalResults, for comparisons across results (not saved)
    return out


def across_results(results: list[dict[str, Any]], labels: list[str], mode: str,
                   metric: str) -> str:
    """Paired table of every result against the first, both scored under ``mode``."""
    from research.paired import compare, paired_table

    base = results[0]["_per_mode"][mode]
    rows = [compare(base, r["_per_mode"][mode], metric=metric, label=label)
            for r, label in zip(results[1:], labels[1:])]
    return paired_table(rows, baseline=labels[0])


BEIR_MODES = ("plain", "corpus + train queries", "corpus + own queries", "corpus only")


def centre_beir(model: str, method: str, *, data_path: str, max_queries: int, max_docs: int,
                seed: int = 0, n_stat: int = 300, max_length: int = 512) -> dict[str, Any]:
    """Retrieval on a BEIR test subset with every :data:`BEIR_MODES` entry.

    The deployable query statistic is the mean of ``n_stat`` queries of the train split
    (seeded sample) sent through the query path; the test queries never enter a mean
    except in the ``own`` reference. Texts are cut to ``max_length`` tokens (512, as the
    harness does for BEIR), so the ``plain`` scores are the harness's.

    Returns:
        ``{"method", "modes": {mode: scores}, "_per_mode": {mode: RetrievalResult}}``.
    """
    import random

    from htp_retrieval.encoder import HTPEncoder
    from htp_retrieval.eval.data import load_beir, subsample
    from htp_retrieval.eval.metrics import evaluate_per_query, mean_scores
    from htp_retrieval.eval.retrieval import RetrievalResult, encode_corpus, top_k_run
    from htp_retrieval.methods import task_instructions

    enc = HTPEncoder(model, method, max_length=max_length, overflow="truncate")
    data = subsample(load_beir(data_path, "test"), n_queries=max_queries or None,
                     n_docs=max_docs or None, seed=seed)
    train = load_beir(data_path, "train")
    train_ids = sorted(train.queries)
    random.Random(seed).shuffle(train_ids)
    qi, di = task_instructions(data.name)
    dids, qids = list(data.corpus), list(data.queries)
    # as the harness embeds a corpus (length-sorted chunks): the same plain scores
    d_emb, _ = encode_corpus(enc, [data.doc_text(d) for d in dids], dids, instruction=di)
    q_emb = enc.encode([data.queries[q] for q in qids], instruction=qi)
    stat = enc.encode([train.queries[q] for q in train_ids[:n_stat]], instruction=qi)
    out: dict[str, Any] = {"method": method, "n_stat": min(n_stat, len(train_ids)),
                           "modes": {}, "_per_mode": {}, "scale": {}}
    for mode in BEIR_MODES:
        q, c = centred(q_emb, d_emb, mode, stat=stat)
        out["scale"][mode] = cosine_scale(q, c, qids, dids, data.qrels)
        per_query = evaluate_per_query(data.qrels, top_k_run(q, c, qids, dids))
        scores = mean_scores(per_query)
        out["modes"][mode] = scores
        out["_per_mode"][mode] = RetrievalResult(
            dataset=data.name, split="test", config={}, scores=scores, cost={}, counts={},
            versions={}, created=0.0, per_query=per_query)
    return out


def cmd_center_beir(args: argparse.Namespace) -> int:
    """``python -m research center-beir``: plain vs centred retrieval per method."""
    from research.paired import compare, paired_table

    results = [centre_beir(args.model, m, data_path=args.data, max_queries=args.max_queries,
                           max_docs=args.max_docs, seed=args.seed, n_stat=args.n_stat,
                           max_length=args.max_length)
               for m in args.methods.split(",")]
    for r in results:
        print(f"\n{r['method']} (query statistic: {r['n_stat']} train queries)\n")
        print("| mode | NDCG@10 | cosine: relevant pairs | other pairs (median, p95, p99) "
              "| relevant above other p99 |\n|---|---|---|---|---|")
        for mode, sc in r["modes"].items():
            k = r["scale"][mode]
            print(f"| {mode} | {sc['NDCG@10']:.2f} | {k['relevant_mean']:.3f} | "
                  f"{k['other_mean']:.3f} ({k['other_p50']:.3f}, {k['other_p95']:.3f}, "
                  f"{k['other_p99']:.3f}) | {100 * k['rel_above_p99']:.0f}% |")
        rows = [compare(r["_per_mode"]["plain"], r["_per_mode"][m], label=m)
                for m in BEIR_MODES[1:]]
        r["paired"] = paired_table(rows, baseline="plain")
        print("\n" + r["paired"])
    if len(results) > 1:
        for mode in ("plain", "corpus + train queries"):
            rows = [compare(results[0]["_per_mode"][mode], r["_per_mode"][mode],
                            label=r["method"]) for r in results[1:]]
            table = paired_table(rows, baseline=results[0]["method"])
            results[0].setdefault("across", {})[mode] = table
            print(f"\n{mode}, against {results[0]['method']}:\n\n{table}")
    for r in results:
        r.pop("_per_mode")
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(results, indent=1))
        print(f"\nwrote {args.output}")
    return 0


def cmd_center(args: argparse.Namespace) -> int:
    """``python -m research center``: print (and with ``--output`` save) the tables."""
    results = []
    for path in args.results:
        r = centre_result(path, data_path=args.data, split=args.split,
                          max_docs=args.max_docs, max_queries=args.max_queries, seed=args.seed)
        results.append(r)
        print(f"\n{path} (chunk vectors from the cache: {r['cached_chunks']})\n")
        print("| mode | NDCG@10 in-corpus | NDCG@10 in-doc |\n|---|---|---|")
        for mode, s in r["modes"].items():
            print(f"| {mode} | {s['NDCG@10']:.2f} | {s['NDCG@10 in-doc']:.2f} |")
        for metric, table in r["paired"].items():
            print(f"\n{metric}, against plain:\n\n{table}")
    labels = [Path(p).stem for p in args.results]
    if len(results) > 1:
        for mode in ("plain", "corpus + cross-fitted queries"):
            for metric in ("NDCG@10", "NDCG@10 in-doc"):
                table = across_results(results, labels, mode, metric)
                print(f"\n{metric}, {mode}, against {labels[0]}:\n\n{table}")
                for r in results:
                    r.setdefault("across", {}).setdefault(mode, {})[metric] = table
                    break
    for r in results:
        r.pop("_per_mode", None)
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(results, indent=1))
        print(f"\nwrote {args.output}")
    return 0


def add_parser(asub: Any) -> None:
    """Register ``center`` and ``center-beir`` on the ``python -m research`` subparsers."""
    q = asub.add_parser("center", help="chunk retrieval on QMSum spans with query and chunk "
                        "vectors centred on deployable means (cross-fitted queries)")
    q.add_argument("results", nargs="+", help="chunk-retrieval results JSON")
    q.add_argument("--data", default="../shared/data/spans/qmsum")
    q.add_argument("--split", default="dev")
    q.add_argument("--max-docs", type=int, default=0, help="the runs' own sample (0: all)")
    q.add_argument("--max-queries", type=int, default=0)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--output", default=None, help="JSON with every table")
    q.set_defaults(func=cmd_center)

    q = asub.add_parser("center-beir", help="BEIR test subset: plain vs centred retrieval "
                        "(documents on the corpus mean, queries on train queries' mean)")
    q.add_argument("--model", default="smollm2-135m-instruct")
    q.add_argument("--methods", default="vanilla-mean,htp")
    q.add_argument("--data", default="../shared/data/beir/scifact")
    q.add_argument("--max-queries", type=int, default=100)
    q.add_argument("--max-docs", type=int, default=600)
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--n-stat", type=int, default=300, help="train queries in the query mean")
    q.add_argument("--max-length", type=int, default=512,
                   help="text tokens per text, cut beyond (the harness's BEIR default)")
    q.add_argument("--output", default=None, help="JSON with every table")
    q.set_defaults(func=cmd_center_beir)
