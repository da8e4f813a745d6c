"""Shared setup for the integration tests: offline, no telemetry."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
os.environ.setdefault("RAGAS_DO_NOT_TRACK", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


import socket  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def chroma_server(tmp_path: Path):  # noqa: ANN201
    """``http://127.0.0.1:PORT`` of a ``chroma run`` server on a temporary directory."""
    pytest.importorskip("chromadb")
    from htp_retrieval.integrations.chroma import make_client

    chroma = Path(sys.executable).with_name("chroma")
    exe = str(chroma) if chroma.exists() else "chroma"
    port = free_port()
    proc = subprocess.Popen(
        [exe, "run", "--path", str(tmp_path / "server-db"), "--host", "127.0.0.1",
         "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"chroma run exited with {proc.returncode}")
            try:
                make_client(url).heartbeat()
                break
            except Exception:
                if time.monotonic() > deadline:
                    pytest.fail("chroma server did not start within 60 s")
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, smol_tokenizer_path: str) -> str:
    """A 3-layer random Llama with SmolLM2's tokenizer, saved as a local model folder (for
    Ray actors and CLI subprocesses)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(smol_tokenizer_path)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=1024))
    out = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)
