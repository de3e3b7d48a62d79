"""LiquidQuant W4A8 on Hopper for layers of few output tiles: stream-K over the K-pair launch of :mod:`.lqq_ws`.

Where a layer has fewer 64-row × 128-token output tiles than the GPU has SMs — the 1024-row k/v projection at
M = 513-1024, 1536- and 2048-row layers at M = 257-384 — :mod:`.lqq_ws`'s K-pair launch runs one program a tile
and leaves the other SMs idle: 72 tiles on 132 SMs use 55 % of the GPU, and every launch takes about as long as
one SM needs for a whole tile's K range (~11.8 µs at K = 4096, the time cuBLAS fp16 takes for these products).
A K split cannot help there: two splits of 72 tiles are 144 programs, two waves on 132 SMs.

Stream-K (Osama et al., "Stream-K: Work-centric Parallel Decomposition for Dense Matrix-Matrix Multiplication on
the GPU", PPoPP 2023) divides the *K iterations* evenly instead: the layer's U = tiles × K tiles iterations, in
order (tile-major, K tiles within a tile), go to P programs (one an SM) L = ⌈U / P⌉ apiece. A program's range
cuts at most two tiles short — the one it starts in and the one it ends in; the tiles between are whole and
stored directly. A cut tile's parts are int32 sums: each program stores its part in a slot of its own (slot
2p for the part its range starts with, 2p + 1 for the one it ends with), takes the tile's atomic ticket, and the
tile's last program to arrive adds the other parts to its own, applies the scales (LiquidGEMM Sec. 4: token scale
× channel scale once after K) and stores the tile, leaving the ticket at zero. Integer sums are exact in any
order, so the output has the same bits as one program over the whole K range — the Triton LiquidQuant kernel's.

Each program is :mod:`.lqq_ws`'s K-pair program: a TMA producer warp walks the program's iterations into a ring
of STAGES slots (even), and two consumer warpgroups take every other K tile of each part of a tile
(:func:`.lqq_ws._multiply_range`: LiquidGEMM Eq. 11-12 dequantization in registers, 8 k32 wgmma a tile), so one
warpgroup's dequantization overlaps the other's products; the second warpgroup hands its sum to the first through
shared memory (two mbarriers: full and free, since a program may cut more than one tile).

Requires K a multiple of 256 and per-token activation scales (:func:`.lqq_wgmma.lqq_wgmma_problem`). No CPU
interpreter runs Gluon; the GPU tests compare it bit for bit with the Triton kernel (the format's pure-torch
reference: :func:`quantkit.runtime.kernels.reference.int8_reference`), and ``quantkit.bench.sass`` compiles it for
sm_90 in CI.
"""

from __future__ import annotations

import torch

from quantkit.runtime.kernels.launch import groups_in_halves
from quantkit.runtime.kernels.lqq_wgmma import lqq_operands
from quantkit.runtime.kernels.lqq_ws import PART_REGS
from quantkit.runtime.kernels.splitk import split_workspace
from quantkit.runtime.kernels.wgmma_common import BN, HAVE_GLUON, ws_maxnreg

KERNEL = "lqq_stream_k"  # its build record (wgmma_common.launch_or_decline)
BM = 128  # tokens a tile
ROWS = 2 * BN  # weight rows a tile: two consumer warpgroups of 64
PART_INTS = BN * BM  # int32 elements of one warpgroup's part of a tile

