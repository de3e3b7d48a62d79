"""The warp-specialized Gluon LiquidQuant kernel (quantkit/runtime/kernels/gluon_sm90/lqq_ws.py): which launches it takes and
what it refuses run anywhere; its numbers run on a Hopper GPU only (Gluon has no CPU interpreter), where they must
equal the Triton LiquidQuant kernel's bit for bit, call after call (a race would show as calls that differ)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (quantkit.runtime.kernels.jit)

import pytest  # noqa: E402

from quantkit.quant.act import quantize_activation_int  # noqa: E402
from quantkit.runtime.kernels.triton import int8_gemm  # noqa: E402
import quantkit.runtime.kernels.configs as configs  # noqa: E402
from quantkit.runtime.kernels.configs import TileConfig, lqq_wgmma_launch, lqq_ws_launch  # noqa: E402
from quantkit.runtime.kernels.gemm import int8_matmul  # noqa: E402
from quantkit.runtime.kernels.gluon_sm90.lqq_ws import HAVE_GLUON, lqq_ws_matmul  # noqa: E402
from quantkit.runtime.kernels.gluon_sm90.common import ws_maxnreg  # noqa: E402
from quantkit.runtime.kernels.reference import int8_reference  # noqa: E402
from quantkit.runtime.kernels.gluon_sm90 import lqq_ws as gluon_lqq_ws  # noqa: E402
from quantkit.runtime.kernels.gluon_sm90 import lqq_wgmma as gluon_lqq_wgmma  # noqa: E402
from quantkit.runtime.kernels.gluon_sm90 import common as gluon_common  # noqa: E402
from tests.kernels_helpers import DEVICE, gluon_lqq, pretend_hopper, packed, record_launches, rel_err  # noqa: E402

ON_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and HAVE_GLUON
hopper = pytest.mark.skipif(not ON_HOPPER, reason="needs a Hopper (sm_90) GPU and Triton's Gluon")


def _acts(m: int, k: int, seed: int):
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed)) * 3
    codes, scales = quantize_activation_int(x, 8, -1)
    return codes.to(DEVICE), scales.float().to(DEVICE)


def test_it_takes_the_unsplit_128_token_launches_only(monkeypatch):
    assert lqq_ws_launch((128, 3, 1, 0), 1) == (128, 3, 0, 1, 2, 1)  # two programs an SM, as lqq_wgmma's
    assert lqq_ws_launch((128, 2, 1, 0), 1) == (128, 3, 0, 1, 2, 1)  # three an SM did not assemble: three stages
    assert lqq_ws_launch((128, 2, 1, 64), 1) == (128, 2, 64, 1, 2, 1)
    assert lqq_ws_launch((128, 3, 1, 32), 1) == (128, 3, 32, 1, 1, 1)
    assert lqq_ws_launch((128, 3, 1, 64), 2) == (128, 3, 64, 2, 1, 1)
    for cfg, wg in [((64, 3, 1, 32), 1), ((64, 3, 1, 32), 2), ((32, 3, 2, 0), 1), ((128, 3, 2, 32), 1)]:
        assert lqq_ws_launch(cfg, wg) is None, (cfg, wg)
    monkeypatch.setattr(configs, "LQQ_WS_TWO_WARPGROUPS", False)
    assert lqq_ws_launch((128, 3, 1, 64), 2) is None
    # every launch it takes fits the register budgets it was measured with
    for n, k in [(4096, 4096), (6144, 4096), (14336, 4096), (1024, 4096), (4096, 14336), (28672, 4096)]:
        for m in range(65, 4097, 61):
            launch = lqq_wgmma_launch(m, n, k)
            ws = launch and lqq_ws_launch(*launch)
            if ws:
                assert ws[0] == 128 and ws[4] <= 3 - ws[3], (n, k, m, ws)


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
    # the large-M model's 160-token tiles, two an SM at two stages (configs.LQQ_BIG_M_WS)
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
    # 256-token programs (a 128-token tail tile; configs.LQQ_BIG_M_TOKENS_256): whole tiles, a ragged
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
def test_int8_matmul_runs_the_ws_kernel_where_the_rule_gives_it_a_launch(monkeypatch):
    calls = record_launches(monkeypatch, gluon_lqq_ws, "lqq_ws_matmul", 4, 10)
    _, tensors, meta = packed("w4a8-lqq", 4096, 1024, 128, seed=1)
    codes, scales = _acts(1024, 1024, 1)
    launch = lqq_wgmma_launch(1024, 4096, 1024)
    assert lqq_ws_launch(*launch) is not None
    out = int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta)
    assert calls == [lqq_ws_launch(*launch)]
    assert torch.equal(out, int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta, use_asm=True,
                                        config=TileConfig(64, 128, 1, 4, 3)))


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


@pytest.mark.gpu
@hopper
def test_int8_matmul_runs_the_256_token_launch_with_the_triton_kernels_bits(monkeypatch):
    """The large-M model's 256-token launch through int8_matmul: lqq_ws with a 128-token tail, the
    Triton kernel's bits, fp16 and bf16."""
    calls = record_launches(monkeypatch, gluon_lqq_ws, "lqq_ws_matmul", 4, 10)
    _, tensors, meta = packed("w4a8-lqq", 4096, 1024, 128, seed=3)
    for m in (1024, 1000):
        codes, scales = _acts(m, 1024, m)
        launch = lqq_wgmma_launch(m, 4096, 1024)
        assert launch == ((128, 3, 1, 128), 2), m
        calls.clear()
        for dtype in (torch.float16, torch.bfloat16):
            out = int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta, out_dtype=dtype)
            assert torch.equal(out, int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta, out_dtype=dtype,
                                                use_asm=True, config=TileConfig(64, 128, 1, 4, 3)))
        assert calls == [lqq_ws_launch(*launch)] * 2


