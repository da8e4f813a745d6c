"""The encode pipeline's parts: batches, cost counters, the prefetch thread.

:class:`HTPEncoder <htp_retrieval.encoder.HTPEncoder>` prepares layouts (tokenize, split
sentences, lay out), cuts them into padded :class:`BatchInputs`, and, with the pipeline on,
prepares batch n+1 in a :class:`Prefetcher` thread while batch n runs its forward pass
(docs/PERFORMANCE.md section 5); :class:`EncodeStats` counts where the time went.
"""

from __future__ import annotations

import contextlib
import gc
import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from htp_retrieval.prepare_pool import CHARS_PER_TOKEN, capped_sizes, cut_windows
from htp_retrieval.rewiring import CopyPlan


@dataclass
class EncodeStats:
    """Cost counters of the last :meth:`HTPEncoder.encode` call.

    Attributes:
        n_texts: Texts encoded.
        text_tokens: Text tokens after truncation (one copy per text).
        input_tokens: Tokens fed to the model, placeholders and templates included.
        padded_tokens: Tokens in the padded batches (``sum(batch_rows * batch_len)``).
        prepare_seconds: Tokenization, segmentation and layout building, in seconds
            (summed over windows; in the pipeline partly hidden behind the forward pass,
            see ``wait_seconds``).
        forward_seconds: Decoder forward passes (copies included; the batch tensors are
            ``inputs_seconds``), in seconds.
        pool_seconds: Pooling, normalization and the copy to host memory, in seconds.
        total_seconds: Wall time of the call, in seconds.
        tokenize_seconds: Tokenization (with offsets) and truncation, part of
            ``prepare_seconds``.
        segment_seconds: Sentence segmentation and token-to-block assignment, part of
            ``prepare_seconds``.
        layout_seconds: Layout building (placeholders, copy and pooling maps), part of
            ``prepare_seconds``.
        copy_seconds: Wall time inside the copy hooks, part of ``forward_seconds`` (host
            time; on CUDA only the launches, see :func:`~htp_retrieval.rewiring.run_decoder`).
        batches: ``(rows, longest row in tokens)`` per batch.
        inputs_seconds: Building each batch's tensors (ids, pooling weights, copy indices;
            pinned and copied to the GPU on CUDA), in seconds; in the pipeline this runs
            in the prefetch thread.
        wait_seconds: Time the forward loop waited for a prepared batch, in seconds. Without
            the pipeline every preparation is waited for; with it, only what the forward
            pass of the previous batch did not cover (at least the first batch's).
        pipelined: Whether batches were prepared in a background thread.
        timeline: ``(start, end)`` of each batch's forward and pooling, seconds since the
            call began, ``[n_batches]``.
        prepare_timeline: ``(start, end)`` of each batch's preparation (its window's layout
            included for the window's first batch), seconds since the call began.
        truncated: ``(text index, tokens before truncation)`` of each text cut to
            ``max_length`` (``overflow="truncate"``).
        windowed: Texts embedded in overlapping windows (``overflow="window"``).
        n_windows: Windows those texts were cut into.
    """

    n_texts: int = 0
    text_tokens: int = 0
    input_tokens: int = 0
    padded_tokens: int = 0
    prepare_seconds: float = 0.0
    forward_seconds: float = 0.0
    pool_seconds: float = 0.0
    total_seconds: float = 0.0
    tokenize_seconds: float = 0.0
    segment_seconds: float = 0.0
    layout_seconds: float = 0.0
    copy_seconds: float = 0.0
    batches: list[tuple[int, int]] = field(default_factory=list)
    inputs_seconds: float = 0.0
    wait_seconds: float = 0.0
    pipelined: bool = False
    timeline: list[tuple[float, float]] = field(default_factory=list)
    prepare_timeline: list[tuple[float, float]] = field(default_factory=list)
    truncated: list[tuple[int, int]] = field(default_factory=list)
    windowed: int = 0
    n_windows: int = 0

    @property
    def padding_fraction(self) -> float:
        """Share of padded batch slots that hold padding (0..1)."""
        return 0.0 if not self.padded_tokens else 1 - self.input_tokens / self.padded_tokens


