"""The Gluon LiquidQuant wgmma kernel (quantkit/runtime/kernels/gluon_sm90/lqq_wgmma.py): the reasons it declines and
the fallback where a launch does not build run anywhere; its numbers run on a Hopper GPU only (Gluon has no CPU interpreter), where they must equal
the Triton LiquidQuant kernel's bit for bit at the same K split and stay within fp16 rounding of the reference."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (quantkit.runtime.kernels.jit)

import pytest  # noqa: E402

from quantkit.quant.act import quantize_activation_int  # noqa: E402
from quantkit.runtime.kernels.triton.launch import TileConfig  # noqa: E402
from quantkit.runtime.kernels.gemm import int8_matmul  # noqa: E402
from quantkit.runtime.kernels.gluon_sm90.lqq_wgmma import (HAVE_GLUON, lqq_wgmma_matmul, lqq_wgmma_problem,  # noqa: E402
                                              one_copy_per_tile)
from quantkit.runtime.kernels.reference import int8_reference  # noqa: E402
from quantkit.runtime.kernels.gluon_sm90 import lqq_wgmma as gluon_lqq_wgmma  # noqa: E402
from tests.kernels_helpers import (DEVICE, a8_split, pretend_hopper, packed, planned_launch, poisoned,  # noqa: E402
                                   record_kernel_launches, rel_err)

ON_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and HAVE_GLUON
hopper = pytest.mark.skipif(not ON_HOPPER, reason="needs a Hopper (sm_90) GPU and Triton's Gluon")


def _acts(m: int, k: int, seed: int):
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed)) * 3
    codes, scales = quantize_activation_int(x, 8, -1)
    return codes.to(DEVICE), scales.float().to(DEVICE)


def test_problem_names_what_the_kernel_cannot_take():
    _, _, meta = packed("w4a8-lqq", 64, 512, 128)
    codes, _ = _acts(40, 512, 0)
    assert "not w4a8-lqq" in lqq_wgmma_problem(codes, -1, "w8", meta)
    assert "per-token" in lqq_wgmma_problem(codes, 128, "w4a8-lqq", meta)
    _, _, m300 = packed("w4a8-lqq", 64, 300, 128)
    c300, _ = _acts(40, 300, 0)
    assert "multiple of 256" in lqq_wgmma_problem(c300, -1, "w4a8-lqq", m300)
    wide = torch.zeros(40, 520, dtype=torch.int8, device=codes.device)
    assert "16-byte" in lqq_wgmma_problem(wide[:, 1:513], -1, "w4a8-lqq", meta)
    f32 = torch.empty(40, 64, dtype=torch.float32, device=codes.device)
    assert "fp16" in lqq_wgmma_problem(codes, -1, "w4a8-lqq", meta, f32)
    if not ON_HOPPER:
        assert lqq_wgmma_problem(codes, -1, "w4a8-lqq", meta) is not None


def test_a_config_that_does_not_build_is_declined_from_then_on_and_later_errors_are_raised(monkeypatch):
    """A config that fails its first launch is declined without another try; the kernel as a whole only after
    BROKEN_AFTER failed configs with none that ran (a renamed operation fails them all); a config's failure next
    to one that ran declines that config alone; a config that ran raises its later errors."""
    from quantkit.runtime.kernels.gluon_sm90 import common as wgmma_common

    monkeypatch.setattr(wgmma_common, "_FAILED", {})
    monkeypatch.setattr(wgmma_common, "_LAUNCHED", set())
    calls = []

    def broken():
        calls.append(1)
        raise RuntimeError("async_copy_global_to_shared has been removed; call async_load instead")

    with pytest.warns(RuntimeWarning, match="did not build"):
        assert wgmma_common.launch_or_decline("lqq_wgmma", (64, 3, 1), broken) is None
    assert wgmma_common.launch_or_decline("lqq_wgmma", (64, 3, 1), broken) is None and len(calls) == 1
    assert wgmma_common.config_declined("lqq_wgmma", (64, 3, 1))
    assert not wgmma_common.config_declined("lqq_wgmma", (128, 3, 1))
    assert wgmma_common.kernel_broken("lqq_wgmma") is None       # one config: maybe only that one
    assert wgmma_common.launch_or_decline("lqq_wgmma", (128, 3, 1), broken) is None   # no second warning
    assert "async_load" in wgmma_common.kernel_broken("lqq_wgmma")
    codes = torch.zeros(4, 256, dtype=torch.int8)
    if wgmma_common.HAVE_GLUON and ON_HOPPER:
        assert "did not build" in wgmma_common.hopper_problem(codes.cuda(), 256, None, torch.float16, "lqq_wgmma")

    assert wgmma_common.launch_or_decline("w8a8_wgmma", (64, 64, 4, 4), lambda: 7) == 7
    with pytest.warns(RuntimeWarning, match="did not build"):
        assert wgmma_common.launch_or_decline("w8a8_wgmma", (64, 128, 4, 4), broken) is None
    assert wgmma_common.launch_or_decline("w8a8_wgmma", (64, 128, 8, 4), broken) is None
    assert wgmma_common.kernel_broken("w8a8_wgmma") is None      # another config ran: only these two declined
    with pytest.raises(RuntimeError):  # the same config ran before: a real error, raised
        wgmma_common.launch_or_decline("w8a8_wgmma", (64, 64, 4, 4), broken)

    def oom():
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(torch.cuda.OutOfMemoryError):  # out of memory on a first launch: raised, not declined
        wgmma_common.launch_or_decline("w8a8_wgmma", (128, 128, 4, 4), oom)
    assert not wgmma_common.config_declined("w8a8_wgmma", (128, 128, 4, 4))


def test_a_launch_that_does_not_build_falls_back_to_the_next_kernel_of_the_plan(monkeypatch):
    """A lqq_wgmma launch that fails to build is declined (a warning names the fallback) and int8_matmul runs the
    next entry of its plan — here the Triton kernel, interpreted, with the reference's numbers; the declined launch
    is not tried again. (The launch rules are replaced: this checks the fallback, not their choice.)"""
    from quantkit.runtime.kernels import heuristic
    from quantkit.runtime.kernels.gemm import LqqLaunch
    from quantkit.runtime.kernels.gluon_sm90 import common as wgmma_common

    launch = (64, 3, 1, 0, 1)
    monkeypatch.setattr(heuristic, "lqq_cluster_launch", lambda m, n, k, sms: None)
    monkeypatch.setattr(heuristic, "lqq_k_pair", lambda m, n, k, sms: False)
    monkeypatch.setattr(heuristic, "lqq_gluon_launch", lambda m, n, k, sms: ("wgmma", launch))
    pretend_hopper(monkeypatch)
    monkeypatch.setattr(wgmma_common, "_FAILED", {})
    monkeypatch.setattr(wgmma_common, "_LAUNCHED", set())
    monkeypatch.setattr(gluon_lqq_wgmma, "lqq_wgmma_problem", lambda *a, **kw: None)
    tried = []

    def broken(codes, scales, tensors, meta, *cfg, out=None, out_dtype=torch.float16):
        tried.append(cfg)
        raise RuntimeError("does not build here")

    monkeypatch.setattr(gluon_lqq_wgmma, "lqq_wgmma_matmul", broken)
    calls = record_kernel_launches(monkeypatch)
    _, tensors, meta = packed("w4a8-lqq", 64, 256, 128, seed=3)
    codes, scales = _acts(40, 256, 3)
    assert planned_launch(monkeypatch, "a8", ("w4a8-lqq",), 40, 64, 256, -1, torch.float16) == \
        ("gluon_sm90.lqq", LqqLaunch(gluon_lqq_wgmma.KERNEL, launch))
    ref = int8_reference(codes, scales, -1, "w4a8-lqq", tensors, meta)
    with pytest.warns(RuntimeWarning, match="lqq_wgmma did not build"):
        y = int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta)
    assert tried == [launch] and [name for name, _ in calls] == ["triton.int8"]
    assert rel_err(y, ref) < 1e-3
    calls.clear()
    y = int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta)  # declined from then on, without a try
    assert tried == [launch] and [name for name, _ in calls] == ["triton.int8"]
    assert rel_err(y, ref) < 1e-3


@pytest.mark.skipif(ON_HOPPER, reason="checks the fallback where the Gluon kernel cannot run")
def test_int8_matmul_falls_back_to_triton_where_gluon_cannot_run():
    _, tensors, meta = packed("w4a8-lqq", 64, 256, 128, seed=3)
    codes, scales = _acts(96, 256, 3)
    out = int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta, out=poisoned(96, 64, torch.float16))
    assert rel_err(out, int8_reference(codes, scales, -1, "w4a8-lqq", tensors, meta)) < 1e-3


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("n,k,m,bm,stages,split,tail", [
    (200, 512, 33, 32, 3, 1, 0), (1000, 1024, 130, 64, 3, 2, 0), (33, 768, 1, 64, 3, 2, 0),
    (127, 1280, 257, 128, 2, 1, 0), (64, 256, 5, 32, 3, 4, 0), (4096, 2048, 200, 64, 4, 4, 0),
    (65, 4096, 128, 128, 3, 2, 0),
    # a tail tile of 32/64 tokens beside the main one: partly or wholly past M, split or not
    (200, 512, 33, 32, 3, 1, 32), (1000, 1024, 130, 128, 3, 1, 32), (127, 1280, 257, 64, 3, 2, 32),
    (4096, 2048, 200, 128, 2, 1, 64), (65, 4096, 300, 128, 3, 2, 64), (64, 256, 5, 32, 3, 4, 64),
    (333, 768, 161, 128, 3, 1, 32)])
def test_gluon_kernel_equals_triton_at_the_same_split_and_the_reference(n, k, m, bm, stages, split, tail):
    _, tensors, meta = packed("w4a8-lqq", n, k, 128, seed=n + m)
    codes, scales = _acts(m, k, seed=m)
    # a row-strided output (rows n + 8 apart), as QuantLinear's callers may pass
    out = torch.full((m, n + 8), float("nan"), dtype=torch.float16, device=DEVICE)[:, :n]
    got = lqq_wgmma_matmul(codes, scales, tensors, meta, bm, stages, split, tail, out=out)
    tri = int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta, config=TileConfig(64, bm, split, 4, 3))
    assert torch.equal(got, tri)
    assert rel_err(got, int8_reference(codes, scales, -1, "w4a8-lqq", tensors, meta)) < 1e-3


def test_matmul_refuses_tiles_it_has_no_kernel_for():
    _, tensors, meta = packed("w4a8-lqq", 64, 256, 128)
    codes, scales = _acts(8, 256, 0)
    for bm, stages, split, tail in [(96, 3, 1, 0), (128, 3, 1, 16), (16, 3, 1, 32), (64, 1, 1, 0), (64, 3, 0, 0)]:
        with pytest.raises(ValueError, match="bm must be"):
            lqq_wgmma_matmul(codes, scales, tensors, meta, bm, stages, split, tail)


@pytest.mark.gpu
@hopper
def test_int8_matmul_runs_the_first_launch_of_its_plan_with_the_triton_kernels_bits(monkeypatch):
    """Selection rules are checked by invariants: with no tuned tables, int8_matmul runs the first launch of the
    registry's plan for LiquidQuant W4A8 (whichever kernel: the A8 GEMV, the CUDA cluster kernel, the K-pair or
    other Gluon launches, the Triton kernel), fp16 and bf16, within the reference's tolerance and — where the launch
    sums in the Triton kernel's order — bit for bit the Triton kernel at that launch's K split."""
    calls = record_kernel_launches(monkeypatch)
    for n, k, m in ((4096, 512, 16), (4096, 512, 40), (4096, 512, 160), (4096, 512, 256), (14336, 1024, 300),
                    (6144, 1024, 1000), (1024, 4096, 769), (512, 3584, 40), (1000, 1280, 2049)):
        _, tensors, meta = packed("w4a8-lqq", n, k, 128, seed=n + m)
        codes, scales = _acts(m, k, seed=m)
        ref = int8_reference(codes, scales, -1, "w4a8-lqq", tensors, meta)
        for dtype in (torch.float16, torch.bfloat16):
            launch = planned_launch(monkeypatch, "a8", ("w4a8-lqq",), m, n, k, -1, dtype)
            calls.clear()
            out = int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta, out_dtype=dtype)
            assert calls == [launch], (n, k, m, dtype)
            assert out.dtype == dtype
            assert rel_err(out, ref) < (1e-3 if dtype == torch.float16 else 8e-3), (n, k, m, launch)
            split = a8_split(*launch)
            if split is not None:
                tri = int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta, out_dtype=dtype,
                                  config=TileConfig(64, 128, split, 4, 3))
                assert torch.equal(out, tri), (n, k, m, launch)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("n,k,m,bm,stages,split,tail", [
    (200, 512, 33, 32, 3, 1, 0), (1000, 1024, 130, 128, 3, 1, 32), (65, 4096, 300, 128, 3, 2, 64),
    (127, 1280, 257, 64, 3, 2, 32), (64, 256, 5, 32, 3, 4, 0),
    (1000, 1024, 1025, 128, 3, 1, 64), (300, 768, 2049, 64, 3, 1, 32)])  # the large-M model's options, ragged M
def test_two_warpgroup_kernel_equals_triton_at_the_same_split(n, k, m, bm, stages, split, tail):
    """128 rows a program (the second warpgroup's partly or wholly past N): the same int32 sums, the same bits."""
    _, tensors, meta = packed("w4a8-lqq", n, k, 128, seed=n + m)
    codes, scales = _acts(m, k, seed=m)
    got = lqq_wgmma_matmul(codes, scales, tensors, meta, bm, stages, split, tail, 2)
    tri = int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta, config=TileConfig(64, bm, split, 4, 3))
    assert torch.equal(got, tri)


def test_one_copy_per_tile_only_for_two_warpgroups_with_a_tail():
    """The single cp.async per tile (one CTA barrier fewer) is taken only where the A/B measured it faster."""
    assert one_copy_per_tile(64, 2) == one_copy_per_tile(32, 2) == 0
    assert one_copy_per_tile(0, 2) == one_copy_per_tile(64, 1) == one_copy_per_tile(0, 1) == 2
