"""LiquidQuant W4A8 on Hopper with its dequantization overlapping tensor-core products (Gluon).

The Triton LiquidQuant kernel (:mod:`quantkit.runtime.kernels.triton.int8_gemm`) dequantizes a 256-column weight
tile into registers and multiplies it with ``tl.dot``; Triton 3.6 waits for every int8 product whose operand sits in
registers (``wgmma.wait_group 0``) before the program dequantizes its next tile, so within a program the tensor cores
idle while the integer units work and vice versa (docs/BENCHMARKS.md). LiquidGEMM's ImFP pipeline (LiquidGEMM
Sec. 5) overlaps the two. This kernel does that in Gluon, where the waits are explicit — across warpgroups (two
per program, or programs sharing an SM), not within one (below):

* a program owns BN = 64 weight rows per warpgroup (wgmma's M side; one warpgroup, or two sharing every
  activation tile — a launch config) × BM tokens (wgmma's N side), the
  transposed product Y^T = W·X^T (LiquidGEMM Sec. 5.4), optionally plus a tail tile of BT = 32/64 more tokens
  that multiplies the same dequantized planes into a second accumulator — a program dequantizes its weight slice
  once whatever its token count, so M = 160 runs one 128 + 32 program per row tile rather than five of 32
  (Triton tensors are powers of two; the tail is how a 96/160/192-token tile is written);
* per 256-column tile, the lane loads its words directly in the register layout of wgmma's A operand, so the
  dequantized int8 planes need no shuffle: plane p of 4 consecutive words is 4 consecutive K positions — exactly
  the 4 bytes of one A-fragment register (k_width 4). The arithmetic is
  :data:`quantkit.runtime.kernels.triton.dequant.ASM_I8`: (q·s + a) XOR 0x80 on four int8 lanes per IMAD (LiquidGEMM
  Eq. 11-12);
* plane p multiplies activation columns 32p … 32p + 31 of the tile (:mod:`quantkit.formats.nibble_planes`): one
  k32 ``wgmma`` per plane, from an activation tile that ``cp.async`` brought into shared memory STAGES - 1 tiles
  ahead — as two copies of 128 columns, or one (:func:`one_copy_per_tile`: Triton puts a CTA barrier before each);
* the 8 products of tile t are issued asynchronously and waited for before tile t + 1 is dequantized: ptxas does
  not keep a register A operand alive while its wgmma runs, so overlapping one tile's products with the next tile's
  dequantization inside a warpgroup lets it reuse those registers and return wrong sums (docs/BENCHMARKS.md); the
  overlap comes from the other warpgroup or program on the SM. The unsplit 128-token launches run
  :mod:`quantkit.runtime.kernels.gluon_sm90.lqq_ws` instead (a TMA producer warp);
* one int32 accumulator spans K (per-token activations, no per-group float scale, LiquidGEMM Sec. 4); the
  epilogue applies token scale × channel scale and stores fp16.

Requires K a multiple of 256 and per-token activation scales; :func:`lqq_wgmma_problem` says when it cannot run.
Shared Gluon pieces (activation ring, split-K store, launch checks): :mod:`quantkit.runtime.kernels.gluon_sm90.common`.
The pure-torch reference of the format is :func:`quantkit.runtime.kernels.reference.int8_reference`.
"""

from __future__ import annotations

import torch

from quantkit.runtime.kernels.triton.dequant import ASM_I8_TEXT, CONSTRAINTS_I8_TEXT
from quantkit.runtime.kernels.jit import check_device
from quantkit.runtime.kernels.triton.launch import groups_in_halves, split_plan
from quantkit.runtime.kernels.scratch import split_workspace
from quantkit.runtime.kernels.gluon_sm90.common import BN, HAVE_GLUON, hopper_problem

KERNEL = "lqq_wgmma"  # its name for hopper_problem / launch_or_decline

