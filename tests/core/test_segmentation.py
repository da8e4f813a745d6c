"""Every segmenter splits real sentences and returns ascending character offsets."""

from __future__ import annotations

from pathlib import Path

import pytest

from htp_retrieval.segmentation import get_segmenter

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"

TEXT = "Dr. Smith measured 3.5 mg of protein. The cells died! Why? Nobody knows."


@pytest.mark.parametrize("name", ["sentencizer", "spacy", "pysbd", "regex"])
def test_segmenters_split_sentences(name: str) -> None:
    seg = get_segmenter(name)
    (starts,) = seg.sentence_starts([TEXT])
    assert starts[0] == 0 and starts == sorted(starts)
    assert TEXT.index("The cells") in starts
    assert TEXT.index("Nobody") in starts
    assert 3 <= len(starts) <= 5


def test_unknown_segmenter() -> None:
    with pytest.raises(ValueError, match="unknown segmenter"):
        get_segmenter("nope")  # type: ignore[arg-type]


def _stock_sentencizer(texts: list[str]) -> list[list[int]]:
    """spaCy's own pipeline: ``nlp.pipe`` with the ``sentencizer`` pipe."""
    import spacy

    nlp = spacy.blank("en")
    nlp.add_pipe("sentencizer")
    out = []
    for doc in nlp.pipe(texts):
        starts = sorted({s.start_char for s in doc.sents if s.text.strip()})
        out.append(starts or [0])
    return out


def test_sentencizer_windows_equal_stock_spacy_on_random_text() -> None:
    """Tokenizing only windows around marks gives spaCy's starts on adversarial text:
    marks in runs of marks, quotes and brackets after marks, every kind of whitespace,
    abbreviations, special cases, texts that start or end in marks or spaces."""
    import random

    rng = random.Random(0)
    alphabet = list("abcXY 12") + [
        ".", ".", "!", "?", "\u3002", "\u2026", '"', "'", "(", ")", "-", ",", ";", "\n",
        "\n\n", "  ", " \n ", "\t", "\xa0", "\u2028", "\x1c", "\u3000", "e.g.", "U.S.",
        "Dr.", "...", " . ", "a.m.", ":)", "'s", "n't", " -- ", '. "', '? " ,']
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
             for _ in range(4000)]
    texts += ["Hello.\n", "   .", "A. \" B.", "x", "", "   ", ". . .", "Yes ? \" \nNo ."]
    assert get_segmenter("sentencizer").sentence_starts(texts) == _stock_sentencizer(texts)


@pytest.mark.skipif(not (DATA / "spans" / "qmsum" / "corpus.jsonl").exists(),
                    reason="../shared/data missing")
def test_sentencizer_windows_equal_stock_spacy_on_meetings_and_essays() -> None:
    """The same on long real documents: QMSum meeting transcripts (spaced punctuation,
    quotes after marks) and the Paul Graham essays."""
    import json

    meetings = [json.loads(line)["text"]
                for line in (DATA / "spans" / "qmsum" / "corpus.jsonl").open()][:60]
    essays = [p.read_text() for p in sorted((DATA / "haystack" / "paul_graham_essays").glob("*.txt"))]
    texts = meetings + essays
    assert get_segmenter("sentencizer").sentence_starts(texts) == _stock_sentencizer(texts)


def test_mark_windows_cover_marks_and_the_run_after() -> None:
    from htp_retrieval.segmentation import mark_windows

    text = "No mark here. Dr. Who (said) it! \"Then\" more words\n  end?  "
    owner, begin, end = mark_windows([text, "plain"], frozenset(".!?"))
    got = [text[a:b] for a, b in zip(begin.tolist(), end.tolist())]
    assert owner.tolist() == [0, 0, 0]
    assert got == ["here. Dr. Who", "it! \"Then\"", "end?  "]


def test_tokenizer_rule_with_a_space_turns_windows_off() -> None:
    """A special case whose key holds a space could match across a window's edge, so
    such a tokenizer is run on whole texts."""
    import spacy

    from htp_retrieval.segmentation import _windows_exact

    nlp = spacy.blank("en")
    marks = frozenset(".!?")
    assert _windows_exact(nlp.tokenizer, marks)
    nlp.tokenizer.add_special_case("New York.", [{"ORTH": "New York."}])
    assert not _windows_exact(nlp.tokenizer, marks)
    assert not _windows_exact(spacy.blank("en").tokenizer, frozenset({"..."}))
    assert not _windows_exact(spacy.blank("en").tokenizer, frozenset({".", "\u2028"}))
