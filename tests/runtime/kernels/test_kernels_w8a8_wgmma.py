"""The W8A8 TMA kernel (quantkit/runtime/kernels/gluon_sm90/w8a8_wgmma.py) and the int8 operands that let MixLLM W4A8 and
mixed layers run it (int8_operand.py). The operands and the launch rule are checked anywhere (the operand kernel
under Triton's CPU interpreter); the kernel itself only on a Hopper GPU, where it must equal the Triton W8A8 kernel
bit for bit."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (quantkit.runtime.kernels.jit)

import pytest  # noqa: E402

from quantkit.quant.act import quantize_activation_int  # noqa: E402
from quantkit.runtime.kernels.heuristic import MIXLLM_OPERAND_MIN_M  # noqa: E402
from quantkit.runtime.kernels.triton.launch import TileConfig  # noqa: E402
from quantkit.runtime.kernels.gemm import int8_matmul, mixed_int8_matmul  # noqa: E402
from quantkit.runtime.kernels.triton.int8_operand import mixed_w8_operand, w8_operand  # noqa: E402
from quantkit.runtime.kernels.reference import int8_reference, int8_weight  # noqa: E402
from quantkit.runtime.kernels.gluon_sm90.w8a8_wgmma import w8a8_wgmma_matmul, w8a8_wgmma_problem  # noqa: E402
from quantkit.runtime.kernels.gluon_sm90.common import HAVE_GLUON  # noqa: E402
from quantkit.runtime.kernels.gluon_sm90 import w8a8_wgmma as gluon_w8a8  # noqa: E402
from quantkit.runtime.kernels.triton.int8_gemm import per_channel_sum  # noqa: E402
from tests.kernels_helpers import (DEVICE, a8_split, packed, planned_launch, record_kernel_launches,  # noqa: E402
                                   rel_err)

ON_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and HAVE_GLUON
hopper = pytest.mark.skipif(not ON_HOPPER, reason="needs a Hopper (sm_90) GPU and Triton's Gluon")


def _acts(m: int, k: int, act_group: int, seed: int):
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed)) * 3
    codes, scales = quantize_activation_int(x, 8, act_group)
    return codes.to(DEVICE), scales.float().to(DEVICE)


def _mixed_parts(n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=g)
    rows8, rows4 = perm[: max(1, n // 10)].sort().values, perm[max(1, n // 10):].sort().values
    parts = []
    for layout, rows in (("w4a16", rows4), ("w8", rows8)):
        _, tensors, meta = packed(layout, len(rows), k, 128, seed=seed + len(rows))
        parts.append((layout, tensors, meta, rows.to(torch.int32).to(DEVICE)))
    return parts


@pytest.mark.parametrize("n,k", [(33, 200), (70, 512), (5, 1000)])
def test_asym4_operand_is_the_w4a8_kernels_q_minus_z_and_scales_widen_exactly(n, k):
    _, tensors, meta = packed("w4a16", n, k, 128, seed=n)
    operand = w8_operand("w4a16", tensors, meta)
    assert torch.equal(operand["qweight"].cpu(), int8_weight("w4a16", tensors, meta).cpu())
    fp16 = (tensors["qparams"].cpu() & 0xFFFF).to(torch.int16).view(torch.float16)
    assert torch.equal(operand["scales"].cpu(), fp16.float())


def test_mixed_operand_puts_each_partitions_rows_in_output_order():
    n, k, m = 50, 384, 3
    parts = _mixed_parts(n, k, seed=5)
    (tensors, meta) = mixed_w8_operand(parts, n)
    codes, scales = _acts(m, k, 128, seed=1)
    got = int8_reference(codes, scales, 128, "w8", tensors, meta)
    for layout, t, mt, rows in parts:
        part = int8_reference(codes, scales, 128, layout, t, mt)
        assert torch.equal(got[:, rows.long()].cpu(), part.cpu())


@pytest.mark.parametrize("n,k", [(33, 200), (5, 1000)])
def test_liquidquant_operand_is_its_first_level_with_the_channel_scale(n, k):
    _, tensors, meta = packed("w4a8-lqq", n, k, 128, seed=n)
    operand = w8_operand("w4a8-lqq", tensors, meta)
    assert torch.equal(operand["qweight"].cpu(), int8_weight("w4a8-lqq", tensors, meta).cpu())
    assert torch.equal(operand["scales"].cpu(), tensors["channel_scales"].cpu().float().unsqueeze(0))


def test_mixed_liquidquant_operand_is_one_per_channel_weight_in_output_order():
    n, k, m = 50, 328, 3
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(7))
    parts = []
    for layout, rows, group in (("w4a8-lqq", perm[5:].sort().values, 128), ("w8", perm[:5].sort().values, -1)):
        _, tensors, meta = packed(layout, len(rows), k, group, seed=len(rows))
        parts.append((layout, tensors, meta, rows.to(torch.int32).to(DEVICE)))
    tensors, meta = mixed_w8_operand(parts, n)
    assert meta["group_size"] == -1 and tensors["scales"].shape == (1, n)
    codes, scales = _acts(m, k, -1, seed=1)
    got = int8_reference(codes, scales, -1, "w8", tensors, meta)
    for layout, t, mt, rows in parts:
        torch.testing.assert_close(got[:, rows.long()].cpu(), int8_reference(codes, scales, -1, layout, t, mt).cpu(),
                                   rtol=1e-12, atol=0)
    _, t, mt = packed("w8", 2, k, 128)  # g128 8-bit rows have per-group scales: no common operand
    assert mixed_w8_operand([parts[0], ("w8", t, mt, torch.tensor([0, 1], dtype=torch.int32))], n - 3) is None


def test_the_mixed_tma_kernel_declines_partitions_whose_operands_differ():
    """LiquidQuant rows (one scale a row) next to g128 8-bit rows have no common operand: the kernel turns the call
    down by name in ``accepts``, so the registry runs the next kernel and a forced choice says why."""
    from quantkit.runtime.kernels.gemm import A8Call, GluonW8a8Mixed, problem_for, weight_group_of

    k = 512
    _, lqq, lqq_meta = packed("w4a8-lqq", 30, k, 128)
    _, w8, w8_meta = packed("w8", 2, k, 128)
    parts = [("w4a8-lqq", lqq, lqq_meta, torch.arange(30, dtype=torch.int32)),
             ("w8", w8, w8_meta, torch.arange(30, 32, dtype=torch.int32))]
    assert weight_group_of(parts) is None
    codes, scales = _acts(600, k, -1, seed=1)
    call = A8Call(codes, scales, -1, parts, 32, torch.float16)
    p = problem_for("a8_mixed", ("w4a8-lqq", "w8"), 600, 32, k, -1, torch.float16, codes.device, None)
    assert "differ" in GluonW8a8Mixed().accepts(p, call, (64, 64, 4, 4, True, 1))


def test_mixed_operand_declines_partitions_of_different_group_sizes():
    n, k = 20, 512
    parts = _mixed_parts(n, k, seed=2)
    _, t, mt = packed("w8", 2, k, 256)
    assert mixed_w8_operand([parts[0], ("w8", t, mt, torch.tensor([0, 1], dtype=torch.int32))], n) is None


def test_problem_names_what_the_kernel_cannot_take():
    _, _, meta = packed("w8", 64, 512, 128)
    codes, _ = _acts(40, 512, 128, 0)
    assert "not w8" in w8a8_wgmma_problem(codes, 128, "w4a16", meta)
    assert "128 columns" in w8a8_wgmma_problem(codes, 64, "w8", meta)
    wide = torch.zeros(40, 520, dtype=torch.int8, device=codes.device)
    assert "16-byte" in w8a8_wgmma_problem(wide[:, 1:513], 128, "w8", meta)
    f32 = torch.empty(40, 64, dtype=torch.float32, device=codes.device)
    assert "fp16 or bf16" in w8a8_wgmma_problem(codes, 128, "w8", meta, f32)
    if not ON_HOPPER:
        assert w8a8_wgmma_problem(codes, 128, "w8", meta) is not None


def test_mixed_operand_refuses_partitions_that_do_not_cover_the_layer():
    parts = _mixed_parts(20, 256, seed=7)
    with pytest.raises(ValueError, match="rows"):
        mixed_w8_operand(parts, 21)


@pytest.mark.skipif(ON_HOPPER, reason="checks the fallback where the Gluon kernels cannot run")
def test_int8_matmul_falls_back_to_triton_where_the_gluon_paths_cannot_run():
    # sizes where the TMA kernel would take the product on a Hopper GPU (w8 from 17 tokens, MixLLM W4A8 and mixed
    # layers through the int8 operand from MIXLLM_OPERAND_MIN_M)
    m8, mo, k = 70, MIXLLM_OPERAND_MIN_M, 256
    codes, scales = _acts(m8, k, 128, seed=2)
    _, tensors, meta = packed("w8", 30, k, 128, seed=2)
    y = int8_matmul(codes, scales, 128, "w8", tensors, meta)
    assert rel_err(y, int8_reference(codes, scales, 128, "w8", tensors, meta)) < 1e-3
    codes, scales = _acts(mo, k, 128, seed=3)
    _, tensors, meta = packed("w4a16", 20, k, 128, seed=3)
    y = int8_matmul(codes, scales, 128, "w4a16", tensors, meta)
    assert rel_err(y, int8_reference(codes, scales, 128, "w4a16", tensors, meta)) < 1e-3
    parts = _mixed_parts(20, k, seed=4)
    y = mixed_int8_matmul(codes, scales, 128, parts, 20)
    for layout, t, mt, rows in parts:
        assert rel_err(y[:, rows.long()], int8_reference(codes, scales, 128, layout, t, mt)) < 1e-3


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("n,k,m,act_group,tile,dtype", [
    (200, 512, 33, 128, (64, 128, 4, 4), torch.float16), (1000, 1024, 130, 128, (64, 64, 4, 4), torch.bfloat16),
    (64, 256, 1, 128, (64, 64, 3, 4), torch.float16), (127, 1280, 257, -1, (128, 128, 4, 8), torch.float16),
    (129, 400, 70, 128, (64, 128, 4, 4), torch.bfloat16),
    # scales loaded a block ahead: odd and even block counts, one block, more stages than blocks, a ragged last tile
    (200, 384, 33, 128, (64, 64, 4, 4, True), torch.float16), (129, 128, 70, 128, (64, 64, 3, 4, True), torch.float16),
    (1000, 1024, 130, 128, (128, 64, 4, 8, True), torch.bfloat16),
    (127, 1280, 257, -1, (64, 64, 6, 4, True), torch.float16), (70, 640, 1, 128, (64, 128, 4, 4, True), torch.float16),
    (300, 896, 129, 128, (128, 128, 4, 8, True), torch.float16),
    (256, 2048, 200, 128, (64, 64, 4, 4, True), torch.float16)])
def test_gluon_w8a8_equals_triton_and_the_reference(n, k, m, act_group, tile, dtype):
    _, tensors, meta = packed("w8", n, k, 128, seed=n + m)
    codes, scales = _acts(m, k, act_group, seed=m)
    out = torch.full((m, n + 8), float("nan"), dtype=dtype, device=DEVICE)[:, :n]  # rows n + 8 apart
    got = w8a8_wgmma_matmul(codes, scales, act_group, tensors, meta, *tile, out=out)
    tri = int8_matmul(codes, scales, act_group, "w8", tensors, meta, out_dtype=dtype,
                      config=TileConfig(64, 64, 1, 4, 3))
    assert torch.equal(got, tri)
    tol = 1e-3 if dtype == torch.float16 else 4e-3  # the output's rounding: bf16 keeps 8 significant bits
    assert rel_err(got, int8_reference(codes, scales, act_group, "w8", tensors, meta)) < tol


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("n,k,m,act_group,tile,split", [
    (200, 1280, 33, 128, (64, 64, 4, 4, True), 2), (129, 400, 1, 128, (64, 128, 4, 4, True), 2),
    (4096, 4096, 20, 128, (64, 64, 4, 4, True), 4), (127, 1280, 64, -1, (64, 128, 3, 4, False), 3),
    (70, 3072, 17, 128, (64, 64, 4, 4, True), 4), (96, 896, 9, 128, (64, 64, 3, 4, True), 4),
    (300, 2048, 130, 128, (128, 128, 4, 8, True), 2)])
def test_gluon_w8a8_k_split_equals_triton_split_the_same_way(n, k, m, act_group, tile, split):
    """Each split's blocks from zero, the slots added in split order: the Triton kernel's sums at the same split
    (uneven splits, one tile a split, a last split of one 128-column block, two warpgroups, M = 1, per-token
    activations; a second call reuses the zeroed tickets)."""
    _, tensors, meta = packed("w8", n, k, 128, seed=n + m + split)
    codes, scales = _acts(m, k, act_group, seed=m + split)
    tri = int8_matmul(codes, scales, act_group, "w8", tensors, meta, config=TileConfig(64, 64, split, 4, 3))
    for _ in range(2):
        got = w8a8_wgmma_matmul(codes, scales, act_group, tensors, meta, *tile, split)
        assert torch.equal(got, tri)
    assert rel_err(got, int8_reference(codes, scales, act_group, "w8", tensors, meta)) < 1e-3


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("n,k,m,tile,split", [
    (200, 1280, 33, (64, 128, 4, 4), 1), (129, 400, 1, (64, 64, 3, 4), 2), (4096, 4096, 300, (128, 128, 4, 8), 1),
    (127, 3072, 70, (64, 128, 4, 4, True), 4), (300, 128, 17, (64, 64, 4, 4), 1), (96, 896, 9, (64, 64, 6, 4), 2),
    (4096, 4096, 600, (128, 128, 3, 8, False), 1), (200, 1280, 129, (128, 128, 3, 8, False), 2)])
def test_per_channel_w8a8_sums_over_k_with_the_triton_kernels_bits(n, k, m, tile, split):
    """Per-channel weights and per-token activations: one int32 sum a split (ragged N, M = 1, one block, more
    stages than blocks, two warpgroups, the launch rule's 128×128×3 tile), the Triton kernel's bits at the same
    split, the reference's values."""
    _, tensors, meta = packed("w8", n, k, -1, seed=n + m)
    codes, scales = _acts(m, k, -1, seed=m)
    assert per_channel_sum(-1, tensors["scales"].shape[0], tensors["qweight"].shape[1])
    tri = int8_matmul(codes, scales, -1, "w8", tensors, meta, config=TileConfig(64, 64, split, 4, 3))
    got = w8a8_wgmma_matmul(codes, scales, -1, tensors, meta, *tile, split_k=split)
    assert torch.equal(got, tri)
    assert rel_err(got, int8_reference(codes, scales, -1, "w8", tensors, meta)) < 1e-3


@pytest.mark.gpu
@hopper
def test_int8_matmul_runs_the_first_launch_of_its_plan_with_the_triton_kernels_bits(monkeypatch):
    """Selection rules are checked by invariants: with no tuned tables, int8_matmul runs the first launch of the
    registry's plan for W8A8 (the A8 GEMV at decode sizes, this kernel, the Triton kernel), within the reference's
    tolerance and, where that launch sums in the Triton kernel's order, bit for bit the Triton kernel at its K
    split."""
    calls = record_kernel_launches(monkeypatch)
    _, tensors, meta = packed("w8", 4096, 512, 128, seed=1)
    _, wide, wide_meta = packed("w8", 4224, 512, 128, seed=2)
    codes, scales = _acts(256, 512, 128, 1)
    for (t, mt), m, dtype in [((tensors, meta), 256, torch.float16), ((tensors, meta), 64, torch.bfloat16),
                              ((tensors, meta), 8, torch.float16), ((tensors, meta), 17, torch.float16),
                              ((wide, wide_meta), 64, torch.float16), ((wide, wide_meta), 200, torch.bfloat16)]:
        n = int(mt["out_features"])
        launch = planned_launch(monkeypatch, "a8", ("w8",), m, n, 512, 128, dtype)
        calls.clear()
        out = int8_matmul(codes[:m], scales[:m], 128, "w8", t, mt, out_dtype=dtype)
        assert calls == [launch], (m, n, launch)
        tol = 1e-3 if dtype == torch.float16 else 4e-3
        assert rel_err(out, int8_reference(codes[:m], scales[:m], 128, "w8", t, mt)) < tol, (m, n, launch)
        split = a8_split(*launch)
        if split is not None:
            assert torch.equal(out, int8_matmul(codes[:m], scales[:m], 128, "w8", t, mt, out_dtype=dtype,
                                                config=TileConfig(64, 64, split, 4, 3))), (m, n, launch)


@pytest.mark.gpu
@hopper
def test_every_default_and_tune_launch_equals_triton_at_its_split(monkeypatch):
    """Every launch of this kernel's default and tune space, through int8_matmul: the Triton kernel's bits at the
    launch's K split."""
    from quantkit.runtime.kernels.gemm import GluonW8a8, problem_for

    kernel = GluonW8a8()
    for n, k, m in ((4096, 1024, 17), (1000, 2048, 130), (300, 768, 600)):
        _, tensors, meta = packed("w8", n, k, 128, seed=n + m)
        codes, scales = _acts(m, k, 128, seed=m)
        p = problem_for("a8", ("w8",), m, n, k, 128, torch.float16, codes.device)
        launches = list(dict.fromkeys(kernel.configs(p) + kernel.candidates(p)))
        assert launches, (n, k, m)
        for cfg in launches:
            got = int8_matmul(codes, scales, 128, "w8", tensors, meta, kernel=kernel.name, launch_config=cfg)
            tri = int8_matmul(codes, scales, 128, "w8", tensors, meta, config=TileConfig(64, 64, cfg[5], 4, 3))
            assert torch.equal(got, tri), (n, k, m, cfg)


@pytest.mark.gpu
@hopper
def test_w4a8_and_mixed_prefill_through_the_int8_operand_equal_their_triton_kernels(monkeypatch):
    """MixLLM W4A8 and a mixed layer from MIXLLM_OPERAND_MIN_M tokens: with no tuned tables, the first launch of
    each plan runs; where that is the TMA kernel it reads the materialized int8 operand, and either way the result
    is the Triton kernel's bits at the launch's K split."""
    operands = []

    def spy(*args, **kwargs):
        operands.append(args[3]["qweight"].shape)  # the materialized operand: [N, Kp] int8
        return w8a8_wgmma_matmul(*args, **kwargs)

    monkeypatch.setattr(gluon_w8a8, "w8a8_wgmma_matmul", spy)
    calls = record_kernel_launches(monkeypatch)
    m, n, k = MIXLLM_OPERAND_MIN_M + 3, 300, 768
    codes, scales = _acts(m, k, 128, seed=3)
    _, tensors, meta = packed("w4a16", n, k, 128, seed=3)
    parts = _mixed_parts(n, k, seed=4)
    for op, layouts in (("a8", ("w4a16",)), ("a8_mixed", tuple(p[0] for p in parts))):
        launch = planned_launch(monkeypatch, op, layouts, m, n, k, 128, torch.float16)
        calls.clear()
        operands.clear()
        if op == "a8":
            got = int8_matmul(codes, scales, 128, "w4a16", tensors, meta)
        else:
            got = mixed_int8_matmul(codes, scales, 128, parts, n)
        assert calls == [launch], (op, launch)
        assert operands == ([(n, k)] if launch[0].startswith("gluon_sm90.w8a8") else []), (op, launch)
        tile = TileConfig(64, 64, a8_split(*launch), 4, 3)
        if op == "a8":
            assert torch.equal(got, int8_matmul(codes, scales, 128, "w4a16", tensors, meta, config=tile))
        else:
            assert torch.equal(got, mixed_int8_matmul(codes, scales, 128, parts, n, config=tile))


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("m", [MIXLLM_OPERAND_MIN_M + 3, 2100])
def test_mixed_liquidquant_prefill_is_one_per_channel_product_with_the_triton_kernels_bits(monkeypatch, m):
    """A mixed LiquidQuant layer (LiquidQuant + per-channel 8-bit rows, per-token activations) from
    MIXLLM_OPERAND_MIN_M tokens: the first launch of its plan, the TMA kernel on the per-channel operand (64- and
    128-token tiles), gives the Triton mixed kernel's bits at its K split."""
    operands = []

    def spy(*args, **kwargs):
        operands.append(tuple(args[3]["scales"].shape))
        return w8a8_wgmma_matmul(*args, **kwargs)

    monkeypatch.setattr(gluon_w8a8, "w8a8_wgmma_matmul", spy)
    calls = record_kernel_launches(monkeypatch)
    n, k = 4096, 1024  # at 2100 tokens the launch rule takes 128×128 tiles
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(m))
    parts = []
    for layout, rows, group in (("w4a8-lqq", perm[400:].sort().values, 128), ("w8", perm[:400].sort().values, -1)):
        _, tensors, meta = packed(layout, len(rows), k, group, seed=len(rows))
        parts.append((layout, tensors, meta, rows.to(torch.int32).to(DEVICE)))
    codes, scales = _acts(m, k, -1, seed=m)
    launch = planned_launch(monkeypatch, "a8_mixed", ("w4a8-lqq", "w8"), m, n, k, -1, torch.float16, -1)
    assert launch[0] == "gluon_sm90.w8a8_mixed" and launch[1][:2] == ((128, 128) if m > 2000 else (64, 128))
    calls.clear()
    got = mixed_int8_matmul(codes, scales, -1, parts, n)
    assert calls == [launch] and operands == [(1, n)]
    tile = TileConfig(64, 64, a8_split(*launch), 4, 3)
    assert torch.equal(got, mixed_int8_matmul(codes, scales, -1, parts, n, config=tile))
    for layout, t, mt, rows in parts:
        assert rel_err(got[:, rows.long()], int8_reference(codes, scales, -1, layout, t, mt)) < 1e-3
