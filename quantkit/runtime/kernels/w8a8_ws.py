"""MixLLM W8A8 prefill on Hopper with a producer warp: the warp-specialized form of :mod:`.w8a8_wgmma` (Gluon),
built as :mod:`.lqq_ws` is for LiquidQuant (LiquidGEMM Sec. 5's shape: a load warp feeds compute warpgroups).

In :mod:`.w8a8_wgmma` every warp of a program also issues the TMA of the next K block, and the compiler puts CTA
barriers around that issue (four per block in the SASS); ncu had its warps at ~3.7 cycles per issued instruction
with two warps a scheduler (docs/BENCHMARKS.md, session 21). Here:

* the **producer** (one warp) walks the K blocks: waits until ring slot ``kb % STAGES`` is empty (mbarrier
  ``empty``), then starts the TMA of the [BM, 128] activation block and the [BN, 128] weight block, completing on
  mbarrier ``ready``;
* the **consumers** (the default partition: WG warpgroups of 64 tokens each, sharing the weight block) wait on
  ``ready``, issue the block's products into a fresh int32 accumulator, wait for them, release the slot (with two
  warpgroups after a barrier of the partition) and scale the block into the fp32 result — the fast I2F of MixLLM
  Sec. 3.3 / Fig. 4 times activation scale × weight scale, the scales loaded one block ahead as in
  :mod:`.w8a8_wgmma`.

The same sums in the same order as :mod:`.w8a8_wgmma` and the Triton W8A8 kernel, so the same bits. Requirements
are :func:`.w8a8_wgmma.w8a8_wgmma_problem`'s. No CPU interpreter runs Gluon; the GPU tests compare it bit for bit
with the Triton kernel (reference: :func:`quantkit.runtime.kernels.reference.int8_reference`).
"""

from __future__ import annotations

import torch

from quantkit.runtime.kernels.jit import check_device
from quantkit.runtime.kernels.launch import act_groups_in_halves, groups_in_halves
from quantkit.runtime.kernels.wgmma_common import HAVE_GLUON, PRODUCER_REGS, ws_maxnreg

KERNEL = "w8a8_ws"

