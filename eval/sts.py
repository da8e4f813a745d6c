"""Semantic textual similarity: Spearman correlation of cosine similarity with gold scores.

Data: jsonl rows ``{"sentence1", "sentence2", "score"}`` (STS Benchmark in
``../shared/data/sts/stsb/{train,dev,test}.jsonl``, or any file in that form). Gold scores
stay floats: the official HTP STS script casts them to ``int``, which turns STS-B's 0-5 scale
into six tied ranks and changes Spearman; this module never rounds them.

The metric is MTEB's and the paper's (Sec. 5.3, Table 11): ``100 x`` Spearman's rank
correlation (``scipy.stats.spearmanr``) between the cosine similarity of the two sentence
embeddings and the gold score. Sentences get no instruction (the paper adds prompts to every
task "except for STS").
"""

from __future__ import annotations

import json
import random
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from htp_retrieval.eval.cost import PeakMemory
from htp_retrieval.eval.retrieval import RetrievalResult, _loadavg, versions


@dataclass
class StsData:
    """A split of sentence pairs with gold similarity scores.

    Attributes:
        name: Dataset name (lower case, e.g. ``stsb``).
        split: Split name (``test``, ``dev``, ``train``).
        sentence1: First sentences, ``[n_pairs]``.
        sentence2: Second sentences, ``[n_pairs]``.
        scores: Gold scores as floats, ``[n_pairs]`` (STS-B: 0-5).
    """

    name: str
    split: str
    sentence1: list[str]
    sentence2: list[str]
    scores: list[float]

    def __len__(self) -> int:
        return len(self.scores)

    def subsample(self, n: int, *, seed: int = 0) -> StsData:
        """``n`` pairs drawn at random (seeded), in their original order."""
        if n >= len(self):
            return self
        keep = sorted(random.Random(seed).sample(range(len(self)), n))
        return StsData(self.name, self.split, [self.sentence1[i] for i in keep],
                       [self.sentence2[i] for i in keep], [self.scores[i] for i in keep])


