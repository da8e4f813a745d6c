"""Dense retrieval evaluation of one encoder on a BEIR split, with its cost."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from htp_retrieval.eval.cost import PeakMemory
from htp_retrieval.eval.data import BeirData
from htp_retrieval.eval.metrics import DEFAULT_METRICS, evaluate_per_query, mean_scores
from htp_retrieval.files import atomic_write
from htp_retrieval.methods import task_instructions


def save_npz_atomic(path: Path, **arrays: Any) -> None:
    """Write ``arrays`` to ``path`` (``.npz``) with :func:`~htp_retrieval.files.atomic_write`:
    a reader never sees a partial file, and concurrent writers of one cache entry do not
    collide."""
    with atomic_write(path, "wb") as f:
        np.savez(f, **arrays)


@dataclass
class RetrievalResult:
    """One model/method/dataset result (what the results JSON holds).

    Attributes:
        dataset: Dataset name.
        split: Qrels split.
        config: The encoder's settings record (:meth:`HTPEncoder.record`) plus
            instructions and run settings.
        scores: Metric label -> value in percent (NDCG@10, Recall@100, ...).
        cost: ``corpus_seconds``, ``query_seconds``, ``encode_seconds`` (s),
            ``corpus_tokens``, ``tokens_per_second``, ``peak_memory_bytes``,
            ``padding_fraction``, ``prepare_seconds``, ``forward_seconds``.
        counts: ``n_docs``, ``n_queries``, ``n_qrels``.
        versions: Package versions and platform.
        created: Unix time of the run.
        per_query: ``query_id -> {metric label: value}`` in percent, the rows that
            :attr:`scores` averages (for paired comparisons; empty in results written
            before it was recorded).
        per_pair: STS only: ``cosine`` (and ``cosine centred``) of every pair and its
            ``gold`` score, ``[n_pairs]`` each in file order (the values :attr:`scores`'
            Spearman correlates), so two methods can be compared pair by pair
            (``python -m research paired``); empty for retrieval and for older STS results.
        query_meta: ``query_id -> facts`` the rows can be split by, e.g. for needle and
            passkey the relevant document, the seeded needle ``depth`` (0..1) and its
            ``n_tokens``.
        htp_config: The whole resolved :class:`~htp_retrieval.config.HTPConfig` of the
            (document) encoder (:meth:`~htp_retrieval.config.HTPConfig.to_dict`):
            ``HTPEncoder(model, HTPConfig.from_dict(result["htp_config"]))`` rebuilds it.
        query_htp_config: The query encoder's, where queries used another one.
        same_layouts: Checks that other K-policy values lay out every input of this run
            as it was laid out (``python -m research same-layouts --write``,
            research/layout_check.py); written only when there are some.
        run: What defines the result (:func:`htp_retrieval.eval.naming.run_identity`:
            model, dtype, padding side, ``htp_config`` and data settings); its digest
            names the file (:func:`~htp_retrieval.eval.naming.result_file_name`).
        label: A readable label (the method and the settings given explicitly).
    """

    dataset: str
    split: str
    config: dict[str, Any]
    scores: dict[str, float]
    cost: dict[str, float]
    counts: dict[str, int]
    versions: dict[str, str] = field(default_factory=dict)
    created: float = 0.0
    per_query: dict[str, dict[str, float]] = field(default_factory=dict)
    per_pair: dict[str, list[float]] = field(default_factory=dict)
    query_meta: dict[str, dict[str, Any]] = field(default_factory=dict)
    same_layouts: list[dict[str, Any]] = field(default_factory=list)
    htp_config: dict[str, Any] = field(default_factory=dict)
    query_htp_config: dict[str, Any] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)
    label: str = ""

    def save(self, path: str | Path) -> None:
        """Write the result as JSON (parents created)."""
        raw = asdict(self)
        for key in ("per_pair", "same_layouts", "htp_config", "query_htp_config", "run", "label"):
            if not raw[key]:
                del raw[key]
        with atomic_write(path) as f:
            f.write(json.dumps(raw, indent=2, sort_keys=True))

    @classmethod
    def load(cls, path: str | Path) -> RetrievalResult:
        """Read a result JSON written by :meth:`save`."""
        return cls(**json.loads(Path(path).read_text()))


def versions(encoder: Any = None) -> dict[str, str]:
    """Versions of the packages that affect results, and the machine that ran them.

    Every result file and bench JSON records these: the CPU (:func:`htp_retrieval.dtypes.
    cpu_facts`: model name, cores, torch's CPU capability, native bf16), and a GPU's name
    and CUDA version where one is visible.

    Args:
        encoder: The encoder of the run; where it has a ``model`` on a device, the result
            records it as ``device`` (``cpu``, or ``cuda:0 (NVIDIA H100 80GB HBM3)``): bf16
            kernels differ between devices, and so do the scores (research/ANALYSIS.md,
            section 15).
    """
    import torch
    import transformers

    import htp_retrieval
    from htp_retrieval.dtypes import cpu_facts

    out = {
        "htp_retrieval": htp_retrieval.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        **cpu_facts(),
    }
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
        out["cuda"] = str(torch.version.cuda)
    dev = getattr(getattr(encoder, "model", None), "device", None)
    if isinstance(dev, torch.device):
        out["device"] = str(dev)
        if dev.type == "cuda":
            out["device"] += f" ({torch.cuda.get_device_name(dev)})"
    return out


def rank1_of(run: dict[str, dict[str, float]]) -> dict[str, str]:
    """The rank-1 document of each query.

    Args:
        run: ``query_id -> {doc_id: score}``, as from :func:`top_k_run`.

    Returns:
        ``query_id -> doc_id`` (queries with no scored document are absent).
    """
    return {qid: max(docs, key=docs.get) for qid, docs in run.items() if docs}


def rank1_documents(run: dict[str, dict[str, float]]) -> Counter[str]:
    """How many queries each document is rank 1 for.

    Args:
        run: ``query_id -> {doc_id: score}``, as from :func:`top_k_run`.

    Returns:
        ``doc_id -> queries`` (documents at rank 1 of no query are absent).
    """
    return Counter(rank1_of(run).values())


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (an all-zero row stays zero): ``[n, d]`` -> ``[n, d]``."""
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def rank1_counts(run: dict[str, dict[str, float]]) -> dict[str, int]:
    """How concentrated the rank-1 documents of a run are (hub documents).

    Args:
        run: ``query_id -> {doc_id: score}``, as from :func:`top_k_run`.

    Returns:
        ``rank1_docs``: distinct documents at rank 1 over all queries;
        ``rank1_top_queries``: queries whose rank-1 document is the most frequent one.
        A few documents at rank 1 for every query is the hubness that made Qwen2.5's htp
        score Acc@1 0 in fp32 (research/ANALYSIS.md, section 15.4). Empty run: zeros.
    """
    top = rank1_documents(run)
    return {"rank1_docs": len(top),
            "rank1_top_queries": top.most_common(1)[0][1] if top else 0}


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
    sims = unit_rows(q_emb) @ unit_rows(d_emb).T
    k = min(k, len(dids))
    top = np.argpartition(-sims, k - 1, axis=1)[:, :k]
    return {
        qid: {dids[j]: float(sims[i, j]) for j in top[i]} for i, qid in enumerate(qids)
    }


def _loadavg() -> float:
    """1-minute load average (0.0 where unavailable): recorded so contended runs show."""
    try:
        return float(os.getloadavg()[0])
    except (OSError, AttributeError):  # pragma: no cover
        return 0.0


CHECKPOINT_DOCS = 1024
"""Default most documents per corpus checkpoint chunk (:func:`encode_corpus`)."""

CHECKPOINT_CHARS = 500_000
"""Default most characters per corpus checkpoint chunk (:func:`encode_corpus`), about
125,000 tokens at 4 characters per token."""


def _fingerprint(config: dict[str, Any], instruction: str | None, ids: list[str]) -> str:
    blob = json.dumps({"config": config, "instruction": instruction, "ids": ids}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def timing_machine(device: str = "cpu") -> str:
    """Where a corpus chunk was timed: the CPU model and logical core count, plus the device
    where it is not the CPU (for example ``Intel(R) Xeon(R) Processor x2`` or
    ``AMD EPYC x16, cuda:0 (NVIDIA H100 80GB HBM3)``). Times taken on different machines are
    not comparable, so a resumed corpus records every machine its chunks ran on.

    Args:
        device: The device string the chunk ran on (``cpu``, ``cuda``, ``cuda:0``).
    """
    from htp_retrieval.dtypes import cpu_facts

    facts = cpu_facts()
    label = f"{facts['cpu']} x{facts['cpu_count']}"
    if device.startswith("cuda"):
        import torch

        label += f", {device} ({torch.cuda.get_device_name(torch.device(device))})"
    return label


def timed_on_one_machine(cost: dict[str, Any]) -> bool:
    """Whether a result's ``cost`` was timed on one machine: at most one
    :func:`timing_machine` label in ``cost["machines"]`` (a result from before the labels
    were recorded counts as one). A corpus resumed from a checkpoint encoded elsewhere sums
    two machines' seconds, which is no one machine's cost.
    """
    return len(cost.get("machines") or ()) <= 1


def encode_corpus(
    encoder: Any,
    texts: list[str],
    ids: list[str],
    *,
    instruction: str | None = None,
    checkpoint_dir: str | Path | None = None,
    chunk_size: int = CHECKPOINT_DOCS,
    chunk_chars: int | None = CHECKPOINT_CHARS,
    device: str = "cpu",
    show_progress_bar: bool = True,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Embed a corpus in length-sorted chunks, optionally checkpointing each chunk.

    Texts are ordered by character length (longest first) and cut into consecutive chunks
    of at most ``chunk_size`` texts and ``chunk_chars`` characters (a longer text is a chunk
    of its own); each chunk is one :meth:`encode` call, so batches stay length-sorted.
    With ``checkpoint_dir``, each finished chunk is written as ``chunk_NNNN.npz`` with its
    cost, under a fingerprint of the encoder config, instruction and ids; a rerun with the
    same fingerprint loads finished chunks instead of recomputing them, and a different
    fingerprint clears the folder. Embeddings are batch-invariant, so a resumed corpus equals
    an uninterrupted one.

    Args:
        encoder: An :class:`~htp_retrieval.HTPEncoder`.
        texts: Document texts, ``[n_docs]``.
        ids: Document ids, ``[n_docs]`` (part of the fingerprint).
        instruction: Document instruction.
        checkpoint_dir: Folder for chunk files (``None``: no checkpointing).
        chunk_size: Documents per chunk at most. A resumed folder that holds finished
            chunks keeps the ``chunk_size`` and ``chunk_chars`` they were cut with, so
            changing either never discards them; a folder with no finished chunk yet takes
            the new ones.
        chunk_chars: Characters per chunk at most (``None``: no limit), so that a corpus
            of long documents (needle/passkey at 8192 tokens: about 35,000 characters
            each) is still checkpointed every few hundred thousand characters.
        device: Device string for :class:`PeakMemory`.
        show_progress_bar: One tqdm bar over documents.

    Returns:
        ``([n_docs, hidden] float32 embeddings in input order, cost)``; cost holds
        ``seconds`` (wall, summed over chunks, resumed ones included), ``cpu_seconds``,
        ``text_tokens``, ``input_tokens``, ``padded_tokens``, ``prepare_seconds``,
        ``forward_seconds``, ``peak_memory_bytes`` (max over chunks), ``resumed_chunks``
        and ``machines``, the sorted :func:`timing_machine` labels the chunks were timed on
        (more than one where a checkpoint was resumed elsewhere; ``unknown`` for a chunk
        checkpointed before labels were recorded).

    Raises:
        ValueError: if ``chunk_size`` or ``chunk_chars`` is below 1.
    """
    from tqdm.auto import tqdm

    from htp_retrieval.prepare_pool import cut_windows

    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if chunk_chars is not None and chunk_chars < 1:
        raise ValueError(f"chunk_chars must be >= 1 or None, got {chunk_chars}")
    ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else None
    if ckpt is not None:
        fp = _fingerprint(dict(encoder.record()), instruction, ids)
        meta = ckpt / "meta.json"
        old = json.loads(meta.read_text()) if meta.exists() else {}
        if ckpt.exists() and old.get("fp") != fp:
            shutil.rmtree(ckpt)
        elif old.get("chunk_size") and any(ckpt.glob("chunk_*.npz")):
            # Finished chunks were cut with the stored limits: resume with them, losing
            # nothing (a folder from before ``chunk_chars`` existed was cut by count only).
            # With no finished chunk yet, the requested limits win.
            chunk_size, chunk_chars = int(old["chunk_size"]), old.get("chunk_chars")
        with atomic_write(meta) as f:
            f.write(json.dumps({"fp": fp, "n_docs": len(ids), "chunk_size": chunk_size,
                                "chunk_chars": chunk_chars}))
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    sizes = [len(t) for t in texts]
    chunks = cut_windows(order, sizes, chunk_chars, max_items=chunk_size)
    keys = ("seconds", "cpu_seconds", "text_tokens", "input_tokens", "padded_tokens",
            "prepare_seconds", "forward_seconds")
    cost: dict[str, Any] = dict.fromkeys(keys, 0)
    cost.update(peak_memory_bytes=0, resumed_chunks=0)
    here = timing_machine(device)
    machines: set[str] = set()
    out: np.ndarray | None = None
    with tqdm(total=len(texts), disable=not show_progress_bar, desc="corpus",
              unit="doc") as bar:
        for c, idx in enumerate(chunks):
            path = ckpt / f"chunk_{c:04d}.npz" if ckpt is not None else None
            emb = None
            if path is not None and path.exists():
                z = np.load(path)
                if z["emb"].shape[0] == len(idx):
                    emb, part = z["emb"], json.loads(str(z["cost"]))
                    cost["resumed_chunks"] += 1
                    bar.update(len(idx))
                # else: a chunk cut with another size (an old meta.json): recompute it
            if emb is None:
                c0 = time.process_time()
                with PeakMemory(device) as mem:
                    emb = encoder.encode([texts[i] for i in idx], instruction=instruction,
                                         progress=bar.update)  # the bar moves per batch
                st = encoder.last_stats
                part = {"seconds": mem.seconds, "cpu_seconds": time.process_time() - c0,
                        "text_tokens": st.text_tokens, "input_tokens": st.input_tokens,
                        "padded_tokens": st.padded_tokens,
                        "prepare_seconds": st.prepare_seconds,
                        "forward_seconds": st.forward_seconds,
                        "peak_memory_bytes": mem.peak_bytes, "machine": here}
                if path is not None:
                    save_npz_atomic(path, emb=emb, cost=json.dumps(part))
            for k in keys:
                cost[k] += part[k]
            cost["peak_memory_bytes"] = max(cost["peak_memory_bytes"], part["peak_memory_bytes"])
            machines.add(part.get("machine", "unknown"))
            if out is None:
                out = np.zeros((len(texts), emb.shape[1]), dtype=np.float32)
            out[idx] = emb
    cost["machines"] = sorted(machines) or [here]
    if out is None:
        out = np.zeros((0, getattr(encoder, "hidden_size", 0)), dtype=np.float32)
    return out, cost


def run_retrieval(
    encoder: Any,
    data: BeirData,
    *,
    split: str = "test",
    query_instruction: str | None = None,
    document_instruction: str | None = None,
    show_progress_bar: bool = True,
    checkpoint_dir: str | Path | None = None,
    chunk_size: int = CHECKPOINT_DOCS,
    chunk_chars: int | None = CHECKPOINT_CHARS,
    query_encoder: Any | None = None,
    metrics: Iterable[str] | None = None,
    center_queries: Sequence[str] | str | None = None,
    center_label: str = "",
    seed: int = 0,
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
        checkpoint_dir: If set, corpus embeddings are saved there chunk by chunk and an
            interrupted run resumes from the finished chunks (see :func:`encode_corpus`).
        chunk_size: Documents per checkpoint chunk at most.
        chunk_chars: Characters per checkpoint chunk at most (``None``: no limit).
        query_encoder: Encoder for the queries when it differs from the documents' (a
            query/document method pairing; its config is recorded as ``query_config``).
        metrics: pytrec_eval measures (default: :data:`~htp_retrieval.eval.metrics.
            DEFAULT_METRICS`); e.g. add ``P_1`` (reported as ``Acc@1``) for needle/passkey accuracy.
        center_queries: Also score with the vectors centred
            (:func:`~htp_retrieval.eval.centred.centred_vectors`): documents on this
            corpus's mean, queries on the mean of these query texts (embedded with the query
            instruction; none may be an evaluated query) or ``"crossfit"``. The centred
            scores are added with the ``" centred"`` suffix, and ``config["centering"]``
            records the sample.
        center_label: Name of the query sample, recorded.
        seed: Seed of the cross-fitting halves.

    Returns:
        The :class:`RetrievalResult` (scores in percent; cost in seconds and bytes).
    """
    qi, di = task_instructions(data.name)
    query_instruction = query_instruction if query_instruction is not None else qi
    document_instruction = document_instruction if document_instruction is not None else di
    dids = list(data.corpus)
    qids = list(data.queries)
    device = str(encoder.model.device) if hasattr(encoder, "model") else "cpu"
    load0 = _loadavg()
    d_emb, dcost = encode_corpus(
        encoder, [data.doc_text(d) for d in dids], dids,
        instruction=document_instruction, checkpoint_dir=checkpoint_dir,
        chunk_size=chunk_size, chunk_chars=chunk_chars, device=device,
        show_progress_bar=show_progress_bar,
    )
    c0 = time.process_time()
    qenc = query_encoder if query_encoder is not None else encoder
    with PeakMemory(device) as mem_q:
        q_emb = qenc.encode([data.queries[q] for q in qids], instruction=query_instruction,
                            show_progress_bar=show_progress_bar)
    qstats = qenc.last_stats
    q_cpu = time.process_time() - c0
    run = top_k_run(q_emb, d_emb, qids, dids)
    metrics = DEFAULT_METRICS if metrics is None else tuple(metrics)
    per_query = evaluate_per_query(data.qrels, run, metrics=metrics)
    scores = mean_scores(per_query, metrics=metrics)
    centring = None
    if center_queries is not None:
        from htp_retrieval.eval.centred import score_centred

        def score(q: np.ndarray, d: np.ndarray) -> tuple[dict[str, float], dict[str, Any]]:
            pq = evaluate_per_query(data.qrels, top_k_run(q, d, qids, dids), metrics=metrics)
            return mean_scores(pq, metrics=metrics), pq

        centring = score_centred(
            qenc, center_queries, q_emb, d_emb, score, instruction=query_instruction,
            evaluated=[data.queries[q] for q in qids], label=center_label, seed=seed,
            scores=scores, per_query=per_query, qrels=data.qrels, ids=(qids, dids),
            show_progress_bar=show_progress_bar)
    cost = {
        "corpus_seconds": dcost["seconds"],
        "query_seconds": mem_q.seconds,
        "encode_seconds": dcost["seconds"] + mem_q.seconds,
        "cpu_seconds": dcost["cpu_seconds"] + q_cpu,
        "corpus_text_tokens": dcost["text_tokens"],
        "corpus_input_tokens": dcost["input_tokens"],
        "tokens_per_second": dcost["text_tokens"] / max(dcost["seconds"], 1e-9),
        "peak_memory_bytes": max(dcost["peak_memory_bytes"], mem_q.peak_bytes),
        "padding_fraction": (1 - dcost["input_tokens"] / dcost["padded_tokens"]
                             if dcost["padded_tokens"] else 0.0),
        "prepare_seconds": dcost["prepare_seconds"] + qstats.prepare_seconds,
        "forward_seconds": dcost["forward_seconds"] + qstats.forward_seconds,
        "resumed_chunks": dcost["resumed_chunks"],
        "machines": dcost["machines"],
        "loadavg_start": load0,
        "loadavg_end": _loadavg(),
    }
    config = dict(encoder.record())
    config.update(query_instruction=query_instruction, document_instruction=document_instruction)
    if centring is not None:
        config["centering"] = centring
    if query_encoder is not None:
        config["query_config"] = dict(query_encoder.record())
    return RetrievalResult(
        dataset=data.name,
        split=split,
        config=config,
        scores=scores,
        cost=cost,
        counts={"n_docs": len(dids), "n_queries": len(qids),
                "n_qrels": sum(len(r) for r in data.qrels.values()), **rank1_counts(run)},
        versions=versions(encoder),
        created=time.time(),
        per_query=per_query,
        htp_config=encoder.config.to_dict(),
        query_htp_config={} if query_encoder is None else query_encoder.config.to_dict(),
    )
