"""Bench and batching logic on tiny random decoders (no timing is asserted)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from htp_retrieval.encoder import HTPEncoder
from htp_retrieval.eval.bench import (
    RAW,
    RAW_FULL,
    ST_MEAN,
    Bench,
    MethodFigures,
    check_targets,
    cut_layers,
    long_documents,
    measure_memory,
    parse_variant,
    plot,
    ratios,
    raw_batches,
    raw_forward,
)
from htp_retrieval.rewiring import base_model, decoder_layers, run_decoder

TEXTS = [
    "Short text.",
    "Cells divide. Then they grow! Proteins fold in the membrane. The end is near.",
    "A medium length sentence about graphene and its inductive properties. Another one.",
    "One",
    " ".join(f"Sentence number {i} is about topic {i % 3}." for i in range(12)),
]


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("method", ["htp", "echo-mean", "tp-prompteol-last"])
def test_right_padded_batches_equal_single_texts(tiny, method: str) -> None:  # noqa: ANN001
    """Right padding runs without a padding mask; every row must still equal its solo run."""
    model, tok = tiny
    enc = HTPEncoder(model, method, tokenizer=tok, dtype="float32", max_padding=1.0)
    batch = enc.encode(TEXTS, batch_size=8)
    widths = {n for _, n in enc.last_stats.batches}
    assert len(enc.last_stats.batches) == 1 and enc.last_stats.padding_fraction > 0.3, widths
    for i, t in enumerate(TEXTS):
        assert _cos(enc.encode([t])[0], batch[i]) >= 0.9999, (method, i)


def test_padding_cap_bounds_every_batch(tiny_llama) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    lengths = [513, 500, 470, 460, 300, 290, 120, 119, 118, 20, 5]
    for cap in (0.05, 0.1, 0.3):
        enc = HTPEncoder(model, "vanilla-mean", tokenizer=tok, max_padding=cap)
        batches = enc._batches(lengths, 32, 16384)
        assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
        for b in batches:
            width = max(lengths[i] for i in b)
            assert all(lengths[i] >= (1 - cap) * width for i in b)
    with pytest.raises(ValueError, match="max_padding"):
        HTPEncoder(model, "htp", tokenizer=tok, max_padding=1.5)


def test_stats_break_down_the_encode_time(tiny_llama) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    enc = HTPEncoder(model, "htp", tokenizer=tok, dtype="float32")
    enc.encode(TEXTS)
    st = enc.last_stats
    parts = st.tokenize_seconds + st.segment_seconds + st.layout_seconds
    assert 0 < parts <= st.prepare_seconds + 1e-6
    assert st.copy_seconds > 0 and st.copy_seconds < st.forward_seconds
    assert st.prepare_seconds + st.forward_seconds + st.pool_seconds <= st.total_seconds + 1e-6
    enc2 = HTPEncoder(model, "vanilla-mean", tokenizer=tok, dtype="float32")
    enc2.encode(TEXTS)
    assert enc2.last_stats.copy_seconds == 0


def test_raw_forward_runs_the_same_layers(tiny) -> None:  # noqa: ANN001
    model, tok = tiny
    enc = HTPEncoder(model, "vanilla-mean", tokenizer=tok, dtype="float32", max_padding=1.0)
    (ids, mask), = raw_batches(enc, TEXTS)
    layers = decoder_layers(model)
    n = len(layers)
    seen: list[int] = []
    hs = [layer.register_forward_hook(lambda m, a, o, i=i: seen.append(i))
          for i, layer in enumerate(layers)]
    try:
        raw_forward(model, [(ids, mask)], n_layers=3)
    finally:
        for h in hs:
            h.remove()
    assert seen == [0, 1, 2] and len(decoder_layers(model)) == n  # cut, then restored
    # raw (no padding mask) == the encoder's decoder run at every real position
    with torch.no_grad(), cut_layers(model, 3):
        out = base_model(model)(input_ids=ids, use_cache=False).last_hidden_state
    emb = model.get_input_embeddings()(ids)
    ref = run_decoder(model, inputs_embeds=emb, attention_mask=mask,
                      position_ids=(mask.cumsum(1) - 1).clamp(min=0), exit_layer=3)
    norm = base_model(model).norm
    real = mask.bool()
    torch.testing.assert_close(out[real], norm(ref)[real], rtol=1e-4, atol=1e-4)


def test_long_documents_are_deterministic_and_long_enough(tiny_llama) -> None:  # noqa: ANN001
    _, tok = tiny_llama
    pieces = [f"Piece {i} is about topic {i * 7 % 11}. " + "words " * (3 + i % 5)
              for i in range(40)]
    a = long_documents(pieces, tok, length=200, n=3)
    assert a == long_documents(pieces, tok, length=200, n=3) and len(set(a)) == 3
    assert all(len(tok(d, add_special_tokens=False).input_ids) >= 200 for d in a)
    with pytest.raises(ValueError):
        long_documents([], tok, length=10, n=1)


def _fig(method: str, seconds: float, mem: int, pad: float = 0.02, prep: float = 0.01
         ) -> MethodFigures:
    return MethodFigures(method, [seconds], seconds, seconds, 1000, 1000, 1020, pad,
                         1000 / seconds, {"prepare": prep * seconds, "forward": seconds}, 1,
                         mem, "test")


def test_ratios_and_targets(tmp_path: Path) -> None:
    figs = {RAW: _fig(RAW, 9.8, 100), "vanilla-mean": _fig("vanilla-mean", 10.0, 100),
            "htp": _fig("htp", 10.6, 105, prep=0.02), "echo-mean": _fig("echo-mean", 20.0, 190)}
    r = ratios(figs)
    assert r["htp"]["time_vs_vanilla"] == pytest.approx(1.06)
    assert r["vanilla-mean"]["throughput_vs_raw"] == pytest.approx(0.98)
    setting = {"length": 512, "source": "test", "n_texts": 4, "text_tokens": 1000,
               "beyond_trained_context": False, "loadavg_start": 0.0, "loadavg_end": 0.0,
               "methods": {k: vars(v) for k, v in figs.items()}, "ratios": r}
    checks = {t["target"]: t["ok"] for t in check_targets(setting)}
    assert checks == {"htp_time_vs_vanilla": False, "htp_memory_vs_vanilla": True,
                      "prepare_share": True, "vanilla_throughput_vs_raw": True,
                      "echo_time_vs_vanilla": True, "padding_fraction": True}
    figs[ST_MEAN] = _fig(ST_MEAN, 12.0, 0)
    setting["methods"] = {k: vars(v) for k, v in figs.items()}
    setting["ratios"] = ratios(figs)
    gpu = {t["target"]: (round(t["value"], 3), t["ok"])
           for t in check_targets(setting, "cuda:0")}
    assert gpu["vanilla_throughput_vs_raw"] == (0.98, True)  # 0.90 on a GPU
    assert gpu["htp_throughput_vs_raw"] == (0.925, True)  # 0.85
    assert gpu["vanilla_vs_st"] == (1.2, True)  # at least as fast as sentence-transformers
    assert "prepare_share" not in gpu  # overlapped by the pipeline there
    setting["targets"] = check_targets(setting)
    res = {"config": {"model": "m", "device": "cpu", "dtype": "bfloat16", "threads": 2},
           "settings": [setting, {**setting, "length": 2048}]}
    png = plot([json.loads(json.dumps(res))], tmp_path / "p.png")
    assert png.stat().st_size > 1000


def test_bench_and_memory_worker_on_a_saved_tiny_model(tiny_llama, tmp_path: Path) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    path = tmp_path / "tiny"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    bench = Bench(str(path), [RAW, RAW_FULL, "raw@htp", "htp"], device="cpu", dtype="float32")
    assert sorted(bench.encoders) == ["htp", "vanilla-mean"]
    bench.set_length(64)
    runs = {m: bench.run(m, TEXTS) for m in bench.methods}
    htp_tokens = runs["htp"].stats["input_tokens"]
    assert bench.raw_counts("raw@htp", TEXTS)["input_tokens"] == htp_tokens
    assert bench.raw_counts(RAW, TEXTS)["input_tokens"] < htp_tokens
    res = measure_memory({"model": str(path), "method": "htp", "texts": TEXTS,
                          "max_length": 64, "device": "cpu", "dtype": "float32",
                          "threads": 1, "batch_size": 8, "max_tokens_per_batch": 4096},
                         timeout=120)
    assert res["probe"] in ("anon-rss-sampling", "VmHWM", "rss-sampling")
    assert res["peak_memory_bytes"] > 0 and res["rss_hwm_bytes"] >= 0
    assert res["base_bytes"] > 0


@pytest.mark.parametrize(("method", "summary"),
                         [("htp", "mean"), ("htp", "last"), ("tp-mean", "last")])
def test_in_place_copies_equal_out_of_place(tiny_llama, method: str, summary: str) -> None:  # noqa: ANN001
    from htp_retrieval.rewiring import CopyPlan, apply_copies

    model, tok = tiny_llama
    enc = HTPEncoder(model, method, tokenizer=tok, dtype="float32", summary=summary)
    lays = enc.build_layouts(TEXTS[1:3])
    width = max(len(lay) for lay in lays)
    plan = CopyPlan.from_layouts(lays, [0, 0], "cpu", summary=summary)
    hidden = torch.randn(2, width, 8)
    before = hidden.clone()
    out = apply_copies(hidden, plan)
    assert torch.equal(hidden, before) and not torch.equal(out, before)
    same = apply_copies(hidden, plan, inplace=True)
    assert same is hidden and torch.equal(hidden, out)
    # run_decoder copies from layer 0 on never touch the caller's inputs_embeds
    ids = torch.tensor([list(lays[0].input_ids)]).clamp(max=model.config.vocab_size - 1)
    embeds = model.get_input_embeddings()(ids).detach()
    kept = embeds.clone()
    with torch.no_grad():
        run_decoder(model, inputs_embeds=embeds, attention_mask=None,
                    position_ids=torch.arange(ids.shape[1]).unsqueeze(0), exit_layer=3,
                    plan=CopyPlan.from_layouts(lays[:1], [0], "cpu"), tp_start=0, tp_exit=3)
    assert torch.equal(embeds, kept)


def test_variant_entries() -> None:
    assert parse_variant("htp") == ("htp", {})
    assert parse_variant("htp~pipew64") == ("htp", {"pipeline": True, "prepare_window": 64})
    assert parse_variant("vanilla-mean~syncwa") == (
        "vanilla-mean", {"pipeline": False, "prepare_window": "auto"})
    assert parse_variant("tp-mean~pipe") == ("tp-mean", {"pipeline": True})
    assert parse_variant("htp~p8") == ("htp", {"prepare_workers": 8})
    assert parse_variant("htp~syncpa") == ("htp", {"pipeline": False, "prepare_workers": "auto"})
    for bad in ("htp~", "htp~x2", "htp~w", "htp~q4"):
        with pytest.raises(ValueError, match="sync, pipe"):
            parse_variant(bad)
