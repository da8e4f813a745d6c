"""``htp-retrieval report``: tables, ratios, HTP-vs-vanilla lines and plots from real runs.

The results JSONs are made by really running the eval (tiny random decoder) on a handful
of SciFact documents and on a small BEIR folder written here, and one STS run.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from htp_retrieval.encoder import HTPEncoder
from htp_retrieval.eval.data import BeirData, load_beir, subsample
from htp_retrieval.eval.naming import data_settings, run_identity
from htp_retrieval.eval.report import (
    ResultRecord,
    build_report,
    load_results,
    series_colours,
)
from htp_retrieval.eval.retrieval import RetrievalResult, run_retrieval, versions

SHARED = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data"))
SCIFACT = os.path.join(SHARED, "beir", "scifact")
STSB = os.path.join(SHARED, "sts", "stsb", "test.jsonl")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MODEL = "LlamaForCausalLM"  # HTPEncoder.record()["model"] of a model object: its class name

pytestmark = pytest.mark.skipif(not os.path.isdir(SCIFACT), reason="shared SciFact missing")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():  # noqa: ANN202
    """Tiny models run fastest on one thread (and do not fight a busy machine for cores)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _name(method: str, length: int, *, k: int | None = None, n: int | None = None,
          subset: str | None = None) -> str:
    parts = [method, f"len{length}"]
    if k is not None:
        parts.append(f"k{k}")
    if n is not None:
        parts.append(f"n{n}")
    if subset:
        parts.append(subset)
    return "__".join(parts) + ".json"