if HAVE_GLUON:
    from quantkit.runtime.kernels.gluon_sm90.common import (X_SMEM, a_layout, async_copy, cta_barrier, gl, gluon, issue_x,
                                                       load_words, mma_layout, stacked_int8_view, store_split_pair,
                                                       store_tile, wait_x, warpgroup_mma, warpgroup_mma_wait, x_layout,
                                                       x_tile_ptrs)

    ASM_I8 = gl.constexpr(ASM_I8_TEXT)
    CONSTRAINTS_I8 = gl.constexpr(CONSTRAINTS_I8_TEXT)

    @gluon.jit
    def planes_wgmma(words, s_lo, a_lo, s_hi, a_hi):
        """The 8 int8 planes [rows, 32] of a word tile in the A-operand layout of ``words`` (LiquidGEMM Eq. 11-12,
        :data:`quantkit.runtime.kernels.triton.dequant.ASM_I8`); s_*, a_* int32 [rows] per-row multiplier and offset
        of each half-tile."""
        return gl.inline_asm_elementwise(
            ASM_I8, CONSTRAINTS_I8,
            [words, s_lo[:, None], (a_lo * 0x01010101)[:, None], s_hi[:, None], (a_hi * 0x01010101)[:, None]],
            dtype=(gl.int8, ) * 8, is_pure=True, pack=4)

    @gluon.jit
    def multiply_tile(planes, xs, xt, base, acc, acc_t, BT: gl.constexpr, WG: gl.constexpr):
        """The 8 k32 products of a tile's int8 planes [64·WG, 32] against activation slices ``base`` and ``base`` + 1
        of ``xs`` (plane p: columns 32p … 32p + 31) — and, with a tail tile of BT tokens, the same planes against
        ``xt`` into ``acc_t`` (one dequantization for BM + BT tokens) — issued asynchronously, then all waited for:
        ptxas does not keep a register A operand alive while its product runs, so no register may be written
        before this wait (waiting only for the previous tile's products lets it give the next tile's planes and
        addresses registers these products still read: wrong sums, docs/BENCHMARKS.md). Returns (acc, acc_t);
        without a tail (BT = 0) ``xt`` and ``acc_t`` are not used."""
        for p in gl.static_range(8):
            xb = xs.index(base + p // 4).slice(32 * (p % 4), 32, dim=1).permute((1, 0))
            acc = warpgroup_mma(planes[p], xb, acc, is_async=True)
            if BT > 0:
                xtb = xt.index(base + p // 4).slice(32 * (p % 4), 32, dim=1).permute((1, 0))
                acc_t = warpgroup_mma(gl.convert_layout(planes[p], a_layout(BT, WG)), xtb, acc_t, is_async=True)
        if BT > 0:
            acc, acc_t = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc_t))
        else:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        return acc, acc_t

    @gluon.jit
    def apply_scales(acc, sa_ptr, cs_ptr, rm, rn, M, N, stride_sm):
        """fp32 (acc · token scale) · channel scale of an int32 tile [rows, BM] (LiquidGEMM Sec. 4: per-token
        activation scales and the per-channel first-level weight scale, applied once after K)."""
        sa = gl.load(sa_ptr + gl.minimum(rm, M - 1) * stride_sm)
        cs = gl.load(cs_ptr + gl.minimum(rn, N - 1)).to(gl.float32)
        return acc.to(gl.float32) * sa[None, :] * cs[:, None]

    @gluon.jit
    def _lqq_wgmma_kernel(a_ptr, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, ws_ptr, ticket_ptr, M, N, stride_am, stride_sm,
                          stride_om, w_row, n_tiles, tiles_per_split, hpg, groups, BM: gl.constexpr,
                          STAGES: gl.constexpr, SPLIT_K: gl.constexpr, BT: gl.constexpr, WG: gl.constexpr,
                          COPIES: gl.constexpr):
        pid_n = gl.program_id(0)
        pid_m = gl.program_id(1)
        pid_k = gl.program_id(2)
        t_begin = pid_k * tiles_per_split
        t_end = gl.minimum(t_begin + tiles_per_split, n_tiles)
        # no zero-trip path: its zeroed accumulator would merge with in-flight products, and ptxas then serializes
        # every wgmma of the kernel (C7515); the launch guarantees every split has a tile
        gl.assume(t_end > t_begin)
        ROWS: gl.constexpr = 64 * WG
        mma: gl.constexpr = mma_layout(BM, WG)
        a_l: gl.constexpr = a_layout(BM, WG)
        x_l: gl.constexpr = x_layout(WG)
        TM: gl.constexpr = BM + BT  # tokens per program: a [ROWS, BM] tile and, if BT, a [ROWS, BT] tail tile
        xs = gl.allocate_shared_memory(gl.int8, [2 * STAGES, BM, 128], X_SMEM)

        rn = pid_n * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, a_l))
        rn_in = gl.minimum(rn, N - 1)
        w_ptrs = w_ptr + rn_in[:, None] * w_row + gl.arange(0, 32, layout=gl.SliceLayout(0, a_l))[None, :]
        # token rows past M read rows from the start again (their products are never stored): clamped to row
        # M - 1 instead, every program of a ragged last token tile read that one row, the same lines from all SMs
        if COPIES == 0:  # a tile's two halves in one copy, into the same bytes seen as [2·BM, 128] (issue_x)
            xs_in = stacked_int8_view(xs, STAGES, BM, X_SMEM)
            x_ptrs = x_tile_ptrs(a_ptr, pid_m * TM, M, stride_am, BM, 2, 128, x_l)
        else:
            xs_in = xs
            x_ptrs = x_tile_ptrs(a_ptr, pid_m * TM, M, stride_am, BM, 1, 128, x_l)
        if BT > 0:
            mma_t: gl.constexpr = mma_layout(BT, WG)
            xt = gl.allocate_shared_memory(gl.int8, [2 * STAGES, BT, 128], X_SMEM)
            if COPIES == 0:
                xt_in = stacked_int8_view(xt, STAGES, BT, X_SMEM)
                xt_ptrs = x_tile_ptrs(a_ptr, pid_m * TM + BM, M, stride_am, BT, 2, 128, x_l)
            else:
                xt_in = xt
                xt_ptrs = x_tile_ptrs(a_ptr, pid_m * TM + BM, M, stride_am, BT, 1, 128, x_l)

        for i0 in gl.static_range(STAGES - 1):
            issue_x(xs_in, x_ptrs, i0, t_begin, t_end, STAGES, COPIES, 128)
            if BT > 0:
                issue_x(xt_in, xt_ptrs, i0, t_begin, t_end, STAGES, COPIES, 128)
            async_copy.commit_group()
        acc = gl.zeros([ROWS, BM], gl.int32, mma)
        if BT > 0:
            acc_t = gl.zeros([ROWS, BT], gl.int32, mma_t)
        words, p_lo, p_hi = load_words(w_ptrs, p_ptr, t_begin, t_end, hpg, groups, N, rn_in)
        for t in range(t_begin, t_end):
            i = t - t_begin
            planes = planes_wgmma(words, p_lo & 0xFF, (p_lo >> 8) & 0xFF, p_hi & 0xFF, (p_hi >> 8) & 0xFF)
            # the next tile's words and group words load while this tile's products run (loading 2-3 tiles ahead
            # measured slower almost everywhere)
            words, p_lo, p_hi = load_words(w_ptrs, p_ptr, t + 1, t_end, hpg, groups, N, rn_in)
            wait_x(STAGES)
            slot = i % STAGES
            if BT > 0:
                acc, acc_t = multiply_tile(planes, xs, xt, 2 * slot, acc, acc_t, BT, WG)
            else:
                acc, _ = multiply_tile(planes, xs, xs, 2 * slot, acc, acc, BT, WG)
            # each warpgroup waits for its own products before the next wait_x, whose CTA barrier both pass, so tile
            # t-1's slot may already be free here; this barrier's removal has not been timed
            if WG > 1:
                cta_barrier()
            issue_x(xs_in, x_ptrs, i + STAGES - 1, t_begin, t_end, STAGES, COPIES, 128)  # into tile t-1's slot
            if BT > 0:
                issue_x(xt_in, xt_ptrs, i + STAGES - 1, t_begin, t_end, STAGES, COPIES, 128)
            async_copy.commit_group()
        # the empty copies issued past the last tile still write (zeros) into the ring, which the split-K ticket's
        # scratch may share: let them land first
        async_copy.wait_group(0)
        rm = pid_m * TM + gl.arange(0, BM, layout=gl.SliceLayout(0, mma))
        rn_o = pid_n * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, mma))
        y = apply_scales(acc, sa_ptr, cs_ptr, rm, rn_o, M, N, stride_sm)
        if BT == 0:
            store_tile(out_ptr, ws_ptr, ticket_ptr, y, rm, rn_o, M, N, stride_om, pid_k, SPLIT_K)
        else:
            rm_t = pid_m * TM + BM + gl.arange(0, BT, layout=gl.SliceLayout(0, mma_t))
            rn_t = pid_n * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, mma_t))
            if SPLIT_K == 1:  # one tile at a time: fewer live registers
                store_tile(out_ptr, ws_ptr, ticket_ptr, y, rm, rn_o, M, N, stride_om, pid_k, SPLIT_K)
                y_t = apply_scales(acc_t, sa_ptr, cs_ptr, rm_t, rn_t, M, N, stride_sm)
                store_tile(out_ptr, ws_ptr, ticket_ptr, y_t, rm_t, rn_t, M, N, stride_om, pid_k, SPLIT_K)
            else:
                y_t = apply_scales(acc_t, sa_ptr, cs_ptr, rm_t, rn_t, M, N, stride_sm)
                store_split_pair(out_ptr, ws_ptr, ticket_ptr, y, rm, rn_o, y_t, rm_t, rn_t, M, N, stride_om, pid_k,
                                 SPLIT_K)


