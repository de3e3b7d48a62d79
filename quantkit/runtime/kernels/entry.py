"""The kernels as :mod:`quantkit.runtime.dispatch` calls them: ``fn(x [M, K], tensors, meta, act, shared=None)
-> [M, N]`` per layout, and one entry for a whole mixed-precision layer.

Each kernel layout gets one entry that receives raw activations (``quantizes_activations=True``) and picks:

* A8 symmetric activations with groups of a multiple of 128 (or per token) → the Triton activation quantizer,
  then the int8 tensor-core kernel of the layout (W8A8, MixLLM W4A8, LiquidQuant W4A8);
* no activation quantization and a ``w4a16`` weight with fp16/bf16 activations → the W4A16 kernel;
* anything else (another activation format, fp32 activations for W4A16, A16 with an int8-only layout) → the
  activations are fake-quantized with :func:`quantkit.quant.act.quantize_activation` and multiplied by the
  dequantized weight in torch — the same numbers QuantLinear's reference path computes, just not fast.

Where torch.compile traces the forward, the GEMMs and the activation quantizer run as the custom ops of
:mod:`.ops` (opaque nodes, the same kernels underneath).

The activation's int8 codes and its fake-quant form come from the forward's
:class:`~quantkit.runtime.dispatch.SharedActivation` (``shared``; a fresh one when called alone), so the
partitions of a mixed-precision layer quantize the activation once between them.

:func:`mixed_kernel` runs a two-partition layer whose layouts all have int8 kernels with A8 activations as ONE
launch of :func:`quantkit.runtime.kernels.triton.int8_gemm.mixed_int8_matmul` (MixLLM Sec. 3.4): one activation quantization, each partition's
epilogue scattering into its output columns; :func:`mixed_supported` says which layers it takes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F

from quantkit.quant.act import quantize_activation_fp8_codes, quantize_activation_int
from quantkit.runtime.dispatch import A8_FORM, FAKE_FORM, ActQuant, SharedActivation
from quantkit.runtime.kernels import ops
from quantkit.runtime.kernels.fp8_gemm import bind_fp8, fp8_matmul
from quantkit.runtime.kernels.triton.act_quant import quantize_activation_fp8_triton, quantize_activation_triton
from quantkit.runtime.kernels.gemm import (bind_int8, bind_w4a16, int8_matmul, mixed_int8_matmul,
                                           w4a16_matmul)
from quantkit.runtime.kernels.triton.int8_gemm import MODES
from quantkit.runtime.kernels.triton.rms_norm import rms_norm_triton

HALF_DTYPES = (torch.float16, torch.bfloat16)


def int8_path_ok(act) -> bool:
    """True when the int8 kernels can apply the activation quantization ``act`` (8-bit symmetric, groups of a
    multiple of 128 or per token)."""
    return (act is not None and act.bits == 8 and act.sym and not act.fp8
            and (act.group_size == -1 or (act.group_size > 0 and act.group_size % 128 == 0)))


def quantize_for_kernel(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A8 codes and scales of ``x`` [M, K]: the Triton kernel for power-of-two groups (and per token), torch
    otherwise (same values either way); the ``quantkit::act_quant`` op where torch.compile traces."""
    if torch.compiler.is_compiling():
        return ops.act_quant(x.contiguous(), 8, group_size)
    if group_size == -1 or group_size & (group_size - 1) == 0:
        return quantize_activation_triton(x.contiguous(), 8, group_size)
    return quantize_activation_int(x, 8, group_size)


