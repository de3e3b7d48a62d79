"""MixLLM W8A8 (sym-8 g128 weights × A8 g128 activations) for prefill on Hopper: both int8 operands arrive in
shared memory by TMA and each 128-column group's product is scaled into the fp32 accumulator while other
warpgroups' products run (Gluon).

MixLLM scales every group of 128 columns by weight scale × activation scale (MixLLM Sec. 3.3, group-tile
accumulation), so a group's int32 sum must be finished, converted and scaled before it joins the fp32 result. The
Triton kernel (:mod:`quantkit.runtime.kernels.triton.int8_gemm`) holds the weight operand in registers and waits for
each group's products before its epilogue: 378 TOP/s at M = 4096, about half of cuBLAS fp16 (docs/BENCHMARKS.md). An
8-bit weight needs no dequantization, so here the orientation is the plain one, Y = X·Wᵀ: a program owns BM tokens ×
BN weight rows, a TMA ring brings [BM, 128] activation and [BN, 128] weight blocks (STAGES deep, one mbarrier each),
every block is one asynchronous wgmma into a fresh int32 accumulator, and its epilogue is the fast I2F of MixLLM
Sec. 3.3 / Fig. 4 ((sum + 0x4b400000) as fp32 − 1.5·2^23, exact while |sum| < 2^22) times activation scale × weight
scale. Within a warpgroup each block's epilogue waits for its products; the tiles the launch rule picks are one
warpgroup of 64 tokens, two programs per SM, so one program's products run while the other scales its block (the
per-block promotion of DeepGEMM on Hopper, without its strict ping-pong scheduling). With ``ahead`` (the rule's
launches) a block's group scales are loaded one block early: loaded after its products are issued, they have not
arrived when the products have (ncu: long-scoreboard stalls the largest share), so loading them early is 1.1× faster.
Launches of few programs split K: each split's program takes whole 256-column tiles, stores its fp32 tile in a slot
of :mod:`quantkit.runtime.kernels.triton.splitk`'s workspace, and the tile's last program adds the slots in split
order — the Triton kernel's scheme, so the same bits at the same split.

Same sums in the same order as the Triton kernel (block by block from zero, product of the two scales), so the
result is bit-identical to :func:`quantkit.runtime.kernels.triton.int8_gemm.int8_matmul` for a ``w8`` weight at the
same K split (the two launch rules may split differently: then the fp32 sums differ in their last bits).

Per-channel weights with per-token activations (the per-channel W8A8 recipes and a mixed LiquidQuant layer's int8
operand) have no block scale at all: there the wgmmas chain into one int32 accumulator over the split's K range,
one product group stays in flight while the next block loads, and the sum is converted and scaled once
(:func:`.triton.int8_gemm.per_channel_sum`; LiquidGEMM Sec. 4's epilogue), as the Triton kernel does for these
weights: the same bits again at the same K split.

Requires K and the row strides to be multiples of 16 bytes (TMA) and groups that are multiples of 128 columns (or
per-token activations): :func:`w8a8_wgmma_problem`. Reference: :func:`.reference.int8_reference`.
"""

from __future__ import annotations

import torch

from quantkit.runtime.kernels.jit import check_device
from quantkit.formats.nibble_planes import padded_k
from quantkit.runtime.kernels.triton.int8_gemm import per_channel_sum
from quantkit.runtime.kernels.triton.launch import act_groups_in_halves, groups_in_halves, split_plan
from quantkit.runtime.kernels.scratch import split_workspace
from quantkit.runtime.kernels.gluon_sm90.common import HAVE_GLUON, hopper_problem

KERNEL = "w8a8_wgmma"  # its name for hopper_problem / launch_or_decline

