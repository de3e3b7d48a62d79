"""Checks and conversions every layout shares: record consistency, fp16 storage of scales, the default grouping,
and validation of tensors read back from a checkpoint (a wrong shape there is a user-facing problem — a corrupt
file or a mismatched manifest — so it raises QuantkitError, not a traceback)."""

from __future__ import annotations

import torch

from quantkit.errors import QuantkitError
from quantkit.quant.grid import num_groups
from quantkit.quant.records import QuantizedWeight

FP16_MAX = torch.finfo(torch.float16).max


def record_problem(qw: QuantizedWeight) -> str | None:
    """Why ``qw`` is not a consistent record (shapes of scales/zeros/g_idx/channel_scales against codes [N, K],
    codes/zeros within their bit-width, fp16-storable scales), or None. Every layout's ``supports`` uses it."""
    if qw.codes.dim() != 2:
        return f"codes must be 2-D [N, K], got shape {tuple(qw.codes.shape)}"
    n, k = qw.codes.shape
    g = num_groups(k, qw.group_size)
    if tuple(qw.scales.shape) != (n, g) or tuple(qw.zeros.shape) != (n, g):
        return (f"scales {tuple(qw.scales.shape)} / zeros {tuple(qw.zeros.shape)} do not match [N, G] = {(n, g)} "
                f"for K={k}, group_size={qw.group_size}")
    if qw.g_idx is not None:
        if tuple(qw.g_idx.shape) != (k,):
            return f"g_idx has shape {tuple(qw.g_idx.shape)}, expected ({k},)"
        if k and (int(qw.g_idx.min()) < 0 or int(qw.g_idx.max()) >= g):
            return f"g_idx values must lie in [0, {g - 1}]"
    if qw.channel_scales is not None and tuple(qw.channel_scales.shape) != (n,):
        return f"channel_scales has shape {tuple(qw.channel_scales.shape)}, expected ({n},)"
    if qw.fp8:
        if qw.bits != 8 or qw.channel_scales is not None:
            return f"FP8 E4M3 weights are 8-bit and one-level, this one has {qw.bits} bits"
        if qw.codes.numel() and bool(((qw.codes & 0x7F) == 0x7F).any()):
            return "FP8 codes include NaN bit patterns (0x7F / 0xFF); quantize with quantkit.quant.grid.quantize_fp8"
    zero_bits = 8 if qw.channel_scales is not None else qw.bits  # LiquidQuant offsets a are full bytes
    for name, t, b in (("codes", qw.codes, qw.bits), ("zeros", qw.zeros, zero_bits)):
        if t.numel() and (int(t.min()) < 0 or int(t.max()) > 2 ** b - 1):
            return f"{name} must lie in [0, {2 ** b - 1}] for {b}-bit storage"
    for name, t in (("scales", qw.scales), ("channel_scales", qw.channel_scales)):
        if t is not None and t.numel() and float(t.float().abs().max()) > FP16_MAX:
            return f"{name} exceed the fp16 range the checkpoint stores them in"
    return None


def default_g_idx(k: int, group_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """g_idx of consecutive groups (k // group_size; all zeros per-channel) as int32 [K]."""
    gs = max(k, 1) if group_size == -1 else group_size
    return (torch.arange(k, device=device) // gs).to(torch.int32)


def has_act_order(qw: QuantizedWeight) -> bool:
    """True when ``qw.g_idx`` differs from the consecutive grouping (GPTQ desc_act without static groups)."""
    if qw.g_idx is None:
        return False
    return not torch.equal(qw.g_idx.to(torch.int32).cpu(), default_g_idx(qw.codes.shape[1], qw.group_size))


def g_idx_or_none(g_idx: torch.Tensor, k: int, group_size: int) -> torch.Tensor | None:
    """A g_idx read from disk as the record stores it: None when it is the consecutive grouping."""
    g_idx = g_idx.to(torch.int32)
    return None if torch.equal(g_idx.cpu(), default_g_idx(k, group_size)) else g_idx


def fp16(x: torch.Tensor) -> torch.Tensor:
    """A contiguous fp16 copy for storage (scales are fp16-representable by construction, grid.round_scale_up)."""
    return x.to(torch.float16).contiguous()


def require(tensors: dict, name: str, shape: tuple[int, ...], dtype: torch.dtype, layout: str) -> torch.Tensor:
    """``tensors[name]``, checked for presence, shape and dtype; QuantkitError naming the tensor otherwise."""
    if name not in tensors:
        raise QuantkitError(f"{layout} weight is missing tensor '{name}' (has {sorted(tensors)}); "
                            f"the checkpoint is incomplete or was written with another layout")
    t = tensors[name]
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
        raise QuantkitError(f"{layout} tensor '{name}' is {t.dtype} {tuple(t.shape)}, expected {dtype} "
                            f"{tuple(shape)}; the checkpoint does not match its manifest")
    return t


def meta_field(meta: dict, key: str, layout: str):
    """``meta[key]``; QuantkitError when the manifest entry lacks it."""
    if key not in meta:
        raise QuantkitError(f"{layout} layout metadata lacks '{key}' (has {sorted(meta)}); "
                            f"the manifest is incomplete or from another quantkit version")
    return meta[key]


def refuse_unsupported(layout: str, reason: str | None) -> None:
    """Raise QuantkitError when a layout's ``supports`` gave a ``reason`` it cannot hold a weight."""
    if reason is not None:
        raise QuantkitError(f"layout '{layout}' cannot store this weight: {reason}")
