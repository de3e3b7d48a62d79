"""The stream-K LiquidQuant kernel (quantkit/runtime/kernels/lqq_stream_k.py): its plan and what it refuses run
anywhere; its numbers run on a Hopper GPU only (Gluon has no CPU interpreter), where they must equal the Triton
LiquidQuant kernel's bit for bit, call after call, whatever the number of programs the K iterations are divided
over (a wrong part, slot or ticket would show as a difference, a race as calls that differ)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (quantkit.runtime.kernels.jit)

import pytest  # noqa: E402

from quantkit.quant.act import quantize_activation_int  # noqa: E402
from quantkit.runtime.kernels.configs import TileConfig  # noqa: E402
from quantkit.runtime.kernels.int8_gemm import int8_matmul  # noqa: E402
from quantkit.runtime.kernels.lqq_stream_k import HAVE_GLUON, lqq_stream_k_matmul, stream_k_plan  # noqa: E402
from tests.kernels_helpers import DEVICE, packed  # noqa: E402

ON_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and HAVE_GLUON
hopper = pytest.mark.skipif(not ON_HOPPER, reason="needs a Hopper (sm_90) GPU and Triton's Gluon")


def _acts(m: int, k: int, seed: int):
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed)) * 3
    codes, scales = quantize_activation_int(x, 8, -1)
    return codes.to(DEVICE), scales.float().to(DEVICE)


@pytest.mark.parametrize("m,n,k,programs,want", [
    (384, 1536, 4096, 132, (36, 5, 116)),  # 36 tiles of 128 rows: 576 iterations, 5 a program
    (513, 1024, 4096, 132, (40, 5, 128)),
    (384, 1536, 4096, 1, (36, 576, 1)),
    (5, 64, 256, 132, (1, 1, 1)),  # fewer iterations than programs: one each
    (300, 333, 1280, 7, (9, 7, 7)),
])
def test_plan_divides_the_iterations_evenly_and_leaves_no_program_empty(m, n, k, programs, want):
    tiles, per, grid = stream_k_plan(m, n, k, programs)
    assert (tiles, per, grid) == want
    units = tiles * (k // 256)
    assert grid <= programs and (grid - 1) * per < units <= grid * per


def test_matmul_refuses_a_ring_it_was_not_built_for():
    for stages in (1, 5):
        with pytest.raises(ValueError, match="2-4 stages"):
            lqq_stream_k_matmul(torch.zeros(4, 256, dtype=torch.int8), torch.ones(4, 1), {}, {}, stages=stages)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("n,k,m,programs,stages", [
    # the layers it is for: 36-48 tiles over the SMs (tiles cut in three or four parts)
    (1536, 4096, 384, None, 4), (1024, 4096, 513, None, 3), (2048, 4096, 288, None, 2),
    # a program over several whole tiles and cut ones, one over a whole layer, one iteration a program (a tile in
    # 16 parts: the last program adds 15 slots), program counts that do not divide the iterations
    (1024, 4096, 513, 7, 4), (333, 1280, 300, 1, 4), (1024, 4096, 384, 1000, 4), (333, 1280, 300, 50, 2),
    # odd N, rows past N in the second warpgroup, M below one token tile, one K tile, a ragged last token tile
    (200, 512, 33, None, 4), (64, 256, 5, 3, 4), (127, 768, 130, 11, 2), (4096, 2048, 1025, None, 4),
    (1000, 1024, 200, None, 3)])
def test_stream_k_equals_triton_call_after_call(n, k, m, programs, stages):
    """Integer parts added exactly: the unsplit Triton kernel's bits, into a row-strided output and in bf16."""
    _, tensors, meta = packed("w4a8-lqq", n, k, 128, seed=n + m + (programs or 0))
    codes, scales = _acts(m, k, seed=m + 7)
    tri = int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta, config=TileConfig(64, 128, 1, 4, 3))
    for _ in range(4):
        out = torch.full((m, n + 8), float("nan"), dtype=torch.float16, device=DEVICE)[:, :n]
        got = lqq_stream_k_matmul(codes, scales, tensors, meta, programs, stages, out=out)
        assert torch.equal(got, tri)
    bf = lqq_stream_k_matmul(codes, scales, tensors, meta, programs, stages, out_dtype=torch.bfloat16)
    assert torch.equal(bf, int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta, out_dtype=torch.bfloat16,
                                       config=TileConfig(64, 128, 1, 4, 3)))
