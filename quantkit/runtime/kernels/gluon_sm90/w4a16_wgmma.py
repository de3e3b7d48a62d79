"""W4A16 on Hopper with the dequantization of one warpgroup overlapping the fp16 tensor-core products of others
(Gluon).

The Triton W4A16 kernel (:mod:`quantkit.runtime.kernels.triton.w4a16`) places the 8 dequantized planes of a
256-column tile side by side in K order (a register shuffle through shared memory) and multiplies them with
``tl.dot``, which Triton 3.6 waits for before the program dequantizes its next tile, so at prefill sizes it runs
0.66-0.95× cuBLAS fp16 (docs/BENCHMARKS.md). This kernel follows :mod:`quantkit.runtime.kernels.gluon_sm90.lqq_wgmma`
(LiquidGEMM Sec. 5's ImFP pipeline, TurboMind Sec. 4.1/4.3: the packed layout follows the MMA operand,
dequantization overlaps the MMA) for fp16/bf16 operands:

* a program owns 64 weight rows per warpgroup (wgmma's M side; one or two warpgroups, which share the program's
  activation tiles and take turns on the tensor cores while the other dequantizes) × BM tokens (wgmma's N side):
  the transposed product Y^T = Ŵ·X^T (LiquidGEMM Sec. 5.4);
* the lane loads its weight words directly in the register layout of wgmma's fp16 A operand (k_width 2): the lane
  of fragment coordinates (g, c) holds words 2c, 2c + 1, 2c + 8, 2c + 9 (+ 16) of rows g and g + 8 of its warp's
  16 rows, and because word j carries column j of every plane (:mod:`quantkit.formats.nibble_planes`), byte b of
  words 2c and 2c + 1 is exactly one A-fragment register — the fp16 pair of K positions (2c, 2c + 1) — of plane b
  (low nibbles) and plane b + 4 (high nibbles). So the planes need no shuffle, and the arithmetic is the Triton
  kernel's :data:`quantkit.runtime.kernels.triton.dequant.ASM_F16` (MixLLM Sec. 3.3 / TurboMind Fig. 6
  magic-number int→float, exact (q − z), one rounding of (q − z)·s): Ŵ is the same fp16 (bf16) weight as the Triton
  kernel's and the reference's;
* plane p multiplies activation columns 32p … 32p + 31 of the tile: one k32 ``warpgroup_mma`` per plane from an
  fp16 activation tile that ``cp.async`` brought into shared memory STAGES − 1 tiles ahead (four [BM, 64] slices
  of 128 bytes a row per tile);
* a tile's 8 planes are formed (two at a time: b and b + 4 share their byte gathers; 64 registers a thread), then
  its 8 products issued asynchronously and waited for before the next tile's planes: ptxas does not keep a
  register A operand alive while its product runs, so overlapping products with the next planes inside a warpgroup
  leaves writes to such registers in the SASS (:mod:`quantkit.bench.sass`); the tensor cores overlap other
  warpgroups' work;
* fp32 accumulation over K, stored in the activation dtype, directly or through split-K slots
  (:mod:`quantkit.runtime.kernels.triton.splitk`).

Requires K a multiple of 256, 16-byte aligned activation rows, and a Hopper GPU; :func:`w4a16_wgmma_problem`
says when it cannot run. No CPU interpreter runs Gluon: the pure-torch reference of the format is
:func:`quantkit.runtime.kernels.reference.w4a16_reference`, and the GPU tests compare the two.
"""

from __future__ import annotations

import torch

from quantkit.runtime.kernels.triton.dequant import CONSTRAINTS_F16_PAIR_TEXT, asm_f16_pair
from quantkit.runtime.kernels.jit import check_device
from quantkit.runtime.kernels.triton.launch import groups_in_halves, split_plan
from quantkit.runtime.kernels.scratch import split_workspace
from quantkit.runtime.kernels.gluon_sm90.common import BN, HAVE_GLUON, hopper_problem

KERNEL = "w4a16_wgmma"  # its name for hopper_problem / launch_or_decline
TOKEN_TILES = (32, 64, 128)  # BM: wgmma's N side (the fp32 accumulator is BM / 2 registers a thread)
SMEM_RING_MAX = 196608  # bytes of activation ring a program may take (Hopper: 227 KB of shared memory per block)


