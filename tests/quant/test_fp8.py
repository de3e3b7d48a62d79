"""FP8 E4M3 weights and activations (the ``fp8`` grid): checked bit for bit against a brute-force nearest-value
search over the 254 finite e4m3 numbers, on awkward shapes; the reference layout stores them exactly; recipes,
exports and the search refuse what they cannot do in one line."""

from __future__ import annotations

import pytest
import torch

from quantkit.errors import QuantkitError
from quantkit.formats import get_layout
from quantkit.formats.common import record_problem
from quantkit.quant import grid
from quantkit.quant.act import quantize_activation
from quantkit.quant.recipe import load_recipe, parse_recipe

FINITE = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
VALUES = FINITE.view(torch.float8_e4m3fn).double()


def _nearest_codes(x: torch.Tensor) -> torch.Tensor:
    """The e4m3 bit pattern nearest to each element of ``x`` (|x| <= 448), ties to the even mantissa; a value that
    rounds to zero keeps x's sign (-0 is 0x80), as the cast does."""
    d = (x.double().reshape(-1, 1) - VALUES.reshape(1, -1)).abs()
    best = d.min(dim=1, keepdim=True).values
    tied = d == best
    even = (FINITE & 1) == 0
    pick = torch.where(tied.sum(1) > 1, (tied & even).float().argmax(1), tied.float().argmax(1))
    codes = FINITE[pick].reshape(x.shape)
    zero = (codes == 0x80) | (codes == 0x00)
    return torch.where(zero, torch.where(torch.signbit(x), 0x80, 0x00).to(torch.uint8), codes)


def _plain_scales(w: torch.Tensor, group_size: int) -> torch.Tensor:
    """absmax / 448 per row and group, rounded up to fp16, 1 for an all-zero group."""
    k = w.shape[1]
    gs = k if group_size == -1 else group_size
    cols = []
    for start in range(0, k, gs):
        absmax = w[:, start:start + gs].abs().amax(dim=1)
        cols.append(grid.round_scale_up(torch.where(absmax > 0, absmax / torch.tensor(448.0), torch.ones_like(absmax))))
    return torch.stack(cols, dim=1)


@pytest.mark.parametrize("n,k,group_size", [(7, 300, -1), (7, 300, 128), (1, 1, -1), (33, 129, 64), (4, 5, 128)])
def test_fp8_weights_are_the_nearest_e4m3_values_of_w_over_the_scale(n, k, group_size):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(n * k)) * 3
    w[0, :2] = torch.tensor([0.0, -0.0])[: min(2, k)]
    qw = grid.quantize_fp8(w, group_size)
    scales = _plain_scales(w, group_size)
    assert torch.equal(qw.scales, scales)
    g = qw.group_index()
    assert torch.equal(qw.codes, _nearest_codes(w / scales[:, g]))
    assert qw.fp8 and qw.bits == 8 and qw.sym and not qw.zeros.any()
    assert record_problem(qw) is None
    want = qw.codes.view(torch.float8_e4m3fn).double() * scales[:, g].double()
    assert torch.equal(grid.dequantize(qw).double(), want)  # exact in fp32: e4m3 × an fp16 value


def test_an_all_zero_row_gets_scale_one_and_zero_codes():
    qw = grid.quantize_fp8(torch.zeros(3, 10))
    assert torch.equal(qw.scales, torch.ones(3, 1)) and not qw.codes.any()


def test_nan_bit_patterns_are_not_a_record():
    qw = grid.quantize_fp8(torch.randn(2, 8))
    qw.codes[1, 3] = 0x7F
    assert "NaN" in record_problem(qw)


@pytest.mark.parametrize("shape,group_size", [((1, 200), -1), ((3, 2, 130), -1), ((5, 300), 128)])
def test_fp8_activations_are_nearest_e4m3_with_an_fp32_scale_per_token(shape, group_size):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1)) * 5
    got = quantize_activation(x, 8, group_size, True, fp8=True)
    rows = x.reshape(-1, shape[-1])
    gs = shape[-1] if group_size == -1 else group_size
    want = torch.empty_like(rows)
    for start in range(0, shape[-1], gs):
        part = rows[:, start:start + gs]
        scale = part.abs().amax(1, keepdim=True) / torch.tensor(448.0)
        want[:, start:start + gs] = (_nearest_codes(part / scale).view(torch.float8_e4m3fn).float() * scale)
    assert torch.equal(got, want.reshape(shape))
    assert got.dtype == x.dtype


def test_the_reference_layout_stores_fp8_weights_bit_exactly():
    qw = grid.quantize_fp8(torch.randn(9, 257) * 0.02, -1)
    lay = get_layout("reference")
    meta = lay.layout_meta(qw)
    back = lay.unpack(lay.pack(qw), meta)
    assert meta["fp8"] is True and back.fp8
    assert torch.equal(back.codes, qw.codes) and torch.equal(back.scales, qw.scales)
    assert torch.equal(grid.dequantize(back), grid.dequantize(qw))
    assert "fp8" not in lay.layout_meta(grid.quantize(torch.randn(2, 8), 4, -1))  # other manifests unchanged


def test_kernel_and_engine_layouts_refuse_fp8_weights_by_name():
    qw = grid.quantize_fp8(torch.randn(16, 256))
    for name in ("w8", "gptq"):
        assert "FP8" in get_layout(name).supports(qw)
    assert get_layout("awq").supports(qw) is not None  # refused by its bit-width first


def test_the_fp8_recipe_and_its_refusals():
    r = load_recipe("fp8-w8a8")
    assert r.weight.grid == "fp8" and r.activation.fp8 and not r.uses_calibration
    with pytest.raises(QuantkitError, match="grid: fp8' takes method rtn"):
        parse_recipe({"weight": {"method": "gptq", "grid": "fp8", "bits": 8, "sym": True}})
    with pytest.raises(QuantkitError, match="activation.fp8' needs activation.bits 8"):
        parse_recipe({"weight": {"method": "rtn"}, "activation": {"bits": 4, "fp8": True}})
    over = parse_recipe({"weight": {"method": "rtn", "grid": "fp8", "bits": 8, "sym": True, "group_size": -1},
                         "overrides": [{"pattern": "*.down_proj", "bits": 4, "sym": False, "group_size": 128}]})
    assert over.spec_for("x.down_proj").grid == "affine" and over.spec_for("x.q_proj").grid == "fp8"


def test_search_and_engine_exports_refuse_fp8_recipes(tmp_path):
    from quantkit.checkpoint.choose import check_recipe_export
    from quantkit.search.command import run_search

    with pytest.raises(QuantkitError, match="no plan to search"):
        run_search("builtin:reference", str(tmp_path / "plan.json"), "fp8-w8a8", device="cpu")
    weight_only = parse_recipe({"weight": {"method": "rtn", "grid": "fp8", "bits": 8, "sym": True,
                                           "group_size": -1}})
    for export in ("gptq", "awq"):
        with pytest.raises(QuantkitError, match="FP8 E4M3 weights"):
            check_recipe_export(weight_only, export, False)


def test_fp8_edge_values_give_no_nan():
    x = torch.tensor([[1e-44, 0.0, -1e-44, 0.0], [0.0, 0.0, 0.0, 0.0]])
    assert torch.isfinite(quantize_activation(x, 8, -1, True, fp8=True)).all()
    w = torch.randn(2, 8)
    w[1, 3] = float("nan")
    with pytest.raises(QuantkitError, match="NaN or inf"):
        grid.quantize_fp8(w)
