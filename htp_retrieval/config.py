"""``HTPConfig``: every setting that defines an embedding, resolved once per model.

A config is frozen and fully explicit: :meth:`HTPConfig.for_model` resolves the method
(:mod:`htp_retrieval.methods`), the model family's layer preset
(:data:`htp_retrieval.models.LAYER_PRESETS`), an optional calibration preset and the
caller's overrides into one object, and nothing downstream inherits a value. In a resolved
config ``None`` means "none" (no block budget of that kind), never "inherit".

Example:
    >>> from htp_retrieval.config import HTPConfig, LayerRange
    >>> cfg = HTPConfig(method="htp", max_length=512, layers=LayerRange(1, 15, -2))
    >>> HTPConfig.from_json(cfg.to_json()) == cfg
    True
    >>> cfg.replace(k=2).blocks.k
    2

Which values the defaults have, and how they were measured: docs/METHODS.md (presets and
block budgets) and research/ANALYSIS.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from htp_retrieval.layout import LongBudget, adaptive_k, as_long_budget
from htp_retrieval.long_text import OVERFLOWS, Overflow, default_max_length
from htp_retrieval.methods import MethodSpec, TokensPerBlock, get_method
from htp_retrieval.models import (
    default_long_budget,
    default_short_budget,
    layer_preset,
    resolve_exit_layer,
)

Summary = Literal["last", "mean"]
"""What each ``<PST>`` receives: the block's last-token state (the paper, Sec. 4.2) or the
mean of the block's token states."""
SEGMENTERS = ("spacy", "sentencizer", "pysbd", "regex")
"""Sentence segmenter names (:func:`htp_retrieval.segmentation.get_segmenter`)."""

LAYER_KEYS = ("tp_start", "tp_exit", "output_layer")
"""Flat names of :class:`LayerRange`'s fields."""
BLOCK_KEYS = ("k", "tokens_per_block", "max_blocks", "min_block_tokens", "long_budget",
              "short_budget")
"""Flat names of :class:`BlockPolicy`'s fields."""
TOP_KEYS = ("method", "max_length", "overflow", "summary", "segmenter", "placeholder_init",
            "keep_sink", "bare_prefix", "preset")
"""Flat names of :class:`HTPConfig`'s own fields."""
SETTING_KEYS = TOP_KEYS + LAYER_KEYS + BLOCK_KEYS
"""Every setting by its flat name: what :meth:`HTPConfig.replace`, :meth:`HTPConfig.for_model`
and ``HTPEncoder(model, **settings)`` accept."""
PRESET_KEYS = ("tp_start", "tp_exit", "output_layer", "summary", "max_blocks",
               "min_block_tokens", "long_budget", "short_budget", "k", "bare_prefix")
"""The settings a calibration preset (a partial config, ``htp-retrieval calibrate``) may set."""


def _check_int(name: str, value: object, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


@dataclass(frozen=True)
class LayerRange:
    """Which decoder layers receive copies, and where to exit (paper Sec. 4.2-4.4).

    Attributes:
        tp_start: First layer (0-based) whose input receives the copies.
        tp_exit: Copies stop before this layer (exclusive); ``tp_exit == tp_start``: none.
        output_layer: Early exit as ``hidden_states[output_layer]``: negative counts from
            the top (-1: last layer, -2: second-to-last), positive is the layers run.

    Raises:
        ValueError: if ``0 <= tp_start <= tp_exit`` does not hold or ``output_layer`` is 0.
    """

    tp_start: int
    tp_exit: int
    output_layer: int

    def __post_init__(self) -> None:
        for name in LAYER_KEYS:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"{name} must be an integer, got {v!r}")
        if not 0 <= self.tp_start <= self.tp_exit:
            raise ValueError(f"need 0 <= tp_start <= tp_exit, got tp_start={self.tp_start}, "
                             f"tp_exit={self.tp_exit}")
        if self.output_layer == 0:
            raise ValueError("output_layer 0 runs no layer: use -1 (last) or a count >= 1")

    def exit_layer(self, n_layers: int) -> int:
        """L', the decoder layers run on a model of ``n_layers`` layers.

        Raises:
            ValueError: if it falls outside 1..n_layers, or ``tp_exit > n_layers``.
        """
        if self.tp_exit > n_layers:
            raise ValueError(f"need 0 <= tp_start <= tp_exit <= {n_layers}, got "
                             f"tp_start={self.tp_start}, tp_exit={self.tp_exit}")
        return resolve_exit_layer(self.output_layer, n_layers)


