"""Integration: the packaged SmolLM2 on real SciFact data, through the library and the CLI."""

from __future__ import annotations

import json
import os

import pytest

from htp_retrieval.cli import main
from htp_retrieval.encoder import HTPEncoder
from htp_retrieval.eval.data import load_beir, subsample
from htp_retrieval.eval.retrieval import run_retrieval

SCIFACT = os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "beir", "scifact"))
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not os.path.isdir(SCIFACT), reason="../shared/data missing"),
]

# Measured with `htp-retrieval eval --data ../shared/data/beir/scifact --methods
# vanilla-mean,htp --max-queries 30 --max-docs 100 --seed 0 --dtype D` (the shipped llama
# preset; Intel Xeon, 2 threads): float32 htp NDCG@10 60.41, vanilla-mean 56.46; bfloat16
# htp 60.41, vanilla-mean 57.46. The floor sits between HTP and vanilla-mean in both dtypes
# (`dtype="auto"` picks one per CPU), so a regression (or losing the HTP gain) fails.
HTP_NDCG10_FLOOR = 59.0


def test_htp_on_scifact_subset_clears_floor() -> None:
    data = subsample(load_beir(SCIFACT, "test"), n_queries=30, n_docs=100, seed=0)
    enc = HTPEncoder("smollm2-135m-instruct", "htp")
    res = run_retrieval(enc, data, show_progress_bar=False)
    assert {k: res.counts[k] for k in ("n_docs", "n_queries")} == \
        {"n_docs": 100, "n_queries": 30}
    assert 1 <= res.counts["rank1_docs"] <= 30
    assert res.scores["NDCG@10"] >= HTP_NDCG10_FLOOR, res.scores
    assert res.cost["encode_seconds"] > 0 and res.cost["tokens_per_second"] > 0


def test_cli_eval_writes_and_reuses_results(tmp_path, capsys) -> None:  # noqa: ANN001
    argv = ["eval", "--data", SCIFACT, "--methods", "vanilla-mean,htp", "--max-queries", "3",
            "--max-docs", "12", "--output", str(tmp_path), "--quiet"]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "| htp |" in table and "| vanilla-mean |" in table
    files = sorted(tmp_path.rglob("*.json"))
    assert len(files) == 2
    saved = json.loads(files[0].read_text())
    assert saved["counts"]["n_queries"] == 3 and "NDCG@10" in saved["scores"]
    assert saved["config"]["exit_layer"] == 29  # second-to-last of 30 layers
    mtimes = [f.stat().st_mtime for f in files]
    assert main(argv) == 0
    assert [f.stat().st_mtime for f in files] == mtimes  # reused, not recomputed
    err = capsys.readouterr().err
    assert "reusing" in err


def test_cli_layout_prints_appendix_c_style(capsys) -> None:  # noqa: ANN001
    text = "First claim here. Second one!"
    assert main(["layout", text, "--instruction", "Retrieve", "--method", "htp-last"]) == 0
    out = capsys.readouterr().out  # the paper's HTP: one block per sentence (K = 1)
    assert out.count("<B-PST>") == 2 and out.count("<PST>") == 2
    assert out.index("rieve") < out.index("<B-PST>")  # instruction kept in front
    assert main(["layout", text, "--instruction", "Retrieve"]) == 0
    out = capsys.readouterr().out  # shipped htp: 7 text tokens < T = 64 (and <= 256), one block
    assert out.count("<B-PST>") == 1 and out.count("<PST>") == 1
    assert out.index("rieve") < out.index("<B-PST>")
    assert main(["layout", text, "--instruction", "Retrieve", "--min-block-tokens", "0",
                 "--short-budget", "0"]) == 0
    out = capsys.readouterr().out  # without the density cap and the short-text budget:
    # one block per sentence again
    assert out.count("<B-PST>") == 2 and out.count("<PST>") == 2


QMSUM = os.path.abspath(os.path.join(SCIFACT, "..", "..", "longembed", "qmsum"))


