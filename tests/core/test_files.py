"""atomic_write: a target is either the old file or the whole new one, never half of one.

Concurrent writers of one file are tested through the chunk-embedding cache
(tests/eval/test_eval_checkpoint.py) and the packaged-model assembly
(tests/core/test_packaged_models.py).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from htp_retrieval.files import atomic_write


def test_writes_text_and_bytes_and_creates_parents(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "result.json"
    with atomic_write(target) as f:
        f.write("{\"ndcg\": 0.5}\n")
    assert target.read_text(encoding="utf-8") == "{\"ndcg\": 0.5}\n"
    with atomic_write(target, "wb") as f:
        f.write(b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in target.parent.iterdir()) == ["result.json"]


def test_failure_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "cache.json"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="disk full"), atomic_write(target) as f:
        f.write("half of the new")
        raise RuntimeError("disk full")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["cache.json"]


def test_permissions_follow_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        with atomic_write(tmp_path / "x.txt") as f:
            f.write("x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "x.txt").stat().st_mode) == 0o644


def test_rejects_other_modes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'a'"), atomic_write(tmp_path / "x", "a"):  # type: ignore[arg-type]
        pass
    assert not (tmp_path / "x").exists()
