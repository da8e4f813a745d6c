"""Chunk-level retrieval on evidence spans: which chunk of a long document answers a query.

The data layout is a BEIR folder plus ``spans/<split>.jsonl``, one line per evidence span
``{"query-id", "corpus-id", "start", "end"}`` (character offsets into that document's
``text``, end exclusive), as ``../shared/data/spans/qmsum`` (QMSum's ``relevant_text_span``
turns) has it. Every document is cut into chunks
(:func:`~htp_retrieval.chunking.split_chunks`); a chunk is relevant to a query when it
overlaps one of the query's spans. Scores come in two scopes:

* **in-corpus**: the chunks of all documents are ranked (``NDCG@10``, ``Recall@10``);
* **in-document**: only the chunks of the query's own document are ranked
  (``NDCG@10 in-doc``, ``Recall@10 in-doc``).

Chunk vectors (:data:`CHUNK_VARIANTS`) are ``naive`` (each chunk embedded alone),
``late`` (contextual chunk embeddings from one pass per window of the document,
:meth:`~htp_retrieval.HTPEncoder.encode_late_chunks`) or ``late-mix`` (the mean of a chunk's
unit-length ``naive`` and ``late`` vectors: its own content plus its document's context).
Finished chunk embeddings are cached in ``<cache>/chunk-embeddings/`` under a fingerprint
of the encoder, chunking and spans, so ``late-mix`` reuses the two runs it combines.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from htp_retrieval.chunking import Chunk, split_chunks
from htp_retrieval.eval.cost import PeakMemory
from htp_retrieval.eval.data import BeirData, load_beir, read_jsonl
from htp_retrieval.eval.metrics import evaluate_per_query, mean_scores
from htp_retrieval.eval.retrieval import (
    RetrievalResult,
    save_npz_atomic,
    timing_machine,
    top_k_run,
    unit_rows,
    versions,
)
from htp_retrieval.files import atomic_write
from htp_retrieval.methods import task_instructions

CHUNK_METRICS = ("ndcg_cut_10", "recall_10")
"""pytrec_eval measures of chunk retrieval (``NDCG@10``, ``Recall@10``)."""

CHUNK_VARIANTS: tuple[str, ...] = ("naive", "late", "late-mix")
"""Chunk embeddings the chunk-level eval compares."""

IN_DOC = " in-doc"
"""Suffix of the in-document scores' labels."""


@dataclass
class SpanData:
    """A split with evidence spans.

    Attributes:
        beir: The documents, queries and document-level qrels.
        spans: ``query_id -> [(doc_id, start, end)]`` character spans (end exclusive).
    """

    beir: BeirData
    spans: dict[str, list[tuple[str, int, int]]]

    @property
    def name(self) -> str:
        """Dataset name (the folder name)."""
        return self.beir.name

    @property
    def corpus(self) -> dict[str, dict[str, str]]:
        """``doc_id -> {"title", "text"}``."""
        return self.beir.corpus

    @property
    def queries(self) -> dict[str, str]:
        """``query_id -> text`` (queries with at least one span)."""
        return self.beir.queries


def has_spans(path: str | Path, split: str) -> bool:
    """Whether ``path`` is a folder in the evidence-span layout for ``split``."""
    p = Path(path)
    return (p / "spans" / f"{split}.jsonl").exists() and (p / "corpus.jsonl").exists()