if HAVE_GLUON:
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from quantkit.runtime.kernels.gluon_sm90.common import (cta_barrier, gl, gluon, mbarrier, sum_slots, tma_load,
                                                       warpgroup_mma, warpgroup_mma_wait)

    I2F_BIAS_INT = gl.constexpr(0x4B400000)  # bit pattern of 12582912.0 = 1.5·2^23 (MixLLM Sec. 3.3, Fig. 4)
    I2F_BIAS_FLOAT = gl.constexpr(12582912.0)

    @gluon.constexpr_function
    def _acc_layout(BM, BN, num_warps):
        """wgmma accumulator layout of a [BM, BN] tile: warps stacked along the tokens (16 rows each)."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BN, 32])

    @gluon.jit
    def _load_block(x_desc, w_desc, xs, ws, bars, i, kb, off_m, off_n, STAGES: gl.constexpr):
        """Start the TMA of K block kb, the program's i-th, of the activations and weights into ring slot
        i % STAGES."""
        s = i % STAGES
        mbarrier.expect(bars.index(s), x_desc.block_type.nbytes + w_desc.block_type.nbytes)
        tma_load(x_desc, [off_m, kb * 128], bars.index(s), xs.index(s))
        tma_load(w_desc, [off_n, kb * 128], bars.index(s), ws.index(s))

    @gluon.jit
    def _mma_block(xs, ws, bars, i, part, STAGES: gl.constexpr):
        """Wait for the program's i-th K block's operands and start its products into a fresh int32
        accumulator."""
        slot = i % STAGES
        mbarrier.wait(bars.index(slot), (i // STAGES) & 1)
        return warpgroup_mma(xs.index(slot), ws.index(slot).permute((1, 0)), part, use_acc=False, is_async=True)

    @gluon.jit
    def _store_split(out_ptr, ws_ptr, ticket_ptr, acc, rm, rn, M, N, stride_om, SPLIT_K: gl.constexpr):
        """A K-split program's fp32 tile into its slot of the workspace (slots M·N apart, rows N apart); the tile's
        last program adds the slots in split order from zero and stores the sum
        (:mod:`quantkit.runtime.kernels.triton.splitk`'s scheme)."""
        mask = (rm < M)[:, None] & (rn < N)[None, :]
        offs = rm[:, None] * N + rn[None, :]
        gl.store(ws_ptr + gl.program_id(1) * (M * N) + offs, acc, mask=mask)
        cta_barrier()  # every warp's slot stores precede the ticket's release
        ticket = ticket_ptr + gl.program_id(0)
        if gl.atomic_add(ticket, 1) == SPLIT_K - 1:
            total = sum_slots(gl.zeros_like(acc), ws_ptr + offs, mask, M * N, SPLIT_K)
            gl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], total.to(out_ptr.dtype.element_ty),
                     mask=mask)
            gl.atomic_xchg(ticket, 0)

    @gluon.jit
    def _block_scales(sa_ptr, sw_ptr, kb, rm_in, rn, N, stride_sm, act_hpg, act_groups, hpg, groups,
                      EVEN_N: gl.constexpr):
        """(activation scales [BM], weight scales [BN]) of K block kb (MixLLM Sec. 3.3 step 2). The weight scales
        are addressed from the tile's first row, unclamped, so each thread's adjacent pairs load as one 8-byte
        access from one base register (a clamp per column costs two loads and ~60 address instructions per
        block); the mask only where N is not a multiple of the tile."""
        sa = gl.load(sa_ptr + rm_in * stride_sm + gl.minimum(kb // act_hpg, act_groups - 1))
        row = sw_ptr + gl.minimum(kb // hpg, groups - 1) * N
        if EVEN_N:
            sw = gl.load(row + rn)
        else:
            sw = gl.load(row + rn, mask=rn < N, other=0.0)
        return sa, sw

    @gluon.jit
    def _i2f(part):
        """Exact float value of an int32 block sum (|sum| < 2^22) by the magic-number conversion."""
        return (part + I2F_BIAS_INT).to(gl.float32, bitcast=True) - I2F_BIAS_FLOAT

    @gluon.jit
    def _w8a8_wgmma_kernel(x_desc, w_desc, sa_ptr, sw_ptr, out_ptr, ws_ptr, ticket_ptr, M, N, K, stride_sm,
                           stride_om, act_hpg, act_groups, hpg, groups, blocks_per_split, BM: gl.constexpr,
                           BN: gl.constexpr, STAGES: gl.constexpr, GROUP_M: gl.constexpr, EVEN_N: gl.constexpr,
                           AHEAD: gl.constexpr, SPLIT_K: gl.constexpr, PER_CHANNEL: gl.constexpr,
                           num_warps: gl.constexpr):
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
        # a K-split launch: program axis 1 takes blocks kb_begin … kb_end − 1 (whole 256-column tiles,
        # launch.split_plan: no split is empty)
        n_blocks = gl.cdiv(K, 128)
        kb_begin = gl.program_id(1) * blocks_per_split
        kb_end = gl.minimum(kb_begin + blocks_per_split, n_blocks)
        gl.assume(kb_end > kb_begin)

        acc_l: gl.constexpr = _acc_layout(BM, BN, num_warps)
        xs = gl.allocate_shared_memory(gl.int8, [STAGES, BM, 128], x_desc.layout)
        ws = gl.allocate_shared_memory(gl.int8, [STAGES, BN, 128], w_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(bars.index(i), count=1)
        for i0 in gl.static_range(STAGES - 1):
            if kb_begin + i0 < kb_end:
                _load_block(x_desc, w_desc, xs, ws, bars, i0, kb_begin + i0, off_m, off_n, STAGES)

        rm = off_m + gl.arange(0, BM, layout=gl.SliceLayout(1, acc_l))
        rn = off_n + gl.arange(0, BN, layout=gl.SliceLayout(0, acc_l))
        rm_in = gl.minimum(rm, M - 1)
        if PER_CHANNEL:
            # one scale per token and per weight row: the int32 sum spans the split's K range (exact while
            # |sum| < 2^31: K·128² < 2^31, per_channel_sum) and is scaled once; block i + STAGES - 1 is loaded
            # into the slot of block i - 1 once that block's products are done (one product group in flight)
            part = gl.zeros([BM, BN], gl.int32, acc_l)
            for kb in range(kb_begin, kb_end):
                rel = kb - kb_begin
                slot = rel % STAGES
                mbarrier.wait(bars.index(slot), (rel // STAGES) & 1)
                part = warpgroup_mma(xs.index(slot), ws.index(slot).permute((1, 0)), part, use_acc=True,
                                     is_async=True)
                part = warpgroup_mma_wait(num_outstanding=1, deps=(part, ))
                if kb + STAGES - 1 < kb_end:
                    _load_block(x_desc, w_desc, xs, ws, bars, rel + STAGES - 1, kb + STAGES - 1, off_m, off_n,
                                STAGES)
            part = warpgroup_mma_wait(num_outstanding=0, deps=(part, ))
            sa, sw = _block_scales(sa_ptr, sw_ptr, kb_begin, rm_in, rn, N, stride_sm, act_hpg, act_groups, hpg,
                                   groups, EVEN_N)
            acc = (part.to(gl.float32) * sa[:, None]) * sw[None, :]  # the Triton kernel's order: its bits
        else:
            acc = gl.zeros([BM, BN], gl.float32, acc_l)
            part = gl.zeros([BM, BN], gl.int32, acc_l)
            if AHEAD:
                sa, sw = _block_scales(sa_ptr, sw_ptr, kb_begin, rm_in, rn, N, stride_sm, act_hpg, act_groups,
                                       hpg, groups, EVEN_N)
            for kb in range(kb_begin, kb_end):
                rel = kb - kb_begin
                # block kb + STAGES - 1 into the slot block kb - 1 left (its products were waited for)
                if kb + STAGES - 1 < kb_end:
                    _load_block(x_desc, w_desc, xs, ws, bars, rel + STAGES - 1, kb + STAGES - 1, off_m, off_n,
                                STAGES)
                part = _mma_block(xs, ws, bars, rel, part, STAGES)
                if AHEAD:
                    # the next block's scales load while this block's products run and it is scaled: a whole
                    # iteration to arrive (the last iteration reloads its own)
                    sa_next, sw_next = _block_scales(sa_ptr, sw_ptr, gl.minimum(kb + 1, kb_end - 1), rm_in, rn,
                                                     N, stride_sm, act_hpg, act_groups, hpg, groups, EVEN_N)
                else:
                    # the block's scales load while its products run
                    sa, sw = _block_scales(sa_ptr, sw_ptr, kb, rm_in, rn, N, stride_sm, act_hpg, act_groups,
                                           hpg, groups, EVEN_N)
                part = warpgroup_mma_wait(num_outstanding=0, deps=(part, ))
                acc += _i2f(part) * (sw[None, :] * sa[:, None])
                if AHEAD:
                    sa, sw = sa_next, sw_next
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(i))
        if SPLIT_K == 1:
            mask = (rm < M)[:, None] & (rn < N)[None, :]
            gl.store(out_ptr + rm[:, None] * stride_om + rn[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)
        else:
            _store_split(out_ptr, ws_ptr, ticket_ptr, acc, rm, rn, M, N, stride_om, SPLIT_K)


def w8a8_wgmma_problem(a_codes: torch.Tensor, act_group_size: int, layout: str, meta: dict,
                       out: torch.Tensor | None = None, out_dtype: torch.dtype = torch.float16) -> str | None:
    """Why :func:`w8a8_wgmma_matmul` cannot run (None: it can): a ``w8`` weight with 128-column groups (or
    per-channel), activation groups of a multiple of 128 columns or per-token, then
    :func:`quantkit.runtime.kernels.gluon_sm90.common.hopper_problem` with TMA's 16-byte rule for K."""
    if layout != "w8":
        return f"layout {layout} is not w8"
    gs = int(meta["group_size"])
    if (gs != -1 and gs % 128) or (act_group_size != -1 and act_group_size % 128):
        return "groups are not multiples of 128 columns"
    return hopper_problem(a_codes, a_codes.shape[1], out, out_dtype, KERNEL, k_multiple=16)


def w8a8_wgmma_matmul(a_codes: torch.Tensor, a_scales: torch.Tensor, act_group_size: int, tensors: dict,
                      meta: dict, bm: int = 64, bn: int = 128, stages: int = 4, num_warps: int = 4,
                      ahead: bool = False, split_k: int = 1, out: torch.Tensor | None = None,
                      out_dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """Y [M, N] = dequant(A)·Ŵᵀ for int8 codes [M, K] with float32 scales [M, G] and a ``w8`` weight (module
    docstring); ``bm`` tokens × ``bn`` weight rows per program, ``stages`` K blocks in flight, ``num_warps`` 4 or
    8 (one or two warpgroups along the tokens; ``bm`` a multiple of 16·num_warps), ``ahead``: each block's scales
    loaded during the block before; ``split_k`` programs along K (whole 256-column tiles each, fp32 slots added in
    split order, :mod:`quantkit.runtime.kernels.triton.splitk`). The caller checks :func:`w8a8_wgmma_problem`."""
    if bm % (16 * num_warps) or bn not in (64, 128):
        raise ValueError(f"tile {bm}x{bn} with {num_warps} warps: BM must be a multiple of 16·warps, BN 64 or 128")
    m, k = a_codes.shape
    qweight, scales = tensors["qweight"], tensors["scales"]
    check_device(a_codes, a_scales, qweight, scales)
    n = int(meta["out_features"])
    out = torch.empty(m, n, dtype=out_dtype, device=a_codes.device) if out is None else out
    x_layout = gl.NVMMASharedLayout.get_default_for([bm, 128], gl.int8)
    w_layout = gl.NVMMASharedLayout.get_default_for([bn, 128], gl.int8)
    x_desc = TensorDescriptor(a_codes, [m, k], [a_codes.stride(0), 1], [bm, 128], x_layout)
    # the weight's columns past K are zero padding (nibble_planes.padded_k): the descriptor stops at K
    w_desc = TensorDescriptor(qweight, [n, k], [qweight.stride(0), 1], [bn, 128], w_layout)
    n_tiles = qweight.shape[1] // 256
    # K's own tiles: a weight stored wider than padded_k(K) must not shorten the last split's block range
    tiles_per_split, split = split_plan(-(-k // 256), split_k)
    grid = (-(-m // bm) * -(-n // bn), split)
    ws, tickets = split_workspace(a_codes.device, m * n, split, grid[0])
    _w8a8_wgmma_kernel[grid](x_desc, w_desc, a_scales, scales, out, ws, tickets, m, n, k, a_scales.stride(0),
                             out.stride(0), act_groups_in_halves(act_group_size, k), a_scales.shape[1],
                             groups_in_halves(meta, n_tiles), scales.shape[0], 2 * tiles_per_split, BM=bm, BN=bn,
                             STAGES=stages, GROUP_M=8, EVEN_N=n % bn == 0, AHEAD=ahead, SPLIT_K=split,
                             PER_CHANNEL=per_channel_sum(act_group_size, scales.shape[0], padded_k(k)),
                             num_warps=num_warps)
    return out
