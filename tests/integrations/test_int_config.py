"""One ``HTPConfig`` through the integrations: what a Chroma collection stores is the
encoder's resolved config (packaged SmolLM2, a local model folder, a sentence-transformers
folder), a reopened collection embeds with its stored config even where today's defaults
differ, ``HTPEmbeddings(config=...)`` round-trips and refuses conflicts, and
``htp-retrieval ingest/query --config FILE`` (and the Ray writer) use a saved config.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("chromadb")

from htp_retrieval import HTPEncoder  # noqa: E402
from htp_retrieval.config import HTPConfig, read_config_file  # noqa: E402
from htp_retrieval.integrations.chroma import (  # noqa: E402
    HTPEmbeddingFunction,
    collection_embedding_function,
    ingest,
    make_client,
)
from htp_retrieval.methods import DEFAULT_QUERY_INSTRUCTION  # noqa: E402
from htp_retrieval.models import DEFAULT_MODEL  # noqa: E402

DOCS = {
    "bees.txt": "Honey bees dance to show where flowers are. The waggle dance gives the "
                "direction. Its length gives the distance.",
    "tea.txt": "Green tea is not oxidized. Black tea is fully oxidized. Oolong sits between.",
}
QUERY = "How do bees tell each other where flowers are? They dance."


def _src(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in DOCS.items():
        (root / name).write_text(text, encoding="utf-8")
    return root


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


@pytest.fixture(scope="module")
def smol_k2() -> HTPConfig:
    """SmolLM2's HTP config with settings today's defaults do not give (K=2, exit at -3)."""
    cfg = HTPConfig.for_model(DEFAULT_MODEL, "htp").replace(k=2, output_layer=-3)
    assert cfg != HTPConfig.for_model(DEFAULT_MODEL, "htp")
    return cfg


@pytest.fixture(scope="module")
def st_folder(tmp_path_factory: pytest.TempPathFactory, smol_tokenizer_path: str) -> str:
    """A tiny mean-pooled sentence-transformers folder (random Qwen2, max_seq_length 96)."""
    pytest.importorskip("sentence_transformers")
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling
    from transformers import AutoTokenizer, Qwen2Config, Qwen2Model

    root = tmp_path_factory.mktemp("st")
    tok = AutoTokenizer.from_pretrained(smol_tokenizer_path)
    tok.chat_template = None  # plain text input, as the released models' folders
    torch.manual_seed(0)
    model = Qwen2Model(Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=3, num_attention_heads=2,
                                   num_key_value_heads=1, max_position_embeddings=2048))
    base = root / "base"
    model.save_pretrained(base)
    tok.save_pretrained(base)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr = Transformer(str(base), max_seq_length=96)
        st = SentenceTransformer(modules=[tr, Pooling(32, pooling_mode="mean")],
                                 prompts={"query": "query: ", "document": ""}, device="cpu")
    out = root / "st-mean"
    st.save(str(out))
    return str(out)


# ------------------------------------------------------------------ stored == encoder's
@pytest.mark.parametrize("which", ["packaged", "folder", "st"])
def test_stored_config_is_the_encoders(which: str, request: pytest.FixtureRequest,
                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The config a collection stores equals ``shared_encoder(...).encoder.config``."""
    monkeypatch.setenv("HTP_RETRIEVAL_DEVICE", "cpu")  # reopened on the same device
    if which == "packaged":
        ef = HTPEmbeddingFunction(device="cpu")
    elif which == "folder":
        ef = HTPEmbeddingFunction(request.getfixturevalue("tiny_model_dir"), "htp",
                                  device="cpu", dtype="float32", encoder_kwargs={"k": 2})
    else:  # its max_seq_length and readout layer are known only to the loaded encoder
        ef = HTPEmbeddingFunction(request.getfixturevalue("st_folder"), "htp", device="cpu",
                                  dtype="float32")
    stored = ef.get_config()
    enc = ef._shared().encoder
    assert stored["config"] == enc.config.to_dict()
    assert stored["max_length"] == enc.config.max_length == ef.max_length
    # a plain encoder of the same settings resolves the same config
    plain = HTPEncoder(ef.model_name, ef.method, device="cpu", dtype=ef.dtype,
                       **ef.encoder_kwargs)
    assert plain.config == enc.config
    if which == "st":
        assert enc.config.max_length == 96 - len(enc.st.lead_ids) - len(enc.st.trail_ids)
        assert enc.config.layers.output_layer == -1
    if which == "folder":
        assert enc.config.blocks.k == 2
    # what a collection stores, and what it gives back when reopened
    ingest(_src(tmp_path / "src"), db=tmp_path / "db", collection="stored",
           embedding_function=ef, show_progress=False)
    col = make_client(tmp_path / "db").get_collection("stored")
    reopened = collection_embedding_function(col)
    assert reopened.get_config() == stored
    assert reopened._shared().encoder is enc  # one model for the same config


