"""Diagnosis helpers (``python -m research``): variant parsing, norm and drift profiles, sink ablation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from htp_retrieval.encoder import HTPEncoder
from research.analysis import drift_profile, norm_profile, parse_variant

TEXT = "The cell divides. Proteins fold quickly. Results were significant in mice."


def test_parse_variant_types_and_errors() -> None:
    name, enc, run = parse_variant(
        "v:method=htp,tp_start=2,keep_sink=false,output_layer=none,"
        "document_instruction=Represent this, please")
    assert name == "v"
    assert enc == {"method": "htp", "tp_start": 2, "keep_sink": False, "output_layer": None}
    assert run == {"document_instruction": "Represent this, please"}
    with pytest.raises(ValueError, match="unknown key 'bogus'"):
        parse_variant("v:bogus=1")
    with pytest.raises(ValueError, match="no name"):
        parse_variant(":method=htp")
    assert parse_variant("v:long_budget=1024:8")[1] == {"long_budget": (1024, 8)}
    assert parse_variant("v:long_budget=0")[1] == {"long_budget": 0}
    with pytest.raises(ValueError, match="'1024'"):
        parse_variant("v:long_budget=1024")
    # query-only settings: the documents keep the variant's encoder settings
    _, enc, run = parse_variant("v:method=htp,tp_start=2,query_tp_start=1,query_short_budget=256:1")
    assert enc == {"method": "htp", "tp_start": 2}
    assert run == {"query_settings": {"tp_start": 1, "short_budget": (256, 1)}}
    with pytest.raises(ValueError, match="unknown key 'query_bogus'.*query_<setting>"):
        parse_variant("v:query_bogus=1")


def test_norm_profile_groups(tiny_llama) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    enc = HTPEncoder(model, "htp", tokenizer=tok, dtype="float32", output_layer=-1)
    prof = norm_profile(enc, [TEXT])
    assert set(prof) == {"sink", "bpst", "pst", "copy_source", "text_max"}
    assert all(len(v) == 6 for v in prof.values())
    # copies make each <PST> equal its source before every layer in [tp_start, tp_exit),
    # so after the first copy layer their norms track each other
    assert prof["pst"][enc.tp_start] > 0


def test_drift_is_one_for_identical_method(tiny_llama) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    a = HTPEncoder(model, "vanilla-mean", tokenizer=tok, dtype="float32", output_layer=-1)
    b = HTPEncoder(model, "htp", tokenizer=tok, dtype="float32", output_layer=-1)
    same = drift_profile(a, a, [TEXT])
    assert min(same) > 0.9999
    moved = drift_profile(b, a, [TEXT])
    assert len(moved) == 6 and min(moved) < 0.9999


def test_sink_ablation_puts_bpst_at_zero(tiny_llama) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    safe = HTPEncoder(model, "htp", tokenizer=tok, dtype="float32")
    unsafe = HTPEncoder(model, "htp", tokenizer=tok, dtype="float32", keep_sink=False)
    assert safe.build_layouts([TEXT])[0].bpst_positions[0] == 1
    assert unsafe.build_layouts([TEXT])[0].bpst_positions[0] == 0
    assert unsafe.record()["keep_sink"] is False and safe.record()["keep_sink"] is True
    assert unsafe.encode([TEXT]).shape == (1, model.config.hidden_size)


def test_mean_summary_copies_block_mean(tiny_llama) -> None:  # noqa: ANN001
    import torch

    from htp_retrieval.rewiring import CopyPlan, apply_copies

    model, tok = tiny_llama
    enc = HTPEncoder(model, "htp", tokenizer=tok, dtype="float32", summary="mean")
    lays = enc.build_layouts([TEXT, "One short sentence. And two."])
    width = max(len(lay) for lay in lays)
    hidden = torch.randn(2, width, 8)
    for side_offsets in ([0, 0], [width - len(lays[0]), width - len(lays[1])]):
        plan = CopyPlan.from_layouts(lays, side_offsets, "cpu", summary="mean")
        out = apply_copies(hidden, plan)
        for r, (lay, off) in enumerate(zip(lays, side_offsets)):
            for (dst, _), size, b in zip(lay.local_copies, lay.block_sizes, lay.bpst_positions):
                want = hidden[r, dst + 1 + off : dst + 1 + size + off].mean(0)
                torch.testing.assert_close(out[r, dst + off], want)
                torch.testing.assert_close(out[r, b + off], want)  # <B-PST> <- <PST>
    assert enc.record()["summary"] == "mean"
    with pytest.raises(ValueError, match="summary"):
        HTPEncoder(model, "htp", tokenizer=tok, summary="max")


def test_ablate_pairing_shares_one_corpus_encode(tiny_llama, tmp_path, capsys) -> None:  # noqa: ANN001
    """``ablate``: variants that differ only in the query method reuse the corpus."""
    import json
    import os

    from research.__main__ import main

    scifact = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "beir",
                           "scifact")
    if not os.path.isdir(scifact):
        pytest.skip("../shared/data missing")
    model, tok = tiny_llama
    mdir = tmp_path / "tiny"
    model.save_pretrained(mdir)
    tok.save_pretrained(mdir)
    out = tmp_path / "analysis"
    rc = main(["ablate", "--model", str(mdir), "--data", scifact, "--split", "train",
               "--max-queries", "4", "--max-docs", "12", "--max-length", "48", "--quiet",
               "--output", str(out),
               "--variant", "htp:method=htp",
               "--variant", "htp-tp-queries:method=htp,query_method=tp-mean",
               "--variant", "htp-start3-queries:method=htp,query_tp_start=3"])
    assert rc == 0
    folder = next(out.glob("*/scifact-train-q4d12s0"))
    first = json.loads((folder / "htp.json").read_text())
    paired = json.loads((folder / "htp-tp-queries.json").read_text())
    assert first["cost"]["resumed_chunks"] == 0
    assert paired["cost"]["resumed_chunks"] >= 1  # the corpus came from the first variant
    assert paired["config"]["query_config"]["method"] == "tp-mean"
    # each variant records its run as eval does (the committed-results check reads it)
    assert first["label"] == "htp" and paired["label"] == "htp-tp-queries"
    assert first["run"]["htp_config"] == first["htp_config"]
    assert first["run"]["data"] == {"subset": {"max_queries": 4, "max_docs": 12}, "seed": 0}
    assert paired["run"]["query_htp_config"]["method"] == "tp-mean"
    start3 = json.loads((folder / "htp-start3-queries.json").read_text())
    assert start3["cost"]["resumed_chunks"] >= 1  # same documents, queries only differ
    assert start3["run"]["query_htp_config"]["method"] == "htp"
    assert start3["run"]["query_htp_config"]["layers"]["tp_start"] == 3
    assert start3["htp_config"] == first["htp_config"]
    assert start3["scores"] != first["scores"]
    assert "htp-tp-queries" in capsys.readouterr().out


def test_parse_synthetic_spec() -> None:
    from research.analysis import parse_synthetic_spec

    assert parse_synthetic_spec("passkey:256") == ("passkey", 256)
    assert parse_synthetic_spec("Needle:1024") == ("needle", 1024)
    assert parse_synthetic_spec("../shared/data/beir/scifact") is None
    assert parse_synthetic_spec("C:/data/scifact") is None  # a path with a colon
    with pytest.raises(ValueError, match="passkey:<context length"):
        parse_synthetic_spec("passkey:long")
    with pytest.raises(ValueError, match="needle:<context length"):
        parse_synthetic_spec("needle:0")


def test_ablate_on_generated_passkey(tiny_llama, tmp_path) -> None:  # noqa: ANN001
    """``ablate --data passkey:<n>`` generates the task and scores each variant."""
    import json

    from research.__main__ import main

    model, tok = tiny_llama
    mdir = tmp_path / "tiny"
    model.save_pretrained(mdir)
    tok.save_pretrained(mdir)
    out = tmp_path / "analysis"
    rc = main(["ablate", "--model", str(mdir), "--data", "passkey:64", "--seed", "3",
               "--max-docs", "6", "--max-queries", "3", "--quiet", "--output", str(out),
               "--variant", "vanilla:method=vanilla-mean",
               "--variant", "htp:method=htp", "--variant", "htp-k1:method=htp,max_blocks=0"])
    assert rc == 0
    folder = next(out.glob("*/passkey-64-seed3-q3d6"))
    for name in ("vanilla", "htp", "htp-k1"):
        res = json.loads((folder / f"{name}.json").read_text())
        counts = res["counts"]
        assert {k: counts[k] for k in ("n_docs", "n_queries", "n_qrels")} == \
            {"n_docs": 6, "n_queries": 3, "n_qrels": 3}
        assert 1 <= counts["rank1_docs"] <= 3 and 1 <= counts["rank1_top_queries"] <= 3
        assert res["config"]["max_length"] == 64  # the context length, not --max-length
        assert res["run"]["data"]["context_length"] == 64 and res["label"] == name
        assert 0.0 <= res["scores"]["NDCG@10"] <= 100.0
    assert json.loads((folder / "htp.json").read_text())["config"]["max_blocks"] == 32
    assert json.loads((folder / "htp-k1.json").read_text())["config"]["max_blocks"] is None  # fixed K
    # a stored variant is reused only if made with the same encoder settings: a name whose
    # meaning changed (here: "htp" without the density cap) is refused, and nothing is lost
    before = (folder / "htp.json").read_bytes()
    base = ["ablate", "--model", str(mdir), "--data", "passkey:64", "--seed", "3",
            "--max-docs", "6", "--max-queries", "3", "--quiet", "--output", str(out)]
    assert main([*base, "--variant", "htp:method=htp"]) == 0  # same settings: reused
    with pytest.raises(SystemExit, match=r"htp\.json holds variant 'htp'.*min_block_tokens: "
                       r"64 -> None.*--overwrite"):
        main([*base, "--variant", "htp:method=htp,min_block_tokens=0"])
    assert (folder / "htp.json").read_bytes() == before
    # ablate records per-query rows and needle positions, so `paired` can split them
    saved = json.loads((folder / "vanilla.json").read_text())
    assert "Acc@1" in saved["scores"] and len(saved["per_query"]) == 3
    assert all(0.0 <= m["position"] <= 1.0 for m in saved["query_meta"].values())
    plot = tmp_path / "split.png"
    assert main(["paired", str(folder / "vanilla.json"), str(folder / "htp.json"),
                 "--split-by", "position", "--bins", "2", "--plot", str(plot)]) == 0
    assert plot.stat().st_size > 0


def test_seed_table_means_and_wins() -> None:
    from types import SimpleNamespace

    from research.analysis import seed_table

    def r(v: float) -> SimpleNamespace:
        return SimpleNamespace(scores={"NDCG@10": v})

    table = seed_table([("s0", [("vanilla-mean", r(20.0)), ("htp", r(30.0))]),
                        ("s1", [("htp", r(10.0)), ("vanilla-mean", r(20.0))]),
                        ("s2", [("vanilla-mean", r(40.0))])])
    rows = table.splitlines()
    assert rows[0].startswith("| variant | s0 | s1 | s2 | mean |")
    assert rows[2] == "| vanilla-mean | 20.00 | 20.00 | 40.00 | 26.67 | +0.00 | – | 3 of 3 |"
    # no per-query rows: no interval
    assert rows[3] == "| htp | 30.00 | 10.00 | – | 20.00 | +0.00 | – | 1 of 2 |"
    with pytest.raises(ValueError, match="baseline variant 'bm25'"):
        seed_table([("s0", [("htp", r(1.0))])], baseline="bm25")


def test_seed_groups_name_the_shipped_run_and_plot_its_deltas(tmp_path: Path) -> None:
    """A shipped htp result is ``htp (shipped)`` whatever its label records (here Qwen2.5's
    family long-text budget, ``lb1024-4``); the plot draws variants run at two or more
    lengths and refuses when there is none."""
    import json
    import shutil

    from research.analysis import plot_seed_deltas, seed_groups

    src = Path(__file__).resolve().parents[2] / "results" / "h100" / \
        "qwen2.5-coder-0.5b-instruct" / "needle-test"

    def committed(label: str, ctx: int) -> Path:
        (path,) = [p for p in sorted(src.glob("*.json"))
                   if (raw := json.loads(p.read_text()))["label"] == label
                   and raw["config"]["context_length"] == ctx]
        return path

    files = [committed("htp__lb1024-4__mbt64", 2048), committed("htp__mbt64", 1024),
             committed("vanilla-mean", 2048), committed("vanilla-mean", 1024)]
    for f in files:
        shutil.copy(f, tmp_path / f.name)
    # these runs predate the Qwen2 preset's later first copy layer for htp: not shipped
    # as they are, shipped once their layers are today's
    names = {name for folders in seed_groups([tmp_path]).values() for _, rows in folders
             for name, _ in rows}
    assert "htp (shipped)" not in names and "htp__mbt64" in names
    from htp_retrieval.methods import METHODS
    from htp_retrieval.models import layer_preset

    for f in files[:2]:
        rec = json.loads(f.read_text())
        rec["config"]["tp_start"] = layer_preset("qwen2").tp_start_for(METHODS["htp"])
        (tmp_path / f.name).write_text(json.dumps(rec))
    files[:2] = [tmp_path / f.name for f in files[:2]]
    groups = seed_groups([tmp_path])
    names = {name for folders in groups.values() for _, rows in folders for name, _ in rows}
    assert names == {"htp (shipped)", "vanilla-mean"}
    png = plot_seed_deltas([tmp_path], tmp_path / "plots" / "seeds.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a run off the shipped settings keeps its label
    rec = json.loads(files[1].read_text())
    rec["config"]["max_blocks"] = 8
    rec["label"] = "htp__mb8__mbt64"
    (tmp_path / "htp__mb8.json").write_text(json.dumps(rec))
    names = {name for _, rows in seed_groups([tmp_path])[
        ("qwen2.5-coder-0.5b-instruct", "needle", 1024)] for name, _ in rows}
    assert "htp__mb8__mbt64" in names
    one = tmp_path / "one"
    one.mkdir()
    for f in files[2:] + files[1:2]:
        shutil.copy(f, one / f.name)
    with pytest.raises(ValueError, match="two or more context lengths"):
        plot_seed_deltas([one], tmp_path / "none.png")
    from research.__main__ import main

    with pytest.raises(SystemExit, match="research seeds --plot: nothing to plot"):
        main(["seeds", str(one), "--plot", str(tmp_path / "none.png")])


def test_seed_table_interval_resamples_queries_within_seeds() -> None:
    """The ``95% CI`` column is :func:`seeds_ci` of the per-query differences; with one seed
    it is ``paired``'s bootstrap interval, and it needs the same queries."""
    from types import SimpleNamespace

    from htp_retrieval.eval.retrieval import RetrievalResult
    from research.analysis import seed_table
    from research.paired import compare, seeds_ci

    rng = np.random.default_rng(0)
    base = [rng.uniform(0, 100, 40), rng.uniform(0, 100, 60)]
    var = [base[0] + rng.normal(5, 10, 40), base[1] + rng.normal(-1, 10, 60)]

    def r(v: np.ndarray, prefix: str) -> SimpleNamespace:
        pq = {f"{prefix}{i:03d}": {"NDCG@10": float(x)} for i, x in enumerate(v)}
        return SimpleNamespace(scores={"NDCG@10": float(v.mean())}, per_query=pq)

    diffs = [var[0] - base[0], var[1] - base[1]]
    mean, lo, hi = seeds_ci(diffs)
    # the statistic is the Δ mean column: the mean over seeds of each seed's mean difference
    assert mean == pytest.approx(np.mean([d.mean() for d in diffs]))
    assert lo < mean < hi
    table = seed_table([("s0", [("vanilla-mean", r(base[0], "a")), ("htp", r(var[0], "a"))]),
                        ("s1", [("vanilla-mean", r(base[1], "b")), ("htp", r(var[1], "b"))])])
    assert f"| {mean:+.2f} | [{lo:+.2f}, {hi:+.2f}] | " in table.splitlines()[3]
    # one seed: the same interval as paired
    one = compare(RetrievalResult(dataset="d", split="test", config={}, scores={}, cost={}, counts={},
                                  per_query=r(base[0], "a").per_query),
                  RetrievalResult(dataset="d", split="test", config={}, scores={}, cost={}, counts={},
                                  per_query=r(var[0], "a").per_query))
    assert seeds_ci([diffs[0]])[1:] == pytest.approx((one.ci_low, one.ci_high))
    # queries differ in a seed: no interval rather than a wrong one
    table = seed_table([("s0", [("vanilla-mean", r(base[0], "a")), ("htp", r(var[0], "x"))])])
    assert table.splitlines()[3].endswith("| – | 1 of 1 |")
    # every difference equal: a point interval
    assert seeds_ci([np.full(5, 2.0), np.full(3, 4.0)]) == (3.0, 3.0, 3.0)
    with pytest.raises(ValueError, match="no seeds"):
        seeds_ci([])
    with pytest.raises(ValueError, match="seed 1: needs a 1-D array"):
        seeds_ci([np.ones(3), np.ones((2, 2))])



