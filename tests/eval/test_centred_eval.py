"""Centred scores beside plain ones in the harness (tiny random Llama, toy BEIR folders)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from htp_retrieval import Centering, HTPEncoder
from htp_retrieval.eval.centred import (
    CENTRED,
    centred_vectors,
    cosine_scale,
    read_query_sample,
)
from htp_retrieval.eval.data import load_beir
from htp_retrieval.eval.metrics import evaluate_per_query, mean_scores
from htp_retrieval.eval.retrieval import RetrievalResult, run_retrieval, top_k_run

TOPICS = ["apples", "boats", "clouds", "drums", "eagles", "ferns"]


def _beir(root: Path) -> Path:
    """Six documents; test queries name a document's topic, train queries other words."""
    (root / "qrels").mkdir(parents=True)
    with open(root / "corpus.jsonl", "w") as f:
        for i, t in enumerate(TOPICS):
            text = " ".join(f"The {t} of line {j} are many." for j in range(6))
            f.write(json.dumps({"_id": f"d{i}", "title": "", "text": text}) + "\n")
    queries, test, train = [], ["query-id\tcorpus-id\tscore"], ["query-id\tcorpus-id\tscore"]
    for i, t in enumerate(TOPICS):
        queries.append({"_id": f"t{i}", "text": f"Where are the {t}?"})
        test.append(f"t{i}\td{i}\t1")
        queries.append({"_id": f"r{i}", "text": f"Tell me about {t} please."})
        train.append(f"r{i}\td{i}\t1")
    (root / "queries.jsonl").write_text("\n".join(json.dumps(q) for q in queries) + "\n")
    (root / "qrels" / "test.tsv").write_text("\n".join(test) + "\n")
    (root / "qrels" / "train.tsv").write_text("\n".join(train) + "\n")
    return root


def test_centred_scores_equal_the_centring_applied_by_hand(tiny_llama, tmp_path: Path) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    root = _beir(tmp_path / "toy")
    data = load_beir(root, "test")
    sample, label = read_query_sample(f"{root}:train")
    assert label == "toy-train" and len(sample) == 6 and not set(sample) & set(
        data.queries.values())
    enc = HTPEncoder(model, "htp", tokenizer=tok, dtype="float32", max_length=256)
    res = run_retrieval(enc, data, query_instruction="Find it.", show_progress_bar=False,
                        center_queries=sample, center_label=label)
    record = dict(res.config["centering"])
    scale = record.pop("scale")
    assert record == {"query_sample": "toy-train", "n_sample_queries": 6,
                      "n_sample_overlap_dropped": 0, "n_documents": 6}
    dids, qids = list(data.corpus), list(data.queries)
    d = enc.encode([data.doc_text(i) for i in dids])
    q = enc.encode([data.queries[i] for i in qids], instruction="Find it.")
    cen = Centering.fit(d, enc.encode(sample, instruction="Find it."))
    per_query = evaluate_per_query(
        data.qrels, top_k_run(cen.apply(q, "query"), cen.apply(d, "document"), qids, dids))
    want = mean_scores(per_query)
    assert scale["plain"] == pytest.approx(cosine_scale(q, d, qids, dids, data.qrels))
    assert scale["centred"] == pytest.approx(cosine_scale(
        cen.apply(q, "query"), cen.apply(d, "document"), qids, dids, data.qrels), abs=1e-6)
    for metric, value in want.items():
        assert res.scores[metric + CENTRED] == pytest.approx(value, abs=1e-6)
        for qid in qids:
            assert res.per_query[qid][metric + CENTRED] == pytest.approx(
                per_query[qid][metric], abs=1e-6)
    plain = run_retrieval(enc, data, query_instruction="Find it.", show_progress_bar=False)
    assert {k: v for k, v in res.scores.items() if not k.endswith(CENTRED)} == plain.scores
    with pytest.raises(ValueError, match="holds only evaluated queries"):
        run_retrieval(enc, data, show_progress_bar=False,
                      center_queries=list(data.queries.values()))
    # a sample repeating some evaluated queries (SciFact train repeats two test claims):
    # those are left out, with a warning, and the rest centre exactly as alone
    first = data.queries[qids[0]]
    with pytest.warns(UserWarning, match=r"holds 1 of the evaluated queries.*6 of 7"):
        mixed = run_retrieval(enc, data, query_instruction="Find it.", show_progress_bar=False,
                              center_queries=[first, *sample], center_label=label)
    assert mixed.config["centering"]["n_sample_overlap_dropped"] == 1
    assert mixed.config["centering"]["n_sample_queries"] == 6
    for metric in want:
        assert mixed.scores[metric + CENTRED] == pytest.approx(res.scores[metric + CENTRED])