def _toy_beir(root: Path) -> Path:
    """A small BEIR folder (``toy``): 6 documents, 3 queries, one with two relevant docs."""
    d = root / "toy"
    (d / "qrels").mkdir(parents=True)
    docs = {
        "d1": "Graphene conducts heat well. It is a single layer of carbon atoms.",
        "d2": "Mitochondria produce ATP. They are the powerhouse of the cell.",
        "d3": "The Nile is a long river. It flows north through Egypt.",
        "d4": "Vaccines train the immune system. They reduce severe disease.",
        "d5": "Heat moves through metals by electrons. Copper is a good conductor.",
        "d6": "Rivers carry sediment to the sea. Deltas form at river mouths.",
    }
    (d / "corpus.jsonl").write_text("".join(
        json.dumps({"_id": i, "title": "", "text": t}) + "\n" for i, t in docs.items()))
    queries = {"q1": "which materials conduct heat", "q2": "cell energy", "q3": "rivers"}
    (d / "queries.jsonl").write_text("".join(
        json.dumps({"_id": i, "text": t}) + "\n" for i, t in queries.items()))
    (d / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td5\t1\nq2\td2\t1\nq3\td3\t1\nq3\td6\t1\n")
    return d


def _run(model, tok, data: BeirData, out: Path, method: str, length: int,  # noqa: ANN001
         *, k: int | None = None, n: int | None = None, subset: str | None = None,
         command: str | None = None) -> Path:
    # the report places a model in a family by its packaged name only, so a run of a model
    # object is judged against the method's defaults: no Llama short-text budget here
    enc = HTPEncoder(model, method, tokenizer=tok, dtype="float32", max_length=length, k=k,
                     tokens_per_block=n, short_budget=0 if method == "htp" else None)
    res = run_retrieval(enc, data, show_progress_bar=False)
    sub = re.fullmatch(r"q(\d+)d(\d+)s(\d+)", subset or "")
    res.run = run_identity(  # the report reads the subsample from here, not from file names
        model=MODEL, dtype="float32", padding_side="right", config=enc.config,
        data=data_settings(max_queries=int(sub[1]), max_docs=int(sub[2]), seed=int(sub[3]))
        if sub else None)
    res.config["command"] = command or (f"pytest tests/eval/test_eval_report.py  # run_retrieval "
                                        f"method={method} max_length={length} k={k} n={n}")
    path = out / MODEL / f"{data.name}-test" / _name(method, length, k=k, n=n,
                                                             subset=subset)
    res.save(path)
    return path


@pytest.fixture(scope="module")
def results_dir(tiny_llama, tmp_path_factory) -> Path:  # noqa: ANN001
    model, tok = tiny_llama
    root = tmp_path_factory.mktemp("report")
    out = root / "results"
    sci = subsample(load_beir(SCIFACT), n_queries=5, n_docs=15, seed=0)
    tag = "q5d15s0"
    one_call = "pytest tests/eval/test_eval_report.py  # one eval call, 3 methods x 2 lengths"
    for length in (32, 64):
        for method in ("vanilla-mean", "tp-mean", "htp"):
            _run(model, tok, sci, out, method, length, subset=tag, command=one_call)
    _run(model, tok, sci, out, "htp-fixed-tokens", 64, n=16, subset=tag)
    for k in (2, 4):
        _run(model, tok, sci, out, "htp", 64, k=k, subset=tag)
    toy = load_beir(_toy_beir(root))
    for method in ("vanilla-mean", "htp"):
        _run(model, tok, toy, out, method, 64)
    if os.path.isfile(STSB):
        _sts_run(model, tok, out)
    # things the report must pass over: a checkpoint folder and a foreign JSON
    (out / MODEL / "toy-test" / "htp__len64.partial").mkdir()
    (out / MODEL / "toy-test" / "htp__len64.partial" / "meta.json").write_text("{}")
    (out / "other.json").write_text(json.dumps({"name": "not a result", "scores": {}}))
    (out / "mteb").mkdir()
    (out / "mteb" / "scifact-local.json").write_text(json.dumps(
        {"task_name": "scifact-local", "mteb_version": "2.26.24", "scores": {}}))
    return out


def _sts_run(model, tok, out: Path) -> None:  # noqa: ANN001
    """A real STS run on 30 STS-B pairs: Spearman (x100) of cosine against float gold."""
    from scipy.stats import spearmanr

    rows = [json.loads(line) for line in open(STSB, encoding="utf-8").readlines()[:30]]
    for method in ("vanilla-mean", "htp"):
        enc = HTPEncoder(model, method, tokenizer=tok, dtype="float32", max_length=64)
        t0 = time.perf_counter()
        a = enc.encode([r["sentence1"] for r in rows])
        tokens = enc.last_stats.text_tokens
        b = enc.encode([r["sentence2"] for r in rows])
        tokens += enc.last_stats.text_tokens
        secs = time.perf_counter() - t0
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        rho = spearmanr([float(r["score"]) for r in rows], cos).statistic
        config = dict(enc.record(), command=f"pytest tests/eval/test_eval_report.py  # sts {method}")
        RetrievalResult(
            dataset="stsb", split="test", config=config, scores={"Spearman": 100 * rho},
            cost={"encode_seconds": secs, "tokens_per_second": tokens / secs},
            counts={"n_pairs": len(rows)}, versions=versions(), created=time.time(),
            run=run_identity(model=MODEL, dtype="float32", padding_side="right",
                             config=enc.config, data=data_settings(max_docs=30)),
        ).save(out / MODEL / "stsb-test" / f"{method}__len64__q0d30s0.json")


def _table_rows(md: str, header_start: str) -> list[list[str]]:
    """Rows (cells) of every Markdown table whose header starts with ``header_start``."""
    rows, on = [], False
    for line in md.splitlines():
        if line.startswith(header_start):
            on, head = True, [c.strip() for c in line.strip("|").split("|")]
            continue
        if on and line.startswith("|---"):
            continue
        if on and line.startswith("|"):
            rows.append(dict(zip(head, [c.strip() for c in line.strip("|").split("|")])))
        else:
            on = False
    return rows


def test_report_tables_ratios_and_statement(results_dir: Path, tmp_path: Path) -> None:
    out_md = tmp_path / "docs" / "RESULTS.md"
    rep = build_report([results_dir], output=out_md, plots_dir=tmp_path / "docs" / "plots",
                       title="Tiny results")
    md = rep.markdown
    assert md.startswith("# Tiny results\n")
    records, skipped = load_results([results_dir])
    n_stsb = 2 if os.path.isfile(STSB) else 0
    assert len(records) == 11 + n_stsb
    # every run records the device and CPU it ran on (bf16 scores and speed differ by CPU)
    raw = json.loads(next(results_dir.rglob("htp__len64*.json")).read_text())
    import torch

    from htp_retrieval.dtypes import cpu_has_native_bf16

    got = raw["versions"]
    assert got["device"] == "cpu" and got["cpu"] and got["cpu"] != "unknown"
    assert got["cpu_capability"] == str(torch.backends.cpu.get_cpu_capability())
    assert got["cpu_native_bf16"] == ("yes" if cpu_has_native_bf16() else "no")
    assert [p.name for p, _ in skipped] == ["scifact-local.json", "other.json"]
    assert "other.json`: not a results JSON (no 'dataset' key)" in md
    assert "- 1 mteb output files" in md and "meta.json" not in md

    # full run and subset are separate, labelled tables
    assert "### toy (test), full split (3 queries, 6 documents)" in md
    assert "### scifact (test), subset `q5d15s0` (5 queries, 15 documents, seed 0)" in md
    assert md.index("### scifact") < md.index("### toy")

    # every table row: ratios recomputed from the JSONs of the same set
    by_path = {r.path.name: r for r in records}
    rows = _table_rows(md, "| method |")
    rows = [r for r in rows if "time x vanilla-mean" in r]
    assert rows
    base_rows = [r for r in rows if r["method"] == "vanilla-mean"]
    assert base_rows and all(r["time x vanilla-mean"] == "1.00" for r in base_rows)
    htp64 = by_path["htp__len64__q5d15s0.json"]
    base64 = by_path["vanilla-mean__len64__q5d15s0.json"]
    ratio = htp64.cost["encode_seconds"] / base64.cost["encode_seconds"]
    mem = htp64.cost["peak_memory_bytes"] / base64.cost["peak_memory_bytes"]
    cell = next(r for r in rows if r["method"] == "htp" and r.get("k") == "1"
                and r["NDCG@10"] == f"{htp64.scores['NDCG@10']:.2f}")
    assert cell["time x vanilla-mean"] == f"{ratio:.2f}"
    assert cell["memory x vanilla-mean"] == (f"{mem:.2f}" if base64.cost["peak_memory_bytes"]
                                             > 0 else "n/a")
    assert cell["Recall@100"] == f"{htp64.scores['Recall@100']:.2f}"
    # cost ratios only against the baseline of the same eval call: the K runs came from
    # other calls, so they have no ratio
    k_rows = [r for r in rows if r["method"] == "htp" and r.get("k") in ("2", "4")]
    assert len(k_rows) == 2
    assert all(r["time x vanilla-mean"] == r["memory x vanilla-mean"] == "n/a" for r in k_rows)
    # K varies among HTP rows only: a column, and "–" where K does not apply
    assert any(r["method"] == "tp-mean" and r.get("k") == "–" for r in rows)
    # commands printed with each table
    assert "# run_retrieval method=htp max_length=64 k=4 n=None" in md

    # HTP vs vanilla-mean: one line per set, the difference in points, said plainly
    for length in (32, 64):
        h = by_path[f"htp__len{length}__q5d15s0.json"].scores["NDCG@10"]
        v = by_path[f"vanilla-mean__len{length}__q5d15s0.json"].scores["NDCG@10"]
        d = round(h - v, 2) + 0.0
        verdict = (f"htp beats vanilla-mean by {d:.2f} points" if d > 0 else
                   f"**htp does not beat vanilla-mean** ({d:+.2f} points)")
        # the label names the config keys that set htp apart (k=1 where K varies; summary=...)
        line = re.compile(r"htp( \([^)]*\))? " + re.escape(
            f"{h:.2f} vs vanilla-mean {v:.2f} NDCG@10: {verdict}."))
        found = [m.group(1) or "" for m in line.finditer(md)]
        assert found, line.pattern
        if length == 64:
            assert any("k=1" in q for q in found), found
    assert re.search(r"htp does not beat vanilla-mean in \d+ of \d+ comparisons", md)
    assert len(rep.comparisons) == 2 + 2 + 1 + (1 if n_stsb else 0)  # k=1,2,4 @64; @32; toy
    # the shipped-settings table: K = 1 is htp's default, K = 2 and 4 are not
    shipped = [c for c in rep.comparisons if c.shipped]
    assert shipped
    assert all(c.label.endswith("default)") or "(" not in c.label for c in shipped)
    assert not any("k=2" in c.label or "k=4" in c.label for c in shipped)
    lost = sum(1 for c in shipped if round(c.diff, 2) <= 0)
    assert (f"With its shipped settings, htp does not beat vanilla-mean in {lost} of "
            f"{len(shipped)} tables") in md
    if n_stsb:
        # STS tables: any "| method | ..." table with a Spearman column (other varying config
        # keys, e.g. summary, may come first)
        sts = [r for r in _table_rows(md, "| method |") if "Spearman" in r]
        assert {r["method"] for r in sts} == {"vanilla-mean", "htp"}
        assert "Spearman:" in md

    # the length pivot (NDCG@10 by max length)
    assert "NDCG@10 by max length (tokens):" in md
    assert "| method | 32 | 64 |" in md


def test_report_plots_and_determinism(results_dir: Path, tmp_path: Path) -> None:
    out_md = tmp_path / "RESULTS.md"
    plots = tmp_path / "plots"
    rep = build_report([results_dir], output=out_md, plots_dir=plots)
    names = sorted(p.name for p in rep.plots)
    sub = f"{MODEL}__scifact-test__q5d15s0"
    for expected in (f"{sub}__length.png", f"{sub}__len64__k.png", f"{sub}__len64__blocks.png",
                     f"{sub}__cost.png"):
        assert expected in names, names
    for p in rep.plots:
        data = p.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, p
        import matplotlib.image as mpimg

        img = mpimg.imread(p)
        assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 300
        assert float(img[..., :3].std()) > 0.01  # not a blank canvas
    # the Markdown embeds every PNG by a path relative to itself
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", rep.markdown)
    assert sorted(links) == sorted(f"plots/{n}" for n in names)
    assert all((out_md.parent / link).is_file() for link in links)
    # no K plot where K does not vary; no length plot for a single length
    assert not any(n.startswith(f"{MODEL}__toy-test") and n.endswith(("__k.png", "__length.png"))
                   for n in names)

    again = build_report([results_dir], output=out_md, plots_dir=plots)
    assert again.markdown == rep.markdown
    # a list of files gives the tables of exactly those files
    files = sorted((results_dir / MODEL / "toy-test").glob("*.json"))
    only = build_report(files, output=out_md, plots=False)
    assert "### toy (test)" in only.markdown and "scifact" not in only.markdown


def test_report_cli(results_dir: Path, tmp_path: Path) -> None:
    from htp_retrieval.cli import main

    out_md = tmp_path / "out" / "R.md"
    rc = main(["report", str(results_dir / MODEL / "toy-test"),
               str(results_dir / MODEL / "scifact-test" / "htp__len32__q5d15s0.json"),
               "--output", str(out_md), "--plots-dir", str(tmp_path / "out" / "img"),
               "--title", "CLI report", "--baseline", "vanilla-mean"])
    assert rc == 0
    md = out_md.read_text()
    assert md.startswith("# CLI report\n")
    assert "htp-retrieval report" in md  # the command that made it
    assert "### toy (test), full split" in md and "`q5d15s0`" in md
    with pytest.raises(ValueError, match="not a results JSON"):
        main(["report", str(results_dir / "other.json"), "--output", "-"])
    with pytest.raises(FileNotFoundError):
        main(["report", str(tmp_path / "missing"), "--output", "-"])


def test_subset_from_the_run(results_dir: Path, tmp_path: Path) -> None:
    """The subsample is read from the file's ``run``; names and folders say nothing."""
    src = results_dir / MODEL / "toy-test" / "htp__len64.json"
    raw = json.loads(src.read_text())
    raw["run"]["data"] = data_settings(max_queries=3, max_docs=9, seed=1)
    dst = tmp_path / MODEL / "toy-test-q5d5s5" / "htp__q5d5s5.json"
    dst.parent.mkdir(parents=True)
    dst.write_text(json.dumps(raw))
    (rec,), _ = load_results([tmp_path])
    assert rec.subset is not None and rec.subset.tag == "q3d9s1"
    (full,), _ = load_results([src])
    assert full.subset is None


def test_summary_as_recorded_and_relevance(results_dir: Path, tmp_path: Path) -> None:
    """Results record every setting and the report reads them as they are (no defaults
    filled in); ``summary`` shows only for methods with block placeholders."""
    from htp_retrieval.eval.report import key_is_relevant, read_result

    rec = read_result(results_dir / MODEL / "toy-test" / "htp__len64.json")
    assert rec.config["summary"] == "mean" and rec.config["keep_sink"] is True
    f = tmp_path / "htp-last__len64.json"
    f.write_text(json.dumps({"dataset": "toy", "split": "test", "scores": {"NDCG@10": 1.0},
                             "config": {"model": MODEL, "method": "htp-last"}}))
    assert "summary" not in read_result(f).config
    assert key_is_relevant("htp", "summary") and key_is_relevant("tp-sentence", "summary")
    assert not key_is_relevant("vanilla-mean", "summary")
    assert not key_is_relevant("tp-mean", "summary")


def test_label_marks_the_shipped_default(tmp_path: Path) -> None:
    """Rows whose listed settings are all the method's shipped defaults say ``default``."""
    from htp_retrieval.eval.report import read_result, variant_label

    def rec(name: str, **cfg: object) -> object:
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps({"dataset": "toy", "split": "test", "scores": {"NDCG@10": 1.0},
                                 "config": {"model": MODEL, "k": 1, **cfg}}))
        return read_result(f)

    shipped = rec("a", method="htp", summary="mean", max_blocks=32, min_block_tokens=64)
    uncapped = rec("b", method="htp", summary="mean", max_blocks=32)
    paper = rec("c", method="htp-last", summary="last")
    keys = ["min_block_tokens"]
    assert variant_label(shipped, keys) == "htp (min_block_tokens=64, default)"
    assert variant_label(uncapped, keys) == "htp (min_block_tokens=none)"
    assert variant_label(paper, ["summary"]) == "htp-last (summary=last, default)"
    assert variant_label(shipped, []) == "htp"  # nothing listed, nothing to mark
    assert variant_label(shipped, ["tp_start"]) == "htp (tp_start=none)"  # not a spec setting


