"""W4A16 on Hopper with a producer warp: the warp-specialized form of
:mod:`quantkit.runtime.kernels.gluon_sm90.w4a16_wgmma` (Gluon), built as
:mod:`quantkit.runtime.kernels.gluon_sm90.lqq_ws` is for LiquidQuant (LiquidGEMM Sec. 5's ImFP shape: a load warp
feeds compute warpgroups).

* the **producer** (one warp) walks the K tiles: waits until ring slot ``t % STAGES`` is empty (mbarrier
  ``empty``), then starts the TMA of fp16/bf16 activation tile t — four [BM, 64] boxes (128 bytes a row, the
  slices wgmma reads) — completing on mbarrier ``ready``;
* the **consumers** (one warpgroup of 64 weight rows: the default partition; with two warpgroups, 128 rows, the
  second is a 4-warp worker partition of its own) form a tile's 8 planes from the words they load in wgmma's
  A-operand layout (:func:`quantkit.runtime.kernels.gluon_sm90.w4a16_wgmma.form_planes`: MixLLM Sec. 3.3 /
  TurboMind Fig. 6 magic-number int→float, exact (q − z), one rounding of (q − z)·s), load the next tile's words,
  wait on ``ready``, issue the 8 k32 products and wait for them
  (:func:`quantkit.runtime.kernels.gluon_sm90.w4a16_wgmma.multiply_planes`: no register is rewritten while a
  product reads it), then release the slot (``empty`` completes with one arrival from each warpgroup). The two
  warpgroups are partitions of their own rather than one 8-warp partition meeting at a barrier before each release
  (where they dequantize at once and then wait on the tensor cores at once): apart they take turns, 1.16-1.37×
  faster at every launch timed (docs/BENCHMARKS.md, Measured and dropped);
* a ragged last token tile moves back to end at token M − 1 (TMA boxes reaching past M are slow in
  :mod:`quantkit.runtime.kernels.gluon_sm90.lqq_ws`) and stores only its new rows
  (:func:`quantkit.runtime.kernels.gluon_sm90.common.store_rows`); fp32 sums over K in the tile order of
  :mod:`quantkit.runtime.kernels.gluon_sm90.w4a16_wgmma`, so the two give the same bits at the same token tile.

Unsplit launches of 128 tokens, one or two warpgroups (by default
:func:`quantkit.runtime.kernels.heuristic.w4a16_gluon_launch`: one warpgroup where its programs fit one wave, else
two). The GPU tests compare it with :mod:`quantkit.runtime.kernels.gluon_sm90.w4a16_wgmma`
bit for bit and with :func:`quantkit.runtime.kernels.reference.w4a16_reference`.
"""

from __future__ import annotations

import torch

from quantkit.runtime.kernels.triton.launch import groups_in_halves
from quantkit.runtime.kernels.gluon_sm90.w4a16_wgmma import w4a16_operands, w4a16_wgmma_problem
from quantkit.runtime.kernels.gluon_sm90.common import BN, HAVE_GLUON, PART_REGS, PRODUCER_REGS, ws_maxnreg

KERNEL = "w4a16_ws"

