"""Chroma: a registered HTP embedding function, resumable ingestion and querying.

* :class:`HTPEmbeddingFunction` is registered with ``chromadb`` under the name
  ``htp-retrieval``; its config is stored with the collection, the whole resolved
  :class:`~htp_retrieval.config.HTPConfig` included, so a persisted collection reopened in a
  new process (after ``import htp_retrieval.integrations.chroma``) embeds new documents and
  queries with the same model, instructions and config.
* :func:`ingest` loads a folder of ``.txt``/``.md`` files or a BEIR ``corpus.jsonl`` into a
  collection: stable ids, batched writes, progress bar, idempotent (a re-run adds nothing)
  and resumable (a killed run is completed by the next one, without duplicates). Documents
  it cannot use (empty, undecodable, malformed) are reported with their ids.
* :func:`query` searches a collection made by :func:`ingest`.

Chroma's default embedding function (which downloads a model) is never used, and telemetry
is off (``anonymized_telemetry=False``) for every client made here.

Example:
    >>> from htp_retrieval.integrations.chroma import ingest, query
    >>> report = ingest("essays/", db="chroma-db", collection="essays")  # doctest: +SKIP
    >>> hits = query("How do startups raise money?", db="chroma-db",
    ...              collection="essays", n_results=3)                   # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

import numpy as np

from htp_retrieval.centering import CENTRE_KEY, Centering, Side
from htp_retrieval.chunking import DEFAULT_CHUNK_TOKENS
from htp_retrieval.config import SETTING_KEYS, HTPConfig
from htp_retrieval.dtypes import resolve_dtype
from htp_retrieval.integrations._runtime import (
    EncoderConfig,
    as_htp_config,
    canonical_dtype,
    check_device,
    check_follows_config,
    check_model,
    check_texts,
    resolve_config_cheaply,
    shared_encoder,
    split_settings,
)
from htp_retrieval.integrations.sources import (
    TEXT_SUFFIXES,
    Skipped,
    SourceDoc,
    check_documents,
    corpus_file,
    count_source,
    file_doc,
    list_folder,
    read_beir_lines,
    read_source,
)
from htp_retrieval.methods import DEFAULT_QUERY_INSTRUCTION, get_method
from htp_retrieval.models import DEFAULT_MODEL

os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
try:
    import chromadb
    from chromadb.api.types import Documents, EmbeddingFunction
    from chromadb.api.types import Embeddings as ChromaEmbeddings
    from chromadb.config import Settings
    from chromadb.utils.embedding_functions import register_embedding_function
except ImportError as _e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f"the Chroma integration needs chromadb ({_e}): pip install \"htp-retrieval[chroma]\""
    ) from _e

EF_NAME = "htp-retrieval"
_IDENTITY_KEYS = ("model_name", "method", "query_instruction", "document_instruction",
                  "normalize", "max_length", "dtype", "encoder_kwargs", "overflow",
                  "chunking", "chunk_size", "chunk_overlap", "config", "centering")
_LEGACY = {"max_length": 512, "overflow": "truncate", "chunking": "none"}
"""Values of keys a collection made before they existed does not store (it was made so).
A collection stored without ``config`` (made before configs were stored) embeds with the
config its settings resolve to today."""
REFIT_GROWTH = 0.25
""":func:`ingest` refits a centred collection's document mean (``refit_centering=None``)
when its vector count differs by more than this fraction from the count the mean was
fitted on."""
_REFIT_PENDING = "htp_refit_pending"  # collection metadata: the centring a refit moves to
_refitting: ContextVar[tuple[str, str] | None] = ContextVar("htp_refitting", default=None)
CHUNK_WRITE = 64
"""Chunks per write: a long document's chunks are written in groups of this many."""
_WINDOWS: dict[str, int | None] = {}


def model_window(model_name: str) -> int | None:
    """The default ``max_length`` of a model (its context window less the layout reserve,
    :func:`~htp_retrieval.long_text.default_max_length`), read from its config without
    loading the weights.

    Returns:
        Text tokens, or ``None`` where the config cannot be read (the encoder then decides
        when it loads).
    """
    if model_name not in _WINDOWS:
        from htp_retrieval.long_text import default_max_length
        from htp_retrieval.models import resolve_model_path

        try:
            from transformers import AutoConfig

            path, _ = resolve_model_path(model_name)
            cfg = AutoConfig.from_pretrained(path)
            _WINDOWS[model_name] = default_max_length(
                getattr(cfg, "max_position_embeddings", None))
        except Exception:  # noqa: BLE001 - unreadable here: the encoder resolves it
            return None
    return _WINDOWS[model_name]


