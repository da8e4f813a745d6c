"""The vectorized preparation gives exactly the layouts of the original code.

The reference below is the implementation before vectorization, copied verbatim: the full
encoding sliced to ``max_length``, per-token ``bisect`` sentence assignment, Python loops
for block starts, and spaCy's ``nlp.pipe`` with the ``sentencizer`` pipe. It is compared
with :meth:`HTPEncoder.build_layouts` on real SciFact documents (512 tokens) and on long
concatenated texts (8192 tokens), for every method family.
"""

from __future__ import annotations

import json
import os
from bisect import bisect_right
from collections.abc import Sequence
from functools import lru_cache

import pytest

from htp_retrieval.encoder import HTPEncoder
from htp_retrieval.layout import (
    Layout,
    adaptive_k,
    auto_tokens_per_block,
    build_layout,
    count_sentences,
    sentence_block_starts,
    token_block_starts,
    token_sentence_index,
)
from htp_retrieval.segmentation import SpacySegmenter, _starts_from_spans

SCIFACT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "beir", "scifact"))

needs_scifact = pytest.mark.skipif(not os.path.isdir(SCIFACT), reason="../shared/data missing")

EDGE_TEXTS = [
    "!!! Hello there", "Hello.\n", ". . . and then", "a.b. c! ?? d", "e.g. this. U.S. is big",
    "Mr. Smith went.  \n\n  Then ! ", "\u3002x\u3002y", "No punctuation at all",
    "Ends with marks?!", "(Quoted.) Next one. \"And this.\" Done", "  leading space. x",
]


def _ref_token_sentence_index(token_offsets: Sequence[tuple[int, int]],
                              sentence_starts: Sequence[int]) -> list[int]:
    out: list[int] = []
    prev = 0
    for start, end in token_offsets:
        last_char = max(start, end - 1)
        idx = max(bisect_right(sentence_starts, last_char) - 1, 0)
        idx = max(idx, prev)
        out.append(idx)
        prev = idx
    if out:
        base = out[0]
        out = [i - base for i in out]
    return out


def _ref_sentence_block_starts(sentence_index: Sequence[int], k: int) -> list[int]:
    starts: list[int] = []
    prev_sentence = None
    ordinal = -1
    for i, s in enumerate(sentence_index):
        if s != prev_sentence:
            ordinal += 1
            prev_sentence = s
            if ordinal % k == 0:
                starts.append(i)
    return starts


def _ref_count_sentences(sentence_index: Sequence[int]) -> int:
    return sum(1 for i, s in enumerate(sentence_index) if i == 0 or s != sentence_index[i - 1])


@lru_cache(maxsize=1)
def _ref_nlp():  # noqa: ANN202 - a stock spaCy pipeline, independent of the package's
    import spacy

    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    return nlp


def _ref_sentencizer(texts: Sequence[str]) -> list[list[int]]:
    nlp = _ref_nlp()
    return [_starts_from_spans(t, [(s.start_char, s.end_char) for s in doc.sents])
            for t, doc in zip(texts, nlp.pipe(texts, batch_size=64))]


def _ref_layouts(enc: HTPEncoder, texts: Sequence[str]) -> list[Layout]:
    """``build_layouts`` as it was before vectorization."""
    e = enc.tokenizer(list(texts), add_special_tokens=False, return_offsets_mapping=True,
                      split_special_tokens=True)
    ids_all = [ids[: enc.max_length] for ids in e["input_ids"]]
    offs_all = [offs[: enc.max_length] for offs in e["offset_mapping"]]
    spec = enc.spec
    auto_n = spec.blocks == "tokens" and spec.tokens_per_block == "auto"
    if spec.placeholders in ("local", "hierarchical") and (spec.blocks == "sentence" or auto_n):
        kept = [t[: offs[-1][1]] for t, offs in zip(texts, offs_all)]
        starts_all = _ref_sentencizer(kept)
        sent_idx = [_ref_token_sentence_index(o, s) for o, s in zip(offs_all, starts_all)]
        blocks = [
            _ref_sentence_block_starts(
                si, adaptive_k(_ref_count_sentences(si), spec.sentences_per_block,
                               enc.max_blocks, n_tokens=len(ids),
                               min_block_tokens=enc.min_block_tokens,
                               long_budget=enc.long_budget, short_budget=enc.short_budget))
            for si, ids in zip(sent_idx, ids_all)]
        if auto_n:
            blocks = [token_block_starts(len(ids), auto_tokens_per_block(len(ids), len(b)))
                      for ids, b in zip(ids_all, blocks)]
    elif spec.placeholders in ("local", "hierarchical"):
        blocks = [token_block_starts(len(ids), spec.tokens_per_block) for ids in ids_all]
    else:
        blocks = [[0] for _ in ids_all]
    prefix = enc.prefix_ids(None)
    return [build_layout(spec=spec, text_ids=ids, block_starts=b, prefix_ids=prefix,
                         template=enc.template, pst_id=enc.pst_id, bpst_id=enc.bpst_id)
            for ids, b in zip(ids_all, blocks)]


