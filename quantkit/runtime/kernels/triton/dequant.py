"""In-register dequantization of tile-planar 4-bit words (:mod:`quantkit.formats.nibble_planes`) into the
tensor-core operands of the 8 planes of a 256-column tile — one PTX path and one plain-Triton path per kind,
computing the same bits.

* :func:`planes_f16` → 8 fp16 (or bf16) planes (q - z)·s for the W4A16 kernel. PTX: per two words, PRMT gathers
  byte b of both words into one register, LOP3 with 0x000F000F | 0x6400 0x6400 turns the two low nibbles into
  the fp16 pair (1024 + q) — the magic-number int→float of MixLLM Sec. 3.3 / TurboMind Fig. 6, with 0x6400 =
  1024.0 playing the role 0x4b400000 plays for fp32 — then one sub.f16x2 of (1024 + z) and one mul.f16x2 by s.
  High nibbles are masked in place (1024 + 16q) and fixed with one fma by 1/16 and -(64 + z). Both are exact:
  every intermediate is an integer below 2048 or the single rounding of (q - z)·s.
  2 instructions per element.
* :func:`planes_i8` → 8 int8 planes ((q·s + a) mod 256) XOR 0x80 for the W4A8 kernels (LiquidGEMM Eq. 12; the
  MixLLM asymmetric case is s = 1, a = 128 - z, giving q - z, MixLLM Sec. 3.3 two-step dequantization). PTX: per
  four words, 3 PRMT gather byte b of each, then four int8 lanes at once — LOP3 (mask), IMAD (·s + a·0x01010101,
  no carry between lanes because q·s + a <= 255, LiquidGEMM Eq. 11), LOP3 (XOR 0x80808080) — 10 instructions per
  8 elements (LiquidGEMM Fig. 8 counts 7 without our 3 gathers).

Planes 0-3 (low nibbles) belong to the tile's first 128 columns, planes 4-7 to the second: the ``_lo``/``_hi``
parameters are the per-row values of those two half-tiles.
"""

from __future__ import annotations

import triton.language as tl

from quantkit.runtime.kernels.jit import kernel


def _gather_selector(b: int) -> int:
    """PRMT selector putting byte b of operand A in byte 0 and byte b of operand B in byte 2 (bytes 1 and 3 get
    the same and are masked off)."""
    return b | (b << 4) | ((4 + b) << 8) | ((4 + b) << 12)


def _asm_f16_byte(b: int, bf16: bool, words: tuple[str, str], consts: tuple[str, str, str, str],
                  outs: tuple[str, str]) -> list[str]:
    """PTX lines for byte b of two words → planes b (low nibbles) and b + 4 (high) as f16x2 (bf16x2) registers
    ``outs``; ``consts`` = (1024 + z_lo, s_lo, -(64 + z_hi), s_hi) operands (bf16: 128 + z_lo, s_lo, 128 + z_hi,
    s_hi); needs the registers p, t and c (= 0x2C002C00) of :func:`_asm_f16_head`."""
    ty = "bf16x2" if bf16 else "f16x2"
    magic = "0x43004300" if bf16 else "0x64006400"
    zl, sl, zh, sh = consts
    lines = [f"prmt.b32 p, {words[0]}, {words[1]}, {hex(_gather_selector(b))};",
             f"lop3.b32 t, p, 0x000F000F, {magic}, 0xea;",
             f"sub.rn.{ty} t, t, {zl};",
             f"mul.rn.{ty} {outs[0]}, t, {sl};"]
    if bf16:  # bf16 has 7 mantissa bits: shift the high nibble down instead of the 1/16 trick
        lines += ["shr.u32 t, p, 4;", f"lop3.b32 t, t, 0x000F000F, {magic}, 0xea;", f"sub.rn.{ty} t, t, {zh};"]
    else:
        lines += [f"lop3.b32 t, p, 0x00F000F0, {magic}, 0xea;", f"fma.rn.f16x2 t, t, c, {zh};"]
    lines.append(f"mul.rn.{ty} {outs[1]}, t, {sh};")
    return lines


def _asm_f16_head() -> list[str]:
    return ["{", ".reg .b32 p, t, c;", "mov.b32 c, 0x2C002C00;"]