# ------------------------------------------------------------------ reopened collection
def test_reopened_collection_embeds_with_its_stored_config(smol_k2: HTPConfig,
                                                           tmp_path: Path) -> None:
    """A collection stored with a config that today's defaults would not give embeds new
    documents and queries with exactly that config."""
    db = tmp_path / "db"
    made = HTPEmbeddingFunction(config=smol_k2, device="cpu")
    ingest(_src(tmp_path / "src"), db=db, collection="k-two", embedding_function=made,
           show_progress=False)
    stored = make_client(db).get_collection("k-two").configuration_json[
        "embedding_function"]["config"]
    # the settings alone (htp, no encoder_kwargs) resolve to today's defaults, not to K=2
    assert (stored["method"], stored["encoder_kwargs"]) == ("htp", {})
    assert HTPConfig.from_dict(stored["config"]) == smol_k2
    assert HTPEmbeddingFunction(device="cpu").resolved_config() != smol_k2

    col = make_client(db).get_collection("k-two")  # the embedding function is rebuilt
    ef = collection_embedding_function(col)
    assert ef.config == smol_k2 and ef._shared().encoder.config == smol_k2
    ref = HTPEncoder(DEFAULT_MODEL, smol_k2, device="cpu", dtype=ef.dtype)
    q = np.asarray(ef.embed_query([QUERY]))
    want = ref.encode([QUERY], instruction=DEFAULT_QUERY_INSTRUCTION, normalize=True)
    assert _cos(q, want).min() >= 0.9999
    today = HTPEncoder(DEFAULT_MODEL, "htp", device="cpu", dtype=ef.dtype)
    assert _cos(q, today.encode([QUERY], instruction=DEFAULT_QUERY_INSTRUCTION,
                                normalize=True)).max() < 0.999  # the defaults differ
    col.add(ids=["new"], documents=[DOCS["bees.txt"]])  # a new document: the stored config
    got = np.asarray(col.get(ids=["new"], include=["embeddings"])["embeddings"])
    assert _cos(got, ref.encode([DOCS["bees.txt"]], normalize=True)).min() >= 0.9999
    hits = col.query(query_texts=[QUERY], n_results=1)
    assert hits["ids"][0][0] in ("bees.txt", "new")


def test_stored_config_conflicts_and_old_collections(smol_k2: HTPConfig,
                                                     tmp_path: Path) -> None:
    from htp_retrieval.integrations.chroma import SettingsConflictError, open_collection

    db = tmp_path / "db"
    ingest(_src(tmp_path / "src"), db=db, collection="k-two", show_progress=False,
           embedding_function=HTPEmbeddingFunction(config=smol_k2, device="cpu"))
    client = make_client(db)
    # the same config spelled as settings is accepted; today's defaults are refused
    same = HTPEmbeddingFunction(encoder_kwargs={"k": 2, "output_layer": -3}, device="cpu")
    assert open_collection(client, "k-two", embedding_function=same) is not None
    with pytest.raises(SettingsConflictError, match=r"config\.output_layer stored -3, "
                       r"requested -2; config\.k stored 2, requested 1"):
        open_collection(client, "k-two", embedding_function=HTPEmbeddingFunction(device="cpu"))
    with pytest.raises(SettingsConflictError, match="method stored 'htp', requested "
                       "'vanilla-mean'"):
        ingest(tmp_path / "src", db=db, collection="k-two", show_progress=False,
               embedding_function=HTPEmbeddingFunction(method="vanilla-mean"))
    # an old collection stored without a config: today's resolution of its settings
    old = {k: v for k, v in same.get_config().items() if k != "config"}
    ef = HTPEmbeddingFunction.build_from_config(old)
    assert "config" not in ef.get_config() and ef.resolved_config() == smol_k2
    ef.validate_config_update(old, same.get_config())
    with pytest.raises(SettingsConflictError, match=r"config\.k stored 2"):
        ef.validate_config_update(old, HTPEmbeddingFunction().get_config())
    # explicit settings that disagree with a config are refused, naming both
    with pytest.raises(ValueError, match="method='vanilla-mean' conflicts with config "
                       "method 'htp'"):
        HTPEmbeddingFunction(method="vanilla-mean", config=smol_k2)
    with pytest.raises(ValueError, match=r"encoder_kwargs settings \['k'\] conflict"):
        HTPEmbeddingFunction(config=smol_k2, encoder_kwargs={"k": 3})
    with pytest.raises(ValueError, match="invalid 'config'"):
        HTPEmbeddingFunction.validate_config({"model_name": "x", "config": {"method": "htp"}})


