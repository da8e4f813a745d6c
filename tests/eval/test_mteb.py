"""MTEB 2.x compatibility: real mteb runs on local tasks (no hub) with a tiny decoder."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

pytest.importorskip("mteb")

from htp_retrieval.encoder import HTPEncoder  # noqa: E402
from htp_retrieval.eval.data import load_beir, subsample  # noqa: E402
from htp_retrieval.eval.retrieval import run_retrieval  # noqa: E402

SHARED = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data"))
SCIFACT = os.path.join(SHARED, "beir", "scifact")
STSB = os.path.join(SHARED, "sts", "stsb")
N_QUERIES, N_DOCS = 8, 30


@pytest.fixture(autouse=True, scope="module")
def _one_thread():  # noqa: ANN202
    """Tiny models run fastest on one thread (and do not fight a busy machine for cores)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def encoder(tiny_llama):  # noqa: ANN001, ANN201
    model, tok = tiny_llama
    return HTPEncoder(model, "htp", tokenizer=tok, dtype="float32", max_length=128)


def test_protocol_and_instructions(encoder) -> None:  # noqa: ANN001
    import mteb
    from mteb.models import EncoderProtocol
    from mteb.types import PromptType

    from htp_retrieval.eval.mteb_model import HTPMtebEncoder, table6_key, task_instruction
    from htp_retrieval.methods import TASK_INSTRUCTIONS

    model = HTPMtebEncoder(encoder=encoder)
    assert isinstance(model, EncoderProtocol)
    meta = model.mteb_model_meta
    assert meta.experiment_kwargs["method"] == "htp" and meta.embed_dim == 64
    assert meta.similarity_fn_name.value == "cosine"

    scifact = mteb.get_task("SciFact").metadata  # metadata only: no download
    assert task_instruction(scifact, PromptType.query) == TASK_INSTRUCTIONS["scifact"]
    assert task_instruction(scifact, PromptType.document) is None
    assert task_instruction(mteb.get_task("STSBenchmark").metadata, None) is None
    assert table6_key("LEMBQMSumRetrieval") == "qmsum"
    assert table6_key("LEMBNeedleRetrieval") == "needle"
    assert table6_key("TRECCOVID") == "trec-covid"
    # unknown task: the metadata's query prompt, then its description
    nq = mteb.get_task("NQ").metadata
    assert table6_key("NQ") is None
    assert task_instruction(nq, PromptType.query) == (
        nq.prompt["query"] if isinstance(nq.prompt, dict) else nq.prompt or nq.description)
    assert model.instruction_for(scifact, PromptType.query) == TASK_INSTRUCTIONS["scifact"]
    over = HTPMtebEncoder(encoder=encoder, instructions={"SciFact": "Find evidence"})
    assert over.instruction_for(scifact, PromptType.query) == "Find evidence"


def test_empty_text_named(encoder) -> None:  # noqa: ANN001
    import mteb
    from mteb.types import PromptType
    from torch.utils.data import DataLoader

    from htp_retrieval.eval.mteb_model import HTPMtebEncoder

    meta = mteb.get_task("SciFact").metadata
    doc = PromptType.document
    batches = DataLoader([{"text": "A real document."}, {"text": "  "}, {"text": "Another."}],
                         batch_size=2)
    with pytest.raises(ValueError, match="index 1"):
        HTPMtebEncoder(encoder=encoder).encode(batches, task_metadata=meta, hf_split="test",
                                               hf_subset="default", prompt_type=doc)
    emb = HTPMtebEncoder(encoder=encoder, on_empty="zeros").encode(
        batches, task_metadata=meta, hf_split="test", hf_subset="default", prompt_type=doc)
    assert emb.shape == (3, 64)
    assert not emb[1].any() and emb[0].any() and emb[2].any()
    # the other texts are embedded exactly as on their own
    np.testing.assert_allclose(emb[[0, 2]], encoder.encode(["A real document.", "Another."]),
                               atol=1e-5)


