"""LiquidQuant W4A8 for layers with few output tiles: a K split reduced inside a thread-block cluster (CUDA C++,
NVRTC via CuPy; Hopper).

A layer of few weight rows (the 1024-row k/v projection of Llama-3-8B, Qwen2's 512-row one) gives the Gluon kernels
too few output tiles to fill 132 SMs at a few hundred tokens, so they split K. Their split programs each store an
fp32 slot to global memory, fence, take an atomic ticket, and the tile's last program reads every slot back
(:mod:`.splitk`): measured on the k/v layer at 128 tokens, ~1.7-4.2 µs of a 9-12 µs launch (docs/BENCHMARKS.md,
session 18). Here the S programs that split one output tile's K are one cluster (``__cluster_dims__``), resident
together, and they add their partial tiles through distributed shared memory instead:

* a CTA (4 warps) owns 64 weight rows × BT tokens over 1/S of the 256-column tiles; warp w multiplies rows
  32(w & 1) … +31 by tokens (w >> 1)·BT/2 … with ``mma.sync.m16n8k32`` on int8 (weights the A operand, tokens B);
* each tile's weight words, group words and activation codes arrive by ``cp.async`` in a STAGES-deep shared-memory
  ring (the first weight tiles before the wait for the previous grid); a lane reads its words from there and
  dequantizes them in registers, four int8 lanes per IMAD, as ((q·s + a) mod 256) XOR 0x80 (LiquidGEMM Eq. 11-12;
  the same words, gather and arithmetic as the A8 GEMV, :mod:`.cuda_gemv_a8`). Rows are padded so that ``ldmatrix``
  (activations, 272 bytes) and the 16-byte word loads (192 bytes) meet no bank conflicts. (Its first form loaded
  the words straight into registers one tile ahead, as the GEMV does: ~1.6 µs a tile, the load latency — H100,
  docs/logs/session19/cluster_sweep_a_h100.json);
* per-token activation scales and one per-channel weight scale (LiquidGEMM Sec. 4) leave the K sum an exact int32,
  so the partial tiles add exactly in any order: each CTA writes its int32 tile into its own shared memory, a
  cluster barrier (release / acquire) publishes it, CTA r adds token rows r·BT/S … of all S tiles over
  ``ld.shared::cluster`` and stores them as (sum · token scale) · channel scale in fp16/bf16 — the Triton and Gluon
  kernels' epilogue on the same exact sum, so the result is bit for bit theirs unsplit;
* a second cluster barrier keeps every CTA's shared memory alive until its peers have read it.

Like the decode GEMVs it launches with programmatic dependent launch where the device takes it (its first weight
tile loads before the wait, :mod:`.cuda_common`). Requires K a multiple of 256, per-token activations with 16-byte
aligned rows, fp16 channel scales, compute capability 9.0 (clusters) and CuPy: :func:`lqq_cluster_problem` says
what is missing. The format's pure-torch reference is :func:`quantkit.runtime.kernels.reference.int8_reference`.
"""

from __future__ import annotations

import torch

from quantkit.runtime.kernels.cuda_common import (PRELUDE, allow_dynamic_shared, compile_problem, cxx_bool,
                                                    device_index, device_problem, group_shift, launch, launch_form)
from quantkit.runtime.kernels.cuda_gemv_a8 import IMMA
from quantkit.runtime.kernels.launch import groups_in_halves, split_plan

ROW_BYTES = 272  # one token row of an activation stage in shared memory: 256 codes + 16 bytes of padding
W_ROW_BYTES = 192  # one weight row of a stage: a tile's 128 bytes of words + 64 of padding
CLUSTER_SPLITS = (1, 2, 4, 8)  # CTAs of a cluster (8: the portable cluster size)
CLUSTER_TOKENS = (64, 128)
CLUSTER_STAGES = (2, 3, 4)
CLUSTER_TOKEN_WARPS = (2, 4)  # warps along the tokens (a CTA has twice as many: two along its 64 rows)

