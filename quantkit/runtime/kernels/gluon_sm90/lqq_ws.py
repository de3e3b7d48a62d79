"""LiquidQuant W4A8 on Hopper with a producer warp: the warp-specialized form of
:mod:`quantkit.runtime.kernels.gluon_sm90.lqq_wgmma` (Gluon).

:mod:`quantkit.runtime.kernels.gluon_sm90.lqq_wgmma` has every warp of a program dequantize weights, issue wgmma
*and* copy the activation tiles (``cp.async``, then a CTA barrier and a proxy fence before each tile's products).
Nsight Compute has its warps waiting on their own instruction stream (docs/BENCHMARKS.md), while cuBLAS runs a
producer warp (TMA, mbarriers) that feeds consumer warpgroups. LiquidGEMM Sec. 5 (ImFP) builds its kernel the same
way: a load warp brings operand tiles over TMA into a shared-memory ring, compute warpgroups dequantize and multiply.
This kernel does that with ``gl.warp_specialize``:

* the **producer** (one warp, 24 registers) walks the program's K tiles: waits until ring slot ``i % STAGES`` (its
  i-th tile) is empty (mbarrier ``empty``), then starts the TMA of activation tile t — two [BM, 128] int8 boxes, plus
  two [BT, 128] for a tail tile — completing on mbarrier ``ready``. Token rows past M arrive as zeros (TMA bounds),
  and their products are never stored;
* the **consumers** (one warpgroup of 64 weight rows: the default partition; with two warpgroups, 128 rows, the
  second is a 4-warp worker partition of its own) are :mod:`quantkit.runtime.kernels.gluon_sm90.lqq_wgmma`'s loop
  without the copies: dequantize tile t in registers (:data:`quantkit.runtime.kernels.triton.dequant.ASM_I8`,
  LiquidGEMM Eq. 11-12), load tile t + 1's words, wait on ``ready``, issue the 8 (16 with a tail) asynchronous k32
  products, wait for them, and release the slot (``empty``, which completes with one arrival from each warpgroup).
  Waiting for the tile's own products, not only the previous tile's, is what keeps the sums right: ptxas does not
  keep a register A operand alive while its wgmma runs (docs/BENCHMARKS.md); the tensor cores stay busy with the
  other warpgroup's or the other program's products. The two warpgroups are partitions of their own rather than one
  8-warp partition that meets at a barrier before releasing each slot (where both dequantize at once and then both
  wait on the tensor cores): apart they drift into turns, 1.05-1.37× faster at every launch timed
  (docs/BENCHMARKS.md, Measured and dropped);
* a ragged last token tile moves back to end at token M − 1 (its TMA boxes then lie inside the activations —
  boxes reaching past M are much slower) and stores only its own new rows;
* the epilogue is :mod:`quantkit.runtime.kernels.gluon_sm90.lqq_wgmma`'s: (acc · token scale) · channel scale,
  fp16/bf16 store — 16 bytes along Y's rows at a time
  (:func:`quantkit.runtime.kernels.gluon_sm90.common.store_rows_coalesced`, 1.05x faster) — or, in a K-split launch
  (program axis 2 walks its share of the 256-column tiles, producer and consumers alike), the fp32 slot of
  :mod:`quantkit.runtime.kernels.triton.splitk`'s scheme, the tile's last program adding the slots in split order
  (:func:`quantkit.runtime.kernels.gluon_sm90.common.store_rows_split`; each warpgroup of a two-warpgroup launch on
  tickets of its own). Split launches would give layers with few output tiles (the 1024-row k/v products) programs
  enough to fill the SMs, as lqq_wgmma's do, but measure no faster there than lqq_wgmma's splits, so the rules give
  this kernel none.

**Halved last waves** (``halves_from``): a 256-token program (128 tokens and a 128-token tail, two warpgroups)
holds its SM alone, so a launch of 192 such tiles on 132 SMs runs two full program times although its second wave
holds 60 tiles. With ``halves_from`` the program axis is one-dimensional: programs below it run whole tiles in the
2-D launch's order (row tiles fastest), and each tile from there on runs as two programs of 128 tokens (without the
tail tile: a runtime branch around :func:`_producer` and :func:`_consumers`, whose code is unchanged). Half the
tokens dequantize the same weights, so a half takes ~0.6 of a whole tile's time, not 0.5 (0.56 of a wave in the
large-M model's fit, 0.65 in the 128-token launch's own timing); the same int32 sums and epilogue, so the same bits.
The program order is: whole tiles, then the first halves of the later tiles, then their second halves — a tile of a
last token row of 128 tokens or fewer has none, so a ragged M (1025 tokens: four whole token rows and one of a
single token) runs that row as 128-token programs. ``quantkit tune`` times the launch with the last partial wave's
tiles halved and with every tile halved against the whole tiles (:class:`quantkit.runtime.kernels.gemm.GluonLqq`).

**K-pair launches** (``k_pair``): a program that has its SM to itself (a layer of few output tiles: the k/v
projection at M = 513-1024, 4096 rows at M = 129-256) cannot overlap a warpgroup's dequantization with its own
products — it must wait for them before it writes registers again — so its tensor cores idle while it dequantizes.
A K-pair program runs two consumer warpgroups (the default partition and a 4-warp worker, 232-248 registers each)
on the same 64 rows and 128 tokens, warpgroup h taking tiles h, h + 2, … of the K range from ring slots that only
it uses (STAGES even, so each slot's mbarrier phases follow one warpgroup); while one dequantizes, the other's
products run. The second leaves its int32 sum in shared memory, the first adds it (an mbarrier orders the two) and
stores the tile as above — integers, exact in any order, so the same bits as one warpgroup over the whole range.
Launches of at most one program an SM on more than half the SMs take it by default
(:func:`quantkit.runtime.kernels.heuristic.lqq_k_pair`).
Storing the dequantized planes to shared memory so that a warpgroup's own products could run on (the extra
shared-memory traffic and fence) and three warpgroups along K both measure slower (docs/BENCHMARKS.md, Measured and
dropped).

Same bits as :mod:`quantkit.runtime.kernels.gluon_sm90.lqq_wgmma` and the Triton LiquidQuant kernel (exact int32
products, the same epilogue). No CPU interpreter runs Gluon; the GPU tests compare it bit for bit with the Triton
kernel (the format's pure-torch reference is :func:`quantkit.runtime.kernels.reference.int8_reference`).
"""