def _scifact(limit: int) -> list[str]:
    out = []
    with open(os.path.join(SCIFACT, "corpus.jsonl")) as f:
        for line in f:
            d = json.loads(line)
            out.append(f"{d.get('title', '')} {d['text']}".strip())
            if len(out) >= limit:
                break
    return out


def _long_texts(docs: Sequence[str], n: int, chars: int) -> list[str]:
    out, cur, i = [], "", 0
    while len(out) < n:
        cur += docs[i % len(docs)] + "\n\n"
        i += 1
        if len(cur) >= chars:
            out.append(cur)
            cur = ""
    return out


@needs_scifact
@pytest.mark.parametrize("method", ["htp", "htp-last", "tp-sentence", "htp-fixed-tokens",
                                    "tp-mean", "vanilla-mean", "echo-mean"])
def test_layouts_identical_to_reference(tiny_llama, method: str) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    docs = _scifact(400)
    enc = HTPEncoder(model, method, tokenizer=tok, max_length=512)
    texts = docs + EDGE_TEXTS
    assert enc.build_layouts(texts) == _ref_layouts(enc, texts)
    enc.max_length = 8192
    long = _long_texts(docs, 6, 45_000)  # about 9-10k tokens each, cut to 8192
    assert enc.build_layouts(long) == _ref_layouts(enc, long)
    enc.max_length = 64  # most texts cut mid-sentence
    assert enc.build_layouts(texts) == _ref_layouts(enc, texts)


def test_auto_tokens_per_block_identical(tiny_llama) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    enc = HTPEncoder(model, "htp-fixed-tokens", tokenizer=tok, tokens_per_block="auto")
    texts = EDGE_TEXTS + ["One. Two. Three. " * 40]
    assert enc.build_layouts(texts) == _ref_layouts(enc, texts)


@needs_scifact
def test_sentencizer_identical_to_spacy_pipe() -> None:
    docs = _scifact(1000)
    texts = docs + EDGE_TEXTS + [d[:37] for d in docs[:200]] + ["   ", "\n\n", "."]
    assert SpacySegmenter("sentencizer").sentence_starts(texts) == _ref_sentencizer(texts)


def test_layout_helpers_match_reference() -> None:
    import random

    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(0, 60)
        offs, pos = [], 0
        for _ in range(n):
            a = pos + rng.randint(0, 2)
            b = a + rng.randint(0, 4)
            offs.append((a, b))
            pos = b if rng.random() < 0.9 else max(0, b - 3)  # some odd, overlapping offsets
        starts = sorted({0, *(rng.randint(0, pos + 3) for _ in range(rng.randint(0, 8)))})
        si = token_sentence_index(offs, starts)
        assert si == _ref_token_sentence_index(offs, starts)
        assert count_sentences(si) == _ref_count_sentences(si)
        for k in (1, 2, 3):
            assert sentence_block_starts(si, k) == _ref_sentence_block_starts(si, k)


@needs_scifact
def test_layouts_identical_with_parallel_tokenizer(tiny_llama, monkeypatch) -> None:  # noqa: ANN001
    """The Rust tokenizer's batch encode on every core (what the CLI turns on) gives the
    same layouts as on one thread: the ids and offsets do not depend on the threads."""
    model, tok = tiny_llama
    docs = _scifact(300)
    enc = HTPEncoder(model, "htp", tokenizer=tok, max_length=512)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    one = enc.build_layouts(docs)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    assert enc.build_layouts(docs) == one