def load_spans(path: str | Path, split: str = "dev", *, max_docs: int = 0,
               max_queries: int = 0, seed: int = 0) -> SpanData:
    """Read a BEIR folder with ``spans/<split>.jsonl``.

    Args:
        path: The folder.
        split: Split name (``qrels/<split>.tsv`` and ``spans/<split>.jsonl``).
        max_docs: Keep a seeded sample of this many documents with their queries (0: all).
        max_queries: Then keep a seeded sample of this many queries (0: all).
        seed: Sampling seed.

    Returns:
        The :class:`SpanData`; only queries with at least one span are kept.

    Raises:
        FileNotFoundError: if a file is missing (named).
        ValueError: if a span names an unknown document or lies outside its text (the
            line is named).
    """
    root = Path(path)
    beir = load_beir(root, split=split)
    span_file = root / "spans" / f"{split}.jsonl"
    if not span_file.exists():
        raise FileNotFoundError(f"evidence spans missing: {span_file}")
    spans: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    for n, row in enumerate(read_jsonl(span_file), 1):
        qid, did = str(row["query-id"]), str(row["corpus-id"])
        start, end = int(row["start"]), int(row["end"])
        if did not in beir.corpus:
            raise ValueError(f"{span_file}:{n}: unknown document {did!r}")
        if not 0 <= start < end <= len(beir.corpus[did]["text"]):
            raise ValueError(f"{span_file}:{n}: span [{start}, {end}) outside document "
                             f"{did!r} ({len(beir.corpus[did]['text'])} characters)")
        if qid in beir.queries:
            spans[qid].append((did, start, end))
    corpus = beir.corpus
    queries = {q: t for q, t in beir.queries.items() if q in spans}
    if max_docs and max_docs < len(corpus):
        keep = set(random.Random(seed).sample(sorted(corpus), max_docs))
        corpus = {d: v for d, v in corpus.items() if d in keep}
        queries = {q: t for q, t in queries.items() if all(s[0] in keep for s in spans[q])}
    if max_queries and max_queries < len(queries):
        keep_q = set(random.Random(seed).sample(sorted(queries), max_queries))
        queries = {q: t for q, t in queries.items() if q in keep_q}
    qrels = {q: {s[0]: 1 for s in spans[q]} for q in queries}
    return SpanData(BeirData(beir.name, corpus, queries, qrels),
                    {q: spans[q] for q in queries})


def spans_from_synthetic(data: Any) -> SpanData:
    """Evidence spans of a generated needle or passkey split: each query's span is the
    inserted text in its one relevant document, so the relevant chunk is the one holding it.

    Args:
        data: A :class:`~htp_retrieval.eval.synthetic.SyntheticData` (``doc_meta`` with
            ``char_offset`` and ``needle``).

    Returns:
        The :class:`SpanData` (name ``<task>-spans``).

    Raises:
        ValueError: if a document's inserted text is not at its recorded offset.
    """
    spans: dict[str, list[tuple[str, int, int]]] = {}
    for q, rel in data.qrels.items():
        for d in rel:
            meta = data.doc_meta[d]
            start, needle = int(meta["char_offset"]), str(meta["needle"])
            text = data.corpus[d]["text"]
            if text[start : start + len(needle)] != needle:
                raise ValueError(f"{d}: the inserted text is not at char_offset {start}")
            spans.setdefault(q, []).append((d, start, start + len(needle)))
    beir = BeirData(f"{data.task}-spans", data.corpus, data.queries, data.qrels)
    return SpanData(beir, spans)


def chunk_id(doc_id: str, index: int) -> str:
    """The id of chunk ``index`` of a document: ``DOC_ID#cN``."""
    return f"{doc_id}#c{index}"


def chunk_qrels(data: SpanData, chunks: dict[str, list[Chunk]]) -> dict[str, dict[str, int]]:
    """``query_id -> {chunk_id: 1}``: the chunks overlapping one of the query's spans."""
    out: dict[str, dict[str, int]] = {}
    for q, spans in data.spans.items():
        rel = {chunk_id(d, c.index): 1 for d, s, e in spans for c in chunks[d]
               if c.start < e and s < c.end}
        out[q] = rel
    return out


