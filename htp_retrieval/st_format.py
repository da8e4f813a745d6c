"""Read a local sentence-transformers folder of a finetuned decoder embedding model.

Finetuned decoder embedders (Qwen3-Embedding, gte-Qwen2-instruct, e5-mistral) ship as
sentence-transformers folders: ``modules.json`` lists a ``Transformer`` (the decoder), a
``Pooling`` module (``1_Pooling/config.json``: last-token or mean pooling) and optionally a
``Normalize`` module; ``config_sentence_transformers.json`` holds the ``prompts`` and
``default_prompt_name``; the tokenizer may append EOS (Qwen3-Embedding's post-processor,
e5-mistral's ``add_eos_token``), which last-token pooling then reads.
:func:`read_st_folder` reads those settings into :class:`STSettings`, so
:class:`~htp_retrieval.HTPEncoder` can embed exactly as ``SentenceTransformer(folder)``
does (the model's own pooling, the last layer, its special tokens) and put HTP on top.

Supported: causal decoders with a ``Pooling`` module in ``lasttoken`` or ``mean`` mode and
an optional ``Normalize``. Refused with a one-line ``ValueError``: other pooling modes,
other modules (``Dense``, latent-attention poolers), and models with bidirectional
attention or a built-in latent-attention pooler (NV-Embed, ``model_type`` ``nvembed``).

Source: sentence-transformers 6.x ``Transformer``/``Pooling``/``Normalize`` modules and their
saved configs (the older ``pooling_mode_*`` boolean keys are read too).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

logger = logging.getLogger(__name__)

STPooling = Literal["last", "mean"]
"""The model's own readout: ``last`` (sentence-transformers ``lasttoken``) or ``mean``."""

_MODES = {"lasttoken": "last", "mean": "mean"}
_LEGACY_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
_BIDIRECTIONAL_TYPES = ("nvembed", "bidirectional", "llm2vec")


@dataclass(frozen=True)
class STSettings:
    """What a sentence-transformers folder tells about how to embed with its model.

    Attributes:
        path: The folder.
        transformer_path: Folder of the ``Transformer`` module (weights, config, tokenizer),
            usually ``path`` itself.
        pooling: The model's readout (:data:`STPooling`).
        include_prompt: Whether prompt tokens are mean-pooled (``Pooling``'s
            ``include_prompt``; sentence-transformers' default ``True``).
        normalize: Whether a ``Normalize`` module L2-normalizes the output.
        lead_ids: Special token ids the tokenizer puts before the text (e.g. BOS), ``[n]``.
        trail_ids: Special token ids the tokenizer appends (e.g. EOS), ``[n]``; with
            last-token pooling the last of them is the pooled token.
        max_seq_length: Tokens sentence-transformers truncates to (special and prompt
            tokens included), or ``None`` when not set.
        prompts: Prompt name -> prompt text, prepended verbatim to the input text.
        default_prompt_name: Prompt applied when none is given, or ``None``.
        padding_side: The tokenizer's padding side (``right`` or ``left``).
        model_type: ``config.model_type`` of the decoder.
    """

    path: str
    transformer_path: str
    pooling: STPooling
    include_prompt: bool = True
    normalize: bool = False
    lead_ids: tuple[int, ...] = ()
    trail_ids: tuple[int, ...] = ()
    max_seq_length: int | None = None
    prompts: dict[str, str] = field(default_factory=dict, compare=False)
    default_prompt_name: str | None = None
    padding_side: Literal["right", "left"] = "right"
    model_type: str = ""

    @property
    def appends_eos(self) -> bool:
        """Whether the tokenizer appends a special token (EOS) after the text."""
        return bool(self.trail_ids)

    def resolve_prompt(self, prompt: str | None = None, prompt_name: str | None = None
                       ) -> str | None:
        """The prompt text sentence-transformers would prepend for these arguments.

        ``prompt`` wins; else ``prompts[prompt_name]``; else the default prompt, if any.

        Raises:
            ValueError: if both are given, or ``prompt_name`` is not in :attr:`prompts`
                (the message lists the names).
        """
        if prompt is not None and prompt_name is not None:
            raise ValueError("pass prompt= or prompt_name=, not both")
        if prompt is not None:
            return prompt
        if prompt_name is not None:
            if prompt_name not in self.prompts:
                raise ValueError(f"prompt_name {prompt_name!r} is not among the model's prompts "
                                 f"{sorted(self.prompts)}")
            return self.prompts[prompt_name]
        if self.default_prompt_name is not None:
            return self.prompts.get(self.default_prompt_name)
        return None


def is_st_folder(model: object) -> bool:
    """Whether ``model`` is a local directory holding a ``modules.json`` (no file is parsed)."""
    return isinstance(model, (str, Path)) and (Path(model).expanduser() / "modules.json").is_file()


def read_prompts(path: str | Path) -> tuple[dict[str, str], str | None]:
    """``(prompts, default_prompt_name)`` of a sentence-transformers folder, read from its
    ``config_sentence_transformers.json`` alone (``({}, None)`` when it has none)."""
    cfg = _read_json(Path(path).expanduser() / "config_sentence_transformers.json")
    prompts = {str(k): str(v) for k, v in (cfg.get("prompts") or {}).items() if v is not None}
    return prompts, cfg.get("default_prompt_name") or None