def _asm_f16(bf16: bool) -> str:
    """PTX for 2 words ($8, $9) → 8 f16x2 registers ($0..$7 = planes 0..7); $10 = 1024 + z_lo (bf16: 128 + z_lo),
    $11 = s_lo, $12 = -(64 + z_hi) (bf16: 128 + z_hi), $13 = s_hi."""
    lines = _asm_f16_head()
    for b in range(4):
        lines += _asm_f16_byte(b, bf16, ("$8", "$9"), ("$10", "$11", "$12", "$13"), (f"${b}", f"${4 + b}"))
    return "\n".join(lines + ["}"])


def asm_f16_pair(b: int, bf16: bool) -> str:
    """PTX for byte b only of :func:`_asm_f16` (the same instructions, so the same bits): 2 words ($2, $3) →
    planes b ($0) and b + 4 ($1); $4..$7 as $10..$13 there. The Gluon W4A16 kernel forms planes a pair at a time."""
    lines = _asm_f16_head() + _asm_f16_byte(b, bf16, ("$2", "$3"), ("$4", "$5", "$6", "$7"), ("$0", "$1"))
    return "\n".join(lines + ["}"])


CONSTRAINTS_F16_PAIR_TEXT = "=r,=r," + ",".join(["r"] * 6)  # 2 outputs; 2 words + 4 f16x2 per pack of 2


def _asm_i8() -> str:
    """PTX for 4 words ($8..$11) → 8 int8x4 registers ($0..$7 = planes 0..7); $12 = s_lo, $16 = a_lo·0x01010101,
    $20 = s_hi, $24 = a_hi·0x01010101 (each int32 input arrives as 4 copies; the first is used)."""
    lines = ["{", ".reg .b32 u, v, g, t;"]
    for b in range(4):
        sel = hex(b | (4 + b) << 4)  # byte 0 = byte b of A, byte 1 = byte b of B
        lines += [f"prmt.b32 u, $8, $9, {sel};", f"prmt.b32 v, $10, $11, {sel};", "prmt.b32 g, u, v, 0x5410;",
                  "and.b32 t, g, 0x0F0F0F0F;", "mad.lo.u32 t, t, $12, $16;", f"xor.b32 ${b}, t, 0x80808080;",
                  "shr.u32 t, g, 4;", "and.b32 t, t, 0x0F0F0F0F;", "mad.lo.u32 t, t, $20, $24;",
                  f"xor.b32 ${4 + b}, t, 0x80808080;"]
    lines.append("}")
    return "\n".join(lines)


ASM_F16 = tl.constexpr(_asm_f16(False))
ASM_BF16 = tl.constexpr(_asm_f16(True))
ASM_I8_TEXT = _asm_i8()  # also the Gluon kernel's (lqq_wgmma), which wraps it in its own constexpr
ASM_I8 = tl.constexpr(ASM_I8_TEXT)
CONSTRAINTS_F16 = tl.constexpr("=r," * 8 + ",".join(["r"] * 6))  # 8 outputs; 2 words + 4 f16x2 per pack of 2
CONSTRAINTS_I8_TEXT = "=r," * 8 + ",".join(["r"] * 20)  # 8 outputs; 4 words + 4 × 4 int32 per pack of 4
CONSTRAINTS_I8 = tl.constexpr(CONSTRAINTS_I8_TEXT)


