"""The warp-specialized Gluon LiquidQuant kernel (quantkit/runtime/kernels/gluon_sm90/lqq_ws.py): what it refuses and the
fallbacks where a launch does not build run anywhere; its numbers run on a Hopper GPU only (Gluon has no CPU interpreter), where they must
equal the Triton LiquidQuant kernel's bit for bit, call after call (a race would show as calls that differ)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (quantkit.runtime.kernels.jit)

import pytest  # noqa: E402

from quantkit.quant.act import quantize_activation_int  # noqa: E402
from quantkit.runtime.kernels.gemm import GluonLqq, GluonLqqKPair, int8_matmul, problem_for  # noqa: E402
from quantkit.runtime.kernels.registry import plan  # noqa: E402
from quantkit.runtime.kernels.triton.launch import TileConfig  # noqa: E402
from quantkit.runtime.kernels.gluon_sm90.lqq_ws import HAVE_GLUON, lqq_ws_matmul  # noqa: E402
from quantkit.runtime.kernels.gluon_sm90.common import ws_maxnreg  # noqa: E402
from quantkit.runtime.kernels.reference import int8_reference  # noqa: E402
from quantkit.runtime.kernels.gluon_sm90 import lqq_ws as gluon_lqq_ws  # noqa: E402
from quantkit.runtime.kernels.gluon_sm90 import lqq_wgmma as gluon_lqq_wgmma  # noqa: E402
from quantkit.runtime.kernels.gluon_sm90 import common as gluon_common  # noqa: E402
from tests.kernels_helpers import DEVICE, a8_split, gluon_lqq, pretend_hopper, packed, rel_err  # noqa: E402

ON_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and HAVE_GLUON
hopper = pytest.mark.skipif(not ON_HOPPER, reason="needs a Hopper (sm_90) GPU and Triton's Gluon")


def _acts(m: int, k: int, seed: int):
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed)) * 3
    codes, scales = quantize_activation_int(x, 8, -1)
    return codes.to(DEVICE), scales.float().to(DEVICE)


def test_register_budget_leaves_the_consumers_about_230_registers():
    assert ws_maxnreg(1, 2) == 128  # 2 x 256 threads x 128 = the register file; consumers setmaxnreg 232
    assert ws_maxnreg(1, 1) == 256
    assert ws_maxnreg(2, 1) == 168  # 384 threads


def test_matmul_refuses_launches_it_was_not_built_for():
    _, tensors, meta = packed("w4a8-lqq", 64, 256, 128)
    codes, scales = _acts(8, 256, 0)
    for bm, stages, tail, wg, per_sm in [(64, 3, 0, 1, 1), (128, 1, 0, 1, 1), (128, 3, 16, 1, 1), (128, 3, 0, 3, 1),
                                         (128, 3, 0, 1, 3), (128, 3, 64, 2, 2),
                                         # a 128-token tail: 256 KB of ring at four stages, no room for two an SM
                                         (128, 4, 128, 2, 1), (128, 3, 128, 1, 2)]:
        with pytest.raises(ValueError, match="bm must be 128"):
            lqq_ws_matmul(codes, scales, tensors, meta, bm, stages, tail, wg, per_sm)


def test_matmul_refuses_a_split_below_one():
    _, tensors, meta = packed("w4a8-lqq", 64, 256, 128)
    codes, scales = _acts(8, 256, 0)
    with pytest.raises(ValueError, match="split_k >= 1"):
        lqq_ws_matmul(codes, scales, tensors, meta, 128, 3, 0, 1, 1, 0)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("n,k,m,stages,tail,wg,per_sm,split", [
    (200, 512, 33, 3, 0, 1, 2, 1), (333, 1024, 130, 3, 0, 1, 2, 1), (65, 768, 1, 3, 0, 1, 1, 1),
    (4096, 2048, 769, 3, 0, 1, 2, 1), (1000, 1280, 257, 2, 0, 1, 2, 1), (127, 4096, 640, 3, 0, 1, 1, 1),
    # tails of 32/64 tokens: wholly or partly past M, one or two warpgroups
    (200, 512, 33, 3, 32, 1, 1, 1), (1000, 1024, 300, 2, 64, 1, 2, 1), (333, 768, 161, 3, 32, 1, 1, 1),
    (4096, 2048, 700, 3, 64, 2, 1, 1), (130, 2304, 1025, 3, 64, 2, 1, 1), (64, 256, 5, 2, 64, 2, 1, 1),
    # 160-token tiles, two an SM at two stages
    (1024, 1024, 2049, 2, 32, 1, 2, 1),
    # K splits: the k/v layer's launches, a split that does not divide the tiles (5 tiles in 2), a ragged last token
    # tile moved back over the tile before (its overlap rows stay out of the slots), tails, two warpgroups, a split
    # of one tile a program
    (1024, 4096, 769, 3, 0, 1, 2, 2), (1024, 4096, 128, 3, 0, 1, 2, 8), (333, 1280, 300, 3, 0, 1, 2, 2),
    (200, 1280, 300, 3, 32, 1, 1, 2), (1000, 2048, 161, 2, 64, 1, 2, 4), (4096, 2048, 700, 3, 64, 2, 1, 2),
    (64, 256, 5, 2, 0, 1, 2, 2), (130, 2304, 1025, 3, 32, 2, 1, 3), (1000, 2048, 161, 2, 64, 1, 2, 8),
    # two warpgroups (partitions of their own, each on its own split-K tickets): a tail of 32,
    # none, one K tile, a split of two-warpgroup programs over a ragged token tile
    (333, 768, 161, 3, 32, 2, 1, 1), (200, 512, 33, 3, 0, 2, 1, 1), (1000, 1280, 300, 2, 32, 2, 1, 1),
    (333, 1280, 300, 3, 0, 2, 1, 2),
    # 256-token programs (a 128-token tail tile): whole tiles, a ragged
    # last tile moved back (M = 1000, 513), a tail partly past M (M = 200), odd N, a K split, one K tile
    (4096, 2048, 1024, 3, 128, 2, 1, 1), (1000, 1280, 1000, 3, 128, 2, 1, 1), (333, 2304, 513, 3, 128, 2, 1, 1),
    (130, 768, 200, 3, 128, 2, 1, 1), (1000, 2048, 700, 3, 128, 2, 1, 2), (64, 256, 300, 2, 128, 2, 1, 1)])
def test_ws_kernel_equals_triton_at_the_same_split_call_after_call(n, k, m, stages, tail, wg, per_sm, split):
    """Bit for bit the Triton kernel's result at the same K split (which sums the same fp32 partials in the same
    order), call after call (a race would show as calls that differ), into a row-strided output, and in bf16."""
    _, tensors, meta = packed("w4a8-lqq", n, k, 128, seed=n + m + (split if split > 1 else 0))
    codes, scales = _acts(m, k, seed=m + (1 if split > 1 else 0))
    tri = int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta, config=TileConfig(64, 128, split, 4, 3))
    for _ in range(4):
        # a row-strided output (rows n + 8 apart), as QuantLinear's callers may pass
        out = torch.full((m, n + 8), float("nan"), dtype=torch.float16, device=DEVICE)[:, :n]
        got = lqq_ws_matmul(codes, scales, tensors, meta, 128, stages, tail, wg, per_sm, split, out=out)
        assert torch.equal(got, tri)
    assert rel_err(got, int8_reference(codes, scales, -1, "w4a8-lqq", tensors, meta)) < 1e-3
    bf = lqq_ws_matmul(codes, scales, tensors, meta, 128, stages, tail, wg, per_sm, split, out_dtype=torch.bfloat16)
    assert bf.dtype == torch.bfloat16
    assert torch.equal(bf, int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta, out_dtype=torch.bfloat16,
                                       config=TileConfig(64, 128, split, 4, 3)))


def test_k_pair_refuses_launches_it_was_not_built_for():
    """A K-pair launch takes 128 tokens without a tail, 2 or 4 stages (one warpgroup per ring slot) and one
    warpgroup of rows: anything else is a ValueError naming what it takes, before any GPU work."""
    for kw in [dict(stages=3), dict(tail=32), dict(warpgroups=2), dict(per_sm=2)]:
        with pytest.raises(ValueError, match="K-pair"):
            lqq_ws_matmul(torch.zeros(4, 256, dtype=torch.int8), torch.ones(4, 1), {}, {}, k_pair=True,
                          **{"stages": 4, **kw})


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("n,k,m,stages,split", [
    (1024, 4096, 769, 4, 1), (1024, 4096, 513, 2, 1), (200, 512, 33, 4, 1), (333, 1280, 300, 4, 1),
    (127, 768, 130, 2, 1), (64, 256, 5, 4, 1), (1024, 4096, 769, 4, 2), (333, 1280, 300, 2, 2),
    (1000, 2048, 161, 4, 3), (4096, 2048, 1025, 4, 1)])
def test_k_pair_launch_equals_triton_at_the_same_split_call_after_call(n, k, m, stages, split):
    """Two warpgroups over alternate K tiles, their int32 sums added in shared memory: exact integers, so the
    Triton kernel's bits at the same split, call after call — odd and even tile counts, a program of one tile (the
    second warpgroup has none), ragged token tiles, splits, bf16."""
    _, tensors, meta = packed("w4a8-lqq", n, k, 128, seed=n + m + 11 * split)
    codes, scales = _acts(m, k, seed=m + 5)
    tri = int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta, config=TileConfig(64, 128, split, 4, 3))
    for _ in range(4):
        out = torch.full((m, n + 8), float("nan"), dtype=torch.float16, device=DEVICE)[:, :n]
        got = lqq_ws_matmul(codes, scales, tensors, meta, 128, stages, 0, 1, 1, split, out=out, k_pair=True)
        assert torch.equal(got, tri)
    bf = lqq_ws_matmul(codes, scales, tensors, meta, 128, stages, 0, 1, 1, split, out_dtype=torch.bfloat16,
                       k_pair=True)
    assert torch.equal(bf, int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta, out_dtype=torch.bfloat16,
                                       config=TileConfig(64, 128, split, 4, 3)))


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("n,k,m", [(200, 512, 130), (333, 2304, 513), (1024, 4096, 769), (1000, 1280, 1000),
                                   (6144, 512, 1000), (4096, 1024, 1024)])
def test_every_default_and_tune_launch_equals_triton_at_its_split(n, k, m):
    """Every launch of the LiquidQuant Gluon kernels' default rules and tune spaces for the product (warp-specialized
    ones with tails of 0-128 tokens, one or two warpgroups, the 256-token launch with its later tiles halved, K-pair
    launches, lqq_wgmma's tiles and splits), through int8_matmul: the Triton kernel's bits at its K split."""
    _, tensors, meta = packed("w4a8-lqq", n, k, 128, seed=n + m)
    codes, scales = _acts(m, k, seed=m)
    p = problem_for("a8", ("w4a8-lqq",), m, n, k, -1, torch.float16, codes.device)
    tri = {}
    for kernel in (GluonLqqKPair(), GluonLqq()):
        launches = list(dict.fromkeys(kernel.configs(p) + kernel.candidates(p)))
        for cfg in launches:
            split = a8_split(kernel.name, cfg)
            if split not in tri:
                tri[split] = int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta,
                                         config=TileConfig(64, 128, split, 4, 3))
            for _ in range(2):  # a race would show as calls that differ
                got = int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta, kernel=kernel.name,
                                  launch_config=cfg)
                assert torch.equal(got, tri[split]), (kernel.name, cfg)
    assert tri


def test_halved_tiles_take_the_256_token_launch_only():
    _, tensors, meta = packed("w4a8-lqq", 64, 256, 128)
    codes, scales = _acts(8, 256, 0)
    for tail, wg, split, halves_from in [(64, 2, 1, 0), (128, 1, 1, 0), (128, 2, 2, 0), (128, 2, 1, -1)]:
        with pytest.raises(ValueError, match="halved tiles"):
            lqq_ws_matmul(codes, scales, tensors, meta, 128, 3, tail, wg, 1, split, halves_from=halves_from)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("n,k,m,halves_from", [
    (4096, 2048, 1024, 100),  # 128 tiles: 28 of them as 56 programs
    (1000, 1280, 1000, 3),  # N not a multiple of 128; the ragged last token tile moved back, its halves too
    (333, 2304, 513, 0),  # every tile halved; the last token row (one token) has first halves only
    (333, 1280, 300, 4),  # whole tiles in the last token row (44 tokens) next to first halves of it
    (200, 512, 100, 0),  # M <= 128: first halves only
    (130, 768, 200, 1),  # one token tile, partly past M
    (64, 256, 300, 10)])  # halves_from past the last tile: none halved
def test_halved_tiles_equal_the_triton_kernel_call_after_call(n, k, m, halves_from):
    """A 256-token launch whose tiles from ``halves_from`` on run as two 128-token programs each: bit for bit the
    Triton kernel's result (the same int32 sums, the same epilogue), call after call, fp16 into a row-strided output
    and bf16."""
    _, tensors, meta = packed("w4a8-lqq", n, k, 128, seed=n + m)
    codes, scales = _acts(m, k, seed=m)
    for dtype in (torch.float16, torch.bfloat16):
        tri = int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta, out_dtype=dtype,
                          config=TileConfig(64, 128, 1, 4, 3))
        for _ in range(3):
            out = torch.full((m, n + 8), float("nan"), dtype=dtype, device=DEVICE)[:, :n]
            got = lqq_ws_matmul(codes, scales, tensors, meta, 128, 3, 128, 2, 1, out=out, out_dtype=dtype,
                                halves_from=halves_from)
            assert torch.equal(got, tri)


@pytest.mark.parametrize("n", [64, 128, 130, 333, 1000])
def test_halved_launch_programs_cover_every_output_once(n):
    """The halved launch's programs (lqq_ws.halved_programs) mapped to tiles as _lqq_ws_kernel's HALVES branch maps
    them (a mirror of its index arithmetic): every output row of every token is stored exactly once, for ragged and
    whole last token rows and every halves_from."""
    from quantkit.runtime.kernels.gluon_sm90.lqq_ws import halved_programs, tiles_with_second_half

    for m in list(range(1, 600, 7)) + [640, 768, 769, 1000, 1024, 1025]:
        row_tiles, tiles = -(-n // 128), -(-n // 128) * -(-m // 256)
        full = tiles_with_second_half(m, n)
        for h in sorted({0, 1, row_tiles, full - 1, full, full + 1, tiles - 1, tiles} & set(range(tiles + 1))):
            stored = torch.zeros(m, row_tiles, dtype=torch.int32)
            for pid in range(halved_programs(m, n, h)):
                second = int(pid >= tiles)
                tile = pid - second * (tiles - h)
                tail_on = pid < h
                first = (tile // row_tiles) * 256 + second * 128
                span = 256 if tail_on else 128
                row0 = max(min(first, m - span), 0)
                lo, hi = max(row0, first), min(row0 + span, m)  # the epilogue stores rows first <= r < M of its box
                if lo < hi:
                    stored[lo:hi, tile % row_tiles] += 1
            assert torch.equal(stored, torch.ones_like(stored)), (n, m, h)


def _fake_gluon_launches(monkeypatch, n: int, fails=lambda kernel, cfg, halves_from: False) -> list:
    """Replace lqq_ws_matmul and lqq_wgmma_matmul with fakes that record (kernel, launch arguments, halves_from) of
    each launch that builds — "k_pair" for the K-pair launches — and raise where ``fails`` says the launch does not
    build; both return zeros [M, n]."""
    launched = []

    def ws(codes, scales, tensors, meta, *cfg, out=None, out_dtype=torch.float16, k_pair=False, halves_from=None):
        kernel = "k_pair" if k_pair else gluon_lqq_ws.KERNEL
        if fails(kernel, cfg, halves_from):
            raise RuntimeError("a launch that does not build")
        launched.append((kernel, cfg, halves_from))
        return torch.zeros(codes.shape[0], n, dtype=out_dtype)

    def wgmma(codes, scales, tensors, meta, *cfg, out=None, out_dtype=torch.float16):
        if fails(gluon_lqq_wgmma.KERNEL, cfg, None):
            raise RuntimeError("a launch that does not build")
        launched.append((gluon_lqq_wgmma.KERNEL, cfg, None))
        return torch.zeros(codes.shape[0], n, dtype=out_dtype)

    monkeypatch.setattr(gluon_lqq_ws, "lqq_ws_matmul", ws)
    monkeypatch.setattr(gluon_lqq_wgmma, "lqq_wgmma_matmul", wgmma)
    return launched


def _record(choice) -> tuple:
    """What _fake_gluon_launches records for a plan entry of the LiquidQuant Gluon kernels."""
    if choice.kernel.name == "gluon_sm90.lqq_ws_k_pair":
        return "k_pair", tuple(choice.config), None
    kernel = gluon_lqq_wgmma.KERNEL if choice.config.kernel == gluon_lqq_wgmma.KERNEL else gluon_lqq_ws.KERNEL
    return kernel, tuple(choice.config.args), choice.config.halves_from


def _gluon_entries(m: int, n: int, k: int, dtype: torch.dtype) -> list:
    """The plan's entries of the LiquidQuant Gluon kernels that can run this product (on the DEVICE as the test
    presents it)."""
    p = problem_for("a8", ("w4a8-lqq",), m, n, k, -1, dtype, torch.device(DEVICE))
    return [c for c in plan(p) if c.ok and c.kernel.name.startswith("gluon_sm90.lqq")]


def test_a_tuned_halved_launch_that_does_not_build_falls_back_to_the_next_launch_of_the_plan(tmp_path, monkeypatch):
    """A tuned table's halved 256-token launch runs first; where it fails to build, a warning says so and the next
    launch of the plan runs, and the halved launch is declined from then on — on a build record of its own: halved
    failures never count against lqq_ws's other launches (common.kernel_broken)."""
    from quantkit.runtime.kernels import gemm, registry, tables
    from quantkit.runtime.kernels.gemm import LqqLaunch
    from quantkit.runtime.kernels.gluon_sm90 import common as wgmma_common
    from quantkit.runtime.kernels.gluon_sm90.lqq_ws import HALVES_KERNEL, KERNEL

    monkeypatch.setattr(gemm, "device_name", lambda device: "NVIDIA Test GPU")
    pretend_hopper(monkeypatch)
    monkeypatch.setenv(tables.ENV_DIR, str(tmp_path))
    monkeypatch.delenv(registry.ENV_TABLES, raising=False)
    halved = LqqLaunch(HALVES_KERNEL, (128, 3, 128, 2, 1, 1), 132)
    lqq = GluonLqq()
    tables.write_table(tmp_path, "NVIDIA Test GPU", (9, 0), 132, "a8", ("w4a8-lqq",), -1,
                       [{"n": n, "k": 4096, "m": 1024, "kernel": lqq.name, "config": lqq.config_to_json(halved)}
                        for n in (6144, 14336)], "quantkit tune", "abc1234", "2026-01-01T00:00:00Z")
    tables.clear_cache()
    monkeypatch.setattr(wgmma_common, "_FAILED", {})
    monkeypatch.setattr(wgmma_common, "_LAUNCHED", set())
    monkeypatch.setattr(gluon_lqq_wgmma, "lqq_wgmma_problem", lambda *a, **kw: None)
    launched = _fake_gluon_launches(monkeypatch, 6144, lambda kernel, cfg, halves_from: halves_from is not None)
    meta = {"in_features": 4096, "out_features": 6144}
    codes, scales = torch.zeros(1024, 4096, dtype=torch.int8), torch.ones(1024, 1)
    for dtype in (torch.float16, torch.bfloat16):
        entries = _gluon_entries(1024, 6144, 4096, dtype)
        assert entries[0].config == halved and "tuned" in entries[0].reason
        launched.clear()
        if dtype == torch.float16:
            with pytest.warns(RuntimeWarning, match="lqq_ws_halves did not build"):
                y = gluon_lqq(codes, scales, meta, dtype)
        else:  # the same launch for another output dtype: another config, tried (and failing) once more
            y = gluon_lqq(codes, scales, meta, dtype)
        assert y is not None and launched == [_record(entries[1])]
        launched.clear()  # declined from then on: straight to the next launch
        gluon_lqq(codes, scales, meta, dtype)
        assert launched == [_record(entries[1])]
    # two halved configs failed, none ran: the halved launches count as broken, lqq_ws's others do not
    assert wgmma_common.kernel_broken(HALVES_KERNEL) is not None and wgmma_common.kernel_broken(KERNEL) is None
    # another layer's tuned halved launch is declined before it is tried
    launched.clear()
    meta = {"in_features": 4096, "out_features": 14336}
    entries = _gluon_entries(1024, 14336, 4096, torch.float16)
    assert entries[0].config == halved
    gluon_lqq(codes, scales, meta, torch.float16)
    assert launched == [_record(entries[1])]


