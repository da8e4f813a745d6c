"""``htp-retrieval bench-chunks``: naive chunks against late chunking on the same chunks,
on a tiny random model and real QMSum meetings (timing bookkeeping, not speed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from htp_retrieval.cli import main
from htp_retrieval.eval.chunk_bench import sample_documents

QMSUM = Path(__file__).resolve().parents[3] / "shared" / "data" / "spans" / "qmsum"


def test_sample_documents_is_seeded_and_names_a_missing_corpus(tmp_path: Path) -> None:
    if not (QMSUM / "corpus.jsonl").exists():
        pytest.skip(f"QMSum spans not found at {QMSUM}")
    a = sample_documents(QMSUM, 3, seed=0)
    assert a == sample_documents(QMSUM, 3, seed=0) and len(a) == 3
    assert list(a) == sorted(a) and a != sample_documents(QMSUM, 3, seed=1)
    with pytest.raises(FileNotFoundError, match="no corpus.jsonl in"):
        sample_documents(tmp_path, 3)


def test_bench_chunks_times_both_chunkings_on_the_same_chunks(
    tiny_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if not (QMSUM / "corpus.jsonl").exists():
        pytest.skip(f"QMSum spans not found at {QMSUM}")
    out = tmp_path / "bench"
    assert main(["bench-chunks", "--model", tiny_dir, "--data", str(QMSUM), "--n-docs", "2",
                 "--methods", "vanilla-mean,htp", "--chunk-tokens", "128", "--repeats", "1",
                 "--threads", "1", "--dtype", "float32", "--device", "cpu", "--quiet",
                 "--output", str(out)]) == 0
    table = capsys.readouterr().out
    (path,) = out.glob("*.json")
    res = json.loads(path.read_text())
    assert res["n_docs"] == 2 and res["n_chunks"] > 2 * 10  # meetings of ~53k characters
    assert res["versions"]["cpu"] and res["config"]["window_tokens"] > 128
    for method in ("vanilla-mean", "htp"):
        f = res["methods"][method]
        naive, late = f["naive"], f["late"]
        # naive runs one text per chunk; late one window per few thousand tokens
        assert naive["forward_passes"] == res["n_chunks"]
        assert 2 <= late["forward_passes"] < res["n_chunks"] / 4
        assert naive["text_tokens"] > 0 and late["text_tokens"] > 0
        assert f["late_over_naive"] == pytest.approx(late["seconds"] / naive["seconds"])
        assert naive["s_per_1000_chunks"] == pytest.approx(
            1000 * naive["seconds"] / res["n_chunks"])
        assert f"| {method} |" in table
    assert "bench-chunks --model" in res["config"]["command"]


def test_bench_chunks_refuses_last_token_pooling(tiny_dir: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="vanilla-last.*last-token pooling"):
        main(["bench-chunks", "--model", tiny_dir, "--methods", "vanilla-last",
              "--output", str(tmp_path)])