def test_rows_of_an_earlier_family_preset_are_marked(tmp_path: Path) -> None:
    """A packaged model's family preset fixes the copy and exit layers: a result that ran
    with other layers (an earlier preset) names them in its table cell, label and legend
    and is not the shipped method, even where no other row varies them."""
    from htp_retrieval.eval.report import (
        ResultRecord,
        ResultSet,
        format_set_table,
        is_shipped,
        plot_label,
        variant_label,
    )

    def rec(model: str, method: str, tp_start: int, tp_exit: int = 7) -> ResultRecord:
        cfg = {"model": model, "method": method, "k": 1, "summary": "mean", "max_blocks": 32,
               "min_block_tokens": 64, "long_budget": [1024, 4], "short_budget": None,
               "segmenter": "sentencizer", "tokens_per_block": 32, "tp_start": tp_start,
               "tp_exit": tp_exit, "output_layer": -2}
        if method != "htp":
            cfg.update(summary="last", max_blocks=None, min_block_tokens=None,
                       long_budget=None)
        return ResultRecord(path=Path(f"{method}{tp_start}.json"), dataset="needle",
                            split="test", config=cfg, scores={"NDCG@10": 1.0})

    qwen = "qwen2.5-coder-0.5b-instruct"
    earlier, today = rec(qwen, "htp", 1), rec(qwen, "htp", 2)
    assert variant_label(earlier, []) == plot_label(earlier, []) == "htp (tp_start=1)"
    assert variant_label(today, []) == "htp" and is_shipped(today, [])
    assert not is_shipped(earlier, [])
    # Token Prepending keeps the family's first copy layer; vanilla has no copies
    assert variant_label(rec(qwen, "tp-mean", 1), []) == "tp-mean"
    assert is_shipped(rec(qwen, "tp-mean", 1), [])
    assert not is_shipped(rec(qwen, "tp-mean", 2), [])
    assert variant_label(rec(qwen, "vanilla-mean", 1), []) == "vanilla-mean"
    # another family's preset is its own (SmolLM2: copies before layers 1-14)
    assert variant_label(rec("smollm2-135m-instruct", "htp", 1, 15), []) == "htp"
    assert variant_label(rec("smollm2-135m-instruct", "htp", 1), []) == "htp (tp_exit=7)"
    # where the table already has the column, the cell does not repeat it
    rs = ResultSet(model=qwen, dataset="needle", split="test", subset=None, length=256,
                   length_key="context_length", records=[earlier, today], keys=[])
    cells = [line.split(" | ")[0].strip("| ") for line in
             format_set_table(rs).splitlines()[2:]]
    assert cells == ["htp (tp_start=1)", "htp"]
    rs.keys = ["tp_start"]
    assert [line.split(" | ")[0].strip("| ") for line in
            format_set_table(rs).splitlines()[2:]] == ["htp", "htp"]
    assert variant_label(earlier, ["tp_start"]) == "htp (tp_start=1)"
    assert variant_label(today, ["tp_start"]) == "htp (tp_start=2, default)"
    # the report leaves the earlier preset out of its shipped table and says so
    for r in (earlier, rec(qwen, "vanilla-mean", 1)):
        (tmp_path / r.path.name).write_text(json.dumps(
            {"dataset": r.dataset, "split": r.split, "scores": r.scores, "config": r.config}))
    md = build_report([tmp_path], plots=False).markdown
    assert "1 tables have htp only with layers other than its model family's preset" in md
    assert "htp (tp_start=1) 1.00 vs vanilla-mean 1.00" in md


