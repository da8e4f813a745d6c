"""``HTPEncoder``: HTP and every baseline on an unmodified Hugging Face decoder.

Example:
    >>> from htp_retrieval import HTPEncoder
    >>> enc = HTPEncoder("smollm2-135m-instruct", method="htp")      # doctest: +SKIP
    >>> docs = enc.encode(["First sentence. Second one."])           # doctest: +SKIP
    >>> qs = enc.encode(["a claim"], instruction="Given a scientific claim, retrieve "
    ...                 "documents that support or refute the claim")  # doctest: +SKIP
"""

from __future__ import annotations

import collections
import itertools
import logging
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from htp_retrieval.centering import SIDES, Centering, Side
from htp_retrieval.chunking import Chunk, chunk_token_ranges
from htp_retrieval.config import SETTING_KEYS, HTPConfig
from htp_retrieval.layout import (
    Layout,
    TemplateIds,
    as_long_budget,
    auto_tokens_per_block,
    build_layout,
    count_sentences,
    render_layout,
    sentence_block_starts,
    token_block_starts,
    token_sentence_array,
)
from htp_retrieval.long_text import (
    TRUNCATION_MARK,
    block_starts_for_chunks,
    late_windows,
    overlapping_windows,
    truncation_warnings_off,
)
from htp_retrieval.methods import MethodSpec, get_method
from htp_retrieval.models import DEFAULT_MODEL, load_model
from htp_retrieval.pipeline import (
    POOL_PENDING_BATCHES,
    BatchInputs,
    EncodeStats,
    Prefetcher,
    _gc_paused,
    auto_windows,
)
from htp_retrieval.pooling import last_pool, mean_pool
from htp_retrieval.prepare_pool import (
    PreparePool,
    auto_workers,
    length_windows,
)
from htp_retrieval.rewiring import CopyPlan, base_model, decoder_layers, run_decoder
from htp_retrieval.segmentation import Segmenter, get_segmenter
from htp_retrieval.st_format import STSettings, is_st_folder, read_st_folder

logger = logging.getLogger(__name__)

PST = "<PST>"
BPST = "<B-PST>"
PaddingSide = Literal["right", "left"]
PlaceholderInit = str
"""``mean`` (mean of the embedding matrix, as ``resize_token_embeddings`` does),
``zeros``, ``bos``, or ``token:<text>`` (a copy of that token's embedding, e.g. ``token:.``)."""

def resolve_config(
    model: str | Any,
    method: str | MethodSpec = "htp",
    *,
    preset: str | Path | Mapping[str, Any] | None = None,
    n_layers: int | None = None,
    st: STSettings | None = None,
    **settings: Any,
) -> HTPConfig:
    """The :class:`~htp_retrieval.config.HTPConfig` that ``HTPEncoder(model, method,
    preset=preset, **settings)`` runs with, resolved without loading weights.

    A sentence-transformers folder's own ``max_seq_length`` (less its special tokens) and
    last-layer readout are the defaults of ``max_length`` and ``output_layer``; any other
    model resolves by :meth:`HTPConfig.for_model
    <htp_retrieval.config.HTPConfig.for_model>`.

    Args:
        model: A model reference (packaged name, ``.gguf``, directory, hub id; only its
            config is read) or a model config.
        method: Method name, alias or spec.
        preset: A calibration preset (path or dict of preset keys).
        n_layers: Decoder layers (default: the config's ``num_hidden_layers``).
        st: The folder's settings when the caller has read them already.
        **settings: Overrides by flat name (``None`` = not given).

    Raises:
        ValueError: as :meth:`HTPConfig.for_model`.
    """
    if st is None and isinstance(model, (str, Path)) and is_st_folder(str(model)):
        st = read_st_folder(str(model))
    st_len = None
    if st is not None and st.max_seq_length is not None:
        st_len = st.max_seq_length - len(st.lead_ids) - len(st.trail_ids)
    return HTPConfig.for_model(model, method, preset=preset, n_layers=n_layers,
                               st_max_length=st_len,
                               st_output_layer=-1 if st is not None else None, **settings)


RUNTIME_KEYS = ("padding_side", "max_padding", "pipeline", "prepare_window", "prepare_workers")
"""Keyword settings of :class:`HTPEncoder` that change speed, never the vectors."""


def _setting(path: str, doc: str) -> property:
    """A read-only view of one field of the encoder's :class:`HTPConfig`."""
    parts = path.split(".")

    def get(self: HTPEncoder) -> Any:
        value: Any = self._config
        for part in parts:
            value = getattr(value, part)
        return value

    return property(get, doc=f"{doc} (``config.{path}``)")


PROMPTEOL_BEFORE = 'This sentence : "'
PROMPTEOL_AFTER = '" means in one word:"'
ECHO_BEFORE = "Rewrite the sentence:"
ECHO_MIDDLE = ", rewritten sentence:"
INSTRUCTION_FORMAT = "{instruction} Text:"


@dataclass(frozen=True)
class _ConfigOnly:
    """Stand-in for the model in a worker's encoder copy: its config alone."""

    config: Any


_TOKENIZE_LOCK = threading.Lock()


def _offsets_array(offsets: Sequence[tuple[int, int]]) -> np.ndarray:
    """``[(start, end), ...]`` character offsets -> ``[n_tokens, 2]`` int64 array (about
    twice as fast as ``np.asarray`` on a list of tuples)."""
    flat = np.fromiter(itertools.chain.from_iterable(offsets), dtype=np.int64,
                       count=2 * len(offsets))
    return flat.reshape(-1, 2)


def _check_workers(workers: Any) -> int | Literal["auto"]:
    if workers is None:
        return 0
    if workers == "auto":
        return "auto"
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ValueError(f"prepare_workers must be 'auto' or an int >= 0, got {workers!r}")
    return workers


def _check_window(window: Any) -> int | Literal["auto"] | None:
    if window is None or window == "auto":
        return window
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"prepare_window must be an int >= 1, 'auto' or None, got {window!r}")
    return window


_INDEX = re.compile(r"(text at index )(\d+)")


def _remap_indices(message: str, indices: Sequence[int]) -> str:
    """``message`` with each "text at index i" made "text at index indices[i]"."""
    return _INDEX.sub(lambda m: f"{m.group(1)}{indices[int(m.group(2))]}", message)


def _shift_indices(message: str, offset: int) -> str:
    """``message`` with each "text at index i" made "text at index i + offset"."""
    return _INDEX.sub(lambda m: f"{m.group(1)}{int(m.group(2)) + offset}", message)