def one_copy_per_tile(tail: int, warpgroups: int) -> int:
    """The ``COPIES`` of :func:`quantkit.runtime.kernels.gluon_sm90.common.issue_x` for a launch: 0 (a tile's two
    halves in one cp.async, so fewer CTA barriers a tile) for two warpgroups with a tail tile, where it measures 1.03×
    faster on an H100 (geometric mean of 24 points, 0.996-1.13×); else 2 (a copy per half): the single copy measures
    0.96-1.01× on one-warpgroup launches and 0.90-0.99× in the W4A16 kernel — why fewer barriers can be slower is not
    known."""
    return 0 if tail and warpgroups > 1 else 2


def lqq_wgmma_problem(a_codes: torch.Tensor, act_group_size: int, layout: str, meta: dict,
                      out: torch.Tensor | None = None, out_dtype: torch.dtype = torch.float16,
                      kernel: str | None = KERNEL) -> str | None:
    """Why :func:`lqq_wgmma_matmul` cannot run this product (None: it can): a ``w4a8-lqq`` weight with per-token
    activations (act_group_size -1), then :func:`quantkit.runtime.kernels.gluon_sm90.common.hopper_problem` for Gluon
    kernel ``kernel`` (this one, or :mod:`quantkit.runtime.kernels.gluon_sm90.lqq_ws`, which takes the same products
    and builds on its own; None: whether either could run, leaving
    :func:`quantkit.runtime.kernels.gluon_sm90.common.kernel_broken` to the caller)."""
    if layout != "w4a8-lqq":
        return f"layout {layout} is not w4a8-lqq"
    if act_group_size != -1:
        return "activations are not per-token"
    return hopper_problem(a_codes, int(meta["in_features"]), out, out_dtype, kernel)