@dataclass(frozen=True)
class BlockPolicy:
    """How a document is cut into blocks: K and the block budget, in one place (Sec. 4.1).

    The number of blocks of a document is :meth:`k_for`'s K applied to its sentences:
    K starts at ``k`` and grows so that the document gets at most ``max_blocks`` blocks,
    at most one per ``min_block_tokens`` text tokens, at most ``long_budget[1]`` past
    ``long_budget[0]`` text tokens and at most ``short_budget[1]`` up to ``short_budget[0]``
    (:func:`htp_retrieval.layout.adaptive_k`). ``None`` disables a bound.

    Attributes:
        k: Minimum sentences per block, K >= 1.
        tokens_per_block: N for methods with fixed-token blocks (``htp-fixed-tokens``), or
            ``"auto"`` (per document, text tokens // sentence blocks); other methods ignore it.
        max_blocks: Blocks per document at most, or ``None``.
        min_block_tokens: Density cap T: at most one block per T text tokens, or ``None``.
        long_budget: ``(L, B_L)``: past L text tokens at most B_L blocks, or ``None``.
        short_budget: ``(S, B_S)``: up to S text tokens at most B_S blocks, or ``None``.

    Raises:
        ValueError: for a value below 1 or a budget that is not two integers >= 1.
    """

    k: int = 1
    tokens_per_block: TokensPerBlock = 32
    max_blocks: int | None = None
    min_block_tokens: int | None = None
    long_budget: LongBudget | None = None
    short_budget: LongBudget | None = None

    def __post_init__(self) -> None:
        _check_int("k (sentences per block)", self.k, 1)
        if self.tokens_per_block != "auto":
            _check_int("tokens_per_block", self.tokens_per_block, 1)
        for name in ("max_blocks", "min_block_tokens"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), 1)
        for name in ("long_budget", "short_budget"):
            v = getattr(self, name)
            if v is not None:
                checked = as_long_budget(v, name=name)
                if checked is None:
                    raise ValueError(f"{name} must be (L, B_L) or None, got {v!r}")
                object.__setattr__(self, name, checked)

    def k_for(self, n_sentences: int, n_tokens: int) -> int:
        """K for one document of ``n_sentences`` sentences and ``n_tokens`` text tokens."""
        return adaptive_k(n_sentences, self.k, self.max_blocks, n_tokens=n_tokens,
                          min_block_tokens=self.min_block_tokens,
                          long_budget=self.long_budget, short_budget=self.short_budget)


