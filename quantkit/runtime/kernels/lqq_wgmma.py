"""LiquidQuant W4A8 on Hopper with its dequantization overlapping its own tensor-core products (Gluon).

The Triton LiquidQuant kernel (:mod:`.int8_gemm`) dequantizes a 256-column weight tile into registers and
multiplies it with ``tl.dot``; Triton 3.6 waits for every int8 product whose operand sits in registers
(``wgmma.wait_group 0``) before the program dequantizes its next tile, so within a program the tensor cores
idle while the integer units work and vice versa (docs/BENCHMARKS.md). LiquidGEMM's ImFP pipeline (LiquidGEMM
Sec. 5) overlaps the two. This kernel does that in Gluon, where the waits are explicit:

* a program owns BN = 64 weight rows (one warpgroup, wgmma's M side) × BM tokens (wgmma's N side), the
  transposed product Y^T = W·X^T (LiquidGEMM Sec. 5.4);
* per 256-column tile, the lane loads its words directly in the register layout of wgmma's A operand, so the
  dequantized int8 planes need no shuffle: plane p of 4 consecutive words is 4 consecutive K positions — exactly
  the 4 bytes of one A-fragment register (k_width 4). The arithmetic is :data:`.dequant.ASM_I8`: (q·s + a) XOR
  0x80 on four int8 lanes per IMAD (LiquidGEMM Eq. 11-12);
* plane p multiplies activation columns 32p … 32p + 31 of the tile (:mod:`quantkit.formats.nibble_planes`): one
  k32 ``wgmma`` per plane, from an activation tile that ``cp.async`` brought into shared memory STAGES - 1 tiles
  ahead;
* the 8 products of tile t are issued asynchronously and the program waits only for those of tile t - 1 before
  dequantizing tile t + 1 — the overlap Triton's ``tl.dot`` does not allow;
* one int32 accumulator spans K (per-token activations, no per-group float scale, LiquidGEMM Sec. 4); the
  epilogue applies token scale × channel scale and stores fp16.

Requires K a multiple of 256 and per-token activation scales; :func:`lqq_wgmma_problem` says when it cannot run.
The pure-torch reference of the format is :func:`quantkit.runtime.kernels.reference.int8_reference`.
"""

from __future__ import annotations

import torch

from quantkit.runtime.kernels.dequant import _asm_i8
from quantkit.runtime.kernels.launch import groups_in_halves, split_plan
from quantkit.runtime.kernels.splitk import split_workspace

try:  # Gluon (Triton >= 3.5) and its Hopper ops; absent on CPU-only installs with older Triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait
    HAVE_GLUON = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    HAVE_GLUON = False

BN = 64  # weight rows per program: one warpgroup of wgmma's M = 64


