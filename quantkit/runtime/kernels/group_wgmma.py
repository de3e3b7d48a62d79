"""MixLLM W8A8, W4A8 and the one-launch mixed W4.4A8 on Hopper, with each 128-column group's float epilogue
overlapping the next group's tensor-core products (Gluon).

MixLLM's weights and activations both carry a float scale per group of 128 columns, so every group's int32
partial sum must be converted and scaled before it joins the fp32 accumulator (MixLLM Sec. 3.3, group-tile
accumulation, step 2). In the Triton kernel (:mod:`.int8_gemm`) each such epilogue waits for its own products, and
the tensor cores idle through it: 378-387 TOP/s at M = 4096, about half of cuBLAS fp16 (docs/BENCHMARKS.md). Here
two int32 accumulators take turns: the products of one half-tile (128 columns, one group) run while the previous
half-tile's sum is converted — the fast I2F of MixLLM Sec. 3.3 / Fig. 4: (sum + 0x4b400000) reinterpreted as
fp32, minus 1.5·2^23, exact while |sum| < 2^22 — and multiplied by weight scale × activation scale into the fp32
accumulator. Everything else is the layout of :mod:`.wgmma_common`: a program owns 64 weight rows × BM tokens
(one warpgroup), activations arrive by cp.async, weights are read into the register layout of wgmma's A operand:

* ``w8`` (MixLLM sym-8 g128): the stored int8 bytes [64, 128] of a half-tile, one product of K = 128;
* ``w4a16`` asymmetric 4-bit (MixLLM W4A8): the tile-planar words dequantized to q - z as ((q·1 + 128 - z) mod 256)
  XOR 0x80 (MixLLM two-step dequantization step 1, the LiquidQuant arithmetic with s = 1), one k32 product per
  plane, exactly as the Triton kernel;
* a mixed layer (MixLLM Sec. 3.4) runs both partitions in one launch: programs below ``tiles_a`` take the first
  partition's rows, the rest the second's, and each stores to its rows' output columns (scatter epilogue).

The sums are added in the Triton kernel's order with the same expressions, so results are bit-identical to it at
the same K split. Requires K a multiple of 256 and weight / activation groups that are multiples of 128 columns
(or per-token activations): :func:`group_wgmma_problem`. Reference: :func:`.reference.int8_reference`.
"""

from __future__ import annotations

import torch

from quantkit.runtime.kernels.launch import act_groups_in_halves, groups_in_halves, split_plan
from quantkit.runtime.kernels.splitk import split_workspace
from quantkit.runtime.kernels.wgmma_common import BN, HAVE_GLUON, hopper_problem

LAYOUTS = {"w8": 0, "w4a16": 1}  # the MODE of each weight layout (int8_gemm.W8, int8_gemm.ASYM4)

