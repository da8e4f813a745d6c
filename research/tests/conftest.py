"""The tiny random decoders of tests/conftest.py, reused here (imported, not copied)."""

from tests.conftest import smol_tokenizer_path, tiny, tiny_dir, tiny_llama  # noqa: F401