def test_crossfit_centres_each_half_on_the_other() -> None:
    rng = np.random.default_rng(1)
    q, d = rng.normal(size=(9, 5)) + 2, rng.normal(size=(20, 5)) + 3
    qc, dc = centred_vectors(q, d, "crossfit", seed=3)
    fold = np.random.default_rng(3).permutation(9) % 2
    for f in (0, 1):
        cen = Centering.fit(d, q[fold != f])
        np.testing.assert_allclose(qc[fold == f], cen.apply(q[fold == f], "query"), atol=1e-6)
    np.testing.assert_allclose(dc, Centering.fit(d, q).apply(d, "document"), atol=1e-6)
    with pytest.raises(ValueError, match="at least 2 queries"):
        centred_vectors(q[:1], d, "crossfit")


def test_harness_runs_and_tables_show_centred_columns(tiny_dir: str, tmp_path: Path) -> None:
    from htp_retrieval.eval.harness import EvalSettings, format_results, resolve_data, run_eval

    root = _beir(tmp_path / "toy")
    items = resolve_data(str(root), split="test")
    settings = EvalSettings(model=tiny_dir, methods=["vanilla-mean"], dtype="float32",
                            output=tmp_path / "out", show_progress_bar=False,
                            center_queries=f"{root}:train")
    (res,) = run_eval(items, settings)
    (path,) = (tmp_path / "out").rglob("*.json")
    raw = json.loads(path.read_text())
    assert raw["run"]["data"] == {"center_queries": "toy-train", "seed": 0}
    assert raw["label"] == "vanilla-mean__len512"
    assert "NDCG@10 centred" in res.scores and res.config["centering"]["n_sample_queries"] == 6
    table = format_results([res])
    assert "| NDCG@10 | NDCG@10 centred | Recall@100 | Recall@100 centred |" in table


def _sts(root: Path) -> Path:
    """An STS folder: test pairs over TOPICS; train pairs share one sentence with test."""
    root.mkdir()
    rows = {"test": [(f"The {a} are here.", f"The {b} are near.", 5.0 - i % 6)
                     for i, (a, b) in enumerate(zip(TOPICS, TOPICS[1:] + TOPICS[:1]))],
            "train": [(f"Some {t} were seen.", f"No {t} at all.", 2.0) for t in TOPICS]}
    rows["train"].append(("The apples are here.", "Nothing.", 0.0))
    for split, pairs in rows.items():
        (root / f"{split}.jsonl").write_text("".join(
            json.dumps({"sentence1": a, "sentence2": b, "score": g}) + "\n"
            for a, b, g in pairs))
    return root


