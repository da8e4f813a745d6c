"""HTPConfig: validation, JSON round trip, resolution per family, and the encoder built on it."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from htp_retrieval import HTPConfig, HTPEncoder
from htp_retrieval.config import SETTING_KEYS, BlockPolicy, LayerRange


def _family(model_type: str, n_layers: int = 30, max_pos: int = 8192) -> SimpleNamespace:
    return SimpleNamespace(model_type=model_type, num_hidden_layers=n_layers,
                           max_position_embeddings=max_pos)


def test_json_round_trip_replace_and_digest() -> None:
    cfg = HTPConfig.for_model(_family("llama"), "htp", preset=None, k=2)
    again = HTPConfig.from_json(cfg.to_json())
    assert again == cfg and again.digest() == cfg.digest()
    assert isinstance(again.blocks.long_budget, tuple)  # lists in JSON come back as tuples
    assert HTPConfig.from_dict(cfg.flat()) == cfg  # the flat form reads too
    changed = cfg.replace(k=3, tp_start=2, long_budget=0, summary="last")
    assert (changed.blocks.k, changed.layers.tp_start, changed.blocks.long_budget,
            changed.summary) == (3, 2, None, "last")
    assert changed.digest() != cfg.digest() and cfg.blocks.k == 2  # frozen: cfg unchanged
    assert set(cfg.flat()) == set(SETTING_KEYS)
    with pytest.raises(ValueError, match="unknown replace"):
        cfg.replace(blocks_per_doc=3)
    with pytest.raises(ValueError, match="missing"):
        HTPConfig.from_dict({"method": "htp"})


@pytest.mark.parametrize("bad, match", [
    ({"summary": "max"}, "summary must be"),
    ({"k": 0}, "k \\(sentences per block\\)"),
    ({"max_length": 0}, "max_length must be"),
    ({"overflow": "drop"}, "overflow must be"),
    ({"segmenter": "nltk"}, "segmenter must be"),
    ({"long_budget": (1024,)}, "long_budget must be"),
    ({"placeholder_init": "random"}, "placeholder_init must be"),
    ({"method": "bm25"}, "unknown method"),
    ({"tp_start": 5, "tp_exit": 3}, "tp_start <= tp_exit"),
])
def test_invalid_values_are_refused_on_construction(bad: dict, match: str) -> None:
    cfg = HTPConfig(method="htp", max_length=512, layers=LayerRange(1, 7, -2))
    with pytest.raises(ValueError, match=match):
        cfg.replace(**bad)


def test_for_model_resolves_family_and_method_once() -> None:
    smol = HTPConfig.for_model(_family("llama", 30), "htp")
    assert (smol.layers, smol.summary, smol.max_length) == (LayerRange(1, 15, -2), "mean", 8064)
    assert smol.blocks == BlockPolicy(k=1, max_blocks=32, min_block_tokens=64,
                                      long_budget=(1024, 8), short_budget=(256, 1))
    qwen = HTPConfig.for_model(_family("qwen2", 24, 32768), "retrieval")  # alias of htp
    assert qwen.method == "htp" and qwen.layers == LayerRange(2, 7, -2)
    assert (qwen.blocks.long_budget, qwen.blocks.short_budget) == ((1024, 4), None)
    # the qwen2 family starts htp's copies one layer later than Token Prepending's
    assert HTPConfig.for_model(_family("qwen2", 24), "tp-mean").layers == LayerRange(1, 7, -2)
    assert HTPConfig.for_model(_family("qwen2", 24), "htp-last").layers.tp_start == 2
    assert HTPConfig.for_model(_family("qwen2", 24), "htp", tp_start=1).layers.tp_start == 1
    # Gemma-3 (text) copies before layers 1-3 (research/ANALYSIS.md section 21)
    gem = HTPConfig.for_model(_family("gemma3_text", 18), "htp")
    assert gem.layers == LayerRange(1, 4, -2) and gem.blocks.short_budget is None
    van = HTPConfig.for_model(_family("qwen2", 24), "vanilla-mean")
    assert van.blocks == BlockPolicy() and van.summary == "last"
    # a preset: explicit settings win over it; TP takes only its layers
    pre = {"tp_start": 2, "tp_exit": 4, "max_blocks": 8, "summary": "mean", "k": None}
    both = HTPConfig.for_model(_family("llama", 6), "htp", preset=pre, tp_exit=5)
    assert (both.layers.tp_start, both.layers.tp_exit, both.blocks.max_blocks) == (2, 5, 8)
    tp = HTPConfig.for_model(_family("llama", 6), "tp-mean", preset=pre)
    assert (tp.layers.tp_start, tp.blocks.max_blocks, tp.summary) == (2, None, "last")
    with pytest.raises(ValueError, match="tp_exit <= 6"):
        HTPConfig.for_model(_family("llama", 6), "htp", tp_exit=9)
    with pytest.raises(ValueError, match="unknown settings keys"):
        HTPConfig.for_model(_family("llama", 6), "htp", blocks=3)


def test_encoder_takes_a_config_and_has_at_most_ten_parameters(tiny_llama) -> None:  # noqa: ANN001
    assert len(inspect.signature(HTPEncoder.__init__).parameters) <= 10
    model, tok = tiny_llama
    by_name = HTPEncoder(model, "htp", tokenizer=tok, k=2, max_length=128)
    cfg = HTPConfig.from_json(by_name.config.to_json())
    by_config = HTPEncoder(model, cfg, tokenizer=tok)
    assert by_config.config == by_name.config and by_config.record() == by_name.record()
    texts = ["One sentence here. Another one follows. A third.", "Short text."]
    np.testing.assert_array_equal(by_config.encode(texts), by_name.encode(texts))
    assert HTPEncoder(model, cfg, tokenizer=tok, k=1).config.blocks.k == 1  # settings replace
    with pytest.raises(TypeError, match="unknown settings \\['blocks_per_doc'\\]"):
        HTPEncoder(model, "htp", tokenizer=tok, blocks_per_doc=2)
    with pytest.raises(ValueError, match="tp_exit <= 6"):  # the tiny model has 6 layers
        HTPEncoder(model, cfg.replace(tp_exit=9), tokenizer=tok)
    by_name.max_length = 64  # assignable, and the config follows
    assert by_name.config.max_length == 64


def test_config_is_saved_in_json_results(tiny_llama, tmp_path) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    enc = HTPEncoder(model, "htp", tokenizer=tok, max_length=96)
    path = tmp_path / "run.json"
    path.write_text(enc.config.to_json(indent=1))
    assert HTPEncoder(model, HTPConfig.from_json(path.read_text()), tokenizer=tok).config \
        == enc.config
    assert json.loads(path.read_text())["blocks"]["max_blocks"] == 32


def test_core_and_eval_never_import_research() -> None:
    code = (
        "import sys, htp_retrieval, htp_retrieval.encoder, htp_retrieval.config, "
        "htp_retrieval.cli, htp_retrieval.eval.harness, htp_retrieval.eval.report, "
        "htp_retrieval.eval.calibrate, htp_retrieval.integrations.chroma, "
        "htp_retrieval.integrations.embeddings\n"
        "bad = sorted(m for m in sys.modules if m.startswith('research'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    core = ("import sys, htp_retrieval, htp_retrieval.encoder, htp_retrieval.config\n"
            "bad = sorted(m for m in sys.modules if m.startswith('htp_retrieval.eval'))\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", core], check=True)


def test_record_reads_back_as_the_config(tiny_llama) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    for method, kw in [("htp", {}), ("vanilla-mean", {"overflow": "truncate"}),
                       ("htp-last", {"bare_prefix": "Text:", "keep_sink": False}),
                       ("tp-mean", {"max_length": 64, "overflow": "error"}),
                       ("htp-fixed-tokens", {"tokens_per_block": "auto"})]:
        enc = HTPEncoder(model, method, tokenizer=tok, **kw)
        assert HTPConfig.from_record(enc.record()) == enc.config, method


def test_config_command_prints_the_resolved_config(tmp_path, capsys) -> None:  # noqa: ANN001
    from htp_retrieval.cli import main

    assert main(["config", "--model", "smollm2-135m-instruct", "--k", "2"]) == 0
    printed = HTPConfig.from_json(capsys.readouterr().out)
    assert printed == HTPConfig.for_model("smollm2-135m-instruct", "htp", k=2)
    out = tmp_path / "cfg.json"
    assert main(["config", "--method", "vanilla-mean", "--output", str(out)]) == 0
    assert HTPConfig.from_json(out.read_text()).method == "vanilla-mean"
    with pytest.raises(SystemExit, match="tp_exit <= 30"):
        main(["config", "--tp-exit", "99"])
    bad = tmp_path / "bad.json"
    bad.write_text("[1]")
    with pytest.raises(SystemExit, match="--config .*bad.json"):
        main(["layout", "x", "--config", str(bad)])


def test_record_holds_every_setting(tiny_llama) -> None:  # noqa: ANN001
    """The record a results JSON stores holds every setting, so the config it was run with
    comes back whole from it (a setting added to HTPConfig later needs no record rule)."""
    model, tok = tiny_llama
    enc = HTPEncoder(model, "htp", tokenizer=tok)
    for cfg in (enc.config, enc.config.replace(bare_prefix="Text:", keep_sink=False)):
        enc.config = cfg
        record = enc.record()
        assert set(SETTING_KEYS) <= set(record)
        assert HTPConfig.from_record(record) == cfg
        assert record["exit_layer"] == enc.exit_layer and record["n_layers"] == enc.n_layers