"""Corpus checkpointing: an interrupted corpus encode resumes to the same embeddings."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from htp_retrieval.encoder import HTPEncoder
from htp_retrieval.eval.retrieval import encode_corpus, save_npz_atomic


def _corpus() -> tuple[list[str], list[str]]:
    """Eleven short documents of different lengths, and their ids."""
    texts = [f"Document {i}. " + "It has words. " * (i % 5 + 1) for i in range(11)]
    return texts, [f"d{i}" for i in range(11)]


def test_resume_matches_uninterrupted(tiny_llama, tmp_path) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    enc = HTPEncoder(model, "htp", tokenizer=tok, dtype="float32")
    texts, ids = _corpus()
    full, cost = encode_corpus(enc, texts, ids, chunk_size=4, show_progress_bar=False)
    assert cost["resumed_chunks"] == 0 and cost["text_tokens"] > 0

    ckpt = tmp_path / "ckpt"
    first, _ = encode_corpus(enc, texts, ids, checkpoint_dir=ckpt, chunk_size=4,
                             show_progress_bar=False)
    chunks = sorted(ckpt.glob("chunk_*.npz"))
    assert len(chunks) == 3
    chunks[-1].unlink()  # as if the run died before its last chunk
    resumed, rcost = encode_corpus(enc, texts, ids, checkpoint_dir=ckpt, chunk_size=4,
                                   show_progress_bar=False)
    assert rcost["resumed_chunks"] == 2
    assert rcost["text_tokens"] == cost["text_tokens"]
    np.testing.assert_allclose(resumed, first, atol=1e-5)
    cos = (full * resumed).sum(1) / np.linalg.norm(full, axis=1) / np.linalg.norm(resumed, axis=1)
    assert cos.min() > 0.999

    # a different encoder config invalidates the checkpoint instead of mixing embeddings
    other = HTPEncoder(model, "vanilla-mean", tokenizer=tok, dtype="float32")
    _, ocost = encode_corpus(other, texts, ids, checkpoint_dir=ckpt, chunk_size=4,
                             show_progress_bar=False)
    assert ocost["resumed_chunks"] == 0


def test_resume_with_another_chunk_size_keeps_finished_chunks(tiny_llama, tmp_path) -> None:  # noqa: ANN001
    """A rerun with a different ``--chunk-size`` resumes with the stored size."""
    model, tok = tiny_llama
    enc = HTPEncoder(model, "htp", tokenizer=tok, dtype="float32")
    texts, ids = _corpus()
    ckpt = tmp_path / "ckpt"
    first, _ = encode_corpus(enc, texts, ids, checkpoint_dir=ckpt, chunk_size=4,
                             show_progress_bar=False)
    sorted(ckpt.glob("chunk_*.npz"))[-1].unlink()
    resumed, rcost = encode_corpus(enc, texts, ids, checkpoint_dir=ckpt, chunk_size=8,
                                   show_progress_bar=False)
    assert rcost["resumed_chunks"] == 2
    np.testing.assert_allclose(resumed, first, atol=1e-5)
    assert len(list(ckpt.glob("chunk_*.npz"))) == 3


def test_new_chunk_size_wins_when_no_chunk_is_finished(tiny_llama, tmp_path) -> None:  # noqa: ANN001
    """A run killed before its first chunk leaves only meta.json; a rerun with a smaller
    ``--chunk-size`` then checkpoints with the new size instead of the stale one."""
    import json

    model, tok = tiny_llama
    enc = HTPEncoder(model, "htp", tokenizer=tok, dtype="float32")
    texts, ids = _corpus()
    ckpt = tmp_path / "ckpt"
    encode_corpus(enc, texts, ids, checkpoint_dir=ckpt, chunk_size=1024, show_progress_bar=False)
    for f in ckpt.glob("chunk_*.npz"):  # as if killed before the first chunk finished
        f.unlink()
    assert json.loads((ckpt / "meta.json").read_text())["chunk_size"] == 1024
    encode_corpus(enc, texts, ids, checkpoint_dir=ckpt, chunk_size=4, show_progress_bar=False)
    assert json.loads((ckpt / "meta.json").read_text())["chunk_size"] == 4
    assert len(list(ckpt.glob("chunk_*.npz"))) == 3  # ceil(11 / 4)


def test_long_documents_are_checkpointed_by_characters(tiny_llama, tmp_path) -> None:  # noqa: ANN001
    """A few long documents (needle/passkey at 8192 tokens) are cut by ``chunk_chars``
    long before ``chunk_size`` documents, every chunk holds at least one document, and a
    rerun resumes from the finished chunks to the same embeddings."""
    import json

    model, tok = tiny_llama
    enc = HTPEncoder(model, "htp", tokenizer=tok, dtype="float32")
    texts = [f"Document {i}. " + "It has words. " * (3 + 4 * i) for i in range(5)]
    ids = [f"d{i}" for i in range(5)]
    full, _ = encode_corpus(enc, texts, ids, chunk_chars=None, show_progress_bar=False)
    ckpt = tmp_path / "ckpt"
    budget = len(texts[-1]) + len(texts[-2]) - 1  # the longest text alone, then pairs at most
    first, _ = encode_corpus(enc, texts, ids, checkpoint_dir=ckpt, chunk_chars=budget,
                             show_progress_bar=False)
    files = sorted(ckpt.glob("chunk_*.npz"))
    sizes = [np.load(f)["emb"].shape[0] for f in files]
    assert sizes[0] == 1 and sum(sizes) == 5 and len(files) >= 3
    lengths = sorted((len(t) for t in texts), reverse=True)  # chunks follow this order
    starts = np.cumsum([0, *sizes])
    for a, b in zip(starts[:-1], starts[1:], strict=True):
        assert b - a == 1 or sum(lengths[a:b]) <= budget
    meta = json.loads((ckpt / "meta.json").read_text())
    assert (meta["chunk_size"], meta["chunk_chars"]) == (1024, budget)
    np.testing.assert_allclose(first, full, atol=1e-5)
    files[-1].unlink()
    resumed, rcost = encode_corpus(enc, texts, ids, checkpoint_dir=ckpt, chunk_chars=10**9,
                                   show_progress_bar=False)  # stored limits win
    assert rcost["resumed_chunks"] == len(files) - 1
    np.testing.assert_allclose(resumed, full, atol=1e-5)


def test_folder_cut_by_count_only_resumes_by_count(tiny_llama, tmp_path) -> None:  # noqa: ANN001
    """A checkpoint folder written before ``chunk_chars`` existed (its meta.json has no
    ``chunk_chars``) resumes cut by count alone, so no finished chunk is misread."""
    import json

    model, tok = tiny_llama
    enc = HTPEncoder(model, "vanilla-mean", tokenizer=tok, dtype="float32")
    texts, ids = _corpus()
    ckpt = tmp_path / "ckpt"
    first, _ = encode_corpus(enc, texts, ids, checkpoint_dir=ckpt, chunk_size=4,
                             chunk_chars=None, show_progress_bar=False)
    meta = json.loads((ckpt / "meta.json").read_text())
    del meta["chunk_chars"]
    (ckpt / "meta.json").write_text(json.dumps(meta))
    sorted(ckpt.glob("chunk_*.npz"))[-1].unlink()
    resumed, rcost = encode_corpus(enc, texts, ids, checkpoint_dir=ckpt, chunk_size=4,
                                   chunk_chars=20, show_progress_bar=False)
    assert rcost["resumed_chunks"] == 2
    np.testing.assert_allclose(resumed, first, atol=1e-5)
    assert len(list(ckpt.glob("chunk_*.npz"))) == 3


def test_chunk_size_must_be_positive(tiny_llama) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    enc = HTPEncoder(model, "vanilla-mean", tokenizer=tok, dtype="float32")
    with pytest.raises(ValueError, match="chunk_size"):
        encode_corpus(enc, ["a b."], ["d0"], chunk_size=0, show_progress_bar=False)
    with pytest.raises(ValueError, match="chunk_chars"):
        encode_corpus(enc, ["a b."], ["d0"], chunk_chars=0, show_progress_bar=False)


def test_progress_is_reported_per_batch(tiny_llama) -> None:  # noqa: ANN001
    """A caller's bar moves after every batch, not only after a whole chunk of documents."""
    model, tok = tiny_llama
    enc = HTPEncoder(model, "htp", tokenizer=tok, dtype="float32", batch_size=3)
    texts, _ = _corpus()
    calls: list[int] = []
    enc.encode(texts, progress=calls.append)
    assert len(calls) == len(enc.last_stats.batches) >= 4  # at most 3 texts per batch
    assert calls == [rows for rows, _ in enc.last_stats.batches] and sum(calls) == 11


