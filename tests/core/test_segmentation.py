"""Every segmenter splits real sentences and returns ascending character offsets."""

from __future__ import annotations

import pytest

from htp_retrieval.segmentation import get_segmenter

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