SOURCE = PRELUDE + IMMA + r"""
// the A8 GEMV's int8 mma without `volatile`: it reads registers only, so the compiler may move it past the
// shared-memory loads of the next plane and keep the tensor cores fed from one warp
__device__ __forceinline__ void mma_s8(int* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void cp_async16(u32 dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(u32 addr, u32& d0, u32& d1, u32& d2, u32& d3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(d0), "=r"(d1), "=r"(d2), "=r"(d3) : "r"(addr));
}

// every CTA of the cluster past this point, and every shared-memory write before it visible to all of them
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// four int32 at shared address `addr` of the cluster's CTA `rank` (distributed shared memory)
__device__ __forceinline__ int4 ld_cluster_v4(u32 addr, int rank) {
    u32 remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
    int4 v;
    asm volatile("ld.shared::cluster.v4.s32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(remote) : "memory");
    return v;
}

__device__ __forceinline__ void cp_async4(u32 dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"(dst), "l"(src) : "memory");
}

__device__ __forceinline__ uint4 lds128(u32 addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    return v;
}

__device__ __forceinline__ u32 lds32(u32 addr) {
    u32 v;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr));
    return v;
}

// Y [M, N] for 64 weight rows × BT tokens per CTA, S CTAs of a cluster splitting K (module docstring). A ring stage
// holds one 256-column tile: the BT token rows (ACT_ROW bytes each), the 64 weight rows' words (W_ROW bytes each)
// and their two half-tiles' group words
template <int S, int BT, int WT, int STAGES, bool BF16>
__global__ void __cluster_dims__(S, 1, 1) __launch_bounds__(64 * WT)
lqq_cluster(const signed char* __restrict__ a, const float* __restrict__ sa, int M, long long stride_am,
            long long stride_sm, const char* __restrict__ w, const u32* __restrict__ params,
            const __half* __restrict__ cs, int N, int w_row, int hpg, int shift, int groups, void* __restrict__ out_,
            long long stride_om, int n_tiles, int tiles_per_split) {
    constexpr int ACT_ROW = 272;  // 256 codes + 16: the 8 rows of an ldmatrix phase land 4 banks apart
    constexpr int W_ROW = 192;    // 128 bytes of words + 64: a 16-byte load phase's rows g, g + 1 in other bank halves
    constexpr int W_OFF = BT * ACT_ROW, P_OFF = W_OFF + 64 * W_ROW;
    constexpr int STAGE = P_OFF + 2 * 64 * 4;
    constexpr int PART = ACT_ROW / 4;  // int32 per token row of the partial tile (64 rows + 4), in stage 0's codes
    constexpr int NTH = 64 * WT;       // threads: WT warps along the tokens × 2 along the rows
    constexpr int NF = BT / WT / 8;    // 8-token fragments per warp
    extern __shared__ __align__(16) unsigned char smem[];
    typedef typename OutType<BF16>::T T;
    T* out = reinterpret_cast<T*>(out_);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    // clusters are S consecutive CTAs along x: rank = blockIdx.x % S
    const int rank = blockIdx.x % S, row0 = (blockIdx.x / S) * 64, m0 = blockIdx.y * BT;
    const int t_begin = rank * tiles_per_split, t_end = min(t_begin + tiles_per_split, n_tiles);
    const u32 smem0 = (u32)__cvta_generic_to_shared(smem);

    int acc[2][NF][4];
#pragma unroll
    for (int f = 0; f < 2; ++f)
#pragma unroll
        for (int j = 0; j < NF; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[f][j][i] = 0;

    // tile t's weight words and group words into stage s (rows past N copy row N − 1, never stored)
    auto issue_w = [&](int t, int s) {
        if (t < t_end) {
            const u32 base = smem0 + s * STAGE;
#pragma unroll
            for (int q = 0; q < 512 / NTH; ++q) {
                const int idx = threadIdx.x + NTH * q, r = idx >> 3, ch = idx & 7;
                cp_async16(base + W_OFF + r * W_ROW + 16 * ch,
                           w + (long long)min(row0 + r, N - 1) * w_row + t * 128 + 16 * ch);
            }
            const int half = threadIdx.x >> 6, r = threadIdx.x & 63;
            if (threadIdx.x < 128)
                cp_async4(base + P_OFF + 4 * threadIdx.x,
                          params + (long long)group_of(2 * t + half, shift, hpg, groups) * N + min(row0 + r, N - 1));
        }
    };
    // tile t's BT token rows of 256 codes into stage s (tokens past M copy row M − 1, never stored)
    auto issue_a = [&](int t, int s) {
        if (t < t_end) {
#pragma unroll
            for (int q = 0; q < BT * 16 / NTH; ++q) {
                const int idx = threadIdx.x + NTH * q, r = idx >> 4, ch = idx & 15;
                cp_async16(smem0 + s * STAGE + r * ACT_ROW + 16 * ch,
                           a + (long long)min(m0 + r, M - 1) * stride_am + t * 256 + 16 * ch);
            }
        }
    };
    pdl_trigger();
    // the weights are no earlier kernel's output: their first tiles are on the way before the wait for the
    // previous grid, which may have written the activation codes and scales. Group s holds tile s's codes (group 0
    // also the first weights); every group is committed, empty past the K range, so the wait counts below hold
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) issue_w(t_begin + s, s);
    pdl_wait();
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        issue_a(t_begin + s, s);
        cp_commit();
    }

    const int tok0 = (warp >> 1) * (BT / WT);
    // ldmatrix.x4: lanes 0-7 / 8-15 / 16-23 / 24-31 address tokens 0-7 bytes 0-15 / tokens 0-7 bytes 16-31 /
    // tokens 8-15 bytes 0-15 / tokens 8-15 bytes 16-31 of a plane — b0, b1 of two 8-token fragments
    const u32 lm_lane = (tok0 + (lane & 7) + 8 * (lane >> 4)) * ACT_ROW + 16 * ((lane >> 3) & 1);
    const int wrow = 32 * (warp & 1) + g;  // + 16f + 8r: the lane's weight rows in the CTA's 64
    for (int t = t_begin; t < t_end; ++t) {
        const int i = t - t_begin;
        cp_wait<STAGES - 2>();
        __syncthreads();  // tile t landed for all; every warp is done with the stage refilled next
        issue_w(t + STAGES - 1, (i + STAGES - 1) % STAGES);
        issue_a(t + STAGES - 1, (i + STAGES - 1) % STAGES);
        cp_commit();
        const u32 st = smem0 + (i % STAGES) * STAGE;
        uint4 words[2][2][2];  // [16-row fragment][row g / g + 8][first / second 64 bytes of the row's tile]
#pragma unroll
        for (int f = 0; f < 2; ++f)
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int v = 0; v < 2; ++v)
                    words[f][r][v] = lds128(st + W_OFF + (wrow + 16 * f + 8 * r) * W_ROW + 64 * v + 16 * c);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            u32 s8[2][2], a4[2][2];
#pragma unroll
            for (int f = 0; f < 2; ++f)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const u32 p = lds32(st + P_OFF + 4 * (64 * half + wrow + 16 * f + 8 * r));
                    s8[f][r] = p & 0xFFu;
                    a4[f][r] = ((p >> 8) & 0xFFu) * 0x01010101u;
                }
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                const int plane = b + 4 * half;  // activation columns 32·plane … +31 of the tile
                u32 q[2][2][2];
#pragma unroll
                for (int f = 0; f < 2; ++f)
#pragma unroll
                    for (int r = 0; r < 2; ++r)
#pragma unroll
                        for (int v = 0; v < 2; ++v) {  // (q·s + a) XOR 0x80 on four int8 lanes (LiquidGEMM Eq. 11-12)
                            const u32 bytes = gather4(words[f][r][v], b);
                            q[f][r][v] = (((half == 0 ? bytes : bytes >> 4) & 0x0F0F0F0Fu) * s8[f][r] + a4[f][r])
                                         ^ 0x80808080u;
                        }
                u32 bf[NF][2];  // the plane's B fragments, all loaded before its products
#pragma unroll
                for (int j = 0; j < NF; j += 2)
                    ldmatrix_x4(st + lm_lane + j * 8 * ACT_ROW + plane * 32, bf[j][0], bf[j][1], bf[j + 1][0],
                                bf[j + 1][1]);
#pragma unroll
                for (int j = 0; j < NF; ++j)
#pragma unroll
                    for (int f = 0; f < 2; ++f)
                        mma_s8(acc[f][j], q[f][0][0], q[f][1][0], q[f][0][1], q[f][1][1], bf[j][0], bf[j][1]);
            }
        }
    }
    cp_wait<0>();
    __syncthreads();  // every stage read and every copy landed: stage 0's codes become this CTA's partial tile
    int* part = reinterpret_cast<int*>(smem);
#pragma unroll
    for (int f = 0; f < 2; ++f)
#pragma unroll
        for (int j = 0; j < NF; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i)  // the mma C fragment: row g + 8(i >> 1), token 2c + (i & 1)
                part[(tok0 + 8 * j + 2 * c + (i & 1)) * PART + 32 * (warp & 1) + 16 * f + 8 * (i >> 1) + g] =
                    acc[f][j][i];
    cluster_sync();
    constexpr int TOKS = BT / S;  // token rows this CTA adds up and stores, 4 weight rows per thread and step
    for (int idx = threadIdx.x; idx < TOKS * 16; idx += NTH) {
        const int tl = rank * TOKS + (idx >> 4), rq = 4 * (idx & 15);
        const u32 addr = smem0 + (u32)(tl * PART + rq) * 4u;
        int4 sum = ld_cluster_v4(addr, 0);
#pragma unroll
        for (int q = 1; q < S; ++q) {
            const int4 v = ld_cluster_v4(addr, q);
            sum.x += v.x; sum.y += v.y; sum.z += v.z; sum.w += v.w;
        }
        const int tok = m0 + tl;
        if (tok < M) {
            const float s_tok = sa[(long long)tok * stride_sm];
            const int vals[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = row0 + rq + e;
                if (row < N)  // (sum · token scale) · channel scale: the Triton / Gluon epilogue's order
                    store_out(out + (long long)tok * stride_om + row,
                              __fmul_rn(__fmul_rn((float)vals[e], s_tok), __half2float(cs[row])));
            }
        }
    }
    cluster_sync();  // no CTA exits while a peer may still read its shared memory
}
"""


