"""Activation quantization: fake-quant for accuracy runs, integer codes for the W4A8/W8A8 kernels' reference,
and forward pre-hooks that quantize every linear's input.

MixLLM Sec. 3.1.2 / 4.1: 8-bit symmetric activations, group-wise with group size 128 along the hidden (K)
dimension; group_size = -1 is the per-token scheme of SmoothQuant/QuaRot/QServe. Activations are quantized with
exactly the weight grid (:mod:`quantkit.quant.grid`, rows = tokens): fp16 scales s = absmax / (2^(b-1) - 1),
symmetric codes in [-(2^(b-1) - 1), 2^(b-1) - 1]. K not a multiple of the group gives a short last group.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from quantkit.errors import QuantkitError
from quantkit.quant import grid


def _check(bits: int, group_size: int) -> None:
    if not 2 <= int(bits) <= 8:
        raise QuantkitError(f"activation bits must be in 2..8, got {bits}; MixLLM uses 8")
    if group_size != -1 and int(group_size) < 1:
        raise QuantkitError(f"activation group size must be -1 (per token) or >= 1, got {group_size}; e.g. 128")


def quantize_activation(x: torch.Tensor, bits: int = 8, group_size: int = 128, sym: bool = True,
                        fp8: bool = False) -> torch.Tensor:
    """Fake-quantized activations (quantize → dequantize), same shape and dtype as ``x`` [..., K], grouped along
    the last dim (MixLLM Sec. 3.1.2: A8 symmetric g128; group_size -1 = per token); ``fp8``: the e4m3 grid of
    :func:`quantize_activation_fp8` instead of the integer one."""
    _check(bits, group_size)
    if fp8:
        return quantize_activation_fp8(x, group_size)
    k = x.shape[-1]
    rows = x.reshape(-1, k)
    return grid.dequantize(grid.quantize(rows, bits, group_size, sym), x.dtype).reshape(x.shape)


def quantize_activation_int(x: torch.Tensor, bits: int = 8,
                            group_size: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric integer activations for the kernels (MixLLM Sec. 3.1.2, LiquidGEMM Eq. 1 with z = 0): codes int8
    [..., K] in [-(2^(b-1) - 1), 2^(b-1) - 1] and fp16-rounded scales float32 [..., G], with
    codes · scales[..., k // group_size] == quantize_activation(x, bits, group_size) exactly."""
    _check(bits, group_size)
    k = x.shape[-1]
    qw = grid.quantize(x.reshape(-1, k), bits, group_size, sym=True)
    codes = (qw.codes.to(torch.int16) - 2 ** (bits - 1)).to(torch.int8)
    return codes.reshape(x.shape), qw.scales.reshape(*x.shape[:-1], qw.num_groups)


def quantize_activation_fp8(x: torch.Tensor, group_size: int = -1) -> torch.Tensor:
    """Dynamic FP8 E4M3 activations, fake-quantized (the per-token scheme of vLLM's FP8 W8A8 with group_size -1):
    per group (token) the fp32 scale absmax / 448 (1 for an all-zero group), values e4m3(x / scale) · scale, in
    x's dtype. The scale is not rounded to fp16: the GEMM takes it as an fp32 row scale (at least fp32's smallest
    normal value)."""
    k = x.shape[-1]
    rows = x.reshape(-1, k).float()
    gs = k if group_size == -1 else group_size
    out = torch.empty_like(rows)
    for start in range(0, k, gs):
        codes, scale = _fp8_group(rows[:, start:start + gs])
        out[:, start:start + gs] = codes.float() * scale
    return out.to(x.dtype).reshape(x.shape)


def quantize_activation_fp8_codes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token FP8 E4M3 activations for the FP8 GEMM: codes float8_e4m3fn [M, K] and float32 scales [M, 1] of
    x [M, K], with codes · scales == :func:`quantize_activation_fp8` (x, -1) before its cast to x's dtype."""
    return _fp8_group(x.float())


def _fp8_group(part: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 codes, fp32 scale [rows, 1]) of fp32 rows ``part``: scale = absmax / 448, 1 for an all-zero row."""
    absmax = part.abs().amax(dim=1, keepdim=True)
    # a row so small that absmax / 448 underflows fp32 keeps the smallest normal scale (its codes round to 0)
    scale = (absmax / grid.device_scalar(grid.FP8_MAX, part)).clamp_min(torch.finfo(torch.float32).tiny)
    scale = torch.where(absmax > 0, scale, torch.ones_like(absmax))
    return grid.e4m3_round(part / scale), scale


def _fake_quant_input(module: nn.Module, args: tuple, bits: int, group_size: int, sym: bool, fp8: bool) -> tuple:
    return (quantize_activation(args[0], bits, group_size, sym, fp8),) + tuple(args[1:])


def attach_act_quant(target: nn.Module | dict[str, nn.Module], bits: int = 8, group_size: int = 128,
                     sym: bool = True, fp8: bool = False) -> list[RemovableHandle]:
    """Register forward pre-hooks that fake-quantize the input of each linear (MixLLM A8 simulation; ``fp8``:
    dynamic e4m3, :func:`quantize_activation_fp8`).

    ``target``: a dict name → nn.Linear, a single nn.Linear, or a causal LM (all decoder-layer linears,
    :func:`quantkit.model.walk.iter_linears`). Returns the handles; :func:`remove_hooks` undoes it.
    """
    _check(bits, group_size)
    if isinstance(target, dict):
        modules = list(target.values())
    elif isinstance(target, nn.Linear):
        modules = [target]
    else:
        from quantkit.model.walk import iter_linears

        modules = [m for _, m in iter_linears(target)]
    if not modules:
        raise QuantkitError("no linear layers to quantize activations of; pass a model or a dict of nn.Linear")
    hook = functools.partial(_fake_quant_input, bits=bits, group_size=group_size, sym=sym, fp8=fp8)
    return [m.register_forward_pre_hook(hook) for m in modules]


def remove_hooks(handles: list[RemovableHandle]) -> None:
    """Remove hooks returned by :func:`attach_act_quant` (idempotent)."""
    for h in handles:
        h.remove()
