"""Encoder behaviour on tiny random decoders: batch invariance, padding, injection, errors."""

from __future__ import annotations

import numpy as np
import pytest

from htp_retrieval.encoder import HTPEncoder
from htp_retrieval.methods import METHODS

TEXTS = [
    "Short text.",
    "Cells divide. Then they grow! Proteins fold in the membrane. The end is near.",
    "A medium length sentence about graphene and its inductive properties. Another one.",
    "One",
]


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_batch_invariance(tiny, method: str, padding_side: str) -> None:  # noqa: ANN001
    model, tok = tiny
    # max_padding=1.0: texts of very different lengths share one padded batch
    enc = HTPEncoder(model, method, tokenizer=tok, padding_side=padding_side,
                     tokens_per_block=4, dtype="float32", max_padding=1.0)
    batch = enc.encode(TEXTS, batch_size=8)
    stats = enc.last_stats
    assert stats.padded_tokens > stats.input_tokens  # padding actually occurred
    assert max(rows for rows, _ in stats.batches) > 1
    for i, t in enumerate(TEXTS):
        alone = enc.encode([t])[0]
        assert _cos(alone, batch[i]) >= 0.999, (method, padding_side, i)


@pytest.mark.parametrize("method", ["htp", "vanilla-last", "tp-prompteol-last"])
def test_left_and_right_padding_agree(tiny, method: str) -> None:  # noqa: ANN001
    model, tok = tiny
    right = HTPEncoder(model, method, tokenizer=tok, padding_side="right").encode(TEXTS)
    left = HTPEncoder(model, method, tokenizer=tok, padding_side="left").encode(TEXTS)
    for a, b in zip(right, left):
        assert _cos(a, b) >= 0.999


def test_literal_placeholder_strings_stay_text(tiny_llama) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    for method in ("htp", "vanilla-mean", "tp-mean"):
        enc = HTPEncoder(model, method, tokenizer=tok)
        lay = enc.build_layouts(["Attack <PST> and <B-PST> here."],
                                instruction="use <PST> please")[0]
        n_ph = sum(1 for i in lay.input_ids if i in (enc.pst_id, enc.bpst_id))
        assert n_ph == lay.n_placeholders  # only the scheme's own placeholders
        text_ids = [lay.input_ids[p] for p in lay.pool_positions]
        assert enc.pst_id not in text_ids and enc.bpst_id not in text_ids


def test_truncation_never_cuts_placeholders(tiny_llama) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    enc = HTPEncoder(model, "htp", tokenizer=tok, max_length=20, min_block_tokens=0,
                     short_budget=0)
    long = " ".join(f"Sentence number {i} is here." for i in range(50))
    lay = enc.build_layouts([long])[0]
    assert lay.n_text_tokens == 20 == len(lay.pool_positions)
    assert len(lay.pst_positions) == len(lay.bpst_positions) >= 3
    assert lay.input_ids[lay.pst_positions[0]] == enc.pst_id


def test_empty_text_error_names_index(tiny_llama) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    enc = HTPEncoder(model, "htp", tokenizer=tok)
    with pytest.raises(ValueError, match="index 2"):
        enc.encode(["fine", "also fine", "   \n"])
    with pytest.raises(ValueError, match="index 1"):
        enc.encode(["fine", None])  # type: ignore[list-item]
    assert enc.encode([]).shape == (0, model.config.hidden_size)


def test_order_restored_and_normalize(tiny_llama) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    enc = HTPEncoder(model, "htp", tokenizer=tok, batch_size=2, max_tokens_per_batch=64)
    out = enc.encode(TEXTS, normalize=True)
    assert out.shape == (4, model.config.hidden_size)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-4)
    rev = enc.encode(TEXTS[::-1], normalize=True)
    np.testing.assert_allclose(out, rev[::-1], atol=1e-5)
    assert len(enc.last_stats.batches) >= 2


def test_invalid_settings(tiny_llama) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    with pytest.raises(ValueError, match="tp_start"):
        HTPEncoder(model, "htp", tokenizer=tok, tp_start=5, tp_exit=2)
    with pytest.raises(ValueError, match="output_layer"):
        HTPEncoder(model, "htp", tokenizer=tok, output_layer=-40)
    with pytest.raises(ValueError, match="padding_side"):
        HTPEncoder(model, "htp", tokenizer=tok, padding_side="middle")  # type: ignore[arg-type]
