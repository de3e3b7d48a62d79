"""``w4a16`` layout: 4-bit group-wise weights (asymmetric, or symmetric with zero 8) for quantkit's Triton
kernels — the W4A16 kernel (fp16/bf16 activations) and the MixLLM W4A8 kernel (int8 activations, two-step
dequantization, MixLLM Sec. 3.3) read the same tensors.

Tensors (N = out_features, K = in_features, Kp = K rounded up to 256, G = groups):

* ``qweight`` int32 [N, Kp/8]: codes in tile-planar order (:mod:`quantkit.formats.nibble_planes`).
* ``qparams`` int32 [G, N]: scale and zero point of group g of row n in one word — bits 0-15 the fp16 scale,
  bits 16-23 the zero point (0..15), bits 24-31 zero. Group-major, so a kernel tile of consecutive rows reads
  one contiguous run per group; one 32-bit word per row because Triton streams only loads of >= 4 bytes per
  element through its asynchronous shared-memory pipeline — separate fp16 scales and uint8 zeros were loaded
  synchronously, a memory round trip per tile (docs/formats.md gives the measured cost).

Dequantization: W[n, k] = (code[n, k] - zero[g, n]) · scale[g, n], g = k // group_size. Groups must be
multiples of 128 columns (or one per row) and consecutive: :func:`supports` says why otherwise.
"""

from __future__ import annotations

import torch

from quantkit.formats import nibble_planes
from quantkit.formats.common import fp16, meta_field, record_problem, refuse_unsupported, require
from quantkit.formats.kernel_common import base_meta, group_problem
from quantkit.quant.grid import num_groups
from quantkit.quant.records import QuantizedWeight

NAME = "w4a16"
FORMAT_VERSION = 1
BITS = 4
# the axis of each tensor that indexes output rows (rows are packed independently): quantkit.formats.row_concat
ROW_AXES = {"qweight": 0, "qparams": 1}


def supports(qw: QuantizedWeight) -> str | None:
    """None when the w4a16 tensors hold ``qw`` bit-exactly and its kernels can run it, else the reason (not
    4-bit, LiquidQuant two-level, groups not a multiple of 128, act-order, inconsistent record)."""
    if qw.bits != BITS:
        return f"w4a16 holds 4-bit codes, this weight has {qw.bits} bits (8-bit symmetric: 'w8')"
    if qw.channel_scales is not None:
        return "LiquidQuant two-level weights go to the 'w4a8-lqq' layout"
    return record_problem(qw) or group_problem(qw, NAME)


def layout_meta(qw: QuantizedWeight) -> dict:
    """The JSON-serialisable facts :func:`unpack` and the kernels need besides the tensors."""
    meta = base_meta(qw, NAME, FORMAT_VERSION, nibble_planes.padded_k(qw.codes.shape[1]))
    meta["tile_k"] = nibble_planes.TILE_K
    return meta


def pack_params(scales: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """int32 [G, N] words (fp16 bits of scale | zero << 16) from per-row scales and zeros [N, G]."""
    bits = fp16(scales.t()).view(torch.int16).to(torch.int32) & 0xFFFF
    return (bits | (zeros.t().to(torch.int32) << 16)).contiguous()


def unpack_params(qparams: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(scales float32 [N, G], zeros uint8 [N, G]) from :func:`pack_params` words."""
    scales = (qparams & 0xFFFF).to(torch.int16).view(torch.float16).float()
    zeros = ((qparams >> 16) & 0xFF).to(torch.uint8)
    return scales.t().contiguous(), zeros.t().contiguous()


def pack(qw: QuantizedWeight) -> dict[str, torch.Tensor]:
    """{"qweight", "qparams"} of ``qw`` (module docstring); QuantkitError when :func:`supports` refuses it."""
    refuse_unsupported(NAME, supports(qw))
    return {"qweight": nibble_planes.pack_codes(qw.codes), "qparams": pack_params(qw.scales, qw.zeros)}


def unpack(tensors: dict[str, torch.Tensor], meta: dict) -> QuantizedWeight:
    """Rebuild the QuantizedWeight :func:`pack` stored (scales float32 of the fp16 values, zeros uint8);
    QuantkitError on missing or mis-shaped tensors."""
    gs = int(meta_field(meta, "group_size", NAME))
    n = int(meta_field(meta, "out_features", NAME))
    k = int(meta_field(meta, "in_features", NAME))
    g = num_groups(k, gs)
    qweight = require(tensors, "qweight", (n, nibble_planes.padded_k(k) // nibble_planes.PLANES), torch.int32, NAME)
    scales, zeros = unpack_params(require(tensors, "qparams", (g, n), torch.int32, NAME))
    return QuantizedWeight(codes=nibble_planes.unpack_codes(qweight, k), scales=scales, zeros=zeros, bits=BITS,
                           group_size=gs, sym=bool(meta_field(meta, "sym", NAME)))
