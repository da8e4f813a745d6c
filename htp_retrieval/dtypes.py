"""``dtype="auto"``: the weight dtype that runs fastest where the encoder runs.

The rule (:func:`resolve_dtype`):

* CUDA device with bf16 support (``torch.cuda.is_bf16_supported()``, Ampere and later):
  ``bfloat16``;
* CUDA device without it (Volta, Turing): ``float16``;
* CPU with native bf16 matrix instructions (``avx512_bf16`` or ``amx_bf16`` in the CPU
  flags, with torch's kernels built for AVX-512 or later): ``bfloat16``;
* any other CPU: ``float32`` (bf16 there is emulated and slower than fp32).

Explicit dtypes (``bfloat16``, ``float16``, ``float32``) pass through unchanged. The
capability probes are the small functions :func:`cpu_has_native_bf16` and
:func:`cuda_bf16_supported`, so tests can replace them.
"""

from __future__ import annotations

import logging
import threading
from functools import lru_cache
from typing import Literal, get_args

logger = logging.getLogger(__name__)

DTypeName = Literal["bfloat16", "float16", "float32"]
"""A concrete weight dtype."""
DTypeArg = Literal["auto", "bfloat16", "float16", "float32"]
"""What ``dtype=`` accepts: a concrete dtype or ``auto``."""
AUTO = "auto"

_CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""``/proc/cpuinfo`` flags of native bf16 dot-product / matrix instructions."""

_logged: set[tuple[str, str]] = set()
_log_lock = threading.Lock()


def _cpuinfo_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """CPU feature flags from the first ``flags`` line of ``path`` (empty if unreadable)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@lru_cache(maxsize=1)
def cpu_has_native_bf16() -> bool:
    """Whether this CPU runs bf16 matrix products natively (the probe behind ``auto``).

    True when torch's CPU kernels use AVX-512 or later
    (``torch.backends.cpu.get_cpu_capability()`` is ``AVX512`` or an ``AMX`` level) and
    ``/proc/cpuinfo`` lists ``avx512_bf16`` or ``amx_bf16``. Cached for the process.
    """
    import torch

    try:
        capability = str(torch.backends.cpu.get_cpu_capability()).upper()
    except (AttributeError, RuntimeError):  # pragma: no cover - very old torch
        capability = ""
    if "AVX512" not in capability and "AMX" not in capability:
        return False
    flags = _cpuinfo_flags()
    return any(f in flags for f in _CPU_BF16_FLAGS)


def cuda_bf16_supported(device: str = "cuda") -> bool:
    """Whether the CUDA device ``device`` (``cuda`` or ``cuda:N``) supports bf16.

    ``torch.cuda.is_bf16_supported()`` on that device; ``False`` when CUDA is unavailable.
    """
    import torch

    if not torch.cuda.is_available():
        return False
    index = device.partition(":")[2]
    with torch.cuda.device(int(index) if index.isdigit() else torch.cuda.current_device()):
        return bool(torch.cuda.is_bf16_supported())


def resolve_dtype(dtype: str = AUTO, device: str = "cpu") -> DTypeName:
    """The concrete weight dtype for ``dtype`` on ``device``.

    Args:
        dtype: ``auto``, ``bfloat16``, ``float16`` or ``float32``. A concrete dtype is
            returned unchanged (an explicit choice always wins).
        device: Where the weights go: ``cpu``, ``cuda``, ``cuda:N``, or ``auto`` (CUDA
            when available, else CPU). A ``device_map`` value such as ``auto`` counts as
            CUDA when CUDA is available.

    Returns:
        ``bfloat16``, ``float16`` or ``float32``: for ``auto`` on CUDA, ``bfloat16``
        where :func:`cuda_bf16_supported`, else ``float16``; on CPU, ``bfloat16`` where
        :func:`cpu_has_native_bf16`, else ``float32``. The first decision per
        ``(device, result)`` is logged at INFO on ``htp_retrieval.dtypes``.

    Raises:
        ValueError: for any other ``dtype`` (the message names it and the valid values).
    """
    if dtype in get_args(DTypeName):
        return dtype  # type: ignore[return-value]
    if dtype != AUTO:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of "
                         f"{', '.join(get_args(DTypeArg))}")
    dev = str(device)
    if dev == "auto":
        import torch

        dev = "cuda" if torch.cuda.is_available() else "cpu"
    if dev.startswith("cuda"):
        bf16 = cuda_bf16_supported(dev)
        out: DTypeName = "bfloat16" if bf16 else "float16"
        why = "the GPU supports bf16" if bf16 else "the GPU has no bf16 support"
    else:
        bf16 = cpu_has_native_bf16()
        out = "bfloat16" if bf16 else "float32"
        why = ("the CPU has native bf16 instructions (avx512_bf16/amx_bf16)" if bf16
               else "the CPU has no native bf16 instructions")
    with _log_lock:
        if (dev, out) not in _logged:
            _logged.add((dev, out))
            logger.info("dtype auto -> %s on %s: %s", out, dev, why)
    return out


__all__ = ["AUTO", "DTypeArg", "DTypeName", "cpu_has_native_bf16", "cuda_bf16_supported",
           "resolve_dtype"]
