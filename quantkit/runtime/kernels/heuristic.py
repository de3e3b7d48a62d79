"""Default launches where no tuned table applies (:mod:`.tables`): a few rules from the layer's tile counts and the
device's real SM count.

Speed on a particular GPU comes from ``quantkit tune``, which times every kernel and launch of
:meth:`~.registry.GemmKernel.candidates` and writes the fastest as data. These rules only have to be sound on any
GPU and any layer, with nothing fitted to one device:

* **Fill the SMs.** A product of few tokens is a stream of weight bytes; it runs at the memory's rate only when
  every SM has a program loading. Where one wave of programs leaves SMs idle, K is split (doubling, each split
  keeping :data:`MIN_SPLIT_TILES` tiles of 256 columns; the fp32 partial sums meet in per-split slots,
  :mod:`.triton.splitk`).
* **No token tile larger than M needs**, and the larger tile once M fills it: a program dequantizes its weight
  slice once whatever its token tile (LiquidGEMM Sec. 5.4, Y^T = W·X^T), so fewer, wider token tiles mean less
  dequantization.
* **The specialised kernels in the token ranges they exist for**: the CUDA GEMVs at decode sizes (their own
  rules, :func:`.cuda.gemv.cuda_gemv_preferred`, :func:`.cuda.gemv_a8.a8_gemv_preferred`), the CUDA cluster kernel
  on layers too narrow to fill the SMs, the Hopper wgmma kernels above decode sizes, dequantize-then-cuBLAS where
  W4A16 is compute-bound.
"""

from __future__ import annotations

from quantkit.runtime.kernels.triton.launch import TileConfig, split_plan

MIN_SPLIT_TILES = 4  # 256-column K tiles per split at least: shorter splits add more slot traffic than they hide
SMS_WITHOUT_GPU = 132  # the SM count the rules size waves by where there is no GPU (the interpreter; an H100's)
WGMMA_MIN_M = 32  # tokens from which the Hopper wgmma kernels take a product: one 32-token wgmma tile is full
DEQUANT_MIN_M = 513  # W4A16 from here: dequantize Ŵ once and call cuBLAS (compute-bound; the dequant is ~NK bytes)
MIXLLM_OPERAND_MIN_M = 512  # MixLLM g128 formats from here: write the int8 operand once, then the W8A8 TMA kernel
W8A8_WIDE_TILE_WAVES = 1.5  # per-channel W8A8 launches of this many waves of 128×128 tiles take those tiles
W8A8_CHANNEL_SPLIT_MIN_TILES = 32  # per-channel W8A8 splits K from this many 256-column tiles only
CLUSTER_MAX_ROW_TILES = 32  # LiquidQuant layers of at most this many 64-row tiles take the cluster kernel
CLUSTER_MAX_M = 512


def sms_of(device) -> int:
    """The SM count of a CUDA ``device`` (:data:`SMS_WITHOUT_GPU` for any other)."""
    from quantkit.runtime.kernels.registry import device_traits

    return device_traits(device)[1] or SMS_WITHOUT_GPU


