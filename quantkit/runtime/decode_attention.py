"""Decode attention for grouped-query models inside a compiled decode step.

At one query token, the query heads that share a KV head can be the rows of one attention call over that KV head
(TurboMind's Q rearrangement): [B, Hq, 1, D] → [B, Hkv, Hq/Hkv, D], the KV cache read once. transformers does this
in eager decode but not while dynamo traces (its SDPA path then calls ``repeat_kv``, which copies every KV head once
per query head each step: on the 8B model at batch 1 and a 1K cache, 0.47 of a 2.92 ms step; docs/BENCHMARKS.md,
whole-model speed). :func:`decode_sdpa` is transformers' SDPA attention with that rearrangement at every single-token
step; anything else goes to transformers' own function unchanged.

On a GPU the single-token step is one call of :func:`quantkit.runtime.kernels.ops.decode_attention` instead
(:mod:`quantkit.runtime.kernels.triton.decode_attention`: the group's query heads as the rows of one tensor-core
tile, and the cache split across the GPU as flash-decoding does), where the mask is boolean and shared by the
heads and the tensors suit it (:func:`~quantkit.runtime.kernels.triton.decode_attention.decode_attention_problem`);
``QUANTKIT_KERNELS=0`` keeps SDPA.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

NAME = "quantkit_sdpa"


def decode_sdpa(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None, **kwargs):
    """transformers' attention-function signature: (output [B, T, Hq, D], None). A single-token query attends per
    KV head with its group's query heads as rows: the decode-attention kernel on a GPU, else one SDPA call
    (module docstring)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    rep = getattr(module, "num_key_value_groups", 1)
    b, hq, t, d = query.shape
    if t != 1 or any(kwargs.get(k) is not None for k in ("position_bias", "softcap", "s_aux")):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    kernel_mask = _kernel_mask(query, key, value, attention_mask, dropout)
    if kernel_mask is not False:
        from quantkit.runtime.kernels import ops

        scale = scaling if scaling is not None else d ** -0.5
        out = ops.decode_attention(query[:, :, 0, :], key, value, kernel_mask, float(scale))
        return out[:, None].contiguous(), None
    q = query.reshape(b, hq // rep, rep, d)
    mask = attention_mask
    if mask is not None and mask.shape[1] != 1:  # a per-head mask follows its heads
        mask = mask.reshape(mask.shape[0], hq // rep, rep, mask.shape[-1])
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
    return out.reshape(b, hq, 1, value.shape[-1]).transpose(1, 2).contiguous(), None


def _kernel_mask(query, key, value, attention_mask, dropout) -> torch.Tensor | None | bool:
    """The [B, L] boolean mask the decode-attention kernel takes for this call (None: no mask), or False where the
    kernel does not apply (not on a GPU, dropout, kernels switched off, a per-head or additive mask, or shapes
    the kernel refuses)."""
    from quantkit.runtime.dispatch import ENV_SWITCH

    if query.device.type != "cuda" or dropout or os.environ.get(ENV_SWITCH) == "0":
        return False
    from quantkit.runtime.kernels.triton.decode_attention import decode_attention_problem

    mask = attention_mask
    if mask is not None:
        if (mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[2] != 1
                or mask.shape[3] != key.shape[2]):
            return False
        mask = mask[:, 0, 0, :].expand(query.shape[0], key.shape[2])
    return False if decode_attention_problem(query[:, :, 0, :], key, value, mask) else mask


def use_decode_attention(model: torch.nn.Module) -> bool:
    """Switch a model that attends with transformers' SDPA to :func:`decode_sdpa` (same results; registered with
    transformers' attention and mask interfaces once). Returns whether it switched: other implementations (eager,
    flash, a quantized KV cache's) are left as they are."""
    from quantkit.model.attention import use_attention

    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    use_attention(model, NAME, decode_sdpa)
    return True