def _class_name(module_type: str) -> str:
    return module_type.rsplit(".", 1)[-1]


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def pooling_mode(config: dict[str, Any]) -> STPooling:
    """The readout of a ``Pooling`` module config (``1_Pooling/config.json``).

    Reads ``pooling_mode`` (sentence-transformers 6) or the older ``pooling_mode_*`` flags.

    Raises:
        ValueError: for any mode but ``lasttoken`` or ``mean``, or several modes at once.
    """
    mode: Any = config.get("pooling_mode")
    if mode is None:
        mode = [name for key, name in _LEGACY_KEYS.items() if config.get(key)]
    if isinstance(mode, (list, tuple)):
        if len(mode) != 1:
            raise ValueError(f"pooling mode {list(mode)} is not supported (only one of lasttoken "
                             "or mean)")
        mode = mode[0]
    if mode not in _MODES:
        raise ValueError(f"pooling mode {mode!r} is not supported (only lasttoken or mean)")
    return _MODES[mode]  # type: ignore[return-value]


def special_ids(tokenizer: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The special ids a tokenizer adds around a text: ``(lead_ids, trail_ids)``.

    Compares ``tokenizer(t)`` with ``tokenizer(t, add_special_tokens=False)``, so it sees
    whatever adds them (a post-processor template, ``add_bos_token``/``add_eos_token``).

    Raises:
        ValueError: if the tokenizer changes the text's own tokens when adding them.
    """
    probe = "Hello world. A second sentence."
    plain = list(tokenizer(probe, add_special_tokens=False).input_ids)
    full = list(tokenizer(probe).input_ids)
    for i in range(len(full) - len(plain) + 1):
        if full[i : i + len(plain)] == plain:
            return tuple(full[:i]), tuple(full[i + len(plain):])
    raise ValueError("the tokenizer's special tokens change the text tokens; not supported")


def read_st_folder(path: str | Path, tokenizer: Any | None = None) -> STSettings:
    """Read a sentence-transformers folder's embedding settings.

    Args:
        path: Local folder with ``modules.json``.
        tokenizer: The folder's tokenizer if already loaded (else it is loaded from the
            ``Transformer`` module's folder to find its special tokens and padding side).

    Returns:
        The :class:`STSettings`.

    Raises:
        ValueError: for a folder that is not supported, in one line: no ``Transformer``
            first, no ``Pooling`` module, a module other than Transformer/Pooling/Normalize
            (e.g. ``Dense`` or a latent-attention pooler), a pooling mode other than
            ``lasttoken``/``mean``, or a decoder with bidirectional attention or a built-in
            latent-attention pooler (NV-Embed), or a Transformer that renders text through
            the chat template (``modality_config`` with ``message``, which sentence-transformers
            6 writes for a tokenizer with a chat template).
        FileNotFoundError: if ``modules.json`` is missing.
    """
    root = Path(path).expanduser()
    mfile = root / "modules.json"
    if not mfile.is_file():
        raise FileNotFoundError(f"{root}: no modules.json (not a sentence-transformers folder)")
    with open(mfile, encoding="utf-8") as f:
        modules = json.load(f)
    kinds = [_class_name(str(m.get("type", ""))) for m in modules]
    name = root.name
    if not kinds or kinds[0] != "Transformer":
        raise ValueError(f"{name}: the first module is {kinds[:1]}, not a Transformer; not "
                         "supported")
    extra = [k for k in kinds[1:] if k not in ("Pooling", "Normalize")]
    if extra:
        raise ValueError(f"{name}: module {extra[0]} is not supported (only Transformer, Pooling "
                         "and Normalize; latent-attention poolers and Dense layers are not)")
    if "Pooling" not in kinds:
        raise ValueError(f"{name}: no Pooling module; not supported")
    tr_path = root / (modules[0].get("path") or "")
    pool_cfg = _read_json(root / (modules[kinds.index("Pooling")].get("path") or "") /
                          "config.json")
    config = _read_json(tr_path / "config.json")
    model_type = str(config.get("model_type", ""))
    archs = " ".join(config.get("architectures") or [])
    if (any(t in model_type.lower() for t in _BIDIRECTIONAL_TYPES) or "NVEmbed" in archs
            or config.get("is_causal") is False or config.get("causal") is False
            or config.get("bidirectional") is True):
        raise ValueError(f"{name}: model_type {model_type!r} uses bidirectional attention or a "
                         "latent-attention pooler (e.g. NV-Embed); only causal decoders with "
                         "lasttoken or mean pooling are supported")
    bert_cfg = _read_json(tr_path / "sentence_bert_config.json") or _read_json(
        root / "sentence_bert_config.json")
    pooling = pooling_mode(pool_cfg)
    if "message" in (bert_cfg.get("modality_config") or {}):
        raise ValueError(f"{name}: its Transformer renders text through the chat template "
                         "(modality_config 'message', sentence-transformers 6); not supported, "
                         "only plain text input")
    prompts, default_prompt_name = read_prompts(root)
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(tr_path))
    lead, trail = special_ids(tokenizer)
    max_seq = bert_cfg.get("max_seq_length")
    if max_seq is None:
        tok_max = getattr(tokenizer, "model_max_length", None)
        max_seq = tok_max if isinstance(tok_max, int) and tok_max < 10**7 else None
    side = getattr(tokenizer, "padding_side", "right")
    return STSettings(
        path=str(root),
        transformer_path=str(tr_path),
        pooling=pooling,
        include_prompt=bool(pool_cfg.get("include_prompt", True)),
        normalize="Normalize" in kinds,
        lead_ids=lead,
        trail_ids=trail,
        max_seq_length=int(max_seq) if max_seq is not None else None,
        prompts=prompts,
        default_prompt_name=default_prompt_name,
        padding_side="left" if side == "left" else "right",
        model_type=model_type,
    )


__all__ = ["STSettings", "STPooling", "is_st_folder", "read_st_folder", "read_prompts",
           "pooling_mode", "special_ids"]
