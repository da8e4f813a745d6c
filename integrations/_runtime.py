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
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

T = TypeVar("T")


@dataclass(frozen=True)
class EncoderConfig:
    """What defines an :class:`~htp_retrieval.HTPEncoder` (hashable key of the shared cache).

    Attributes:
        model: Packaged name, ``.gguf`` path, local directory or hub id.
        method: HTP method name or alias (``htp``, ``vanilla-mean``, ...).
        max_length: Maximum text tokens per text.
        device: ``auto``, ``cpu`` or ``cuda``.
        dtype: ``bfloat16``, ``float16`` or ``float32``.
        extra: Further :class:`~htp_retrieval.HTPEncoder` keyword arguments, as sorted
            ``(name, value)`` pairs.
    """

    model: str
    method: str = "htp"
    max_length: int = 512
    device: str = "auto"
    dtype: str = "bfloat16"
    extra: tuple[tuple[str, Any], ...] = field(default_factory=tuple)

    @classmethod
    def create(
        cls,
        model: str,
        method: str = "htp",
        max_length: int = 512,
        device: str = "auto",
        dtype: str = "bfloat16",
        extra: dict[str, Any] | None = None,
    ) -> EncoderConfig:
        """Build a config from plain arguments (``extra`` is a dict of encoder kwargs)."""
        return cls(model, method, max_length, device, dtype, tuple(sorted((extra or {}).items())))


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
        self.encoder = HTPEncoder(
            config.model,
            config.method,
            max_length=config.max_length,
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
    ) -> np.ndarray:
        """Embed texts (thread-safe).

        Args:
            texts: Texts, passed to the encoder as they are.
            instruction: Instruction put before each text (``None``: none).
            normalize: L2-normalize the vectors.
            batch_size: Maximum texts per forward pass (default: the encoder's).
            show_progress_bar: tqdm bar over texts.

        Returns:
            ``[len(texts), hidden]`` float32 array.

        Raises:
            ValueError: if a text is empty, whitespace-only or not a string (names its index).
        """
        with self.lock:
            return self.encoder.encode(
                list(texts),
                instruction=instruction,
                normalize=normalize,
                batch_size=batch_size,
                show_progress_bar=show_progress_bar,
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

    Raises:
        ImportError: if the model's package is missing (the message gives the pip command).
        ValueError: for an unknown method or invalid encoder settings.
    """
    enc = _CACHE.get(config)
    if enc is not None:
        return enc
    with _CACHE_LOCK:
        enc = _CACHE.get(config)
        if enc is None:
            enc = _CACHE[config] = SharedEncoder(config)
        return enc


def loaded_configs() -> list[EncoderConfig]:
    """Configs whose encoder is loaded in this process (for tests and diagnostics)."""
    return list(_CACHE)