def test_dtype_is_a_device_choice_and_the_report_puts_dtypes_side_by_side(
        tmp_path: Path) -> None:
    """``dtype="auto"`` picks float32 or bfloat16 per device, so neither makes a row
    off-default; each htp row meets the vanilla-mean of its own dtype; the shipped table
    gains a dtype column and the report a table with one column per dtype, `not run` where a
    dtype is missing, and a count of losses per dtype."""
    from htp_retrieval.eval.report import comparisons, group_results, is_shipped, variant_label

    smol = "smollm2-135m-instruct"

    def rec(method: str, dtype: str, acc: float, ndcg: float, length: int = 256,
            min_block_tokens: int = 64, repeat: str = "") -> ResultRecord:
        cfg = {"model": smol, "method": method, "dtype": dtype, "context_length": length,
               "max_length": length, "k": 1, "summary": "mean", "max_blocks": 32,
               "min_block_tokens": min_block_tokens, "long_budget": [1024, 8],
               "short_budget": [256, 1], "segmenter": "sentencizer", "tokens_per_block": 32,
               "tp_start": 1, "tp_exit": 15, "output_layer": -2}
        return ResultRecord(path=Path(f"{method}-{dtype}-{length}-{min_block_tokens}{repeat}.json"),
                            dataset="needle", split="test", config=cfg,
                            scores={"Acc@1": acc, "NDCG@10": ndcg})

    recs = [rec("vanilla-mean", "float32", 28.0, 59.7), rec("htp", "float32", 50.0, 72.8),
            rec("vanilla-mean", "bfloat16", 30.0, 58.0), rec("htp", "bfloat16", 26.0, 60.0),
            rec("htp", "bfloat16", 40.0, 65.0, min_block_tokens=0),
            rec("vanilla-mean", "bfloat16", 10.0, 20.0, length=512),
            rec("htp", "bfloat16", 12.0, 21.0, length=512),
            rec("htp", "bfloat16", 14.0, 22.0, length=512, repeat="b")]
    sets = group_results(recs)
    assert sets[0].keys == ["dtype", "min_block_tokens"]
    htp32 = recs[1]
    assert is_shipped(htp32, sets[0].keys)
    assert variant_label(htp32, sets[0].keys) == "htp (dtype=float32, min_block_tokens=64, default)"
    # plot legends name the dtype only where it is not the plot's usual one
    from htp_retrieval.eval.report import plot_label, usual_device_values
    usual = usual_device_values(recs)
    assert usual == {"dtype": "bfloat16"}
    assert plot_label(htp32, sets[0].keys, usual=usual) == "htp (dtype=float32, shipped)"
    assert plot_label(recs[3], sets[0].keys, usual=usual) == "htp (shipped)"
    assert plot_label(recs[0], sets[0].keys, usual=usual) == "vanilla-mean (dtype=float32)"
    assert plot_label(recs[2], sets[0].keys, usual=usual) == "vanilla-mean"
    assert plot_label(recs[2], sets[0].keys) == "vanilla-mean (dtype=bfloat16)"
    comps = comparisons(sets)
    assert {(c.dtype, c.base_value) for c in comps if c.shipped} == {
        ("float32", 28.0), ("bfloat16", 30.0), ("bfloat16", 10.0)}
    # a repeated shipped run of one table and dtype is one row in both tables: the first
    # file in name order ("...-64.json" before "...-64b.json")
    assert sum(c.shipped for c in comps) == 4
    for r in recs:
        (tmp_path / r.path.name).write_text(json.dumps(
            {"dataset": r.dataset, "split": r.split, "scores": r.scores, "config": r.config}))
    md = build_report([tmp_path], plots=False).markdown
    shipped = _table_rows(md, "| model | data | length | subset | dtype |")
    assert [(r["dtype"], r["Δ"]) for r in shipped] == [
        ("bfloat16", "**-4.00**"), ("float32", "+22.00"), ("bfloat16", "+2.00")]
    assert "does not beat vanilla-mean in 1 of 3 rows, one per table and dtype (main" in md
    assert "### htp minus vanilla-mean by dtype" in md
    by_dtype = _table_rows(md, "| model | data | length | subset | score | float32:")
    assert [list(r.values())[5:] for r in by_dtype] == [
        ["50.00 / 28.00", "+22.00 (NDCG@10 +13.10)", "26.00 / 30.00",
         "**-4.00** (NDCG@10 +2.00)"],
        ["not run", "", "12.00 / 10.00", "+2.00 (NDCG@10 +1.00)"]]
    assert ("float32: htp does not beat vanilla-mean in 0 of 1 tables; bfloat16: htp does "
            "not beat vanilla-mean in 1 of 2 tables (main score).") in md



