"""Adaptive K's short-text budget ``(S, B_S)``: at most B_S blocks for a text of up to S
text tokens (research/ANALYSIS.md section 16). The layout rule, the encoder's order of
defaults (argument > calibration preset > model family, for methods with a density cap),
result names, variant specs, the CLI flag and the report's settings columns."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from htp_retrieval import models
from htp_retrieval.cli import main
from htp_retrieval.encoder import HTPEncoder
from htp_retrieval.eval.harness import DataItem, EvalSettings, RunPoint, result_paths
from htp_retrieval.eval.report import is_shipped, key_is_relevant, read_result, variant_label
from htp_retrieval.layout import adaptive_k, block_budget, parse_long_budget
from htp_retrieval.methods import get_method
from htp_retrieval.models import default_short_budget

SHIPPED = (32, 64, (1024, 8))  # htp's B, T and long budget
TEXT = " ".join(f"Sentence number {i} is here." for i in range(40))  # 7 tokens a sentence


def test_short_budget_caps_blocks_up_to_s_tokens() -> None:
    assert block_budget(250, *SHIPPED) == 3  # the density cap alone: 250 // 64
    assert block_budget(250, *SHIPPED, (256, 1)) == 1
    assert block_budget(256, *SHIPPED, (256, 1)) == 1  # S itself is short
    assert block_budget(257, *SHIPPED, (256, 1)) == 4  # past S: the other caps
    assert block_budget(100, *SHIPPED, (256, 1)) == 1
    assert block_budget(100, None, None, None, (256, 2)) == 2  # alone it is the only cap
    assert block_budget(300, None, None, None, (256, 2)) is None
    # 36 sentences in 250 tokens: one block of all of them (K = 36), instead of K = 12
    assert adaptive_k(36, 1, 32, n_tokens=250, min_block_tokens=64) == 12
    assert adaptive_k(36, 1, 32, n_tokens=250, min_block_tokens=64, short_budget=(256, 1)) == 36
    with pytest.raises(ValueError, match="needs n_tokens"):
        adaptive_k(5, 1, 32, short_budget=(256, 1))
    with pytest.raises(ValueError, match="short_budget must be"):
        block_budget(100, 32, 64, None, (256, 0))
    with pytest.raises(ValueError, match="short budget '256' is not"):
        parse_long_budget("256", name="short budget")


def test_default_short_budget_only_for_methods_with_a_density_cap(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert default_short_budget(get_method("htp"), "llama") == \
        models.LAYER_PRESETS["llama"].short_budget
    monkeypatch.setitem(models.LAYER_PRESETS, "qwen2",
                        replace(models.LAYER_PRESETS["qwen2"], short_budget=(128, 2)))
    assert default_short_budget(get_method("htp"), "qwen2") == (128, 2)
    assert default_short_budget(get_method("htp-last"), "qwen2") is None  # no density cap
    assert default_short_budget(get_method("tp-sentence"), "qwen2") is None
    assert default_short_budget(get_method("htp"), None) is None


def test_encoder_short_budget_order_and_layouts(tiny_llama, monkeypatch) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    monkeypatch.setitem(models.LAYER_PRESETS, "llama",
                        replace(models.LAYER_PRESETS["llama"], short_budget=(512, 2)))
    fam = HTPEncoder(model, "htp", tokenizer=tok, max_length=512)
    assert fam.short_budget == (512, 2) and fam.record()["short_budget"] == [512, 2]
    arg = HTPEncoder(model, "htp", tokenizer=tok, max_length=512, short_budget=(512, 1))
    pre = HTPEncoder(model, "htp", tokenizer=tok, max_length=512,
                     preset={"short_budget": [512, 3]})
    off = HTPEncoder(model, "htp", tokenizer=tok, max_length=512, short_budget=0)
    assert (arg.short_budget, pre.short_budget, off.short_budget) == ((512, 1), (512, 3), None)
    assert off.record()["short_budget"] is None
    assert HTPEncoder(model, "htp-last", tokenizer=tok).short_budget is None
    n = {name: len(e.build_layouts([TEXT])[0].pst_positions)
         for name, e in (("fam", fam), ("arg", arg), ("pre", pre), ("off", off))}
    n_tokens = len(tok(TEXT, add_special_tokens=False)["input_ids"])
    assert n_tokens <= 512
    assert n == {"fam": 2, "arg": 1, "pre": 3, "off": max(1, n_tokens // 64)}
    with pytest.raises(ValueError, match="short_budget"):
        HTPEncoder(model, "htp", tokenizer=tok, short_budget=(256,))  # type: ignore[arg-type]


def test_runs_record_the_short_budget(tiny_dir: str) -> None:
    """The resolved short budget is part of the run: the family's by default (Llama: 256:1),
    the flag's otherwise, and nothing for methods without sentence blocks."""
    item = DataItem("retrieval", "needle", "test", None)  # type: ignore[arg-type]

    def run(method: str, **kw: object) -> tuple[dict, Path]:
        point = RunPoint(get_method(method), 256)
        (_, r, path), = result_paths(EvalSettings(model=tiny_dir, **kw), point, item)[1]  # type: ignore[arg-type]
        return r["htp_config"]["blocks"], path

    default, path = run("htp")
    assert default["short_budget"] == [256, 1]
    assert run("htp", short_budget=(256, 1))[1] == path
    off, off_path = run("htp", short_budget=0)
    assert off["short_budget"] is None and off_path != path
    assert run("htp", short_budget=(64, 1))[0]["short_budget"] == [64, 1]
    vanilla, vpath = run("vanilla-mean", short_budget=(256, 1))
    assert vanilla["short_budget"] is None and vpath == run("vanilla-mean")[1]


def test_short_budget_cli_flag(capsys) -> None:  # noqa: ANN001
    with pytest.raises(SystemExit):
        main(["eval", "--data", "passkey", "--short-budget", "256"])
    assert "--short-budget: short budget '256' is not L:B_L" in capsys.readouterr().err


def test_report_labels_short_budget_runs(tmp_path: Path) -> None:
    def rec(name: str, **extra: object) -> object:
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps({
            "dataset": "needle", "split": "test", "scores": {"NDCG@10": 1.0},
            "config": {"model": "smollm2-135m-instruct", "method": "htp", "k": 1,
                       "summary": "mean", "tokens_per_block": 32, "segmenter": "sentencizer",
                       "max_blocks": 32, "min_block_tokens": 64, "max_length": 256,
                       "context_length": 256, "long_budget": [1024, 8], **extra}}))
        return read_result(f)

    plain, short = rec("a"), rec("b", short_budget=[256, 1])
    assert key_is_relevant("htp", "short_budget") and not key_is_relevant(
        "vanilla-mean", "short_budget")
    shipped = models.LAYER_PRESETS["llama"].short_budget
    assert is_shipped(short, ["short_budget"]) == (shipped == (256, 1))
    assert is_shipped(plain, ["short_budget"]) == (shipped is None)
    assert variant_label(short, ["short_budget"]).startswith("htp (short_budget=256:1")
