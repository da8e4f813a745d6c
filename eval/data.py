"""BEIR-format datasets: ``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``."""

from __future__ import annotations

import csv
import json
import random
from dataclasses import dataclass
from pathlib import Path


@dataclass
class BeirData:
    """A BEIR retrieval split.

    Attributes:
        name: Dataset name (the folder name, lower case).
        corpus: ``doc_id -> {"title", "text"}``.
        queries: ``query_id -> text`` (only queries that the split's qrels name).
        qrels: ``query_id -> {doc_id: relevance}`` (every relevant document kept).
    """

    name: str
    corpus: dict[str, dict[str, str]]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]

    def doc_text(self, doc_id: str) -> str:
        """``title + " " + text``, stripped (the BEIR convention)."""
        d = self.corpus[doc_id]
        return f"{d.get('title') or ''} {d.get('text') or ''}".strip()


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a jsonl file (blank lines skipped).

    Raises:
        ValueError: on invalid JSON (file and line number named).
    """
    rows = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{line_no}: invalid JSON ({e.msg})") from e
    return rows


def load_beir(path: str | Path, split: str = "test") -> BeirData:
    """Load a BEIR folder.

    Args:
        path: Folder with ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/<split>.tsv``.
        split: Qrels split (``test``, ``train``, ``dev``).

    Returns:
        The :class:`BeirData`; queries are restricted to those the split's qrels name.

    Raises:
        FileNotFoundError: if a file is missing (the message names it).
        ValueError: on malformed lines (file and line number named).
    """
    root = Path(path)
    files = [root / "corpus.jsonl", root / "queries.jsonl", root / "qrels" / f"{split}.tsv"]
    for f in files:
        if not f.exists():
            raise FileNotFoundError(f"BEIR file missing: {f}")
    corpus = {str(r["_id"]): {"title": r.get("title", ""), "text": r.get("text", "")}
              for r in read_jsonl(files[0])}
    all_queries = {str(r["_id"]): r["text"] for r in read_jsonl(files[1])}
    qrels: dict[str, dict[str, int]] = {}
    with open(files[2], encoding="utf-8") as f:
        reader = csv.reader(f, delimiter="\t")
        header = next(reader, None)
        if header and header[0] != "query-id":  # no header line: treat it as data
            reader = iter([header, *reader])
        for row in reader:
            if len(row) < 3:
                continue
            qid, did, score = row[0], row[1], int(float(row[2]))
            qrels.setdefault(qid, {})[did] = score
    queries = {q: all_queries[q] for q in qrels if q in all_queries}
    qrels = {q: r for q, r in qrels.items() if q in queries}
    return BeirData(root.name.lower(), corpus, queries, qrels)


def subsample(
    data: BeirData, *, n_queries: int | None = None, n_docs: int | None = None, seed: int = 0
) -> BeirData:
    """A smaller split: ``n_queries`` queries, their relevant documents, plus distractors.

    Args:
        data: The full split.
        n_queries: Queries kept (random, seeded); ``None`` keeps all.
        n_docs: Total documents kept: every relevant document of the kept queries, then
            random distractors up to this count; ``None`` keeps the whole corpus.
        seed: Random seed.
    """
    rng = random.Random(seed)
    qids = sorted(data.queries)
    if n_queries is not None and n_queries < len(qids):
        qids = sorted(rng.sample(qids, n_queries))
    qrels = {q: data.qrels[q] for q in qids}
    if n_docs is None:
        corpus = data.corpus
    else:
        keep = {d for q in qids for d in qrels[q] if d in data.corpus}
        others = sorted(set(data.corpus) - keep)
        rng.shuffle(others)
        keep |= set(others[: max(0, n_docs - len(keep))])
        corpus = {d: data.corpus[d] for d in sorted(keep)}
    return BeirData(data.name, corpus, {q: data.queries[q] for q in qids}, qrels)
