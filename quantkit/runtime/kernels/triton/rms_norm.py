"""RMSNorm with the A8 activation quantization of its consumers folded in (Triton, one pass per token row).

transformers' RMSNorm (Llama, Mistral, Qwen2/3) is eight torch operations — cast, square, mean, add, rsqrt,
multiply, cast, multiply by the weight — each a kernel launch and a pass over the hidden states in eager mode.
This kernel computes the same function in one program per row,

    y = fp16( w · fp16( x · rsqrt(mean(x²) + eps) ) )      (x, w and y in the model's dtype, the rest in fp32)

— the order of transformers' ``weight * hidden_states.to(input_dtype)`` — and, when the projections that read y
quantize their activations (MixLLM Sec. 3.1.2 A8, per 128-column group or per token), writes their int8 codes and
float32 scales from the very y it stores, with the arithmetic of :mod:`quantkit.runtime.kernels.triton.act_quant`
(the same helper functions), so the codes equal ``quantize_activation_triton(y)`` bit for bit. Like the quantizer,
each program first lets the next kernel launch (programmatic dependent launch on Hopper,
:mod:`quantkit.runtime.kernels.cuda.common`; that kernel still waits for this one's results). The sum of squares is
reduced in another order than torch's and rsqrt is the hardware's: y can differ from transformers' by up to two
rounding steps of the model dtype (one in fp16(x·r), carried through the product with w).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from quantkit.quant.grid import num_groups
from quantkit.runtime.kernels.triton.act_quant import HAVE_GDC, MAX_ROW, _codes, _scale_up, gdc_launch_dependents
from quantkit.runtime.kernels.cuda.common import pdl_supported
from quantkit.runtime.kernels.jit import PreparedByShape, PreparedLaunch, check_device, kernel, launch_kernel


@kernel
def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, c_ptr, s_ptr, K, G, eps, stride_xm, stride_ym, stride_cm, stride_sm,
                     BK: tl.constexpr, GS: tl.constexpr, QUANT: tl.constexpr, PER_TOKEN: tl.constexpr,
                     QMAX: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # as the activation quantizer does: the decode GEMV after may launch and stream its weights now
        gdc_launch_dependents()
    row = tl.program_id(0)
    k = tl.arange(0, BK)
    mask = k < K
    x = tl.load(x_ptr + row * stride_xm + k, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + k, mask=mask, other=0.0)
    r = tl.math.rsqrt(tl.sum(x * x, axis=0) / K + eps)
    normed = (x * r).to(w.dtype)
    y = (w.to(tl.float32) * normed.to(tl.float32)).to(w.dtype)
    tl.store(y_ptr + row * stride_ym + k, y, mask=mask)
    if QUANT:
        v = y.to(tl.float32)  # the stored values, as the quantizer would read them back
        if PER_TOKEN:
            s = _scale_up(tl.max(tl.abs(v), axis=0), QMAX)
            tl.store(c_ptr + row * stride_cm + k, _codes(v, s, QMAX), mask=mask)
            tl.store(s_ptr + row * stride_sm, s)
        else:
            groups = tl.reshape(v, (BK // GS, GS))
            s = _scale_up(tl.max(tl.abs(groups), axis=1), QMAX)
            codes = tl.reshape(_codes(groups, s[:, None], QMAX), (BK,))
            tl.store(c_ptr + row * stride_cm + k, codes, mask=mask)
            g = tl.arange(0, BK // GS)
            tl.store(s_ptr + row * stride_sm + g, s, mask=g < G)


_PREPARED = PreparedByShape()  # call shape → (prepared launch, groups)


def rms_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, group_size: int | None = None,
                    bits: int = 8) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(y [M, K] in x's dtype, codes int8 [M, K] or None, scales float32 [M, G] or None) for x [M, K] (unit column
    stride) and ``weight`` [K] of x's dtype (module docstring). ``group_size`` None: no quantization; -1 per
    token; else a power of two >= 16 (:func:`quantkit.runtime.kernels.triton.act_quant.quantize_activation_triton`'s
    groups). A call shaped like an earlier one (shapes, strides, dtypes, device, eps, groups, bits) reuses its
    prepared launch (:class:`~quantkit.runtime.kernels.jit.PreparedLaunch`)."""
    quant = group_size is not None
    key = (tuple(x.shape), x.stride(), x.dtype, x.device, tuple(weight.shape), weight.dtype, weight.device, float(eps),
           group_size, bits)
    prepared, g = _PREPARED.get(key)
    if prepared is not None and weight.is_contiguous():
        y = torch.empty_like(x)
        codes = torch.empty(x.shape, dtype=torch.int8, device=x.device) if quant else y
        scales = torch.empty(x.shape[0], g, dtype=torch.float32, device=x.device) if quant else y
        if prepared(x, weight, y, codes, scales):
            return (y, codes, scales) if quant else (y, None, None)
    if x.dim() != 2 or x.stride(1) != 1 or weight.shape != (x.shape[1],) or weight.dtype != x.dtype:
        raise ValueError(f"rms_norm_triton takes x [M, K] with unit column stride and a weight [K] of its dtype, got "
                         f"{tuple(x.shape)} {x.dtype} and {tuple(weight.shape)} {weight.dtype}")
    if group_size is not None and group_size != -1 and (group_size < 16 or group_size & (group_size - 1)):
        raise ValueError(f"group_size must be None, -1 or a power of two >= 16, got {group_size}")
    check_device(x, weight)
    m, k = x.shape
    bk = max(triton.next_power_of_2(k), 16 if group_size in (None, -1) else group_size)
    if bk > MAX_ROW:
        raise ValueError(f"rms_norm_triton holds a row of at most {MAX_ROW} features in one program, got K = {k}")
    y = torch.empty_like(x)
    g = num_groups(k, group_size) if quant else 1
    codes = torch.empty(m, k, dtype=torch.int8, device=x.device) if quant else y
    scales = torch.empty(m, g, dtype=torch.float32, device=x.device) if quant else y
    pdl = HAVE_GDC and x.is_cuda and pdl_supported(x.device.index if x.device.index is not None
                                                   else torch.cuda.current_device())
    if m:
        args = (x, weight.contiguous(), y, codes, scales, k, g, float(eps), x.stride(0), y.stride(0), codes.stride(0),
                scales.stride(0))
        kwargs = dict(BK=bk, GS=group_size if quant and group_size > 0 else 16, QUANT=quant,
                      PER_TOKEN=group_size == -1, QMAX=float(2 ** (bits - 1) - 1), PDL=pdl,
                      num_warps=8 if bk >= 2048 else 4)
        launch_kernel(_rms_norm_kernel, (m,), *args, **kwargs)
        _PREPARED.remember(key, lambda: PreparedLaunch.create(_rms_norm_kernel, (m,), args, kwargs, (0, 1, 2, 3, 4)),
                           g)
    return (y, codes, scales) if quant else (y, None, None)
