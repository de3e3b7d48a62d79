"""W4A16 decode GEMV in CUDA C++ (compiled at run time by NVRTC through CuPy), reading the ``w4a16`` layout.

Why CUDA next to the Triton kernels: a decode GEMV (M <= 16 tokens) is a weight stream (MixLLM Sec. 3.5
roofline), and Triton's smallest tensor-core operand wastes most of each program on a 16-token activation tile.
This kernel is warp-level, in the manner of TurboMind's GEMV path (TurboMind Sec. 4):

* a block owns 16 weight rows; its NWARPS warps split K by 256-column tiles (warp w takes tiles w, w + NWARPS,
  …, one tile loaded ahead into the other of two register tiles) and add their partial sums through shared
  memory at the end; under programmatic dependent launch a warp requests its first tile, or at M <= 8 on layers
  of <= 8192 rows and columns its first two (:func:`wait_after_two`), before it waits for the previous grid;
* lane (g, c) — the coordinates of the ``mma.sync.m16n8k16`` fragments — loads 16-byte vectors c and c + 4 of
  rows g and g + 8 of the tile (``ld.global.nc.L1::no_allocate``: each weight byte is read once); every word
  feeds the same fragment slot of all 8 planes (the tile-planar order of :mod:`quantkit.formats.nibble_planes`);
* dequantization in registers, per pair of adjacent columns: PRMT gathers byte b of two adjacent words, a mask
  | 0x6400 forms the fp16 pair 1024 + q and one sub.f16x2 of 1024 + z (high nibbles: fma by 1/16 and
  −(64 + z)) gives q − z *exactly* — the magic-number int→float of MixLLM Sec. 3.3 / TurboMind Fig. 6
  (bf16: 128 + q with the 0x4300 exponent);
* tensor cores multiply (q − z) by up to 8 tokens (the mma's N side; the GEMV's one token wastes nothing that
  the memory-bound kernel needs; or two sets of 8 by the same dequantized fragment, a launch column of 16)
  into an fp32 partial sum per 128-column group, which is scaled once by the
  group's fp32 scale (MixLLM Sec. 3.3 group-tile accumulation). Ŵ is therefore never rounded to fp16: the
  result is the exact Σ (q − z)·s·x up to fp32 summation, within the fp16 rounding of the weight of
  :func:`quantkit.runtime.kernels.reference.w4a16_reference` (which rounds Ŵ to the activation dtype as the
  tensor-core kernels do).

Measured on an H100 (docs/BENCHMARKS.md, ``docs/bench/gemv_sweep.py``): 14.9 µs at M = 1 on 14336 × 4096
(2.96× cuBLAS fp16, Triton 20.2 µs); at M = 2-8 1.0–1.5× the Triton kernel's 128-row tiles on the five
Llama-3.1-8B shapes (docs/logs/gemv_sweep_m8_tiles_h100.json).
Nsight Compute showed the schedulers issuing on ~47 % of cycles with ~400 instructions per tile, so the loop was
cut to ~270 (a signed division for the group index, a two-instruction mask, a tile copy and a token predicate
removed: 17.8 → 14.9 µs); a pure read of the same bytes takes 11.8 µs. Variants measured and dropped:
per-element fp16 scaling before the mma, activations staged in shared memory, a TMA bulk prefetch of the block's
rows into L2, a CUDA-core FMA version, register caps, a second tile in flight, (sm_90) the weight stream
through TMA bulk copies into a shared-memory ring (slower at every shape and M: whole blocks wait for their
chunk, then compute while nothing of theirs is loading; docs/logs/gemv_sweep_bulk_h100.json,
docs/logs/gemv_sweep_lean_h100.json, docs/logs/ncu_gemv_regs_vs_bulk_h100.txt; code at commit f721c5e), and a
per-warp cp.async ring of 2-6 stages (slower, more stages slower still: docs/logs/gemv_sweep_async_h100.json;
code at commit 87fd855).

Requires K a multiple of 256 and 8-byte aligned activation rows (every real model's hidden sizes are);
:func:`cuda_gemv_supported` says when; :func:`quantkit.runtime.kernels.w4a16.w4a16_matmul` uses it where
:func:`cuda_gemv_preferred` says it is faster
and runs the Triton kernel otherwise. The pure-torch reference of the format is
:func:`quantkit.runtime.kernels.reference.w4a16_reference`; this kernel runs only with CuPy and a CUDA GPU.
"""

