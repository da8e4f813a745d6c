"""``dtype="auto"``: the weight dtype that runs fastest where the encoder runs.

The rule (:func:`resolve_dtype`):

* CUDA device with bf16 support (``torch.cuda.is_bf16_supported()``, Ampere and later):
  ``bfloat16``;
* CUDA device without it (Volta, Turing): ``float16``;
* CPU with native bf16 instructions (``avx512_bf16`` or ``amx_bf16`` in the CPU flags,
  with torch's kernels built for AVX-512 or later): ``bfloat16`` if a one-off matrix-product
  benchmark finds bf16 no more than 5% slower than fp32 on this machine, else ``float32``
  (:func:`cpu_prefers_bf16`). The flag alone does not settle it: with AMX or on AMD Zen 4
  bf16 was about 3x faster than fp32, on an Intel Xeon with ``avx512_bf16`` but no AMX it
  was 1.4-1.8x slower. The measurement is cached per machine in
  ``<cache_dir>/cpu-dtype.json`` (:func:`htp_retrieval.models.cache_dir`);
* any other CPU: ``float32`` (bf16 there is emulated and 6-7x slower than fp32), without
  benchmarking.

Explicit dtypes (``bfloat16``, ``float16``, ``float32``) pass through unchanged. The
probes are the small functions :func:`cpu_prefers_bf16` (which uses
:func:`cpu_has_native_bf16` and :func:`cpu_matmul_seconds`) and :func:`cuda_bf16_supported`,
so tests can replace them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, get_args

from htp_retrieval.files import atomic_write

logger = logging.getLogger(__name__)

DTypeName = Literal["bfloat16", "float16", "float32"]
"""A concrete weight dtype."""
DTypeArg = Literal["auto", "bfloat16", "float16", "float32"]
"""What ``dtype=`` accepts: a concrete dtype or ``auto``."""
AUTO = "auto"

_CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
"""``/proc/cpuinfo`` flags of native bf16 dot-product / matrix instructions."""
BF16_TOLERANCE = 1.05
"""``auto`` takes bf16 on a CPU when its measured matmul time is at most this times fp32's
(bf16 also halves the weights' memory)."""
CPU_DTYPE_CACHE = "cpu-dtype.json"
"""File name, in :func:`htp_retrieval.models.cache_dir`, of the cached CPU benchmarks."""

_logged: set[tuple[str, str]] = set()
_log_lock = threading.Lock()


def _cpuinfo_field(prefixes: tuple[str, ...], path: str = "/proc/cpuinfo") -> str | None:
    """The value of the first ``/proc/cpuinfo`` line starting with one of ``prefixes``
    (``None`` if there is none or the file is unreadable)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(prefixes):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _cpuinfo_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """CPU feature flags from the first ``flags`` line of ``path`` (empty if unreadable)."""
    return frozenset((_cpuinfo_field(("flags", "Features"), path) or "").split())


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


def _cpu_model_name(path: str = "/proc/cpuinfo") -> str:
    """The CPU's ``model name`` from ``path`` (``unknown`` if unreadable)."""
    return _cpuinfo_field(("model name",), path) or "unknown"


def cpu_facts() -> dict[str, str]:
    """What a CPU figure depends on, for result files: ``cpu`` (model name), ``cpu_count``
    (logical cores), ``cpu_capability`` (``torch.backends.cpu.get_cpu_capability()``, e.g.
    ``AVX2``, ``AVX512``) and ``cpu_native_bf16`` (``yes``/``no``, :func:`cpu_has_native_bf16`):
    the same model and dtype run several times faster or slower from one CPU to the next.
    """
    import os
    import platform

    import torch

    cpu = _cpu_model_name()
    if cpu == "unknown":
        cpu = platform.processor() or cpu
    try:
        capability = str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):  # pragma: no cover - very old torch
        capability = "unknown"
    return {"cpu": cpu, "cpu_count": str(os.cpu_count()), "cpu_capability": capability,
            "cpu_native_bf16": "yes" if cpu_has_native_bf16() else "no"}