def lqq_operands(a_codes: torch.Tensor, a_scales: torch.Tensor, tensors: dict, meta: dict) -> tuple:
    """(M, K, N, qweight, qparams, channel scales, 256-column tiles) of a LiquidQuant product on the Gluon kernels,
    after checking that everything is on one CUDA device."""
    qweight, qparams, cs = tensors["qweight"], tensors["qparams"], tensors["channel_scales"]
    check_device(a_codes, a_scales, qweight, qparams, cs)
    m, k = a_codes.shape
    return m, k, int(meta["out_features"]), qweight, qparams, cs, qweight.shape[1] // 32


def lqq_wgmma_matmul(a_codes: torch.Tensor, a_scales: torch.Tensor, tensors: dict, meta: dict, bm: int = 128,
                     stages: int = 3, split_k: int = 1, tail: int = 0, warpgroups: int = 1,
                     out: torch.Tensor | None = None, out_dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """Y [M, N] (``out_dtype``, or ``out``'s) = dequant(A)·Ŵᵀ for int8 codes [M, K] with per-token float32
    scales [M, 1] and a ``w4a8-lqq`` weight (module docstring); ``bm`` tokens per program (32, 64 or 128) plus
    ``tail`` more (0, 32 or 64) that multiply the same dequantized weights — so M = 160 runs as
    one 128 + 32 program per row tile instead of five 32-token ones that each dequantize the whole weight;
    ``stages`` activation tiles in flight, ``split_k`` programs along K (fp32 slots summed in split order,
    :mod:`quantkit.runtime.kernels.triton.splitk`), ``warpgroups`` (1 or 2) warpgroups of 64 weight rows sharing each
    activation tile. The caller checks :func:`lqq_wgmma_problem`. Same bits as the Triton LiquidQuant kernel with the
    same split (exact int32 products, then (acc · token scale) · channel scale)."""
    if (bm not in (32, 64, 128) or tail not in (0, 32, 64) or stages not in (2, 3, 4) or split_k < 1
            or warpgroups not in (1, 2)):
        raise ValueError(f"bm must be 32, 64 or 128, tail 0, 32 or 64, stages 2-4, split_k >= 1 and warpgroups 1-2; "
                         f"got {bm}, {tail}, {stages}, {split_k}, {warpgroups}")
    m, k, n, qweight, qparams, cs, n_tiles = lqq_operands(a_codes, a_scales, tensors, meta)
    tiles_per_split, split = split_plan(n_tiles, split_k)
    out = torch.empty(m, n, dtype=out_dtype, device=a_codes.device) if out is None else out
    grid = (-(-n // (BN * warpgroups)), -(-m // (bm + tail)), split)
    ws, tickets = split_workspace(a_codes.device, m * n, split, grid[0] * grid[1])
    hpg = groups_in_halves(meta, n_tiles)
    _lqq_wgmma_kernel[grid](a_codes, a_scales, qweight, qparams, cs, out, ws, tickets, m, n, a_codes.stride(0),
                            a_scales.stride(0), out.stride(0), qweight.shape[1], n_tiles, tiles_per_split,
                            hpg, qparams.shape[0], BM=bm, STAGES=stages, SPLIT_K=split, BT=tail, WG=warpgroups,
                            COPIES=one_copy_per_tile(tail, warpgroups), num_warps=4 * warpgroups)
    return out