def test_a_centring_sample_never_makes_a_row_off_default() -> None:
    """``--center-queries`` adds centred scores without changing the vectors: a row with a
    query sample is still the shipped htp, is labelled with its sample, and meets the
    vanilla-mean of its own run."""
    from htp_retrieval.eval.report import (
        comparisons,
        group_results,
        is_shipped,
        plot_label,
        variant_label,
    )

    def rec(method: str, centering: str | None, ndcg: float) -> ResultRecord:
        cfg = {"model": "smollm2-135m-instruct", "method": method, "dtype": "float32",
               "max_length": 512, "k": 1, "summary": "mean", "max_blocks": 32,
               "min_block_tokens": 64, "long_budget": [1024, 8], "short_budget": [256, 1],
               "segmenter": "sentencizer", "tokens_per_block": 32, "tp_start": 1,
               "tp_exit": 15, "output_layer": -2}
        if centering:
            cfg["centering"] = centering
        return ResultRecord(path=Path(f"{method}-{centering}.json"), dataset="scifact",
                            split="test", config=cfg, scores={"NDCG@10": ndcg})

    recs = [rec("vanilla-mean", "scifact-train", 18.0), rec("htp", "scifact-train", 22.0),
            rec("vanilla-mean", None, 19.0), rec("htp", None, 21.0)]
    (rs,) = group_results(recs)
    assert rs.keys == ["centering"]
    assert is_shipped(recs[1], rs.keys) and is_shipped(recs[3], rs.keys)
    assert variant_label(recs[1], rs.keys) == "htp (centering=scifact-train)"
    # "shipped" is said where a setting that changes the vectors varies; here none does
    assert plot_label(recs[1], rs.keys) == "htp (centering=scifact-train)"
    assert plot_label(recs[3], rs.keys) == "htp"
    comps = comparisons([rs])
    assert {(c.value, c.base_value) for c in comps if c.shipped} == {
        (22.0, 18.0), (21.0, 19.0)}
    # the by-dtype table takes the plain run's cell although the centred run sorts first,
    # so adding a centred run of the same settings never changes a cell; alone, it fills one
    from htp_retrieval.eval.dtype_report import dtype_table_rows
    assert [c.score_only for c in comps] == [True, False]
    ((_, by),) = dtype_table_rows(comps)
    assert (by["float32"].value, by["float32"].base_value) == (21.0, 19.0)
    ((_, by),) = dtype_table_rows(comps[:1])
    assert (by["float32"].value, by["float32"].base_value) == (22.0, 18.0)