if HAVE_GLUON:
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from quantkit.runtime.kernels.w8a8_wgmma import _acc_layout, _block_scales, _i2f
    from quantkit.runtime.kernels.wgmma_common import (cta_barrier, gl, gluon, mbarrier, ring_barriers, tma_load,
                                                       warpgroup_mma, warpgroup_mma_wait)

    PRODUCER_REGS_C = gl.constexpr(PRODUCER_REGS)  # Triton kernels read only constexpr globals

    @gluon.jit
    def _producer(x_desc, w_desc, xs, ws, ready, empty, off_m, off_n, n_blocks, STAGES: gl.constexpr):
        """K block kb's activation and weight blocks into ring slot kb % STAGES once the consumers released it."""
        for kb in range(n_blocks):
            s = kb % STAGES
            # the ring's mbarriers start with phase 1 complete: the first STAGES waits pass at once
            mbarrier.wait(empty.index(s), ((kb // STAGES) & 1) ^ 1)
            bar = ready.index(s)
            mbarrier.expect(bar, x_desc.block_type.nbytes + w_desc.block_type.nbytes)
            tma_load(x_desc, [off_m, kb * 128], bar, xs.index(s))
            tma_load(w_desc, [off_n, kb * 128], bar, ws.index(s))

    @gluon.jit
    def _consumers(xs, ws, ready, empty, sa_ptr, sw_ptr, out_ptr, M, N, stride_sm, stride_om, act_hpg, act_groups,
                   hpg, groups, off_m, off_n, n_blocks, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr,
                   WG: gl.constexpr, EVEN_N: gl.constexpr):
        """Multiply, scale and store the program's [BM, BN] output tile (module docstring)."""
        acc_l: gl.constexpr = _acc_layout(BM, BN, 4 * WG)
        rm = off_m + gl.arange(0, BM, layout=gl.SliceLayout(1, acc_l))
        rn = off_n + gl.arange(0, BN, layout=gl.SliceLayout(0, acc_l))
        rm_in = gl.minimum(rm, M - 1)
        acc = gl.zeros([BM, BN], gl.float32, acc_l)
        part = gl.zeros([BM, BN], gl.int32, acc_l)
        sa, sw = _block_scales(sa_ptr, sw_ptr, 0, rm_in, rn, N, stride_sm, act_hpg, act_groups, hpg, groups, EVEN_N)
        for kb in range(n_blocks):
            s = kb % STAGES
            mbarrier.wait(ready.index(s), (kb // STAGES) & 1)
            part = warpgroup_mma(xs.index(s), ws.index(s).permute((1, 0)), part, use_acc=False, is_async=True)
            sa_next, sw_next = _block_scales(sa_ptr, sw_ptr, gl.minimum(kb + 1, n_blocks - 1), rm_in, rn, N,
                                             stride_sm, act_hpg, act_groups, hpg, groups, EVEN_N)
            part = warpgroup_mma_wait(num_outstanding=0, deps=(part, ))
            if WG > 1:  # each warpgroup waited for its own products: meet before the slot is released
                cta_barrier()
            mbarrier.arrive(empty.index(s), count=1)
            acc += _i2f(part) * (sw[None, :] * sa[:, None])
            sa, sw = sa_next, sw_next
        mask = (rm < M)[:, None] & (rn < N)[None, :]
        gl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)

    @gluon.jit
    def _w8a8_ws_kernel(x_desc, w_desc, sa_ptr, sw_ptr, out_ptr, M, N, K, stride_sm, stride_om, act_hpg, act_groups,
                        hpg, groups, BM: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr,
                        WG: gl.constexpr, EVEN_N: gl.constexpr):
        # grouped program order: GROUP_M token tiles share each weight tile while it is in L2
        pid = gl.program_id(0)
        num_m = gl.cdiv(M, BM)
        num_n = gl.cdiv(N, BN)
        in_group = GROUP_M * num_n
        first_m = (pid // in_group) * GROUP_M
        size_m = gl.minimum(num_m - first_m, GROUP_M)
        pid_m = first_m + (pid % in_group) % size_m
        pid_n = (pid % in_group) // size_m
        off_m = pid_m * BM
        off_n = pid_n * BN
        n_blocks = gl.cdiv(K, 128)
        gl.assume(n_blocks > 0)
        xs = gl.allocate_shared_memory(gl.int8, [STAGES, BM, 128], x_desc.layout)
        ws = gl.allocate_shared_memory(gl.int8, [STAGES, BN, 128], w_desc.layout)
        ready, empty = ring_barriers(STAGES)
        gl.warp_specialize([
            (_consumers, (xs, ws, ready, empty, sa_ptr, sw_ptr, out_ptr, M, N, stride_sm, stride_om, act_hpg,
                          act_groups, hpg, groups, off_m, off_n, n_blocks, BM, BN, STAGES, WG, EVEN_N)),
            (_producer, (x_desc, w_desc, xs, ws, ready, empty, off_m, off_n, n_blocks, STAGES)),
        ], [1], [PRODUCER_REGS_C])


def w8a8_ws_matmul(a_codes: torch.Tensor, a_scales: torch.Tensor, act_group_size: int, tensors: dict, meta: dict,
                   bn: int = 128, stages: int = 4, warpgroups: int = 1, per_sm: int = 2,
                   out: torch.Tensor | None = None, out_dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """Y [M, N] = dequant(A)·Ŵᵀ for int8 codes [M, K] with float32 scales [M, G] and a ``w8`` weight, as
    :func:`.w8a8_wgmma.w8a8_wgmma_matmul` with the scales a block ahead (same bits), with a producer warp bringing
    both operands over TMA (module docstring): 64·``warpgroups`` tokens × ``bn`` weight rows per program,
    ``stages`` K blocks in flight, ``per_sm`` programs meant to share an SM (sets the register budget,
    :func:`.wgmma_common.ws_maxnreg`). The caller checks :func:`.w8a8_wgmma.w8a8_wgmma_problem`."""
    if bn not in (64, 128) or warpgroups not in (1, 2) or stages not in (2, 3, 4, 5, 6) or per_sm not in (1, 2):
        raise ValueError(f"bn must be 64 or 128, warpgroups 1-2, stages 2-6 and per_sm 1-2; got {bn}, {warpgroups}, "
                         f"{stages}, {per_sm}")
    m, k = a_codes.shape
    qweight, scales = tensors["qweight"], tensors["scales"]
    check_device(a_codes, a_scales, qweight, scales)
    n = int(meta["out_features"])
    bm = 64 * warpgroups
    out = torch.empty(m, n, dtype=out_dtype, device=a_codes.device) if out is None else out
    x_layout = gl.NVMMASharedLayout.get_default_for([bm, 128], gl.int8)
    w_layout = gl.NVMMASharedLayout.get_default_for([bn, 128], gl.int8)
    x_desc = TensorDescriptor(a_codes, [m, k], [a_codes.stride(0), 1], [bm, 128], x_layout)
    # the weight's columns past K are zero padding (nibble_planes.padded_k): the descriptor stops at K
    w_desc = TensorDescriptor(qweight, [n, k], [qweight.stride(0), 1], [bn, 128], w_layout)
    n_tiles = qweight.shape[1] // 256
    grid = (-(-m // bm) * -(-n // bn),)
    _w8a8_ws_kernel[grid](x_desc, w_desc, a_scales, scales, out, m, n, k, a_scales.stride(0), out.stride(0),
                          act_groups_in_halves(act_group_size, k), a_scales.shape[1], groups_in_halves(meta, n_tiles),
                          scales.shape[0], BM=bm, BN=bn, STAGES=stages, GROUP_M=8, WG=warpgroups, EVEN_N=n % bn == 0,
                          num_warps=4 * warpgroups, maxnreg=ws_maxnreg(warpgroups, per_sm))
    return out


__all__ = ["KERNEL", "w8a8_ws_matmul"]