from __future__ import annotations

import dataclasses

import torch

from quantkit.runtime.kernels.cuda_common import (PRELUDE, compile_problem, cxx_bool, device_index, device_problem,
                                                    group_shift, launch, launch_form)
from quantkit.runtime.kernels.cuda_common import cupy_available  # noqa: F401 — callers and tests import it from here
from quantkit.runtime.kernels.launch import groups_in_halves

TOKENS_PER_COLUMN = 8  # the mma's N side: tokens of one launch column
CUDA_GEMV_MAX_M = 8  # the most tokens w4a16_matmul's default path sends here (cuda_gemv_preferred); the kernel takes 16

SOURCE = PRELUDE + r"""
// c[0..3] += A (a0..a3) · B (b0, b1), fp32 accumulators, operands of element type TY ("f16" or "bf16")
#define QK_MMA_M16N8K16(TY)                                                                                  \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TY "." TY ".f32 {%0, %1, %2, %3}, "                 \
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"                                             \
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                            \
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))

// (a & mask) | bits in one LOP3 (0xEA = (a & b) | c); written out because the compiler, given two immediates,
// emits an AND and an OR (measured: 64 of the ~400 instructions per tile)
__device__ __forceinline__ u32 and_or(u32 a, u32 mask, u32 bits) {
    u32 r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(a), "r"(mask), "r"(bits));
    return r;
}

template <bool BF16> struct Pair;
template <> struct Pair<false> {
    typedef __half T; typedef __half2 T2;
    static __device__ __forceinline__ T2 bits(u32 v) { return *reinterpret_cast<T2*>(&v); }
    static __device__ __forceinline__ u32 word(T2 v) { return *reinterpret_cast<u32*>(&v); }
    // low nibbles of p's bytes 0 and 2 with the 0x6400 exponent: the fp16 pair 1024 + q; minus (1024 + z): q - z
    static __device__ __forceinline__ u32 low_q(u32 p, T2 zm) {
        return word(__hsub2(bits(and_or(p, 0x000F000Fu, 0x64006400u)), zm));
    }
    // high nibbles in place: 1024 + 16q; fma(v, 1/16, -(64 + z)) = q - z exactly
    static __device__ __forceinline__ u32 high_q(u32 p, T2 zm) {
        return word(__hfma2(bits(and_or(p, 0x00F000F0u, 0x64006400u)), bits(0x2C002C00u), zm));
    }
    // fp16 bit patterns: 1024 + z = 0x6400 + z (ulp 1), -(64 + z) = 0xD400 + 16z (ulp 1/16), 1/16 = 0x2C00
    static __device__ __forceinline__ void zeros(u32 w, T2& z_lo, T2& z_hi) {
        const u32 z = (w >> 16) & 0xFFu;
        z_lo = bits(0x64006400u + z * 0x00010001u);
        z_hi = bits(0xD400D400u + (z << 4) * 0x00010001u);
    }
    static __device__ __forceinline__ float scale(u32 w) {
        return __half2float(__ushort_as_half((unsigned short)(w & 0xFFFFu)));
    }
    static __device__ __forceinline__ void mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
        QK_MMA_M16N8K16("f16");
    }
};
template <> struct Pair<true> {
    typedef __nv_bfloat16 T; typedef __nv_bfloat162 T2;
    static __device__ __forceinline__ T2 bits(u32 v) { return *reinterpret_cast<T2*>(&v); }
    static __device__ __forceinline__ u32 word(T2 v) { return *reinterpret_cast<u32*>(&v); }
    // 0x4300 = 128.0 in bf16 (ulp 1 on [128, 256)): 128 + q exactly, minus (128 + z) exactly
    static __device__ __forceinline__ u32 low_q(u32 p, T2 zm) {
        return word(__hsub2(bits(and_or(p, 0x000F000Fu, 0x43004300u)), zm));
    }
    static __device__ __forceinline__ u32 high_q(u32 p, T2 zm) {
        return word(__hsub2(bits(and_or(p >> 4, 0x000F000Fu, 0x43004300u)), zm));
    }
    static __device__ __forceinline__ void zeros(u32 w, T2& z_lo, T2& z_hi) {
        z_lo = bits(0x43004300u + ((w >> 16) & 0xFFu) * 0x00010001u);
        z_hi = z_lo;
    }
    static __device__ __forceinline__ float scale(u32 w) {  // the fp16 scale rounded to bf16, as the reference
        return __bfloat162float(__float2bfloat16_rn(__half2float(__ushort_as_half((unsigned short)(w & 0xFFFFu)))));
    }
    static __device__ __forceinline__ void mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
        QK_MMA_M16N8K16("bf16");
    }
};

// byte b of word a -> bytes 0, 1; byte b of word c -> bytes 2, 3
__device__ __forceinline__ u32 gather(u32 a, u32 c, int b) {
    return __byte_perm(a, c, (u32)(b | (b << 4) | ((4 + b) << 8) | ((4 + b) << 12)));
}

struct Tile {  // one lane's share of a 256-column tile of the block's 16 rows, loaded one tile ahead
    uint4 w[2][2];  // [row g, row g + 8][words 4c..4c+3, words 16+4c..16+4c+3]
    u32 p[2][2];    // [row][half-tile 0, 1] scale | zero words
};

// acc[j] += Σ over one 256-column tile t of (q - z)·x, one fp32 scale per (row, half-tile); acc[j][i]: row
// g + 8(i >> 1), token 8j + 2c + (i & 1) of the launch column. J sets of 8 tokens share every dequantized fragment
// (xr[j]: token 8j + g's activations).
template <bool BF16, int J>
__device__ __forceinline__ void mma_tile(const Tile& cur, const typename Pair<BF16>::T* const* xr, int t,
                                         float (*acc)[4]) {
    typedef Pair<BF16> P;
    typedef typename P::T2 T2;
    T2 zl[2], zh[2], unused;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        P::zeros(cur.p[r][0], zl[r], unused);
        P::zeros(cur.p[r][1], unused, zh[r]);
    }
    float part[J][2][4];  // Σ (q - z)·x per token set and half-tile (fp32)
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
        for (int i = 0; i < 8; ++i) part[j][i >> 2][i & 3] = 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {      // words 0-15 / 16-31 of the tile
#pragma unroll
        for (int b = 0; b < 4; ++b) {  // byte b: plane b (low nibble, first half-tile), b + 4 (high, second)
            u32 pa[2], pb[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                pa[r] = gather(cur.w[r][h].x, cur.w[r][h].y, b);  // columns 4c, 4c+1 of the plane
                pb[r] = gather(cur.w[r][h].z, cur.w[r][h].w, b);  // columns 4c+2, 4c+3
            }
#pragma unroll
            for (int hi = 0; hi < 2; ++hi) {
                const int plane = b + 4 * hi;
                u32 a0, a1, a2, a3;
                if (hi == 0) {
                    a0 = P::low_q(pa[0], zl[0]); a1 = P::low_q(pa[1], zl[1]);
                    a2 = P::low_q(pb[0], zl[0]); a3 = P::low_q(pb[1], zl[1]);
                } else {
                    a0 = P::high_q(pa[0], zh[0]); a1 = P::high_q(pa[1], zh[1]);
                    a2 = P::high_q(pb[0], zh[0]); a3 = P::high_q(pb[1], zh[1]);
                }
#pragma unroll
                for (int j = 0; j < J; ++j) {
                    // token 8j + g's columns 256t + 32·plane + 16h + 4c .. +3
                    const uint2 xv = *reinterpret_cast<const uint2*>(xr[j] + t * 256 + plane * 32 + 16 * h);
                    P::mma(part[j][hi], a0, a1, a2, a3, xv.x, xv.y);
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // one fp32 scale per (row, half-tile)
            const int r = i >> 1;
            acc[j][i] = fmaf(P::scale(cur.p[r][0]), part[j][0][i], fmaf(P::scale(cur.p[r][1]), part[j][1][i],
                                                                         acc[j][i]));
        }
}

// Y[M, N] = X[M, K] · Ŵ[N, K]^T for 8·J tokens per launch column: a block owns 16 rows, its NWARPS warps share K;
// each warp multiplies one tile while the next is loading (two register tiles used in turn, so no tile is copied)
// L2PF: see ld_stream. The explicit minimum of 1 block per SM matters: without it ptxas aims at more resident
// blocks, caps the kernel at 80 registers, hoists fewer loads and runs 10-45 % slower (docs/logs/gemv_sweep_*.json)
// WAIT2: wait for the previous grid after two tiles are in flight, not one
template <int NWARPS, bool BF16, int L2PF, int J, bool WAIT2>
__global__ void __launch_bounds__(NWARPS * 32, 1)
w4a16_gemv_mma(const void* __restrict__ x_, const uint4* __restrict__ w, const u32* __restrict__ qp,
               void* __restrict__ out_, int M, int N, long long stride_xm, long long stride_om, int w_row_vec,
               int n_tiles, int halves_per_group, int group_shift, int n_groups) {
    typedef typename Pair<BF16>::T T;
    const T* x = reinterpret_cast<const T*>(x_);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, c = lane & 3;  // mma fragment coordinates: row / token g, column pair c
    const int row0 = blockIdx.x * 16;
    const int m0 = blockIdx.y * 8 * J;
    const int rows[2] = {min(row0 + g, N - 1), min(row0 + g + 8, N - 1)};
    // lanes of tokens past M read the last token (their output columns are never stored): no predicate, no zeroing
    const T* xr[J];
    float acc[J][4];
#pragma unroll
    for (int j = 0; j < J; ++j) {
        xr[j] = x + (long long)min(m0 + 8 * j + g, M - 1) * stride_xm + 4 * c;
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[j][i] = 0.f;
    }

    auto load = [&](int t, Tile& tl) {
        const int g_lo = group_of(2 * t, group_shift, halves_per_group, n_groups);
        const int g_hi = group_of(2 * t + 1, group_shift, halves_per_group, n_groups);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const uint4* base = w + (long long)rows[r] * w_row_vec + t * 8 + c;
            tl.w[r][0] = ld_stream<L2PF>(base);
            tl.w[r][1] = ld_stream<L2PF>(base + 4);
            tl.p[r][0] = __ldg(qp + (long long)g_lo * N + rows[r]);
            tl.p[r][1] = __ldg(qp + (long long)g_hi * N + rows[r]);
        }
    };
    pdl_trigger();
    Tile ta, tb;
    int t = warp;
    if (t < n_tiles) load(t, ta);
    if (WAIT2 && t + NWARPS < n_tiles) load(t + NWARPS, tb);
    pdl_wait();  // the weights are no earlier kernel's output; the activations may be
    // each tile is requested one tile's work before it is used: the register tile it lands in was just consumed
    for (; t < n_tiles; t += 2 * NWARPS) {
        if (!WAIT2 && t + NWARPS < n_tiles) load(t + NWARPS, tb);
        mma_tile<BF16, J>(ta, xr, t, acc);
        if (WAIT2 && t + 2 * NWARPS < n_tiles) load(t + 2 * NWARPS, ta);
        if (t + NWARPS >= n_tiles) break;
        if (!WAIT2 && t + 2 * NWARPS < n_tiles) load(t + 2 * NWARPS, ta);
        mma_tile<BF16, J>(tb, xr, t + NWARPS, acc);
        if (WAIT2 && t + 3 * NWARPS < n_tiles) load(t + 3 * NWARPS, tb);
    }
    reduce_store<NWARPS, J>(acc, reinterpret_cast<T*>(out_), row0, m0, M, N, stride_om, nullptr);
}
"""


