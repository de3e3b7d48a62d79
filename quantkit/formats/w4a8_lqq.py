"""``w4a8-lqq`` layout: LiquidQuant two-level 4-bit weights (LiquidGEMM Sec. 4) for quantkit's W4A8 Triton
kernel, which turns each UINT4 code into the INT8 tensor-core operand in registers as (q·s + a) XOR 0x80
(LiquidGEMM Eq. 12) and applies the per-channel first-level scale in the epilogue.

Tensors (N = out_features, K = in_features, Kp = K rounded up to 256, G = groups):

* ``qweight`` int32 [N, Kp/8]: UINT4 codes Q_u4 in tile-planar order (:mod:`quantkit.formats.nibble_planes`):
  one byte carries the codes of two 128-column groups, so four byte lanes masked with 0x0F0F0F0F share one
  (s, a) pair — LiquidGEMM's "dual-MMA" idea (Sec. 5.2: one load feeds two MMAs) in tile form.
* ``qparams`` int32 [G, N]: the second-level pair of group g of row n in one word — bits 0-7 the integer
  scale s_u8 in [1, 16] (Eq. 7), bits 8-15 the offset a = 2^7 + min(Q_i8) (Eq. 10), bits 16-31 zero (one
  32-bit word, so Triton's asynchronous pipeline streams it with the codes; see ``w4a16``).
* ``channel_scales`` fp16 [N]: the first-level per-channel scale s_c (Eq. 1).

Dequantization: Q^_i8 = ((q·s_u8 + a) mod 256) XOR 0x80 read as int8, W^ = Q^_i8 · s_c.
"""

from __future__ import annotations

import torch

from quantkit.formats import nibble_planes
from quantkit.formats.common import fp16, meta_field, record_problem, refuse_unsupported, require
from quantkit.formats.kernel_common import base_meta, group_problem
from quantkit.quant.grid import num_groups
from quantkit.quant.records import QuantizedWeight

NAME = "w4a8-lqq"
FORMAT_VERSION = 1
BITS = 4
# the axis of each tensor that indexes output rows (rows are packed independently): quantkit.formats.row_concat
ROW_AXES = {"qweight": 0, "qparams": 1, "channel_scales": 0}
S_MAX = 16  # LiquidGEMM Sec. 4: s_u8 <= ceil(238 / 15) = 16 keeps q·s <= 240 inside a byte


def supports(qw: QuantizedWeight) -> str | None:
    """None when ``qw`` is a LiquidQuant two-level weight these tensors hold bit-exactly and the kernel can run,
    else the reason (no channel scales, not 4-bit, s_u8 outside 1..16 or not integer, groups not a multiple
    of 128, act-order, or some q·s_u8 + a above 255 — LiquidGEMM Eq. 11, which the kernels' four-lanes-at-once
    multiply-add needs: a larger lane would carry into its neighbour)."""
    if qw.channel_scales is None:
        return "w4a8-lqq holds LiquidQuant two-level weights (channel_scales); one-level 4-bit weights use 'w4a16'"
    if qw.bits != BITS:
        return f"LiquidQuant weights are 4-bit (LiquidGEMM Sec. 4), this one has {qw.bits} bits"
    problem = record_problem(qw) or group_problem(qw, NAME)
    if problem is not None:
        return problem
    s = qw.scales.float()
    if s.numel() and (not torch.equal(s, s.round()) or float(s.min()) < 1 or float(s.max()) > S_MAX):
        return f"LiquidQuant second-level scales must be integers in [1, {S_MAX}] (LiquidGEMM Eq. 7)"
    if qw.codes.numel():
        g = qw.group_index().to(qw.codes.device)
        # int16 suffices (15·16 + 255 < 2^15) and keeps an 8B-model layer's check to a few hundred MB
        lane = qw.codes.to(torch.int16) * s.round().to(torch.int16)[:, g] + qw.zeros.to(torch.int16)[:, g]
        if int(lane.max()) > 255:
            return ("LiquidQuant codes·s_u8 + a exceed 255 (LiquidGEMM Eq. 11), which the kernels cannot compute "
                    "four lanes at a time; re-quantize with quantkit's lqq_quantize")
    return None


def layout_meta(qw: QuantizedWeight) -> dict:
    """The JSON-serialisable facts :func:`unpack` and the kernel need besides the tensors."""
    meta = base_meta(qw, NAME, FORMAT_VERSION, nibble_planes.padded_k(qw.codes.shape[1]))
    meta["tile_k"] = nibble_planes.TILE_K
    meta["two_level"] = True
    return meta


def pack(qw: QuantizedWeight) -> dict[str, torch.Tensor]:
    """{"qweight", "qparams", "channel_scales"} of ``qw`` (module docstring); QuantkitError when
    :func:`supports` refuses it."""
    refuse_unsupported(NAME, supports(qw))
    s_u8 = qw.scales.t().round().to(torch.int32)
    a = qw.zeros.t().to(torch.int32)
    return {"qweight": nibble_planes.pack_codes(qw.codes), "qparams": (s_u8 | (a << 8)).contiguous(),
            "channel_scales": fp16(qw.channel_scales)}


def unpack(tensors: dict[str, torch.Tensor], meta: dict) -> QuantizedWeight:
    """Rebuild the LiquidQuant QuantizedWeight :func:`pack` stored (scales = s_u8 as float32, zeros = a uint8,
    channel_scales float32 of the fp16 values)."""
    gs = int(meta_field(meta, "group_size", NAME))
    n = int(meta_field(meta, "out_features", NAME))
    k = int(meta_field(meta, "in_features", NAME))
    g = num_groups(k, gs)
    qweight = require(tensors, "qweight", (n, nibble_planes.padded_k(k) // nibble_planes.PLANES), torch.int32, NAME)
    qparams = require(tensors, "qparams", (g, n), torch.int32, NAME)
    cs = require(tensors, "channel_scales", (n,), torch.float16, NAME)
    return QuantizedWeight(codes=nibble_planes.unpack_codes(qweight, k),
                           scales=(qparams & 0xFF).t().float().contiguous(),
                           zeros=((qparams >> 8) & 0xFF).t().to(torch.uint8).contiguous(), bits=BITS, group_size=gs,
                           sym=False,
                           channel_scales=cs.float())
