"""The warp-specialized Gluon W4A16 kernel (quantkit/runtime/kernels/gluon_sm90/w4a16_ws.py): what it refuses runs anywhere;
its numbers run on a Hopper GPU only (Gluon has no CPU interpreter), where they must equal the non-specialized
Gluon kernel's at the same 128-token tiles bit for bit, call after call, and stay within fp16/bf16 rounding of the
reference."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (quantkit.runtime.kernels.jit)

import pytest  # noqa: E402

import quantkit.runtime.kernels.triton.w4a16 as w4a16_module  # noqa: E402
from quantkit.runtime.kernels.configs import w4a16_wgmma_config, w4a16_ws_warpgroups  # noqa: E402
from quantkit.runtime.kernels.reference import w4a16_reference  # noqa: E402
from quantkit.runtime.kernels.gemm import w4a16_matmul  # noqa: E402
from quantkit.runtime.kernels.gluon_sm90.w4a16_wgmma import w4a16_wgmma_matmul  # noqa: E402
from quantkit.runtime.kernels.gluon_sm90.w4a16_ws import HAVE_GLUON, w4a16_ws_matmul, w4a16_ws_problem  # noqa: E402
from quantkit.runtime.kernels.gluon_sm90 import w4a16_ws as gluon_w4a16_ws  # noqa: E402
from tests.kernels_helpers import DEVICE, packed, record_launches, rel_err  # noqa: E402

ON_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and HAVE_GLUON
hopper = pytest.mark.skipif(not ON_HOPPER, reason="needs a Hopper (sm_90) GPU and Triton's Gluon")
TOL = {torch.float16: 1e-3, torch.bfloat16: 8e-3}


def test_matmul_refuses_launches_it_was_not_built_for():
    _, tensors, meta = packed("w4a16", 64, 256, 128)
    x = torch.randn(8, 256, device=DEVICE).half()
    for stages, wg in [(1, 1), (4, 1), (3, 0), (3, 3)]:
        with pytest.raises(ValueError, match="stages must be 2-3 and warpgroups 1-2"):
            w4a16_ws_matmul(x, tensors, meta, stages, wg)


def test_problem_names_what_the_kernel_cannot_take():
    _, _, meta = packed("w4a16", 64, 512, 128)
    x = torch.randn(40, 512, device=DEVICE)
    assert "not fp16/bf16" in w4a16_ws_problem(x, meta)
    _, _, m300 = packed("w4a16", 64, 300, 128)
    assert "multiple of 256" in w4a16_ws_problem(torch.randn(40, 300, device=DEVICE).half(), m300)
    if not ON_HOPPER:
        assert w4a16_ws_problem(x.half(), meta) is not None


def test_rule_takes_the_ws_kernel_where_the_sweep_measured_it_faster():
    # measured on an H100 (µs: this kernel vs the path the rule runs without it)
    for m in (65, 96, 128):  # every 128-token launch of the wgmma rule, same warpgroups (14336x4096: 34.6 vs 42.0)
        for n, k in [(14336, 4096), (28672, 4096), (4096, 4096), (8192, 4096), (12288, 4096)]:
            cfg = w4a16_wgmma_config(m, n, k)
            assert w4a16_ws_warpgroups(m, n, k) == (cfg[3] if cfg is not None else None), (m, n, k)
    assert w4a16_ws_warpgroups(96, 14336, 4096) == 2 and w4a16_ws_warpgroups(96, 4096, 4096) is None
    assert w4a16_ws_warpgroups(32, 14336, 4096) is None  # 32-token tiles stay on the wgmma kernel
    assert w4a16_ws_warpgroups(256, 4096, 4096) == 1  # 128 programs of 64 rows, one wave: 19.7 vs 26.7 on two
    assert w4a16_ws_warpgroups(256, 4096, 14336) == 1  # 62.4 vs 80.2
    assert w4a16_ws_warpgroups(320, 4096, 4096) == 2  # 96 programs of 128 rows: 27.1 vs 36.4 on one
    # two warpgroups (partitions that take turns) wherever one warpgroup's 64-row programs need more than one wave
    assert w4a16_ws_warpgroups(160, 6144, 4096) == 2  # 27.9 vs 36.6
    assert w4a16_ws_warpgroups(288, 6144, 4096) == 2  # 50.6 vs 53.7
    assert w4a16_ws_warpgroups(160, 4608, 3584) == 2  # 144 programs of 64 rows: 24.8 vs 32.4
    assert w4a16_ws_warpgroups(512, 14336, 4096) == w4a16_ws_warpgroups(256, 28672, 4096) == 2  # 119.0 vs 143.7
    assert w4a16_ws_warpgroups(160, 14336, 4096) == w4a16_ws_warpgroups(129, 28672, 4096) == 2  # 57.0 vs Triton's 67.6
    for m in (80, 128, 256, 512):  # the k/v layer: 8-64 programs, the Triton kernel or dequantize-then-cuBLAS
        assert w4a16_ws_warpgroups(m, 1024, 4096) is None
    for m in (1, 16, 513, 1024):  # decode GEMV / above the range
        assert w4a16_ws_warpgroups(m, 14336, 4096) is None


@pytest.mark.gpu
@hopper
def test_w4a16_matmul_runs_the_ws_kernel_where_the_rule_picks_it(monkeypatch):
    calls = record_launches(monkeypatch, gluon_w4a16_ws, "w4a16_ws_matmul", 3)
    _, tensors, meta = packed("w4a16", 14336, 512, 128, seed=5)
    for m, dtype in ((100, torch.float16), (320, torch.bfloat16), (512, torch.float16)):
        wg = w4a16_ws_warpgroups(m, 14336, 512)
        assert wg is not None, m
        x = torch.randn(m, 512, device=DEVICE).to(dtype)
        out = torch.full((m, 14336), float("nan"), dtype=dtype, device=DEVICE)
        n_calls = len(calls)
        assert w4a16_matmul(x, tensors, meta, out=out).data_ptr() == out.data_ptr()
        assert len(calls) == n_calls + 1 and calls[-1] == (3, wg)
        assert rel_err(out, w4a16_reference(x, tensors, meta)) < TOL[dtype]
    n_calls = len(calls)
    for m in (24, 513):  # the rule says another path here (M = 160 and 300: two warpgroups)
        assert w4a16_ws_warpgroups(m, 14336, 512) is None
        w4a16_matmul(torch.randn(m, 512, device=DEVICE).half(), tensors, meta)
    assert len(calls) == n_calls


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("n,k,m,group,stages,wg", [
    (200, 512, 33, 128, 3, 1), (333, 1024, 130, 128, 3, 1), (65, 768, 1, 128, 2, 1), (4096, 2048, 769, 128, 3, 1),
    (1000, 1280, 257, 256, 2, 1), (127, 4096, 640, -1, 3, 1),
    # two warpgroups: 128 rows a program, the second warpgroup's rows partly or wholly past N
    (200, 512, 33, 128, 3, 2), (1000, 1024, 300, 128, 2, 2), (4096, 2048, 1025, 128, 3, 2), (65, 256, 5, -1, 3, 2),
    (4096, 2048, 300, 128, 3, 2), (130, 768, 129, 128, 2, 2), (64, 1280, 257, 128, 3, 2)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_ws_kernel_equals_the_wgmma_kernel_bit_for_bit_call_after_call(n, k, m, group, stages, wg, dtype):
    _, tensors, meta = packed("w4a16", n, k, group, seed=n + m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype).to(DEVICE)
    ref = w4a16_wgmma_matmul(x, tensors, meta, 128, 3, 1, wg)  # same tiles, same sums in the same order
    for _ in range(4):
        # a row-strided output (rows n + 8 apart), as QuantLinear's callers may pass
        out = torch.full((m, n + 8), float("nan"), dtype=dtype, device=DEVICE)[:, :n]
        got = w4a16_ws_matmul(x, tensors, meta, stages, wg, out=out)
        assert got.data_ptr() == out.data_ptr() and torch.equal(got, ref)
    assert rel_err(got, w4a16_reference(x, tensors, meta)) < TOL[dtype]
    fresh = w4a16_ws_matmul(x, tensors, meta, stages, wg)  # its own output tensor
    assert fresh.dtype == dtype and fresh.shape == (m, n) and torch.equal(fresh, ref)

