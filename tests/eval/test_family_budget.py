"""A model family's own adaptive-K long-text budget (``LayerPreset.long_budget``): the
encoder runs it by default, results record it in their run, and the report counts it as
shipped."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from htp_retrieval import models
from htp_retrieval.encoder import HTPEncoder
from htp_retrieval.eval.harness import DataItem, EvalSettings, RunPoint, result_paths
from htp_retrieval.eval.report import is_shipped, read_result, variant_label
from htp_retrieval.methods import get_method
from htp_retrieval.models import default_long_budget, model_type_of

HTP_OWN = get_method("htp").long_budget  # (1024, 8)
FAMILY = (64, 2)


@pytest.fixture
def qwen2_budget(monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """The ``qwen2`` family preset with its own long budget, whatever the shipped one is."""
    monkeypatch.setitem(models.LAYER_PRESETS, "qwen2",
                        replace(models.LAYER_PRESETS["qwen2"], long_budget=FAMILY))
    return FAMILY


def test_default_long_budget_per_family(qwen2_budget: tuple[int, int]) -> None:
    assert default_long_budget(HTP_OWN, "qwen2") == qwen2_budget
    assert default_long_budget(HTP_OWN, "llama") == HTP_OWN  # no family budget: the method's
    assert default_long_budget(HTP_OWN, None) == HTP_OWN
    assert default_long_budget(HTP_OWN, "no-such-family") == HTP_OWN
    assert default_long_budget(None, "qwen2") is None  # a method without one keeps none


def test_model_type_of_packaged_and_local(tmp_path: Path, tiny_llama) -> None:  # noqa: ANN001
    assert model_type_of("qwen2.5-coder-0.5b-instruct") == "qwen2"
    assert model_type_of("smollm2-135m-instruct") == "llama"
    model, _ = tiny_llama
    model.config.save_pretrained(tmp_path)  # config.json only: no weights are read
    assert model_type_of(str(tmp_path)) == "llama"
    assert model_type_of(str(tmp_path / "missing")) is None


def test_encoder_takes_the_family_budget(tiny, qwen2_budget: tuple[int, int]) -> None:  # noqa: ANN001
    """Order: explicit argument > calibration preset > family > method."""
    model, tok = tiny
    family = model.config.model_type
    expect = qwen2_budget if family == "qwen2" else HTP_OWN
    assert HTPEncoder(model, "htp", tokenizer=tok).long_budget == expect
    assert HTPEncoder(model, "htp", tokenizer=tok, long_budget=(1024, 8)).long_budget == HTP_OWN
    assert HTPEncoder(model, "htp", tokenizer=tok, long_budget=0).long_budget is None
    assert HTPEncoder(model, "htp", tokenizer=tok,
                      preset={"long_budget": [512, 3]}).long_budget == (512, 3)
    assert HTPEncoder(model, "htp", tokenizer=tok, preset={"long_budget": 0}).long_budget is None
    assert HTPEncoder(model, "htp-last", tokenizer=tok).long_budget is None  # none of its own
    if family == "qwen2":  # the family budget shapes the layouts: 2 blocks past 64 tokens
        enc = HTPEncoder(model, "htp", tokenizer=tok, max_length=256)
        text = " ".join(f"Sentence number {i} is here." for i in range(30))
        assert len(enc.build_layouts([text])[0].pst_positions) == qwen2_budget[1]
    with pytest.raises(ValueError, match="long_budget"):
        HTPEncoder(model, "htp", tokenizer=tok, long_budget=(1024,))


def _blocks(model: str, point: RunPoint, **kw: object) -> tuple[dict, Path]:
    """The resolved block policy of one point's run, and its file (nothing runs)."""
    item = DataItem("retrieval", "needle", "test", None)  # type: ignore[arg-type]
    (_, run, path), = result_paths(EvalSettings(model=model, **kw), point, item)[1]  # type: ignore[arg-type]
    return run["htp_config"]["blocks"], path