@pytest.mark.skipif(not os.path.isdir(SCIFACT), reason="shared SciFact data not present")
def test_mteb_retrieval_matches_own_harness(encoder, tmp_path) -> None:  # noqa: ANN001
    import mteb

    from htp_retrieval.eval.mteb_model import HTPMtebEncoder
    from htp_retrieval.eval.mteb_tasks import beir_task

    task = beir_task(SCIFACT, max_queries=N_QUERIES, max_docs=N_DOCS, seed=0)
    assert task.metadata.name == f"scifact-local-q{N_QUERIES}d{N_DOCS}s0"
    model = HTPMtebEncoder(encoder=encoder)
    res = mteb.evaluate(model, [task], cache=mteb.ResultCache(cache_path=tmp_path / "mteb"),
                        encode_kwargs={"batch_size": 8}, show_progress_bar=False)
    assert not res.exceptions
    (tr,) = res.task_results
    (entry,) = tr.scores["test"]
    mteb_ndcg = 100 * entry["ndcg_at_10"]
    assert 0.0 <= mteb_ndcg <= 100.0
    assert entry["main_score"] == entry["ndcg_at_10"]
    # queries got the Table 6 instruction, documents none
    assert {c["prompt_type"] for c in model.calls} == {"query", "document"}
    assert sum(c["n_texts"] for c in model.calls) == N_QUERIES + N_DOCS

    # our own harness on the same subsample, same encoder: the same NDCG@10 and Recall@100
    data = subsample(load_beir(SCIFACT), n_queries=N_QUERIES, n_docs=N_DOCS, seed=0)
    ours = run_retrieval(encoder, data, show_progress_bar=False)
    assert mteb_ndcg == pytest.approx(ours.scores["NDCG@10"], abs=0.05)
    assert 100 * entry["recall_at_100"] == pytest.approx(ours.scores["Recall@100"], abs=0.05)

    # mteb recorded the result under the model meta (method in the experiment name)
    files = list((tmp_path / "mteb").rglob(f"{task.metadata.name}.json"))
    assert len(files) == 1 and "method_htp" in str(files[0])
    saved = json.loads(files[0].read_text())
    assert saved["scores"]["test"][0]["ndcg_at_10"] == pytest.approx(entry["ndcg_at_10"])


@pytest.mark.skipif(not os.path.isdir(STSB), reason="shared STS-B data not present")
def test_mteb_sts_local(encoder, tmp_path) -> None:  # noqa: ANN001
    import mteb
    from scipy.stats import spearmanr

    from htp_retrieval.eval.mteb_model import HTPMtebEncoder
    from htp_retrieval.eval.mteb_tasks import read_sts_jsonl, sts_task

    n = 40
    task = sts_task(STSB, split="test", max_pairs=n)
    model = HTPMtebEncoder(encoder=encoder)
    res = mteb.evaluate(model, [task], cache=mteb.ResultCache(cache_path=tmp_path / "mteb"),
                        encode_kwargs={"batch_size": 16}, show_progress_bar=False)
    assert not res.exceptions
    (entry,) = res.task_results[0].scores["test"]
    assert -1.0 <= entry["cosine_spearman"] <= 1.0
    # STS inputs get no instruction (prompt_type None)
    assert {c["prompt_type"] for c in model.calls} == {None}

    # the same Spearman from the embeddings directly, with float gold scores
    cols = read_sts_jsonl(os.path.join(STSB, "test.jsonl"), max_pairs=n)
    assert any(not float(s).is_integer() for s in cols["score"])
    a, b = encoder.encode(cols["sentence1"]), encoder.encode(cols["sentence2"])
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    expected = spearmanr(cols["score"], cos).statistic
    assert entry["cosine_spearman"] == pytest.approx(expected, abs=1e-3)


def test_resolve_tasks_local_names(tmp_path) -> None:  # noqa: ANN001
    from htp_retrieval.eval.mteb_tasks import resolve_tasks

    with pytest.raises(FileNotFoundError, match="scifact-local"):
        resolve_tasks(["scifact-local"], data_root=tmp_path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"sentence1": "a", "sentence2": "b"}\n')
    (task,) = resolve_tasks([f"sts:{bad}"])
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        task.load_data()
    if os.path.isdir(SHARED):
        tasks = resolve_tasks(["scifact-local", "stsb-local", f"beir:{SCIFACT}@train"],
                              data_root=SHARED, max_queries=3, max_docs=10)
        assert [t.metadata.name for t in tasks] == [
            "scifact-local-q3d10s0", "stsb-local", "scifact-local-train-q3d10s0"]
        assert tasks[2].metadata.eval_splits == ["train"]
