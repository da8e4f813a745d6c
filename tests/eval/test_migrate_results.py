"""``scripts/migrate_results.py``: results under the old naming scheme, moved once to
``<method>__<digest>.json`` with every setting recorded, as ``eval`` now names them."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from htp_retrieval.eval.harness import DataItem, EvalSettings, RunPoint, result_paths
from htp_retrieval.eval.report import read_result, variant_label
from htp_retrieval.eval.retrieval import RetrievalResult
from htp_retrieval.methods import get_method

ROOT = Path(__file__).resolve().parents[2]
MODEL = "LlamaForCausalLM"


@pytest.fixture(scope="module")
def migrate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("migrate_results",
                                                  ROOT / "scripts" / "migrate_results.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _old(folder: Path, name: str, **cfg: object) -> Path:
    """A results JSON as the old scheme wrote it: settings at their historical defaults
    (summary ``last``, no budgets) left out of ``config``, data tags in the name."""
    f = folder / f"{name}.json"
    f.parent.mkdir(parents=True, exist_ok=True)
    config = {"model": MODEL, "method": "htp", "k": 1, "tokens_per_block": 32,
              "segmenter": "sentencizer", "tp_start": 1, "tp_exit": 7, "output_layer": -2,
              "dtype": "float32", "padding_side": "right", "placeholder_init": "mean",
              "summary": "mean", **cfg}
    f.write_text(json.dumps({"dataset": "toy", "split": "test", "scores": {"NDCG@10": 1.0},
                             "cost": {}, "counts": {}, "config": config}))
    return f


def _moved(migrate: ModuleType, f: Path) -> Path:
    status, raw, new = migrate.migrate(f)
    assert status == "moved"
    new.write_text(json.dumps(raw))
    return new


def test_a_budget_that_cannot_bind_is_recorded_as_the_default(
        migrate: ModuleType, tmp_path: Path) -> None:
    """With T = 64, B = 8 at 512 tokens has the default B = 32's layouts; at 1024 not."""
    def rec(name: str, **cfg: object) -> object:
        return read_result(_moved(migrate, _old(tmp_path / name, "htp__len512", **cfg)))

    short = rec("a", max_blocks=8, min_block_tokens=64, max_length=512)
    assert short.config["max_blocks"] == 32 and short.config["max_blocks_recorded"] == 8
    assert variant_label(short, ["max_blocks", "min_block_tokens"]) == \
        "htp (max_blocks=32, min_block_tokens=64, default)"
    long = rec("b", max_blocks=8, min_block_tokens=64, max_length=1024)  # 8 blocks vs 16
    assert long.config["max_blocks"] == 8 and "max_blocks_recorded" not in long.config
    uncapped = rec("c", max_blocks=8, max_length=512)  # no T: B = 8 binds at any length
    assert uncapped.config["max_blocks"] == 8
    # runs made before the long-text budget (1024, 8): the default's layouts up to 1024
    # tokens, not past it; B = 8 with no long budget differs below 1024 tokens
    old = rec("d", max_blocks=32, min_block_tokens=64, max_length=1024)
    assert old.config["long_budget"] == [1024, 8] and old.config["long_budget_recorded"] is None
    old_long = rec("e", max_blocks=32, min_block_tokens=64, max_length=8192)
    assert old_long.config["long_budget"] is None and "long_budget_recorded" not in old_long.config
    assert variant_label(old_long, ["long_budget"]) == "htp (long_budget=none)"
    new = rec("f", max_blocks=32, min_block_tokens=64, long_budget=[1024, 8], max_length=8192)
    assert variant_label(new, ["long_budget"]) == "htp (long_budget=1024:8, default)"
    # B = 8 never exceeds B_L = 8: it reads as B = 8 under the default long budget
    b8 = rec("g", max_blocks=8, min_block_tokens=64, max_length=8192)
    assert b8.config["max_blocks"] == 8 and b8.config["long_budget"] == [1024, 8]
    assert variant_label(b8, ["max_blocks"]) == "htp (max_blocks=8)"
    # without T the long budget still cannot bind at 512 tokens
    no_t = rec("h", max_blocks=32, max_length=512)
    assert no_t.config["long_budget"] == [1024, 8] and no_t.config["min_block_tokens"] is None