def test_dispatch_falls_back_to_lqq_wgmma_where_the_ws_kernel_does_not_build_and_runs_it_on_its_own(monkeypatch):
    """A 128-token tile's launches: the warp-specialized one, then the same tile on lqq_wgmma. A ws launch that
    fails to build falls back to that lqq_wgmma launch (the warning names the fallback); a broken lqq_wgmma does not
    stop a working lqq_ws (each kernel has its own build record); with both broken no Gluon launch runs. (The launch
    rules are replaced: this checks the fallback, not their choice.)"""
    from quantkit.runtime.kernels import heuristic
    from quantkit.runtime.kernels.gluon_sm90 import common as wgmma_common

    monkeypatch.setattr(heuristic, "lqq_cluster_launch", lambda m, n, k, sms: None)
    monkeypatch.setattr(heuristic, "lqq_k_pair", lambda m, n, k, sms: False)
    monkeypatch.setattr(heuristic, "lqq_gluon_launch", lambda m, n, k, sms: ("ws", (128, 3, 0, 1, 2, 1)))
    pretend_hopper(monkeypatch)
    monkeypatch.setattr(wgmma_common, "_FAILED", {})
    monkeypatch.setattr(wgmma_common, "_LAUNCHED", set())
    broken: set[str] = set()
    monkeypatch.setattr(gluon_lqq_wgmma, "lqq_wgmma_problem", lambda *a, **kw: None)
    monkeypatch.setattr(gluon_common, "kernel_broken", lambda kernel: "broken" if kernel in broken else None)
    ws_builds = [False]
    launched = _fake_gluon_launches(monkeypatch, 6144,
                                    lambda kernel, cfg, halves: kernel == gluon_lqq_ws.KERNEL and not ws_builds[0])
    meta = {"in_features": 4096, "out_features": 6144}
    codes, scales = torch.zeros(769, 4096, dtype=torch.int8), torch.ones(769, 1)
    ws, wgmma = _gluon_entries(769, 6144, 4096, torch.float16)
    assert ws.config.kernel == gluon_lqq_ws.KERNEL and wgmma.config.kernel == gluon_lqq_wgmma.KERNEL
    bm, _, tail, _, _, split = ws.config.args
    assert (wgmma.config.args[0], wgmma.config.args[2], wgmma.config.args[3]) == (bm, split, tail)  # the same tile
    with pytest.warns(RuntimeWarning, match="lqq_ws did not build"):
        y = gluon_lqq(codes, scales, meta, torch.float16)
    assert y is not None and launched == [_record(wgmma)]
    # the other way round: lqq_wgmma does not build here, lqq_ws does
    monkeypatch.setattr(wgmma_common, "_FAILED", {})
    launched.clear()
    ws_builds[0] = True
    broken.add(gluon_lqq_wgmma.KERNEL)
    y = gluon_lqq(codes, scales, meta, torch.float16)
    assert y is not None and launched == [_record(ws)]
    broken.add(gluon_lqq_ws.KERNEL)  # neither: the Triton kernel (None here)
    assert gluon_lqq(codes, scales, meta, torch.float16) is None


