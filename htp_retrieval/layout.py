"""Pure layout functions: where text, placeholders and templates go, and the index maps.

Nothing here touches a model, so every rule is testable on plain lists of ids.

The HTP sequence (paper Sec. 4.1, Eq. 3, with the Appendix C prefix)::

    <sink> [instruction] <B-PST>_1 .. <B-PST>_M  <PST>_1 S_1 .. <PST>_M S_M [suffix]

Position 0 (``<sink>``: BOS, or the tokenizer's substitute) is the model's attention sink
and is never a placeholder and never the target of a copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from htp_retrieval.methods import MethodSpec


@dataclass(frozen=True)
class TemplateIds:
    """Token ids of a method's template pieces.

    Attributes:
        before: Ids placed right before the text (e.g. PromptEOL's ``This sentence : "``).
        middle: Ids between the two copies of the text (Echo only).
        after: Ids after the text (e.g. ``" means in one word:"``).
    """

    before: tuple[int, ...] = ()
    middle: tuple[int, ...] = ()
    after: tuple[int, ...] = ()


@dataclass(frozen=True)
class Layout:
    """One input sequence and its index maps (positions are 0-based, unpadded).

    Attributes:
        input_ids: Token ids ``[seq]``; placeholders carry the ``<PST>``/``<B-PST>`` ids.
        pool_positions: Positions averaged by mean pooling: text tokens only (for Echo,
            the second copy), never placeholders, instruction or template tokens.
        last_position: Position read by last-token pooling (the final token).
        pst_positions: Positions of ``<PST>`` tokens, in block order.
        bpst_positions: Positions of ``<B-PST>`` tokens, in block order.
        local_copies: ``(dst, src)`` pairs applied first: ``<PST>_m <- end(S_m)`` (Sec. 4.2),
            or for Token Prepending ``<PST> <- last token``.
        global_copies: ``(dst, src)`` pairs applied second: ``<B-PST>_m <- <PST>_m``
            (Sec. 4.3).
        n_text_tokens: Number of text tokens after truncation (one copy).
    """

    input_ids: tuple[int, ...]
    pool_positions: tuple[int, ...]
    last_position: int
    pst_positions: tuple[int, ...] = ()
    bpst_positions: tuple[int, ...] = ()
    local_copies: tuple[tuple[int, int], ...] = ()
    global_copies: tuple[tuple[int, int], ...] = ()
    n_text_tokens: int = 0
    block_sizes: tuple[int, ...] = field(default=(), compare=False)

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def n_placeholders(self) -> int:
        """Number of ``<PST>`` plus ``<B-PST>`` tokens."""
        return len(self.pst_positions) + len(self.bpst_positions)


def token_sentence_index(
    token_offsets: Sequence[tuple[int, int]] | np.ndarray, sentence_starts: Sequence[int]
) -> list[int]:
    """Assign each token to the sentence holding its last character.

    Using the last character (not the first) keeps a token with a leading space, such as
    ``" The"``, in the sentence that the word starts.

    Args:
        token_offsets: ``(start, end)`` character offsets per token, ``[n_tokens]`` pairs
            or an ``[n_tokens, 2]`` integer array.
        sentence_starts: Character offsets where sentences start, ascending; the first
            is usually 0.

    Returns:
        Sentence index per token, ``[n_tokens]``, non-decreasing, starting at 0.
    """
    return token_sentence_array(token_offsets, sentence_starts).tolist()


def token_sentence_array(
    token_offsets: Sequence[tuple[int, int]] | np.ndarray, sentence_starts: Sequence[int]
) -> np.ndarray:
    """:func:`token_sentence_index` as an ``[n_tokens]`` int64 array (vectorized).

    Token t gets ``max(bisect_right(starts, max(start_t, end_t - 1)) - 1, 0)``, made
    non-decreasing (a running maximum, for odd offsets) and shifted so the first token's
    sentence is 0.
    """
    offs = np.asarray(token_offsets, dtype=np.int64).reshape(-1, 2)
    if len(offs) == 0:
        return np.zeros(0, dtype=np.int64)
    last_char = np.maximum(offs[:, 0], offs[:, 1] - 1)
    starts = np.asarray(sentence_starts, dtype=np.int64)
    idx = np.searchsorted(starts, last_char, side="right") - 1
    np.maximum(idx, 0, out=idx)
    np.maximum.accumulate(idx, out=idx)  # monotone even for odd offsets
    idx -= idx[0]
    return idx


def _sentence_runs(sentence_index: Sequence[int] | np.ndarray) -> np.ndarray:
    """Token indices where a new sentence (a run in ``sentence_index``) begins."""
    si = np.asarray(sentence_index)
    if si.size == 0:
        return np.zeros(0, dtype=np.int64)
    change = np.empty(si.size, dtype=bool)
    change[0] = True
    np.not_equal(si[1:], si[:-1], out=change[1:])
    return np.flatnonzero(change)


def sentence_block_starts(sentence_index: Sequence[int] | np.ndarray, k: int) -> list[int]:
    """Token indices where blocks of K sentences start.

    Args:
        sentence_index: Sentence index per token (from :func:`token_sentence_index`),
            ``[n_tokens]``.
        k: Sentences per block (K >= 1, paper Sec. 4.1).

    Returns:
        Ascending token indices, the first being 0; empty for an empty input. Sentences
        are counted by the runs in ``sentence_index`` (sentences that own tokens), so K
        counts non-empty sentences.

    Raises:
        ValueError: if ``k < 1``.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return _sentence_runs(sentence_index)[::k].tolist()


def count_sentences(sentence_index: Sequence[int] | np.ndarray) -> int:
    """Number of sentences that own at least one token (runs in ``sentence_index``)."""
    return int(_sentence_runs(sentence_index).size)


LongBudget = tuple[int, int]
"""``(L, B_L)``: a document of more than L text tokens gets at most B_L blocks."""

ShortBudget = tuple[int, int]
"""``(S, B_S)``: a document of at most S text tokens gets at most B_S blocks."""


def adaptive_k(
    n_sentences: int,
    k: int = 1,
    max_blocks: int | None = None,
    *,
    n_tokens: int | None = None,
    min_block_tokens: int | None = None,
    long_budget: LongBudget | None = None,
    short_budget: ShortBudget | None = None,
) -> int:
    """K for one document under a block budget (adaptive K, research/ANALYSIS.md section 8).

    The paper finds K = 1 best for short documents and larger K for long ones, as too many
    ``<B-PST>`` tokens push the model out of distribution (Sec. 5.3, Table 12). This policy
    keeps K at its minimum ``k`` until the document would need more than its budget of
    blocks, then grows it: ``K = max(k, ceil(n_sentences / budget))``, so a document never
    gets more than ``budget`` ``<PST>``/``<B-PST>`` pairs. The budget is
    :func:`block_budget` of the document's text tokens: ``max_blocks``; with
    ``min_block_tokens = T`` also at most ``max(1, n_tokens // T)``, so a text of very short
    sentences (passkey filler, lists) gets no more than one block per T text tokens on
    average (the placeholder density, research/ANALYSIS.md section 10); with ``long_budget =
    (L, B_L)`` at most B_L past L text tokens (research/ANALYSIS.md section 13); with
    ``short_budget = (S, B_S)`` at most B_S up to S text tokens (research/ANALYSIS.md
    section 16).

    Args:
        n_sentences: Sentences in the (truncated) document.
        k: Minimum sentences per block (K >= 1).
        max_blocks: Block budget per document; ``None``: no cap on the count.
        n_tokens: Text tokens in the (truncated) document; needed with
            ``min_block_tokens`` or ``long_budget``.
        min_block_tokens: T, text tokens per block on average at least; ``None``: no
            density cap.
        long_budget: ``(L, B_L)``, the budget of documents longer than L text tokens;
            ``None``: none.
        short_budget: ``(S, B_S)``, the budget of documents of at most S text tokens;
            ``None``: none.

    Raises:
        ValueError: if ``k < 1``, a budget or T is below 1, or ``min_block_tokens``,
            ``long_budget`` or ``short_budget`` is given without ``n_tokens``.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if (min_block_tokens is not None or long_budget is not None
            or short_budget is not None) and n_tokens is None:
        raise ValueError("min_block_tokens, long_budget or short_budget needs n_tokens (the "
                         "document's text tokens)")
    budget = block_budget(max(1, n_tokens or 1), max_blocks, min_block_tokens, long_budget,
                          short_budget)
    if budget is None:
        return k
    return max(k, -(-n_sentences // budget))


def block_budget(
    n_tokens: int,
    max_blocks: int | None,
    min_block_tokens: int | None = None,
    long_budget: LongBudget | None = None,
    short_budget: ShortBudget | None = None,
) -> int | None:
    """The most blocks :func:`adaptive_k` gives a document of ``n_tokens`` text tokens.

    ``min(B, max(1, n_tokens // T), B_L if n_tokens > L, B_S if n_tokens <= S)`` over the
    parts that are set; ``None`` when none is.

    Args:
        n_tokens: Text tokens in the (truncated) document.
        max_blocks: Block budget B (``None``: none).
        min_block_tokens: Density cap T (``None``: none).
        long_budget: ``(L, B_L)`` (``None``: none).
        short_budget: ``(S, B_S)`` (``None``: none).

    Raises:
        ValueError: if ``n_tokens``, B, T, L, B_L, S or B_S is below 1.
    """
    if n_tokens < 1:
        raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
    if max_blocks is not None and max_blocks < 1:
        raise ValueError(f"max_blocks must be >= 1, got {max_blocks}")
    caps = [] if max_blocks is None else [max_blocks]
    if min_block_tokens is not None:
        if min_block_tokens < 1:
            raise ValueError(f"min_block_tokens must be >= 1, got {min_block_tokens}")
        caps.append(max(1, n_tokens // min_block_tokens))
    if long_budget is not None:
        after, blocks = as_long_budget(long_budget)  # type: ignore[misc]
        if n_tokens > after:
            caps.append(blocks)
    if short_budget is not None:
        upto, blocks = as_long_budget(short_budget, name="short_budget")  # type: ignore[misc]
        if n_tokens <= upto:
            caps.append(blocks)
    return min(caps) if caps else None


def as_long_budget(value: object, *, name: str = "long_budget") -> LongBudget | None:
    """Check a long- or short-text budget: ``(L, B_L)`` (tuple or list, as presets give it)
    or none.

    Args:
        value: The budget.
        name: What the error message calls it (``long_budget``, ``short_budget``).

    Returns:
        ``(L, B_L)`` as a tuple, or ``None`` for ``None`` and ``0``.

    Raises:
        ValueError: if it is not two integers >= 1 (the message names the value).
    """
    if value is None or value == 0:
        return None
    if (isinstance(value, (tuple, list)) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)):
        return (value[0], value[1])
    raise ValueError(f"{name} must be (L, B_L) with both >= 1, 0 or None, got {value!r}")


def parse_long_budget(text: str, *, name: str = "long budget") -> LongBudget | None:
    """Parse ``"L:B_L"`` (e.g. ``"1024:8"``) into ``(L, B_L)``; ``"0"``/``"none"``: ``None``.

    Also parses a short-text budget ``"S:B_S"`` (``name="short budget"``, for the message).

    Raises:
        ValueError: naming the text, if it is not two integers >= 1 joined by ``:``.
    """
    raw = str(text).strip().lower()
    if raw in ("0", "none", "off"):
        return None
    after, sep, blocks = raw.partition(":")
    try:
        budget = (int(after), int(blocks))
    except ValueError:
        budget = (0, 0)
    if not sep or min(budget) < 1:
        raise ValueError(f"{name} {text!r} is not L:B_L (two integers >= 1, e.g. "
                         "1024:8) or 0 for none")
    return budget


def same_block_budgets(
    a: tuple[int | None, int | None, LongBudget | None]
    | tuple[int | None, int | None, LongBudget | None, ShortBudget | None],
    b: tuple[int | None, int | None, LongBudget | None]
    | tuple[int | None, int | None, LongBudget | None, ShortBudget | None],
    max_text_tokens: int,
) -> bool:
    """Whether two budgets ``(B, T, (L, B_L)[, (S, B_S)])`` agree for every length up to a
    max length (the short-text budget is optional: absent, none).

    If they do, :func:`adaptive_k` gives every document truncated to ``max_text_tokens``
    the same K under both, so the layouts are identical (with T = 64 and 512 tokens,
    B = 8 and B = 32 both allow at most 8 blocks).

    Raises:
        ValueError: if ``max_text_tokens < 1`` or a budget part is below 1.
    """
    if max_text_tokens < 1:
        raise ValueError(f"max_text_tokens must be >= 1, got {max_text_tokens}")
    return all(block_budget(n, *a) == block_budget(n, *b) for n in range(1, max_text_tokens + 1))


def token_block_starts(n_tokens: int, n: int) -> list[int]:
    """Token indices where fixed blocks of N tokens start (the paper's Fig. 7 ablation).

    Raises:
        ValueError: if ``n < 1``.
    """
    if n < 1:
        raise ValueError(f"tokens per block must be >= 1, got {n}")
    return list(range(0, n_tokens, n))


def auto_tokens_per_block(n_tokens: int, n_sentence_blocks: int) -> int:
    """N for the sentence-vs-fixed-token ablation (paper Sec. 5.4, Fig. 7).

    ``N = floor(n_tokens / n_sentence_blocks)`` (at least 1), so fixed blocks of N tokens
    give about as many ``<PST>`` as the document has sentence blocks.

    Args:
        n_tokens: Text tokens of the document (after truncation).
        n_sentence_blocks: Sentence blocks of the same text (sentences when K = 1).
    """
    return max(1, n_tokens // max(1, n_sentence_blocks))


def build_layout(
    *,
    spec: MethodSpec,
    text_ids: Sequence[int],
    block_starts: Sequence[int],
    prefix_ids: Sequence[int],
    template: TemplateIds,
    pst_id: int,
    bpst_id: int,
    allow_placeholder_at_zero: bool = False,
) -> Layout:
    """Assemble one input sequence for a method and compute its index maps.

    Args:
        spec: The method.
        text_ids: Text token ids, already truncated to the max length (placeholders are
            added after truncation, so they are never cut).
        block_starts: Token indices (into ``text_ids``) where blocks start; used by the
            ``local`` and ``hierarchical`` schemes. Must start at 0.
        prefix_ids: Ids before everything else: the sink token (BOS) and the instruction.
            Must be non-empty when the method has placeholders, so that position 0 is
            never a placeholder.
        template: The method's template pieces.
        pst_id: Token id of ``<PST>``.
        bpst_id: Token id of ``<B-PST>``.
        allow_placeholder_at_zero: Diagnostics only (the sink ablation, research/ANALYSIS.md): allow an
            empty prefix, so ``<B-PST>_1`` (or ``<PST>``) sits at position 0, the attention
            sink, and its copies overwrite the sink's state. Never the default.

    Returns:
        The :class:`Layout`.

    Raises:
        ValueError: if ``text_ids`` is empty, if ``block_starts`` does not start at 0 or is
            not ascending within the text, or if a placeholder would land at position 0.
    """
    if len(text_ids) == 0:
        raise ValueError("text_ids is empty")
    ids: list[int] = list(prefix_ids)
    pool: list[int] = []
    pst: list[int] = []
    bpst: list[int] = []
    local: list[tuple[int, int]] = []
    glob: list[tuple[int, int]] = []
    sizes: list[int] = []

    if spec.placeholders != "none" and not prefix_ids and not allow_placeholder_at_zero:
        raise ValueError(
            "prefix_ids is empty: a placeholder would sit at position 0, the attention "
            "sink; pass a BOS/sink token in prefix_ids"
        )

    if spec.placeholders in ("local", "hierarchical"):
        starts = list(block_starts)
        if not starts or starts[0] != 0:
            raise ValueError(f"block_starts must start at 0, got {starts[:3]}")
        if any(b <= a for a, b in zip(starts, starts[1:])) or starts[-1] >= len(text_ids):
            raise ValueError("block_starts must be strictly ascending and inside the text")
        bounds = list(zip(starts, starts[1:] + [len(text_ids)]))
    else:
        bounds = [(0, len(text_ids))]

    if spec.placeholders == "hierarchical":
        bpst = list(range(len(ids), len(ids) + len(bounds)))
        ids.extend([bpst_id] * len(bounds))

    ids.extend(template.before)

    if spec.template == "echo":
        ids.extend(text_ids)
        ids.extend(template.middle)
        pool = list(range(len(ids), len(ids) + len(text_ids)))
        ids.extend(text_ids)
    elif spec.placeholders in ("local", "hierarchical"):
        for a, b in bounds:
            pst.append(len(ids))
            ids.append(pst_id)
            pool.extend(range(len(ids), len(ids) + (b - a)))
            ids.extend(text_ids[a:b])
            local.append((pst[-1], len(ids) - 1))  # <PST>_m <- end(S_m)
            sizes.append(b - a)
    else:
        if spec.placeholders == "tp":
            pst.append(len(ids))
            ids.append(pst_id)
        pool = list(range(len(ids), len(ids) + len(text_ids)))
        ids.extend(text_ids)

    ids.extend(template.after)
    last = len(ids) - 1
    if spec.placeholders == "tp":
        local.append((pst[0], last))  # Token Prepending: <PST> <- last token
    if spec.placeholders == "hierarchical":
        glob = list(zip(bpst, pst))  # <B-PST>_m <- <PST>_m

    if (0 in pst or 0 in bpst) and not allow_placeholder_at_zero:
        raise ValueError("a placeholder landed at position 0 (the attention sink)")
    return Layout(
        input_ids=tuple(ids),
        pool_positions=tuple(pool),
        last_position=last,
        pst_positions=tuple(pst),
        bpst_positions=tuple(bpst),
        local_copies=tuple(local),
        global_copies=tuple(glob),
        n_text_tokens=len(text_ids),
        block_sizes=tuple(sizes),
    )


def render_layout(layout: Layout, tokens: Sequence[str]) -> str:
    """Render a layout as text, like the paper's Appendix C example.

    Args:
        layout: The layout.
        tokens: The token string per position (``tokenizer.convert_ids_to_tokens``), with
            placeholders already rendered as ``<PST>``/``<B-PST>``.

    Returns:
        One string; pooled text tokens are shown as they are, other tokens in brackets
        ``[..]`` so the reader sees what mean pooling excludes.
    """
    pooled = set(layout.pool_positions)
    out = []
    for i, t in enumerate(tokens):
        out.append(t if i in pooled or t in ("<PST>", "<B-PST>") else f"[{t}]")
    return " ".join(out)
