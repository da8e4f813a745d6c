"""Centring modes of python -m research center (pure array logic)."""

from __future__ import annotations

import numpy as np
import pytest

from research.centering import MODES, centred


def test_centring_modes() -> None:
    rng = np.random.default_rng(1)
    q = rng.normal(size=(10, 4)) + 3.0
    c = rng.normal(size=(7, 4)) - 2.0
    qu = q / np.linalg.norm(q, axis=1, keepdims=True)
    cu = c / np.linalg.norm(c, axis=1, keepdims=True)
    pq, pc = centred(q, c, "plain")
    np.testing.assert_allclose(pq, qu)
    np.testing.assert_allclose(pc, cu)
    oq, oc = centred(q, c, "corpus + own queries")
    np.testing.assert_allclose(oq.mean(0), 0, atol=1e-12)
    np.testing.assert_allclose(oc.mean(0), 0, atol=1e-12)
    xq, xc = centred(q, c, "corpus + cross-fitted queries", seed=3)
    np.testing.assert_allclose(xc, oc)
    fold = np.random.default_rng(3).permutation(10) % 2
    for i in range(10):  # each query minus the mean of the other fold, never its own
        other = qu[fold != fold[i]].mean(0)
        np.testing.assert_allclose(xq[i], qu[i] - other)
        assert not np.allclose(xq[i], qu[i] - qu[fold == fold[i]].mean(0))
    cq, cc = centred(q, c, "corpus only")
    np.testing.assert_allclose(cq, qu)
    np.testing.assert_allclose(cc, oc)
    assert set(MODES) == {"plain", "corpus + cross-fitted queries", "corpus + own queries",
                          "corpus only"}
    with pytest.raises(ValueError, match="unknown centring mode"):
        centred(q, c, "whiten")
    with pytest.raises(ValueError, match="at least 2 queries"):
        centred(q[:1], c, "corpus + cross-fitted queries")


def test_train_query_centring() -> None:
    rng = np.random.default_rng(2)
    q, c, stat = rng.normal(size=(6, 3)), rng.normal(size=(5, 3)), rng.normal(size=(9, 3))
    tq, tc = centred(q, c, "corpus + train queries", stat=stat)
    su = stat / np.linalg.norm(stat, axis=1, keepdims=True)
    np.testing.assert_allclose(tq, q / np.linalg.norm(q, axis=1, keepdims=True) - su.mean(0))
    np.testing.assert_allclose(tc, centred(q, c, "corpus only")[1])
    np.testing.assert_allclose(centred(q, c, "plain", stat=stat)[0], centred(q, c, "plain")[0])
    with pytest.raises(ValueError, match="train queries"):
        centred(q, c, "corpus + train queries")



def test_paired_centred_view() -> None:
    from htp_retrieval.eval.retrieval import RetrievalResult
    from research.paired import centred_view, compare

    rows = {"a": {"NDCG@10": 10.0, "NDCG@10 centred": 30.0},
            "b": {"NDCG@10": 20.0, "NDCG@10 centred": 20.0}}
    res = RetrievalResult(dataset="d", split="test", config={}, scores={}, cost={}, counts={},
                          versions={}, created=0.0, per_query=rows)
    view = centred_view(res, "NDCG@10")
    assert view.per_query["a"]["NDCG@10"] == 30.0 and res.per_query["a"]["NDCG@10"] == 10.0
    row = compare(res, view, label="centred")
    assert (row.mean_diff, row.wins, row.ties) == (10.0, 1, 1)
    with pytest.raises(ValueError, match="--center-queries"):
        centred_view(res, "Recall@10")


def test_sts_centred_table_reads_the_stored_interval() -> None:
    from htp_retrieval.eval.retrieval import RetrievalResult
    from research.paired import sts_centred_table

    cen = {"sentence_sample": "stsb-dev", "spearman_delta_ci95": [0.5, 4.25]}
    res = RetrievalResult(dataset="stsb", split="test", config={"centering": cen},
                          scores={"Spearman": 40.0, "Spearman centred": 42.5}, cost={},
                          counts={}, versions={}, created=0.0)
    table = sts_centred_table([res], ["smol vanilla-mean"])
    assert table.splitlines()[-1] == ("| smol vanilla-mean | stsb-dev | 40.00 | 42.50 | +2.50 | "
                                      "[+0.50, +4.25] |")
    plain = RetrievalResult(dataset="stsb", split="test", config={}, scores={"Spearman": 40.0},
                            cost={}, counts={}, versions={}, created=0.0)
    with pytest.raises(ValueError, match="--center-queries"):
        sts_centred_table([plain], ["plain"])


def test_sts_paired_table_bootstraps_over_pairs() -> None:
    from scipy.stats import spearmanr

    from htp_retrieval.eval.retrieval import RetrievalResult
    from research.paired import sts_paired_table

    rng = np.random.default_rng(0)
    gold = rng.uniform(0, 5, 400)
    noisy = gold + rng.normal(0, 3.0, 400)  # the baseline: weakly related to gold
    clean = gold + rng.normal(0, 0.5, 400)  # the variant: strongly related

    def sts(cos: np.ndarray, g: np.ndarray = gold) -> RetrievalResult:
        return RetrievalResult(dataset="stsb", split="test", config={},
                               scores={"Spearman": 100 * spearmanr(cos, g).statistic}, cost={},
                               counts={}, versions={}, created=0.0,
                               per_pair={"cosine": cos.tolist(), "gold": g.tolist()})

    base, better = sts(noisy), sts(clean)
    lines = sts_paired_table([base, better], ["base", "better"]).splitlines()
    assert lines[0] == f"baseline: base, Spearman {base.scores['Spearman']:.2f} over 400 pairs"
    cells = [c.strip() for c in lines[-1].split("|")[1:-1]]
    assert cells[0] == "better" and cells[1] == f"{better.scores['Spearman']:.2f}"
    lo, hi = (float(x) for x in cells[3].strip("[]").split(","))
    diff = float(cells[2])
    assert diff > 0 and 0 < lo < diff < hi and cells[4] == "100.0%"
    # the same cosines: a zero difference; other pairs or no per-pair rows: named errors
    assert "| base2 | " in sts_paired_table([base, sts(noisy)], ["base", "base2"])
    with pytest.raises(ValueError, match="other: scored on other sentence pairs"):
        sts_paired_table([base, sts(clean, gold[::-1].copy())], ["base", "other"])
    old = RetrievalResult(dataset="stsb", split="test", config={}, scores={"Spearman": 1.0},
                          cost={}, counts={}, versions={}, created=0.0)
    with pytest.raises(ValueError, match="old: no per-pair cosines.*--overwrite"):
        sts_paired_table([base, old], ["base", "old"])
    with pytest.raises(ValueError, match="no per-pair 'cosine centred'.*--center-queries"):
        sts_paired_table([base, better], ["base", "better"], metric="Spearman centred")
    retrieval = RetrievalResult(dataset="scifact", split="test", config={},
                                scores={"NDCG@10": 50.0}, cost={}, counts={}, versions={},
                                created=0.0)
    with pytest.raises(ValueError, match="ndcg: not an STS result"):
        sts_paired_table([base, retrieval], ["base", "ndcg"])
