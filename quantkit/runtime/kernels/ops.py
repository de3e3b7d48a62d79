"""The kernels' entry points as torch custom ops (``torch.library``), for code that ``torch.compile`` traces.

Inside a compiled region (HF ``generate`` with a static cache compiles the forward; a decode loop compiled with
``mode="reduce-overhead"`` captures it as CUDA graphs), each GEMM and the activation quantizer is one opaque node:
dynamo does not trace the registry's Python (the kernel choice, the launch-config lookup, Triton and CuPy
launches), and Inductor keeps the call as it is. Eager code calls the entry points directly: a custom op's
dispatch would add host time to every call and buys nothing there.

* ``quantkit::a8_gemm(codes, scales, act_group, layout, packed, spec, out_dtype)`` —
  :func:`.gemm.int8_matmul`;
* ``quantkit::a8_mixed_gemm(codes, scales, act_group, packed, rows, spec, out_features, out_dtype)`` —
  :func:`.gemm.mixed_int8_matmul` (MixLLM Sec. 3.4);
* ``quantkit::w4a16_gemm(x, packed, spec)`` — :func:`.gemm.w4a16_matmul`;
* ``quantkit::fp8_gemm(codes, scales, packed, spec, out_dtype)`` — :func:`.fp8_gemm.fp8_matmul`, FP8 tensors
  passed as bytes (the FP8 activation quantizer is plain torch ops there, which dynamo traces);
* ``quantkit::act_quant(x, bits, group_size)`` — :func:`.triton.act_quant.quantize_activation_triton`;
* ``quantkit::decode_attention(q, k, v, mask, scale)`` — :func:`.triton.decode_attention.decode_attention`;
* ``quantkit::decode_attention_kv8(q, k codes, scale, min, v codes, scale, min, mask, scale)`` —
  :func:`.triton.decode_attention.decode_attention_kv8`;
* ``quantkit::decode_attention_kv4(q, the cache's eight tensors, tokens, group, residual, scale)`` —
  :func:`.triton.decode_attention.decode_attention_kv4`.

A layout's tensors travel as a list with a ``spec`` string (their names and the layout metadata as JSON, made
once per layer by :func:`layer_spec`). On the CPU each op runs the torch reference of the same packed format
(:mod:`.reference`), so the ops are checked with ``torch.library.opcheck`` in CI. The GEMM ops run under
:func:`.scratch.graph_owned_scratch`: split-K scratch memory belongs to the graph that replays them.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping

import torch
from torch.library import custom_op

from quantkit.runtime.kernels.scratch import graph_owned_scratch


def layer_spec(tensors: Mapping[str, torch.Tensor], meta: dict) -> tuple[list[str], str]:
    """(tensor names in the op's order, the spec string) of a layer's packed tensors and metadata."""
    names = sorted(tensors)
    return names, _spec(tuple(names), meta)


@torch.compiler.assume_constant_result
def _spec(names: tuple[str, ...], meta: dict) -> str:
    # a constant of the traced graph: computed once at trace time, not traced (dynamo cannot trace json)
    return json.dumps({"names": list(names), "meta": meta}, sort_keys=True)


@functools.lru_cache(maxsize=4096)
def _parse(spec: str) -> tuple[tuple[str, ...], dict]:
    d = json.loads(spec)
    return tuple(d["names"]), d["meta"]


def _unpack(packed: list[torch.Tensor], spec: str) -> tuple[dict, dict]:
    names, meta = _parse(spec)
    return dict(zip(names, packed)), meta


@custom_op("quantkit::a8_gemm", mutates_args=())
def a8_gemm(codes: torch.Tensor, scales: torch.Tensor, act_group: int, layout: str, packed: list[torch.Tensor],
            spec: str, out_dtype: torch.dtype) -> torch.Tensor:
    """Y [M, N] (``out_dtype``) = dequant(A)·Ŵᵀ for int8 activation codes and float32 scales, by the kernel the
    registry picks (:func:`.gemm.int8_matmul`)."""
    from quantkit.runtime.kernels.gemm import int8_matmul

    tensors, meta = _unpack(packed, spec)
    with graph_owned_scratch():
        return int8_matmul(codes, scales, act_group, layout, tensors, meta, out_dtype=out_dtype)


@a8_gemm.register_kernel("cpu")
def _a8_gemm_cpu(codes, scales, act_group, layout, packed, spec, out_dtype):
    from quantkit.runtime.kernels.reference import int8_reference

    tensors, meta = _unpack(packed, spec)
    return int8_reference(codes, scales, act_group, layout, tensors, meta).to(out_dtype)


@a8_gemm.register_fake
def _a8_gemm_fake(codes, scales, act_group, layout, packed, spec, out_dtype):
    _, meta = _parse(spec)
    return codes.new_empty(codes.shape[0], int(meta["out_features"]), dtype=out_dtype)


def mixed_spec(parts: list) -> tuple[list[torch.Tensor], list[torch.Tensor], str]:
    """(packed tensors of all partitions in order, their output rows, the spec string) of a mixed layer's
    ``parts`` — (layout, tensors, meta, rows) each."""
    packed, rows, layouts, metas = [], [], [], []
    for layout, tensors, meta, r in parts:
        names = sorted(tensors)
        packed += [tensors[n] for n in names]
        rows.append(r)
        layouts.append((layout, tuple(names)))
        metas.append(meta)
    return packed, rows, _mixed_spec(tuple(layouts), tuple(metas))


@torch.compiler.assume_constant_result
def _mixed_spec(layouts: tuple[tuple[str, tuple[str, ...]], ...], metas: tuple[dict, ...]) -> str:
    return json.dumps([{"layout": layout, "spec": _spec(names, meta)} for (layout, names), meta in zip(layouts, metas)])


@functools.lru_cache(maxsize=1024)
def _parse_mixed(spec: str) -> tuple[tuple[str, str, int], ...]:
    return tuple((p["layout"], p["spec"], len(_parse(p["spec"])[0])) for p in json.loads(spec))


def _parts(packed: list[torch.Tensor], rows: list[torch.Tensor], spec: str) -> list:
    parts, start = [], 0
    for (layout, part_spec, count), r in zip(_parse_mixed(spec), rows):
        tensors, meta = _unpack(list(packed[start:start + count]), part_spec)
        parts.append((layout, tensors, meta, r))
        start += count
    return parts


@custom_op("quantkit::a8_mixed_gemm", mutates_args=())
def a8_mixed_gemm(codes: torch.Tensor, scales: torch.Tensor, act_group: int, packed: list[torch.Tensor],
                  rows: list[torch.Tensor], spec: str, out_features: int, out_dtype: torch.dtype) -> torch.Tensor:
    """Y [M, out_features] of a two-partition layer in one launch (:func:`.gemm.mixed_int8_matmul`), the
    partitions as :func:`mixed_spec` lays them out."""
    from quantkit.runtime.kernels.gemm import mixed_int8_matmul

    with graph_owned_scratch():
        return mixed_int8_matmul(codes, scales, act_group, _parts(packed, rows, spec), out_features,
                                 out_dtype=out_dtype)


@a8_mixed_gemm.register_kernel("cpu")
def _a8_mixed_gemm_cpu(codes, scales, act_group, packed, rows, spec, out_features, out_dtype):
    from quantkit.runtime.kernels.reference import int8_reference

    out = torch.empty(codes.shape[0], out_features, dtype=torch.float64)
    for layout, tensors, meta, r in _parts(packed, rows, spec):
        out[:, r.long()] = int8_reference(codes, scales, act_group, layout, tensors, meta)
    return out.to(out_dtype)


@a8_mixed_gemm.register_fake
def _a8_mixed_gemm_fake(codes, scales, act_group, packed, rows, spec, out_features, out_dtype):
    return codes.new_empty(codes.shape[0], out_features, dtype=out_dtype)


@custom_op("quantkit::w4a16_gemm", mutates_args=())
def w4a16_gemm(x: torch.Tensor, packed: list[torch.Tensor], spec: str) -> torch.Tensor:
    """Y = X·Ŵᵀ [M, N] in x's dtype for a ``w4a16`` weight (:func:`.gemm.w4a16_matmul`)."""
    from quantkit.runtime.kernels.gemm import w4a16_matmul

    tensors, meta = _unpack(packed, spec)
    with graph_owned_scratch():
        return w4a16_matmul(x, tensors, meta)


@w4a16_gemm.register_kernel("cpu")
def _w4a16_gemm_cpu(x, packed, spec):
    from quantkit.runtime.kernels.reference import w4a16_reference

    tensors, meta = _unpack(packed, spec)
    return w4a16_reference(x, tensors, meta).to(x.dtype)


@w4a16_gemm.register_fake
def _w4a16_gemm_fake(x, packed, spec):
    _, meta = _parse(spec)
    return x.new_empty(x.shape[0], int(meta["out_features"]))


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """An FP8 tensor as its bytes (uint8, same shape), other tensors as they are: the FP8 op takes bytes, which
    every torch build can compare and copy (opcheck and the CPU build have no float8 arithmetic)."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def _fp8_args(codes: torch.Tensor, packed: list[torch.Tensor], spec: str) -> tuple[torch.Tensor, dict, dict]:
    tensors, meta = _unpack(packed, spec)
    tensors["qweight"] = tensors["qweight"].view(torch.float8_e4m3fn)
    return codes.view(torch.float8_e4m3fn), tensors, meta


@custom_op("quantkit::fp8_gemm", mutates_args=())
def fp8_gemm(codes: torch.Tensor, scales: torch.Tensor, packed: list[torch.Tensor], spec: str,
             out_dtype: torch.dtype) -> torch.Tensor:
    """Y [M, N] (``out_dtype``) of per-token FP8 activation codes (as bytes, :func:`as_bytes`) and scales and an
    ``fp8`` weight (its ``qweight`` as bytes), by the kernel the registry picks (:func:`.fp8_gemm.fp8_matmul`)."""
    from quantkit.runtime.kernels.fp8_gemm import fp8_matmul

    a, tensors, meta = _fp8_args(codes, packed, spec)
    return fp8_matmul(a, scales, tensors, meta, out_dtype=out_dtype)


@fp8_gemm.register_kernel("cpu")
def _fp8_gemm_cpu(codes, scales, packed, spec, out_dtype):
    from quantkit.runtime.kernels.fp8_gemm import fp8_reference

    a, tensors, _ = _fp8_args(codes, packed, spec)
    return fp8_reference(a, scales, tensors, out_dtype)


@fp8_gemm.register_fake
def _fp8_gemm_fake(codes, scales, packed, spec, out_dtype):
    _, meta = _parse(spec)
    return codes.new_empty(codes.shape[0], int(meta["out_features"]), dtype=out_dtype)


@custom_op("quantkit::act_quant", mutates_args=())
def act_quant(x: torch.Tensor, bits: int, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes int8 [M, K], scales float32 [M, G]) of x (:func:`.triton.act_quant.quantize_activation_triton`)."""
    from quantkit.runtime.kernels.triton.act_quant import quantize_activation_triton

    codes, scales = quantize_activation_triton(x.contiguous(), bits, group_size)
    return codes, scales.float()


@act_quant.register_kernel("cpu")
def _act_quant_cpu(x, bits, group_size):
    from quantkit.quant.act import quantize_activation_int

    codes, scales = quantize_activation_int(x, bits, group_size)
    return codes.to(torch.int8), scales.float()


@act_quant.register_fake
def _act_quant_fake(x, bits, group_size):
    k = x.shape[1]
    groups = 1 if group_size == -1 else -(-k // group_size)
    return x.new_empty(x.shape, dtype=torch.int8), x.new_empty(x.shape[0], groups, dtype=torch.float32)


@custom_op("quantkit::decode_attention", mutates_args=())
def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                     scale: float) -> torch.Tensor:
    """Attention [B, Hq, D] of one query token per sequence over a KV cache [B, Hkv, L, D]: the split-KV kernel
    (:func:`.triton.decode_attention.decode_attention`) where it is the faster
    (:func:`.triton.decode_attention.kernel_preferred`), else SDPA with grouped KV heads."""
    import torch.nn.functional as F

    from quantkit.runtime.kernels.registry import device_traits
    from quantkit.runtime.kernels.triton.decode_attention import decode_attention as run
    from quantkit.runtime.kernels.triton.decode_attention import kernel_preferred

    sms = device_traits(q.device)[1] or 132
    if kernel_preferred(q.shape[0], k.shape[1], sms):
        return run(q, k, v, mask, scale, sms=sms)
    m = None if mask is None else mask[:, None, None, :]
    return F.scaled_dot_product_attention(q[:, :, None], k, v, attn_mask=m, scale=scale, enable_gqa=True)[:, :, 0]


@decode_attention.register_kernel("cpu")
def _decode_attention_cpu(q, k, v, mask, scale):
    from quantkit.runtime.kernels.triton.decode_attention import decode_attention_reference

    return decode_attention_reference(q, k, v, mask, scale)


@decode_attention.register_fake
def _decode_attention_fake(q, k, v, mask, scale):
    return q.new_empty(q.shape)


@custom_op("quantkit::decode_attention_kv8", mutates_args=())
def decode_attention_kv8(q: torch.Tensor, k_codes: torch.Tensor, k_scale: torch.Tensor, k_min: torch.Tensor,
                         v_codes: torch.Tensor, v_scale: torch.Tensor, v_min: torch.Tensor,
                         mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """Attention [B, Hq, D] of one query token per sequence over a KV8 cache (codes uint8 [B, Hkv, L, D], fp16
    scale and minimum [B, Hkv, L, 1]): :func:`.triton.decode_attention.decode_attention_kv8`."""
    from quantkit.runtime.kernels.registry import device_traits
    from quantkit.runtime.kernels.triton.decode_attention import decode_attention_kv8 as run

    return run(q, {"codes": k_codes, "scale": k_scale, "min": k_min},
               {"codes": v_codes, "scale": v_scale, "min": v_min}, mask, scale, sms=device_traits(q.device)[1] or 132)


@decode_attention_kv8.register_kernel("cpu")
def _decode_attention_kv8_cpu(q, k_codes, k_scale, k_min, v_codes, v_scale, v_min, mask, scale):
    from quantkit.runtime.kernels.triton.decode_attention import kv8_reference

    return kv8_reference(q, {"codes": k_codes, "scale": k_scale, "min": k_min},
                         {"codes": v_codes, "scale": v_scale, "min": v_min}, mask, scale)


@decode_attention_kv8.register_fake
def _decode_attention_kv8_fake(q, k_codes, k_scale, k_min, v_codes, v_scale, v_min, mask, scale):
    return q.new_empty(q.shape)


_KV4 = ("k_codes", "k_scale", "k_min", "v_codes", "v_scale", "v_min", "k_ring", "v_ring")


@custom_op("quantkit::decode_attention_kv4", mutates_args=())
def decode_attention_kv4(q: torch.Tensor, k_codes: torch.Tensor, k_scale: torch.Tensor, k_min: torch.Tensor,
                         v_codes: torch.Tensor, v_scale: torch.Tensor, v_min: torch.Tensor, k_ring: torch.Tensor,
                         v_ring: torch.Tensor, tokens: torch.Tensor, group: int, residual: int,
                         scale: float) -> torch.Tensor:
    """Attention [B, Hq, D] of one query token per sequence over the ``tokens`` ([1]) tokens of a KV4 cache with its
    fp16 window (:func:`.triton.decode_attention.decode_attention_kv4`, which documents the layout)."""
    from quantkit.runtime.kernels.registry import device_traits
    from quantkit.runtime.kernels.triton.decode_attention import decode_attention_kv4 as run

    cache = dict(zip(_KV4, (k_codes, k_scale, k_min, v_codes, v_scale, v_min, k_ring, v_ring)))
    return run(q, cache, tokens, group, residual, scale, sms=device_traits(q.device)[1] or 132)


@decode_attention_kv4.register_kernel("cpu")
def _decode_attention_kv4_cpu(q, k_codes, k_scale, k_min, v_codes, v_scale, v_min, k_ring, v_ring, tokens, group,
                              residual, scale):
    from quantkit.runtime.kernels.triton.decode_attention import kv4_reference

    cache = dict(zip(_KV4, (k_codes, k_scale, k_min, v_codes, v_scale, v_min, k_ring, v_ring)))
    return kv4_reference(q, cache, int(tokens[0]), group, residual, scale)


@decode_attention_kv4.register_fake
def _decode_attention_kv4_fake(q, k_codes, k_scale, k_min, v_codes, v_scale, v_min, k_ring, v_ring, tokens, group,
                               residual, scale):
    return q.new_empty(q.shape)
