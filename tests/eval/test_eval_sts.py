"""STS: loading jsonl, Spearman on FLOAT gold scores (never cast to int), cost, CLI."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from scipy.stats import spearmanr

from htp_retrieval.cli import main
from htp_retrieval.config import HTPConfig, LayerRange
from htp_retrieval.eval.retrieval import RetrievalResult
from htp_retrieval.eval.sts import StsData, load_sts, run_sts, spearman_percent
from htp_retrieval.pipeline import EncodeStats

STSB = os.path.abspath(os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "shared", "data", "sts", "stsb"))
needs_stsb = pytest.mark.skipif(not os.path.isdir(STSB), reason="../shared/data missing")


class _AngleEncoder:
    """Stub encoder: sentence ``"s<x>"`` -> unit vector at angle ``x`` (radians)."""

    def __init__(self) -> None:
        self.last_stats = EncodeStats()
        self.config = HTPConfig(method="vanilla-mean", max_length=512,
                                layers=LayerRange(1, 7, -2))

    def encode(self, texts, *, instruction=None, show_progress_bar=False):  # noqa: ANN001, ANN201
        angles = np.array([float(t[1:]) for t in texts])
        self.last_stats = EncodeStats(n_texts=len(texts), text_tokens=len(texts),
                                      input_tokens=len(texts), padded_tokens=len(texts))
        return np.stack([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)

    def record(self) -> dict:
        return {"model": "stub", "method": "angle"}


def test_spearman_uses_float_gold_not_int() -> None:
    # gold 0.2 .. 1.8: an int cast makes it 0,0,0,0,1,1,1,1,1 (ties) and changes Spearman
    gold = [0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.6, 1.8]
    angles = [1.5 - 0.15 * i for i in range(len(gold))]  # similarity rises with gold
    data = StsData("toy", "test", ["s0"] * len(gold), [f"s{a}" for a in angles], gold)
    res = run_sts(_AngleEncoder(), data, show_progress_bar=False)
    cos = np.cos(angles)
    assert res.scores["Spearman"] == pytest.approx(100 * spearmanr(cos, gold).statistic)
    assert res.scores["Spearman"] == pytest.approx(100.0)
    int_cast = 100 * spearmanr(cos, [int(g) for g in gold]).statistic
    assert int_cast < 90  # what the official script's int() would have reported
    assert spearman_percent(cos, gold) == pytest.approx(100.0)
    assert res.counts == {"n_pairs": 9, "n_sentences": 10}  # "s0" encoded once
    for key in ("encode_seconds", "cpu_seconds", "tokens_per_second", "peak_memory_bytes",
                "padding_fraction", "prepare_seconds", "forward_seconds"):
        assert key in res.cost


@needs_stsb
def test_load_stsb_keeps_float_scores() -> None:
    data = load_sts(STSB, split="test")
    assert (data.name, data.split, len(data)) == ("stsb", "test", 1379)
    assert all(isinstance(s, float) for s in data.scores)
    assert any(s != int(s) for s in data.scores)
    same = load_sts(os.path.join(STSB, "test.jsonl"))
    assert same.name == "stsb" and same.scores == data.scores


def test_bad_rows_name_file_and_line(tmp_path) -> None:  # noqa: ANN001
    f = tmp_path / "pairs.jsonl"
    f.write_text(json.dumps({"sentence1": "a", "sentence2": "b", "score": 1.5}) + "\n"
                 + json.dumps({"sentence1": "a", "score": 2}) + "\n")
    with pytest.raises(ValueError, match=r"pairs.jsonl:2"):
        load_sts(f)
    f.write_text(json.dumps({"sentence1": " ", "sentence2": "b", "score": 1}) + "\n")
    with pytest.raises(ValueError, match=r"pairs.jsonl:1: sentence1 and sentence2"):
        load_sts(f)


@needs_stsb
def test_cli_sts_on_tiny_model(tiny_dir, tmp_path, capsys) -> None:  # noqa: ANN001
    model_dir = tiny_dir
    out = tmp_path / "results"
    argv = ["eval", "--data", STSB, "--split", "test", "--methods", "vanilla-mean,htp",
            "--max-queries", "12", "--model", str(model_dir), "--dtype", "float32", "--output", str(out), "--quiet"]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "| Spearman |" in table and "### stsb (test)" in table
    files = sorted(out.rglob("*.json"))
    assert [f.name.split("__")[0] for f in files] == ["htp", "vanilla-mean"]
    res = RetrievalResult.load(files[0])
    # a Llama: htp runs with the family's short-text budget
    assert res.config["short_budget"] == [256, 1] and res.config["min_block_tokens"] == 64
    assert res.run["data"] == {"subset": {"max_queries": 12, "max_docs": 0}, "seed": 0}
    assert res.dataset == "stsb" and res.counts["n_pairs"] == 12
    assert np.isfinite(res.scores["Spearman"]) and res.cost["encode_seconds"] > 0
    assert res.config["command"].startswith("htp-retrieval eval --data")
