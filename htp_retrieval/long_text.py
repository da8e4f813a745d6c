"""Texts longer than one forward pass: overlapping windows, and late-chunking windows.

Pure functions on token offsets and character spans; :class:`~htp_retrieval.HTPEncoder`
uses them for ``overflow="window"`` and :meth:`~htp_retrieval.HTPEncoder.encode_late_chunks`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from htp_retrieval.chunking import Chunk, chunk_token_ranges

Overflow = Literal["window", "truncate", "error"]
"""What :class:`~htp_retrieval.HTPEncoder` does with a text of more than ``max_length``
tokens: ``window`` embeds overlapping windows of at most ``max_length`` tokens and averages
them weighted by their token counts, ``truncate`` keeps the first ``max_length`` tokens and
logs a warning naming the text and the tokens dropped, ``error`` raises ``ValueError``."""

OVERFLOWS: tuple[str, ...] = ("window", "truncate", "error")

MAX_DEFAULT_LENGTH = 8192
"""Cap of the default ``max_length`` (tokens): a model's context window, at most this."""

LAYOUT_RESERVE = 128
"""Tokens of the context window left for the sink, instruction, template and placeholders
when ``max_length`` defaults to the context window."""

WINDOW_MARGIN = 8
"""Tokens kept free in each window: re-tokenizing a window's text can give a token or two
more than its share of the document's tokens."""


def default_max_length(max_position_embeddings: int | None) -> int:
    """The default ``max_length`` in text tokens for a model's context window.

    Args:
        max_position_embeddings: The model config's value (``None``: unknown).

    Returns:
        ``min(max_position_embeddings, 8192) - 128`` (8192 when unknown), at least 64.
    """
    window = min(max_position_embeddings or MAX_DEFAULT_LENGTH, MAX_DEFAULT_LENGTH)
    return max(64, window - LAYOUT_RESERVE)


@dataclass(frozen=True)
class Window:
    """One window of a long text.

    Attributes:
        start: First character (inclusive) in the text.
        end: Last character (exclusive).
        n_tokens: Tokens of the text inside the window (its weight when pooled).
    """

    start: int
    end: int
    n_tokens: int


def overlapping_windows(
    offsets: np.ndarray | Sequence[tuple[int, int]], max_length: int
) -> list[Window]:
    """Cut a tokenized text into overlapping windows of at most ``max_length`` tokens.

    Windows hold ``max_length - 8`` tokens (:data:`WINDOW_MARGIN`) and overlap by an
    eighth of that; the last one ends at the last token.

    Args:
        offsets: ``[n_tokens, 2]`` character ``(start, end)`` per token.
        max_length: Token budget of one window.

    Returns:
        ``[n_windows]`` windows in text order (one window when the text fits).

    Raises:
        ValueError: if ``max_length`` leaves no room for a window (below 16 tokens).
    """
    offs = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    n = len(offs)
    size = max_length - WINDOW_MARGIN
    if size < 8:
        raise ValueError(f"max_length={max_length} is too small to cut windows (need >= 16)")
    if n <= max_length:
        return [Window(int(offs[0, 0]), int(offs[-1, 1]), n)] if n else []
    stride = size - size // 8
    out = []
    a = 0
    while True:
        b = min(a + size, n)
        out.append(Window(int(offs[a, 0]), int(offs[b - 1, 1]), b - a))
        if b == n:
            return out
        a += stride


@dataclass(frozen=True)
class LateWindow:
    """A window of whole chunks for late chunking.

    Attributes:
        start: First character of the window in its document (its first chunk's start).
        end: Last character (exclusive; its last chunk's end).
        chunks: Indices of the chunks it embeds, consecutive.
    """

    start: int
    end: int
    chunks: tuple[int, ...]


def late_windows(
    offsets: np.ndarray | Sequence[tuple[int, int]], chunks: Sequence[Chunk], window_tokens: int
) -> list[LateWindow]:
    """Group a document's consecutive chunks into windows of at most ``window_tokens``.

    Each window is one forward pass; a chunk is never split across windows. A chunk longer
    than a window gets a window of its own (its tokens beyond the budget are the caller's
    to report).

    Args:
        offsets: ``[n_tokens, 2]`` character offsets of the document's tokens.
        chunks: The document's chunks in order (:func:`~htp_retrieval.chunking.split_chunks`).
        window_tokens: Token budget of a window (:data:`WINDOW_MARGIN` kept free).

    Returns:
        ``[n_windows]`` windows covering every chunk once, in order.
    """
    ranges = chunk_token_ranges(offsets, chunks)
    budget = max(1, window_tokens - WINDOW_MARGIN)
    out: list[LateWindow] = []
    cur: list[int] = []
    first_tok = 0
    for i, (a, b) in enumerate(ranges):
        if cur and b - first_tok > budget:
            out.append(LateWindow(chunks[cur[0]].start, chunks[cur[-1]].end, tuple(cur)))
            cur = []
        if not cur:
            first_tok = a
        cur.append(i)
    if cur:
        out.append(LateWindow(chunks[cur[0]].start, chunks[cur[-1]].end, tuple(cur)))
    return out


def block_starts_for_chunks(ranges: Sequence[tuple[int, int]], n_tokens: int) -> list[int]:
    """HTP block starts (text-token indices) aligned to chunk starts.

    One block per chunk, so no block straddles a chunk boundary; overlapping chunks start a
    block where each new chunk starts. The first block starts at token 0.

    Args:
        ranges: ``[n_chunks]`` token ranges of the chunks within the window.
        n_tokens: Text tokens in the window.

    Returns:
        Strictly increasing starts, the first 0, all below ``n_tokens``.
    """
    starts = sorted({0, *(a for a, _ in ranges if 0 < a < n_tokens)})
    return starts


TRUNCATION_MARK = "htp_truncation"
"""Attribute the encoder sets on its truncation warning records
(:func:`truncation_warnings_off`)."""

ENCODER_LOGGER = "htp_retrieval.encoder"
"""Name of the logger that carries the encoder's truncation warnings."""


def _not_truncation(record: logging.LogRecord) -> bool:
    return not getattr(record, TRUNCATION_MARK, False)


@contextlib.contextmanager
def truncation_warnings_off() -> Iterator[None]:
    """Drop the encoder's per-call truncation warnings while the block runs (other warnings
    pass), for callers that cut texts on purpose or report truncation themselves: the
    bench truncates every setting to its length; ``ingest`` names truncated documents by
    id in its report. The filter is removed on exit, also on errors. Importing this does
    not import torch."""
    log = logging.getLogger(ENCODER_LOGGER)
    log.addFilter(_not_truncation)
    try:
        yield
    finally:
        log.removeFilter(_not_truncation)


__all__ = ["Overflow", "OVERFLOWS", "Window", "LateWindow", "default_max_length",
           "overlapping_windows", "late_windows", "block_starts_for_chunks",
           "MAX_DEFAULT_LENGTH", "LAYOUT_RESERVE", "WINDOW_MARGIN",
           "truncation_warnings_off", "TRUNCATION_MARK"]
