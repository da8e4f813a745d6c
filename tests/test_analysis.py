"""Diagnosis helpers (issue 6): variant parsing, norm and drift profiles, sink ablation."""

from __future__ import annotations

import pytest

from htp_retrieval.encoder import HTPEncoder
from htp_retrieval.eval.analysis import drift_profile, norm_profile, parse_variant

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
    assert unsafe.config()["keep_sink"] is False and "keep_sink" not in safe.config()
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
    assert enc.config()["summary"] == "mean"
    with pytest.raises(ValueError, match="summary"):
        HTPEncoder(model, "htp", tokenizer=tok, summary="max")


def test_ablate_pairing_shares_one_corpus_encode(tiny_llama, tmp_path, capsys) -> None:  # noqa: ANN001
    """``analyze ablate``: variants that differ only in the query method reuse the corpus."""
    import json
    import os

    from htp_retrieval.cli import main

    scifact = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "beir",
                           "scifact")
    if not os.path.isdir(scifact):
        pytest.skip("../shared/data missing")
    model, tok = tiny_llama
    mdir = tmp_path / "tiny"
    model.save_pretrained(mdir)
    tok.save_pretrained(mdir)
    out = tmp_path / "analysis"
    rc = main(["analyze", "ablate", "--model", str(mdir), "--data", scifact, "--split", "train",
               "--max-queries", "4", "--max-docs", "12", "--max-length", "48", "--quiet",
               "--output", str(out),
               "--variant", "htp:method=htp",
               "--variant", "htp-tp-queries:method=htp,query_method=tp-mean"])
    assert rc == 0
    folder = next(out.glob("*/scifact-train-q4d12s0"))
    first = json.loads((folder / "htp.json").read_text())
    paired = json.loads((folder / "htp-tp-queries.json").read_text())
    assert first["cost"]["resumed_chunks"] == 0
    assert paired["cost"]["resumed_chunks"] >= 1  # the corpus came from the first variant
    assert paired["config"]["query_config"]["method"] == "tp-mean"
    assert "htp-tp-queries" in capsys.readouterr().out
