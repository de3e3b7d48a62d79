"""Decode attention for grouped-query models inside a compiled decode step.

At one query token, the query heads that share a KV head can be the rows of one attention call over that KV head
(TurboMind's Q rearrangement): [B, Hq, 1, D] → [B, Hkv, Hq/Hkv, D], the KV cache read once. transformers does this
in eager decode but not while dynamo traces (its SDPA path then calls ``repeat_kv``, which copies every KV head once
per query head each step: on the 8B model at batch 1 and a 1K cache, 0.47 of a 2.92 ms step; docs/BENCHMARKS.md,
whole-model speed). :func:`decode_sdpa` is transformers' SDPA attention with that rearrangement at every single-token
step; anything else goes to transformers' own function unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NAME = "quantkit_sdpa"


def decode_sdpa(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None, **kwargs):
    """transformers' attention-function signature: (output [B, T, Hq, D], None). A single-token query of a
    grouped-query layer attends per KV head with its group's query heads as rows (module docstring)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    rep = getattr(module, "num_key_value_groups", 1)
    b, hq, t, d = query.shape
    if t != 1 or rep == 1 or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    q = query.reshape(b, hq // rep, rep, d)
    mask = attention_mask
    if mask is not None and mask.shape[1] != 1:  # a per-head mask follows its heads
        mask = mask.reshape(mask.shape[0], hq // rep, rep, mask.shape[-1])
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
    return out.reshape(b, hq, 1, value.shape[-1]).transpose(1, 2).contiguous(), None


def use_decode_attention(model: torch.nn.Module) -> bool:
    """Switch a model that attends with transformers' SDPA to :func:`decode_sdpa` (same results; registered with
    transformers' attention and mask interfaces once). Returns whether it switched: other implementations (eager,
    flash, a quantized KV cache's) are left as they are."""
    from quantkit.model.attention import use_attention

    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    use_attention(model, NAME, decode_sdpa)
    return True
