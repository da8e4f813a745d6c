"""``HTPEmbeddings``: one embeddings class for LangChain and LlamaIndex.

The class is a pydantic model that is both a :class:`langchain_core.embeddings.Embeddings`
and a LlamaIndex :class:`~llama_index.core.base.embeddings.base.BaseEmbedding`, so the same
object can be handed to either framework (or both). Queries and documents get separate
instructions; the model (an :class:`~htp_retrieval.HTPEncoder`) loads on first use and is
shared by every copy of the object in the process.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any, Literal

import numpy as np

from htp_retrieval.centering import Centering, Side
from htp_retrieval.config import SETTING_KEYS, HTPConfig
from htp_retrieval.integrations._runtime import (
    EncoderConfig,
    SharedEncoder,
    as_htp_config,
    canonical_dtype,
    check_device,
    check_follows_config,
    check_texts,
    shared_encoder,
)
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
    from llama_index.core.bridge.pydantic import (
        ConfigDict,
        Field,
        field_serializer,
        field_validator,
        model_validator,
    )
    from pydantic import SkipValidation, WithJsonSchema  # llama-index-core requires pydantic 2
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

    Finetuned embedding models: ``model_name`` may be a local sentence-transformers folder
    (Qwen3-Embedding, gte-Qwen2-instruct, e5-mistral; see docs/FINETUNED.md). The encoder
    then uses the model's own pooling, special tokens, last layer and ``max_seq_length``;
    queries get the model's ``query`` prompt and documents its ``document`` (or
    ``passage``/``corpus``) prompt, as ``encode_query``/``encode_document`` of
    sentence-transformers choose them (its ``default_prompt_name`` where it has no such
    prompt). A ``query_instruction``/``document_instruction`` given explicitly is used as
    the prompt text instead, verbatim. ``method="vanilla"`` reproduces
    sentence-transformers; ``htp`` adds HTP's placeholders on top.

    Long texts: ``max_length`` defaults to the model's context window, and a longer text is
    embedded whole in overlapping windows (``overflow="window"``); ``overflow="truncate"``
    cuts it to ``max_length`` tokens and logs a warning naming the text, ``"error"`` raises.
    For chunked retrieval with each chunk embedded in the context of its whole document
    (late chunking), see :meth:`embed_late_chunks` and
    :mod:`htp_retrieval.integrations.late_chunking`.

    One config: ``config`` takes a resolved :class:`~htp_retrieval.config.HTPConfig` (e.g.
    ``HTPConfig.from_json(...)`` of a results JSON's config, or ``encoder.config`` of an
    encoder you tried), used as is; ``method``, ``max_length`` and ``overflow`` then follow
    it, and :attr:`htp_config` is the config the shared encoder embeds with::

        cfg = HTPConfig.for_model("smollm2-135m-instruct", "htp", k=2)
        emb = HTPEmbeddings(config=cfg)            # or config=cfg.to_dict() / cfg.to_json()
        assert emb.htp_config == cfg

    Centring: ``centering`` (a :class:`~htp_retrieval.centering.Centering`, its dict or a
    saved file; :meth:`fit_centering` fits one from a corpus and a sample of real queries)
    centres queries on its query mean and documents on its document mean, which lifts
    decoder embeddings out of their narrow cone (docs/INTEGRATIONS.md, "Centring")::

        cen = emb.fit_centering(corpus_texts, sample_queries)
        emb = HTPEmbeddings(centering=cen)          # or centering="centering.json"

    Arguments carried over from ``HuggingFaceEmbeddings`` / ``HuggingFaceEmbedding`` keep
    their meaning: ``text_instruction`` for ``document_instruction``, ``model_kwargs`` for loading (``device``, ``dtype``/``torch_dtype``, and
    :class:`~htp_retrieval.HTPEncoder` keywords), ``encode_kwargs`` for encoding
    (``batch_size``, ``normalize_embeddings``, ``show_progress_bar``), ``model=`` for
    ``model_name=``. Any other unknown argument is an error, never ignored.

    Raises:
        ValueError: at construction (pydantic ``ValidationError``) for an unknown argument
            or ``model_kwargs``/``encode_kwargs`` key, an unknown method, dtype or device, an
            unknown encoder keyword, an ``overflow`` other than window/truncate/error, or a
            non-positive ``max_length`` or ``embed_batch_size``, a ``config`` that is not one,
            or a ``config`` together with a different ``method``/``max_length``/``overflow``
            or with settings in ``encoder_kwargs``; when embedding, for a text
            without content (its index is named), a text over ``max_length`` with
            ``overflow="error"``, or invalid encoder settings.
        TypeError: when embedding, if a single string is passed where a list is expected.
        ImportError: when embedding, if a packaged model's package is missing.
    """

    model_config = ConfigDict(
        protected_namespaces=(), use_attribute_docstrings=True, populate_by_name=True,
        extra="forbid", validate_assignment=True,
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
    max_length: int | None = Field(
        default=None, gt=0,
        description="Text tokens per forward pass (None: the model's context window).",
    )
    """Text tokens per forward pass (default ``None``: the model's context window less a
    small reserve, :func:`~htp_retrieval.long_text.default_max_length`; 8064 for SmolLM2).
    A longer text is handled by ``overflow``."""
    overflow: Literal["window", "truncate", "error"] = Field(
        default="window",
        description="A text longer than max_length: window (embedded whole in overlapping "
        "windows), truncate (cut, with a warning naming it) or error.",
    )
    """What a text longer than ``max_length`` tokens gets: ``window`` (default; embedded
    whole, in overlapping windows whose vectors are averaged by their token counts),
    ``truncate`` (cut to ``max_length`` tokens; the encoder logs a warning naming the text's
    index, its token count and how many tokens were dropped) or ``error`` (``ValueError``
    naming the text)."""
    device: str = Field(default="auto", description="auto, cpu or cuda.")
    """``auto``, ``cpu`` or ``cuda``."""
    dtype: str = Field(default="auto", description="auto, bfloat16, float16 or float32.")
    """Weight dtype: ``auto`` (default: bf16 on a GPU or a CPU where native bf16 measured as fast
    as fp32, float32 on other CPUs; :func:`htp_retrieval.dtypes.resolve_dtype`), ``bfloat16``, ``float16`` or
    ``float32`` (aliases ``bf16``, ``fp16``, ``fp32`` and ``torch.dtype`` objects are
    accepted)."""
    encoder_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Further HTPEncoder keyword arguments."
    )
    """Further :class:`~htp_retrieval.HTPEncoder` keyword arguments (``k``, ``segmenter``, ...)."""
    config: Annotated[
        HTPConfig | None, SkipValidation, WithJsonSchema({"type": ["object", "null"]})
    ] = Field(
        default=None,
        description="A resolved HTPConfig (or its dict / JSON), used as is; method, "
        "max_length and overflow follow it.",
    )
    """A resolved :class:`~htp_retrieval.config.HTPConfig`, used as is (``None``: resolved
    from ``method``, ``max_length``, ``overflow`` and ``encoder_kwargs`` by the encoder).
    E.g. read from a results JSON or ``encoder.config.to_json()``; a dict
    (:meth:`~htp_retrieval.config.HTPConfig.to_dict`) or its JSON string is accepted and
    serialized back as the dict. ``method``, ``max_length`` and ``overflow`` follow it;
    giving a different value for one of them, or any setting in ``encoder_kwargs``
    (``k``, ``tp_start``, ``preset``, ...; :data:`~htp_retrieval.config.SETTING_KEYS`),
    together with it raises ``ValueError``: change the config instead
    (:meth:`~htp_retrieval.config.HTPConfig.replace`)."""
    centering: Annotated[
        Centering | None, SkipValidation, WithJsonSchema({"type": ["object", "null"]})
    ] = Field(
        default=None,
        description="A Centering (or its dict, or a path to a saved one): queries and "
        "documents centred on its means.",
    )
    """A :class:`~htp_retrieval.centering.Centering` fitted with this model, method and
    these instructions (:meth:`fit_centering`), its ``to_dict()``, or the path of one saved
    with ``Centering.save``: queries are then centred on its query mean and documents (and
    late chunks) on its document mean, and come back L2-normalised. ``None`` (default): no
    centring. Fit it once on the corpus and a query sample and keep it fixed while a vector
    store is filled: vectors centred with different means do not mix."""
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
    def _carried_over(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if "class_name" in data:  # LlamaIndex's model_dump() adds it: a round trip
            data = dict(data)
            name = data.pop("class_name")
            if name != cls.class_name():
                raise ValueError(f"class_name {name!r} is not {cls.class_name()!r}: these "
                                 "arguments describe another embedding class")
        return carry_over_kwargs(data, set(cls.model_fields))

    @field_validator("method")
    @classmethod
    def _check_method(cls, v: str) -> str:
        from htp_retrieval.methods import get_method

        get_method(v)
        return v

    @field_validator("dtype", mode="before")
    @classmethod
    def _check_dtype(cls, v: Any) -> str:
        return canonical_dtype(v)

    @field_validator("device")
    @classmethod
    def _check_device(cls, v: str) -> str:
        return check_device(v)

    @field_validator("encoder_kwargs")
    @classmethod
    def _check_encoder_kwargs(cls, v: dict[str, Any]) -> dict[str, Any]:
        check_encoder_kwargs(v)
        return v

    @field_validator("config", mode="before")
    @classmethod
    def _check_config(cls, v: Any) -> HTPConfig | None:
        return as_htp_config(v)

    @field_serializer("config")
    def _dump_config(self, v: HTPConfig | None) -> dict[str, Any] | None:
        return None if v is None else v.to_dict()

    @field_validator("centering", mode="before")
    @classmethod
    def _check_centering(cls, v: Any) -> Centering | None:
        return Centering.coerce(v)

    @field_serializer("centering")
    def _dump_centering(self, v: Centering | None) -> dict[str, Any] | None:
        return None if v is None else v.to_dict()

    @model_validator(mode="after")
    def _follow_config(self) -> HTPEmbeddings:
        cfg = self.config
        if cfg is None:
            return self
        names = ("method", "max_length", "overflow")
        check_follows_config(cfg, {n: getattr(self, n) for n in names
                                   if n in self.model_fields_set}, self.encoder_kwargs)
        for name in names:  # set without validation: they follow the config, unset by the user
            self.__dict__[name] = getattr(cfg, name)
        return self

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
            self.encoder_kwargs, overflow=self.overflow, htp_config=self.config,
        )

    @property
    def htp_config(self) -> HTPConfig:
        """The resolved :class:`~htp_retrieval.config.HTPConfig` the shared encoder embeds
        with (``config`` itself when given; loads the model on first access). Save it
        (``.to_json()``) to embed with exactly these settings later:
        ``HTPEmbeddings(config=...)``, ``htp-retrieval ingest --config FILE``."""
        return self._shared().encoder.config

    def _shared(self) -> SharedEncoder:
        return shared_encoder(self.encoder_config)

    async def _ashared(self) -> SharedEncoder:
        # The first load takes seconds: keep it off the event loop too.
        return await asyncio.to_thread(self._shared)

    def _st_prompt(self, field: str, names: tuple[str, ...]) -> str | None:
        """The instruction passed to the encoder for queries or documents.

        For a sentence-transformers folder whose ``field`` was not set explicitly: the
        first of the model's prompts named in ``names`` (``None``, the model's default
        prompt, when it has none of them); otherwise ``field``'s value (an explicit
        ``None`` on such a folder is ``""``: no prompt).
        """
        value: str | None = getattr(self, field)
        from htp_retrieval.st_format import is_st_folder, read_prompts

        if not is_st_folder(self.model_name):
            return value
        if field in self.model_fields_set:
            return "" if value is None else value
        prompts, _ = read_prompts(self.model_name)
        return next((prompts[n] for n in names if n in prompts), None)

    @property
    def _query_prompt(self) -> str | None:
        """Instruction (or sentence-transformers prompt) for queries."""
        return self._st_prompt("query_instruction", ("query",))

    @property
    def _document_prompt(self) -> str | None:
        """Instruction (or sentence-transformers prompt) for documents."""
        return self._st_prompt("document_instruction", ("document", "passage", "corpus"))

    @property
    def encoder(self) -> Any:
        """The shared :class:`~htp_retrieval.HTPEncoder` (loads the model on first access)."""
        return self._shared().encoder

    def _centred(self, shared: SharedEncoder, vecs: np.ndarray, side: Side) -> np.ndarray:
        """``vecs`` centred on ``centering``'s ``side`` mean (as they are without one)."""
        cen = self.centering
        if cen is None:
            return vecs
        cen.check_config(shared.encoder.config, model=shared.encoder.model_name)
        return cen.apply(vecs, side)

    def _embed(self, texts: list[str], instruction: str | None, side: Side,
               progress: bool = False) -> list[list[float]]:
        check_texts(texts)
        if not texts:
            return []
        shared = self._shared()
        vecs = shared.encode(list(texts), instruction=instruction, normalize=self.normalize,
                             batch_size=self.embed_batch_size, show_progress_bar=progress)
        return self._centred(shared, vecs, side).tolist()

    async def _aembed(self, texts: list[str], instruction: str | None, side: Side,
                      progress: bool = False) -> list[list[float]]:
        check_texts(texts)
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
        return self._centred(shared, vecs, side).tolist()

    def fit_centering(self, documents: list[str], queries: list[str], *,
                      query_source: str = "") -> Centering:
        """Fit a :class:`~htp_retrieval.centering.Centering` for this object: the documents
        and queries embedded as :meth:`embed_documents` and :meth:`embed_query` embed them
        (without centring), their means recorded with the encoder config and instructions.
        Pass it as ``centering=`` (or assign ``emb.centering = ...``), or ``save`` it.

        Args:
            documents: ``[n_docs]`` texts of the corpus (or its chunks).
            queries: ``[n_queries]`` queries of the same kind as real ones (e.g. a task's
                train or dev queries, or queries already served), never those it will be
                evaluated on.
            query_source: Where the query sample came from (recorded).

        Raises:
            TypeError: if a list is a single string.
            ValueError: if a list is empty or a text carries no content.
        """
        from htp_retrieval.centering import fit_centering

        check_texts(documents)
        check_texts(queries)
        shared = self._shared()
        with shared.lock:
            return fit_centering(shared.encoder, documents, queries,
                                 query_instruction=self._query_prompt,
                                 document_instruction=self._document_prompt,
                                 query_source=query_source,
                                 show_progress_bar=self.show_progress)

    # ------------------------------------------------------------ late chunking
    def embed_late_chunks(
        self,
        documents: list[str],
        spans: list[list[tuple[int, int]]],
        *,
        window_tokens: int | None = None,
    ) -> list[np.ndarray]:
        """Contextual chunk vectors ("late chunking", Günther et al. 2024, arXiv 2409.04701).

        Each document runs through the model once per window of whole chunks (one window
        for a document within ``max_length`` tokens), and each chunk's vector is pooled from
        its own tokens, which have seen the text before them in the window. Documents get
        ``document_instruction``; vectors are L2-normalized when ``normalize`` is set. Calls
        are serialized on the shared encoder. The framework recipes are in
        :mod:`htp_retrieval.integrations.late_chunking`.

        Args:
            documents: ``[n_docs]`` full document texts.
            spans: ``[n_docs][n_chunks]`` character spans ``(start, end)`` into each document
                (``documents[i][start:end]`` is the chunk), in document order.
            window_tokens: Text tokens per forward pass (default and maximum:
                ``max_length``).

        Returns:
            ``[n_docs]`` float32 arrays ``[n_chunks, hidden]``, chunks in input order.

        Raises:
            TypeError: if ``documents`` is a single string.
            ValueError: for a method with last-token pooling, a document that is empty or
                has no spans (its index is named), a span outside its document, or a
                ``window_tokens`` out of range.
        """
        from htp_retrieval.chunking import Chunk

        check_texts(documents)
        if len(spans) != len(documents):
            raise ValueError(f"got {len(documents)} documents but {len(spans)} span lists: "
                             "pass one list of (start, end) spans per document")
        chunks = [[Chunk(j, int(a), int(b)) for j, (a, b) in enumerate(doc_spans)]
                  for doc_spans in spans]
        if not documents:
            return []
        shared = self._shared()
        with shared.lock:
            return shared.encoder.encode_late_chunks(
                list(documents), chunks, instruction=self._document_prompt,
                window_tokens=window_tokens, normalize=self.normalize,
                batch_size=self.embed_batch_size, show_progress_bar=self.show_progress,
                centering=self.centering)

    # ---------------------------------------------------------------- LangChain
    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed documents (``document_instruction``) for LangChain.

        Args:
            texts: Documents, ``[n]``.

        Returns:
            ``n`` vectors of ``hidden`` floats.

        Raises:
            TypeError: if ``texts`` is a single string.
            ValueError: if a text carries no content (its index is named).
        """
        return self._embed(texts, self._document_prompt, "document", self.show_progress)

    def embed_query(self, text: str) -> list[float]:
        """Embed one query (``query_instruction``) for LangChain.

        Returns:
            ``hidden`` floats.

        Raises:
            TypeError: if ``text`` is not a string.
            ValueError: if the text carries no content.
        """
        _one_text(text)
        return self._embed([text], self._query_prompt, "query")[0]

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        """Async :meth:`embed_documents` (worker thread; concurrent calls are batched)."""
        return await self._aembed(texts, self._document_prompt, "document", self.show_progress)

    async def aembed_query(self, text: str) -> list[float]:
        """Async :meth:`embed_query` (runs on a worker thread)."""
        _one_text(text)
        return (await self._aembed([text], self._query_prompt, "query"))[0]

    # --------------------------------------------------------------- LlamaIndex
    def get_text_embedding_batch(self, texts: list[str], show_progress: bool = False,
                                 **kwargs: Any) -> list[list[float]]:
        """LlamaIndex batch embedding; a bare string raises ``TypeError`` (it would be
        embedded character by character)."""
        check_texts(texts)
        return super().get_text_embedding_batch(texts, show_progress=show_progress, **kwargs)

    async def aget_text_embedding_batch(self, texts: list[str], show_progress: bool = False,
                                        **kwargs: Any) -> list[list[float]]:
        """Async :meth:`get_text_embedding_batch`."""
        check_texts(texts)
        return await super().aget_text_embedding_batch(texts, show_progress=show_progress,
                                                        **kwargs)

    def _get_query_embedding(self, query: str) -> list[float]:
        """LlamaIndex query embedding (``query_instruction``), ``hidden`` floats."""
        return self._embed([query], self._query_prompt, "query")[0]

    def _get_text_embedding(self, text: str) -> list[float]:
        """LlamaIndex document embedding (``document_instruction``), ``hidden`` floats."""
        return self._embed([text], self._document_prompt, "document")[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        """LlamaIndex batch document embeddings, ``[n][hidden]``."""
        return self._embed(texts, self._document_prompt, "document")

    async def _aget_query_embedding(self, query: str) -> list[float]:
        """Async :meth:`_get_query_embedding` (runs on a worker thread)."""
        return (await self._aembed([query], self._query_prompt, "query"))[0]

    async def _aget_text_embedding(self, text: str) -> list[float]:
        """Async :meth:`_get_text_embedding` (runs on a worker thread)."""
        return (await self._aembed([text], self._document_prompt, "document"))[0]

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        """Async :meth:`_get_text_embeddings` (runs on a worker thread)."""
        return await self._aembed(texts, self._document_prompt, "document")


_LOAD_KEYS = {"device": "device", "dtype": "dtype", "torch_dtype": "dtype"}
_ENCODE_KEYS = {"batch_size": "embed_batch_size", "normalize_embeddings": "normalize",
                "show_progress_bar": "show_progress"}
_HINTS = {"batch_size": "embed_batch_size=N (or encode_kwargs={'batch_size': N})",
          "normalize_embeddings": "normalize=... (or encode_kwargs={'normalize_embeddings': ...})",
          "show_progress_bar": "show_progress=...", "torch_dtype": "dtype=...",
          "model_path": "model_name=...", "instruction": "query_instruction=..."}


def _one_text(text: Any) -> None:
    if not isinstance(text, str):
        raise TypeError(f"expected one text (str), got {type(text).__name__}")


def check_encoder_kwargs(kwargs: dict[str, Any]) -> None:
    """Check that every key is a keyword of :class:`~htp_retrieval.HTPEncoder`.

    Raises:
        ValueError: naming the unknown keys and the accepted ones.
    """
    from htp_retrieval.encoder import RUNTIME_KEYS

    own = {"model", "method", "max_length", "overflow", "device", "dtype"}
    named = ("device_map", "batch_size", "max_tokens_per_batch", "preset")
    accepted = [p for p in (*SETTING_KEYS, *RUNTIME_KEYS, *named) if p not in own]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise ValueError(f"unknown encoder keyword(s) {unknown}: HTPEncoder accepts "
                         f"{', '.join(accepted)}")


def carry_over_kwargs(data: dict[str, Any], fields: set[str]) -> dict[str, Any]:
    """Map arguments users carry over from ``HuggingFaceEmbeddings`` onto our fields.

    ``model`` -> ``model_name``; ``text_instruction`` -> ``document_instruction``;
    ``model_kwargs`` keys ``device``, ``dtype``/``torch_dtype``
    (also inside a nested ``model_kwargs``) -> those fields, other keys -> ``encoder_kwargs``
    (checked against :class:`~htp_retrieval.HTPEncoder`); ``encode_kwargs`` keys
    ``batch_size`` -> ``embed_batch_size``, ``normalize_embeddings`` -> ``normalize``,
    ``show_progress_bar`` -> ``show_progress``.

    Args:
        data: The keyword arguments given to the constructor.
        fields: The model's field names.

    Returns:
        The arguments with carried-over names replaced.

    Raises:
        ValueError: for a key with no meaning here, a value given twice with two different
            values, or an unknown argument (with the name to use instead where there is one).
    """
    data = dict(data)
    out: dict[str, Any] = {}

    def put(field: str, value: Any, given_as: str) -> None:
        if field in out and out[field] != value:
            raise ValueError(f"{field} given twice with different values ({out[field]!r} and "
                             f"{value!r} from {given_as})")
        out[field] = value

    if "model" in data:
        put("model_name", data.pop("model"), "model")
    if "text_instruction" in data:  # LlamaIndex HuggingFaceEmbedding's name
        put("document_instruction", data.pop("text_instruction"), "text_instruction")
    model_kwargs = dict(data.pop("model_kwargs", None) or {})
    nested = model_kwargs.pop("model_kwargs", None) or {}
    model_kwargs.update({k: v for k, v in nested.items() if k in ("dtype", "torch_dtype")})
    extra_nested = sorted(set(nested) - {"dtype", "torch_dtype"})
    if extra_nested:
        raise ValueError(f"model_kwargs['model_kwargs'] keys {extra_nested} have no meaning "
                         "here (only dtype/torch_dtype)")
    encoder_kwargs: dict[str, Any] = {}
    for k, v in model_kwargs.items():
        if k in _LOAD_KEYS:
            put(_LOAD_KEYS[k], v, f"model_kwargs[{k!r}]")
        else:
            encoder_kwargs[k] = v
    if encoder_kwargs:
        check_encoder_kwargs(encoder_kwargs)
        put("encoder_kwargs", {**dict(data.pop("encoder_kwargs", None) or {}),
                               **encoder_kwargs}, "model_kwargs")
    encode_kwargs = dict(data.pop("encode_kwargs", None) or {})
    for k, v in encode_kwargs.items():
        if k not in _ENCODE_KEYS:
            raise ValueError(f"encode_kwargs key {k!r} has no meaning here: accepted keys are "
                             f"{', '.join(_ENCODE_KEYS)}")
        put(_ENCODE_KEYS[k], v, f"encode_kwargs[{k!r}]")
    for k, v in data.items():
        if k not in fields:
            hint = f": use {_HINTS[k]}" if k in _HINTS else ""
            raise ValueError(f"unknown argument {k!r}{hint}")
        put(k, v, k)
    return out


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
