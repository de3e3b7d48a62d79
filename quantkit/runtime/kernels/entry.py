"""The kernels as :mod:`quantkit.runtime.dispatch` calls them: ``fn(x [M, K], tensors, meta, act) -> [M, N]``.

Each kernel layout gets one entry that receives raw activations (``quantizes_activations=True``) and picks:

* A8 symmetric activations with groups of a multiple of 128 (or per token) → the Triton activation quantizer,
  then the int8 tensor-core kernel of the layout (W8A8, MixLLM W4A8, LiquidQuant W4A8);
* no activation quantization and a ``w4a16`` weight with fp16/bf16 activations → the W4A16 kernel;
* anything else (another activation format, fp32 activations for W4A16, A16 with an int8-only layout) → the
  activations are fake-quantized with :func:`quantkit.quant.act.quantize_activation` and multiplied by the
  dequantized weight in torch — the same numbers QuantLinear's reference path computes, just not fast.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F

from quantkit.quant.act import quantize_activation, quantize_activation_int
from quantkit.runtime.kernels.act_quant import quantize_activation_triton
from quantkit.runtime.kernels.int8_gemm import MODES, int8_matmul
from quantkit.runtime.kernels.w4a16 import w4a16_matmul

HALF_DTYPES = (torch.float16, torch.bfloat16)


def int8_path_ok(act) -> bool:
    """True when the int8 kernels can apply the activation quantization ``act`` (8-bit symmetric, groups of a
    multiple of 128 or per token)."""
    return (act is not None and act.bits == 8 and act.sym
            and (act.group_size == -1 or (act.group_size > 0 and act.group_size % 128 == 0)))


def quantize_for_kernel(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A8 codes and scales of ``x`` [M, K]: the Triton kernel for power-of-two groups (and per token), torch
    otherwise (same values either way)."""
    if group_size == -1 or group_size & (group_size - 1) == 0:
        return quantize_activation_triton(x.contiguous(), 8, group_size)
    return quantize_activation_int(x, 8, group_size)


def _dense(x: torch.Tensor, layout: str, tensors: Mapping[str, torch.Tensor], meta: dict) -> torch.Tensor:
    from quantkit.formats.registry import get_layout
    from quantkit.quant.grid import dequantize

    w = dequantize(get_layout(layout).unpack(dict(tensors), meta), torch.float32).to(x.dtype)
    return F.linear(x, w)


def layout_kernel(layout: str) -> Callable:
    """The dispatch entry of a kernel layout (module docstring)."""
    if layout not in MODES:
        raise ValueError(f"no Triton kernels for layout '{layout}'")

    def run(x: torch.Tensor, tensors: Mapping[str, torch.Tensor], meta: dict, act) -> torch.Tensor:
        if int8_path_ok(act):
            codes, scales = quantize_for_kernel(x, act.group_size)
            out_dtype = x.dtype if x.dtype.is_floating_point else torch.float32
            return int8_matmul(codes, scales.float(), act.group_size, layout, dict(tensors), meta,
                               out_dtype=out_dtype)
        xq = x if act is None else quantize_activation(x, act.bits, act.group_size, act.sym)
        if layout == "w4a16" and xq.dtype in HALF_DTYPES:
            return w4a16_matmul(xq.contiguous(), dict(tensors), meta)
        return _dense(xq, layout, tensors, meta)

    run.__name__ = f"triton_{layout.replace('-', '_')}"
    return run
