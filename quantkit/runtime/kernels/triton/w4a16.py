"""W4A16 Triton kernel: 4-bit group-wise weights in the ``w4a16`` layout × fp16/bf16 activations.

Per 256-column tile a program loads its BN rows' 32 words each (128 contiguous bytes a row), dequantizes the 8
planes in registers (:func:`quantkit.runtime.kernels.triton.dequant.planes_f16`: magic-number int→float, exact
(q - z)·s), places them side by side in K order (:func:`quantkit.runtime.kernels.triton.dequant.side_by_side`) and
issues one tensor-core product against the tile's [256, BM] activations, accumulating in fp32 (TurboMind Sec.
4.1/4.3: the packed layout follows the MMA operand, dequantization overlaps the MMA — Triton keeps consecutive
tiles' products in flight). The
product is computed transposed, Y^T = W·X^T (LiquidGEMM Sec. 5.4), so a one-token GEMV still fills the MMA's
64-row side with weights. Small M splits K over programs (:mod:`quantkit.runtime.kernels.triton.splitk`); the default tile is
:func:`quantkit.runtime.kernels.heuristic.triton_tile`.
"""

from __future__ import annotations

import torch
import triton.language as tl

from quantkit.formats.nibble_planes import PLANE_K
from quantkit.runtime.kernels.heuristic import sms_of, triton_tile
from quantkit.runtime.kernels.jit import INTERPRET, USE_ASM, PreparedLaunch, check_device, kernel, launch_kernel
from quantkit.runtime.kernels.triton.dequant import planes_f16, side_by_side
from quantkit.runtime.kernels.triton.launch import TileConfig, groups_in_halves, split_plan
from quantkit.runtime.kernels.scratch import split_workspace
from quantkit.runtime.kernels.triton.splitk import store_tile


@kernel
def _bf16_rne(h):
    """fp16 → bf16 rounded to nearest even, in integer arithmetic (the CPU interpreter's conversion truncates;
    on a GPU this equals cvt.rn.bf16.f16)."""
    b = h.to(tl.float32).to(tl.int32, bitcast=True)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return b.to(tl.int16).to(tl.bfloat16, bitcast=True)


