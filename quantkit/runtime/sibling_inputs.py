"""One activation quantization for sibling projections: q/k/v of an attention block and gate/up of an MLP read the
same input tensor, so its A8 codes (or fake-quant form) are computed once per parent call — as MixLLM Sec. 3.4
does for the partitions of one layer, carried one level up.

A :class:`SiblingScope` lives on a parent module with two or more QuantLinear children that quantize activations.
Forward hooks clear it when the parent's forward starts and ends, and it shares only while a parent call is
under way, so sharing never crosses parent calls: a CUDA
graph captured around the parent records its own quantization, and no activation outlives the call. Within the
call, a child reuses the previous child's :class:`~quantkit.runtime.dispatch.SharedActivation` forms only for the
very same tensor object, unchanged since (its version counter), with the same activation quantization, shape,
dtype, CUDA stream and graph-capture state. Tensors made under ``torch.inference_mode`` carry no version counter,
so they are never shared; writes that bypass the counter (through ``.data`` or raw pointers) between two sibling
calls would go unseen.

Memory: the remembered forms (the int8 codes and scales, on the reference path a fake-quantized copy) live until
the next projection of the parent quantizes another input or the parent's call ends — in an attention block,
through the attention core until ``o_proj``: a long prefill holds one more M × K int8 tensor there.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from quantkit.runtime.dispatch import ActQuant, SharedActivation


class SiblingScope:
    """The last quantized input of one parent module call (module docstring)."""

    def __init__(self) -> None:
        self._entry: tuple | None = None
        self._depth = 0  # parent calls under way (a child called on its own shares nothing)

    def enter(self, *_args) -> None:
        """The parent's forward pre-hook: a fresh call remembers nothing yet."""
        self._depth += 1
        self._entry = None

    def leave(self, *_args) -> None:
        """The parent's forward hook (also when the forward raised): forget the input."""
        self._depth = max(0, self._depth - 1)
        self._entry = None

    def shared(self, source: torch.Tensor, x: torch.Tensor, act: ActQuant | None) -> SharedActivation:
        """A SharedActivation of ``x`` (``source`` reshaped to [M, K]) holding the forms a sibling already
        computed from ``source`` in this parent call, if any; remembered for the next sibling otherwise."""
        shared = SharedActivation(x, act)
        if act is None or not self._depth or source.is_inference():
            return shared
        key = (source._version, act, tuple(x.shape), x.dtype, _stream_state(x))
        if self._entry is not None and self._entry[0] is source and self._entry[1] == key:
            shared.adopt(self._entry[2])
        else:
            self._entry = (source, key, shared)
        return shared


def _stream_state(x: torch.Tensor) -> tuple:
    """Where x's kernels would run now: forms made on another stream, or outside a CUDA graph capture that is now
    under way (or inside one now over), are not reused."""
    if not x.is_cuda:
        return ()
    with torch.cuda.device(x.device):
        return torch.cuda.current_stream().cuda_stream, torch.cuda.is_current_stream_capturing()


def share_sibling_inputs(model: nn.Module) -> int:
    """Give every module with >= 2 direct QuantLinear children that quantize activations a :class:`SiblingScope`
    (the children's ``sibling_scope``, opened and cleared by the parent's forward hooks). Returns how many parents
    got one; calling it again adds nothing."""
    from quantkit.runtime.quant_linear import QuantLinear

    added = 0
    for parent in model.modules():
        children = [c for c in parent.children() if isinstance(c, QuantLinear) and c.act is not None]
        if len(children) < 2 or any(c.sibling_scope is not None for c in children):
            continue
        scope = SiblingScope()
        parent.register_forward_pre_hook(scope.enter)
        parent.register_forward_hook(scope.leave, always_call=True)
        for c in children:
            c.sibling_scope = scope
        added += 1
    return added