def test_seed_variants_read_as_seeds(tmp_path: Path) -> None:
    """Needle/passkey runs of several ``--seed`` values are labelled by seed, not by the
    whole generator record."""
    from htp_retrieval.eval.report import read_result, variant_label

    recs = []
    for seed in (2, 3):
        f = tmp_path / f"htp__ctx256__seed{seed}.json"
        synthetic = {"generator_version": 1, "seed": seed, "task": "needle",
                     "tokenizer": MODEL}
        f.write_text(json.dumps({"dataset": "needle", "split": "test",
                                 "scores": {"NDCG@10": 1.0},
                                 "config": {"model": MODEL, "method": "htp",
                                            "synthetic": synthetic}}))
        recs.append(read_result(f))
    assert [variant_label(r, ["synthetic"]) for r in recs] == \
        ["htp (synthetic=seed 2)", "htp (synthetic=seed 3)"]


def test_length_plot_marks_shipped_series(tmp_path: Path) -> None:
    """In the length plot, rows with a method's shipped settings are the solid series;
    off-default variants (here a fixed-K htp run) are not."""
    from htp_retrieval.eval.report import _length_series, _shipped_labels, group_results

    recs = []
    for i, (method, ctx, cfg) in enumerate([
        ("vanilla-mean", 256, {}), ("vanilla-mean", 512, {}),
        ("htp", 256, {"summary": "mean", "max_blocks": 32, "min_block_tokens": 64,
                      "long_budget": [1024, 8]}),
        ("htp", 512, {"summary": "mean", "max_blocks": 32, "min_block_tokens": 64,
                      "long_budget": [1024, 8]}),
        ("htp", 512, {"summary": "mean", "max_blocks": None, "min_block_tokens": 64,
                      "long_budget": [1024, 8]}),
    ]):
        f = tmp_path / f"r{i}.json"
        f.write_text(json.dumps({"dataset": "needle", "split": "test",
                                 "scores": {"NDCG@10": float(i)},
                                 "config": {"model": MODEL, "method": method, "k": 1,
                                            "tokens_per_block": 32,
                                            "segmenter": "sentencizer",
                                            "context_length": ctx, **cfg}}))
        recs.append(f)
    from htp_retrieval.eval.report import read_result

    sets = group_results([read_result(f) for f in recs])
    series = _length_series(sets)
    shipped = _shipped_labels(sets)
    assert set(series) == {"vanilla-mean", "htp (max_blocks=32, default)",
                           "htp (max_blocks=none)"}
    assert shipped == {"vanilla-mean", "htp (max_blocks=32, default)"}
    assert [x for x, _ in series["htp (max_blocks=32, default)"]] == [256, 512]
    # the plot names the same three variants with only their off-default settings
    from htp_retrieval.eval.report import plot_label

    short = _length_series(sets, label=plot_label)
    assert set(short) == {"vanilla-mean", "htp (shipped)", "htp (max_blocks=none)"}
    assert _shipped_labels(sets, label=plot_label) == {"vanilla-mean", "htp (shipped)"}
    assert short["htp (shipped)"] == series["htp (max_blocks=32, default)"]


