"""Shared, lazily created encoders for the framework integrations (no framework imports).

Every integration object (:class:`~htp_retrieval.integrations.embeddings.HTPEmbeddings`,
the Chroma embedding function) describes its encoder with an :class:`EncoderConfig`; the
encoder is built on first use and shared by every object with the same config in the
process (copies, deep copies and unpickled objects included). Calls on one encoder are
serialized by a lock, and async callers run on the encoder's own single worker thread, so
the event loop never runs the model.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from htp_retrieval.config import SETTING_KEYS, HTPConfig
from htp_retrieval.integrations.sources import content_error

T = TypeVar("T")

DTYPES = ("auto", "bfloat16", "float16", "float32")
"""Weight dtypes the integrations accept (``auto``: chosen from the device)."""
_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16",
                  "fp32": "float32", "float": "float32"}


def canonical_dtype(dtype: Any) -> str:
    """A dtype name in :data:`DTYPES` from a name, an alias or a ``torch.dtype``.

    ``bf16``, ``fp16``/``half`` and ``fp32``/``float`` are accepted as aliases, and
    ``torch.bfloat16`` etc. as objects (``torch_dtype`` values carried over from
    ``transformers``).

    Raises:
        ValueError: for anything else, naming the value and the accepted names.
    """
    name = str(dtype).removeprefix("torch.").strip().lower()
    name = _DTYPE_ALIASES.get(name, name)
    if name not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported: use one of {', '.join(DTYPES)}")
    return name


def check_device(device: str) -> str:
    """Check a device name: ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``.

    Returns:
        ``device`` unchanged.

    Raises:
        ValueError: if the name is not a torch device, or names a CUDA/MPS device that
            torch cannot see (the message says to use ``auto`` or ``cpu``).
    """
    if device == "auto":
        return device
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device {device!r} is not a torch device: use auto, cpu, cuda, "
                         f"cuda:N or mps ({e})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but torch sees no CUDA GPU: use "
                         "device 'auto' or 'cpu'")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r} requested but torch sees "
                         f"{torch.cuda.device_count()} CUDA GPU(s)")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {device!r} requested but MPS is not available: use 'auto'")
    if dev.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device {device!r} is not supported: use auto, cpu, cuda or mps")
    return device


def check_model(model: str) -> str:
    """Check that a model reference can be loaded, without loading its weights.

    A packaged name needs its package installed; a ``.gguf`` path must exist; a local
    folder must hold a ``config.json``; anything else is taken as a hub id whose
    ``config.json`` must be reachable (from the local cache when ``HF_HUB_OFFLINE=1``).

    Returns:
        ``model`` unchanged.

    Raises:
        ImportError: if a packaged model's package is missing (the message has the pip
            command).
        FileNotFoundError: for a missing ``.gguf`` file or a folder without ``config.json``.
        ValueError: if the name is neither packaged, a path, nor a reachable hub id (the
            message lists the packaged names and the closest match).
    """
    from htp_retrieval.models import PACKAGED, packaged_gguf

    if model in PACKAGED:
        packaged_gguf(model)
        return model
    path = Path(model).expanduser()
    if model.endswith(".gguf"):
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file not found: {path}")
        return model
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model folder {path} has no config.json: not a Hugging "
                                    "Face model folder")
        return model
    if model.startswith((".", "/", "~")) or model.count("/") > 1:
        raise FileNotFoundError(f"model folder not found: {path}")
    try:
        from transformers import AutoConfig
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            AutoConfig.from_pretrained(model)
        finally:
            hf_logging.set_verbosity(verbosity)
    except Exception as e:  # noqa: BLE001 - any failure: not loadable from here
        close = difflib.get_close_matches(model, list(PACKAGED), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False")
        where = "a hub id in the local cache (HF_HUB_OFFLINE is set)" if offline else (
            "a reachable hub id")
        reason = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise ValueError(f"model {model!r} not found: not a packaged model "
                         f"({', '.join(PACKAGED)}), a local folder, a .gguf file or {where}"
                         f"{hint} [{reason}]") from None
    return model


@dataclass(frozen=True)
class EncoderConfig:
    """What defines an :class:`~htp_retrieval.HTPEncoder` (hashable key of the shared cache).

    Attributes:
        model: Packaged name, ``.gguf`` path, local directory or hub id.
        method: HTP method name or alias (``htp``, ``vanilla-mean``, ...).
        max_length: Text tokens per forward pass (``None``: the model's context window,
            :func:`~htp_retrieval.long_text.default_max_length`).
        overflow: What a longer text gets (:data:`~htp_retrieval.long_text.Overflow`):
            ``window``, ``truncate`` (with a warning naming it) or ``error``.
        device: ``auto``, ``cpu`` or ``cuda``.
        dtype: ``bfloat16``, ``float16`` or ``float32`` (``auto`` is resolved by
            :meth:`create`).
        extra: Further :class:`~htp_retrieval.HTPEncoder` keyword arguments, as sorted
            ``(name, value)`` pairs (only speed-only ones when ``htp_config`` is set).
        htp_config: A resolved :class:`~htp_retrieval.config.HTPConfig` as
            :meth:`~htp_retrieval.config.HTPConfig.to_json`, used as is (``method``,
            ``max_length`` and ``overflow`` then mirror it); ``None``: the encoder resolves
            its config from the fields above.
    """

    model: str
    method: str = "htp"
    max_length: int | None = None
    device: str = "auto"
    dtype: str = "bfloat16"
    overflow: str = "window"
    extra: tuple[tuple[str, Any], ...] = field(default_factory=tuple)
    htp_config: str | None = None

    @classmethod
    def create(
        cls,
        model: str,
        method: str = "htp",
        max_length: int | None = None,
        device: str = "auto",
        dtype: str = "auto",
        extra: dict[str, Any] | None = None,
        overflow: str = "window",
        htp_config: HTPConfig | str | None = None,
    ) -> EncoderConfig:
        """Build a config from plain arguments (``extra`` is a dict of encoder kwargs;
        ``dtype="auto"`` is resolved for ``device`` by :func:`htp_retrieval.dtypes.resolve_dtype`,
        so equal encoders share one cache entry).

        With ``htp_config`` (an :class:`~htp_retrieval.config.HTPConfig` or its JSON),
        ``method``, ``max_length`` and ``overflow`` are taken from it.

        Raises:
            ValueError: with ``htp_config``, if ``method``, ``max_length`` or ``overflow``
                disagree with it, or ``extra`` holds a setting (it belongs in the config).
        """
        from htp_retrieval.dtypes import resolve_dtype

        concrete = resolve_dtype(canonical_dtype(dtype), device)
        extra = dict(extra or {})
        if htp_config is None:
            return cls(model, method, max_length, device, concrete, overflow,
                       tuple(sorted(extra.items())))
        cfg = HTPConfig.from_json(htp_config) if isinstance(htp_config, str) else htp_config
        check_follows_config(cfg, {"method": method, "max_length": max_length,
                                   "overflow": overflow}, extra)
        return cls(model, cfg.method, cfg.max_length, device, concrete, cfg.overflow,
                   tuple(sorted(extra.items())), cfg.to_json())

    def resolved(self, cfg: HTPConfig) -> EncoderConfig:
        """This key with ``cfg`` as its config (setting keys dropped from ``extra``): the
        key of an encoder built from ``cfg`` with this key's model, device, dtype and
        speed-only keywords."""
        runtime = tuple((k, v) for k, v in self.extra if k not in SETTING_KEYS)
        return EncoderConfig(self.model, cfg.method, cfg.max_length, self.device, self.dtype,
                             cfg.overflow, runtime, cfg.to_json())


def check_follows_config(cfg: HTPConfig, given: Mapping[str, Any],
                         encoder_kwargs: Mapping[str, Any]) -> None:
    """Refuse settings that would be ignored beside a whole config.

    Args:
        cfg: The config in use.
        given: ``method``, ``max_length``, ``overflow`` as the caller set them (``None``:
            not set; a method alias counts as its canonical name).
        encoder_kwargs: Further encoder keywords; none may be a setting
            (:data:`~htp_retrieval.config.SETTING_KEYS`).

    Raises:
        ValueError: naming the first value that differs from the config, or the setting
            keys in ``encoder_kwargs``, with the fix (``config.replace(...)``).
    """
    from htp_retrieval.methods import get_method

    for name, value in given.items():
        if value is None:
            continue
        same = get_method(value).name if name == "method" else value
        if same != getattr(cfg, name):
            raise ValueError(f"{name}={value!r} conflicts with config {name} "
                             f"{getattr(cfg, name)!r}: leave {name} out (it follows the "
                             f"config) or pass config.replace({name}=...)")
    settings = sorted(set(encoder_kwargs) & set(SETTING_KEYS))
    if settings:
        raise ValueError(f"encoder_kwargs settings {settings} conflict with config (it holds "
                         f"every setting): pass config.replace("
                         f"{', '.join(f'{k}=...' for k in settings)}) instead")


def split_settings(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(settings, others)``: the :data:`~htp_retrieval.config.SETTING_KEYS` of encoder
    keyword arguments (``preset`` included), and the rest (speed-only and loading keys)."""
    settings = {k: v for k, v in kwargs.items() if k in SETTING_KEYS}
    return settings, {k: v for k, v in kwargs.items() if k not in SETTING_KEYS}


