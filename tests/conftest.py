"""Shared fixtures: tiny random-weight Llama and Qwen2 decoders with a real tokenizer."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")
SCIFACT = os.path.abspath(os.path.join(SHARED, "beir", "scifact"))


@pytest.fixture(scope="session")
def smol_tokenizer_path() -> str:
    """Local directory of the packaged SmolLM2 (converted once from its GGUF)."""
    from htp_retrieval.models import resolve_model_path

    return resolve_model_path("smollm2-135m-instruct")[0]


def _tiny(arch: str, tokenizer_path: str):  # noqa: ANN202
    from transformers import (
        AutoTokenizer,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    common = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                  num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=4096, attn_implementation="sdpa")
    torch.manual_seed(0)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    return model.eval(), tok


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def tiny(request: pytest.FixtureRequest, smol_tokenizer_path: str):  # noqa: ANN201
    """``(model, tokenizer)``: a 6-layer random decoder (float32) and a real fast tokenizer."""
    return _tiny(request.param, smol_tokenizer_path)


@pytest.fixture(scope="session")
def tiny_llama(smol_tokenizer_path: str):  # noqa: ANN201
    return _tiny("llama", smol_tokenizer_path)


def _saved(model_and_tok: tuple, tmp_path_factory: pytest.TempPathFactory, name: str) -> str:
    model, tok = model_and_tok
    d = tmp_path_factory.mktemp(name)
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


@pytest.fixture(scope="session")
def tiny_dir(tiny_llama, tmp_path_factory) -> str:  # noqa: ANN001
    """:func:`tiny_llama` saved as a model folder (for commands that take ``--model``)."""
    return _saved(tiny_llama, tmp_path_factory, "tiny_llama")


@pytest.fixture(scope="session")
def tiny_qwen_dir(smol_tokenizer_path: str, tmp_path_factory) -> str:  # noqa: ANN001
    """A 6-layer random Qwen2 decoder saved as a model folder (the ``qwen2`` family)."""
    return _saved(_tiny("qwen2", smol_tokenizer_path), tmp_path_factory, "tiny_qwen2")
