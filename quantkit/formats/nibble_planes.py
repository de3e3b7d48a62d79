"""The 4-bit code packing of the GPU kernel layouts ``w4a16`` and ``w4a8-lqq``: "tile-planar" int32 words.

K is cut into tiles of TILE_K = 256 input columns, each tile into PLANES = 8 planes of PLANE_K = 32 consecutive
columns. Word j (0 <= j < 32) of tile t in row n holds the code of column ``256·t + 32·p + j`` of every plane p,
at bits ``8·(p mod 4) + 4·(p div 4)``: byte b holds plane b in its low nibble and plane b + 4 in its high nibble.

    code[n, 256·t + 32·p + j]  →  qweight[n, 32·t + j]  bits [8·(p % 4) + 4·(p // 4), +4)

Why this order (the kernels read it with no run-time permutation, docs/formats.md draws it):

* a [rows, 32]-word tile covers 256 columns; its 8 planes are the 8 [rows, 32] k-slices of the tile's
  tensor-core operand, and every word feeds the *same* fragment slot of all 8 (TurboMind Sec. 4.1: the layout
  follows the MMA data path; LiquidGEMM Sec. 5.2: one wide load carries the codes of several MMAs). Unpacking a
  plane is elementwise on the word tile, so Triton keeps it in the MMA operand registers, and the 8 planes side
  by side are one [rows, 256] operand in the activations' K order: one product per tile;
* low nibbles of all bytes are planes 0-3 (columns 256t..256t+127), high nibbles planes 4-7 (256t+128..255):
  one 0x0F0F0F0F mask yields four int8 lanes of one 128-column group (the SWAR dequantization of LiquidGEMM
  Fig. 8 with a single per-group multiplier), one 0x000F000F mask with the 0x6400 exponent yields an fp16 pair;
* a row's 32 words per tile are 128 contiguous bytes: 16-byte vector loads, full cache lines.

K is zero-padded to a multiple of 256 (padding codes are 0; the kernels zero the matching activations).
"""

from __future__ import annotations

import torch

from quantkit.formats.bitpack import pad_last, pad_to_multiple

TILE_K = 256
PLANES = 8
PLANE_K = TILE_K // PLANES  # 32 columns per plane = words per row per tile
BITS = 4


def padded_k(k: int) -> int:
    """K rounded up to a whole number of 256-column tiles."""
    return pad_to_multiple(max(k, 1), TILE_K)


def plane_shift(p: int) -> int:
    """Bit offset of plane ``p``'s nibble inside a word (byte p mod 4, high nibble for planes 4-7)."""
    return 8 * (p % 4) + 4 * (p // 4)


def _to_int32(u: torch.Tensor) -> torch.Tensor:
    """int64 holding unsigned 32-bit patterns → int32 with the same bits."""
    return torch.where(u >= 1 << 31, u - (1 << 32), u).to(torch.int32)


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [N, K] in [0, 15] → int32 words [N, padded_k(K) / 8] in tile-planar order (module docstring).
    Raises ValueError for codes above 15 (a record breaking its own invariant)."""
    if codes.dim() != 2:
        raise ValueError(f"expected codes [N, K], got shape {tuple(codes.shape)}")
    c = codes.to(torch.int64)
    if c.numel() and (int(c.min()) < 0 or int(c.max()) > 15):
        raise ValueError("4-bit codes must lie in [0, 15]")
    n, k = c.shape
    kp = padded_k(k)
    tiles = pad_last(c, kp).reshape(n, kp // TILE_K, PLANES, PLANE_K)
    shifts = torch.tensor([plane_shift(p) for p in range(PLANES)], dtype=torch.int64, device=c.device)
    words = (tiles << shifts.view(1, 1, PLANES, 1)).sum(dim=2)  # disjoint bit ranges: sum == OR
    return _to_int32(words.reshape(n, kp // PLANES)).contiguous()


def unpack_codes(words: torch.Tensor, k: int) -> torch.Tensor:
    """Inverse of :func:`pack_codes`: int32 words [N, padded_k(K) / 8] → uint8 codes [N, K]."""
    n, w = words.shape
    if w * PLANES != padded_k(k):
        raise ValueError(f"{w} words per row do not hold K = {k} tile-planar codes (expected {padded_k(k) // 8})")
    u = words.to(torch.int64) & 0xFFFFFFFF
    tiles = u.reshape(n, w // PLANE_K, 1, PLANE_K)
    shifts = torch.tensor([plane_shift(p) for p in range(PLANES)], dtype=torch.int64, device=words.device)
    codes = (tiles >> shifts.view(1, 1, PLANES, 1)) & 0xF
    return codes.reshape(n, -1)[:, :k].to(torch.uint8)


def pad_to_tiles(x: torch.Tensor) -> torch.Tensor:
    """``x`` [..., K] zero-padded along K to padded_k(K) (the activation side of a tile-planar product)."""
    return pad_last(x, padded_k(x.shape[-1]))