_RESOLVED: dict[tuple[Any, ...], HTPConfig | None] = {}


def resolve_config_cheaply(
    model: str, method: str = "htp", max_length: int | None = None,
    overflow: str = "window", extra: dict[str, Any] | None = None,
) -> HTPConfig | None:
    """The :class:`~htp_retrieval.config.HTPConfig` an encoder built from these settings
    resolves, read from the model's ``config.json`` only (no weights loaded).

    :meth:`HTPConfig.for_model <htp_retrieval.config.HTPConfig.for_model>` with the setting
    keys of ``extra`` (``preset`` included). A sentence-transformers folder is not resolved
    here: its ``max_seq_length`` and special tokens set ``max_length`` and the readout
    layer, which only the loaded encoder knows. Results are cached per argument set.

    Returns:
        The config, or ``None`` where it cannot be resolved cheaply (a sentence-transformers
        folder; a model whose ``config.json`` is not readable here, e.g. an uncached hub id;
        settings :meth:`~htp_retrieval.config.HTPConfig.for_model` refuses): the loaded
        encoder then resolves it, and raises what is wrong.
    """
    from htp_retrieval.st_format import is_st_folder

    settings, _ = split_settings(dict(extra or {}))
    try:
        key = (model, method, max_length, overflow, json.dumps(settings, sort_keys=True))
    except TypeError:  # a non-JSON setting (a Segmenter object): the encoder resolves it
        return None
    if key in _RESOLVED:
        return _RESOLVED[key]
    cfg: HTPConfig | None = None
    if not is_st_folder(model):
        preset = settings.pop("preset", None)
        try:
            from transformers.utils import logging as hf_logging

            verbosity = hf_logging.get_verbosity()
            hf_logging.set_verbosity_error()
            try:
                cfg = HTPConfig.for_model(model, method, preset=preset, max_length=max_length,
                                          overflow=overflow, **settings)
            finally:
                hf_logging.set_verbosity(verbosity)
        except Exception:  # noqa: BLE001 - the loaded encoder resolves it (and says why)
            cfg = None
    _RESOLVED[key] = cfg
    return cfg


