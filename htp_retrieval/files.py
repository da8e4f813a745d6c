"""Writing files so that a reader never sees half of one.

Results, checkpoints, caches and the assembled model weights are all written the same way:
into a uniquely named temporary file in the target's folder, then renamed over the target
with :func:`os.replace` (atomic on POSIX and Windows within one file system).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Literal


@contextmanager
def atomic_write(path: str | os.PathLike[str], mode: Literal["w", "wb"] = "w", *,
                 encoding: str | None = "utf-8") -> Iterator[IO[Any]]:
    """Open a temporary file for writing; on a clean exit rename it to ``path``.

    The temporary file sits beside ``path`` and is named
    ``.{name}.{pid}.{random}.tmp``: unique per process and per call, so two writers of the
    same file at once (two processes converting one model, two runs sharing a cache) each
    write their own copy and the last rename wins, and the leading dot keeps it out of
    globs such as ``chunk_*.npz``. It is created with the usual permissions (``0o666``
    less the umask). If the ``with`` body raises, the temporary file is removed and
    ``path`` is left as it was. Parent folders are created.

    Args:
        path: the file to write.
        mode: ``"w"`` (text, written with ``encoding``) or ``"wb"`` (bytes).
        encoding: the text encoding; ignored for ``"wb"``.

    Yields:
        The open temporary file.

    Raises:
        ValueError: if ``mode`` is neither ``"w"`` nor ``"wb"``.
        OSError: if the folder cannot be created or written; ``path`` is unchanged.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write mode must be 'w' or 'wb', not {mode!r}")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0),
                 0o666)
    try:
        with (os.fdopen(fd, "wb") if mode == "wb"
              else os.fdopen(fd, "w", encoding=encoding)) as f:
            yield f
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
