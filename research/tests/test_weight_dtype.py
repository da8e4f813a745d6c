"""``python -m research weights-dtype`` on the packaged SmolLM2 and real SciFact documents."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SCIFACT = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "beir" / "scifact"


@pytest.mark.integration
@pytest.mark.skipif(not SCIFACT.is_dir(), reason="../shared/data missing")
def test_cached_bf16_weights_are_a_rounding_of_the_float32_conversion(tmp_path: Path) -> None:
    import argparse

    from research.weight_dtype import cmd_weights_dtype

    args = argparse.Namespace(model="smollm2-135m-instruct", data=str(SCIFACT), n_texts=2,
                              methods="vanilla-mean", output=str(tmp_path))
    assert cmd_weights_dtype(args) == 0
    res = json.loads((tmp_path / "weights-dtype-smollm2-135m-instruct.json").read_text())
    w = res["weights"]
    assert w["stored_dtype"] == "torch.bfloat16" and w["tensors"] > 200
    # bf16 keeps 8 significand bits: rounding moves a tensor by at most 2**-8 relative
    assert 0 < w["relative_l2_median"] <= w["relative_l2_max"] < 2.0**-8
    assert res["n_texts"] == 2 and res["cosine"]["vanilla-mean"]["min"] > 0.9999
    with pytest.raises(FileNotFoundError, match="no corpus.jsonl"):
        cmd_weights_dtype(argparse.Namespace(**{**vars(args), "data": str(tmp_path)}))