def as_htp_config(value: Any) -> HTPConfig | None:
    """An :class:`~htp_retrieval.config.HTPConfig` from itself, its dict
    (:meth:`~htp_retrieval.config.HTPConfig.to_dict`, nested or flat) or its JSON string.

    Raises:
        ValueError: for anything else, or a dict/JSON that is not a valid config (the
            message names the key or value).
    """
    if value is None or isinstance(value, HTPConfig):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"config string is not JSON ({e}): pass an HTPConfig, its "
                             "to_dict() or its to_json()") from None
    if isinstance(value, Mapping):
        return HTPConfig.from_dict(value)
    raise ValueError(f"config must be an HTPConfig, its to_dict() or its to_json(), got "
                     f"{type(value).__name__}")


def check_texts(texts: Any) -> None:
    """Check a batch of texts before it reaches the encoder.

    Raises:
        TypeError: if ``texts`` is a single string (it would be embedded character by
            character), not a sequence, or holds a non-string (its index is named).
        ValueError: if an entry carries no content (see
            :func:`~htp_retrieval.integrations.sources.content_error`); names its index.
    """
    if isinstance(texts, (str, bytes)):
        raise TypeError(f"expected a list of texts, got a single {type(texts).__name__} "
                        f"({texts[:40]!r}): wrap it in a list, e.g. [text]")
    if not isinstance(texts, Sequence):
        raise TypeError(f"expected a list of texts, got {type(texts).__name__}")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"text at index {i} is {type(t).__name__}, not str")
        reason = content_error(t)
        if reason is not None:
            reason = "empty or whitespace-only" if reason == "empty" else reason
            raise ValueError(f"text at index {i} is {reason}")