@dataclass
class BatchInputs:
    """One padded batch, ready for the forward pass (tensors on the model's device).

    Attributes:
        ids: Token ids ``[batch, width]`` (placeholders carry their ids).
        attention_mask: Padding mask ``[batch, width]`` for left padding, ``None`` for
            right padding (the causal mask alone is exact there).
        position_ids: ``[1, width]`` (right padding) or ``[batch, width]`` (left padding).
        pool: Mean-pooling weights ``[batch, width]`` float32 (1 on pooled text tokens).
        plan: Copy indices of the placeholders, or ``None`` for methods without copies.
        last: Position read by last-token pooling per row ``[batch]``, else ``None``.
        width: Padded length of the batch, in tokens.
        has_placeholders: Whether any row holds a ``<PST>``/``<B-PST>`` (read on the
            host, so the forward pass needs no device-to-host check).
    """

    ids: torch.Tensor
    attention_mask: torch.Tensor | None
    position_ids: torch.Tensor
    pool: torch.Tensor
    plan: CopyPlan | None
    last: torch.Tensor | None
    width: int
    has_placeholders: bool = True


_DONE = object()
_GC_LOCK = threading.Lock()
_GC_PAUSES = [0, False]
"""Open :func:`_gc_paused` sections, and whether the collector was enabled at the first."""


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a batch is prepared.

    Preparation allocates a few hundred thousand small containers (token ids, offset pairs,
    spaCy docs) that hold no reference cycles; the collector's full passes over them took
    about 45% of a first pass over 1,024 SciFact documents (docs/PERFORMANCE.md section 5).
    Reference counting still frees everything; cyclic garbage made meanwhile is collected
    after. Nested and concurrent sections (the prefetch thread) share one pause; the
    collector is re-enabled when the last ends, and only if it was enabled before.
    """
    with _GC_LOCK:
        if _GC_PAUSES[0] == 0:
            _GC_PAUSES[1] = gc.isenabled()
            gc.disable()
        _GC_PAUSES[0] += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _GC_PAUSES[0] -= 1
            if _GC_PAUSES[0] == 0 and _GC_PAUSES[1]:
                gc.enable()


POOL_PENDING_BATCHES = 8
"""With ``prepare_workers``: batches with room for more rows held back for later windows."""
AUTO_WINDOW_BATCHES = 4
"""``prepare_window="auto"``: about this many batches' worth of text per window."""


def auto_windows(texts: Sequence[str], max_tokens_per_batch: int, max_length: int
                 ) -> list[tuple[int, int]]:
    """Consecutive ``[start, end)`` groups of texts of about :data:`AUTO_WINDOW_BATCHES`
    batches' worth of tokens each, estimated from characters before tokenizing.

    Each text counts ``min(characters, max_length x 2 x CHARS_PER_TOKEN)`` (longer text
    is cut or windowed anyway); a window holds at least one text. Sized so the next
    window's preparation overlaps a few forward passes, while each window still has
    enough texts for length-sorted batches with little padding.

    Args:
        texts: The texts of one call.
        max_tokens_per_batch: Padded tokens per batch.
        max_length: Text tokens per text.

    Returns:
        The windows, covering ``range(len(texts))`` in order.
    """
    budget = AUTO_WINDOW_BATCHES * max_tokens_per_batch * CHARS_PER_TOKEN
    groups = cut_windows(range(len(texts)), capped_sizes(texts, max_length), budget)
    return [(g[0], g[-1] + 1) for g in groups]


class Prefetcher(Iterator[Any]):
    """Run an iterator in a background thread, ``depth`` items ahead of the consumer.

    Items come out in the iterator's order. An exception raised in the thread is raised
    by ``next()`` in the consumer (with its traceback); :meth:`close` stops the thread
    (also when the consumer fails mid-way) without waiting for the source to finish.

    Args:
        source: The iterator to run ahead (e.g. prepared batches).
        depth: Items held ready at most (1: prepare batch n+1 while n runs).

    Raises:
        ValueError: if ``depth < 1``.
    """

    def __init__(self, source: Iterator[Any], depth: int = 1) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self._source = source
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._finished = False
        self._thread = threading.Thread(target=self._run, name="htp-prefetch", daemon=True)
        self._thread.start()

    def _put(self, item: tuple[str, Any]) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            for item in self._source:
                if not self._put(("item", item)):
                    return
            self._put(("done", _DONE))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            self._put(("error", e))

    def __next__(self) -> Any:
        if self._finished:
            raise StopIteration
        kind, value = self._queue.get()
        if kind == "item":
            return value
        self._finished = True
        if kind == "error":
            raise value
        raise StopIteration

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread and drop prepared items (idempotent)."""
        self._stop.set()
        self._finished = True
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout)