def is_sts_file(path: str | Path) -> bool:
    """Whether ``path`` is a jsonl file whose first row has ``sentence1/sentence2/score``."""
    p = Path(path)
    if not p.is_file():
        return False
    with open(p, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    return False
                return isinstance(row, dict) and {"sentence1", "sentence2", "score"} <= set(row)
    return False


def sts_file(path: str | Path, split: str = "test") -> Path | None:
    """The STS jsonl file for ``path``: the file itself, or ``<folder>/<split>.jsonl``."""
    p = Path(path)
    if p.is_dir():
        p = p / f"{split}.jsonl"
    return p if is_sts_file(p) else None


def load_sts(path: str | Path, *, split: str = "test", name: str | None = None) -> StsData:
    """Load STS pairs from a jsonl file or a folder holding ``<split>.jsonl``.

    Args:
        path: A ``.jsonl`` file or a folder (``../shared/data/sts/stsb``).
        split: File stem to read from a folder.
        name: Dataset name (default: the folder's name, or the file stem when it is not a
            split name).

    Returns:
        The :class:`StsData` (gold scores as floats).

    Raises:
        FileNotFoundError: if the file is missing.
        ValueError: for a row without two non-empty sentences and a numeric score (file and
            line named).
    """
    p = Path(path)
    if p.is_dir():
        p = p / f"{split}.jsonl"
    else:
        split = p.stem if p.stem in ("train", "dev", "test", "validation") else split
    if not p.is_file():
        raise FileNotFoundError(f"STS file missing: {p}")
    if name is None:
        name = p.parent.name if p.stem in ("train", "dev", "test", "validation") else p.stem
    s1: list[str] = []
    s2: list[str] = []
    gold: list[float] = []
    with open(p, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                a, b, score = row["sentence1"], row["sentence2"], float(row["score"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{p}:{n}: need sentence1, sentence2 and a numeric score "
                                 f"({type(e).__name__}: {e})") from e
            if not (isinstance(a, str) and a.strip() and isinstance(b, str) and b.strip()):
                raise ValueError(f"{p}:{n}: sentence1 and sentence2 must be non-empty strings")
            if not np.isfinite(score):
                raise ValueError(f"{p}:{n}: score is not finite ({score})")
            s1.append(a)
            s2.append(b)
            gold.append(score)
    if not gold:
        raise ValueError(f"{p}: no sentence pairs")
    return StsData(name.lower(), split, s1, s2, gold)


def spearman_percent(predicted: np.ndarray | list[float], gold: np.ndarray | list[float]) -> float:
    """``100 x`` Spearman's rho of predicted similarities against float gold scores."""
    from scipy.stats import spearmanr

    x, y = np.asarray(predicted, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    if _constant(x, y, "Spearman"):
        return float("nan")
    return float(100.0 * spearmanr(x, y).statistic)


def bootstrap_spearman_delta(
    base: np.ndarray, variant: np.ndarray, gold: np.ndarray, *, seed: int = 0,
    n_resamples: int = 1000,
) -> tuple[float, float, float]:
    """Paired bootstrap of a Spearman difference on the same sentence pairs.

    Pairs are resampled with replacement (``n_resamples`` seeded resamples); each resample
    scores ``100 x (Spearman(variant) - Spearman(base))`` against the resampled gold.

    Args:
        base: ``[n_pairs]`` the baseline's similarity of every pair (e.g. cosine).
        variant: ``[n_pairs]`` the variant's similarity of the same pairs, same order.
        gold: ``[n_pairs]`` gold scores.
        seed: Resampling seed (the interval is deterministic for a seed).
        n_resamples: Number of resamples.

    Returns:
        ``(low, high, fraction_above_zero)``: the 95% percentile interval of the difference
        (points) and the fraction of resamples in which the variant is ahead.

    Raises:
        ValueError: if the three arrays differ in length or hold fewer than 3 pairs.
    """
    from scipy.stats import rankdata

    base, variant, gold = (np.asarray(a, dtype=np.float64) for a in (base, variant, gold))
    if not len(base) == len(variant) == len(gold) or len(gold) < 3:
        raise ValueError(f"need at least 3 pairs and equal lengths, got base {len(base)}, "
                         f"variant {len(variant)}, gold {len(gold)}")
    rng = np.random.default_rng(seed)
    deltas = np.empty(n_resamples)
    for i in range(n_resamples):
        idx = rng.integers(0, len(gold), len(gold))
        g = rankdata(gold[idx])
        deltas[i] = 100.0 * (np.corrcoef(rankdata(variant[idx]), g)[0, 1]
                             - np.corrcoef(rankdata(base[idx]), g)[0, 1])
    deltas = deltas[np.isfinite(deltas)]
    return (float(np.percentile(deltas, 2.5)), float(np.percentile(deltas, 97.5)),
            float((deltas > 0).mean()))


def _constant(x: np.ndarray, y: np.ndarray, what: str) -> bool:
    """Warn (and return True) when a correlation is undefined: fewer than 2 distinct values."""
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        which = "gold scores" if len(y) >= 2 and np.ptp(y) == 0 else "similarities"
        warnings.warn(f"{what} undefined on {len(x)} pairs: constant {which}; reported as NaN",
                      stacklevel=3)
        return True
    return False


def run_sts(
    encoder: Any,
    data: StsData,
    *,
    instruction: str | None = None,
    show_progress_bar: bool = True,
    center_queries: Sequence[str] | str | None = None,
    center_label: str = "",
    seed: int = 0,
) -> RetrievalResult:
    """Embed every distinct sentence once and score cosine similarity against gold.

    Args:
        encoder: An :class:`~htp_retrieval.HTPEncoder` (or anything with ``encode``,
            ``config()`` and ``last_stats``).
        data: The pairs.
        instruction: Instruction for both sentences (default none, as in the paper).
        show_progress_bar: tqdm bar over sentences.
        center_queries: Also score with both sentences centred on one mean
            (:func:`~htp_retrieval.eval.centred.score_sts_centred`): sample sentences, or
            ``"crossfit"``; adds ``Spearman centred`` and ``Pearson centred`` and
            ``config["centering"]``.
        center_label: Name of the sentence sample, recorded.
        seed: Seed of the cross-fitting halves.

    Returns:
        A :class:`~htp_retrieval.eval.retrieval.RetrievalResult` with ``scores``
        ``Spearman`` and ``Pearson`` (x100) and ``cost`` ``encode_seconds``, ``cpu_seconds``,
        ``text_tokens``, ``tokens_per_second`` (text tokens/s), ``peak_memory_bytes``,
        ``padding_fraction``, ``prepare_seconds``, ``forward_seconds``; ``per_pair`` holds
        every pair's ``cosine`` (and ``cosine centred``) and ``gold`` score.
    """
    from scipy.stats import pearsonr

    sentences = list(dict.fromkeys(data.sentence1 + data.sentence2))
    index = {s: i for i, s in enumerate(sentences)}
    device = str(encoder.model.device) if hasattr(encoder, "model") else "cpu"
    load0 = _loadavg()
    c0 = time.process_time()
    with PeakMemory(device) as mem:
        emb = encoder.encode(sentences, instruction=instruction,
                             show_progress_bar=show_progress_bar)
    st = encoder.last_stats
    emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    a = emb[[index[s] for s in data.sentence1]]
    b = emb[[index[s] for s in data.sentence2]]
    cos = (a * b).sum(axis=1)
    gold = np.asarray(data.scores, dtype=np.float64)
    pearson = (float("nan") if _constant(cos, gold, "Pearson")
               else float(100.0 * pearsonr(cos.astype(np.float64), gold).statistic))
    scores = {"Spearman": spearman_percent(cos, gold), "Pearson": pearson}
    per_pair = {"cosine": cos.tolist(), "gold": gold.tolist()}
    centring = None
    if center_queries is not None:
        from htp_retrieval.eval.centred import score_sts_centred

        pairs = np.array([[index[s] for s in data.sentence1],
                          [index[s] for s in data.sentence2]]).T
        c_scores, centring, cos_c = score_sts_centred(
            encoder, center_queries, sentences, emb, pairs, gold, instruction=instruction,
            label=center_label, seed=seed, show_progress_bar=show_progress_bar)
        scores.update(c_scores)
        per_pair["cosine centred"] = cos_c.tolist()
    cost = {
        "encode_seconds": mem.seconds,
        "cpu_seconds": time.process_time() - c0,
        "text_tokens": st.text_tokens,
        "input_tokens": st.input_tokens,
        "tokens_per_second": st.text_tokens / max(mem.seconds, 1e-9),
        "peak_memory_bytes": mem.peak_bytes,
        "padding_fraction": st.padding_fraction,
        "prepare_seconds": st.prepare_seconds,
        "forward_seconds": st.forward_seconds,
        "loadavg_start": load0,
        "loadavg_end": _loadavg(),
    }
    config = dict(encoder.record())
    config.update(query_instruction=instruction, document_instruction=instruction)
    if centring is not None:
        config["centering"] = centring
    return RetrievalResult(
        dataset=data.name, split=data.split, config=config, scores=scores, cost=cost,
        counts={"n_pairs": len(data), "n_sentences": len(sentences)},
        versions=versions(encoder), created=time.time(), per_pair=per_pair,
        htp_config=encoder.config.to_dict())


__all__ = ["StsData", "load_sts", "run_sts", "spearman_percent", "bootstrap_spearman_delta",
           "is_sts_file", "sts_file"]
