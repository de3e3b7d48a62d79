"""Tile configurations of the Triton GEMM kernels and the rule that picks one per problem size.

Both kernels compute the transposed product Y^T = W·X^T (LiquidGEMM Sec. 5.4): a program owns BN weight rows
(the tensor-core M dimension, 64 per warpgroup for wgmma) and BM tokens (the N dimension, as small as 16), so a
decode step with one token wastes no weight-side work. Small M is memory-bound: the weight stream must be split
over enough programs to keep every SM loading (split-K adds programs along K and sums partial results with fp32
atomics). Large M is compute-bound: big tiles, 8 warps.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

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


def _bm_for(m: int) -> int:
    """Token tile: the smallest power of two >= M, between 16 (tl.dot minimum) and 128."""
    bm = 16
    while bm < m and bm < 128:
        bm *= 2
    return bm


def _split_for(programs: int, tiles: int, sms: int) -> int:
    """Split-K factor giving at least ~2 programs per SM without splits shorter than 4 tiles of 256 columns."""
    split = 1
    while programs * split < 2 * sms and tiles // (split * 2) >= 4:
        split *= 2
    return split


def gemm_config(m: int, n: int, k: int, sms: int = SMS_H100) -> TileConfig:
    """Default tile config of the W4A16 and int8 kernels for an [M, K] × [K, N] product (module docstring)."""
    tiles = -(-k // 256)
    if m <= 64:
        bn = 64
        bm = _bm_for(m)
        programs = -(-n // bn) * -(-m // bm)
        return TileConfig(bn, bm, _split_for(programs, tiles, sms), num_warps=4, num_stages=4)
    if m <= 128:
        return TileConfig(128, _bm_for(m), 1, num_warps=8, num_stages=3)
    return TileConfig(128, 128, 1, num_warps=8, num_stages=3)
