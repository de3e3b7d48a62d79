"""``w8`` layout: 8-bit symmetric group-wise weights (MixLLM Sec. 3.1.2 / 4.1: sym-8 g128) for quantkit's W8A8
Triton kernel, which feeds them to the int8 tensor cores as they are and applies the per-group weight and
activation scales to each 128-column partial sum (MixLLM Sec. 3.3, group-tile accumulation).

Tensors (N = out_features, K = in_features, Kp = K rounded up to 256, G = groups):

* ``qweight`` int8 [N, Kp]: code - 128, i.e. the signed value in [-127, 127] (symmetric codes lie in [1, 255]);
  row-major along K, zero-padded — a kernel tile row is 128 contiguous bytes per half-tile.
* ``scales`` float32 [G, N]: group-major, as in ``w4a16``; the values are the record's fp16 scales, stored in
  32 bits because Triton streams only loads of >= 4 bytes per element through its asynchronous pipeline.

Dequantization: W[n, k] = qweight[n, k] · scales[k // group_size, n]. Only symmetric weights (every zero point
128): an asymmetric 8-bit (q - z) can reach ±255 and no longer fits the int8 operand.
"""

from __future__ import annotations

import torch

from quantkit.formats.bitpack import pad_last
from quantkit.formats.common import fp16, meta_field, record_problem, refuse_unsupported, require
from quantkit.formats.kernel_common import base_meta, group_problem
from quantkit.formats.nibble_planes import padded_k
from quantkit.quant.grid import num_groups
from quantkit.quant.records import QuantizedWeight

NAME = "w8"
FORMAT_VERSION = 1
BITS = 8
ZERO = 128
# the axis of each tensor that indexes output rows (rows are packed independently): quantkit.formats.row_concat
ROW_AXES = {"qweight": 0, "scales": 1}


def supports(qw: QuantizedWeight) -> str | None:
    """None when ``qw`` is an 8-bit symmetric weight these tensors hold bit-exactly and the kernel can run, else
    the reason (not 8-bit, a zero point other than 128, LiquidQuant, groups not a multiple of 128, act-order)."""
    if qw.bits != BITS:
        return f"w8 holds 8-bit codes, this weight has {qw.bits} bits (4-bit: 'w4a16')"
    if qw.channel_scales is not None:
        return "LiquidQuant two-level weights go to the 'w4a8-lqq' layout"
    if qw.fp8:
        return "FP8 E4M3 weights are not int8 codes; they go to 'fp8' (per channel) or 'reference'"
    problem = record_problem(qw) or group_problem(qw, NAME)
    if problem is not None:
        return problem
    if qw.zeros.numel() and not bool((qw.zeros.to(torch.int64) == ZERO).all()):
        return ("w8 holds symmetric weights (zero point 128): (q - z) of an asymmetric 8-bit weight does not fit "
                "the int8 tensor-core operand; quantize with sym: true or use the 'reference' layout")
    return None


def layout_meta(qw: QuantizedWeight) -> dict:
    """The JSON-serialisable facts :func:`unpack` and the kernel need besides the tensors."""
    return base_meta(qw, NAME, FORMAT_VERSION, padded_k(qw.codes.shape[1]))


def pack(qw: QuantizedWeight) -> dict[str, torch.Tensor]:
    """{"qweight", "scales"} of ``qw`` (module docstring); QuantkitError when :func:`supports` refuses it."""
    refuse_unsupported(NAME, supports(qw))
    signed = qw.codes.to(torch.int16) - ZERO
    return {"qweight": pad_last(signed, padded_k(qw.codes.shape[1])).to(torch.int8).contiguous(),
            "scales": fp16(qw.scales.t()).float()}


def unpack(tensors: dict[str, torch.Tensor], meta: dict) -> QuantizedWeight:
    """Rebuild the QuantizedWeight :func:`pack` stored (codes = qweight + 128, zeros 128, scales float32)."""
    gs = int(meta_field(meta, "group_size", NAME))
    n = int(meta_field(meta, "out_features", NAME))
    k = int(meta_field(meta, "in_features", NAME))
    g = num_groups(k, gs)
    qweight = require(tensors, "qweight", (n, padded_k(k)), torch.int8, NAME)
    scales = require(tensors, "scales", (g, n), torch.float32, NAME)
    codes = (qweight[:, :k].to(torch.int16) + ZERO).to(torch.uint8)
    return QuantizedWeight(codes=codes.contiguous(), scales=scales.t().half().float().contiguous(),
                           zeros=torch.full((n, g), ZERO, dtype=torch.uint8, device=qweight.device),
                           bits=BITS, group_size=gs, sym=bool(meta_field(meta, "sym", NAME)))