def test_migrated_files_are_the_files_eval_names(migrate: ModuleType, tiny_dir: Path,  # noqa: ANN001
                                                 tmp_path: Path) -> None:
    """A migrated result lands where ``eval`` with the same settings looks for it (a budget
    that cannot bind: where the default run's file is), every setting is in its config,
    and its label is the old name less the data tags."""
    from htp_retrieval import HTPEncoder

    out = tmp_path / "results"
    item = DataItem("retrieval", "toy", "test", None)  # type: ignore[arg-type]

    def planned(length: int, **kw: object) -> tuple[dict, Path]:
        settings = EvalSettings(model=str(tiny_dir), dtype="float32", output=out,
                                max_queries=5, max_docs=15, **kw)  # type: ignore[arg-type]
        (_, run, path), = result_paths(settings, RunPoint(get_method("htp"), length), item)[1]
        return run, path

    def write_old(length: int) -> Path:
        enc = HTPEncoder(str(tiny_dir), "htp", dtype="float32", max_length=length, max_blocks=8)
        # the old record: settings at their historical defaults left out
        config = {k: v for k, v in enc.record().items()
                  if k not in ("keep_sink", "bare_prefix", "preset", "overflow")}
        config["command"] = "htp-retrieval eval ..."
        old = planned(length)[1].parent / f"htp__len{length}__mb8__mbt64__q5d15s0__float32.json"
        RetrievalResult(dataset="toy", split="test", config=config, scores={"NDCG@10": 1.0},
                        cost={}, counts={}).save(old)
        return old

    binding, unbound = write_old(1024), write_old(512)  # 8 blocks vs 16; 8 either way
    assert migrate.main([str(out)]) == 0
    assert not binding.exists() and not unbound.exists()
    run, path = planned(1024, max_blocks=8)
    raw = json.loads(path.read_text())
    assert raw["run"] == run and raw["label"] == "htp__len1024__mb8__mbt64"
    assert raw["config"]["overflow"] == "truncate" and raw["config"]["keep_sink"] is True
    assert read_result(path).subset is not None and read_result(path).subset.tag == "q5d15s0"
    run, path = planned(512)  # the default's file; the value it ran with is kept
    raw = json.loads(path.read_text())
    assert raw["run"] == run and raw["config"]["max_blocks"] == 32
    assert raw["config"]["max_blocks_recorded"] == 8
    assert migrate.main([str(out), "--check"]) == 0  # nothing left in the old form
    # a second old file of one run is refused, naming both
    write_old(1024)
    with pytest.raises(SystemExit, match="are one run"):
        migrate.main([str(out)])


def test_every_committed_result_is_in_the_new_form() -> None:
    """Every results JSON in the repo carries its whole config and its run, and sits at the
    name ``eval`` gives that run (research variants keep the names their commands chose),
    so the report reads them as they are."""
    from htp_retrieval.config import HTPConfig
    from htp_retrieval.eval.naming import result_file_name

    seen = 0
    for root in (ROOT / "results", ROOT / "research" / "results"):
        for path in sorted(root.rglob("*.json")):
            raw = json.loads(path.read_text())
            if not (isinstance(raw, dict) and "scores" in raw and "split" in raw
                    and "method" in raw.get("config", {})):
                continue
            hint = f"{path}: run python scripts/migrate_results.py results research/results"
            assert "run" in raw and "label" in raw, hint
            cfg = HTPConfig.from_dict(raw["htp_config"])
            assert cfg == HTPConfig.from_record(raw["config"]) == \
                HTPConfig.from_dict(raw["run"]["htp_config"]), path
            assert set(cfg.flat()) <= set(raw["config"]), path  # every setting recorded
            if "variant" not in raw["config"]:
                assert path.name == result_file_name(raw["run"]), path
            seen += 1
    assert seen > 700
