"""Fused activation quantization (Triton): fp16/bf16/fp32 activations [M, K] → int8 codes [M, K] and float32
scales [M, G] in one pass over the tile, bit-identical to :func:`quantkit.quant.act.quantize_activation_int`
(MixLLM Sec. 3.1.2: 8-bit symmetric, group size 128 along K, or per token with group_size -1).

Per (row, group): s = absmax / 127 (absmax floored at 1e-8) rounded *up* to fp16 (grid.round_scale_up: the
nearest fp16, bumped one ulp when it fell below s), codes = round-half-even(x / s) clamped to [-127, 127].
The division is IEEE round-to-nearest (tl.math.div_rn) and rounding uses the 1.5·2^23 magic add — both exactly
what torch computes — so the codes match bit for bit. Every element is read once: a program holds whole groups
(or whole rows, per token) in registers. On Hopper each program first lets the next kernel launch (programmatic
dependent launch, :mod:`quantkit.runtime.kernels.cuda.common`): the decode GEMV after it streams its weights while
the codes are made.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from quantkit.errors import QuantkitError
from quantkit.quant.grid import num_groups
from quantkit.runtime.kernels.cuda.common import pdl_supported
from quantkit.runtime.kernels.jit import PreparedByShape, PreparedLaunch, check_device, kernel, launch_kernel

try:  # programmatic dependent launch's trigger (recent Triton; 3.6 has it); without it the quantizer never signals
    from triton.language.extra.cuda import gdc_launch_dependents
    HAVE_GDC = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    HAVE_GDC = False

    @kernel
    def gdc_launch_dependents():
        pass

FP16_TINY = tl.constexpr(6.103515625e-05)  # smallest normal fp16 (round_scale_up clamps to it)
FP16_MAX = tl.constexpr(65504.0)
ROUND_MAGIC = tl.constexpr(12582912.0)  # 1.5·2^23: (y + M) - M rounds y half-to-even for |y| < 2^22
MAX_ROW = 65536  # per-token rows up to this many features are quantized by one program


@kernel
def _scale_up(absmax, QMAX: tl.constexpr):
    """fp16-representable scale >= absmax / QMAX, as float32 (quantkit.quant.grid.round_scale_up)."""
    s = tl.math.div_rn(tl.maximum(absmax, 1e-8), QMAX)
    s = tl.minimum(tl.maximum(s, FP16_TINY), FP16_MAX)
    h = s.to(tl.float16)
    up = (h.to(tl.int16, bitcast=True) + 1).to(tl.float16, bitcast=True)
    return tl.where(h.to(tl.float32) < s, up.to(tl.float32), h.to(tl.float32))


@kernel
def _codes(x, s, QMAX: tl.constexpr):
    """clamp(round_half_even(x / s), -QMAX, QMAX) as int8."""
    y = tl.math.div_rn(x, s)
    y = (y + ROUND_MAGIC) - ROUND_MAGIC
    return tl.minimum(tl.maximum(y, -QMAX), QMAX).to(tl.int8)


@kernel
def _act_quant_group_kernel(x_ptr, c_ptr, s_ptr, M, K, G, stride_xm, stride_cm, stride_sm,
                            GS: tl.constexpr, BM: tl.constexpr, QMAX: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # the GEMV after may launch now: it streams weights until these codes are complete (cuda_common)
        gdc_launch_dependents()
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    g = tl.program_id(1)
    k = g * GS + tl.arange(0, GS)
    mask = (rm < M)[:, None] & (k < K)[None, :]
    x = tl.load(x_ptr + rm[:, None] * stride_xm + k[None, :], mask=mask, other=0.0).to(tl.float32)
    s = _scale_up(tl.max(tl.abs(x), axis=1), QMAX)
    tl.store(c_ptr + rm[:, None] * stride_cm + k[None, :], _codes(x, s[:, None], QMAX), mask=mask)
    tl.store(s_ptr + rm * stride_sm + g, s, mask=rm < M)


@kernel
def _act_quant_token_kernel(x_ptr, c_ptr, s_ptr, M, K, stride_xm, stride_cm, stride_sm,
                            BK: tl.constexpr, BM: tl.constexpr, QMAX: tl.constexpr, PDL: tl.constexpr):
    """Per-token scales: BM whole rows (BK >= K) per program, read once — a loop over K chunks would chain one
    memory round trip per chunk, which dominates a decode step with one token."""
    if PDL:
        gdc_launch_dependents()
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    k = tl.arange(0, BK)
    mask = (rm < M)[:, None] & (k < K)[None, :]
    x = tl.load(x_ptr + rm[:, None] * stride_xm + k[None, :], mask=mask, other=0.0).to(tl.float32)
    s = _scale_up(tl.max(tl.abs(x), axis=1), QMAX)
    tl.store(c_ptr + rm[:, None] * stride_cm + k[None, :], _codes(x, s[:, None], QMAX), mask=mask)
    tl.store(s_ptr + rm * stride_sm, s, mask=rm < M)


FP8_MAX = tl.constexpr(448.0)  # the largest finite float8_e4m3fn
FP32_TINY = tl.constexpr(1.1754943508222875e-38)  # smallest normal fp32 (the FP8 scale's floor)


@kernel
def _e4m3_bits(y):
    """The float8_e4m3fn bit pattern (int32 0..255) of fp32 ``y`` with |y| <= 448, rounded to nearest, ties to even
    — torch's cast, done with integer operations so that the interpreter computes it too. Normal e4m3 values keep 3
    mantissa bits (the fp32 mantissa rounded at bit 20, a carry moving into the exponent); below 2^-6 the values
    are multiples of 2^-9, whose count n (0..8, 8 being 2^-6) is the code itself; the sign is kept, -0 included."""
    bits = y.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a = tl.abs(y)
    ab = a.to(tl.int32, bitcast=True)
    r = (ab + 0x7FFFF + ((ab >> 20) & 1)) & 0x7FF00000  # mantissa rounded to 3 bits, half to even
    normal = (((r >> 23) - 120) << 3) | ((r >> 20) & 7)
    sub = ((a * 512.0 + ROUND_MAGIC) - ROUND_MAGIC).to(tl.int32)  # round_half_even(|y| / 2^-9)
    return sign | tl.where(a < 0.015625, sub, normal)


@kernel
def _act_quant_fp8_kernel(x_ptr, c_ptr, s_ptr, M, K, stride_xm, stride_cm, BK: tl.constexpr, BM: tl.constexpr):
    """Per-token FP8: s = absmax / 448 (at least fp32's smallest normal; 1 for an all-zero row), codes =
    e4m3(clamp(x / s, ±448)) as bytes; BM whole rows per program."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    k = tl.arange(0, BK)
    mask = (rm < M)[:, None] & (k < K)[None, :]
    x = tl.load(x_ptr + rm[:, None] * stride_xm + k[None, :], mask=mask, other=0.0).to(tl.float32)
    absmax = tl.max(tl.abs(x), axis=1)
    s = tl.maximum(tl.math.div_rn(absmax, FP8_MAX), FP32_TINY)
    s = tl.where(absmax > 0, s, 1.0)
    y = tl.math.div_rn(x, s[:, None])
    y = tl.minimum(tl.maximum(y, -FP8_MAX), FP8_MAX)
    tl.store(c_ptr + rm[:, None] * stride_cm + k[None, :], _e4m3_bits(y).to(tl.uint8), mask=mask)
    tl.store(s_ptr + rm, s, mask=rm < M)


def quantize_activation_fp8_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes float8_e4m3fn [M, K], scales float32 [M, 1]) of activations ``x`` [M, K] (unit column stride) in one
    pass: bit-identical to :func:`quantkit.quant.act.quantize_activation_fp8_codes` (vLLM's dynamic per-token FP8)."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x must be [M, K] with unit column stride, got shape {tuple(x.shape)}")
    check_device(x)
    m, k = x.shape
    codes = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    bk = triton.next_power_of_2(max(k, 1))
    if bk > MAX_ROW:
        raise QuantkitError(f"per-token FP8 quantization holds whole rows of at most {MAX_ROW} features in one "
                            f"program, got K = {k}")
    if m:
        bm, warps = act_quant_launch(m, bk, -1)
        launch_kernel(_act_quant_fp8_kernel, (-(-m // bm),), x, codes.view(torch.uint8), scales, m, k, x.stride(0),
                      codes.stride(0), BK=bk, BM=bm, num_warps=warps)
    return codes, scales


TOKEN_ROW_ELEMS = 4096  # per-token rows narrower than this share a program, up to this many columns a program


def act_quant_launch(m: int, k_padded: int, group_size: int) -> tuple[int, int]:
    """(rows per program, warps) of the activation quantizer for M rows of ``k_padded`` (the power of two >= K)
    columns; ``group_size`` -1 for per-token scales. A program's rows past M are masked but still pay the rounding,
    so decode sizes take one row a program; per-token rows get warps enough that no thread holds more than 64
    values; group-wise scales batch 4 rows up to 64 tokens and 16 above."""
    if group_size == -1:
        rows = 1 if k_padded >= TOKEN_ROW_ELEMS else min(1 << (m - 1).bit_length(), TOKEN_ROW_ELEMS // k_padded)
        return rows, min(32, max(8, k_padded // 2048))
    if m <= 4:
        return 1, 2
    return (4, 4) if m <= 64 else (16, 4)


_PREPARED = PreparedByShape()  # call shape → (prepared launch, groups)


def quantize_activation_triton(x: torch.Tensor, bits: int = 8, group_size: int = 128,
                               launch: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes int8 [M, K], scales float32 [M, G]) of activations ``x`` [M, K] — the same values as
    :func:`quantkit.quant.act.quantize_activation_int` (module docstring). ``group_size``: a power of two >= 16
    or -1 (per token). ``launch``: (rows per program, warps), default :func:`act_quant_launch`. A call shaped like
    an earlier one (shape, strides, dtype, device, bits, groups) reuses its prepared launch
    (:class:`~quantkit.runtime.kernels.jit.PreparedLaunch`): decode steps quantize the same shapes every token."""
    key = (tuple(x.shape), x.stride(), x.dtype, x.device, bits, group_size, None if launch is None else tuple(launch))
    prepared, g = _PREPARED.get(key)
    if prepared is not None:
        codes = torch.empty(x.shape, dtype=torch.int8, device=x.device)
        scales = torch.empty(x.shape[0], g, dtype=torch.float32, device=x.device)
        if prepared(x, codes, scales):
            return codes, scales
    if not 2 <= int(bits) <= 8:
        raise QuantkitError(f"activation bits must be in 2..8, got {bits}; MixLLM uses 8")
    if group_size != -1 and (group_size < 16 or group_size & (group_size - 1)):
        raise QuantkitError(f"the activation-quantization kernel takes group sizes that are powers of two >= 16 "
                            f"or -1 (per token), got {group_size}")
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x must be [M, K] with unit column stride, got shape {tuple(x.shape)}")
    check_device(x)
    m, k = x.shape
    g = num_groups(k, group_size)
    codes = torch.empty(m, k, dtype=torch.int8, device=x.device)
    scales = torch.empty(m, g, dtype=torch.float32, device=x.device)
    qmax = float(2 ** (bits - 1) - 1)
    bk = triton.next_power_of_2(k)
    if group_size == -1 and bk > MAX_ROW:
        raise QuantkitError(f"per-token activation quantization holds whole rows of at most {MAX_ROW} "
                            f"features in one program, got K = {k}; use group_size 128")
    if m == 0:
        return codes, scales
    bm, warps = launch or act_quant_launch(m, bk, group_size)
    if bm < 1 or bm & (bm - 1) or warps < 1 or warps & (warps - 1):
        raise ValueError(f"launch must be (rows, warps), powers of two, got {launch}")
    pdl = HAVE_GDC and x.is_cuda and pdl_supported(x.device.index if x.device.index is not None
                                                   else torch.cuda.current_device())
    if group_size == -1:
        fn, grid = _act_quant_token_kernel, (-(-m // bm),)
        args = (x, codes, scales, m, k, x.stride(0), codes.stride(0), scales.stride(0))
        kwargs = dict(BK=bk, BM=bm, QMAX=qmax, PDL=pdl, num_warps=warps)
    else:
        fn, grid = _act_quant_group_kernel, (-(-m // bm), g)
        args = (x, codes, scales, m, k, g, x.stride(0), codes.stride(0), scales.stride(0))
        kwargs = dict(GS=group_size, BM=bm, QMAX=qmax, PDL=pdl, num_warps=warps)
    launch_kernel(fn, grid, *args, **kwargs)
    _PREPARED.remember(key, lambda: PreparedLaunch.create(fn, grid, args, kwargs, (0, 1, 2)), g)
    return codes, scales
