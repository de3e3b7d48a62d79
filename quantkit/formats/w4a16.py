"""``w4a16`` layout: 4-bit group-wise weights (asymmetric, or symmetric with zero 8) for quantkit's Triton
kernels — the W4A16 kernel (fp16/bf16 activations) and the MixLLM W4A8 kernel (int8 activations, two-step
dequantization, MixLLM Sec. 3.3) read the same tensors.

Tensors (N = out_features, K = in_features, Kp = K rounded up to 256, G = groups):

* ``qweight`` int32 [N, Kp/8]: codes in tile-planar order (:mod:`quantkit.formats.nibble_planes`).
* ``scales`` fp16 [G, N]: group-major, so a kernel tile of consecutive output rows reads one contiguous run per
  group (no gather).
* ``qzeros`` uint8 [G, N]: the zero points as they are (0..15).

Dequantization: W[n, k] = (code[n, k] - qzeros[g, n]) · scales[g, n], g = k // group_size. Groups must be
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


def pack(qw: QuantizedWeight) -> dict[str, torch.Tensor]:
    """{"qweight", "scales", "qzeros"} of ``qw`` (module docstring); QuantkitError when :func:`supports` refuses."""
    refuse_unsupported(NAME, supports(qw))
    return {"qweight": nibble_planes.pack_codes(qw.codes),
            "scales": fp16(qw.scales.t()),
            "qzeros": qw.zeros.t().to(torch.uint8).contiguous()}


def unpack(tensors: dict[str, torch.Tensor], meta: dict) -> QuantizedWeight:
    """Rebuild the QuantizedWeight :func:`pack` stored (scales float32 of the fp16 values, zeros uint8)."""
    gs = int(meta_field(meta, "group_size", NAME))
    n = int(meta_field(meta, "out_features", NAME))
    k = int(meta_field(meta, "in_features", NAME))
    g = num_groups(k, gs)
    qweight = require(tensors, "qweight", (n, nibble_planes.padded_k(k) // nibble_planes.PLANES), torch.int32, NAME)
    scales = require(tensors, "scales", (g, n), torch.float16, NAME)
    qzeros = require(tensors, "qzeros", (g, n), torch.uint8, NAME)
    return QuantizedWeight(codes=nibble_planes.unpack_codes(qweight, k), scales=scales.t().float().contiguous(),
                           zeros=qzeros.t().contiguous(), bits=BITS, group_size=gs,
                           sym=bool(meta_field(meta, "sym", NAME)))
