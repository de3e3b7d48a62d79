"""Replaying a decoder sub-block from its last linear's recorded input, so that GPTQ's true-sequential stages
(GPTQ Sec. 4 "Step 3") run the attention core once per calibration window instead of once per stage.

A layer quantized stage by stage (q,k,v → o → gate,up → down) runs its forward once per stage, each time up to
the stage's linears, and once more for its output. Every run after the o stage recomputes attention from the
already-final q/k/v weights and the unchanged layer input. A block M (``self_attn``, ``mlp``) whose output *is*
the output of its last linear L (checked once by object identity, as ``M(x) = L(f(x))`` with f everything before
L) can instead return ``L(x_L)`` from the input x_L recorded in the stage that calibrated L, provided that

- every other linear of M was final when x_L was recorded (so f has not changed since), and
- M's inputs equal the recorded ones (compared exactly; otherwise M runs normally).

L is called as a module, with its current (quantized) weight and any hooks, so the replay is exact: the same
values the full forward computes, minus the work of f. Recorded tensors stay where the batches are; the cost is
one copy of M's input and of x_L per window, which :func:`record_bytes` estimates.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from quantkit.model.layerwise import LayerBatch, layer_output


@dataclass
class _Block:
    """A replayable sub-block: the module, its last linear (name and module), the other linears inside it, how
    many outputs follow the first (all None), and per window the recorded (args, kwargs, x_L)."""

    module: nn.Module
    last: str
    last_linear: nn.Linear
    others: frozenset[str]
    trailing_nones: int | None
    records: dict[int, tuple[tuple, dict, torch.Tensor]] = field(default_factory=dict)


def _same(a, b) -> bool:
    """Exact equality of two call arguments (tensors by value, containers element-wise, the rest by ==)."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except Exception:  # objects whose == is not a truth value (e.g. a cache): not the same call
        return False


class BlockReplay:
    """Finds the replayable blocks of ``layer`` (one probe forward of ``probe_batch``) and, while
    :meth:`window` contexts run, records and replays them (module docstring)."""

    def __init__(self, layer: nn.Module, linears: Mapping[str, nn.Linear], probe_batch: LayerBatch):
        self.layer = layer
        self.blocks: list[_Block] = _find_blocks(layer, linears, probe_batch)
        self.final: set[str] = set()
        self._recording: list[_Block] = []
        self._window: int | None = None

    def stage(self, names: Iterable[str]) -> None:
        """Start a stage that calibrates ``names``: blocks whose last linear is among them, and whose other
        linears are all final, record their inputs during the stage's windows."""
        names = set(names)
        self._recording = [b for b in self.blocks if b.last in names and b.others <= self.final]

    def finish(self, names: Iterable[str]) -> None:
        """Mark ``names`` as final (their weights no longer change)."""
        self.final.update(names)
        self._recording = []

    def run(self, batches: list[LayerBatch], call) -> None:
        """``call(batch)`` for each window in order, with recording and replay active for that window."""
        with self._installed():
            for i, b in enumerate(batches):
                self._window = i
                call(b)
        self._window = None

    def outputs(self, batches: list[LayerBatch]) -> list[LayerBatch]:
        """The layer's outputs for every window (the next layer's inputs), replaying what can be replayed."""
        out: list[LayerBatch] = []
        self.run(batches, lambda b: out.append(LayerBatch(layer_output(self.layer, b), b.kwargs)))
        return out

    @contextmanager
    def _installed(self) -> Iterator[None]:
        handles, saved = [], []
        try:
            for block in self._recording:
                handles.append(block.module.register_forward_pre_hook(self._record_input(block), with_kwargs=True))
                # first, so a hook that ends the forward at this linear (GPTQ's stage capture) runs after it
                handles.append(block.last_linear.register_forward_pre_hook(self._record_last(block), with_kwargs=True,
                                                              prepend=True))
            for block in self.blocks:
                if block.records and block not in self._recording:
                    saved.append((block.module, block.module.__dict__.get("forward")))
                    block.module.forward = self._replaying(block, block.module.forward)
            yield
        finally:
            for h in handles:
                h.remove()
            for module, prev in saved:
                if prev is None:
                    del module.forward
                else:
                    module.forward = prev

    def _record_input(self, block: _Block):
        def hook(_module, args, kwargs):
            block.records[self._window] = (args, dict(kwargs), None)
        return hook

    def _record_last(self, block: _Block):
        def hook(_module, args, kwargs):
            a, kw, _ = block.records[self._window]
            block.records[self._window] = (a, kw, args[0] if args else kwargs["input"])
        return hook

    def _replaying(self, block: _Block, forward):
        def replay(*args, **kwargs):
            rec = block.records.get(self._window)
            if rec is None or rec[2] is None or not (_same(args, rec[0]) and _same(kwargs, rec[1])):
                return forward(*args, **kwargs)
            y = block.last_linear(rec[2])
            return y if block.trailing_nones is None else (y, *([None] * block.trailing_nones))
        return replay


