"""The Gluon W4A16 wgmma kernel (quantkit/runtime/kernels/gluon_sm90/w4a16_wgmma.py): its per-byte dequantization PTX (the
Triton kernel's instructions), the reasons it declines, and — on a Hopper GPU only (Gluon has no CPU interpreter) —
its numbers against the torch reference and the Triton W4A16 kernel on awkward shapes."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (quantkit.runtime.kernels.jit)

import pytest  # noqa: E402

from quantkit.runtime.kernels.triton.dequant import _asm_f16, asm_f16_pair  # noqa: E402
from quantkit.runtime.kernels.reference import w4a16_reference  # noqa: E402
from quantkit.runtime.kernels.gemm import w4a16_matmul  # noqa: E402
from quantkit.runtime.kernels.gluon_sm90.w4a16_wgmma import HAVE_GLUON, w4a16_wgmma_matmul, w4a16_wgmma_problem  # noqa: E402
from tests.kernels_helpers import DEVICE, packed, planned_launch, record_kernel_launches, rel_err  # noqa: E402

ON_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and HAVE_GLUON
hopper = pytest.mark.skipif(not ON_HOPPER, reason="needs a Hopper (sm_90) GPU and Triton's Gluon")
TOL = {torch.float16: 1e-3, torch.bfloat16: 8e-3}


@pytest.mark.parametrize("bf16", [False, True])
def test_pair_ptx_is_the_triton_kernels_instructions_for_one_byte(bf16):
    """Byte b's block of the 8-plane PTX with its operands renamed ($8, $9 → $2, $3; $10-$13 → $4-$7; planes b and
    b + 4 → $0, $1) is the pair PTX: both kernels round the same (q − z)·s the same way."""
    full = _asm_f16(bf16).splitlines()
    per_byte = (len(full) - 4) // 4
    names = {"$10": "$4", "$11": "$5", "$12": "$6", "$13": "$7", "$8": "$2", "$9": "$3"}
    for b in range(4):
        block = full[3 + b * per_byte: 3 + (b + 1) * per_byte]
        renamed = []
        for line in block:
            for old, new in names.items():
                line = line.replace(old + ",", new + "#,").replace(old + ";", new + "#;")
            line = line.replace(f"${b},", "$0#,").replace(f"${4 + b},", "$1#,")
            renamed.append(line.replace("#", ""))
        assert asm_f16_pair(b, bf16).splitlines() == full[:3] + renamed + ["}"]


def test_problem_names_what_the_kernel_cannot_take():
    _, _, meta = packed("w4a16", 64, 512, 128)
    x = torch.randn(40, 512, device=DEVICE).half()
    assert "fp16/bf16" in w4a16_wgmma_problem(x.float(), meta)
    assert "dtype" in w4a16_wgmma_problem(x, meta, torch.empty(40, 64, device=DEVICE, dtype=torch.bfloat16))
    _, _, m300 = packed("w4a16", 64, 300, 128)
    assert "multiple of 256" in w4a16_wgmma_problem(torch.randn(40, 300, device=DEVICE).half(), m300)
    wide = torch.zeros(40, 520, dtype=torch.float16, device=DEVICE)
    assert "16-byte" in w4a16_wgmma_problem(wide[:, 4:516], meta)  # rows 1040 bytes apart, start 8 bytes in
    assert "16-byte" in w4a16_wgmma_problem(torch.zeros(40, 516, dtype=torch.float16, device=DEVICE)[:, :512], meta)
    if ON_HOPPER:  # rows 1040 bytes apart, 16-byte aligned, but a stride Triton cannot prove 16-element aligned
        assert "16 elements" in w4a16_wgmma_problem(torch.zeros(40, 520, dtype=torch.float16,
                                                                device=DEVICE)[:, :512], meta)
    if not ON_HOPPER:
        assert w4a16_wgmma_problem(x, meta) is not None


def test_matmul_refuses_tiles_it_has_no_kernel_for():
    _, tensors, meta = packed("w4a16", 64, 256, 128)
    x = torch.randn(8, 256, device=DEVICE).half()
    for bm, stages, split, wg in [(96, 3, 1, 1), (16, 3, 1, 1), (64, 1, 1, 1), (64, 3, 0, 1), (64, 3, 1, 3),
                                  (128, 4, 1, 1)]:
        with pytest.raises(ValueError, match="bm must be"):
            w4a16_wgmma_matmul(x, tensors, meta, bm, stages, split, wg)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("n,k,m,group,bm,stages,split,wg", [
    (200, 512, 33, 128, 32, 3, 1, 1), (1000, 1024, 130, 128, 64, 3, 2, 1), (33, 768, 1, 128, 64, 3, 2, 1),
    (127, 1280, 257, 256, 128, 2, 1, 1), (64, 256, 5, -1, 32, 3, 4, 1), (4096, 2048, 200, 128, 64, 4, 4, 1),
    (65, 4096, 128, 128, 128, 3, 2, 1), (333, 768, 161, 256, 128, 3, 1, 1), (17, 512, 3, 128, 128, 2, 1, 1),
    # two warpgroups: 128 rows a program, the second warpgroup's rows partly or wholly past N
    (200, 512, 33, 128, 32, 3, 1, 2), (1000, 1024, 130, 128, 64, 3, 2, 2), (65, 4096, 300, 128, 128, 3, 1, 2),
    (127, 1280, 257, 256, 128, 2, 3, 2), (33, 768, 1, 128, 64, 4, 1, 2), (64, 256, 5, -1, 32, 3, 4, 2)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gluon_kernel_matches_the_reference_and_the_triton_kernel(n, k, m, group, bm, stages, split, wg, dtype):
    _, tensors, meta = packed("w4a16", n, k, group, seed=n + m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype).to(DEVICE)
    # a row-strided output (rows n + 8 apart), as QuantLinear's callers may pass
    out = torch.full((m, n + 8), float("nan"), dtype=dtype, device=DEVICE)[:, :n]
    got = w4a16_wgmma_matmul(x, tensors, meta, bm, stages, split, wg, out=out)
    assert got.data_ptr() == out.data_ptr() and torch.isfinite(got).all()
    assert rel_err(got, w4a16_reference(x, tensors, meta)) < TOL[dtype]
    # same Ŵ bits as the Triton kernel, fp32 sums in another order: far inside the reference tolerance
    tri = w4a16_matmul(x, tensors, meta, kernel="triton.w4a16")  # the Triton kernel at its default tile
    assert rel_err(got, tri) < TOL[dtype] / 4


@pytest.mark.gpu
@hopper
def test_gluon_kernel_reads_strided_activation_rows():
    _, tensors, meta = packed("w4a16", 96, 512, 128, seed=2)
    wide = torch.randn(70, 768, device=DEVICE).half()
    x = wide[:, 256:]  # rows 1536 bytes apart
    got = w4a16_wgmma_matmul(x, tensors, meta, 64, 3, 1)
    assert rel_err(got, w4a16_reference(x, tensors, meta)) < TOL[torch.float16]


@pytest.mark.gpu
@hopper
def test_w4a16_matmul_runs_the_first_launch_of_its_plan(monkeypatch):
    """Selection rules are checked by invariants: with no tuned tables, w4a16_matmul runs the first launch of the
    registry's plan (whichever kernel that is: the GEMV, the Gluon kernels, dequantize-then-cuBLAS, the Triton
    kernel), into the given output, within the reference's tolerance of both the reference and the Triton kernel
    (the same Ŵ bits, fp32 sums in another order, fp16 outputs rounded apart)."""
    calls = record_kernel_launches(monkeypatch)
    _, tensors, meta = packed("w4a16", 14336, 512, 128, seed=4)
    _, narrow, narrow_meta = packed("w4a16", 1024, 512, 128, seed=5)
    for (t, mt), m, dtype in [((tensors, meta), 1, torch.float16), ((tensors, meta), 24, torch.float16),
                              ((tensors, meta), 100, torch.bfloat16), ((tensors, meta), 120, torch.float16),
                              ((tensors, meta), 200, torch.float16), ((tensors, meta), 600, torch.bfloat16),
                              ((narrow, narrow_meta), 24, torch.float16), ((narrow, narrow_meta), 300, torch.float16)]:
        n = int(mt["out_features"])
        launch = planned_launch(monkeypatch, "a16", ("w4a16",), m, n, 512, 0, dtype)
        x = torch.randn(m, 512, device=DEVICE).to(dtype)
        out = torch.full((m, n), float("nan"), dtype=dtype, device=DEVICE)
        calls.clear()
        assert w4a16_matmul(x, t, mt, out=out).data_ptr() == out.data_ptr()
        assert calls == [launch], (m, n, launch)
        assert rel_err(out, w4a16_reference(x, t, mt)) < TOL[dtype], (m, n, launch)
        assert rel_err(out, w4a16_matmul(x, t, mt, kernel="triton.w4a16")) < TOL[dtype], (m, n, launch)
