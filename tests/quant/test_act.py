"""Activation quantization (quantkit.quant.act): integer path vs a per-element loop, fake path vs integer path,
error bounds, shapes, and the forward pre-hooks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from conftest import build_tiny_model
from quantkit.errors import QuantkitError
from quantkit.quant import act
from test_grid import fp16_up

F32 = np.float32


def loop_int(x: np.ndarray, bits: int, group_size: int):
    """Per element: s = fp16_up(absmax / (2^(b-1)-1)) per row group, code = clamp(rint(x / s), ±(2^(b-1)-1))."""
    m, k = x.shape
    gs = k if group_size == -1 else group_size
    ng = -(-k // gs)
    half = 2 ** (bits - 1) - 1
    codes = np.zeros((m, k), np.int64)
    scales = np.zeros((m, ng), np.float32)
    for r in range(m):
        for g in range(ng):
            cols = range(g * gs, min((g + 1) * gs, k))
            amax = max(abs(F32(x[r, c])) for c in cols)
            s = fp16_up(max(max(amax, F32(1e-8)) / F32(half), F32(np.finfo(np.float16).tiny)))
            scales[r, g] = s
            for c in cols:
                codes[r, c] = min(max(int(np.rint(F32(x[r, c]) / s)), -half), half)
    return codes, scales


def activations(shape, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=gen)
    x[..., 5] *= 30  # an outlier hidden channel, as in LLM activations
    return x


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group_size", [128, 64, -1])
@pytest.mark.parametrize("shape", [(1, 200), (3, 5, 328), (7, 64)])
def test_int_path_matches_loop_and_fake_path(bits, group_size, shape):
    x = activations(shape, seed=bits + shape[-1])
    x.view(-1, shape[-1])[0] = 0.0  # an all-zero token
    codes, scales = act.quantize_activation_int(x, bits, group_size)
    k = shape[-1]
    ng = 1 if group_size == -1 else -(-k // group_size)
    assert codes.dtype == torch.int8 and codes.shape == x.shape
    assert scales.shape == (*shape[:-1], ng) and scales.dtype == torch.float32
    ref_codes, ref_scales = loop_int(x.reshape(-1, k).numpy(), bits, group_size)
    np.testing.assert_array_equal(codes.reshape(-1, k).numpy().astype(np.int64), ref_codes)
    np.testing.assert_array_equal(scales.reshape(-1, ng).numpy(), ref_scales)
    assert torch.equal(scales, scales.half().float())
    # the fake path is exactly codes · scales
    g = torch.arange(k) // (k if group_size == -1 else group_size)
    fq = act.quantize_activation(x, bits, group_size)
    assert fq.shape == x.shape and fq.dtype == x.dtype
    assert torch.equal(fq, codes.float() * scales[..., g])
    # round-trip error within half a step, and zero tokens stay exactly zero
    assert bool(((fq - x).abs() <= scales[..., g] * (0.5 + 1e-6)).all())
    assert torch.equal(fq.reshape(-1, k)[0], torch.zeros(k))


def test_group_wise_beats_per_token_with_outlier_channels():
    x = activations((64, 512), seed=3)
    e_tok = float((act.quantize_activation(x, 8, -1) - x).pow(2).mean())
    e_grp = float((act.quantize_activation(x, 8, 128) - x).pow(2).mean())
    assert e_grp < 0.5 * e_tok, (e_grp, e_tok)


def test_half_dtypes_and_asym():
    x = activations((3, 200), seed=4)
    for dt in (torch.float16, torch.bfloat16):
        xd = x.to(dt)
        fq = act.quantize_activation(xd, 8, 128)
        assert fq.dtype == dt
        codes, scales = act.quantize_activation_int(xd, 8, 128)
        g = torch.arange(200) // 128
        assert torch.equal(fq, (codes.float() * scales[..., g]).to(dt))
    fa = act.quantize_activation(x.abs(), 4, 64, sym=False)  # asym uses all 16 levels on one-sided inputs
    fs = act.quantize_activation(x.abs(), 4, 64, sym=True)
    assert float((fa - x.abs()).pow(2).mean()) < float((fs - x.abs()).pow(2).mean())


def test_bad_options():
    x = torch.randn(2, 64)
    with pytest.raises(QuantkitError, match="bits"):
        act.quantize_activation(x, 9)
    with pytest.raises(QuantkitError, match="group size"):
        act.quantize_activation_int(x, 8, 0)
    with pytest.raises(QuantkitError, match="no linear"):
        act.attach_act_quant({})


def test_hooks_on_a_linear_and_removal():
    torch.manual_seed(0)
    lin = nn.Linear(200, 7)
    x = activations((3, 5, 200), seed=5)
    plain = lin(x)
    handles = act.attach_act_quant({"proj": lin}, bits=4, group_size=64)
    hooked = lin(x)
    assert torch.equal(hooked, nn.functional.linear(act.quantize_activation(x, 4, 64), lin.weight, lin.bias))
    assert not torch.equal(hooked, plain)
    act.remove_hooks(handles)
    assert torch.equal(lin(x), plain)
    act.remove_hooks(handles)  # removing twice is harmless


def test_hooks_on_a_tiny_model():
    model = build_tiny_model("llama", seed=0)
    ids = torch.randint(0, model.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(ids).logits
        handles = act.attach_act_quant(model, bits=8, group_size=128)
        n_linears = sum(1 for n, m in model.named_modules() if isinstance(m, nn.Linear) and "lm_head" not in n)
        assert len(handles) == n_linears
        q8 = model(ids).logits
        act.remove_hooks(handles)
        handles = act.attach_act_quant(model, bits=4, group_size=128)
        q4 = model(ids).logits
        act.remove_hooks(handles)
        back = model(ids).logits
    assert torch.equal(back, ref)
    d8 = float((q8 - ref).abs().max())
    d4 = float((q4 - ref).abs().max())
    assert 0 < d8 < d4
