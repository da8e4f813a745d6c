"""Centring: queries and documents moved onto a common origin before cosine scoring.

Mean-pooled decoder embeddings sit in a narrow cone (unrelated texts score cosine 0.8-0.96)
and the query cloud is offset from the document cloud, because queries carry an
instruction and documents do not. Subtracting each side's mean (documents: the mean of the
corpus; queries: the mean of a sample of queries of the same kind) before cosine removes
both the common direction and the offset. This is the first step of "all-but-the-top" (Mu
and Viswanath 2018, arXiv 1702.01417), done per side; its second step, removing the top
principal directions, is not implemented. Both means are statistics a deployment has: its
corpus, and queries it has seen or a sample it wrote. Measured gains and losses per task:
docs/RAG.md (section "Centring") and research/ANALYSIS.md.

:class:`Centering` holds the two means and applies them; :func:`fit_centering` embeds texts
with an encoder and fits one. ``HTPEncoder.encode(centering=..., side=...)``,
``HTPEmbeddings(centering=...)`` and Chroma collections (``ingest(center_queries=...)``)
apply it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from htp_retrieval.files import atomic_write

if TYPE_CHECKING:
    from htp_retrieval.config import HTPConfig
    from htp_retrieval.encoder import HTPEncoder

Side = Literal["query", "document"]
SIDES: tuple[str, ...] = ("query", "document")
CENTRE_KEY = "htp_centre"
"""Metadata key of a stored vector: :meth:`Centering.document_digest` of the mean it was
centred on."""
FORMAT = "htp-retrieval/centering"
"""The ``format`` tag of a saved :class:`Centering`."""


def _unit_rows(x: np.ndarray, what: str) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    bad = np.flatnonzero((norms[:, 0] == 0) | ~np.isfinite(norms[:, 0]))
    if bad.size:
        raise ValueError(f"{what} row {int(bad[0])} has norm {float(norms[bad[0], 0])}: "
                         "a zero or non-finite vector cannot be centred")
    return x / norms


def _matrix(vectors: Any, what: str, hidden: int | None = None) -> np.ndarray:
    x = np.asarray(vectors, dtype=np.float32)
    if x.ndim == 1 and x.size:
        x = x[None, :]
    if x.ndim != 2 or not len(x):
        raise ValueError(f"{what} must be a non-empty [n, hidden] array, got shape {x.shape}")
    if hidden is not None and x.shape[1] != hidden:
        raise ValueError(f"{what} have {x.shape[1]} dimensions, the centring {hidden}: it was "
                         "fitted on another model")
    return x


@dataclass(frozen=True, eq=False)
class Centering:
    """Means of unit-normalised query and document vectors, and the transform using them.

    :meth:`apply` maps a vector ``v`` of side ``s`` to ``unit(unit(v) - mean_s)``: rows are
    L2-normalised, the side's mean is subtracted, and the result is L2-normalised again, so
    cosine, dot product and L2 rankings agree on centred vectors. Queries and documents must
    come from the same encoder config and instructions as the means (``config``,
    ``query_instruction`` and ``document_instruction`` record them; an encoder checks its
    config against ``config`` before applying).

    Attributes:
        document_mean: ``[hidden]`` float32, mean of the unit document (or chunk) vectors.
        query_mean: ``[hidden]`` float32, mean of the unit query vectors.
        n_documents: Vectors the document mean was fitted on.
        n_queries: Vectors the query mean was fitted on.
        query_source: Where the query sample came from (free text, e.g. ``"scifact train
            claims"``), kept for the record.
        config: The :meth:`~htp_retrieval.config.HTPConfig.to_dict` of the encoder config
            the vectors were made with (``None``: not recorded, not checked).
        model: The model name the vectors were made with (``None``: not recorded).
        query_instruction: Instruction the queries were embedded with.
        document_instruction: Instruction the documents were embedded with.

    Raises:
        ValueError: on construction, if the means are not 1-D, differ in length, are not
            finite, or a count is below 1.
    """

    document_mean: np.ndarray
    query_mean: np.ndarray
    n_documents: int
    n_queries: int
    query_source: str = ""
    config: Mapping[str, Any] | None = field(default=None, repr=False)
    model: str | None = None
    query_instruction: str | None = None
    document_instruction: str | None = None

    def __post_init__(self) -> None:
        d = np.asarray(self.document_mean, dtype=np.float32).reshape(-1)
        q = np.asarray(self.query_mean, dtype=np.float32).reshape(-1)
        if np.ndim(self.document_mean) != 1 or np.ndim(self.query_mean) != 1 or not d.size:
            raise ValueError("document_mean and query_mean must be non-empty 1-D vectors")
        if d.shape != q.shape:
            raise ValueError(f"document_mean has {d.size} dimensions, query_mean {q.size}")
        if not (np.isfinite(d).all() and np.isfinite(q).all()):
            raise ValueError("document_mean and query_mean must be finite")
        if int(self.n_documents) < 1 or int(self.n_queries) < 1:
            raise ValueError(f"n_documents and n_queries must be >= 1, got "
                             f"{self.n_documents} and {self.n_queries}")
        d.setflags(write=False)
        q.setflags(write=False)
        object.__setattr__(self, "document_mean", d)
        object.__setattr__(self, "query_mean", q)
        if self.config is not None:  # as JSON has it (tuples as lists), so saved == fitted
            object.__setattr__(self, "config", json.loads(json.dumps(dict(self.config))))

    # ------------------------------------------------------------------ fitting
    @classmethod
    def fit(cls, documents: Any, queries: Any, *, query_source: str = "",
            **record: Any) -> Centering:
        """Fit both means from vectors.

        Args:
            documents: ``[n_docs, hidden]`` document (or chunk) vectors of the corpus.
            queries: ``[n_queries, hidden]`` vectors of a query sample, embedded through
                the query path (the query instruction) of the same encoder.
            query_source: Where the query sample came from (recorded).
            **record: ``config``, ``model``, ``query_instruction``,
                ``document_instruction`` to record (see the class attributes).

        Raises:
            ValueError: for an empty or non-2-D input, different widths, or a zero row.
        """
        d = _unit_rows(_matrix(documents, "documents"), "documents")
        q = _unit_rows(_matrix(queries, "queries", d.shape[1]), "queries")
        return cls(d.mean(axis=0), q.mean(axis=0), len(d), len(q), query_source, **record)

    def with_queries(self, queries: Any, *, query_source: str = "") -> Centering:
        """The same document mean with a query mean fitted on ``queries``
        (``[n, hidden]``); stored document vectors stay valid.

        Raises:
            ValueError: as :meth:`fit`.
        """
        q = _unit_rows(_matrix(queries, "queries", self.hidden), "queries")
        return self.replace(query_mean=q.mean(axis=0), n_queries=len(q),
                            query_source=query_source)

    def replace(self, **changes: Any) -> Centering:
        """A copy with ``changes`` applied (validated again)."""
        data = {k: getattr(self, k) for k in self.__dataclass_fields__}
        unknown = set(changes) - set(data)
        if unknown:
            raise ValueError(f"unknown Centering fields: {sorted(unknown)}")
        return type(self)(**{**data, **changes})

    # ---------------------------------------------------------------- applying
    @property
    def hidden(self) -> int:
        """Vector width (the model's hidden size)."""
        return int(self.document_mean.size)

    def document_digest(self) -> str:
        """Short hex digest of :attr:`document_mean`: names the mean a stored vector was
        centred on (Chroma records carry it, :data:`CENTRE_KEY`)."""
        return hashlib.sha256(self.document_mean.tobytes()).hexdigest()[:16]

    def uncentre_documents(self, vectors: Any) -> np.ndarray:
        """Invert :meth:`apply` on the document side: the unit vectors ``r`` whose
        ``unit(r - document_mean)`` are ``vectors`` (``[n, hidden]``).

        ``r = m + t c`` with ``t > 0`` the root of ``|m + t c| = 1``; exact because the
        mean of unit vectors has norm below 1. Used to refit the document mean of stored
        vectors without embedding the texts again.

        Raises:
            ValueError: for a width other than :attr:`hidden`, or a mean of norm 1 (every
                fitted vector identical: nothing to invert).
        """
        c = _unit_rows(_matrix(vectors, "centred vectors", self.hidden), "centred vectors")
        m = self.document_mean.astype(np.float64)
        rest = 1.0 - float(m @ m)
        if rest <= 0:
            raise ValueError("the document mean has norm 1: centred vectors cannot be inverted")
        mc = c.astype(np.float64) @ m
        t = -mc + np.sqrt(mc * mc + rest)
        return _unit_rows((m + t[:, None] * c).astype(np.float32), "recovered vectors")

    def mean(self, side: Side) -> np.ndarray:
        """The mean subtracted from ``side``'s vectors, ``[hidden]``.

        Raises:
            ValueError: for a side other than ``query`` or ``document``.
        """
        if side not in SIDES:
            raise ValueError(f"side must be 'query' or 'document', got {side!r}")
        return self.query_mean if side == "query" else self.document_mean

    def apply(self, vectors: Any, side: Side) -> np.ndarray:
        """Centre vectors of one side: ``unit(unit(v) - mean(side))`` per row.

        Args:
            vectors: ``[n, hidden]`` (or ``[hidden]``) vectors from the encoder config the
                centring was fitted with.
            side: ``"query"`` or ``"document"`` (chunks are documents).

        Returns:
            ``[n, hidden]`` float32 unit vectors (``[0, hidden]`` for none).

        Raises:
            ValueError: for an unknown side, a width other than :attr:`hidden`, a zero row,
                or a vector equal to the mean (nothing left to normalise).
        """
        mean = self.mean(side)
        x = np.asarray(vectors, dtype=np.float32)
        if x.ndim == 2 and not len(x):
            return np.zeros((0, self.hidden), dtype=np.float32)
        x = _matrix(x, f"{side} vectors", self.hidden)
        return _unit_rows(_unit_rows(x, f"{side} vectors") - mean, f"centred {side} vectors")

    def check_config(self, config: HTPConfig, *, model: str | None = None) -> None:
        """Refuse an encoder config (and model) other than the recorded ones.

        Raises:
            ValueError: naming the model, or the first differing setting by its flat name
                (:meth:`~htp_retrieval.config.HTPConfig.flat`).
        """
        if self.model is not None and model is not None and model != self.model:
            raise ValueError(f"this centring was fitted on model {self.model!r}, not "
                             f"{model!r}: fit one for this model (fit_centering)")
        if self.config is None:
            return
        mine = self.__dict__.get("_htp_config")
        if mine is None:  # parsed once: this runs on every centred call
            from htp_retrieval.config import HTPConfig

            mine = HTPConfig.from_dict(self.config)
            object.__setattr__(self, "_htp_config", mine)
        if mine == config:
            return
        a, b = mine.flat(), config.flat()
        key = next(k for k in a if a[k] != b[k])
        raise ValueError(f"this centring was fitted with config {key}={a[key]!r}, the "
                         f"encoder has {key}={b[key]!r}: fit one for this config "
                         "(fit_centering)")

    # ------------------------------------------------------------------ saving
    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable dict (means as lists of floats), read by :meth:`from_dict`."""
        return {"format": FORMAT, "version": 1,
                "document_mean": [float(v) for v in self.document_mean],
                "query_mean": [float(v) for v in self.query_mean],
                "n_documents": int(self.n_documents), "n_queries": int(self.n_queries),
                "query_source": self.query_source, "config": self.config,
                "model": self.model, "query_instruction": self.query_instruction,
                "document_instruction": self.document_instruction}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Centering:
        """Rebuild from :meth:`to_dict` output.

        Raises:
            ValueError: if ``data`` is not a saved centring or a field is invalid.
        """
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            raise ValueError(f"not a saved centring (no format {FORMAT!r}): make one with "
                             "fit_centering(...) and Centering.save(path)")
        keys = set(cls.__dataclass_fields__)
        unknown = set(data) - keys - {"format", "version"}
        if unknown:
            raise ValueError(f"unknown keys in a saved centring: {sorted(unknown)}")
        return cls(**{k: data[k] for k in keys if k in data})

    def save(self, path: str | Path) -> Path:
        """Write :meth:`to_dict` as JSON to ``path``; returns the path."""
        p = Path(path)
        with atomic_write(p) as f:
            f.write(json.dumps(self.to_dict()))
        return p

    @classmethod
    def load(cls, path: str | Path) -> Centering:
        """Read a centring saved by :meth:`save`.

        Raises:
            FileNotFoundError: if ``path`` does not exist.
            ValueError: if it is not JSON or not a saved centring (the path is named).
        """
        p = Path(path)
        if not p.is_file():
            raise FileNotFoundError(f"no centring file at {p}: save one with "
                                    "Centering.save(path)")
        try:
            return cls.from_dict(json.loads(p.read_text()))
        except (ValueError, TypeError) as e:
            raise ValueError(f"{p}: {e}") from None

    @classmethod
    def coerce(cls, value: Centering | Mapping[str, Any] | str | Path | None
               ) -> Centering | None:
        """A :class:`Centering` from itself, its :meth:`to_dict`, or a path to a saved one
        (``None`` stays ``None``).

        Raises:
            FileNotFoundError, ValueError: as :meth:`load` and :meth:`from_dict`.
            TypeError: for any other type.
        """
        if value is None or isinstance(value, Centering):
            return value
        if isinstance(value, Mapping):
            return cls.from_dict(value)
        if isinstance(value, (str, Path)):
            return cls.load(value)
        raise TypeError(f"centering must be a Centering, its to_dict() or a file path, not "
                        f"{type(value).__name__}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Centering):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"Centering(hidden={self.hidden}, n_documents={self.n_documents}, "
                f"n_queries={self.n_queries}, query_source={self.query_source!r}, "
                f"model={self.model!r})")


def read_query_file(path: str | Path) -> list[str]:
    """Query texts from a file: one per non-empty line, or the ``text`` of each line of a
    BEIR ``queries.jsonl``.

    Raises:
        FileNotFoundError: if the file does not exist.
        ValueError: if it holds no query, or a JSON line has no ``text`` (line named).
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"query sample {path}: no such file")
    out: list[str] = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        if p.suffix == ".jsonl":
            try:
                text = json.loads(line)["text"]
            except (ValueError, KeyError, TypeError):
                raise ValueError(f"{path} line {n}: not a JSON object with a 'text' "
                                 "field") from None
            out.append(str(text))
        else:
            out.append(line.strip())
    if not out:
        raise ValueError(f"{path} holds no query: one query per line")
    return out


def fit_centering(
    encoder: HTPEncoder,
    documents: Sequence[str],
    queries: Sequence[str],
    *,
    query_instruction: str | None,
    document_instruction: str | None = None,
    query_source: str = "",
    show_progress_bar: bool = False,
) -> Centering:
    """Embed a corpus and a query sample with ``encoder`` and fit a :class:`Centering`.

    Args:
        encoder: The encoder that will embed the collection and its queries.
        documents: ``[n_docs]`` texts of the corpus (or its chunks, as they are embedded).
        queries: ``[n_queries]`` query texts of the same kind as real queries (e.g. a
            task's train or dev queries, or queries already served); never the queries the
            centring will be evaluated on.
        query_instruction: Instruction queries are embedded with.
        document_instruction: Instruction documents are embedded with (usually none).
        query_source: Where the query sample came from (recorded).
        show_progress_bar: tqdm bars while embedding.

    Returns:
        The fitted :class:`Centering`, with the encoder's config, model and both
        instructions recorded.

    Raises:
        ValueError: if either list is empty, or for what :meth:`HTPEncoder.encode` raises.
    """
    if not len(documents) or not len(queries):
        raise ValueError(f"fit_centering needs documents and queries, got {len(documents)} "
                         f"and {len(queries)}")
    d = encoder.encode(list(documents), instruction=document_instruction,
                       show_progress_bar=show_progress_bar)
    q = encoder.encode(list(queries), instruction=query_instruction,
                       show_progress_bar=show_progress_bar)
    return Centering.fit(d, q, query_source=query_source, config=encoder.config.to_dict(),
                         model=encoder.model_name, query_instruction=query_instruction,
                         document_instruction=document_instruction)


__all__ = ["Centering", "fit_centering", "read_query_file", "CENTRE_KEY", "Side", "SIDES", "FORMAT"]
