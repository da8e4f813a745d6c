"""Chunk boundaries for long documents: character spans cut to a token budget.

Boundaries come from LangChain's ``RecursiveCharacterTextSplitter`` measured in the model's
own tokens, with separators tried in order: paragraph, line, sentence end, clause, word,
character. A chunk therefore never straddles a sentence when the sentence fits in the
budget. Each :class:`Chunk` carries its character span, so ``text[start:end]`` is the
chunk's text; the token ranges used by late chunking (Günther et al. 2024,
arXiv 2409.04701) are derived from those spans and the tokenizer's offsets
(:func:`chunk_token_ranges`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

Chunking = Literal["none", "naive", "late"]
"""How a long document becomes vectors: ``none`` one vector per document, ``naive`` each
chunk embedded on its own, ``late`` each chunk pooled from one pass over its document
(contextual chunk embeddings)."""

CHUNKINGS: tuple[str, ...] = ("none", "naive", "late")

DEFAULT_CHUNK_TOKENS = 512
"""Chunk size in the model's tokens where none is given: ``ingest``, the Chroma embedding
function, the LangChain and LlamaIndex chunking helpers and the examples (why this size:
docs/RAG.md, "Chunk size"). The chunk-level eval's ``--chunk-tokens`` defaults to 256, the
size of its tables."""

SEPARATORS: tuple[str, ...] = (
    "\n\n",                 # paragraph
    "\n",                   # line (a speaker turn in meeting transcripts)
    r"(?<=[.!?])\s+",       # sentence end
    r"(?<=[;:,])\s+",       # clause
    " ",                    # word
    "",                     # character
)
"""Separators tried in order (regular expressions), from paragraph to character."""


@dataclass(frozen=True)
class Chunk:
    """One chunk of a document.

    Attributes:
        index: Position of the chunk in its document (0-based).
        start: First character (inclusive) in the document text.
        end: Last character (exclusive); ``text[start:end]`` is the chunk's text.
    """

    index: int
    start: int
    end: int

    def text(self, document: str) -> str:
        """The chunk's text in ``document``."""
        return document[self.start : self.end]


def check_chunk_settings(chunk_tokens: int, chunk_overlap: int) -> None:
    """Validate a chunk size and overlap (tokens).

    Raises:
        ValueError: if ``chunk_tokens < 16`` or the overlap is negative or not below half
            of the chunk size.
    """
    if chunk_tokens < 16:
        raise ValueError(f"chunk size must be >= 16 tokens, got {chunk_tokens}")
    if not 0 <= chunk_overlap < chunk_tokens // 2:
        raise ValueError(f"chunk overlap must be in [0, {chunk_tokens // 2}) tokens "
                         f"(below half the chunk size), got {chunk_overlap}")


def text_splitter(tokenizer: Any, chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
                  chunk_overlap: int = 0, *,
                  add_start_index: bool = False) -> Any:
    """LangChain's ``RecursiveCharacterTextSplitter`` measured in ``tokenizer``'s tokens.

    Separators :data:`SEPARATORS` (paragraph to character), whitespace-trimmed chunks.

    Args:
        tokenizer: A Hugging Face tokenizer (lengths are in its tokens, no special tokens).
        chunk_tokens: Chunk size in tokens.
        chunk_overlap: Overlap between consecutive chunks in tokens.
        add_start_index: Put each chunk's character offset in ``metadata["start_index"]``
            (``split_documents``/``create_documents``).

    Raises:
        ValueError: for invalid sizes (:func:`check_chunk_settings`).
        ImportError: without ``langchain-text-splitters``.
    """
    check_chunk_settings(chunk_tokens, chunk_overlap)
    try:
        from langchain_text_splitters import RecursiveCharacterTextSplitter
    except ImportError as e:  # pragma: no cover - a core dependency
        raise ImportError("chunking needs langchain-text-splitters: "
                          "pip install langchain-text-splitters") from e

    def n_tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False, split_special_tokens=True)
                   .input_ids)

    return RecursiveCharacterTextSplitter(
        separators=list(SEPARATORS), is_separator_regex=True, keep_separator="end",
        chunk_size=chunk_tokens, chunk_overlap=chunk_overlap, length_function=n_tokens,
        strip_whitespace=True, add_start_index=add_start_index)


def split_chunks(
    text: str, tokenizer: Any, *, chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    chunk_overlap: int = 0
) -> list[Chunk]:
    """Cut a document into chunks of at most about ``chunk_tokens`` tokens.

    Chunks are whitespace-trimmed spans in document order; consecutive chunks share about
    ``chunk_overlap`` tokens. A text within the budget is one chunk. The token counts are
    measured on the pieces the splitter joins, so a chunk can exceed the budget by a few
    tokens where a join changes the tokenization.

    Args:
        text: The document.
        tokenizer: The embedding model's tokenizer (lengths are in its tokens).
        chunk_tokens: Chunk size in tokens.
        chunk_overlap: Overlap between consecutive chunks in tokens.

    Returns:
        ``[n_chunks]`` :class:`Chunk` (empty for a whitespace-only text).

    Raises:
        ValueError: for invalid sizes (:func:`check_chunk_settings`).
    """
    pieces = text_splitter(tokenizer, chunk_tokens, chunk_overlap).split_text(text)
    chunks: list[Chunk] = []
    pos = 0
    for piece in pieces:
        start = text.find(piece, pos)
        if start < 0:  # cannot happen for a splitter that returns substrings
            raise RuntimeError(f"chunk {len(chunks)} is not a substring of its document")
        chunks.append(Chunk(len(chunks), start, start + len(piece)))
        pos = start + 1
    return chunks


def chunk_token_ranges(
    offsets: np.ndarray | Sequence[tuple[int, int]], chunks: Sequence[Chunk]
) -> list[tuple[int, int]]:
    """Token range ``[first, last)`` of each chunk, from the tokenizer's offsets.

    A token belongs to a chunk when its last character lies inside the chunk's span (the
    rule :func:`~htp_retrieval.layout.token_sentence_index` uses for sentences).

    Args:
        offsets: ``[n_tokens, 2]`` character ``(start, end)`` per token of the document.
        chunks: The document's chunks, in order.

    Returns:
        ``[n_chunks]`` token ranges; a chunk shorter than a token gets the token holding it.
    """
    offs = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    last_char = np.maximum(offs[:, 1] - 1, offs[:, 0])
    ranges = []
    for c in chunks:
        a = int(np.searchsorted(last_char, c.start, side="left"))
        b = int(np.searchsorted(last_char, c.end, side="left"))
        if b <= a:  # the chunk sits inside one token
            a = min(a, len(offs) - 1)
            b = a + 1
        ranges.append((a, b))
    return ranges


__all__ = ["text_splitter", "Chunk", "Chunking", "CHUNKINGS", "DEFAULT_CHUNK_TOKENS",
           "SEPARATORS", "split_chunks",
           "chunk_token_ranges", "check_chunk_settings"]
