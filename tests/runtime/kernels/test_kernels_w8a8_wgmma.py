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
from quantkit.runtime.kernels.triton import int8_gemm  # noqa: E402
from quantkit.runtime.kernels.configs import (MIXLLM_MIXED_OPERAND_MIN_M, MIXLLM_OPERAND_MIN_M,  # noqa: E402
                                             TileConfig, w8a8_wgmma_config)
from quantkit.runtime.kernels.gemm import int8_matmul, mixed_int8_matmul  # noqa: E402
from quantkit.runtime.kernels.triton.int8_operand import mixed_w8_operand, w8_operand  # noqa: E402
from quantkit.runtime.kernels.reference import int8_reference, int8_weight  # noqa: E402
from quantkit.runtime.kernels.gluon_sm90.w8a8_wgmma import w8a8_wgmma_matmul, w8a8_wgmma_problem  # noqa: E402
from quantkit.runtime.kernels.gluon_sm90.common import HAVE_GLUON  # noqa: E402
from quantkit.runtime.kernels.gluon_sm90 import w8a8_wgmma as gluon_w8a8  # noqa: E402
from tests.kernels_helpers import DEVICE, packed, record_launches, rel_err  # noqa: E402

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


def test_rule_takes_w8a8_from_17_tokens_with_fewer_rows_per_program_on_small_launches():
    assert w8a8_wgmma_config(16, 14336, 4096) is None and w8a8_wgmma_config(48, 14336, 4096) is None
    assert w8a8_wgmma_config(64, 14336, 4096) is None
    assert w8a8_wgmma_config(17, 14336, 4096) == (64, 64, 4, 4, True, 1) and w8a8_wgmma_config(32, 28672, 4096)[1] == 128
    assert w8a8_wgmma_config(65, 14336, 4096) == (64, 128, 4, 4, True, 1)
    assert w8a8_wgmma_config(256, 4096, 4096) == (64, 64, 4, 4, True, 1)  # 4 × 32 = 128 programs of 128 rows
    assert w8a8_wgmma_config(512, 4096, 4096) == (64, 128, 4, 4, True, 1)


def test_rule_splits_k_on_launches_of_few_programs_and_takes_33_to_64_tokens_on_narrow_layers():
    split = {m: w8a8_wgmma_config(m, 4096, 4096)[-1] for m in (17, 48, 64, 65, 192, 193)}
    assert split == {17: 4, 48: 4, 64: 4, 65: 2, 192: 2, 193: 1}  # 64, 128, 192, 256 programs of 64 rows
    assert w8a8_wgmma_config(32, 6144, 4096)[-1] == 4 and w8a8_wgmma_config(128, 6144, 4096)[-1] == 2
    assert w8a8_wgmma_config(32, 14336, 4096)[-1] == 1  # 224 programs: split 2 would pass W8A8_SPLIT_PROGRAMS
    assert w8a8_wgmma_config(32, 4096, 3584)[-1] == 2  # 14 tiles of 256 columns: 14 // 4 < MIN_SPLIT_TILES
    assert w8a8_wgmma_config(32, 4096, 512)[-1] == 1
    assert w8a8_wgmma_config(48, 4096, 4096) is not None and w8a8_wgmma_config(48, 4224, 4096) is None


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
    # sizes where the rules would pick the TMA kernel (w8 above 64 tokens) or the int8 operand (MIXLLM_OPERAND_MIN_M on)
    m8, mo, k = 70, MIXLLM_OPERAND_MIN_M, 256
    codes, scales = _acts(m8, k, 128, seed=2)
    _, tensors, meta = packed("w8", 30, k, 128, seed=2)
    assert w8a8_wgmma_config(m8, 30, k) is not None
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
def test_int8_matmul_runs_the_w8a8_kernel_where_the_rule_picks_it(monkeypatch):
    calls = record_launches(monkeypatch, gluon_w8a8, "w8a8_wgmma_matmul", 5, 11)
    _, tensors, meta = packed("w8", 4096, 512, 128, seed=1)
    codes, scales = _acts(256, 512, 128, 1)
    out = int8_matmul(codes, scales, 128, "w8", tensors, meta)
    assert calls == [w8a8_wgmma_config(256, 4096, 512)]
    assert rel_err(out, int8_reference(codes, scales, 128, "w8", tensors, meta)) < 1e-3
    # 64 tokens on a 4096-row layer: this kernel (W8A8_WGMMA_MID_M); on wider layers the Triton kernel; decode: the
    # A8 GEMV
    int8_matmul(codes[:64], scales[:64], 128, "w8", tensors, meta)
    assert calls[1] == w8a8_wgmma_config(64, 4096, 512)
    del calls[1]
    _, wide, wide_meta = packed("w8", 4224, 512, 128, seed=2)
    int8_matmul(codes[:64], scales[:64], 128, "w8", wide, wide_meta)
    int8_matmul(codes[:8], scales[:8], 128, "w8", tensors, meta)
    assert len(calls) == 1


@pytest.mark.gpu
@hopper
def test_w4a8_and_mixed_prefill_through_the_int8_operand_equal_their_triton_kernels(monkeypatch):
    calls = []

    def spy(*args, **kwargs):
        calls.append(args[3]["qweight"].shape)  # the materialized operand: [N, Kp] int8
        return w8a8_wgmma_matmul(*args, **kwargs)

    monkeypatch.setattr(gluon_w8a8, "w8a8_wgmma_matmul", spy)
    m, n, k = max(MIXLLM_OPERAND_MIN_M, MIXLLM_MIXED_OPERAND_MIN_M) + 3, 300, 768
    codes, scales = _acts(m, k, 128, seed=3)
    _, tensors, meta = packed("w4a16", n, k, 128, seed=3)
    via = int8_matmul(codes, scales, 128, "w4a16", tensors, meta)
    assert torch.equal(via, int8_matmul(codes, scales, 128, "w4a16", tensors, meta, config=TileConfig(64, 64, 1, 4, 3)))
    parts = _mixed_parts(n, k, seed=4)
    mixed = mixed_int8_matmul(codes, scales, 128, parts, n)
    assert torch.equal(mixed, mixed_int8_matmul(codes, scales, 128, parts, n, config=TileConfig(64, 64, 1, 4, 3)))
    assert calls == [(n, k), (n, k)]  # both through the materialized operand (Kp = K = 768)
