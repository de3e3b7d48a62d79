"""quantkit.quant.grid against a plain per-element loop (numpy float32 scalars, so the reference does the same
IEEE float32 arithmetic one element at a time) — codes, zeros and scales must match bit-exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quantkit.quant import grid
from quantkit.quant.records import QuantizedWeight

F32 = np.float32
SHAPES = [(7, 200), (1, 328), (33, 64), (5, 100)]


def fp16_up(x: np.float32) -> np.float32:
    """Smallest fp16 value >= x, as float32."""
    h = np.float16(x)
    if F32(h) < x:
        h = np.nextafter(h, np.float16(np.inf))
    return F32(h)


def loop_quantize(w: np.ndarray, bits: int, group_size: int, sym: bool, clip: np.ndarray):
    """One group, one element at a time: range (asym: extended to contain 0), shrink by clip, fp16 scale rounded
    up, integer zero, codes = clamp(rint(w/s) + z)."""
    n, k = w.shape
    gs = k if group_size == -1 else group_size
    ng = -(-k // gs)
    maxq = 2 ** bits - 1
    codes = np.zeros((n, k), dtype=np.int64)
    scales = np.zeros((n, ng), dtype=np.float32)
    zeros = np.zeros((n, ng), dtype=np.int64)
    for r in range(n):
        for g in range(ng):
            cols = range(g * gs, min((g + 1) * gs, k))
            vals = [F32(w[r, c]) for c in cols]
            c_ = F32(clip[r, g])
            if sym:
                amax = max(abs(v) for v in vals)
                raw = max(F32(amax * c_), F32(1e-8)) / F32(2 ** (bits - 1) - 1)
            else:
                lo = F32(min(min(vals), F32(0)) * c_)
                hi = F32(max(max(vals), F32(0)) * c_)
                raw = max(F32(hi - lo), F32(1e-8)) / F32(maxq)
            raw = min(max(F32(raw), F32(np.finfo(np.float16).tiny)), F32(np.finfo(np.float16).max))
            s = fp16_up(raw)
            z = 2 ** (bits - 1) if sym else min(max(int(np.rint(F32(-lo) / s)), 0), maxq)
            scales[r, g] = s
            zeros[r, g] = z
            for c in cols:
                codes[r, c] = min(max(int(np.rint(F32(w[r, c]) / s)) + z, 1 if sym else 0), maxq)
    return codes, scales, zeros


def loop_dequantize(codes, scales, zeros, g_idx):
    n, k = codes.shape
    out = np.zeros((n, k), dtype=np.float32)
    for r in range(n):
        for c in range(k):
            g = g_idx[c]
            out[r, c] = F32(F32(codes[r, c] - zeros[r, g]) * scales[r, g])
    return out


def random_weight(n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    # rows with very different magnitudes, a few outliers, one all-positive row when n > 2
    w = torch.randn(n, k, generator=gen) * torch.rand(n, 1, generator=gen).mul(3).add(0.01)
    w[:, torch.randint(0, k, (3,), generator=gen)] *= 8
    if n > 2:
        w[1] = w[1].abs() + 0.1
    return w


@pytest.mark.parametrize("bits", range(2, 9))
@pytest.mark.parametrize("sym", [False, True])
@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
def test_matches_loop_reference(bits, sym, group_size):
    gen = torch.Generator().manual_seed(1000 * bits + 10 * group_size + sym)
    for i, (n, k) in enumerate(SHAPES):
        w = random_weight(n, k, gen)
        ng = grid.num_groups(k, group_size)
        # every other shape uses a per-group clip tensor (as the clipping search produces)
        clip = torch.rand(n, ng, generator=gen) * 0.5 + 0.5 if i % 2 else torch.ones(n, ng)
        qw = grid.quantize(w, bits, group_size, sym, clip=clip if i % 2 else 1.0)
        codes, scales, zeros = loop_quantize(w.numpy(), bits, group_size, sym, clip.numpy())
        assert qw.codes.dtype == torch.uint8 and qw.zeros.dtype == torch.uint8
        assert qw.codes.shape == (n, k) and qw.scales.shape == (n, ng) == qw.zeros.shape
        np.testing.assert_array_equal(qw.scales.numpy(), scales)
        np.testing.assert_array_equal(qw.zeros.numpy().astype(np.int64), zeros)
        np.testing.assert_array_equal(qw.codes.numpy().astype(np.int64), codes)
        g_idx = qw.group_index().numpy()
        np.testing.assert_array_equal(grid.dequantize(qw).numpy(), loop_dequantize(codes, scales, zeros, g_idx))


@pytest.mark.parametrize("bits", range(2, 9))
@pytest.mark.parametrize("sym", [False, True])
def test_codes_in_range_scales_fp16_and_error_within_half_step(bits, sym):
    gen = torch.Generator().manual_seed(bits * 7 + sym)
    maxq = 2 ** bits - 1
    for n, k in SHAPES:
        for group_size in (32, 128, -1):
            w = random_weight(n, k, gen)
            ng = grid.num_groups(k, group_size)
            clip = torch.rand(n, ng, generator=gen) * 0.4 + 0.6
            qw = grid.quantize(w, bits, group_size, sym, clip=clip)
            assert int(qw.codes.max()) <= maxq
            if sym:
                assert int(qw.codes.min()) >= 1
                assert bool((qw.zeros == 2 ** (bits - 1)).all())
            else:
                assert int(qw.zeros.max()) <= maxq
            assert torch.equal(qw.scales, qw.scales.half().float())
            assert bool((qw.scales > 0).all())
            g = qw.group_index()
            s = qw.scales[:, g]
            err = (grid.dequantize(qw) - w).abs()
            # the clipped range of every element's group
            wg = [w[:, g == j] for j in range(ng)]
            if sym:
                hi = torch.stack([x.abs().amax(1) for x in wg], 1) * clip
                lo = -hi
            else:
                lo = torch.stack([x.amin(1).clamp(max=0) for x in wg], 1) * clip
                hi = torch.stack([x.amax(1).clamp(min=0) for x in wg], 1) * clip
            inside = (w >= lo[:, g]) & (w <= hi[:, g])
            assert bool(inside.any())
            assert bool((err[inside] <= s[inside] * (0.5 + 1e-5)).all()), float((err / s)[inside].max())
            # outside the clipped range values saturate: at the lowest code below it, within one step of the
            # top code above it (the rounded-up scale may leave the top code slightly beyond the range)
            above = ~inside & (w > 0)
            below = ~inside & (w < 0)
            assert bool((qw.codes[above] >= maxq - 1).all())
            assert bool((qw.codes[below] <= (1 if sym else 0)).all())


def test_zero_rows_and_constant_rows():
    w = torch.zeros(3, 200)
    w[1] = 0.25  # constant positive row: the asym range is extended to contain 0
    w[2] = -3.0
    for sym in (False, True):
        for bits in (2, 4, 8):
            qw = grid.quantize(w, bits, 64, sym)
            d = grid.dequantize(qw)
            assert torch.equal(d[0], torch.zeros(200))
            s = qw.scales[:, qw.group_index()]
            assert bool(((d - w).abs() <= s * 0.5).all())


def test_per_channel_equals_one_group_of_k_and_scalar_clip_equals_tensor():
    gen = torch.Generator().manual_seed(3)
    w = random_weight(9, 200, gen)
    a = grid.quantize(w, 4, -1, False, clip=0.8)
    b = grid.quantize(w, 4, 200, False, clip=torch.full((9, 1), 0.8))
    assert torch.equal(a.codes, b.codes) and torch.equal(a.scales, b.scales) and torch.equal(a.zeros, b.zeros)
    assert torch.equal(grid.dequantize(a), grid.dequantize(b))
    assert a.group_size == -1 and a.scales.shape == (9, 1)


def test_group_larger_than_k_and_half_inputs():
    gen = torch.Generator().manual_seed(4)
    w = random_weight(5, 100, gen)
    qw = grid.quantize(w, 4, 128, False)
    assert qw.scales.shape == (5, 1)
    assert torch.equal(qw.codes, grid.quantize(w, 4, -1, False).codes)
    # half/bf16 inputs are quantized from their exact float32 value; fake_quantize returns the input dtype
    for dt in (torch.float16, torch.bfloat16):
        wd = w.to(dt)
        fq = grid.fake_quantize(wd, 4, 32, True)
        assert fq.dtype == dt
        assert torch.equal(fq, grid.dequantize(grid.quantize(wd.float(), 4, 32, True), dt))


def test_dequantize_with_explicit_g_idx():
    gen = torch.Generator().manual_seed(5)
    n, k, ng = 4, 96, 3
    codes = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    scales = torch.rand(n, ng, generator=gen).half().float() + 0.01
    zeros = torch.randint(0, 16, (n, ng), generator=gen, dtype=torch.uint8)
    g_idx = torch.randint(0, ng, (k,), generator=gen, dtype=torch.int32)
    qw = QuantizedWeight(codes=codes, scales=scales, zeros=zeros, bits=4, group_size=32, sym=False, g_idx=g_idx)
    ref = loop_dequantize(codes.numpy().astype(np.int64), scales.numpy(), zeros.numpy().astype(np.int64),
                          g_idx.numpy())
    np.testing.assert_array_equal(grid.dequantize(qw).numpy(), ref)


def test_rejects_bad_bits_and_shapes():
    w = torch.randn(4, 64)
    for bits in (1, 9):
        with pytest.raises(ValueError, match="bits"):
            grid.quantize(w, bits, 32, False)
    with pytest.raises(ValueError, match="2-D"):
        grid.quantize(torch.randn(2, 3, 4), 4, 32, False)
