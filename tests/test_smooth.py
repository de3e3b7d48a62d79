"""SmoothQuant folds (quantkit.quant.smooth): the smoothed model computes the same function, the factors follow
Eq. 4 with grouped-query attention, per-token A8 loses less after smoothing, and recipes wire it in."""

from __future__ import annotations

import pytest
import torch

from quantkit.errors import QuantkitError
from quantkit.model import find_decoder_layers
from quantkit.model.layerwise import LayerBatch, capture_layer_inputs, layer_output
from quantkit.quant.act import attach_act_quant, remove_hooks
from quantkit.quant.smooth import input_absmax, smooth_layer, smooth_pairs, smoothing_scales
from tests.layerquant_helpers import correlated_tiny_model, token_ids


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def _smoothed(arch, alpha=0.5, seed=0):
    model = correlated_tiny_model(arch, seed=seed)
    ids = token_ids(model, 4, 32, seed=1)
    before = _logits(model, ids)
    smoothed = correlated_tiny_model(arch, seed=seed)
    _, layers = find_decoder_layers(smoothed)
    batches = capture_layer_inputs(smoothed, ids, "cpu", 2)
    for layer in layers:
        smooth_layer(layer, batches, alpha)
        batches = [LayerBatch(layer_output(layer, b), b.kwargs) for b in batches]
    return model, smoothed, ids, before


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_smoothing_keeps_the_function(arch):
    _, smoothed, ids, before = _smoothed(arch)
    torch.testing.assert_close(_logits(smoothed, ids), before, rtol=1e-4, atol=1e-4)


def test_scales_follow_eq4_and_share_kv_heads():
    model = correlated_tiny_model("llama")
    layer = find_decoder_layers(model)[1][0]
    ids = token_ids(model, 2, 16, seed=3)
    batches = capture_layer_inputs(model, ids, "cpu", 2)
    pairs = smooth_pairs(layer)
    assert [p.name for p in pairs] == ["input_layernorm", "post_attention_layernorm", "v_proj", "up_proj"]
    o = pairs[2]
    assert (o.rep, o.head) == (2, 16)  # 4 query heads over 2 KV heads, head size 64 / 4
    x = torch.tensor([4.0, 1.0, 0.0])
    w = [torch.tensor([[1.0, 4.0, 2.0]]), torch.tensor([[-2.0, 1.0, 0.5]])]
    s = smoothing_scales(x, w, 0.5)
    torch.testing.assert_close(s, torch.tensor([2.0 / 2 ** 0.5, 1.0 / 2.0, 1e-5 ** 0.5 / 2 ** 0.5]))
    v_before = layer.self_attn.v_proj.weight.clone()
    xa = input_absmax(layer, batches, pairs)[2]
    smooth_layer(layer, batches, 0.5)
    ratio = (v_before / layer.self_attn.v_proj.weight)[:, 0]  # s per KV channel (v's output rows)
    # the KV channel's factor uses the largest activation of the query heads that read it
    xq = xa.view(2, 2, 16).amax(dim=1).reshape(-1)
    assert float(xq[0]) == pytest.approx(max(float(xa[0]), float(xa[16])))
    assert ratio.numel() == 32 and bool(torch.isfinite(ratio).all())


def test_smoothing_cuts_the_per_token_a8_error():
    model, smoothed, ids, before = _smoothed("llama", seed=2)

    def a8_error(m):
        hooks = attach_act_quant(m, 8, -1, True)
        try:
            return float((_logits(m, ids) - before).pow(2).mean())
        finally:
            remove_hooks(hooks)

    assert a8_error(smoothed) < 0.7 * a8_error(model)


def test_recipe_field_and_errors():
    from quantkit.quant.recipe import parse_recipe

    r = parse_recipe({"weight": {"method": "rtn", "bits": 8, "sym": True},
                      "activation": {"bits": 8, "group_size": -1, "smooth": 0.5}})
    assert r.activation.smooth == 0.5 and r.uses_calibration
    with pytest.raises(QuantkitError, match=r"alpha in \[0, 1\]"):
        parse_recipe({"weight": {"method": "rtn"}, "activation": {"bits": 8, "smooth": 1.5}})
    with pytest.raises(QuantkitError, match="needs quantized activations"):
        parse_recipe({"weight": {"method": "rtn"}, "activation": {"smooth": 0.5}})
    with pytest.raises(QuantkitError, match="alpha must be in"):
        model = correlated_tiny_model("llama")
        smooth_layer(find_decoder_layers(model)[1][0], [], 2.0)
