"""Calibration presets: search space, preset round trip, and a budget-bounded real run."""

from __future__ import annotations

import json
import os

import pytest

from htp_retrieval.eval.calibrate import candidate_axes, load_preset, scale_layers

SCIFACT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data",
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


def test_scale_layers_keeps_fraction_of_depth() -> None:
    smol = {"tp_start": 1, "tp_exit": 15, "output_layer": -2, "summary": "mean", "max_blocks": 32}
    # SmolLM2's first half (1-14 of 30) carried to Qwen2.5's 24 layers: 1-11, exit unchanged
    assert scale_layers(smol, 30, 24) == {**smol, "tp_exit": 12}
    assert scale_layers(smol, 30, 30) == smol and scale_layers(smol, 30, 30) is not smol
    tiny = scale_layers({"tp_start": 1, "tp_exit": 2}, 30, 6)  # 1-1 of 30 -> still one layer
    assert tiny == {"tp_start": 1, "tp_exit": 2}
    assert scale_layers({"tp_start": 0, "tp_exit": 0, "output_layer": 29}, 30, 24) == \
        {"tp_start": 0, "tp_exit": 0, "output_layer": 23}  # an empty window stays empty
    with pytest.raises(ValueError, match="from_layers=0"):
        scale_layers(smol, 0, 24)


def test_preset_from_another_depth_is_scaled_per_method(tiny_llama, tmp_path) -> None:  # noqa: ANN001
    from htp_retrieval.encoder import HTPEncoder

    model, tok = tiny_llama  # 6 layers
    path = tmp_path / "deep.json"
    path.write_text(json.dumps({"n_layers": 12, "best": {
        "tp_start": 2, "tp_exit": 8, "output_layer": -2, "summary": "mean", "max_blocks": 4}}))
    assert load_preset(path)["tp_exit"] == 8  # as written without a target depth
    assert load_preset(path, n_layers=6)["tp_exit"] == 4
    enc = HTPEncoder(model, "htp-last", tokenizer=tok, preset=path)
    assert (enc.tp_start, enc.tp_exit, enc.exit_layer) == (1, 4, 5)
    assert enc.summary == "mean" and enc.max_blocks == 4
    assert enc.record()["preset"] == str(path)
    tp = HTPEncoder(model, "tp-mean", tokenizer=tok, preset=path)  # layers only
    assert (tp.tp_start, tp.tp_exit, tp.exit_layer, tp.summary) == (1, 4, 5, "last")
    van = HTPEncoder(model, "vanilla-mean", tokenizer=tok, preset=path)  # exit layer only
    assert van.exit_layer == 5 and van.max_blocks is None
    assert van.record()["summary"] == "last" and van.record()["max_blocks"] is None


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
    assert raw["min_gain"] == 1.0  # the objective's bar is recorded with the preset
    enc = HTPEncoder("smollm2-135m-instruct", "htp", preset=out)
    assert enc.tp_exit == raw["best"]["tp_exit"]
    with pytest.raises(SystemExit, match="test split"):
        main(["calibrate", "--data", SCIFACT, "--split", "test", "--output", str(out)])


@pytest.mark.skipif(not os.path.isdir(SCIFACT), reason="shared SciFact data not present")
def test_calibrate_resumes_from_its_trial_journal(tmp_path, capsys, tiny_dir) -> None:  # noqa: ANN001
    """An interrupted calibration resumes: scored trials are read back from the journal
    (a line torn by the kill is dropped), their seconds count against the budget, and a
    journal of other data is refused by name. (Logic only: a tiny random model.)"""
    from htp_retrieval.cli import main

    out = tmp_path / "smol.json"
    args = ["calibrate", "--model", tiny_dir, "--data", SCIFACT, "--max-queries", "4",
            "--max-docs", "12", "--output", str(out)]
    assert main([*args, "--budget-minutes", "0"]) == 0
    journal = tmp_path / "smol.trials.jsonl"  # default: next to the preset
    lines = journal.read_text().splitlines()
    header = json.loads(lines[0])
    assert header["model"] == tiny_dir and header["data"]["n_docs"] == 12
    assert sum('"vanilla"' in x and '"trial"' not in x for x in lines[1:]) == 1
    (first,) = [json.loads(x)["trial"] for x in lines if x.startswith('{"trial"')]
    first_preset = json.loads(out.read_text())
    # a kill while writing leaves a torn line; the starting trial took "a long time"
    first["seconds"] = 1e6
    journal.write_text("\n".join([*lines[:-1], json.dumps({"trial": first})])
                       + '\n{"trial": {"sett')
    capsys.readouterr()
    # a 60-minute budget: the replayed 1e6 s already exceed it, so nothing new runs
    assert main([*args, "--budget-minutes", "60"]) == 0
    err = capsys.readouterr().err
    assert "resuming: 1 scored trials" in err and "from smol.trials.jsonl" in err
    resumed = json.loads(out.read_text())
    assert len(resumed["trials"]) == 1
    assert resumed["trials"][0]["htp"] == first_preset["trials"][0]["htp"]
    assert resumed["best"] == first_preset["best"]
    after = journal.read_text().splitlines()
    assert len(after) == len(lines) and all(json.loads(x) for x in after)  # torn line gone
    with pytest.raises(SystemExit, match="another calibration"):
        main(["calibrate", "--model", tiny_dir, "--data", SCIFACT, "--max-queries", "4",
              "--max-docs", "13", "--output", str(out)])
    assert main([*args, "--budget-minutes", "0", "--fresh"]) == 0
    assert "resuming" not in capsys.readouterr().err
    assert json.loads(out.read_text())["trials"][0]["seconds"] < 1e6