if HAVE_GLUON:
    from quantkit.runtime.kernels.lqq_wgmma import planes_wgmma
    from quantkit.runtime.kernels.wgmma_common import (ROWS, X_LAYOUT, X_SMEM, a_layout, copy_x, gl, gluon,
                                                       mma_layout, store_tile, wait_x, warpgroup_mma,
                                                       warpgroup_mma_wait, x_half)

    I2F_BIAS_INT = gl.constexpr(0x4B400000)  # bit pattern of 12582912.0 = 1.5·2^23 (MixLLM Sec. 3.3, Fig. 4)
    I2F_BIAS_FLOAT = gl.constexpr(12582912.0)
    _W8 = gl.constexpr(0)

    @gluon.jit
    def _weight_scale(p, MODE: gl.constexpr):
        """fp32 weight-group scale of each row from its group word: stored fp32 (w8) or fp16 in bits 0-15."""
        if MODE == _W8:
            s = p
        else:
            s = (p & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
        return s

    @gluon.jit
    def _group_scales(p_ptr, sa_ptr, half, rn_in, rm_in, N, stride_sm, hpg, groups, act_hpg, act_groups,
                      MODE: gl.constexpr):
        """(weight scales [64], activation scales [BM]) of half-tile ``half`` (MixLLM Sec. 3.3 step 2)."""
        p = gl.load(p_ptr + gl.minimum(half // hpg, groups - 1) * N + rn_in)
        sa = gl.load(sa_ptr + rm_in * stride_sm + gl.minimum(half // act_hpg, act_groups - 1))
        return _weight_scale(p, MODE), sa

    @gluon.jit
    def _i2f(part):
        """Exact float value of an int32 group sum (|sum| < 2^22) by the magic-number conversion."""
        return (part + I2F_BIAS_INT).to(gl.float32, bitcast=True) - I2F_BIAS_FLOAT

    @gluon.jit
    def _weights(w_ptrs, p_ptr, t, rn_in, N, hpg, groups, MODE: gl.constexpr):
        """The int8 A operands of tile t: w8 → its two [64, 128] halves as stored; asym-4 → 8 planes [64, 32] of
        q - z (planes 0-3 the first half)."""
        if MODE == _W8:
            ops = (gl.load(w_ptrs + t * 256), gl.load(w_ptrs + t * 256 + 128))
        else:
            z_lo = (gl.load(p_ptr + gl.minimum((2 * t) // hpg, groups - 1) * N + rn_in) >> 16) & 0xFF
            z_hi = (gl.load(p_ptr + gl.minimum((2 * t + 1) // hpg, groups - 1) * N + rn_in) >> 16) & 0xFF
            one = gl.full(z_lo.shape, 1, gl.int32, z_lo.type.layout)
            ops = planes_wgmma(gl.load(w_ptrs + t * 32), one, 128 - z_lo, one, 128 - z_hi)
        return ops

    @gluon.jit
    def _issue_half(ops, xs, i, acc, h: gl.constexpr, STAGES: gl.constexpr, MODE: gl.constexpr):
        """Start the products of half h of ring tile i into a fresh int32 accumulator (not waited for)."""
        if MODE == _W8:
            acc = warpgroup_mma(ops[h], x_half(xs, i, h, STAGES), acc, use_acc=False, is_async=True)
        else:
            xh = xs.index(2 * (i % STAGES) + h)
            acc = warpgroup_mma(ops[4 * h], xh.slice(0, 32, dim=1).permute((1, 0)), acc, use_acc=False,
                                is_async=True)
            for p in gl.static_range(1, 4):
                acc = warpgroup_mma(ops[4 * h + p], xh.slice(32 * p, 32, dim=1).permute((1, 0)), acc,
                                    is_async=True)
        return acc

    @gluon.jit
    def _group_tile(xs, a_ptr, sa_ptr, w_ptr, p_ptr, cols_ptr, out_ptr, ws_ptr, ticket_ptr, pid_n, pid_m, pid_k, M, N,
                    stride_am, stride_sm, act_hpg, act_groups, w_row, n_tiles, tiles_per_split, hpg, groups,
                    stride_om, stride_wm, MODE: gl.constexpr, SCATTER: gl.constexpr, BM: gl.constexpr,
                    STAGES: gl.constexpr, SPLIT_K: gl.constexpr, OVERLAP_HI: gl.constexpr):
        """One [64, BM] output tile of a group-scaled weight (module docstring). The first half-tile's epilogue
        always runs during the second half's products; with OVERLAP_HI the second half's runs during the next
        tile's first-half products (its sum converted before the loop turns, see below), else at once."""
        PENDING: gl.constexpr = 1 if MODE == _W8 else 4  # commit groups one half-tile's products make
        t_begin = pid_k * tiles_per_split
        t_end = gl.minimum(t_begin + tiles_per_split, n_tiles)
        gl.assume(t_end > t_begin)  # no zero-trip path (lqq_wgmma: ptxas would serialize every wgmma)
        mma: gl.constexpr = mma_layout(BM)
        a_l: gl.constexpr = a_layout(BM)

        rn_a = gl.minimum(pid_n * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, a_l)), N - 1)
        if MODE == _W8:
            w_ptrs = w_ptr + rn_a[:, None] * w_row + gl.arange(0, 128, layout=gl.SliceLayout(0, a_l))[None, :]
        else:
            w_ptrs = w_ptr + rn_a[:, None] * w_row + gl.arange(0, 32, layout=gl.SliceLayout(0, a_l))[None, :]
        rm_x = gl.minimum(pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, X_LAYOUT)), M - 1)
        x_ptrs = a_ptr + rm_x[:, None] * stride_am + gl.arange(0, 128, layout=gl.SliceLayout(0, X_LAYOUT))[None, :]
        rn = pid_n * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, mma))
        rn_in = gl.minimum(rn, N - 1)
        rm = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(0, mma))
        rm_in = gl.minimum(rm, M - 1)

        for i0 in gl.static_range(STAGES - 1):
            copy_x(xs, x_ptrs, i0, t_begin, t_end, STAGES)
        acc = gl.zeros([ROWS, BM], gl.float32, mma)
        part = gl.zeros([ROWS, BM], gl.int32, mma)
        done_hi = part
        f_hi = gl.zeros([ROWS, BM], gl.float32, mma)  # the previous tile's second half: none yet (adds 0 · 0)
        ws_hi = gl.zeros([ROWS], gl.float32, gl.SliceLayout(1, mma))
        sa_hi = gl.zeros([BM], gl.float32, gl.SliceLayout(0, mma))
        ops = _weights(w_ptrs, p_ptr, t_begin, rn_a, N, hpg, groups, MODE)
        for t in range(t_begin, t_end):
            i = t - t_begin
            wait_x(STAGES)
            part_lo = _issue_half(ops, xs, i, part, 0, STAGES, MODE)
            if OVERLAP_HI:
                acc += f_hi * (ws_hi[:, None] * sa_hi[None, :])  # while the first half's products run
            part_hi = _issue_half(ops, xs, i, done_hi, 1, STAGES, MODE)
            ops = _weights(w_ptrs, p_ptr, gl.minimum(t + 1, t_end - 1), rn_a, N, hpg, groups, MODE)
            ws_lo, sa_lo = _group_scales(p_ptr, sa_ptr, 2 * t, rn_in, rm_in, N, stride_sm, hpg, groups, act_hpg,
                                         act_groups, MODE)
            ws_hi, sa_hi = _group_scales(p_ptr, sa_ptr, 2 * t + 1, rn_in, rm_in, N, stride_sm, hpg, groups,
                                         act_hpg, act_groups, MODE)
            part = warpgroup_mma_wait(num_outstanding=PENDING, deps=(part_lo, ))
            acc += _i2f(part) * (ws_lo[:, None] * sa_lo[None, :])  # while the second half's products run
            # nothing stays in flight across iterations: ptxas cannot follow a product through the loop's back
            # edge and would serialize every wgmma (C7514)
            done_hi = warpgroup_mma_wait(num_outstanding=0, deps=(part_hi, ))
            f_hi = _i2f(done_hi)  # converted now, with no product in flight: ptxas waits otherwise (C7517)
            if not OVERLAP_HI:
                acc += f_hi * (ws_hi[:, None] * sa_hi[None, :])
            copy_x(xs, x_ptrs, i + STAGES - 1, t_begin, t_end, STAGES)  # into tile i-1's slot
        if OVERLAP_HI:
            acc += f_hi * (ws_hi[:, None] * sa_hi[None, :])
        if SCATTER:
            cols = gl.load(cols_ptr + rn_in)
        else:
            cols = rn
        store_tile(out_ptr, ws_ptr, ticket_ptr, acc, rm, rn, cols, M, N, stride_om, stride_wm, pid_k, SPLIT_K)

    @gluon.jit
    def _group_wgmma_kernel(a_ptr, sa_ptr, w_ptr, p_ptr, out_ptr, ws_ptr, ticket_ptr, M, N, stride_am, stride_sm,
                            act_hpg, act_groups, w_row, n_tiles, tiles_per_split, hpg, groups, stride_om,
                            MODE: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr, SPLIT_K: gl.constexpr,
                            OVERLAP_HI: gl.constexpr):
        xs = gl.allocate_shared_memory(gl.int8, [2 * STAGES, BM, 128], X_SMEM)
        _group_tile(xs, a_ptr, sa_ptr, w_ptr, p_ptr, p_ptr, out_ptr, ws_ptr, ticket_ptr, gl.program_id(0),
                    gl.program_id(1), gl.program_id(2), M, N, stride_am, stride_sm, act_hpg, act_groups, w_row,
                    n_tiles, tiles_per_split, hpg, groups, stride_om, N, MODE, False, BM, STAGES, SPLIT_K, OVERLAP_HI)

    @gluon.jit
    def _group_wgmma_mixed_kernel(a_ptr, sa_ptr, out_ptr, ws_ptr, ticket_ptr, M, stride_am, stride_sm, act_hpg,
                                  act_groups, n_tiles, tiles_per_split, stride_om, stride_wm, tiles_a,
                                  w_a, p_a, cols_a, N_a, w_row_a, hpg_a, groups_a,
                                  w_b, p_b, cols_b, N_b, w_row_b, hpg_b, groups_b,
                                  MODE_A: gl.constexpr, MODE_B: gl.constexpr, BM: gl.constexpr,
                                  STAGES: gl.constexpr, SPLIT_K: gl.constexpr, OVERLAP_HI: gl.constexpr):
        pid_n = gl.program_id(0)
        xs = gl.allocate_shared_memory(gl.int8, [2 * STAGES, BM, 128], X_SMEM)
        if pid_n < tiles_a:
            _group_tile(xs, a_ptr, sa_ptr, w_a, p_a, cols_a, out_ptr, ws_ptr, ticket_ptr, pid_n, gl.program_id(1),
                        gl.program_id(2), M, N_a, stride_am, stride_sm, act_hpg, act_groups, w_row_a, n_tiles,
                        tiles_per_split, hpg_a, groups_a, stride_om, stride_wm, MODE_A, True, BM, STAGES, SPLIT_K,
                        OVERLAP_HI)
        else:
            # partition B's split-K slots sit after A's rows (as the Triton mixed kernel)
            _group_tile(xs, a_ptr, sa_ptr, w_b, p_b, cols_b, out_ptr, ws_ptr + N_a, ticket_ptr, pid_n - tiles_a,
                        gl.program_id(1), gl.program_id(2), M, N_b, stride_am, stride_sm, act_hpg, act_groups,
                        w_row_b, n_tiles, tiles_per_split, hpg_b, groups_b, stride_om, stride_wm, MODE_B, True, BM,
                        STAGES, SPLIT_K, OVERLAP_HI)


def group_wgmma_problem(a_codes: torch.Tensor, act_group_size: int, layouts: tuple[str, ...], k: int,
                        out: torch.Tensor | None = None, out_dtype: torch.dtype = torch.float16) -> str | None:
    """Why :func:`group_wgmma_matmul` / :func:`group_wgmma_mixed` cannot run (None: they can): ``w8`` or ``w4a16``
    weights, activation groups of 128 columns or per-token, then :func:`.wgmma_common.hopper_problem`."""
    bad = [lay for lay in layouts if lay not in LAYOUTS]
    if bad:
        return f"layout {bad[0]} is not w8 or w4a16"
    if act_group_size != -1 and act_group_size % 128:
        return f"activation groups of {act_group_size} columns"
    return hopper_problem(a_codes, k, out, out_dtype)


def _weight(layout: str, tensors: dict, meta: dict, n_tiles: int) -> dict:
    w = tensors["qweight"]
    return {"w": w, "p": tensors["scales"] if layout == "w8" else tensors["qparams"], "n": int(meta["out_features"]),
            "w_row": w.shape[1], "hpg": groups_in_halves(meta, n_tiles), "groups": int(meta["num_groups"]),
            "mode": LAYOUTS[layout]}


def group_wgmma_matmul(a_codes: torch.Tensor, a_scales: torch.Tensor, act_group_size: int, layout: str,
                       tensors: dict, meta: dict, bm: int = 64, stages: int = 3, split_k: int = 1,
                       out: torch.Tensor | None = None, out_dtype: torch.dtype = torch.float16,
                       overlap_hi: bool = True) -> torch.Tensor:
    """Y [M, N] = dequant(A)·Ŵᵀ for int8 codes [M, K] with float32 scales [M, G] and a ``w8`` or ``w4a16``
    weight (module docstring); ``bm`` tokens per program (32 or 64: three [64, BM] accumulators live in
    registers), ``stages`` activation tiles in flight, ``split_k`` programs along K. The caller checks
    :func:`group_wgmma_problem`. Same bits as :func:`.int8_gemm.int8_matmul` at the same split."""
    m, k = a_codes.shape
    n_tiles = -(-k // 256)
    wa = _weight(layout, tensors, meta, n_tiles)
    tiles_per_split, split = split_plan(n_tiles, split_k)
    out = torch.empty(m, wa["n"], dtype=out_dtype, device=a_codes.device) if out is None else out
    grid = (-(-wa["n"] // BN), -(-m // bm), split)
    ws, tickets = split_workspace(a_codes.device, m * wa["n"], split, grid[0] * grid[1])
    _group_wgmma_kernel[grid](a_codes, a_scales, wa["w"], wa["p"], out, ws, tickets, m, wa["n"], a_codes.stride(0),
                              a_scales.stride(0), act_groups_in_halves(act_group_size, k), a_scales.shape[1],
                              wa["w_row"], n_tiles, tiles_per_split, wa["hpg"], wa["groups"], out.stride(0),
                              MODE=wa["mode"], BM=bm, STAGES=stages, SPLIT_K=split, OVERLAP_HI=overlap_hi,
                              num_warps=4)
    return out


def group_wgmma_mixed(a_codes: torch.Tensor, a_scales: torch.Tensor, act_group_size: int, parts: list,
                      out_features: int, bm: int = 64, stages: int = 3, split_k: int = 1,
                      out: torch.Tensor | None = None, out_dtype: torch.dtype = torch.float16,
                      overlap_hi: bool = True) -> torch.Tensor:
    """Y [M, out_features] of a mixed-precision layer in one launch (MixLLM Sec. 3.4): ``parts`` two (layout,
    tensors, meta, rows) partitions of ``w8`` / ``w4a16`` rows, each scattered to its rows' columns; the 8-bit
    partition's programs come second (as :func:`.int8_gemm.mixed_int8_matmul`, whose bits it reproduces at the
    same split)."""
    m, k = a_codes.shape
    n_tiles = -(-k // 256)
    args = []
    for layout, tensors, meta, rows in parts:
        wa = _weight(layout, tensors, meta, n_tiles)
        wa["cols"] = rows.to(torch.int32).contiguous()
        args.append(wa)
    if args[0]["mode"] == LAYOUTS["w8"] and args[1]["mode"] != LAYOUTS["w8"]:
        args.reverse()
    a, b = args
    tiles_per_split, split = split_plan(n_tiles, split_k)
    out = torch.empty(m, out_features, dtype=out_dtype, device=a_codes.device) if out is None else out
    tiles_a = -(-a["n"] // BN)
    grid = (tiles_a + -(-b["n"] // BN), -(-m // bm), split)
    ws, tickets = split_workspace(a_codes.device, m * out_features, split, grid[0] * grid[1])
    _group_wgmma_mixed_kernel[grid](a_codes, a_scales, out, ws, tickets, m, a_codes.stride(0), a_scales.stride(0),
                                    act_groups_in_halves(act_group_size, k), a_scales.shape[1], n_tiles,
                                    tiles_per_split, out.stride(0), out_features, tiles_a,
                                    a["w"], a["p"], a["cols"], a["n"], a["w_row"], a["hpg"], a["groups"],
                                    b["w"], b["p"], b["cols"], b["n"], b["w_row"], b["hpg"], b["groups"],
                                    MODE_A=a["mode"], MODE_B=b["mode"], BM=bm, STAGES=stages, SPLIT_K=split,
                                    OVERLAP_HI=overlap_hi, num_warps=4)
    return out
