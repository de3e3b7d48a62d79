"""Fused activation-quantization kernel: bit-identical codes and scales to quantize_activation_int (MixLLM A8
g128 / per token), including all-zero rows, ties, a short last group and bf16/fp32 inputs."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (quantkit.runtime.kernels.jit)

import pytest  # noqa: E402

from quantkit.errors import QuantkitError  # noqa: E402
from quantkit.quant.act import quantize_activation_int  # noqa: E402
from quantkit.runtime.kernels.triton.act_quant import quantize_activation_triton  # noqa: E402
from tests.kernels_helpers import DEVICE  # noqa: E402


@pytest.mark.parametrize("m,k,group_size", [(1, 200, 128), (33, 328, -1), (3, 300, 128), (5, 128, 64), (2, 72, 16)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_act_quant_is_bit_identical_to_torch(m, k, group_size, dtype):
    gen = torch.Generator().manual_seed(m * k)
    x = (torch.randn(m, k, generator=gen) * torch.rand(m, 1, generator=gen) * 10).to(dtype)
    x[0, :3] = 0
    if m > 2:
        x[2] = 0  # an all-zero row: the 1e-8 floor, then the fp16 minimum normal scale
    x[-1, -1] = 1.0  # exact ties appear when a value is a half-integer multiple of its scale
    codes, scales = quantize_activation_triton(x.to(DEVICE), 8, group_size)
    ref_codes, ref_scales = quantize_activation_int(x, 8, group_size)
    assert torch.equal(codes.cpu(), ref_codes)
    assert torch.equal(scales.cpu(), ref_scales.float())


def test_act_quant_other_bit_widths():
    x = torch.randn(4, 256) * 2
    codes, scales = quantize_activation_triton(x.half().to(DEVICE), 4, 128)
    ref_codes, ref_scales = quantize_activation_int(x.half(), 4, 128)
    assert torch.equal(codes.cpu(), ref_codes) and torch.equal(scales.cpu(), ref_scales.float())


def test_act_quant_refuses_groups_it_cannot_tile():
    with pytest.raises(QuantkitError, match="powers of two"):
        quantize_activation_triton(torch.randn(2, 300, device=DEVICE), 8, 100)
    with pytest.raises(QuantkitError, match="bits"):
        quantize_activation_triton(torch.randn(2, 300, device=DEVICE), 9, 128)


@pytest.mark.parametrize("group_size", [128, -1])
@pytest.mark.parametrize("launch", [(1, 1), (1, 8), (2, 2), (4, 4), (16, 4)])
def test_act_quant_launch_shapes_give_the_same_bits(group_size, launch):
    """Every (rows per program, warps) the launch rule can pick: rows past M masked, the same codes and scales."""
    gen = torch.Generator().manual_seed(launch[0] * 7 + launch[1])
    x = (torch.randn(5, 300, generator=gen) * 3).half()
    codes, scales = quantize_activation_triton(x.to(DEVICE), 8, group_size, launch=launch)
    ref_codes, ref_scales = quantize_activation_int(x, 8, group_size)
    assert torch.equal(codes.cpu(), ref_codes) and torch.equal(scales.cpu(), ref_scales.float())


def test_every_launch_the_rule_gives_is_bit_identical():
    """Whatever (rows per program, warps) act_quant_launch gives, from decode to prefill token counts and on narrow
    to wide rows, the kernel takes it and returns the reference's codes and scales (rows past M masked)."""
    from quantkit.runtime.kernels.triton.act_quant import act_quant_launch

    launches = sorted({(group, act_quant_launch(m, k_padded, group)) for group in (128, -1)
                       for m in (1, 3, 4, 5, 16, 64, 65, 1000, 4096) for k_padded in (256, 512, 4096, 16384, 65536)})
    x = (torch.randn(5, 300, generator=torch.Generator().manual_seed(9)) * 3).half()
    for group, launch in launches:
        codes, scales = quantize_activation_triton(x.to(DEVICE), 8, group, launch=launch)
        ref_codes, ref_scales = quantize_activation_int(x, 8, group)
        assert torch.equal(codes.cpu(), ref_codes) and torch.equal(scales.cpu(), ref_scales.float()), (group, launch)


def test_act_quant_empty_and_bad_launch():
    codes, scales = quantize_activation_triton(torch.zeros(0, 256, device=DEVICE, dtype=torch.float16), 8, -1)
    assert codes.shape == (0, 256) and scales.shape == (0, 1)
    with pytest.raises(ValueError, match="powers of two"):
        quantize_activation_triton(torch.randn(2, 256, device=DEVICE).half(), 8, 128, launch=(3, 4))
