"""Calibration presets: search space, preset round trip, and a budget-bounded real run."""

from __future__ import annotations

import json
import os

import pytest

from htp_retrieval.eval.calibrate import candidate_axes, load_preset

SCIFACT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data",
                                       "beir", "scifact"))


def test_axes_scale_with_depth() -> None:
    for n in (6, 24, 30, 32):
        axes = candidate_axes(n)
        for a, b in axes["window"]:
            assert 0 < a < b <= n
        assert all(-n <= o < 0 for o in axes["output_layer"])


def test_preset_round_trip_and_precedence(tiny_llama, tmp_path) -> None:  # noqa: ANN001
    from htp_retrieval.encoder import HTPEncoder

    model, tok = tiny_llama
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"best": {"tp_start": 2, "tp_exit": 4, "output_layer": -1,
                                         "summary": "mean", "max_blocks": 8, "k": None}}))
    assert load_preset(path)["tp_exit"] == 4
    enc = HTPEncoder(model, "htp", tokenizer=tok, preset=path)
    assert (enc.tp_start, enc.tp_exit, enc.exit_layer) == (2, 4, 6)
    assert enc.summary == "mean" and enc.max_blocks == 8
    enc2 = HTPEncoder(model, "htp", tokenizer=tok, preset=path, tp_exit=5, max_blocks=0)
    assert enc2.tp_exit == 5 and enc2.max_blocks is None  # explicit arguments win
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"best": {"layers": 3}}))
    with pytest.raises(ValueError, match="unknown preset keys"):
        load_preset(bad)
    bad.write_text("{}")
    with pytest.raises(ValueError, match="not a calibration preset"):
        load_preset(bad)


@pytest.mark.skipif(not os.path.isdir(SCIFACT), reason="shared SciFact data not present")
def test_calibrate_cli_writes_loadable_preset(tmp_path) -> None:
    from htp_retrieval.cli import main
    from htp_retrieval.encoder import HTPEncoder

    out = tmp_path / "smol.json"
    # a zero budget runs exactly the starting trial, on 4 train claims and 12 documents
    assert main(["calibrate", "--data", SCIFACT, "--max-queries", "4", "--max-docs", "12",
                 "--budget-minutes", "0", "--output", str(out)]) == 0
    raw = json.loads(out.read_text())
    assert raw["data"]["split"] == "train" and len(raw["trials"]) == 1
    t = raw["trials"][0]
    assert 0 <= t["htp"] <= 100 and 0 <= t["vanilla"] <= 100
    assert abs(t["gain"] - (t["htp"] - t["vanilla"])) < 1e-3
    enc = HTPEncoder("smollm2-135m-instruct", "htp", preset=out)
    assert enc.tp_exit == raw["best"]["tp_exit"]
    with pytest.raises(SystemExit, match="test split"):
        main(["calibrate", "--data", SCIFACT, "--split", "test", "--output", str(out)])
