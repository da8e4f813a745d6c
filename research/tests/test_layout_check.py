"""``python -m research same-layouts``: a finished run's documents and queries laid out
with its own settings and with another K-policy value, on the data rebuilt from the record;
a written check makes the record the run of the value it matches."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from htp_retrieval import models
from htp_retrieval.cli import main
from htp_retrieval.eval.naming import result_file_name
from htp_retrieval.eval.report import is_shipped, read_result
from htp_retrieval.eval.retrieval import RetrievalResult
from research.__main__ import main as research_main
from research.layout_check import check_record, write_check


@pytest.fixture(scope="module")
def passkey_runs(tiny_dir, tmp_path_factory) -> Path:  # noqa: ANN001
    """htp and vanilla-mean on passkey at 64 and 512 tokens (4 documents, 2 queries), with a
    tiny random Llama saved to a folder, without the Llama short-text budget (as runs made
    before it shipped)."""
    d = tiny_dir
    out = tmp_path_factory.mktemp("lc") / "results"
    assert main(["eval", "--data", "passkey", "--context-lengths", "64,512", "--methods",
                 "vanilla-mean,htp", "--max-queries", "2", "--max-docs", "4", "--model", str(d),
                 "--dtype", "float32", "--output", str(out), "--quiet",
                 "--short-budget", "0"]) == 0
    return out


def _one(root: Path, method: str, context_length: int) -> Path:
    """The one result of ``method`` at ``context_length`` under ``root``."""
    (path,) = [p for p in root.rglob(f"{method}__*.json")
               if json.loads(p.read_text())["config"]["context_length"] == context_length]
    return path


def test_check_counts_changed_inputs_on_the_rebuilt_data(passkey_runs: Path) -> None:
    short, long_ = _one(passkey_runs, "htp", 64), _one(passkey_runs, "htp", 512)
    cache: dict = {}
    # (256, 1): the 64-token documents get one block under T = 64 anyway, the 512-token
    # ones are past S; the queries are one block either way
    for path in (short, long_):
        check = check_record(path, {"short_budget": [256, 1]}, encoders=cache)
        assert check.same and check.documents == 4 and check.queries == 2
    # (600, 1) reaches the 512-token documents: every one of them loses blocks
    check = check_record(long_, {"short_budget": [600, 1]}, encoders=cache)
    assert (check.documents_changed, check.queries_changed, check.same) == (4, 0, False)
    # a block budget of 2 caps them too (8 blocks under T = 64 at 512 tokens)
    assert check_record(long_, {"max_blocks": 2}, encoders=cache).documents_changed == 4
    with pytest.raises(ValueError, match="not written"):
        write_check(check, command="x")


def test_check_refuses_other_data_methods_and_keys(passkey_runs: Path, tmp_path: Path) -> None:
    path = _one(passkey_runs, "htp", 512)
    raw = json.loads(path.read_text())
    raw["cost"]["corpus_text_tokens"] += 1  # as if run on another corpus
    other = tmp_path / "htp__other.json"
    other.write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=r"htp__other\.json: the rebuilt corpus gives"):
        check_record(other, {"short_budget": [256, 1]})
    with pytest.raises(ValueError, match="has no sentence blocks"):
        check_record(_one(passkey_runs, "vanilla-mean", 512), {"short_budget": None})
    with pytest.raises(ValueError, match=r"cannot check \['k'\]"):
        check_record(path, {"k": 2})


def test_cli_writes_only_unchanged_checks_and_the_report_shows_the_default(
        passkey_runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    root = tmp_path / "copy"
    shutil.copytree(passkey_runs, root)
    assert research_main(["same-layouts", str(root), "--short-budget", "600:1",
                 "--write"]) == 1  # the 512-token documents change
    table = capsys.readouterr().out
    assert "| 4 of 4 | 0 of 2 | no |" in table and "| 0 of 4 | 0 of 2 | yes |" in table
    long_ = _one(root, "htp", 512)
    assert "same_layouts" not in json.loads(long_.read_text())
    assert research_main(["same-layouts", str(root), "--short-budget", "256:1",
                 "--write"]) == 0
    # the checked record is now the run of the checked value: its config, its file
    assert not long_.exists()
    moved = _one(root, "htp", 512)
    raw = json.loads(moved.read_text())
    entry = raw["same_layouts"]
    assert [e["settings"] for e in entry] == [{"short_budget": [256, 1]}]
    assert entry[0]["command"].startswith("python -m research same-layouts ")
    assert entry[0]["command"].endswith("--short-budget 256:1 --write")
    assert raw["config"]["short_budget"] == [256, 1] and raw["config"]["short_budget_recorded"] is None
    assert raw["htp_config"]["blocks"]["short_budget"] == [256, 1] == \
        raw["run"]["htp_config"]["blocks"]["short_budget"]
    assert moved.name == result_file_name(raw["run"])
    # a record run with the checked value gets no entry
    ran = root / "passkey-test-sb"
    ran.mkdir()
    (ran / moved.name).write_text(json.dumps({k: v for k, v in raw.items()
                                              if k != "same_layouts"}))
    assert research_main(["same-layouts", str(ran), "--short-budget", "256:1",
                 "--write"]) == 0
    assert "same_layouts" not in json.loads((ran / moved.name).read_text())
    # eval reuses the annotated file (RetrievalResult.load) and keeps the entry on save
    res = RetrievalResult.load(moved)
    assert res.same_layouts == entry
    res.save(tmp_path / "resaved.json")
    assert json.loads((tmp_path / "resaved.json").read_text())["same_layouts"] == entry

    # the report: under a family that ships (256, 1), the checked run is its shipped htp;
    # the run as it was before the check is not
    monkeypatch.setitem(models.LAYER_PRESETS, "llama",
                        replace(models.LAYER_PRESETS["llama"], short_budget=(256, 1)))
    raw["config"]["model"] = "smollm2-135m-instruct"  # a packaged name gives the family
    pre = models.LAYER_PRESETS["llama"]  # and its layers (the tiny model ran others)
    raw["config"].update(tp_start=pre.tp_start, tp_exit=pre.tp_exit,
                         output_layer=pre.output_layer)
    checked, unchecked = tmp_path / "checked.json", tmp_path / "unchecked.json"
    checked.write_text(json.dumps(raw))
    before = {**raw, "config": {**raw["config"], "short_budget": None}}
    unchecked.write_text(json.dumps(before))
    rec = read_result(checked)
    assert rec.config["short_budget"] == [256, 1] and rec.config["short_budget_recorded"] is None
    assert is_shipped(rec, [])
    rec = read_result(unchecked)
    assert rec.config["short_budget"] is None and not is_shipped(rec, [])
