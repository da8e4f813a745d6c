"""Seed parity: the official README's command lines, with only the script name changed."""

from __future__ import annotations

import json
import os

import pytest

from htp_retrieval.cli import main
from htp_retrieval.eval import parity
from htp_retrieval.eval.parity import find_local, load_config, resolve_official, with_pooling
from htp_retrieval.methods import get_method

SHARED = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data"))
needs_data = pytest.mark.skipif(not os.path.isdir(os.path.join(SHARED, "beir", "scifact")),
                                reason="../shared/data missing")


# Every command line of the official README (../shared/seeds/000_*.txt), "python X.py" -> "X.py",
# with the method it must resolve to.
README_COMMANDS = [
    ("mteb_retrieval_tasks.py --model_method vanilla-mean-pool "
     "--architecture mistral-instruct-vanilla", "vanilla-mean"),
    ("mteb_retrieval_tasks.py --model_method echo-mean-pool "
     "--architecture mistral-instruct-vanilla", "echo-mean"),
    ("mteb_retrieval_tasks.py --model_method tp-mean-pool --architecture mistral-instruct-tp",
     "tp-mean"),
    ("mteb_retrieval_tasks.py --model_method tp-prompteol-last-pool "
     "--architecture mistral-instruct-tp", "tp-prompteol-last"),
    ("mteb_retrieval_tasks.py --model_method vanilla-mean-pool --architecture mistral-instruct-tp "
     "--use_which_plan tp_sentence", "tp-sentence"),
    ("mteb_retrieval_tasks.py --model_method vanilla-mean-pool --architecture mistral-instruct-tp "
     "--use_which_plan tp_sentence_begin", "htp-last"),
    ("mteb_retrieval_tasks.py --model_method tp-prompteol-last-pool "
     "--architecture mistral-instruct-tp --output_layer -1 --tp_starting_index 10 "
     "--tp_exiting_index 20 --verbose 1 --retrieval_datasets NFCorpus FiQA2018 SciFact",
     "tp-prompteol-last"),
    ("longembed_retrieval_tasks.py --model_method echo-mean-pool "
     "--architecture mistral-instruct-vanilla", "echo-mean"),
    ("longembed_retrieval_tasks.py --model_method tp-mean-pool "
     "--architecture mistral-instruct-tp", "tp-mean"),
    ("longembed_retrieval_tasks.py --model_method tp-prompteol-last-pool "
     "--architecture mistral-instruct-tp", "tp-prompteol-last"),
    ("longembed_retrieval_tasks.py --model_method vanilla-mean-pool "
     "--architecture mistral-instruct-tp --use_which_plan tp_sentence", "tp-sentence"),
    ("longembed_retrieval_tasks.py --model_method vanilla-mean-pool "
     "--architecture mistral-instruct-tp --use_which_plan tp_sentence_begin", "htp-last"),
    ("synthetic_retrieval_tasks.py --model_method vanilla-mean-pool "
     "--architecture mistral-instruct-tp --use_which_plan tp_sentence_begin", "htp-last"),
    ("mteb_sts_tasks.py --model_method vanilla-mean-pool --architecture mistral-instruct-tp "
     "--use_which_plan tp_sentence_begin", "htp-last"),
]


@pytest.mark.parametrize(("line", "method"), README_COMMANDS)
def test_every_readme_command_parses_and_maps(line: str, method: str, monkeypatch) -> None:  # noqa: ANN001
    seen = {}

    def fake(args) -> int:  # noqa: ANN001
        seen["run"] = resolve_official(args, load_config(args.config))
        seen["args"] = args
        return 0

    monkeypatch.setattr(parity, "cmd_parity", fake)
    assert main(line.split()) == 0
    run, args = seen["run"], seen["args"]
    assert run.spec.name == method
    assert run.model == "mistralai/Mistral-7B-Instruct-v0.3"
    assert args.parity_script == line.split()[0].removesuffix(".py")
    if "--tp_starting_index 10" in line:
        assert (run.tp_start, run.tp_exit, run.output_layer, args.verbose) == (10, 20, -1, 1)
        assert args.retrieval_datasets == ["NFCorpus", "FiQA2018", "SciFact"]


def _small(tiny_dir: str, out) -> list[str]:  # noqa: ANN001
    """Overrides that make a README command fit a test: tiny model, few documents."""
    return ["--model_name_or_path", tiny_dir, "--tp_exiting_index", "5", "--dtype", "float32",
            "--max_queries", "2", "--max_docs", "5", "--output", str(out), "--quiet"]