def test_seed_tables_group_by_length_and_name_seeds(tmp_path: Path) -> None:
    """``seeds``: one table per context length, a column per generator seed, the
    variant named by the file stem without ``__ctxN``/``__seedN``; bad input is named."""
    import json

    from research.analysis import seed_tables

    def write(folder: Path, stem: str, method: str, seed: int, ctx: int, v: float) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        f = folder / f"{stem}.json"
        f.write_text(json.dumps({
            "dataset": "needle", "split": "test", "scores": {"NDCG@10": v},
            "config": {"model": "m", "method": method, "max_length": ctx,
                       "context_length": ctx,
                       "synthetic": {"generator_version": 1, "seed": seed, "task": "needle"}}}))
        return f

    a, b = tmp_path / "a", tmp_path / "b"
    write(a, "vanilla-mean__ctx256", "vanilla-mean", 0, 256, 10.0)
    write(a, "htp__ctx256__mbt64", "htp", 0, 256, 20.0)
    write(b, "vanilla-mean__ctx256__seed2", "vanilla-mean", 2, 256, 30.0)
    write(b, "htp__ctx256__mbt64__seed2", "htp", 2, 256, 20.0)
    write(b, "vanilla-mean__ctx512__seed2", "vanilla-mean", 2, 512, 5.0)
    out = seed_tables([a, b])
    assert "### m / needle, context length 256 tokens (NDCG@10)" in out
    assert "| variant | seed 0 | seed 2 | mean |" in out
    assert "| htp__mbt64 | 20.00 | 20.00 | 20.00 | +0.00 | – | 1 of 2 |" in out
    assert "### m / needle, context length 512 tokens (NDCG@10)" in out
    dup = write(tmp_path / "c", "vanilla-mean__ctx256", "vanilla-mean", 0, 256, 1.0)
    with pytest.raises(ValueError, match="both vanilla-mean at seed 0"):
        seed_tables([a, dup])
    beir = tmp_path / "d" / "htp__len512.json"
    beir.parent.mkdir()
    beir.write_text(json.dumps({"dataset": "scifact", "split": "test",
                                "scores": {"NDCG@10": 1.0}, "config": {"method": "htp"}}))
    with pytest.raises(ValueError, match="htp__len512.json: no generator seed"):
        seed_tables([beir])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no results JSON"):
        seed_tables([tmp_path / "empty"])
    with pytest.raises(ValueError, match="no such results file or folder"):
        seed_tables([tmp_path / "missing"])



