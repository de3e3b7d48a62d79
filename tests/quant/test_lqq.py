"""LiquidQuant (quantkit.quant.lqq): exhaustive no-overflow proof of LiquidGEMM Eq. 11-12, bit-exact comparison
with a per-element loop, and accuracy next to plain 4-bit asym g128."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from quantkit.quant import grid, lqq
from test_grid import fp16_up

F32 = np.float32


def all_minmax_rows() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One row per (min, max) with -119 <= min <= max <= 119, holding every integer in [min, max] (239 columns,
    the row max repeated as padding): every Q_u8 value, hence every Q_u4 code, that a group can produce."""
    v = torch.arange(-119, 120)
    mn, mx = torch.meshgrid(v, v, indexing="ij")
    keep = mn <= mx
    mn, mx = mn[keep], mx[keep]
    rows = torch.minimum(mn.unsqueeze(1) + torch.arange(239).unsqueeze(0), mx.unsqueeze(1))
    return rows, mn, mx


def test_exhaustive_no_wraparound_eq11_eq12():
    rows, mn, mx = all_minmax_rows()
    assert rows.shape == (239 * 240 // 2, 239)
    qw = lqq.lqq_from_int8(rows.to(torch.int16), torch.ones(rows.shape[0]), group_size=-1)
    s = qw.scales[:, 0].long()
    a = qw.zeros[:, 0].long()
    codes = qw.codes.long()
    assert torch.equal(qw.scales, qw.scales.round())
    assert int(s.min()) >= 1 and int(s.max()) == 16
    assert torch.equal(a, 128 + mn)  # Eq. 10
    assert int(codes.max()) == 15
    prod = codes * s.unsqueeze(1)
    assert int(prod.max()) <= 240  # the UINT8 multiply of Eq. 11
    pre_xor = prod + a.unsqueeze(1)
    assert int(pre_xor.max()) <= 255 and int(pre_xor.min()) >= 0  # Eq. 11: never leaves UINT8 before the XOR
    assert int(pre_xor.max()) == 255  # the bound is tight (e.g. min -113, max 119: 15·16 + 15), so it is exercised
    expected = prod + mn.unsqueeze(1)  # Eq. 8 in unbounded integers
    got = lqq.lqq_int8_codes(qw).long()  # Eq. 12 in uint8 lanes
    assert torch.equal(got, expected)
    # and the recovered INT8 value is the nearest multiple: within s_u8 / 2 of Q_i8, no code clamped
    assert bool(((2 * (got - rows)).abs() <= s.unsqueeze(1)).all())
    # every code 0..15 occurs with the largest scale s = 16
    assert set(codes[s == 16].unique().tolist()) == set(range(16))


def loop_lqq(w: np.ndarray, group_size: int):
    """Per-element LQQ in Python ints: s_c = fp16_up(absmax / 119), Q_i8 = rint(w / s_c); per group
    s = max(1, ceil(range / 15)), code = floor(Q_u8 / s + 1/2), a = 128 + min."""
    n, k = w.shape
    gs = k if group_size == -1 else group_size
    ng = -(-k // gs)
    codes = np.zeros((n, k), np.int64)
    s_u8 = np.zeros((n, ng), np.int64)
    a = np.zeros((n, ng), np.int64)
    s_c = np.zeros(n, np.float32)
    deq = np.zeros((n, k), np.float32)
    for r in range(n):
        amax = max(abs(F32(v)) for v in w[r])
        s_c[r] = fp16_up(max(F32(amax / F32(119)), F32(np.finfo(np.float16).tiny)))
        q = [min(max(int(np.rint(F32(v) / s_c[r])), -119), 119) for v in w[r]]
        for g in range(ng):
            cols = range(g * gs, min((g + 1) * gs, k))
            lo, hi = min(q[c] for c in cols), max(q[c] for c in cols)
            s = max(1, math.ceil((hi - lo) / 15))
            s_u8[r, g], a[r, g] = s, 128 + lo
            for c in cols:
                codes[r, c] = math.floor((q[c] - lo) / s + 0.5)
                deq[r, c] = F32(F32(codes[r, c] * s + lo) * s_c[r])
    return codes, s_u8, a, s_c, deq


@pytest.mark.parametrize("shape,group_size", [((7, 200), 128), ((1, 328), -1), ((33, 64), 32), ((5, 328), 128),
                                              ((4, 100), 128)])
def test_matches_loop_reference(shape, group_size):
    gen = torch.Generator().manual_seed(shape[0] * 1000 + shape[1])
    w = torch.randn(*shape, generator=gen) * torch.rand(shape[0], 1, generator=gen).add(0.01)
    w[0, 3] *= 10  # an outlier stretches one channel's INT8 scale
    if shape[0] > 2:
        w[1] = w[1].abs()  # an all-positive channel: its groups have min(Q_i8) > 0
        w[2] = 0.0
    qw = lqq.lqq_quantize(w, group_size)
    codes, s_u8, a, s_c, deq = loop_lqq(w.numpy(), group_size)
    assert qw.codes.dtype == torch.uint8 and qw.zeros.dtype == torch.uint8
    assert qw.bits == 4 and qw.group_size == group_size and qw.meta == {"method": "lqq"}
    np.testing.assert_array_equal(qw.codes.numpy().astype(np.int64), codes)
    np.testing.assert_array_equal(qw.scales.numpy(), s_u8.astype(np.float32))
    np.testing.assert_array_equal(qw.zeros.numpy().astype(np.int64), a)
    np.testing.assert_array_equal(qw.channel_scales.numpy(), s_c)
    np.testing.assert_array_equal(lqq.dequantize_lqq(qw).numpy(), deq)
    # grid.dequantize dispatches two-level weights here; the dtype is honoured
    assert torch.equal(grid.dequantize(qw), lqq.dequantize_lqq(qw))
    assert grid.dequantize(qw, torch.float16).dtype == torch.float16


def test_first_level_range_and_scale():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(9, 200, generator=gen) * 3
    q, s_c = lqq.lqq_first_level(w)
    assert int(q.abs().max(dim=1).values.min()) == 119  # every channel reaches the protective bound, not beyond
    assert torch.equal(s_c, s_c.half().float()) and bool((s_c * 119 >= w.abs().amax(1)).all())
    with pytest.raises(ValueError, match="119"):
        lqq.lqq_from_int8(torch.full((2, 8), 120, dtype=torch.int16), torch.ones(2))
    with pytest.raises(ValueError, match="LiquidQuant"):
        lqq.lqq_int8_codes(grid.quantize(w, 4, 128, False))


def test_error_close_to_plain_4bit_asym_g128():
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(256, 1024, generator=gen) * torch.rand(256, 1, generator=gen).add(0.05)
    e_lqq = float((lqq.dequantize_lqq(lqq.lqq_quantize(w, 128)) - w).pow(2).mean())
    e_rtn = float((grid.dequantize(grid.quantize(w, 4, 128, False)) - w).pow(2).mean())
    print(f"MSE lqq g128 {e_lqq:.4e}  rtn 4-bit asym g128 {e_rtn:.4e}  ratio {e_lqq / e_rtn:.3f}")
    assert e_lqq < 1.25 * e_rtn


def _plain_fit(x: list[float], ratio: float, minus: int) -> tuple[int, int, int, list[int]]:
    """lqq_fit_groups + lqq_codes for one group, element by element in float32 (module docstring's rule)."""
    lo = F32(min(min(x), 0.0)) * F32(ratio)
    hi = F32(max(max(x), 0.0)) * F32(ratio)
    m = int(min(max(np.round(lo), -119), 119))
    s = int(min(max(math.ceil(F32(F32(hi) - F32(m)) / F32(15)) - minus, 1), 16))
    q_max = min(15, (127 - m) // s)
    codes = [int(min(max(np.round(F32(F32(v) - F32(m)) / F32(s)), 0), q_max)) for v in x]
    return m, s, q_max, codes


@pytest.mark.parametrize("ratio,minus", [(1.0, 0), (1.0, 1), (0.79, 0), (0.7, 1)])
def test_fit_groups_matches_plain_loop(ratio, minus):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(9, 37, generator=g) * 40).clamp(-119, 119)
    x[0] = x[0].abs()  # a group with no negative value: m = 0
    m, s, q_max = lqq.lqq_fit_groups(x, ratio, minus)
    q = lqq.lqq_codes(x, m, s, q_max)
    for r in range(x.shape[0]):
        pm, ps, pq, pc = _plain_fit(x[r].tolist(), ratio, minus)
        assert (int(m[r]), int(s[r]), int(q_max[r])) == (pm, ps, pq)
        assert q[r].long().tolist() == pc


@pytest.mark.parametrize("n,k,group_size", [(1, 128, 128), (7, 300, 128), (33, 256, 64), (5, 96, -1),
                                            (3, 640, 256)])
@pytest.mark.parametrize("with_inputs", [False, True])
def test_search_stays_in_the_kernel_format(n, k, group_size, with_inputs):
    """Every searched group keeps Q_u4·s_u8 + a <= 255 and s_u8 in 1..16, the packer accepts and round-trips it
    bit for bit, and its error is no larger than the paper's rule (the rule's candidate is in the search)."""
    from quantkit.formats import w4a8_lqq

    g = torch.Generator().manual_seed(n * k)
    w = torch.randn(n, k, generator=g) * 0.02
    w[:, 3] *= 25  # an input column with outlier weights
    x = torch.randn(64, k, generator=g) if with_inputs else None
    qw = lqq.lqq_search(w, group_size, inputs=x)
    gi = qw.group_index()
    lane = qw.codes.long() * qw.scales.long()[:, gi] + qw.zeros.long()[:, gi]
    assert int(lane.max()) <= 255 and int(qw.codes.max()) <= 15
    assert torch.equal(qw.scales, qw.scales.round()) and 1 <= float(qw.scales.min()) <= float(qw.scales.max()) <= 16
    if group_size % 128 == 0:  # the kernels' groups
        assert w4a8_lqq.supports(qw) is None
        back = w4a8_lqq.unpack(w4a8_lqq.pack(qw), w4a8_lqq.layout_meta(qw))
        assert torch.equal(grid.dequantize(back), grid.dequantize(qw))
    d_search = w - grid.dequantize(qw)
    d_rule = w - grid.dequantize(lqq.lqq_quantize(w, group_size))
    if with_inputs:
        assert float((d_search @ x.T).pow(2).sum()) <= float((d_rule @ x.T).pow(2).sum()) * 1.0001
    else:
        assert float(d_search.pow(2).sum()) <= float(d_rule.pow(2).sum()) * 1.0001


def test_search_picks_the_best_candidate():
    """Brute force over the same candidates, one group at a time: the search keeps the lowest-error one."""
    g = torch.Generator().manual_seed(11)
    w = torch.randn(4, 64, generator=g) * 0.05
    w[1, 7] = 0.9  # saturates under a first-level shrink
    qw = lqq.lqq_search(w, 32, channel_ratios=(1.0, 0.9), grid_steps=4, max_shrink=0.2)
    err = (w - grid.dequantize(qw)).pow(2).sum(1)
    for r in range(4):
        best = math.inf
        for cr in (1.0, 0.9):
            s_c = lqq.lqq_channel_scales(w[r:r + 1], cr)
            total = 0.0
            for gi in range(2):
                x = w[r:r + 1, gi * 32:(gi + 1) * 32] / s_c
                group_best = math.inf
                for ratio in torch.linspace(1.0, 0.8, 5).tolist():
                    for minus in (0, 1):
                        m, s, q_max = lqq.lqq_fit_groups(x.clamp(-119, 119), torch.tensor(ratio).float(), minus)
                        dq = (lqq.lqq_codes(x.clamp(-119, 119), m, s, q_max) * s + m) * s_c
                        group_best = min(group_best, float((w[r:r + 1, gi * 32:(gi + 1) * 32] - dq).pow(2).sum()))
                total += group_best
            best = min(best, total)
        assert float(err[r]) == pytest.approx(best, rel=1e-5)