@dataclass(frozen=True)
class HTPConfig:
    """Every setting that defines an embedding (HTP, Ding et al., ACL 2026, Sec. 4).

    Build one with :meth:`for_model` (the method's and the model family's defaults filled
    in), or write every field yourself. Saved with every result (:meth:`to_dict`); equal
    configs on equal weights give equal vectors.

    Attributes:
        method: Canonical method name (:data:`htp_retrieval.methods.METHODS`; an alias is
            normalised).
        max_length: Text tokens per forward pass (placeholders and templates come on top).
        layers: Copy window and early exit (:class:`LayerRange`).
        blocks: K and the block budget (:class:`BlockPolicy`).
        summary: What ``<PST>_m`` receives (:data:`Summary`).
        overflow: What a text longer than ``max_length`` gets
            (:data:`~htp_retrieval.long_text.Overflow`): ``window`` (embedded whole in
            overlapping windows), ``truncate`` (cut, with a warning naming it) or ``error``.
        segmenter: Sentence splitter (:data:`SEGMENTERS`).
        placeholder_init: Input embedding of ``<PST>``/``<B-PST>``: ``mean`` (mean of the
            embedding matrix), ``zeros``, ``bos`` or ``token:<text>``.
        keep_sink: Keep the sink token at position 0 (``False`` only for the sink ablation:
            copies then overwrite the attention sink).
        bare_prefix: Text after the sink when there is no instruction (documents), e.g.
            ``"Text:"``; ``""``: none.
        preset: The calibration preset file the settings came from (provenance), or ``None``.

    Raises:
        ValueError: on construction, for any invalid value (the message names it).
    """

    method: str
    max_length: int
    layers: LayerRange
    blocks: BlockPolicy = field(default_factory=BlockPolicy)
    summary: Summary = "last"
    overflow: Overflow = "window"
    segmenter: str = "sentencizer"
    placeholder_init: str = "mean"
    keep_sink: bool = True
    bare_prefix: str = ""
    preset: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", get_method(self.method).name)
        _check_int("max_length", self.max_length, 1)
        if not isinstance(self.layers, LayerRange):
            raise ValueError(f"layers must be a LayerRange, got {self.layers!r}")
        if not isinstance(self.blocks, BlockPolicy):
            raise ValueError(f"blocks must be a BlockPolicy, got {self.blocks!r}")
        if self.summary not in ("last", "mean"):
            raise ValueError(f"summary must be 'last' or 'mean', got {self.summary!r}")
        if self.overflow not in OVERFLOWS:
            raise ValueError(f"overflow must be one of {OVERFLOWS}, got {self.overflow!r}")
        if self.segmenter not in SEGMENTERS:
            raise ValueError(f"segmenter must be one of {SEGMENTERS}, got {self.segmenter!r}")
        init = self.placeholder_init
        if not isinstance(init, str) or not (init in ("mean", "zeros", "bos")
                                             or (init.startswith("token:") and len(init) > 6)):
            raise ValueError("placeholder_init must be 'mean', 'zeros', 'bos' or "
                             f"'token:<text>', got {init!r}")
        if not isinstance(self.keep_sink, bool):
            raise ValueError(f"keep_sink must be True or False, got {self.keep_sink!r}")
        if not isinstance(self.bare_prefix, str):
            raise ValueError(f"bare_prefix must be a string, got {self.bare_prefix!r}")

    # ------------------------------------------------------------------ views
    @property
    def spec(self) -> MethodSpec:
        """The method's :class:`~htp_retrieval.methods.MethodSpec` with this K and N."""
        return get_method(self.method).with_options(
            k=self.blocks.k, tokens_per_block=self.blocks.tokens_per_block)

    def flat(self) -> dict[str, Any]:
        """Every setting by its flat name (:data:`SETTING_KEYS`); budgets as lists."""
        out = {k: getattr(self, k) for k in TOP_KEYS}
        out.update(dataclasses.asdict(self.layers))
        out.update({k: list(v) if isinstance(v, tuple) else v
                    for k, v in dataclasses.asdict(self.blocks).items()})
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready nested form: top-level fields, ``layers`` and ``blocks`` objects."""
        out: dict[str, Any] = {k: getattr(self, k) for k in TOP_KEYS}
        out["layers"] = dataclasses.asdict(self.layers)
        out["blocks"] = {k: list(v) if isinstance(v, tuple) else v
                         for k, v in dataclasses.asdict(self.blocks).items()}
        return out

    def to_json(self, **kwargs: Any) -> str:
        """:meth:`to_dict` as JSON (keys sorted)."""
        return json.dumps(self.to_dict(), sort_keys=True, **kwargs)

    def digest(self, length: int = 8) -> str:
        """A short hex hash of :meth:`to_json` (names result files and caches)."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:length]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HTPConfig:
        """Inverse of :meth:`to_dict`; a flat dict of :data:`SETTING_KEYS` is read as well.

        Raises:
            ValueError: on an unknown key, a missing required one or an invalid value.
        """
        d = dict(data)
        layers = d.pop("layers", None)
        blocks = d.pop("blocks", None)
        check_settings(d, where="config")
        flat_layers = {k: d.pop(k) for k in LAYER_KEYS if k in d}
        flat_blocks = {k: d.pop(k) for k in BLOCK_KEYS if k in d}
        layers = {**(layers or {}), **flat_layers}
        blocks = {**(blocks or {}), **flat_blocks}
        check_settings(layers, where="layers", valid=LAYER_KEYS)
        check_settings(blocks, where="blocks", valid=BLOCK_KEYS)
        missing = [k for k in ("method", "max_length") if k not in d] + [
            k for k in LAYER_KEYS if k not in layers]
        if missing:
            raise ValueError(f"config is missing {missing}")
        return cls(layers=LayerRange(**layers), blocks=BlockPolicy(**_budgets(blocks)), **d)

    @classmethod
    def from_json(cls, text: str) -> HTPConfig:
        """Inverse of :meth:`to_json`."""
        return cls.from_dict(json.loads(text))

    def replace(self, **settings: Any) -> HTPConfig:
        """A copy with settings changed by flat name (``k=2``, ``tp_start=3``, ...).

        ``0`` or ``None`` for ``max_blocks``, ``min_block_tokens``, ``long_budget`` or
        ``short_budget`` turns that bound off.

        Raises:
            ValueError: on an unknown name or an invalid value.
        """
        check_settings(settings, where="replace()")
        top = {k: v for k, v in settings.items() if k in TOP_KEYS}
        lay = {k: v for k, v in settings.items() if k in LAYER_KEYS}
        blk = _budgets({k: v for k, v in settings.items() if k in BLOCK_KEYS})
        return dataclasses.replace(
            self, **top,
            layers=dataclasses.replace(self.layers, **lay) if lay else self.layers,
            blocks=dataclasses.replace(self.blocks, **blk) if blk else self.blocks)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> HTPConfig:
        """The config of a flat settings record (:meth:`HTPEncoder.record
        <htp_retrieval.HTPEncoder.record>`, the ``config`` object of a results JSON).

        A record leaves out settings at their historical defaults; they are read as those
        values: ``summary`` ``last``, ``keep_sink`` ``True``, no block budgets, no
        ``bare_prefix``, no ``preset``, ``overflow`` ``truncate``. Keys that are not
        settings (``model``, ``dtype``, ``n_layers``, instructions, ...) are ignored.

        Raises:
            ValueError: if the record has no ``method``, ``max_length`` or layers, or an
                invalid value.
        """
        flat = {k: record[k] for k in SETTING_KEYS if k in record}
        flat.setdefault("overflow", "truncate")
        if flat.get("bare_prefix") is None:
            flat["bare_prefix"] = ""
        return cls.from_dict(flat)

    # ------------------------------------------------------------------ resolution
    @classmethod
    def for_model(
        cls,
        model_config: Any,
        method: str | MethodSpec = "htp",
        *,
        preset: str | Path | Mapping[str, Any] | None = None,
        n_layers: int | None = None,
        st_max_length: int | None = None,
        st_output_layer: int | None = None,
        **settings: Any,
    ) -> HTPConfig:
        """Resolve the defaults of ``method`` on a model into a fully explicit config.

        Order, first given wins: ``settings`` (``None`` = not given), the calibration
        ``preset``, the model family's :class:`~htp_retrieval.models.LayerPreset`, the
        method's :class:`~htp_retrieval.methods.MethodSpec`. Token Prepending takes only a
        preset's layers, and methods without placeholders (vanilla, Echo, PromptEOL) only
        its ``output_layer``, so all stay comparable at the same exit layer. A preset file
        calibrated on a model of another depth has its layers scaled (:func:`scale_layers`).

        Args:
            model_config: The model's Hugging Face config (``model.config``: its
                ``model_type``, ``num_hidden_layers``, ``max_position_embeddings``), a
                loaded model, or a model reference as :func:`~htp_retrieval.load_model`
                takes it (packaged name, ``.gguf``, directory; only its config is read).
            method: Method name, alias or spec.
            preset: A calibration preset: ``htp-retrieval calibrate`` JSON path, or a dict
                of :data:`PRESET_KEYS` (a partial config).
            n_layers: Decoder layers (default: ``num_hidden_layers``).
            st_max_length: A sentence-transformers folder's text budget in tokens (its
                ``max_seq_length`` less its own special tokens): the default ``max_length``.
            st_output_layer: A sentence-transformers folder's readout layer (``-1``): the
                default ``output_layer``, ahead of any preset.
            **settings: Overrides by flat name (:data:`SETTING_KEYS`).

        Raises:
            ValueError: for an unknown setting or method, an invalid value, a preset that is
                not one, or a layer window outside the model.
        """
        if isinstance(model_config, (str, Path)):
            from transformers import AutoConfig

            from htp_retrieval.models import resolve_model_path

            model_config = AutoConfig.from_pretrained(resolve_model_path(str(model_config))[0])
        cfg = getattr(model_config, "config", model_config)
        if n_layers is None:
            n_layers = int(cfg.num_hidden_layers)
        model_type = getattr(cfg, "model_type", None)
        given = {k: v for k, v in settings.items() if v is not None}
        if isinstance(method, MethodSpec):
            spec = method
        else:
            spec = get_method(given.pop("method", method))
        check_settings(given, where="settings")
        pre, pre_name = _preset_settings(preset, spec, n_layers)

        def pick(key: str, default: Any) -> Any:
            if key in given:
                return given[key]
            return pre[key] if key in pre else default

        family = layer_preset(model_type or "")
        summary = given.get("summary") or pre.get("summary") or spec.summary
        blocks = BlockPolicy(**_budgets({
            "k": pick("k", spec.sentences_per_block),
            "tokens_per_block": given.get("tokens_per_block", spec.tokens_per_block),
            "max_blocks": pick("max_blocks", spec.max_blocks),
            "min_block_tokens": pick("min_block_tokens", spec.min_block_tokens),
            "long_budget": pick("long_budget",
                                default_long_budget(spec.long_budget, model_type)),
            "short_budget": pick("short_budget", default_short_budget(spec, model_type)),
        }))
        out_layer = given.get("output_layer", st_output_layer)
        layers = LayerRange(
            pick("tp_start", family.tp_start_for(spec)),
            pick("tp_exit", min(family.tp_exit, n_layers)),
            out_layer if out_layer is not None else pick("output_layer", family.output_layer))
        layers.exit_layer(n_layers)  # checks the window against this model
        max_length = given.get("max_length", st_max_length)
        if max_length is None:
            max_length = default_max_length(getattr(cfg, "max_position_embeddings", None))
        return cls(
            method=spec.name, max_length=max_length, layers=layers, blocks=blocks,
            summary=summary, overflow=given.get("overflow", "window"),
            segmenter=given.get("segmenter", "sentencizer"),
            placeholder_init=given.get("placeholder_init", "mean"),
            keep_sink=given.get("keep_sink", True),
            bare_prefix=given.get("bare_prefix", pre.get("bare_prefix") or ""),
            preset=given.get("preset", pre_name))


