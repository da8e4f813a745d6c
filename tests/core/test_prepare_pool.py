"""Preparation in worker processes (``prepare_workers``): same vectors, input order, errors
and truncations named by input index, one pool per encoder and config."""

from __future__ import annotations

import numpy as np
import pytest

from htp_retrieval.encoder import HTPEncoder
from htp_retrieval.prepare_pool import auto_workers, cut_windows, length_windows
from tests.core.test_pipeline import TEXTS as PIPELINE_TEXTS

TEXTS = PIPELINE_TEXTS * 3


def test_length_windows_cover_every_text_longest_first() -> None:
    texts = ["a" * n for n in (5, 300, 40, 300, 1, 2000, 80)]
    windows = length_windows(texts, max_tokens_per_batch=64, max_length=100)
    flat = [i for w in windows for i in w]
    assert sorted(flat) == list(range(len(texts)))
    # longest first by characters (capped at max_length x 8 = 800), ties in input order
    assert flat == [5, 1, 3, 6, 2, 0, 4]
    budget = 64 * 4 // 4  # characters per window
    for w in windows:
        assert len(w) == 1 or sum(min(len(texts[i]), 800) for i in w) <= budget
    assert length_windows([], 64, 100) == []
    assert 1 <= auto_workers() <= 8


def test_cut_windows_limits_characters_and_items_each_optional() -> None:
    sizes = [50, 40, 30, 20, 10, 200]
    order = [5, 0, 1, 2, 3, 4]
    # a text over the character budget is a group of its own; groups keep the order
    assert cut_windows(order, sizes, 60) == [[5], [0], [1], [2, 3, 4]]
    assert cut_windows(order, sizes, None, max_items=4) == [[5, 0, 1, 2], [3, 4]]
    assert cut_windows(order, sizes, 100, max_items=2) == [[5], [0, 1], [2, 3], [4]]
    assert cut_windows(order, sizes, None) == [order]
    assert cut_windows([], sizes, None) == []


@pytest.mark.parametrize("method", ["htp", "vanilla-mean"])
def test_workers_give_the_same_vectors_in_input_order(tiny_llama, method: str) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    ref_enc = HTPEncoder(model, method, tokenizer=tok, batch_size=4, max_tokens_per_batch=96)
    ref = ref_enc.encode(TEXTS)
    with HTPEncoder(model, method, tokenizer=tok, batch_size=4, max_tokens_per_batch=96,
                    prepare_workers=2) as enc:
        out = enc.encode(TEXTS)
        st = enc.last_stats
        pool = enc._pool
        assert pool is not None and pool.workers == 2
        # other batch shapes than one sorted call: equal up to rounding
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)
        assert st.text_tokens == ref_enc.last_stats.text_tokens
        assert sum(r for r, _ in st.batches) == len(TEXTS)
        assert len(st.timeline) == len(st.prepare_timeline) == len(st.batches)
        if method == "htp":
            assert st.segment_seconds > 0  # the workers' step times come back
        again = enc.encode(TEXTS[:7])
        assert enc._pool is pool  # started once, reused
        np.testing.assert_allclose(again, ref[:7], rtol=1e-4, atol=1e-5)
        one = enc.encode([TEXTS[2]])  # one text: laid out here, no window to share
        np.testing.assert_allclose(one[0], ref[2], rtol=1e-4, atol=1e-5)
        if method == "htp":  # (the restart does not depend on the method: checked once)
            enc.max_length = 16  # the workers hold the old config: a new pool
            cut = enc.encode(TEXTS[:5])
            assert enc._pool is not pool and enc.last_stats.windowed == 1
    assert enc._pool is None  # closed on exit
    if method == "htp":
        ref_enc.max_length = 16
        np.testing.assert_allclose(cut, ref_enc.encode(TEXTS[:5]), rtol=1e-4, atol=1e-5)


def test_workers_name_errors_and_truncations_by_input_index(tiny_llama) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    long = "A sentence that goes on. " * 40
    texts = ["Short one.", "Cats sleep.", long, "Dogs too."]
    enc = HTPEncoder(model, "htp", tokenizer=tok, max_length=32, overflow="error",
                     prepare_workers=1)
    try:
        with pytest.raises(ValueError, match=r"text at index 2 has \d+ tokens"):
            enc.encode(texts)
        enc.config = enc.config.replace(overflow="truncate")
        enc.encode(texts)
        assert [i for i, _ in enc.last_stats.truncated] == [2]
    finally:
        enc.close()


def test_prepare_workers_setting_checked(tiny_llama) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    for bad in (-1, 1.5, "many", True):
        with pytest.raises(ValueError, match="prepare_workers"):
            HTPEncoder(model, "htp", tokenizer=tok, prepare_workers=bad)
    assert HTPEncoder(model, "htp", tokenizer=tok).prepare_workers == 0
    assert HTPEncoder(model, "htp", tokenizer=tok, prepare_workers="auto").prepare_workers == "auto"


def test_unpicklable_segmenter_is_refused_with_the_fix(tiny_llama) -> None:  # noqa: ANN001
    model, tok = tiny_llama

    class LocalSegmenter:  # a local class cannot be pickled into a worker
        name = "regex"  # the config records a known name

        def sentence_starts(self, texts):  # noqa: ANN001, ANN201
            return [[0] for _ in texts]

    enc = HTPEncoder(model, "htp", tokenizer=tok, segmenter=LocalSegmenter(), prepare_workers=1)
    with pytest.raises(ValueError, match="cannot be sent to a worker process.*prepare_workers=0"):
        enc.encode(TEXTS[:3])
    assert enc._pool is None
    one = HTPEncoder(model, "htp", tokenizer=tok, segmenter=LocalSegmenter())
    assert one.encode(TEXTS[:3]).shape[0] == 3  # in-process layout still works
