"""MTEB 2.x compatibility: :class:`HTPMtebEncoder` wraps an :class:`~htp_retrieval.HTPEncoder`.

The wrapper implements mteb's ``EncoderProtocol`` (``encode(inputs: DataLoader, *,
task_metadata, hf_split, hf_subset, prompt_type)``, ``similarity``, ``similarity_pairwise``,
``mteb_model_meta``), so any MTEB task can be run with any method:

    >>> import mteb                                                         # doctest: +SKIP
    >>> from htp_retrieval.eval.mteb_model import HTPMtebEncoder             # doctest: +SKIP
    >>> model = HTPMtebEncoder("smollm2-135m-instruct", method="htp")        # doctest: +SKIP
    >>> mteb.evaluate(model, mteb.get_tasks(tasks=["SciFact"]))             # doctest: +SKIP

Prompts follow the paper's retrieval setup (Sec. 5, Table 6): queries
(``PromptType.query``) get the task's instruction as ``"{instruction} Text:"`` before the
text; documents (``PromptType.document``) get none; STS inputs (``prompt_type=None``) get
none ("prompts to the texts, except for STS"). The instruction is, in order: an explicit
override, the paper's Table 6 wording for the task (:data:`htp_retrieval.methods.
TASK_INSTRUCTIONS`, matched on the normalized mteb task name), the task metadata's query
prompt, and finally the task's description.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np

from htp_retrieval.methods import TASK_INSTRUCTIONS

try:
    from mteb.models.abs_encoder import AbsEncoder
    from mteb.models.model_meta import ModelMeta
    from mteb.types import PromptType
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "MTEB support needs mteb 2.x: pip install 'mteb>=2,<3' "
        "(or pip install 'htp-retrieval[eval]')"
    ) from e

EmptyPolicy = Literal["error", "zeros"]
"""What :meth:`HTPMtebEncoder.encode` does with an empty or whitespace-only text: raise a
``ValueError`` naming the task and index (default), or embed it as a zero vector."""

_LEMB = {"wikimqa": "2wikimqa", "summscreenfd": "summ_screen_fd", "narrativeqa": "narrativeqa",
         "qmsum": "qmsum", "needle": "needle", "passkey": "passkey"}
_ALIASES = {"treccovid": "trec-covid", "fiqa": "fiqa2018"}
# settings recorded in ModelMeta.experiment_kwargs (mteb names its results folder after them)
_EXPERIMENT_KEYS = ("method", "k", "tokens_per_block", "segmenter", "max_length", "tp_start",
                    "tp_exit", "output_layer", "dtype", "placeholder_init", "keep_sink")


def table6_key(task_name: str) -> str | None:
    """The :data:`TASK_INSTRUCTIONS` key of an mteb or local task name, or ``None``.

    ``SciFact`` -> ``scifact``, ``TRECCOVID`` -> ``trec-covid``, ``LEMBQMSumRetrieval`` ->
    ``qmsum``, ``LEMBNeedleRetrieval`` -> ``needle``, ``scifact-local`` -> ``scifact``.
    """
    key = task_name.lower()
    key = re.sub(r"-local(-.*)?$", "", key)
    key = re.sub(r"\.v\d+$", "", key)
    if key.startswith("lemb") and key.endswith("retrieval"):
        key = _LEMB.get(key[4:-9], key[4:-9])
    key = _ALIASES.get(key, key)
    return key if key in TASK_INSTRUCTIONS else None


def task_instruction(
    task_metadata: Any,
    prompt_type: PromptType | None,
    *,
    overrides: Mapping[str, str] | None = None,
) -> str | None:
    """The instruction for one ``encode`` call (see the module docstring for the order).

    Args:
        task_metadata: mteb ``TaskMetadata`` (``name``, ``type``, ``prompt``, ``description``).
        prompt_type: ``PromptType.query``, ``PromptType.document`` or ``None``.
        overrides: ``task name -> instruction`` (or ``"<task name>-query"``) taking priority.

    Returns:
        The instruction text, or ``None`` for documents and STS inputs.
    """
    name = str(task_metadata.name)
    ptype = PromptType(prompt_type) if prompt_type is not None else None
    if ptype == PromptType.document:
        return None
    if ptype is None and task_metadata.type == "STS":
        return None
    if overrides:
        for key in (f"{name}-query", name):
            if key in overrides:
                return overrides[key]
    key = table6_key(name)
    if key is not None:
        return TASK_INSTRUCTIONS[key]
    prompt = task_metadata.prompt
    if isinstance(prompt, Mapping):
        prompt = prompt.get("query")
    if prompt:
        return str(prompt)
    return str(task_metadata.description).strip() or None


def _meta_name(model: str) -> str:
    if os.path.exists(model) or model.endswith(".gguf") or "/" not in model:
        return f"htp-retrieval/{Path(model).name or model}"
    return model


def load_htp_mteb_model(
    model_name: str, revision: str | None = None, **kwargs: Any
) -> HTPMtebEncoder:
    """Loader for :attr:`ModelMeta.loader`: builds an :class:`HTPMtebEncoder`.

    ``kwargs`` carry ``model`` (the name given to :class:`~htp_retrieval.HTPEncoder`;
    default ``model_name``), ``method`` and any encoder option.
    """
    model = kwargs.pop("model", model_name)
    return HTPMtebEncoder(model, revision, **kwargs)


class HTPMtebEncoder(AbsEncoder):
    """An mteb 2.x ``EncoderProtocol`` model backed by :class:`~htp_retrieval.HTPEncoder`.

    Args:
        model_name: Model for :class:`~htp_retrieval.HTPEncoder` (packaged name, ``.gguf``,
            local dir or hub id). Ignored when ``encoder`` is given.
        revision: Recorded in the mteb metadata (default ``htp-retrieval-<version>``).
        device: ``auto``/``cpu``/``cuda`` (``None``: ``auto``).
        method: Any method name or alias (``htp``, ``vanilla-mean``, ...).
        encoder: An already built encoder (then ``model_name``/``method``/``encoder_kwargs``
            are not used).
        instructions: ``task name -> query instruction`` overrides.
        on_empty: :data:`EmptyPolicy`.
        **encoder_kwargs: Passed to :class:`~htp_retrieval.HTPEncoder` (``k``,
            ``max_length``, ``tp_start``, ``dtype``, ...).

    Attributes:
        encoder: The wrapped encoder.
        calls: One dict per ``encode`` call: ``task``, ``prompt_type``, ``n_texts``,
            ``text_tokens``, ``seconds`` (wall) — the cost of the run.
    """

    def __init__(
        self,
        model_name: str = "smollm2-135m-instruct",
        revision: str | None = None,
        *,
        device: str | None = None,
        method: str = "htp",
        encoder: Any | None = None,
        instructions: Mapping[str, str] | None = None,
        on_empty: EmptyPolicy = "error",
        **encoder_kwargs: Any,
    ) -> None:
        if encoder is None:
            from htp_retrieval.encoder import HTPEncoder

            encoder = HTPEncoder(model_name, method, device=device or "auto",
                                 **{"max_length": 512, "overflow": "truncate", **encoder_kwargs})
        if on_empty not in ("error", "zeros"):
            raise ValueError(f"on_empty must be 'error' or 'zeros', got {on_empty!r}")
        self.encoder = encoder
        self.model = encoder  # AbsEncoder convention
        self.instructions = dict(instructions or {})
        self.on_empty: EmptyPolicy = on_empty
        self.calls: list[dict[str, Any]] = []
        self.mteb_model_meta = self._model_meta(revision)

    def _model_meta(self, revision: str | None) -> ModelMeta:
        import htp_retrieval
        from htp_retrieval.eval.report import key_is_relevant

        cfg = dict(self.encoder.record())
        exp = {k: cfg[k] for k in _EXPERIMENT_KEYS
               if k in cfg and key_is_relevant(cfg["method"], k)}
        model = getattr(self.encoder, "model", None)
        n_params = (sum(p.numel() for p in model.parameters())
                    if model is not None and hasattr(model, "parameters") else None)
        return ModelMeta(
            loader=load_htp_mteb_model,
            loader_kwargs={"model": cfg["model"], **{k: v for k, v in exp.items()}},
            name=_meta_name(str(cfg["model"])),
            revision=revision or f"htp-retrieval-{htp_retrieval.__version__}",
            release_date=None,
            languages=None,
            n_parameters=n_params,
            memory_usage_mb=None,
            max_tokens=float(cfg["max_length"]),
            embed_dim=int(self.encoder.hidden_size),
            license=None,
            open_weights=None,
            public_training_code=None,
            public_training_data=None,
            framework=["PyTorch", "Transformers"],
            reference="https://arxiv.org/abs/2511.14868",
            similarity_fn_name="cosine",
            use_instructions=True,
            training_datasets=None,
            experiment_kwargs=exp,
        )

    def instruction_for(self, task_metadata: Any, prompt_type: PromptType | None) -> str | None:
        """The instruction this model uses for a task and prompt type (see
        :func:`task_instruction`)."""
        return task_instruction(task_metadata, prompt_type, overrides=self.instructions)

    def encode(
        self,
        inputs: Any,
        *,
        task_metadata: Any,
        hf_split: str,
        hf_subset: str,
        prompt_type: PromptType | None = None,
        **kwargs: Any,
    ) -> np.ndarray:
        """Embed every text of mteb's DataLoader (batches of ``{"text": [...]}``).

        All batches are collected and encoded in one :meth:`HTPEncoder.encode` call, so
        the encoder's length-sorted batching spans the whole set.

        Args:
            inputs: ``DataLoader`` of batches with a ``text`` list.
            task_metadata: The task's metadata (instruction lookup).
            hf_split: Split (unused).
            hf_subset: Subset (unused).
            prompt_type: ``query``, ``document`` or ``None``.
            **kwargs: ``batch_size`` (texts per forward batch), ``show_progress_bar``.

        Returns:
            ``[n_texts, hidden]`` float32 embeddings, in input order.

        Raises:
            ValueError: if a batch has no ``text`` column, or a text is empty or not a string
                and ``on_empty="error"`` (names the task and the index).
        """
        texts: list[Any] = []
        for b, batch in enumerate(inputs):
            if "text" not in batch:
                raise ValueError(f"{task_metadata.name}: batch {b} has no 'text' column "
                                 f"(columns: {sorted(batch)}); only text tasks are supported")
            texts.extend(batch["text"])
        bad = [i for i, t in enumerate(texts) if not isinstance(t, str) or not t.strip()]
        if bad and self.on_empty == "error":
            raise ValueError(
                f"{task_metadata.name} ({hf_split}/{hf_subset}, {prompt_type}): text at index "
                f"{bad[0]} is empty or not a string ({len(bad)} such texts); pass "
                f"on_empty='zeros' (--on-empty zeros) to embed them as zero vectors"
            )
        bad_set = set(bad)
        keep = [i for i in range(len(texts)) if i not in bad_set]
        instruction = self.instruction_for(task_metadata, prompt_type)
        t0 = time.perf_counter()
        emb = self.encoder.encode(
            [texts[i] for i in keep],
            instruction=instruction,
            batch_size=kwargs.get("batch_size"),
            show_progress_bar=bool(kwargs.get("show_progress_bar", False)),
        )
        seconds = time.perf_counter() - t0
        stats = getattr(self.encoder, "last_stats", None)
        self.calls.append({
            "task": str(task_metadata.name),
            "prompt_type": None if prompt_type is None else str(PromptType(prompt_type).value),
            "n_texts": len(texts),
            "text_tokens": int(getattr(stats, "text_tokens", 0)),
            "seconds": seconds,
        })
        if not bad:
            return emb
        out = np.zeros((len(texts), self.encoder.hidden_size), dtype=np.float32)
        out[keep] = emb
        return out


__all__ = ["HTPMtebEncoder", "load_htp_mteb_model", "task_instruction", "table6_key",
           "EmptyPolicy"]
