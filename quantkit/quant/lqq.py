"""LiquidQuant (LQQ) two-level W4 quantization and its overflow-free 8-bit dequantization (LiquidGEMM Sec. 4).

Level 1 (Eq. 1, protective range of Sec. 3.2): per output channel, Q_i8 = round(W / s_c) in [-119, 119] with
s_c = absmax / 119 (fp16, rounded up so no value clamps).
Level 2 (Eq. 7): per group, Q_u8 = Q_i8 - min(Q_i8) in [0, 238], Q_u4 = round(Q_u8 / s_u8) in [0, 15], and the
offset a = 2^7 + min(Q_i8) (Eq. 10).
Dequantization (Eq. 12): Q^_i8 = (Q_u4 · s_u8 + a) XOR 0x80, all in 8-bit unsigned lanes, then W^ = Q^_i8 · s_c.

Choice of s_u8. Eq. 7 writes s_u8 = max(Q_u8) / 15 rounded to an integer. Rounding to nearest can round *down*
(e.g. a group range of 22 gives s_u8 = round(1.47) = 1), and then codes up to 22 would have to clamp at 15 —
an error of 7 int8 steps instead of s_u8/2. We use s_u8 = max(1, ceil(max(Q_u8) / 15)) instead:

* max(Q_u8) / s_u8 <= 15, so Q_u4 = round(Q_u8 / s_u8) never clamps and |Q^_i8 - Q_i8| <= s_u8 / 2;
* s_u8 <= ceil(238 / 15) = 16, so Q_u4 · s_u8 <= 15 · 16 = 240 fits UINT8 (the multiply of Eq. 11);
* Q_u4 · s_u8 <= Q_u8 + s_u8/2 <= max(Q_u8) + 8, hence Q_u4 · s_u8 + a <= max(Q_i8) + 8 + 128 <= 255 — the
  bound of Eq. 11 holds, and the XOR of Eq. 12 returns exactly Q_u4 · s_u8 + min(Q_i8) (Eq. 8), no wraparound.

tests/test_lqq.py checks these three facts exhaustively over every (min, max) pair in [-119, 119].
"""

from __future__ import annotations

import torch

from quantkit.quant import grid
from quantkit.quant.records import QuantizedWeight

PROTECT = 119  # LiquidGEMM Sec. 3.2 protective INT8 range [-119, 119]
U4_MAX = 15


def lqq_first_level(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel symmetric INT8 in the protective range (LiquidGEMM Eq. 1 + Sec. 3.2): returns
    (Q_i8 int16 [N, K] in [-119, 119], s_c float32 [N] fp16-representable)."""
    w = weight.float()
    s_c = grid.round_scale_up(w.abs().amax(dim=1) / grid.device_scalar(PROTECT, w))
    q = torch.round(w / s_c.unsqueeze(1)).clamp_(-PROTECT, PROTECT)
    return q.to(torch.int16), s_c


def _group_reduce(q: torch.Tensor, g_idx: torch.Tensor, ng: int, reduce: str) -> torch.Tensor:
    """Per-row, per-group min/max of integer q [N, K] → [N, G] (groups may be ragged)."""
    out = torch.zeros(q.shape[0], ng, dtype=q.dtype, device=q.device)
    return out.scatter_reduce_(1, g_idx.expand_as(q), q, reduce, include_self=False)


def lqq_from_int8(q_i8: torch.Tensor, channel_scales: torch.Tensor, group_size: int = 128) -> QuantizedWeight:
    """Second LQQ level (LiquidGEMM Eq. 7, 10) on first-level codes Q_i8 [N, K] in [-119, 119]: UINT4 codes,
    integer s_u8 = max(1, ceil(range / 15)) (module docstring says why not round) and a = 128 + min(Q_i8) per
    group. Rounding is half-up in exact integer arithmetic: Q_u4 = floor((2·Q_u8 + s) / (2·s))."""
    if q_i8.dim() != 2:
        raise ValueError(f"expected 2-D INT8 codes, got shape {tuple(q_i8.shape)}")
    q = q_i8.to(torch.int32)
    if q.numel() and (int(q.min()) < -PROTECT or int(q.max()) > PROTECT):
        raise ValueError(f"LQQ first-level codes must lie in [-{PROTECT}, {PROTECT}]")
    n, k = q.shape
    ng = grid.num_groups(k, group_size)
    g = (torch.arange(k, device=q.device) // (k if group_size == -1 else group_size)).unsqueeze(0)
    qmin = _group_reduce(q, g, ng, "amin")
    qmax = _group_reduce(q, g, ng, "amax")
    s = torch.div(qmax - qmin + U4_MAX - 1, U4_MAX, rounding_mode="floor").clamp_(min=1)  # ceil, >= 1
    q_u8 = q - qmin.gather(1, g.expand(n, k))
    s_k = s.gather(1, g.expand(n, k))
    codes = torch.div(2 * q_u8 + s_k, 2 * s_k, rounding_mode="floor")
    return QuantizedWeight(codes=codes.to(torch.uint8), scales=s.float(), zeros=(128 + qmin).to(torch.uint8),
                           bits=4, group_size=group_size, sym=False,
                           channel_scales=channel_scales.float(), meta={"method": "lqq"})


def lqq_quantize(weight: torch.Tensor, group_size: int = 128) -> QuantizedWeight:
    """LiquidQuant two-level quantization of a weight [N, K] (LiquidGEMM Sec. 4, Eq. 1 and 7-10): codes = Q_u4,
    scales = s_u8 (integer-valued floats), zeros = a = 128 + min(Q_i8) (uint8), channel_scales = s_c."""
    if weight.dim() != 2:
        raise ValueError(f"expected a 2-D weight, got shape {tuple(weight.shape)}")
    q_i8, s_c = lqq_first_level(weight)
    return lqq_from_int8(q_i8, s_c, group_size)


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
