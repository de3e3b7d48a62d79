"""``awq`` layout: the tensors of an AutoAWQ "GEMM" checkpoint (AWQ: Lin et al. 2023; the packing is AutoAWQ's,
also read by transformers through GPTQModel, vLLM, SGLang and TGI — docs/formats.md).

Tensors of a linear layer with K = in_features, N = out_features, G = ceil(K / group_size):

* ``qweight`` int32 [K, N'/8]: row k holds codes W_q[0..N-1, k], eight 4-bit codes per word along N in AWQ's
  interleaved order — nibble i (bits 4i..4i+3) of word j holds output column 8j + ORDER[i],
  ORDER = [0, 2, 4, 6, 1, 3, 5, 7] (the order AutoAWQ's GEMM kernel dequantizes in).
* ``qzeros`` int32 [G, N'/8]: zero points, same packing and order. Stored as they are (no offset, unlike GPTQ v1).
* ``scales`` fp16 [G, N].
  Dequantization: W[n, k] = scales[k // group_size, n] · (q[k, n] - zero[k // group_size, n]).

N' = N rounded up to a multiple of 8; padding columns hold code 0 and zero 0, and the real N is in the layout
metadata. 4-bit only, groups of consecutive columns only (no g_idx: act-order is not representable).
Symmetric weights are stored with their explicit zero 8 — (q - 8)·s is the same weight, so nothing is lost.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from quantkit.errors import QuantkitError
from quantkit.formats import bitpack
from quantkit.formats.common import (fp16, has_act_order, meta_field, record_problem, refuse_unsupported,
                                     require)
from quantkit.quant.grid import num_groups
from quantkit.quant.records import QuantizedWeight

NAME = "awq"
FORMAT_VERSION = 1
BITS = 4
PACK = 8
ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _interleave(x: torch.Tensor) -> torch.Tensor:
    """Columns [..., N'] reordered so that position 8j + i holds column 8j + ORDER[i]."""
    lead, n = x.shape[:-1], x.shape[-1]
    order = torch.tensor(ORDER, device=x.device)
    return x.reshape(*lead, n // PACK, PACK)[..., order].reshape(*lead, n)


def _deinterleave(x: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`_interleave`."""
    lead, n = x.shape[:-1], x.shape[-1]
    inverse = torch.argsort(torch.tensor(ORDER, device=x.device))
    return x.reshape(*lead, n // PACK, PACK)[..., inverse].reshape(*lead, n)


def _pack_along_n(x: torch.Tensor) -> torch.Tensor:
    """[R, N] 4-bit values → int32 [R, N'/8] in AWQ order."""
    padded = bitpack.pad_last(x.to(torch.int64), bitpack.pad_to_multiple(x.shape[-1], PACK))
    return bitpack.pack_bits(_interleave(padded), BITS)


def _unpack_along_n(words: torch.Tensor, n: int) -> torch.Tensor:
    """int32 [R, N'/8] in AWQ order → int64 [R, N]."""
    return _deinterleave(bitpack.unpack_bits(words, BITS, words.shape[-1] * PACK))[..., :n]


def supports(qw: QuantizedWeight) -> str | None:
    """None when an AutoAWQ GEMM checkpoint can hold ``qw`` bit-exactly, else the reason: not 4-bit,
    act-order g_idx, LiquidQuant two-level weights."""
    if qw.bits != BITS:
        return f"AWQ GEMM checkpoints hold 4-bit codes, this weight has {qw.bits} bits (use 'gptq' or 'reference')"
    if qw.channel_scales is not None:
        return ("LiquidQuant two-level weights (per-channel INT8 scale + UINT4 groups) have no AWQ form; "
                "use 'reference' or the w4a8 kernel layout")
    if qw.fp8:
        return "FP8 E4M3 weights have no AWQ form (AWQ stores integer codes); use 'reference'"
    problem = record_problem(qw)
    if problem is not None:
        return problem
    if has_act_order(qw):
        return "AWQ checkpoints have no g_idx, so act-order (desc_act) column groups cannot be stored; use 'gptq'"
    return None


def layout_meta(qw: QuantizedWeight) -> dict:
    """The JSON-serialisable facts :func:`unpack` needs besides the tensors (manifest entry of one weight)."""
    n, k = qw.codes.shape
    return {"layout": NAME, "format_version": FORMAT_VERSION, "bits": BITS, "group_size": int(qw.group_size),
            "sym": bool(qw.sym), "in_features": int(k), "out_features": int(n),
            "num_groups": int(qw.scales.shape[1])}


def pack(qw: QuantizedWeight) -> dict[str, torch.Tensor]:
    """{"qweight", "qzeros", "scales"} of ``qw`` in AutoAWQ GEMM layout (module docstring); QuantkitError when
    :func:`supports` refuses it."""
    refuse_unsupported(NAME, supports(qw))
    return {"qweight": _pack_along_n(qw.codes.t()),
            "qzeros": _pack_along_n(qw.zeros.t()),
            "scales": fp16(qw.scales.t())}


def unpack(tensors: dict[str, torch.Tensor], meta: dict) -> QuantizedWeight:
    """Rebuild the QuantizedWeight from AWQ GEMM tensors (g_idx None: consecutive groups)."""
    gs = int(meta_field(meta, "group_size", NAME))
    n = int(meta_field(meta, "out_features", NAME))
    k = int(meta_field(meta, "in_features", NAME))
    if int(meta.get("bits", BITS)) != BITS:
        raise QuantkitError(f"awq metadata says {meta['bits']} bits; AWQ GEMM checkpoints hold 4 bits")
    g = num_groups(k, gs)
    words = bitpack.pad_to_multiple(n, PACK) // PACK
    qweight = require(tensors, "qweight", (k, words), torch.int32, NAME)
    qzeros = require(tensors, "qzeros", (g, words), torch.int32, NAME)
    scales = require(tensors, "scales", (g, n), torch.float16, NAME)
    return QuantizedWeight(codes=_unpack_along_n(qweight, n).t().to(torch.uint8).contiguous(),
                           scales=scales.t().float().contiguous(),
                           zeros=_unpack_along_n(qzeros, n).t().to(torch.uint8).contiguous(),
                           bits=BITS, group_size=gs, sym=bool(meta_field(meta, "sym", NAME)))


def quantization_config(metas: dict | Iterable[dict]) -> dict:
    """config.json ``quantization_config`` for AutoAWQ GEMM weights with these layout metas (one or an iterable):
    {"quant_method": "awq", "bits": 4, "group_size", "zero_point": true, "version": "gemm"}; layers with
    different group sizes raise QuantkitError (config.json holds one)."""
    metas = [metas] if isinstance(metas, dict) else list(metas)
    if not metas:
        raise QuantkitError("no quantized layers to describe in the AWQ quantization_config")
    sizes = sorted({int(m["group_size"]) for m in metas})
    if len(sizes) != 1:
        raise QuantkitError(f"AWQ config.json holds one group_size for all layers, but layers use {sizes}; "
                            f"re-quantize with one group size or export with the 'reference' layout")
    return {"quant_method": "awq", "bits": BITS, "group_size": sizes[0], "zero_point": True, "version": "gemm"}
