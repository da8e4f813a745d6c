"""``dtype="auto"``: resolved from capability probes and a cached CPU benchmark; explicit
dtypes win."""

from __future__ import annotations

import json
import logging

import pytest

from htp_retrieval import dtypes
from htp_retrieval.dtypes import resolve_dtype


@pytest.fixture(autouse=True)
def _fresh_log_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dtypes, "_logged", set())


def _cpu(monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    monkeypatch.setattr(dtypes, "cpu_prefers_bf16", lambda: native)
    monkeypatch.setattr(dtypes, "cpu_has_native_bf16", lambda: native)


def _cuda(monkeypatch: pytest.MonkeyPatch, bf16: bool) -> None:
    monkeypatch.setattr(dtypes, "cuda_bf16_supported", lambda device="cuda": bf16)


def test_cpu_with_native_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    _cpu(monkeypatch, True)
    assert resolve_dtype("auto", "cpu") == "bfloat16"


def test_cpu_without_native_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    _cpu(monkeypatch, False)
    assert resolve_dtype("auto", "cpu") == "float32"


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_with_bf16(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    _cuda(monkeypatch, True)
    assert resolve_dtype("auto", device) == "bfloat16"


def test_cuda_without_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    _cuda(monkeypatch, False)
    assert resolve_dtype("auto", "cuda") == "float16"


def test_auto_device_follows_cuda_availability(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    _cpu(monkeypatch, False)
    _cuda(monkeypatch, True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_dtype("auto", "auto") == "float32"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_dtype("auto", "auto") == "bfloat16"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_explicit_dtype_passes_through(monkeypatch: pytest.MonkeyPatch, dtype: str,
                                       device: str) -> None:
    def never(*_a: object) -> bool:
        raise AssertionError("an explicit dtype must not probe the hardware")

    monkeypatch.setattr(dtypes, "cpu_has_native_bf16", never)
    monkeypatch.setattr(dtypes, "cpu_prefers_bf16", never)
    monkeypatch.setattr(dtypes, "cuda_bf16_supported", never)
    assert resolve_dtype(dtype, device) == dtype


@pytest.mark.parametrize("bad", ["bf16", "float64", "", "AUTO"])
def test_invalid_dtype_raises_naming_it(bad: str) -> None:
    with pytest.raises(ValueError, match=repr(bad)):
        resolve_dtype(bad, "cpu")


def test_decision_logged_once(monkeypatch: pytest.MonkeyPatch,
                              caplog: pytest.LogCaptureFixture) -> None:
    _cpu(monkeypatch, True)
    with caplog.at_level(logging.INFO, logger="htp_retrieval.dtypes"):
        resolve_dtype("auto", "cpu")
        resolve_dtype("auto", "cpu")
    hits = [r for r in caplog.records if "dtype auto" in r.getMessage()]
    assert len(hits) == 1 and "bfloat16" in hits[0].getMessage()


@pytest.mark.parametrize(("capability", "flags", "expected"), [
    ("AVX512", "fpu avx512f avx512_bf16 sse", True),
    ("AVX512", "fpu avx512f amx_bf16 amx_tile", True),
    ("AVX512", "fpu avx512f avx512bw", False),
    ("AVX2", "fpu avx2 avx512_bf16", False),  # kernels not built for AVX-512 here
    ("DEFAULT", "", False),
])
def test_cpu_probe(monkeypatch: pytest.MonkeyPatch, capability: str, flags: str,
                   expected: bool) -> None:
    import torch

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(dtypes, "_cpuinfo_flags", lambda path="": frozenset(flags.split()))
    dtypes.cpu_has_native_bf16.cache_clear()
    try:
        assert dtypes.cpu_has_native_bf16() is expected
    finally:
        dtypes.cpu_has_native_bf16.cache_clear()


@pytest.mark.parametrize(("bf16_ms", "expected"), [
    (2.0, True),     # bf16 twice as fast (AMX, Zen 4)
    (10.4, True),    # within BF16_TOLERANCE of fp32: bf16 halves the memory
    (16.0, False),   # avx512_bf16 without AMX on an Intel Xeon: 1.6x slower
])
def test_native_cpu_takes_bf16_only_where_it_measured_fast(
        monkeypatch: pytest.MonkeyPatch, bf16_ms: float, expected: bool) -> None:
    monkeypatch.setattr(dtypes, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setattr(dtypes, "cpu_matmul_seconds", lambda: {
        "key": "test", "float32": 0.010, "bfloat16": bf16_ms / 1e3})
    dtypes.cpu_prefers_bf16.cache_clear()
    try:
        assert dtypes.cpu_prefers_bf16() is expected
        assert resolve_dtype("auto", "cpu") == ("bfloat16" if expected else "float32")
    finally:
        dtypes.cpu_prefers_bf16.cache_clear()


def test_cpu_without_native_bf16_is_not_benchmarked(monkeypatch: pytest.MonkeyPatch) -> None:
    def never() -> dict:
        raise AssertionError("a CPU without bf16 instructions must not be benchmarked")

    monkeypatch.setattr(dtypes, "cpu_has_native_bf16", lambda: False)
    monkeypatch.setattr(dtypes, "cpu_matmul_seconds", never)
    dtypes.cpu_prefers_bf16.cache_clear()
    try:
        assert resolve_dtype("auto", "cpu") == "float32"
    finally:
        dtypes.cpu_prefers_bf16.cache_clear()


def test_cpu_benchmark_is_measured_once_per_machine(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path) -> None:  # noqa: ANN001
    runs: list[int] = []

    def timed() -> dict[str, float]:
        runs.append(1)
        return {"float32": 0.01, "bfloat16": 0.02}

    monkeypatch.setattr(dtypes, "_time_linear", timed)
    cache = tmp_path / "sub" / "cpu-dtype.json"
    first = dtypes.cpu_matmul_seconds(cache)
    again = dtypes.cpu_matmul_seconds(cache)  # as a new process would: read from the file
    assert len(runs) == 1 and again == first and first["bfloat16"] == 0.02
    assert first["key"] in json.loads(cache.read_text())
    monkeypatch.setattr(dtypes, "_cpu_model_name", lambda: "another CPU")
    other = dtypes.cpu_matmul_seconds(cache)  # another machine sharing the cache: measured
    assert len(runs) == 2 and len(json.loads(cache.read_text())) == 2
    assert other["key"] != first["key"] and "another CPU" in other["key"]
    cache.write_text("{not json")  # a damaged file is measured again and rewritten
    dtypes.cpu_matmul_seconds(cache)
    assert len(runs) == 3 and len(json.loads(cache.read_text())) == 1


def test_unwritable_benchmark_cache_warns_and_still_decides(
        monkeypatch: pytest.MonkeyPatch, tmp_path, caplog: pytest.LogCaptureFixture) -> None:  # noqa: ANN001
    monkeypatch.setattr(dtypes, "_time_linear", lambda: {"float32": 0.01, "bfloat16": 0.005})
    blocker = tmp_path / "file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger="htp_retrieval.dtypes"):
        t = dtypes.cpu_matmul_seconds(blocker / "cpu-dtype.json")
    assert t["bfloat16"] == 0.005
    assert any("could not store the CPU dtype benchmark" in r.getMessage()
               for r in caplog.records)


def test_real_matmul_benchmark_times_both_dtypes() -> None:
    t = dtypes._time_linear(n=64, k=64, m=64, repeats=2)
    assert set(t) == {"float32", "bfloat16"}
    assert all(0 < v < 5 for v in t.values())


def test_encoder_records_resolved_dtype(tiny_llama, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """config() never says ``auto``; the CLI offers ``auto`` as its default."""
    from htp_retrieval.cli import _add_encoder_args
    from htp_retrieval.encoder import HTPEncoder

    model, tok = tiny_llama
    cfg = HTPEncoder(model, "htp", tokenizer=tok).record()
    assert cfg["dtype"] == "float32"
    import argparse

    p = argparse.ArgumentParser()
    _add_encoder_args(p)
    assert p.parse_args([]).dtype == "auto"
    assert p.parse_args(["--dtype", "float32"]).dtype == "float32"


def test_load_model_resolves_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    """load_model keys its cache by the resolved dtype, so auto and bf16 share a model."""
    from htp_retrieval import models

    seen: list[str] = []

    def fake_resolve(dtype: str, device: str) -> str:
        seen.append(dtype)
        return "bfloat16"

    monkeypatch.setattr(models, "resolve_dtype", fake_resolve)
    monkeypatch.setitem(models._LOADED, ("m", "cpu", "bfloat16"), ("MODEL", "TOK"))
    assert models.load_model("m", device="cpu") == ("MODEL", "TOK")
    assert seen == ["auto"]
