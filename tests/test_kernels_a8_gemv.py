"""CUDA decode GEMV over int8 activation codes (quantkit.runtime.kernels.cuda_gemv_a8): W8A8, MixLLM W4A8 and the
one-launch mixed W4.4A8 against the torch reference over the same packed tensors, and the reasons it declines an
input (checked without a GPU)."""

from __future__ import annotations

import pytest
import torch

from quantkit.formats import get_layout
from quantkit.quant import grid
from quantkit.quant.act import quantize_activation_int
from quantkit.runtime.kernels.reference import int8_reference
from tests.kernels_helpers import packed, poisoned, rel_err

TOL = 1e-3  # fp16 output rounding; the sums are exact integers times fp32 scales


def _gpu_ok() -> bool:
    from quantkit.runtime.kernels.cuda_gemv import cupy_available

    return torch.cuda.is_available() and cupy_available()


def _acts(m: int, k: int, act_group: int, seed: int, device: str = "cuda"):
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed)) * 3
    codes, scales = quantize_activation_int(x, 8, act_group)
    return codes.to(device), scales.float().to(device)


def test_a8_gemv_declines_inputs_it_cannot_read():
    """Shape, layout and alignment reasons come before the device ones, so they are checked on the CPU."""
    from quantkit.runtime.kernels.cuda_gemv_a8 import a8_gemv_problem

    codes, scales = _acts(2, 512, 128, 0, "cpu")
    assert "outside 1..16" in a8_gemv_problem(codes[:0], scales[:0], ["w8"], torch.float16, 512)
    big, big_s = _acts(17, 512, 128, 0, "cpu")
    assert "outside 1..16" in a8_gemv_problem(big, big_s, ["w8"], torch.float16, 512)
    assert "w4a8-lqq" in a8_gemv_problem(codes, scales, ["w4a16", "w4a8-lqq"], torch.float16, 512)
    assert "multiple of 256" in a8_gemv_problem(codes, scales, ["w8"], torch.float16, 384)
    assert "fp16/bf16" in a8_gemv_problem(codes, scales, ["w8"], torch.float32, 512)
    wide = torch.zeros(2, 520, dtype=torch.int8)
    assert "16-byte aligned" in a8_gemv_problem(wide[:, :512], scales, ["w8"], torch.float16, 512)
    assert "CUDA device" in a8_gemv_problem(codes, scales, ["w8"], torch.float16, 512)


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ok(), reason="needs a CUDA GPU and CuPy")
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout,m,n,k,group_size,act_group,warps,sets", [
    ("w8", 1, 33, 256, 128, 128, 2, 1), ("w8", 5, 1000, 2304, 128, -1, 4, 1), ("w8", 8, 4103, 1024, 256, 256, 8, 1),
    ("w8", 12, 65, 3840, 384, 128, 2, 1), ("w8", 12, 65, 3840, 384, 128, 4, 2), ("w8", 37, 40, 512, 128, -1, 2, 2),
    ("w4a16", 1, 33, 256, 128, 128, 2, 1), ("w4a16", 3, 1000, 2304, -1, 128, 4, 1),
    ("w4a16", 8, 4103, 1024, 256, -1, 8, 1), ("w4a16", 12, 65, 3840, 384, 384, 2, 1),
    ("w4a16", 2, 40, 7168, 128, 128, 4, 1), ("w4a16", 16, 257, 4096, 128, 128, 4, 2),
    ("w4a16", 13, 33, 2304, -1, -1, 8, 2)])
def test_a8_gemv_matches_reference_on_gpu(layout, m, n, k, group_size, act_group, warps, sets, out_dtype):
    """Odd N (a partial block), per-channel / 256- / 384-column weight groups, per-token and grouped activation
    scales, M past one launch column of 8 or 16 tokens (two 8-token sets sharing each weight fragment), every
    warp looping over several tiles (odd and even counts)."""
    from quantkit.runtime.kernels.cuda_gemv_a8 import a8_gemv_cuda

    sym = layout == "w8"
    _, tensors, meta = packed(layout, n, k, group_size, seed=m + n, sym=sym)
    codes, scales = _acts(m, k, act_group, seed=k + m)
    ref = int8_reference(codes, scales, act_group, layout, tensors, meta)
    out = a8_gemv_cuda(codes, scales, act_group, [(layout, tensors, meta, None)], n, out_dtype,
                       out=poisoned(m, n, out_dtype), warps=warps, token_sets=sets)
    assert rel_err(out, ref) < (TOL if out_dtype == torch.float16 else 8e-3)
    if m <= 4:  # int8_matmul's default path at decode sizes is this kernel
        from quantkit.runtime.kernels.int8_gemm import int8_matmul

        default = a8_gemv_cuda(codes, scales, act_group, [(layout, tensors, meta, None)], n, out_dtype)
        assert torch.equal(int8_matmul(codes, scales, act_group, layout, tensors, meta, out_dtype), default)


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ok(), reason="needs a CUDA GPU and CuPy")
@pytest.mark.parametrize("m,n,k,act_group,order", [(1, 70, 512, 128, "w8-first"), (4, 300, 2304, -1, "w4-first"),
                                                   (8, 1030, 4096, 128, "w4-first"), (16, 300, 2304, 128, "w8-first")])
def test_mixed_a8_gemv_scatters_both_partitions_on_gpu(m, n, k, act_group, order):
    """A W4.4A8 layer in one launch: every third row (a partial 16-row block of them) at 8 bits, the rest asym
    4-bit, output columns scattered through each partition's row map; the Triton one-launch kernel agrees."""
    from quantkit.runtime.kernels.cuda_gemv_a8 import a8_gemv_cuda
    from quantkit.runtime.kernels.int8_gemm import mixed_int8_matmul

    w = torch.randn(n, k, generator=torch.Generator().manual_seed(n))
    rows8 = torch.arange(1, n, 3)
    rows4 = torch.tensor(sorted(set(range(n)) - set(rows8.tolist())))
    codes, scales = _acts(m, k, act_group, seed=m)
    parts, ref = [], torch.empty(m, n, dtype=torch.float64)
    for layout, qw, rows in (("w4a16", grid.quantize(w[rows4], 4, 128), rows4),
                             ("w8", grid.quantize(w[rows8], 8, 128, sym=True), rows8)):
        lay = get_layout(layout)
        tensors = {key: t.cuda() for key, t in lay.pack(qw).items()}
        parts.append((layout, tensors, lay.layout_meta(qw), rows.cuda()))
        ref[:, rows] = int8_reference(codes, scales, act_group, layout, tensors, lay.layout_meta(qw)).cpu()
    if order == "w8-first":
        parts.reverse()
    out = a8_gemv_cuda(codes, scales, act_group, parts, n, out=poisoned(m, n, torch.float16))
    assert rel_err(out, ref) < TOL
    triton = mixed_int8_matmul(codes, scales, act_group, parts, n, bn_b=16)  # bn_b: the Triton kernel
    assert rel_err(out, triton) < TOL
    assert torch.equal(mixed_int8_matmul(codes, scales, act_group, parts, n), a8_gemv_cuda(codes, scales, act_group,
                                                                                         parts, n))
