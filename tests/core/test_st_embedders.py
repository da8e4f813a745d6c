"""Finetuned decoder embedders in sentence-transformers format (htp_retrieval.st_format).

Tiny random-weight folders built with sentence-transformers itself: a Qwen3 model whose
tokenizer appends EOS through its post-processor (as Qwen3-Embedding's does), a Mistral
model with BOS and EOS (e5-mistral style), both last-token pooled and normalized, and a
mean-pooled Qwen2 model with a default prompt. ``method="vanilla"`` must reproduce
``SentenceTransformer(folder).encode`` for both padding sides; HTP must change the vector
but keep the model's readout.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from htp_retrieval import HTPEncoder
from htp_retrieval.st_format import is_st_folder, read_st_folder

TEXTS = [
    "Graphene is a single layer of carbon atoms. It conducts heat very well.",
    "short one",
    "A much longer third text, with several sentences. It has a second one! And a "
    "question? Yes, and a fourth sentence to make it longer than the others.",
]
QUERY_PROMPT = "Instruct: Given a claim, retrieve documents that support it\nQuery:"


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(1)


def _build(root: Path, name: str, arch: str, tok_path: str, *, template: str | None,
           pooling: str, normalize: bool, prompts: dict[str, str],
           default_prompt_name: str | None = None, padding_side: str = "right") -> str:
    """Save a tiny sentence-transformers folder; returns its path."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.normalize import Normalize
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling
    from tokenizers.processors import TemplateProcessing
    from transformers import (
        AutoTokenizer,
        MistralConfig,
        MistralModel,
        Qwen2Config,
        Qwen2Model,
        Qwen3Config,
        Qwen3Model,
    )

    tok = AutoTokenizer.from_pretrained(tok_path)
    # plain text input, as the released models' folders (a chat template would make
    # sentence-transformers 6 render each text as a chat message)
    tok.chat_template = None
    if template is not None:
        bos, eos = tok.bos_token, tok.eos_token
        single = template.format(bos=bos, eos=eos)
        specials = [(t, tok.convert_tokens_to_ids(t)) for t in (bos, eos) if t in single]
        tok.backend_tokenizer.post_processor = TemplateProcessing(
            single=single, pair=single.replace("$A", "$A $B:1"), special_tokens=specials)
    common = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                  num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=2048)
    torch.manual_seed(0)
    if arch == "qwen3":
        model = Qwen3Model(Qwen3Config(head_dim=16, **common))
    elif arch == "mistral":
        model = MistralModel(MistralConfig(**common))
    else:
        model = Qwen2Model(Qwen2Config(**common))
    base = root / f"{name}-base"
    model.save_pretrained(base)
    tok.save_pretrained(base)
    cfg_path = base / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["padding_side"] = padding_side
    cfg_path.write_text(json.dumps(cfg))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr = Transformer(str(base))
        modules = [tr, Pooling(64, pooling_mode=pooling)] + ([Normalize()] if normalize else [])
        st = SentenceTransformer(modules=modules, prompts=prompts,
                                 default_prompt_name=default_prompt_name, device="cpu")
    out = root / name
    st.save(str(out))
    return str(out)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory, smol_tokenizer_path: str
            ) -> dict[str, str]:
    root = tmp_path_factory.mktemp("st")
    return {
        "qwen3-last": _build(root, "qwen3-last", "qwen3", smol_tokenizer_path,
                             template="$A {eos}", pooling="lasttoken", normalize=True,
                             prompts={"query": QUERY_PROMPT, "document": ""},
                             padding_side="left"),
        "mistral-last": _build(root, "mistral-last", "mistral", smol_tokenizer_path,
                               template="{bos} $A {eos}", pooling="lasttoken",
                               normalize=True, prompts={"query": "query: ",
                                                        "passage": "passage: "}),
        "qwen2-mean": _build(root, "qwen2-mean", "qwen2", smol_tokenizer_path,
                             template="{bos} $A", pooling="mean", normalize=False,
                             prompts={"query": "Represent this query: ", "document": ""},
                             default_prompt_name="query"),
    }


_ST_CACHE: dict[str, object] = {}


def _st(path: str, padding_side: str):  # noqa: ANN202
    from sentence_transformers import SentenceTransformer

    if path not in _ST_CACHE:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _ST_CACHE[path] = SentenceTransformer(path, device="cpu")
    model = _ST_CACHE[path]
    model.tokenizer.padding_side = padding_side  # type: ignore[attr-defined]
    return model