def test_compare_roots_pairs_the_same_relative_paths(tmp_path: Path) -> None:
    import json

    from research.analysis import compare_roots

    def write(root: Path, rel: str, v: float, method: str) -> None:
        f = root / rel  # a file is one run on both roots: the same name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps({"dataset": "needle", "split": "test", "label": method,
                                 "scores": {"NDCG@10": v},
                                 "config": {"method": method, "context_length": 256}}))

    a, b = tmp_path / "cpu", tmp_path / "gpu"
    write(a, "m/needle-test/htp__0a1b2c3d.json", 40.0, "htp")
    write(b, "m/needle-test/htp__0a1b2c3d.json", 43.0, "htp")
    write(a, "m/needle-test/vanilla-mean__4e5f6a7b.json", 30.0, "vanilla-mean")
    write(b, "m/needle-test/vanilla-mean__4e5f6a7b.json", 29.0, "vanilla-mean")
    write(b, "m/needle-test/tp-mean__8c9d0e1f.json", 1.0, "tp-mean")  # only in b: not a row
    out = compare_roots(a, b)
    assert "| m/needle-test/htp ctx256 | 40.00 | 43.00 | +3.00 |" in out
    assert "| m/needle-test/vanilla-mean ctx256 | 30.00 | 29.00 | -1.00 |" in out
    assert "tp-mean" not in out
    assert "2 runs in both: mean absolute difference 2.00, largest 3.00 (NDCG@10)." in out
    with pytest.raises(ValueError, match="no results JSON under"):
        compare_roots(a, tmp_path / "empty")


