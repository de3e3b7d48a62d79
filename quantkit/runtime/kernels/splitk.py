"""Split-K without extra kernels: the programs of one output tile add their fp32 partial sums into a workspace
with atomics, the last one to arrive (an atomic ticket per tile) reads the total, writes the output in its
dtype and leaves the workspace and its ticket at zero for the next call.

The earlier form — a zeroed fp32 result per call, atomics, then a cast into the output — cost two more kernels
per GEMM (a memset and the cast), a few µs each against a ~15 µs decode GEMV. The workspace and tickets are
allocated once per (device, stream) and grown on demand: a kernel on another stream never shares them.
"""

from __future__ import annotations

import torch
import triton.language as tl

from quantkit.runtime.kernels.jit import kernel

_WORKSPACES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def split_workspace(device: torch.device, elements: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 workspace of >= ``elements`` zeros, int32 tickets of >= ``tiles`` zeros) for split-K launches on
    the current stream of ``device``; kernels return both to zero when they finish."""
    device = torch.device(device)
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device, stream)
    ws, tickets = _WORKSPACES.get(key, (None, None))
    if ws is None or ws.numel() < elements:
        ws = torch.zeros(max(elements, 1), dtype=torch.float32, device=device)
    if tickets is None or tickets.numel() < tiles:
        tickets = torch.zeros(max(tiles, 1), dtype=torch.int32, device=device)
    _WORKSPACES[key] = (ws, tickets)
    return ws, tickets


@kernel
def store_tile(out_ptr, out_ptrs, ws_ptrs, acc, mask, ticket_ptr, SPLIT_K: tl.constexpr):
    """Write a finished [BN, BM] fp32 tile: directly, or through the split-K workspace (module docstring)."""
    if SPLIT_K == 1:
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(ws_ptrs, acc, mask=mask)
        # acq_rel: every program's partial sums are visible to the program that draws the last ticket
        if tl.atomic_add(ticket_ptr, 1) == SPLIT_K - 1:
            zero = tl.full(acc.shape, 0.0, tl.float32)
            total = tl.atomic_add(ws_ptrs, zero, mask=mask)  # an atomic read of the finished sums
            total = tl.where(mask, total, zero)  # masked lanes return undefined values; keep the cast finite
            tl.store(ws_ptrs, zero, mask=mask)
            tl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(ticket_ptr, 0)