@pytest.mark.skipif(not os.path.isdir(QMSUM), reason="../shared/data missing")
def test_blocks_command_keeps_qmsum_within_the_block_budget(capsys) -> None:  # noqa: ANN001
    """``htp-retrieval blocks`` on real QMSum: adaptive K caps blocks, fixed K does not.

    At 2048 tokens every meeting is past 1024 text tokens, so the shipped long-text budget
    gives each exactly 8 blocks (research/ANALYSIS.md section 13).
    """
    assert main(["blocks", "--data", QMSUM, "--max-length", "2048"]) == 0
    rows = {r[1]: r for r in ([c.strip() for c in line.split("|")[1:-1]]
                              for line in capsys.readouterr().out.splitlines()
                              if line.startswith("| qmsum-test"))}
    fixed = rows["fixed"]
    policy = rows["max_blocks=32, min_block_tokens=64, long_budget=1024:8, "
                  "short_budget=256:1"]  # shipped
    assert fixed[2] == policy[2] == "197"  # every document, under both rules
    assert int(fixed[7]) > 32 and int(fixed[8]) > 0  # fixed K = 1: some documents exceed 32
    assert policy[3] == policy[7] == "8" and policy[8] == "0"  # the policy: 8 blocks each
    assert float(policy[9]) < float(fixed[9])  # fewer placeholders per text token


@pytest.mark.skipif(not os.path.isdir(QMSUM), reason="../shared/data missing")
def test_blocks_command_lays_out_queries_with_their_instruction(capsys) -> None:  # noqa: ANN001
    """``blocks --queries`` adds rows for the queries (LongEmbed QMSum's 1,527 answer
    summaries), laid out with the task's query instruction as ``eval`` encodes them: far
    shorter than the 512-token meetings, so fewer blocks under the shipped policy."""
    assert main(["blocks", "--data", QMSUM, "--max-length", "512", "--queries"]) == 0
    rows = [[c.strip() for c in line.split("|")[1:-1]]
            for line in capsys.readouterr().out.splitlines() if line.startswith("| qmsum-test")]
    docs = [r for r in rows if r[0] == "qmsum-test" and r[1] != "fixed"]
    queries = [r for r in rows if r[0] == "qmsum-test queries" and r[1] != "fixed"]
    assert len(docs) == len(queries) == 1
    assert docs[0][2] == "197" and queries[0][2] == "1527"
    assert queries[0][3] == "1" and float(queries[0][4]) < float(docs[0][4])
    assert int(docs[0][10]) == 512 and 0 < int(queries[0][10]) < 512  # median text tokens


@pytest.mark.skipif(not os.path.isdir(QMSUM), reason="../shared/data missing")
def test_blocks_command_reads_span_folders_and_refuses_sts(capsys) -> None:  # noqa: ANN001
    """An evidence-span folder is laid out as its whole documents (the 197 QMSum meetings of
    ``spans/qmsum``); STS data has no documents and gets a one-line error naming it."""
    spans = os.path.join(QMSUM, "..", "..", "spans", "qmsum")
    assert main(["blocks", "--data", spans, "--split", "dev", "--max-length", "512"]) == 0
    rows = [[c.strip() for c in line.split("|")[1:-1]]
            for line in capsys.readouterr().out.splitlines() if line.startswith("| qmsum-dev")]
    assert [r[2] for r in rows] == ["197", "197"]
    stsb = os.path.join(QMSUM, "..", "..", "sts", "stsb")
    with pytest.raises(SystemExit, match="STS data"):
        main(["blocks", "--data", stsb])


@pytest.mark.skipif(not os.path.isdir(QMSUM), reason="../shared/data missing")
def test_blocks_command_measures_needle_at_its_context_length(capsys) -> None:  # noqa: ANN001
    """Without ``--max-length``, needle documents are laid out at their context length, as
    ``eval`` encodes them: at 1,100 tokens (past 1024) the shipped policy gives 8 blocks,
    which a 512-token cut could never show."""
    assert main(["blocks", "--data", "needle", "--context-lengths", "1100"]) == 0
    out = capsys.readouterr().out
    (row,) = [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines()
              if line.startswith("| needle-test @1100") and "long_budget=1024:8" in line]
    assert row[3] == row[7] == "8"  # every document: 8 blocks past 1024 text tokens
    (fixed,) = [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines()
                if line.startswith("| needle-test @1100 | fixed")]
    assert int(fixed[3]) > 32  # one block per sentence over ~1,100 tokens of essay