def test_concurrent_writers_of_one_cache_entry_leave_one_whole_file(tmp_path) -> None:  # noqa: ANN001
    """Two evals filling the shared chunk-embedding cache at once write the same entry; the
    file must be one writer's whole arrays, with no temporary left behind."""
    path = tmp_path / "entry.npz"
    arrays = [np.full((400, 256), float(i), dtype=np.float32) for i in range(6)]
    barrier, errors = threading.Barrier(len(arrays)), []

    def write(a: np.ndarray) -> None:
        barrier.wait()
        try:
            save_npz_atomic(path, emb=a)
        except Exception as e:  # noqa: BLE001 - collected and asserted below
            errors.append(e)

    threads = [threading.Thread(target=write, args=(a,)) for a in arrays]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    got = np.load(path)["emb"]
    assert got.shape == (400, 256) and np.all(got == got[0, 0])  # one writer's, not mixed
    assert [p.name for p in tmp_path.iterdir()] == ["entry.npz"]


def test_resume_on_another_machine_records_both(tiny_llama, tmp_path) -> None:  # noqa: ANN001
    """A checkpoint resumed on another machine lists both machines in ``cost["machines"]``,
    so the report does not compare its time with a baseline timed on one."""
    import json

    from htp_retrieval.eval.retrieval import timing_machine

    model, tok = tiny_llama
    enc = HTPEncoder(model, "htp", tokenizer=tok, dtype="float32")
    texts, ids = _corpus()
    ckpt = tmp_path / "ckpt"
    _, cost = encode_corpus(enc, texts, ids, checkpoint_dir=ckpt, chunk_size=4,
                            show_progress_bar=False)
    here = timing_machine("cpu")
    assert cost["machines"] == [here]
    files = sorted(ckpt.glob("chunk_*.npz"))
    z = np.load(files[0])
    part = json.loads(str(z["cost"]))
    assert part["machine"] == here
    part["machine"] = "Other CPU x64"  # as if this chunk had been encoded elsewhere
    save_npz_atomic(files[0], emb=z["emb"], cost=json.dumps(part))
    files[-1].unlink()
    _, rcost = encode_corpus(enc, texts, ids, checkpoint_dir=ckpt, chunk_size=4,
                             show_progress_bar=False)
    assert rcost["resumed_chunks"] == 2
    assert rcost["machines"] == sorted(["Other CPU x64", here])