@register_embedding_function
class HTPEmbeddingFunction(EmbeddingFunction[Documents]):
    """Chroma embedding function backed by a shared :class:`~htp_retrieval.HTPEncoder`.

    Documents (``__call__``) get ``document_instruction``; queries (``embed_query``, used by
    ``collection.query(query_texts=...)``) get ``query_instruction``. The model loads on the
    first call and is shared with :class:`~htp_retrieval.integrations.HTPEmbeddings` objects
    that resolve to the same config.

    The collection stores the whole resolved :class:`~htp_retrieval.config.HTPConfig`
    (:meth:`get_config`'s ``config``, equal to the loaded encoder's ``encoder.config``), and
    a reopened collection embeds with exactly that config, even where the library's
    defaults have changed since.

    Args:
        model_name: Packaged model name, ``.gguf`` path, local directory (stored as an
            absolute path) or hub id.
        method: HTP method or alias (``htp``, ``vanilla-mean``, ...; stored by its canonical
            name). Default ``htp``; with ``config``, the config's.
        query_instruction: Instruction before queries (``None``: none).
        document_instruction: Instruction before documents (default none).
        normalize: L2-normalize the vectors (default ``True``).
        max_length: Text tokens per forward pass (``None``, the default: the model's context
            window, or a sentence-transformers folder's ``max_seq_length``, resolved and
            stored as that number, so a reopened collection uses the same; with ``config``,
            the config's).
        overflow: What a text longer than ``max_length`` gets: ``window`` (default; embedded
            whole in overlapping windows), ``truncate`` (cut; :meth:`embed_documents_array`
            reports which) or ``error`` (with ``config``, the config's). A collection stored
            without this setting was made with ``truncate`` and ``max_length`` 512, and
            keeps them.
        chunking: How :func:`ingest` turns a document into vectors (stored with the
            collection; this function embeds whatever texts it is given): ``none`` (one
            vector per document, default), ``naive`` (each chunk embedded on its own) or
            ``late`` (each chunk pooled from one pass over its document,
            :meth:`~htp_retrieval.HTPEncoder.encode_late_chunks`).
        chunk_size: Chunk size in tokens (:func:`~htp_retrieval.chunking.split_chunks`).
        chunk_overlap: Overlap of consecutive chunks in tokens.
        dtype: ``auto`` (default), ``bfloat16``, ``float16`` or ``float32``. ``auto`` is
            resolved here for ``device`` (:func:`htp_retrieval.dtypes.resolve_dtype`: bf16
            on a GPU or a CPU where native bf16 measured as fast as fp32, float32 on
            other CPUs) and the concrete
            dtype is what the collection stores, so every vector of a collection is made in
            one dtype wherever it is reopened.
        encoder_kwargs: Further :class:`~htp_retrieval.HTPEncoder` keyword arguments (must
            be JSON-serializable: they are stored in the collection config). With ``config``
            only the speed-only ones (``padding_side``, ...): the settings are in the config.
        device: ``auto``, ``cpu`` or ``cuda`` (not stored: a reopened collection uses
            ``auto``).
        batch_size: Maximum texts per forward pass (not stored).
        config: A resolved :class:`~htp_retrieval.config.HTPConfig` (or its
            :meth:`~htp_retrieval.config.HTPConfig.to_dict` / JSON), e.g. a results JSON's
            or ``encoder.config`` of an encoder you tried, used and stored as is; ``None``:
            resolved from ``method``, ``max_length``, ``overflow`` and ``encoder_kwargs``
            (:meth:`resolved_config`).
        centering: A :class:`~htp_retrieval.centering.Centering` (or its dict, or a saved
            file) fitted with this model, config and these instructions: documents and
            chunks are centred on its document mean, queries on its query mean, and the
            centring is stored with the collection. :func:`ingest` fits one for a new
            collection when given ``center_queries``. ``None`` (default): vectors as the
            encoder makes them.

    Raises:
        ValueError: if ``max_length`` or ``batch_size`` is not positive, the method, dtype,
            device, overflow or chunking is unknown, the chunk size and overlap are
            invalid, ``config`` is not a valid config, or ``config`` comes with a different
            ``method``, ``max_length`` or ``overflow`` or with settings in
            ``encoder_kwargs`` (checked here, before any model is loaded).
    """

    def __init__(
        self,
        model_name: str = DEFAULT_MODEL,
        method: str | None = None,
        *,
        query_instruction: str | None = DEFAULT_QUERY_INSTRUCTION,
        document_instruction: str | None = None,
        normalize: bool = True,
        max_length: int | None = None,
        dtype: str = "auto",
        encoder_kwargs: dict[str, Any] | None = None,
        device: str = "auto",
        batch_size: int = 16,
        overflow: str | None = None,
        chunking: str = "none",
        chunk_size: int = DEFAULT_CHUNK_TOKENS,
        chunk_overlap: int = 0,
        config: HTPConfig | Mapping[str, Any] | str | None = None,
        centering: Centering | Mapping[str, Any] | str | None = None,
    ) -> None:
        from htp_retrieval.chunking import CHUNKINGS, check_chunk_settings
        from htp_retrieval.long_text import OVERFLOWS

        htp = as_htp_config(config)
        encoder_kwargs = dict(encoder_kwargs or {})
        if htp is not None:
            check_follows_config(htp, {"method": method, "max_length": max_length,
                                       "overflow": overflow}, encoder_kwargs)
            method, max_length, overflow = htp.method, htp.max_length, htp.overflow
        method = "htp" if method is None else method
        overflow = "window" if overflow is None else overflow
        if (max_length is not None and max_length < 1) or batch_size < 1:
            raise ValueError(f"max_length and batch_size must be >= 1, got {max_length} and "
                             f"{batch_size}")
        if overflow not in OVERFLOWS:
            raise ValueError(f"overflow {overflow!r} is not supported: use one of "
                             f"{', '.join(OVERFLOWS)}")
        if chunking not in CHUNKINGS:
            raise ValueError(f"chunking {chunking!r} is not supported: use one of "
                             f"{', '.join(CHUNKINGS)}")
        check_chunk_settings(chunk_size, chunk_overlap)
        if chunking == "late" and get_method(method).pooling != "mean":
            raise ValueError(f"late chunking needs a mean-pooled method, not {method!r}: use "
                             "htp, vanilla-mean or tp-mean, or chunking 'naive'")
        local = Path(model_name).expanduser()
        if local.exists():  # stored absolute, so the collection reopens from anywhere
            model_name = str(local.resolve())
        self.model_name = model_name
        self.method = get_method(method).name  # aliases stored by their canonical name
        self.query_instruction = query_instruction
        self.document_instruction = document_instruction
        self.normalize = normalize
        self.max_length = max_length
        self.overflow = overflow
        self.chunking = chunking
        self.chunk_size = chunk_size
        self.chunk_overlap = chunk_overlap
        self.device = check_device(device)
        self.dtype = resolve_dtype(canonical_dtype(dtype), self.device)
        self.encoder_kwargs = encoder_kwargs
        self.batch_size = batch_size
        self.config: HTPConfig | None = htp
        """The explicit config (``None``: resolved from the settings, :meth:`resolved_config`)."""
        self.centering: Centering | None = Centering.coerce(centering)
        """Centring applied to every vector (``None``: none), stored with the collection."""
        self._raw: dict[tuple[str, ...], np.ndarray] = {}  # uncentred vectors kept by ingest
        # keys of ``_raw`` whose texts were cut to max_length -> the cut chunks' indices
        self._raw_cut: dict[tuple[str, ...], list[int]] = {}
        self._resolved: tuple[tuple[Any, ...], HTPConfig] | None = None
        self._stores_config = True  # False: rebuilt from a collection stored without one

    def _settings_key(self) -> tuple[Any, ...]:
        return (self.model_name, self.method, self.max_length, self.overflow,
                json.dumps(self.encoder_kwargs, sort_keys=True, default=repr))

    def _plain_config(self) -> EncoderConfig:
        """The encoder key of the settings without a config (the encoder resolves it)."""
        return EncoderConfig.create(self.model_name, self.method, self.max_length,
                                    self.device, self.dtype, self.encoder_kwargs,
                                    overflow=self.overflow)

    def resolved_config(self) -> HTPConfig:
        """The :class:`~htp_retrieval.config.HTPConfig` this function embeds with.

        ``config`` when given. Otherwise the settings (``method``, ``max_length``,
        ``overflow``, the setting keys of ``encoder_kwargs``) resolved as
        :class:`~htp_retrieval.HTPEncoder` resolves them: from the model's ``config.json``
        alone where that gives the encoder's config
        (:func:`~htp_retrieval.integrations._runtime.resolve_config_cheaply`), else (a
        sentence-transformers folder, an uncached hub id) by loading the shared encoder and
        reading its ``encoder.config``. The result is kept, and ``max_length`` is set to
        its number.

        Raises:
            ValueError, ImportError, OSError: what loading the encoder raises, where it had
                to be loaded (invalid settings, a model that cannot be loaded).
        """
        if self.config is not None:
            return self.config
        if self._resolved is None or self._resolved[0] != self._settings_key():
            cfg = resolve_config_cheaply(self.model_name, self.method, self.max_length,
                                         self.overflow, self.encoder_kwargs)
            if cfg is None:
                cfg = shared_encoder(self._plain_config()).encoder.config
            self.max_length = cfg.max_length
            self._resolved = (self._settings_key(), cfg)
        return self._resolved[1]

    def resolved_max_length(self) -> int:
        """``max_length``, with ``None`` resolved (:meth:`resolved_config`); the resolved
        number is kept."""
        return self.resolved_config().max_length

    def _config(self) -> EncoderConfig:
        cfg = self.resolved_config()
        _, runtime = split_settings(self.encoder_kwargs)
        return EncoderConfig.create(self.model_name, cfg.method, cfg.max_length, self.device,
                                    self.dtype, runtime, overflow=cfg.overflow, htp_config=cfg)

    def _shared(self) -> Any:
        return shared_encoder(self._config())

    def load(self) -> None:
        """Load the model now (first use loads it otherwise); raises what loading raises.

        Raises:
            ImportError: if a packaged model's package is missing.
            ValueError: for a model that cannot be found or invalid encoder settings.
        """
        check_model(self.model_name)
        self._shared()

    def _centre(self, vecs: np.ndarray, side: Side, *, centred: bool = True) -> np.ndarray:
        """``vecs`` centred on :attr:`centering`'s ``side`` mean (as they are without one, or
        with ``centred=False``)."""
        if self.centering is None or not centred:
            return vecs
        enc = self._shared().encoder
        self.centering.check_config(enc.config, model=enc.model_name)
        return self.centering.apply(vecs, side)

    def _encode(self, texts: Sequence[str], instruction: str | None, side: Side,
                progress: bool | Callable[[int], object] = False,
                truncated: list[int] | None = None, *, centred: bool = True) -> np.ndarray:
        check_texts(texts)
        if len(texts) == 0:
            return np.zeros((0, 0), dtype=np.float32)
        shared = self._shared()
        with shared.lock:  # the stats read below belong to this call
            vecs = shared.encoder.encode(
                list(texts), instruction=instruction, normalize=self.normalize,
                batch_size=self.batch_size, show_progress_bar=progress is True,
                progress=progress if callable(progress) else None,
            )
            if truncated is not None:
                truncated.extend(int(i) for i, _ in shared.encoder.last_stats.truncated)
        return self._centre(vecs, side, centred=centred)

    def __call__(self, input: Documents) -> ChromaEmbeddings:
        """Embed documents: ``[n]`` texts -> ``n`` float32 vectors of ``hidden`` values
        (centred on the document mean when the function has a :attr:`centering`).

        Raises:
            TypeError: if ``input`` is a single string.
            ValueError: if a text carries no content (its index is named).
        """
        return list(self._encode(input, self.document_instruction, "document"))

    def embed_query(self, input: Documents) -> ChromaEmbeddings:
        """Embed queries (``query_instruction``): ``[n]`` texts -> ``n`` vectors (centred on
        the query mean when the function has a :attr:`centering`)."""
        return list(self._encode(input, self.query_instruction, "query"))

    def embed_documents_array(
        self, texts: Sequence[str], *, show_progress_bar: bool = False,
        progress: Callable[[int], object] | None = None,
        truncated: list[int] | None = None,
    ) -> np.ndarray:
        """Embed documents as one ``[n, hidden]`` float32 array (used by :func:`ingest`).

        Args:
            texts: Documents, ``[n]``.
            show_progress_bar: The encoder's own tqdm bar.
            progress: Called after each forward pass with the number of documents embedded.
            truncated: If given, the indices of the texts cut to ``max_length`` are appended
                (only ``overflow="truncate"`` cuts texts).

        Raises:
            ValueError: if a text carries no content, or is longer than ``max_length`` with
                ``overflow="error"``.
        """
        keys = [("doc", t) for t in texts]
        if self._raw and all(k in self._raw for k in keys):  # embedded while fitting
            vecs = np.stack([self._raw[k] for k in keys])
            if truncated is not None:
                truncated.extend(i for i, k in enumerate(keys) if k in self._raw_cut)
            for k in set(keys):
                self._raw.pop(k, None)
            if progress is not None:
                progress(len(texts))
            return self._centre(vecs, "document")
        return self._encode(texts, self.document_instruction, "document",
                            progress or show_progress_bar, truncated)

    def split(self, text: str) -> list[Any]:
        """Chunks of a document by this collection's chunk settings, in the model's tokens.

        Returns:
            ``[n_chunks]`` :class:`~htp_retrieval.chunking.Chunk` (character spans of
            ``text``; one chunk for a text within ``chunk_size``).
        """
        from htp_retrieval.chunking import split_chunks

        tokenizer = self._shared().encoder.tokenizer
        return split_chunks(text, tokenizer, chunk_tokens=self.chunk_size,
                            chunk_overlap=self.chunk_overlap)

    def embed_chunks(self, text: str, chunks: Sequence[Any], *, centred: bool = True,
                     truncated: list[int] | None = None) -> np.ndarray:
        """Embed the chunks of one document by this collection's chunking.

        ``naive``: each chunk's text on its own (with the document instruction); ``late``:
        one pass per window of whole chunks over the document
        (:meth:`~htp_retrieval.HTPEncoder.encode_late_chunks`).

        Args:
            text: The document.
            chunks: Its chunks (:meth:`split`).
            centred: Centre on :attr:`centering`'s document mean (when there is one).
            truncated: If given, the indices of chunks cut to ``max_length`` tokens are
                appended (:meth:`check_chunk_fits` makes this rare: a chunk the splitter
                made a few tokens longer than ``chunk_size``).

        Returns:
            ``[n_chunks, hidden]`` float32 array.

        Raises:
            ValueError: if the chunking is ``none``, or the encoder refuses the text.
        """
        key = ("chunks", text, *(f"{c.start}:{c.end}" for c in chunks))
        if key in self._raw:  # embedded while fitting the centring
            cut = self._raw_cut.pop(key, [])
            if truncated is not None:
                truncated.extend(cut)
            return self._centre(self._raw.pop(key), "document", centred=centred)
        if self.chunking == "naive":
            return self._encode([c.text(text) for c in chunks], self.document_instruction,
                                "document", truncated=truncated, centred=centred)
        if self.chunking != "late":
            raise ValueError(f"embed_chunks needs chunking 'naive' or 'late', not "
                             f"{self.chunking!r}")
        shared = self._shared()
        with shared.lock:
            enc = shared.encoder
            vecs = enc.encode_late_chunks(
                [text], [list(chunks)], instruction=self.document_instruction,
                normalize=self.normalize, batch_size=self.batch_size)[0]
            if truncated is not None and enc.last_stats.truncated:
                truncated.extend(_late_cut_chunks(enc, text, chunks))
        return self._centre(vecs, "document", centred=centred)

    def check_chunk_fits(self) -> None:
        """Refuse a chunk size that does not fit one forward pass.

        A chunk of a chunked collection is embedded in one pass of at most ``max_length``
        text tokens (:data:`~htp_retrieval.long_text.WINDOW_MARGIN` of them kept free), so
        ``chunk_size`` above that would cut every long chunk (``late``, or
        ``overflow="truncate"``) or split it into windows (``naive`` with ``window``).
        :func:`ingest` and the Ray ingestion call it before they create a collection (an
        existing collection keeps the settings it was made with; a chunk cut there is named
        in the report).

        Raises:
            ValueError: naming both numbers and the two fixes.
        """
        if self.chunking != "none":
            _check_chunk_fits(self.chunking, self.chunk_size, self.resolved_max_length())

    @staticmethod
    def name() -> str:
        """Registered name, stored in the collection config."""
        return EF_NAME

    def default_space(self) -> str:  # type: ignore[override]
        """Cosine distance (the vectors are compared by angle)."""
        return "cosine"

    def supported_spaces(self) -> list[str]:  # type: ignore[override]
        """All of Chroma's spaces (vectors are normalized by default)."""
        return ["cosine", "l2", "ip"]

    def _stored(self, *, with_config: bool = True) -> dict[str, Any]:
        out = {
            "model_name": self.model_name,
            "method": self.method,
            "query_instruction": self.query_instruction,
            "document_instruction": self.document_instruction,
            "normalize": self.normalize,
            "max_length": self.resolved_max_length() if with_config else self.max_length,
            "dtype": self.dtype,
            "encoder_kwargs": self.encoder_kwargs,
            "overflow": self.overflow,
            "chunking": self.chunking,
            "chunk_size": self.chunk_size,
            "chunk_overlap": self.chunk_overlap,
        }
        if with_config and self._stores_config:
            out["config"] = self.resolved_config().to_dict()
        if self.centering is not None:  # absent, not None: plain collections store as before
            out["centering"] = self.centering.to_dict()
        return out

    def get_config(self) -> dict[str, Any]:
        """JSON config stored with the collection (device and batch size excluded).

        ``config`` is the whole resolved :class:`~htp_retrieval.config.HTPConfig`
        (:meth:`resolved_config`; ``to_dict()``), equal to the shared encoder's
        ``encoder.config``; a function rebuilt from a collection stored without one
        returns what is stored (no ``config`` key).
        """
        return self._stored()

    @staticmethod
    def build_from_config(config: dict[str, Any]) -> HTPEmbeddingFunction:
        """Rebuild from :meth:`get_config` output (``HTP_RETRIEVAL_DEVICE`` picks the device).

        See :meth:`from_stored`.
        """
        return HTPEmbeddingFunction.from_stored(
            config, device=os.environ.get("HTP_RETRIEVAL_DEVICE", "auto"))

    @classmethod
    def from_stored(cls, config: Mapping[str, Any], *, device: str = "auto",
                    batch_size: int = 16) -> HTPEmbeddingFunction:
        """Rebuild from a stored :meth:`get_config`, on ``device``.

        With a stored ``config`` the function embeds with exactly that
        :class:`~htp_retrieval.config.HTPConfig` (whatever today's defaults are), and
        :meth:`get_config` returns what was stored. A key missing from an older config takes
        the value that config was made with (``max_length`` 512, ``overflow`` ``truncate``,
        ``chunking`` ``none``); without ``config`` its settings resolve with today's defaults.

        Raises:
            ValueError: as :meth:`validate_config`, or for stored settings that disagree with
                the stored config.
        """
        cls.validate_config(dict(config))
        values = {k: config[k] for k in _IDENTITY_KEYS if k in config}
        htp = values.pop("config", None)
        if htp is None:
            ef = cls(**{**_LEGACY, **values}, device=device, batch_size=batch_size)
            ef._stores_config = False
            return ef
        kwargs = dict(values.pop("encoder_kwargs", None) or {})
        _, runtime = split_settings(kwargs)
        ef = cls(**values, encoder_kwargs=runtime, config=htp, device=device,
                 batch_size=batch_size)
        ef.encoder_kwargs = kwargs  # as stored: its settings are in the config already
        return ef

    @staticmethod
    def validate_config(config: dict[str, Any]) -> None:
        """Reject configs with unknown keys, without a model, or with an invalid ``config``.

        Raises:
            ValueError: on an unknown key, a missing ``model_name`` or a ``config`` that is
                not a valid :class:`~htp_retrieval.config.HTPConfig` dict.
        """
        unknown = set(config) - set(_IDENTITY_KEYS)
        if unknown:
            raise ValueError(f"unknown {EF_NAME} config keys: {sorted(unknown)}")
        if not config.get("model_name"):
            raise ValueError(f"{EF_NAME} config needs model_name")
        if config.get("config") is not None:
            try:
                as_htp_config(config["config"])
            except (ValueError, TypeError) as e:
                raise ValueError(f"{EF_NAME} config holds an invalid 'config' ({e}): drop "
                                 "that key to resolve the settings again") from None

    def validate_config_update(self, old_config: dict[str, Any], new_config: dict[str, Any]
                               ) -> None:
        """Refuse changes that would mix incompatible vectors in one collection.

        Each requested key is compared with the stored one. A requested ``config`` is
        compared with the stored config (a collection stored without one: the config its
        settings resolve to), field by field; the settings in ``encoder_kwargs`` are then
        covered by the config, and only its speed-only keys are compared.

        Raises:
            SettingsConflictError: naming each setting that differs, with the stored and the
                requested value.
        """
        asked = as_htp_config(new_config.get("config"))
        with_config = asked is not None
        plain = [k for k in _IDENTITY_KEYS if k in new_config and k not in ("config", "centering")
                 and not (with_config and k == "encoder_kwargs")]
        changed = [k for k in plain if new_config[k] != old_config.get(k)]
        pairs = [f"{k} stored {old_config.get(k)!r}, requested {new_config[k]!r}"
                 for k in changed]
        if asked is not None:
            if "encoder_kwargs" in new_config:
                old_rt = split_settings(dict(old_config.get("encoder_kwargs") or {}))[1]
                new_rt = split_settings(dict(new_config["encoder_kwargs"] or {}))[1]
                if old_rt != new_rt:
                    pairs.append(f"encoder_kwargs stored {old_rt!r}, requested {new_rt!r}")
            pairs += config_diff(stored_htp_config(old_config), asked, skip=changed)
        if "centering" in new_config:  # a function without one leaves the stored one alone
            pairs += centering_conflict(old_config.get("centering"), new_config["centering"])
        if pairs:
            raise SettingsConflictError(
                f"cannot change settings of an existing collection ({'; '.join(pairs)}): leave "
                "them out to reuse the stored settings, or ingest into a new collection (or "
                "drop this one)")

    def __repr__(self) -> str:
        shown = self._stored(with_config=False)
        if self.config is not None or self._resolved is not None:
            shown["config"] = self.resolved_config().to_dict()
        return f"HTPEmbeddingFunction({shown!r})"


