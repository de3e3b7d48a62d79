"""``gptq`` layout: the tensors of a GPTQ checkpoint as GPTQ-for-LLaMa / AutoGPTQ / GPTQModel write them
(GPTQ: Frantar et al. 2022; the on-disk format is a convention of those tools, described publicly e.g. at
danieldk.eu/GPTQ-Checkpoint-Format). Loaders in transformers (through GPTQModel), vLLM, SGLang and TGI read it.

Tensors of a linear layer with K = in_features, N = out_features, G = ceil(K / group_size) (1 per-channel):

* ``qweight`` int32 [K'·b/32, N]: column n holds codes W_q[n, 0..K-1] packed along K as a little-endian bit
  stream — b ∈ {2, 4, 8}: code k at bits b·(k mod 32/b) of row k div (32/b); b = 3: 32 codes per 3 rows (ten
  codes, two bits of the 11th | its last bit, ten codes, one bit of the 22nd | two bits, ten codes).
  K' = K rounded up to whole words (to 32/b, or to 32 for 3-bit); the padding codes are 0.
* ``qzeros`` int32 [G, N'·b/32]: zero points packed the same way but along N (N' = N rounded up likewise).
* ``scales`` fp16 [G, N].
* ``g_idx`` int32 [K]: the group of input column k — k // group_size, or GPTQ act-order's (desc_act) own map.
  Dequantization: W[n, k] = scales[g_idx[k], n] · (q[k, n] - zero[g_idx[k], n]).

Zero points, "v1" (``checkpoint_format: "gptq"``, what engines expect by default): the stored value is
zero - 1 and loaders add 1 back — a historical offset of the original GPTQ code. An asymmetric zero of 0 has no
v1 value that every reader decodes to 0 (readers that mask (stored + 1) to b bits get 0 from 2^b - 1, readers that
add 1 after masking get 2^b, writers that clamp zero - 1 at 0 turn it into 1; docs/formats.md), so
:func:`supports` refuses it and points to ``gptq_v2``, GPTQModel's format that stores the zero itself
(``checkpoint_format: "gptq_v2"``, :mod:`quantkit.formats.gptq_v2`).
Symmetric weights store 2^(b-1) - 1 everywhere (zero 2^(b-1), records.py).
N or K that are not whole words are padded and the real sizes are kept in the layout metadata; engines that
derive shapes from config.json need K a multiple of the packing unit (and usually of group_size) and N a multiple
of 32/b, which real LLM projections are.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from quantkit.errors import QuantkitError
from quantkit.formats import bitpack
from quantkit.formats.common import (fp16, g_idx_or_none, has_act_order, meta_field, record_problem,
                                     refuse_unsupported, require)
from quantkit.quant.grid import num_groups
from quantkit.quant.records import QuantizedWeight

NAME = "gptq"
FORMAT_VERSION = 1
BITS = (2, 3, 4, 8)
V1 = "gptq"
V2 = "gptq_v2"
_ZERO_OFFSET = {V1: 1, V2: 0}


def pack_unit(bits: int) -> int:
    """Codes per whole block of int32 words: 32/b, or 32 codes in 3 words for 3-bit."""
    return 32 // bits if 32 % bits == 0 else 32


def packed_len(count: int, bits: int) -> int:
    """int32 words holding ``count`` codes after padding to whole blocks: ceil(count / unit) · unit · b / 32."""
    return bitpack.pad_to_multiple(count, pack_unit(bits)) * bits // 32


def _check_format(checkpoint_format: str) -> None:
    if checkpoint_format not in _ZERO_OFFSET:
        raise QuantkitError(f"unknown GPTQ checkpoint_format '{checkpoint_format}'; use '{V1}' or '{V2}'")


def supports(qw: QuantizedWeight, checkpoint_format: str = V1) -> str | None:
    """None when a GPTQ checkpoint can hold ``qw`` bit-exactly, else the reason: bits outside {2, 3, 4, 8},
    LiquidQuant two-level weights, a sym record with non-2^(b-1) zeros, or (v1) an asymmetric zero of 0."""
    _check_format(checkpoint_format)
    if qw.bits not in BITS:
        return f"GPTQ checkpoints hold 2, 3, 4 or 8-bit codes, this weight has {qw.bits} bits (use 'reference')"
    if qw.channel_scales is not None:
        return ("LiquidQuant two-level weights (per-channel INT8 scale + UINT4 groups) have no GPTQ form; "
                "use 'reference' or the w4a8 kernel layout")
    if qw.fp8:
        return "FP8 E4M3 weights have no GPTQ form (GPTQ stores integer codes); use 'reference'"
    problem = record_problem(qw)
    if problem is not None:
        return problem
    zeros = qw.zeros.to(torch.int64)
    if qw.sym and not bool((zeros == 2 ** (qw.bits - 1)).all()):
        return f"record is marked symmetric but its zeros are not all {2 ** (qw.bits - 1)}"
    if checkpoint_format == V1 and not qw.sym and bool((zeros == 0).any()):
        n_bad = int((zeros == 0).sum())
        return (f"{n_bad} group(s) have zero point 0, which GPTQ v1 (stored zero - 1) cannot encode so that "
                f"every engine reads it back; use layout '{V2}' or 'reference'")
    return None


def layout_meta(qw: QuantizedWeight, checkpoint_format: str = V1) -> dict:
    """The JSON-serialisable facts :func:`unpack` needs besides the tensors (manifest entry of one weight)."""
    _check_format(checkpoint_format)
    n, k = qw.codes.shape
    return {"layout": NAME if checkpoint_format == V1 else V2, "format_version": FORMAT_VERSION,
            "checkpoint_format": checkpoint_format, "bits": int(qw.bits), "group_size": int(qw.group_size),
            "sym": bool(qw.sym), "desc_act": has_act_order(qw), "in_features": int(k), "out_features": int(n),
            "num_groups": int(qw.scales.shape[1])}


def pack(qw: QuantizedWeight, checkpoint_format: str = V1) -> dict[str, torch.Tensor]:
    """{"qweight", "qzeros", "scales", "g_idx"} of ``qw`` in GPTQ layout (module docstring); QuantkitError when
    :func:`supports` refuses it."""
    refuse_unsupported(NAME if checkpoint_format == V1 else V2, supports(qw, checkpoint_format))
    n, k = qw.codes.shape
    b = qw.bits
    codes = bitpack.pad_last(qw.codes.to(torch.int64), bitpack.pad_to_multiple(k, pack_unit(b)))
    stored = qw.zeros.to(torch.int64).t() - _ZERO_OFFSET[checkpoint_format]  # [G, N]
    stored = bitpack.pad_last(stored, bitpack.pad_to_multiple(n, pack_unit(b)))
    g_idx = qw.g_idx if qw.g_idx is not None else qw.group_index()
    return {"qweight": bitpack.pack_bits(codes, b).t().contiguous(),
            "qzeros": bitpack.pack_bits(stored, b),
            "scales": fp16(qw.scales.t()),
            "g_idx": g_idx.to(torch.int32).contiguous()}


def unpack(tensors: dict[str, torch.Tensor], meta: dict) -> QuantizedWeight:
    """Rebuild the QuantizedWeight from GPTQ tensors (either checkpoint_format, from ``meta``). A v1 stored zero
    of 2^b - 1 (written by other tools for zero 0) decodes as AutoGPTQ does, (stored + 1) mod 2^b. g_idx equal to
    the consecutive grouping comes back as None, as quantizers record it."""
    fmt = meta.get("checkpoint_format", V1)
    _check_format(fmt)
    layout = NAME if fmt == V1 else V2
    b = int(meta_field(meta, "bits", layout))
    gs = int(meta_field(meta, "group_size", layout))
    n = int(meta_field(meta, "out_features", layout))
    k = int(meta_field(meta, "in_features", layout))
    if b not in BITS:
        raise QuantkitError(f"{layout} metadata says {b} bits; GPTQ checkpoints hold 2, 3, 4 or 8 bits")
    g = num_groups(k, gs)
    qweight = require(tensors, "qweight", (packed_len(k, b), n), torch.int32, layout)
    qzeros = require(tensors, "qzeros", (g, packed_len(n, b)), torch.int32, layout)
    scales = require(tensors, "scales", (g, n), torch.float16, layout)
    g_idx = require(tensors, "g_idx", (k,), torch.int32, layout)
    if k and (int(g_idx.min()) < 0 or int(g_idx.max()) >= g):
        raise QuantkitError(f"{layout} g_idx holds groups outside [0, {g - 1}]; the checkpoint is corrupt")
    zeros = (bitpack.unpack_bits(qzeros, b, n) + _ZERO_OFFSET[fmt]) % (1 << b)
    return QuantizedWeight(codes=bitpack.unpack_bits(qweight.t(), b, k).to(torch.uint8),
                           scales=scales.t().float().contiguous(),
                           zeros=zeros.t().to(torch.uint8).contiguous(),
                           bits=b, group_size=gs, sym=bool(meta_field(meta, "sym", layout)),
                           g_idx=g_idx_or_none(g_idx, k, gs))


def quantization_config(metas: dict | Iterable[dict]) -> dict:
    """The ``quantization_config`` of config.json for a model whose quantized linears carry these layout metas
    (one meta or an iterable of them), with the keys GPTQModel writes and transformers/vLLM read: quant_method,
    bits, group_size, desc_act, sym, checkpoint_format. config.json holds one bits/group_size/sym for the whole
    model, so layers that disagree raise QuantkitError; desc_act is true when any layer uses act-order."""
    metas = [metas] if isinstance(metas, dict) else list(metas)
    if not metas:
        raise QuantkitError("no quantized layers to describe in the GPTQ quantization_config")
    keys = ("bits", "group_size", "sym", "checkpoint_format")
    first = {key: metas[0].get(key) for key in keys}
    for m in metas[1:]:
        other = {key: m.get(key) for key in keys}
        if other != first:
            raise QuantkitError(f"GPTQ config.json holds one bits/group_size/sym for all layers, but layers differ "
                                f"({first} vs {other}); export mixed-precision models with the 'reference' layout")
    return {"quant_method": "gptq", "bits": first["bits"], "group_size": first["group_size"],
            "desc_act": any(bool(m.get("desc_act")) for m in metas), "sym": first["sym"],
            "checkpoint_format": first["checkpoint_format"]}