def _fingerprint(config: dict[str, Any], ids: list[str]) -> str:
    blob = json.dumps({"config": config, "ids": ids}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def embed_chunks(
    encoder: Any,
    data: SpanData,
    chunks: dict[str, list[Chunk]],
    *,
    chunking: str,
    window_tokens: int | None = None,
    checkpoint_dir: str | Path | None = None,
    docs_per_checkpoint: int = 8,
    show_progress_bar: bool = True,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Embed every chunk, document by document, with optional checkpoints.

    Args:
        encoder: An :class:`~htp_retrieval.HTPEncoder`.
        data: The split.
        chunks: ``doc_id -> [n_chunks]`` chunks.
        chunking: ``naive`` (each chunk alone, :meth:`encode`) or ``late``
            (:meth:`encode_late_chunks`).
        window_tokens: Late chunking: text tokens per forward pass (default: the
            encoder's ``max_length``).
        checkpoint_dir: Folder for ``part_NNNN.npz`` files of ``docs_per_checkpoint``
            documents each, under a fingerprint of the settings; a rerun resumes.
        docs_per_checkpoint: Documents per checkpoint file.
        show_progress_bar: A tqdm bar over documents.

    Returns:
        ``(doc_id -> [n_chunks, hidden] float32, cost)``; cost holds ``seconds`` (wall,
        summed over parts), ``text_tokens``, ``resumed_parts``, ``peak_memory_bytes`` and
        ``machines`` (the :func:`~htp_retrieval.eval.retrieval.timing_machine` labels the
        parts were timed on; more than one where a checkpoint was resumed elsewhere).

    Raises:
        ValueError: for an unknown ``chunking``.
    """
    from tqdm.auto import tqdm

    if chunking not in ("naive", "late"):
        raise ValueError(f"chunking must be 'naive' or 'late' here, got {chunking!r}")
    dids = sorted(chunks)
    ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else None
    if ckpt is not None:
        spans = {d: [(c.start, c.end) for c in chunks[d]] for d in dids}
        fp = _fingerprint({"encoder": dict(encoder.record()), "chunking": chunking,
                           "window_tokens": window_tokens, "spans": spans}, dids)
        meta = ckpt / "meta.json"
        old = json.loads(meta.read_text()) if meta.exists() else {}
        if ckpt.exists() and (old.get("fp") != fp
                              or old.get("docs_per_checkpoint") != docs_per_checkpoint):
            shutil.rmtree(ckpt)
        with atomic_write(meta) as f:
            f.write(json.dumps({"fp": fp, "docs_per_checkpoint": docs_per_checkpoint}))
    out: dict[str, np.ndarray] = {}
    cost: dict[str, Any] = {"seconds": 0.0, "text_tokens": 0, "resumed_parts": 0,
                            "peak_memory_bytes": 0}
    device = str(getattr(encoder.model, "device", "cpu")) if hasattr(encoder, "model") else "cpu"
    here = timing_machine(device)
    machines: set[str] = set()
    parts = [dids[i : i + docs_per_checkpoint] for i in range(0, len(dids), docs_per_checkpoint)]
    with tqdm(total=len(dids), disable=not show_progress_bar, desc=f"{chunking} chunks",
              unit="doc") as bar:
        for p, part in enumerate(parts):
            path = ckpt / f"part_{p:04d}.npz" if ckpt is not None else None
            if path is not None and path.exists():
                z = np.load(path)
                for d in part:
                    out[d] = z[d]
                c = json.loads(str(z["__cost__"]))
                cost["seconds"] += c["seconds"]
                cost["text_tokens"] += c["text_tokens"]
                cost["resumed_parts"] += 1
                machines.add(c.get("machine", "unknown"))
                bar.update(len(part))
                continue
            texts = [data.beir.corpus[d]["text"] for d in part]
            with PeakMemory(device) as mem:
                if chunking == "naive":
                    flat = [c.text(t) for t, d in zip(texts, part) for c in chunks[d]]
                    vecs = encoder.encode(flat)
                    tokens = encoder.last_stats.text_tokens
                    embs, a = [], 0
                    for d in part:
                        embs.append(vecs[a : a + len(chunks[d])])
                        a += len(chunks[d])
                else:
                    embs = encoder.encode_late_chunks(texts, [chunks[d] for d in part],
                                                      window_tokens=window_tokens)
                    tokens = encoder.last_stats.text_tokens
            c = {"seconds": mem.seconds, "text_tokens": tokens, "machine": here}
            machines.add(here)
            cost["seconds"] += mem.seconds
            cost["text_tokens"] += tokens
            cost["peak_memory_bytes"] = max(cost["peak_memory_bytes"], mem.peak_bytes)
            for d, e in zip(part, embs):
                out[d] = e
            if path is not None:
                save_npz_atomic(path, __cost__=json.dumps(c), **{d: out[d] for d in part})
            bar.update(len(part))
    cost["machines"] = sorted(machines) or [here]
    return out, cost


def _weights_digest(encoder: Any) -> str:
    """A short digest of the model's weights (two slices), so that two models with one
    name (random test models, a fine-tuned copy) never share cached embeddings."""
    import torch

    params = list(encoder.model.parameters())
    h = hashlib.sha256()
    for p in (params[0], params[-1]):
        h.update(p.detach().flatten()[:4096].to("cpu", torch.float32).numpy().tobytes())
    return h.hexdigest()[:16]


def cached_chunk_embeddings(
    encoder: Any,
    data: SpanData,
    chunks: dict[str, list[Chunk]],
    *,
    chunking: str,
    window_tokens: int | None = None,
    checkpoint_dir: str | Path | None = None,
    show_progress_bar: bool = True,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """:func:`embed_chunks` (or a :data:`CHUNK_VARIANTS` combination) behind a file cache.

    The cache file is ``<cache_dir>/chunk-embeddings/<fingerprint>.npz``
    (:func:`~htp_retrieval.models.cache_dir`), the fingerprint covering the encoder
    config, the chunking, the window and every chunk span. ``late-mix`` is the mean of the
    unit-length ``naive`` and ``late`` vectors, each taken from the cache or computed.

    Returns:
        ``(doc_id -> [n_chunks, hidden] float32, cost)`` as :func:`embed_chunks`, cost
        summed over the parts computed or cached (``cached`` counts cache hits).

    Raises:
        ValueError: for a chunking not in :data:`CHUNK_VARIANTS`.
    """
    from htp_retrieval.models import cache_dir

    if chunking not in CHUNK_VARIANTS:
        raise ValueError(f"chunking must be one of {CHUNK_VARIANTS}, got {chunking!r}")
    if chunking == "late-mix":
        parts = [cached_chunk_embeddings(
            encoder, data, chunks, chunking=c, window_tokens=window_tokens,
            checkpoint_dir=None if checkpoint_dir is None else Path(checkpoint_dir) / c,
            show_progress_bar=show_progress_bar) for c in ("naive", "late")]
        (a, ca), (b, cb) = parts
        mixed = {d: (0.5 * (unit_rows(a[d]) + unit_rows(b[d]))).astype(np.float32) for d in a}
        cost = {k: ca[k] + cb[k] for k in ("seconds", "text_tokens", "resumed_parts", "cached")}
        cost["peak_memory_bytes"] = max(ca["peak_memory_bytes"], cb["peak_memory_bytes"])
        cost["machines"] = sorted({*ca.get("machines", ["unknown"]),
                                   *cb.get("machines", ["unknown"])})
        return mixed, cost
    dids = sorted(chunks)
    window = (window_tokens or encoder.max_length) if chunking == "late" else None
    spans = {d: [(c.start, c.end) for c in chunks[d]] for d in dids}
    key = _fingerprint({"encoder": dict(encoder.record()), "weights": _weights_digest(encoder),
                        "chunking": chunking, "window_tokens": window, "spans": spans}, dids)
    path = cache_dir() / "chunk-embeddings" / f"{key}.npz"
    if path.exists():
        z = np.load(path)
        cost = json.loads(str(z["__cost__"]))
        cost["cached"] = 1
        return {d: z[d] for d in dids}, cost
    embs, cost = embed_chunks(encoder, data, chunks, chunking=chunking,
                              window_tokens=window_tokens, checkpoint_dir=checkpoint_dir,
                              show_progress_bar=show_progress_bar)
    cost["cached"] = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    save_npz_atomic(path, __cost__=json.dumps(cost), **embs)
    return embs, cost


def score_chunks(
    q_emb: np.ndarray,
    c_emb: np.ndarray,
    qids: list[str],
    cids: list[str],
    data: SpanData,
    chunks: dict[str, list[Chunk]],
    qrels: dict[str, dict[str, int]] | None = None,
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Score chunk retrieval in both scopes by cosine similarity.

    In-corpus every query ranks all chunks (top 100); in-document it ranks the chunks of
    the documents its evidence spans are in.

    Args:
        q_emb: ``[n_queries, hidden]`` query vectors, rows in ``qids`` order.
        c_emb: ``[n_chunks, hidden]`` chunk vectors, rows in ``cids`` order
            (:func:`chunk_id` of every document's chunks).
        qids: Query ids.
        cids: Chunk ids.
        data: The split (its spans say each query's documents).
        chunks: Each document's chunks.
        qrels: :func:`chunk_qrels` of ``data`` and ``chunks`` (computed when ``None``).

    Returns:
        ``(scores, per_query)``: mean ``NDCG@10``/``Recall@10`` in-corpus and with the
        ``" in-doc"`` suffix, and the same per query.
    """
    qrels = chunk_qrels(data, chunks) if qrels is None else qrels
    run = top_k_run(q_emb, c_emb, qids, cids, k=100)
    per_query = evaluate_per_query(qrels, run, metrics=CHUNK_METRICS)
    # in-document: each query ranks its own document's chunks
    row = {cid: i for i, cid in enumerate(cids)}
    q_unit, c_unit = unit_rows(q_emb), unit_rows(c_emb)
    doc_run: dict[str, dict[str, float]] = {}
    for i, q in enumerate(qids):
        own = sorted({d for d, _, _ in data.spans[q]})
        ids = [chunk_id(d, c.index) for d in own for c in chunks[d]]
        sims = c_unit[[row[c] for c in ids]] @ q_unit[i]
        doc_run[q] = {c: float(s) for c, s in zip(ids, sims)}
    per_doc = evaluate_per_query(qrels, doc_run, metrics=CHUNK_METRICS)
    for q, vals in per_doc.items():
        per_query.setdefault(q, {}).update({k + IN_DOC: v for k, v in vals.items()})
    scores = mean_scores({q: {k: v for k, v in r.items() if not k.endswith(IN_DOC)}
                          for q, r in per_query.items()}, metrics=CHUNK_METRICS)
    doc_scores = mean_scores(per_doc, metrics=CHUNK_METRICS)
    scores.update({k + IN_DOC: v for k, v in doc_scores.items()})
    return scores, per_query


def run_chunk_retrieval(
    encoder: Any,
    data: SpanData,
    *,
    split: str = "dev",
    chunking: str = "naive",
    chunk_tokens: int = 256,
    chunk_overlap: int = 0,
    window_tokens: int | None = None,
    query_instruction: str | None = None,
    checkpoint_dir: str | Path | None = None,
    show_progress_bar: bool = True,
    center_queries: Sequence[str] | str | None = None,
    center_label: str = "",
    seed: int = 0,
) -> RetrievalResult:
    """Chunk every document, embed the chunks and the queries, and score both scopes.

    Args:
        encoder: An :class:`~htp_retrieval.HTPEncoder` with mean pooling for ``late``.
        data: The split (:func:`load_spans`).
        split: Split name recorded in the result.
        chunking: One of :data:`CHUNK_VARIANTS`.
        chunk_tokens: Chunk size in the encoder's tokens.
        chunk_overlap: Overlap between consecutive chunks, in tokens.
        window_tokens: Late chunking: text tokens per forward pass (default: the
            encoder's ``max_length``, the model's window).
        query_instruction: Defaults to the dataset's instruction
            (:func:`~htp_retrieval.methods.task_instructions`).
        checkpoint_dir: Resume folder for the chunk embeddings (:func:`embed_chunks`).
        show_progress_bar: tqdm bars.
        center_queries: Also score both scopes with centred vectors (chunks on the mean
            of all chunks, queries on these query texts' mean, or ``"crossfit"``), as
            :func:`~htp_retrieval.eval.retrieval.run_retrieval` does; the scores get the
            ``" centred"`` suffix (``NDCG@10 centred``, ``NDCG@10 in-doc centred``).
        center_label: Name of the query sample, recorded in ``config["centering"]``.
        seed: Seed of the cross-fitting halves.

    Returns:
        A :class:`~htp_retrieval.eval.retrieval.RetrievalResult` whose scores are
        ``NDCG@10``/``Recall@10`` in-corpus and ``NDCG@10 in-doc``/``Recall@10 in-doc``,
        and whose config records the chunking.
    """
    qi, _ = task_instructions(data.name)
    query_instruction = qi if query_instruction is None else query_instruction
    t0 = time.perf_counter()
    chunks = {d: split_chunks(v["text"], encoder.tokenizer, chunk_tokens=chunk_tokens,
                              chunk_overlap=chunk_overlap)
              for d, v in data.beir.corpus.items() if v["text"].strip()}
    chunk_seconds = time.perf_counter() - t0
    embs, dcost = cached_chunk_embeddings(
        encoder, data, chunks, chunking=chunking, window_tokens=window_tokens,
        checkpoint_dir=checkpoint_dir, show_progress_bar=show_progress_bar)
    dids = sorted(chunks)
    cids = [chunk_id(d, c.index) for d in dids for c in chunks[d]]
    c_emb = np.concatenate([embs[d] for d in dids])
    qids = list(data.beir.queries)
    t1 = time.perf_counter()
    q_emb = encoder.encode([data.beir.queries[q] for q in qids], instruction=query_instruction,
                           show_progress_bar=show_progress_bar)
    q_seconds = time.perf_counter() - t1
    qrels = chunk_qrels(data, chunks)
    scores, per_query = score_chunks(q_emb, c_emb, qids, cids, data, chunks, qrels)
    centring = None
    if center_queries is not None:
        from htp_retrieval.eval.centred import score_centred

        centring = score_centred(
            encoder, center_queries, q_emb, c_emb,
            lambda q, c: score_chunks(q, c, qids, cids, data, chunks, qrels),
            instruction=query_instruction, evaluated=[data.beir.queries[q] for q in qids],
            label=center_label, seed=seed, scores=scores, per_query=per_query,
            qrels=qrels, ids=(qids, cids), show_progress_bar=show_progress_bar)
    config = dict(encoder.record())
    config.update(query_instruction=query_instruction, document_instruction=None,
                  chunking=chunking, chunk_tokens=chunk_tokens, chunk_overlap=chunk_overlap,
                  window_tokens=(window_tokens or encoder.max_length)
                  if chunking.startswith("late") else None)
    if centring is not None:
        config["centering"] = centring
    n_chunks = len(cids)
    return RetrievalResult(
        dataset=data.name,
        split=split,
        config=config,
        scores=scores,
        cost={"corpus_seconds": dcost["seconds"], "query_seconds": q_seconds,
              "encode_seconds": dcost["seconds"] + q_seconds, "chunk_seconds": chunk_seconds,
              "corpus_text_tokens": dcost["text_tokens"],
              "tokens_per_second": dcost["text_tokens"] / max(dcost["seconds"], 1e-9),
              "seconds_per_1000_chunks": 1000 * dcost["seconds"] / max(n_chunks, 1),
              "peak_memory_bytes": dcost["peak_memory_bytes"],
              "resumed_chunks": dcost["resumed_parts"], "cached": dcost["cached"],
              "machines": dcost.get("machines", ["unknown"])},
        counts={"n_docs": len(dids), "n_chunks": n_chunks, "n_queries": len(qids),
                "n_qrels": sum(len(r) for r in qrels.values()),
                "n_spans": sum(len(s) for s in data.spans.values())},
        versions=versions(encoder),
        created=time.time(),
        htp_config=encoder.config.to_dict(),
        per_query=per_query,
    )


__all__ = ["score_chunks", "spans_from_synthetic", "CHUNK_VARIANTS", "cached_chunk_embeddings", "SpanData", "has_spans", "load_spans", "chunk_id", "chunk_qrels", "embed_chunks",
           "run_chunk_retrieval", "CHUNK_METRICS", "IN_DOC"]