def test_sts_centred_on_a_sentence_sample_and_crossfit(tiny_dir, tmp_path: Path) -> None:  # noqa: ANN001
    from scipy.stats import spearmanr

    from htp_retrieval.eval.harness import EvalSettings, format_results, resolve_data, run_eval
    from htp_retrieval.eval.sts import load_sts

    root = _sts(tmp_path / "toysts")
    sample, label = read_query_sample(f"{root}:train")
    assert label == "toysts-train" and len(sample) == 14  # distinct sentences
    settings = EvalSettings(model=tiny_dir, methods=["vanilla-mean"], dtype="float32",
                            output=tmp_path / "out", show_progress_bar=False,
                            center_queries=f"{root}:train")
    with pytest.warns(UserWarning, match=r"holds 1 of the evaluated sentences.*13 of 14"):
        (res,) = run_eval(resolve_data(str(root), split="test"), settings)
    rec = res.config["centering"]
    assert rec["n_sample_sentences"] == 13 and rec["n_sample_overlap_dropped"] == 1
    # by hand: the same encoder, both sentences on the mean of the 13 kept sample sentences
    enc = HTPEncoder(tiny_dir, "vanilla-mean", dtype="float32")
    data = load_sts(root, split="test")
    kept = [s for s in sample if s != "The apples are here."]
    cen = Centering.fit(enc.encode(kept), enc.encode(kept))
    a = cen.apply(enc.encode(data.sentence1), "document")
    b = cen.apply(enc.encode(data.sentence2), "document")
    want = 100 * spearmanr((a * b).sum(axis=1), data.scores).statistic
    assert res.scores["Spearman centred"] == pytest.approx(want, abs=1e-6)
    assert res.scores["Spearman centred"] != pytest.approx(res.scores["Spearman"], abs=1e-6)
    assert set(rec["scale"]) == {"plain", "centred"}
    lo, hi = rec["spearman_delta_ci95"]
    assert lo <= hi
    assert "| Spearman | Spearman centred |" in format_results([res])
    cross = EvalSettings(model=tiny_dir, methods=["vanilla-mean"], dtype="float32",
                         output=tmp_path / "out", show_progress_bar=False,
                         center_queries="crossfit")
    (res_x,) = run_eval(resolve_data(str(root), split="test"), cross)
    assert res_x.config["centering"]["sentence_sample"] == "crossfit"
    assert np.isfinite(res_x.scores["Spearman centred"])
    assert res_x.scores["Spearman"] == pytest.approx(res.scores["Spearman"], abs=1e-9)
    # research's paired bootstrap: an STS result compares plain with centred over pairs,
    # and asking it for per-query rows says what to run instead
    from research.paired import load_per_query, sts_centred_table, sts_paired_table

    res.save(tmp_path / "sts.json")
    with pytest.raises(ValueError, match=r"sts\.json: an STS result.*--metric Spearman"):
        load_per_query(tmp_path / "sts.json")
    assert f"| {res.scores['Spearman']:.2f} |" in sts_centred_table([res], ["vm"])
    # the stored per-pair cosines are the ones the scores correlate, and survive a save
    back = RetrievalResult.load(tmp_path / "sts.json")
    assert back.per_pair["gold"] == data.scores
    for key, metric in (("cosine", "Spearman"), ("cosine centred", "Spearman centred")):
        rho = 100 * spearmanr(back.per_pair[key], data.scores).statistic
        assert rho == pytest.approx(res.scores[metric], abs=1e-9)
    # pair by pair: the two centrings of one run differ only in the centred cosines
    table = sts_paired_table([res, res_x], ["sample", "crossfit"], metric="Spearman centred")
    diff = res_x.scores["Spearman centred"] - res.scores["Spearman centred"]
    assert f"| crossfit | {res_x.scores['Spearman centred']:.2f} | {diff:+.2f} |" in table
    assert "| crossfit | " + f"{res.scores['Spearman']:.2f} | +0.00 | [+0.00, +0.00] | 0.0% |" in (
        sts_paired_table([res, res_x], ["sample", "crossfit"], metric="Spearman"))


def test_cosine_scale_separates_relevant_pairs() -> None:
    q = np.array([[1.0, 0.0], [0.0, 1.0]])
    c = np.array([[1.0, 0.1], [0.1, 1.0], [1.0, 1.0]])
    k = cosine_scale(q, c, ["q0", "q1"], ["d0", "d1", "d2"], {"q0": {"d0": 1}, "q1": {"d1": 1}})
    assert k["relevant_mean"] == pytest.approx(1 / np.sqrt(1.01))
    others = [0.1 / np.sqrt(1.01), 1 / np.sqrt(2), 0.1 / np.sqrt(1.01), 1 / np.sqrt(2)]
    assert k["other_mean"] == pytest.approx(np.mean(others))
    assert k["rel_above_p99"] == 1.0


def test_a_sample_of_only_evaluated_queries_fails_before_any_encoding(
        tmp_path: Path) -> None:
    """``--center-queries DIR:test`` on the test split would leave no query to centre on:
    the CLI says so up front (a model path that does not exist is never reached), and
    ``run_eval`` raises before writing anything."""
    from htp_retrieval.cli import main
    from htp_retrieval.eval.harness import EvalSettings, resolve_data, run_eval

    root = _beir(tmp_path / "toy")
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match="holds only texts of the evaluated toy test split"):
        main(["eval", "--data", str(root), "--split", "test", "--methods", "vanilla-mean",
              "--model", str(tmp_path / "no-model"), "--center-queries", f"{root}:test",
              "--output", str(out)])
    settings = EvalSettings(model=str(tmp_path / "no-model"), methods=["vanilla-mean"],
                            output=out, show_progress_bar=False,
                            center_queries=f"{root}:test")
    with pytest.raises(ValueError, match=r"toy:test holds only texts"):
        run_eval(resolve_data(str(root), split="test"), settings)
    assert not out.exists()
