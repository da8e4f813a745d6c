"""LongEmbed tasks (Zhu et al., 2024) from a local folder or the hub dataset ``dwzhu/LongEmbed``.

Two local layouts are read:

* **BEIR**: ``corpus.jsonl`` (``_id``, ``title``, ``text``), ``queries.jsonl`` (``_id``,
  ``text``), ``qrels/<split>.tsv`` (e.g. ``../shared/data/longembed/qmsum``).
* **LongEmbed hub files**: ``corpus.jsonl`` (``doc_id``, ``text``), ``queries.jsonl``
  (``qid``, ``text``), ``qrels.jsonl`` (``qid``, ``doc_id``), as in the hub repository's task
  folders (its README: "Each dataset has three splits: corpus, queries, and qrels"); needle
  and passkey rows also carry ``context_length``.

Either may be the task folder itself or a parent holding ``<task>/``. Without a local path,
the task is read from the hub with ``datasets.load_dataset("dwzhu/LongEmbed", name=task,
split=...)`` (LongEmbed's documented loader). Every relevant document of a query is kept
(the mteb loader keeps only the last one per query).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from htp_retrieval.eval.data import BeirData, load_beir, read_jsonl

LONGEMBED_HUB = "dwzhu/LongEmbed"
LONGEMBED_TASKS: tuple[str, ...] = (
    "narrativeqa", "qmsum", "2wikimqa", "summ_screen_fd", "passkey", "needle")
"""Task (config) names of the hub dataset."""


def _field(row: dict[str, Any], names: tuple[str, ...], where: str) -> Any:
    for n in names:
        if n in row and row[n] is not None:
            return row[n]
    raise ValueError(f"{where}: row has none of the fields {names}: keys {sorted(row)}")


def from_rows(
    name: str,
    corpus_rows: Iterable[dict[str, Any]],
    query_rows: Iterable[dict[str, Any]],
    qrel_rows: Iterable[dict[str, Any]],
    *,
    context_length: int | None = None,
) -> BeirData:
    """Build a split from LongEmbed rows (hub splits or ``*.jsonl`` files).

    Args:
        name: Dataset name (lower case).
        corpus_rows: Rows with ``doc_id`` (or ``_id``) and ``text`` (``title`` optional).
        query_rows: Rows with ``qid`` (or ``_id``) and ``text``.
        qrel_rows: Rows with ``qid`` and ``doc_id`` (``score`` optional, default 1).
        context_length: For needle/passkey rows: keep rows of this length only. Required
            when the rows hold several lengths.

    Returns:
        The :class:`BeirData`; all relevant documents per query are kept.

    Raises:
        ValueError: for missing fields, or several context lengths and none chosen.
    """
    def keep(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        rows = list(rows)
        lengths = sorted({int(r["context_length"]) for r in rows if "context_length" in r})
        if not lengths:
            return rows
        if context_length is None:
            if len(lengths) > 1:
                raise ValueError(f"{name}: rows hold context lengths {lengths}; pass "
                                 "context_length= to pick one")
            return rows
        return [r for r in rows if int(r.get("context_length", -1)) == int(context_length)]

    corpus = {
        str(_field(r, ("doc_id", "_id", "id"), f"{name} corpus")): {
            "title": r.get("title") or "", "text": str(_field(r, ("text",), f"{name} corpus"))}
        for r in keep(corpus_rows)
    }
    queries = {str(_field(r, ("qid", "_id", "id"), f"{name} queries")):
               str(_field(r, ("text",), f"{name} queries")) for r in keep(query_rows)}
    qrels: dict[str, dict[str, int]] = {}
    for r in keep(qrel_rows):
        q = str(_field(r, ("qid", "query-id", "query_id"), f"{name} qrels"))
        d = str(_field(r, ("doc_id", "corpus-id", "corpus_id"), f"{name} qrels"))
        qrels.setdefault(q, {})[d] = int(float(r.get("score", 1)))
    queries = {q: t for q, t in queries.items() if q in qrels}
    qrels = {q: r for q, r in qrels.items() if q in queries}
    if context_length is not None and not corpus:
        raise ValueError(f"{name}: no rows with context_length={context_length}")
    return BeirData(name, corpus, queries, qrels)


def _load_local(root: Path, name: str, split: str, context_length: int | None) -> BeirData:
    if (root / "qrels" / f"{split}.tsv").exists():
        data = load_beir(root, split=split)
        data.name = name
        return data
    files = [root / "corpus.jsonl", root / "queries.jsonl", root / "qrels.jsonl"]
    if all(f.exists() for f in files):
        return from_rows(name, *(read_jsonl(f) for f in files), context_length=context_length)
    raise FileNotFoundError(
        f"{root} is not a LongEmbed folder: expected corpus.jsonl, queries.jsonl and "
        f"qrels/{split}.tsv (BEIR layout) or qrels.jsonl (LongEmbed hub layout)")


def _load_hub(repo: str, task: str, context_length: int | None) -> BeirData:
    try:
        import datasets
    except ImportError as e:  # pragma: no cover - datasets ships with mteb
        raise ImportError(
            f"loading LongEmbed task {task!r} from the hub needs `pip install datasets`; "
            "or pass a local folder") from e
    splits = {}
    for s in ("corpus", "queries", "qrels"):
        try:
            splits[s] = datasets.load_dataset(path=repo, name=task, split=s)
        except Exception as e:  # network, auth, missing config: all end here
            raise RuntimeError(
                f"could not load LongEmbed task {task!r} (split {s!r}) from the hub dataset "
                f"{repo!r}: {type(e).__name__}: {e}. Without network access, pass a local "
                f"folder instead (e.g. --data ../shared/data/longembed/{task}, or "
                f"load_longembed('/path/to/{task}')).") from e
    return from_rows(task, splits["corpus"], splits["queries"], splits["qrels"],
                     context_length=context_length)


def load_longembed(
    source: str | Path,
    *,
    task: str | None = None,
    context_length: int | None = None,
    split: str = "test",
) -> BeirData:
    """Load a LongEmbed task from a local folder or the hub.

    Args:
        source: A local folder (the task folder, or a parent with ``<task>/``) in BEIR or
            LongEmbed hub layout; or, when no such path exists, a hub dataset id
            (``dwzhu/LongEmbed``; ``"hub"`` is short for it).
        task: Task name (``qmsum``, ``2wikimqa``, ``summ_screen_fd``, ``narrativeqa``,
            ``needle``, ``passkey``). Required for the hub; for a folder it names the
            subfolder (if present) and the dataset (default: the folder name).
        context_length: needle/passkey only: the context length (tokens) to keep.
        split: Qrels split of a BEIR-layout folder.

    Returns:
        The :class:`BeirData` (name: the task, lower case).

    Raises:
        FileNotFoundError: for a folder in neither layout (the message names the files).
        ValueError: if the hub is asked without a task.
        RuntimeError: if the hub cannot be reached (e.g. offline); the message says to pass
            a local path.
    """
    root = Path(source).expanduser()
    if root.exists():
        if task and (root / task).is_dir():
            root = root / task
        return _load_local(root, (task or root.name).lower(), split, context_length)
    repo = LONGEMBED_HUB if str(source) == "hub" else str(source)
    if not task:
        raise ValueError(
            f"{source!r} is not a local folder; to read the hub dataset {repo!r} pass task= "
            f"(one of {', '.join(LONGEMBED_TASKS)})")
    return _load_hub(repo, task, context_length)


__all__ = ["load_longembed", "from_rows", "LONGEMBED_HUB", "LONGEMBED_TASKS"]