def a8_activation(shared: SharedActivation) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward's A8 codes int8 [M, K] and float32 scales [M, G] (:func:`quantize_for_kernel`), computed once
    per :class:`SharedActivation` whichever partition asks first; they also stand in for its fake-quant form
    (:func:`dequantize_a8`), so a partition without an int8 kernel does not quantize x again."""
    def compute(x: torch.Tensor, act: ActQuant) -> tuple[torch.Tensor, torch.Tensor]:
        codes, scales = quantize_for_kernel(x, act.group_size)
        scales = scales.float()
        dtype = x.dtype  # not x itself: the forms may outlive this forward's input (SharedActivation.of_input)
        shared.offer(FAKE_FORM, lambda: dequantize_a8(codes, scales, act.group_size, dtype))
        return codes, scales

    return shared.form(A8_FORM, compute)


def dequantize_a8(codes: torch.Tensor, scales: torch.Tensor, group_size: int, dtype: torch.dtype) -> torch.Tensor:
    """codes · scales of their group, in ``dtype`` — bit-identical to :func:`quantkit.quant.act.quantize_activation`
    of the same input (the same fp32 product (q - z)·s with z = 0, then one cast; quantkit.quant.grid.dequantize)."""
    k = codes.shape[-1]
    g = torch.arange(k, device=codes.device) // (k if group_size == -1 else group_size)
    return (codes.float() * scales[:, g]).to(dtype)


def _out_dtype(x: torch.Tensor) -> torch.dtype:
    return x.dtype if x.dtype.is_floating_point else torch.float32


def _dense(x: torch.Tensor, layout: str, tensors: Mapping[str, torch.Tensor], meta: dict) -> torch.Tensor:
    from quantkit.formats.registry import get_layout
    from quantkit.quant.grid import dequantize

    w = dequantize(get_layout(layout).unpack(dict(tensors), meta), torch.float32).to(x.dtype)
    return F.linear(x, w)


def layout_kernel(layout: str) -> Callable:
    """The dispatch entry of a kernel layout (module docstring)."""
    if layout not in MODES:
        raise ValueError(f"no Triton kernels for layout '{layout}'")

    def run(x: torch.Tensor, tensors: Mapping[str, torch.Tensor], meta: dict, act,
            shared: SharedActivation | None = None) -> torch.Tensor:
        shared = SharedActivation(x, act) if shared is None else shared
        compiling = torch.compiler.is_compiling()
        if int8_path_ok(act):
            codes, scales = a8_activation(shared)
            if compiling:
                names, spec = ops.layer_spec(tensors, meta)
                return ops.a8_gemm(codes, scales, act.group_size, layout, [tensors[n] for n in names], spec,
                                   _out_dtype(x))
            return int8_matmul(codes, scales, act.group_size, layout, dict(tensors), meta,
                               out_dtype=_out_dtype(x))
        xq = shared.fake_quant()
        if layout == "w4a16" and xq.dtype in HALF_DTYPES:
            if compiling:
                names, spec = ops.layer_spec(tensors, meta)
                return ops.w4a16_gemm(xq.contiguous(), [tensors[n] for n in names], spec)
            return w4a16_matmul(xq.contiguous(), dict(tensors), meta)
        return _dense(xq, layout, tensors, meta)

    run.__name__ = f"triton_{layout.replace('-', '_')}"
    return run


def layout_binder(layout: str) -> Callable:
    """The dispatch ``bind`` of a kernel layout: ``bind(x, tensors, meta, act, shared)`` returns ``f(x, shared) ->
    y | None`` that runs the kernel the registry chooses for this layer at x's token count with its launch prepared
    once (:func:`.gemm.bind_w4a16`, :func:`.gemm.bind_int8`), or None where that kernel has no prepared form (the
    layout's entry, :func:`layout_kernel`, then serves every call). Never under torch.compile (the custom ops
    serve there)."""
    if layout not in MODES:
        raise ValueError(f"no Triton kernels for layout '{layout}'")

    def bind(x: torch.Tensor, tensors: Mapping[str, torch.Tensor], meta: dict, act, shared: SharedActivation):
        if torch.compiler.is_compiling():
            return None
        if int8_path_ok(act):
            codes, scales = a8_activation(shared)
            run = bind_int8(codes, scales, act.group_size, [(layout, dict(tensors), meta, None)],
                            int(meta["out_features"]), _out_dtype(x))
            return None if run is None else (lambda x, shared: run(*a8_activation(shared)))
        if act is None and layout == "w4a16" and x.dtype in HALF_DTYPES:
            run = bind_w4a16(x.contiguous(), dict(tensors), meta)
            return None if run is None else (lambda x, shared: run(x))
        return None

    return bind


FP8_FORM = "fp8"  # SharedActivation's name of the per-token FP8 codes and scales


def fp8_path_ok(act, dtype: torch.dtype) -> bool:
    """True when the FP8 GEMM can apply ``act``: dynamic per-token E4M3 activations (the fp8-w8a8 recipe) in
    fp16/bf16."""
    return act is not None and act.fp8 and act.group_size == -1 and dtype in HALF_DTYPES


def fp8_codes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token FP8 codes float8_e4m3fn [M, K] and float32 scales [M, 1] of x [M, K]: the fused Triton quantizer on
    a GPU (:func:`.triton.act_quant.quantize_activation_fp8_triton`), torch ops elsewhere and where torch.compile
    traces (:func:`quantkit.quant.act.quantize_activation_fp8_codes`); the same values either way."""
    if x.is_cuda and not torch.compiler.is_compiling():
        return quantize_activation_fp8_triton(x.contiguous())
    return quantize_activation_fp8_codes(x)


