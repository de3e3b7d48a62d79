"""Bit-packing of small unsigned integers into int32 words, shared by every on-disk layout.

One rule covers all bit-widths: along the packed dimension the values form a little-endian bit stream, value j
occupying bits [j·b, (j+1)·b) of the stream, and word w holding stream bits [32·w, 32·(w+1)). For b in {2, 4, 8}
this is the familiar "value j at bits (j mod 32/b)·b of word j div (32/b)"; for b = 3 it is exactly GPTQ's
32-values-in-3-words packing (ten values, two bits of the eleventh, ...); for 5, 6, 7 a value may straddle two
words. Words are stored as int32 (safetensors and torch have no uint32 arithmetic); the bit pattern is what counts.
"""

from __future__ import annotations

import torch

_WORD = 32
_ROW_CHUNK_ELEMS = 1 << 22  # bounds the int64 temporaries of one call to a few tens of MB


def words_for(count: int, bits: int) -> int:
    """Number of int32 words holding ``count`` values of ``bits`` bits: ceil(count·bits / 32)."""
    return -(-count * bits // _WORD)


def pad_to_multiple(count: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is >= ``count``."""
    return -(-count // multiple) * multiple


def pad_last(x: torch.Tensor, length: int) -> torch.Tensor:
    """``x`` zero-padded along its last dimension to ``length`` (unchanged when already that long)."""
    extra = length - x.shape[-1]
    if extra < 0:
        raise ValueError(f"cannot pad length {x.shape[-1]} down to {length}")
    if extra == 0:
        return x
    return torch.cat([x, x.new_zeros(*x.shape[:-1], extra)], dim=-1)


def _to_int32(u: torch.Tensor) -> torch.Tensor:
    """int64 holding unsigned 32-bit patterns → int32 with the same bits (two's complement reinterpretation)."""
    return torch.where(u >= 1 << 31, u - (1 << 32), u).to(torch.int32)


def _positions(count: int, bits: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    pos = torch.arange(count, device=device, dtype=torch.int64) * bits
    return pos // _WORD, pos % _WORD


def pack_bits(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack integers in [0, 2^bits) along the last dimension into int32 words [..., ceil(C·bits/32)].

    The bit-stream rule of the module docstring; leading dimensions are kept. Raises ValueError when a value
    does not fit ``bits`` bits (a record that breaks its own invariant, i.e. a bug upstream).
    """
    if not 1 <= bits <= _WORD:
        raise ValueError(f"bits must be in 1..32, got {bits}")
    lead, count = tuple(values.shape[:-1]), values.shape[-1]
    v = values.reshape(-1, count).to(torch.int64)
    if v.numel() and (int(v.min()) < 0 or int(v.max()) >= 1 << bits):
        raise ValueError(f"values outside [0, {(1 << bits) - 1}] cannot be packed in {bits} bits")
    n_words = words_for(count, bits)
    word, off = _positions(count, bits, v.device)
    spill = (off + bits) > _WORD  # values whose high bits continue in the next word
    out = torch.zeros(v.shape[0], n_words + 1, dtype=torch.int64, device=v.device)
    step = max(1, _ROW_CHUNK_ELEMS // max(count, 1))
    for r in range(0, v.shape[0], step):
        vr = v[r:r + step]
        idx = word.expand_as(vr)
        # the bit ranges are disjoint, so a sum is the OR of the shifted values
        out[r:r + step].scatter_add_(1, idx, (vr << off) & 0xFFFFFFFF)
        if bool(spill.any()):
            high = torch.where(spill, vr >> (_WORD - off), torch.zeros_like(vr))
            out[r:r + step].scatter_add_(1, idx + 1, high)
    return _to_int32(out[:, :n_words]).reshape(*lead, n_words)


def unpack_bits(words: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: the first ``count`` ``bits``-bit values of int32 words [..., W] → int64
    [..., count]. Raises ValueError when W words cannot hold ``count`` values."""
    if not 1 <= bits <= _WORD:
        raise ValueError(f"bits must be in 1..32, got {bits}")
    lead, n_words = tuple(words.shape[:-1]), words.shape[-1]
    if words_for(count, bits) > n_words:
        raise ValueError(f"{n_words} words hold fewer than {count} values of {bits} bits")
    u = words.reshape(-1, n_words).to(torch.int64) & 0xFFFFFFFF
    u = torch.cat([u, u.new_zeros(u.shape[0], 1)], dim=1)  # a zero word so the spill read never leaves the row
    word, off = _positions(count, bits, u.device)
    mask = (1 << bits) - 1
    out = torch.empty(u.shape[0], count, dtype=torch.int64, device=u.device)
    step = max(1, _ROW_CHUNK_ELEMS // max(count, 1))
    for r in range(0, u.shape[0], step):
        ur = u[r:r + step]
        lo = ur[:, word] >> off
        hi = ur[:, word + 1] << (_WORD - off)  # off = 0: shifts the whole next word above the mask
        out[r:r + step] = (lo | hi) & mask
    return out.reshape(*lead, count)