def _find_blocks(layer: nn.Module, linears: Mapping[str, nn.Linear], batch: LayerBatch) -> list[_Block]:
    """Modules of ``layer`` holding linears whose output, in one forward of ``batch``, is their last linear's
    output object, unchanged since the linear returned it (alone, or first with only Nones after it)."""
    by_id = {id(m): n for n, m in linears.items()}
    parents = {}
    for name, module in layer.named_modules():
        inner = [by_id[id(m)] for m in module.modules() if id(m) in by_id]
        if module is not layer and inner and not isinstance(module, nn.Linear):
            parents[name] = (module, inner)
    last_out: dict[str, tuple[torch.Tensor, int]] = {}  # the linear's output and its version when returned
    calls: dict[str, list[str]] = {n: [] for n in parents}
    outs: dict[str, object] = {}
    handles = []
    try:
        for lname, lin in linears.items():
            handles.append(lin.register_forward_hook(
                lambda _m, _a, y, _n=lname: last_out.__setitem__(_n, (y, y._version))))
        for pname, (module, inner) in parents.items():
            handles.append(module.register_forward_pre_hook(lambda _m, _a, _p=pname: calls[_p].clear()))
            for lname in inner:
                handles.append(linears[lname].register_forward_pre_hook(
                    lambda _m, _a, _p=pname, _n=lname: calls[_p].append(_n)))
            handles.append(module.register_forward_hook(lambda _m, _a, y, _p=pname: outs.__setitem__(_p, y)))
        with torch.no_grad():
            layer_output(layer, batch)
    finally:
        for h in handles:
            h.remove()
    blocks = []
    for pname, (module, inner) in parents.items():
        if not calls.get(pname) or pname not in outs:
            continue
        last = calls[pname][-1]
        y = outs[pname]
        trailing = None
        if isinstance(y, tuple) and y and all(t is None for t in y[1:]):
            trailing, y = len(y) - 1, y[0]
        seen = last_out.get(last)
        if seen is None or y is not seen[0] or y._version != seen[1]:  # another tensor, or changed in place
            continue
        blocks.append(_Block(module, last, linears[last], frozenset(set(inner) - {last}), trailing))
    # a block nested in another replayable one with the same last linear adds nothing
    return [b for b in blocks if not any(o is not b and o.last == b.last and b.module in set(o.module.modules())
                                         for o in blocks)]


def record_bytes(batches: list[LayerBatch], linears: Mapping[str, nn.Linear]) -> int:
    """An upper estimate of what replaying a Llama-like layer records over ``batches``: per token, the inputs of
    the attention and MLP blocks (hidden size each) and of their last linears (o_proj's, at most hidden size;
    down_proj's, the widest input of the layer's linears)."""
    tokens = sum(b.hidden.shape[:-1].numel() for b in batches)
    hidden = batches[0].hidden.shape[-1]
    widest = max(lin.in_features for lin in linears.values())
    return tokens * (3 * hidden + widest) * batches[0].hidden.element_size()
