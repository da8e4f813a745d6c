"""Pure layout rules: positions, copies, pooling masks, sink protection (no model)."""

from __future__ import annotations

import pytest

from htp_retrieval.layout import (
    TemplateIds,
    build_layout,
    sentence_block_starts,
    token_block_starts,
    token_sentence_index,
)
from htp_retrieval.methods import ALIASES, METHODS, get_method, plan_to_method

PST, BPST, SINK = 900, 901, 1


def lay(method: str, text=(10, 11, 12, 13, 14, 15), starts=(0, 2, 5), prefix=(SINK, 50, 51),
        template=None):
    return build_layout(spec=get_method(method), text_ids=list(text), block_starts=list(starts),
                        prefix_ids=list(prefix), template=template or TemplateIds(), pst_id=PST, bpst_id=BPST)


def test_htp_layout_matches_eq3_with_sink_in_front() -> None:
    L = lay("htp")
    # <sink> instr instr <B-PST>x3 <PST> 10 11 <PST> 12 13 14 <PST> 15
    assert L.input_ids == (SINK, 50, 51, BPST, BPST, BPST, PST, 10, 11, PST, 12, 13, 14, PST, 15)
    assert L.bpst_positions == (3, 4, 5)
    assert L.pst_positions == (6, 9, 13)
    # local: <PST>_m <- last token of block m; global: <B-PST>_m <- <PST>_m
    assert L.local_copies == ((6, 8), (9, 12), (13, 14))
    assert L.global_copies == ((3, 6), (4, 9), (5, 13))
    # mean pooling covers text tokens only
    assert [L.input_ids[p] for p in L.pool_positions] == [10, 11, 12, 13, 14, 15]
    assert L.last_position == 14
    assert 0 not in L.pst_positions + L.bpst_positions
    assert all(dst != 0 for dst, _ in L.local_copies + L.global_copies)


def test_tp_copies_last_token_into_single_pst() -> None:
    t = TemplateIds(before=(70,), after=(71, 72))
    L = lay("tp-prompteol-last", template=t)
    assert L.input_ids == (SINK, 50, 51, 70, PST, 10, 11, 12, 13, 14, 15, 71, 72)
    assert L.local_copies == ((4, 12),) and L.global_copies == ()
    assert L.last_position == 12


def test_tp_sentence_has_local_copies_only() -> None:
    L = lay("tp-sentence")
    assert L.bpst_positions == () and L.global_copies == ()
    assert len(L.pst_positions) == 3


def test_echo_pools_second_copy() -> None:
    t = TemplateIds(before=(70,), middle=(71,))
    L = lay("echo-mean", text=(10, 11, 12), template=t)
    assert L.input_ids == (SINK, 50, 51, 70, 10, 11, 12, 71, 10, 11, 12)
    assert L.pool_positions == (8, 9, 10)


def test_vanilla_has_no_placeholders() -> None:
    L = lay("vanilla-mean")
    assert PST not in L.input_ids and BPST not in L.input_ids
    assert L.local_copies == () and L.n_placeholders == 0


def test_placeholder_at_position_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="position 0"):
        lay("htp", prefix=())


def test_bad_block_starts_and_empty_text() -> None:
    with pytest.raises(ValueError, match="start at 0"):
        lay("htp", starts=(1, 3))
    with pytest.raises(ValueError, match="empty"):
        lay("htp", text=())


def test_sentence_index_and_k_grouping() -> None:
    text = "Hello world. The cat sat. Dogs bark!"
    # tokens: "Hello"," world","."," The"," cat"," sat","."," Dogs"," bark","!"
    offs = [(0, 5), (5, 11), (11, 12), (12, 16), (16, 20), (20, 24), (24, 25), (25, 30),
            (30, 35), (35, 36)]
    assert text[12:16] == " The"
    idx = token_sentence_index(offs, [0, 13, 26])
    assert idx == [0, 0, 0, 1, 1, 1, 1, 2, 2, 2]
    assert sentence_block_starts(idx, 1) == [0, 3, 7]
    assert sentence_block_starts(idx, 2) == [0, 7]
    assert sentence_block_starts(idx, 8) == [0]
    assert token_block_starts(10, 4) == [0, 4, 8]
    with pytest.raises(ValueError):
        sentence_block_starts(idx, 0)


def test_official_aliases_resolve() -> None:
    for alias, name in ALIASES.items():
        assert get_method(alias) is METHODS[name]
    assert plan_to_method("vanilla-mean-pool", "tp_sentence_begin").name == "htp-last"
    assert plan_to_method("vanilla-mean-pool", "tp_sentence").name == "tp-sentence"
    assert plan_to_method("tp-prompteol-last-pool", "tp").name == "tp-prompteol-last"
    # task presets (research/ANALYSIS.md, section 9)
    assert get_method("retrieval").name == "htp" and get_method("sts").name == "prompteol-last"
    with pytest.raises(ValueError, match="unknown method"):
        get_method("nope")


def test_adaptive_k_caps_blocks() -> None:
    from htp_retrieval.layout import adaptive_k, count_sentences, sentence_block_starts

    assert adaptive_k(10, 1, None) == 1
    assert adaptive_k(10, 1, 16) == 1  # short document: K stays at its minimum
    assert adaptive_k(40, 1, 16) == 3  # ceil(40 / 16)
    assert adaptive_k(40, 4, 16) == 4  # never below the minimum K
    si = [0, 0, 1, 1, 1, 2, 3, 3, 4]
    assert count_sentences(si) == 5
    k = adaptive_k(count_sentences(si), 1, 2)
    assert k == 3 and len(sentence_block_starts(si, k)) == 2
    with pytest.raises(ValueError, match="max_blocks"):
        adaptive_k(5, 1, 0)