def _time_linear(n: int = 512, k: int = 1024, m: int = 2048, repeats: int = 5) -> dict[str, float]:
    """Best-of-``repeats`` seconds of one ``[n, k] @ [k, m]`` product in fp32 and in bf16.

    The two dtypes alternate, so a change of load hits both; torch's current thread count
    is used. About 0.1-0.5 s in all on a 2-core CPU.
    """
    import torch

    a32 = torch.randn(n, k)
    w32 = torch.randn(m, k)
    pairs = {"float32": (a32, w32),
             "bfloat16": (a32.to(torch.bfloat16), w32.to(torch.bfloat16))}
    best = {name: float("inf") for name in pairs}
    with torch.inference_mode():
        for a, w in pairs.values():  # warm-up: kernel selection, first-touch pages
            torch.nn.functional.linear(a, w)
        for _ in range(repeats):
            for name, (a, w) in pairs.items():
                t = time.perf_counter()
                torch.nn.functional.linear(a, w)
                best[name] = min(best[name], time.perf_counter() - t)
    return best


def cpu_matmul_seconds(cache: str | Path | None = None) -> dict[str, Any]:
    """This CPU's fp32 and bf16 matrix-product times, measured once per machine.

    Keyed by the CPU model name, a digest of its feature flags, the torch version, torch's
    CPU capability and the thread count; a stored entry for the same key is reused, any
    other key is measured (0.1-0.5 s) and added. Delete the file to measure again.

    Args:
        cache: The JSON file (default ``<cache_dir>/cpu-dtype.json``). An unwritable file
            is not an error: the measurement is then kept for this process only.

    Returns:
        ``{"key": str, "float32": seconds, "bfloat16": seconds, "measured": ISO time}``:
        seconds of one ``[512, 1024] @ [1024, 2048]`` product (best of 5).
    """
    import torch

    if cache is None:
        from htp_retrieval.models import cache_dir

        cache = cache_dir() / CPU_DTYPE_CACHE
    path = Path(cache)
    flags = hashlib.sha256(" ".join(sorted(_cpuinfo_flags())).encode()).hexdigest()[:8]
    key = (f"{_cpu_model_name()} | flags {flags} | torch {torch.__version__} | "
           f"{torch.backends.cpu.get_cpu_capability()} | {torch.get_num_threads()} threads")
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        stored = {}
    if not isinstance(stored, dict):
        stored = {}
    entry = stored.get(key)
    if isinstance(entry, dict) and {"float32", "bfloat16"} <= set(entry):
        return {"key": key, **entry}
    entry = {**_time_linear(), "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}
    stored[key] = entry
    try:
        with atomic_write(path) as f:
            f.write(json.dumps(stored, indent=1))
    except OSError as err:
        logger.warning("could not store the CPU dtype benchmark in %s (%s); it will be "
                       "measured again in the next process", path, err)
    return {"key": key, **entry}


@lru_cache(maxsize=1)
def cpu_prefers_bf16() -> bool:
    """Whether ``dtype="auto"`` takes bf16 on this CPU (the CPU probe behind ``auto``).

    True when :func:`cpu_has_native_bf16` and :func:`cpu_matmul_seconds` finds bf16 at
    most :data:`BF16_TOLERANCE` times fp32's time; a CPU without the instructions is not
    benchmarked. Cached for the process.
    """
    if not cpu_has_native_bf16():
        return False
    t = cpu_matmul_seconds()
    ratio = t["bfloat16"] / t["float32"]
    logger.info("CPU matmul benchmark (%s): bf16 %.2f ms, fp32 %.2f ms (bf16 / fp32 = %.2f)",
                t["key"], 1e3 * t["bfloat16"], 1e3 * t["float32"], ratio)
    return ratio <= BF16_TOLERANCE


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
        :func:`cpu_prefers_bf16`, else ``float32``. The first decision per
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
        bf16 = cpu_prefers_bf16()
        out = "bfloat16" if bf16 else "float32"
        if bf16:
            why = "the CPU has native bf16 instructions and bf16 matmuls measured as fast"
        elif cpu_has_native_bf16():
            why = ("the CPU has native bf16 instructions but bf16 matmuls measured slower "
                   "than fp32 here")
        else:
            why = "the CPU has no native bf16 instructions"
    with _log_lock:
        if (dev, out) not in _logged:
            _logged.add((dev, out))
            logger.info("dtype auto -> %s on %s: %s", out, dev, why)
    return out


__all__ = ["AUTO", "BF16_TOLERANCE", "DTypeArg", "DTypeName", "cpu_has_native_bf16",
           "cpu_matmul_seconds", "cpu_prefers_bf16", "cuda_bf16_supported", "resolve_dtype"]
