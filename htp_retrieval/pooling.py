"""Readouts: mean pooling over text tokens and last-token pooling (paper Sec. 3.1, 4.4)."""

from __future__ import annotations

import torch

_CHUNK_ELEMENTS = 1 << 22
"""Float32 elements converted at a time by :func:`mean_pool` (16 MiB)."""


def mean_pool(hidden: torch.Tensor, pool_mask: torch.Tensor, *, check: bool = True
              ) -> torch.Tensor:
    """Mean pooling over the positions selected by ``pool_mask``.

    Args:
        hidden: ``[batch, seq, hidden]`` hidden states.
        pool_mask: ``[batch, seq]``, 1 for text tokens to average, 0 elsewhere
            (placeholders, instruction, template and padding).
        check: Raise for a row that selects nothing. The check reads a value back from
            the device (a synchronisation on CUDA); pass ``False`` when the caller has
            checked the mask on the host.

    Returns:
        ``[batch, hidden]`` float32 embeddings.

    Raises:
        ValueError: if a row selects no position.
    """
    mask = pool_mask.to(torch.float32)
    counts = mask.sum(dim=1, keepdim=True)
    if check and bool((counts == 0).any()):
        raise ValueError("mean pooling: a row has no text token to average")
    # float32 sums, a few rows at a time: a float32 copy of the whole batch would double
    # the memory of the last hidden states
    step = max(1, _CHUNK_ELEMENTS // max(1, hidden.shape[1] * hidden.shape[2]))
    summed = torch.cat([
        torch.einsum("bsh,bs->bh", hidden[a : a + step].to(torch.float32), mask[a : a + step])
        for a in range(0, hidden.shape[0], step)
    ])
    return summed / counts


def last_pool(hidden: torch.Tensor, last_index: torch.Tensor) -> torch.Tensor:
    """Last-token pooling.

    Args:
        hidden: ``[batch, seq, hidden]`` hidden states.
        last_index: ``[batch]`` position of each row's final token (padding accounted for).

    Returns:
        ``[batch, hidden]`` float32 embeddings.
    """
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    return hidden[rows, last_index].to(torch.float32)
