"""Sweeps through ``htp-retrieval eval``: max length x K, needle context lengths, auto N."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from htp_retrieval.cli import main
from htp_retrieval.encoder import HTPEncoder
from htp_retrieval.eval.harness import (
    DataItem,
    EvalSettings,
    RunPoint,
    encode_length,
    parse_list,
    point_label,
    result_paths,
    sweep_points,
)
from htp_retrieval.layout import auto_tokens_per_block
from htp_retrieval.methods import get_method

SCIFACT = os.path.abspath(os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "shared", "data", "beir", "scifact"))
needs_scifact = pytest.mark.skipif(not os.path.isdir(SCIFACT), reason="../shared/data missing")


@pytest.fixture(autouse=True)
def _bf16_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's identity holds the dtype ``auto`` resolves to: pin the probe so these file
    checks read the same on every CPU."""
    monkeypatch.setattr("htp_retrieval.dtypes.cpu_prefers_bf16", lambda: True)


COST_KEYS = ("encode_seconds", "cpu_seconds", "tokens_per_second", "peak_memory_bytes",
             "padding_fraction", "prepare_seconds", "forward_seconds")


def test_parse_and_sweep_points() -> None:
    assert parse_list("512, 1024") == [512, 1024]
    assert parse_list("16,auto", allow_auto=True) == [16, "auto"]
    with pytest.raises(ValueError, match="'x'"):
        parse_list("1,x")
    pts = sweep_points(["vanilla-mean", "htp", "htp-fixed-tokens"], max_lengths=[512],
                       ks=[1, 4], ns=[16, "auto"])
    got = [(p.method.name, p.k, p.n) for p in pts]
    assert got == [("vanilla-mean", None, None), ("htp", 1, None), ("htp", 4, None),
                   ("htp-fixed-tokens", None, 16), ("htp-fixed-tokens", 1, "auto"),
                   ("htp-fixed-tokens", 4, "auto")]


def _labels(out: Path) -> list[str]:
    """The labels of the results under ``out``, sorted; every file is ``<method>__<digest>``."""
    paths = list(out.rglob("*.json"))
    assert all(re.fullmatch(r"[a-z-]+__[0-9a-f]{8}\.json", p.name) for p in paths)
    return sorted(json.loads(p.read_text())["label"] for p in paths)


def _planned(model: str, point: RunPoint, **kw: object) -> tuple[dict, Path]:
    """``(run, path)`` of one retrieval point, as ``eval`` plans it (nothing runs)."""
    item = DataItem("retrieval", "toy", "test", None)  # type: ignore[arg-type]
    (_, run, path), = result_paths(EvalSettings(model=model, **kw), point, item)[1]  # type: ignore[arg-type]
    return run, path


def test_result_files_are_the_method_and_a_digest_of_the_run(tiny_dir) -> None:  # noqa: ANN001
    """One file per resolved run: the same settings spelled two ways share it, any setting
    that changes the config (or the data, or the dtype) gets its own."""
    htp, vanilla = RunPoint(get_method("htp"), 512), RunPoint(get_method("vanilla-mean"), 512)
    run, path = _planned(tiny_dir, htp)
    assert re.fullmatch(r"htp__[0-9a-f]{8}\.json", path.name)
    assert path.parent.name == "toy-test"
    enc = HTPEncoder(tiny_dir, "htp", max_length=512, overflow="truncate")
    assert run["htp_config"] == enc.config.to_dict()  # what the encoder resolves
    assert run["dtype"] == "bfloat16" and run["data"] == {}
    # the defaults spelled out share the default's file
    assert _planned(tiny_dir, htp, max_blocks=32)[1] == path
    assert _planned(tiny_dir, htp, long_budget=(1024, 8), min_block_tokens=64)[1] == path
    # every other value is its own run, whether or not it changes a layout here
    others = [_planned(tiny_dir, htp, **kw)[1] for kw in (
        {"max_blocks": 8}, {"max_blocks": 0}, {"min_block_tokens": 0}, {"long_budget": 0},
        {"segmenter": "spacy"}, {"tp_start": 2}, {"output_layer": -3}, {"dtype": "float32"},
        {"max_queries": 30, "max_docs": 200}, {"max_queries": 30, "max_docs": 200, "seed": 1})]
    others += [_planned(tiny_dir, RunPoint(get_method("htp"), 512, 4))[1],
                _planned(tiny_dir, RunPoint(get_method("htp"), 1024))[1]]
    assert len({path, *others}) == len(others) + 1
    # block settings do not apply to vanilla-mean: one file
    assert _planned(tiny_dir, vanilla, max_blocks=0, long_budget=0)[1] == \
        _planned(tiny_dir, vanilla)[1]
    # the label names the settings given, never the file
    assert point_label(RunPoint(get_method("htp"), 512, 4), EvalSettings(
        segmenter="spacy", max_blocks=8, long_budget=0)) == "htp__len512__k4__mb8__lb0__spacy"
    assert point_label(vanilla, EvalSettings(max_blocks=8)) == "vanilla-mean__len512"


