"""Cost measurement: wall time and peak memory of an encode step."""

from __future__ import annotations

import os
import threading
import time
from types import TracebackType

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """Resident set size of this process, in bytes (Linux ``/proc``; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:  # pragma: no cover
        return 0


def _trim_heap() -> None:
    """Return freed heap pages to the OS (glibc ``malloc_trim``) so RSS tracks live memory."""
    import gc

    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # pragma: no cover - non-glibc
        pass


class PeakMemory:
    """Measure peak memory above the level at entry, in bytes.

    On CUDA it reads ``torch.cuda.max_memory_allocated`` (reset at entry); on CPU a thread
    samples the process RSS every ``interval`` seconds. ``peak_bytes`` is the peak minus the
    level at entry: the activations and buffers of the step, not the weights.

    Args:
        device: ``cpu`` or a CUDA device string.
        interval: CPU sampling period in seconds.
    """

    def __init__(self, device: str = "cpu", interval: float = 0.005) -> None:
        self.device = device
        self.interval = interval
        self.peak_bytes = 0
        self.seconds = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakMemory:
        self._t0 = time.perf_counter()
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
        else:
            _trim_heap()
            self._base = rss_bytes()
            self._max = self._base

            def sample() -> None:
                while not self._stop.is_set():
                    self._max = max(self._max, rss_bytes())
                    time.sleep(self.interval)

            self._thread = threading.Thread(target=sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()
            self.peak_bytes = torch.cuda.max_memory_allocated() - self._base
        else:
            self._stop.set()
            if self._thread is not None:
                self._thread.join()
            self._max = max(self._max, rss_bytes())
            self.peak_bytes = self._max - self._base
        self.seconds = time.perf_counter() - self._t0