@pytest.mark.parametrize("n", [64, 128, 130, 333, 1000])
def test_halved_launch_programs_cover_every_output_once(n):
    """The halved launch's programs (lqq_ws.halved_programs) mapped to tiles as _lqq_ws_kernel's HALVES branch maps
    them (a mirror of its index arithmetic): every output row of every token is stored exactly once, for ragged and
    whole last token rows and every halves_from."""
    from quantkit.runtime.kernels.gluon_sm90.lqq_ws import halved_programs

    for m in list(range(1, 600, 7)) + [640, 768, 769, 1000, 1024, 1025]:
        row_tiles, tiles = -(-n // 128), -(-n // 128) * -(-m // 256)
        full = configs.lqq_tiles_with_second_half(m, n)
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


def test_halves_rule_halves_tiles_where_the_model_has_fewer_waves(monkeypatch):
    """configs.lqq_ws_halves: the halved plan of the 256-token launch (whole tiles, then halves of 0.56 of a wave,
    placed in launch order on the first free SM) where it has fewer waves than the whole tiles; never for other
    launches."""
    launch = (128, 3, 128, 2, 1, 1)
    assert configs.lqq_halves_plan(1024, 6144) == (132, 1.56)  # 192 tiles: 60 halved into 120 programs
    assert configs.lqq_ws_halves(1024, 6144, 4096, launch) == 132
    assert configs.lqq_ws_halves(1024, 14336, 4096, launch) == 396  # 448 tiles: 52 halved
    # 1025 tokens on 4096 rows: four whole token rows (128 tiles), then the last row of one token as 32 halves —
    # a last token tile of <= 128 tokens has no second half
    assert configs.lqq_halves_plan(1025, 4096) == (128, 1.56)
    assert configs.lqq_ws_halves(1025, 4096, 4096, launch) == 128
    assert configs.lqq_ws_halves(1024, 4096, 4096, launch) is None  # 128 tiles, one wave: 1.09 against 1.12
    assert configs.lqq_ws_halves(1024, 28672, 4096, launch) is None  # 104 tiles left: two waves of halves
    assert configs.lqq_ws_halves(1024, 6144, 4096, launch, sms=96) is None  # exactly two whole waves
    assert configs.lqq_ws_halves(512, 6144, 4096, launch) is None  # below the 256-token option's 513 tokens
    # from 577 tokens: at 513 / 576 on the widest layers the halved launches lost to the 192-token one-warpgroup ones
    # (0.91-0.97x), which the rule keeps there
    assert configs.LQQ_HALVES_MIN_M == 577 and configs.lqq_ws_halves(576, 28672, 4096, launch) is None
    for n, k in [(28672, 4096), (18944, 3584)]:
        for m in (513, 576):
            assert lqq_wgmma_launch(m, n, k) == ((128, 2, 1, 64), 1), (n, k, m)
    assert configs.lqq_ws_halves(640, 14336, 4096, launch) == 224  # 1.17x in the same ABBA
    for other in [(128, 3, 64, 2, 1, 1), (128, 3, 128, 2, 1, 2), (128, 3, 0, 1, 2, 1), None]:
        assert configs.lqq_ws_halves(1024, 6144, 4096, other) is None, other
    # the large-M model times the 256-token option by the fewer of its whole and halved waves
    option = configs.LQQ_BIG_M_TOKENS_256
    assert configs.lqq_big_m_option_waves(option, 1024, 6144, 4096) == 1.56
    monkeypatch.setattr(configs, "LQQ_WS_HALVES", False)
    assert configs.lqq_ws_halves(1024, 6144, 4096, launch) is None
    assert configs.lqq_big_m_option_waves(option, 1024, 6144, 4096) > 1.9


def test_dispatch_runs_whole_tiles_where_the_halved_launch_does_not_build(monkeypatch):
    """int8_gemm._gluon_matmul: where configs.lqq_ws_halves applies it launches the halved form first; a halved
    launch that fails to build falls back to the same launch with whole tiles (the warning says so), on a build record
    of its own — halved failures never count against lqq_ws's whole-tile launches (wgmma_common.kernel_broken)."""
    pretend_hopper(monkeypatch)
    from quantkit.runtime.kernels.gluon_sm90 import common as wgmma_common
    from quantkit.runtime.kernels.gluon_sm90.lqq_ws import HALVES_KERNEL, KERNEL

    monkeypatch.setattr(wgmma_common, "_FAILED", {})
    monkeypatch.setattr(wgmma_common, "_LAUNCHED", set())
    monkeypatch.setattr(gluon_lqq_wgmma, "lqq_wgmma_problem", lambda *a, **kw: None)
    launched = []

    def ws(codes, scales, tensors, meta, *cfg, out=None, out_dtype=torch.float16, halves_from=None):
        launched.append((cfg, halves_from))
        if halves_from is not None:
            raise RuntimeError("a halved launch that does not build")
        return torch.zeros(codes.shape[0], meta["out_features"], dtype=out_dtype)

    monkeypatch.setattr(gluon_lqq_ws, "lqq_ws_matmul", ws)
    meta = {"in_features": 4096, "out_features": 6144}
    codes, scales = torch.zeros(1024, 4096, dtype=torch.int8), torch.ones(1024, 1)
    ws_launch = lqq_ws_launch(*lqq_wgmma_launch(1024, 6144, 4096))
    with pytest.warns(RuntimeWarning, match="lqq_ws_halves did not build"):
        y = gluon_lqq(codes, scales, meta, torch.float16)
    assert y is not None and launched == [(ws_launch, 132), (ws_launch, None)]
    launched.clear()  # declined from then on: straight to whole tiles
    gluon_lqq(codes, scales, meta, torch.float16)
    assert launched == [(ws_launch, None)]
    # a second halved config failing marks the halved launches broken, not lqq_ws: its whole tiles still run
    launched.clear()
    gluon_lqq(codes, scales, meta, torch.bfloat16)
    assert launched == [(ws_launch, 132), (ws_launch, None)]
    assert wgmma_common.kernel_broken(HALVES_KERNEL) is not None and wgmma_common.kernel_broken(KERNEL) is None
    launched.clear()
    meta = {"in_features": 4096, "out_features": 14336}
    codes, scales = torch.zeros(1024, 4096, dtype=torch.int8), torch.ones(1024, 1)
    gluon_lqq(codes, scales, meta, torch.float16)
    assert launched == [(lqq_ws_launch(*lqq_wgmma_launch(1024, 14336, 4096)), None)]


@pytest.mark.gpu
@hopper
def test_int8_matmul_halves_the_last_wave_with_the_triton_kernels_bits(monkeypatch):
    """Through int8_matmul where configs.lqq_ws_halves applies (6144 rows, M = 1024 and a ragged 1000): the halved
    256-token launch runs, with the Triton kernel's bits, fp16 and bf16."""
    calls = []
    wrapped = gluon_lqq_ws.lqq_ws_matmul

    def spy(*args, **kwargs):
        y = wrapped(*args, **kwargs)
        calls.append((args[4:10], kwargs.get("halves_from")))
        return y

    monkeypatch.setattr(gluon_lqq_ws, "lqq_ws_matmul", spy)
    _, tensors, meta = packed("w4a8-lqq", 6144, 512, 128, seed=5)
    for m in (1024, 1000):
        codes, scales = _acts(m, 512, m)
        ws = lqq_ws_launch(*lqq_wgmma_launch(m, 6144, 512))
        assert configs.lqq_ws_halves(m, 6144, 512, ws) == 132, m
        calls.clear()
        for dtype in (torch.float16, torch.bfloat16):
            out = int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta, out_dtype=dtype)
            assert torch.equal(out, int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta, out_dtype=dtype,
                                                use_asm=True, config=TileConfig(64, 128, 1, 4, 3)))
        assert calls == [(ws, 132)] * 2


