"""The examples run offline on tiny inputs (each in its own process, as a user runs it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data"
ESSAYS = DATA / "haystack" / "paul_graham_essays"
SCIFACT = DATA / "beir" / "scifact"


def _run(args: list[str], tmp_path: Path) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ANONYMIZED_TELEMETRY": "False",
           "RAGAS_DO_NOT_TRACK": "true", "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


_INDEXED = re.compile(r"^indexed (\d+) chunks from (\d+) essays \((?:late chunking|naive "
                      r"chunks), at most (\d+) tokens per chunk\)", re.M)


def _chunking(out: str, chunk_tokens: int) -> None:
    """Real chunking: more chunks than essays, none much over the token budget."""
    m = _INDEXED.search(out)
    assert m, out
    n_chunks, n_essays, longest = map(int, m.groups())
    assert n_chunks > n_essays >= 1
    assert longest <= chunk_tokens + 8  # a join can add a token or two


@pytest.mark.skipif(not ESSAYS.is_dir(), reason="essays not available")
def test_langchain_rag(tmp_path: Path) -> None:
    pytest.importorskip("langchain_chroma")
    out = _run([str(ROOT / "examples/langchain_rag.py"), str(ESSAYS), "--limit", "1",
                "--db", str(tmp_path / "db"), "--max-new-tokens", "16", "--k", "1",
                "--chunk-tokens", "128"], tmp_path)
    _chunking(out, 128)
    assert "(naive chunks," in out
    assert re.search(r"^source: addiction#\d+ \[\d+:\d+\]: ", out, re.M), out
    assert "essay: addiction (" in out and "answer:" in out


@pytest.mark.skipif(not ESSAYS.is_dir(), reason="essays not available")
def test_llamaindex_chroma(tmp_path: Path) -> None:
    pytest.importorskip("llama_index.vector_stores.chroma")
    out = _run([str(ROOT / "examples/llamaindex_chroma.py"), str(ESSAYS), "--limit", "1",
                "--db", str(tmp_path / "db"), "--k", "2", "--chunk-size", "128",
                "--chunking", "late"], tmp_path)
    _chunking(out, 128)
    assert "(late chunking," in out
    hits = [x for x in out.splitlines() if re.match(r"^-?\d\.\d{4} addiction: ", x)]
    assert len(hits) == 2


@pytest.mark.skipif(not SCIFACT.is_dir(), reason="SciFact not available")
def test_ragas_eval(tmp_path: Path) -> None:
    pytest.importorskip("ragas")
    out = _run([str(ROOT / "examples/ragas_eval.py"), str(SCIFACT), "--max-queries", "2",
                "--max-docs", "6", "--k", "3"], tmp_path)
    rows = [x for x in out.splitlines() if x.startswith("| htp") or x.startswith("| vanilla")]
    assert len(rows) == 2
