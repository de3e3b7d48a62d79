"""quantkit.formats.row_concat: stacking the packed rows of several weights equals packing their row-stacked record,
bit for bit, for every layout that declares ROW_AXES (awkward shapes: odd N, N = 1, K not a multiple of 128), and
refuses with a reason what cannot be stacked."""

from __future__ import annotations

import pytest
import torch

from quantkit.formats import get_layout
from quantkit.formats.row_concat import row_axes, stack_problem, stack_rows
from quantkit.quant import grid, lqq
from quantkit.quant.records import QuantizedWeight

ROWS = [7, 1, 33]  # q/k/v-like row counts of the stacked weights
K = 328


def _record(layout: str, n: int, k: int, group_size: int, seed: int, g_idx=None) -> QuantizedWeight:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * 0.05
    if layout == "w4a8-lqq":
        return lqq.lqq_quantize(w, group_size)
    if layout == "w8":
        return grid.quantize(w, 8, group_size, sym=True)
    if layout == "fp8":
        return grid.quantize_fp8(w, group_size)
    qw = grid.quantize(w, 4, group_size, sym=False)
    qw.codes = torch.randint(0, 16, (n, k), generator=gen).to(torch.uint8)  # the whole code range
    qw.g_idx = g_idx
    return qw


def _cat(records: list[QuantizedWeight]) -> QuantizedWeight:
    first = records[0]
    cs = None if first.channel_scales is None else torch.cat([r.channel_scales for r in records])
    return QuantizedWeight(codes=torch.cat([r.codes for r in records]), scales=torch.cat([r.scales for r in records]),
                           zeros=torch.cat([r.zeros for r in records]), bits=first.bits, group_size=first.group_size,
                           sym=first.sym, g_idx=first.g_idx, channel_scales=cs, fp8=first.fp8)


@pytest.mark.parametrize("layout,group_size", [(lay, gs) for lay in ("w4a16", "w4a8-lqq", "w8", "reference")
                                               for gs in (128, -1)] + [("fp8", -1)])  # fp8: per channel only
def test_stacked_rows_equal_the_packed_stacked_record(layout, group_size):
    lay = get_layout(layout)
    records = [_record(layout, n, K, group_size, seed=i) for i, n in enumerate(ROWS)]
    tensors, meta = stack_rows(layout, [(lay.pack(r), lay.layout_meta(r)) for r in records])
    whole = _cat(records)
    want = lay.pack(whole)
    assert sorted(tensors) == sorted(want) and meta == lay.layout_meta(whole)
    for name, t in want.items():
        assert tensors[name].dtype == t.dtype and torch.equal(tensors[name], t), name
        assert tensors[name].is_contiguous()
    back = lay.unpack(tensors, meta)
    assert torch.equal(back.codes, whole.codes) and torch.equal(grid.dequantize(back), grid.dequantize(lay.unpack(
        want, meta)))


def test_reference_layout_shares_an_equal_g_idx_and_refuses_different_ones():
    lay = get_layout("reference")
    g_idx = (torch.randperm(K, generator=torch.Generator().manual_seed(3)) // 128).to(torch.int32)
    records = [_record("reference", n, K, 128, seed=i, g_idx=g_idx) for i, n in enumerate(ROWS)]
    tensors, meta = stack_rows("reference", [(lay.pack(r), lay.layout_meta(r)) for r in records])
    assert torch.equal(tensors["g_idx"], g_idx) and meta["out_features"] == sum(ROWS)
    other = _record("reference", 5, K, 128, seed=9, g_idx=torch.flip(g_idx, [0]).contiguous())
    with pytest.raises(ValueError, match="shared tensor 'g_idx' differs"):
        stack_rows("reference", [(lay.pack(records[0]), lay.layout_meta(records[0])),
                                 (lay.pack(other), lay.layout_meta(other))])


def test_what_cannot_be_stacked_says_why():
    assert row_axes("gptq") is None and row_axes("awq") is None
    assert "packs several rows into one word" in stack_problem("awq", [{}, {}])
    lay = get_layout("w4a16")
    a, b = _record("w4a16", 8, K, 128, 0), _record("w4a16", 8, K, -1, 1)
    assert "group_size" in stack_problem("w4a16", [lay.layout_meta(a), lay.layout_meta(b)])
    assert "in_features" in stack_problem("w4a16", [lay.layout_meta(a),
                                                    lay.layout_meta(_record("w4a16", 8, 200, 128, 2))])
    with pytest.raises(ValueError, match="group_size"):
        stack_rows("w4a16", [(lay.pack(a), lay.layout_meta(a)), (lay.pack(b), lay.layout_meta(b))])
    with pytest.raises(ValueError, match="different tensors"):
        stack_rows("w4a16", [({"qweight": lay.pack(a)["qweight"]}, lay.layout_meta(a)),
                             (lay.pack(a), lay.layout_meta(a))])
    with pytest.raises(ValueError, match="nothing to stack"):
        stack_rows("w4a16", [])