def _result(scores: dict[str, float], positions: dict[str, float] | None = None):  # noqa: ANN202
    from htp_retrieval.eval.retrieval import RetrievalResult

    return RetrievalResult(
        dataset="needle", split="test", config={}, counts={},
        scores={"NDCG@10": sum(scores.values()) / len(scores)}, cost={},
        per_query={q: {"NDCG@10": v} for q, v in scores.items()},
        query_meta={q: {"position": x} for q, x in (positions or {}).items()})


def test_paired_comparison_counts_and_interval() -> None:
    from research.paired import compare

    base = _result({"q1": 50.0, "q2": 50.0, "q3": 0.0, "q4": 100.0})
    other = _result({"q1": 60.0, "q2": 45.0, "q3": 20.0, "q4": 100.0})
    r = compare(base, other, label="htp")
    assert (r.n, r.wins, r.losses, r.ties) == (4, 2, 1, 1)
    assert r.mean_diff == pytest.approx(6.25) and r.variant_mean - r.baseline_mean == r.mean_diff
    assert r.ci_low <= r.mean_diff <= r.ci_high and r.ci_low >= -5.0 and r.ci_high <= 20.0
    assert 0.0 < r.p_value <= 1.0
    same = compare(base, base)
    assert same.p_value is None and same.ci_low == same.ci_high == 0.0
    # rank = 100 / MRR, and a lower rank is a win
    ranked = _result({"q1": 1.0, "q2": 1.0})
    ranked.per_query = {"q1": {"MRR": 50.0}, "q2": {"MRR": 25.0}}
    better = _result({"q1": 1.0, "q2": 1.0})
    better.per_query = {"q1": {"MRR": 100.0}, "q2": {"MRR": 25.0}}
    r = compare(ranked, better, metric="rank")
    assert (r.baseline_mean, r.variant_mean, r.wins, r.losses, r.ties) == (3.0, 2.5, 1, 0, 1)
    better.per_query["q2"]["MRR"] = 0.0
    with pytest.raises(ValueError, match="variant: query 'q2' has no relevant document"):
        compare(ranked, better, metric="rank")
    with pytest.raises(ValueError, match="htp: scored on other queries.*1 baseline "
                       "queries missing \\(e.g. 'q4'\\), 1 extra \\(e.g. 'q5'\\)"):
        compare(base, _result({"q1": 1.0, "q2": 1.0, "q3": 1.0, "q5": 1.0}), label="htp")