def cluster_kernel_name(split: int, tokens: int, token_warps: int, stages: int, bf16: bool) -> str:
    """The template instance of SOURCE for a cluster of ``split`` CTAs, ``tokens`` per CTA over ``token_warps`` × 2
    warps, ``stages``."""
    return f"lqq_cluster<{split}, {tokens}, {token_warps}, {stages}, {cxx_bool(bf16)}>"


def cluster_shared_bytes(tokens: int, stages: int) -> int:
    """Dynamic shared memory of a CTA: ``stages`` ring stages, each a tile's ``tokens`` padded activation rows, 64
    padded weight rows and their 2 × 64 group words."""
    return stages * (tokens * ROW_BYTES + 64 * W_ROW_BYTES + 2 * 64 * 4)


def _check_launch(tokens: int, split: int, stages: int, token_warps: int) -> None:
    if (tokens not in CLUSTER_TOKENS or split not in CLUSTER_SPLITS or stages not in CLUSTER_STAGES
            or token_warps not in CLUSTER_TOKEN_WARPS):
        raise ValueError(f"tokens must be one of {CLUSTER_TOKENS}, split one of {CLUSTER_SPLITS}, stages one of "
                         f"{CLUSTER_STAGES} and token_warps one of {CLUSTER_TOKEN_WARPS}; got {tokens}, {split}, "
                         f"{stages}, {token_warps}")


