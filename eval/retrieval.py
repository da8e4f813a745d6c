"""Dense retrieval evaluation of one encoder on a BEIR split, with its cost."""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from htp_retrieval.eval.cost import PeakMemory
from htp_retrieval.eval.data import BeirData
from htp_retrieval.eval.metrics import evaluate_run

from htp_retrieval.methods import task_instructions


@dataclass
class RetrievalResult:
    """One model/method/dataset result (what the results JSON holds).

    Attributes:
        dataset: Dataset name.
        split: Qrels split.
        config: The encoder's settings (:meth:`HTPEncoder.config`) plus instructions.
        scores: Metric label -> value in percent (NDCG@10, Recall@100, ...).
        cost: ``corpus_seconds``, ``query_seconds``, ``encode_seconds`` (s),
            ``corpus_tokens``, ``tokens_per_second``, ``peak_memory_bytes``,
            ``padding_fraction``, ``prepare_seconds``, ``forward_seconds``.
        counts: ``n_docs``, ``n_queries``, ``n_qrels``.
        versions: Package versions and platform.
        created: Unix time of the run.
    """

    dataset: str
    split: str
    config: dict[str, Any]
    scores: dict[str, float]
    cost: dict[str, float]
    counts: dict[str, int]
    versions: dict[str, str] = field(default_factory=dict)
    created: float = 0.0

    def save(self, path: str | Path) -> None:
        """Write the result as JSON (parents created)."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2, sort_keys=True))
        tmp.replace(p)

    @classmethod
    def load(cls, path: str | Path) -> RetrievalResult:
        """Read a result JSON written by :meth:`save`."""
        return cls(**json.loads(Path(path).read_text()))


def versions() -> dict[str, str]:
    """Versions of the packages that affect results."""
    import torch
    import transformers

    import htp_retrieval

    return {
        "htp_retrieval": htp_retrieval.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


def top_k_run(
    q_emb: np.ndarray, d_emb: np.ndarray, qids: list[str], dids: list[str], k: int = 1000
) -> dict[str, dict[str, float]]:
    """Cosine-similarity top-k run ``query_id -> {doc_id: score}``.

    Args:
        q_emb: ``[n_queries, hidden]`` query embeddings.
        d_emb: ``[n_docs, hidden]`` document embeddings.
        qids: Query ids, ``[n_queries]``.
        dids: Document ids, ``[n_docs]``.
        k: Documents kept per query.
    """
    q = q_emb / np.maximum(np.linalg.norm(q_emb, axis=1, keepdims=True), 1e-12)
    d = d_emb / np.maximum(np.linalg.norm(d_emb, axis=1, keepdims=True), 1e-12)
    sims = q @ d.T
    k = min(k, len(dids))
    top = np.argpartition(-sims, k - 1, axis=1)[:, :k]
    return {
        qid: {dids[j]: float(sims[i, j]) for j in top[i]} for i, qid in enumerate(qids)
    }


def run_retrieval(
    encoder: Any,
    data: BeirData,
    *,
    split: str = "test",
    query_instruction: str | None = None,
    document_instruction: str | None = None,
    show_progress_bar: bool = True,
) -> RetrievalResult:
    """Embed a corpus and its queries, retrieve by cosine similarity and score.

    Args:
        encoder: An :class:`~htp_retrieval.HTPEncoder` (or anything with ``encode``,
            ``config()`` and ``last_stats``).
        data: The split.
        split: Split name recorded in the result.
        query_instruction: Defaults to the paper's Table 6 instruction for the dataset.
        document_instruction: Defaults to none (as in the paper).
        show_progress_bar: tqdm bars over documents and queries.

    Returns:
        The :class:`RetrievalResult` (scores in percent; cost in seconds and bytes).
    """
    qi, di = task_instructions(data.name)
    query_instruction = query_instruction if query_instruction is not None else qi
    document_instruction = document_instruction if document_instruction is not None else di
    dids = list(data.corpus)
    qids = list(data.queries)
    device = str(encoder.model.device) if hasattr(encoder, "model") else "cpu"
    with PeakMemory(device) as mem_d:
        d_emb = encoder.encode([data.doc_text(d) for d in dids], instruction=document_instruction,
                               show_progress_bar=show_progress_bar)
    dstats = encoder.last_stats
    with PeakMemory(device) as mem_q:
        q_emb = encoder.encode([data.queries[q] for q in qids], instruction=query_instruction,
                               show_progress_bar=show_progress_bar)
    qstats = encoder.last_stats
    run = top_k_run(q_emb, d_emb, qids, dids)
    scores = evaluate_run(data.qrels, run)
    cost = {
        "corpus_seconds": mem_d.seconds,
        "query_seconds": mem_q.seconds,
        "encode_seconds": mem_d.seconds + mem_q.seconds,
        "corpus_text_tokens": dstats.text_tokens,
        "corpus_input_tokens": dstats.input_tokens,
        "tokens_per_second": dstats.text_tokens / max(mem_d.seconds, 1e-9),
        "peak_memory_bytes": max(mem_d.peak_bytes, mem_q.peak_bytes),
        "padding_fraction": dstats.padding_fraction,
        "prepare_seconds": dstats.prepare_seconds + qstats.prepare_seconds,
        "forward_seconds": dstats.forward_seconds + qstats.forward_seconds,
    }
    config = dict(encoder.config())
    config.update(query_instruction=query_instruction, document_instruction=document_instruction)
    return RetrievalResult(
        dataset=data.name,
        split=split,
        config=config,
        scores=scores,
        cost=cost,
        counts={"n_docs": len(dids), "n_queries": len(qids),
                "n_qrels": sum(len(r) for r in data.qrels.values())},
        versions=versions(),
        created=time.time(),
    )