def test_split_by_position_bins() -> None:
    from research.paired import split_by, split_table

    pos = {"q1": 0.1, "q2": 0.2, "q3": 0.6, "q4": 1.0}
    base = _result({"q1": 10.0, "q2": 30.0, "q3": 50.0, "q4": 70.0}, pos)
    other = _result({"q1": 0.0, "q2": 0.0, "q3": 100.0, "q4": 100.0})
    names, counts, means = split_by({"vanilla": base, "htp": other}, key="position", bins=2)
    assert names == ["0.00-0.50", "0.50-1.00"] and counts == [2, 2]  # 1.0 falls in the last
    assert means == {"vanilla": [20.0, 60.0], "htp": [0.0, 100.0]}
    assert "| 0.50-1.00 | 2 | 60.00 | 100.00 |" in split_table(names, counts, means,
                                                              key="position", metric="NDCG@10")
    with pytest.raises(ValueError, match="htp: query 'q1' has no 'position'"):
        split_by({"htp": other, "vanilla": base}, key="position")


def test_paired_refuses_results_without_rows(tmp_path) -> None:  # noqa: ANN001
    from research.__main__ import main

    old = _result({"q1": 1.0})
    old.per_query = {}
    old.save(tmp_path / "old.json")
    with pytest.raises(SystemExit, match=r"old\.json: no per-query scores.*--overwrite"):
        main(["paired", str(tmp_path / "old.json"), str(tmp_path / "old.json")])