def test_ray_writer_uses_the_stored_config(smol_k2: HTPConfig, tmp_path: Path) -> None:
    pytest.importorskip("ray")
    from htp_retrieval.integrations.ray_ingest import EmbedWriter

    db = tmp_path / "db"
    ingest(_src(tmp_path / "src"), db=db, collection="k-two", show_progress=False,
           embedding_function=HTPEmbeddingFunction(config=smol_k2, device="cpu"))
    stored = collection_embedding_function(make_client(db).get_collection("k-two"))
    w = EmbedWriter(stored.get_config(), str(db), "k-two", device="cpu")
    assert w.ef.config == smol_k2 and w.ef.get_config() == stored.get_config()
    # settings given as encoder_kwargs: stored with the config they resolve to
    plain = HTPEmbeddingFunction(encoder_kwargs={"k": 2, "output_layer": -3}, device="cpu")
    again = HTPEmbeddingFunction.from_stored(plain.get_config(), device="cpu")
    assert again.config == smol_k2 and again.get_config() == plain.get_config()


# ------------------------------------------------------------------ HTPEmbeddings
def test_htpembeddings_config_round_trip_and_conflicts(smol_k2: HTPConfig) -> None:
    pytest.importorskip("langchain_core")
    pytest.importorskip("llama_index.core")
    import copy
    import pickle

    from htp_retrieval.integrations import HTPEmbeddings

    emb = HTPEmbeddings(config=smol_k2.to_dict(), device="cpu")
    assert emb.config == smol_k2
    assert (emb.method, emb.max_length, emb.overflow) == ("htp", smol_k2.max_length, "window")
    for back in (HTPEmbeddings.from_dict(emb.to_dict()),
                 HTPEmbeddings.from_json(emb.to_json()),
                 HTPEmbeddings(**emb.model_dump()),
                 HTPEmbeddings.model_validate_json(emb.model_dump_json()),
                 HTPEmbeddings(config=smol_k2.to_json(), device="cpu"),
                 pickle.loads(pickle.dumps(emb)), copy.deepcopy(emb)):
        assert back.config == smol_k2 and back.encoder_config == emb.encoder_config
    assert emb.model_dump()["config"] == smol_k2.to_dict()
    with pytest.raises(ValueError, match="class_name 'OpenAIEmbedding' is not"):
        HTPEmbeddings(**{**emb.model_dump(), "class_name": "OpenAIEmbedding"})
    assert emb.htp_config == smol_k2 == emb.encoder.config
    ref = HTPEncoder(DEFAULT_MODEL, smol_k2, device="cpu", dtype=emb.encoder_config.dtype)
    q = np.asarray([emb.embed_query(QUERY)])
    assert _cos(q, ref.encode([QUERY], instruction=DEFAULT_QUERY_INSTRUCTION,
                              normalize=True)).min() >= 0.9999
    # one model for one config: the Chroma function with that config shares it
    assert HTPEmbeddingFunction(config=smol_k2, device="cpu")._shared().encoder is emb.encoder

    assert HTPEmbeddings(config=smol_k2, method="htp").config == smol_k2  # agrees: fine
    with pytest.raises(ValueError, match="method='vanilla-mean' conflicts with config "
                       "method 'htp'"):
        HTPEmbeddings(config=smol_k2, method="vanilla-mean")
    with pytest.raises(ValueError, match="max_length=64 conflicts with config max_length"):
        HTPEmbeddings(config=smol_k2, max_length=64)
    with pytest.raises(ValueError, match="overflow='truncate' conflicts"):
        HTPEmbeddings(config=smol_k2, overflow="truncate")
    with pytest.raises(ValueError, match=r"encoder_kwargs settings \['k'\] conflict with "
                       r"config"):
        HTPEmbeddings(config=smol_k2, encoder_kwargs={"k": 3})
    with pytest.raises(ValueError, match=r"\['tp_start'\] conflict"):
        HTPEmbeddings(config=smol_k2, model_kwargs={"tp_start": 2})
    with pytest.raises(ValueError, match="config must be an HTPConfig"):
        HTPEmbeddings(config=3)
    with pytest.raises(ValueError, match="config is missing"):
        HTPEmbeddings(config={"method": "htp"})
    with pytest.raises(ValueError, match="conflicts with config"):
        emb.method = "vanilla-mean"  # assignments are checked too
    speed = HTPEmbeddings(config=smol_k2, encoder_kwargs={"padding_side": "left"})
    assert dict(speed.encoder_config.extra) == {"padding_side": "left"}