def test_a_centring_sample_does_not_split_a_length_series(tmp_path: Path) -> None:
    """Plain scores do not depend on ``--center-queries``: a float32 run without a query
    sample at 256 tokens and one with a sample at 2048 tokens are one series in the length
    table, and where a plain run and a centring run share a length the plain run gives the
    point (as the by-dtype table picks it), whatever the files' order."""
    from htp_retrieval.eval.report import (
        _length_series,
        _shipped_labels,
        format_length_table,
        group_results,
        read_result,
    )

    recs = []
    for i, (ctx, cen, acc) in enumerate([(256, None, 28.0), (2048, "crossfit", 30.0),
                                         (2048, None, 99.0)]):
        cfg = {"model": MODEL, "method": "vanilla-mean", "dtype": "float32",
               "context_length": ctx}
        if cen:
            cfg["centering"] = cen
        f = tmp_path / f"r{i}.json"
        scores = {"Acc@1": acc, **({"Acc@1 centred": acc + 50} if cen else {})}
        f.write_text(json.dumps({"dataset": "needle", "split": "test", "scores": scores,
                                 "config": cfg}))
        recs.append(read_result(f))
    sets = group_results(recs)
    series = _length_series(sets)
    assert list(series) == ["vanilla-mean"]
    assert sorted(series["vanilla-mean"]) == [(256, 28.0), (2048, 99.0)]
    assert _shipped_labels(sets) == {"vanilla-mean"}
    table = format_length_table(sets)
    assert table is not None and table.count("| vanilla-mean |") == 1
    # a centred score keeps runs with different samples apart
    centred = _length_series(sets, score="Acc@1 centred")
    assert list(centred) == ["vanilla-mean (centering=crossfit)"]


def test_plot_label_lists_only_off_default_settings() -> None:
    """Plot legends list a variant's settings that are off the shipped default only, and
    stay one label per variant that the table's labels tell apart."""
    from htp_retrieval.eval.report import ResultRecord, plot_label, variant_label

    def rec(**cfg: object) -> ResultRecord:
        base = {"model": MODEL, "method": "htp", "k": 1, "summary": "mean", "max_blocks": 32,
                "min_block_tokens": 64, "long_budget": [1024, 8], "segmenter": "sentencizer",
                "tokens_per_block": 32}
        return ResultRecord(path=Path("x.json"), dataset="needle", split="test",
                            config={**base, **cfg}, scores={})

    keys = ["k", "long_budget", "max_blocks", "min_block_tokens"]
    recs = [rec(), rec(k=4), rec(k=4, long_budget=None), rec(max_blocks=None),
            rec(long_budget=None, max_blocks=None, min_block_tokens=None)]
    labels = [plot_label(r, keys) for r in recs]
    assert labels == ["htp (shipped)", "htp (k=4)", "htp (k=4, long_budget=none)",
                      "htp (max_blocks=none)",
                      "htp (long_budget=none, max_blocks=none, min_block_tokens=none)"]
    assert len({variant_label(r, keys) for r in recs}) == len(set(labels))
    assert plot_label(rec(), []) == "htp"  # nothing varies: nothing to mark
    assert plot_label(rec(method="vanilla-mean"), keys) == "vanilla-mean"
    # every listed setting at its default, but one the spec fixes off it: not "shipped"
    assert plot_label(rec(summary="last"), keys) == "htp"


