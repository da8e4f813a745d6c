"""LongEmbed loading: the local QMSum folder, the hub file layout, and the offline hub error."""

from __future__ import annotations

import json
import os

import pytest

from htp_retrieval.eval.harness import resolve_data
from htp_retrieval.eval.longembed import from_rows, load_longembed

LONGEMBED = os.path.abspath(os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "shared", "data", "longembed"))
QMSUM = os.path.join(LONGEMBED, "qmsum")
needs_qmsum = pytest.mark.skipif(not os.path.isdir(QMSUM), reason="../shared/data missing")


@needs_qmsum
def test_local_qmsum_keeps_every_relevant_document() -> None:
    data = load_longembed(QMSUM)
    assert data.name == "qmsum"
    assert (len(data.corpus), len(data.queries)) == (197, 1527)
    assert sum(len(r) for r in data.qrels.values()) == 1529
    assert sorted(len(r) for r in data.qrels.values())[-2:] == [2, 2]  # two summaries, 2 docs
    via_parent = load_longembed(LONGEMBED, task="qmsum")
    assert via_parent.qrels == data.qrels
    items = resolve_data(QMSUM, max_queries=3, max_docs=5)
    assert len(items) == 1 and items[0].name == "qmsum" and len(items[0].data.corpus) == 5


def _write_hub_layout(root) -> None:  # noqa: ANN001
    root.mkdir()
    rows = {
        "corpus.jsonl": [{"doc_id": f"d{i}", "text": f"doc {i}", "context_length": c}
                         for i, c in enumerate([256, 256, 512])],
        "queries.jsonl": [{"qid": "q0", "text": "first", "context_length": 256},
                          {"qid": "q1", "text": "second", "context_length": 512}],
        "qrels.jsonl": [{"qid": "q0", "doc_id": "d0", "context_length": 256},
                        {"qid": "q0", "doc_id": "d1", "context_length": 256},
                        {"qid": "q1", "doc_id": "d2", "context_length": 512}],
    }
    for name, rs in rows.items():
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rs))


def test_hub_file_layout_and_context_length(tmp_path) -> None:  # noqa: ANN001
    _write_hub_layout(tmp_path / "needle")
    d256 = load_longembed(tmp_path, task="needle", context_length=256)
    assert d256.name == "needle" and set(d256.corpus) == {"d0", "d1"}
    assert d256.qrels == {"q0": {"d0": 1, "d1": 1}}  # both relevant documents kept
    with pytest.raises(ValueError, match="context_length="):
        load_longembed(tmp_path / "needle")
    items = resolve_data(str(tmp_path / "needle"), context_lengths=[256, 512])
    assert [(it.context_length, len(it.data.corpus)) for it in items] == [(256, 2), (512, 1)]


def test_from_rows_names_missing_fields() -> None:
    with pytest.raises(ValueError, match="qmsum corpus: row has none of the fields"):
        from_rows("qmsum", [{"text": "x"}], [], [])


def test_not_a_longembed_folder(tmp_path) -> None:  # noqa: ANN001
    (tmp_path / "corpus.jsonl").write_text("")
    with pytest.raises(FileNotFoundError, match="qrels.jsonl"):
        load_longembed(tmp_path)


def test_hub_offline_error_says_pass_a_local_path(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="pass a local folder"):
        load_longembed("dwzhu/LongEmbed", task="qmsum")
    with pytest.raises(RuntimeError, match="'summ_screen_fd'"):
        resolve_data("longembed:summ_screen_fd")
    with pytest.raises(ValueError, match="pass task="):
        load_longembed("dwzhu/LongEmbed")