def fp8_activation(shared: SharedActivation) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward's per-token FP8 codes and float32 scales (:func:`fp8_codes`), computed once per
    :class:`SharedActivation`; they also stand in for its fake-quant form (codes · scales, the very values of
    :func:`quantkit.quant.act.quantize_activation_fp8`)."""
    def compute(x: torch.Tensor, act: ActQuant) -> tuple[torch.Tensor, torch.Tensor]:
        codes, scales = fp8_codes(x)
        dtype = x.dtype
        shared.offer(FAKE_FORM, lambda: (codes.float() * scales).to(dtype))
        return codes, scales

    return shared.form(FP8_FORM, compute)


def fp8_kernel(x: torch.Tensor, tensors: Mapping[str, torch.Tensor], meta: dict, act,
               shared: SharedActivation | None = None) -> torch.Tensor:
    """The dispatch entry of the ``fp8`` layout: per-token FP8 activations × the weight on the ``fp8`` priority list
    (:func:`.fp8_gemm.fp8_matmul`); other activation schemes get the QuantLinear reference's numbers (fake-quant
    activations × the dequantized weight)."""
    shared = SharedActivation(x, act) if shared is None else shared
    if not fp8_path_ok(act, x.dtype):
        return _dense(shared.fake_quant(), "fp8", tensors, meta)
    codes, scales = fp8_activation(shared)
    if torch.compiler.is_compiling():
        names, spec = ops.layer_spec(tensors, meta)
        return ops.fp8_gemm(ops.as_bytes(codes), scales, [ops.as_bytes(tensors[n]) for n in names], spec, x.dtype)
    return fp8_matmul(codes, scales, dict(tensors), meta, out_dtype=x.dtype)


def fp8_binder(x: torch.Tensor, tensors: Mapping[str, torch.Tensor], meta: dict, act, shared: SharedActivation):
    """The dispatch ``bind`` of the ``fp8`` layout: the ``fp8`` choice made once for this layer and token count
    (:func:`.fp8_gemm.bind_fp8`), or None for activations it does not take."""
    if torch.compiler.is_compiling() or not fp8_path_ok(act, x.dtype):
        return None
    run = bind_fp8(*fp8_activation(shared), dict(tensors), meta, x.dtype)
    return None if run is None else (lambda x, shared: run(*fp8_activation(shared)))


def mixed_supported(layouts: tuple[str, ...], act: ActQuant | None) -> bool:
    """True when :func:`mixed_kernel` can run a layer with partitions in ``layouts``: two partitions, both in an
    int8-kernel layout (``w8``, ``w4a16``, ``w4a8-lqq``), activations the int8 kernels quantize (A8)."""
    return len(layouts) == 2 and all(lay in MODES for lay in layouts) and int8_path_ok(act)


def mixed_kernel(x: torch.Tensor, parts: list, out_features: int, act: ActQuant | None,
                 shared: SharedActivation | None = None) -> torch.Tensor:
    """Y [M, out_features] (x's dtype, no bias) of a mixed-precision layer in one launch (MixLLM Sec. 3.4):
    the activation quantized once, then :func:`quantkit.runtime.kernels.triton.int8_gemm.mixed_int8_matmul` over ``parts`` — a list of
    (layout, tensors, meta, rows int32 output indices)."""
    layouts = tuple(p[0] for p in parts)
    if not mixed_supported(layouts, act):
        raise ValueError(f"the one-launch mixed kernel cannot run partitions {layouts} with activations {act}")
    shared = SharedActivation(x, act) if shared is None else shared
    codes, scales = a8_activation(shared)
    if torch.compiler.is_compiling():
        packed, rows, spec = ops.mixed_spec(parts)
        return ops.a8_mixed_gemm(codes, scales, act.group_size, packed, rows, spec, out_features, _out_dtype(x))
    return mixed_int8_matmul(codes, scales, act.group_size,
                             [(lay, dict(tensors), meta, rows) for lay, tensors, meta, rows in parts],
                             out_features, out_dtype=_out_dtype(x))


def mixed_binder(x: torch.Tensor, parts: list, out_features: int, act: ActQuant | None,
                 shared: SharedActivation):
    """The dispatch ``bind`` of the one-launch mixed kernel: the ``a8_mixed`` choice made once for this layer and
    token count with its launch prepared (:func:`.gemm.bind_int8` over both partitions), as ``f(x, shared) -> y |
    None``, or None where that kernel has no prepared form (then :func:`mixed_kernel` serves every call)."""
    if torch.compiler.is_compiling() or not mixed_supported(tuple(p[0] for p in parts), act):
        return None
    codes, scales = a8_activation(shared)
    run = bind_int8(codes, scales, act.group_size, [(lay, dict(t), meta, rows) for lay, t, meta, rows in parts],
                    out_features, _out_dtype(x))
    return None if run is None else (lambda x, shared: run(*a8_activation(shared)))


def rms_norm_entry(x: torch.Tensor, weight: torch.Tensor, eps: float, act: ActQuant | None
             ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The registered RMSNorm kernel (:mod:`quantkit.runtime.kernels.triton.rms_norm`): y of x [M, K], and the A8 codes and scales of y that
    :func:`a8_activation` would make when ``act`` is one the int8 kernels take with power-of-two groups (else
    None, None: the consumers quantize y themselves)."""
    group_size = None
    if int8_path_ok(act) and (act.group_size == -1 or act.group_size & (act.group_size - 1) == 0):
        group_size = act.group_size
    return rms_norm_triton(x, weight, eps, group_size)