def test_shipped_table_bolds_losses_in_main_score_and_ndcg() -> None:
    """A row that wins on Acc@1 but not on NDCG@10 (Qwen2.5's needle at 2048 tokens) has its
    NDCG@10 difference bold, so the table does not read as a clean win."""
    from htp_retrieval.eval.report import Comparison, ResultSet, format_shipped_table

    def comp(dataset: str, score: str, value: float, base: float,
             ndcg: tuple[float, float] | None) -> Comparison:
        rs = ResultSet(model="m", dataset=dataset, split="test", subset=None, length=2048,
                       length_key="context_length", records=[], keys=[])
        return Comparison(set=rs, label="htp", score=score, value=value, base_value=base,
                          shipped=True, ndcg=ndcg)

    rows = [comp("needle", "Acc@1", 8.0, 2.0, (35.44, 35.72)),    # wins Acc@1, loses NDCG@10
            comp("passkey", "Acc@1", 2.0, 10.0, (27.38, 24.19)),  # loses Acc@1, wins NDCG@10
            comp("scifact", "NDCG@10", 14.04, 9.99, None),
            comp("qmsum", "NDCG@10", 13.80, 13.80, None)]         # a tie is not a win
    table = format_shipped_table(rows, compare="htp", baseline="vanilla-mean")
    assert table is not None
    cells = {line.split(" | ")[1]: [c.strip() for c in line.strip("| ").split(" | ")[-2:]]
             for line in table.splitlines()[2:]}
    assert cells["needle (test)"] == ["+6.00", "**-0.28**"]
    assert cells["passkey (test)"] == ["**-8.00**", "+3.19"]
    assert cells["scifact (test)"] == ["+4.05", "+4.05"]
    assert cells["qmsum (test)"] == ["**+0.00**", "**+0.00**"]


def test_centred_scores_sit_beside_plain_ones(tmp_path: Path) -> None:
    """A centred run's table shows each score with its centred one; the centring record
    reads as its sample's label, so it makes a column only when samples differ."""
    from htp_retrieval.eval.report import format_set_table, group_results, read_result

    def rec(name: str, method: str, sample: str, plain: float, centred: float) -> object:
        f = tmp_path / f"{name}.json"
        cen = {"sentence_sample": sample, "scale": {"plain": {}, "centred": {}}}
        f.write_text(json.dumps({
            "dataset": "stsb", "split": "test",
            "scores": {"Spearman": plain, "Spearman centred": centred},
            "config": {"model": MODEL, "method": method, "max_length": 512,
                       "centering": cen}}))
        return read_result(f)

    same = [rec("a", "vanilla-mean", "stsb-dev", 40.0, 45.0),
            rec("b", "htp", "stsb-dev", 50.0, 51.0)]
    (rs,) = group_results(same)
    assert rs.scores == ["Spearman", "Spearman centred"]
    (row, _) = _table_rows(format_set_table(rs), "| method")
    assert "centering" not in row and row["Spearman centred"] == "45.00"
    (rs2,) = group_results([*same, rec("c", "htp", "stsb-train", 50.0, 52.0)])
    assert [r.config["centering"] for r in rs2.records] == ["stsb-dev", "stsb-dev",
                                                             "stsb-train"]
    assert "centering" in rs2.keys


def test_length_plot_colours_stay_distinct_past_ten_shipped_series() -> None:
    """Two dtypes give up to one shipped series per method and dtype: more than tab10 has."""
    for n in (3, 10, 11, 20):
        solid = [f"method{i}" for i in range(n)]
        colour = series_colours(solid, ["ablation a", "ablation b"])
        assert len({colour[lb] for lb in solid}) == n
        assert colour["ablation a"] not in {colour[lb] for lb in solid}


def test_same_eval_call_needs_one_command_on_one_machine(tmp_path) -> None:
    """Cost ratios pair two results only when one ``eval`` call on one machine timed both:
    the same command rerun elsewhere, or a checkpoint resumed (here or elsewhere), is not
    paired."""
    from htp_retrieval.eval.report import ResultRecord, same_eval_call

    def rec(command: str, cpu: str, machines: list[str] | None) -> ResultRecord:
        cost = {"encode_seconds": 1.0} if machines is None else {"encode_seconds": 1.0,
                                                                 "machines": machines}
        return ResultRecord(path=tmp_path / "x.json", dataset="needle", split="test",
                            config={"command": command}, scores={}, cost=cost,
                            versions={"cpu": cpu, "cpu_count": "2", "device": "cpu"})

    cmd = "htp-retrieval eval --data needle --methods vanilla-mean,htp"
    a = rec(cmd, "AMD EPYC", ["AMD EPYC x2"])
    assert same_eval_call(a, rec(cmd, "AMD EPYC", ["AMD EPYC x2"]))
    assert same_eval_call(a, rec(cmd, "AMD EPYC", None))  # a result from before the field
    assert not same_eval_call(a, rec(cmd + " --quiet", "AMD EPYC", ["AMD EPYC x2"]))
    assert not same_eval_call(a, rec(cmd, "Intel Xeon", ["Intel Xeon x2"]))
    assert not same_eval_call(a, rec(cmd, "AMD EPYC", ["AMD EPYC x2", "Intel Xeon x2"]))
    assert not same_eval_call(rec("", "AMD EPYC", None), rec("", "AMD EPYC", None))
    resumed = rec(cmd, "AMD EPYC", ["AMD EPYC x2"])
    resumed.cost["resumed_chunks"] = 3  # chunks timed by an earlier call of the command
    assert not same_eval_call(a, resumed) and not same_eval_call(resumed, a)
