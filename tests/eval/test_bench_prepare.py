"""Bench additions: ``--prepare-only``, the sentence-transformers peer, the
pipeline's wait figures, and ``--dtype auto`` resolved in the file name."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from htp_retrieval.eval.bench import ST_MEAN, Bench, figures, format_prepare, format_setting

TEXTS = [
    "Graphene is a single layer of carbon. It conducts heat well. It is strong.",
    "Proteins fold. Misfolding causes disease! Chaperones help? Yes.",
    "Short text.",
]


@pytest.fixture(scope="module")
def saved_tiny(tiny_llama, tmp_path_factory: pytest.TempPathFactory) -> str:  # noqa: ANN001
    model, tok = tiny_llama
    path = tmp_path_factory.mktemp("tiny41") / "tiny"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def test_st_peer_matches_vanilla_mean_shape(saved_tiny: str) -> None:
    pytest.importorskip("sentence_transformers")
    bench = Bench(saved_tiny, ["vanilla-mean", ST_MEAN], device="cpu", dtype="float32")
    bench.set_length(64)
    assert bench.st is not None and bench.st.max_seq_length == 64
    run = bench.run(ST_MEAN, TEXTS)
    assert run.seconds > 0 and run.stats == {}
    counts = bench.raw_counts(ST_MEAN, TEXTS)
    ref = bench.run("vanilla-mean", TEXTS).stats
    assert counts["text_tokens"] == ref["text_tokens"]
    assert counts["input_tokens"] <= counts["padded_tokens"]
    f = figures(ST_MEAN, [run], counts)
    assert f.tokens_per_second > 0 and f.breakdown == {}
    # the peer embeds the same text: full-depth mean pooling of plain text, no chat template
    vec = bench.st.encode(TEXTS[:1], convert_to_numpy=True)
    assert vec.shape == (1, bench.model.config.hidden_size) and np.isfinite(vec).all()


def test_wait_in_breakdown_and_table(saved_tiny: str) -> None:
    bench = Bench(saved_tiny, ["vanilla-mean", "htp"], device="cpu", dtype="float32",
                  pipeline=True, batch_size=1)
    bench.set_length(64)
    runs = [bench.run("htp", TEXTS) for _ in range(2)]
    f = figures("htp", runs)
    assert {"wait", "inputs", "prepare"} <= set(f.breakdown)
    assert 0 < f.breakdown["wait"] < f.median_seconds
    assert runs[0].stats["pipelined"] is True
    setting = {"length": 64, "source": "t", "n_texts": 3, "text_tokens": f.text_tokens,
               "loadavg_start": 0.0, "loadavg_end": 0.0, "beyond_trained_context": False,
               "methods": {"htp": f.__dict__}, "ratios": {"htp": {
                   "time_vs_vanilla": None, "memory_vs_vanilla": None, "time_vs_raw": None,
                   "throughput_vs_raw": None, "time_vs_own_raw": None}}, "targets": []}
    assert "wait s" in format_setting(setting)


def test_prepare_only_cli(saved_tiny: str, tmp_path: Path) -> None:
    from htp_retrieval.cli import main

    data = tmp_path / "beir"
    data.mkdir()
    with open(data / "corpus.jsonl", "w") as f:
        for i, t in enumerate(TEXTS * 3):
            f.write(json.dumps({"_id": str(i), "title": "", "text": t}) + "\n")
    out = tmp_path / "out"
    rc = main(["bench", "--model", saved_tiny, "--data", str(data), "--lengths", "64",
               "--n-docs", "9", "--methods", "raw,vanilla-mean,htp", "--repeats", "2",
               "--threads", "1", "--prepare-only", "--quiet", "--output", str(out),
               "--dtype", "float32"])
    assert rc == 0
    files = list(out.glob("*__prepare.json"))
    assert len(files) == 1 and "float32" in files[0].name
    res = json.loads(files[0].read_text())
    assert res["config"]["prepare_only"] and res["config"]["dtype"] == "float32"
    s = res["settings"][0]
    assert sorted(s["methods"]) == ["htp", "vanilla-mean"]  # raw has no preparation
    h = s["methods"]["htp"]
    assert h["tokens_per_second"] > 0 and h["text_tokens"] > 0
    assert h["breakdown"]["segment"] > 0
    assert "text tok/s" in format_prepare(s)
