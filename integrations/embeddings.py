"""``HTPEmbeddings``: one embeddings class for LangChain and LlamaIndex.

The class is a pydantic model that is both a :class:`langchain_core.embeddings.Embeddings`
and a LlamaIndex :class:`~llama_index.core.base.embeddings.base.BaseEmbedding`, so the same
object can be handed to either framework (or both). Queries and documents get separate
instructions; the model (an :class:`~htp_retrieval.HTPEncoder`) loads on first use and is
shared by every copy of the object in the process.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from htp_retrieval.integrations._runtime import EncoderConfig, SharedEncoder, shared_encoder
from htp_retrieval.methods import DEFAULT_QUERY_INSTRUCTION
from htp_retrieval.models import DEFAULT_MODEL

_PIP = 'pip install "htp-retrieval[langchain,llamaindex]"'
try:
    from langchain_core.embeddings import Embeddings as _LCEmbeddings
except ImportError as _e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f"HTPEmbeddings needs langchain-core ({_e}); install the extras: {_PIP}"
    ) from _e
try:
    from llama_index.core.base.embeddings.base import BaseEmbedding as _LIBaseEmbedding
    from llama_index.core.bridge.pydantic import ConfigDict, Field, model_validator
except ImportError as _e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f"HTPEmbeddings needs llama-index-core ({_e}); install the extras: {_PIP}"
    ) from _e


class HTPEmbeddings(_LIBaseEmbedding, _LCEmbeddings):
    """HTP text embeddings for LangChain and LlamaIndex (one object serves both).

    Queries are embedded with ``query_instruction`` and documents with
    ``document_instruction`` (none by default, as in the HTP paper), in both frameworks.
    Text is passed to the model as is (no newline stripping); an empty or whitespace-only
    text raises ``ValueError`` naming its index. Vectors are L2-normalized by default, so
    cosine, dot product and L2 rankings agree.

    The encoder is created on first use (not in ``__init__``) and shared by all objects with
    the same model settings in the process, copies included. Calls are serialized on the
    shared encoder; async methods run it on a worker thread, never on the event loop, and
    are safe to run many at once.

    LangChain (swap for ``HuggingFaceEmbeddings``)::

        from langchain_core.vectorstores import InMemoryVectorStore
        from htp_retrieval.integrations import HTPEmbeddings

        emb = HTPEmbeddings()                      # packaged SmolLM2-135M-Instruct, HTP
        store = InMemoryVectorStore.from_texts(["HTP adds block summary tokens."], emb)
        docs = store.as_retriever(search_kwargs={"k": 1}).invoke("What does HTP add?")
        vec = emb.embed_query("What does HTP add?")          # list[float], len 576

    LlamaIndex (swap for ``HuggingFaceEmbedding``)::

        from llama_index.core import Document, Settings, VectorStoreIndex
        from htp_retrieval.integrations import HTPEmbeddings

        Settings.embed_model = HTPEmbeddings(embed_batch_size=16)
        index = VectorStoreIndex.from_documents([Document(text="HTP adds block summaries.")])
        nodes = index.as_retriever(similarity_top_k=1).retrieve("What does HTP add?")

    Raises:
        ValueError: at validation time for a non-positive ``max_length`` or
            ``embed_batch_size``; when embedding, for an empty text (its index is named),
            an unknown method or invalid encoder settings.
        ImportError: when embedding, if a packaged model's package is missing.
    """

    model_config = ConfigDict(
        protected_namespaces=(), use_attribute_docstrings=True, populate_by_name=True
    )

    model_name: str = Field(
        default=DEFAULT_MODEL,
        description="Packaged model name, .gguf path, local directory or hub id "
        "(`model=` is accepted as an alias).",
    )
    """Packaged model name, ``.gguf`` path, local directory or hub id (``model=`` works too)."""
    method: str = Field(default="htp", description="Embedding method, e.g. htp or vanilla-mean.")
    """Embedding method or alias (``htp``, ``vanilla-mean``, ...; see ``htp_retrieval.METHODS``)."""
    query_instruction: str | None = Field(
        default=DEFAULT_QUERY_INSTRUCTION,
        description="Instruction put before queries (None: no instruction).",
    )
    """Instruction put before queries only (``None``: none)."""
    document_instruction: str | None = Field(
        default=None, description="Instruction put before documents (None: no instruction)."
    )
    """Instruction put before documents only (default ``None``, as in the paper)."""
    normalize: bool = Field(default=True, description="L2-normalize the embeddings.")
    """L2-normalize the vectors (default ``True``)."""
    max_length: int = Field(default=512, gt=0, description="Maximum text tokens per text.")
    """Maximum text tokens kept per text (longer texts are truncated)."""
    device: str = Field(default="auto", description="auto, cpu or cuda.")
    """``auto``, ``cpu`` or ``cuda``."""
    dtype: str = Field(default="bfloat16", description="bfloat16, float16 or float32.")
    """Weight dtype: ``bfloat16``, ``float16`` or ``float32``."""
    encoder_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Further HTPEncoder keyword arguments."
    )
    """Further :class:`~htp_retrieval.HTPEncoder` keyword arguments (``k``, ``segmenter``, ...)."""
    show_progress: bool = Field(
        default=False, description="tqdm bar in embed_documents / aembed_documents."
    )
    """Show a tqdm bar in LangChain's ``embed_documents`` (LlamaIndex passes its own flag)."""
    embed_batch_size: int = Field(
        default=16, gt=0, le=2048, description="Maximum texts per forward pass."
    )
    """Maximum texts per forward pass (LangChain and LlamaIndex)."""

    @model_validator(mode="before")
    @classmethod
    def _model_alias(cls, data: Any) -> Any:
        if isinstance(data, dict) and "model" in data and "model_name" not in data:
            data = dict(data)
            data["model_name"] = data.pop("model")
        return data

    @classmethod
    def class_name(cls) -> str:
        """LlamaIndex serialization name."""
        return "HTPEmbeddings"

    # ------------------------------------------------------------------ runtime
    @property
    def encoder_config(self) -> EncoderConfig:
        """The settings that identify the shared encoder."""
        return EncoderConfig.create(
            self.model_name, self.method, self.max_length, self.device, self.dtype,
            self.encoder_kwargs,
        )

    def _shared(self) -> SharedEncoder:
        return shared_encoder(self.encoder_config)

    async def _ashared(self) -> SharedEncoder:
        # The first load takes seconds: keep it off the event loop too.
        return await asyncio.to_thread(self._shared)

    @property
    def encoder(self) -> Any:
        """The shared :class:`~htp_retrieval.HTPEncoder` (loads the model on first access)."""
        return self._shared().encoder

    def _encode(
        self, shared: SharedEncoder, texts: list[str], instruction: str | None, progress: bool
    ) -> list[list[float]]:
        vecs: np.ndarray = shared.encode(
            texts,
            instruction=instruction,
            normalize=self.normalize,
            batch_size=self.embed_batch_size,
            show_progress_bar=progress,
        )
        return vecs.tolist()

    def _embed(self, texts: list[str], instruction: str | None, progress: bool = False
               ) -> list[list[float]]:
        if not texts:
            return []
        return self._encode(self._shared(), list(texts), instruction, progress)

    async def _aembed(self, texts: list[str], instruction: str | None, progress: bool = False
                      ) -> list[list[float]]:
        if not texts:
            return []
        shared = await self._ashared()
        vecs = await shared.aencode(
            list(texts),
            instruction=instruction,
            normalize=self.normalize,
            batch_size=self.embed_batch_size,
            show_progress_bar=progress,
        )
        return vecs.tolist()

    # ---------------------------------------------------------------- LangChain
    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed documents (``document_instruction``) for LangChain.

        Args:
            texts: Documents, ``[n]``.

        Returns:
            ``n`` vectors of ``hidden`` floats.

        Raises:
            ValueError: if a text is empty or whitespace-only (its index is named).
        """
        return self._embed(texts, self.document_instruction, self.show_progress)

    def embed_query(self, text: str) -> list[float]:
        """Embed one query (``query_instruction``) for LangChain.

        Returns:
            ``hidden`` floats.

        Raises:
            ValueError: if the text is empty or whitespace-only.
        """
        return self._embed([text], self.query_instruction)[0]

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        """Async :meth:`embed_documents` (worker thread; concurrent calls are batched)."""
        return await self._aembed(texts, self.document_instruction, self.show_progress)

    async def aembed_query(self, text: str) -> list[float]:
        """Async :meth:`embed_query` (runs on a worker thread)."""
        return (await self._aembed([text], self.query_instruction))[0]

    # --------------------------------------------------------------- LlamaIndex
    def _get_query_embedding(self, query: str) -> list[float]:
        """LlamaIndex query embedding (``query_instruction``), ``hidden`` floats."""
        return self._embed([query], self.query_instruction)[0]

    def _get_text_embedding(self, text: str) -> list[float]:
        """LlamaIndex document embedding (``document_instruction``), ``hidden`` floats."""
        return self._embed([text], self.document_instruction)[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        """LlamaIndex batch document embeddings, ``[n][hidden]``."""
        return self._embed(texts, self.document_instruction)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        """Async :meth:`_get_query_embedding` (runs on a worker thread)."""
        return (await self._aembed([query], self.query_instruction))[0]

    async def _aget_text_embedding(self, text: str) -> list[float]:
        """Async :meth:`_get_text_embedding` (runs on a worker thread)."""
        return (await self._aembed([text], self.document_instruction))[0]

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        """Async :meth:`_get_text_embeddings` (runs on a worker thread)."""
        return await self._aembed(texts, self.document_instruction)


def _install_llamaindex_resolve_shim() -> None:
    """Keep LlamaIndex from wrapping :class:`HTPEmbeddings` as a LangChain model.

    ``llama_index.core.embeddings.utils.resolve_embed_model`` (used by ``Settings`` and the
    indexes) wraps any LangChain ``Embeddings`` in ``LangchainEmbedding`` when the
    ``langchain`` package is importable, which needs ``llama-index-embeddings-langchain``
    and would bypass this class's LlamaIndex methods. The shim returns ``HTPEmbeddings``
    objects as they are (setting the callback manager as LlamaIndex does) and delegates
    everything else to the original function.
    """
    import sys

    from llama_index.core.embeddings import utils as li_utils

    original = li_utils.resolve_embed_model
    if getattr(original, "_htp_shim", False):
        return

    def resolve_embed_model(embed_model: Any = None, callback_manager: Any = None) -> Any:
        if isinstance(embed_model, HTPEmbeddings):
            from llama_index.core.settings import Settings

            embed_model.callback_manager = callback_manager or Settings.callback_manager
            return embed_model
        return original(embed_model, callback_manager=callback_manager)

    resolve_embed_model._htp_shim = True  # type: ignore[attr-defined]
    resolve_embed_model.__doc__ = original.__doc__
    for name, mod in list(sys.modules.items()):
        if name.startswith("llama_index.") and getattr(mod, "resolve_embed_model", None) is original:
            mod.resolve_embed_model = resolve_embed_model  # type: ignore[attr-defined]


_install_llamaindex_resolve_shim()

__all__ = ["HTPEmbeddings"]