def cdiv(a: int, b: int) -> int:
    """⌈a / b⌉."""
    return -(-a // b)


def k_tiles(k: int) -> int:
    """256-column tiles of a row of K columns."""
    return cdiv(k, 256)


def split_to_fill(programs: int, k: int, sms: int, min_tiles: int = MIN_SPLIT_TILES) -> int:
    """K split (a power of two) of a launch of ``programs`` unsplit programs on rows of K columns: doubled while the
    launch has fewer programs than ``sms`` and each split keeps ``min_tiles`` tiles of 256 columns."""
    split = 1
    while programs * split < sms and k_tiles(k) // (split * 2) >= min_tiles:
        split *= 2
    return split


def token_tile(m: int, tiles: tuple[int, ...]) -> int:
    """The smallest of ``tiles`` (ascending) that holds M tokens, else the largest."""
    return next((t for t in tiles if t >= m), tiles[-1])


def triton_tile(m: int, n: int, k: int, sms: int) -> TileConfig:
    """The Triton GEMM kernels' tile for M tokens on an [N, K] weight: BM from 16 to 128 tokens as M needs, 128
    weight rows per program where that still gives every SM a program (else 64), K split until it does."""
    bm = token_tile(m, (16, 32, 64, 128))
    bn = 128 if cdiv(n, 128) * cdiv(m, bm) >= sms else 64
    split = split_to_fill(cdiv(n, bn) * cdiv(m, bm), k, sms)
    return TileConfig(bn, bm, split, *triton_warps_stages(bn, bm))


def triton_warps_stages(bn: int, bm: int) -> tuple[int, int]:
    """(warps, stages) of a Triton GEMM tile: 8 warps from 128 × 128 (else 4); 3 stages for 128-token tiles, whose
    fp16 activation stages take 64 KB each (else 4)."""
    return 8 if bn * bm >= 128 * 128 else 4, 3 if bm >= 128 else 4


def mixed_second_bn(config: TileConfig, second_is_wider: bool, m: int) -> int:
    """Rows per program of a one-launch mixed layer's second partition: half of BN where that partition stores twice
    the bytes per row (8-bit next to 4-bit) at decode sizes, so its programs do not finish after the 4-bit ones."""
    return config.bn // 2 if second_is_wider and m <= 16 and config.bn >= 128 else config.bn


def lqq_cluster_launch(m: int, n: int, k: int, sms: int) -> tuple[int, int, int, int, int] | None:
    """(tokens, K split, stages, depth, rows) of the CUDA LiquidQuant cluster kernel for M tokens on an [N, K]
    weight, or None where it does not take the product: layers of at most :data:`CLUSTER_MAX_ROW_TILES` 64-row tiles
    from 9 to :data:`CLUSTER_MAX_M` tokens, 64 tokens a CTA, the cluster split (2-8) that gives every SM a CTA."""
    row_tiles = cdiv(n, 64)
    if not 9 <= m <= CLUSTER_MAX_M or row_tiles > CLUSTER_MAX_ROW_TILES or k % 256:
        return None
    programs = row_tiles * cdiv(m, 64)
    split = next((s for s in (2, 4, 8) if programs * s >= sms), 8)
    while split > 2 and k_tiles(k) < 2 * split:
        split //= 2
    return (64, split, 3, 2, 64) if k_tiles(k) >= 2 * split else None


def lqq_gluon_launch(m: int, n: int, k: int, sms: int) -> tuple[str, tuple] | None:
    """("ws" or "wgmma", the launch's arguments after the operands) of the Gluon LiquidQuant kernels for M tokens on an
    [N, K] weight, or None below :data:`WGMMA_MIN_M` tokens. 32- or 64-token tiles up to 96 tokens, else 128; an unsplit
    128-token launch runs on the warp-specialized kernel (tokens, stages, tail, warpgroups, programs an SM, K split),
    the others on the wgmma kernel (tokens, stages, K split, tail, warpgroups)."""
    if m < WGMMA_MIN_M:
        return None
    bm = token_tile(m, (32, 64)) if m <= 96 else 128
    split = split_to_fill(cdiv(n, 64) * cdiv(m, bm), k, sms)
    if bm == 128 and split == 1:
        return "ws", (128, 3, 0, 1, 2, 1)
    return "wgmma", (bm, 3, split, 0, 1)


def lqq_k_pair(m: int, n: int, k: int, sms: int) -> bool:
    """Whether a LiquidQuant product runs as a K-pair launch (two warpgroups over alternate K tiles of one program's
    rows, :mod:`.gluon_sm90.lqq_ws`): where 128-token programs give more than half the SMs one and at most one each
    — a program alone on its SM cannot otherwise overlap its dequantization with its products."""
    programs = cdiv(n, 64) * cdiv(m, 128)
    return m >= 128 and k >= 512 and sms // 2 < programs <= sms


def w4a16_gluon_launch(m: int, n: int, k: int, sms: int) -> tuple[str, tuple] | None:
    """("ws" or "wgmma", arguments) of the Gluon W4A16 kernels for M tokens on an [N, K] weight, or None where the
    Triton kernel or dequantize-then-cuBLAS runs: 32-token wgmma tiles at 17-32 tokens (bm, stages, split,
    warpgroups), 128-token warp-specialized programs at 65 to :data:`DEQUANT_MIN_M` - 1 tokens on layers whose
    64-row programs fill most of the SMs (stages, warpgroups: two where one warpgroup's programs need more than one
    wave)."""
    if 17 <= m <= 32:
        if cdiv(n, 128) >= sms * 3 // 4:
            return "wgmma", (32, 3, 1, 2)
        return "wgmma", (32, 3, 2 if k_tiles(k) >= 2 * MIN_SPLIT_TILES else 1, 1)
    if 65 <= m < DEQUANT_MIN_M:
        programs = cdiv(n, 64) * cdiv(m, 128)
        if programs < sms * 3 // 4:
            return None
        return "ws", (3, 1 if programs <= sms else 2)
    return None


def w8a8_gluon_launch(m: int, n: int, k: int, sms: int, per_channel: bool = False
                      ) -> tuple[int, int, int, int, bool, int] | None:
    """(tokens, weight rows, stages, warps, scales a block ahead, K split) of the Gluon W8A8 TMA kernel from 17 tokens:
    64-token tiles, 128 rows a program where that leaves more than a wave of programs (else 64), K split while the
    launch has fewer programs than three waves. For per-channel products (``per_channel``: per-token activations and
    one weight scale per row, whose int32 sums span K) with 128-token tiles filling :data:`W8A8_WIDE_TILE_WAVES` waves,
    128×128 tiles of two warpgroups, three stages (fewer weight reads per product; 1.1-1.2× the 64-token tiles at
    M ≥ 1024 on an H200, docs/BENCHMARKS.md), and a K split only from :data:`W8A8_CHANNEL_SPLIT_MIN_TILES` tiles
    (on an H200 at 32-128 tokens a 4096×4096 product took 11.7-22.5 µs split, 8.3-9.0 unsplit; K = 14336 gains by
    it)."""
    if m < 17:
        return None
    if per_channel and cdiv(m, 128) * cdiv(n, 128) >= W8A8_WIDE_TILE_WAVES * sms:
        return 128, 128, 3, 8, False, 1
    token_tiles = cdiv(m, 64)
    bn = 128 if token_tiles * cdiv(n, 128) > sms else 64
    programs = token_tiles * cdiv(n, bn)
    split = next((s for s in (4, 2) if programs * s <= 3 * sms and split_plan(k_tiles(k), s)[0] >= MIN_SPLIT_TILES),
                 1)
    if per_channel and k_tiles(k) < W8A8_CHANNEL_SPLIT_MIN_TILES:
        split = 1
    return 64, bn, 4, 4, True, split
