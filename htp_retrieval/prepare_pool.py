"""Preparation in worker processes: tokenize, split sentences and lay out texts beside the
forward pass.

On a GPU the forward pass of a small decoder outruns one CPU core's preparation, and a
thread cannot help: spaCy's tokenizer and the layout code hold Python's GIL, which the
forward loop needs to queue kernels (docs/PERFORMANCE.md section 5). :class:`PreparePool`
runs :meth:`HTPEncoder.build_layouts <htp_retrieval.encoder.HTPEncoder.build_layouts>` in
spawned processes, each holding a copy of the encoder without its model (tokenizer,
config, segmenter), while the calling process runs the forward passes.

Texts are sent in windows cut from their order by length (:func:`length_windows`), so the
batches cut from consecutive windows are close to those of the whole call sorted at once.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import pickle
import time
from collections.abc import Sequence
from concurrent.futures.process import BrokenProcessPool
from typing import Any

CHARS_PER_TOKEN = 4
"""Characters per token assumed when sizing a window (English BPE: about 4)."""
WINDOW_BATCH_SHARE = 4
"""Windows hold about ``1 / WINDOW_BATCH_SHARE`` of a batch's tokens, so the first batch is
laid out by several workers at once and the device waits only for that."""
_STARTUP_SECONDS = 300.0

_WARM_UP = "A worker lays out texts. It is warmed up on two sentences."
_ENCODER: Any = None
"""The worker's model-less encoder (set by :func:`_init_worker`)."""


def auto_workers() -> int:
    """``prepare_workers="auto"``: one worker per CPU core this process may use, less one
    for the forward loop, at most 8 and at least 1."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 2
    return max(1, min(8, cores - 1))


def length_windows(texts: Sequence[str], max_tokens_per_batch: int, max_length: int
                   ) -> list[list[int]]:
    """Cut texts, longest first by characters, into windows of about
    ``max_tokens_per_batch / WINDOW_BATCH_SHARE`` tokens' worth each.

    Each text counts ``min(characters, max_length x 2 x CHARS_PER_TOKEN)`` characters
    (longer text is cut or windowed anyway); a window holds at least one text. Ties keep
    input order.

    Args:
        texts: The texts of one call, ``[n]``.
        max_tokens_per_batch: Padded tokens per batch.
        max_length: Text tokens per text.

    Returns:
        Lists of input indices; every index appears once.
    """
    sizes = capped_sizes(texts, max_length)
    order = sorted(range(len(texts)), key=lambda i: -sizes[i])
    budget = max(1, max_tokens_per_batch * CHARS_PER_TOKEN // WINDOW_BATCH_SHARE)
    return cut_windows(order, sizes, budget)


def capped_sizes(texts: Sequence[str], max_length: int) -> list[int]:
    """Characters per text for sizing windows, capped at ``max_length x 2 x
    CHARS_PER_TOKEN`` (longer text is cut or windowed anyway)."""
    cap = max_length * 2 * CHARS_PER_TOKEN
    return [min(len(t), cap) for t in texts]


def cut_windows(order: Sequence[int], sizes: Sequence[int], budget: int | None, *,
                max_items: int | None = None) -> list[list[int]]:
    """Cut ``order`` (text indices) into consecutive groups of at most ``budget`` characters
    of ``sizes`` (``None``: any number) and at most ``max_items`` texts (``None``: any
    number); a group holds at least one text."""
    windows: list[list[int]] = []
    cur: list[int] = []
    used = 0
    for i in order:
        if cur and ((budget is not None and used + sizes[i] > budget)
                    or len(cur) == max_items):
            windows.append(cur)
            cur, used = [], 0
        cur.append(i)
        used += sizes[i]
    if cur:
        windows.append(cur)
    return windows


def _init_worker(state: bytes) -> None:
    """Worker start: one preparation thread, no tokenizer thread pool, the encoder copy,
    warmed up on one short text."""
    global _ENCODER
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    _ENCODER = pickle.loads(state)
    # load the segmenter and the tokenizer's caches now, not in the first window
    _ENCODER.build_layouts([_WARM_UP])


def _ready(seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def _prepare(texts: list[str], instruction: str | None) -> tuple[list[Any], dict[str, Any]]:
    """Lay out one window in a worker: ``(layouts, step times and truncations)``."""
    from htp_retrieval.pipeline import EncodeStats

    stats = EncodeStats()
    layouts = _ENCODER.build_layouts(texts, instruction=instruction, stats=stats)
    return layouts, {"tokenize_seconds": stats.tokenize_seconds,
                     "segment_seconds": stats.segment_seconds,
                     "layout_seconds": stats.layout_seconds, "truncated": stats.truncated}


class PreparePool:
    """Spawned worker processes that lay out texts for one encoder.

    Started once per encoder (workers import torch, the tokenizer and the segmenter,
    a few seconds each, in parallel) and reused by every :meth:`HTPEncoder.encode` call;
    :meth:`close` (or :meth:`HTPEncoder.close`, or the encoder's garbage collection) stops
    the workers.

    Args:
        encoder: The model-less encoder copy the workers run (pickled once per worker).
        workers: Number of processes (at least 1).

    Raises:
        ValueError: if ``workers < 1`` or the encoder copy cannot be pickled (a custom
            segmenter object must be picklable to run in workers).
        RuntimeError: if a worker dies while starting (e.g. a script without the
            ``if __name__ == "__main__":`` guard that spawned processes need).
        TimeoutError: if the workers do not start within 300 seconds.
    """

    def __init__(self, encoder: Any, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"prepare_workers must be at least 1, got {workers}")
        try:
            state = pickle.dumps(encoder)
        except Exception as e:  # noqa: BLE001 - any pickling failure has one fix
            raise ValueError(f"prepare_workers={workers}: the encoder's tokenizer or segmenter "
                             f"cannot be sent to a worker process ({e}); use a named "
                             "segmenter or prepare_workers=0") from e
        self.workers = workers
        self._executor = cf.ProcessPoolExecutor(
            max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker, initargs=(state,))
        # spawn starts processes as tasks arrive: one short task per worker starts them all
        futures = [self._executor.submit(_ready, 0.05) for _ in range(workers)]
        try:
            for f in cf.as_completed(futures, timeout=_STARTUP_SECONDS):
                f.result()
        except BrokenProcessPool as e:
            self.close()
            raise RuntimeError(
                f"prepare_workers={workers}: the worker processes died while starting. Spawned "
                "workers import the main module, so a script must create and use the encoder "
                "under `if __name__ == \"__main__\":`; or pass prepare_workers=0") from e
        except BaseException:
            self.close()
            raise

    def submit(self, texts: list[str], instruction: str | None) -> cf.Future:
        """Queue one window: a future of ``(layouts, step times and truncations)``; a
        ``ValueError`` from the layout names the text's index in ``texts``."""
        return self._executor.submit(_prepare, texts, instruction)

    def close(self) -> None:
        """Stop the workers (queued windows are cancelled)."""
        self._executor.shutdown(wait=True, cancel_futures=True)
