"""Tile configurations of the Triton GEMM kernels and the rule that picks one per problem size.

Both kernels compute the transposed product Y^T = W·X^T (LiquidGEMM Sec. 5.4): a program owns BN weight rows
(the tensor-core M dimension, 64 per warpgroup for wgmma) and BM tokens (the N dimension, as small as 16), so a
decode step with one token wastes no weight-side work. Small M is memory-bound: the weight stream must be spread
over enough programs to keep every SM loading (split-K adds programs along K and sums partial results with fp32
atomics, at the price of a zeroed workspace and a final cast). Large M is compute-bound: big tiles, 8 warps.

The table below is the fastest config per kernel kind and token-count class measured by
``python -m quantkit.bench.sweep`` on an H100 at N = 14336, K = 4096 (docs/BENCHMARKS.md). For narrow layers
at small M (fewer row tiles than half the SMs, e.g. N = 4096) the rule switches to 64-row tiles and splits K
until about one program per SM streams weights — the config the same sweep found fastest at N = 4096.
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


KINDS = ("w4a16", "lqq", "asym", "w8", "mixed")
# kind → [(largest M of the class, config)], measured at N = 14336, K = 4096 (docs/BENCHMARKS.md)
TABLE: dict[str, list[tuple[int, TileConfig]]] = {
    "w4a16": [(1, TileConfig(128, 16, 2, 4, 4)), (16, TileConfig(64, 16, 1, 4, 4)),
              (64, TileConfig(64, 64, 1, 4, 3)), (1 << 30, TileConfig(128, 128, 1, 8, 3))],
    "lqq": [(16, TileConfig(128, 16, 1, 4, 4)), (64, TileConfig(128, 32, 1, 4, 4)),
            (1 << 30, TileConfig(128, 128, 1, 8, 3))],
    "asym": [(16, TileConfig(128, 16, 1, 4, 4)), (64, TileConfig(128, 32, 1, 4, 4)),
             (1 << 30, TileConfig(128, 128, 1, 8, 3))],
    "w8": [(1, TileConfig(128, 16, 1, 4, 4)), (16, TileConfig(64, 16, 1, 4, 4)), (64, TileConfig(64, 64, 1, 4, 3)),
           (1 << 30, TileConfig(64, 256, 1, 8, 2))],
    "mixed": [(1, TileConfig(64, 16, 1, 4, 4)), (16, TileConfig(128, 16, 1, 4, 4)), (64, TileConfig(64, 64, 1, 4, 3)),
              (1 << 30, TileConfig(64, 128, 1, 4, 3))],
}


def _split_for(programs: int, tiles: int, sms: int) -> int:
    """Split-K factor giving about one program per SM without splits shorter than 4 tiles of 256 columns."""
    split = 1
    while programs * split < sms and tiles // (split * 2) >= 4:
        split *= 2
    return split


def gemm_config(m: int, n: int, k: int, kind: str = "w4a16", sms: int = SMS_H100) -> TileConfig:
    """The tile config of kernel ``kind`` (w4a16, lqq, asym, w8, mixed) for an [M, K] × [K, N] product: the
    measured table entry of M's class; for small M on a layer with fewer row tiles than half the SMs, 64-row
    tiles with K split until about one program per SM (module docstring)."""
    if kind not in TABLE:
        raise ValueError(f"unknown kernel kind '{kind}'; known: {', '.join(KINDS)}")
    cfg = next(c for top, c in TABLE[kind] if m <= top)
    if m <= 16 and -(-n // cfg.bn) * -(-m // cfg.bm) < sms // 2:
        programs = -(-n // 64) * -(-m // cfg.bm)
        cfg = TileConfig(64, cfg.bm, max(cfg.split_k, _split_for(programs, -(-k // 256), sms)), 4, 4)
    return cfg
