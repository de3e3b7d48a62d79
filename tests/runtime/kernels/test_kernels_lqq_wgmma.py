"""The Gluon LiquidQuant wgmma kernel (quantkit/runtime/kernels/gluon_sm90/lqq_wgmma.py): its launch rule and the reasons it
declines run anywhere; its numbers run on a Hopper GPU only (Gluon has no CPU interpreter), where they must equal
the Triton LiquidQuant kernel's bit for bit at the same K split and stay within fp16 rounding of the reference."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (quantkit.runtime.kernels.jit)

import pytest  # noqa: E402

from quantkit.quant.act import quantize_activation_int  # noqa: E402
from quantkit.runtime.kernels.triton import int8_gemm  # noqa: E402
import quantkit.runtime.kernels.configs as configs  # noqa: E402
from quantkit.runtime.kernels.triton.launch import split_plan  # noqa: E402
from quantkit.runtime.kernels.configs import (TileConfig, gemm_config, lqq_wgmma_config, lqq_wgmma_cost,  # noqa: E402
                                             lqq_wgmma_launch, lqq_wgmma_warpgroups)
from quantkit.runtime.kernels.gemm import int8_matmul  # noqa: E402
from quantkit.runtime.kernels.gluon_sm90.lqq_wgmma import (HAVE_GLUON, lqq_wgmma_matmul, lqq_wgmma_problem,  # noqa: E402
                                              one_copy_per_tile)
from quantkit.runtime.kernels.reference import int8_reference  # noqa: E402
from quantkit.runtime.kernels.gluon_sm90 import lqq_wgmma as gluon_lqq_wgmma  # noqa: E402
from tests.kernels_helpers import DEVICE, gluon_lqq, pretend_hopper, packed, poisoned, record_launches, rel_err  # noqa: E402

ON_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and HAVE_GLUON
hopper = pytest.mark.skipif(not ON_HOPPER, reason="needs a Hopper (sm_90) GPU and Triton's Gluon")
LLAMA = [(14336, 4096), (4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336), (1024, 4096)]

T256 = ((128, 3, 1, 128), 2)  # the large-M model's 256-token launch (configs.LQQ_BIG_M_TOKENS_256, lqq_ws only)


def _acts(m: int, k: int, seed: int):
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed)) * 3
    codes, scales = quantize_activation_int(x, 8, -1)
    return codes.to(DEVICE), scales.float().to(DEVICE)


def test_rule_range_of_the_gluon_kernel_by_layer_and_token_count():
    assert lqq_wgmma_config(16, 14336, 4096) is None  # decode: CUDA GEMV / Triton
    assert lqq_wgmma_config(4096, 4096, 4096) is not None  # up to 4096 tokens on layers of <= 8192 rows
    # the large-M wave model over the warp-specialized launches: at M = 4096 the 256-token tiles (two warpgroups,
    # lqq_ws only), 116.2 us vs 133.5 for the 192-token tiles at two stages (ABBA)
    assert lqq_wgmma_launch(4096, 4096, 4096) == T256
    assert lqq_wgmma_config(4097, 1024, 4096) is None and lqq_wgmma_config(4097, 4096, 4096) is None
    # wide layers above 768 tokens: the same model (14336x4096 M = 1025: the 256-token tiles with the last token row
    # (one token) and the last wave halved, 122.6 us vs 137.7 in ABBA; the Triton kernel 160.6)
    assert lqq_wgmma_launch(1025, 14336, 4096) == T256
    assert lqq_wgmma_launch(1024, 14336, 4096) == T256  # 119.7 us vs 139.2 (ABBA)
    # long rows on a layer of <= 8192 rows: up to 4096 tokens (4096x14336 M = 2049: 245.4 us vs the Triton kernel's
    # 325.0), with the model refitted for rows longer than 8192: two warpgroups at three or four stages (ABBA, µs
    # against the constants of shorter rows: M = 1280 122.7 vs 135.6, 2049-4096 on 192-token tiles, four stages) and
    # the 256-token tiles where they fill the waves (M = 769: 83.4 us vs 103.9, ABBA)
    assert lqq_wgmma_launch(769, 4096, 14336) == T256
    assert lqq_wgmma_launch(1280, 4096, 14336) == ((128, 4, 1, 32), 2)
    assert lqq_wgmma_launch(2049, 4096, 14336) == ((128, 4, 1, 64), 2)
    assert lqq_wgmma_config(1025, 14336, 14336) is None  # more rows and long ones: Triton above 768 (not measured)
    # from 32 tokens the cost model with splits of 4: the Gluon kernel split beats the Triton kernel (4608x3584 M = 40:
    # 11.4 us vs 13.6), 64-token tiles split 4 on long rows (4096x14336 M = 64: 21.0 us vs 24.4 on 32-token ones)
    assert lqq_wgmma_config(32, 4096, 4096) == (32, 3, 2, 0)
    assert lqq_wgmma_config(40, 4608, 3584) == (64, 3, 2, 0)
    assert lqq_wgmma_config(64, 4096, 14336) == (64, 3, 4, 0)
    assert lqq_wgmma_config(88, 1024, 4096) == (64, 3, 4, 0)  # the k/v layer: 8.3 us vs 9.6 (fp16 9.2)
    assert lqq_wgmma_config(64, 512, 4096) is None  # 8 row tiles: fewer than MIN_PROGRAMS programs, Triton's tiles


def tokens(cfg):
    """Tokens per program of a lqq_wgmma_config: the token tile plus its tail."""
    return cfg[0] + cfg[3]


def test_rule_above_64_tokens_takes_the_tiles_the_sweep_measured_fastest():
    # one 96/160-token program per row tile where M fits one
    assert lqq_wgmma_config(96, 14336, 4096) == (64, 3, 1, 32)
    assert lqq_wgmma_config(160, 14336, 4096) == (128, 3, 1, 32)
    assert lqq_wgmma_config(288, 14336, 4096) == (64, 3, 1, 32)  # 52.2 µs; 32-token tiles 81.5
    assert lqq_wgmma_config(160, 4096, 14336) == (128, 3, 2, 32)  # 64 programs: K split in two
    # 256 tokens on two warpgroups at M = 700-768 on the widest layer (ABBA: M = 700 177.6 us vs 179.7, M = 768 180.4
    # vs 185.7; 4096x4096 M = 1024 30.6 vs 37.3)
    assert lqq_wgmma_launch(768, 28672, 4096) == lqq_wgmma_launch(1024, 4096, 4096) == T256


def test_rule_takes_the_measured_exceptions_on_fused_qkv_shapes_only():
    # measured on 6144×4096 (96 row tiles) and 4608×3584 (72)
    assert lqq_wgmma_config(448, 6144, 4096) == (64, 3, 1, 32)  # 96-token tiles, was 128
    assert lqq_wgmma_config(480, 6144, 4096) == (64, 3, 1, 32)
    assert lqq_wgmma_config(481, 6144, 4096) is None  # the Triton kernel ...
    assert gemm_config(481, 6144, 4096, "lqq").bm == 128  # ... on 128-token tiles
    assert lqq_wgmma_config(640, 6144, 4096) is None
    assert gemm_config(640, 6144, 4096, "lqq") == TileConfig(128, 128, 1, 4, 2)
    # past the exceptions (641-768: 44.6 / 45.2 us at M = 700 / 768 against 47.7 / 49.9 on 128-token tiles): the
    # large-M model
    assert lqq_wgmma_launch(700, 6144, 4096) == ((128, 2, 1, 64), 1)
    assert lqq_wgmma_launch(769, 6144, 4096) == ((128, 2, 1, 32), 1)
    assert lqq_wgmma_config(641, 4608, 3584) is None and lqq_wgmma_config(768, 4608, 3584) is None
    # above 768 the large-M model's launch beats Triton's one wave: the 256-token tiles, every one halved (M = 769:
    # 31.3 us vs 34.8, ABBA)
    assert lqq_wgmma_launch(769, 4608, 3584) == T256
    assert lqq_wgmma_config(640, 4608, 3584) is not None and lqq_wgmma_config(897, 4608, 3584) is not None
    assert gemm_config(704, 4608, 3584, "lqq") == TileConfig(128, 128, 1, 4, 2)  # 216 programs, one wave
    assert lqq_wgmma_config(576, 6081, 4096) is None  # 96 row tiles of 64, like 6144


def test_rule_exceptions_leave_other_shapes_to_the_cost_model(monkeypatch):
    # neighbouring row-tile counts and longer rows: the same pick as with no exceptions at all (the Triton kernel ran
    # 1.15-1.65x slower than the model's picks on 72 and 128 row tiles at M = 464-640)
    shapes = ((4096, 4096), (4608, 3584), (6080, 4096), (6145, 4096), (8192, 4096), (6144, 8192), (6144, 14336),
              (6144, 2048), (4608, 3072), (6144, 5120))
    ms = sorted({*range(385, 780, 3), 416, 480, 481, 640, 641, 768, 769, 896, 897, 1024})
    with_exceptions = {(n, k, m): lqq_wgmma_config(m, n, k) for n, k in shapes for m in ms}
    monkeypatch.setattr(configs, "LQQ_ROW_TILE_EXCEPTIONS", {})
    lqq_wgmma_launch.cache_clear()
    try:
        for (n, k, m), cfg in with_exceptions.items():
            if (n, k) == (4608, 3584) and 641 <= m <= 768:
                continue  # its own exception
            assert cfg == lqq_wgmma_config(m, n, k), (n, k, m)
        assert lqq_wgmma_config(448, 6144, 4096) == (128, 3, 1, 0)  # and the exceptions did change 6144x4096
    finally:
        lqq_wgmma_launch.cache_clear()


def test_large_m_wave_model_takes_the_launches_measured_fastest():
    # µs: the pick vs lqq_wgmma launches and the Triton kernel
    two192, two160, two128 = ((128, 2, 1, 64), 1), ((128, 2, 1, 32), 1), ((128, 3, 1, 0), 1)
    wg2, one192 = ((128, 3, 1, 64), 2), ((128, 3, 1, 64), 1)
    # two-warpgroup programs run their warpgroups as partitions that take turns, and the model's (192, 2, 3) cost is
    # scaled by that form's measured gain (1.16x); 6144x4096 runs the 256-token tiles from 2048 (ABBA: 91.3 vs 99.0 at
    # 2048, 183.4 vs 196.8 at 4096) and, with their last wave halved, at 1536 (69.5 us vs 67.5: 0.97x, one of the
    # points where the halved model lost in its ABBA; 1.047x over the 77 that changed)
    assert lqq_wgmma_launch(1536, 6144, 4096) == T256
    for m in (2048, 3072, 4096):
        assert lqq_wgmma_launch(m, 6144, 4096) == T256, m
    # M = 1000: 256-token tiles, 59.6 us vs 58.1 for 128-token tiles in ABBA: one of the points where the model with
    # 256-token tiles loses (0.974x; geometric mean over the 172 points that changed 1.096x)
    assert lqq_wgmma_launch(1000, 6144, 4096) == T256
    assert lqq_wgmma_launch(1280, 6144, 4096, max_warpgroups=1) == two160  # 64.8 vs 77.5
    assert lqq_wgmma_launch(1280, 6144, 4096) == T256  # 61.6 vs 65.8 (ABBA)
    # the k/v layer: a program per SM at 1000 tokens; past 132 programs the 160-token tiles (M = 1025: 15.5 vs 18.1,
    # M = 2049: 21.2 vs 32.6, where the other launch ran 0.83x fp16)
    assert lqq_wgmma_launch(1000, 1024, 4096) == two128
    assert lqq_wgmma_launch(1025, 1024, 4096) == lqq_wgmma_launch(2049, 1024, 4096) == two160
    assert lqq_wgmma_launch(1536, 1024, 4096) == one192  # one 192-token program an SM: 16.3 vs 18.4 on 128-token tiles
    # 28672x4096: 256-token tiles (ABBA: M = 1024 232.1 vs 286.9, 2048 447.9 vs 518.0)
    for m in (1024, 1280, 1536, 2048, 4096):
        assert lqq_wgmma_launch(m, 28672, 4096) == T256, m
    # 256-token tiles, the last token row (one token) and the last wave halved: 95.9 us vs 95.6 (ABBA; the Triton
    # kernel 118.6)
    assert lqq_wgmma_launch(769, 14336, 4096) == T256
    # one warpgroup only (a two-warpgroup build failed): the model's one-warpgroup options
    assert lqq_wgmma_launch(1536, 6144, 4096, max_warpgroups=1) == two192
    for n, k in LLAMA + [(3584, 3584), (4608, 3584), (37888, 3584), (8192, 4096), (24576, 4096), (11008, 4096),
                         (3584, 18944), (5120, 13824)]:
        # rows longer than 8192: the long-row table adds two warpgroups on 128 / 160 / 192 tokens at 3-4 stages,
        # and both tables have the 256-token tiles
        two_wg = ({((128, st, 1, tail), 2) for st in (3, 4) for tail in (0, 32, 64)} if k > configs.LQQ_WGMMA_NARROW
                  else {wg2}) | {T256}
        for m in range(769, 4097, 37):
            launch = lqq_wgmma_launch(m, n, k)
            assert launch in {two192, two160, two128, one192} | two_wg, (n, k, m, launch)
            assert lqq_wgmma_launch(m, n, k, max_warpgroups=1) in (two192, two160, two128, one192), (n, k, m)
    # wide and long rows: the Triton kernel above 768 tokens (not measured) — and, alike, from 384 up to 768
    assert lqq_wgmma_launch(2048, 14336, 14336) is None
    assert not configs._lqq_big_m_below_768(512, 14336, 14336)  # the M <= 768 cost model's launch there


def test_large_m_model_refitted_for_long_rows_only():
    # the refit lost on the wide layers in its ABBA check (14336x4096, 28672x4096: 0.986-0.988x), won on rows longer
    # than 8192 (1.05-1.13x on three layers it was not fitted to)
    assert configs.lqq_big_m_options(4096) is configs.LQQ_BIG_M_WS
    assert configs.lqq_big_m_options(14336) is configs.LQQ_BIG_M_WS_LONG_ROWS
    assert configs.lqq_big_m_options(configs.LQQ_WGMMA_NARROW) is configs.LQQ_BIG_M_WS
    assert set(configs.LQQ_BIG_M_WS) < set(configs.LQQ_BIG_M_WS_LONG_ROWS)
    # every long-row option runs on lqq_ws (a launch lqq_ws_launch maps), four stages on two warpgroups included
    for tokens, wg, stages in configs.LQQ_BIG_M_WS_LONG_ROWS:
        ws = configs.lqq_ws_launch((128, stages, 1, tokens - 128), wg)
        assert ws is not None and ws[2] == tokens - 128 and ws[3] == wg
    # wide rows of 4096: the LQQ_BIG_M_WS one-warpgroup pick (its two-warpgroup pick is the 256-token tiles)
    assert configs.lqq_wgmma_launch(1024, 14336, 4096, max_warpgroups=1) == ((128, 2, 1, 32), 1)
    # 256-token tiles: 335.9 us vs 370.7 for 192 tokens at four stages
    assert configs.lqq_wgmma_launch(3072, 3584, 18944) == T256


def test_large_m_waves_count_a_last_wave_of_lone_programs_as_solo():
    # 128 programs of two-an-SM launches: each alone on its SM, the last (only) wave weighted by solo
    assert configs.lqq_big_m_waves(128, 2, 0.88, 0.5) == pytest.approx(0.88 * 0.5 + 0.5 * 128 / 264)
    # 144 programs: 12 SMs hold two — a full wave's weight, whatever the fraction
    assert configs.lqq_big_m_waves(144, 2, 0.88, 0.5) == pytest.approx(0.5 + 0.5 * 144 / 264)
    assert configs.lqq_big_m_waves(264, 2, 0.88, 0.5) == pytest.approx(1.0)
    assert configs.lqq_big_m_waves(265, 2, 0.88, 0.5) == pytest.approx(1 + 0.88 * 0.5 + 0.5 / 264)
    assert configs.lqq_big_m_waves(132, 1, 1.0, 0.1) == pytest.approx(1.0)


def test_rule_above_768_tokens_splits_k_only_for_launches_short_of_half_the_sms():
    # 1024x4096 M = 769-1024: 112-128 programs ran 14.1-14.5 us unsplit, 19.8-20.2 split in two (coverage logs)
    for m in (769, 896, 1024):
        assert lqq_wgmma_config(m, 1024, 4096) == (128, 3, 1, 0)
    assert lqq_wgmma_config(1000, 512, 4096) == (64, 3, 1, 0)  # halved: 128 programs
    assert lqq_wgmma_config(1000, 128, 4096) == (32, 3, 4, 0)  # 2 row tiles: 64 programs even on 32-token tiles
    assert lqq_wgmma_config(1000, 1024, 8192)[2] == 2  # the long-row split stays


def test_rule_never_falls_to_32_token_tiles_above_64_tokens_on_llama_shapes():
    # (the 16-row-tile 1024×4096 layer runs 64-token tiles split 4 there)
    for n, k in LLAMA:
        for m in range(65, 4097, 7):
            cfg = lqq_wgmma_config(m, n, k)
            assert cfg is None or tokens(cfg) >= 64, (n, k, m, cfg)


def test_rule_configs_are_ones_the_kernel_has():
    for n, k in LLAMA + [(3584, 3584), (512, 3584), (18944, 3584), (1000, 4352), (2048, 4096)]:
        for m in range(32, 4097, 13):
            cfg = lqq_wgmma_config(m, n, k)
            one = lqq_wgmma_launch(m, n, k, max_warpgroups=1)
            assert one is None or one[1] == 1  # the fallback where a two-warpgroup build fails
            if cfg is not None:
                assert lqq_wgmma_warpgroups(m, n, k) in (1, 2)
                bm, stages, split, tail = cfg
                # four stages: the large-M model's two-warpgroup options on rows longer than 8192
                assert bm in (32, 64, 128) and stages in (2, 3, 4) and split in (1, 2, 4, 8) and tail in (0, 32, 64, 128)
                # a 128-token tail: the large-M model's 256-token launch, two warpgroups on lqq_ws, from 513 tokens
                assert tail < 128 or (lqq_wgmma_launch(m, n, k) == T256 and m >= configs.LQQ_BIG_M_TOKENS_256_MIN_M
                                      and configs.lqq_ws_launch(cfg, 2) is not None)
                assert stages < 4 or (k > configs.LQQ_WGMMA_NARROW and lqq_wgmma_warpgroups(m, n, k) == 2)
                assert split_plan(-(-k // 256), split)[0] >= 4  # every split but the last keeps 4 tiles of 256
                if split > 1 and m <= 768:  # the cost model splits only launches of fewer programs than SMs
                    assert -(-n // 64) * -(-m // tokens(cfg)) < 132


def test_rule_uses_two_stages_on_the_large_m_models_two_per_sm_launches_and_launches_of_a_program_per_sm():
    assert lqq_wgmma_config(640, 4096, 4096)[1] == 2
    assert lqq_wgmma_launch(768, 4096, 4096) == ((128, 3, 1, 64), 2)  # one two-warpgroup program an SM: 3 stages
    assert lqq_wgmma_launch(896, 4096, 4096) == T256  # 30.7 us vs 38.3 on 128-token tiles two an SM
    # 256-token tiles every one halved: 18.2 us vs 18.4 on 128-token tiles two an SM (ABBA)
    assert lqq_wgmma_launch(1024, 2048, 4096) == T256
    assert lqq_wgmma_config(768, 1024, 4096)[1] == 3  # 16 row tiles: fewer programs than SMs
    assert lqq_wgmma_config(512, 4096, 4096)[1] == 3
    assert lqq_wgmma_config(1024, 4096, 4096)[1] == 3


def test_cost_model_prefers_fewer_token_tiles_and_fuller_waves():
    # the same launch with more tokens per program (less dequantization per token) costs less per token
    assert lqq_wgmma_cost(160, 14336, 4096, 160, 1) < lqq_wgmma_cost(160, 14336, 4096, 32, 1)
    # a split helps a launch of few programs on long rows, not one that already fills the GPU
    assert lqq_wgmma_cost(160, 4096, 14336, 160, 2) < lqq_wgmma_cost(160, 4096, 14336, 160, 1)
    assert lqq_wgmma_cost(512, 14336, 4096, 128, 2) > lqq_wgmma_cost(512, 14336, 4096, 128, 1)


def test_cost_model_region_and_its_split_terms():
    """configs.lqq_uses_cost_model says where lqq_wgmma_launch takes the cost model's pick, and the split terms
    (each slot the tile's last program adds costs "slot_tiles") order the splits."""
    from quantkit.runtime.kernels.configs import lqq_cost_model_launch, lqq_uses_cost_model

    assert lqq_uses_cost_model(32, 4096, 4096) and lqq_uses_cost_model(128, 1024, 4096)
    assert not lqq_uses_cost_model(31, 4096, 4096)  # decode sizes: GEMV / Triton
    assert not lqq_uses_cost_model(512, 4096, 4096)  # the large-M model from 384 where 128-token programs fill the GPU
    assert not lqq_uses_cost_model(448, 6144, 4096)  # a measured exception
    assert not lqq_uses_cost_model(800, 1024, 4096)  # above 768
    for n, k in LLAMA + [(4608, 3584), (512, 3584), (2048, 4096)]:
        for m in range(32, 769, 11):
            if lqq_uses_cost_model(m, n, k):
                assert lqq_wgmma_launch(m, n, k) == lqq_cost_model_launch(m, n, k), (n, k, m)
    # the split terms: K tiles / split + fixed + split_tiles + slot_tiles × split
    c = dict(configs.LQQ_WGMMA_COST)
    free = dict(c, slot_tiles=0, split_tiles=0)
    ratio = lambda cost, split: (lqq_wgmma_cost(96, 1024, 4096, 32, split, cost=cost)  # noqa: E731
                                 / lqq_wgmma_cost(96, 1024, 4096, 32, 1, cost=cost))
    assert ratio(c, 4) > ratio(free, 4) and ratio(c, 2) > ratio(free, 2)
    def work(split, cost):
        return 16 / split + cost["fixed_tiles"] + cost["split_tiles"] + cost["slot_tiles"] * split

    assert ratio(c, 4) / ratio(free, 4) == pytest.approx(work(4, c) / work(4, free))
    # the k/v layer at 96 tokens splits 4 (8.2 µs vs 9.2 split 2)
    assert lqq_wgmma_launch(96, 1024, 4096)[0][2] == 4


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


def test_a_two_warpgroup_launch_that_does_not_build_falls_back_to_the_one_warpgroup_pick(monkeypatch):
    """14336x4096 M = 352: two warpgroups on 192-token tiles; if that does not build, the rule's pick among
    one-warpgroup launches (128-token tiles: 60.8 us vs 67.3 for the 192-token tile on one, lqq_wg2_wide_h100.json),
    not the same tile on one warpgroup."""
    pretend_hopper(monkeypatch)
    from quantkit.runtime.kernels.gluon_sm90 import common as wgmma_common

    monkeypatch.setattr(wgmma_common, "_FAILED", {})
    monkeypatch.setattr(wgmma_common, "_LAUNCHED", set())
    monkeypatch.setattr(gluon_lqq_wgmma, "lqq_wgmma_problem", lambda *a, **kw: None)
    launched = []

    def fake(codes, scales, tensors, meta, bm, stages, split, tail, wg, out=None, out_dtype=torch.float16):
        if wg == 2:
            raise RuntimeError("does not build here")
        launched.append((bm, stages, split, tail, wg))
        return torch.zeros(codes.shape[0], 14336, dtype=out_dtype)

    monkeypatch.setattr(gluon_lqq_wgmma, "lqq_wgmma_matmul", fake)
    monkeypatch.setattr(configs, "lqq_ws_launch", lambda *a: None)  # lqq_wgmma's own fallback
    assert lqq_wgmma_launch(352, 14336, 4096) == ((128, 3, 1, 64), 2)
    assert lqq_wgmma_launch(352, 14336, 4096, max_warpgroups=1) == ((128, 3, 1, 0), 1)
    meta = {"in_features": 4096, "out_features": 14336}
    codes, scales = torch.zeros(352, 4096, dtype=torch.int8), torch.ones(352, 1)
    with pytest.warns(RuntimeWarning, match="did not build"):
        y = gluon_lqq(codes, scales, meta, torch.float16)
    assert y is not None and y.dtype == torch.float16 and launched == [(128, 3, 1, 0, 1)]
    # the 6144x4096 exception's two-warpgroup entry: without two warpgroups, the cost model's one-warpgroup pick
    assert lqq_wgmma_launch(448, 6144, 4096)[1] == 2
    assert lqq_wgmma_launch(448, 6144, 4096, max_warpgroups=1)[1] == 1


@pytest.mark.skipif(ON_HOPPER, reason="checks the fallback where the Gluon kernel cannot run")
def test_int8_matmul_falls_back_to_triton_where_gluon_cannot_run():
    _, tensors, meta = packed("w4a8-lqq", 64, 256, 128, seed=3)
    codes, scales = _acts(96, 256, 3)
    assert lqq_wgmma_config(96, 64, 256) is not None  # the rule alone would pick the Gluon kernel
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


def test_triton_rule_takes_128_token_tiles_with_a_ragged_last_tile_above_512_tokens():
    # LiquidQuant 14336×4096 M = 1025 on 64×64 tiles ran 0.66× fp16
    assert gemm_config(1025, 14336, 4096, "lqq").bm == 128
    assert gemm_config(2049, 28672, 4096, "lqq").bm == 128
    assert gemm_config(448, 14336, 4096, "lqq").bm == 64  # up to 512 a half-empty 128-token tile is still refused


@pytest.mark.gpu
@hopper
def test_int8_matmul_runs_the_gluon_kernel_where_the_rule_picks_it(monkeypatch):
    calls = record_launches(monkeypatch, gluon_lqq_wgmma, "lqq_wgmma_matmul", 4, 8)
    _, tensors, meta = packed("w4a8-lqq", 4096, 512, 128, seed=1)
    codes, scales = _acts(256, 512, 1)
    cfg = lqq_wgmma_config(256, 4096, 512)
    monkeypatch.setattr(configs, "lqq_ws_launch", lambda *a: None)  # this kernel's own launches, not lqq_ws's
    monkeypatch.setattr(configs, "LQQ_K_PAIR", False)  # (4096 rows at M = 256 would run a K-pair launch of lqq_ws)
    out = int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta)
    assert calls == [cfg]
    tail_cfg = lqq_wgmma_config(160, 4096, 512)
    assert tail_cfg[3] > 0  # a tail tile through the rule's tuple (its 4th element)
    tail_out = int8_matmul(codes[:160], scales[:160], -1, "w4a8-lqq", tensors, meta)
    assert calls[-1] == tail_cfg
    assert rel_err(tail_out, int8_reference(codes[:160], scales[:160], -1, "w4a8-lqq", tensors, meta)) < 1e-3
    calls.pop()
    assert rel_err(out, int8_reference(codes, scales, -1, "w4a8-lqq", tensors, meta)) < 1e-3
    bf16 = int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta, out_dtype=torch.bfloat16)
    assert len(calls) == 2 and bf16.dtype == torch.bfloat16
    assert torch.equal(bf16, int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta, out_dtype=torch.bfloat16,
                                         config=TileConfig(64, 128, 1, 4, 3)))
    int8_matmul(codes[:16], scales[:16], -1, "w4a8-lqq", tensors, meta)  # decode sizes: GEMV / Triton
    assert len(calls) == 2


