"""Forward pre-hooks that rewire hidden states between decoder layers, and early exit.

The model is the unmodified Hugging Face decoder: the copies are forward pre-hooks on its
decoder layers, the early exit a forward hook that stops the layer loop. Copies are
vectorized index operations over the whole batch (no Python loop over rows).

Source: HTP (Ding et al., ACL 2026) Sec. 4.2 (``f_local``), Sec. 4.3 (``f_global``),
Sec. 4.4 (early exit); Token Prepending (Fu et al., ACL 2025).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from htp_retrieval.layout import Layout


@dataclass(frozen=True)
class CopyPlan:
    """Flattened copy indices for one padded batch.

    Each copy stage is three ``[n_copies]`` long tensors: batch row, destination position,
    source position. Stage 1 (local) runs before stage 2 (global), so ``<B-PST>_m`` gets
    the state ``<PST>_m`` holds after its own copy, exactly ``f_global(f_local(v))``.
    """

    local: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    global_: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    local_mean: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    """With block-mean summaries: ``(token_rows, token_positions, segment, counts)``; the
    first three are ``[n_block_tokens]`` (``segment`` indexes the local copy that the token's
    block feeds), ``counts`` is ``[n_local_copies, 1]`` float32 block sizes, built once per
    batch rather than at every copy layer.
    The local stage then writes the mean of each block's states instead of its last token's."""

    def to(self, device: torch.device | str, *, pin: bool = False,
           non_blocking: bool = False) -> CopyPlan:
        """The same plan with its index tensors on ``device`` (for a model split over GPUs).

        Args:
            device: Target device.
            pin: Pin the (host) tensors first, so a CUDA copy can be asynchronous.
            non_blocking: Passed to ``Tensor.to``.
        """

        def move(t: tuple[torch.Tensor, ...] | None) -> tuple[torch.Tensor, ...] | None:
            if t is None:
                return None
            return tuple((x.pin_memory() if pin else x).to(device, non_blocking=non_blocking)
                         for x in t)

        return CopyPlan(local=move(self.local), global_=move(self.global_),  # type: ignore[arg-type]
                        local_mean=move(self.local_mean))  # type: ignore[arg-type]

    @property
    def empty(self) -> bool:
        """True when the batch has no copies at all."""
        return self.local[0].numel() == 0 and self.global_[0].numel() == 0

    @classmethod
    def from_layouts(
        cls,
        layouts: Sequence[Layout],
        offsets: Sequence[int],
        device: torch.device | str,
        *,
        summary: str = "last",
    ) -> CopyPlan:
        """Build the plan for a batch.

        Args:
            layouts: One layout per row.
            offsets: Left-padding offset per row (0 with right padding), in tokens.
            device: Device of the hidden states.
            summary: ``last`` (the paper: ``<PST>_m`` <- the block's last token) or
                ``mean`` (``<PST>_m`` <- the mean of the block's token states; only for
                block layouts, where each ``<PST>`` directly precedes its block).
        """

        def stage(pairs_of: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            rows, dst, src = [], [], []
            for r, (lay, off) in enumerate(zip(layouts, offsets)):
                for d, s in getattr(lay, pairs_of):
                    rows.append(r)
                    dst.append(d + off)
                    src.append(s + off)
            def t(x: list[int]) -> torch.Tensor:
                return torch.tensor(x, dtype=torch.long, device=device)
            return t(rows), t(dst), t(src)

        local_mean = None
        if summary == "mean":
            t_rows, t_pos, seg = [], [], []
            n = 0
            for r, (lay, off) in enumerate(zip(layouts, offsets)):
                if len(lay.block_sizes) != len(lay.local_copies):
                    raise ValueError("summary='mean' needs a block layout (<PST> per block)")
                for (dst, _src), size in zip(lay.local_copies, lay.block_sizes):
                    t_rows.extend([r] * size)
                    t_pos.extend(range(dst + 1 + off, dst + 1 + size + off))
                    seg.extend([n] * size)
                    n += 1
            sizes = [max(1, size) for lay in layouts for size in lay.block_sizes]
            local_mean = (*(torch.tensor(x, dtype=torch.long, device=device)
                            for x in (t_rows, t_pos, seg)),
                          torch.tensor(sizes, dtype=torch.float32, device=device).unsqueeze(1))
        elif summary != "last":
            raise ValueError(f"summary must be 'last' or 'mean', got {summary!r}")
        return cls(local=stage("local_copies"), global_=stage("global_copies"),
                   local_mean=local_mean)  # type: ignore[arg-type]


_MEAN_CHUNK_TOKENS = 1024
"""Tokens gathered at a time for block means (bounds the float32 scratch memory)."""


def apply_copies(hidden: torch.Tensor, plan: CopyPlan, *, inplace: bool = False) -> torch.Tensor:
    """Apply ``f_global(f_local(hidden))``.

    Both stages write into one tensor, so the global stage reads ``<PST>_m`` after its local
    copy. Block means (``plan.local_mean``) are summed in float32,
    :data:`_MEAN_CHUNK_TOKENS` tokens at a time, so the scratch memory stays small for any
    batch. Only placeholder positions are written; text positions are read.

    Args:
        hidden: Hidden states entering a layer, ``[batch, seq, hidden]``.
        plan: The batch's copy plan.
        inplace: Write into ``hidden`` itself (what the layer hooks do: the layer input is
            then not held twice while the layer runs) instead of a copy.

    Returns:
        ``[batch, seq, hidden]``: ``hidden`` itself when ``inplace``, else a new tensor (and
        ``hidden`` is not modified).
    """
    if plan.local[0].device != hidden.device:  # device_map="auto": layers on several GPUs
        plan = plan.to(hidden.device)
    out = hidden if inplace else hidden.clone()
    rows, dst, src = plan.local
    if rows.numel() and plan.local_mean is not None:
        t_rows, t_pos, seg, counts = plan.local_mean
        sums = torch.zeros((rows.numel(), out.shape[-1]), dtype=torch.float32,
                           device=out.device)
        for a in range(0, t_rows.numel(), _MEAN_CHUNK_TOKENS):
            b = a + _MEAN_CHUNK_TOKENS
            sums.index_add_(0, seg[a:b], out[t_rows[a:b], t_pos[a:b]].float())
        out.index_put_((rows, dst), (sums / counts).to(out.dtype))
    elif rows.numel():
        out.index_put_((rows, dst), out[rows, src])
    rows, dst, src = plan.global_
    if rows.numel():
        out.index_put_((rows, dst), out[rows, src])
    return out


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """Return the decoder layer list of a causal LM or its base model.

    Raises:
        ValueError: if no ``layers`` ModuleList is found.
    """
    base = base_model(model)
    layers = getattr(base, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"{type(model).__name__}: no decoder `layers` ModuleList found")
    return layers


def base_model(model: nn.Module) -> nn.Module:
    """The transformer body without the LM head (``model.model`` for ``*ForCausalLM``)."""
    if hasattr(model, "layers"):
        return model
    inner = getattr(model, "model", None)
    if inner is not None and hasattr(inner, "layers"):
        return inner
    if hasattr(model, "get_decoder"):
        dec = model.get_decoder()
        if hasattr(dec, "layers"):
            return dec
    raise ValueError(f"{type(model).__name__}: cannot find the decoder body")


class _EarlyExit(Exception):
    def __init__(self, hidden: torch.Tensor) -> None:
        self.hidden = hidden


def _first(x: object) -> torch.Tensor:
    return x[0] if isinstance(x, (tuple, list)) else x  # type: ignore[return-value]


def run_decoder(
    model: nn.Module,
    *,
    inputs_embeds: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor,
    exit_layer: int,
    plan: CopyPlan | None = None,
    tp_start: int = 0,
    tp_exit: int = 0,
    timings: dict[str, float] | None = None,
) -> torch.Tensor:
    """Run the decoder up to ``exit_layer`` layers with copies before layers in [tp_start, tp_exit).

    Args:
        model: A causal LM or its base model.
        inputs_embeds: ``[batch, seq, hidden]`` input embeddings.
        attention_mask: ``[batch, seq]``, 1 for tokens, 0 for padding; ``None`` for the
            plain causal mask (exact for right padding, and the fast SDPA path).
        position_ids: ``[batch, seq]`` or ``[1, seq]`` (left padding: positions start at
            the first token).
        exit_layer: L', the number of layers to run, 1..L. The result equals
            ``hidden_states[L']`` of a full run with ``output_hidden_states=True``
            (for L' = L that includes the final norm, as Hugging Face returns it).
        plan: Copies to apply; ``None`` or empty for no rewiring.
        tp_start: First layer index (0-based) whose input is rewired.
        tp_exit: Layer index at which rewiring stops (exclusive).
        timings: If given, ``timings["copy_seconds"]`` is increased by the wall time of the
            copy hooks (host time: on CUDA, kernel launches only unless the caller
            synchronizes; use ``torch.profiler`` there) and ``timings["copy_calls"]`` by
            their number.

    Returns:
        ``[batch, seq, hidden]`` hidden states after layer L'. The LM head is never run.

    Raises:
        ValueError: if ``exit_layer`` is outside 1..L or ``tp_start > tp_exit``.
    """
    body = base_model(model)
    layers = decoder_layers(body)
    n_layers = len(layers)
    if not 1 <= exit_layer <= n_layers:
        raise ValueError(f"exit_layer must be in 1..{n_layers}, got {exit_layer}")
    if tp_start > tp_exit:
        raise ValueError(f"tp_start ({tp_start}) > tp_exit ({tp_exit})")
    handles = []

    def copies(hidden: torch.Tensor, inplace: bool) -> torch.Tensor:
        with torch.profiler.record_function("htp.copies"):
            if timings is None:
                return apply_copies(hidden, plan, inplace=inplace)  # type: ignore[arg-type]
            t0 = time.perf_counter()
            out = apply_copies(hidden, plan, inplace=inplace)  # type: ignore[arg-type]
            timings["copy_seconds"] = timings.get("copy_seconds", 0.0) + time.perf_counter() - t0
            timings["copy_calls"] = timings.get("copy_calls", 0.0) + 1
            return out

    def make_pre_hook(inplace: bool):  # noqa: ANN202
        def pre_hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            if args:
                return (copies(args[0], inplace), *args[1:]), kwargs
            kwargs = dict(kwargs)
            kwargs["hidden_states"] = copies(kwargs["hidden_states"], inplace)
            return args, kwargs

        return pre_hook

    def exit_hook(module: nn.Module, args: tuple, output: object) -> None:
        raise _EarlyExit(_first(output))

    try:
        if plan is not None and not plan.empty:
            for i in range(max(tp_start, 0), min(tp_exit, exit_layer)):
                # In place from layer 1 on: a layer's input is the previous layer's output,
                # owned by this forward pass, so it is not held twice while the layer runs.
                # Layer 0 receives the caller's inputs_embeds, which are left untouched.
                hook = make_pre_hook(inplace=i > 0)
                handles.append(layers[i].register_forward_pre_hook(hook, with_kwargs=True))
        if exit_layer < n_layers:
            handles.append(layers[exit_layer - 1].register_forward_hook(exit_hook))
        try:
            out = body(
                inputs_embeds=inputs_embeds,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=False,
            )
        except _EarlyExit as stop:
            return stop.hidden
        return out.last_hidden_state
    finally:
        for h in handles:
            h.remove()