@kernel
def _group_params(p_ptr, g, N, rn_in, BF16: tl.constexpr):
    """(scale [BN, 1] in the activation dtype, zero point [BN, 1] uint8) of group g from ``qparams`` words."""
    p = tl.load(p_ptr + g * N + rn_in)
    s = (p & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
    if BF16:
        s = _bf16_rne(s)
    return s[:, None], ((p >> 16) & 0xFF).to(tl.uint8)[:, None]


@kernel
def _w4a16_kernel(x_ptr, w_ptr, p_ptr, out_ptr, ws_ptr, ticket_ptr, M, N, K, stride_xm, stride_om, w_row, n_tiles,
                  tiles_per_split, halves_per_group, n_groups,
                  BN: tl.constexpr, BM: tl.constexpr, SPLIT_K: tl.constexpr, BF16: tl.constexpr,
                  EVEN_K: tl.constexpr, USE_ASM: tl.constexpr, UPCAST_DOT: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    rn = pid_n * BN + tl.arange(0, BN)
    rm = pid_m * BM + tl.arange(0, BM)
    rj = tl.arange(0, 32)
    rk = tl.arange(0, 256)
    # rows past N / tokens past M read row N-1 / tokens from the start again (never stored): no masks in the main
    # loop. (Clamped to M - 1, every program of a ragged last token tile read that one row many times over, the
    # same lines from all SMs; measured on the LiquidQuant kernels, docs/BENCHMARKS.md: up to 4x in the Gluon one.)
    rn_in = tl.minimum(rn, N - 1)
    rm_in = rm % M
    w_ptrs = w_ptr + rn_in[:, None] * w_row + rj[None, :]
    x_ptrs = x_ptr + rm_in[None, :] * stride_xm + rk[:, None]
    acc = tl.full((BN, BM), 0.0, tl.float32)
    t_begin = pid_k * tiles_per_split
    t_end = tl.minimum(t_begin + tiles_per_split, n_tiles)
    for t in range(t_begin, t_end):
        words = tl.load(w_ptrs + t * 32)
        # clamped: a half-tile past K (K not a multiple of 256) has no group; its codes meet zero activations
        g_lo = tl.minimum((2 * t) // halves_per_group, n_groups - 1)
        g_hi = tl.minimum((2 * t + 1) // halves_per_group, n_groups - 1)
        s_lo, z_lo = _group_params(p_ptr, g_lo, N, rn_in, BF16)
        s_hi, z_hi = _group_params(p_ptr, g_hi, N, rn_in, BF16)
        planes = planes_f16(words, z_lo, s_lo, z_hi, s_hi, BF16, USE_ASM)
        if EVEN_K:
            xt = tl.load(x_ptrs + t * 256)
        else:
            k = t * 256 + rk
            xt = tl.load(x_ptrs + t * 256, mask=(k < K)[:, None], other=0.0)
        # one product over the 8 planes side by side: Triton keeps the dequantized operand in registers and
        # the tensor-core products of consecutive tiles in flight (8 separate products waited for each other)
        w = side_by_side(planes, 0, 8)
        if UPCAST_DOT:  # the CPU interpreter's bf16 tl.dot is wrong; fp32 holds bf16 products exactly
            acc = tl.dot(w.to(tl.float32), xt.to(tl.float32), acc)
        else:
            acc = tl.dot(w, xt, acc)
    n_ok = rn < N
    m_ok = rm < M
    mask = m_ok[None, :] & n_ok[:, None]
    store_tile(out_ptr, out_ptr + rm[None, :] * stride_om + rn[:, None], ws_ptr + rm[None, :] * N + rn[:, None],
               acc, mask, ticket_ptr + pid_m * tl.num_programs(0) + pid_n, pid_k, M * N, SPLIT_K)


@kernel
def _w4a16_dequant_kernel(w_ptr, p_ptr, out_ptr, N, K, w_row, halves_per_group, n_groups, BN: tl.constexpr,
                          BF16: tl.constexpr, USE_ASM: tl.constexpr):
    """Ŵ[rows, 256-column tile] = (q - z)·s in the output dtype, the same bits the GEMM kernel multiplies."""
    pid_n = tl.program_id(0)
    t = tl.program_id(1)
    rn = pid_n * BN + tl.arange(0, BN)
    rn_in = tl.minimum(rn, N - 1)
    words = tl.load(w_ptr + rn_in[:, None] * w_row + t * 32 + tl.arange(0, 32)[None, :])
    s_lo, z_lo = _group_params(p_ptr, tl.minimum((2 * t) // halves_per_group, n_groups - 1), N, rn_in, BF16)
    s_hi, z_hi = _group_params(p_ptr, tl.minimum((2 * t + 1) // halves_per_group, n_groups - 1), N, rn_in, BF16)
    w = side_by_side(planes_f16(words, z_lo, s_lo, z_hi, s_hi, BF16, USE_ASM), 0, 8)
    k = t * 256 + tl.arange(0, 256)
    tl.store(out_ptr + rn[:, None] * K + k[None, :], w, mask=(rn < N)[:, None] & (k < K)[None, :])


def w4a16_dequantize(tensors: dict, meta: dict, dtype: torch.dtype = torch.float16,
                     use_asm: bool | None = None) -> torch.Tensor:
    """Ŵ [N, K] of a ``w4a16`` weight in ``dtype`` (fp16/bf16), dequantized on the GPU with the GEMM kernel's
    arithmetic: bit-identical to :func:`.reference.w4a16_weight`."""
    qweight, qparams = tensors["qweight"], tensors["qparams"]
    check_device(qweight, qparams)
    n, k = int(meta["out_features"]), int(meta["in_features"])
    n_tiles = qweight.shape[1] // PLANE_K
    out = torch.empty(n, k, dtype=dtype, device=qweight.device)
    bn = 64
    launch_kernel(_w4a16_dequant_kernel, (-(-n // bn), n_tiles), qweight, qparams, out, n, k, qweight.shape[1],
                  groups_in_halves(meta, n_tiles), qparams.shape[0], BN=bn, BF16=dtype == torch.bfloat16,
                  USE_ASM=USE_ASM if use_asm is None else use_asm, num_warps=4)
    return out


def check_input(x: torch.Tensor, tensors: dict, meta: dict) -> None:
    """A ValueError unless ``x`` is fp16/bf16 [M, in_features] with unit column stride on the weight's device."""
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"w4a16 kernel takes fp16/bf16 activations, got {x.dtype}")
    check_device(x, tensors["qweight"], tensors["qparams"])
    if x.dim() != 2 or x.shape[1] != int(meta["in_features"]) or x.stride(1) != 1:
        raise ValueError(f"x must be [M, {meta['in_features']}] with unit column stride, got {tuple(x.shape)}")


def triton_w4a16_matmul(x: torch.Tensor, tensors: dict, meta: dict, config: TileConfig | None = None,
                        out: torch.Tensor | None = None, use_asm: bool | None = None) -> torch.Tensor:
    """Y = X·Ŵᵀ [M, N] in x's dtype (fp16 or bf16) on the Triton kernel (module docstring) for a ``w4a16`` weight,
    Ŵ = (q - z)·s rounded to x's dtype per element (bf16: s rounded to bf16 first); fp32 accumulation. ``x``
    [M, K] (any row stride, unit column stride); ``config`` the tile (default :func:`.heuristic.triton_tile`);
    ``out`` an optional [M, N] result; ``use_asm`` False forces the plain-Triton dequantization.
    Reference: :func:`quantkit.runtime.kernels.reference.w4a16_reference`."""
    check_input(x, tensors, meta)
    out = torch.empty(x.shape[0], int(meta["out_features"]), dtype=x.dtype, device=x.device) if out is None else out
    fn, grid, *args, kwargs = _launch(x, tensors, meta, config, out, use_asm)
    launch_kernel(fn, grid, *args, **kwargs)
    return out


def _launch(x: torch.Tensor, tensors: dict, meta: dict, config: TileConfig | None, out: torch.Tensor,
            use_asm: bool | None) -> tuple:
    """(kernel, grid, *arguments, {constexprs and options}) of :func:`triton_w4a16_matmul`'s launch, x at argument
    0 and out at argument 3 (:data:`BoundTritonW4a16.SLOTS`)."""
    qweight, qparams = tensors["qweight"], tensors["qparams"]
    bf16 = x.dtype == torch.bfloat16
    m, k = x.shape
    n = int(meta["out_features"])
    n_tiles = qweight.shape[1] // PLANE_K
    cfg = config or triton_tile(m, n, k, sms_of(x.device))
    tiles_per_split, split = split_plan(n_tiles, cfg.split_k)
    grid = (-(-n // cfg.bn), -(-m // cfg.bm), split)
    ws, tickets = split_workspace(x.device, m * n, split, grid[0] * grid[1])
    return (_w4a16_kernel, grid, x, qweight, qparams, out, ws, tickets, m, n, k, x.stride(0), out.stride(0),
            qweight.shape[1], n_tiles, tiles_per_split, groups_in_halves(meta, n_tiles), qparams.shape[0],
            dict(BN=cfg.bn, BM=cfg.bm, SPLIT_K=split, BF16=bf16, EVEN_K=k % 256 == 0,
                 USE_ASM=USE_ASM if use_asm is None else use_asm, UPCAST_DOT=INTERPRET and bf16,
                 num_warps=cfg.num_warps, num_stages=cfg.num_stages))


class BoundTritonW4a16:
    """:func:`triton_w4a16_matmul` of one layer at one token count, dtype and row stride, with its launch prepared
    once (:class:`~quantkit.runtime.kernels.jit.PreparedLaunch`): a call allocates the output and launches. A call
    with another shape, row stride or dtype, or one the prepared launch turns down, returns None (the caller then
    runs :func:`triton_w4a16_matmul`)."""

    SLOTS = (0, 3)  # the activation's and the output's positions in the kernel's arguments

    def __init__(self, prepared: PreparedLaunch, x: torch.Tensor, n: int):
        self.prepared, self.n = prepared, n
        self.shape, self.stride, self.dtype, self.device = x.shape, x.stride(), x.dtype, x.device

    @classmethod
    def create(cls, x: torch.Tensor, tensors: dict, meta: dict, config: TileConfig | None = None
               ) -> BoundTritonW4a16 | None:
        """The bound launch for activations like ``x`` with the tile ``config`` (default: the launch rule's), or
        None where launches cannot be prepared here (the interpreter, an old Triton)."""
        check_input(x, tensors, meta)
        out = torch.empty(x.shape[0], int(meta["out_features"]), dtype=x.dtype, device=x.device)
        fn, grid, *args, kwargs = _launch(x, tensors, meta, config, out, None)
        prepared = PreparedLaunch.create(fn, grid, tuple(args), kwargs, cls.SLOTS)
        return None if prepared is None else cls(prepared, x, int(meta["out_features"]))

    def __call__(self, x: torch.Tensor) -> torch.Tensor | None:
        if x.shape != self.shape or x.stride() != self.stride or x.dtype != self.dtype:
            return None
        out = torch.empty(self.shape[0], self.n, dtype=self.dtype, device=self.device)
        return out if self.prepared(x, out) else None
