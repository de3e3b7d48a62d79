"""Shared pieces of the Gluon kernels for Hopper's wgmma (:mod:`.lqq_wgmma`, :mod:`.group_wgmma`): the import
guard, the activation-tile ring (cp.async into 128-byte-swizzled shared memory), the output store (direct,
scattered to a partition's columns, or through split-K slots as :mod:`.splitk`), and the checks every such
launch needs.

Why Gluon: Triton 3.6's ``tl.dot`` waits for each int8 product whose operand sits in registers before the
program goes on (``wgmma.wait_group 0``), so a kernel that dequantizes weights in registers cannot overlap that
work with its own tensor-core products; Gluon exposes ``warpgroup_mma(is_async=True)`` and
``warpgroup_mma_wait(num_outstanding)`` (docs/BENCHMARKS.md). Every kernel here is one warpgroup: a program owns
``BN`` = 64 weight rows (wgmma's M side) × BM tokens (its N side), the transposed product Y^T = W·X^T
(LiquidGEMM Sec. 5.4), and reads its weights straight into the register layout of wgmma's A operand.
"""

from __future__ import annotations

import torch

try:  # Gluon (Triton >= 3.5) and its Hopper ops; absent with older Triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait
    HAVE_GLUON = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    HAVE_GLUON = False

BN = 64  # weight rows per program: one warpgroup of wgmma's M = 64
OUT_DTYPES = (torch.float16, torch.bfloat16)

__all__ = ["BN", "HAVE_GLUON", "OUT_DTYPES", "hopper_problem"]


def hopper_problem(a_codes: torch.Tensor, k: int, out: torch.Tensor | None, out_dtype: torch.dtype,
                   k_multiple: int = 256) -> str | None:
    """Why a Gluon wgmma kernel cannot run on these activations (None: it can): K a multiple of ``k_multiple``
    (256 for the cp.async kernels' whole tiles, 16 for TMA), int8 codes with unit column stride and 16-byte aligned
    rows (cp.async and TMA move 16 bytes), an fp16/bf16 output with unit column stride, Gluon, and a Hopper GPU
    (compute capability 9.0: wgmma). The cheap shape checks come first, so they are testable without a GPU."""
    if k % k_multiple:
        return f"K = {k} is not a multiple of {k_multiple}"
    if a_codes.stride(1) != 1 or a_codes.data_ptr() % 16 or a_codes.stride(0) % 16:
        return "activation rows are not 16-byte aligned with unit column stride"
    dtype = out.dtype if out is not None else out_dtype
    if dtype not in OUT_DTYPES or (out is not None and out.stride(1) != 1):
        return "the output must be fp16 or bf16 with unit column stride"
    if not HAVE_GLUON:
        return "this Triton has no Gluon"
    if not a_codes.is_cuda or torch.cuda.get_device_capability(a_codes.device) != (9, 0):
        return "not a Hopper (sm_90) GPU"
    return None


if HAVE_GLUON:
    @gluon.constexpr_function
    def mma_layout(BM):
        """Accumulator layout of a [64, BM] wgmma tile of one warpgroup (int8: instruction k 32, n <= 128)."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, min(BM, 128), 32])

    @gluon.constexpr_function
    def a_layout(BM):
        """Register layout of the int8 A operand of that tile (4 consecutive K bytes per 32-bit register)."""
        return gl.DotOperandLayout(operand_index=0, parent=mma_layout(BM), k_width=4)

    ROWS = gl.constexpr(BN)  # BN inside kernels

    # an activation half-tile [BM, 128] as cp.async reads it (16 bytes a thread) and as it sits in shared memory
    X_LAYOUT = gl.constexpr(gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[4, 8], warps_per_cta=[4, 1],
                                             order=[1, 0]))
    X_SMEM = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2))

    @gluon.jit
    def copy_x(xs, x_ptrs, i, t_begin, t_end, STAGES: gl.constexpr):
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
    def wait_x(STAGES: gl.constexpr):
        """Wait until the oldest activation tile in flight has landed for every thread and is visible to wgmma."""
        async_copy.wait_group(STAGES - 2)  # this thread's copies
        gl.thread_barrier()  # ... and every other thread's
        fence_async_shared()  # generic-proxy writes before the async-proxy reads of wgmma

    @gluon.jit
    def x_half(xs, i, h: gl.constexpr, STAGES: gl.constexpr):
        """Shared-memory view [128, BM] (K-major B operand) of half h of the i-th tile of the ring."""
        return xs.index(2 * (i % STAGES) + h).permute((1, 0))

    @gluon.jit
    def store_tile(out_ptr, ws_ptr, ticket_ptr, y, rm, rn, cols, M, N, stride_om, stride_wm, pid_k,
                   SPLIT_K: gl.constexpr):
        """Write a finished fp32 tile y [64, BM] (rows rn of the partition, tokens rm) to output columns ``cols``:
        directly, or through split-K slot pid_k of the workspace, the last program of the tile adding the slots in
        split order (:func:`quantkit.runtime.kernels.splitk.store_tile`, the same bits)."""
        mask = (rm < M)[None, :] & (rn < N)[:, None]
        out_ptrs = out_ptr + rm[None, :] * stride_om + cols[:, None]
        if SPLIT_K == 1:
            gl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=mask)
        else:
            ws_ptrs = ws_ptr + rm[None, :] * stride_wm + rn[:, None]
            gl.store(ws_ptrs + pid_k * (M * stride_wm), y, mask=mask)
            gl.thread_barrier()  # every warp's slot stores precede the ticket's release
            ticket = ticket_ptr + gl.program_id(1) * gl.num_programs(0) + gl.program_id(0)
            if gl.atomic_add(ticket, 1) == SPLIT_K - 1:
                total = gl.full(y.shape, 0.0, gl.float32, y.type.layout)
                for s in gl.static_range(SPLIT_K):
                    total += gl.load(ws_ptrs + s * (M * stride_wm), mask=mask, other=0.0, cache_modifier=".cg")
                gl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=mask)
                gl.atomic_xchg(ticket, 0)

    __all__ += ["ROWS", "X_LAYOUT", "X_SMEM", "a_layout", "async_copy", "copy_x", "fence_async_shared", "gl", "gluon",
                "mma_layout", "store_tile", "wait_x", "warpgroup_mma", "warpgroup_mma_wait", "x_half"]
