"""Result file names: the method plus a short hash of everything that defines the run.

A results JSON stores its run under ``"run"`` (:func:`run_identity`): the model, the
resolved dtype and padding side, the whole resolved
:class:`~htp_retrieval.config.HTPConfig` and the data settings (subsample, synthetic
context, chunking, centring sample). Its file name is ``<method>__<digest>.json``
(:func:`result_file_name`), so two runs share a file exactly when they define the same
embeddings on the same data, and ``eval`` reuses a file when asked for the same run. A
readable label (:func:`run_label`: the method and the settings given on the command line)
is stored beside it for tables and logs; it never decides which file a run uses.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from htp_retrieval.config import HTPConfig

DIGEST_CHARS = 8
"""Hex characters of the run digest in a file name (32 bits)."""


def run_identity(
    *,
    model: str,
    dtype: str,
    padding_side: str,
    config: HTPConfig | Mapping[str, Any],
    data: Mapping[str, Any] | None = None,
    query_config: HTPConfig | Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What defines one result: the dict whose digest names its file.

    Args:
        model: The model as the run names it (``config["model"]``: a packaged name, a
            path, a hub id).
        dtype: The resolved weight dtype (``bfloat16``, ``float32``, ``float16``).
        padding_side: ``right`` or ``left``.
        config: The whole resolved config (an :class:`HTPConfig` or its
            :meth:`~HTPConfig.to_dict`).
        data: Data settings (:func:`data_settings`); ``None``-valued keys are dropped.
        query_config: A separate query encoder's config, where queries used one.

    Returns:
        ``{"model", "dtype", "padding_side", "htp_config", "data"[, "query_htp_config"]}``,
        JSON-ready.
    """
    def as_dict(c: HTPConfig | Mapping[str, Any]) -> dict[str, Any]:
        return c.to_dict() if isinstance(c, HTPConfig) else HTPConfig.from_dict(c).to_dict()

    out: dict[str, Any] = {
        "model": str(model), "dtype": str(dtype), "padding_side": str(padding_side),
        "htp_config": as_dict(config),
        "data": {k: v for k, v in (data or {}).items() if v is not None},
    }
    if query_config is not None:
        out["query_htp_config"] = as_dict(query_config)
    return out


def data_settings(
    *,
    max_queries: int = 0,
    max_docs: int = 0,
    seed: int = 0,
    context_length: int | None = None,
    synthetic_tokenizer: str | None = None,
    chunking: Mapping[str, Any] | None = None,
    center_queries: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The data part of a run's identity; settings at their defaults are left out.

    Args:
        max_queries, max_docs: Subsample sizes (``0``: all).
        seed: Subsample, synthetic generation and cross-fit seed; recorded with a
            subsample, a synthetic context or a centring sample.
        context_length: Needle/passkey context length in tokens.
        synthetic_tokenizer: The tokenizer that measured synthetic lengths, when not the
            default.
        chunking: Evidence-span runs: ``{"chunking", "chunk_tokens", "chunk_overlap",
            "late_window"}``.
        center_queries: The centring sample's label
            (:func:`htp_retrieval.eval.centred.sample_label`).
        extra: Extra config keys a caller records with the run (they define it too).
    """
    out: dict[str, Any] = {}
    if max_queries or max_docs:
        out["subset"] = {"max_queries": int(max_queries), "max_docs": int(max_docs)}
    if out or context_length is not None or center_queries:
        out["seed"] = int(seed)
    if context_length is not None:
        out["context_length"] = int(context_length)
        if synthetic_tokenizer:
            out["synthetic_tokenizer"] = synthetic_tokenizer
    if chunking:
        out["chunking"] = dict(chunking)
    if center_queries:
        out["center_queries"] = center_queries
    if extra:
        out["extra"] = json.loads(json.dumps(dict(extra), sort_keys=True))
    return out


def run_digest(identity: Mapping[str, Any], length: int = DIGEST_CHARS) -> str:
    """Hex SHA-256 of the identity's canonical JSON (sorted keys), first ``length`` chars."""
    blob = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)


def result_file_name(identity: Mapping[str, Any]) -> str:
    """``<method>__<digest>.json`` for a :func:`run_identity`."""
    return f"{_safe(identity['htp_config']['method'])}__{run_digest(identity)}.json"


def run_label(method: str, tags: list[str] | tuple[str, ...] = ()) -> str:
    """A readable label: the method and the tags of settings given explicitly, joined by
    ``__`` (``htp__mb8__tp3-12``)."""
    return "__".join([_safe(method), *(_safe(t) for t in tags if t)])


def subset_of_run(run: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """``(max_queries, max_docs, seed)`` of a stored run, or ``None`` for a full split."""
    data = run.get("data") or {}
    sub = data.get("subset")
    if not sub:
        return None
    return int(sub["max_queries"]), int(sub["max_docs"]), int(data.get("seed", 0))


__all__ = ["DIGEST_CHARS", "run_identity", "data_settings", "run_digest",
           "result_file_name", "run_label", "subset_of_run"]