def centering_conflict(stored: Mapping[str, Any] | None, requested: Mapping[str, Any] | None
                       ) -> list[str]:
    """Why a collection's stored centring cannot become ``requested`` (empty: it can).

    The stored vectors were centred on the stored document mean, so the document side must
    stay as it is (or stay absent); the query mean may change freely (a new query sample
    changes no stored vector).
    """
    if stored is None and requested is None:
        return []
    if stored is None or requested is None:
        return [f"centering stored {'none' if stored is None else 'fitted'}, requested "
                f"{'none' if requested is None else 'fitted'} (stored vectors would mix "
                "centred and uncentred ones)"]
    a, b = Centering.from_dict(stored), Centering.from_dict(requested)
    moved = not np.array_equal(a.document_mean, b.document_mean)
    if moved and _refitting.get() == (a.document_digest(), b.document_digest()):
        moved = False  # refit_documents re-centred every stored vector on the new mean
    if moved or a.document_instruction != b.document_instruction or a.config != b.config \
            or a.model != b.model:
        return ["centering document side differs from the stored one (its vectors were "
                "centred on the stored document mean): only the query side may change"]
    return []


def stored_htp_config(stored: Mapping[str, Any]) -> HTPConfig:
    """The :class:`~htp_retrieval.config.HTPConfig` a collection embeds with, from its
    stored :meth:`HTPEmbeddingFunction.get_config`: its ``config``, or for a collection
    stored without one, the config its settings resolve to today
    (:meth:`HTPEmbeddingFunction.resolved_config`; may load the model).

    Raises:
        ValueError: as :meth:`HTPEmbeddingFunction.validate_config`.
    """
    htp = as_htp_config(stored.get("config"))
    if htp is not None:
        return htp
    return HTPEmbeddingFunction.from_stored(stored).resolved_config()