def test_dispatch_falls_back_to_lqq_wgmma_where_the_ws_kernel_does_not_build_and_runs_it_on_its_own(monkeypatch):
    """int8_gemm._gluon_matmul: a warp-specialized launch that fails to build falls back to lqq_wgmma's same launch
    (the warning names that fallback); a broken lqq_wgmma does not stop a working lqq_ws (each kernel has its own
    build record)."""
    pretend_hopper(monkeypatch)
    from quantkit.runtime.kernels.gluon_sm90 import common as wgmma_common

    monkeypatch.setattr(wgmma_common, "_FAILED", {})
    monkeypatch.setattr(wgmma_common, "_LAUNCHED", set())
    broken: set[str] = set()
    monkeypatch.setattr(gluon_lqq_wgmma, "lqq_wgmma_problem", lambda *a, **kw: None)
    monkeypatch.setattr(gluon_common, "kernel_broken", lambda kernel: "broken" if kernel in broken else None)
    launched = []

    def ws(codes, scales, tensors, meta, *cfg, out=None, out_dtype=torch.float16):
        if "ws builds" not in launched:
            raise RuntimeError("gl.warp_specialize: not in this Triton")
        launched.append(("ws", cfg))
        return torch.zeros(codes.shape[0], 4096, dtype=out_dtype)

    def wgmma(codes, scales, tensors, meta, *cfg, out=None, out_dtype=torch.float16):
        launched.append(("wgmma", cfg))
        return torch.zeros(codes.shape[0], 4096, dtype=out_dtype)

    monkeypatch.setattr(gluon_lqq_ws, "lqq_ws_matmul", ws)
    monkeypatch.setattr(gluon_lqq_wgmma, "lqq_wgmma_matmul", wgmma)
    meta = {"in_features": 4096, "out_features": 6144}
    codes, scales = torch.zeros(769, 4096, dtype=torch.int8), torch.ones(769, 1)
    launch = lqq_wgmma_launch(769, 6144, 4096)
    assert lqq_ws_launch(*launch) is not None and launch[0][3] <= configs.LQQ_WGMMA_MAX_TAIL
    with pytest.warns(RuntimeWarning, match="lqq_ws did not build"):
        y = gluon_lqq(codes, scales, meta, torch.float16)
    assert y is not None and launched == [("wgmma", launch[0] + (launch[1],))]
    # a 256-token launch (a 128-token tail: lqq_ws only) falls back to the rule's one-warpgroup pick, never to
    # lqq_wgmma with its own tile
    monkeypatch.setattr(wgmma_common, "_FAILED", {})
    launched.clear()
    meta = {"in_features": 4096, "out_features": 4096}
    codes, scales = torch.zeros(1024, 4096, dtype=torch.int8), torch.ones(1024, 1)
    launch, one = lqq_wgmma_launch(1024, 4096, 4096), lqq_wgmma_launch(1024, 4096, 4096, max_warpgroups=1)
    assert launch == ((128, 3, 1, 128), 2) and one[1] == 1
    with pytest.warns(RuntimeWarning, match="did not build"):
        y = gluon_lqq(codes, scales, meta, torch.float16)
    assert y is not None and launched == [("wgmma", one[0] + (1,))]
    # the other way round: lqq_wgmma does not build here, lqq_ws does
    monkeypatch.setattr(wgmma_common, "_FAILED", {})
    launched[:] = ["ws builds"]
    broken.add("lqq_wgmma")
    y = gluon_lqq(codes, scales, meta, torch.float16)
    ws_launch = lqq_ws_launch(*launch)
    assert y is not None and launched == ["ws builds", ("ws", ws_launch)]
    broken.add("lqq_ws")  # neither: the Triton kernel (None here)
    assert gluon_lqq(codes, scales, meta, torch.float16) is None


