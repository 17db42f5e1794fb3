"""Document boundaries of a ``load_tokens(documents=True)`` batch as flash-attention's
variable-length arguments."""

from __future__ import annotations

import torch

__all__ = ["cu_seqlens"]


def cu_seqlens(positions: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(cu_seqlens, max_seqlen) of a batch's ``"positions"`` (batch, seq_len): the batch's
    tokens flattened row after row are sequences that start where a document starts
    (position 0) and at every row's start (a document continued from the previous row is a
    sequence of its own there). ``cu_seqlens`` is int32, the sequences' cumulative lengths
    from 0 to batch x seq_len; ``max_seqlen`` the longest. Pass them with the flattened
    tokens to ``flash_attn_varlen_func`` (as ``cu_seqlens_q`` and ``cu_seqlens_k``) so that no
    token attends across a document boundary.

    Raises ValueError for a tensor that is not 2-D int positions."""
    if positions.dim() != 2 or positions.dtype.is_floating_point or positions.dtype == torch.bool:
        raise ValueError(
            f"positions must be a (batch, seq_len) int tensor, got {positions.dtype} "
            f"of shape {tuple(positions.shape)}"
        )
    starts = positions == 0
    starts[:, 0] = True
    flat = starts.reshape(-1).nonzero().squeeze(1)
    total = positions.numel()
    bounds = torch.cat([flat, torch.tensor([total], dtype=flat.dtype, device=flat.device)])
    lengths = bounds.diff()
    longest = int(lengths.max()) if len(lengths) else 0
    return bounds.to(torch.int32), longest
