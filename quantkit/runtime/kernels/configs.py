"""Tile configurations of the Triton GEMM kernels and the rule that picks one per problem size.

Both kernels compute the transposed product Y^T = W·X^T (LiquidGEMM Sec. 5.4): a program owns BN weight rows
(the tensor-core M dimension, 64 per warpgroup for wgmma) and BM tokens (the N dimension, as small as 16), so a
decode step with one token wastes no weight-side work. Small M is memory-bound: the weight stream must be spread
over enough programs to keep every SM loading (split-K adds programs along K; their fp32 partial sums go to
per-split workspace slots that the last program of a tile adds, :mod:`quantkit.runtime.kernels.triton.splitk`). Large M is compute-bound.

Up to M = 16 (and for the 8-bit and one-launch mixed kernels at every M) :data:`TABLE` holds the fastest config
per kernel kind and token-count class measured by ``python -m quantkit.bench.sweep`` on an H100 at
N = 14336, K = 4096; for narrow layers at small M (fewer row tiles than half the SMs, e.g. N = 4096) the rule
switches to 64-row tiles and splits K until about one program per SM streams weights. Above M = 16 the 4-bit
single-weight kernels pick from :data:`WAVE_TILES` by wave fill (:func:`wave_config`). docs/BENCHMARKS.md.
"""

from __future__ import annotations

import functools
import heapq
import math

from dataclasses import asdict, dataclass

from quantkit.runtime.kernels.triton.launch import split_plan

SMS_H100 = 132


@dataclass(frozen=True)
class TileConfig:
    """One launch shape: BN weight rows × BM tokens per program, split_k programs along K."""

    bn: int
    bm: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3

    def to_dict(self) -> dict:
        return asdict(self)


# Above M = 16 the 4-bit kernels pick from a per-kind, per-M-class list of tiles (largest first): the first with
# >= MIN_PROGRAMS programs whose last wave is not mostly empty (programs / (waves · SMs · per-SM) >= MIN_WAVE_FILL),
# else, of those with >= MIN_PROGRAMS programs, the one with the fullest waves, else the last (LiquidQuant then
# splits K on long rows). Tuned on an H100 at M = 32 … 4096 on the five Llama-3.1-8B shapes (docs/BENCHMARKS.md).
# LiquidQuant runs best with two programs per SM (two-stage 128×128 or 64×128 tiles of 4 warps: while one program
# dequantizes, the other's tensor-core products run; within a program Triton 3.6 waits for each int8 product before
# the next tile), e.g. 6144×4096 M=4096: 128×128 2 stages 218 µs, 128×256 8 warps 250 µs.
# Entries with split_k > 1 count split_k programs per tile and apply only to rows long enough that each split
# keeps >= WAVE_SPLIT_MIN_TILES tiles of 256 columns (K >= 7168 at split 2, 14336 at 4): on a long-row layer
# splitting K fills the waves where shrinking the tile did (4096×14336 LiquidQuant M=64 64×64 split 4 21.6 µs vs
# 29.5 for 64×32; W4A16 M=64 64×64 split 2 29.1 vs 48.1); on 16-tile rows (K = 4096) splits were mixed and are left
# out. LiquidQuant at M = 257-512 tries 64×128 tiles first and takes them from a wave fill of 0.7
# (WAVE_FILL_OF_CLASS): 6144×4096 M=512 33.9 µs vs 49.5 for the 64×64 tiles whose waves are fuller.
# Entries: (largest M of the class, [(config, programs resident per SM — shared memory and registers)]).
MIN_PROGRAMS = 90
MIN_WAVE_FILL = 0.8
WAVE_SPLIT_MIN_TILES = 14
WAVE_FILL_OF_CLASS = {("lqq", 512): 0.7}  # (kind, largest M of the class) → its MIN_WAVE_FILL
_T64 = TileConfig(64, 64, 1, 4, 4)
WAVE_TILES: dict[str, list[tuple[int, list[tuple[TileConfig, int]]]]] = {
    "lqq": [(64, [(_T64, 2), (TileConfig(64, 64, 2, 4, 4), 2), (TileConfig(64, 64, 4, 4, 4), 2),
                  (TileConfig(64, 32, 1, 4, 4), 3)]),
            (256, [(TileConfig(128, 128, 1, 4, 2), 2), (TileConfig(64, 128, 1, 4, 2), 2),
                   (TileConfig(64, 128, 2, 4, 3), 1), (TileConfig(64, 128, 4, 4, 3), 1), (_T64, 2)]),
            (512, [(TileConfig(64, 128, 2, 4, 3), 1), (TileConfig(64, 128, 4, 4, 3), 1),
                   (TileConfig(64, 128, 1, 4, 2), 2), (TileConfig(128, 128, 1, 4, 2), 2), (_T64, 2)]),
            (1 << 30, [(TileConfig(128, 128, 1, 4, 2), 2), (TileConfig(64, 128, 1, 4, 2), 2),
                       (TileConfig(64, 128, 2, 4, 3), 1), (TileConfig(64, 128, 4, 4, 3), 1), (_T64, 2)])],
    "asym": [(64, [(_T64, 2)]), (1 << 30, [(TileConfig(256, 64, 1, 8, 4), 1), (_T64, 2)])],
    "w4a16": [(64, [(TileConfig(128, 64, 1, 4, 4), 1), (_T64, 2), (TileConfig(64, 64, 2, 4, 4), 2)]),
              (256, [(TileConfig(128, 128, 1, 8, 3), 1), (TileConfig(128, 128, 2, 8, 3), 1),
                     (TileConfig(128, 64, 1, 4, 4), 1), (TileConfig(64, 128, 2, 4, 3), 1), (_T64, 2)]),
              (1 << 30, [(TileConfig(128, 128, 1, 8, 3), 1)])],
}

KINDS = ("w4a16", "lqq", "asym", "w8", "mixed")
# kind → [(largest M of the class, config)] at M <= 16 (all kinds) and above (w8, mixed), measured at
# N = 14336, K = 4096 (docs/BENCHMARKS.md); W4A16 at M = 2-16 on 128-row tiles (14336×4096 M = 8: 16.7 µs vs 21.2
# on 64-row tiles)
TABLE: dict[str, list[tuple[int, TileConfig]]] = {
    "w4a16": [(1, TileConfig(128, 16, 2, 4, 4)), (16, TileConfig(128, 16, 1, 4, 4))],
    "lqq": [(16, TileConfig(128, 16, 1, 4, 4))],
    "asym": [(16, TileConfig(128, 16, 1, 4, 4))],
    "w8": [(1, TileConfig(128, 16, 1, 4, 4)), (16, TileConfig(64, 16, 1, 4, 4)), (64, TileConfig(64, 64, 1, 4, 3)),
           (1 << 30, TileConfig(64, 256, 1, 8, 2))],
    "mixed": [(1, TileConfig(64, 16, 1, 4, 4)), (16, TileConfig(128, 16, 1, 4, 4)), (64, TileConfig(64, 64, 1, 4, 3)),
              (1 << 30, TileConfig(64, 128, 1, 4, 3))],
}


# Shortest K split (in 256-column tiles) of the small-M rule: with split-K sums in per-split slots even short splits
# pay (4096×4096 M = 16 split 4: LiquidQuant 8.7 µs vs 9.6 unsplit, W4A16 9.6 vs 12.0).
MIN_SPLIT_TILES = 4


def _split_for(programs: int, tiles: int, target: int, min_tiles: int = MIN_SPLIT_TILES) -> int:
    """Split-K factor (doubling) of a launch of ``programs`` unsplit programs over rows of ``tiles`` tiles of 256
    columns, until it has ``target`` programs (e.g. one per SM) or a split would be shorter than ``min_tiles``."""
    split = 1
    while programs * split < target and tiles // (split * 2) >= min_tiles:
        split *= 2
    return split