def test_adaptive_k_density_cap() -> None:
    """``min_block_tokens = T``: at most ``max(1, tokens // T)`` blocks (section 10)."""
    from htp_retrieval.layout import adaptive_k

    # passkey-like: 50 sentences of 5 tokens in 250 tokens
    assert adaptive_k(50, 1, 32, n_tokens=250) == 2  # no cap: ceil(50 / 32)
    assert adaptive_k(50, 1, 32, n_tokens=250, min_block_tokens=64) == 17  # 3 blocks: ceil(50 / 3)
    assert adaptive_k(50, 1, None, n_tokens=250, min_block_tokens=64) == 17  # cap alone
    # SciFact-like: 9 sentences in 300 tokens stay at K = 1 under T = 32
    assert adaptive_k(9, 1, 32, n_tokens=300, min_block_tokens=32) == 1
    # the count budget still applies when it is the tighter one
    assert adaptive_k(400, 1, 32, n_tokens=8000, min_block_tokens=64) == 13  # ceil(400 / 32)
    assert adaptive_k(3, 1, 32, n_tokens=10, min_block_tokens=64) == 3  # one block at least
    with pytest.raises(ValueError, match="min_block_tokens must be"):
        adaptive_k(5, 1, 32, n_tokens=100, min_block_tokens=0)
    with pytest.raises(ValueError, match="needs n_tokens"):
        adaptive_k(5, 1, 32, min_block_tokens=16)


def test_same_block_budgets_tells_when_a_budget_binds() -> None:
    """Budgets that agree at every length up to a max length give the same K for every text."""
    from htp_retrieval.layout import adaptive_k, block_budget, same_block_budgets

    assert block_budget(512, 8, 64) == block_budget(512, 32, 64) == 8
    assert block_budget(1024, 8, 64) == 8 and block_budget(1024, 32, 64) == 16
    assert block_budget(100, None, 64) == 1 and block_budget(100, 8, None) == 8
    assert block_budget(100, None, None) is None
    assert same_block_budgets((8, 64, None), (32, 64, None), 575)  # 575 // 64 = 8
    assert not same_block_budgets((8, 64, None), (32, 64, None), 576)  # 9 blocks vs 8
    for n_tokens in range(1, 513):
        for n_sent in (1, 5, 8, 9, 17, 40, 120):
            assert adaptive_k(n_sent, 1, 8, n_tokens=n_tokens, min_block_tokens=64) == \
                adaptive_k(n_sent, 1, 32, n_tokens=n_tokens, min_block_tokens=64)
    assert adaptive_k(40, 1, 8, n_tokens=1024, min_block_tokens=64) == 5  # B = 8 binds
    assert adaptive_k(40, 1, 32, n_tokens=1024, min_block_tokens=64) == 3  # 16 blocks
    with pytest.raises(ValueError, match="max_text_tokens"):
        same_block_budgets((8, 64, None), (32, 64, None), 0)
    with pytest.raises(ValueError, match="n_tokens"):
        block_budget(0, 8, 64)


def test_long_budget_caps_blocks_past_l_tokens() -> None:
    """``long_budget = (L, B_L)``: at most B_L blocks past L text tokens (section 13)."""
    from htp_retrieval.layout import (
        adaptive_k,
        block_budget,
        parse_long_budget,
        same_block_budgets,
    )

    shipped = (32, 64, (1024, 8))
    assert block_budget(1024, *shipped) == 16  # at L the density cap still decides
    assert block_budget(1025, *shipped) == 8
    assert block_budget(8192, *shipped) == 8 and block_budget(8192, 32, 64) == 32
    assert block_budget(600, *shipped) == 9  # short documents: unchanged
    # needle at 1024 tokens keeps 16 blocks; at 2048, 8 (K = ceil(sentences / 8))
    assert adaptive_k(60, 1, 32, n_tokens=1018, min_block_tokens=64, long_budget=(1024, 8)) == 4
    assert adaptive_k(120, 1, 32, n_tokens=2040, min_block_tokens=64, long_budget=(1024, 8)) \
        == 15
    # it never binds up to L, nor when B is already at most B_L
    assert same_block_budgets(shipped, (32, 64, None), 1024)
    assert not same_block_budgets(shipped, (32, 64, None), 1025)
    assert same_block_budgets(shipped, (8, 64, None), 8192) is False  # 600 tokens: 9 vs 8
    assert same_block_budgets((8, 64, (1024, 8)), (8, 64, None), 8192)
    with pytest.raises(ValueError, match="needs n_tokens"):
        adaptive_k(5, 1, 32, long_budget=(1024, 8))
    with pytest.raises(ValueError, match="long_budget"):
        block_budget(100, 32, 64, (0, 8))
    assert parse_long_budget("1024:8") == (1024, 8)
    from htp_retrieval.layout import as_long_budget

    assert as_long_budget([1024, 8]) == (1024, 8)  # a preset's JSON list
    assert as_long_budget(0) is None and as_long_budget(None) is None
    for bad in ((1024,), (1024, 0), ("1024", 8), 5):
        with pytest.raises(ValueError, match="long_budget must be"):
            as_long_budget(bad)
    assert parse_long_budget("0") is None and parse_long_budget("none") is None
    for bad in ("1024", "1024:0", "a:b", "8:"):
        with pytest.raises(ValueError, match=repr(bad)):
            parse_long_budget(bad)