def config_diff(stored: HTPConfig, requested: HTPConfig, *, skip: Sequence[str] = ()
                ) -> list[str]:
    """``config.NAME stored X, requested Y`` for each setting (flat name,
    :data:`~htp_retrieval.config.SETTING_KEYS`) that differs, names in ``skip`` left out."""
    a, b = stored.flat(), requested.flat()
    return [f"config.{k} stored {a[k]!r}, requested {b[k]!r}" for k in SETTING_KEYS
            if a[k] != b[k] and k not in skip]


# --------------------------------------------------------------------------- errors
class SettingsConflictError(ValueError):
    """Requested settings differ from those stored with an existing collection."""


class CollectionNotFoundError(LookupError):
    """The named collection does not exist (the message lists the existing ones)."""


class DatabaseNotFoundError(FileNotFoundError):
    """An embedded Chroma directory that should exist does not (no ``chroma.sqlite3``)."""


_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]{1,510}[a-zA-Z0-9]$")


def check_collection_name(name: str) -> str:
    """Check a collection name against Chroma's rule, before anything is created.

    Returns:
        ``name`` unchanged.

    Raises:
        ValueError: unless it has 3-512 characters of ``[a-zA-Z0-9._-]`` and starts and ends
            with a letter or digit.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"invalid collection name {name!r}: use 3-512 characters of "
                         "[a-zA-Z0-9._-], starting and ending with a letter or digit")
    return name


# --------------------------------------------------------------------------- clients
def _is_url(db: Any) -> bool:
    return isinstance(db, str) and db.startswith(("http://", "https://"))


def make_client(db: str | os.PathLike[str] | Any | None = None, *, create: bool = True) -> Any:
    """A Chroma client with telemetry off.

    Args:
        db: A client object (returned as is), an ``http://host:port`` URL (``HttpClient``
            to a ``chroma run`` server), or a directory for the embedded
            ``PersistentClient`` (default ``./chroma``).
        create: Create the directory of an embedded database if it does not exist
            (``False`` for commands that only read, so a mistyped path creates nothing).

    Returns:
        The ``chromadb`` client.

    Raises:
        DatabaseNotFoundError: with ``create=False``, if the directory holds no database.
        ConnectionError: if the server at the URL does not answer.
    """
    if db is not None and not isinstance(db, (str, os.PathLike)):
        return db
    settings = Settings(anonymized_telemetry=False)
    target = str(db) if db is not None else "chroma"
    if _is_url(target):
        url = urlparse(target)
        try:
            return chromadb.HttpClient(
                host=url.hostname or "127.0.0.1",
                port=url.port or (443 if url.scheme == "https" else 8000),
                ssl=url.scheme == "https",
                settings=settings,
            )
        except ValueError as e:  # chromadb: "Could not connect to a Chroma server..."
            raise ConnectionError(f"cannot reach the Chroma server at {target}: start it "
                                  "('chroma run --path DIR --port PORT') or fix --db") from e
    if Path(target).exists() and not Path(target).is_dir():
        raise FileExistsError(f"--db {target} is a file, not a Chroma database directory: "
                              "give a directory (or an http://HOST:PORT server)")
    if not create and not (Path(target) / "chroma.sqlite3").is_file():
        raise DatabaseNotFoundError(f"no Chroma database at {target} (give the --db that "
                                    "ingest wrote to)")
    return chromadb.PersistentClient(path=target, settings=settings)


def _names(client: Any) -> list[str]:
    return sorted(c.name if hasattr(c, "name") else str(c) for c in client.list_collections())


def get_collection(client: Any, collection: str) -> Any:
    """An existing collection, with its stored :class:`HTPEmbeddingFunction`.

    Raises:
        CollectionNotFoundError: if it does not exist (the message lists those that do).
        ValueError: if it was not made with an :class:`HTPEmbeddingFunction`.
    """
    names = _names(client)
    if collection not in names:
        have = ", ".join(names) if names else "none"
        raise CollectionNotFoundError(f"collection {collection!r} not found (collections "
                                      f"here: {have})")
    col = client.get_collection(collection)
    return client.get_collection(collection, embedding_function=collection_embedding_function(col))


def open_collection(
    client: Any, collection: str, *, embedding_function: HTPEmbeddingFunction | None = None
) -> Any:
    """Get or create a collection that carries an :class:`HTPEmbeddingFunction`.

    Args:
        client: A Chroma client.
        collection: Collection name.
        embedding_function: For a new collection (default: :class:`HTPEmbeddingFunction`
            defaults). For an existing one it must match the stored config; ``None`` uses
            the stored one.

    Returns:
        The collection, whose embedding function is an :class:`HTPEmbeddingFunction`.

    Raises:
        ValueError: for an invalid name, or if the existing collection has another
            embedding function (:class:`SettingsConflictError`: a different HTP config).
    """
    check_collection_name(collection)
    if collection in _names(client):
        col = client.get_collection(collection)
        stored = collection_embedding_function(col)
        if embedding_function is not None and stored.get_config() != embedding_function.get_config():
            stored.validate_config_update(stored.get_config(), embedding_function.get_config())
        if embedding_function is not None:  # keep the caller's device and batch size
            stored.device, stored.batch_size = embedding_function.device, embedding_function.batch_size
        return client.get_collection(collection, embedding_function=stored)
    ef = embedding_function or HTPEmbeddingFunction()
    return client.get_or_create_collection(collection, embedding_function=ef)


def prepare_collection(
    client: Any, collection: str, *, embedding_function: HTPEmbeddingFunction | None = None
) -> tuple[Any, HTPEmbeddingFunction, bool]:
    """Open a collection for writing; a new one is created only once its model has loaded.

    For a new collection the model is checked and loaded first, so a mistyped model, a
    missing package or an unusable device leaves no collection behind.

    Returns:
        ``(collection, embedding_function, created)``.

    Raises:
        ValueError, ImportError, FileNotFoundError: as :func:`open_collection` and
            :meth:`HTPEmbeddingFunction.load`, before anything is created.
    """
    check_collection_name(collection)
    created = collection not in _names(client)
    if created:
        (embedding_function or HTPEmbeddingFunction()).load()
    col = open_collection(client, collection, embedding_function=embedding_function)
    return col, collection_embedding_function(col), created


def collection_embedding_function(col: Any) -> HTPEmbeddingFunction:
    """The :class:`HTPEmbeddingFunction` stored in a collection's config.

    Raises:
        ValueError: if the collection was not made with an :class:`HTPEmbeddingFunction`.
    """
    ef = (col.configuration or {}).get("embedding_function")
    if not isinstance(ef, HTPEmbeddingFunction):
        name = getattr(ef, "name", lambda: None)() if ef is not None else None
        raise ValueError(f"collection {col.name!r} has embedding function {name!r}, not "
                         f"{EF_NAME!r}: it was not created by htp-retrieval ingest (use "
                         f"another collection name, or 'htp-retrieval drop {col.name}')")
    return ef


def resolve_settings(
    client: Any,
    collection: str,
    requested: Mapping[str, Any],
    *,
    device: str = "auto",
    batch_size: int = 16,
) -> HTPEmbeddingFunction:
    """The embedding function for an ingest: the stored settings, or defaults for a new one.

    Settings not in ``requested`` come from the collection when it exists (so a rerun need
    not repeat its flags) and from :class:`HTPEmbeddingFunction`'s defaults when it does
    not. A requested setting that differs from the stored one is refused.

    Args:
        client: A Chroma client.
        collection: Collection name.
        requested: Explicitly requested :meth:`HTPEmbeddingFunction.get_config` keys.
        device: Device for the encoder (never stored).
        batch_size: Texts per forward pass (never stored).

    Raises:
        SettingsConflictError: names each conflicting setting with its stored and requested
            value.
        ValueError: for an unknown setting, method, dtype or device, or an invalid name.
    """
    check_collection_name(collection)
    unknown = set(requested) - set(_IDENTITY_KEYS)
    if unknown:
        raise ValueError(f"unknown {EF_NAME} settings: {sorted(unknown)}")
    asked = HTPEmbeddingFunction(**requested, device=device, batch_size=batch_size)
    if collection not in _names(client):
        return asked
    stored = collection_embedding_function(client.get_collection(collection))
    old = stored.get_config()
    new = asked._stored(with_config="config" in requested)  # resolves only when asked
    stored.validate_config_update(old, {k: new[k] for k in requested})
    stored.device, stored.batch_size = check_device(device), batch_size
    return stored


@dataclass
class CollectionInfo:
    """One collection of a database, as ``htp-retrieval collections`` lists it.

    Attributes:
        name: Collection name.
        count: Vectors stored.
        settings: Its :meth:`HTPEmbeddingFunction.get_config`, or ``None`` if it was not
            made by htp-retrieval.
    """

    name: str
    count: int
    settings: dict[str, Any] | None


def list_collections(db: str | os.PathLike[str] | Any | None = None) -> list[CollectionInfo]:
    """Every collection of a database with its count and stored settings.

    Raises:
        DatabaseNotFoundError: if an embedded database directory does not exist.
        ConnectionError: if the server does not answer.
    """
    client = make_client(db, create=False)
    out = []
    for name in _names(client):
        col = client.get_collection(name)
        try:
            settings: dict[str, Any] | None = collection_embedding_function(col).get_config()
        except ValueError:
            settings = None
        out.append(CollectionInfo(name, col.count(), settings))
    return out


def drop_collection(db: str | os.PathLike[str] | Any | None, collection: str) -> int:
    """Delete a collection and everything in it.

    Returns:
        The number of vectors it held.

    Raises:
        CollectionNotFoundError: if it does not exist.
        DatabaseNotFoundError: if an embedded database directory does not exist.
    """
    client = make_client(db, create=False)
    names = _names(client)
    if collection not in names:
        raise CollectionNotFoundError(f"collection {collection!r} not found (collections "
                                      f"here: {', '.join(names) or 'none'})")
    n = client.get_collection(collection).count()
    client.delete_collection(collection)
    return int(n)


# --------------------------------------------------------------------------- ingest
@dataclass
class Rejected:
    """A document :func:`ingest` did not store.

    Attributes:
        id: Its id (or ``line N`` for a BEIR line without a usable id).
        reason: ``empty``, ``undecodable: ...``, ``invalid JSON (...)``, ...
    """

    id: str
    reason: str


@dataclass
class IngestReport:
    """What :func:`ingest` did.

    Attributes:
        collection: Collection name.
        seen: Entries read from the source (rejected ones included).
        added: Documents embedded and written for the first time.
        updated: Documents whose text changed since they were stored (re-embedded).
        unchanged: Documents already stored with the same text (skipped).
        rejected: Documents not stored, with the reason.
        skipped: Files of a folder source that were not read (extension, hidden).
        stale: Stored documents whose source entry is gone, left in place.
        pruned: Stored documents whose source entry is gone, removed (``prune=True``).
        centering: How the collection's vectors are centred (``""``: not centred).
        truncated: Documents cut to ``max_length`` tokens when embedded (only with
            ``overflow="truncate"``).
        count: Vectors in the collection afterwards (documents, or chunks of a chunked
            collection).
    """

    collection: str
    seen: int = 0
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    rejected: list[Rejected] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    pruned: list[str] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)
    count: int = 0
    centering: str = ""

    def summary(self) -> str:
        """One line, e.g. ``essays: 49 read, 47 added, 0 updated, 0 unchanged, 2 rejected,
        1 skipped, 0 stale; 47 in collection`` (``, N truncated`` when documents were
        truncated)."""
        tail = f", {len(self.pruned)} pruned" if self.pruned else (
            f", {len(self.stale)} stale (--prune removes them)" if self.stale else ", 0 stale")
        cut = f", {len(self.truncated)} truncated" if self.truncated else ""
        centred = f"; {self.centering}" if self.centering else ""
        return (f"{self.collection}: {self.seen} read, {self.added} added, {self.updated} "
                f"updated, {self.unchanged} unchanged, {len(self.rejected)} rejected, "
                f"{len(self.skipped)} skipped{cut}{tail}; {self.count} in collection{centred}")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


WriteStatus = Literal["added", "updated", "unchanged"]
"""What :func:`write_batch` did with a document."""


def write_batch(
    col: Any, ef: HTPEmbeddingFunction, docs: Sequence[SourceDoc],
    progress: Callable[[int], object] | None = None,
    truncated: list[str] | None = None,
) -> list[WriteStatus]:
    """Write accepted documents to a collection, idempotently (upsert by id).

    Without chunking (``ef.chunking == "none"``) one vector per document, id = document id:
    the batch is looked up by id first; documents already stored with the same text
    (SHA-256 in the ``content_sha256`` metadata) are skipped, the rest are embedded with
    ``ef`` and upserted in one write. With ``naive`` or ``late`` chunking see
    :func:`write_chunked`. Used by :func:`ingest` and by the Ray ingestion.

    Args:
        col: The collection.
        ef: The collection's embedding function.
        docs: Documents with ``text`` set (no rejected ones), unique ids.
        progress: Called with a count as documents are done: at once for unchanged ones,
            after each forward pass (per document when chunked) for embedded ones.
        truncated: If given, the ids of documents cut to ``max_length`` tokens are appended
            (``overflow="truncate"``; chunked: documents with a chunk cut,
            :func:`write_chunked`).

    Returns:
        One :data:`WriteStatus` per document, in order.

    Raises:
        ValueError: if a document has no text, or the encoder refuses one.
    """
    if not docs:
        return []
    for d in docs:
        if d.text is None:
            raise ValueError(f"document {d.id!r} has no text (rejected: {d.error})")
    if getattr(ef, "chunking", "none") != "none":
        return write_chunked(col, ef, docs, progress=progress, truncated=truncated)
    ids = [d.id for d in docs]
    got = col.get(ids=ids, include=["metadatas"])
    stored = {i: (m or {}).get("content_sha256")
              for i, m in zip(got["ids"], got["metadatas"] or [None] * len(got["ids"]), strict=True)}
    statuses: list[WriteStatus] = []
    todo = []
    for d in docs:
        sha = _sha(d.text or "")
        if stored.get(d.id) == sha:
            statuses.append("unchanged")
        else:
            todo.append((d, sha))
            statuses.append("updated" if d.id in stored else "added")
    if progress is not None and len(todo) < len(docs):
        progress(len(docs) - len(todo))
    if todo:
        texts = [d.text or "" for d, _ in todo]
        kwargs: dict[str, Any] = {} if progress is None else {"progress": progress}
        cut: list[int] = []
        if truncated is not None and getattr(ef, "overflow", "window") == "truncate":
            kwargs["truncated"] = cut
        vecs = ef.embed_documents_array(texts, **kwargs)
        col.upsert(
            ids=[d.id for d, _ in todo],
            documents=[d.text or "" for d, _ in todo],
            metadatas=[{**d.metadata, "content_sha256": sha, **_centre_tag(ef)}
                       for d, sha in todo],
            embeddings=vecs,
        )
        if truncated is not None:
            truncated.extend(todo[i][0].id for i in sorted(set(cut)))
    return statuses


def _centre_tag(ef: Any) -> dict[str, str]:
    """The :data:`~htp_retrieval.centering.CENTRE_KEY` metadata of a vector ``ef`` makes."""
    cen = getattr(ef, "centering", None)
    return {} if cen is None else {CENTRE_KEY: cen.document_digest()}


def _check_chunk_fits(chunking: str, chunk_size: int, max_length: int) -> None:
    """:meth:`HTPEmbeddingFunction.check_chunk_fits` on plain values."""
    from htp_retrieval.long_text import WINDOW_MARGIN

    limit = max_length - WINDOW_MARGIN
    if chunking != "none" and chunk_size > limit:
        raise ValueError(f"chunk size {chunk_size} tokens does not fit max_length "
                         f"{max_length} (at most {limit} tokens a chunk): lower the chunk "
                         "size or raise max_length")


def _late_cut_chunks(encoder: Any, text: str, chunks: Sequence[Any]) -> list[int]:
    """Indices of the chunks late chunking cut: a window longer than ``max_length`` holds
    one chunk alone (:func:`~htp_retrieval.long_text.late_windows`), so the cut chunks are
    those with more tokens than a window's budget."""
    from htp_retrieval.chunking import chunk_token_ranges
    from htp_retrieval.long_text import WINDOW_MARGIN

    offsets = encoder.tokenizer(text, add_special_tokens=False, split_special_tokens=True,
                                return_offsets_mapping=True)["offset_mapping"]
    budget = encoder.max_length - WINDOW_MARGIN
    return [c.index for c, (a, b) in zip(chunks, chunk_token_ranges(offsets, chunks),
                                          strict=True) if b - a > budget]


