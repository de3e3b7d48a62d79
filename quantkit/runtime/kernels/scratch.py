"""Scratch memory of split-K launches (:mod:`quantkit.runtime.kernels.triton.splitk`): an fp32 workspace of slots
and int32 tickets that start at zero (the kernels return them to zero when they finish).

Eager calls reuse one workspace and one ticket array per (device, stream), grown on demand, so a call allocates
nothing and a kernel on another stream never shares them.

Inside a compiled region (the custom ops of :mod:`quantkit.runtime.kernels.ops`, under :func:`graph_owned_scratch`),
a cached buffer grown while torch.compile's CUDA graphs warm up or record would come from the graph's private memory
pool and outlive it, which CUDA-graph trees refuse ("tensors in the cudagraph pool not tracked as outputs"). There
the slots are allocated per call (``torch.empty``: inside a graph, a block of the graph's pool that the replay
reuses, no allocation at replay) and the tickets are one fixed array per device, allocated outside any graph by
:func:`reserve_graph_tickets` (the packed-model loader and the decode loop call it). Kernels of one device's graphs
therefore share those tickets: graphs replayed concurrently on two streams of one device are not supported.
"""

from __future__ import annotations

import contextlib
import threading

import torch

_WORKSPACES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
_GRAPH_TICKETS: dict[torch.device, torch.Tensor] = {}
GRAPH_TICKET_CAPACITY = 1 << 16  # output tiles of one split launch; split launches have few (they fill idle SMs)
_scope = threading.local()


@contextlib.contextmanager
def graph_owned_scratch():
    """Within this context :func:`split_workspace` hands out per-call slots and the device's fixed tickets
    (module docstring): what a kernel call inside a compiled CUDA graph must use."""
    before = getattr(_scope, "graph", False)
    _scope.graph = True
    try:
        yield
    finally:
        _scope.graph = before


def graph_scratch_active() -> bool:
    """Whether :func:`graph_owned_scratch` is in force on this thread."""
    return getattr(_scope, "graph", False)


def reserve_graph_tickets(device: torch.device | str) -> torch.Tensor:
    """The zeroed tickets that split launches inside compiled graphs on ``device`` share, allocated on first call;
    call it outside any CUDA-graph capture or warm-up (module docstring)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    tickets = _GRAPH_TICKETS.get(device)
    if tickets is None:
        tickets = _GRAPH_TICKETS[device] = torch.zeros(GRAPH_TICKET_CAPACITY, dtype=torch.int32, device=device)
    return tickets


def split_workspace(device: torch.device, slot: int, split: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 workspace of >= ``split`` slots of ``slot`` elements — none for an unsplit launch, which never touches
    it — and int32 tickets of >= ``tiles`` zeros) for split-K launches on the current stream of ``device``;
    kernels return the tickets to zero when they finish. The kernels address slots with 32-bit offsets, so more
    than 2^31 - 1 elements is refused."""
    elements = slot * split if split > 1 else 0
    if elements >= 2**31:
        raise ValueError(f"a split-K workspace of {elements} elements exceeds 32-bit offsets; use split_k=1 "
                         "(or fewer tokens per call)")
    device = torch.device(device)
    if getattr(_scope, "graph", False):
        if tiles > GRAPH_TICKET_CAPACITY:
            raise ValueError(f"a split-K launch of {tiles} output tiles exceeds the {GRAPH_TICKET_CAPACITY} tickets "
                             "of a compiled graph; use split_k=1 for this shape")
        return torch.empty(max(elements, 1), dtype=torch.float32, device=device), reserve_graph_tickets(device)
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device, stream)
    ws, tickets = _WORKSPACES.get(key, (None, None))
    if ws is None or ws.numel() < elements:
        ws = torch.zeros(max(elements, 1), dtype=torch.float32, device=device)
    if tickets is None or tickets.numel() < tiles:
        tickets = torch.zeros(max(tiles, 1), dtype=torch.int32, device=device)
    _WORKSPACES[key] = (ws, tickets)
    return ws, tickets
