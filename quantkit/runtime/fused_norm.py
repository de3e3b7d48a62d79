"""The RMSNorms in front of the fused projections run as one kernel that also quantizes their output for them.

A decoder layer's ``input_layernorm`` feeds q/k/v and its ``post_attention_layernorm`` feeds gate/up. transformers
computes RMSNorm in eight torch operations (a kernel each in eager mode), and an A8 checkpoint then quantizes the
result in one more (MixLLM Sec. 3.1.2); :mod:`quantkit.runtime.kernels.triton.rms_norm` does both in one pass per
token. At load each such norm becomes a :class:`FusedRMSNorm`: the same ``weight`` and ``variance_epsilon`` (same
``state_dict`` keys), on a device with the kernel that kernel, elsewhere the original class's own forward (so CPU
results are transformers' to the bit). Its output carries the codes and scales it made (:data:`A8_ATTR`); the first
QuantLinear reading that very tensor, unchanged, with the same activation quantization, on the same stream and in
the same CUDA-graph capture state, takes them instead of quantizing again
(:func:`quantkit.runtime.norm_codes.adopt_norm_codes`) and removes
them from the tensor (siblings that are not fused get them through their :mod:`~quantkit.runtime.sibling_inputs`
scope), so they live no longer than a quantization of that input would. "Unchanged" is the version counter; an
inference-mode tensor has none, so a write between the norm and its consumer that bypasses the counter (``.data``,
raw pointers, in-place under inference mode) would go unseen — which is why a norm with forward hooks (that could
change its output in place) attaches nothing; pre-hooks on the consumers could do the same and are not checked. In
grad mode, or where no kernel is registered, transformers' forward runs.

The FP16 layer of ``quantkit bench PACKED --decode-step`` keeps these norms (without the quantization): only the
linears differ between the two layers it times.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from quantkit.runtime.dispatch import ActQuant, norm_kernel_for
from quantkit.runtime.fused_siblings import SIBLING_SETS, SiblingSlice
from quantkit.runtime.norm_codes import A8_ATTR, output_state
from quantkit.runtime.quant_linear import QuantLinear

ENV_SWITCH = "QUANTKIT_FUSE_NORM"  # "0": load_packed keeps transformers' norms (QUANTKIT_FUSE=0 does too)
# norm → the block it feeds, in the decoder layers of the supported architectures (llama, mistral, qwen2, qwen3)
NORM_FEEDS = {"input_layernorm": "self_attn", "post_attention_layernorm": "mlp"}


class FusedRMSNorm(nn.Module):
    """An RMSNorm run by the registered norm kernel where there is one, quantizing its output for ``act``
    (module docstring); the original class's forward elsewhere."""

    def __init__(self, norm: nn.Module, act: ActQuant | None):
        super().__init__()
        self.weight = norm.weight
        self.variance_epsilon = float(norm.variance_epsilon)
        self.base = type(norm)  # its forward reads only weight and variance_epsilon
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """RMSNorm(x) · weight; on the kernel, with the A8 form of the result attached for its consumers."""
        fn = norm_kernel_for(x.device)
        k = self.weight.shape[0]
        if (fn is None or x.dtype != self.weight.dtype or x.shape[-1] != k or torch.is_grad_enabled()
                or torch.compiler.is_compiling()):
            # grad mode: the kernel has no backward; torch.compile: the norm compiles, its consumers quantize
            return self.base.forward(self, x)
        hooked = bool(self._forward_hooks or self._forward_hooks_with_kwargs or nn.modules.module._global_forward_hooks)
        y, codes, scales = fn(x.reshape(-1, k).contiguous(), self.weight, self.variance_epsilon,
                              None if hooked else self.act)
        y = y.view(x.shape)
        if codes is not None:
            setattr(y, A8_ATTR, (self.act, output_state(y), codes, scales))
        return y

    def extra_repr(self) -> str:
        act = f", quantizes for A{self.act.bits}" if self.act else ""
        return f"{self.base.__name__}({self.weight.shape[0]}, eps={self.variance_epsilon}){act}"


def _consumer_act(block: nn.Module) -> ActQuant | None:
    """The activation quantization of the quantized projections reading a block's input (q/k/v or gate/up, fused
    or not), if they all share one; else None (the norm then only normalizes)."""
    acts = []
    for name in {n for s in SIBLING_SETS for n in s}:
        mod = getattr(block, name, None)
        if isinstance(mod, SiblingSlice):
            acts.append(mod.group.linear.act)
        elif isinstance(mod, QuantLinear):
            acts.append(mod.act)
    return acts[0] if acts and all(a == acts[0] for a in acts) else None


def fuse_norms(model: nn.Module) -> int:
    """Replace each RMSNorm of :data:`NORM_FEEDS` (a module with a ``weight`` and ``variance_epsilon`` whose
    class name ends in RMSNorm, beside the block it feeds) by a :class:`FusedRMSNorm` quantizing for that block's
    projections. Returns how many were replaced; a second call replaces none."""
    replaced = 0
    for layer in list(model.modules()):
        for norm_name, block_name in NORM_FEEDS.items():
            norm, block = getattr(layer, norm_name, None), getattr(layer, block_name, None)
            if (norm is None or block is None or isinstance(norm, FusedRMSNorm)
                    or not type(norm).__name__.endswith("RMSNorm") or not hasattr(norm, "variance_epsilon")
                    or not isinstance(getattr(norm, "weight", None), torch.Tensor)):
                continue
            setattr(layer, norm_name, FusedRMSNorm(norm, _consumer_act(block)))
            replaced += 1
    return replaced