@kernel
def _nibble(words, p: tl.constexpr):
    """The 4-bit codes of plane p of a word tile, as int32 (shift = nibble_planes.plane_shift(p))."""
    return (words >> (8 * (p % 4) + 4 * (p // 4))) & 0xF


@kernel
def _plane_f16(words, p: tl.constexpr, z, s, BF16: tl.constexpr):
    """Plain-Triton plane p: fp16 (magic(q) - (1024 + z)) · s; bf16 via fp32 ((q - z)·s, one rounding) because
    the CPU interpreter mis-evaluates bf16 arithmetic — on a GPU both round the same exact product once."""
    if BF16:
        v = ((_nibble(words, p) - z.to(tl.int32)).to(tl.float32) * s.to(tl.float32)).to(tl.bfloat16)
    else:
        v = ((_nibble(words, p) | 0x6400).to(tl.int16).to(tl.float16, bitcast=True) - (z.to(tl.float16) + 1024.0)) * s
    return v


@kernel
def planes_f16(words, z_lo, s_lo, z_hi, s_hi, BF16: tl.constexpr, USE_ASM: tl.constexpr):
    """8 planes [R, 32] of (q - z)·s in fp16 (bf16 when BF16) from words [R, 32]; z_* uint8 [R, 1] zero points,
    s_* [R, 1] scales already in the output dtype."""
    if USE_ASM:
        if BF16:
            zl = (z_lo.to(tl.float32) + 128.0).to(tl.bfloat16)
            zh = (z_hi.to(tl.float32) + 128.0).to(tl.bfloat16)
            out = tl.inline_asm_elementwise(ASM_BF16, CONSTRAINTS_F16,
                                            [words, zl, s_lo, zh, s_hi], dtype=(tl.bfloat16,) * 8,
                                            is_pure=True, pack=2)
        else:
            zl = z_lo.to(tl.float16) + 1024.0
            zh = -64.0 - z_hi.to(tl.float16)  # high nibbles come out as 1024 + 16q: (v/16) - (64 + z)
            out = tl.inline_asm_elementwise(ASM_F16, CONSTRAINTS_F16,
                                            [words, zl, s_lo, zh, s_hi], dtype=(tl.float16,) * 8,
                                            is_pure=True, pack=2)
    else:
        out = (_plane_f16(words, 0, z_lo, s_lo, BF16), _plane_f16(words, 1, z_lo, s_lo, BF16),
               _plane_f16(words, 2, z_lo, s_lo, BF16), _plane_f16(words, 3, z_lo, s_lo, BF16),
               _plane_f16(words, 4, z_hi, s_hi, BF16), _plane_f16(words, 5, z_hi, s_hi, BF16),
               _plane_f16(words, 6, z_hi, s_hi, BF16), _plane_f16(words, 7, z_hi, s_hi, BF16))
    return out


@kernel
def _plane_i8(words, p: tl.constexpr, s, a):
    """Plain-Triton plane p: ((q·s + a) mod 256) XOR 0x80 as int8 == ((q·s + a) mod 256) - 128."""
    return (((_nibble(words, p) * s + a) & 0xFF) - 128).to(tl.int8)


@kernel
def planes_i8(words, s_lo, a_lo, s_hi, a_hi, USE_ASM: tl.constexpr):
    """8 int8 planes [R, 32] of ((q·s + a) mod 256) XOR 0x80 from words [R, 32]; s_*, a_* int32 [R, 1]
    (LiquidQuant: s_u8 and a; MixLLM asymmetric: 1 and 128 - z)."""
    if USE_ASM:
        out = tl.inline_asm_elementwise(
            ASM_I8, CONSTRAINTS_I8,
            [words, s_lo, a_lo * 0x01010101, s_hi, a_hi * 0x01010101], dtype=(tl.int8,) * 8, is_pure=True, pack=4)
    else:
        out = (_plane_i8(words, 0, s_lo, a_lo), _plane_i8(words, 1, s_lo, a_lo),
               _plane_i8(words, 2, s_lo, a_lo), _plane_i8(words, 3, s_lo, a_lo),
               _plane_i8(words, 4, s_hi, a_hi), _plane_i8(words, 5, s_hi, a_hi),
               _plane_i8(words, 6, s_hi, a_hi), _plane_i8(words, 7, s_hi, a_hi))
    return out


@kernel
def side_by_side(planes, first: tl.constexpr, count: tl.constexpr):
    """planes[first .. first + count - 1] ([R, 32] each) as one [R, 32·count] operand, plane i at columns
    32·i .. 32·i + 31 — the K order of the activation columns, so one tensor-core product covers them all.
    ``count`` 4 (planes ``first`` .. ``first`` + 3) or 8 (all planes, ``first`` 0)."""
    tl.static_assert(count == 4 or (count == 8 and first == 0), "side_by_side: count 4, or count 8 from plane 0")
    if count == 4:
        x = tl.join(tl.join(planes[first], planes[first + 1]), tl.join(planes[first + 2], planes[first + 3]))
        x = tl.permute(x, (0, 3, 2, 1))  # [r, c, i, j] holds plane 2j + i → [r, j, i, c]
    else:
        x = tl.join(tl.join(tl.join(planes[0], planes[1]), tl.join(planes[2], planes[3])),
                    tl.join(tl.join(planes[4], planes[5]), tl.join(planes[6], planes[7])))
        x = tl.permute(x, (0, 4, 3, 2, 1))  # [r, c, i, j, k] holds plane 4k + 2j + i
    return tl.reshape(x, (planes[0].shape[0], 32 * count))


@kernel
def group_scale_f32(p, W8: tl.constexpr):
    """fp32 weight-group scale from a per-group word: stored as float32 (``w8``) or as the fp16 bits 0-15 of a
    ``w4a16`` word (scale | zero << 16), widened exactly (MixLLM Sec. 3.3 step 2's weight scale)."""
    if W8:
        s = p
    else:
        s = (p & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return s