def test_auto_tokens_per_block_matches_sentence_count(tiny_llama) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    text = ("The cell divides quickly. Proteins fold in many ways under stress. Results were "
            "significant in mice and in rats. We repeat it.")
    sent = HTPEncoder(model, "htp", tokenizer=tok, dtype="float32",
                      min_block_tokens=0, short_budget=0).build_layouts([text])[0]
    fixed = HTPEncoder(model, "htp-fixed-tokens", tokenizer=tok, dtype="float32",
                       tokens_per_block="auto")
    lay = fixed.build_layouts([text])[0]
    n_sent, n_tok = len(sent.pst_positions), sent.n_text_tokens
    n = auto_tokens_per_block(n_tok, n_sent)
    assert n_sent == 4 and n == n_tok // 4
    assert lay.block_sizes[:-1] == (n,) * (len(lay.block_sizes) - 1)  # every N tokens
    assert len(lay.pst_positions) == -(-n_tok // n)  # ceil(T / N) >= sentences
    assert fixed.record()["tokens_per_block"] == "auto"
    with pytest.raises(ValueError, match="'auto'"):
        get_method("htp-fixed-tokens").with_options(tokens_per_block="some")  # type: ignore[arg-type]


def test_encode_length_keeps_synthetic_documents_whole(tiny_llama) -> None:  # noqa: ANN001
    from htp_retrieval.eval.synthetic import generate

    model, tok = tiny_llama
    enc = HTPEncoder(model, "htp", tokenizer=tok, dtype="float32")
    data = generate("passkey", 256, seed=0, n_docs=6, n_queries=2)
    longest = max(len(tok(data.doc_text(d), add_special_tokens=False).input_ids)
                  for d in data.corpus)
    assert 0.85 * 256 <= longest <= 256
    assert encode_length(enc, data, max_length=100, context_length=256) == 100  # flag wins
    assert encode_length(enc, data) == 512  # a BEIR set without --max-length
    assert encode_length(enc, data, context_length=256) == 256
    # measured with a tokenizer that counts fewer tokens: the longest document, not the cut
    assert encode_length(enc, data, context_length=64) == longest


@needs_scifact
def test_max_length_and_k_sweep_one_json_each(tiny_dir, tmp_path, capsys) -> None:  # noqa: ANN001
    out = tmp_path / "results"
    argv = ["eval", "--data", SCIFACT, "--methods", "vanilla-mean,htp", "--max-length", "48,96",
            "--k", "1,2", "--max-queries", "2", "--max-docs", "5", "--model", tiny_dir, "--dtype", "float32",
            "--output", str(out), "--quiet"]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert table.count("### scifact (test)") == 2
    assert "max length 48" in table and "max length 96" in table
    assert "| vanilla-mean | - | - |" in table and "| 1.00 | 1.00 |" in table
    assert _labels(out) == sorted(
        [f"vanilla-mean__len{n}" for n in (48, 96)]
        + [f"htp__len{n}__k{k}" for n in (48, 96) for k in (1, 2)])
    for p in out.rglob("*.json"):
        saved = json.loads(p.read_text())
        assert saved["config"]["command"].startswith("htp-retrieval eval --data")
        assert all(k in saved["cost"] for k in COST_KEYS)
        assert saved["config"]["max_length"] in (48, 96)
        assert saved["run"]["data"] == {"subset": {"max_queries": 2, "max_docs": 5}, "seed": 0}
        assert saved["run"]["dtype"] == "float32"
    assert not list(out.rglob("*.partial"))  # checkpoints removed after each save
    mtimes = {p: p.stat().st_mtime for p in out.rglob("*.json")}
    assert main(argv) == 0
    assert {p: p.stat().st_mtime for p in out.rglob("*.json")} == mtimes
    assert capsys.readouterr().err.count("reusing") == 6
    # cost ratios pair results timed by one call: reused ones keep their first call's ...
    assert main([*argv[:4], "htp,vanilla-mean", *argv[5:]]) == 0
    rows = sorted(line for line in capsys.readouterr().out.splitlines()
                  if line.startswith("| htp"))
    assert rows == sorted(line for line in table.splitlines() if line.startswith("| htp"))
    # ... and an htp result recomputed by another call has none against the old vanilla-mean
    one = [*argv[:4], "htp", "--max-length", "48", "--k", "1", *argv[9:]]
    assert main([*one, "--overwrite"]) == 0
    capsys.readouterr()
    assert main([*argv[:4], "vanilla-mean,htp", *one[5:]]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [r.endswith("| 1.00 | 1.00 |") for r in rows[1:]] == [True, False]
    assert rows[2].startswith("| htp") and rows[2].endswith("| n/a | n/a |")


def test_needle_context_lengths_one_json_each(tiny_dir, tmp_path, capsys) -> None:  # noqa: ANN001
    out = tmp_path / "results"
    argv = ["eval", "--data", "passkey", "--context-lengths", "64,128", "--methods",
            "vanilla-mean,htp-fixed-tokens", "--tokens-per-block", "auto", "--max-queries", "2",
            "--max-docs", "4", "--model", tiny_dir, "--dtype", "float32", "--output", str(out), "--quiet",
            "--verbose"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "context length 64 tokens" in printed and "| Acc@1 | NDCG@10 |" in printed
    assert "<B-PST>" in printed  # --verbose layout of htp-fixed-tokens
    assert _labels(out) == ["htp-fixed-tokens__nauto"] * 2 + ["vanilla-mean"] * 2
    runs = {(p.name.split("__")[0], json.loads(p.read_text())["run"]["data"]["context_length"]): p
            for p in out.rglob("*.json")}
    assert sorted(runs) == [("htp-fixed-tokens", 64), ("htp-fixed-tokens", 128),
                            ("vanilla-mean", 64), ("vanilla-mean", 128)]
    saved = json.loads(runs["vanilla-mean", 128].read_text())
    assert saved["dataset"] == "passkey" and saved["config"]["context_length"] == 128
    assert saved["config"]["max_length"] >= 128  # covers the context length
    assert saved["config"]["synthetic"]["tokenizer"] == "smollm2-135m-instruct"
    assert 0 <= saved["scores"]["Acc@1"] <= 100 and saved["counts"]["n_docs"] == 4
    # per-query rows average to the scores; each query knows where its key sits
    rows = saved["per_query"]
    assert sorted(rows) == sorted(saved["query_meta"]) and len(rows) == 2
    for label in ("Acc@1", "NDCG@10"):
        assert sum(r[label] for r in rows.values()) / 2 == pytest.approx(saved["scores"][label])
    for meta in saved["query_meta"].values():
        assert meta["doc_id"].startswith("passkey-128-d") and 0.0 <= meta["position"] <= 1.0


@needs_scifact
def test_eval_with_a_calibration_preset(tiny_dir, tmp_path, capsys) -> None:  # noqa: ANN001
    preset = tmp_path / "from-12-layers.json"
    preset.write_text(json.dumps({"n_layers": 12, "best": {
        "tp_start": 2, "tp_exit": 8, "output_layer": -2, "summary": "mean", "max_blocks": 0}}))
    out = tmp_path / "results"
    argv = ["eval", "--data", SCIFACT, "--methods", "vanilla-mean,htp", "--max-length", "48",
            "--max-queries", "2", "--max-docs", "5", "--model", tiny_dir, "--dtype", "float32",
            "--output", str(out), "--quiet", "--preset", str(preset)]
    assert main(argv) == 0
    assert _labels(out) == ["htp__len48__preset-from-12-layers",
                            "vanilla-mean__len48__preset-from-12-layers"]
    cfg = {p.name.split("__")[0]: json.loads(p.read_text())["config"] for p in out.rglob("*.json")}
    assert (cfg["htp"]["tp_start"], cfg["htp"]["tp_exit"]) == (1, 4)  # scaled 12 -> 6 layers
    assert cfg["htp"]["exit_layer"] == cfg["vanilla-mean"]["exit_layer"] == 5
    assert cfg["htp"]["max_blocks"] is None and cfg["htp"]["summary"] == "mean"
    assert cfg["htp"]["preset"] == str(preset)
    capsys.readouterr()
    preset.write_text("{}")
    with pytest.raises(SystemExit, match="--preset: .*not a calibration preset"):
        main(argv)
    with pytest.raises(SystemExit, match="--preset: .*No such file"):
        main([*argv[:-1], str(tmp_path / "missing.json")])


def test_unknown_data_is_a_clear_cli_error(tmp_path) -> None:  # noqa: ANN001
    with pytest.raises(SystemExit, match="'nfcorpus': no such file or folder"):
        main(["eval", "--data", "nfcorpus", "--output", str(tmp_path)])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="expected a BEIR/LongEmbed folder"):
        main(["eval", "--data", str(tmp_path / "empty"), "--output", str(tmp_path)])
    with pytest.raises(SystemExit, match="'x' in '512,x' is not an integer"):
        main(["eval", "--data", "passkey", "--max-length", "512,x"])
    with pytest.raises(SystemExit, match="--chunk-chars must be >= 0, got -1"):
        main(["eval", "--data", "passkey", "--chunk-chars", "-1"])
    with pytest.raises(SystemExit, match="--chunk-size must be >= 1, got 0"):
        main(["eval", "--data", "passkey", "--chunk-size", "0"])


def test_bad_long_budget_is_a_clear_cli_error(capsys) -> None:  # noqa: ANN001
    with pytest.raises(SystemExit):
        main(["eval", "--data", "passkey", "--long-budget", "1024"])
    assert "--long-budget: long budget '1024' is not L:B_L" in capsys.readouterr().err


def test_htp_long_budget_caps_blocks_past_1024_tokens(tiny_llama) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    doc = " ".join(f"Cell line {i} divides quickly." for i in range(200))
    n_tokens = len(tok(doc, add_special_tokens=False)["input_ids"])
    assert n_tokens > 1024  # the test needs a document past L
    htp = HTPEncoder(model, "htp", tokenizer=tok, dtype="float32", max_length=4096)
    off = HTPEncoder(model, "htp", tokenizer=tok, dtype="float32", max_length=4096,
                     long_budget=0)
    assert htp.long_budget == (1024, 8) and off.long_budget is None
    assert htp.record()["long_budget"] == [1024, 8] and off.record()["long_budget"] is None
    assert len(htp.build_layouts([doc])[0].pst_positions) == 8
    k = -(-200 // min(32, n_tokens // 64))  # K under B = 32 and T = 64 alone
    assert len(off.build_layouts([doc])[0].pst_positions) == -(-200 // k) > 8
    short = " ".join(f"Cell line {i} divides quickly." for i in range(20))
    assert htp.build_layouts([short]) == off.build_layouts([short])
    with pytest.raises(ValueError, match="long_budget"):
        HTPEncoder(model, "htp", tokenizer=tok, long_budget=(1024, 0))  # type: ignore[arg-type]


def test_htp_default_block_budget_caps_long_documents(tiny_llama) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    long_doc = " ".join(f"Cell line {i} divides quickly." for i in range(40))
    short_doc = " ".join(f"Cell line {i} divides quickly." for i in range(20))
    # the block budget B alone (T = 0): the density cap is tested in test_calibrate
    htp = HTPEncoder(model, "htp", tokenizer=tok, dtype="float32", min_block_tokens=0)
    fixed = HTPEncoder(model, "htp", tokenizer=tok, dtype="float32", max_blocks=0,
                       min_block_tokens=0)
    paper = HTPEncoder(model, "htp-last", tokenizer=tok, dtype="float32")
    assert htp.max_blocks == 32 and fixed.max_blocks is None and paper.max_blocks is None
    assert htp.record()["max_blocks"] == 32 and fixed.record()["max_blocks"] is None
    # 40 sentences: K grows to ceil(40 / 32) = 2, so 20 blocks; fixed K = 1 keeps 40
    assert len(htp.build_layouts([long_doc])[0].pst_positions) == 20
    assert len(fixed.build_layouts([long_doc])[0].pst_positions) == 40
    assert len(paper.build_layouts([long_doc])[0].pst_positions) == 40
    # up to 32 sentences the budget changes nothing: the layout equals fixed K = 1
    assert htp.build_layouts([short_doc]) == fixed.build_layouts([short_doc])


def test_result_file_follows_the_resolved_dtype(tiny_dir,  # noqa: ANN001
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    point = RunPoint(get_method("vanilla-mean"), 512)
    fp32 = _planned(tiny_dir, point, dtype="float32")
    monkeypatch.setattr("htp_retrieval.dtypes.cpu_prefers_bf16", lambda: False)
    assert _planned(tiny_dir, point, device="cpu") == fp32  # auto on an AVX2-only CPU
    bf16 = _planned(tiny_dir, point, device="cpu", dtype="bfloat16")
    assert bf16[1] != fp32[1] and bf16[0]["dtype"] == "bfloat16"


@needs_scifact
def test_eval_of_one_saved_config(tiny_dir, tmp_path, capsys) -> None:  # noqa: ANN001
    from htp_retrieval.config import HTPConfig

    cfg_path = tmp_path / "cfg.json"
    assert main(["config", "--model", tiny_dir, "--k", "2", "--max-length", "48",
                 "--overflow", "truncate", "--output", str(cfg_path)]) == 0
    cfg = HTPConfig.from_json(cfg_path.read_text())
    out = tmp_path / "results"
    argv = ["eval", "--data", SCIFACT, "--max-queries", "2", "--max-docs", "5", "--model",
            tiny_dir, "--dtype", "float32", "--output", str(out), "--quiet",
            "--config", str(cfg_path)]
    assert main(argv) == 0
    (path,) = out.rglob("*.json")
    assert _labels(out) == [f"htp__cfg-{cfg.digest()}"]
    raw = json.loads(path.read_text())
    assert HTPConfig.from_dict(raw["htp_config"]) == cfg  # evaluated exactly as saved
    assert raw["config"]["k"] == 2 and raw["config"]["max_length"] == 48
    capsys.readouterr()
    assert main(argv) == 0  # the rerun reuses the file
    assert "reusing" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="settings \\['tp_start'\\] are given"):
        main([*argv, "--tp-start", "2"])
    with pytest.raises(SystemExit, match="differ from the config's method"):
        main([*argv, "--methods", "vanilla-mean"])