def test_min_block_tokens_caps_placeholder_density(tiny_llama) -> None:  # noqa: ANN001
    """The density cap of adaptive K, from the argument or a preset, in the layouts."""
    from htp_retrieval.encoder import HTPEncoder

    model, tok = tiny_llama
    text = " ".join(["The sky is blue."] * 30)  # many very short sentences
    base = HTPEncoder(model, "htp", tokenizer=tok, max_length=256, min_block_tokens=0,
                      short_budget=0)
    n_text = base.build_layouts([text])[0].n_text_tokens
    dense = len(base.build_layouts([text])[0].pst_positions)
    capped = HTPEncoder(model, "htp", tokenizer=tok, max_length=256, min_block_tokens=32,
                        short_budget=0)
    lay = capped.build_layouts([text])[0]
    assert lay.n_text_tokens == n_text
    assert len(lay.pst_positions) <= max(1, n_text // 32) < dense
    assert capped.record()["min_block_tokens"] == 32
    assert base.record()["min_block_tokens"] is None  # 0: no cap, recorded as None
    via_preset = HTPEncoder(model, "htp", tokenizer=tok, max_length=256,
                            preset={"min_block_tokens": 32, "short_budget": 0})
    assert via_preset.build_layouts([text])[0].pst_positions == lay.pst_positions
    # the shipped default: T = 64 (research/ANALYSIS.md, section 10)
    shipped = HTPEncoder(model, "htp", tokenizer=tok, max_length=256)
    assert shipped.min_block_tokens == 64 and shipped.record()["min_block_tokens"] == 64
    # ... and on a Llama, one block up to 256 text tokens (its short-text budget, section 16)
    assert n_text <= 256 and len(shipped.build_layouts([text])[0].pst_positions) == 1
    no_short = HTPEncoder(model, "htp", tokenizer=tok, max_length=256, short_budget=0)
    assert len(no_short.build_layouts([text])[0].pst_positions) == max(1, n_text // 64)
    assert HTPEncoder(model, "htp-last", tokenizer=tok).min_block_tokens is None  # paper's
    with pytest.raises(ValueError, match="min_block_tokens"):
        HTPEncoder(model, "htp", tokenizer=tok, min_block_tokens=-4)


@pytest.mark.skipif(not os.path.isdir(SCIFACT), reason="shared SciFact data not present")
def test_calibrate_long_budget_axis_on_long_documents(tmp_path, tiny_dir) -> None:  # noqa: ANN001
    """With long validation documents the search ends with the long-budget axis, scored
    there (at their length) against vanilla-mean, and the preset carries its choice.
    (Logic only: a tiny random model with SmolLM2's tokenizer.)"""
    from htp_retrieval.cli import main
    from htp_retrieval.encoder import HTPEncoder
    from htp_retrieval.eval.calibrate import (
        LONG_BUDGETS,
        Calibration,
        LongSet,
        calibrate,
        parse_long_data,
    )
    from htp_retrieval.eval.data import load_beir, subsample
    from htp_retrieval.eval.harness import resolve_data

    data = subsample(load_beir(SCIFACT, split="train"), n_queries=2, n_docs=6, seed=0)
    # documents of 1,100 and 1,150 tokens: past the 1024-token threshold, so budgets bind
    sets = []
    for n in (1100, 1150):
        (item,) = resolve_data("passkey", seed=1, context_lengths=[n], max_docs=2,
                               max_queries=2)
        sets.append(LongSet(f"passkey-{n}-seed1", item.data, n))
    cal = calibrate(tiny_dir, data, split="train", budget_seconds=3600,
                    rounds=0, long_sets=sets)
    assert isinstance(cal, Calibration)
    main_trials = [t for t in cal.trials if not t["long"]]
    long_trials = [t for t in cal.trials if t["long"]]
    assert len(main_trials) == 1  # rounds=0: the starting trial only
    assert [t["settings"]["long_budget"] for t in long_trials] == list(LONG_BUDGETS)
    assert cal.trials.index(main_trials[0]) == len(LONG_BUDGETS)  # the long axis runs first
    assert main_trials[0]["settings"]["long_budget"] == cal.best["long_budget"]
    for t in long_trials:  # means over the two sets; one vanilla-mean per set and exit layer
        assert set(t["parts"]) == {"passkey-1100-seed1", "passkey-1150-seed1"}
        assert abs(t["htp"] - sum(h for h, _ in t["parts"].values()) / 2) < 1e-9
        assert [v for _, v in t["parts"].values()] == \
            [v for _, v in long_trials[0]["parts"].values()]
    best = max(long_trials, key=lambda t: t["gain"])
    assert cal.best["long_budget"] == best["settings"]["long_budget"]
    assert cal.best_long_gain == best["gain"]
    assert cal.long_data == [{"name": f"passkey-{n}-seed1", "max_length": n, "n_queries": 2,
                              "n_docs": 2} for n in (1100, 1150)]
    assert parse_long_data("needle:2048,8192") == [("needle", 2048), ("needle", 8192)]
    assert parse_long_data("needle:2048, passkey:512") == [("needle", 2048), ("passkey", 512)]
    item = sets[0].data
    # block budgets really differ on these documents: 4 blocks vs none (32 under T = 64)
    enc4 = HTPEncoder(tiny_dir, "htp", max_length=1100, long_budget=[1024, 4])
    enc0 = HTPEncoder(tiny_dir, "htp", max_length=1100, long_budget=0)
    doc = next(iter(item.corpus.values()))
    text = doc if isinstance(doc, str) else doc.get("text", "")
    assert len(enc4.build_layouts([text])[0].pst_positions) == 4
    assert len(enc0.build_layouts([text])[0].pst_positions) > 4
    out = tmp_path / "p.json"
    cal.save(out)
    assert HTPEncoder(tiny_dir, "htp", preset=out).long_budget == (
        None if cal.best["long_budget"] == 0 else tuple(cal.best["long_budget"]))
    # the test seed and malformed specs are refused before any model work
    with pytest.raises(SystemExit, match="test data"):
        main(["calibrate", "--data", SCIFACT, "--long-data", "needle:2048", "--long-seed",
              "0", "--output", str(out)])
    for bad in ("qmsum", "needle:0", "2048"):
        with pytest.raises(SystemExit, match="needle:<tokens>"):
            main(["calibrate", "--data", SCIFACT, "--long-data", bad, "--output", str(out)])


def test_objective_prefers_the_better_retriever_once_it_wins() -> None:
    """The search maximises HTP NDCG@10 among candidates at least ``min_gain`` above
    vanilla-mean, and the gain while none is: the first SmolLM2 run's exit layers -2
    (HTP 52.89, vanilla 48.44) and -9 (HTP 29.71, vanilla 25.17) must pick -2, although -9's
    gain is larger."""
    from htp_retrieval.eval.calibrate import Trial

    exit_2 = Trial({"output_layer": -2}, htp=52.89, vanilla=48.44, seconds=1.0)
    exit_9 = Trial({"output_layer": -9}, htp=29.71, vanilla=25.17, seconds=1.0)
    assert exit_9.gain > exit_2.gain
    assert max([exit_9, exit_2], key=lambda t: t.objective(1.0)) is exit_2
    # a candidate under the bar never beats one over it, however good its own score
    level = Trial({"output_layer": -1}, htp=60.0, vanilla=59.5, seconds=1.0)
    assert exit_9.objective(1.0) > level.objective(1.0)
    # while nothing clears the bar, the larger gain wins
    small = Trial({"output_layer": -3}, htp=40.0, vanilla=39.8, seconds=1.0)
    assert level.objective(1.0) > small.objective(1.0)
    assert max([exit_9, exit_2], key=lambda t: t.objective(5.0)) is exit_9