def _enc(path: str, method: str = "vanilla", **kw: object) -> HTPEncoder:
    return HTPEncoder(path, method=method, dtype="float32", device="cpu", **kw)


def test_reads_settings(folders: dict[str, str]) -> None:
    q3 = read_st_folder(folders["qwen3-last"])
    assert q3.pooling == "last" and q3.normalize and q3.appends_eos
    assert q3.lead_ids == () and len(q3.trail_ids) == 1
    assert q3.padding_side == "left"
    assert q3.prompts["query"] == QUERY_PROMPT and q3.default_prompt_name is None
    mi = read_st_folder(folders["mistral-last"])
    assert len(mi.lead_ids) == 1 and len(mi.trail_ids) == 1 and mi.padding_side == "right"
    mean = read_st_folder(folders["qwen2-mean"])
    assert mean.pooling == "mean" and not mean.normalize and not mean.appends_eos
    assert mean.default_prompt_name == "query" and mean.include_prompt
    assert is_st_folder(folders["qwen2-mean"]) and not is_st_folder(folders["qwen2-mean"] + "/1_Pooling")


@pytest.mark.parametrize("name", ["qwen3-last", "mistral-last", "qwen2-mean"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_vanilla_matches_sentence_transformers(folders: dict[str, str], name: str,
                                               side: str) -> None:
    path = folders[name]
    ref = _st(path, side).encode(TEXTS, batch_size=3)
    enc = _enc(path, padding_side=side)
    assert enc.exit_layer == enc.n_layers  # no early exit
    got = enc.encode(TEXTS, batch_size=3)
    assert got.shape == ref.shape
    assert _cos(got, ref).min() >= 0.9999
    if read_st_folder(path).normalize:
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("name", ["qwen3-last", "mistral-last"])
def test_prompts_applied_as_sentence_transformers(folders: dict[str, str], name: str) -> None:
    path = folders[name]
    st = _st(path, "right")
    enc = _enc(path)
    got = enc.encode(TEXTS, prompt_name="query")
    assert _cos(got, st.encode(TEXTS, prompt_name="query")).min() >= 0.9999
    # a prompt ending in a space: the text's first token absorbs it, as in one string
    got = enc.encode(TEXTS, prompt="find: ")
    assert _cos(got, st.encode(TEXTS, prompt="find: ")).min() >= 0.9999
    # the prompt changes the vector
    assert _cos(got, enc.encode(TEXTS)).min() < 0.999
    with pytest.raises(ValueError, match="not among the model's prompts"):
        enc.encode(TEXTS, prompt_name="nope")


def test_default_prompt_and_include_prompt(folders: dict[str, str], tmp_path: Path) -> None:
    path = folders["qwen2-mean"]
    st = _st(path, "right")
    enc = _enc(path)
    # no prompt given: the model's default_prompt_name applies, as in sentence-transformers
    assert _cos(enc.encode(TEXTS), st.encode(TEXTS)).min() >= 0.9999
    assert _cos(enc.encode(TEXTS, prompt=""), st.encode(TEXTS, prompt="")).min() >= 0.9999
    # include_prompt=False: prompt tokens (and the BOS before them) are not mean-pooled
    excl = tmp_path / "excl"
    shutil.copytree(path, excl)
    cfg = json.loads((excl / "1_Pooling" / "config.json").read_text())
    cfg["include_prompt"] = False
    (excl / "1_Pooling" / "config.json").write_text(json.dumps(cfg))
    st2 = _st(str(excl), "left")
    got = _enc(str(excl), padding_side="left").encode(TEXTS)
    ref = st2.encode(TEXTS)
    assert _cos(got, ref).min() >= 0.9999
    assert _cos(got, enc.encode(TEXTS)).min() < 0.9999


def test_htp_keeps_model_pooling(folders: dict[str, str]) -> None:
    path = folders["qwen3-last"]
    st = read_st_folder(path)
    htp = _enc(path, "htp")
    assert htp.spec.pooling == "last" and htp.spec.placeholders == "hierarchical"
    assert htp.exit_layer == htp.n_layers
    for lay in htp.build_layouts(TEXTS):
        assert lay.input_ids[lay.last_position] == st.trail_ids[-1]  # EOS is read
        assert lay.last_position == len(lay) - 1
        assert lay.n_placeholders >= 2
        assert lay.input_ids[0] not in (htp.pst_id, htp.bpst_id)  # a sink comes first
    van = _enc(path).encode(TEXTS)
    got = htp.encode(TEXTS)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert _cos(got, van).max() < 0.9999
    # with a prompt the prompt comes first and no sink is added
    lay = htp.build_layouts(TEXTS[:1], instruction=QUERY_PROMPT)[0]
    vlay = _enc(path).build_layouts(TEXTS[:1], instruction=QUERY_PROMPT)[0]
    n_prompt = len(vlay) - vlay.n_text_tokens - len(st.trail_ids)
    assert lay.input_ids[:n_prompt] == vlay.input_ids[:n_prompt]


def test_htp_mean_pools_no_placeholder(folders: dict[str, str]) -> None:
    path = folders["qwen2-mean"]
    htp = _enc(path, "htp")
    assert htp.spec.pooling == "mean"
    for lay in htp.build_layouts(TEXTS, instruction="Represent this query: "):
        pooled = set(lay.pool_positions)
        assert not pooled & (set(lay.pst_positions) | set(lay.bpst_positions))
        # BOS, prompt and text tokens are pooled, as the model's own mean pooling
        assert len(pooled) == len(lay) - lay.n_placeholders
    assert _cos(htp.encode(TEXTS), _enc(path).encode(TEXTS)).max() < 0.9999


def test_refuses_unsupported(folders: dict[str, str], tmp_path: Path) -> None:
    nv = tmp_path / "nv-embed"
    nv.mkdir()
    (nv / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]))
    (nv / "config.json").write_text(json.dumps({"model_type": "nvembed",
                                                "architectures": ["NVEmbedModel"]}))
    with pytest.raises(ValueError, match="bidirectional attention or a latent-attention"):
        HTPEncoder(str(nv))
    dense = tmp_path / "dense"
    shutil.copytree(folders["qwen2-mean"], dense)
    mods = json.loads((dense / "modules.json").read_text())
    mods.append({"idx": 2, "name": "2", "path": "2_Dense",
                 "type": "sentence_transformers.models.Dense"})
    (dense / "modules.json").write_text(json.dumps(mods))
    with pytest.raises(ValueError, match="module Dense is not supported"):
        read_st_folder(dense)
    cls = tmp_path / "cls"
    shutil.copytree(folders["qwen2-mean"], cls)
    (cls / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 64, "pooling_mode_cls_token": True}))
    with pytest.raises(ValueError, match="pooling mode 'cls' is not supported"):
        read_st_folder(cls)
    with pytest.raises(ValueError, match="template"):
        _enc(folders["qwen2-mean"], "prompteol-last")
    chat = tmp_path / "chat"
    shutil.copytree(folders["qwen2-mean"], chat)
    cfg = json.loads((chat / "sentence_bert_config.json").read_text())
    cfg["modality_config"]["message"] = {"method": "forward", "format": "flat",
                                         "method_output_name": "last_hidden_state"}
    (chat / "sentence_bert_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="chat template"):
        read_st_folder(chat)


def test_prompt_needs_st_folder(tiny_llama) -> None:  # noqa: ANN001
    model, tok = tiny_llama
    enc = HTPEncoder(model, "vanilla-mean", tokenizer=tok)
    with pytest.raises(ValueError, match="sentence-transformers"):
        enc.encode(["a text"], prompt_name="query")


def test_htp_embeddings_picks_prompts(folders: dict[str, str]) -> None:
    pytest.importorskip("langchain_core")
    from htp_retrieval.integrations import HTPEmbeddings

    path = folders["mistral-last"]
    st = _st(path, "right")
    emb = HTPEmbeddings(model_name=path, method="vanilla", dtype="float32", device="cpu")
    q = np.asarray([emb.embed_query(TEXTS[0])])
    assert _cos(q, st.encode_query([TEXTS[0]])).min() >= 0.9999
    d = np.asarray(emb.embed_documents(TEXTS))
    assert _cos(d, st.encode_document(TEXTS)).min() >= 0.9999  # the "passage" prompt
    own = HTPEmbeddings(model_name=path, method="vanilla", dtype="float32", device="cpu",
                        query_instruction="find: ")
    q2 = np.asarray([own.embed_query(TEXTS[0])])
    assert _cos(q2, st.encode([TEXTS[0]], prompt="find: ")).min() >= 0.9999