def chunk_id(doc_id: str, index: int) -> str:
    """Id of a document's chunk: ``DOC_ID#cN`` (``N``: chunk index from 0)."""
    return f"{doc_id}#c{index}"


def _stored_chunks(col: Any, doc_ids: Sequence[str]) -> dict[str, list[tuple[str, dict]]]:
    """``parent_id -> [(chunk id, metadata)]`` of the stored chunks of these documents."""
    out: dict[str, list[tuple[str, dict]]] = {}
    for i in range(0, len(doc_ids), 100):
        part = list(doc_ids[i : i + 100])
        where = {"parent_id": part[0]} if len(part) == 1 else {"parent_id": {"$in": part}}
        got = col.get(where=where, include=["metadatas"])
        for cid, meta in zip(got["ids"], got["metadatas"] or [], strict=True):
            meta = dict(meta or {})
            out.setdefault(str(meta.get("parent_id")), []).append((cid, meta))
    return out


def _complete(stored: list[tuple[str, dict]], doc_id: str, sha: str) -> bool:
    """Whether a document's stored chunks are all there and made from this text."""
    if not stored:
        return False
    n = stored[0][1].get("n_chunks")
    if not isinstance(n, int) or len(stored) != n:
        return False
    return ({cid for cid, _ in stored} == {chunk_id(doc_id, k) for k in range(n)}
            and all(m.get("content_sha256") == sha and m.get("n_chunks") == n
                    for _, m in stored))


