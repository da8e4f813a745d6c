"""Sweeps through ``htp-retrieval eval``: max length x K, needle context lengths, auto N."""

from __future__ import annotations

import json
import os

import pytest

from htp_retrieval.cli import main
from htp_retrieval.encoder import HTPEncoder
from htp_retrieval.eval.harness import (
    EvalSettings,
    RunPoint,
    encode_length,
    parse_list,
    result_name,
    sweep_points,
)
from htp_retrieval.layout import auto_tokens_per_block
from htp_retrieval.methods import get_method

SCIFACT = os.path.abspath(os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "shared", "data", "beir", "scifact"))
needs_scifact = pytest.mark.skipif(not os.path.isdir(SCIFACT), reason="../shared/data missing")


@pytest.fixture(autouse=True)
def _bf16_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Result names carry the dtype ``auto`` resolves to when it is not bf16: pin the
    probe so these name checks read the same on every CPU."""
    monkeypatch.setattr("htp_retrieval.dtypes.cpu_has_native_bf16", lambda: True)


COST_KEYS = ("encode_seconds", "cpu_seconds", "tokens_per_second", "peak_memory_bytes",
             "padding_fraction", "prepare_seconds", "forward_seconds")


@pytest.fixture(scope="module")
def tiny_dir(tiny_llama, tmp_path_factory) -> str:  # noqa: ANN001
    model, tok = tiny_llama
    d = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


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


def test_result_names_keep_the_existing_scheme() -> None:
    s = EvalSettings(max_queries=30, max_docs=200, seed=0)
    assert result_name(RunPoint(get_method("vanilla-mean"), 512), s) == \
        "vanilla-mean__len512__q30d200s0.json"
    assert result_name(RunPoint(get_method("htp"), 512, 4), EvalSettings(segmenter="spacy")) == \
        "htp__len512__k4__mbt64__spacy.json"  # htp's density cap T = 64 is in the name
    assert result_name(RunPoint(get_method("htp"), 512), EvalSettings(min_block_tokens=0)) == \
        "htp__len512.json"  # no cap: the name of htp results made before T = 64 was default
    synth = result_name(RunPoint(get_method("htp"), None, None), EvalSettings(seed=2),
                        context_length=4096)
    assert synth == "htp__ctx4096__mbt64__seed2.json"
    assert result_name(RunPoint(get_method("htp-last"), 512), EvalSettings()) == \
        "htp-last__len512.json"  # the paper's HTP has no cap


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
    files = sorted(p.name for p in out.rglob("*.json"))
    assert files == sorted(
        [f"vanilla-mean__len{n}__q2d5s0__float32.json" for n in (48, 96)]
        + [f"htp__len{n}__k{k}__mbt64__q2d5s0__float32.json" for n in (48, 96)
           for k in (1, 2)])
    for p in out.rglob("*.json"):
        saved = json.loads(p.read_text())
        assert saved["config"]["command"].startswith("htp-retrieval eval --data")
        assert all(k in saved["cost"] for k in COST_KEYS)
        assert saved["config"]["max_length"] in (48, 96)
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
    names = sorted(p.name for p in out.rglob("*.json"))
    assert names == ["htp-fixed-tokens__ctx128__nauto__q2d4s0__float32.json",
                     "htp-fixed-tokens__ctx64__nauto__q2d4s0__float32.json",
                     "vanilla-mean__ctx128__q2d4s0__float32.json",
                     "vanilla-mean__ctx64__q2d4s0__float32.json"]
    saved = json.loads(next(out.rglob("vanilla-mean__ctx128*.json")).read_text())
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
    names = sorted(p.name for p in out.rglob("*.json"))
    assert names == ["htp__len48__preset-from-12-layers__q2d5s0__float32.json",
                     "vanilla-mean__len48__preset-from-12-layers__q2d5s0__float32.json"]
    cfg = {p.name.split("__")[0]: json.loads(p.read_text())["config"] for p in out.rglob("*.json")}
    assert (cfg["htp"]["tp_start"], cfg["htp"]["tp_exit"]) == (1, 4)  # scaled 12 -> 6 layers
    assert cfg["htp"]["exit_layer"] == cfg["vanilla-mean"]["exit_layer"] == 5
    assert "max_blocks" not in cfg["htp"] and cfg["htp"]["summary"] == "mean"
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


def test_bad_long_budget_is_a_clear_cli_error(capsys) -> None:  # noqa: ANN001
    with pytest.raises(SystemExit):
        main(["eval", "--data", "passkey", "--long-budget", "1024"])
    assert "--long-budget: long budget '1024' is not L:B_L" in capsys.readouterr().err


def test_block_budget_in_result_names_only_for_sentence_blocks() -> None:
    s = EvalSettings(max_blocks=0)
    assert result_name(RunPoint(get_method("htp"), 8192), s) == "htp__len8192__mb0__mbt64.json"
    assert result_name(RunPoint(get_method("vanilla-mean"), 8192), s) == \
        "vanilla-mean__len8192.json"
    assert result_name(RunPoint(get_method("htp"), 8192), EvalSettings()) == \
        "htp__len8192__mbt64.json"
    # the default budget (32) shares the default's file; another one is in the name
    assert result_name(RunPoint(get_method("htp"), 8192), EvalSettings(max_blocks=32)) == \
        "htp__len8192__mbt64.json"
    assert result_name(RunPoint(get_method("htp"), 8192), EvalSettings(max_blocks=8)) == \
        "htp__len8192__mb8__mbt64.json"
    assert result_name(RunPoint(get_method("htp-last"), 8192), EvalSettings(max_blocks=8)) == \
        "htp-last__len8192__mb8.json"  # htp-last keeps K fixed by default
    assert result_name(RunPoint(get_method("htp"), 8192), EvalSettings(preset="p.json")) == \
        "htp__len8192__preset-p.json"  # the preset decides T


def test_long_budget_in_result_names_only_where_it_binds() -> None:
    """``lb<L>-<B_L>`` / ``lb0`` appear only when the flag changes some layout at the length."""
    htp = RunPoint(get_method("htp"), 8192)
    assert result_name(htp, EvalSettings(long_budget=0)) == "htp__len8192__lb0__mbt64.json"
    assert result_name(htp, EvalSettings(long_budget=(1024, 8))) == "htp__len8192__mbt64.json"
    assert result_name(htp, EvalSettings(long_budget=(2048, 4))) == \
        "htp__len8192__lb2048-4__mbt64.json"
    # at 1024 tokens or with B = 8 the default (1024, 8) cannot bind: one file
    assert result_name(RunPoint(get_method("htp"), 1024), EvalSettings(long_budget=0)) == \
        "htp__len1024__mbt64.json"
    assert result_name(htp, EvalSettings(max_blocks=8, long_budget=0)) == \
        "htp__len8192__mb8__mbt64.json"
    assert result_name(RunPoint(get_method("vanilla-mean"), 8192),
                       EvalSettings(long_budget=0)) == "vanilla-mean__len8192.json"
    # synthetic tasks name the context length, which is the length that counts
    assert result_name(RunPoint(get_method("htp"), None), EvalSettings(long_budget=0),
                       context_length=2048) == "htp__ctx2048__lb0__mbt64.json"


def test_htp_long_budget_caps_blocks_past_1024_tokens(tiny_llama) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    doc = " ".join(f"Cell line {i} divides quickly." for i in range(200))
    n_tokens = len(tok(doc, add_special_tokens=False)["input_ids"])
    assert n_tokens > 1024  # the test needs a document past L
    htp = HTPEncoder(model, "htp", tokenizer=tok, dtype="float32", max_length=4096)
    off = HTPEncoder(model, "htp", tokenizer=tok, dtype="float32", max_length=4096,
                     long_budget=0)
    assert htp.long_budget == (1024, 8) and off.long_budget is None
    assert htp.record()["long_budget"] == [1024, 8] and "long_budget" not in off.record()
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
    assert htp.record()["max_blocks"] == 32 and "max_blocks" not in fixed.record()
    # 40 sentences: K grows to ceil(40 / 32) = 2, so 20 blocks; fixed K = 1 keeps 40
    assert len(htp.build_layouts([long_doc])[0].pst_positions) == 20
    assert len(fixed.build_layouts([long_doc])[0].pst_positions) == 40
    assert len(paper.build_layouts([long_doc])[0].pst_positions) == 40
    # up to 32 sentences the budget changes nothing: the layout equals fixed K = 1
    assert htp.build_layouts([short_doc]) == fixed.build_layouts([short_doc])


def test_result_name_carries_a_dtype_other_than_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    point = RunPoint(get_method("vanilla-mean"), 512)
    assert result_name(point, EvalSettings(dtype="float32")) == "vanilla-mean__len512__float32.json"
    monkeypatch.setattr("htp_retrieval.dtypes.cpu_has_native_bf16", lambda: False)
    assert result_name(point, EvalSettings(device="cpu")) == "vanilla-mean__len512__float32.json"
    assert result_name(point, EvalSettings(device="cpu", dtype="bfloat16")) == \
        "vanilla-mean__len512.json"


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
    assert path.name == f"htp__cfg-{cfg.digest()}__q2d5s0__float32.json"
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