if HAVE_GLUON:
    from quantkit.runtime.kernels.gluon_sm90.common import (async_copy, cp_async, cta_barrier, gl, gluon, load_words,
                                                       store_tile, wait_x, warpgroup_mma, warpgroup_mma_wait,
                                                       x_layout)

    # Triton kernels read only constexpr globals: one per byte and dtype
    ASM_F16_B0, ASM_F16_B1 = gl.constexpr(asm_f16_pair(0, False)), gl.constexpr(asm_f16_pair(1, False))
    ASM_F16_B2, ASM_F16_B3 = gl.constexpr(asm_f16_pair(2, False)), gl.constexpr(asm_f16_pair(3, False))
    ASM_BF16_B0, ASM_BF16_B1 = gl.constexpr(asm_f16_pair(0, True)), gl.constexpr(asm_f16_pair(1, True))
    ASM_BF16_B2, ASM_BF16_B3 = gl.constexpr(asm_f16_pair(2, True)), gl.constexpr(asm_f16_pair(3, True))
    CONSTRAINTS = gl.constexpr(CONSTRAINTS_F16_PAIR_TEXT)
    # an activation slice [BM, 64] fp16 as it sits in shared memory (cp.async reads it in x_layout(WG, 8))
    XH_SMEM = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))

    @gluon.constexpr_function
    def mma_f16_layout(BM, WG):
        """Accumulator layout of a [64·WG, BM] fp16/bf16 wgmma tile of WG warpgroups, each its own 64 rows
        (instruction k 16)."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4 * WG, 1], instr_shape=[16, BM, 16])

    @gluon.constexpr_function
    def a_f16_layout(BM, WG):
        """Register layout of the fp16 A operand of that tile (2 consecutive K values per 32-bit register) — also
        the layout the weight words are loaded in (docstring)."""
        return gl.DotOperandLayout(operand_index=0, parent=mma_f16_layout(BM, WG), k_width=2)

    @gluon.jit
    def _asm_f16(asm: gl.constexpr, words, zl, sl, zh, sh):
        return gl.inline_asm_elementwise(asm, CONSTRAINTS, [words, zl, sl, zh, sh], dtype=(gl.float16, gl.float16),
                                         is_pure=True, pack=2)

    @gluon.jit
    def _asm_bf16(asm: gl.constexpr, words, zl, sl, zh, sh):
        return gl.inline_asm_elementwise(asm, CONSTRAINTS, [words, zl, sl, zh, sh],
                                         dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=2)

    @gluon.jit
    def _pair(words, zl, sl, zh, sh, b: gl.constexpr, BF16: gl.constexpr):
        """Planes b and b + 4 [64, 32] of a word tile, in the A-operand layout of ``words``."""
        if BF16:
            if b == 0:
                out = _asm_bf16(ASM_BF16_B0, words, zl, sl, zh, sh)
            elif b == 1:
                out = _asm_bf16(ASM_BF16_B1, words, zl, sl, zh, sh)
            elif b == 2:
                out = _asm_bf16(ASM_BF16_B2, words, zl, sl, zh, sh)
            else:
                out = _asm_bf16(ASM_BF16_B3, words, zl, sl, zh, sh)
        else:
            if b == 0:
                out = _asm_f16(ASM_F16_B0, words, zl, sl, zh, sh)
            elif b == 1:
                out = _asm_f16(ASM_F16_B1, words, zl, sl, zh, sh)
            elif b == 2:
                out = _asm_f16(ASM_F16_B2, words, zl, sl, zh, sh)
            else:
                out = _asm_f16(ASM_F16_B3, words, zl, sl, zh, sh)
        return out

    @gluon.jit
    def _group_terms(p, BF16: gl.constexpr):
        """(1024 + z, s, -(64 + z)) [64, 1] in fp16 of ``qparams`` words (scale | zero << 16): the constants
        :data:`quantkit.runtime.kernels.triton.dequant.ASM_F16` takes for a low and a high half-tile (bf16: 128 + z,
        s rounded to bf16, 128 + z)."""
        s16 = (p & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True)
        z = ((p >> 16) & 0xFF).to(gl.float32)
        if BF16:
            z_lo = (z + 128.0).to(gl.bfloat16)
            s = s16.to(gl.float32).to(gl.bfloat16)
            z_hi = z_lo
        else:
            z_lo = (z + 1024.0).to(gl.float16)
            s = s16
            z_hi = (-64.0 - z).to(gl.float16)
        return z_lo[:, None], s[:, None], z_hi[:, None]

    @gluon.jit
    def form_planes(words, p_lo, p_hi, BF16: gl.constexpr):
        """The 8 fp16 (bf16) planes [64·WG, 32] of a word tile whose half-tiles' group words are p_lo, p_hi, in the
        A-operand layout of ``words``: plane b and b + 4 from byte b (:func:`_pair`), as (lo0, hi0, … lo3, hi3)."""
        zl, sl, _ = _group_terms(p_lo, BF16)
        _, sh, zh = _group_terms(p_hi, BF16)
        lo0, hi0 = _pair(words, zl, sl, zh, sh, 0, BF16)
        lo1, hi1 = _pair(words, zl, sl, zh, sh, 1, BF16)
        lo2, hi2 = _pair(words, zl, sl, zh, sh, 2, BF16)
        lo3, hi3 = _pair(words, zl, sl, zh, sh, 3, BF16)
        return lo0, hi0, lo1, hi1, lo2, hi2, lo3, hi3

    @gluon.jit
    def multiply_planes(planes, xs, base, acc):
        """acc + the 8 k32 products of a tile's planes (:func:`form_planes`) against the activation slices ``base``
        … ``base`` + 3 of ``xs`` ([BM, 64] each; plane b: columns 32b … of the tile, plane b + 4: 128 + 32b …),
        issued asynchronously, then all waited for: ptxas does not keep a register A operand alive while its product
        runs, so no register may be written before this wait (docs/BENCHMARKS.md)."""
        lo0, hi0, lo1, hi1, lo2, hi2, lo3, hi3 = planes
        acc = warpgroup_mma(lo0, xs.index(base).slice(0, 32, dim=1).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma(hi0, xs.index(base + 2).slice(0, 32, dim=1).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma(lo1, xs.index(base).slice(32, 32, dim=1).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma(hi1, xs.index(base + 2).slice(32, 32, dim=1).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma(lo2, xs.index(base + 1).slice(0, 32, dim=1).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma(hi2, xs.index(base + 3).slice(0, 32, dim=1).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma(lo3, xs.index(base + 1).slice(32, 32, dim=1).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma(hi3, xs.index(base + 3).slice(32, 32, dim=1).permute((1, 0)), acc, is_async=True)
        return warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))

    @gluon.jit
    def _issue_x(xs, x_ptrs, i, t_begin, t_end, STAGES: gl.constexpr):
        """Start the cp.async of activation tile t_begin + i (four 64-column slices) into ring slot i % STAGES,
        empty past t_end so that wait_group counts stay uniform; the caller commits the group."""
        s = i % STAGES
        t = t_begin + i
        ok = t < t_end
        tt = gl.where(ok, t, t_begin)
        for j in gl.static_range(4):
            cp_async(xs.index(4 * s + j), x_ptrs + tt * 256 + 64 * j, ok)

    @gluon.jit
    def _w4a16_wgmma_kernel(x_ptr, w_ptr, p_ptr, out_ptr, ws_ptr, ticket_ptr, M, N, stride_xm, stride_om, w_row,
                            n_tiles, tiles_per_split, hpg, groups, BM: gl.constexpr, STAGES: gl.constexpr,
                            SPLIT_K: gl.constexpr, BF16: gl.constexpr,
                            WG: gl.constexpr):
        pid_n = gl.program_id(0)
        pid_m = gl.program_id(1)
        pid_k = gl.program_id(2)
        t_begin = pid_k * tiles_per_split
        t_end = gl.minimum(t_begin + tiles_per_split, n_tiles)
        gl.assume(t_end > t_begin)  # the launch gives every split a tile (see lqq_wgmma: no zero-trip path)
        ROWS: gl.constexpr = 64 * WG
        mma: gl.constexpr = mma_f16_layout(BM, WG)
        a_l: gl.constexpr = a_f16_layout(BM, WG)
        x_l: gl.constexpr = x_layout(WG, 8)
        if BF16:
            xs = gl.allocate_shared_memory(gl.bfloat16, [4 * STAGES, BM, 64], XH_SMEM)
        else:
            xs = gl.allocate_shared_memory(gl.float16, [4 * STAGES, BM, 64], XH_SMEM)

        rn = pid_n * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, a_l))
        rn_in = gl.minimum(rn, N - 1)
        w_ptrs = w_ptr + rn_in[:, None] * w_row + gl.arange(0, 32, layout=gl.SliceLayout(0, a_l))[None, :]
        # token rows past M read rows from the start again (their products are never stored), as lqq_wgmma
        rm_x = (pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, x_l))) % M
        x_ptrs = x_ptr + rm_x[:, None] * stride_xm + gl.arange(0, 64, layout=gl.SliceLayout(0, x_l))[None, :]

        for i0 in gl.static_range(STAGES - 1):
            _issue_x(xs, x_ptrs, i0, t_begin, t_end, STAGES)
            async_copy.commit_group()
        acc = gl.zeros([ROWS, BM], gl.float32, mma)
        words, p_lo, p_hi = load_words(w_ptrs, p_ptr, t_begin, t_end, hpg, groups, N, rn_in)
        for t in range(t_begin, t_end):
            i = t - t_begin
            # the tile's 8 planes first, then its 8 products, then a wait for all of them (multiply_planes)
            planes = form_planes(words, p_lo, p_hi, BF16)
            # the next tile's words load while this tile's products run
            words, p_lo, p_hi = load_words(w_ptrs, p_ptr, t + 1, t_end, hpg, groups, N, rn_in)
            wait_x(STAGES)
            acc = multiply_planes(planes, xs, 4 * (i % STAGES), acc)
            # each warpgroup waits for its own products before the next wait_x, whose CTA barrier both pass, so tile
            # t-1's slot may already be free here; this barrier's removal has not been timed
            if WG > 1:
                cta_barrier()
            _issue_x(xs, x_ptrs, i + STAGES - 1, t_begin, t_end, STAGES)
            async_copy.commit_group()
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        async_copy.wait_group(0)  # the empty copies past the last tile still land in the ring (see lqq_wgmma)
        rm = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(0, mma))
        rn_o = pid_n * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, mma))
        store_tile(out_ptr, ws_ptr, ticket_ptr, acc, rm, rn_o, M, N, stride_om, pid_k, SPLIT_K)


def w4a16_wgmma_problem(x: torch.Tensor, meta: dict, out: torch.Tensor | None = None,
                        kernel: str = KERNEL) -> str | None:
    """Why :func:`w4a16_wgmma_matmul` cannot run this product (None: it can): fp16/bf16 activations, an output of
    their dtype, :func:`quantkit.runtime.kernels.gluon_sm90.common.hopper_problem` (K a multiple of 256, 16-byte
    aligned rows, Gluon, sm_90, a kernel — this one or ``kernel``, :mod:`quantkit.runtime.kernels.gluon_sm90.w4a16_ws`
    — that built with this Triton), and a row stride of a multiple of 16 elements."""
    if x.dtype not in (torch.float16, torch.bfloat16):
        return f"activations are {x.dtype}, not fp16/bf16"
    if out is not None and out.dtype != x.dtype:
        return "out must have the activations' dtype"
    # Triton specializes an integer argument divisible by 16 as such; a row stride it cannot prove 8-aligned would
    # make the 16-byte cp.async of a row fail to compile
    why = hopper_problem(x, int(meta["in_features"]), out, x.dtype, kernel)
    if why is None and x.stride(0) % 16:
        why = "activation rows are not 16-byte aligned (row stride not a multiple of 16 elements)"
    return why


def w4a16_operands(x: torch.Tensor, tensors: dict, meta: dict) -> tuple:
    """(M, K, N, qweight, qparams, 256-column tiles) of a W4A16 product on the Gluon kernels, after checking that x
    is [M, K] for this weight and that everything is on one CUDA device."""
    m, k = x.shape
    qweight, qparams = tensors["qweight"], tensors["qparams"]
    check_device(x, qweight, qparams)
    if k != int(meta["in_features"]):
        raise ValueError(f"x must be [M, {meta['in_features']}], got {tuple(x.shape)}")
    return m, k, int(meta["out_features"]), qweight, qparams, qweight.shape[1] // 32


def w4a16_wgmma_matmul(x: torch.Tensor, tensors: dict, meta: dict, bm: int = 128, stages: int = 3,
                       split_k: int = 1, warpgroups: int = 1,
                       out: torch.Tensor | None = None) -> torch.Tensor:
    """Y [M, N] = X·Ŵᵀ in x's dtype (fp16/bf16) for a ``w4a16`` weight (module docstring): Ŵ = (q − z)·s rounded
    to x's dtype per element as :func:`.reference.w4a16_reference`, fp32 accumulation; ``bm`` tokens per program
    (32, 64 or 128), ``stages`` activation tiles in flight (2-4), ``split_k`` programs along K (fp32 slots summed
    in split order, :mod:`quantkit.runtime.kernels.triton.splitk`), ``warpgroups`` (1 or 2) warpgroups per program,
    each its own 64 weight rows against the program's shared activation tiles. The caller checks
    :func:`w4a16_wgmma_problem`."""
    if (bm not in TOKEN_TILES or stages not in (2, 3, 4) or split_k < 1 or warpgroups not in (1, 2)
            or stages * bm * 512 > SMEM_RING_MAX):
        raise ValueError(f"bm must be 32, 64 or 128, stages 2-4 (3 at most with bm 128: the activation ring is "
                         f"stages·bm·512 bytes), split_k >= 1 and warpgroups 1-2; got {bm}, {stages}, {split_k}, "
                         f"{warpgroups}")
    m, k, n, qweight, qparams, n_tiles = w4a16_operands(x, tensors, meta)
    tiles_per_split, split = split_plan(n_tiles, split_k)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device) if out is None else out
    grid = (-(-n // (BN * warpgroups)), -(-m // bm), split)
    ws, tickets = split_workspace(x.device, m * n, split, grid[0] * grid[1])
    _w4a16_wgmma_kernel[grid](x, qweight, qparams, out, ws, tickets, m, n, x.stride(0), out.stride(0),
                              qweight.shape[1], n_tiles, tiles_per_split, groups_in_halves(meta, n_tiles),
                              qparams.shape[0], BM=bm, STAGES=stages, SPLIT_K=split,
                              BF16=x.dtype == torch.bfloat16, WG=warpgroups,
                              num_warps=4 * warpgroups)
    return out