def write_chunked(
    col: Any, ef: HTPEmbeddingFunction, docs: Sequence[SourceDoc],
    progress: Callable[[int], object] | None = None,
    truncated: list[str] | None = None,
) -> list[WriteStatus]:
    """Write documents as chunks (``ef.chunking`` ``naive`` or ``late``), idempotently.

    Each document is cut by :meth:`HTPEmbeddingFunction.split`; chunk ``N`` of document
    ``D`` has id ``D#cN``, its text as the stored document, and metadata: the document's
    own (``source``, ``title``), ``content_sha256`` (of the whole document), ``parent_id``
    (``D``), ``chunk_index`` (``N``), ``chunk_start``/``chunk_end`` (character offsets:
    ``text[chunk_start:chunk_end]`` is the chunk) and ``n_chunks``. A document is complete
    when exactly chunks ``0..n_chunks-1`` are stored, all with its current hash; complete
    documents are skipped. Any other document (new, changed, or cut short by a killed run)
    has all its stored chunks deleted and is written again, in groups of
    :data:`CHUNK_WRITE` chunks, so a rerun leaves no orphan and no missing chunk.

    Args:
        col: The collection.
        ef: The collection's embedding function (its chunk settings are used).
        docs: Documents with ``text`` set, unique ids.
        progress: Called with the number of documents done, as they are done.
        truncated: If given, the ids of documents with a chunk cut to ``max_length`` tokens
            are appended, and the chunk's metadata says ``truncated: True``.

    Returns:
        One :data:`WriteStatus` per document: ``unchanged`` (complete), ``added`` (nothing
        stored, or an incomplete copy of the same text), ``updated`` (the text changed).

    Raises:
        ValueError: if a text gives no chunk or the encoder refuses it (that document's
            stored chunks are left as they were).
    """
    stored = _stored_chunks(col, [d.id for d in docs])
    statuses: list[WriteStatus] = []
    for d in docs:
        text = d.text or ""
        sha = _sha(text)
        have = stored.get(d.id, [])
        if _complete(have, d.id, sha):
            statuses.append("unchanged")
            if progress is not None:
                progress(1)
            continue
        same = bool(have) and all(m.get("content_sha256") == sha for _, m in have)
        statuses.append("added" if not have or same else "updated")
        chunks = ef.split(text)
        if not chunks:
            raise ValueError(f"document {d.id!r} gives no chunk: it holds only whitespace")
        cut: list[int] = []
        vecs = ef.embed_chunks(text, chunks, truncated=cut)  # before anything is deleted
        if cut and truncated is not None:
            truncated.append(d.id)
        if have:
            old = [cid for cid, _ in have]
            for i in range(0, len(old), 1000):
                col.delete(ids=old[i : i + 1000])
        n = len(chunks)
        for g in range(0, n, CHUNK_WRITE):
            group = chunks[g : g + CHUNK_WRITE]
            col.upsert(
                ids=[chunk_id(d.id, c.index) for c in group],
                documents=[c.text(text) for c in group],
                metadatas=[{**d.metadata, "content_sha256": sha, "parent_id": d.id,
                            "chunk_index": c.index, "chunk_start": c.start,
                            "chunk_end": c.end, "n_chunks": n, **_centre_tag(ef),
                            **({"truncated": True} if c.index in cut else {})}
                           for c in group],
                embeddings=vecs[g : g + CHUNK_WRITE],
            )
        if progress is not None:
            progress(1)
    return statuses


def stale_ids(col: Any, seen: set[str], skipped: Sequence[Skipped]) -> list[str]:
    """Stored document ids whose source entry is gone: neither read in this run nor skipped
    by it (a file, or a file inside a folder, that this run skipped is not gone). A chunk
    counts as its document (``parent_id``)."""
    folders = tuple(s.path for s in skipped if s.path.endswith("/"))
    files = {s.path for s in skipped}
    return sorted(i for i in _stored_docs(col)
                  if i not in seen and i not in files and not i.startswith(folders or ("\0",)))


def _stored_docs(col: Any, page: int = 5000) -> dict[str, list[str]]:
    """``document id -> [stored ids]``: a chunk's document is its ``parent_id``, any other
    vector is its own document."""
    docs: dict[str, list[str]] = {}
    done = 0
    while True:
        got = col.get(include=["metadatas"], limit=page, offset=done)
        metas = got["metadatas"] or [None] * len(got["ids"])
        for i, m in zip(got["ids"], metas, strict=True):
            docs.setdefault(str((m or {}).get("parent_id", i)), []).append(i)
        done += len(got["ids"])
        if len(got["ids"]) < page:
            return docs


