"""Clipping search (quantkit.quant.clip) against a per-group brute-force loop, and RTN (quantkit.quant.rtn)."""

from __future__ import annotations

import pytest
import torch

from quantkit.errors import QuantkitError
from quantkit.quant import clip as qclip
from quantkit.quant import grid
from quantkit.quant.rtn import rtn_quantize


def outlier_weight(n: int, k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen)
    mask = torch.rand(n, k, generator=gen) < 0.03
    return w + mask * torch.randn(n, k, generator=gen) * 6  # sparse outliers make clipping worthwhile


def loop_group_errors(w, bits, group_size, sym, x, ratios):
    """errors[n][g][i]: float64 objective of group g of row n quantized alone with ratio i."""
    n, k = w.shape
    gs = k if group_size == -1 else group_size
    out = []
    for r in range(n):
        row = []
        for g in range(grid.num_groups(k, group_size)):
            cols = slice(g * gs, min((g + 1) * gs, k))
            errs = []
            for ratio in ratios:
                qw = grid.quantize(w[r:r + 1, cols], bits, -1, sym, clip=float(ratio))
                d = (w[r, cols] - grid.dequantize(qw)[0]).double()
                errs.append(float((d ** 2).sum() if x is None else ((x[:, cols].double() @ d) ** 2).sum()))
            row.append(errs)
        out.append(row)
    return out


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("sym", [False, True])
@pytest.mark.parametrize("group_size", [32, -1])
@pytest.mark.parametrize("objective", ["weight", "output"])
def test_search_picks_the_loop_minimum(bits, sym, group_size, objective):
    for n, k in [(7, 200), (1, 328)]:
        w = outlier_weight(n, k, seed=bits * 100 + n)
        # 64 tokens: the Gram form runs for g32 (gs <= T), the direct form for per-channel (gs = K > T)
        x = torch.randn(2, 32, k, generator=torch.Generator().manual_seed(k)) if objective == "output" else None
        got = qclip.search_clip(w, bits, group_size, sym, inputs=x, grid=10, max_shrink=0.5)
        ratios = qclip.shrink_ratios(10, 0.5)
        assert got.shape == (n, grid.num_groups(k, group_size)) and got.dtype == torch.float32
        errs = loop_group_errors(w, bits, group_size, sym, None if x is None else x.reshape(-1, k), ratios)
        for r in range(n):
            for g, e in enumerate(errs[r]):
                i = int((ratios == got[r, g]).nonzero())  # the result is one of the candidates
                assert e[i] <= min(e) * (1 + 1e-4) + 1e-9, (r, g, e[i], min(e))
        # the ratios are directly usable by the quantizer
        grid.quantize(w, bits, group_size, sym, clip=got)


def test_clipping_lowers_output_error_with_outliers():
    w = outlier_weight(33, 328, seed=7)
    x = torch.randn(4, 40, 328, generator=torch.Generator().manual_seed(8))
    xs = x.reshape(-1, 328)
    for sym in (False, True):
        c = qclip.search_clip(w, 3, 128, sym, inputs=x)
        assert bool((c < 1).any()) and bool((c >= 0.5).all())
        base = grid.dequantize(grid.quantize(w, 3, 128, sym))
        clipped = grid.dequantize(grid.quantize(w, 3, 128, sym, clip=c))
        e0 = ((w - base) @ xs.T).pow(2).sum()
        e1 = ((w - clipped) @ xs.T).pow(2).sum()
        assert float(e1) < 0.95 * float(e0), (float(e1), float(e0))
        # per group the objective never gets worse than not clipping (r = 1 is always a candidate)
        for g in range(3):
            cols = slice(128 * g, min(128 * (g + 1), 328))
            g0 = ((w - base)[:, cols] @ xs[:, cols].T).pow(2).sum(1)
            g1 = ((w - clipped)[:, cols] @ xs[:, cols].T).pow(2).sum(1)
            assert bool((g1 <= g0 * (1 + 1e-5) + 1e-6).all())


def test_chunking_and_input_layout_do_not_change_the_result():
    w = outlier_weight(9, 200, seed=3)
    x = torch.randn(3, 50, 200, generator=torch.Generator().manual_seed(4))
    ref = qclip.search_clip(w, 4, 64, False, inputs=x, n_tokens=None)
    assert torch.equal(ref, qclip.search_clip(w, 4, 64, False, inputs=x, n_tokens=None, chunk=2))
    assert torch.equal(ref, qclip.search_clip(w, 4, 64, False, inputs=list(x), n_tokens=None))
    wh = w.half()
    assert torch.equal(qclip.search_clip(wh, 4, 64, False, inputs=x.reshape(150, 200), n_tokens=None),
                       qclip.search_clip(wh.float(), 4, 64, False, inputs=x, n_tokens=None))


def test_sample_tokens_is_deterministic_and_evenly_spread():
    x = torch.arange(2 * 300 * 5, dtype=torch.float32).reshape(2, 300, 5)
    s = qclip.sample_tokens(x, 5, n_tokens=7)
    assert s.shape == (7, 5)
    rows = (s[:, 0] / 5).long().tolist()
    assert rows[0] == 0 and rows[-1] == 599 and rows == sorted(rows)
    assert max(b - a for a, b in zip(rows, rows[1:])) <= 101
    assert torch.equal(s, qclip.sample_tokens(x, 5, n_tokens=7))
    assert qclip.sample_tokens(x, 5, n_tokens=None).shape == (600, 5)
    assert qclip.sample_tokens([x[0], x[1]], 5, n_tokens=1000).shape == (600, 5)
    with pytest.raises(ValueError, match="K=6"):
        qclip.sample_tokens(x, 6)


def test_shrink_ratios_and_bad_options():
    r = qclip.shrink_ratios(20, 0.5)
    assert r.shape == (21,) and float(r[0]) == 1.0 and abs(float(r[-1]) - 0.5) < 1e-7
    assert bool((r[1:] < r[:-1]).all())
    for kwargs in ({"grid": 0}, {"max_shrink": 1.0}, {"max_shrink": 0.0}):
        with pytest.raises(QuantkitError):
            qclip.search_clip(torch.randn(2, 32), 4, 32, False, **kwargs)


def test_rtn_quantize():
    w = outlier_weight(7, 200, seed=11)
    x = torch.randn(64, 200, generator=torch.Generator().manual_seed(12))
    plain = rtn_quantize(w, 4, 128, False)
    ref = grid.quantize(w, 4, 128, False)
    assert torch.equal(plain.codes, ref.codes) and torch.equal(plain.scales, ref.scales)
    assert plain.meta == {"method": "rtn", "clip": None}
    for inputs, objective in ((None, "weight"), (x, "output")):
        qw = rtn_quantize(w, 4, 128, True, clip=True, inputs=inputs, grid=10)
        c = qclip.search_clip(w, 4, 128, True, inputs=inputs, grid=10)
        ref = grid.quantize(w, 4, 128, True, clip=c)
        assert torch.equal(qw.codes, ref.codes) and torch.equal(qw.scales, ref.scales)
        assert qw.meta == {"method": "rtn", "clip": objective}
    with pytest.raises(ValueError, match="clip=True"):
        rtn_quantize(w, 4, 128, False, inputs=x)
