"""Plugging an attention function of our own into a transformers model."""

from __future__ import annotations

from collections.abc import Callable

import torch


def use_attention(model: torch.nn.Module, name: str, fn: Callable) -> None:
    """Register ``fn`` (transformers' attention-function signature, masks as SDPA takes them) under ``name`` with
    transformers' attention and mask interfaces, and make it ``model``'s attention implementation."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(name, fn)
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, sdpa_mask)
    model.set_attn_implementation(name)
