"""The encode pipeline: batch n+1 prepared in a thread while batch n runs."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from htp_retrieval.encoder import HTPEncoder
from htp_retrieval.pipeline import Prefetcher

TEXTS = [
    "Graphene is a single layer of carbon. It conducts heat well.",
    "Short one.",
    "A much longer text about proteins. They fold. Misfolding causes disease! "
    "Chaperones help? Yes, they do. And more sentences follow here.",
    "Cats sleep a lot. Dogs too.",
    "The mitochondrion is the powerhouse of the cell.",
    "One. Two. Three. Four. Five. Six. Seven. Eight.",
    "No punctuation here at all",
    "Vaccines train the immune system. Antibodies remain for years.",
    "x",
    "Quantum dots emit light. Their colour depends on size. Small dots are blue.",
]


@pytest.mark.parametrize("method", ["htp", "vanilla-mean", "tp-mean", "prompteol-last"])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_pipeline_identical_and_in_order(tiny, method: str, padding_side: str) -> None:  # noqa: ANN001
    model, tok = tiny
    enc = HTPEncoder(model, method, tokenizer=tok, padding_side=padding_side,  # type: ignore[arg-type]
                     batch_size=3, max_tokens_per_batch=64)
    assert enc.pipeline is False  # CPU default
    seq = enc.encode(TEXTS, pipeline=False)
    st_seq = enc.last_stats
    pipe = enc.encode(TEXTS, pipeline=True)
    st_pipe = enc.last_stats
    assert np.array_equal(seq, pipe)
    assert st_pipe.pipelined and not st_seq.pipelined
    assert st_pipe.batches == st_seq.batches and len(st_pipe.batches) > 2
    assert len(st_pipe.timeline) == len(st_pipe.prepare_timeline) == len(st_pipe.batches)
    assert st_pipe.text_tokens == st_seq.text_tokens > 0
    # in input order: each text alone gives (nearly) its row
    for i in (0, 4, 8):
        one = enc.encode([TEXTS[i]], pipeline=True)
        np.testing.assert_allclose(one[0], pipe[i], rtol=1e-4, atol=1e-5)


def test_prepare_window(tiny_llama) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    enc = HTPEncoder(model, "htp", tokenizer=tok, batch_size=2)
    ref = enc.encode(TEXTS)
    same = enc.encode(TEXTS, pipeline=True, prepare_window=len(TEXTS))
    assert np.array_equal(ref, same)
    win = enc.encode(TEXTS, pipeline=True, prepare_window=3)
    st = enc.last_stats
    np.testing.assert_allclose(win, ref, rtol=1e-4, atol=1e-5)  # other batch shapes
    assert st.n_texts == len(TEXTS) and sum(r for r, _ in st.batches) == len(TEXTS)
    with pytest.raises(ValueError, match="prepare_window"):
        enc.encode(TEXTS, prepare_window=0)


def test_worker_error_propagates(tiny_llama) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    enc = HTPEncoder(model, "htp", tokenizer=tok, batch_size=2)
    enc.encode(TEXTS[:2])  # create the segmenter
    seg = enc.segmenter
    calls = {"n": 0}
    real = seg.sentence_starts

    class Boom(RuntimeError):
        pass

    def flaky(texts):  # noqa: ANN001, ANN202
        calls["n"] += 1
        if calls["n"] == 2:
            raise Boom("segmenter failed in the worker")
        return real(texts)

    seg.sentence_starts = flaky  # type: ignore[method-assign]
    before = threading.active_count()
    try:
        with pytest.raises(Boom, match="worker"):
            enc.encode(TEXTS, pipeline=True, prepare_window=4)
    finally:
        del seg.sentence_starts
    time.sleep(0.2)
    assert threading.active_count() <= before  # the prefetch thread is gone
    # the encoder still works afterwards
    assert enc.encode(TEXTS[:3], pipeline=True).shape == (3, model.config.hidden_size)


def test_bad_text_fails_before_thread(tiny_llama) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    enc = HTPEncoder(model, "htp", tokenizer=tok)
    with pytest.raises(ValueError, match="index 2"):
        enc.encode(["a.", "b.", "  "], pipeline=True)


def test_prefetcher_order_error_and_close() -> None:
    assert list(Prefetcher(iter(range(50)), depth=2)) == list(range(50))

    def bad() -> Iterator[int]:
        yield 1
        raise KeyError("boom")

    it = Prefetcher(bad())
    assert next(it) == 1
    with pytest.raises(KeyError):
        next(it)
    with pytest.raises(StopIteration):
        next(it)

    produced: list[int] = []

    def endless() -> Iterator[int]:
        i = 0
        while True:
            produced.append(i)
            yield i
            i += 1

    it = Prefetcher(endless())
    assert next(it) == 0
    it.close()
    n = len(produced)
    time.sleep(0.2)
    assert len(produced) <= n + 1  # stopped
    with pytest.raises(ValueError):
        Prefetcher(iter([]), depth=0)


def test_build_layouts_restores_the_garbage_collector(tiny_llama) -> None:  # noqa: ANN001
    import gc

    from htp_retrieval.pipeline import _gc_paused

    model, tok = tiny_llama
    enc = HTPEncoder(model, "htp", tokenizer=tok)
    was = gc.isenabled()
    try:
        gc.enable()
        enc.build_layouts(TEXTS)
        assert gc.isenabled()
        with pytest.raises(ValueError):
            enc.build_layouts(["ok.", ""])
        assert gc.isenabled()
        with _gc_paused():
            assert not gc.isenabled()
            with _gc_paused():  # nested (the prefetch thread and a caller)
                assert not gc.isenabled()
            assert not gc.isenabled()
        assert gc.isenabled()
        gc.disable()
        enc.build_layouts(TEXTS)
        assert not gc.isenabled()  # a caller's choice is kept
    finally:
        (gc.enable if was else gc.disable)()


def test_auto_windows_cover_texts_in_order(tiny_llama) -> None:  # noqa: ANN001
    from htp_retrieval.pipeline import AUTO_WINDOW_BATCHES, CHARS_PER_TOKEN, auto_windows

    texts = ["a" * 100] * 50 + ["b" * 100_000] + ["c" * 10] * 3
    wins = auto_windows(texts, max_tokens_per_batch=256, max_length=1024)
    assert wins[0][0] == 0 and wins[-1][1] == len(texts)
    assert all(a < b for a, b in wins) and all(w[1] == v[0] for w, v in zip(wins, wins[1:]))
    budget = AUTO_WINDOW_BATCHES * 256 * CHARS_PER_TOKEN  # 4096 characters
    assert wins[0] == (0, budget // 100)  # 40 texts of 100 characters fill the first
    assert (50, 51) in wins  # a text over the budget (cut to its cap) gets its own window
    assert auto_windows([], 256, 128) == []
    model, tok = tiny_llama
    enc = HTPEncoder(model, "htp", tokenizer=tok, batch_size=2, max_tokens_per_batch=64)
    ref = enc.encode(TEXTS)
    auto = enc.encode(TEXTS, pipeline=True, prepare_window="auto")
    np.testing.assert_allclose(auto, ref, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="prepare_window"):
        enc.encode(TEXTS, prepare_window="all")



def test_window_error_names_index_in_call(tiny_llama) -> None:  # noqa: ANN001
    """With windows, an error names the text's index in the whole call, not in its window."""
    model, tok = tiny_llama
    enc = HTPEncoder(model, "htp", tokenizer=tok, max_length=64, overflow="error")
    texts = TEXTS * 3 + ["A long text. " * 20]  # index 30: the fourth window of 8
    for pipeline in (False, True):
        with pytest.raises(ValueError, match="text at index 30 has"):
            enc.encode(texts, prepare_window=8, pipeline=pipeline)


def test_truncation_warnings_off(tiny_llama, caplog) -> None:  # noqa: ANN001
    """The context drops the truncation warning only, and only inside the block."""
    import logging

    from htp_retrieval.encoder import logger, truncation_warnings_off

    model, tok = tiny_llama
    enc = HTPEncoder(model, "vanilla-mean", tokenizer=tok, max_length=8, overflow="truncate")
    long = "A long text about many things. " * 4
    with caplog.at_level(logging.WARNING, logger="htp_retrieval.encoder"):
        with truncation_warnings_off():
            enc.encode([long])
            logger.warning("another warning")
        assert "truncated" not in caplog.text and "another warning" in caplog.text
        enc.encode([long])
        assert "truncated 1 of 1 texts to max_length=8 tokens" in caplog.text