class SharedEncoder:
    """An :class:`~htp_retrieval.HTPEncoder` with a lock and a one-thread executor.

    Args:
        config: The encoder settings.
    """

    def __init__(self, config: EncoderConfig) -> None:
        try:
            from htp_retrieval.encoder import HTPEncoder
        except ImportError as e:  # pragma: no cover - torch/transformers are core deps
            raise ImportError(
                f"HTP embeddings need torch and transformers ({e}): pip install htp-retrieval"
            ) from e
        self.config = config
        if config.htp_config is not None:  # a resolved config, used as is
            self.encoder = HTPEncoder(config.model, HTPConfig.from_json(config.htp_config),
                                      device=config.device, dtype=config.dtype,
                                      **dict(config.extra))
        else:
            self.encoder = HTPEncoder(
                config.model,
                config.method,
                max_length=config.max_length,
                overflow=config.overflow,  # type: ignore[arg-type]
                device=config.device,
                dtype=config.dtype,
                **dict(config.extra),
            )
        self.lock = threading.Lock()
        self._executor_lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._pending_lock = threading.Lock()
        self._pending: list[_Request] = []
        self._draining = False

    @property
    def executor(self) -> ThreadPoolExecutor:
        """The single worker thread that runs async callers' encodes."""
        with self._executor_lock:  # not self.lock: never wait for a running encode here
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="htp-embed")
            return self._executor

    def encode(
        self,
        texts: Sequence[str],
        *,
        instruction: str | None,
        normalize: bool,
        batch_size: int | None = None,
        show_progress_bar: bool = False,
        progress: Callable[[int], object] | None = None,
    ) -> np.ndarray:
        """Embed texts (thread-safe).

        Args:
            texts: Texts, passed to the encoder as they are.
            instruction: Instruction put before each text (``None``: none).
            normalize: L2-normalize the vectors.
            batch_size: Maximum texts per forward pass (default: the encoder's).
            show_progress_bar: tqdm bar over texts.
            progress: Called after each forward pass with the number of texts it embedded.

        Returns:
            ``[len(texts), hidden]`` float32 array.

        Raises:
            TypeError: if ``texts`` is a single string instead of a sequence of strings, or
                holds a non-string (its index is named).
            ValueError: if a text carries no content (empty, whitespace, only control
                characters, binary); the message names its index.
        """
        check_texts(texts)
        with self.lock:
            return self.encoder.encode(
                list(texts),
                instruction=instruction,
                normalize=normalize,
                batch_size=batch_size,
                show_progress_bar=show_progress_bar,
                progress=progress,
            )

    async def run_async(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the encoder's worker thread without blocking the event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, fn)

    async def aencode(
        self,
        texts: Sequence[str],
        *,
        instruction: str | None,
        normalize: bool,
        batch_size: int | None = None,
        show_progress_bar: bool = False,
    ) -> np.ndarray:
        """Async :meth:`encode`: requests that wait together are embedded in one batch.

        The request is queued and the worker thread drains the queue, merging all waiting
        requests with the same instruction and options into one :meth:`encode` call (many
        concurrent single-query calls cost about one batched forward pass). The event loop
        only awaits a future.

        Returns:
            ``[len(texts), hidden]`` float32 array.

        Raises:
            ValueError: as :meth:`encode`, for this request's texts only.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[np.ndarray] = loop.create_future()
        req = _Request(list(texts), instruction, normalize, batch_size, show_progress_bar,
                       loop, fut)
        with self._pending_lock:
            self._pending.append(req)
            start = not self._draining
            self._draining = True
        if start:
            self.executor.submit(self._drain)
        return await fut

    def _drain(self) -> None:
        while True:
            with self._pending_lock:
                reqs, self._pending = self._pending, []
                if not reqs:
                    self._draining = False
                    return
            groups: dict[tuple[Any, ...], list[_Request]] = {}
            for r in reqs:
                groups.setdefault((r.instruction, r.normalize, r.batch_size), []).append(r)
            for (instruction, normalize, batch_size), group in groups.items():
                texts = [t for r in group for t in r.texts]
                try:
                    vecs = self.encode(texts, instruction=instruction, normalize=normalize,
                                       batch_size=batch_size,
                                       show_progress_bar=any(r.progress for r in group))
                except Exception:
                    if len(group) == 1:
                        self._finish_one(group[0], instruction, normalize, batch_size)
                        continue
                    for r in group:  # each request gets its own result or error
                        self._finish_one(r, instruction, normalize, batch_size)
                    continue
                start = 0
                for r in group:
                    r.resolve(vecs[start : start + len(r.texts)])
                    start += len(r.texts)

    def _finish_one(
        self, r: _Request, instruction: str | None, normalize: bool, batch_size: int | None
    ) -> None:
        try:
            r.resolve(self.encode(r.texts, instruction=instruction, normalize=normalize,
                                  batch_size=batch_size, show_progress_bar=r.progress))
        except Exception as e:  # handed to the awaiting coroutine
            r.resolve(e)


@dataclass
class _Request:
    texts: list[str]
    instruction: str | None
    normalize: bool
    batch_size: int | None
    progress: bool
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[np.ndarray]

    def resolve(self, value: np.ndarray | BaseException) -> None:
        def _set() -> None:
            if self.future.done():  # cancelled by the caller
                return
            if isinstance(value, BaseException):
                self.future.set_exception(value)
            else:
                self.future.set_result(value)

        try:
            self.loop.call_soon_threadsafe(_set)
        except RuntimeError:  # the caller's loop is closed
            pass


_CACHE: dict[EncoderConfig, SharedEncoder] = {}
_CACHE_LOCK = threading.Lock()


def shared_encoder(config: EncoderConfig) -> SharedEncoder:
    """The process-wide :class:`SharedEncoder` for ``config``, created on first call.

    One encoder serves every key that resolves to the same
    :class:`~htp_retrieval.config.HTPConfig`: a loaded encoder is also filed under its
    resolved key (:meth:`EncoderConfig.resolved`), and a key without a config is first
    resolved from the model's ``config.json`` (:func:`resolve_config_cheaply`) and looked up
    by that, so plain settings and the config they resolve to share one model.

    Raises:
        ImportError: if the model's package is missing (the message gives the pip command).
        ValueError: for an unknown method or invalid encoder settings.
    """
    enc = _CACHE.get(config)
    if enc is not None:
        return enc
    with _CACHE_LOCK:
        enc = _CACHE.get(config)
        if enc is not None:
            return enc
        if config.htp_config is None:
            cheap = resolve_config_cheaply(config.model, config.method, config.max_length,
                                           config.overflow, dict(config.extra))
            if cheap is not None:
                enc = _CACHE.get(config.resolved(cheap))
        if enc is None:
            enc = SharedEncoder(config)
        _CACHE[config] = enc
        _CACHE.setdefault(config.resolved(enc.encoder.config), enc)
        return enc


def loaded_configs() -> list[EncoderConfig]:
    """Configs whose encoder is loaded in this process (for tests and diagnostics)."""
    return list(_CACHE)
