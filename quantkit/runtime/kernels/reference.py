"""Plain torch references of the Triton kernels, reading the same packed tensors (the kernels' tests compare
against these; these are compared against the dense F.linear of the QuantizedWeight).

They mirror the kernels' arithmetic where it matters for bits — the per-element fp16/bf16 rounding of (q - z)·s,
the uint8 wrap-around of LiquidGEMM Eq. 12, exact integer partial sums per 128-column half-tile — and use
float64 for the rest, so a kernel result is compared against the exact value of its own formula.
"""

from __future__ import annotations

import torch

from quantkit.formats import nibble_planes
from quantkit.formats.kernel_common import HALF_K
from quantkit.formats.w4a16 import unpack_params

LQQ_LAYOUT = "w4a8-lqq"


def _group_of_columns(meta: dict, kp: int, device) -> torch.Tensor:
    gs = int(meta["group_size"])
    cols = torch.arange(kp, device=device)
    return torch.zeros_like(cols) if gs == -1 else torch.clamp(cols // gs, max=int(meta["num_groups"]) - 1)


def w4a16_weight(tensors: dict, meta: dict, dtype: torch.dtype) -> torch.Tensor:
    """Ŵ [N, K] of a ``w4a16`` weight as the W4A16 kernel forms it: (q - z)·s rounded once to ``dtype`` (for bf16
    the fp16 scale is first rounded to bf16, as the kernel's bf16 path does)."""
    k = int(meta["in_features"])
    codes = nibble_planes.unpack_codes(tensors["qweight"], k).float()
    g = _group_of_columns(meta, k, codes.device)
    scales, zeros = unpack_params(tensors["qparams"])  # [N, G]
    s = scales.half()
    s = (s.to(torch.bfloat16) if dtype == torch.bfloat16 else s).float()[:, g]
    return ((codes - zeros.float()[:, g]) * s).to(dtype)


def w4a16_reference(x: torch.Tensor, tensors: dict, meta: dict) -> torch.Tensor:
    """X·Ŵᵀ [M, N] in float64 with Ŵ from :func:`w4a16_weight` in x's dtype."""
    w = w4a16_weight(tensors, meta, x.dtype)
    return x.double() @ w.double().t()


def int8_weight(layout: str, tensors: dict, meta: dict) -> torch.Tensor:
    """The int8 tensor-core operand [N, Kp] a W8A8/W4A8 kernel multiplies (Kp = K padded to 256):
    ``w8`` the stored int8; ``w4a16`` q - z (MixLLM two-step dequantization, step 1); ``w4a8-lqq``
    ((q·s_u8 + a) mod 256) XOR 0x80 computed in uint8 lanes (LiquidGEMM Eq. 12)."""
    if layout == "w8":
        return tensors["qweight"]
    k = int(meta["in_features"])
    kp = nibble_planes.padded_k(k)
    codes = nibble_planes.unpack_codes(tensors["qweight"], kp)
    g = _group_of_columns(meta, kp, codes.device)
    params = tensors["qparams"][g].t()  # [N, Kp] words of each column's group
    if layout == LQQ_LAYOUT:
        s = (params & 0xFF).to(torch.uint8)
        a = ((params >> 8) & 0xFF).to(torch.uint8)
        return ((codes * s + a) ^ 0x80).view(torch.int8)
    if layout == "w4a16":
        return (codes.to(torch.int16) - ((params >> 16) & 0xFF).to(torch.int16)).to(torch.int8)
    raise ValueError(f"no int8 kernel reads layout '{layout}'")


def _half_scales(scales: torch.Tensor, group_size: int, halves: int) -> torch.Tensor:
    """Per-half-tile scale columns [R, halves] from per-group scales [R, G] (group_size -1: one group)."""
    if group_size == -1:
        return scales[:, :1].expand(-1, halves)
    h = torch.clamp(torch.arange(halves, device=scales.device) * HALF_K // group_size, max=scales.shape[1] - 1)
    return scales[:, h]


def int8_reference(a_codes: torch.Tensor, a_scales: torch.Tensor, act_group_size: int, layout: str,
                   tensors: dict, meta: dict) -> torch.Tensor:
    """Y [M, N] float64 of the W8A8 / W4A8 kernels: exact integer partial sums per 128-column half-tile,
    times the weight scale of that half (w8, w4a16) and the activation scale of that half, summed; LiquidQuant
    weights times the per-channel scale at the end (MixLLM Sec. 3.3 two-step dequantization; LiquidGEMM Sec. 4).
    ``a_codes`` int8 [M, K], ``a_scales`` [M, Ga] from :func:`quantkit.quant.act.quantize_activation_int`."""
    w = int8_weight(layout, tensors, meta).to(torch.int64)
    kp = w.shape[1]
    halves = kp // HALF_K
    a = nibble_planes.pad_to_tiles(a_codes.to(torch.int64))
    partial = torch.einsum("mhk,nhk->mnh", a.reshape(a.shape[0], halves, HALF_K).double(),
                           w.reshape(w.shape[0], halves, HALF_K).double())  # exact: |sum| < 2^53
    sa = _half_scales(a_scales.double(), act_group_size, halves)  # [M, halves]
    if layout == LQQ_LAYOUT:
        y = (partial * sa[:, None, :]).sum(-1)
        return y * tensors["channel_scales"].double()[None, :]
    per_group = tensors["scales"].t() if layout == "w8" else unpack_params(tensors["qparams"])[0]  # [N, G]
    sw = _half_scales(per_group.double(), int(meta["group_size"]), halves)  # [N, halves]
    return (partial * sa[:, None, :] * sw[None, :, :]).sum(-1)