class HTPEncoder:
    """Embed texts with HTP (Ding et al., ACL 2026) or a baseline method.

    The decoder is the unmodified Hugging Face model: ``<PST>``/``<B-PST>`` are added to the
    tokenizer as special tokens, their input embeddings are filled at run time (the weights
    are never resized), copies are forward pre-hooks on the layers in [tp_start, tp_exit),
    and early exit stops after L' layers without computing the LM head.

    Every setting that changes the vectors lives in one :class:`~htp_retrieval.config.HTPConfig`
    (``encoder.config``), resolved once from the method, the model family's preset and any
    overrides (:meth:`HTPConfig.for_model <htp_retrieval.config.HTPConfig.for_model>`).

    Example:
        >>> HTPEncoder("qwen2.5-coder-0.5b-instruct", method="htp")        # doctest: +SKIP
        >>> HTPEncoder("smollm2-135m-instruct", "vanilla-mean", max_length=512)  # doctest: +SKIP
        >>> cfg = HTPConfig.from_json(open("run.json").read())               # doctest: +SKIP
        >>> HTPEncoder("smollm2-135m-instruct", cfg)                         # doctest: +SKIP

    Args:
        model: A packaged name (default ``smollm2-135m-instruct``), a ``.gguf`` path, a local
            directory, a hub id, or an already loaded causal LM (then pass ``tokenizer``).
            A local sentence-transformers folder of a finetuned decoder embedder
            (``modules.json``: Qwen3-Embedding, gte-Qwen2-instruct, e5-mistral) is read by
            :func:`~htp_retrieval.st_format.read_st_folder` and embedded as
            ``SentenceTransformer(folder)`` does: its own pooling (last token or mean), its
            tokenizer's special tokens (the appended EOS is the last-token readout), the
            last layer after the final norm (``output_layer`` defaults to -1), its prompts
            (:meth:`encode`'s ``prompt_name``/``prompt``; ``instruction`` is then a prompt
            text prepended verbatim), its ``Normalize``, and its ``max_seq_length`` as
            the default ``max_length``. Every method then keeps the model's pooling:
            ``vanilla`` reproduces sentence-transformers, ``htp`` adds the placeholders
            (never pooled); methods with a template (Echo, PromptEOL) are refused.
        config: A resolved :class:`~htp_retrieval.config.HTPConfig` (used as is; ``settings``
            replace fields of it), or a method name or alias
            (:data:`htp_retrieval.methods.METHODS`), shorthand for ``method=``; ``None``:
            ``htp`` with the model's defaults.
        tokenizer: Tokenizer for a model object (must be a fast tokenizer).
        device: ``auto``, ``cpu``, ``cuda`` (``cuda:N`` too). Inputs go to the device of
            the input embeddings.
        dtype: ``auto`` (default: :func:`~htp_retrieval.dtypes.resolve_dtype` picks bf16
            on a GPU with bf16 and on a CPU with native bf16 instructions where bf16 measured
            as fast as fp32, fp16 on an older GPU, fp32 on other CPUs), ``bfloat16``, ``float16`` or ``float32``. Ignored for
            a model object. :meth:`record` holds the resolved dtype, never ``auto``.
        device_map: Passed to ``from_pretrained`` (``"auto"`` spreads a model larger than
            one GPU over all visible GPUs, with ``accelerate``); overrides ``device``.
        batch_size: Maximum texts per batch.
        max_tokens_per_batch: Maximum padded tokens per batch (rows x longest row).
        **settings: Config settings by flat name
            (:data:`~htp_retrieval.config.SETTING_KEYS`: ``method``, ``k``, ``max_length``,
            ``overflow``, ``tp_start``, ``output_layer``, ``max_blocks``, ...; ``None``
            keeps the default, see :class:`~htp_retrieval.config.HTPConfig` for what each
            does), ``preset`` (a calibration preset file or dict, applied between the
            family's preset and the explicit settings), ``segmenter`` (a name, or a
            :class:`~htp_retrieval.segmentation.Segmenter` object), and the speed-only
            :data:`RUNTIME_KEYS`: ``padding_side`` (``right`` or ``left``, equal vectors;
            default the sentence-transformers tokenizer's side, else ``right``),
            ``max_padding`` (rows of a batch are at least ``(1 - max_padding)`` x its widest
            row; default 0.1), ``pipeline`` (prepare batch n+1 in a thread while batch n
            runs; default off: on an H100 it was slower, docs/PERFORMANCE.md section 5),
            ``prepare_window`` (lay out this many
            texts at a time, or ``"auto"``: about four batches' worth, :func:`auto_windows`;
            default all of a call), ``prepare_workers`` (lay texts out in this many spawned
            processes while the forward passes run, or ``"auto"``:
            :func:`~htp_retrieval.prepare_pool.auto_workers`; default 0, in the calling
            process; see :meth:`_encode_texts`).

    Raises:
        TypeError: for an unknown setting name (the message lists the valid ones).
        ValueError: for an unknown method, an invalid value (:class:`HTPConfig` names it),
            a layer window outside the model, a padding side; for a sentence-transformers
            folder that is not supported (:func:`~htp_retrieval.st_format.read_st_folder`)
            or a method with a template on one.
    """

    def __init__(
        self,
        model: str | Any = DEFAULT_MODEL,
        config: HTPConfig | str | MethodSpec | None = None,
        *,
        tokenizer: Any | None = None,
        device: str = "auto",
        dtype: str = "auto",
        device_map: str | dict[str, Any] | None = None,
        batch_size: int = 32,
        max_tokens_per_batch: int = 16384,
        **settings: Any,
    ) -> None:
        runtime = {k: settings.pop(k) for k in RUNTIME_KEYS if k in settings}
        preset = settings.pop("preset", None)
        segmenter = settings.get("segmenter")
        if segmenter is not None and not isinstance(segmenter, str):  # a Segmenter object
            settings["segmenter"] = getattr(segmenter, "name", None)
            self._segmenter = segmenter
        else:
            self._segmenter = None
        unknown = sorted(set(settings) - set(SETTING_KEYS))
        if unknown:
            raise TypeError(f"HTPEncoder got unknown settings {unknown}; valid: "
                            f"{', '.join(SETTING_KEYS + RUNTIME_KEYS)} (or pass config=)")
        if isinstance(config, (str, MethodSpec)):  # a method name: HTPEncoder(model, "htp")
            settings.setdefault("method", config)
            config = None
        method = settings.pop("method", None) or "htp"
        if config is not None and not isinstance(config, HTPConfig):
            raise TypeError(f"config must be an HTPConfig or a method name, got "
                            f"{type(config).__name__}")
        get_method(method)  # an unknown method fails before a model loads
        for name in ("long_budget", "short_budget"):
            if settings.get(name) is not None:
                as_long_budget(settings[name], name=name)
        self.st: STSettings | None = None
        if isinstance(model, Path):
            model = str(model)
        padding_side = runtime.get("padding_side")
        if is_st_folder(model):  # refuses unsupported folders before loading weights
            self.st = read_st_folder(model)
            if padding_side is None:
                padding_side = self.st.padding_side
        if padding_side is None:
            padding_side = "right"
        if padding_side not in ("right", "left"):
            raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
        if isinstance(model, str):
            self.model, self.tokenizer = load_model(model, device=device, dtype=dtype,
                                                    device_map=device_map)
            self.model_name = model
        else:
            if tokenizer is None:
                raise ValueError("pass tokenizer= together with a model object")
            self.model, self.tokenizer = model, tokenizer
            self.model_name = getattr(model.config, "_name_or_path", "") or type(model).__name__
        if not getattr(self.tokenizer, "is_fast", False):
            raise ValueError("a fast tokenizer (with offset mapping) is required")
        self.n_layers = len(decoder_layers(self.model))
        if config is None:
            config = resolve_config(self.model.config, method, preset=preset,
                                    n_layers=self.n_layers, st=self.st, **settings)
        else:
            if preset is not None:
                raise ValueError("preset= applies when the config is resolved: pass it to "
                                 "HTPConfig.for_model, not with a config")
            config = config.replace(**{k: v for k, v in settings.items() if v is not None},
                                    **({"method": method} if "method" in settings else {}))
        self.padding_side: PaddingSide = padding_side
        self.batch_size = batch_size
        self.max_tokens_per_batch = max_tokens_per_batch
        max_padding = runtime.get("max_padding", 0.1)
        if not 0.0 <= max_padding <= 1.0:
            raise ValueError(f"max_padding must be in [0, 1], got {max_padding}")
        self.max_padding = max_padding
        self.prepare_window: int | Literal["auto"] | None = _check_window(
            runtime.get("prepare_window"))
        pipeline = runtime.get("pipeline")
        # off by default on every device: the thread needs the GIL for its Python work
        # while the forward loop needs it to queue kernels (measured, docs/PERFORMANCE.md)
        self.pipeline: bool = False if pipeline is None else bool(pipeline)
        self.prepare_workers: int | Literal["auto"] = _check_workers(
            runtime.get("prepare_workers"))
        self._custom_segmenter = self._segmenter is not None
        self._pool: PreparePool | None = None
        self._lock = threading.Lock()
        self.last_stats = EncodeStats()
        self._warned_positions = False

        tok = self.tokenizer
        tok.add_special_tokens({"additional_special_tokens": [PST, BPST]},
                               replace_extra_special_tokens=False)
        self.pst_id = tok.convert_tokens_to_ids(PST)
        self.bpst_id = tok.convert_tokens_to_ids(BPST)
        sink = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
        self.sink_id = sink
        self._init_vec: torch.Tensor | None = None
        self.config = config  # validates the layers against the model, sets spec/template

    # ------------------------------------------------------------------ settings
    @property
    def config(self) -> HTPConfig:
        """The resolved :class:`~htp_retrieval.config.HTPConfig` (assigning one re-derives
        the method spec, the exit layer and the template; raises ``ValueError`` for a
        layer window outside this model)."""
        return self._config

    @config.setter
    def config(self, cfg: HTPConfig) -> None:
        if not isinstance(cfg, HTPConfig):
            raise TypeError(f"config must be an HTPConfig, got {type(cfg).__name__}")
        exit_layer = cfg.layers.exit_layer(self.n_layers)
        old = getattr(self, "_config", None)
        self._config = cfg
        self.exit_layer = exit_layer
        spec = cfg.spec
        self.spec: MethodSpec = (spec if self.st is None else
                                 self._st_spec(spec, self.st, log=old is None))
        keep_sink = cfg.keep_sink
        sink = self.sink_id
        self.sink_ids: tuple[int, ...] = (sink,) if sink is not None and keep_sink else ()
        if self.st is not None:
            # the model's own leading tokens (e.g. BOS) are the sink; a tokenizer that adds
            # none (Qwen3-Embedding) gets ``sink`` only where a placeholder would be first
            self.sink_ids = self.st.lead_ids
        self.template = self._template_ids()
        if old is not None and old.segmenter != cfg.segmenter:
            self._segmenter = None
            self._custom_segmenter = False
        if getattr(self, "_pool", None) is not None and old != cfg:
            self.close()  # the workers hold the old config
        if old is not None and old.placeholder_init != cfg.placeholder_init:
            self._init_vec = None

    tp_start = _setting("layers.tp_start", "First layer receiving copies.")
    tp_exit = _setting("layers.tp_exit", "Copies stop before this layer (exclusive).")
    output_layer = _setting("layers.output_layer", "Early exit as ``hidden_states[i]``.")
    overflow = _setting("overflow", "What a text longer than ``max_length`` gets.")
    summary = _setting("summary", "What ``<PST>_m`` receives (``last`` or ``mean``).")
    max_blocks = _setting("blocks.max_blocks", "Block budget per document, or ``None``.")
    min_block_tokens = _setting("blocks.min_block_tokens", "Density cap T, or ``None``.")
    long_budget = _setting("blocks.long_budget", "``(L, B_L)``, or ``None``.")
    short_budget = _setting("blocks.short_budget", "``(S, B_S)``, or ``None``.")
    keep_sink = _setting("keep_sink", "Whether the sink token stays at position 0.")
    placeholder_init = _setting("placeholder_init", "Input embedding of the placeholders.")
    bare_prefix = _setting("bare_prefix", "Text after the sink for documents.")
    preset = _setting("preset", "The calibration preset file the config came from.")

    @property
    def max_length(self) -> int:
        """Text tokens per forward pass (``config.max_length``; assignable)."""
        return self._config.max_length

    @max_length.setter
    def max_length(self, value: int) -> None:
        self.config = self._config.replace(max_length=value)

    # ------------------------------------------------------------------ workers
    def _layout_copy(self) -> HTPEncoder:
        """A copy without the model's weights, for :class:`PreparePool` workers: the
        tokenizer, config, method and ids :meth:`build_layouts` reads; ``model`` holds only
        the model's config; a named segmenter is created again in the worker."""
        copy = object.__new__(type(self))
        skip = {"model", "_lock", "_init_vec", "last_stats", "_pool"}
        copy.__dict__.update({k: v for k, v in self.__dict__.items() if k not in skip})
        copy.model = _ConfigOnly(self.model.config)
        copy._init_vec = None
        copy._pool = None
        copy.last_stats = EncodeStats()
        copy._warned_positions = True  # the calling process warns
        if not self._custom_segmenter:
            copy._segmenter = None
        return copy

    def _workers(self) -> PreparePool | None:
        """The worker pool of ``prepare_workers`` processes, started on first use."""
        n = auto_workers() if self.prepare_workers == "auto" else self.prepare_workers
        if n == 0:
            return None
        if self._pool is None or self._pool.workers != n:
            self.close()
            self._pool = PreparePool(self._layout_copy(), n)
            weakref.finalize(self, self._pool.close)
        return self._pool

    def close(self) -> None:
        """Stop the ``prepare_workers`` processes, if any (a later call starts them again)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def __enter__(self) -> HTPEncoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ layout
    @property
    def segmenter(self) -> Segmenter:
        """The sentence segmenter, created on first use."""
        if self._segmenter is None:
            self._segmenter = get_segmenter(self._config.segmenter)
        return self._segmenter

    def _ids(self, text: str) -> tuple[int, ...]:
        if not text:
            return ()
        return tuple(
            self.tokenizer(text, add_special_tokens=False, split_special_tokens=True).input_ids
        )

    def _template_ids(self) -> TemplateIds:
        if self.st is not None:  # plain template: the tokenizer's trailing tokens (EOS)
            return TemplateIds((), (), self.st.trail_ids)
        t = self.spec.template
        if t == "prompteol":
            return TemplateIds(self._ids(PROMPTEOL_BEFORE), (), self._ids(PROMPTEOL_AFTER))
        if t == "echo":
            return TemplateIds(self._ids(ECHO_BEFORE), self._ids(ECHO_MIDDLE), ())
        return TemplateIds()

    @staticmethod
    def _st_spec(spec: MethodSpec, st: STSettings, *, log: bool = True) -> MethodSpec:
        """The method as it runs on a sentence-transformers model: the model's pooling.

        Raises:
            ValueError: for a method with a template (Echo, PromptEOL): the model was
                finetuned on its own input format.
        """
        if spec.template != "plain":
            raise ValueError(f"method {spec.name!r} wraps the text in a {spec.template} "
                             "template, which a finetuned embedding model was not trained on; "
                             "use vanilla or htp")
        out = replace(spec, pooling=st.pooling)
        if not log:
            return out
        logger.info(
            "%s is a sentence-transformers model: method %r runs with its own %s pooling%s, "
            "the last layer (no early exit) and its prompts%s",
            st.path, spec.name, "last-token" if st.pooling == "last" else "mean",
            " (the appended EOS is read)" if st.pooling == "last" and st.trail_ids else "",
            "; placeholders are never pooled" if spec.placeholders != "none" else "")
        return out

    def _st_prefix(self, prompt_ids: Sequence[int]) -> tuple[int, ...]:
        """Prefix of a sentence-transformers model's input: its leading special tokens and
        the prompt's tokens; the sink token (EOS) goes first only when that would be empty
        and the method puts placeholders after it (they never sit at position 0)."""
        prefix = self.sink_ids + tuple(prompt_ids)
        if not prefix and self.spec.placeholders != "none" and self.keep_sink:
            sink = self.sink_id if self.sink_id is not None else self.tokenizer.eos_token_id
            prefix = (sink,)
        return prefix

    def _st_pooled(self, lay: Layout, n_prefix: int, n_prompt: int, n_skip: int) -> Layout:
        """Mean pooling as sentence-transformers does it: every token of the model's input
        (leading special tokens, prompt, text, appended EOS), never a placeholder or the
        sink added for them.

        Args:
            lay: The layout (its ``pool_positions`` are the text tokens).
            n_prefix: Prefix length, sink included.
            n_prompt: Prompt tokens in the prefix.
            n_skip: Model tokens left out first (``include_prompt`` off: the leading special
                tokens plus the prompt tokenized alone, as sentence-transformers counts
                them), else 0.
        """
        st = self.st
        assert st is not None
        if st.pooling != "mean":
            return lay
        first = n_prefix - len(st.lead_ids) - n_prompt  # 1 when a sink was added, else 0
        n_trail = len(st.trail_ids)
        pooled = (tuple(range(first, n_prefix)) + lay.pool_positions
                  + tuple(range(len(lay) - n_trail, len(lay))))
        return replace(lay, pool_positions=pooled[n_skip:])

    def _tokenize_prompted(self, prompt: str, texts: Sequence[str]
                           ) -> tuple[list[list[int]], list[list[tuple[int, int]]],
                                      list[list[int]]]:
        """Tokenize ``prompt + text`` as one string, as sentence-transformers does, and split
        the tokens at the prompt's end.

        A token that straddles the boundary (e.g. ``" What"`` after a prompt ending in a
        space) belongs to the text.

        Returns:
            ``(text_ids, text_offsets, prompt_ids)``: ``[n_texts]`` lists; the offsets are
            relative to the text (clipped at 0).
        """
        n = len(prompt)
        ids_all, offs_all = self._tokenize([prompt + t for t in texts])
        text_ids, text_offs, prompt_ids = [], [], []
        for ids, offs in zip(ids_all, offs_all):
            k = 0
            while k < len(offs) and offs[k][1] <= n:
                k += 1
            prompt_ids.append(list(ids[:k]))
            text_ids.append(list(ids[k:]))
            text_offs.append([(max(0, a - n), max(0, b - n)) for a, b in offs[k:]])
        return text_ids, text_offs, prompt_ids

    def prefix_ids(self, instruction: str | None) -> tuple[int, ...]:
        """Sink token (BOS) plus the formatted instruction, ``[prefix_len]`` ids.

        Without an instruction the prefix is the sink plus ``bare_prefix`` (default empty).
        On a sentence-transformers model: its leading special tokens plus the prompt
        ``instruction`` tokenized alone (:meth:`build_layouts` tokenizes prompt and text
        together, as sentence-transformers does).
        """
        if self.st is not None:
            return self._st_prefix(self._ids(instruction or ""))
        if instruction:
            return self.sink_ids + self._ids(INSTRUCTION_FORMAT.format(instruction=instruction))
        return self.sink_ids + self._ids(self.bare_prefix)

    def _tokenize(self, texts: Sequence[str]) -> tuple[list[list[int]], list[Any]]:
        """Token ids and ``(start, end)`` character offsets per text, no special tokens,
        special-token text such as ``"<PST>"`` split as plain text.

        Calls the Rust tokenizer (``backend_tokenizer.encode_batch``) directly, as the
        Hugging Face call does with ``split_special_tokens=True`` and no truncation or
        padding, without building its intermediate dicts; falls back to that call for a
        tokenizer without a backend.

        Returns:
            ``(ids, offsets)``: ``[n_texts]`` lists of ``[n_tokens]`` ids and of
            ``[n_tokens]`` offset pairs.
        """
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None or not hasattr(backend, "encode_special_tokens"):
            enc = self.tokenizer(list(texts), add_special_tokens=False,
                                 return_offsets_mapping=True, split_special_tokens=True)
            return enc["input_ids"], enc["offset_mapping"]
        with _TOKENIZE_LOCK:  # backend state set per call, as the Hugging Face call does
            if not backend.encode_special_tokens:
                backend.encode_special_tokens = True
            if backend.truncation is not None:
                backend.no_truncation()
            if backend.padding is not None:
                backend.no_padding()
            encodings = backend.encode_batch(list(texts), add_special_tokens=False)
        return [e.ids for e in encodings], [e.offsets for e in encodings]

    def build_layouts(
        self,
        texts: Sequence[str],
        *,
        instruction: str | None = None,
        stats: EncodeStats | None = None,
    ) -> list[Layout]:
        """Tokenize, truncate, segment and lay out texts (no model call).

        Text is truncated to ``max_length`` text tokens first; placeholders come after,
        so they are never cut. User text is tokenized with ``split_special_tokens=True``:
        a literal ``"<PST>"`` in it stays plain text.

        Args:
            texts: Texts to lay out.
            instruction: Instruction put before the text.
            stats: If given, its ``tokenize_seconds``, ``segment_seconds`` and
                ``layout_seconds`` are increased by the time of each step.

        Raises:
            ValueError: if a text is not a string or is empty/whitespace-only; the message
                names its index.
        """
        with _gc_paused():
            return self._build_layouts(texts, instruction=instruction, stats=stats)

    def _build_layouts(
        self,
        texts: Sequence[str],
        *,
        instruction: str | None,
        stats: EncodeStats | None,
        chunks: Sequence[Sequence[Chunk]] | None = None,
        ranges_out: list[list[tuple[int, int]]] | None = None,
    ) -> list[Layout]:
        """:meth:`build_layouts` without the garbage-collector pause.

        With ``chunks`` (late chunking: each text's chunks, spans relative to that text),
        placeholder methods get one block per chunk
        (:func:`~htp_retrieval.long_text.block_starts_for_chunks`) and each text's chunk
        token ranges are appended to ``ranges_out``.
        """
        t0 = time.perf_counter()
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise ValueError(f"text at index {i} is {type(t).__name__}, not str")
            if not t.strip():
                raise ValueError(f"text at index {i} is empty or whitespace-only")
        prompt_ids: list[list[int]] | None = None
        if self.st is not None and instruction:
            ids_full, offs_full, prompt_ids = self._tokenize_prompted(instruction, texts)
        else:
            ids_full, offs_full = self._tokenize(texts)
        for i, ids in enumerate(ids_full):
            if len(ids) > self.max_length:
                if self.overflow == "error":
                    raise ValueError(
                        f"text at index {i} has {len(ids)} tokens, more than max_length="
                        f"{self.max_length}: pass overflow='window' to embed it whole, "
                        "overflow='truncate' to cut it, or a larger max_length")
                if stats is not None:
                    stats.truncated.append((i, len(ids)))
        ids_all = [ids[: self.max_length] for ids in ids_full]
        for i, ids in enumerate(ids_all):
            if not ids:
                raise ValueError(f"text at index {i} produced no tokens")
        spec = self.spec
        auto_n = spec.blocks == "tokens" and spec.tokens_per_block == "auto"
        by_sentence = spec.placeholders in ("local", "hierarchical") and (
            spec.blocks == "sentence" or auto_n)
        offs_all = ([_offsets_array(offs[: self.max_length]) for offs in offs_full]
                    if by_sentence or chunks is not None else [])
        t1 = time.perf_counter()
        if chunks is not None:
            ranges = [chunk_token_ranges(offs, ch) for offs, ch in zip(offs_all, chunks)]
            if ranges_out is not None:
                ranges_out.extend(ranges)
        if chunks is not None and spec.placeholders in ("local", "hierarchical"):
            blocks = [block_starts_for_chunks(r, len(ids)) for r, ids in zip(ranges, ids_all)]
        elif by_sentence:
            kept = [t[: int(offs[-1, 1])] for t, offs in zip(texts, offs_all)]
            starts_all = self.segmenter.sentence_starts(kept)
            sent_idx = [token_sentence_array(offs, starts)
                        for offs, starts in zip(offs_all, starts_all)]
            blocks = [
                sentence_block_starts(
                    si, self._config.blocks.k_for(count_sentences(si), len(ids))
                )
                for si, ids in zip(sent_idx, ids_all)
            ]
            if auto_n:  # same <PST> budget as the sentence blocks, cut every N tokens
                blocks = [
                    token_block_starts(len(ids), auto_tokens_per_block(len(ids), len(b)))
                    for ids, b in zip(ids_all, blocks)
                ]
        elif spec.placeholders in ("local", "hierarchical"):
            blocks = [token_block_starts(len(ids), spec.tokens_per_block) for ids in ids_all]
        else:
            blocks = [[0] for _ in ids_all]
        t2 = time.perf_counter()
        if self.st is None:
            prefixes = [self.prefix_ids(instruction)] * len(ids_all)
        else:
            prompts = prompt_ids if prompt_ids is not None else [[] for _ in ids_all]
            prefixes = [self._st_prefix(p) for p in prompts]
        layouts = [
            build_layout(
                spec=spec,
                text_ids=ids,
                block_starts=b,
                prefix_ids=prefix,
                template=self.template,
                pst_id=self.pst_id,
                bpst_id=self.bpst_id,
                allow_placeholder_at_zero=not self.keep_sink,
            )
            for ids, b, prefix in zip(ids_all, blocks, prefixes)
        ]
        if self.st is not None and chunks is None:  # late chunks pool their own tokens
            n_skip = 0
            if instruction and not self.st.include_prompt:
                n_skip = len(self.st.lead_ids) + len(self._ids(instruction))
            layouts = [self._st_pooled(lay, len(prefix), len(p), n_skip)
                       for lay, prefix, p in zip(layouts, prefixes, prompts)]
        if stats is not None:
            stats.tokenize_seconds += t1 - t0
            stats.segment_seconds += t2 - t1
            stats.layout_seconds += time.perf_counter() - t2
        self._check_positions(layouts)
        return layouts

    def _check_positions(self, layouts: Sequence[Layout]) -> None:
        """Warn once when an input is longer than the model's trained context."""
        limit = getattr(self.model.config, "max_position_embeddings", None)
        longest = max((len(lay) for lay in layouts), default=0)
        if limit and longest > limit and not self._warned_positions:
            self._warned_positions = True
            logger.warning(
                "an input has %d tokens (placeholders and template included), more than the "
                "model's max_position_embeddings=%d: positions beyond it are extrapolated",
                longest, limit)

    def describe(self, text: str, *, instruction: str | None = None) -> str:
        """The placeholder layout of one input, like the paper's Appendix C example."""
        lay = self.build_layouts([text], instruction=instruction)[0]
        toks = self.tokenizer.convert_ids_to_tokens(list(lay.input_ids))
        return render_layout(lay, toks)

    # ----------------------------------------------------------------- forward
    def _placeholder_vector(self) -> torch.Tensor:
        if self._init_vec is None:
            emb = self.model.get_input_embeddings()
            w = emb.weight
            init = self.placeholder_init
            with torch.no_grad():
                if init == "mean":
                    # summed in row chunks: a float32 copy of the whole matrix would cost
                    # rows x hidden x 4 bytes at once (545 MB for Qwen2.5's 152k vocabulary)
                    total = torch.zeros(w.shape[1], dtype=torch.float32, device=w.device)
                    for i in range(0, w.shape[0], 8192):
                        total += w[i : i + 8192].float().sum(0)
                    vec = total / w.shape[0] * float(getattr(emb, "embed_scale", 1.0))
                elif init == "zeros":
                    vec = torch.zeros(w.shape[1], device=w.device)
                elif init == "bos" or init.startswith("token:"):
                    ids = (self.sink_id,) if init == "bos" else self._ids(init[len("token:"):])
                    if len(ids) != 1:
                        raise ValueError(f"placeholder_init {init!r} must map to one token")
                    vec = emb(torch.tensor([ids[0]], device=w.device))[0].float()
                else:
                    raise ValueError(f"unknown placeholder_init {init!r}")
            self._init_vec = vec.to(w.dtype)
        return self._init_vec

    def _batches(self, lengths: Sequence[int], batch_size: int, max_tokens: int) -> list[list[int]]:
        """Token-budget batches of indices, longest first.

        A batch ends when it has ``batch_size`` rows, when one more row would exceed
        ``max_tokens`` padded tokens (rows x longest row), or when the next row is shorter
        than ``(1 - max_padding)`` x the batch's longest row.
        """
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        batches: list[list[int]] = []
        cur: list[int] = []
        min_share = 1.0 - self.max_padding
        for i in order:
            longest = lengths[cur[0]] if cur else lengths[i]
            if cur and (len(cur) >= batch_size or (len(cur) + 1) * longest > max_tokens
                        or lengths[i] < min_share * longest):
                batches.append(cur)
                cur = []
            cur.append(i)
        if cur:
            batches.append(cur)
        return batches

    def _batch_inputs(self, layouts: Sequence[Layout]) -> BatchInputs:
        """Host-side tensors of one batch, moved to the model's device.

        Built with numpy (no per-token Python loop over tensors); on CUDA the host tensors
        are pinned and copied with ``non_blocking=True``, so the copy overlaps work that
        is already queued. Safe to call from the prefetch thread: it reads the layouts and
        the encoder's settings only.

        Args:
            layouts: ``[batch]`` layouts.

        Returns:
            The :class:`BatchInputs` (``ids``/``pool`` ``[batch, width]``).
        """
        dev = self.model.get_input_embeddings().weight.device
        n = len(layouts)
        width = max(len(lay) for lay in layouts)
        ids = np.full((n, width), self.tokenizer.pad_token_id or 0, dtype=np.int64)
        mask = np.zeros((n, width), dtype=np.int64)
        pool = np.zeros((n, width), dtype=np.float32)
        offsets = []
        for r, lay in enumerate(layouts):
            off = width - len(lay) if self.padding_side == "left" else 0
            offsets.append(off)
            ids[r, off : off + len(lay)] = lay.input_ids
            mask[r, off : off + len(lay)] = 1
            if self.spec.pooling == "mean" and not len(lay.pool_positions):
                raise ValueError("mean pooling: a row has no text token to average")
            pool[r, np.asarray(lay.pool_positions, dtype=np.int64) + off] = 1.0
        has_ph = any(lay.n_placeholders for lay in layouts)
        cuda = dev.type == "cuda"

        def move(x: np.ndarray | torch.Tensor) -> torch.Tensor:
            t = torch.from_numpy(x) if isinstance(x, np.ndarray) else x
            if cuda:
                return t.pin_memory().to(dev, non_blocking=True)
            return t.to(dev)

        attention_mask: torch.Tensor | None
        if self.padding_side == "right":
            # Causal attention: a real token never attends to the right padding after it, so
            # the plain causal mask gives the same states at every real position. Passing no
            # padding mask (and positions 0..width-1, which equal the real tokens' positions)
            # lets SDPA take its is_causal kernel: no [batch, 1, seq, seq] mask, no repeated
            # K/V heads. Padding states are never read (pooling and copies use real tokens).
            attention_mask = None
            position_ids = move(torch.arange(width).unsqueeze(0))
        else:
            position_ids = move(np.maximum(mask.cumsum(axis=1) - 1, 0))
            attention_mask = move(mask)
        plan = None
        if self.spec.uses_rewiring:
            plan = CopyPlan.from_layouts(layouts, offsets, "cpu",
                                         summary=self.summary if self.spec.placeholders in
                                         ("local", "hierarchical") else "last")
            plan = plan.to(dev, pin=cuda, non_blocking=cuda)
        last = None
        if self.spec.pooling != "mean":
            last = move(torch.tensor([lay.last_position + o
                                      for lay, o in zip(layouts, offsets)]))
        return BatchInputs(ids=move(ids), attention_mask=attention_mask,
                           position_ids=position_ids, pool=move(pool), plan=plan,
                           last=last, width=width, has_placeholders=has_ph)

    @torch.inference_mode()
    def _forward(
        self, layouts: Sequence[Layout], stats: EncodeStats | None = None
    ) -> torch.Tensor:
        """Embed one batch: ``[batch]`` layouts -> ``[batch, hidden]`` float32 vectors.

        With ``stats``, the copy-hook time (CPU only) and the pooling time are added to it.
        """
        return self._run_batch(self._batch_inputs(layouts), stats)

    @torch.inference_mode()
    def _run_batch(self, batch: BatchInputs, stats: EncodeStats | None = None) -> torch.Tensor:
        """Forward and pool one prepared batch -> ``[batch, hidden]`` float32 vectors.

        With ``stats``, the copy-hook time (CPU only) and the pooling time are added to it.
        """
        hidden = self._hidden_states(batch, stats)
        dev = batch.ids.device
        t0 = time.perf_counter()
        with torch.profiler.record_function("htp.pool"):
            hidden = hidden.to(dev)  # a no-op unless device_map put the exit layer elsewhere
            if self.spec.pooling == "mean":
                vecs = mean_pool(hidden, batch.pool, check=False)  # checked on the host
            else:
                assert batch.last is not None
                vecs = last_pool(hidden, batch.last)
        if stats is not None:
            stats.pool_seconds += time.perf_counter() - t0
        return vecs

    @torch.inference_mode()
    def _hidden_states(self, batch: BatchInputs, stats: EncodeStats | None = None
                       ) -> torch.Tensor:
        """The early-exit hidden states of one prepared batch, ``[batch, width, hidden]``.

        With ``stats``, the copy-hook time (CPU only) is added to it.
        """
        ids = batch.ids
        dev = ids.device
        emb = self.model.get_input_embeddings()
        vocab_rows = emb.weight.shape[0]
        embeds = emb(ids.clamp(max=vocab_rows - 1))
        if batch.has_placeholders:  # where(), not a boolean index: no device sync
            is_ph = (ids == self.pst_id) | (ids == self.bpst_id)
            embeds = torch.where(is_ph.unsqueeze(-1), self._placeholder_vector(), embeds)
        timings: dict[str, float] | None = (
            {} if stats is not None and dev.type == "cpu" else None
        )
        hidden = run_decoder(
            self.model,
            inputs_embeds=embeds,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            exit_layer=self.exit_layer,
            plan=batch.plan,
            tp_start=self.tp_start,
            tp_exit=self.tp_exit,
            timings=timings,
        )
        if stats is not None and timings:
            stats.copy_seconds += timings.get("copy_seconds", 0.0)
        return hidden

    def _prepared_batches(
        self,
        texts: Sequence[str],
        windows: Sequence[tuple[int, int]],
        *,
        instruction: str | None,
        batch_size: int,
        max_tokens: int,
        stats: EncodeStats,
        origin: float = 0.0,
    ) -> Iterator[tuple[list[int], BatchInputs]]:
        """Prepare batches in forward order: ``(input indices, inputs)`` per batch.

        Each window of consecutive texts is laid out (tokenize, segment, layout), cut into
        length-sorted token-budget batches (:meth:`_batches`), and each batch's tensors are
        built (:meth:`_batch_inputs`). Adds the prepare counters, token counts and
        ``prepare_timeline`` (seconds since ``origin``, a ``time.perf_counter()`` value) to
        ``stats``; the forward loop writes other fields only.
        """
        for a, _b, layouts, t0 in self._window_layouts(texts, windows, instruction, stats):
            begin = t0  # the window's layout counts toward its first batch
            stats.text_tokens += sum(lay.n_text_tokens for lay in layouts)
            stats.input_tokens += sum(len(lay) for lay in layouts)
            lengths = [len(lay) for lay in layouts]
            for idx in self._batches(lengths, batch_size, max(max_tokens, max(lengths))):
                inputs = self._timed_inputs([layouts[i] for i in idx], stats, begin - origin,
                                            origin)
                yield [a + i for i in idx], inputs
                begin = time.perf_counter()

    def _timed_inputs(self, layouts: Sequence[Layout], stats: EncodeStats, start: float,
                      origin: float) -> BatchInputs:
        """:meth:`_batch_inputs`, its time added to ``stats.inputs_seconds`` and the batch's
        preparation (from ``start``, seconds since ``origin``) to ``prepare_timeline``."""
        t1 = time.perf_counter()
        with torch.profiler.record_function("htp.inputs"):
            inputs = self._batch_inputs(layouts)
        t2 = time.perf_counter()
        stats.inputs_seconds += t2 - t1
        stats.prepare_timeline.append((start, t2 - origin))
        return inputs

    def _pooled_batches(
        self,
        pool: PreparePool,
        texts: Sequence[str],
        *,
        instruction: str | None,
        batch_size: int,
        max_tokens: int,
        stats: EncodeStats,
        origin: float = 0.0,
    ) -> Iterator[tuple[list[int], BatchInputs]]:
        """Batches in forward order, laid out by the worker processes of ``pool``.

        The texts are cut into windows in order of length (:func:`length_windows`), all
        queued at once (the workers lay them out in parallel), and collected in order; the
        layouts received so far are cut into token-budget batches (:meth:`_batches`), and
        the leading full batches (``batch_size`` rows, or no room for one more row) are
        yielded at once; batches with room wait for later windows' texts, at most
        :data:`POOL_PENDING_BATCHES` of them. So batches are close to those of the whole
        call sorted at once, and the first starts after the first few windows.

        ``stats`` gets the workers' step times (summed over workers: CPU time, not wall
        time), their truncations in input indices, token counts and ``prepare_timeline``.

        Raises:
            ValueError: a worker's layout error, naming the text's index in ``texts``.
        """
        windows = length_windows(texts, max_tokens, self.max_length)
        futures = [pool.submit([texts[i] for i in w], instruction) for w in windows]
        pending: list[tuple[int, Layout]] = []
        begin = time.perf_counter()

        def emit(items: list[tuple[int, Layout]], final: bool
                 ) -> Iterator[tuple[list[int], BatchInputs]]:
            nonlocal begin
            lengths = [len(lay) for _, lay in items]
            budget = max(max_tokens, max(lengths))
            cut = self._batches(lengths, batch_size, budget)
            n_out = len(cut)
            if not final:  # a batch with room may still get rows from later windows
                n_out = 0
                while n_out < len(cut) and (
                        len(cut[n_out]) >= batch_size
                        or (len(cut[n_out]) + 1) * lengths[cut[n_out][0]] > budget
                        or len(cut) - n_out > POOL_PENDING_BATCHES):
                    n_out += 1
            keep = cut[:n_out]
            for idx in keep:
                inputs = self._timed_inputs([items[i][1] for i in idx], stats,
                                            begin - origin, origin)
                yield [items[i][0] for i in idx], inputs
                begin = time.perf_counter()
            if not final:
                pending[:] = [items[i] for b in cut[n_out:] for i in b]

        try:
            for w, fut in zip(windows, futures):
                t0 = time.perf_counter()
                try:
                    layouts, steps = fut.result()
                except ValueError as e:
                    raise ValueError(_remap_indices(str(e), w)) from e
                stats.prepare_seconds += time.perf_counter() - t0
                stats.tokenize_seconds += steps["tokenize_seconds"]
                stats.segment_seconds += steps["segment_seconds"]
                stats.layout_seconds += steps["layout_seconds"]
                stats.truncated.extend((w[i], n) for i, n in steps["truncated"])
                stats.text_tokens += sum(lay.n_text_tokens for lay in layouts)
                stats.input_tokens += sum(len(lay) for lay in layouts)
                self._check_positions(layouts)
                yield from emit(pending + list(zip(w, layouts)), final=False)
            if pending:
                yield from emit(pending, final=True)
        finally:
            for fut in futures:
                fut.cancel()

    def _window_layouts(
        self,
        texts: Sequence[str],
        windows: Sequence[tuple[int, int]],
        instruction: str | None,
        stats: EncodeStats,
    ) -> Iterator[tuple[int, int, list[Layout], float]]:
        """The layouts of each window in order: ``(start, end, layouts, t0)``, ``t0`` the
        ``perf_counter`` time their preparation began.

        Adds ``prepare_seconds``, the step times and the truncations (indices into
        ``texts``) to ``stats``. A ``ValueError`` names the text's index in ``texts``, not
        in its window.
        """
        for a, b in windows:
            t0 = time.perf_counter()
            n_cut = len(stats.truncated)
            try:
                with torch.profiler.record_function("htp.prepare"):
                    layouts = self.build_layouts(texts[a:b], instruction=instruction,
                                                 stats=stats)
            except ValueError as e:
                raise ValueError(_shift_indices(str(e), a)) from e
            stats.truncated[n_cut:] = [(a + i, n) for i, n in stats.truncated[n_cut:]]
            stats.prepare_seconds += time.perf_counter() - t0
            yield a, b, layouts, t0

    def encode(
        self,
        texts: Sequence[str],
        *,
        instruction: str | None = None,
        batch_size: int | None = None,
        max_tokens_per_batch: int | None = None,
        show_progress_bar: bool = False,
        normalize: bool | None = None,
        progress: Callable[[int], object] | None = None,
        pipeline: bool | None = None,
        prepare_window: int | Literal["auto"] | None = None,
        prompt_name: str | None = None,
        prompt: str | None = None,
        centering: Centering | None = None,
        side: Side | None = None,
    ) -> np.ndarray:
        """Embed texts.

        A text of more than ``max_length`` tokens is handled by the encoder's ``overflow``:
        with ``window`` it is cut into overlapping windows
        (:func:`~htp_retrieval.long_text.overlapping_windows`), each embedded like a text of
        its own, and its vector is their average weighted by token count
        (:attr:`EncodeStats.windowed` counts such texts); with ``truncate`` a warning names
        every truncated text (index, tokens, tokens dropped); with ``error`` a
        ``ValueError`` names the first. The other arguments are those of
        :meth:`_encode_texts`, which documents batching and the pipeline.

        Args:
            texts: Texts to embed, ``[n]``.
            instruction: Instruction put before the text (queries: the task instruction;
                documents: usually ``None``), as ``"{instruction} Text:"``. On a
                sentence-transformers model it is a prompt text instead, prepended verbatim
                as ``prompt`` is.
            batch_size: Maximum texts per batch (default: the encoder's).
            max_tokens_per_batch: Maximum padded tokens per batch (default: the encoder's).
            show_progress_bar: Show a tqdm bar over texts (over windows when some text is
                windowed).
            normalize: L2-normalize the embeddings (after averaging the windows). ``None``
                (default): whether the sentence-transformers folder has a ``Normalize``
                module, else ``False``.
            progress: Called after each batch with the number of texts it finished.
            pipeline: Prepare the next batch in a background thread (default: the
                encoder's ``pipeline``).
            prepare_window: Lay out texts in groups of this many (see :meth:`_encode_texts`).
            prompt_name: Sentence-transformers models only: the name of one of the model's
                prompts (e.g. ``"query"``); without ``prompt_name``, ``prompt`` or
                ``instruction`` the model's ``default_prompt_name`` applies, as in
                sentence-transformers.
            prompt: Sentence-transformers models only: a prompt text prepended to each text
                and tokenized with it, as ``SentenceTransformer.encode(prompt=...)`` does
                (mean-pooled with the text unless the model's ``include_prompt`` is off).
            centering: A :class:`~htp_retrieval.centering.Centering` fitted with this
                encoder's config: the vectors come back centred on its ``side`` mean and
                L2-normalised (``normalize`` is then moot).
            side: ``"query"`` or ``"document"``: which mean ``centering`` subtracts
                (required with ``centering``).

        Returns:
            ``[n, hidden]`` float32 array (``[0, hidden]`` for no texts).

        Raises:
            ValueError: if a text is empty, whitespace-only or not a string (names its
                index), ``prepare_window < 1``, or with ``overflow="error"`` a text is
                longer than ``max_length``; for ``prompt``/``prompt_name`` on a model that
                is not a sentence-transformers folder, an unknown ``prompt_name``, or two of
                ``instruction``, ``prompt`` and ``prompt_name`` at once; for ``centering``
                without ``side`` (or ``side`` without ``centering``), or a centring fitted
                with another config or model.
        """
        if centering is not None or side is not None:
            if centering is None or side not in SIDES:
                raise ValueError(f"centering= needs side='query' or side='document' and side= "
                                 f"needs centering=, got centering={centering!r}, "
                                 f"side={side!r}")
            centering.check_config(self.config, model=self.model_name)
            vecs = self.encode(texts, instruction=instruction, batch_size=batch_size,
                               max_tokens_per_batch=max_tokens_per_batch,
                               show_progress_bar=show_progress_bar, normalize=False,
                               progress=progress, pipeline=pipeline,
                               prepare_window=prepare_window, prompt_name=prompt_name,
                               prompt=prompt)
            return centering.apply(vecs, side)
        instruction = self._resolve_prompt(instruction, prompt, prompt_name)
        if normalize is None:
            normalize = self.st is not None and self.st.normalize
        kw: dict[str, Any] = dict(instruction=instruction, batch_size=batch_size,
                                  max_tokens_per_batch=max_tokens_per_batch,
                                  pipeline=pipeline, prepare_window=prepare_window)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise ValueError(f"text at index {i} is {type(t).__name__}, not str")
            if not t.strip():
                raise ValueError(f"text at index {i} is empty or whitespace-only")
        # byte-level and byte-fallback tokenizers give at most one token per UTF-8 byte
        # (plus a leading-space token): only texts longer than that can overflow
        maybe_long = [i for i, t in enumerate(texts)
                      if self.overflow == "window" and len(t.encode()) + 1 > self.max_length]
        windows: dict[int, list[Any]] = {}
        if maybe_long:
            _, offs = self._tokenize([texts[i] for i in maybe_long])
            for i, off in zip(maybe_long, offs):
                if len(off) > self.max_length:
                    windows[i] = overlapping_windows(_offsets_array(off), self.max_length)
        if not windows:
            out = self._encode_texts(texts, show_progress_bar=show_progress_bar,
                                     normalize=normalize, progress=progress, **kw)
            self._warn_truncated(self.last_stats)
            return out
        pieces: list[str] = []
        owner: list[int] = []
        weight: list[float] = []
        for i, t in enumerate(texts):
            for w in windows.get(i, [None]):
                pieces.append(t if w is None else t[w.start : w.end])
                owner.append(i)
                weight.append(1.0 if w is None else float(w.n_tokens))
        share = [1.0 / len(windows.get(i, [None])) for i in owner]
        done = [0.0]
        reported = [0]

        def on_batch(idx: list[int]) -> None:
            done[0] += sum(share[j] for j in idx)
            step = int(round(done[0])) - reported[0]
            if step > 0 and progress is not None:
                reported[0] += step
                progress(step)

        vecs = self._encode_texts(pieces, show_progress_bar=show_progress_bar,
                                  normalize=False, progress_idx=on_batch, **kw)
        stats = self.last_stats
        own = np.asarray(owner)
        wts = np.asarray(weight, dtype=np.float64)
        out = np.zeros((len(texts), vecs.shape[1]), dtype=np.float64)
        np.add.at(out, own, vecs * wts[:, None])
        out /= np.bincount(own, weights=wts, minlength=len(texts))[:, None]
        out32 = out.astype(np.float32)
        if normalize:
            out32 /= np.maximum(np.linalg.norm(out32, axis=1, keepdims=True), 1e-12)
        stats.n_texts = len(texts)
        stats.windowed = len(windows)
        stats.n_windows = sum(len(w) for w in windows.values())
        stats.truncated = [(owner[j], n) for j, n in stats.truncated]
        self._warn_truncated(stats)
        return out32

    def _resolve_prompt(self, instruction: str | None, prompt: str | None,
                        prompt_name: str | None) -> str | None:
        """The instruction or prompt text :meth:`encode` puts before the texts.

        Raises:
            ValueError: as :meth:`encode` describes for its prompt arguments.
        """
        if self.st is None:
            if prompt is not None or prompt_name is not None:
                raise ValueError("prompt= and prompt_name= apply to sentence-transformers "
                                 "models (a folder with modules.json); use instruction=")
            return instruction
        if instruction is not None:
            if prompt is not None or prompt_name is not None:
                raise ValueError("pass one of instruction=, prompt= or prompt_name=")
            return instruction
        return self.st.resolve_prompt(prompt, prompt_name)

    def _warn_truncated(self, stats: EncodeStats) -> None:
        """Log one warning naming the texts cut to ``max_length`` (up to 10 listed)."""
        if not stats.truncated:
            return
        cut = sorted(set(stats.truncated))
        named = ", ".join(f"text {i} ({n:,} tokens, {n - self.max_length:,} dropped)"
                          for i, n in cut[:10])
        more = f" and {len(cut) - 10} more" if len(cut) > 10 else ""
        logger.warning(
            "truncated %d of %d texts to max_length=%d tokens: %s%s (pass overflow='window' "
            "to embed them whole)", len(cut), stats.n_texts, self.max_length, named, more,
            extra={TRUNCATION_MARK: True})

    def _encode_texts(
        self,
        texts: Sequence[str],
        *,
        instruction: str | None = None,
        batch_size: int | None = None,
        max_tokens_per_batch: int | None = None,
        show_progress_bar: bool = False,
        normalize: bool = False,
        progress: Callable[[int], object] | None = None,
        pipeline: bool | None = None,
        prepare_window: int | Literal["auto"] | None = None,
        progress_idx: Callable[[list[int]], object] | None = None,
    ) -> np.ndarray:
        """Embed texts of at most ``max_length`` tokens each (longer ones are truncated and
        recorded in :attr:`EncodeStats.truncated`).

        Batches are sorted by length (fewest padded tokens) and the output is restored to
        input order. With the pipeline on, a background thread prepares batch n+1 (its
        tensors, pinned and copied to the GPU on CUDA; with ``prepare_window`` also the
        tokenization, segmentation and layout of the next window of texts) while batch n
        runs the forward pass; the batches, their order and the vectors are the same as
        without it, and an error in the thread is raised here.

        Args:
            texts: Texts to embed.
            instruction: Instruction put before the text (queries: the task instruction;
                documents: usually ``None``).
            batch_size: Maximum texts per batch (default: the encoder's).
            max_tokens_per_batch: Maximum padded tokens per batch (default: the encoder's).
            show_progress_bar: Show a tqdm bar over texts.
            normalize: L2-normalize the embeddings.
            progress: Called after each batch with the number of texts it embedded (e.g. an
                outer ``tqdm``'s ``update``), so a caller's bar moves per batch.
            pipeline: Prepare the next batch in a background thread (default: the
                encoder's ``pipeline``).
            prepare_window: Lay out and batch the texts in windows of this many
                consecutive texts, or ``"auto"`` (:func:`auto_windows`: about four batches'
                worth each) (default: the encoder's, ``None``: all texts at once).
                Windows let preparation overlap the forward pass from the second window
                on; batches are then length-sorted within each window, so for more texts
                than one window they differ from the default batches (the vectors agree up
                to floating-point rounding of the different batch shapes).

        With the encoder's ``prepare_workers`` above 0 (and more than one text), texts are
        laid out in that many worker processes (:class:`PreparePool`, started on the first
        such call) while this process runs the forward passes (:meth:`_pooled_batches`);
        ``prepare_window`` is then not used. Batches are cut from windows in order of
        length, so they can differ slightly from the default batches (the vectors agree
        up to rounding, as with ``prepare_window``).

        Returns:
            ``[n, hidden]`` float32 array (``[0, hidden]`` for no texts).

        Raises:
            ValueError: if a text is empty, whitespace-only or not a string (names its index),
                or ``prepare_window < 1``.
        """
        t0 = time.perf_counter()
        hidden_size = self.model.config.hidden_size
        if len(texts) == 0:
            self.last_stats = EncodeStats()
            return np.zeros((0, hidden_size), dtype=np.float32)
        for i, t in enumerate(texts):  # fail before any thread starts
            if not isinstance(t, str):
                raise ValueError(f"text at index {i} is {type(t).__name__}, not str")
            if not t.strip():
                raise ValueError(f"text at index {i} is empty or whitespace-only")
        pipeline = self.pipeline if pipeline is None else pipeline
        window = _check_window(self.prepare_window if prepare_window is None
                               else prepare_window)
        n = len(texts)
        if window == "auto":
            windows = auto_windows(texts, max_tokens_per_batch or self.max_tokens_per_batch,
                                   self.max_length)
        else:
            step = n if window is None else window
            windows = [(a, min(a + step, n)) for a in range(0, n, step)]
        stats = EncodeStats(n_texts=n, pipelined=bool(pipeline))
        pool = self._workers() if n > 1 else None
        batch_kw: dict[str, Any] = dict(
            instruction=instruction, batch_size=batch_size or self.batch_size,
            max_tokens=max_tokens_per_batch or self.max_tokens_per_batch, stats=stats,
            origin=t0)
        source = (self._pooled_batches(pool, texts, **batch_kw) if pool is not None
                  else self._prepared_batches(texts, windows, **batch_kw))
        out = np.zeros((n, hidden_size), dtype=np.float32)
        from tqdm.auto import tqdm

        batches: Iterator[tuple[list[int], BatchInputs]] = (
            Prefetcher(source, depth=1) if pipeline else source)
        # On CUDA a batch's vectors come back through a pinned buffer and an event, and the
        # loop waits for batch n only after queueing batch n+1: the device never idles
        # while the host reads results back (no per-batch synchronisation).
        pending: collections.deque[tuple[list[int], torch.Tensor, Any, float, int]] = (
            collections.deque())

        def drain(keep: int) -> None:
            while len(pending) > keep:
                idx, host, event, start, width = pending.popleft()
                tw = time.perf_counter()
                if event is not None:
                    event.synchronize()
                out[idx] = host.numpy()
                done = time.perf_counter()
                stats.forward_seconds += done - tw
                stats.timeline.append((start - t0, done - t0))
                stats.padded_tokens += len(idx) * width
                stats.batches.append((len(idx), width))
                bar.update(len(idx))
                if progress is not None:
                    progress(len(idx))
                if progress_idx is not None:
                    progress_idx(idx)

        try:
            with tqdm(total=n, disable=not show_progress_bar, desc="encode",
                      unit="text") as bar, self._lock:
                while True:
                    tw = time.perf_counter()
                    item = next(batches, None)
                    stats.wait_seconds += time.perf_counter() - tw
                    if item is None:
                        break
                    idx, inputs = item
                    t1 = time.perf_counter()
                    pooled_before = stats.pool_seconds
                    with torch.profiler.record_function("htp.forward"):
                        vecs = self._run_batch(inputs, stats)
                    t2 = time.perf_counter()
                    with torch.profiler.record_function("htp.pool"):
                        if normalize:
                            vecs = torch.nn.functional.normalize(vecs, dim=-1)
                        event = None
                        if vecs.device.type == "cuda":
                            host = torch.empty(vecs.shape, dtype=vecs.dtype, pin_memory=True)
                            host.copy_(vecs, non_blocking=True)
                            event = torch.cuda.Event()
                            event.record()
                        else:
                            host = vecs.cpu()
                    stats.forward_seconds += t2 - t1 - (stats.pool_seconds - pooled_before)
                    stats.pool_seconds += time.perf_counter() - t2
                    pending.append((idx, host, event, t1, inputs.width))
                    drain(keep=1 if event is not None else 0)
                drain(keep=0)
        finally:
            if isinstance(batches, Prefetcher):
                batches.close()
        stats.total_seconds = time.perf_counter() - t0
        self.last_stats = stats
        return out

    def encode_late_chunks(
        self,
        documents: Sequence[str],
        chunks: Sequence[Sequence[Chunk]],
        *,
        instruction: str | None = None,
        window_tokens: int | None = None,
        batch_size: int | None = None,
        max_tokens_per_batch: int | None = None,
        show_progress_bar: bool = False,
        normalize: bool = False,
        progress: Callable[[int], object] | None = None,
        centering: Centering | None = None,
    ) -> list[np.ndarray]:
        """Contextual chunk embeddings ("late chunking", Günther et al. 2024, arXiv 2409.04701).

        Each document runs through the model once per window of whole chunks
        (:func:`~htp_retrieval.long_text.late_windows`, at most ``window_tokens`` text
        tokens), and each chunk's vector is the mean of its own text tokens' early-exit
        states, so a chunk is embedded with the text before it in its window. For HTP and
        the other placeholder methods every chunk is one block (a ``<PST>``/``<B-PST>``
        pair, :func:`~htp_retrieval.long_text.block_starts_for_chunks`), so no block
        straddles a chunk and every chunk's tokens see the ``<B-PST>`` summaries of the
        whole window.

        Args:
            documents: ``[n_docs]`` texts.
            chunks: ``[n_docs][n_chunks]`` chunks of each document
                (:func:`~htp_retrieval.chunking.split_chunks`), spans into that document.
            instruction: Instruction put before each window (documents: usually ``None``).
            window_tokens: Text tokens per forward pass (default and maximum:
                ``max_length``).
            batch_size: Maximum windows per batch (default: the encoder's).
            max_tokens_per_batch: Maximum padded tokens per batch (default: the encoder's).
            show_progress_bar: Show a tqdm bar over documents.
            normalize: L2-normalize the chunk vectors.
            progress: Called with the number of documents finished, as they finish.
            centering: A :class:`~htp_retrieval.centering.Centering` fitted with this
                encoder's config: chunk vectors come back centred on its document mean and
                L2-normalised.

        Returns:
            ``[n_docs]`` float32 arrays ``[n_chunks, hidden]``, chunks in input order.

        Raises:
            ValueError: for a method without mean pooling (last-token pooling has no
                per-chunk readout), a document with no chunks or an empty/non-string
                document (names its index), a chunk span outside its document,
                ``window_tokens`` above ``max_length``, or a centring fitted with another
                config or model.
        """
        from tqdm.auto import tqdm

        if centering is not None:
            centering.check_config(self.config, model=self.model_name)

        if self.spec.pooling != "mean":
            raise ValueError(f"late chunking needs a mean-pooled method; {self.spec.name!r} "
                             "uses last-token pooling (try vanilla-mean, tp-mean or htp)")
        window_tokens = window_tokens or self.max_length
        if not 16 <= window_tokens <= self.max_length:
            raise ValueError(f"window_tokens must be in [16, max_length={self.max_length}], "
                             f"got {window_tokens}")
        if len(chunks) != len(documents):
            raise ValueError(f"got {len(documents)} documents but {len(chunks)} chunk lists")
        for i, (doc, ch) in enumerate(zip(documents, chunks)):
            if not isinstance(doc, str) or not doc.strip():
                raise ValueError(f"document at index {i} is empty or not a string")
            if not ch:
                raise ValueError(f"document at index {i} has no chunks")
            bad = [c for c in ch if not 0 <= c.start < c.end <= len(doc)]
            if bad:
                raise ValueError(f"document at index {i}: chunk {bad[0].index} span "
                                 f"[{bad[0].start}, {bad[0].end}) is outside its "
                                 f"{len(doc)} characters")
        stats = EncodeStats(n_texts=len(documents))
        t0 = time.perf_counter()
        hidden_size = self.hidden_size
        out = [np.zeros((len(ch), hidden_size), dtype=np.float32) for ch in chunks]
        # windows of whole chunks, per document
        items: list[tuple[int, tuple[int, ...], str, list[Chunk]]] = []
        _, offs = self._tokenize(list(documents))
        for i, (doc, ch, off) in enumerate(zip(documents, chunks, offs)):
            for w in late_windows(_offsets_array(off), ch, window_tokens):
                rel = [Chunk(j, ch[j].start - w.start, ch[j].end - w.start) for j in w.chunks]
                items.append((i, w.chunks, doc[w.start : w.end], rel))
        left = np.bincount([it[0] for it in items], minlength=len(documents)).tolist()
        bs = batch_size or self.batch_size
        group = max(bs * 4, 64)  # windows laid out at a time (bounds host memory)
        with tqdm(total=len(documents), disable=not show_progress_bar, desc="late chunks",
                  unit="doc") as bar, self._lock:
            for g in range(0, len(items), group):
                part = items[g : g + group]
                ranges: list[list[tuple[int, int]]] = []
                n_cut = len(stats.truncated)
                layouts = self.build_layouts_for_chunks([it[2] for it in part],
                                                        [it[3] for it in part],
                                                        instruction=instruction, stats=stats,
                                                        ranges_out=ranges)
                stats.truncated[n_cut:] = [(part[j][0], n) for j, n in stats.truncated[n_cut:]]
                stats.text_tokens += sum(lay.n_text_tokens for lay in layouts)
                stats.input_tokens += sum(len(lay) for lay in layouts)
                lengths = [len(lay) for lay in layouts]
                mt = max(max_tokens_per_batch or self.max_tokens_per_batch, max(lengths))
                for idx in self._batches(lengths, bs, mt):
                    batch = self._batch_inputs([layouts[j] for j in idx])
                    t1 = time.perf_counter()
                    hidden = self._hidden_states(batch, stats)
                    stats.forward_seconds += time.perf_counter() - t1
                    stats.padded_tokens += len(idx) * batch.width
                    stats.batches.append((len(idx), batch.width))
                    for r, j in enumerate(idx):
                        lay = layouts[j]
                        off = batch.width - len(lay) if self.padding_side == "left" else 0
                        pos = np.asarray(lay.pool_positions, dtype=np.int64) + off
                        if len(pos) != lay.n_text_tokens:  # pragma: no cover - layout bug
                            raise RuntimeError("late chunking: pooled positions are not the "
                                               "text tokens")
                        doc_i, chunk_ids = part[j][0], part[j][1]
                        rows = torch.from_numpy(pos).to(hidden.device)
                        states = hidden[r].index_select(0, rows).float()
                        means = torch.stack([states[a:b].mean(0) for a, b in ranges[j]])
                        out[doc_i][list(chunk_ids)] = means.cpu().numpy()  # one copy per row
                        left[doc_i] -= 1
                        if left[doc_i] == 0:
                            bar.update(1)
                            if progress is not None:
                                progress(1)
        if centering is not None:
            out = [centering.apply(arr, "document") for arr in out]
        elif normalize:
            for arr in out:
                arr /= np.maximum(np.linalg.norm(arr, axis=1, keepdims=True), 1e-12)
        stats.n_windows = len(items)
        stats.total_seconds = time.perf_counter() - t0
        self.last_stats = stats
        self._warn_truncated(stats)
        return out

    def build_layouts_for_chunks(
        self,
        texts: Sequence[str],
        chunks: Sequence[Sequence[Chunk]],
        *,
        instruction: str | None = None,
        stats: EncodeStats | None = None,
        ranges_out: list[list[tuple[int, int]]] | None = None,
    ) -> list[Layout]:
        """Layouts for late chunking: one block per chunk (placeholder methods).

        Args:
            texts: ``[n]`` window texts.
            chunks: ``[n][n_chunks]`` chunks with spans relative to each text.
            instruction: Instruction put before the text.
            stats: Cost counters to add to (see :meth:`build_layouts`).
            ranges_out: If given, each text's chunk token ranges ``[(first, last)]`` are
                appended (text-token indices, :func:`~htp_retrieval.chunking.chunk_token_ranges`).

        Returns:
            ``[n]`` layouts.
        """
        with _gc_paused():
            return self._build_layouts(texts, instruction=instruction, stats=stats,
                                       chunks=chunks, ranges_out=ranges_out)

    @property
    def hidden_size(self) -> int:
        """Embedding dimension."""
        return int(self.model.config.hidden_size)

    def record(self) -> dict[str, Any]:
        """Every setting that defines the embeddings, flat (:meth:`HTPConfig.flat
        <htp_retrieval.config.HTPConfig.flat>`, budgets as lists), with the model, its
        depth, the exit layer, the resolved dtype and the padding side: the ``config``
        record of a results JSON and the key of embedding caches."""
        s = self.spec
        return {
            **self._config.flat(),
            "model": self.model_name,
            "method": s.name,
            "k": s.sentences_per_block,
            "tokens_per_block": s.tokens_per_block,
            "exit_layer": self.exit_layer,
            "n_layers": self.n_layers,
            "dtype": str(self.model.dtype).replace("torch.", ""),
            "padding_side": self.padding_side,
            # sentence-transformers models: the model's own readout
            **({} if self.st is None else {"st_pooling": self.st.pooling,
                                           "st_normalize": self.st.normalize}),
        }


__all__ = ["HTPEncoder", "resolve_config", "EncodeStats", "PST", "BPST", "base_model",
           "truncation_warnings_off"]