if HAVE_GLUON:
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from quantkit.runtime.kernels.gluon_sm90.w4a16_wgmma import a_f16_layout, form_planes, mma_f16_layout, multiply_planes
    from quantkit.runtime.kernels.gluon_sm90.common import (gl, gluon, load_words, mbarrier, ring_barriers,
                                                       store_rows, tma_load, weight_rows)

    PRODUCER_REGS_C = gl.constexpr(PRODUCER_REGS)  # Triton kernels read only constexpr globals

    @gluon.jit
    def _producer(x_desc, xs, ready, empty, row0, n_tiles, BM: gl.constexpr, STAGES: gl.constexpr):
        """Activation tile t into ring slot t % STAGES once the consumers released it (module docstring)."""
        NBYTES: gl.constexpr = 512 * BM  # a tile: 256 fp16/bf16 columns of BM token rows
        for t in range(n_tiles):
            s = t % STAGES
            # the ring's mbarriers start with phase 1 complete: the first STAGES waits pass at once
            mbarrier.wait(empty.index(s), ((t // STAGES) & 1) ^ 1)
            bar = ready.index(s)
            mbarrier.expect(bar, NBYTES)
            for j in gl.static_range(4):
                tma_load(x_desc, [row0, 256 * t + 64 * j], bar, xs.index(4 * s + j))

    @gluon.jit
    def _consumers(xs, ready, empty, w_ptr, p_ptr, out_ptr, M, N, stride_om, w_row, n_tiles, hpg, groups, pid_n,
                   row0, first, BM: gl.constexpr, STAGES: gl.constexpr, BF16: gl.constexpr):
        """One consumer warpgroup: dequantize, multiply and store the [64, BM] output tile of rows 64·pid_n …
        (module docstring)."""
        mma: gl.constexpr = mma_f16_layout(BM, 1)
        rn_in, w_ptrs = weight_rows(w_ptr, pid_n, 64, N, w_row, a_f16_layout(BM, 1))
        acc = gl.zeros([64, BM], gl.float32, mma)
        words, p_lo, p_hi = load_words(w_ptrs, p_ptr, 0, n_tiles, hpg, groups, N, rn_in)
        for t in range(n_tiles):
            s = t % STAGES
            planes = form_planes(words, p_lo, p_hi, BF16)
            words, p_lo, p_hi = load_words(w_ptrs, p_ptr, t + 1, n_tiles, hpg, groups, N, rn_in)
            mbarrier.wait(ready.index(s), (t // STAGES) & 1)
            acc = multiply_planes(planes, xs, 4 * s, acc)
            mbarrier.arrive(empty.index(s), count=1)  # this warpgroup's products are complete: its read of the slot
        rm = row0 + gl.arange(0, BM, layout=gl.SliceLayout(0, mma))
        rn_o = pid_n * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, mma))
        store_rows(out_ptr, acc, rm, rn_o, first, M, N, stride_om)

    @gluon.jit
    def _w4a16_ws_kernel(x_desc, w_ptr, p_ptr, out_ptr, M, N, stride_om, w_row, n_tiles, hpg, groups,
                         BM: gl.constexpr, STAGES: gl.constexpr, WG: gl.constexpr, BF16: gl.constexpr,
                         PART_REGS: gl.constexpr):
        pid_n = gl.program_id(0)
        # a ragged last token tile ends at row M - 1 (module docstring); rows below ``first`` are the tile before's
        first = gl.program_id(1) * BM
        row0 = gl.maximum(gl.minimum(first, M - BM), 0)
        gl.assume(n_tiles > 0)
        if BF16:
            xs = gl.allocate_shared_memory(gl.bfloat16, [4 * STAGES, BM, 64], x_desc.layout)
        else:
            xs = gl.allocate_shared_memory(gl.float16, [4 * STAGES, BM, 64], x_desc.layout)
        ready, empty = ring_barriers(STAGES, WG)
        if WG == 1:
            gl.warp_specialize([
                (_consumers, (xs, ready, empty, w_ptr, p_ptr, out_ptr, M, N, stride_om, w_row, n_tiles, hpg, groups,
                              pid_n, row0, first, BM, STAGES, BF16)),
                (_producer, (x_desc, xs, ready, empty, row0, n_tiles, BM, STAGES)),
            ], [1], [PRODUCER_REGS_C])
        else:  # rows 128·pid_n … + 63 and the 64 after, a warpgroup (partition) each
            gl.warp_specialize([
                (_consumers, (xs, ready, empty, w_ptr, p_ptr, out_ptr, M, N, stride_om, w_row, n_tiles, hpg, groups,
                              2 * pid_n, row0, first, BM, STAGES, BF16)),
                (_consumers, (xs, ready, empty, w_ptr, p_ptr, out_ptr, M, N, stride_om, w_row, n_tiles, hpg, groups,
                              2 * pid_n + 1, row0, first, BM, STAGES, BF16)),
                (_producer, (x_desc, xs, ready, empty, row0, n_tiles, BM, STAGES)),
            ], [4, 1], [PART_REGS, PRODUCER_REGS_C])

def w4a16_ws_problem(x: torch.Tensor, meta: dict, out: torch.Tensor | None = None) -> str | None:
    """Why :func:`w4a16_ws_matmul` cannot run this product (None: it can):
    :func:`quantkit.runtime.kernels.gluon_sm90.w4a16_wgmma.w4a16_wgmma_problem` (fp16/bf16 activations and output, K a
    multiple of 256, 16-byte aligned rows, Gluon, sm_90) under this kernel's own build record."""
    return w4a16_wgmma_problem(x, meta, out, kernel=KERNEL)


def w4a16_ws_matmul(x: torch.Tensor, tensors: dict, meta: dict, stages: int = 3, warpgroups: int = 1,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """Y [M, N] = X·Ŵᵀ in x's dtype (fp16/bf16) for a ``w4a16`` weight, as
    :func:`quantkit.runtime.kernels.gluon_sm90.w4a16_wgmma.w4a16_wgmma_matmul` with 128-token tiles unsplit (the same
    bits), with a producer warp bringing the activations over TMA (module docstring); ``stages`` activation tiles in
    the ring (2 or 3: 64 KB each, so one program an SM, whose register budget
    :func:`quantkit.runtime.kernels.gluon_sm90.common.ws_maxnreg` sets), ``warpgroups`` 1 or 2. The caller checks
    :func:`w4a16_ws_problem`."""
    if stages not in (2, 3) or warpgroups not in (1, 2):
        raise ValueError(f"stages must be 2-3 and warpgroups 1-2; got {stages}, {warpgroups}")
    m, k, n, qweight, qparams, n_tiles = w4a16_operands(x, tensors, meta)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device) if out is None else out
    layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    x_desc = TensorDescriptor(x, [m, k], [x.stride(0), 1], [128, 64], layout)
    grid = (-(-n // (BN * warpgroups)), -(-m // 128))
    _w4a16_ws_kernel[grid](x_desc, qweight, qparams, out, m, n, out.stride(0), qweight.shape[1], n_tiles,
                           groups_in_halves(meta, n_tiles), qparams.shape[0], BM=128, STAGES=stages,
                           WG=warpgroups, BF16=x.dtype == torch.bfloat16, PART_REGS=PART_REGS, num_warps=4,
                           maxnreg=ws_maxnreg(warpgroups, 1))
    return out


__all__ = ["KERNEL", "w4a16_ws_matmul", "w4a16_ws_problem"]
