"""``reference`` layout: quantkit's own plain, row-major packing of any QuantizedWeight (2-8 bits, sym/asym,
act-order g_idx, LiquidQuant two-level, FP8 E4M3). It is what the torch reference kernels read and the layout of choice
when no engine-specific layout fits (e.g. MixLLM's 5-7-bit partitions). docs/formats.md draws it.

Tensors (N = out_features, K = in_features, G = groups, b = bits, zb = zero-point bits):

* ``qweight`` int32 [N, ceil(K·b/32)]: each row's codes packed along K as a little-endian bit stream
  (:mod:`quantkit.formats.bitpack`) — for b = 4: 8 codes per word, code k at bits 4·(k mod 8) of word k div 8;
  for b = 8: 4 per word; for b = 3, 5, 6, 7 codes straddle words. The tail of the last word is zero.
* ``scales`` fp16 [N, G].
* ``qzeros`` int32 [N, ceil(G·zb/32)]: zero points packed the same way. zb = b for one-level weights; zb = 8 for
  LiquidQuant, whose "zeros" are the uint8 offsets a = 128 + min(Q_i8) (LiquidGEMM Eq. 10) and whose "scales"
  are the integer s_u8 in [1, 16] (exact in fp16).
* ``g_idx`` int32 [K]: only when the record carries one (GPTQ act-order); absent = consecutive groups.
* ``channel_scales`` fp16 [N]: only for LiquidQuant two-level weights (first-level s_c, LiquidGEMM Eq. 1).

FP8 E4M3 weights (meta ``fp8``: true) store their codes, the e4m3 bit patterns, as 8-bit codes and zeros of 0.

Symmetric weights keep their (constant 2^(b-1)) zeros: one code path, and the row is self-describing.
"""

from __future__ import annotations

import torch

from quantkit.formats import bitpack
from quantkit.formats.common import fp16, meta_field, record_problem, refuse_unsupported, require
from quantkit.quant.grid import num_groups
from quantkit.quant.records import QuantizedWeight

NAME = "reference"
FORMAT_VERSION = 1
# the axis of each tensor that indexes output rows (rows are packed independently; None: one tensor for all rows,
# g_idx): quantkit.formats.row_concat
ROW_AXES = {"qweight": 0, "scales": 0, "qzeros": 0, "channel_scales": 0, "g_idx": None}
LQQ_ZERO_BITS = 8  # LiquidGEMM Eq. 10: a = 2^7 + min(Q_i8) spans 9..247, a full byte


def _zero_bits(qw: QuantizedWeight) -> int:
    return LQQ_ZERO_BITS if qw.channel_scales is not None else qw.bits


def supports(qw: QuantizedWeight) -> str | None:
    """None when the reference layout can hold ``qw`` bit-exactly, else the reason (bits outside 2..8, an
    inconsistent record, LiquidQuant weights that are not 4-bit)."""
    if not 2 <= qw.bits <= 8:
        return f"the reference layout stores 2-8-bit codes, this weight has {qw.bits} bits"
    if qw.channel_scales is not None and qw.bits != 4:
        return f"LiquidQuant two-level weights are 4-bit (LiquidGEMM Sec. 4), this one has {qw.bits} bits"
    return record_problem(qw)


def layout_meta(qw: QuantizedWeight) -> dict:
    """The JSON-serialisable facts :func:`unpack` needs besides the tensors (manifest entry of one weight)."""
    n, k = qw.codes.shape
    return {"layout": NAME, "format_version": FORMAT_VERSION, "bits": int(qw.bits),
            "group_size": int(qw.group_size), "sym": bool(qw.sym), "in_features": int(k), "out_features": int(n),
            "num_groups": int(qw.scales.shape[1]), "zero_bits": _zero_bits(qw),
            "two_level": qw.channel_scales is not None, "has_g_idx": qw.g_idx is not None,
            **({"fp8": True} if qw.fp8 else {})}


def pack(qw: QuantizedWeight) -> dict[str, torch.Tensor]:
    """The reference tensors of ``qw`` (module docstring); QuantkitError when :func:`supports` refuses it."""
    refuse_unsupported(NAME, supports(qw))
    out = {"qweight": bitpack.pack_bits(qw.codes, qw.bits),
           "scales": fp16(qw.scales),
           "qzeros": bitpack.pack_bits(qw.zeros, _zero_bits(qw))}
    if qw.g_idx is not None:
        out["g_idx"] = qw.g_idx.to(torch.int32).contiguous()
    if qw.channel_scales is not None:
        out["channel_scales"] = fp16(qw.channel_scales)
    return out


def unpack(tensors: dict[str, torch.Tensor], meta: dict) -> QuantizedWeight:
    """Rebuild the QuantizedWeight that :func:`pack` stored (codes/zeros uint8, scales float32 of the fp16
    values, g_idx int32 or None, channel_scales float32 or None); QuantkitError on missing/mis-shaped tensors."""
    bits = int(meta_field(meta, "bits", NAME))
    gs = int(meta_field(meta, "group_size", NAME))
    n = int(meta_field(meta, "out_features", NAME))
    k = int(meta_field(meta, "in_features", NAME))
    two_level = bool(meta_field(meta, "two_level", NAME))
    zb = LQQ_ZERO_BITS if two_level else bits
    g = num_groups(k, gs)
    qweight = require(tensors, "qweight", (n, bitpack.words_for(k, bits)), torch.int32, NAME)
    scales = require(tensors, "scales", (n, g), torch.float16, NAME)
    qzeros = require(tensors, "qzeros", (n, bitpack.words_for(g, zb)), torch.int32, NAME)
    g_idx = require(tensors, "g_idx", (k,), torch.int32, NAME) if meta_field(meta, "has_g_idx", NAME) else None
    cs = require(tensors, "channel_scales", (n,), torch.float16, NAME) if two_level else None
    return QuantizedWeight(
        codes=bitpack.unpack_bits(qweight, bits, k).to(torch.uint8),
        scales=scales.float(),
        zeros=bitpack.unpack_bits(qzeros, zb, g).to(torch.uint8),
        bits=bits, group_size=gs, sym=bool(meta_field(meta, "sym", NAME)),
        g_idx=None if g_idx is None else g_idx.clone(),
        channel_scales=None if cs is None else cs.float(), fp8=bool(meta.get("fp8", False)))
