"""The default launch rules (quantkit/runtime/kernels/heuristic.py) by their invariants: every default launch is one
the tune space holds, fills the SMs it is given without splits shorter than the minimum, and needs nothing of a
particular GPU beyond its SM count."""

from __future__ import annotations

import pytest
import torch

import quantkit.runtime.kernels.gemm  # noqa: F401  (registers the kernels)
from quantkit.bench.explain import METHOD_PROBLEMS, PER_CHANNEL_METHODS
from quantkit.runtime.kernels import heuristic as rules
from quantkit.runtime.kernels.registry import PRIORITY, GemmProblem, plan
from quantkit.runtime.kernels.triton.launch import split_plan

HOPPER_TOOLS = frozenset({"cupy", "gluon"})
SHAPES = [(512, 3584), (1024, 4096), (4096, 4096), (6144, 4096), (14336, 4096), (28672, 4096), (4096, 14336),
          (2048, 5120), (300, 1000)]
MS = [1, 2, 8, 9, 16, 17, 31, 32, 33, 64, 65, 96, 97, 128, 200, 256, 300, 512, 513, 700, 1024, 1500, 4096]


def _problems(sms_list=(132, 78, 16)):
    for method, (op, layouts, act) in METHOD_PROBLEMS.items():
        for n, k in SHAPES:
            for m in MS:
                for sms in sms_list:
                    yield method, GemmProblem(op, layouts, m, n, k, act, torch.float16, (9, 0), sms, HOPPER_TOOLS,
                                              "", -1 if method in PER_CHANNEL_METHODS else None)


def test_every_default_launch_is_in_its_kernels_tune_space():
    for method, p in _problems():
        for kernel in PRIORITY[p.op]:
            if not kernel.can_implement(p)[0] or not kernel.picks(p)[0]:
                continue
            configs = kernel.configs(p)
            assert configs, (kernel.name, p.describe())
            if configs[0] is not None:
                assert configs[0] in kernel.candidates(p), (kernel.name, p.describe(), configs[0])


def test_wide_w8a8_tiles_serve_per_channel_products_of_enough_waves_only():
    """128×128 tiles (int32 sums over K) for per-channel products of at least W8A8_WIDE_TILE_WAVES waves, and no K
    split below W8A8_CHANNEL_SPLIT_MIN_TILES; g128 weights with per-token activations (per-block sums) keep the
    64-token tiles the block epilogue overlaps."""
    from quantkit.runtime.kernels.gemm import GluonW8a8

    wide = (128, 128, 3, 8, False, 1)
    for sms in (16, 132):
        for n, k in SHAPES:
            for m in MS:
                big = rules.cdiv(m, 128) * rules.cdiv(n, 128) >= rules.W8A8_WIDE_TILE_WAVES * sms
                for group in (-1, 128, None):
                    p = GemmProblem("a8", ("w8",), m, n, k, -1, torch.float16, (9, 0), sms, HOPPER_TOOLS, "", group)
                    cfg = GluonW8a8().rule(p)
                    if m >= 17:
                        assert (cfg == wide) == (big and group == -1), (p.describe(), group, cfg)
                        if group == -1 and rules.k_tiles(k) < rules.W8A8_CHANNEL_SPLIT_MIN_TILES:
                            assert cfg[5] == 1, (p.describe(), cfg)  # short K: per-channel sums are not split


def test_every_problem_has_a_kernel_and_the_last_of_each_list_takes_everything():
    for method, p in _problems():
        assert any(c.ok for c in plan(p)), p.describe()
        last = PRIORITY[p.op][-1]
        assert last.can_implement(p)[0] and last.picks(p)[0]


@pytest.mark.parametrize("sms", [16, 78, 132, 264])
def test_triton_tiles_fit_m_and_split_only_to_fill_the_sms(sms):
    for n, k in SHAPES:
        for m in MS:
            cfg = rules.triton_tile(m, n, k, sms)
            assert cfg.bm <= max(16, 1 << (m - 1).bit_length()) and 16 <= cfg.bm <= 128
            programs = rules.cdiv(n, cfg.bn) * rules.cdiv(m, cfg.bm)
            if cfg.split_k > 1:
                assert programs * cfg.split_k // 2 < sms  # the last doubling was still short of a program an SM
                assert rules.k_tiles(k) // cfg.split_k >= rules.MIN_SPLIT_TILES


def test_the_split_follows_the_real_sm_count():
    # a narrow layer at decode size: more SMs want more programs, so a longer split
    small, big = rules.triton_tile(1, 1024, 4096, 16), rules.triton_tile(1, 1024, 4096, 132)
    assert small.split_k < big.split_k
    assert rules.split_to_fill(1000, 4096, 132) == 1 and rules.split_to_fill(8, 4096, 132) == 4


def test_gluon_launch_rules_give_arguments_their_kernels_take():
    from quantkit.runtime.kernels.gluon_sm90 import lqq_wgmma

    for _, p in _problems((132, 78)):
        if p.layouts != ("w4a8-lqq",):
            continue
        launch = rules.lqq_gluon_launch(p.m, p.n, p.k, p.sms)
        if launch is None:
            assert p.m < rules.WGMMA_MIN_M
            continue
        form, args = launch
        if form == "ws":
            bm, stages, tail, wg, per_sm, split = args
            assert bm == 128 and tail == 0 and split == 1 and 1 <= per_sm <= 3 - wg
        else:
            bm, stages, split, tail, wg = args
            assert bm in (32, 64, 128) and bm <= max(32, p.m + 31) and split >= 1
            assert lqq_wgmma.KERNEL
            kt = rules.k_tiles(p.k)
            assert split == 1 or split_plan(kt, split)[0] >= rules.MIN_SPLIT_TILES


def test_without_a_gpu_only_the_triton_kernels_run():
    for method, (op, layouts, act) in METHOD_PROBLEMS.items():
        p = GemmProblem(op, layouts, 16, 4096, 4096, act, torch.float16)
        chosen = next(c for c in plan(p) if c.ok)
        # the interpreted Triton kernels, or for FP8 (no Triton kernel) the torch form
        assert chosen.kernel.name.startswith("triton.") or chosen.kernel.name == "torch.fp8", (method, chosen.kernel.name)