@needs_data
def test_readme_htp_command_with_verbose(tiny_dir, tmp_path, capsys) -> None:  # noqa: ANN001
    # README: python mteb_retrieval_tasks.py --model_method vanilla-mean-pool
    #         --architecture mistral-instruct-tp --use_which_plan tp_sentence_begin
    argv = ["mteb_retrieval_tasks.py", "--model_method", "vanilla-mean-pool", "--architecture",
            "mistral-instruct-tp", "--use_which_plan", "tp_sentence_begin", "--verbose", "1",
            "--retrieval_datasets", "SciFact", *_small(tiny_dir, tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "Model Method            : vanilla-mean-pool  ->  method htp-last" in out
    assert "[htp-last] layout of one document" in out and "<B-PST> <B-PST>" in out
    assert "| htp-last |" in out
    (path,) = tmp_path.rglob("*.json")
    saved = json.loads(path.read_text())
    assert saved["label"] == "htp-last__len512__tp1-5__out-3"  # mistral preset, exit -3
    assert saved["run"]["data"]["extra"]["parity"] == saved["config"]["parity"]
    assert saved["dataset"] == "scifact" and saved["config"]["method"] == "htp-last"
    assert saved["config"]["tp_start"] == 1 and saved["config"]["output_layer"] == -3
    assert saved["config"]["parity"] == {
        "script": "mteb_retrieval_tasks", "model_method": "vanilla-mean-pool",
        "architecture": "mistral-instruct-tp", "use_which_plan": "tp_sentence_begin",
        "pooling": "mean"}
    assert saved["config"]["command"].startswith("htp-retrieval mteb_retrieval_tasks.py")


@needs_data
def test_readme_example_names_missing_datasets(tiny_dir, tmp_path) -> None:  # noqa: ANN001
    # README: ... --output_layer -1 --tp_starting_index 10 --tp_exiting_index 20 --verbose 1
    #         --retrieval_datasets NFCorpus FiQA2018 SciFact
    argv = ["mteb_retrieval_tasks", "--model_method", "tp-prompteol-last-pool",
            "--architecture", "mistral-instruct-tp", "--output_layer", "-1",
            "--tp_starting_index", "10", "--tp_exiting_index", "20", "--verbose", "1",
            "--retrieval_datasets", "NFCorpus", "FiQA2018,SciFact",
            "--model_name_or_path", tiny_dir, "--output", str(tmp_path)]
    with pytest.raises(SystemExit, match="'NFCorpus' .looked in: .*beir/nfcorpus") as e:
        main(argv)
    assert "'FiQA2018'" in str(e.value) and "beir/fiqa" in str(e.value)
    assert "SciFact" not in str(e.value).split("looked in")[0]
    assert not list(tmp_path.rglob("*.json"))


@needs_data
def test_sts_longembed_and_synthetic_scripts(tiny_dir, tmp_path, capsys) -> None:  # noqa: ANN001
    common = ["--model_method", "vanilla-mean-pool", "--architecture", "smollm2-tp",
              "--use_which_plan", "tp_sentence_begin"]
    assert main(["mteb-sts-tasks", *common, *_small(tiny_dir, tmp_path), "--max_queries", "8"]) == 0
    assert main(["longembed_retrieval_tasks", *common, "--retrieval_datasets", "qmsum",
                 "--max_length", "64", *_small(tiny_dir, tmp_path)]) == 0
    assert main(["synthetic_retrieval_tasks.py", *common, "--retrieval_datasets", "passkey",
                 "--context_length", "64", *_small(tiny_dir, tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "| Spearman |" in printed and "### qmsum (test)" in printed
    assert "### passkey (test), context length 64 tokens" in printed
    by_dataset = {(raw := json.loads(p.read_text()))["dataset"]: (raw["label"], raw["run"]["data"])
                  for p in tmp_path.rglob("*.json")}
    # smollm2-tp leaves tp_start and the exit layer to the model preset (empty in the label)
    assert {k: v[0] for k, v in by_dataset.items()} == {
        "stsb": "htp-last__len512__tp-5", "qmsum": "htp-last__len64__tp-5", "passkey": "htp-last__tp-5"}
    assert by_dataset["stsb"][1]["subset"] == {"max_queries": 8, "max_docs": 5}
    assert by_dataset["passkey"][1]["context_length"] == 64


def test_pooling_override_and_config_errors(tmp_path) -> None:  # noqa: ANN001
    assert with_pooling(get_method("vanilla-mean"), "last").name == "vanilla-last"
    htp_last = with_pooling(get_method("htp"), "last")
    assert (htp_last.name, htp_last.pooling, htp_last.placeholders) == (
        "htp-last-pool", "last", "hierarchical")
    with pytest.raises(SystemExit, match="architecture 'llama-9000' not found; available: "
                       "mistral-instruct-vanilla, mistral-instruct-tp"):
        main(["mteb_retrieval_tasks", "--architecture", "llama-9000"])
    own = tmp_path / "config.yaml"
    own.write_text("data:\n  retrieval_task:\n    paths: {MyData: /somewhere/mydata}\n")
    cfg = load_config(own)
    assert cfg["architectures"]["gemma2-tp"]["tp_exiting_index"] == 6  # packaged kept
    section = cfg["data"]["retrieval_task"]
    assert section["paths"] == {"MyData": "/somewhere/mydata"} and section["subfolder"] == "beir"
    path, looked = find_local("MyData", section, cfg)
    assert path is None and looked[0].as_posix() == "/somewhere/mydata"