if HAVE_GLUON:
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from quantkit.runtime.kernels.lqq_wgmma import apply_scales
    from quantkit.runtime.kernels.lqq_ws import PRODUCER_REGS_C, _multiply_range
    from quantkit.runtime.kernels.wgmma_common import (cta_barrier, gl, gluon, mbarrier, ring_barriers, slot_layout,
                                                       store_rows, tma_load)

    @gluon.jit
    def _tile_of(u, n_tiles, row_tiles, M, BM: gl.constexpr):
        """(tile, K tile, row tile, first token, first token row read) of iteration u: tiles in order of token tile,
        then row tile; a ragged last token tile moves back to end at token M − 1 (:mod:`.lqq_ws`)."""
        tile = u // n_tiles
        first = (tile // row_tiles) * BM
        return tile, u - tile * n_tiles, tile % row_tiles, first, gl.maximum(gl.minimum(first, M - BM), 0)

    @gluon.jit
    def _producer(x_desc, xs, ready, empty, M, start, end, n_tiles, row_tiles, BM: gl.constexpr,
                  STAGES: gl.constexpr):
        """The activation tile of each of the program's iterations into ring slot i % STAGES, its i-th, once the
        consumers released it."""
        for u in range(start, end):
            i = u - start
            s = i % STAGES
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)  # phase 1 counts as complete at first
            _, t, _, _, row0 = _tile_of(u, n_tiles, row_tiles, M, BM)
            bar = ready.index(s)
            mbarrier.expect(bar, 256 * BM)
            tma_load(x_desc, [row0, 256 * t], bar, xs.index(2 * s))
            tma_load(x_desc, [row0, 256 * t + 128], bar, xs.index(2 * s + 1))

    @gluon.jit
    def _finish_part(acc, sa_ptr, cs_ptr, out_ptr, part_ptr, ticket_ptr, M, N, stride_sm, stride_om, pid, tile,
                     rows, first, row0, k0, k1, n_tiles, per_program, BM: gl.constexpr, H: gl.constexpr):
        """Store warpgroup H's int32 sum ``acc`` [64, BM] (64-row block ``rows``) of K tiles k0 … k1 − 1 of
        ``tile``: scaled, directly, when that is the whole K range; else, from k0 = 0 (the tile's owner: the part
        its range ends with), wait for the tile's later parts, add them and store the rows; else (the part its range
        starts with) into this program's slot, then count it on the tile's ticket (module docstring). Each
        warpgroup has slots and tickets of its own."""
        L: gl.constexpr = slot_layout(64)
        rm = row0 + gl.arange(0, BM, layout=gl.SliceLayout(0, L))
        rn = rows * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, L))
        acc = gl.convert_layout(acc, L)
        # a part: rows contiguous (slot_layout's four rows a thread are 16 bytes)
        offs = gl.arange(0, BM, layout=gl.SliceLayout(0, L))[None, :] * 64 + gl.arange(
            0, 64, layout=gl.SliceLayout(1, L))[:, None]
        ticket = ticket_ptr + 2 * tile + H
        if (k0 == 0) & (k1 == n_tiles):
            store_rows(out_ptr, apply_scales(acc, sa_ptr, cs_ptr, rm, rn, M, N, stride_sm), rm, rn, first, M, N,
                       stride_om)
        elif k0 == 0:
            # the later parts come from programs pid + 1 … tail, each its range's first part, done before anything
            # else (so they never wait on this one: no cycle; all programs are resident, one an SM)
            tail = (tile * n_tiles + n_tiles - 1) // per_program
            while gl.atomic_add(ticket, 0) < tail - pid:  # acquire: their parts are visible after it
                pass
            for q in range(pid + 1, tail + 1, 2):  # two loads in flight
                two = (gl.zeros_like(offs) + q + 1) <= tail
                acc += gl.load(part_ptr + (2 * q + H) * (64 * BM) + offs, cache_modifier=".cg")
                acc += gl.load(part_ptr + (2 * q + 2 + H) * (64 * BM) + offs, mask=two, other=0,
                               cache_modifier=".cg")
            store_rows(out_ptr, apply_scales(acc, sa_ptr, cs_ptr, rm, rn, M, N, stride_sm), rm, rn, first, M, N,
                       stride_om)
            gl.atomic_xchg(ticket, 0)  # for the next launch
        else:
            gl.store(part_ptr + (2 * pid + H) * (64 * BM) + offs, acc)
            cta_barrier()  # every warp's part precedes the ticket's release (splitk.store_tile)
            gl.atomic_add(ticket, 1)

    @gluon.jit
    def _rows(xs, ready, empty, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, part_ptr, ticket_ptr, M, N, stride_sm,
              stride_om, w_row, start, end, n_tiles, row_tiles, per_program, hpg, groups, BM: gl.constexpr,
              STAGES: gl.constexpr, H: gl.constexpr):
        """Consumer warpgroup H (0 or 1: the first or second 64 rows of each 128-row tile) of a program: for each
        tile its range touches, its part's K tiles (:func:`.lqq_ws._multiply_range`; ring slot = the iteration's
        index in the program's range), then the part finished (:func:`_finish_part`)."""
        pid = gl.program_id(0)
        first_tile = start // n_tiles
        for j in range((end - 1) // n_tiles - first_tile + 1):
            tile = first_tile + j
            lo = tile * n_tiles
            k0 = gl.maximum(start - lo, 0)
            k1 = gl.minimum(end - lo, n_tiles)
            _, _, pid_n, first, row0 = _tile_of(lo, n_tiles, row_tiles, M, BM)
            # iteration lo + t is the program's (lo + t − start)-th: _multiply_range's slot index is t − t_begin
            acc, _ = _multiply_range(xs, xs, ready, empty, w_ptr, p_ptr, N, w_row, start - lo, k0, k1, hpg, groups,
                                     2 * pid_n + H, BM, 0, STAGES, 1)
            _finish_part(acc, sa_ptr, cs_ptr, out_ptr, part_ptr, ticket_ptr, M, N, stride_sm, stride_om, pid, tile,
                         2 * pid_n + H, first, row0, k0, k1, n_tiles, per_program, BM, H)

    @gluon.jit
    def _lqq_stream_k_kernel(x_desc, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, part_ptr, ticket_ptr, M, N, stride_sm,
                             stride_om, w_row, n_tiles, row_tiles, units, per_program, hpg, groups,
                             BM: gl.constexpr, STAGES: gl.constexpr, PART_REGS: gl.constexpr):
        start = gl.program_id(0) * per_program
        end = gl.minimum(start + per_program, units)
        xs = gl.allocate_shared_memory(gl.int8, [2 * STAGES, BM, 128], x_desc.layout)
        ready, empty = ring_barriers(STAGES, 2)
        gl.warp_specialize([
            (_rows, (xs, ready, empty, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, part_ptr, ticket_ptr, M, N, stride_sm,
                     stride_om, w_row, start, end, n_tiles, row_tiles, per_program, hpg, groups, BM, STAGES, 0)),
            (_rows, (xs, ready, empty, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, part_ptr, ticket_ptr, M, N, stride_sm,
                     stride_om, w_row, start, end, n_tiles, row_tiles, per_program, hpg, groups, BM, STAGES, 1)),
            (_producer, (x_desc, xs, ready, empty, M, start, end, n_tiles, row_tiles, BM, STAGES)),
        ], [4, 1], [PART_REGS, PRODUCER_REGS_C])


def stream_k_plan(m: int, n: int, k: int, programs: int) -> tuple[int, int, int]:
    """(tiles, iterations a program, programs launched) of a stream-K launch of ``programs`` programs at most:
    128-row × 128-token tiles of K / 256 iterations each, divided evenly in order (module docstring)."""
    tiles = -(-n // ROWS) * -(-m // BM)
    units = tiles * (k // 256)
    per = -(-units // max(1, min(programs, units)))
    return tiles, per, -(-units // per)


def lqq_stream_k_matmul(a_codes: torch.Tensor, a_scales: torch.Tensor, tensors: dict, meta: dict,
                        programs: int | None = None, stages: int = 4, out: torch.Tensor | None = None,
                        out_dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """Y [M, N] (``out_dtype``, or ``out``'s) = dequant(A)·Ŵᵀ for int8 codes [M, K] with per-token float32 scales
    [M, 1] and a ``w4a8-lqq`` weight — the same bits as the Triton LiquidQuant kernel — with the K iterations of
    the layer's 128-row tiles divided evenly over ``programs`` programs (default: one an SM; module docstring);
    ``stages`` ring slots (2-4). The caller checks :func:`.lqq_wgmma.lqq_wgmma_problem`."""
    if stages not in (2, 3, 4):
        raise ValueError(f"a stream-K launch takes 2-4 stages (ring slots of 32 KB), got {stages}")
    m, k, n, qweight, qparams, cs, n_tiles = lqq_operands(a_codes, a_scales, tensors, meta)
    # a tile's owner waits for programs after it: all must be resident, one an SM (shared memory)
    sms = torch.cuda.get_device_properties(a_codes.device).multi_processor_count
    programs = sms if programs is None else min(programs, sms)
    tiles, per, grid = stream_k_plan(m, n, k, programs)
    out = torch.empty(m, n, dtype=out_dtype, device=a_codes.device) if out is None else out
    # the parts: a slot a warpgroup of each program, int32 in the fp32 workspace's bytes; a ticket a warpgroup
    ws, tickets = split_workspace(a_codes.device, 2 * PART_INTS, grid, 2 * tiles)
    layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    x_desc = TensorDescriptor(a_codes, [m, k], [a_codes.stride(0), 1], [BM, 128], layout)
    _lqq_stream_k_kernel[(grid,)](x_desc, a_scales, qweight, qparams, cs, out, ws.view(torch.int32), tickets, m, n,
                                  a_scales.stride(0), out.stride(0), qweight.shape[1], n_tiles, -(-n // ROWS),
                                  tiles * n_tiles, per, groups_in_halves(meta, n_tiles), qparams.shape[0], BM=BM,
                                  STAGES=stages, PART_REGS=PART_REGS, num_warps=4, maxnreg=ws_maxnreg(2, 1))
    return out


__all__ = ["KERNEL", "lqq_stream_k_matmul", "stream_k_plan"]
