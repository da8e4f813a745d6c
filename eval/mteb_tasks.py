"""Local mteb 2.x tasks over files on disk, so an MTEB run needs no dataset hub.

* :func:`beir_task`: an ``AbsTaskRetrieval`` over a BEIR folder (``corpus.jsonl``,
  ``queries.jsonl``, ``qrels/<split>.tsv``; SciFact, LongEmbed QMSum, ...), read with
  :func:`htp_retrieval.eval.data.load_beir`, optionally subsampled with
  :func:`~htp_retrieval.eval.data.subsample` (the same queries and documents the
  ``htp-retrieval eval --max-queries/--max-docs`` harness uses).
* :func:`sts_task`: an ``AbsTaskSTS`` over a jsonl of ``{"sentence1", "sentence2",
  "score"}`` rows (STS-B in ``../shared/data/sts/stsb``); gold scores are kept as floats.
* :func:`resolve_tasks`: names -> task objects. ``scifact-local``, ``qmsum-local`` and
  ``stsb-local`` (under ``--data-root``, default ``$HTP_RETRIEVAL_DATA`` or
  ``../shared/data``), ``beir:PATH[@split]``, ``sts:PATH[@split]``, or any mteb task name
  (``SciFact``, ``STSBenchmark``, ...; those download from the hub).

Each local task is an instance of a class made for it (mteb keeps task metadata on the
class), named ``<folder>-local`` (plus ``-q<Q>d<D>s<S>`` when subsampled) so its results
never mix with the hub task's in mteb's cache.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from htp_retrieval.eval.data import load_beir, subsample
from htp_retrieval.methods import task_instructions

try:
    from datasets import Dataset
    from mteb.abstasks.retrieval import AbsTaskRetrieval
    from mteb.abstasks.sts import AbsTaskSTS
    from mteb.abstasks.task_metadata import TaskMetadata
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "MTEB support needs mteb 2.x: pip install 'mteb>=2,<3' "
        "(or pip install 'htp-retrieval[eval]')"
    ) from e

DEFAULT_DATA_ROOT = "../shared/data"
LOCAL_TASKS: dict[str, tuple[str, str, str]] = {
    "scifact-local": ("beir", "beir/scifact", "test"),
    "qmsum-local": ("beir", "longembed/qmsum", "test"),
    "stsb-local": ("sts", "sts/stsb", "test"),
}
"""Named local tasks: ``name -> (kind, path under the data root, split)``."""


def _local_metadata(
    name: str, path: Path, description: str, *, task_type: str, split: str, main_score: str,
    prompt: dict[str, str | None] | None = None,
) -> TaskMetadata:
    """mteb metadata for an English text-to-text task read from a local ``path``."""
    extra = {"prompt": prompt} if prompt is not None else {}
    return TaskMetadata(
        name=name,
        dataset={"path": str(path), "revision": "local"},
        description=description,
        type=task_type,
        category="t2t",
        modalities=["text"],
        eval_splits=[split],
        eval_langs=["eng-Latn"],
        main_score=main_score,
        **extra,
    )


def _suffix(max_queries: int | None, max_docs: int | None, seed: int) -> str:
    if not (max_queries or max_docs):
        return ""
    return f"-q{max_queries or 0}d{max_docs or 0}s{seed}"


class LocalBeirRetrieval(AbsTaskRetrieval):
    """Retrieval over a local BEIR folder (built by :func:`beir_task`).

    Identical query and document ids are ignored, as BEIR and
    :func:`htp_retrieval.eval.metrics.evaluate_run` do.
    """

    ignore_identical_ids = True
    data_path: str = ""
    split: str = "test"
    max_queries: int | None = None
    max_docs: int | None = None
    subsample_seed: int = 0

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        """Read the folder into ``self.dataset["default"][split]`` (corpus and queries as
        ``datasets.Dataset`` with ``id``/``title``/``text``; ``relevant_docs`` as
        ``{query_id: {doc_id: relevance}}``).

        Raises:
            FileNotFoundError: if a BEIR file is missing (named).
        """
        if self.data_loaded:
            return
        data = load_beir(self.data_path, split=self.split)
        if self.max_queries or self.max_docs:
            data = subsample(data, n_queries=self.max_queries or None,
                             n_docs=self.max_docs or None, seed=self.subsample_seed)
        corpus = Dataset.from_dict({
            "id": list(data.corpus),
            "title": [d.get("title") or "" for d in data.corpus.values()],
            "text": [d.get("text") or "" for d in data.corpus.values()],
        })
        queries = Dataset.from_dict({"id": list(data.queries),
                                     "text": list(data.queries.values())})
        self.dataset = {"default": {self.split: {
            "corpus": corpus, "queries": queries,
            "relevant_docs": {q: dict(r) for q, r in data.qrels.items()},
            "top_ranked": None,
        }}}
        self.data_loaded = True


def beir_task(
    path: str | Path,
    *,
    split: str = "test",
    name: str | None = None,
    max_queries: int | None = None,
    max_docs: int | None = None,
    seed: int = 0,
) -> LocalBeirRetrieval:
    """An mteb retrieval task over a BEIR folder.

    Args:
        path: The folder.
        split: Qrels split.
        name: Task name (default ``<folder>-local[-<split>][-q<Q>d<D>s<S>]``, the split
            named when it is not ``test``).
        max_queries: Subsample this many queries (``None``: all).
        max_docs: Keep this many documents: every relevant one plus seeded distractors.
        seed: Subsample seed.

    Returns:
        The task (data is read when mteb calls ``load_data``). Queries get the paper's
        Table 6 instruction for the folder name (metadata ``prompt``).

    Raises:
        FileNotFoundError: if the folder does not exist.
    """
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"BEIR folder not found: {root}")
    folder = root.name.lower()
    split_tag = "" if split == "test" else f"-{split}"
    task_name = name or f"{folder}-local{split_tag}{_suffix(max_queries, max_docs, seed)}"
    query_instruction, _ = task_instructions(folder)
    meta = _local_metadata(
        task_name, root, f"BEIR folder {root} ({split} split), read locally.",
        task_type="Retrieval", split=split, main_score="ndcg_at_10",
        prompt={"query": query_instruction},
    )
    cls = type(f"LocalBeir_{folder}", (LocalBeirRetrieval,), {
        "metadata": meta, "data_path": str(root), "split": split,
        "max_queries": max_queries, "max_docs": max_docs, "subsample_seed": seed,
    })
    return cls()


def read_sts_jsonl(path: str | Path, *, max_pairs: int | None = None) -> dict[str, list]:
    """Read ``{"sentence1", "sentence2", "score"}`` rows (scores kept as floats).

    Raises:
        FileNotFoundError: if the file is missing.
        ValueError: on a malformed row (file and line named).
    """
    from htp_retrieval.eval.sts import load_sts

    if not Path(path).is_file():
        raise FileNotFoundError(f"STS file not found: {path}")
    data = load_sts(path)  # the one STS row parser (float scores, errors name file:line)
    n = max_pairs or len(data.scores)
    if not data.scores:
        raise ValueError(f"{path}: no STS rows")
    return {"sentence1": data.sentence1[:n], "sentence2": data.sentence2[:n],
            "score": data.scores[:n]}


class LocalJsonlSTS(AbsTaskSTS):
    """STS over a local jsonl file (built by :func:`sts_task`); Spearman of cosine
    similarity against the gold score (mteb's ``cosine_spearman``)."""

    min_score = 0
    max_score = 5
    data_file: str = ""
    split: str = "test"
    max_pairs: int | None = None

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        """Read the jsonl into ``self.dataset["default"][split]`` (a ``datasets.Dataset``
        with ``sentence1``, ``sentence2``, ``score``)."""
        if self.data_loaded:
            return
        cols = read_sts_jsonl(self.data_file, max_pairs=self.max_pairs)
        self.dataset = {"default": {self.split: Dataset.from_dict(cols)}}
        self.data_loaded = True


def sts_task(
    path: str | Path,
    *,
    split: str = "test",
    name: str | None = None,
    max_pairs: int | None = None,
    min_score: float = 0,
    max_score: float = 5,
) -> LocalJsonlSTS:
    """An mteb STS task over ``<path>/<split>.jsonl`` (or ``path`` itself if a file).

    Args:
        path: Folder with ``<split>.jsonl``, or a jsonl file.
        split: Split name (file stem when ``path`` is a folder).
        name: Task name (default ``<folder>-local[-<split>][-n<max_pairs>]``).
        max_pairs: Keep the first this many pairs (``None``: all).
        min_score: Lowest gold score (for mteb's normalization; Spearman is unaffected).
        max_score: Highest gold score.

    Raises:
        FileNotFoundError: if the file is missing.
    """
    p = Path(path)
    file = p / f"{split}.jsonl" if p.is_dir() else p
    if not file.is_file():
        raise FileNotFoundError(f"STS file not found: {file}")
    stem = (p.name if p.is_dir() else p.stem).lower()
    split_tag = "" if split == "test" or not p.is_dir() else f"-{split}"
    task_name = name or f"{stem}-local{split_tag}" + (f"-n{max_pairs}" if max_pairs else "")
    meta = _local_metadata(
        task_name, file, f"STS pairs from {file}, read locally.",
        task_type="STS", split=split, main_score="cosine_spearman",
    )
    cls = type(f"LocalSTS_{stem}", (LocalJsonlSTS,), {
        "metadata": meta, "data_file": str(file), "split": split, "max_pairs": max_pairs,
        "min_score": min_score, "max_score": max_score,
    })
    return cls()


def _split_at(spec: str, default: str) -> tuple[str, str]:
    if "@" in spec:
        path, split = spec.rsplit("@", 1)
        return path, split
    return spec, default


def resolve_tasks(
    names: Sequence[str],
    *,
    data_root: str | Path | None = None,
    max_queries: int | None = None,
    max_docs: int | None = None,
    max_pairs: int | None = None,
    seed: int = 0,
) -> list[Any]:
    """Task names -> mteb task objects.

    Args:
        names: ``scifact-local``, ``qmsum-local``, ``stsb-local``, ``beir:PATH[@split]``,
            ``sts:PATH[@split]`` or mteb task names.
        data_root: Root of the named local tasks (default ``$HTP_RETRIEVAL_DATA`` or
            ``../shared/data``).
        max_queries: Subsample local retrieval tasks to this many queries.
        max_docs: Subsample local retrieval tasks to this many documents.
        max_pairs: First this many pairs of local STS tasks.
        seed: Subsample seed.

    Raises:
        FileNotFoundError: if a local task's data is missing (path named).
        KeyError: for an unknown mteb task name (mteb's message).
    """
    root = Path(data_root or os.environ.get("HTP_RETRIEVAL_DATA") or DEFAULT_DATA_ROOT)
    out: list[Any] = []
    for raw in names:
        name = raw.strip()
        if not name:
            continue
        kind, path, split = None, "", "test"
        if name in LOCAL_TASKS:
            kind, rel, split = LOCAL_TASKS[name]
            path = str(root / rel)
            if not Path(path).exists():
                raise FileNotFoundError(
                    f"data of local task {name!r} not found at {path}; pass --data-root "
                    f"or set HTP_RETRIEVAL_DATA")
        elif name.startswith(("beir:", "sts:")):
            kind, rest = name.split(":", 1)
            path, split = _split_at(rest, "test")
        if kind == "beir":
            out.append(beir_task(path, split=split, max_queries=max_queries,
                                 max_docs=max_docs, seed=seed))
        elif kind == "sts":
            out.append(sts_task(path, split=split, max_pairs=max_pairs))
        else:
            import mteb

            out.append(mteb.get_task(name))
    return out


__all__ = ["LocalBeirRetrieval", "LocalJsonlSTS", "beir_task", "sts_task", "read_sts_jsonl",
           "resolve_tasks", "LOCAL_TASKS"]