def _budgets(blocks: dict[str, Any]) -> dict[str, Any]:
    """``0`` turns a bound off (``None``); budgets given as lists become tuples."""
    out = dict(blocks)
    for key in ("max_blocks", "min_block_tokens"):
        if key in out and out[key] == 0:
            out[key] = None
    for key in ("long_budget", "short_budget"):
        if key in out:
            out[key] = as_long_budget(out[key], name=key)
    return out


def check_settings(settings: Mapping[str, Any], *, where: str,
                   valid: tuple[str, ...] = SETTING_KEYS) -> None:
    """Refuse unknown setting names.

    Raises:
        ValueError: naming the unknown keys, ``where`` they were given, and the valid ones.
    """
    bad = sorted(set(settings) - set(valid))
    if bad:
        raise ValueError(f"unknown {where} keys {bad}; valid: {', '.join(valid)}")


def _preset_settings(preset: str | Path | Mapping[str, Any] | None, spec: MethodSpec,
                     n_layers: int) -> tuple[dict[str, Any], str | None]:
    """A calibration preset's settings for ``spec`` on a model of ``n_layers`` layers."""
    if preset is None:
        return {}, None
    name: str | None = None
    if isinstance(preset, Mapping):
        pre = dict(preset)
        check_settings(pre, where="preset", valid=PRESET_KEYS)
    else:
        pre, depth = read_preset(preset)
        name = str(preset)
        if depth is not None:
            pre = scale_layers(pre, depth, n_layers)
    # ``None`` in a preset: a budget is off; any other setting is not given
    pre = {k: v for k, v in pre.items() if v is not None or k in BLOCK_KEYS[2:]}
    if spec.placeholders not in ("local", "hierarchical"):
        keep = LAYER_KEYS if spec.placeholders == "tp" else ("output_layer",)
        pre = {k: v for k, v in pre.items() if k in keep}
    return pre, name


