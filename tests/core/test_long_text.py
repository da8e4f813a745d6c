"""Long texts: overlapping windows, truncation warnings, late chunking (tiny random models)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from htp_retrieval import HTPEncoder
from htp_retrieval.chunking import Chunk, chunk_token_ranges, split_chunks
from htp_retrieval.long_text import (
    WINDOW_MARGIN,
    block_starts_for_chunks,
    default_max_length,
    late_windows,
    overlapping_windows,
)

LONG = " ".join(f"Sentence number {i} talks about topic {i % 7} in some detail." for i in range(60))


def _offsets(n: int) -> np.ndarray:
    return np.array([(3 * i, 3 * i + 2) for i in range(n)])


def test_overlapping_windows_cover_every_token_within_budget() -> None:
    offs = _offsets(1000)
    wins = overlapping_windows(offs, 128)
    assert wins[0].start == 0 and wins[-1].end == offs[-1, 1]
    assert all(w.n_tokens <= 128 - WINDOW_MARGIN for w in wins)
    for a, b in zip(wins, wins[1:]):
        assert b.start < a.end  # consecutive windows overlap
    assert overlapping_windows(_offsets(100), 128) == [overlapping_windows(_offsets(100), 128)[0]]
    assert len(overlapping_windows(_offsets(100), 128)) == 1
    with pytest.raises(ValueError, match="too small"):
        overlapping_windows(offs, 10)


def test_default_max_length_is_the_window_capped() -> None:
    assert default_max_length(8192) == 8064
    assert default_max_length(32768) == 8064
    assert default_max_length(2048) == 1920
    assert default_max_length(None) == 8064


def test_late_windows_hold_whole_chunks_in_order() -> None:
    offs = _offsets(1000)
    chunks = [Chunk(i, 3 * 50 * i, 3 * 50 * (i + 1) - 1) for i in range(20)]
    wins = late_windows(offs, chunks, 200)
    assert [c for w in wins for c in w.chunks] == list(range(20))
    ranges = chunk_token_ranges(offs, chunks)
    for w in wins:
        first, last = ranges[w.chunks[0]][0], ranges[w.chunks[-1]][1]
        assert last - first <= 200 - WINDOW_MARGIN
    assert block_starts_for_chunks([(0, 5), (5, 9), (9, 12)], 12) == [0, 5, 9]
    assert block_starts_for_chunks([(2, 5), (4, 9)], 12) == [0, 2, 4]


def test_overflow_error_and_truncate_name_the_text(tiny_llama, caplog) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    err = HTPEncoder(model, "vanilla-mean", tokenizer=tok, max_length=64, overflow="error")
    with pytest.raises(ValueError, match="index 1 has .* tokens, more than max_length=64"):
        err.encode(["short.", LONG])
    cut = HTPEncoder(model, "vanilla-mean", tokenizer=tok, max_length=64, overflow="truncate")
    with caplog.at_level(logging.WARNING, logger="htp_retrieval.encoder"):
        cut.encode(["short.", LONG])
    n = len(tok(LONG, add_special_tokens=False).input_ids)
    assert cut.last_stats.truncated == [(1, n)]
    assert f"text 1 ({n:,} tokens, {n - 64:,} dropped)" in caplog.text
    with pytest.raises(ValueError, match="overflow must be one of"):
        HTPEncoder(model, "htp", tokenizer=tok, overflow="drop")  # type: ignore[arg-type]


@pytest.mark.parametrize("method", ["vanilla-mean", "htp"])
def test_window_default_is_the_token_weighted_mean_of_windows(tiny_llama, method) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    enc = HTPEncoder(model, method, tokenizer=tok, max_length=64)
    assert enc.overflow == "window"
    got = enc.encode(["short text.", LONG])
    assert enc.last_stats.windowed == 1 and enc.last_stats.n_windows > 1
    assert not enc.last_stats.truncated
    _, offs = enc._tokenize([LONG])
    wins = overlapping_windows(np.asarray(offs[0]), 64)
    ref = HTPEncoder(model, method, tokenizer=tok, max_length=64, overflow="error")
    parts = ref.encode([LONG[w.start : w.end] for w in wins])
    weights = np.array([w.n_tokens for w in wins], dtype=np.float64)
    want = (parts * weights[:, None]).sum(0) / weights.sum()
    np.testing.assert_allclose(got[1], want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[0], ref.encode(["short text."])[0], rtol=1e-5, atol=1e-6)
    first = HTPEncoder(model, method, tokenizer=tok, max_length=64, overflow="truncate")
    assert not np.allclose(got[1], first.encode([LONG])[0], atol=1e-3)


def test_late_chunks_pool_the_document_pass(tiny_llama) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    enc = HTPEncoder(model, "vanilla-mean", tokenizer=tok, max_length=2048)
    chunks = split_chunks(LONG, tok, chunk_tokens=48)
    assert len(chunks) > 5
    got = enc.encode_late_chunks([LONG], [chunks])[0]
    # reference: one forward over <s> + the document, mean of each chunk's tokens
    _, offs = enc._tokenize([LONG])
    ranges = chunk_token_ranges(np.asarray(offs[0]), chunks)
    ids = torch.tensor([[tok.bos_token_id, *tok(LONG, add_special_tokens=False).input_ids]])
    with torch.no_grad():
        hs = model(input_ids=ids, output_hidden_states=True).hidden_states[enc.exit_layer][0]
    want = np.stack([hs[1 + a : 1 + b].float().mean(0).numpy() for a, b in ranges])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # windows of whole chunks: every chunk still gets its own vector
    small = enc.encode_late_chunks([LONG], [chunks], window_tokens=128)[0]
    assert enc.last_stats.n_windows > 1
    np.testing.assert_allclose(small[0], got[0], rtol=1e-4, atol=1e-5)  # same left context
    assert not np.allclose(small[-1], got[-1], atol=1e-4)  # less left context


def test_late_chunks_htp_one_block_per_chunk(tiny_llama) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    enc = HTPEncoder(model, "htp", tokenizer=tok, max_length=2048)
    chunks = split_chunks(LONG, tok, chunk_tokens=64)
    lay = enc.build_layouts_for_chunks([LONG], [chunks])[0]
    assert len(lay.pst_positions) == len(lay.bpst_positions) == len(chunks)
    vecs = enc.encode_late_chunks([LONG], [chunks])[0]
    assert vecs.shape == (len(chunks), model.config.hidden_size)
    assert np.isfinite(vecs).all()
    van = HTPEncoder(model, "vanilla-mean", tokenizer=tok, max_length=2048)
    assert not np.allclose(vecs, van.encode_late_chunks([LONG], [chunks])[0], atol=1e-4)


def test_late_chunks_errors(tiny_llama) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    last = HTPEncoder(model, "vanilla-last", tokenizer=tok)
    with pytest.raises(ValueError, match="mean-pooled method"):
        last.encode_late_chunks([LONG], [[Chunk(0, 0, 10)]])
    enc = HTPEncoder(model, "vanilla-mean", tokenizer=tok, max_length=256)
    with pytest.raises(ValueError, match="index 0 has no chunks"):
        enc.encode_late_chunks([LONG], [[]])
    with pytest.raises(ValueError, match="outside its"):
        enc.encode_late_chunks(["abc def"], [[Chunk(0, 0, 99)]])
    with pytest.raises(ValueError, match="window_tokens"):
        enc.encode_late_chunks([LONG], [[Chunk(0, 0, 10)]], window_tokens=1000)


def test_split_chunks_spans_round_trip_and_cover(smol_tokenizer_path) -> None:  # noqa: ANN001
    import json
    from pathlib import Path

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smol_tokenizer_path)
    path = Path(__file__).resolve().parents[3] / "shared/data/spans/qmsum/corpus.jsonl"
    if not path.exists():
        pytest.skip("../shared/data is not beside this checkout")
    with open(path) as f:
        text = json.loads(f.readline())["text"]
    chunks = split_chunks(text, tok, chunk_tokens=256, chunk_overlap=32)
    covered = np.zeros(len(text), dtype=bool)
    for c in chunks:
        piece = c.text(text)
        assert piece == piece.strip() and piece
        n = len(tok(piece, add_special_tokens=False).input_ids)
        assert n <= 256 + 4
        covered[c.start : c.end] = True
    blank = np.array([ch.isspace() for ch in text])
    assert (covered | blank).all()  # every non-whitespace character is in a chunk
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert all(a.start < b.start for a, b in zip(chunks, chunks[1:]))
    # a turn (line) that fits is never split
    lines = {c.text(text) for c in chunks}
    assert any("\n" in t for t in lines)
    with pytest.raises(ValueError, match="overlap"):
        split_chunks(text, tok, chunk_tokens=64, chunk_overlap=40)
