"""Needle and passkey generation: determinism, one relevant document per query, lengths."""

from __future__ import annotations

import hashlib
import os

import pytest

from htp_retrieval.eval.data import load_beir
from htp_retrieval.eval.needles import NEEDLES
from htp_retrieval.eval.synthetic import (
    PASSKEY_FILLER,
    SyntheticData,
    corpus_sha256,
    generate,
    generate_all,
    load_tokenizer,
    write_beir,
)

HAYSTACK = os.path.abspath(os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "shared", "data", "haystack", "paul_graham_essays"))
needs_haystack = pytest.mark.skipif(not os.path.isdir(HAYSTACK), reason="essays missing")
SMALL = dict(n_docs=12, n_queries=5)


def _files_sha(root) -> dict[str, str]:  # noqa: ANN001
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("task", ["passkey", pytest.param("needle", marks=needs_haystack)])
def test_same_seed_gives_byte_identical_corpus(task: str, tmp_path) -> None:  # noqa: ANN001
    a = generate_all(task, [256, 512], seed=3, **SMALL)
    b = generate_all(task, [256, 512], seed=3, **SMALL)
    for length in (256, 512):
        assert corpus_sha256(a[length]) == corpus_sha256(b[length])
        write_beir(a[length], tmp_path / f"a{length}")
        write_beir(b[length], tmp_path / f"b{length}")
        files_a, files_b = _files_sha(tmp_path / f"a{length}"), _files_sha(tmp_path / f"b{length}")
        assert set(files_a) == {"corpus.jsonl", "queries.jsonl", "qrels/test.tsv",
                                "metadata.json"}
        assert files_a == files_b
    other = generate_all(task, [256], seed=4, **SMALL)[256]
    assert corpus_sha256(other) != corpus_sha256(a[256])


@pytest.mark.parametrize("task", ["passkey", pytest.param("needle", marks=needs_haystack)])
def test_one_relevant_document_per_query_and_lengths(task: str) -> None:
    tok = load_tokenizer()
    for length, data in generate_all(task, [256, 1024], seed=0, **SMALL).items():
        assert isinstance(data, SyntheticData) and data.context_length == length
        assert data.name == task and data.tokenizer == "smollm2-135m-instruct"
        assert len(data.corpus) == 12 and len(data.queries) == 5
        texts = {d: v["text"] for d, v in data.corpus.items()}
        counts = {d: len(tok(t, add_special_tokens=False).input_ids) for d, t in texts.items()}
        for d, n in counts.items():
            assert n == data.doc_meta[d]["n_tokens"]
            assert 0.85 * length <= n <= length, (d, n, length)  # filled, never over
        for qid, rel in data.qrels.items():
            assert len(rel) == 1 and list(rel.values()) == [1]
            (did,) = rel
            needle = data.doc_meta[did]["needle"]
            holders = [d for d, t in texts.items() if needle in t]
            assert holders == [did]  # the answer is in the relevant document only
            if task == "passkey":
                name = data.queries[qid].removeprefix("What is the pass key for ").rstrip("?")
                assert [d for d, t in texts.items() if name in t] == [did]
            else:
                assert (needle, data.queries[qid]) in NEEDLES
        if task == "passkey":
            assert all(t.count("The grass is green.") >= 2 for t in texts.values())


def test_passkey_document_is_filler_plus_key() -> None:
    data = generate("passkey", 256, seed=0, **SMALL)
    did, text = next((d, v["text"]) for d, v in data.corpus.items())
    needle = data.doc_meta[did]["needle"]
    assert "'s pass key is " in needle and "Remember it." in needle
    rest = text.replace(needle, " ").split()
    filler = PASSKEY_FILLER.split()
    assert all(w in filler for w in rest)  # everything else is the LongEmbed filler


def test_write_beir_round_trip(tmp_path) -> None:  # noqa: ANN001
    data = generate("passkey", 256, seed=1, **SMALL)
    back = load_beir(write_beir(data, tmp_path / "pk"), "test")
    assert back.qrels == data.qrels and back.queries == data.queries
    assert {d: v["text"] for d, v in back.corpus.items()} == {
        d: v["text"] for d, v in data.corpus.items()}


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="unknown synthetic task"):
        generate("haystack", 256)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n_queries"):
        generate("passkey", 256, n_docs=3, n_queries=5)
    with pytest.raises(ValueError, match="context length"):
        generate("passkey", 8, **SMALL)
    with pytest.raises(FileNotFoundError, match="essays"):
        generate("needle", 256, haystack="/nonexistent/essays", **SMALL)