@dataclasses.dataclass(frozen=True)
class GemvVariant:
    """One compiled form of the decode GEMV: ``warps`` per block (they split K) and the L2 sector prefetch its
    weight loads ask for (``l2_prefetch`` 0, 128 or 256 bytes)."""

    warps: int = 4
    l2_prefetch: int = 128
    token_sets: int = 1  # 8-token sets per launch column sharing every dequantized weight fragment (1 or 2)
    wait_after_two: bool = False  # the previous grid is waited for after two tiles are in flight, not one

    def kernel_name(self, bf16: bool) -> str:
        return (f"w4a16_gemv_mma<{self.warps}, {cxx_bool(bf16)}, {self.l2_prefetch}, {self.token_sets}, "
                f"{cxx_bool(self.wait_after_two)}>")

    @property
    def key(self) -> str:
        """Short name, as the sweep logs spell it."""
        return (f"cuda_w{self.warps}_pf{self.l2_prefetch}" + (f"_j{self.token_sets}" if self.token_sets > 1 else "")
                + ("_w2" if self.wait_after_two else ""))


# the variants docs/bench/gemv_sweep.py times
VARIANTS = [GemvVariant(w, pf) for w in (2, 4, 8) for pf in (0, 128, 256)] + [
    GemvVariant(w, 128, 1, True) for w in (2, 4, 8)]