def test_k_pair_rule_takes_launches_of_one_program_an_sm_on_more_than_half_the_sms():
    """configs.lqq_k_pair: 128-token programs (one per 64 rows and 128 tokens) on more than half the SMs and at most
    all of them, from 128 tokens, K of two tiles or more — and nowhere once switched off."""
    from quantkit.runtime.kernels.configs import SMS_H100, lqq_k_pair

    assert all(lqq_k_pair(m, 1024, 4096) for m in (513, 769, 1024))  # the k/v layer: 80-128 programs
    assert not lqq_k_pair(512, 1024, 4096) and not lqq_k_pair(1025, 1024, 4096)  # 64 and 144 programs
    assert lqq_k_pair(128, 6144, 4096) and lqq_k_pair(256, 4096, 4096) and not lqq_k_pair(257, 4096, 4096)
    assert not lqq_k_pair(127, 8448, 4096)  # below 128 tokens (132 programs)
    assert not lqq_k_pair(769, 1024, 256)  # one K tile: nothing to pair
    for n in (512, 1024, 1536, 2048, 4096, 6144, 14336):
        for m in range(1, 4097, 37):
            programs = -(-n // 64) * -(-m // 128)
            assert lqq_k_pair(m, n, 4096) == (m >= 128 and SMS_H100 // 2 < programs <= SMS_H100), (n, m)
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(configs, "LQQ_K_PAIR", False)
    try:
        assert not lqq_k_pair(769, 1024, 4096)
    finally:
        monkeypatch.undo()


def test_dispatch_runs_a_k_pair_launch_where_the_rule_says_and_falls_back_where_it_does_not_build(monkeypatch):
    """int8_gemm._gluon_matmul: where configs.lqq_k_pair holds, the K-pair launch of lqq_ws runs (128 tokens,
    LQQ_K_PAIR_STAGES stages); where it does not build, a warning names the fallback and the rule's own launch runs."""
    pretend_hopper(monkeypatch)
    from quantkit.runtime.kernels.gluon_sm90 import common as wgmma_common

    monkeypatch.setattr(wgmma_common, "_FAILED", {})
    monkeypatch.setattr(wgmma_common, "_LAUNCHED", set())
    monkeypatch.setattr(gluon_lqq_wgmma, "lqq_wgmma_problem", lambda *a, **kw: None)
    monkeypatch.setattr(gluon_common, "kernel_broken", lambda kernel: None)
    launched = []
    pair_builds = [True]

    def ws(codes, scales, tensors, meta, *cfg, out=None, out_dtype=torch.float16, k_pair=False):
        if k_pair and not pair_builds[0]:
            raise RuntimeError("warp_specialize: a 4-warp worker partition is not in this Triton")
        launched.append(("k_pair" if k_pair else "ws", cfg))
        return torch.zeros(codes.shape[0], 1024, dtype=out_dtype)

    monkeypatch.setattr(gluon_lqq_ws, "lqq_ws_matmul", ws)
    meta = {"in_features": 4096, "out_features": 1024}
    codes, scales = torch.zeros(769, 4096, dtype=torch.int8), torch.ones(769, 1)
    assert gluon_lqq(codes, scales, meta, torch.float16) is not None
    assert launched == [("k_pair", (128, configs.LQQ_K_PAIR_STAGES))]
    launched.clear()
    pair_builds[0] = False  # a fresh process where the K-pair launch does not build
    monkeypatch.setattr(wgmma_common, "_FAILED", {})
    monkeypatch.setattr(wgmma_common, "_LAUNCHED", set())
    with pytest.warns(RuntimeWarning, match="did not build"):
        assert gluon_lqq(codes, scales, meta, torch.float16) is not None
    assert launched == [("ws", lqq_ws_launch(*lqq_wgmma_launch(769, 1024, 4096)))]


@pytest.mark.gpu
@hopper
def test_int8_matmul_runs_k_pair_launches_on_the_kv_layer_with_the_triton_kernels_bits(monkeypatch):
    calls = []
    wrapped = gluon_lqq_ws.lqq_ws_matmul

    def spy(*args, **kwargs):
        calls.append(kwargs.get("k_pair", False))
        return wrapped(*args, **kwargs)

    monkeypatch.setattr(gluon_lqq_ws, "lqq_ws_matmul", spy)
    _, tensors, meta = packed("w4a8-lqq", 1024, 4096, 128, seed=3)
    codes, scales = _acts(769, 4096, 3)
    out = int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta)
    assert calls == [True]
    assert torch.equal(out, int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta, use_asm=True,
                                        config=TileConfig(64, 128, 1, 4, 3)))