def ingest(
    source: str | os.PathLike[str],
    *,
    db: str | os.PathLike[str] | Any | None = None,
    collection: str = "htp",
    embedding_function: HTPEmbeddingFunction | None = None,
    batch_size: int = 16,
    show_progress: bool = True,
    on_batch: Callable[[IngestReport], None] | None = None,
    include: Sequence[str] = (),
    prune: bool = False,
    center_queries: Sequence[str] | None = None,
    query_source: str = "",
    refit_centering: bool | None = None,
) -> IngestReport:
    """Embed a folder of text files or a BEIR corpus into a Chroma collection.

    Everything is checked before anything is created: the collection name, the source,
    and, for a new collection, the model (loaded before the collection exists), so a
    failed first ingest leaves no collection behind. Each batch is looked up by id first;
    documents already stored with the same text (SHA-256 in the ``content_sha256``
    metadata) are skipped, the rest are embedded and upserted as one write. A chunked
    collection (the embedding function's ``chunking``: ``naive`` or ``late``) stores
    chunks with ids ``DOC_ID#cN`` instead (:func:`write_chunked`). A re-run therefore adds
    nothing, and a run killed at any point is completed by the next one with no duplicates,
    no orphan chunks and nothing missing. Stored documents whose source is gone are
    reported as stale, and removed (all their chunks) with ``prune=True``. Documents cut to
    ``max_length`` (``overflow="truncate"``), and documents with a chunk cut to it, are
    listed in the report's ``truncated``.

    Args:
        source: Folder (recursive, ``.txt``/``.md`` plus ``include`` matches) or BEIR
            ``corpus.jsonl`` (or a folder holding one).
        db: Directory for the embedded ``PersistentClient`` (default ``./chroma``), an
            ``http://host:port`` server URL, or a Chroma client.
        collection: Collection name (created with an :class:`HTPEmbeddingFunction`).
        embedding_function: Model settings for a new collection (default
            :class:`HTPEmbeddingFunction` defaults); must match an existing collection's
            (``None``: use the stored settings).
        batch_size: Documents per write.
        show_progress: tqdm bar over documents (moves after each forward pass).
        on_batch: Called with the running report after each batch is written.
        include: Extra glob patterns of files to read from a folder (e.g. ``"*.rst"``);
            skipped files are listed in the report either way.
        prune: Delete stored documents whose source entry is gone (a rejected entry is not
            gone: its stored version stays, and the report lists it as rejected).
        center_queries: A sample of queries of the kind the collection will serve (never
            the ones it is evaluated on). For a new collection: the whole source is
            embedded first (kept in memory, not embedded twice), a
            :class:`~htp_retrieval.centering.Centering` is fitted on its vectors (chunks
            for a chunked collection) and on these queries, stored with the collection, and
            every vector written and every query is centred with it. For an existing
            centred collection: only the query mean is refitted (no stored vector changes).
        query_source: Where ``center_queries`` came from (recorded with the centring).
        refit_centering: A centred collection's document mean after this ingest: ``None``
            (default) refits it (:func:`refit_documents`: every stored vector re-centred,
            nothing embedded again) when the vector count differs by more than
            :data:`REFIT_GROWTH` from the count it was fitted on; ``True`` always,
            ``False`` never. Between refits, new vectors are centred on the stored mean,
            so stored vectors and queries always use one transform.

    Returns:
        The :class:`IngestReport` (rejected documents with their ids and reasons, skipped
        files, stale or pruned ids).

    Raises:
        FileNotFoundError: if the source does not exist or holds no document (an empty
            source never creates a collection nor prunes one).
        ValueError: for an invalid collection name, ``batch_size`` < 1, a new collection's
            chunk size that does not fit ``max_length``
            (:meth:`HTPEmbeddingFunction.check_chunk_fits`), an existing
            collection with another embedding function or config
            (:class:`SettingsConflictError`), an empty ``center_queries``, or
            ``center_queries`` for an existing collection stored without centring.
        ImportError: if a new collection's packaged model is not installed.
        ConnectionError: if the Chroma server does not answer.

    A collection this call created is removed again when the call raises before anything
    was written to it (e.g. the first batch holds a document over ``max_length`` with
    ``overflow="error"``), so an empty collection never keeps the failed settings; anything
    written stays, and a rerun resumes.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    check_collection_name(collection)
    src = check_documents(source, include)
    listing = None if corpus_file(src) is not None else list_folder(src, include)
    if center_queries is not None:
        if isinstance(center_queries, str):
            raise TypeError("center_queries must be a list of query texts, not a string")
        center_queries = list(center_queries)
        if not center_queries:
            raise ValueError("center_queries is empty: give a sample of real queries, or "
                             "leave it out for an uncentred collection")
        check_texts(center_queries)
    client = make_client(db)
    if embedding_function is not None and collection not in _names(client):
        embedding_function.check_chunk_fits()  # a new collection's settings, before it exists
    fit_here = center_queries is not None and collection not in _names(client)
    if fit_here:
        embedding_function = embedding_function or HTPEmbeddingFunction()
        if embedding_function.centering is not None:
            raise ValueError("pass either center_queries or an embedding function with a "
                             "centering, not both")
        embedding_function.load()  # before anything is created, as without centring
        embedding_function.centering = fit_source_centering(
            embedding_function, src, include, center_queries, query_source=query_source,
            batch_size=batch_size, show_progress=show_progress)
    col, ef, created = prepare_collection(client, collection,
                                          embedding_function=embedding_function)
    if center_queries is not None and not fit_here:
        recenter_queries(col, center_queries, query_source=query_source, ef=ef)
    if fit_here:  # the vectors embedded while fitting, not embedded again
        ef._raw, ef._raw_cut = embedding_function._raw, embedding_function._raw_cut
    if ef.centering is not None and (col.metadata or {}).get(_REFIT_PENDING):
        refit_documents(col, ef=ef)  # a refit cut short: finish it before writing
    try:
        report = _ingest_into(col, ef, src, listing, include, collection,
                              batch_size=batch_size, show_progress=show_progress,
                              on_batch=on_batch, prune=prune)
        cen = ef.centering
        if cen is not None and not fit_here and refit_centering is not False and (
                refit_centering or abs(report.count - cen.n_documents)
                > REFIT_GROWTH * cen.n_documents):
            cen = refit_documents(col, ef=ef)
            report.centering = (f"centred: document mean refitted on {cen.n_documents} "
                                f"vectors, query mean of {cen.n_queries} queries")
        return report
    except Exception:
        if created and col.count() == 0:  # made by this call, nothing in it: remove it,
            client.delete_collection(collection)  # so a rerun may use other settings
            logging.getLogger(__name__).warning(
                "ingest into the new collection %r stopped before writing anything: removed "
                "it, so a rerun (with other settings too) starts clean", collection)
        raise
    finally:
        ef._raw, ef._raw_cut = {}, {}
        if embedding_function is not None:
            embedding_function._raw, embedding_function._raw_cut = {}, {}


def fit_source_centering(
    ef: HTPEmbeddingFunction, src: Any, include: Sequence[str], queries: Sequence[str], *,
    query_source: str = "", batch_size: int = 16, show_progress: bool = True,
) -> Centering:
    """Fit a :class:`~htp_retrieval.centering.Centering` on a source's vectors and a query
    sample, as :func:`ingest` does for a new collection with ``center_queries``.

    Every accepted document is embedded as the collection will store it (one vector per
    document, or its chunks), in the batches :func:`ingest` writes, and its uncentred
    vectors are kept on ``ef`` so the writes that follow use them instead of embedding
    again. Rejected documents are left out (ingest reports them).

    Args:
        ef: The new collection's embedding function (without a centring).
        src: A source checked by :func:`~htp_retrieval.integrations.sources.check_documents`.
        include: Extra glob patterns, as for :func:`ingest`.
        queries: ``[n]`` query texts, embedded with ``ef.query_instruction``.
        query_source: Where the queries came from (recorded).
        batch_size: Documents per batch (:func:`ingest`'s).
        show_progress: tqdm bar over documents.

    Returns:
        The fitted centring (document mean over all vectors of the source).

    Raises:
        FileNotFoundError: if the source holds no usable document.
        ValueError: as embedding raises (a text over ``max_length`` with
            ``overflow="error"``, ...).
    """
    from tqdm.auto import tqdm

    vecs: list[np.ndarray] = []
    batch: list[str] = []

    def flush() -> None:
        if batch:
            cut: list[int] = []
            got = ef._encode(batch, ef.document_instruction, "document", truncated=cut,
                             centred=False)
            for i, (t, v) in enumerate(zip(batch, got, strict=True)):
                ef._raw[("doc", t)] = v
                if i in cut:
                    ef._raw_cut[("doc", t)] = [0]
            vecs.append(got)
            bar.update(len(batch))
            batch.clear()

    with tqdm(total=count_source(src), disable=not show_progress, unit="doc",
              desc="fit centring") as bar:
        for doc in read_source(src, include):
            if doc.error is not None or doc.text is None:
                bar.update(1)
                continue
            if ef.chunking == "none":
                batch.append(doc.text)
                if len(batch) >= batch_size:
                    flush()
                continue
            chunks = ef.split(doc.text)
            if chunks:
                cut_chunks: list[int] = []
                v = ef.embed_chunks(doc.text, chunks, centred=False, truncated=cut_chunks)
                key = ("chunks", doc.text, *(f"{c.start}:{c.end}" for c in chunks))
                ef._raw[key] = v
                if cut_chunks:
                    ef._raw_cut[key] = cut_chunks
                vecs.append(v)
            bar.update(1)
        flush()
    if not vecs:
        raise FileNotFoundError(f"{src} holds no usable document to fit a centring on")
    q = ef._encode(list(queries), ef.query_instruction, "query", centred=False)
    enc = ef._shared().encoder
    return Centering.fit(np.concatenate(vecs), q, query_source=query_source,
                         config=enc.config.to_dict(), model=enc.model_name,
                         query_instruction=ef.query_instruction,
                         document_instruction=ef.document_instruction)


def recenter_queries(col: Any, queries: Sequence[str], *, query_source: str = "",
                     ef: HTPEmbeddingFunction | None = None) -> Centering:
    """Refit a centred collection's query mean on ``queries`` and store it.

    The document mean, and so every stored vector, stays as it is; later queries (in this
    and any other process) are centred on the new query mean.

    Args:
        col: A collection made by :func:`ingest` with a centring.
        queries: ``[n]`` query texts of the kind the collection serves.
        query_source: Where they came from (recorded).
        ef: The collection's embedding function as opened (default: read from ``col``); its
            ``centering`` is replaced.

    Returns:
        The stored :class:`~htp_retrieval.centering.Centering`.

    Raises:
        ValueError: if the collection has no centring (its stored vectors are not centred:
            ingest into a new collection with ``center_queries``), or a query is empty.
    """
    ef = ef or collection_embedding_function(col)
    if ef.centering is None:
        raise ValueError(f"collection {col.name!r} was made without centring, so its stored "
                         "vectors are not centred: ingest into a new collection with "
                         "center_queries (--center-queries) to centre it")
    check_texts(queries)
    q = ef._encode(list(queries), ef.query_instruction, "query", centred=False)
    ef.centering = ef.centering.with_queries(q, query_source=query_source)
    col.modify(configuration={"embedding_function": ef})
    return ef.centering


def _pages(col: Any, page: int) -> Any:
    """``(ids, [n, hidden] embeddings, metadatas)`` of every stored vector, a page at a time."""
    done = 0
    while True:
        got = col.get(include=["embeddings", "metadatas"], limit=page, offset=done)
        ids = list(got["ids"])
        if ids:
            yield ids, np.asarray(got["embeddings"], dtype=np.float32), list(
                got["metadatas"] or [None] * len(ids))
        done += len(ids)
        if len(ids) < page:
            return


def refit_documents(col: Any, *, ef: HTPEmbeddingFunction | None = None, page: int = 1000
                    ) -> Centering:
    """Refit a centred collection's document mean on every stored vector and re-centre them.

    Each stored vector is turned back into the unit vector it was made from
    (:meth:`~htp_retrieval.centering.Centering.uncentre_documents`, exact: no text is
    embedded again), the new mean is their mean, and every vector is rewritten centred on
    it (tagged :data:`~htp_retrieval.centering.CENTRE_KEY`) before the collection's stored
    centring changes; the query mean stays. The target centring is recorded in the
    collection's metadata first, so a run killed half-way is finished by the next call (or
    the next :func:`ingest`), which skips the vectors already re-centred.

    Args:
        col: A collection made by :func:`ingest` with a centring.
        ef: Its embedding function as opened (default: read from ``col``).
        page: Vectors read and written per request.

    Returns:
        The stored :class:`~htp_retrieval.centering.Centering` (``n_documents``: the
        collection's vector count).

    Raises:
        ValueError: if the collection has no centring.
    """
    ef = ef or collection_embedding_function(col)
    cen = ef.centering
    if cen is None:
        raise ValueError(f"collection {col.name!r} has no centring to refit: ingest into a "
                         "new collection with center_queries (--center-queries)")
    meta = dict(col.metadata or {})
    pending = meta.get(_REFIT_PENDING)
    new = Centering.from_dict(json.loads(pending)) if pending else None
    if new is None:
        total, n = np.zeros(cen.hidden, dtype=np.float64), 0
        for _, vecs, _metas in _pages(col, page):
            total += cen.uncentre_documents(vecs).sum(axis=0, dtype=np.float64)
            n += len(vecs)
        if n == 0:
            return cen
        new = cen.replace(document_mean=total / n, n_documents=n)
        col.modify(metadata={**meta, _REFIT_PENDING: json.dumps(new.to_dict())})
    tag = new.document_digest()
    for ids, vecs, metas in _pages(col, page):
        todo = [j for j, m in enumerate(metas) if (m or {}).get(CENTRE_KEY) != tag]
        if todo:
            col.update(ids=[ids[j] for j in todo],
                       embeddings=new.apply(cen.uncentre_documents(vecs[todo]), "document"),
                       metadatas=[{CENTRE_KEY: tag}] * len(todo))
    token = _refitting.set((cen.document_digest(), tag))
    try:
        ef.centering = new
        col.modify(configuration={"embedding_function": ef})
    finally:
        _refitting.reset(token)
    col.modify(metadata={**meta, _REFIT_PENDING: ""})
    return new


def _ingest_into(col: Any, ef: HTPEmbeddingFunction, src: Any, listing: Any, include: Any,
                 collection: str, *, batch_size: int, show_progress: bool,
                 on_batch: Callable[[IngestReport], object] | None, prune: bool
                 ) -> IngestReport:
    """The body of :func:`ingest` once the collection is open."""
    from tqdm.auto import tqdm

    report = IngestReport(collection, skipped=list(listing.skipped) if listing else [])
    total = len(listing.files) if listing else count_source(src)
    batch: list[SourceDoc] = []
    seen_ids: set[str] = set()

    def flush() -> None:
        if not batch:
            return
        statuses = write_batch(col, ef, batch, progress=bar.update, truncated=report.truncated)
        report.added += statuses.count("added")
        report.updated += statuses.count("updated")
        report.unchanged += statuses.count("unchanged")
        batch.clear()
        if on_batch is not None:
            on_batch(report)

    with tqdm(total=total, disable=not show_progress, desc=f"ingest {collection}",
              unit="doc") as bar:
        for doc in read_source(src, include):
            report.seen += 1
            seen_ids.add(doc.id)
            if doc.error is not None:
                report.rejected.append(Rejected(doc.id, doc.error))
                bar.update(1)
                continue
            batch.append(doc)
            if len(batch) >= batch_size:
                flush()
        flush()
    return finish_report(report, col, seen_ids, prune=prune)


def finish_report(report: IngestReport, col: Any, seen: set[str], *, prune: bool
                  ) -> IngestReport:
    """Fill a report's ``stale`` (or, with ``prune``, delete them and fill ``pruned``) and
    ``count``, once every source entry has been read.

    Args:
        report: The running report (its ``skipped`` list is read).
        col: The collection.
        seen: Ids of every entry read from the source, rejected ones included.
        prune: Delete the stale ids.

    Returns:
        ``report``.
    """
    stale = stale_ids(col, seen, report.skipped)
    if prune and stale:
        by_doc = _stored_docs(col)
        gone = [i for doc_id in stale for i in by_doc.get(doc_id, [])]
        for i in range(0, len(gone), 1000):
            col.delete(ids=gone[i : i + 1000])
        report.pruned = stale
    else:
        report.stale = stale
    report.count = col.count()
    ef = (getattr(col, "configuration", None) or {}).get("embedding_function")
    cen = getattr(ef, "centering", None)
    if cen is not None:
        report.centering = (f"centred: document mean of {cen.n_documents} vectors, query mean "
                            f"of {cen.n_queries} queries")
    return report


# --------------------------------------------------------------------------- query
@dataclass
class Hit:
    """One search result.

    Attributes:
        id: Stored id: the document id, or ``DOC_ID#cN`` for a chunk.
        distance: Chroma distance (cosine distance for collections made by :func:`ingest`).
        document: Stored text (the chunk's text for a chunk).
        metadata: Stored metadata (a chunk's carries ``parent_id``, ``chunk_index``,
            ``chunk_start``, ``chunk_end``, ``n_chunks``).
    """

    id: str
    distance: float
    document: str | None
    metadata: dict[str, Any]

    @property
    def score(self) -> float:
        """``1 - distance`` (cosine similarity for cosine collections)."""
        return 1.0 - self.distance

    @property
    def parent_id(self) -> str:
        """The document this hit belongs to (its own id when it is not a chunk)."""
        return str(self.metadata.get("parent_id", self.id))

    @property
    def span(self) -> tuple[int, int] | None:
        """``(chunk_start, chunk_end)``: character offsets of a chunk in its document, or
        ``None`` for a whole document."""
        a, b = self.metadata.get("chunk_start"), self.metadata.get("chunk_end")
        return (int(a), int(b)) if a is not None and b is not None else None


def query(
    text: str,
    *,
    db: str | os.PathLike[str] | Any | None = None,
    collection: str = "htp",
    n_results: int = 5,
    where: dict[str, Any] | None = None,
    group_by_document: bool = False,
) -> list[Hit]:
    """Search a collection made by :func:`ingest` (the query gets the query instruction,
    and is centred on the query mean of a centred collection).

    Args:
        text: The query.
        db: As in :func:`ingest`.
        collection: Collection name.
        n_results: Hits returned (at most the collection size).
        where: Optional Chroma metadata filter.
        group_by_document: Return the best chunk of each of the ``n_results`` best
            documents (Chroma is asked for ``8 * n_results`` chunks, then grouped by
            ``parent_id``; fewer documents come back when those chunks span fewer).

    Returns:
        Hits, best first.

    Raises:
        ValueError: for an empty query, or a collection without an
            :class:`HTPEmbeddingFunction`.
        CollectionNotFoundError: if the collection does not exist.
        DatabaseNotFoundError: if an embedded database directory does not exist (nothing
            is created).
    """
    if not text.strip():
        raise ValueError("query text is empty")
    col = get_collection(make_client(db, create=False), collection)
    ef = collection_embedding_function(col)
    try:
        check_model(ef.model_name)
    except (OSError, ValueError) as e:
        raise type(e)(f"collection {collection!r} was made with model {ef.model_name!r}, "
                      f"which cannot be loaded here: {e}") from e
    q = ef.embed_query([text])
    ask = (min(n_results * GROUP_FACTOR, max(1, col.count())) if group_by_document
           else n_results)
    res = col.query(query_embeddings=q, n_results=ask, where=where,
                    include=["documents", "metadatas", "distances"])
    docs = (res.get("documents") or [[]])[0]
    metas = (res.get("metadatas") or [[]])[0]
    hits = [Hit(i, float(d), docs[j] if docs else None, dict(metas[j] or {}) if metas else {})
            for j, (i, d) in enumerate(zip(res["ids"][0], res["distances"][0], strict=True))]
    if not group_by_document:
        return hits
    best: dict[str, Hit] = {}
    for h in hits:  # best first: the first hit of a document is its best chunk
        best.setdefault(h.parent_id, h)
    return list(best.values())[:n_results]


GROUP_FACTOR = 8
"""Chunks asked of Chroma per document wanted by ``query(group_by_document=True)``."""


__all__ = ["HTPEmbeddingFunction", "IngestReport", "Rejected", "Hit", "SourceDoc", "Skipped",
           "ingest", "query", "read_source", "count_source", "make_client", "open_collection",
           "prepare_collection", "get_collection", "resolve_settings", "list_collections",
           "drop_collection", "CollectionInfo", "check_collection_name",
           "collection_embedding_function", "EF_NAME", "TEXT_SUFFIXES", "file_doc",
           "read_beir_lines", "write_batch", "write_chunked", "chunk_id", "model_window",
           "finish_report", "stale_ids", "CHUNK_WRITE", "GROUP_FACTOR",
           "SettingsConflictError", "stored_htp_config", "config_diff",
           "CollectionNotFoundError", "DatabaseNotFoundError", "fit_source_centering",
           "recenter_queries", "centering_conflict", "refit_documents", "REFIT_GROWTH"]