VARIANTS_M16 = [GemvVariant(w, 128, j) for w in (2, 4, 8) for j in (1, 2)]  # --m16 of the sweep


def cuda_gemv_problem(x: torch.Tensor, tensors: dict, meta: dict, out: torch.Tensor | None = None) -> str | None:
    """Why :func:`w4a16_gemv_cuda` cannot run ``x`` [M, K] against these ``w4a16`` tensors (None: it can): it
    needs M >= 1, fp16/bf16 activations with unit column stride and 8-byte aligned rows, K a multiple of 256,
    contiguous 16-byte aligned ``qweight`` and contiguous ``qparams`` on x's CUDA device, an ``out`` (if any) of
    x's dtype with unit column stride, a GPU of compute capability >= 8.0 (mma.sync m16n8k16) and CuPy whose
    NVRTC compiles the kernel. Checked in that order, so the shape reasons are testable without a GPU."""
    qweight, qparams = tensors["qweight"], tensors["qparams"]
    if x.dim() != 2 or x.shape[0] == 0:
        return "no tokens"
    if x.dtype not in (torch.float16, torch.bfloat16):
        return f"activations are {x.dtype}, not fp16/bf16"
    if int(meta["in_features"]) % 256:
        return f"K = {meta['in_features']} is not a multiple of 256"
    if x.stride(1) != 1 or x.data_ptr() % 8 or (x.stride(0) * x.element_size()) % 8:
        return "activation rows are not 8-byte aligned with unit column stride"
    if out is not None and (out.dtype != x.dtype or out.stride(1) != 1):
        return "out must have the activations' dtype and unit column stride"
    if not (qweight.is_contiguous() and qparams.is_contiguous() and qweight.data_ptr() % 16 == 0):
        return "packed tensors are not contiguous and 16-byte aligned"
    problem = device_problem(x, [qweight, qparams], (8, 0), "the GPU is older than compute capability 8.0")
    if problem:
        return problem
    variant = default_variant(int(meta["out_features"]), int(meta["in_features"]), x.shape[0])
    return compile_problem(device_index(x), SOURCE, (variant.kernel_name(x.dtype == torch.bfloat16),), "CUDA GEMV")


