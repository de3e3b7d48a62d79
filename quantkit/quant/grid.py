"""Group-wise uniform quantization grids, 2-8 bits, asymmetric (zero point) and symmetric.

MixLLM Sec. 3.1.2 (and Sec. 4.1: 4-bit asymmetric g128 / 8-bit symmetric g128 weights); the affine form
Q = round(W/s + z), W^ = (Q - z)·s is LiquidGEMM Eq. 1-2. Conventions live in :mod:`quantkit.quant.records`.
"""

from __future__ import annotations

import torch

from quantkit.quant.records import QuantizedWeight


def check_bits(bits: int) -> None:
    if not 2 <= int(bits) <= 8:
        raise ValueError(f"bits must be in 2..8, got {bits}")


def num_groups(k: int, group_size: int) -> int:
    """Groups along K: ceil(K / group_size), or 1 for per-channel (group_size -1)."""
    return 1 if group_size == -1 else -(-k // group_size)


def device_scalar(value: float, like: torch.Tensor) -> torch.Tensor:
    """``value`` as a float32 0-dim tensor on ``like``'s device, to divide by. CUDA turns ``x / python_scalar``
    into ``x * (1 / scalar)`` (one rounding more than a true division), so dividing by a plain number gives
    different codes on GPU and CPU; a device tensor makes both take the IEEE division."""
    return torch.tensor(float(value), dtype=torch.float32, device=like.device)


def round_scale_up(scale: torch.Tensor, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """The smallest value of ``dtype`` >= ``scale`` (clamped to the dtype's positive normal range), as float32.

    Round up, not to nearest: a scale rounded down no longer spans the range in 2^b - 1 steps, so the top codes
    clamp and the error inside the range exceeds s/2 (up to 0.59·s at 8 bits asym, measured).
    """
    info = torch.finfo(dtype)
    scale = scale.float().clamp(min=info.tiny, max=info.max)
    stored = scale.to(dtype)
    up = torch.nextafter(stored, torch.full_like(stored, float("inf")))
    return torch.where(stored.float() < scale, up, stored).float()


def group_params(w: torch.Tensor, bits: int, sym: bool, clip: torch.Tensor | float = 1.0,
                 scale_dtype: torch.dtype | None = torch.float16) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and integer zero of each row of ``w`` [R, C] (one group per row) — LiquidGEMM Eq. 1.

    Asymmetric: the range [min, max] (extended to contain 0, as GPTQ does, so the zero point is a valid code)
    shrunk by ``clip`` maps onto [0, 2^b - 1]. Symmetric: s = clip·absmax / (2^(b-1) - 1), zero = 2^(b-1).
    ``scale_dtype`` rounds scales (upwards) to what the checkpoint stores (None keeps fp32).
    """
    check_bits(bits)
    w = w.float()
    clip = torch.as_tensor(clip, dtype=torch.float32, device=w.device)
    maxq = 2 ** bits - 1
    if sym:
        half = 2 ** (bits - 1) - 1
        scale = (w.abs().amax(dim=1) * clip).clamp(min=1e-8) / device_scalar(half, w)
        zero = torch.full_like(scale, 2 ** (bits - 1))
    else:
        wmin = (w.amin(dim=1).clamp(max=0) * clip)
        wmax = (w.amax(dim=1).clamp(min=0) * clip)
        scale = (wmax - wmin).clamp(min=1e-8) / device_scalar(maxq, w)
    if scale_dtype is not None:
        scale = round_scale_up(scale, scale_dtype)
    if not sym:
        zero = torch.clamp(torch.round(-wmin / scale), 0, maxq)
    return scale, zero


def quantize_codes(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int,
                   sym: bool = False) -> torch.Tensor:
    """Codes q = clamp(round(w / s) + z, lo, 2^b - 1) for per-row ``scale``/``zero`` broadcast over columns.

    lo = 0, or 1 when ``sym``: symmetric codes stay in [1, 2^b - 1] (records.py) even for values a clip ratio
    pushed below -absmax, so both sides saturate at ±(2^(b-1) - 1)·s.
    """
    q = torch.round(w.float() / scale.unsqueeze(-1)) + zero.unsqueeze(-1)
    return q.clamp_(1 if sym else 0, 2 ** bits - 1)


def quantize(w: torch.Tensor, bits: int, group_size: int = 128, sym: bool = False,
             clip: torch.Tensor | float = 1.0, scale_dtype: torch.dtype | None = torch.float16) -> QuantizedWeight:
    """Round-to-nearest group-wise quantization of a weight [N, K] into a :class:`QuantizedWeight`.

    ``clip`` is a shrink ratio of the range, a float or a tensor [N, G] per group (from the clipping search).
    K need not be a multiple of ``group_size``: the last group is shorter.
    """
    check_bits(bits)
    if w.dim() != 2:
        raise ValueError(f"expected a 2-D weight, got shape {tuple(w.shape)}")
    n, k = w.shape
    gs = k if group_size == -1 else group_size
    g = num_groups(k, group_size)
    clip_t = torch.as_tensor(clip, dtype=torch.float32, device=w.device)
    if clip_t.dim() == 0:
        clip_t = clip_t.expand(n, g)
    codes = torch.empty(n, k, dtype=torch.uint8, device=w.device)
    scales = torch.empty(n, g, dtype=torch.float32, device=w.device)
    zeros = torch.empty(n, g, dtype=torch.uint8, device=w.device)
    full = (k // gs) * gs
    if full:  # all whole groups at once: view [N, G_full, gs]
        wg = w[:, :full].reshape(n * (full // gs), gs)
        s, z = group_params(wg, bits, sym, clip_t[:, : full // gs].reshape(-1), scale_dtype)
        codes[:, :full] = quantize_codes(wg, s, z, bits, sym).reshape(n, full).to(torch.uint8)
        scales[:, : full // gs] = s.reshape(n, -1)
        zeros[:, : full // gs] = z.reshape(n, -1).to(torch.uint8)
    if full < k:  # the short tail group
        s, z = group_params(w[:, full:], bits, sym, clip_t[:, -1], scale_dtype)
        codes[:, full:] = quantize_codes(w[:, full:], s, z, bits, sym).to(torch.uint8)
        scales[:, -1] = s
        zeros[:, -1] = z.to(torch.uint8)
    return QuantizedWeight(codes=codes, scales=scales, zeros=zeros, bits=bits, group_size=group_size, sym=sym)


def dequantize(qw: QuantizedWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """W^ = (codes - zeros[g_idx]) · scales[g_idx] (LiquidGEMM Eq. 2), shape [N, K].

    Two-level LiquidQuant weights go through :func:`dequantize_lqq`, FP8 weights through :func:`dequantize_fp8`.
    """
    if qw.channel_scales is not None:
        return dequantize_lqq(qw, dtype)
    if qw.fp8:
        return dequantize_fp8(qw, dtype)
    g = qw.group_index()
    s = qw.scales.float()[:, g]
    z = qw.zeros.float()[:, g]
    return ((qw.codes.float() - z) * s).to(dtype)


def fake_quantize(w: torch.Tensor, bits: int, group_size: int = 128, sym: bool = False,
                  clip: torch.Tensor | float = 1.0) -> torch.Tensor:
    """quantize → dequantize in one call, in w's dtype (RTN)."""
    return dequantize(quantize(w, bits, group_size, sym, clip), w.dtype)


def lqq_int8_codes(qw: QuantizedWeight) -> torch.Tensor:
    """Recovered Q^_i8 [N, K] (int8) by LiquidGEMM Eq. 12, (Q_u4 · s_u8 + a) XOR 0x80, computed in uint8 lanes
    exactly like the GPU kernel (any overflow would wrap here too — the tests prove none occurs)."""
    if qw.channel_scales is None or qw.bits != 4:
        raise ValueError("not a LiquidQuant weight (needs 4-bit codes and channel_scales); use grid.dequantize")
    g = qw.group_index()
    s = qw.scales.round().to(torch.uint8)[:, g]
    a = qw.zeros.to(torch.uint8)[:, g]
    return ((qw.codes.to(torch.uint8) * s + a) ^ 0x80).view(torch.int8)


def dequantize_lqq(qw: QuantizedWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """W^ = Q^_i8 · s_c (LiquidGEMM Eq. 12, then the first-level Eq. 2 in the GEMM epilogue), shape [N, K]."""
    return (lqq_int8_codes(qw).float() * qw.channel_scales.float().unsqueeze(1)).to(dtype)


FP8_MAX = 448.0  # the largest finite float8_e4m3fn


def e4m3_round(x: torch.Tensor) -> torch.Tensor:
    """``x`` (already divided by its scale, so |x| <= 448 up to rounding) rounded to the nearest float8_e4m3fn
    value, ties to even; clamped to ±448 first, since the cast turns anything beyond the largest finite value into
    NaN."""
    return x.float().clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def quantize_fp8(w: torch.Tensor, group_size: int = -1) -> QuantizedWeight:
    """FP8 E4M3 weights (records.py conventions): per group of ``group_size`` input columns (-1: per output channel,
    the FP8 scheme of vLLM / llm-compressor), scale = absmax / 448 rounded up to fp16 (the same scale rule as the
    integer grids, so the largest weight of a group stays within the e4m3 range) and codes = the bits of
    e4m3(w / scale). An all-zero group gets a scale of 1."""
    w = w.float()
    if not bool(torch.isfinite(w).all()):
        from quantkit.errors import QuantkitError

        raise QuantkitError("the weight holds NaN or inf values, which FP8 cannot store; check the source checkpoint")
    n, k = w.shape
    gs = k if group_size == -1 else group_size
    g = num_groups(k, group_size)
    scales = torch.empty(n, g, dtype=torch.float32, device=w.device)
    codes = torch.empty(n, k, dtype=torch.uint8, device=w.device)
    for j in range(g):
        cols = slice(j * gs, min((j + 1) * gs, k))
        absmax = w[:, cols].abs().amax(dim=1)
        s = round_scale_up(torch.where(absmax > 0, absmax / device_scalar(FP8_MAX, w), torch.ones_like(absmax)))
        scales[:, j] = s
        codes[:, cols] = e4m3_round(w[:, cols] / s.unsqueeze(1)).view(torch.uint8)
    zeros = torch.zeros(n, g, dtype=torch.uint8, device=w.device)
    return QuantizedWeight(codes=codes, scales=scales, zeros=zeros, bits=8, group_size=group_size, sym=True, fp8=True)


def dequantize_fp8(qw: QuantizedWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """W^ = e4m3(codes) · scales[g_idx], shape [N, K] (exact in fp32: an e4m3 value times an fp16 scale)."""
    values = qw.codes.contiguous().view(torch.float8_e4m3fn).float()
    return (values * qw.scales.float()[:, qw.group_index()]).to(dtype)
