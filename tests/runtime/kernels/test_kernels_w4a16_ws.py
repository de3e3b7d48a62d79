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

from quantkit.runtime.kernels.reference import w4a16_reference  # noqa: E402
from quantkit.runtime.kernels.gemm import w4a16_matmul  # noqa: E402
from quantkit.runtime.kernels.gluon_sm90.w4a16_wgmma import w4a16_wgmma_matmul  # noqa: E402
from quantkit.runtime.kernels.gluon_sm90.w4a16_ws import HAVE_GLUON, w4a16_ws_matmul, w4a16_ws_problem  # noqa: E402
from tests.kernels_helpers import DEVICE, packed, planned_launch, record_kernel_launches, rel_err  # noqa: E402

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


@pytest.mark.gpu
@hopper
def test_w4a16_matmul_runs_the_first_launch_of_its_plan_and_ws_launches_equal_the_wgmma_kernel(monkeypatch):
    """With no tuned tables, w4a16_matmul runs the first launch of the registry's plan; where that is this kernel,
    its output equals the wgmma kernel's at the same 128-token tiles and warpgroups bit for bit (elsewhere it stays
    within the reference's tolerance). Every launch of this kernel's default and tune space does the same."""
    from quantkit.runtime.kernels.gemm import GluonW4a16Ws, problem_for

    calls = record_kernel_launches(monkeypatch)
    _, tensors, meta = packed("w4a16", 14336, 512, 128, seed=5)
    for m, dtype in ((24, torch.float16), (100, torch.float16), (160, torch.bfloat16), (320, torch.bfloat16),
                     (512, torch.float16), (513, torch.float16)):
        launch = planned_launch(monkeypatch, "a16", ("w4a16",), m, 14336, 512, 0, dtype)
        x = torch.randn(m, 512, device=DEVICE).to(dtype)
        out = torch.full((m, 14336), float("nan"), dtype=dtype, device=DEVICE)
        calls.clear()
        assert w4a16_matmul(x, tensors, meta, out=out).data_ptr() == out.data_ptr()
        assert calls == [launch], (m, launch)
        assert rel_err(out, w4a16_reference(x, tensors, meta)) < TOL[dtype], (m, launch)
        if launch[0] == "gluon_sm90.w4a16_ws":
            _, wg = launch[1]  # (stages, warpgroups)
            assert torch.equal(out, w4a16_wgmma_matmul(x, tensors, meta, 128, 3, 1, wg)), (m, launch)
        p = problem_for("a16", ("w4a16",), m, 14336, 512, 0, dtype, x.device)
        kernel = GluonW4a16Ws()
        for cfg in dict.fromkeys(kernel.configs(p) + kernel.candidates(p)):
            got = w4a16_matmul(x, tensors, meta, kernel=kernel.name, launch_config=cfg)
            assert torch.equal(got, w4a16_wgmma_matmul(x, tensors, meta, 128, 3, 1, cfg[1])), (m, cfg)


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