def cuda_gemv_supported(x: torch.Tensor, tensors: dict, meta: dict, out: torch.Tensor | None = None) -> bool:
    """True when :func:`cuda_gemv_problem` finds nothing in the way."""
    return cuda_gemv_problem(x, tensors, meta, out) is None


def cuda_gemv_warps(n: int, k: int) -> int:
    """Warps per block (they split K) of the register variant for an [N, K] weight: 8 for N <= 4096 (few 16-row
    blocks), 4 up to N = 8192, 2 up to 16384, else 4 — on an H100 the fastest of 2/4/8 per Llama-3.1-8B shape at
    M = 1, 2, 4 and 8, or within 6 % of it (docs/bench/gemv_sweep.py, docs/logs/gemv_sweep_lean_h100.json). Above
    16384 rows (session 13, docs/logs/session13/gemv_wait2_h100.json): 24576×4096 21.3-26.7 µs on 4 warps vs
    23.2-29.8 on 2, 37888×3584 28.1-35.2 vs 29.6-35.8, 28672×4096 a tie — at 111 registers nine 2-warp blocks
    fit an SM, so past ~19000 rows the 2-warp launch needs a second, ragged wave (the A8 GEMV's rule too)."""
    return 8 if n <= 4096 else (4 if n <= 8192 or n > 16384 else 2)


def wait_after_two(n: int, k: int) -> bool:
    """Whether the decode GEMV of an [N, K] weight waits for the previous grid (programmatic dependent launch)
    after two weight tiles per warp are in flight rather than one: on layers of at most 8192 rows and columns.
    H100, docs/bench/gemv_sweep.py (docs/logs/session13/gemv_wait2_h100.json, 12 shapes × M = 1, 2, 4, 8 at the
    rule's warps): there 1.01-1.13× faster on 1024×4096, 4096×4096, 6144×4096 and 3584×3584, 0.98-1.07× on
    4608×3584; on the wider or longer layers (14336-37888 rows, 12288-18944 columns) 0.95-1.02×, not explained
    (the A8 GEMV, same loop, gains there: :func:`.cuda_gemv_a8.a8_wait_after_two`). Only at M <= 8 (one 8-token
    set per launch column); the 16-token variant keeps the old wait."""
    return n <= 8192 and k <= 8192