if HAVE_GLUON:
    _ASM_I8 = gl.constexpr(_asm_i8())
    _CONSTRAINTS_I8 = gl.constexpr("=r," * 8 + ",".join(["r"] * 20))

    @gluon.jit
    def _copy_x(xs, x_ptrs, i, t_begin, t_end, STAGES: gl.constexpr):
        """Start the cp.async of activation tile t_begin + i (both 128-column halves) into ring slot i % STAGES;
        one commit group per call, empty past t_end, so wait_group counts stay uniform."""
        s = i % STAGES
        t = t_begin + i
        ok = t < t_end
        tt = gl.where(ok, t, t_begin)
        async_copy.async_copy_global_to_shared(xs.index(2 * s), x_ptrs + tt * 256, mask=ok)
        async_copy.async_copy_global_to_shared(xs.index(2 * s + 1), x_ptrs + tt * 256 + 128, mask=ok)
        async_copy.commit_group()

    @gluon.jit
    def _lqq_wgmma_kernel(a_ptr, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, ws_ptr, ticket_ptr, M, N, stride_am, stride_sm,
                          stride_om, w_row, n_tiles, tiles_per_split, hpg, groups, BM: gl.constexpr,
                          STAGES: gl.constexpr, SPLIT_K: gl.constexpr):
        pid_n = gl.program_id(0)
        pid_m = gl.program_id(1)
        pid_k = gl.program_id(2)
        t_begin = pid_k * tiles_per_split
        t_end = gl.minimum(t_begin + tiles_per_split, n_tiles)
        # no zero-trip path: its zeroed accumulator would merge with in-flight products, and ptxas then serializes
        # every wgmma of the kernel (C7515); the launch guarantees every split has a tile
        gl.assume(t_end > t_begin)
        BN_: gl.constexpr = 64
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, min(BM, 128), 32])
        a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
        x_l: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[4, 8], warps_per_cta=[4, 1],
                                             order=[1, 0])
        x_s: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
        xs = gl.allocate_shared_memory(gl.int8, [2 * STAGES, BM, 128], x_s)

        rn = pid_n * BN_ + gl.arange(0, BN_, layout=gl.SliceLayout(1, a_l))
        rn_in = gl.minimum(rn, N - 1)
        w_ptrs = w_ptr + rn_in[:, None] * w_row + gl.arange(0, 32, layout=gl.SliceLayout(0, a_l))[None, :]
        rm_x = gl.minimum(pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, x_l)), M - 1)
        x_ptrs = a_ptr + rm_x[:, None] * stride_am + gl.arange(0, 128, layout=gl.SliceLayout(0, x_l))[None, :]

        for i0 in gl.static_range(STAGES - 1):
            _copy_x(xs, x_ptrs, i0, t_begin, t_end, STAGES)
        acc = gl.zeros([BN_, BM], gl.int32, mma)
        words = gl.load(w_ptrs + t_begin * 32)
        p_lo = gl.load(p_ptr + gl.minimum((2 * t_begin) // hpg, groups - 1) * N + rn_in)
        p_hi = gl.load(p_ptr + gl.minimum((2 * t_begin + 1) // hpg, groups - 1) * N + rn_in)
        for t in range(t_begin, t_end):
            i = t - t_begin
            planes = gl.inline_asm_elementwise(
                _ASM_I8, _CONSTRAINTS_I8,
                [words, (p_lo & 0xFF)[:, None], (((p_lo >> 8) & 0xFF) * 0x01010101)[:, None], (p_hi & 0xFF)[:, None],
                 (((p_hi >> 8) & 0xFF) * 0x01010101)[:, None]],
                dtype=(gl.int8, ) * 8, is_pure=True, pack=4)
            # the next tile's words and group words load while this tile's products run
            tn = gl.minimum(t + 1, t_end - 1)
            words = gl.load(w_ptrs + tn * 32)
            p_lo = gl.load(p_ptr + gl.minimum((2 * tn) // hpg, groups - 1) * N + rn_in)
            p_hi = gl.load(p_ptr + gl.minimum((2 * tn + 1) // hpg, groups - 1) * N + rn_in)
            async_copy.wait_group(STAGES - 2)  # tile t's activations have landed (this thread's copies)
            gl.thread_barrier()  # ... and every other thread's
            fence_async_shared()  # generic-proxy writes before the async-proxy reads of wgmma
            slot = i % STAGES
            for p in gl.static_range(8):
                xb = xs.index(2 * slot + p // 4).slice(32 * (p % 4), 32, dim=1).permute((1, 0))
                acc = warpgroup_mma(planes[p], xb, acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=8, deps=(acc, ))  # tile t-1's products are done
            _copy_x(xs, x_ptrs, i + STAGES - 1, t_begin, t_end, STAGES)  # into tile t-1's slot
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        async_copy.wait_group(0)
        rm = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(0, mma))
        rn_o = pid_n * BN_ + gl.arange(0, BN_, layout=gl.SliceLayout(1, mma))
        sa = gl.load(sa_ptr + gl.minimum(rm, M - 1) * stride_sm)
        cs = gl.load(cs_ptr + gl.minimum(rn_o, N - 1)).to(gl.float32)
        y = acc.to(gl.float32) * sa[None, :] * cs[:, None]
        mask = (rm < M)[None, :] & (rn_o < N)[:, None]
        out_ptrs = out_ptr + rm[None, :] * stride_om + rn_o[:, None]
        if SPLIT_K == 1:
            gl.store(out_ptrs, y.to(gl.float16), mask=mask)
        else:
            # per-split slots and a ticket, as quantkit.runtime.kernels.splitk.store_tile: the last program of the
            # tile adds the slots in split order (deterministic), rows N apart in each slot of M·N
            ws_ptrs = ws_ptr + rm[None, :] * N + rn_o[:, None]
            gl.store(ws_ptrs + pid_k * (M * N), y, mask=mask)
            gl.thread_barrier()  # every warp's slot stores precede the ticket's release
            ticket = ticket_ptr + pid_m * gl.num_programs(0) + pid_n
            if gl.atomic_add(ticket, 1) == SPLIT_K - 1:
                total = gl.zeros([BN_, BM], gl.float32, mma)
                for s in gl.static_range(SPLIT_K):
                    total += gl.load(ws_ptrs + s * (M * N), mask=mask, other=0.0, cache_modifier=".cg")
                gl.store(out_ptrs, total.to(gl.float16), mask=mask)
                gl.atomic_xchg(ticket, 0)


def lqq_wgmma_problem(a_codes: torch.Tensor, a_scales: torch.Tensor, act_group_size: int, layout: str,
                      tensors: dict, meta: dict, out: torch.Tensor | None = None) -> str | None:
    """Why :func:`lqq_wgmma_matmul` cannot run this product (None: it can): it needs Gluon, a Hopper GPU
    (compute capability 9.0: wgmma), a ``w4a8-lqq`` weight with per-token activations (act_group_size -1),
    K a multiple of 256, int8 codes with unit column stride and 16-byte aligned rows, and an fp16 ``out`` with
    unit column stride."""
    k = int(meta["in_features"])
    if layout != "w4a8-lqq":
        return f"layout {layout} is not w4a8-lqq"
    if act_group_size != -1:
        return "activations are not per-token"
    if k % 256:
        return f"K = {k} is not a multiple of 256"
    if a_codes.stride(1) != 1 or a_codes.data_ptr() % 16 or a_codes.stride(0) % 16:
        return "activation rows are not 16-byte aligned with unit column stride"
    if out is not None and (out.dtype != torch.float16 or out.stride(1) != 1):
        return "out must be fp16 with unit column stride"
    if not HAVE_GLUON:
        return "this Triton has no Gluon"
    if not a_codes.is_cuda or torch.cuda.get_device_capability(a_codes.device) != (9, 0):
        return "not a Hopper (sm_90) GPU"
    return None


def lqq_wgmma_matmul(a_codes: torch.Tensor, a_scales: torch.Tensor, tensors: dict, meta: dict, bm: int = 128,
                     stages: int = 3, split_k: int = 1, out: torch.Tensor | None = None) -> torch.Tensor:
    """Y [M, N] fp16 = dequant(A)·Ŵᵀ for int8 codes [M, K] with per-token float32 scales [M, 1] and a
    ``w4a8-lqq`` weight (module docstring); ``bm`` tokens per program (32, 64 or 128), ``stages`` activation
    tiles in flight, ``split_k`` programs along K (fp32 slots summed in split order, :mod:`.splitk`). The caller
    checks :func:`lqq_wgmma_problem`. Same bits as the Triton LiquidQuant kernel with the same split (exact int32
    products, then (acc · token scale) · channel scale)."""
    m, k = a_codes.shape
    qweight, qparams, cs = tensors["qweight"], tensors["qparams"], tensors["channel_scales"]
    n = int(meta["out_features"])
    n_tiles = qweight.shape[1] // 32
    tiles_per_split, split = split_plan(n_tiles, split_k)
    out = torch.empty(m, n, dtype=torch.float16, device=a_codes.device) if out is None else out
    grid = (-(-n // BN), -(-m // bm), split)
    ws, tickets = split_workspace(a_codes.device, m * n, split, grid[0] * grid[1])
    _lqq_wgmma_kernel[grid](a_codes, a_scales, qweight, qparams, cs, out, ws, tickets, m, n, a_codes.stride(0),
                            a_scales.stride(0), out.stride(0), qweight.shape[1], n_tiles, tiles_per_split,
                            groups_in_halves(meta, n_tiles), qparams.shape[0], BM=bm, STAGES=stages,
                            SPLIT_K=split, num_warps=4)
    return out
