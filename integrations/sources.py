"""Reading documents for ingestion: folders of text files and BEIR ``corpus.jsonl`` files.

Shared by :func:`~htp_retrieval.integrations.chroma.ingest` and the Ray ingestion, so both
read, accept, reject and skip exactly the same files. Nothing is dropped without a word:

* a document that cannot be used (undecodable, empty, no content, malformed BEIR line,
  duplicate id) is yielded as a :class:`SourceDoc` with ``error`` set;
* a file that is not read at all (another extension, a hidden file or folder) is listed as
  a :class:`Skipped` entry, and ``include`` patterns widen what is read.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TEXT_SUFFIXES = (".txt", ".md")
"""File extensions a folder source reads by default (case-insensitive)."""

# Characters that carry no content: whitespace, C0/C1 controls (NUL included), and
# zero-width/format characters (ZWSP..RLM, LS..RLO, WORD JOINER..INVISIBLE PLUS, BOM).
_CONTENT = re.compile(r"[^\s\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2064\ufeff]")


@dataclass
class SourceDoc:
    """One document read from a source.

    Attributes:
        id: Stable id (relative path for folders, ``_id`` for BEIR, ``line N`` when a
            BEIR line has no usable id).
        text: The text, or ``None`` when rejected.
        metadata: Chroma metadata (``source``, ``title``).
        error: Why the document was rejected, or ``None``.
    """

    id: str
    text: str | None
    metadata: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True)
class Skipped:
    """A file or folder of a folder source that was not read.

    Attributes:
        path: Path relative to the source folder (``/``-separated; a folder ends in ``/``).
        reason: Why, e.g. ``extension .rst`` or ``hidden folder (12 files)``.
    """

    path: str
    reason: str


def content_error(text: str) -> str | None:
    """Why a text cannot be embedded, or ``None`` when it carries content.

    A text is refused when it is empty or whitespace-only (``empty``), when it holds only
    control, format or whitespace characters (``no content: ...``, e.g. a file of NUL
    bytes), or when it contains NUL characters among other text (``binary: ...``: a binary
    file that happens to decode as UTF-8, the rule ``git`` and ``grep`` use).

    Args:
        text: The decoded text.

    Returns:
        The reason, or ``None``.
    """
    if not text.strip():
        return "empty"
    if _CONTENT.search(text) is None:
        return f"no content: {len(text):,} characters, all control or format characters"
    nul = text.count("\x00")
    if nul:
        return f"binary: contains {nul:,} NUL characters"
    return None


def _matches(rel: str, patterns: Sequence[str]) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(name, p) for p in patterns)


def _opens(rel: str, patterns: Sequence[str]) -> bool:
    """Whether a pattern names a hidden folder (by path or name) or something inside it."""
    name = rel.rsplit("/", 1)[-1]
    return any(p == rel or p.startswith(rel + "/") or fnmatch.fnmatch(rel, p)
               or fnmatch.fnmatch(name, p) for p in patterns)


@dataclass
class FolderListing:
    """The files a folder source reads, and what it skips.

    Attributes:
        root: The folder.
        files: Files to read, sorted by relative path.
        skipped: Files and hidden folders not read, with the reason.
    """

    root: Path
    files: list[Path]
    skipped: list[Skipped]


def list_folder(root: str | os.PathLike[str], include: Sequence[str] = ()) -> FolderListing:
    """List a folder source recursively: ``.txt``/``.md`` files plus ``include`` matches.

    Hidden files and folders (a name starting with ``.``) are skipped unless an ``include``
    pattern matches them; a hidden folder is reported once with its file count. Every other
    file that is not read is reported with its extension; symbolic links to folders (not
    followed, so a link cycle cannot loop) and folders that cannot be listed are reported
    too.

    Args:
        root: The source folder.
        include: Extra glob patterns (``fnmatch``), matched against the relative path and
            the file name, e.g. ``("*.rst", "notes/*.log")``.

    Returns:
        The :class:`FolderListing`.
    """
    root = Path(root)
    files: list[Path] = []
    skipped: list[Skipped] = []
    def unlistable(e: OSError) -> None:
        rel = Path(e.filename or root).relative_to(root).as_posix()
        skipped.append(Skipped(rel + "/", f"unreadable folder: {e.strerror or e}"))

    for dirpath, dirnames, filenames in os.walk(root, onerror=unlistable):
        base = Path(dirpath)
        keep_dirs = []
        for d in sorted(dirnames):
            rel = (base / d).relative_to(root).as_posix()
            if (base / d).is_symlink():
                skipped.append(Skipped(rel + "/", "symbolic link to a folder (not followed)"))
            elif d.startswith(".") and not _opens(rel, include):
                n = sum(len(f) for _, _, f in os.walk(base / d))
                skipped.append(Skipped(rel + "/", f"hidden folder ({n} file{'s' * (n != 1)})"))
            else:
                keep_dirs.append(d)
        dirnames[:] = keep_dirs
        for name in filenames:
            path = base / name
            rel = path.relative_to(root).as_posix()
            if _matches(rel, include):
                files.append(path)
            elif name.startswith("."):
                skipped.append(Skipped(rel, "hidden"))
            elif path.suffix.lower() in TEXT_SUFFIXES:
                files.append(path)
            else:
                ext = path.suffix.lower() or "none"
                skipped.append(Skipped(rel, f"extension {ext}"))
    files.sort(key=lambda p: p.relative_to(root).as_posix())
    skipped.sort(key=lambda s: s.path)
    return FolderListing(root, files, skipped)


def corpus_file(source: Path) -> Path | None:
    """The BEIR ``corpus.jsonl`` a source names (the file, or a folder holding one)."""
    if source.is_file() and source.name.endswith(".jsonl"):
        return source
    if source.is_dir() and (source / "corpus.jsonl").is_file():
        return source / "corpus.jsonl"
    return None


def check_source(source: str | os.PathLike[str]) -> Path:
    """Check that a source can be read, before anything is created or written.

    Raises:
        FileNotFoundError: if it does not exist, or is a file other than a ``.jsonl``.
        PermissionError: if it cannot be read.
    """
    src = Path(source)
    if not src.exists():
        raise FileNotFoundError(f"source not found: {src} (give a folder of .txt/.md files "
                                "or a BEIR corpus.jsonl)")
    if src.is_dir() and not os.access(src, os.R_OK | os.X_OK):
        raise PermissionError(f"source is not readable: {src}")
    if corpus_file(src) is None and not src.is_dir():
        raise FileNotFoundError(f"source must be a folder of .txt/.md files or a BEIR "
                                f"corpus.jsonl: {src}")
    corpus = corpus_file(src)
    if corpus is not None and not os.access(corpus, os.R_OK):
        raise PermissionError(f"source is not readable: {corpus}")
    return src


def check_documents(source: str | os.PathLike[str], include: Sequence[str] = ()) -> Path:
    """:func:`check_source`, plus: the source holds at least one entry to read.

    An empty source is an error rather than an empty ingest, so a wrong or unmounted path
    never creates an empty collection, and never lets a prune remove everything.

    Raises:
        FileNotFoundError: as :func:`check_source`, or when nothing would be read (the
            message counts the skipped files and names ``--include``).
        ValueError: if ``include`` is given for a BEIR corpus (it applies to folders).
    """
    src = check_source(source)
    if corpus_file(src) is not None:
        if include:
            raise ValueError(f"include patterns apply to folders of text files, not to the "
                             f"BEIR corpus in {src}")
        if count_source(src) == 0:
            raise FileNotFoundError(f"no documents in {corpus_file(src)}: the file is empty")
        return src
    listing = list_folder(src, include)
    if not listing.files:
        raise FileNotFoundError(f"no documents in {src}: no .txt/.md file "
                                f"({len(listing.skipped)} other entries skipped; --include "
                                "PATTERN reads other files)")
    return src


def count_source(source: str | os.PathLike[str], include: Sequence[str] = ()) -> int:
    """Number of entries :func:`read_source` will yield (for progress totals)."""
    src = Path(source)
    corpus = corpus_file(src)
    if corpus is not None:
        with open(corpus, "rb") as f:
            return sum(1 for line in f if line.strip())
    return len(list_folder(src, include).files)


def read_source(
    source: str | os.PathLike[str], include: Sequence[str] = ()
) -> Iterator[SourceDoc]:
    """Read documents from a folder of text files or a BEIR ``corpus.jsonl``.

    A folder is read as :func:`list_folder` lists it, in sorted order; a document's id is
    its path relative to the folder. A BEIR corpus (the ``.jsonl`` file, or a folder
    holding ``corpus.jsonl``) gives ``_id`` ids and ``title + " " + text`` texts. Rejected
    entries (empty, no content, binary, undecodable, malformed JSON, missing or duplicate
    id) are yielded with ``error`` set, never skipped.

    Args:
        source: The folder or corpus file.
        include: Extra glob patterns for a folder (see :func:`list_folder`).

    Raises:
        FileNotFoundError: if ``source`` does not exist or is not a folder or ``.jsonl``.
    """
    src = check_source(source)
    corpus = corpus_file(src)
    if corpus is not None:
        with open(corpus, "rb") as f:
            yield from read_beir_lines(f)
        return
    for path in list_folder(src, include).files:
        rel = path.relative_to(src).as_posix()
        try:
            data = path.read_bytes()
        except OSError as e:
            yield SourceDoc(rel, None, {"source": rel, "title": path.stem},
                            f"unreadable: {e.strerror or e}")
            continue
        yield file_doc(rel, data)


def _decode(data: bytes) -> str:
    return data.decode("utf-8-sig")


def _undecodable(e: UnicodeDecodeError) -> str:
    return f"undecodable: not UTF-8 (byte 0x{e.object[e.start]:02x} at offset {e.start})"


def file_doc(rel: str, data: bytes) -> SourceDoc:
    """One document from a file's bytes (id ``rel``; rejected if undecodable or contentless).

    Args:
        rel: The file's path relative to the source folder (``/``-separated): its id.
        data: The file's contents.
    """
    meta = {"source": rel, "title": Path(rel).stem}
    try:
        text = _decode(data)
    except UnicodeDecodeError as e:
        return SourceDoc(rel, None, meta, _undecodable(e))
    error = content_error(text)
    if error is not None:
        return SourceDoc(rel, None, meta, error)
    return SourceDoc(rel, text, meta)


def read_beir_lines(lines: Iterable[bytes]) -> Iterator[SourceDoc]:
    """Documents from the lines of a BEIR ``corpus.jsonl`` (see :func:`read_source`).

    Args:
        lines: The file's raw lines, in order (line numbers count from 1, blank lines
            included); a bad line is yielded with ``error`` set and id ``line N``.
    """
    seen: set[str] = set()
    line_no = 0
    for raw in lines:
        line_no += 1
        if not raw.strip():
            continue
        where = f"line {line_no}"
        try:
            row = json.loads(_decode(raw))
        except UnicodeDecodeError as e:
            yield SourceDoc(where, None, {"source": where}, _undecodable(e))
            continue
        except json.JSONDecodeError as e:
            yield SourceDoc(where, None, {"source": where}, f"invalid JSON ({e.msg})")
            continue
        if not isinstance(row, dict) or row.get("_id") in (None, ""):
            yield SourceDoc(where, None, {"source": where}, "no _id")
            continue
        doc_id = str(row["_id"])
        title = row.get("title") or ""
        meta = {"source": where, "title": str(title)}
        if doc_id in seen:
            yield SourceDoc(doc_id, None, meta, f"duplicate id ({where})")
            continue
        seen.add(doc_id)
        text = f"{title} {row.get('text') or ''}".strip()
        error = content_error(text)
        if error is not None:
            yield SourceDoc(doc_id, None, meta, error)
            continue
        yield SourceDoc(doc_id, text, meta)


__all__ = ["TEXT_SUFFIXES", "FolderListing", "Skipped", "SourceDoc", "check_documents",
           "check_source",
           "content_error", "corpus_file", "count_source", "file_doc", "list_folder",
           "read_beir_lines", "read_source"]