def lqq_cluster_problem(a_codes: torch.Tensor, a_scales: torch.Tensor, act_group_size: int, layout: str,
                        tensors: dict, meta: dict, out_dtype: torch.dtype, out: torch.Tensor | None = None,
                        launch_cfg: tuple[int, int, int, int] = (128, 4, 2, 2)) -> str | None:
    """Why :func:`lqq_cluster_matmul` cannot run these arguments with ``launch_cfg`` = (tokens, split, stages,
    token_warps)
    (None: it can): a ``w4a8-lqq`` weight of K a multiple of 256, per-token activation codes (int8, rows 16-byte
    aligned, unit column stride) and float32 scales, an fp16/bf16 output (``out``, if given, of that dtype with unit
    column stride), contiguous 16-byte aligned packed tensors with fp16 channel scales, all on one CUDA device of
    compute capability >= 9.0 (thread-block clusters), and CuPy whose NVRTC compiles the instance. Cheap checks
    first (testable on a CPU)."""
    if layout != "w4a8-lqq":
        return f"layout {layout} is not w4a8-lqq"
    if act_group_size != -1:
        return "activations are not per-token"
    try:
        _check_launch(*launch_cfg)
    except ValueError as e:
        return str(e)
    k, n = int(meta["in_features"]), int(meta["out_features"])
    gs = int(meta["group_size"])
    if gs != -1 and (gs <= 0 or gs % 128):
        return f"weight group size {gs} is neither -1 nor a multiple of 128"
    if k % 256 or a_codes.dim() != 2 or a_codes.shape[1] != k or a_codes.shape[0] < 1:
        return f"K = {k} is not a multiple of 256 or not the codes' width, or there are no tokens"
    if out_dtype not in (torch.float16, torch.bfloat16):
        return f"output dtype {out_dtype} is not fp16/bf16"
    if a_codes.dtype != torch.int8 or a_codes.stride(1) != 1 or a_codes.data_ptr() % 16 or a_codes.stride(0) % 16:
        return "activation codes are not int8 rows, 16-byte aligned, with unit column stride"
    if a_scales.dtype != torch.float32 or tuple(a_scales.shape) != (a_codes.shape[0], 1):
        return "activation scales are not float32 [M, 1]"
    if out is not None and (out.dtype != out_dtype or out.stride(1) != 1 or out.stride(0) < n
                            or tuple(out.shape) != (a_codes.shape[0], n)):
        return "out must be [M, N] of the output dtype with unit column stride"
    qweight, qparams, cs = tensors["qweight"], tensors["qparams"], tensors["channel_scales"]
    if cs.dtype != torch.float16 or tuple(cs.shape) != (n,):
        return "LiquidQuant channel scales are not fp16 [N]"
    if (qweight.dtype != torch.int32 or tuple(qweight.shape) != (n, k // 8) or qparams.dtype != torch.int32
            or qparams.dim() != 2 or qparams.shape[1] != n):
        return "packed LiquidQuant tensors are not int32 qweight [N, K/8] and qparams [groups, N]"
    packed = [qweight, qparams, cs]
    if not all(v.is_contiguous() and v.data_ptr() % 16 == 0 for v in packed):
        return "packed tensors are not contiguous and 16-byte aligned"
    # exactly sm_90, as the Gluon kernels: the launches need up to 186 KiB of shared memory a block (consumer Blackwell
    # gives 99 KiB), and the rule was measured on an H100 only
    problem = device_problem(a_codes, packed + [a_scales] + ([out] if out is not None else []), (9, 0),
                             "the cluster kernel is built for Hopper (compute capability 9.0)", exact=True)
    if problem:
        return problem
    tokens, split, stages, token_warps = launch_cfg
    name = cluster_kernel_name(_cluster_split(int(meta["in_features"]) // 256, split)[1], tokens, token_warps,
                               stages, out_dtype == torch.bfloat16)
    return compile_problem(device_index(a_codes), SOURCE, (name,),
                           "CUDA LiquidQuant cluster kernel")


def _cluster_split(n_tiles: int, split: int) -> tuple[int, int]:
    """(tiles per CTA, CTAs per cluster) for ``split`` asked on ``n_tiles`` 256-column tiles: :func:`.launch.split_plan`
    (no CTA without a tile), lowered further to a cluster size that has an instance (14 tiles asked in 8 come out as
    7 of 2, which becomes 4 of 4, 4, 4, 2)."""
    per, split = split_plan(n_tiles, split)
    while split not in CLUSTER_SPLITS:
        per, split = split_plan(n_tiles, split - 1)
    return per, split


def lqq_cluster_matmul(a_codes: torch.Tensor, a_scales: torch.Tensor, tensors: dict, meta: dict, tokens: int = 128,
                       split: int = 4, stages: int = 2, token_warps: int = 2, out: torch.Tensor | None = None,
                       out_dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """Y [M, N] (``out_dtype``, or ``out``'s) = dequant(A)·Ŵᵀ for int8 codes [M, K] with per-token float32 scales
    [M, 1] and a ``w4a8-lqq`` weight (module docstring): ``tokens`` (64 or 128) per CTA and 64 weight rows, over
    ``token_warps`` (2 or 4) × 2 warps; K split over a cluster of ``split`` CTAs (1, 2, 4 or 8, lowered by
    :func:`_cluster_split`); ``stages`` (2-4) tiles in flight. Bit for bit the unsplit Triton / Gluon LiquidQuant
    result. The caller checks :func:`lqq_cluster_problem`."""
    import numpy as np

    _check_launch(tokens, split, stages, token_warps)
    m, k = a_codes.shape
    n = int(meta["out_features"])
    qweight, qparams, cs = tensors["qweight"], tensors["qparams"], tensors["channel_scales"]
    n_tiles = k // 256
    per, split = _cluster_split(n_tiles, split)
    out = torch.empty(m, n, dtype=out_dtype, device=a_codes.device) if out is None else out
    dev = device_index(a_codes)
    fn, pdl = launch_form(dev, SOURCE, cluster_kernel_name(split, tokens, token_warps, stages,
                                                           out.dtype == torch.bfloat16))
    shared = cluster_shared_bytes(tokens, stages)
    allow_dynamic_shared(fn, dev, shared)
    hpg = groups_in_halves(meta, n_tiles)
    args = (np.uint64(a_codes.data_ptr()), np.uint64(a_scales.data_ptr()), np.int32(m), np.int64(a_codes.stride(0)),
            np.int64(a_scales.stride(0)), np.uint64(qweight.data_ptr()), np.uint64(qparams.data_ptr()),
            np.uint64(cs.data_ptr()), np.int32(n), np.int32(qweight.shape[1] * qweight.element_size()),
            np.int32(hpg), np.int32(group_shift(int(meta["group_size"]), hpg)), np.int32(qparams.shape[0]),
            np.uint64(out.data_ptr()), np.int64(out.stride(0)), np.int32(n_tiles), np.int32(per))
    grid = (-(-n // 64) * split, -(-m // tokens))
    launch(fn, pdl, dev, torch.cuda.current_stream(a_codes.device).cuda_stream, grid, (64 * token_warps,), args,
           shared)
    return out


__all__ = ["lqq_cluster_matmul", "lqq_cluster_problem"]