def test_dispatch_runs_a_k_pair_launch_where_the_rule_says_and_falls_back_where_it_does_not_build(monkeypatch):
    """Where heuristic.lqq_k_pair holds, the K-pair kernel's launch of lqq_ws runs; where it does not build, a warning
    names the fallback and the next launch of the plan runs. (The K-pair rule is replaced: this checks the wiring,
    not its choice.)"""
    from quantkit.runtime.kernels import heuristic
    from quantkit.runtime.kernels.gluon_sm90 import common as wgmma_common

    monkeypatch.setattr(heuristic, "lqq_cluster_launch", lambda m, n, k, sms: None)
    monkeypatch.setattr(heuristic, "lqq_k_pair", lambda m, n, k, sms: True)
    pretend_hopper(monkeypatch)
    monkeypatch.setattr(wgmma_common, "_FAILED", {})
    monkeypatch.setattr(wgmma_common, "_LAUNCHED", set())
    monkeypatch.setattr(gluon_lqq_wgmma, "lqq_wgmma_problem", lambda *a, **kw: None)
    monkeypatch.setattr(gluon_common, "kernel_broken", lambda kernel: None)
    pair_builds = [True]
    launched = _fake_gluon_launches(monkeypatch, 1024, lambda kernel, cfg, halves: kernel == "k_pair"
                                    and not pair_builds[0])
    meta = {"in_features": 4096, "out_features": 1024}
    codes, scales = torch.zeros(769, 4096, dtype=torch.int8), torch.ones(769, 1)
    entries = _gluon_entries(769, 1024, 4096, torch.float16)
    assert entries[0].kernel.name == "gluon_sm90.lqq_ws_k_pair" and len(entries) > 1
    assert gluon_lqq(codes, scales, meta, torch.float16) is not None
    assert launched == [_record(entries[0])]
    launched.clear()
    pair_builds[0] = False  # a fresh process where the K-pair launch does not build
    monkeypatch.setattr(wgmma_common, "_FAILED", {})
    monkeypatch.setattr(wgmma_common, "_LAUNCHED", set())
    with pytest.warns(RuntimeWarning, match="did not build"):
        assert gluon_lqq(codes, scales, meta, torch.float16) is not None
    assert launched == [_record(entries[1])]