def test_research_cli_registers_dtype_seeds_and_compare() -> None:
    import argparse

    from research.analysis import add_subcommands

    parser = argparse.ArgumentParser()
    add_subcommands(parser.add_subparsers())
    args = parser.parse_args(["norms", "--dtype", "float32"])
    assert args.dtype == "float32" and args.func.__name__ == "cmd_norms"
    assert parser.parse_args(["norms"]).dtype == "bfloat16"
    assert parser.parse_args(["seeds", "r"]).func.__name__ == "cmd_seeds"
    args = parser.parse_args(["compare", "a", "b", "--metric", "Acc@1"])
    assert (args.root_a, args.root_b, args.metric) == ("a", "b", "Acc@1")


def test_rank1_counts_measure_hub_documents() -> None:
    from htp_retrieval.eval.retrieval import rank1_counts

    run = {"q1": {"d1": 0.9, "d2": 0.1}, "q2": {"d1": 0.8, "d3": 0.7},
           "q3": {"d2": 0.5, "d1": 0.4}}
    assert rank1_counts(run) == {"rank1_docs": 2, "rank1_top_queries": 2}
    assert rank1_counts({}) == {"rank1_docs": 0, "rank1_top_queries": 0}


def test_variant_spec_reads_short_budget() -> None:
    from research.analysis import parse_variant

    assert parse_variant("v:method=htp,short_budget=256:1")[1] == {
        "method": "htp", "short_budget": (256, 1)}
    assert parse_variant("v:short_budget=0")[1] == {"short_budget": 0}
    with pytest.raises(ValueError, match="short budget '256'"):
        parse_variant("v:short_budget=256")
