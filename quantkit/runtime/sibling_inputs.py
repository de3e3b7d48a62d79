"""One activation quantization for sibling projections: q/k/v of an attention block and gate/up of an MLP read the
same input tensor, so its A8 codes (or fake-quant form) are computed once per parent call — as MixLLM Sec. 3.4
does for the partitions of one layer, carried one level up. The same scope lets the projections fused into one
GEMM at load (:mod:`quantkit.runtime.fused_siblings`) compute that GEMM once for all of them.

A :class:`SiblingScope` lives on a parent module (:func:`scope_of`). Forward hooks clear it when the parent's
forward starts and ends, and it remembers only while a parent call is under way, so nothing is reused across parent
calls: a CUDA graph captured around the parent records its own work, and no activation outlives the call. Within
the call, a value computed from an input is reused only for the very same tensor object, unchanged since (its
version counter), with the same shape, strides, dtype, data pointer, grad mode, CUDA stream and graph-capture
state. Tensors made under ``torch.inference_mode`` carry no version counter: for them "unchanged" is assumed —
within one call of the parent, whose code (the attention and MLP blocks of the supported architectures) calls the
siblings back to back on one tensor. Writes that bypass the counter (``.data``, raw pointers, in-place writes to an
inference tensor) between two sibling calls would go unseen.

Memory: the remembered values (the int8 codes and scales, on the reference path a fake-quantized copy) live until
the next projection of the parent uses another input or the parent's call ends — in an attention block with
unfused projections, through the attention core until ``o_proj``: a long prefill holds one more M × K int8 tensor
there. A fused GEMM's outputs are let go as their siblings take them (:meth:`SiblingScope.forget`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn

from quantkit.runtime.dispatch import ActQuant, SharedActivation

_SCOPE_ATTR = "_quantkit_sibling_scope"


class SiblingScope:
    """What the projections of one parent module call computed from their input, per slot (module docstring)."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple] = {}  # slot → (source tensor, its key, value)
        self._depth = 0  # parent calls under way (a child called on its own reuses nothing)

    def enter(self, *_args) -> None:
        """The parent's forward pre-hook: a fresh call remembers nothing yet."""
        self._depth += 1
        self._entries.clear()

    def leave(self, *_args) -> None:
        """The parent's forward hook (also when the forward raised): forget the inputs."""
        self._depth = max(0, self._depth - 1)
        self._entries.clear()

    def recall(self, slot: str, source: torch.Tensor, key: tuple, compute: Callable[[], object]) -> object:
        """The value remembered in ``slot`` if it was computed in this parent call from the very same, unchanged
        ``source`` with the same ``key``; else ``compute()``, remembered there while a parent call is under way."""
        if not self._depth:
            return compute()
        # where torch.compile traces, the same traced tensor is the same value: its identity is the key
        full = key if torch.compiler.is_compiling() else (*input_key(source), *key)
        entry = self._entries.get(slot)
        if entry is not None and entry[0] is source and entry[1] == full:
            return entry[2]
        value = compute()
        self._entries[slot] = (source, full, value)
        return value

    def forget(self, slot: str) -> None:
        """Drop what ``slot`` remembers (its value is used up)."""
        self._entries.pop(slot, None)

    def shared(self, source: torch.Tensor, x: torch.Tensor, act: ActQuant | None) -> SharedActivation:
        """A SharedActivation of ``x`` (``source`` reshaped to [M, K]) holding the forms a sibling already
        computed from ``source`` in this parent call, if any; remembered for the next sibling otherwise."""
        shared = SharedActivation(x, act)
        if act is None:
            return shared
        prior = self.recall("activation", source, (act, tuple(x.shape), x.dtype), lambda: shared)
        if prior is not shared:
            shared.adopt(prior)
        return shared


def input_key(source: torch.Tensor) -> tuple:
    """What must match for a value computed from ``source`` to be reused (module docstring): its version counter
    (None for an inference tensor, which has none), data pointer, shape, strides, dtype, grad mode, stream state."""
    version = None if source.is_inference() else source._version
    return (version, source.data_ptr(), tuple(source.shape), source.stride(), source.dtype,
            torch.is_grad_enabled(), _stream_state(source))


def _stream_state(x: torch.Tensor) -> tuple:
    """Where x's kernels would run now: forms made on another stream, or outside a CUDA graph capture that is now
    under way (or inside one now over), are not reused."""
    if not x.is_cuda:
        return ()
    with torch.cuda.device(x.device):
        return torch.cuda.current_stream().cuda_stream, torch.cuda.is_current_stream_capturing()


def scope_of(parent: nn.Module) -> SiblingScope:
    """The parent's :class:`SiblingScope`, created on first use with the forward hooks that open and clear it."""
    scope = parent.__dict__.get(_SCOPE_ATTR)
    if scope is None:
        scope = SiblingScope()
        parent.register_forward_pre_hook(scope.enter)
        parent.register_forward_hook(scope.leave, always_call=True)
        parent.__dict__[_SCOPE_ATTR] = scope
    return scope