def test_two_warpgroups_where_the_cost_model_puts_them():
    # measured on an H100: the timed fastest, or within noise
    # of it (28672x4096 M = 320: 107.9 us vs 107.6 on 192-token tiles)
    measured = {(14336, 300): (128, 3, 1, 32), (14336, 320): (128, 3, 1, 32), (28672, 300): (128, 3, 1, 32),
                (28672, 320): (128, 3, 1, 32), (14336, 352): (128, 3, 1, 64),
                (6144, 448): (64, 3, 1, 32), (6144, 480): (64, 3, 1, 32)}
    for (n, m), cfg in measured.items():
        assert lqq_wgmma_launch(m, n, 4096) == (cfg, 2), (n, m)
        assert lqq_wgmma_config(m, n, 4096) == cfg and lqq_wgmma_warpgroups(m, n, 4096) == 2
    # from M = 384 the large-M model's one-warpgroup launches of lqq_ws
    # (14336x4096 M = 384 48.5 us vs 59.3 on the two-warpgroup tiles,
    # M = 448 64.3 vs 79.2, 4608x3584 M = 512 21.9 vs 26.4)
    assert lqq_wgmma_launch(384, 14336, 4096) == lqq_wgmma_launch(500, 4608, 3584) == ((128, 2, 1, 64), 1)
    assert lqq_wgmma_launch(448, 14336, 4096) == ((128, 2, 1, 32), 1)
    # one warpgroup where it was the faster or within noise: 14336x4096 M = 288 (51.1 vs 50.4 on the same tile with
    # two), and
    # 6144x4096 at M = 289-320, where one warpgroup's 96-token tiles fit in one wave (26.3-26.9 us vs 27.9-29.9)
    assert lqq_wgmma_launch(288, 14336, 4096) == ((64, 3, 1, 32), 1)
    for m in (289, 300, 320):
        assert lqq_wgmma_launch(m, 6144, 4096) == ((64, 3, 1, 32), 1)
    # never on a split, never where several programs share an SM, never at decode sizes or on the Triton kernel
    for n, k in ((14336, 4096), (28672, 4096), (4096, 4096), (6144, 4096), (4096, 14336), (1024, 4096),
                 (18944, 3584), (4608, 3584)):
        for m in (33, 64, 96, 128, 160, 200, 256, 300, 400, 512, 513, 640, 768, 1024, 2048, 4096):
            launch = lqq_wgmma_launch(m, n, k)
            if launch is None:
                assert lqq_wgmma_warpgroups(m, n, k) == 1
                continue
            (bm, stages, split, tail), wg = launch
            if wg == 2:
                assert split == 1 and configs.lqq_ws_launch((bm, stages, split, tail), 2)[4] == 1, (n, k, m)
                if configs.lqq_uses_cost_model(m, n, k):  # (the large-M model weighs its options by their waves)
                    assert configs.LQQ_WGMMA_PER_SM[(bm + tail, stages)] == 1, (n, k, m)
                    assert all(configs._lqq_waves(m, n, t, 1, configs.SMS_H100) > 1 for t in configs.LQQ_WGMMA_TILES)
    for m in (33, 64):
        assert lqq_wgmma_warpgroups(m, 14336, 4096) == 1
    assert lqq_wgmma_launch(1024, 14336, 4096) == T256  # two warpgroups on 256 tokens
    # M = 2048 on the wide layer: the 256-token tiles, 223.9 vs 252.3 us (ABBA)
    assert lqq_wgmma_launch(2048, 14336, 4096) == T256
    # M = 481-512 on the wide layer, where the cost model is off by 3-4 %: the large-M model (70.6 us vs 83.0)
    assert lqq_wgmma_launch(512, 14336, 4096) == ((128, 2, 1, 64), 1)
    # a two-warpgroup program costs LQQ_WGMMA_COST["two_warpgroups"] one-warpgroup programs over half as many row tiles
    one = lqq_wgmma_cost(300, 14336, 4096, 160, 1)
    two = lqq_wgmma_cost(300, 14336, 4096, 160, 1, warpgroups=2)
    assert two < one and two == pytest.approx(one * configs.LQQ_WGMMA_COST["two_warpgroups"] * (1.88 / 3.76), rel=0.01)


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


@pytest.mark.gpu
@hopper
def test_int8_matmul_runs_two_warpgroups_where_the_rule_says(monkeypatch):
    calls = record_launches(monkeypatch, gluon_lqq_wgmma, "lqq_wgmma_matmul", 4)
    monkeypatch.setattr(configs, "lqq_ws_launch", lambda *a: None)  # these launches run lqq_ws otherwise
    for n, m, launch in ((14336, 300, (128, 3, 1, 32, 2)), (14336, 192, (128, 3, 1, 64, 2))):
        calls.clear()
        _, tensors, meta = packed("w4a8-lqq", n, 4096, 128, seed=2)
        codes, scales = _acts(m, 4096, 2)
        out = int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta)
        assert calls == [launch]
        assert rel_err(out, int8_reference(codes, scales, -1, "w4a8-lqq", tensors, meta)) < 1e-3


def test_one_copy_per_tile_only_for_two_warpgroups_with_a_tail():
    """The single cp.async per tile (one CTA barrier fewer) is taken only where the A/B measured it faster."""
    assert one_copy_per_tile(64, 2) == one_copy_per_tile(32, 2) == 0
    assert one_copy_per_tile(0, 2) == one_copy_per_tile(64, 1) == one_copy_per_tile(0, 1) == 2