def wave_fill(programs: int, per_sm: int, sms: int = SMS_H100) -> float:
    """Fraction of the launched waves' program slots that hold a program: programs / (waves · SMs · per_sm)."""
    slots = sms * per_sm
    return programs / (-(-programs // slots) * slots)


def wave_config(m: int, n: int, k: int, kind: str, sms: int = SMS_H100) -> TileConfig:
    """Tile of a 4-bit kernel above M = 16 from WAVE_TILES (comment above it), among those with no more token
    columns than max(64, M), up to M = 512 no half-empty last token tile, and no K split shorter than
    WAVE_SPLIT_MIN_TILES tiles: the first of M's class with >= MIN_PROGRAMS programs and a wave fill
    >= MIN_WAVE_FILL (or the class's own, WAVE_FILL_OF_CLASS), else the
    fullest-wave one with >= MIN_PROGRAMS programs, else the last, whose K LiquidQuant and W4A16 split (doubling)
    while short of MIN_PROGRAMS programs and each split keeps >= MIN_SPLIT_TILES tiles of 256 columns: the
    narrow k/v projections (1024×4096 M = 32-128: 64×32 or 64×64 tiles split 4, 6.7-10 µs vs 10-15 unsplit)."""
    n_tiles = -(-k // 256)
    top, tiles = next((top, t) for top, t in WAVE_TILES[kind] if m <= top)
    min_fill = WAVE_FILL_OF_CLASS.get((kind, top), MIN_WAVE_FILL)
    # no tile with more token columns than M needs (M = 65-127 would leave half of a 128-token tile empty) or,
    # up to M = 512, whose last token tile would be half empty or emptier (M = 192, 320, 448 on 128-token tiles);
    # above 512 the last tile pads M by < 25 % and 64-token tiles cost far more (LiquidQuant 14336×4096 M = 1025 on
    # 64×64 250.8 µs, 0.66× fp16; M = 1000 on 128×128 151.4); no split of rows too short for it
    tiles = [(cfg, per_sm) for cfg, per_sm in tiles if cfg.bm <= max(64, m)
             and not (m <= 512 and cfg.bm > 64 and m > cfg.bm and (-m) % cfg.bm >= cfg.bm // 2)
             and (cfg.split_k == 1 or n_tiles // cfg.split_k >= WAVE_SPLIT_MIN_TILES)] or tiles[-1:]
    programs = [-(-n // cfg.bn) * -(-m // cfg.bm) * cfg.split_k for cfg, _ in tiles]
    enough = [(cfg, wave_fill(p, per_sm, sms)) for (cfg, per_sm), p in zip(tiles, programs) if p >= MIN_PROGRAMS]
    for cfg, fill in enough:
        if fill >= min_fill:
            return cfg
    if enough:
        return max(enough, key=lambda e: e[1])[0]  # first of the fullest on ties
    cfg = tiles[-1][0]
    if kind not in ("lqq", "w4a16"):
        return cfg
    split = cfg.split_k * _split_for(programs[-1], n_tiles // cfg.split_k, MIN_PROGRAMS)
    return TileConfig(cfg.bn, cfg.bm, split, cfg.num_warps, cfg.num_stages)


def gemm_config(m: int, n: int, k: int, kind: str = "w4a16", sms: int = SMS_H100) -> TileConfig:
    """The tile config of kernel ``kind`` (w4a16, lqq, asym, w8, mixed) for an [M, K] × [K, N] product: above
    M = 16 the 4-bit single-partition kernels use :func:`wave_config`; otherwise the measured table entry of
    M's class, and for small M on a layer with fewer row tiles than half the SMs, 64-row tiles with K split
    until about one program per SM (module docstring)."""
    if kind not in TABLE:
        raise ValueError(f"unknown kernel kind '{kind}'; known: {', '.join(KINDS)}")
    if kind in WAVE_TILES and m > 16:
        return wave_config(m, n, k, kind, sms)
    cfg = next(c for top, c in TABLE[kind] if m <= top)
    if m <= 16 and -(-n // cfg.bn) * -(-m // cfg.bm) < sms // 2:
        programs = -(-n // 64) * -(-m // cfg.bm)
        cfg = TileConfig(64, cfg.bm, max(cfg.split_k, _split_for(programs, -(-k // 256), sms)), 4, 4)
    return cfg


# LiquidQuant W4A8 on Hopper at M = 32-4096: the Gluon kernels (:mod:`quantkit.runtime.kernels.gluon_sm90.lqq_wgmma`;
# its unsplit 128-token launches on :mod:`quantkit.runtime.kernels.gluon_sm90.lqq_ws`), whose dequantization overlaps
# int8 products of other warpgroups. A program owns 64 weight rows and a token tile of 32, 64 or 128 tokens, or
# 96 / 160 / 192 as a 64- or 128-token tile plus a 32- or 64-token tail tile multiplying the same dequantized weights
# (a program dequantizes its weight slice once whatever its token tile, so fewer token tiles mean less
# dequantization, but fewer programs).
# From M = 32 (to 768, where neither the large-M model nor a measured exception below takes the point,
# lqq_uses_cost_model) the rule scores every (token tile, K split, warpgroups) with a small cost model
# (lqq_wgmma_cost): rounds of programs (ceil of programs / (SMs × resident programs), blended with the exact fraction
# by "exact_rounds") × resident programs ^ "share" (programs sharing an SM slow each other, less than linearly) × (1 +
# "tokens" × tokens / 32) (a tile's products next to its dequantization) × (K tiles per split + "fixed_tiles", +
# "split_tiles" + "slot_tiles" × split when split: the prologue and epilogue, and the split-K slots the tile's last
# program adds) × "two_warpgroups" for a two-warpgroup program. The parameters are fitted on an H100 to 120 timed
# points (13 shapes, M = 33-512, every tile at K split 1, 2 and 4): the picks' geometric-mean time / fastest 1.027
# (docs/BENCHMARKS.md). "two_warpgroups" stays 1.75: at 1.5 (the fit's best, by 0.2 %) 18944×3584 M = 260-288 ran
# 0.89-0.90x. Up to M = 64 only launches of MIN_PROGRAMS programs or more count (else the Triton kernel). A split's
# tiles are split_plan's: all but the last keep MIN_SPLIT_TILES (K = 3584 splits 4 as 4+4+4+2, measured fastest at
# M <= 64 on the 3584-column shapes).
# Resident programs per SM (LQQ_WGMMA_PER_SM) come from ptxas's registers and the shared-memory ring (Triton 3.6);
# two activation stages instead of three at M = 513-768 when the launch has a program per SM (4096×4096 M = 768:
# 30.5 vs 38.5 µs on 128-token tiles; the 1024-row layer's 80 programs keep 3: 14.1 µs vs 17.7 at best with 2).
# K splits only when the unsplit launch has fewer programs than SMs, each split keeping >= MIN_SPLIT_TILES tiles of
# 256 columns (4096×14336 M = 160: 34 µs split 2 vs 47).
# Above M = 768 (up to M = 4096; layers of N > 8192 only with K <= 8192), and from M = 384 where 128-token programs
# would fill half the SMs (LQQ_BIG_M_MIN_M): the large-M wave model below (LQQ_BIG_M_WS) picks the tile where
# 128-token programs would fill at least half the SMs and the long-row split (next) leaves them unsplit; on
# smaller layers the token tile halves and K splits (doubling) where fewer than half the SMs would get a program,
# and rows of K >= 7168 split as long rows while short of LQQ_WGMMA_LONG_ROW_PROGRAMS 128-token programs (not
# measured above 768; e.g. 2048×14336 M = 769-1280 runs split 2). The model's unsplit picks on rows longer than 8192
# were measured on 4096×14336 only. Two warpgroups per program below 768 where the cost model puts them (below).
LQQ_WGMMA_BM = (128, 64, 32)
LQQ_WGMMA_MIN_M = 32
LQQ_WGMMA_MAX_M = 4096
LQQ_WGMMA_WIDE_MAX_M = 768  # above this, the large-M wave model (not on layers of N and K > LQQ_WGMMA_NARROW)
LQQ_WGMMA_NARROW = 8192
LQQ_WGMMA_LONG_ROW_PROGRAMS = 384
LQQ_WGMMA_TILES = {32: (32, 0), 64: (64, 0), 96: (64, 32), 128: (128, 0), 160: (128, 32), 192: (128, 64)}
# (tokens per program, activation stages) → programs resident per SM
LQQ_WGMMA_PER_SM = {(32, 3): 5, (64, 3): 4, (96, 3): 3, (128, 3): 2, (160, 3): 1, (192, 3): 1,
                    (32, 2): 5, (64, 2): 4, (96, 2): 3, (128, 2): 3, (160, 2): 2, (192, 2): 2}
LQQ_WGMMA_COST = {"share": 0.5, "tokens": 0.1, "exact_rounds": 0.2, "fixed_tiles": 2, "split_tiles": 0,
                  "slot_tiles": 1, "two_warpgroups": 1.75}
LQQ_WGMMA_SPLITS = (1, 2, 4)
# Measured exceptions to the cost model, by the layer's row tiles of 64 (K in LQQ_ROW_TILE_EXCEPTIONS_K, the
# measured 3584-4096): (first M, last M, the Gluon config or None for the Triton kernel). Fusing q/k/v at load
# (quantkit/runtime/fused_siblings.py) makes 6144×4096 (96 row tiles) every Llama-3-8B / Mistral-7B layer's q/k/v
# product, and there the model's picks leave 96 row tiles' waves ragged: at M = 416-480 96-token tiles (64 + 32)
# took 34.6-36.1 µs where the model's 128-token tiles took 38.5-40.6; at 481-640 the Triton kernel (64×128 tiles at
# 481-512, 384 programs; 128×128 at 513-640, 240 programs, one wave of two per SM) 35.8-43.2 vs 39.7-54.9 for the
# model. On 4608×3584 (72 row tiles, Qwen2.5-7B's q/k/v fused) the Triton kernel's 128×128 tiles (216 programs) took
# 33.5-34.8 µs at M = 641-768 against the model's 43.1-47.3. Applied to 72 and 128 row tiles at M = 464-640 the
# Triton kernel ran 1.15-1.65× slower than the model's picks, so the exceptions stay per measured row-tile count.
LQQ_ROW_TILE_EXCEPTIONS_K = (3584, 4096)
# Each entry: (first M, last M, config or None, warpgroups). 96 row tiles at 416-480: two warpgroups (33.2 / 33.5 µs
# at M = 448 / 480 vs 35.3 / 35.6 with one; 416 is the same launch grid); above 640 the large-M wave model (44.6 /
# 45.2 µs at M = 700 / 768 against 47.7 / 49.9 on 128-token tiles).
# 72 row tiles at M = 641-768: the Triton kernel's 128×128 tiles (216-252 programs, one wave, two per SM); above 768
# the large-M wave model's warp-specialized launches are faster (31.5-34.7 µs against 33.9-36.3).
LQQ_ROW_TILE_EXCEPTIONS = {96: ((416, 480, (64, 3, 1, 32), 2), (481, 640, None, 1)),
                           72: ((641, 768, None, 1),)}


def _lqq_stages(m: int, programs: int, sms: int) -> int:
    return 2 if m > 512 and programs >= sms else 3


def _lqq_per_sm(m: int, n: int, tile: int, warpgroups: int, sms: int) -> int:
    """Programs of ``tile`` tokens (unsplit) resident per SM at the stage count the rule gives their launch."""
    return LQQ_WGMMA_PER_SM[(tile, _lqq_stages(m, -(-n // (64 * warpgroups)) * -(-m // tile), sms))]


def _lqq_waves(m: int, n: int, tile: int, warpgroups: int, sms: int) -> float:
    """Waves of the unsplit launch on ``tile`` tokens: programs over SMs × resident programs."""
    return -(-n // (64 * warpgroups)) * -(-m // tile) / (sms * _lqq_per_sm(m, n, tile, warpgroups, sms))


def lqq_wgmma_cost(m: int, n: int, k: int, tile: int, split: int, sms: int = SMS_H100,
                   warpgroups: int = 1, cost: dict | None = None) -> float:
    """Relative time of the Gluon LiquidQuant kernel on ``tile`` tokens per program, a K split and 1 or 2
    warpgroups of 64 weight rows per program (the cost model of the comments above and below, with the parameters
    ``cost``, default LQQ_WGMMA_COST; only its ordering means anything)."""
    c = LQQ_WGMMA_COST if cost is None else cost
    unsplit = -(-n // (64 * warpgroups)) * -(-m // tile)
    programs = unsplit * split
    per_sm = _lqq_per_sm(m, n, tile, warpgroups, sms)
    rounds = programs / (sms * per_sm)
    rounds = math.ceil(rounds) * (1 - c["exact_rounds"]) + rounds * c["exact_rounds"]
    resident = min(per_sm, -(-programs // sms))
    work = -(-k // 256) / split + c["fixed_tiles"] + (c["split_tiles"] + c["slot_tiles"] * split if split > 1 else 0)
    cost = rounds * resident ** c["share"] * (1 + c["tokens"] * tile / 32) * work
    return cost * (c["two_warpgroups"] if warpgroups == 2 else 1.0)


# Two warpgroups per LiquidQuant program (128 weight rows sharing each activation tile), every two-warpgroup result
# bit-identical to the Triton kernel: they pay where a program is alone on its SM — the 128-token tiles with a tail
# at three stages, whose activation ring leaves room for one program per SM (LQQ_WGMMA_PER_SM), so one warpgroup has
# the SM's tensor cores and dequantization to itself: 14336×4096 M = 300-448 on 160/192-token tiles 53.4-80.1 µs with
# two vs 62.7-92.7 with one. Where several programs share an SM they lose (the 32/64/128-token tiles, and every tile
# above M = 512 at two stages: 4-35 % slower) — except the 96-token tiles on 6144×4096 at M = 448/480, a measured
# exception above. So the cost model scores two warpgroups only on unsplit tiles with one program per SM: programs
# over 128-row tiles, each costing LQQ_WGMMA_COST["two_warpgroups"] × a one-warpgroup program of the same tile
# (1.56-1.86 measured per program; 1.75 keeps 14336×4096 M = 448 on one warpgroup's 96-token tiles, 75.3 µs vs
# 80.1). And only where no one-warpgroup launch fits in one wave (LQQ_WGMMA_PER_SM is the one-warpgroup table; it
# holds for a two-warpgroup program only because those are scored where one program fits per SM): on 6144×4096 at
# M = 289-320 two-warpgroup 160-token tiles (96 programs) took 27.9-29.9 µs against 26.3-26.9 for one warpgroup's
# 96-token tiles, 384 programs three to an SM. Where the model is off (14336×4096 at M = 481-512: two warpgroups on
# 192-token tiles, 3-4 % slower than one warpgroup's 128-token tiles) the large-M model takes the point (M >= 384).


# LiquidQuant above M = 768: a wave model over launches of the warp-specialized kernel
# (:mod:`quantkit.runtime.kernels.gluon_sm90.lqq_ws`). A launch of P programs, p resident per SM, runs
# W = ceil(P / (SMs · p)) waves; the last, a fraction f of a full wave, counts (solo if no SM holds two of its
# programs, else 1) · (1 − blend) + f · blend (a program alone on its SM runs faster than two sharing one; a ragged
# last wave of programs that share an SM costs nearly a full wave); time = cost × (W − 1 + last) × K / 256.
# Per option, solo and blend are the grid point (0.02 / 0.1 steps) with the most uniform log cost over the points
# timed on an H100 (nine shapes × 15 token counts from 769 to 4096; sd 0.066-0.086), the cost their median; the pick
# was within 2 % of the best at 124 of 135 points, geometric-mean time / fp16 0.722 (docs/BENCHMARKS.md). It covers
# the wide layers (N > 8192, K <= 8192) too, and the layers of N <= 8192 with longer rows up to 4096 tokens
# (measured on 4096x14336). Wider layers with longer rows keep the Triton kernel (not measured).
# (tokens per program, warpgroups, activation stages) → (programs resident per SM, solo, blend, cost per wave of
# 256 K columns)
# From M = LQQ_BIG_M_MIN_M the same model also picks below 769 tokens, where 128-token programs would give at least
# half the SMs one (on rows longer than LQQ_WGMMA_NARROW: LQQ_WGMMA_LONG_ROW_PROGRAMS, where the long-row split
# stops; not on layers with more and longer rows, as above 768): geometric-mean time / fp16 0.785 against 0.878 for
# the cost model where the launch differs. Below 384 tokens, and on layers with fewer programs, the cost model above.
# Two-warpgroup programs run their warpgroups as partitions that take turns (lqq_ws), measured 1.16x (geometric mean)
# the form the (192, 2, 3) cost was fitted to: that option's cost is scaled by 1 / LQQ_BIG_M_ROW_PAIR_GAIN.
# On rows longer than LQQ_WGMMA_NARROW a refit with five more two-warpgroup options (128, 160 and 192 tokens at three
# and four stages; LQQ_BIG_M_WS_LONG_ROWS) prices the launches: on 4096x14336 (Llama-3-8B's down_proj) at
# M = 769-4096 it ran 0.99-1.17x the LQQ_BIG_M_WS constants (geometric mean 1.070x), while on the 14336- and
# 28672-row layers it lost slightly (0.986 and 0.988x), so it applies to long rows only (docs/BENCHMARKS.md,
# "Launch options for LiquidQuant above 384 tokens …"). It was checked on layers of N <= 5120 with K = 11008-18944;
# the one-warpgroup picks (max_warpgroups=1, where a two-warpgroup build failed) follow its constants but were not
# timed as such.
LQQ_BIG_M_MIN_M = 384
LQQ_BIG_M_ROW_PAIR_GAIN = 1.16
# 256-token programs (128 tokens + a 128-token tail tile, two warpgroups: 128 rows × 256 tokens, three stages) run on
# lqq_ws only (lqq_wgmma has no 128-token tail); their dequantization costs 1-3 % of their time. The option's
# constants are fitted on each table's own scale, so the other options' constants and picks stay (sd of the log cost
# 0.059-0.061); 1.096x geometric mean (0.96-1.33x) over the launches without it where the pick changes. The two-stage
# form was never the better of the two by much and is left out. Below 513 tokens (two token tiles or fewer) it was
# not measured, and it is not offered there.
LQQ_BIG_M_TOKENS_256 = (256, 2, 3)
LQQ_BIG_M_TOKENS_256_MIN_M = 513
LQQ_BIG_M_WS = {(192, 1, 2): (2, 0.88, 0.5, 1.592), (160, 1, 2): (2, 0.80, 0.4, 1.381),
                (128, 1, 3): (2, 0.88, 0.5, 1.219), (192, 2, 3): (1, 1.0, 0.1, 1.749 / LQQ_BIG_M_ROW_PAIR_GAIN),
                (192, 1, 3): (1, 1.0, 0.2, 0.985), LQQ_BIG_M_TOKENS_256: (1, 1.14, 0.3, 1.752)}
LQQ_BIG_M_WS_LONG_ROWS = {(192, 1, 2): (2, 0.86, 0.4, 1.630), (160, 1, 2): (2, 0.80, 0.3, 1.408),
                          (128, 1, 3): (2, 0.76, 0.2, 1.195), (192, 2, 3): (1, 1.04, 0.2, 1.521),
                          (192, 1, 3): (1, 1.04, 0.1, 0.976), (128, 2, 3): (1, 1.04, 0.1, 1.123),
                          (128, 2, 4): (1, 1.02, 0.1, 1.140), (160, 2, 3): (1, 1.12, 0.2, 1.318),
                          (160, 2, 4): (1, 1.04, 0.1, 1.329), (192, 2, 4): (1, 1.08, 0.2, 1.488),
                          LQQ_BIG_M_TOKENS_256: (1, 0.86, 0.3, 1.972)}
# (tokens per program) → (token tile, tail) of the large-M options: the cost model's tiles and the 256-token one
LQQ_BIG_M_TILES = {**LQQ_WGMMA_TILES, 256: (128, 128)}
LQQ_WGMMA_MAX_TAIL = 64  # lqq_wgmma's largest tail tile; the 256-token launches run on lqq_ws only


def lqq_big_m_options(k: int) -> dict:
    """The large-M wave model's options and constants for rows of ``k`` columns (comment above): the long-row
    refit on rows longer than LQQ_WGMMA_NARROW, LQQ_BIG_M_WS elsewhere."""
    return LQQ_BIG_M_WS_LONG_ROWS if k > LQQ_WGMMA_NARROW else LQQ_BIG_M_WS


def lqq_big_m_waves(programs: int, per_sm: int, solo: float, blend: float, sms: int = SMS_H100) -> float:
    """Waves of a launch of ``programs`` programs, ``per_sm`` resident per SM, in the large-M wave model (comment
    above): full waves before the last, the last weighted by ``solo`` and ``blend``."""
    full = sms * per_sm
    waves = -(-programs // full)
    fraction = (programs - (waves - 1) * full) / full
    last = (solo if fraction * per_sm <= 1 else 1.0) * (1 - blend) + fraction * blend
    return waves - 1 + last


# Halved tiles: a 256-token program holds its SM alone, so a launch's last wave runs as long as a full one however
# few tiles it holds (6144x4096 M = 1024, 192 tiles on 132 SMs: the 60 of the second wave 23.1 µs against 25.0 in
# the first). lqq_ws_matmul(halves_from=h) runs tiles 0 … h − 1 whole and each later tile as two 128-token programs
# (all first halves, then the second halves), the same int32 sums and epilogue, so the same bits; a tile whose second
# half lies past M (a last token tile of <= 128 tokens) runs its first only. A half dequantizes the same weights for
# half the tokens: its wave measured a median 0.56 of a whole wave on the large-M model's scale (0.31-0.72 at up to
# five whole waves). lqq_halves_plan times each h at whole waves (and at the last whole token row) by placing the
# programs in launch order on the SMs, each on the first free one — a whole tile 1, a half LQQ_BIG_M_HALF — and the
# 256-token option of the large-M model takes the better of that and its whole-tile waves; lqq_ws_halves gives h
# where the halves won. (Like the other flags here, LQQ_WS_HALVES is read when a shape's launch is first picked:
# lqq_wgmma_launch caches its picks.)
LQQ_WS_HALVES = True
LQQ_BIG_M_HALF = 0.56
# from 577 tokens: at 513 and 576 on the two widest layers (28672x4096, 18944x3584: three token rows, the last of
# 1-64 tokens) the halved launches ran 0.91-0.97x the 192-token one-warpgroup launches; from 640 tokens they win
# (1.047x geometric mean, 0.959-1.199x, bit-identical, none slower than fp16)
LQQ_HALVES_MIN_M = 577


def lqq_tiles_with_second_half(m: int, n: int) -> int:
    """Tiles (128 rows × 256 tokens, row tiles fastest) of M tokens on N rows whose second 128 tokens hold any: all,
    or all but the last token row where it holds 128 tokens or fewer."""
    rows, token_tiles = -(-n // 128), -(-m // 256)
    return rows * token_tiles if m % 256 == 0 or m % 256 > 128 else rows * (token_tiles - 1)


def _makespan(durations: list[float], sms: int) -> float:
    """Time until the last of ``durations`` ends, each started in order on the first SM free."""
    free = [0.0] * sms
    for d in durations:
        heapq.heapreplace(free, free[0] + d)
    return max(free)


@functools.lru_cache(maxsize=4096)
def lqq_halves_plan(m: int, n: int, sms: int = SMS_H100) -> tuple[int, float]:
    """(halves_from, waves) of the 256-token launch (128 rows × 256 tokens a tile) of M >= 1 tokens on N >= 1 rows
    with its later tiles halved (comment above): the best h among whole waves and the last whole token row (h = 0,
    every tile halved, is always among them)."""
    tiles, full = -(-n // 128) * -(-m // 256), lqq_tiles_with_second_half(m, n)
    best = (0, math.inf)
    for h in sorted({w * sms for w in range(full // sms + 1)} | {full}):
        if h >= tiles:
            continue
        waves = _makespan([1.0] * h + [LQQ_BIG_M_HALF] * (tiles - h + max(0, full - h)), sms)
        if waves < best[1]:
            best = (h, waves)
    return best


def _whole_waves(option: tuple[int, int, int], m: int, n: int, k: int, sms: int) -> float:
    """Waves of the large-M model's ``option`` (tokens, warpgroups, stages) with whole tiles (:func:`lqq_big_m_waves`)."""
    tokens, wg, _ = option
    per_sm, solo, blend, _ = lqq_big_m_options(k)[option]
    return lqq_big_m_waves(-(-n // (64 * wg)) * -(-m // tokens), per_sm, solo, blend, sms)


@functools.lru_cache(maxsize=4096)  # lqq_ws_halves asks once per call of a 256-token launch
def _halves_from(m: int, n: int, k: int, sms: int) -> int | None:
    """The halved plan's ``halves_from`` where it has fewer waves than the 256-token option's whole tiles, else
    None (M >= LQQ_HALVES_MIN_M)."""
    h, waves = lqq_halves_plan(m, n, sms)
    return h if waves < _whole_waves(LQQ_BIG_M_TOKENS_256, m, n, k, sms) else None


def lqq_big_m_option_waves(option: tuple[int, int, int], m: int, n: int, k: int, sms: int = SMS_H100) -> float:
    """Waves of the large-M model's ``option`` (tokens, warpgroups, stages) for M tokens on an [N, K] weight
    (:func:`lqq_big_m_waves`); the 256-token option's the fewer of that and its halved plan's
    (:func:`lqq_halves_plan`)."""
    waves = _whole_waves(option, m, n, k, sms)
    if option == LQQ_BIG_M_TOKENS_256 and LQQ_WS_HALVES and m >= LQQ_HALVES_MIN_M:
        return min(waves, lqq_halves_plan(m, n, sms)[1])
    return waves


def lqq_ws_halves(m: int, n: int, k: int, launch: tuple[int, int, int, int, int, int] | None,
                  sms: int = SMS_H100) -> int | None:
    """``halves_from`` of :func:`quantkit.runtime.kernels.gluon_sm90.lqq_ws.lqq_ws_matmul` for the lqq_ws ``launch`` (:func:`lqq_ws_launch`) of M tokens
    on an [N, K] weight: the halved plan's where it has fewer waves than the whole tiles (comment above), else
    None."""
    if not LQQ_WS_HALVES or launch is None or m < LQQ_HALVES_MIN_M:
        return None
    bm, _, tail, warpgroups, per_sm, split = launch
    if (bm, tail, warpgroups, per_sm, split) != (128, 128, 2, 1, 1):
        return None
    return _halves_from(m, n, k, sms)


def lqq_big_m_launch(m: int, n: int, k: int, sms: int = SMS_H100,
                     max_warpgroups: int = 2) -> tuple[tuple[int, int, int, int], int]:
    """((tokens per program, stages, K split, tail), warpgroups) of the Gluon LiquidQuant kernel above M = 768 (from
    M = LQQ_BIG_M_MIN_M on layers with programs enough): the option of :func:`lqq_big_m_options` the wave model
    times fastest (comment above)."""
    table = lqq_big_m_options(k)

    def time(option: tuple[int, int, int]) -> float:
        return table[option][3] * lqq_big_m_option_waves(option, m, n, k, sms) * -(-k // 256)

    tokens, wg, stages = min((o for o in table if o[1] <= max_warpgroups
                              and (o != LQQ_BIG_M_TOKENS_256 or m >= LQQ_BIG_M_TOKENS_256_MIN_M)), key=time)
    bm, tail = LQQ_BIG_M_TILES[tokens]
    return (bm, stages, 1, tail), wg


def lqq_wgmma_warpgroups(m: int, n: int, k: int, sms: int = SMS_H100) -> int:
    """Warpgroups per program of the Gluon LiquidQuant kernel for M tokens on an [N, K] weight (the launch of
    :func:`lqq_wgmma_launch`; 1 where the Triton kernel runs)."""
    launch = lqq_wgmma_launch(m, n, k, sms)
    return 1 if launch is None else launch[1]


def lqq_wgmma_config(m: int, n: int, k: int, sms: int = SMS_H100) -> tuple[int, int, int, int] | None:
    """(tokens per program, activation stages, K split, tail tokens per program) of the Gluon LiquidQuant kernel for
    M tokens on an [N, K] weight, or None where the Triton LiquidQuant kernel runs instead (comment above)."""
    launch = lqq_wgmma_launch(m, n, k, sms)
    return None if launch is None else launch[0]


@functools.lru_cache(maxsize=4096)  # scoring 12-18 options costs ~10 µs of Python, once per layer shape and M
def lqq_wgmma_launch(m: int, n: int, k: int, sms: int = SMS_H100,
                     max_warpgroups: int = 2) -> tuple[tuple[int, int, int, int], int] | None:
    """((tokens per program, activation stages, K split, tail tokens), warpgroups) of the Gluon LiquidQuant kernel
    for M tokens on an [N, K] weight, or None where the Triton LiquidQuant kernel runs instead (comments above).
    ``max_warpgroups=1``: the pick among one-warpgroup launches only (where a two-warpgroup build failed)."""
    if not LQQ_WGMMA_MIN_M <= m <= LQQ_WGMMA_MAX_M:
        return None
    if m > LQQ_WGMMA_WIDE_MAX_M and n > LQQ_WGMMA_NARROW:
        return lqq_big_m_launch(m, n, k, sms, max_warpgroups) if k <= LQQ_WGMMA_NARROW else None
    row_tiles, k_tiles = -(-n // 64), -(-k // 256)
    exception = _lqq_row_tile_exception(m, n, k, max_warpgroups)
    if exception is not None:
        return exception[0]
    if _lqq_big_m_below_768(m, n, k, sms):
        return lqq_big_m_launch(m, n, k, sms, max_warpgroups)
    if m <= LQQ_WGMMA_WIDE_MAX_M:
        return lqq_cost_model_launch(m, n, k, sms, max_warpgroups)
    # Above 768 tokens (layers of <= 8192 rows): 128 tokens to start from — halved on small layers, else the large-M
    # wave model's pick where the launch stays unsplit
    bm = 128
    while bm > LQQ_WGMMA_BM[-1] and row_tiles * -(-m // bm) < sms // 2:
        bm //= 2
    programs = row_tiles * -(-m // bm)
    # Halving the token tile gives the narrow layers' launches their programs (512×4096 M = 1000: 64-token tiles, 128
    # programs), so the split up to one program per SM only where even that leaves fewer than half the SMs one: split
    # in two, the 1024-row layer's 112-128 programs at M = 769-1024 ran 19.8-20.2 µs against 14.1-14.5 unsplit. The
    # long-row split (rows of >= 2 × WAVE_SPLIT_MIN_TILES tiles, K >= 7168 here) stays; not measured above 768.
    split = max(_split_for(programs, k_tiles, sms) if programs < sms // 2 else 1,
                _split_for(programs, k_tiles, LQQ_WGMMA_LONG_ROW_PROGRAMS, WAVE_SPLIT_MIN_TILES))
    if bm == 128 and split == 1:
        return lqq_big_m_launch(m, n, k, sms, max_warpgroups)
    return (bm, 3, split, 0), 1


def _lqq_row_tile_exception(m: int, n: int, k: int, max_warpgroups: int = 2) -> tuple | None:
    """A 1-tuple (launch,) of the measured exception (LQQ_ROW_TILE_EXCEPTIONS) at this point — its launch None for the
    Triton kernel — or None where none applies (a two-warpgroup exception without two warpgroups falls to the
    models)."""
    if LQQ_ROW_TILE_EXCEPTIONS_K[0] <= k <= LQQ_ROW_TILE_EXCEPTIONS_K[1]:
        for first, last, cfg, wg in LQQ_ROW_TILE_EXCEPTIONS.get(-(-n // 64), ()):
            if first <= m <= last:
                return ((None if cfg is None else (cfg, wg)),) if wg <= max_warpgroups else None
    return None


def _lqq_big_m_below_768(m: int, n: int, k: int, sms: int = SMS_H100) -> bool:
    """Whether the large-M wave model picks at M = LQQ_BIG_M_MIN_M … 768: where 128-token programs fill half the SMs
    (on rows longer than LQQ_WGMMA_NARROW: LQQ_WGMMA_LONG_ROW_PROGRAMS; not on layers with more and longer rows)."""
    return (LQQ_BIG_M_MIN_M <= m <= LQQ_WGMMA_WIDE_MAX_M and not (n > LQQ_WGMMA_NARROW and k > LQQ_WGMMA_NARROW)
            and -(-n // 64) * -(-m // 128) >= (LQQ_WGMMA_LONG_ROW_PROGRAMS if k > LQQ_WGMMA_NARROW else sms // 2))


def lqq_uses_cost_model(m: int, n: int, k: int, sms: int = SMS_H100) -> bool:
    """Whether :func:`lqq_wgmma_launch` takes the cost model's pick (:func:`lqq_cost_model_launch`) at this point."""
    return (LQQ_WGMMA_MIN_M <= m <= LQQ_WGMMA_WIDE_MAX_M and _lqq_row_tile_exception(m, n, k) is None
            and not _lqq_big_m_below_768(m, n, k, sms))


def lqq_cost_model_options(m: int, n: int, k: int, sms: int = SMS_H100,
                           max_warpgroups: int = 2) -> list[tuple[int, int, int]]:
    """(tokens per program, K split, warpgroups) of every launch the LiquidQuant cost model scores for M tokens on an
    [N, K] weight (comments above): every token tile at each LQQ_WGMMA_SPLITS split where the unsplit launch has fewer
    programs than SMs and every split of :func:`quantkit.runtime.kernels.triton.launch.split_plan` but the last keeps MIN_SPLIT_TILES tiles; up to 64
    tokens only launches of MIN_PROGRAMS programs or more; two warpgroups on unsplit tiles where no one-warpgroup tile
    fits one wave."""
    row_tiles, k_tiles = -(-n // 64), -(-k // 256)
    options = []
    for tile in LQQ_WGMMA_TILES:
        unsplit = row_tiles * -(-m // tile)
        for split in LQQ_WGMMA_SPLITS:
            if split > 1 and (unsplit >= sms or split_plan(k_tiles, split)[0] < MIN_SPLIT_TILES):
                continue
            if m <= 64 and unsplit * split_plan(k_tiles, split)[1] < MIN_PROGRAMS:
                continue
            options.append((tile, split, 1))
    if m > 64 and max_warpgroups > 1 and not any(_lqq_waves(m, n, tile, 1, sms) <= 1 for tile in LQQ_WGMMA_TILES):
        options += [(tile, 1, 2) for tile in LQQ_WGMMA_TILES if _lqq_per_sm(m, n, tile, 2, sms) == 1]
    return options


def lqq_cost_model_launch(m: int, n: int, k: int, sms: int = SMS_H100, max_warpgroups: int = 2,
                          cost: dict | None = None) -> tuple[tuple[int, int, int, int], int] | None:
    """((tokens, stages, K split, tail), warpgroups) of the option of :func:`lqq_cost_model_options` that
    :func:`lqq_wgmma_cost` (with ``cost``, default LQQ_WGMMA_COST) scores fastest; None where there is none (up to
    64 tokens on layers too narrow for MIN_PROGRAMS programs: the Triton kernel)."""
    options = lqq_cost_model_options(m, n, k, sms, max_warpgroups)
    if not options:
        return None
    tile, split, wg = min(options, key=lambda o: lqq_wgmma_cost(m, n, k, o[0], o[1], sms, o[2], cost))
    bm, tail = LQQ_WGMMA_TILES[tile]
    return (bm, _lqq_stages(m, -(-n // (64 * wg)) * -(-m // tile), sms), split, tail), wg


# The warp-specialized LiquidQuant kernel (:mod:`quantkit.runtime.kernels.gluon_sm90.lqq_ws`: a TMA producer warp,
# consumer warpgroups) runs the rule's unsplit launches of 128-token tiles (with or without a 32/64-token tail) in
# place of :mod:`quantkit.runtime.kernels.gluon_sm90.lqq_wgmma`: on an H100 (same launch, ABBA, every output
# bit-identical) 1.10x geometric mean over 55 points, 128 tokens on one warpgroup 1.09x (1.01-1.14x), 160 tokens
# 1.29x, 192 tokens on one warpgroup 1.24x, on two 1.035x (1.01-1.08x) — which is why two warpgroups run it too. A
# launch of the rule at two stages and 128 tokens (three programs an SM) runs three stages here (two an SM): the
# consumers' registers at three an SM did not assemble (ptxas). The 64- and 32-token launches, and split-K ones,
# stay on lqq_wgmma. The cost models above are fitted to the kernels as they are (this one on the unsplit 128-token
# tiles).
LQQ_WS_TWO_WARPGROUPS = True


def lqq_ws_launch(cfg: tuple[int, int, int, int], warpgroups: int) -> tuple[int, int, int, int, int, int] | None:
    """(tokens per program, stages, tail, warpgroups, programs per SM, K split) of :func:`quantkit.runtime.kernels.gluon_sm90.lqq_ws.lqq_ws_matmul` for
    the Gluon LiquidQuant launch ``cfg`` = (tokens, stages, K split, tail) on ``warpgroups`` warpgroups, or None where
    that launch stays on :mod:`quantkit.runtime.kernels.gluon_sm90.lqq_wgmma` (comment above: K-split launches too —
    lqq_ws takes a K split, but on the k/v layer, where splits matter most, it ran no faster than lqq_wgmma's split
    launches)."""
    bm, stages, split, tail = cfg
    if bm != 128 or split != 1 or (warpgroups == 2 and not LQQ_WS_TWO_WARPGROUPS):
        return None
    # the sixth field, the K split, is always 1 here: lqq_ws_matmul's own split_k, which the rules leave at 1
    if warpgroups == 2:
        return bm, stages, tail, 2, 1, 1
    if tail == 0:
        return bm, 3, 0, 1, LQQ_WGMMA_PER_SM[(128, 3)], 1
    return bm, stages, tail, 1, LQQ_WGMMA_PER_SM[(bm + tail, stages)], 1

# K-pair launches of the warp-specialized LiquidQuant kernel (lqq_ws.lqq_ws_matmul(k_pair=True)): two consumer
# warpgroups on one program's 64 rows × 128 tokens, each taking every other 256-column tile, their int32 sums added
# in shared memory — one program an SM whose dequantization overlaps its own products. A one-warpgroup program that
# alone holds its SM cannot overlap them (a warpgroup must wait for its own products before it writes registers
# again), so launches of at most one program an SM run ~1.15x slower than this (bit-identical; on an H100 1024x4096
# at M = 513-1024 (80-128 programs) 1.07-1.16x, 1024x5120 at 513 / 769 1.18-1.19x, 4096x4096 at M = 129-256 (128
# programs) 1.10-1.16x). With 64 programs or fewer it loses (2048x4096 M = 256: 12.2 µs against 11.8; 512x3584 and
# the k/v layer below 512 tokens, where the cluster kernel runs: 0.53-0.99x), and wherever the one-warpgroup launches
# have two programs an SM (2048x4096 and 4096x4096 at 513-1024, 6144x4096 at 129-769: 0.66-0.85x). Hence: more than
# half the SMs and at most one program each, from 128 tokens (a token tile past M makes TMA boxes reach past the
# activations, which is slow), on layers of K tiles enough to pair. Through int8_matmul on ten shapes: 1.04-1.21x the
# launch without it at 50 of 51 points, 0.97x at 4096x14336 M = 129.
LQQ_K_PAIR = True
LQQ_K_PAIR_STAGES = 4  # two ring slots a warpgroup (one each: 1.24-1.27x slower on the k/v layer)


def lqq_k_pair(m: int, n: int, k: int, sms: int = SMS_H100) -> bool:
    """Whether int8_matmul runs this LiquidQuant product as a K-pair launch of :mod:`quantkit.runtime.kernels.gluon_sm90.lqq_ws` (comment above) in
    place of the Gluon launch :func:`lqq_wgmma_launch` picks: 128-token programs (one per 64 rows and 128 tokens)
    filling more than half the SMs and at most all of them, M >= 128, K of two 256-column tiles or more."""
    programs = -(-n // 64) * -(-m // 128)
    return LQQ_K_PAIR and m >= 128 and k >= 512 and sms // 2 < programs <= sms


# LiquidQuant on layers of few rows: the CUDA cluster kernel (:mod:`quantkit.runtime.kernels.cuda.lqq_cluster`),
# whose K split adds its partial tiles inside a thread-block cluster instead of through global slots and a ticket.
# Timed on an H100, every launch bit-identical to the unsplit Triton kernel; per class of layer (largest N) and range
# of M, the launch with the best geometric mean over the points of the range (within 2.5 % of each point's best
# launch), where it beat the rule without it (through int8_matmul 1.03-1.62× that rule where it runs).
# * The first ranges start at 9 tokens, ahead of the A8 GEMV (int8_gemm.int8_matmul tries this kernel first): at
#   M = 9-16 the 17-64 launches ran 5.1-5.7 µs on the 512- and 1024-row layers against the GEMV's 6.4-7.7, and
#   7.2-7.3 on 2048×4096 against 7.4-7.6; at M <= 8 the GEMV's 2.7-4.5 µs stays, and at M = 9-16 on the 4096- and
#   6144-row classes (the kernel 0.95-1.06× it). At M = 32 on 6144×4096 and 4608×3584 the Gluon rule's full tile
#   wins (this kernel 0.95-0.99×). On the wider layers (14336 rows and more, or K = 14336) the other kernels were
#   faster at every M measured (up to 192), and from 576 tokens on 1024-row layers, 288 on 2048-row ones.
# * Two-warpgroup launches (128 rows a CTA) on the 512-row class end at 896 tokens: at M = 960 on 512×3584 (0.62×)
#   8 token tiles × 4 row blocks × 4 make 32 clusters of 4 single-CTA SMs, more than run at once. They start at 513
#   tokens: a 64-token launch split 8 ran 0.73-0.80× fp16 on 512×4096 at M = 513-640, where they ran 9.7-9.9 µs.
# * Other K: on the 512- and 1024-row layers of K = 5120 (the k/v projections of Qwen2.5-14B-like models) at
#   M <= 384 1.11-1.45× the rule without it; above that 1024×5120 M = 448 ran 0.82×, and on 5120×5120 (the 6144-row
#   class) 1.00-1.02×, so K = 5120 takes the classes up to 2048 rows to M = 384, and its 512-row layers to M = 896
#   (1.03-1.18× fp16 where the Gluon rule ran 0.90-0.98×). K = 8192 (1024×8192) was 0.89-1.23×, slower at 5 of its
#   13 covered points: not taken.
# * Still slower than fp16: 512×3584 at most M of 513-1024 (0.90-0.98×) and the 512-row class at 897-1024 on every
#   K (0.87-1.0×), where no launch of this kernel or the Gluon rule beat cuBLAS's 9.7-14.3 µs.
# K → None (all of the table) or the (largest N, last M) pairs it applies to; the K measured, these only
LQQ_CLUSTER_K = {3584: None, 4096: None, 5120: ((2048, 384), (512, 896))}
# largest N → ((first M, last M, (tokens per CTA, K split, stages, depth, rows)), ...); the first class that holds N
LQQ_CLUSTER_TABLE = {
    512: ((9, 64, (64, 8, 3, 1, 64)), (65, 192, (64, 8, 4, 1, 64)), (193, 448, (64, 4, 3, 2, 64)),
          (449, 512, (64, 2, 4, 1, 64)), (513, 896, (128, 4, 3, 2, 128)), (897, 1024, (64, 2, 3, 2, 64))),
    1024: ((9, 64, (64, 4, 4, 1, 64)), (65, 192, (64, 4, 3, 2, 64)), (193, 256, (64, 2, 4, 1, 64)),
           (257, 320, (64, 4, 2, 1, 64)), (321, 384, (128, 4, 3, 2, 128)), (385, 512, (64, 2, 3, 2, 64))),
    2048: ((9, 16, (64, 8, 2, 1, 64)), (17, 64, (64, 4, 4, 2, 128)), (65, 128, (64, 2, 4, 2, 64)),
           (129, 256, (64, 2, 3, 2, 64))),
    4096: ((17, 64, (64, 2, 4, 2, 64)), (65, 128, (64, 2, 3, 2, 64))),
    6144: ((17, 31, (64, 2, 3, 2, 64)), (33, 64, (64, 2, 3, 2, 64))),  # at 32 the Gluon rule's full tile won
}


@functools.lru_cache(maxsize=4096)  # on every LiquidQuant call, decode steps included
def lqq_cluster_launch(m: int, n: int, k: int) -> tuple[int, int, int, int, int] | None:
    """(tokens, K split, stages, depth, rows) of :func:`quantkit.runtime.kernels.cuda.lqq_cluster.lqq_cluster_matmul` for M tokens on an [N, K]
    LiquidQuant weight, or None where the other kernels run (comment above)."""
    if k not in LQQ_CLUSTER_K:
        return None
    if LQQ_CLUSTER_K[k] is not None and not any(n <= max_n and m <= last_m for max_n, last_m in LQQ_CLUSTER_K[k]):
        return None
    for max_n, ranges in LQQ_CLUSTER_TABLE.items():
        if n <= max_n:
            return next((launch for first, last, launch in ranges if first <= m <= last), None)
    return None


# MixLLM W8A8 at M = 17-32, above 64 and at 33-64 on layers of up to W8A8_WGMMA_MID_MAX_N rows: the Gluon TMA kernel
# (:mod:`quantkit.runtime.kernels.gluon_sm90.w8a8_wgmma`), 64 tokens × 128 weight rows per program (64 rows when that
# leaves fewer than W8A8_WGMMA_MIN_PROGRAMS programs), 4 stages, one warpgroup. Against the Triton W8A8 kernel on an
# H100 (five Llama-3-8B shapes × M = 17-4096): 1.2-1.6× faster at M >= 256, 2.7-3.8× at M = 128 (where the Triton
# rule's 256-token tile is half empty), 0.63-0.94× cuBLAS fp16 at M >= 256; at M = 17-32 1.08-2.4× faster on four
# shapes and 0.97-1.13× on 4096×14336. 128×128 tiles (two warpgroups) were 1.2× slower, and pairing K blocks so one
# block's epilogue overlaps the next one's products was slower at M >= 1024.
# Every launch loads the next K block's group scales during the current one (W8A8_SCALES_AHEAD): otherwise the
# kernel's warps stall mostly on long scoreboards, the scale loads issued after the products and read right after
# them (ncu: 1.5 of ~4 cycles per issued instruction; 0.4 with them a block ahead); 64×128 tiles 1.105× faster
# (geometric mean; 0.97-1.21×). Two int32 accumulators in turn (block kb's products while block kb - 1 is scaled)
# were no faster (64×128 spilled).
# K split (whole 256-column tiles a split, fp32 slots added in split order, the same bits as the Triton kernel split
# the same way): launches of P programs split by the largest of 4 and 2 that keeps P · split <= W8A8_SPLIT_PROGRAMS
# and K's 256-column tiles / split, rounded down, at MIN_SPLIT_TILES or more (launch.split_plan then gives the last
# split what is left, e.g. 4, 4, 4, 2 of 14 tiles at a split of 4 — which this bound refuses): 4096×4096
# M = 17-32 14.3-14.9 µs against 21.5 unsplit (fp16 14.1-14.3), 4096×14336 M = 17-32 2.1-2.2×; 0.99-2.45× the
# unsplit rule on shapes outside the sweep (geometric mean 1.32×). Splits lose where the launch already has ~224
# programs or more (14336×4096, 28672×4096, 4096×4096 at M = 256), which the bound keeps unsplit.
# At M = 33-64 the split kernel beat the Triton kernel on 4096×4096 (1.10-1.13×) and 4096×14336 (1.6×) but not on
# 6144×4096 (0.91-0.97×) or 14336×4096 (0.95×): layers of up to W8A8_WGMMA_MID_MAX_N rows take it there.
W8A8_SCALES_AHEAD = True
W8A8_WGMMA_SMALL_M = (17, 32)
W8A8_WGMMA_MID_M = (33, 64)
W8A8_WGMMA_MID_MAX_N = 4096
W8A8_WGMMA_MIN_M = 65
W8A8_WGMMA_MIN_PROGRAMS = 200
W8A8_SPLIT_PROGRAMS = 400


@functools.lru_cache(maxsize=4096)  # on every W8A8 / MixLLM-operand call, as the other launch rules
def w8a8_wgmma_config(m: int, n: int, k: int) -> tuple[int, int, int, int, bool, int] | None:
    """(tokens per program, weight rows per program, stages, warps, scales a block ahead, K split) of the Gluon W8A8
    kernel for M tokens on an [N, K] weight, or None where the Triton kernel runs (comment above)."""
    small = W8A8_WGMMA_SMALL_M[0] <= m <= W8A8_WGMMA_SMALL_M[1]
    mid = W8A8_WGMMA_MID_M[0] <= m <= W8A8_WGMMA_MID_M[1] and n <= W8A8_WGMMA_MID_MAX_N
    if m < W8A8_WGMMA_MIN_M and not (small or mid):
        return None
    token_tiles = -(-m // 64)
    bn = 128 if token_tiles * -(-n // 128) >= W8A8_WGMMA_MIN_PROGRAMS else 64
    programs = token_tiles * -(-n // bn)
    n_tiles = -(-k // 256)
    split = next((s for s in (4, 2) if programs * s <= W8A8_SPLIT_PROGRAMS and n_tiles // s >= MIN_SPLIT_TILES), 1)
    return 64, bn, 4, 4, W8A8_SCALES_AHEAD, split


# MixLLM W4A8 and mixed W4.4A8 prefill: from this many tokens the layer's int8 operand q − z is written once per
# call (:mod:`quantkit.runtime.kernels.triton.int8_operand`, one launch per partition, a mixed layer's rows in output
# order) and the W8A8 TMA kernel multiplies it — bit-identical to the g128 Triton kernels. On an H100 (five
# Llama-3-8B shapes) W4A8 ran 1.11-1.26× the Triton kernel at M = 512 and 1.18-1.39× at 768, mixed 0.97-1.33× and
# 1.02-1.41×; at 256 0.72-1.13×, so that stays Triton. Both switch at the same M so a mixed layer stays within
# 1.00-1.05× of W4A8's time (switching only W4A8 would leave mixed layers at 1.17-1.37× it). Gathering the mixed
# operand with indexed copies instead cost 38-70 µs more.
MIXLLM_OPERAND_MIN_M = 512
MIXLLM_MIXED_OPERAND_MIN_M = 512


# One-launch mixed W4.4A8 at M <= 16 with 128-row (or larger) tiles: the 8-bit partition's programs get half
# the rows, so their doubled bytes per row do not leave them running after the 4-bit ones (14336×4096 M=2:
# 22.7 → 19.4 µs, 28672×4096 M=16: 42.0 → 32.2 µs; on 64-row split-K tiles it was 2–14 % faster on 6144×4096 but
# 5–15 % slower on the 4096-row layers, and at M >= 256 0–25 % slower everywhere, so only 128-row tiles at M <= 16
# halve)
MIXED_HALF_BN_8BIT = True


def mixed_second_bn(cfg: TileConfig, second_is_wider: bool, m: int) -> int:
    """Rows per program of a one-launch mixed layer's second partition: BN / 2 when that partition stores twice
    the bytes per row (8-bit next to 4-bit), M <= 16 and BN >= 128 (see MIXED_HALF_BN_8BIT), else BN."""
    halve = MIXED_HALF_BN_8BIT and second_is_wider and m <= 16 and cfg.bn >= 128
    return cfg.bn // 2 if halve else cfg.bn


# W4A16 at prefill sizes: dequantizing Ŵ once (N·K·2.5 bytes moved, ~55 µs for 14336×4096) and calling cuBLAS
# beats the fused kernel above M = 512 on the five Llama-3.1-8B shapes (M = 1024 0.74-0.80× fp16 vs 0.63-0.68×
# fused, M = 4096 0.93-0.95× vs 0.65-0.74×; at M = 513-1000 faster at 34 of 35 points; at M = 512 it won on 2 of 5
# shapes, by <= 8 %).
W4A16_DEQUANT_MIN_M = 513
# ... and from M = 257 on 6144×4096 (Llama-3's fused q/k/v), where it beats the Gluon kernel (w4a16_wgmma_config) at
# M = 257-512: 54.2-62.1 vs 61.0-68.4 µs (two warpgroups leave 144-192 programs there, 1.1-1.5 waves on 132 SMs). On
# the other four shapes the Gluon kernel was 1.05-1.54× faster at those counts. On Hopper the warp-specialized kernel
# takes 6144×4096 at M = 257-512 first (w4a16_ws_warpgroups: two warpgroups, 50.1-55.2 µs), so this holds where it
# cannot run.
W4A16_DEQUANT_SHAPES_FROM_257 = ((6144, 4096),)


def w4a16_dequant_preferred(m: int, n: int, k: int) -> bool:
    """Whether W4A16 with M tokens runs as dequantize-then-cuBLAS rather than a fused kernel."""
    return m >= W4A16_DEQUANT_MIN_M or (m >= 257 and (n, k) in W4A16_DEQUANT_SHAPES_FROM_257)


# W4A16 at M = 17-32 and 65-128 on Hopper: the Gluon kernel (:mod:`quantkit.runtime.kernels.gluon_sm90.w4a16_wgmma`)
# on 32-token tiles at M <= 32 (two warpgroups of 128 rows on layers of >= 96 such row tiles, else one warpgroup and
# K split in two) and 128-token tiles, two warpgroups where that leaves >= 96 programs. On an H100 (five
# Llama-3.1-8B shapes): 1.06-1.28× the Triton path at M = 17-24, 1.32-1.42× on the 14336/28672-row layers at
# M = 65-112 (one 128-token tile where the Triton kernel runs two 64-token ones). At M = 33-64 the Triton kernel is
# as fast (within 4 %) and keeps them, as it keeps launches of fewer programs (its split-K). The kernel waits for a
# tile's products before forming the next tile's planes (:mod:`quantkit.runtime.kernels.gluon_sm90.w4a16_wgmma`:
# overlapping them would write registers its running products read), so at M = 256-512 the Triton kernel is
# 1.09-1.27x faster, while at M = 96 on 14336×4096 the Gluon kernel leads (41.8 µs vs 47.9): it keeps M <= 128.
# Above M = 512 dequantize-then-cuBLAS is faster (above). Its 128-token launches run the warp-specialized kernel
# (W4A16_WS_* below), which also takes parts of M = 129-512.
W4A16_WGMMA_MAX_M = 128
W4A16_WGMMA_MIN_PROGRAMS = 128  # 64-row programs of 128-token tiles below which the Triton kernel (split-K) runs
W4A16_WGMMA_WG2_PROGRAMS = 96  # 128-row programs at or above which two warpgroups share each activation tile


@functools.lru_cache(maxsize=4096)
def w4a16_wgmma_config(m: int, n: int, k: int) -> tuple[int, int, int, int] | None:
    """(bm, stages, split_k, warpgroups) of the Gluon W4A16 kernel for M tokens on an [N, K] weight, or
    None where another path is faster (comment above; the caller also checks that the kernel can run)."""
    if m <= 16 or 33 <= m <= 64 or m > W4A16_WGMMA_MAX_M or w4a16_dequant_preferred(m, n, k):
        return None
    if m <= 32:
        return (32, 3, 1, 2) if -(-n // 128) >= W4A16_WGMMA_WG2_PROGRAMS else (32, 3, 2, 1)
    tiles = -(-m // 128)
    if -(-n // 64) * tiles < W4A16_WGMMA_MIN_PROGRAMS:
        return None
    return (128, 3, 1, 2 if -(-n // 128) * tiles >= W4A16_WGMMA_WG2_PROGRAMS else 1)



# The warp-specialized W4A16 kernel (:mod:`quantkit.runtime.kernels.gluon_sm90.w4a16_ws`: a TMA producer warp,
# consumer warpgroups; unsplit 128-token tiles), every output bit-identical to w4a16_wgmma's same launch: faster than
# w4a16_wgmma on the same launch at all 24 points timed (1.02-1.32×), so the M = 65-128 launches of
# w4a16_wgmma_config run it (14336×4096 / 28672×4096: 33.4-34.6 µs and 69.6-72.1 against 40.8-42.1 and 81.2-83.8).
# At M = 129-512 a two-warpgroup launch runs its warpgroups as partitions of their own, which take turns instead of
# meeting at a barrier every tile (1.16-1.37x the barrier form), and a 128-row program takes 1.34-1.53x a 64-row
# one, so two warpgroups are faster wherever one warpgroup's 64-row programs need more than one wave: 1.03-1.47x one
# warpgroup (6144x4096 M = 257-512 1.03-1.07x, 4608x3584 M = 129-224 1.30-1.33x, the 14336- and 28672-row layers
# 1.17-1.40x, 4096x14336 at M = 320-512 1.41-1.47x), and 1.17-1.27x the Triton kernel (14336x4096 and 28672x4096 at
# M = 129-192 and 257-288). Where one wave of 64-row programs holds the layer (4096x4096, 4096x14336 at
# M = 160-256: 128 programs) one warpgroup stays, 1.28-1.36x two. Layers with fewer than W4A16_WS_MIN_PROGRAMS such
# programs keep the other paths (the k/v layer, 16-64 programs). M = 65-128 on layers short of
# W4A16_WGMMA_MIN_PROGRAMS stay on the Triton kernel (6144×4096 M = 80: 24.1 µs against 22.4, where its one
# 128-token tile reads 48 rows past M).
W4A16_WS_MAX_M = 512
W4A16_WS_MIN_PROGRAMS = 96


@functools.lru_cache(maxsize=4096)
def w4a16_ws_warpgroups(m: int, n: int, k: int, sms: int = SMS_H100) -> int | None:
    """Warpgroups (1 or 2) of the warp-specialized W4A16 kernel for M tokens on an [N, K] weight, or None where
    another path runs (comment above; the caller also checks that the kernel can run)."""
    if m <= 128:
        cfg = w4a16_wgmma_config(m, n, k)
        return cfg[3] if cfg is not None and cfg[0] == 128 else None
    if m > W4A16_WS_MAX_M:
        return None
    programs_one = -(-n // 64) * -(-m // 128)
    if programs_one < W4A16_WS_MIN_PROGRAMS:
        return None
    return 1 if programs_one <= sms else 2

# The activation quantizer (:mod:`quantkit.runtime.kernels.triton.act_quant`): rows per program and warps, timed on
# an H100 (every variant bit-identical, M = 1-4096, K = 4096 and 14336): a program's rows past M are masked but still
# pay the round-to-nearest divisions, so padding is what decode sizes lose. Per token, 1 row × 8 warps was the
# fastest variant at every M and both K (M = 1, K = 4096: 2.5 µs, against 7.6 for 2 rows × 4 warps). Per 128-column
# group: 1 row × 2 warps within 12 % of the best at M <= 4 (1.8-2.4 µs), 4 rows × 4 warps at M = 8-64 (within 13 %;
# the best at M = 64), 16 rows × 4 warps above (the best at M = 4096 and at M = 1024, K = 14336; at M = 1024,
# K = 4096 13 % behind 4 rows × 2 warps; at M = 256 8 % behind 4 rows × 4 warps at K = 4096 and 2 % behind 4 rows ×
# 2 warps at K = 14336).
# Per-token rows wider than the measured 16384 columns get more warps, so no thread holds more than 64 values (not
# measured).
ACT_QUANT_TOKEN_ELEMS = 4096  # columns per program of per-token rows narrower than this: whole rows up to it


def act_quant_launch(m: int, k_padded: int, group_size: int) -> tuple[int, int]:
    """(rows per program, warps) of the activation quantizer for M rows of ``k_padded`` (the power of two >= K)
    columns; ``group_size`` -1 for per-token scales (comment above)."""
    if group_size == -1:
        rows = 1 if k_padded >= ACT_QUANT_TOKEN_ELEMS else min(1 << (m - 1).bit_length(),
                                                                ACT_QUANT_TOKEN_ELEMS // k_padded)
        return rows, min(32, max(8, k_padded // 2048))
    if m <= 4:
        return 1, 2
    return (4, 4) if m <= 64 else (16, 4)
