"""quantkit.runtime.decode_attention: grouped-query decode attention by KV head gives transformers' SDPA results,
with a static cache's mask and without, and leaves other attention implementations alone."""

from __future__ import annotations

import pytest
import torch

from quantkit.runtime.decode_attention import NAME, decode_sdpa, use_decode_attention
from quantkit.runtime.generate import Generator
from tests.conftest import build_tiny_model


@pytest.mark.parametrize("mask", ["none", "bool", "float", "per-head"])
def test_single_token_attention_by_kv_head_equals_sdpa_with_repeated_heads(mask):
    from transformers.integrations.sdpa_attention import repeat_kv

    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 8, 1, 16, generator=gen), torch.randn(3, 2, 9, 16, generator=gen), torch.randn(
        3, 2, 9, 16, generator=gen)
    module = torch.nn.Module()
    module.num_key_value_groups = 4
    keep = torch.rand(3, 8 if mask == "per-head" else 1, 1, 9, generator=gen) > 0.3
    keep[..., 0] = True
    m = {"none": None, "bool": keep, "per-head": keep,
         "float": torch.zeros(3, 1, 1, 9).masked_fill(~keep, float("-inf"))}[mask]
    got, _ = decode_sdpa(module, q, k, v, m, scaling=0.25)
    want = torch.nn.functional.scaled_dot_product_attention(q, repeat_kv(k, 4), repeat_kv(v, 4), attn_mask=m,
                                                            scale=0.25)
    torch.testing.assert_close(got, want.transpose(1, 2), rtol=1e-5, atol=1e-6)


def test_a_model_decodes_the_same_tokens_and_other_implementations_are_kept():
    model = build_tiny_model("llama", seed=5)
    ids = torch.randint(1, 500, (2, 11), generator=torch.Generator().manual_seed(3))
    want, _ = Generator(model, max_context=40).generate(ids, 12)
    assert use_decode_attention(model) and model.config._attn_implementation == NAME
    got, _ = Generator(model, max_context=40).generate(ids, 12)
    assert torch.equal(got, want)
    assert not use_decode_attention(model)  # already switched
    eager = build_tiny_model("llama", seed=5)
    eager.set_attn_implementation("eager")
    assert not use_decode_attention(eager) and eager.config._attn_implementation == "eager"
