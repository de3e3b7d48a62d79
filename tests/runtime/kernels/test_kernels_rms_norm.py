"""RMSNorm kernel with the A8 quantization folded in: y as transformers' RMSNorm computes it (within one rounding
step of the model dtype), and codes/scales bit-identical to quantizing that very y (MixLLM A8 g128 / per token),
on awkward shapes (K not a multiple of 128, M = 1, odd M)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (quantkit.runtime.kernels.jit)

import pytest  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRMSNorm  # noqa: E402

from quantkit.quant.act import quantize_activation_int  # noqa: E402
from quantkit.runtime.kernels.triton.rms_norm import rms_norm_triton  # noqa: E402
from tests.kernels_helpers import DEVICE  # noqa: E402


def _norm(k: int, dtype: torch.dtype, seed: int) -> LlamaRMSNorm:
    norm = LlamaRMSNorm(k, eps=1e-5)
    norm.weight.data = (torch.rand(k, generator=torch.Generator().manual_seed(seed)) + 0.5).to(dtype)
    return norm


@pytest.mark.parametrize("m,k,group_size", [(1, 200, 128), (3, 328, -1), (33, 256, None), (2, 72, 16),
                                            (5, 4096, 128)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_norm_and_codes(m, k, group_size, dtype):
    gen = torch.Generator().manual_seed(m * k)
    x = (torch.randn(m, k, generator=gen) * torch.rand(m, 1, generator=gen) * 8).to(dtype)
    norm = _norm(k, dtype, m + k)
    y, codes, scales = rms_norm_triton(x.to(DEVICE), norm.weight.data.to(DEVICE), 1e-5, group_size)
    ref = norm(x)
    y = y.cpu()
    assert y.dtype == dtype and y.shape == (m, k)
    # two rounding steps of the dtype (another r by a few fp32 ulps can move fp16(x·r) by one step and y by two;
    # fp32: the reduction order over K); bf16 four, as Triton's CPU interpreter truncates fp32 → bf16
    step = {torch.float16: 2.0 ** -9, torch.bfloat16: 2.0 ** -5, torch.float32: 2.0 ** -20}[dtype]
    assert bool(((y.float() - ref.float()).abs() <= ref.float().abs() * step + 1e-30).all())
    if group_size is None:
        assert codes is None and scales is None
    else:
        want_codes, want_scales = quantize_activation_int(y, 8, group_size)
        assert torch.equal(codes.cpu(), want_codes) and torch.equal(scales.cpu(), want_scales.float())


def test_refusals():
    x = torch.randn(2, 64, device=DEVICE)
    with pytest.raises(ValueError, match="weight \\[K\\] of its dtype"):
        rms_norm_triton(x, torch.ones(64, device=DEVICE, dtype=torch.float16), 1e-5)
    with pytest.raises(ValueError, match="power of two"):
        rms_norm_triton(x, torch.ones(64, device=DEVICE), 1e-5, 100)