from __future__ import annotations

import torch

from quantkit.runtime.kernels.triton.launch import groups_in_halves, split_plan
from quantkit.runtime.kernels.gluon_sm90.lqq_wgmma import lqq_operands, lqq_wgmma_problem
from quantkit.runtime.kernels.scratch import split_workspace
from quantkit.runtime.kernels.gluon_sm90.common import BN, HAVE_GLUON, PART_REGS, PRODUCER_REGS, ws_maxnreg

KERNEL = "lqq_ws"
K_PAIR_KERNEL = "lqq_ws_k_pair"  # the K-pair launches' own build record (launch_or_decline), apart from KERNEL's
HALVES_KERNEL = "lqq_ws_halves"  # the halved launches' own build record: their failures leave KERNEL's launches be

if HAVE_GLUON:
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from quantkit.runtime.kernels.gluon_sm90.lqq_wgmma import apply_scales, multiply_tile, planes_wgmma
    from quantkit.runtime.kernels.gluon_sm90.common import (a_layout, gl, gluon, load_words, mbarrier, mma_layout,
                                                       ring_barriers, store_rows_coalesced, store_rows_split,
                                                       store_rows_split_pair, tma_load, weight_rows)

    PRODUCER_REGS_C = gl.constexpr(PRODUCER_REGS)  # Triton kernels read only constexpr globals
    RED_SMEM = gl.constexpr(gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0]))

    @gluon.jit
    def load_tile(x_desc, xt_desc, xs, xt, bar, s, row0, t, BM: gl.constexpr, BT: gl.constexpr):
        """Start the TMA of activation tile t (256 int8 columns of BM + BT token rows from row0) into ring slot s,
        completing on mbarrier ``bar``."""
        mbarrier.expect(bar, 256 * (BM + BT))
        tma_load(x_desc, [row0, 256 * t], bar, xs.index(2 * s))
        tma_load(x_desc, [row0, 256 * t + 128], bar, xs.index(2 * s + 1))
        if BT > 0:
            tma_load(xt_desc, [row0 + BM, 256 * t], bar, xt.index(2 * s))
            tma_load(xt_desc, [row0 + BM, 256 * t + 128], bar, xt.index(2 * s + 1))

    @gluon.jit
    def _producer(x_desc, xt_desc, xs, xt, ready, empty, row0, t_begin, t_end, BM: gl.constexpr, BT: gl.constexpr,
                  STAGES: gl.constexpr):
        """Activation tile t (of this program's K range) into ring slot i % STAGES, its i-th, once the consumers
        released it (module docstring)."""
        for t in range(t_begin, t_end):
            i = t - t_begin
            s = i % STAGES
            # the ring's mbarriers start with phase 1 complete: the first STAGES waits pass at once
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
            load_tile(x_desc, xt_desc, xs, xt, ready.index(s), s, row0, t, BM, BT)

    @gluon.jit
    def _store_result(acc, acc_t, sa_ptr, cs_ptr, out_ptr, ws_ptr, ticket_ptr, M, N, stride_sm, stride_om, pid_n,
                      pid_k, row0, first, BM: gl.constexpr, BT: gl.constexpr, SPLIT_K: gl.constexpr):
        """The epilogue: (acc · token scale) · channel scale of the [64, BM] tile of rows 64·pid_n … (and its
        [64, BT] tail ``acc_t``), stored directly or through split-K slot pid_k (module docstring)."""
        ROWS: gl.constexpr = 64
        mma: gl.constexpr = mma_layout(BM, 1)
        if BT > 0:
            mma_t: gl.constexpr = mma_layout(BT, 1)
        rm = row0 + gl.arange(0, BM, layout=gl.SliceLayout(0, mma))
        rn_o = pid_n * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, mma))
        if BT > 0:
            rm_t = row0 + BM + gl.arange(0, BT, layout=gl.SliceLayout(0, mma_t))
            rn_t = pid_n * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, mma_t))
        if SPLIT_K == 1:
            store_rows_coalesced(out_ptr, apply_scales(acc, sa_ptr, cs_ptr, rm, rn_o, M, N, stride_sm), rm, rn_o,
                                 first, M, N, stride_om)
            if BT > 0:
                store_rows_coalesced(out_ptr, apply_scales(acc_t, sa_ptr, cs_ptr, rm_t, rn_t, M, N, stride_sm), rm_t,
                                     rn_t, first, M, N, stride_om)
        elif BT == 0:
            store_rows_split(out_ptr, ws_ptr, ticket_ptr, apply_scales(acc, sa_ptr, cs_ptr, rm, rn_o, M, N, stride_sm),
                             rm, rn_o, first, M, N, stride_om, pid_k, SPLIT_K)
        else:
            store_rows_split_pair(out_ptr, ws_ptr, ticket_ptr,
                                  apply_scales(acc, sa_ptr, cs_ptr, rm, rn_o, M, N, stride_sm), rm, rn_o,
                                  apply_scales(acc_t, sa_ptr, cs_ptr, rm_t, rn_t, M, N, stride_sm), rm_t, rn_t,
                                  first, M, N, stride_om, pid_k, SPLIT_K)

    @gluon.jit
    def _multiply_range(xs, xt, ready, empty, w_ptr, p_ptr, N, w_row, t_begin, t_first, t_end, hpg, groups, pid_n,
                        BM: gl.constexpr, BT: gl.constexpr, STAGES: gl.constexpr, STEP: gl.constexpr):
        """One consumer warpgroup's K loop over tiles t_first, t_first + STEP, … < t_end of the program's range from
        t_begin (ring slot i % STAGES holds its i-th tile): dequantize in registers, wait for the tile, multiply it
        into int32 sums (and the tail's), wait for the products, release the slot. Returns (acc [64, BM], acc_t
        [64, BT], or acc itself without a tail: a placeholder the epilogue does not read)."""
        mma: gl.constexpr = mma_layout(BM, 1)
        rn_in, w_ptrs = weight_rows(w_ptr, pid_n, 64, N, w_row, a_layout(BM, 1))
        acc = gl.zeros([64, BM], gl.int32, mma)
        if BT > 0:
            acc_t = gl.zeros([64, BT], gl.int32, mma_layout(BT, 1))
        else:
            acc_t = acc
        words, p_lo, p_hi = load_words(w_ptrs, p_ptr, t_first, t_end, hpg, groups, N, rn_in)
        for t in range(t_first, t_end, STEP):
            i = t - t_begin
            s = i % STAGES
            planes = planes_wgmma(words, p_lo & 0xFF, (p_lo >> 8) & 0xFF, p_hi & 0xFF, (p_hi >> 8) & 0xFF)
            words, p_lo, p_hi = load_words(w_ptrs, p_ptr, t + STEP, t_end, hpg, groups, N, rn_in)
            mbarrier.wait(ready.index(s), (i // STAGES) & 1)
            if BT > 0:  # the tail tile multiplies the same planes: one dequantization for BM + BT tokens
                acc, acc_t = multiply_tile(planes, xs, xt, 2 * s, acc, acc_t, BT, 1)
            else:
                acc, _ = multiply_tile(planes, xs, xs, 2 * s, acc, acc, BT, 1)
            mbarrier.arrive(empty.index(s), count=1)  # this warpgroup's products are complete: its read of the slot
        if BT == 0:
            acc_t = acc
        return acc, acc_t

    @gluon.jit
    def _consumers(xs, xt, ready, empty, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, ws_ptr, ticket_ptr, M, N, stride_sm,
                   stride_om, w_row, t_begin, t_end, hpg, groups, pid_n, pid_k, row0, first, BM: gl.constexpr,
                   BT: gl.constexpr, STAGES: gl.constexpr, SPLIT_K: gl.constexpr):
        """One consumer warpgroup: dequantize, multiply and store the [64, BM (+ BT)] output tile of rows 64·pid_n …
        over the program's K range, directly or through split-K slot pid_k (module docstring)."""
        acc, acc_t = _multiply_range(xs, xt, ready, empty, w_ptr, p_ptr, N, w_row, t_begin, t_begin, t_end, hpg,
                                     groups, pid_n, BM, BT, STAGES, 1)
        _store_result(acc, acc_t, sa_ptr, cs_ptr, out_ptr, ws_ptr, ticket_ptr, M, N, stride_sm, stride_om, pid_n,
                      pid_k, row0, first, BM, BT, SPLIT_K)

    @gluon.jit
    def _producer_halves(x_desc, xt_desc, xs, xt, ready, empty, row0, t_begin, t_end, tail_on, BM: gl.constexpr,
                         BT: gl.constexpr, STAGES: gl.constexpr):
        """:func:`_producer` of a program that runs its tail tile (``tail_on``) or only its first BM tokens."""
        if tail_on:
            _producer(x_desc, xt_desc, xs, xt, ready, empty, row0, t_begin, t_end, BM, BT, STAGES)
        else:
            _producer(x_desc, xt_desc, xs, xt, ready, empty, row0, t_begin, t_end, BM, 0, STAGES)

    @gluon.jit
    def _consumers_halves(xs, xt, ready, empty, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, ws_ptr, ticket_ptr, M, N,
                          stride_sm, stride_om, w_row, t_begin, t_end, hpg, groups, pid_n, pid_k, row0, first, tail_on,
                          BM: gl.constexpr, BT: gl.constexpr, STAGES: gl.constexpr, SPLIT_K: gl.constexpr):
        """:func:`_consumers` of a program that runs its tail tile (``tail_on``) or only its first BM tokens."""
        if tail_on:
            _consumers(xs, xt, ready, empty, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, ws_ptr, ticket_ptr, M, N, stride_sm,
                       stride_om, w_row, t_begin, t_end, hpg, groups, pid_n, pid_k, row0, first, BM, BT, STAGES,
                       SPLIT_K)
        else:
            _consumers(xs, xt, ready, empty, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, ws_ptr, ticket_ptr, M, N, stride_sm,
                       stride_om, w_row, t_begin, t_end, hpg, groups, pid_n, pid_k, row0, first, BM, 0, STAGES,
                       SPLIT_K)

    @gluon.jit
    def _k_half(xs, ready, empty, red, red_bar, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, ws_ptr, ticket_ptr, M, N,
                stride_sm, stride_om, w_row, t_begin, t_end, hpg, groups, pid_n, pid_k, row0, first, BM: gl.constexpr,
                STAGES: gl.constexpr, SPLIT_K: gl.constexpr, HALF: gl.constexpr):
        """One of the two consumer warpgroups of a K-pair launch: tiles t_begin + HALF, + 2, … of the program's K
        range into its own int32 [64, BM] sum (STAGES even, so each ring slot serves one warpgroup and its mbarrier
        phases run in that warpgroup's order). HALF 1 leaves its sum in shared memory ``red``; HALF 0 adds it —
        integer sums, exact in any order, so the same bits as one warpgroup over the whole range — and stores the
        tile (module docstring)."""
        acc, _ = _multiply_range(xs, xs, ready, empty, w_ptr, p_ptr, N, w_row, t_begin, t_begin + HALF, t_end, hpg,
                                 groups, pid_n, BM, 0, STAGES, 2)
        if HALF == 1:
            red.store(acc)
            mbarrier.arrive(red_bar, count=1)  # after every thread's store (release at CTA scope)
        else:
            mbarrier.wait(red_bar, 0)
            acc += red.load(mma_layout(BM, 1))
            _store_result(acc, acc, sa_ptr, cs_ptr, out_ptr, ws_ptr, ticket_ptr, M, N, stride_sm, stride_om, pid_n,
                          pid_k, row0, first, BM, 0, SPLIT_K)

    @gluon.jit
    def _lqq_ws_kpair_kernel(x_desc, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, ws_ptr, ticket_ptr, M, N, stride_sm,
                             stride_om, w_row, n_tiles, tiles_per_split, hpg, groups, BM: gl.constexpr,
                             STAGES: gl.constexpr, SPLIT_K: gl.constexpr, HALF_REGS: gl.constexpr):
        pid_n = gl.program_id(0)
        pid_k = gl.program_id(2)
        t_begin = pid_k * tiles_per_split
        t_end = gl.minimum(t_begin + tiles_per_split, n_tiles)
        first = gl.program_id(1) * BM  # a ragged last token tile moves back, as in _lqq_ws_kernel
        row0 = gl.maximum(gl.minimum(first, M - BM), 0)
        gl.static_assert(STAGES % 2 == 0, "a K-pair ring needs an even number of slots: one warpgroup per slot")
        xs = gl.allocate_shared_memory(gl.int8, [2 * STAGES, BM, 128], x_desc.layout)
        red = gl.allocate_shared_memory(gl.int32, [64, BM], RED_SMEM)
        red_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(red_bar, count=1)
        ready, empty = ring_barriers(STAGES)
        gl.warp_specialize([
            (_k_half, (xs, ready, empty, red, red_bar, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, ws_ptr, ticket_ptr, M,
                       N, stride_sm, stride_om, w_row, t_begin, t_end, hpg, groups, pid_n, pid_k, row0, first, BM,
                       STAGES, SPLIT_K, 0)),
            (_k_half, (xs, ready, empty, red, red_bar, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, ws_ptr, ticket_ptr, M,
                       N, stride_sm, stride_om, w_row, t_begin, t_end, hpg, groups, pid_n, pid_k, row0, first, BM,
                       STAGES, SPLIT_K, 1)),
            (_producer, (x_desc, x_desc, xs, xs, ready, empty, row0, t_begin, t_end, BM, 0, STAGES)),
        ], [4, 1], [HALF_REGS, PRODUCER_REGS_C])

    @gluon.jit
    def _lqq_ws_kernel(x_desc, xt_desc, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, ws_ptr, ticket_ptr, M, N, stride_sm,
                       stride_om, w_row, n_tiles, tiles_per_split, hpg, groups, halves_from, BM: gl.constexpr,
                       BT: gl.constexpr, STAGES: gl.constexpr, WG: gl.constexpr, SPLIT_K: gl.constexpr,
                       PART_REGS: gl.constexpr, HALVES: gl.constexpr = False):
        pid_k = gl.program_id(2)
        t_begin = pid_k * tiles_per_split
        t_end = gl.minimum(t_begin + tiles_per_split, n_tiles)
        # a ragged last token tile moves back to end at row M - 1, so that its TMA boxes lie inside the activations
        # (boxes reaching past M are slow: 4096x4096 M = 769 45.7 µs against 33.1 at M = 768); its rows below
        # ``first`` belong to the tile before and are not stored again
        if HALVES:  # one program axis over the tiles in the 2-D launch's order: whole below halves_from, then the
            # first halves of the tiles from there, then their second halves (only the tiles that have one)
            row_tiles = gl.cdiv(N, 64 * WG)
            tiles = row_tiles * gl.cdiv(M, BM + BT)
            second = (gl.program_id(0) >= tiles).to(gl.int32)
            tile = gl.program_id(0) - second * (tiles - halves_from)
            pid_n = tile % row_tiles
            tail_on = gl.program_id(0) < halves_from
            first = (tile // row_tiles) * (BM + BT) + second * BM
            row0 = gl.maximum(gl.minimum(first, M - BM - BT * tail_on.to(gl.int32)), 0)
        else:
            pid_n = gl.program_id(0)
            first = gl.program_id(1) * (BM + BT)
            row0 = gl.maximum(gl.minimum(first, M - (BM + BT)), 0)
        gl.assume(t_end > t_begin)  # the launch gives every split a tile (launch.split_plan)
        xs = gl.allocate_shared_memory(gl.int8, [2 * STAGES, BM, 128], x_desc.layout)
        if BT > 0:
            xt = gl.allocate_shared_memory(gl.int8, [2 * STAGES, BT, 128], xt_desc.layout)
        else:
            xt = xs
        ready, empty = ring_barriers(STAGES, WG)
        if WG == 1:
            gl.warp_specialize([
                (_consumers, (xs, xt, ready, empty, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, ws_ptr, ticket_ptr, M, N,
                              stride_sm, stride_om, w_row, t_begin, t_end, hpg, groups, pid_n, pid_k, row0, first, BM,
                              BT, STAGES, SPLIT_K)),
                (_producer, (x_desc, xt_desc, xs, xt, ready, empty, row0, t_begin, t_end, BM, BT, STAGES)),
            ], [1], [PRODUCER_REGS_C])
        elif HALVES:  # two warpgroups, unsplit (lqq_ws_matmul checks)
            gl.warp_specialize([
                (_consumers_halves, (xs, xt, ready, empty, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, ws_ptr, ticket_ptr, M,
                                     N, stride_sm, stride_om, w_row, t_begin, t_end, hpg, groups, 2 * pid_n, pid_k,
                                     row0, first, tail_on, BM, BT, STAGES, SPLIT_K)),
                (_consumers_halves, (xs, xt, ready, empty, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, ws_ptr, ticket_ptr, M,
                                     N, stride_sm, stride_om, w_row, t_begin, t_end, hpg, groups, 2 * pid_n + 1, pid_k,
                                     row0, first, tail_on, BM, BT, STAGES, SPLIT_K)),
                (_producer_halves, (x_desc, xt_desc, xs, xt, ready, empty, row0, t_begin, t_end, tail_on, BM, BT,
                                    STAGES)),
            ], [4, 1], [PART_REGS, PRODUCER_REGS_C])
        else:  # rows 128·pid_n … + 63 and the 64 after, each warpgroup with its own split-K tickets
            tickets = gl.num_programs(0) * gl.num_programs(1)
            gl.warp_specialize([
                (_consumers, (xs, xt, ready, empty, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, ws_ptr, ticket_ptr, M, N,
                              stride_sm, stride_om, w_row, t_begin, t_end, hpg, groups, 2 * pid_n, pid_k, row0, first,
                              BM, BT, STAGES, SPLIT_K)),
                (_consumers, (xs, xt, ready, empty, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, ws_ptr,
                              ticket_ptr + tickets, M, N, stride_sm, stride_om, w_row, t_begin, t_end, hpg, groups,
                              2 * pid_n + 1, pid_k, row0, first, BM, BT, STAGES, SPLIT_K)),
                (_producer, (x_desc, xt_desc, xs, xt, ready, empty, row0, t_begin, t_end, BM, BT, STAGES)),
            ], [4, 1], [PART_REGS, PRODUCER_REGS_C])

def halved_programs(m: int, n: int, halves_from: int) -> int:
    """Programs of a 256-token launch (128 rows × 256 tokens a tile) of M tokens on N rows with the tiles from
    ``halves_from`` (<= the tiles) on halved: one per tile — whole, or its first half — then one per second half of
    the tiles from ``halves_from`` on that have one (:func:`tiles_with_second_half`; module docstring)."""
    tiles = -(-n // 128) * -(-m // 256)
    return tiles + max(tiles_with_second_half(m, n) - halves_from, 0)


def tiles_with_second_half(m: int, n: int) -> int:
    """Tiles (128 rows × 256 tokens, row tiles fastest) of M tokens on N rows whose second 128 tokens hold any: all,
    or all but the last token row where it holds 128 tokens or fewer."""
    rows, token_tiles = -(-n // 128), -(-m // 256)
    return rows * token_tiles if m % 256 == 0 or m % 256 > 128 else rows * (token_tiles - 1)


def lqq_ws_matmul(a_codes: torch.Tensor, a_scales: torch.Tensor, tensors: dict, meta: dict, bm: int = 128,
                  stages: int = 3, tail: int = 0, warpgroups: int = 1, per_sm: int = 1, split_k: int = 1,
                  out: torch.Tensor | None = None, out_dtype: torch.dtype = torch.float16,
                  k_pair: bool = False, halves_from: int | None = None) -> torch.Tensor:
    """Y [M, N] (``out_dtype``, or ``out``'s) = dequant(A)·Ŵᵀ for int8 codes [M, K] with per-token float32 scales
    [M, 1] and a ``w4a8-lqq`` weight, as :func:`quantkit.runtime.kernels.gluon_sm90.lqq_wgmma.lqq_wgmma_matmul`
    (same bits at the same K split), with a producer warp bringing the activations over TMA (module docstring); 128
    tokens per program plus ``tail`` (0, 32, 64, 128); ``per_sm`` programs meant to share an SM (sets the register
    budget, :func:`quantkit.runtime.kernels.gluon_sm90.common.ws_maxnreg`); ``split_k`` programs along K (fp32 slots
    summed in split order, :mod:`quantkit.runtime.kernels.triton.splitk`). ``k_pair``: two consumer warpgroups on the
    same 64 rows, each taking every other tile of the K range (module docstring; one warpgroup of rows, no tail, 2
    or 4 stages, one program an SM). ``halves_from`` (a 256-token launch: tail 128, two warpgroups,
    unsplit): the output tiles from that one on, in launch order, each run as two 128-token programs — the last
    wave's tiles spread over twice the programs (module docstring). The
    caller checks :func:`quantkit.runtime.kernels.gluon_sm90.lqq_wgmma.lqq_wgmma_problem`."""
    if k_pair and (bm != 128 or tail or stages not in (2, 4) or warpgroups != 1 or per_sm != 1 or split_k < 1):
        raise ValueError(f"a K-pair launch takes bm 128, no tail, 2 or 4 stages, one warpgroup of rows, one program "
                         f"an SM and split_k >= 1; got {bm}, {tail}, {stages}, {warpgroups}, {per_sm}, {split_k}")
    if (bm != 128 or tail not in (0, 32, 64, 128) or stages not in (2, 3, 4) or warpgroups not in (1, 2)
            or not 1 <= per_sm <= 3 - warpgroups or split_k < 1 or (tail == 128 and (stages > 3 or per_sm != 1))):
        raise ValueError(f"bm must be 128, tail 0, 32, 64 or 128, stages 2-4, warpgroups 1-2, per_sm 1-2 with one "
                         f"warpgroup (1 with two: the consumers need ~230 registers) and split_k >= 1 — a 128-token "
                         f"tail: 2-3 stages (64 KB each) and one program an SM; got {bm}, {tail}, {stages}, "
                         f"{warpgroups}, {per_sm}, {split_k}")
    if halves_from is not None and (tail != 128 or warpgroups != 2 or split_k != 1 or halves_from < 0):
        raise ValueError(f"a launch of halved tiles takes tail 128, two warpgroups and no K split, and halves_from >= "
                         f"0; got {tail}, {warpgroups}, {split_k}, {halves_from}")
    m, k, n, qweight, qparams, cs, n_tiles = lqq_operands(a_codes, a_scales, tensors, meta)
    tiles_per_split, split = split_plan(n_tiles, split_k)
    out = torch.empty(m, n, dtype=out_dtype, device=a_codes.device) if out is None else out
    layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    x_desc = TensorDescriptor(a_codes, [m, k], [a_codes.stride(0), 1], [bm, 128], layout)
    xt_desc = TensorDescriptor(a_codes, [m, k], [a_codes.stride(0), 1], [max(tail, 8), 128], layout)
    grid = (-(-n // (BN * warpgroups)), -(-m // (bm + tail)), split)
    if halves_from is not None:
        halves_from = min(halves_from, grid[0] * grid[1])
        grid = (halved_programs(m, n, halves_from), 1, 1)
    # two warpgroups store their rows on tickets of their own (the second set after the first)
    ws, tickets = split_workspace(a_codes.device, m * n, split, grid[0] * grid[1] * warpgroups)  # K-pair: 1
    if k_pair:
        _lqq_ws_kpair_kernel[grid](x_desc, a_scales, qweight, qparams, cs, out, ws, tickets, m, n, a_scales.stride(0),
                                   out.stride(0), qweight.shape[1], n_tiles, tiles_per_split,
                                   groups_in_halves(meta, n_tiles), qparams.shape[0], BM=bm, STAGES=stages,
                                   SPLIT_K=split, HALF_REGS=PART_REGS, num_warps=4,
                                   maxnreg=ws_maxnreg(2, 1))
        return out
    _lqq_ws_kernel[grid](x_desc, xt_desc, a_scales, qweight, qparams, cs, out, ws, tickets, m, n, a_scales.stride(0),
                         out.stride(0), qweight.shape[1], n_tiles, tiles_per_split, groups_in_halves(meta, n_tiles),
                         qparams.shape[0], halves_from or 0, BM=bm, BT=tail, STAGES=stages, WG=warpgroups,
                         SPLIT_K=split, PART_REGS=PART_REGS, HALVES=halves_from is not None, num_warps=4,
                         maxnreg=ws_maxnreg(warpgroups, per_sm))
    return out


__all__ = ["HALVES_KERNEL", "KERNEL", "K_PAIR_KERNEL", "halved_programs", "lqq_wgmma_problem", "lqq_ws_matmul"]