def read_config_file(path: str | Path) -> HTPConfig:
    """Read a saved :class:`~htp_retrieval.config.HTPConfig` from a JSON file.

    Args:
        path: A JSON file holding a config (:meth:`~htp_retrieval.config.HTPConfig.to_json`,
            nested or flat keys), or a results JSON holding one under ``"htp_config"`` (at
            the top level or inside its ``"config"`` record).

    Returns:
        The config, used as is.

    Raises:
        FileNotFoundError: if the file does not exist.
        ValueError: if it is not JSON or holds no valid config (the message names the file).
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"config file not found: {p} (give a JSON file written from "
                                "encoder.config.to_json(), or a results JSON)")
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"config file {p} is not JSON ({e}): give a file written from "
                         "encoder.config.to_json(), or a results JSON") from None
    data: Any = raw
    if isinstance(raw, dict) and "htp_config" in raw:
        data = raw["htp_config"]
    elif isinstance(raw, dict) and isinstance(raw.get("config"), dict) and (
            "htp_config" in raw["config"]):
        data = raw["config"]["htp_config"]
    if not isinstance(data, dict) or "method" not in data:
        raise ValueError(f"config file {p} holds no HTPConfig: expected a JSON object with "
                         "method, max_length, layers, ... (encoder.config.to_json()) or a "
                         "results JSON with an 'htp_config' key")
    try:
        return HTPConfig.from_dict(data)
    except (ValueError, TypeError) as e:
        raise ValueError(f"config file {p} holds an invalid HTPConfig: {e}") from None


def read_preset(path: str | Path) -> tuple[dict[str, Any], int | None]:
    """The settings of a calibration preset JSON and the depth they were chosen on.

    Args:
        path: A file written by ``htp-retrieval calibrate``, or any JSON object with a
            ``best`` object of :data:`PRESET_KEYS` (and optionally ``n_layers``).

    Returns:
        ``(settings, n_layers)``: a partial config (flat names), and the number of decoder
        layers of the model it was calibrated on (``None`` if the file does not say).

    Raises:
        FileNotFoundError: if the file is missing.
        ValueError: if it is not JSON, holds no ``best`` settings, or has unknown keys.
    """
    try:
        raw = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a calibration preset (invalid JSON: {e})") from None
    best = raw.get("best") if isinstance(raw, dict) else None
    if not isinstance(best, dict):
        raise ValueError(f"{path}: not a calibration preset (no 'best' settings)")
    bad = set(best) - set(PRESET_KEYS)
    if bad:
        raise ValueError(f"{path}: unknown preset keys {sorted(bad)}; valid: {PRESET_KEYS}")
    depth = raw.get("n_layers")
    return dict(best), depth if isinstance(depth, int) and depth > 0 else None


def scale_layers(settings: dict[str, Any], from_layers: int, to_layers: int) -> dict[str, Any]:
    """Carry layer settings to a model of another depth, keeping their fraction of depth.

    ``tp_start`` and ``tp_exit`` (and a non-negative ``output_layer``) become
    ``round(value * to_layers / from_layers)``; a non-empty copy window stays non-empty and
    within ``[0, to_layers]``. A negative ``output_layer`` counts from the top
    (``-2``: second-to-last layer) and is kept as it is, as the paper's presets are written.
    Other keys are copied unchanged. This is how a preset calibrated on one model is tried on
    another (the paper's open question on layer transfer, Sec. 7).

    Args:
        settings: A partial config (:data:`PRESET_KEYS`).
        from_layers: Decoder layers of the model the settings were chosen on.
        to_layers: Decoder layers of the target model.

    Returns:
        A new dict.

    Raises:
        ValueError: if a depth is below 1.
    """
    if from_layers < 1 or to_layers < 1:
        raise ValueError(f"depths must be >= 1, got from_layers={from_layers}, "
                         f"to_layers={to_layers}")
    out = dict(settings)
    if from_layers == to_layers:
        return out

    def scale(v: int) -> int:
        return min(to_layers, max(0, round(v * to_layers / from_layers)))

    a, b = out.get("tp_start"), out.get("tp_exit")
    if a is not None:
        out["tp_start"] = max(scale(a), 1 if a >= 1 else 0)
    if b is not None:
        out["tp_exit"] = scale(b)
        lo = out.get("tp_start") or 0
        if a is not None and b > a and out["tp_exit"] <= lo:  # keep a non-empty window
            out["tp_exit"] = min(to_layers, lo + 1)
            out["tp_start"] = min(lo, out["tp_exit"] - 1)
    o = out.get("output_layer")
    if o is not None and o >= 0:
        out["output_layer"] = scale(o)
    return out


__all__ = ["HTPConfig", "LayerRange", "BlockPolicy", "SETTING_KEYS", "PRESET_KEYS",
           "read_config_file", "read_preset", "scale_layers", "check_settings"]
