"""SmoothQuant folds (quantkit.quant.smooth): the smoothed model computes the same function, the factors follow
Eq. 4 with grouped-query attention, per-token A8 loses less after smoothing, and recipes wire it in."""

from __future__ import annotations

import pytest
import torch

from quantkit.errors import QuantkitError
from quantkit.model import find_decoder_layers
from quantkit.model.layerwise import LayerBatch, capture_layer_inputs, layer_output
from quantkit.quant.act import attach_act_quant, remove_hooks
from quantkit.quant.smooth import ALPHA_GRID, input_absmax, smooth_layer, smooth_pairs, smoothing_scales
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


def _a8_fakes():
    from quantkit.quant.act import quantize_activation
    from quantkit.quant.grid import dequantize, quantize

    return (lambda lin, w: dequantize(quantize(w, 8, -1, True), torch.float32),
            lambda x: quantize_activation(x, 8, -1, True))


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_searched_alpha_keeps_the_function_and_picks_per_fold(arch):
    model = correlated_tiny_model(arch, seed=4)
    ids = token_ids(model, 4, 32, seed=1)
    before = _logits(model, ids)
    _, layers = find_decoder_layers(model)
    batches = capture_layer_inputs(model, ids, "cpu", 2)
    chosen = []
    for layer in layers:
        chosen.append(smooth_layer(layer, batches, "auto", *_a8_fakes()))
        batches = [LayerBatch(layer_output(layer, b), b.kwargs) for b in batches]
    torch.testing.assert_close(_logits(model, ids), before, rtol=1e-4, atol=1e-4)
    for per_fold in chosen:
        assert set(per_fold) == {"input_layernorm", "post_attention_layernorm", "v_proj", "up_proj"}
        assert all(a is None or a in ALPHA_GRID for a in per_fold.values())


def test_search_alpha_smooths_an_outlier_channel_and_leaves_flat_inputs():
    from quantkit.quant.smooth import SmoothPair, search_alpha

    g = torch.Generator().manual_seed(0)
    lin = torch.nn.Linear(256, 64, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(64, 256, generator=g) * 0.05)
    pair = SmoothPair("test", torch.nn.Identity(), [lin])
    fake_w, fake_a = _a8_fakes()
    x = torch.randn(512, 256, generator=g)
    x[:, 7] *= 300.0  # one massive channel makes every token's 8-bit scale coarse
    weights = [lin.weight]
    a = search_alpha(pair, x, x.abs().amax(0), weights, fake_w, fake_a)
    assert a is not None and a > 0

    def err(alpha):
        s = torch.ones(256) if alpha is None else smoothing_scales(x.abs().amax(0), weights, alpha)
        with torch.no_grad():
            y = fake_a(x / s) @ fake_w(lin, lin.weight * s).T
            return float((y - x @ lin.weight.T).square().sum())

    assert err(a) <= min(err(None), err(0.5))
    assert err(a) < 0.25 * err(None)


def test_auto_alpha_needs_the_quantizers_and_parses():
    from quantkit.quant.recipe import parse_recipe

    r = parse_recipe({"weight": {"method": "rtn", "bits": 8, "sym": True},
                      "activation": {"bits": 8, "group_size": -1, "smooth": "auto"}})
    assert r.activation.smooth == "auto"
    with pytest.raises(QuantkitError, match="or 'auto'"):
        parse_recipe({"weight": {"method": "rtn"}, "activation": {"bits": 8, "smooth": "best"}})
    model = correlated_tiny_model("llama")
    with pytest.raises(ValueError, match="fake_weight and fake_act"):
        smooth_layer(find_decoder_layers(model)[1][0], [], "auto")