def test_runs_record_the_family_budget(qwen2_budget: tuple[int, int], tiny_qwen_dir: str,
                                       tiny_dir: str) -> None:
    htp = RunPoint(get_method("htp"), 2048)
    qwen, path = _blocks(tiny_qwen_dir, htp)
    assert qwen["long_budget"] == list(qwen2_budget)
    # the same file as the flag naming that budget, so an explicit run is reused
    assert _blocks(tiny_qwen_dir, htp, long_budget=qwen2_budget)[1] == path
    # the method's own budget on this family is another run
    own, own_path = _blocks(tiny_qwen_dir, htp, long_budget=HTP_OWN)
    assert own["long_budget"] == list(HTP_OWN) and own_path != path
    # Llama keeps the method's long budget and adds its short-text budget (section 16)
    llama = _blocks(tiny_dir, htp)[0]
    assert llama["long_budget"] == list(HTP_OWN) and llama["short_budget"] == [256, 1]
    vanilla = _blocks(tiny_qwen_dir, RunPoint(get_method("vanilla-mean"), 2048))[0]
    assert vanilla["long_budget"] is None and vanilla["max_blocks"] is None


def test_report_counts_the_family_budget_as_shipped(
        tmp_path: Path, qwen2_budget: tuple[int, int]) -> None:
    def rec(name: str, model: str, long_budget: list[int],
            short_budget: list[int] | None = None) -> object:
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps({
            "dataset": "needle", "split": "test", "scores": {"NDCG@10": 1.0},
            "config": {"model": model, "method": "htp", "k": 1, "summary": "mean",
                       "tokens_per_block": 32, "segmenter": "sentencizer",
                       "max_blocks": 32, "min_block_tokens": 64, "max_length": 2048,
                       "context_length": 2048, "long_budget": long_budget,
                       "short_budget": short_budget}}))
        return read_result(f)

    fam = rec("a", "qwen2.5-coder-0.5b-instruct", list(qwen2_budget))
    own = rec("b", "qwen2.5-coder-0.5b-instruct", list(HTP_OWN))
    smol = rec("c", "smollm2-135m-instruct", list(HTP_OWN), [256, 1])  # Llama's short budget
    keys = ["long_budget"]
    assert is_shipped(fam, keys) and not is_shipped(own, keys) and is_shipped(smol, keys)
    # alone in its table (nothing varies) the method's budget is still not Qwen's shipped one
    assert is_shipped(fam, []) and not is_shipped(own, []) and is_shipped(smol, [])
    assert variant_label(fam, keys) == \
        f"htp (long_budget={qwen2_budget[0]}:{qwen2_budget[1]}, default)"
    assert variant_label(own, keys) == "htp (long_budget=1024:8)"


def test_shipped_qwen2_budget_is_its_default_run(tiny_qwen_dir: str) -> None:
    """Qwen2 ships 4 blocks past 1024 text tokens (research/ANALYSIS.md section 14): a default
    run shares its file with ``--long-budget 1024:4``, and the method's own (1024, 8) is
    the variant it now is."""
    htp = RunPoint(get_method("htp"), 2048)
    default, path = _blocks(tiny_qwen_dir, htp)
    assert default["long_budget"] == [1024, 4]
    assert _blocks(tiny_qwen_dir, htp, long_budget=(1024, 4))[1] == path
    assert _blocks(tiny_qwen_dir, htp, long_budget=HTP_OWN)[1] != path
    assert default_long_budget(HTP_OWN, model_type_of("smollm2-135m-instruct")) == HTP_OWN


def test_k_policy_help_names_the_spec_and_family_defaults(qwen2_budget: tuple[int, int]) -> None:
    """The ``--long-budget``/``--max-blocks``/``--min-block-tokens`` help reads its defaults
    from the ``htp`` spec and the family presets, so it cannot drift from what runs."""
    import argparse

    from htp_retrieval.cli import _add_k_policy_args

    p = argparse.ArgumentParser(prog="x", formatter_class=argparse.RawTextHelpFormatter)
    _add_k_policy_args(p)
    text = " ".join(p.format_help().split())
    htp = get_method("htp")
    assert f"(qwen2: {qwen2_budget[0]}:{qwen2_budget[1]})" in text
    assert f"(htp: {HTP_OWN[0]}:{HTP_OWN[1]})" in text
    assert f"(htp: {htp.max_blocks})" in text
    assert f"(htp: {htp.min_block_tokens})" in text