def cuda_gemv_preferred(m: int, n: int, k: int) -> bool:
    """Whether the CUDA GEMV beats the Triton W4A16 kernel for M tokens on an [N, K] weight (H100): M <= 8 — it
    wins or ties on every Llama-3.1-8B shape there (M = 8: 6144×4096 10.6 vs 12.7 µs, 14336×4096 16.6 vs 17.2;
    28672×4096 and 4096×14336 within 2 %; docs/logs/gemv_sweep_m8_tiles_h100.json) — and Triton above
    (4096×4096 M = 16: 9.6 vs 10.7 µs; 14336×4096: 19.4 vs 28.6; gemv_sweep_slots_h100.json and
    tile_m16_slots_h100.json — before the split-K slots the GEMV also won M = 9-16 up to 8192 × 8192)."""
    return 1 <= m <= CUDA_GEMV_MAX_M


def default_variant(n: int, k: int, m: int = 1) -> GemvVariant:
    """The GEMV variant :func:`w4a16_gemv_cuda` runs for M tokens on an [N, K] weight when none is named: M <= 8:
    warps by :func:`cuda_gemv_warps`, 128-byte L2 prefetch (2-4 % faster than none, as fast as 256 on an H100:
    docs/logs/gemv_sweep_pf_h100.json), the wait of :func:`wait_after_two`; above: 4 warps, two 8-token sets per
    launch column (the fastest or within 4 % of it at M = 12 and 16 on layers up to 8192 × 8192,
    docs/logs/gemv_sweep_m16_h100.json)."""
    if m > TOKENS_PER_COLUMN:
        return GemvVariant(4, 128, 2)
    return GemvVariant(cuda_gemv_warps(n, k), 128, 1, wait_after_two(n, k))


def w4a16_gemv_cuda(x: torch.Tensor, tensors: dict, meta: dict, variant: GemvVariant | None = None,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """Y = X·Ŵᵀ [M, N] in x's dtype for a ``w4a16`` weight (module docstring), on x's current CUDA stream (so it
    can be captured in a CUDA graph once it has run outside capture: the first call compiles); 8 or 16 tokens
    per launch column. Ŵ is not rounded to the activation dtype (module docstring), so results differ from the
    Triton kernels and :func:`quantkit.runtime.kernels.reference.w4a16_reference` by that rounding (≈ 3e-4
    relative in fp16). The caller checks :func:`cuda_gemv_supported`; ``variant`` defaults to
    :func:`default_variant`."""
    import numpy as np

    m, k = x.shape
    n = int(meta["out_features"])
    if k != int(meta["in_features"]):
        raise ValueError(f"x must be [M, {meta['in_features']}], got {tuple(x.shape)}")
    qweight, qparams = tensors["qweight"], tensors["qparams"]
    n_tiles, n_groups = qweight.shape[1] // 32, qparams.shape[0]
    dev = device_index(x)
    bf16 = x.dtype == torch.bfloat16
    variant = variant or default_variant(n, k, m)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device) if out is None else out
    fn, pdl = launch_form(dev, SOURCE, variant.kernel_name(bf16))
    hpg = groups_in_halves(meta, n_tiles)
    shift = group_shift(int(meta["group_size"]), hpg)
    if variant.token_sets not in (1, 2):
        raise ValueError(f"token_sets must be 1 or 2, got {variant.token_sets}")
    grid = (-(-n // 16), -(-m // (TOKENS_PER_COLUMN * variant.token_sets)))
    args = (np.uint64(x.data_ptr()), np.uint64(qweight.data_ptr()), np.uint64(qparams.data_ptr()),
            np.uint64(out.data_ptr()), np.int32(m), np.int32(n), np.int64(x.stride(0)), np.int64(out.stride(0)),
            np.int32(qweight.shape[1] // 4), np.int32(n_tiles), np.int32(hpg), np.int32(shift), np.int32(n_groups))
    launch(fn, pdl, dev, torch.cuda.current_stream(x.device).cuda_stream, grid, (32 * variant.warps,), args)
    return out