# ------------------------------------------------------------------ CLI
def test_cli_config_file(smol_k2: HTPConfig, tmp_path: Path,
                         capsys: pytest.CaptureFixture[str]) -> None:
    from htp_retrieval.cli import main

    src = _src(tmp_path / "src")
    db = str(tmp_path / "db")
    saved = tmp_path / "k2.json"
    saved.write_text(smol_k2.to_json(), encoding="utf-8")
    results = tmp_path / "results.json"  # a results JSON carrying its config
    results.write_text(json.dumps({"dataset": "x", "config": {"method": "htp"},
                                   "htp_config": smol_k2.to_dict()}), encoding="utf-8")
    assert read_config_file(results) == smol_k2 == read_config_file(saved)
    base = ["ingest", str(src), "--db", db, "--collection", "from-file", "--quiet",
            "--device", "cpu"]

    # bad files and conflicting flags: one line naming the file, nothing created
    (tmp_path / "bad.json").write_text("{not json", encoding="utf-8")
    (tmp_path / "other.json").write_text(json.dumps({"scores": {}}), encoding="utf-8")
    for name, needle in (("bad.json", "is not JSON"), ("other.json", "holds no HTPConfig"),
                         ("missing.json", "config file not found")):
        assert main([*base, "--config", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0] and name in err[0], err
    assert main([*base, "--config", str(saved), "--method", "vanilla-mean"]) == 2
    err = capsys.readouterr().err
    assert f"--method vanilla-mean conflicts with --config {saved}" in err
    assert not Path(db).exists()

    assert main([*base, "--config", str(saved)]) == 0
    assert "2 added" in capsys.readouterr().out
    col = make_client(db).get_collection("from-file")
    assert col.configuration_json["embedding_function"]["config"]["config"] == (
        smol_k2.to_dict())
    assert collection_embedding_function(col)._shared().encoder.config == smol_k2
    # a rerun: no flags, the same file or a results JSON with it; another config is refused
    assert main(base) == 0 and "2 unchanged" in capsys.readouterr().out
    assert main([*base, "--config", str(results)]) == 0
    capsys.readouterr()
    (tmp_path / "k1.json").write_text(smol_k2.replace(k=1).to_json(), encoding="utf-8")
    assert main([*base, "--config", str(tmp_path / "k1.json")]) == 2
    err = capsys.readouterr().err
    assert "cannot change settings" in err and "config.k stored 2, requested 1" in err

    query = ["query", QUERY, "--db", db, "--collection", "from-file", "--json", "-k", "1"]
    assert main([*query, "--config", str(saved)]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == "bees.txt#c0"
    assert main([*query, "--config", str(tmp_path / "k1.json")]) == 2
    err = capsys.readouterr().err
    assert "was not made with --config" in err and "config.k stored 2, requested 1" in err


def test_cli_help_lists_config() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "htp_retrieval.cli", "ingest", "--help"],
                         capture_output=True, text=True, timeout=120, check=True)
    assert "--config FILE.json" in out.stdout and "saved HTPConfig" in out.stdout
