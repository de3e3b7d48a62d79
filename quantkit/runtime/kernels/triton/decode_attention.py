"""Decode attention: one query token per sequence against a KV cache, split over the cache (flash-decoding).

At a decode step each sequence has one query token, so attention is a matrix-vector product per head, bound by
reading the cache. Two things make it fast:

* **Grouped query heads share one read of their KV head** (TurboMind Sec. 4's Q rearrangement; BitDecoding's
  packing of the query heads of a KV head into the rows of one MMA tile): one program takes the ``rep = Hq / Hkv``
  query heads of a KV head as the rows of a ``[BLOCK_H, D]`` tile (zero rows pad it to 16 for the tensor cores) and
  reads each key and value block once for all of them, where SDPA over ``repeat_kv`` reads it ``rep`` times.
* **Split-KV** (flash-decoding): at batch 1 there are only ``Hkv`` (8 for Llama-3.1-8B) such programs, too few for
  a GPU, so the cache is cut into ``splits`` chunks of whole ``BLOCK_N`` blocks. Each program keeps the online
  softmax of its chunk (running max ``m``, sum ``l`` of exp(s - m), and the unnormalised output, FlashAttention's
  recurrence) and writes them; :func:`_combine_kernel` merges the chunks of each head,
  ``o = Σ_s e^{m_s - M} o_s / Σ_s e^{m_s - M} l_s`` with ``M = max_s m_s``.

Positions a boolean ``mask`` [B, L] marks False (a static cache's unwritten tail, padding) take no weight; a head
with no visible position gets zeros. Scores and the softmax are fp32; probabilities are rounded to the cache dtype
for the P·V product, as FlashAttention does. :func:`decode_attention_reference` is the same function in torch.

:func:`decode_attention_kv8` reads a KV8 cache instead (:func:`quantkit.quant.kv.pack`: uint8 codes, an fp16 scale
and minimum per token and head), dequantizing each block in registers before the same dots (BitDecoding: the
low-bit cache converted in registers, tensor-core MMAs on the result); :func:`kv8_reference` is its torch form.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from quantkit.runtime.kernels.attention_launch import launch_for
from quantkit.runtime.kernels.jit import INTERPRET, check_device, kernel, launch_kernel

MIN_ROWS = 16  # the smallest row count of a tensor-core dot


@kernel
def _dot(a, b, DOT_F32: tl.constexpr):
    """``tl.dot(a, b)`` in fp32 accumulation; under Triton's CPU interpreter (which multiplies bf16 tiles wrongly)
    the same values as fp32 tiles."""
    if DOT_F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    return tl.dot(a, b)


@kernel
def _codes_as(codes, dtype: tl.constexpr, INTERPRETED: tl.constexpr):
    """Integer codes as exact ``dtype`` values (via fp32 under the CPU interpreter, whose direct uint8 → bf16
    conversion is wrong)."""
    if INTERPRETED:
        return codes.to(tl.float32).to(dtype)
    return codes.to(dtype)


@kernel
def _softmax_step(scores, valid, m_i, l_i):
    """One block of FlashAttention's online softmax: positions not ``valid`` take no weight; returns the block's
    probabilities (relative to the new running max), the factor ``alpha`` that rescales the old output, and the
    new running max and sum."""
    scores = tl.where(valid[None, :], scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no visible position yet: keep exp() finite
    p = tl.exp(scores - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, axis=1)


@kernel
def _attend_block(q, k, v, valid, m_i, l_i, acc, scale, DOT_F32: tl.constexpr):
    """Scores of the query rows against keys [BLOCK_N, D], the online softmax, and P·V added to ``acc``;
    probabilities are rounded to the cache dtype for the P·V product, as FlashAttention does."""
    p, alpha, m_i, l_i = _softmax_step(_dot(q, tl.trans(k), DOT_F32) * scale, valid, m_i, l_i)
    return m_i, l_i, acc * alpha[:, None] + _dot(p.to(v.dtype), v, DOT_F32)


@kernel
def _store_partial(o_ptr, m_ptr, l_ptr, acc, m_i, l_i, b, heads, live, s, so_b, so_h, so_s, sml_b, sml_h,
                   D: tl.constexpr):
    """A split's unnormalised output rows and softmax state (max, sum) for :func:`_combine_kernel`."""
    d = tl.arange(0, D)
    tl.store(o_ptr + b * so_b + heads[:, None] * so_h + s * so_s + d[None, :], acc, mask=live[:, None])
    tl.store(m_ptr + b * sml_b + heads * sml_h + s, m_i, mask=live)
    tl.store(l_ptr + b * sml_b + heads * sml_h + s, l_i, mask=live)


@kernel
def _program_start(q_ptr, sq_b, sq_h, rep, BLOCK_H: tl.constexpr, D: tl.constexpr):
    """A split program's indices (sequence, KV head, split), its live query rows and their heads, the query tile
    [BLOCK_H, D], and an empty online-softmax state (running max, sum, output)."""
    # 64-bit sequence index: batch × a long cache passes 2^31 elements (32 sequences of 128K tokens, 8 KV heads)
    b, kvh, s = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    rows = tl.arange(0, BLOCK_H)
    live = rows < rep
    heads = kvh * rep + rows
    d = tl.arange(0, D)
    q = tl.load(q_ptr + b * sq_b + heads[:, None] * sq_h + d[None, :], mask=live[:, None], other=0.0)
    return (b, kvh, s, live, heads, q, tl.full((BLOCK_H,), float("-inf"), tl.float32), tl.zeros((BLOCK_H,), tl.float32),
            tl.zeros((BLOCK_H, D), tl.float32))


@kernel
def _block_positions(n0, end, mask_ptr, mask_row, HAS_MASK: tl.constexpr, BLOCK_N: tl.constexpr):
    """The cache positions of the block at ``n0`` and which of them count: before ``end`` and, with a mask, marked
    True in the sequence's mask row."""
    pos = n0 + tl.arange(0, BLOCK_N)
    valid = pos < end
    if HAS_MASK:
        valid = valid & (tl.load(mask_ptr + mask_row + pos, mask=valid, other=0) != 0)
    return pos, valid


@kernel
def _split_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, o_ptr, m_ptr, l_ptr, L, rep, chunk, scale, sq_b, sq_h, sk_b, sk_h,
                  sk_l, sv_b, sv_h, sv_l, sm_b, so_b, so_h, so_s, sml_b, sml_h, HAS_MASK: tl.constexpr,
                  BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, DOT_F32: tl.constexpr):
    b, kvh, s, live, heads, q, m_i, l_i, acc = _program_start(q_ptr, sq_b, sq_h, rep, BLOCK_H, D)
    d = tl.arange(0, D)
    start = s * chunk
    end = tl.minimum(start + chunk, L)
    k_base = k_ptr + b * sk_b + kvh * sk_h
    v_base = v_ptr + b * sv_b + kvh * sv_h
    for n0 in range(start, end, BLOCK_N):
        pos, valid = _block_positions(n0, end, mask_ptr, b * sm_b, HAS_MASK, BLOCK_N)
        k = tl.load(k_base + pos[:, None] * sk_l + d[None, :], mask=valid[:, None], other=0.0)
        v = tl.load(v_base + pos[:, None] * sv_l + d[None, :], mask=valid[:, None], other=0.0)
        m_i, l_i, acc = _attend_block(q, k, v, valid, m_i, l_i, acc, scale, DOT_F32)
    _store_partial(o_ptr, m_ptr, l_ptr, acc, m_i, l_i, b, heads, live, s, so_b, so_h, so_s, sml_b, sml_h, D)


@kernel
def _split_kv8_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, o_ptr, m_ptr, l_ptr, ks_ptr, km_ptr, vs_ptr, vm_ptr, L, rep,
                      chunk, scale, sq_b, sq_h, sk_b, sk_h, sk_l, sv_b, sv_h, sv_l, sm_b, so_b, so_h, so_s, sml_b,
                      sml_h, ss_b, ss_h,
                      HAS_MASK: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                      DOT_F32: tl.constexpr):
    # With x̂ = c·s + m per token, the affine map moves out of the dots onto [rows, BLOCK_N] tiles:
    #   q·k̂_t = s_t (q·c_t) + m_t Σ_d q_d        Σ_t p_t v̂_t = Σ_t (p_t s_t) c_t + Σ_t p_t m_t
    # so the codes enter the tensor cores as exact fp16/bf16 integers and nothing is dequantized per element.
    b, kvh, s, live, heads, q, m_i, l_i, acc = _program_start(q_ptr, sq_b, sq_h, rep, BLOCK_H, D)
    d = tl.arange(0, D)
    q_sum = tl.sum(q.to(tl.float32), axis=1)
    start = s * chunk
    end = tl.minimum(start + chunk, L)
    k_base = k_ptr + b * sk_b + kvh * sk_h
    v_base = v_ptr + b * sv_b + kvh * sv_h
    scales = b * ss_b + kvh * ss_h
    for n0 in range(start, end, BLOCK_N):
        pos, valid = _block_positions(n0, end, mask_ptr, b * sm_b, HAS_MASK, BLOCK_N)
        kc = tl.load(k_base + pos[:, None] * sk_l + d[None, :], mask=valid[:, None], other=0)
        kc = _codes_as(kc, q.dtype, DOT_F32)
        k_s = tl.load(ks_ptr + scales + pos, mask=valid, other=0.0).to(tl.float32)
        k_m = tl.load(km_ptr + scales + pos, mask=valid, other=0.0).to(tl.float32)
        qc = _dot(q, tl.trans(kc), DOT_F32)
        p, alpha, m_i, l_i = _softmax_step((qc * k_s[None, :] + q_sum[:, None] * k_m[None, :]) * scale, valid,
                                           m_i, l_i)
        vc = tl.load(v_base + pos[:, None] * sv_l + d[None, :], mask=valid[:, None], other=0)
        vc = _codes_as(vc, q.dtype, DOT_F32)
        v_s = tl.load(vs_ptr + scales + pos, mask=valid, other=0.0).to(tl.float32)
        v_m = tl.load(vm_ptr + scales + pos, mask=valid, other=0.0).to(tl.float32)
        pv = _dot((p * v_s[None, :]).to(q.dtype), vc, DOT_F32) + tl.sum(p * v_m[None, :], axis=1)[:, None]
        acc = acc * alpha[:, None] + pv
    _store_partial(o_ptr, m_ptr, l_ptr, acc, m_i, l_i, b, heads, live, s, so_b, so_h, so_s, sml_b, sml_h, D)


@kernel
def _split_kv4_kernel(q_ptr, kc_ptr, ks_ptr, km_ptr, vc_ptr, vs_ptr, vm_ptr, kr_ptr, vr_ptr, n_ptr, o_ptr, m_ptr,
                      l_ptr, rep, chunk, scale, R, W, sq_b, sq_h, sc_b, sc_h, sks_b, sks_h, svs_b, svs_h, sr_b, sr_h,
                      so_b, so_h, so_s, sml_b, sml_h, G: tl.constexpr, BLOCK_H: tl.constexpr,
                      BLOCK_N: tl.constexpr, D: tl.constexpr, F16: tl.constexpr, DOT_F32: tl.constexpr):
    # A byte holds channels 2j (low nibble) and 2j + 1 (high), so the kernel works on the even and odd channels as
    # two halves of D/2: q·k = q_even·k_even + q_odd·k_odd, and the output halves are stored interleaved. The
    # scales broadcast over 3-D views: keys [blocks, G tokens, D/2] under a [blocks, 1, D/2] row of channel scales,
    # values [BLOCK_N, D/G groups, G/2] under [BLOCK_N, D/G, 1] token scales. fp16 queries dequantize in fp16
    # (one rounding of c·s + m, as the fp32 reference rounds it); bf16 queries in fp32.
    H2: tl.constexpr = D // 2
    NB: tl.constexpr = BLOCK_N // G
    NG: tl.constexpr = D // G
    b, kvh, s = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    rows = tl.arange(0, BLOCK_H)
    live = rows < rep
    heads = kvh * rep + rows
    j = tl.arange(0, H2)
    q_at = q_ptr + b * sq_b + heads[:, None] * sq_h + 2 * j[None, :]
    q_lo = tl.load(q_at, mask=live[:, None], other=0.0)
    q_hi = tl.load(q_at + 1, mask=live[:, None], other=0.0)
    cd = tl.float16 if F16 else tl.float32
    m_i = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_H,), tl.float32)
    acc_lo = tl.zeros((BLOCK_H, H2), tl.float32)
    acc_hi = tl.zeros((BLOCK_H, H2), tl.float32)
    n = tl.load(n_ptr)  # tokens in the cache, read on the GPU: one captured graph serves every step
    prefix = tl.maximum(((n - R) // G) * G, 0)  # quant.kv.quantized_prefix
    if s < tl.num_programs(2) - 1:  # a chunk of the quantized prefix
        start = s * chunk
        end = tl.minimum(start + chunk, prefix)
        codes = b * sc_b + kvh * sc_h
        k_scales = b * sks_b + kvh * sks_h
        v_scales = b * svs_b + kvh * svs_h
        blk = tl.arange(0, NB)
        t = tl.arange(0, G)
        grp = tl.arange(0, NG)
        within = tl.arange(0, G // 2)
        for n0 in range(start, end, BLOCK_N):
            tok = n0 + blk[:, None] * G + t[None, :]  # [NB, G]
            kc = tl.load(kc_ptr + codes + tok[:, :, None] * H2 + j[None, None, :],
                         mask=(tok < end)[:, :, None], other=0)
            row = k_scales + (n0 // G + blk)[:, None, None] * D + 2 * j[None, None, :]  # [NB, 1, D/2]
            ok = (n0 + blk * G < end)[:, None, None]
            k_lo = (kc & 0xF).to(cd) * tl.load(ks_ptr + row, mask=ok, other=0.0).to(cd) \
                + tl.load(km_ptr + row, mask=ok, other=0.0).to(cd)
            k_hi = (kc >> 4).to(cd) * tl.load(ks_ptr + row + 1, mask=ok, other=0.0).to(cd) \
                + tl.load(km_ptr + row + 1, mask=ok, other=0.0).to(cd)
            k_lo = tl.reshape(k_lo, (BLOCK_N, H2)).to(q_lo.dtype)
            k_hi = tl.reshape(k_hi, (BLOCK_N, H2)).to(q_lo.dtype)
            pos = n0 + tl.arange(0, BLOCK_N)
            valid = pos < end
            scores = _dot(q_lo, tl.trans(k_lo), DOT_F32) + _dot(q_hi, tl.trans(k_hi), DOT_F32)
            p, alpha, m_i, l_i = _softmax_step(scores * scale, valid, m_i, l_i)
            vc = tl.load(vc_ptr + codes + pos[:, None, None] * H2 + grp[None, :, None] * (G // 2)
                         + within[None, None, :], mask=valid[:, None, None], other=0)  # [BLOCK_N, D/G, G/2]
            at = v_scales + pos[:, None, None] * NG + grp[None, :, None]  # [BLOCK_N, D/G, 1]
            v_s = tl.load(vs_ptr + at, mask=valid[:, None, None], other=0.0).to(cd)
            v_m = tl.load(vm_ptr + at, mask=valid[:, None, None], other=0.0).to(cd)
            v_lo = tl.reshape((vc & 0xF).to(cd) * v_s + v_m, (BLOCK_N, H2)).to(q_lo.dtype)
            v_hi = tl.reshape((vc >> 4).to(cd) * v_s + v_m, (BLOCK_N, H2)).to(q_lo.dtype)
            pq = p.to(q_lo.dtype)
            acc_lo = acc_lo * alpha[:, None] + _dot(pq, v_lo, DOT_F32)
            acc_hi = acc_hi * alpha[:, None] + _dot(pq, v_hi, DOT_F32)
    else:  # the fp16 window [prefix, n), held in a ring of W slots
        for n0 in range(prefix, n, BLOCK_N):
            pos = n0 + tl.arange(0, BLOCK_N)
            valid = pos < n
            ring = b * sr_b + kvh * sr_h + (pos % W)[:, None] * D + 2 * j[None, :]
            k_lo = tl.load(kr_ptr + ring, mask=valid[:, None], other=0.0)
            k_hi = tl.load(kr_ptr + ring + 1, mask=valid[:, None], other=0.0)
            scores = _dot(q_lo, tl.trans(k_lo), DOT_F32) + _dot(q_hi, tl.trans(k_hi), DOT_F32)
            p, alpha, m_i, l_i = _softmax_step(scores * scale, valid, m_i, l_i)
            pq = p.to(q_lo.dtype)
            acc_lo = acc_lo * alpha[:, None] + _dot(pq, tl.load(vr_ptr + ring, mask=valid[:, None], other=0.0),
                                                    DOT_F32)
            acc_hi = acc_hi * alpha[:, None] + _dot(pq, tl.load(vr_ptr + ring + 1, mask=valid[:, None], other=0.0),
                                                    DOT_F32)
    out = o_ptr + b * so_b + heads[:, None] * so_h + s * so_s + 2 * j[None, :]
    tl.store(out, acc_lo, mask=live[:, None])
    tl.store(out + 1, acc_hi, mask=live[:, None])
    tl.store(m_ptr + b * sml_b + heads * sml_h + s, m_i, mask=live)
    tl.store(l_ptr + b * sml_b + heads * sml_h + s, l_i, mask=live)


@kernel
def _combine_kernel(o_ptr, m_ptr, l_ptr, out_ptr, splits, so_b, so_h, so_s, sml_b, sml_h, sout_b, sout_h,
                    BLOCK_S: tl.constexpr, D: tl.constexpr):
    b, h = tl.program_id(0).to(tl.int64), tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    live = s < splits
    m = tl.load(m_ptr + b * sml_b + h * sml_h + s, mask=live, other=float("-inf"))
    l = tl.load(l_ptr + b * sml_b + h * sml_h + s, mask=live, other=0.0)
    top = tl.max(m, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)
    w = tl.where(m == float("-inf"), 0.0, tl.exp(m - top))
    d = tl.arange(0, D)
    o = tl.load(o_ptr + b * so_b + h * so_h + s[:, None] * so_s + d[None, :], mask=live[:, None], other=0.0)
    num = tl.sum(o * w[:, None], axis=0)
    den = tl.sum(l * w, axis=0)
    out = tl.where(den > 0, num / tl.where(den > 0, den, 1.0), 0.0)
    tl.store(out_ptr + b * sout_b + h * sout_h + d, out.to(out_ptr.dtype.element_ty))


def decode_attention_problem(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             mask: torch.Tensor | None) -> str | None:
    """Why :func:`decode_attention` cannot take these tensors (None: it can): q [B, Hq, D], k and v [B, Hkv, L, D]
    of one fp16/bf16 dtype with unit stride along D, D a power of two from 16 to 256, Hq a multiple of Hkv with
    at most 64 query heads per KV head, and ``mask`` (if any) boolean [B, L]."""
    if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"query and cache must be one fp16/bf16 dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
    return _shape_problem(q, k, v, mask)


def _shape_problem(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> str | None:
    if q.dim() != 3 or k.dim() != 4 or v.shape != k.shape:
        return "q must be [B, Hq, D] and k, v one shape [B, Hkv, L, D]"
    b, hq, d = q.shape
    if k.shape[0] != b or k.shape[3] != d:
        return f"q {tuple(q.shape)} and the cache {tuple(k.shape)} disagree on batch or head size"
    if d < 16 or d > 256 or d & (d - 1):
        return f"head size {d} is not a power of two from 16 to 256"
    if hq % k.shape[1] or hq // k.shape[1] > 64:
        return f"{hq} query heads do not group evenly (at most 64 each) over {k.shape[1]} KV heads"
    if q.stride(2) != 1 or k.stride(3) != 1 or v.stride(3) != 1:
        return "q, k and v need unit stride along the head dimension"
    if mask is not None and (mask.dtype != torch.bool or mask.shape != (b, k.shape[2])):
        return f"the mask must be boolean [B, L] = [{b}, {k.shape[2]}], got {mask.dtype} {tuple(mask.shape)}"
    return None


def split_count(batch: int, kv_heads: int, length: int, sms: int, block_n: int = 64) -> int:
    """How many chunks each (sequence, KV head) splits the cache into: enough programs for two waves of ``sms``
    multiprocessors, each chunk at least one ``block_n`` block (the flash-decoding rule)."""
    blocks = max(1, -(-length // block_n))
    want = max(1, -(-2 * sms // max(1, batch * kv_heads)))
    return min(want, blocks)


def kernel_preferred(batch: int, kv_heads: int, sms: int) -> bool:
    """Whether to run this kernel rather than SDPA's own GQA kernels (``enable_gqa=True``) for a decode step: while
    the batch alone cannot fill the GPU (batch × KV heads ≤ SMs), where splitting the cache is what fills it. On an
    H200 with Llama-3.1-8B heads (32 query / 8 KV, D = 128), kernel vs SDPA with the cache mask: 5.6 vs 11.5 µs at
    batch 1 and a 1K cache, 41.8 vs 45.0 at 32K; batch 8: 11.7 vs 16.4 at 1K, 261.5 vs 251.7 at 32K; batch 32:
    45.3 vs 42.0 at 1K, 1235 vs 959 at 32K (docs/BENCHMARKS.md, decode attention)."""
    return batch * kv_heads <= sms


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
                     splits: int | None = None, sms: int = 132, launch: tuple | None = None) -> torch.Tensor:
    """softmax(scale · q·kᵀ + mask) · v per query head [B, Hq, D] in q's dtype, for one query token per sequence
    (module docstring). ``splits`` defaults to :func:`split_count` for ``sms`` multiprocessors; ``launch``
    (BLOCK_N, warps, stages) to :func:`quantkit.runtime.kernels.attention_launch.launch_for`'s."""
    why = decode_attention_problem(q, k, v, mask)
    if why:
        raise ValueError(why)
    check_device(q, k, v)
    b, hq, d = q.shape
    kvh, length = k.shape[1], k.shape[2]
    block_n, warps, stages = launch or launch_for("fp16", d, q.device)
    chunk, splits = _chunks(b, kvh, length, splits, sms, block_n)
    part, ml, out = _partials(q, splits)
    launch_kernel(_split_kernel, (b, kvh, splits), q, k, v, q if mask is None else mask, part, ml[0], ml[1], length,
                  hq // kvh, chunk, float(scale), q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2),
                  v.stride(0), v.stride(1), v.stride(2), 0 if mask is None else mask.stride(0), part.stride(0),
                  part.stride(1), part.stride(2), ml.stride(1), ml.stride(2), HAS_MASK=mask is not None,
                  BLOCK_H=_rows(hq // kvh), BLOCK_N=block_n, D=d, DOT_F32=INTERPRET, num_warps=warps, num_stages=stages)
    return _combine(part, ml, out)


def decode_attention_kv8(q: torch.Tensor, k: dict, v: dict, mask: torch.Tensor | None, scale: float,
                         splits: int | None = None, sms: int = 132, launch: tuple | None = None) -> torch.Tensor:
    """:func:`decode_attention` over a KV8 cache (:func:`quantkit.quant.kv.pack`'s form): ``k`` and ``v`` each
    {"codes": uint8 [B, Hkv, L, D], "scale", "min": fp16 [B, Hkv, L, 1]}, dequantized in registers block by block
    (BitDecoding's read of a low-bit cache), x̂ = code · scale + min rounded to q's dtype."""
    why = kv8_problem(q, k, v, mask)
    if why:
        raise ValueError(why)
    check_device(q, k["codes"], v["codes"])
    ks, km, vs, vm = (t[..., 0] for t in (k["scale"], k["min"], v["scale"], v["min"]))
    kc, vc = k["codes"], v["codes"]
    b, hq, d = q.shape
    kvh, length = kc.shape[1], kc.shape[2]
    block_n, warps, stages = launch or launch_for("kv8", d, q.device)
    chunk, splits = _chunks(b, kvh, length, splits, sms, block_n)
    part, ml, out = _partials(q, splits)
    launch_kernel(_split_kv8_kernel, (b, kvh, splits), q, kc, vc, q if mask is None else mask, part, ml[0], ml[1], ks,
                  km, vs, vm, length, hq // kvh, chunk, float(scale), q.stride(0), q.stride(1), *kc.stride()[:3],
                  *vc.stride()[:3], 0 if mask is None else mask.stride(0), part.stride(0), part.stride(1),
                  part.stride(2), ml.stride(1), ml.stride(2), ks.stride(0), ks.stride(1), HAS_MASK=mask is not None,
                  BLOCK_H=_rows(hq // kvh), BLOCK_N=block_n, D=d, DOT_F32=INTERPRET, num_warps=warps, num_stages=stages)
    return _combine(part, ml, out)


def kv8_problem(q: torch.Tensor, k: dict, v: dict, mask: torch.Tensor | None) -> str | None:
    """Why :func:`decode_attention_kv8` cannot take this cache (None: it can): uint8 codes of the query's head
    size, and fp16 scale and minimum [B, Hkv, L, 1] with contiguous token rows, besides
    :func:`decode_attention_problem`'s conditions."""
    codes_k, codes_v = k["codes"], v["codes"]
    if codes_k.dtype != torch.uint8 or codes_v.dtype != torch.uint8:
        return f"KV8 codes must be uint8, got {codes_k.dtype} and {codes_v.dtype}"
    shape = (*codes_k.shape[:3], 1)
    for t in (k["scale"], k["min"], v["scale"], v["min"]):
        if t.shape != shape or t.dtype != torch.float16 or t.stride(2) != 1:
            return f"KV8 scales and minima must be fp16 {shape} with unit token stride, got {t.dtype} {tuple(t.shape)}"
    if any(t.stride()[:3] != k["scale"].stride()[:3] for t in (k["min"], v["scale"], v["min"])):
        return "KV8 scales and minima must share one layout"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"the query must be fp16/bf16, got {q.dtype}"
    return _shape_problem(q, codes_k, codes_v, mask)


KV4_PARTS = ("k_codes", "k_scale", "k_min", "v_codes", "v_scale", "v_min", "k_ring", "v_ring")


def kv4_problem(q: torch.Tensor, cache: dict, group: int, residual: int) -> str | None:
    """Why :func:`decode_attention_kv4` cannot read ``cache`` (None: it can). The cache (one layer, contiguous):
    ``k_codes`` / ``v_codes`` uint8 [B, Hkv, L, D/2] (two codes a byte, low nibble first); ``k_scale`` / ``k_min``
    fp16 [B, Hkv, L/G, D] (keys per channel over blocks of G tokens); ``v_scale`` / ``v_min`` fp16
    [B, Hkv, L, D/G] (values per token over G channels); ``k_ring`` / ``v_ring`` [B, Hkv, W, D] in q's dtype with
    W ≥ residual + G, token p in slot p mod W (the fp16 window)."""
    missing = [name for name in KV4_PARTS if name not in cache]
    if missing:
        return f"the KV4 cache lacks {', '.join(missing)}"
    if q.dim() != 3 or q.dtype not in (torch.float16, torch.bfloat16) or q.stride(2) != 1:
        return f"the query must be fp16/bf16 [B, Hq, D] with unit stride along D, got {q.dtype} {tuple(q.shape)}"
    b, hq, d = q.shape
    kc = cache["k_codes"]
    if kc.dim() != 4 or kc.shape[0] != b or kc.shape[3] * 2 != d:
        return f"k_codes must be [B, Hkv, L, D/2] = [{b}, Hkv, L, {d // 2}], got {tuple(kc.shape)}"
    bh, length = kc.shape[:2], kc.shape[2]
    if d < 32 or d > 256 or d & (d - 1) or d % group or length % group or group < 2:
        return (f"head size {d} (a power of two from 32 to 256) and cache length {length} must be multiples of the "
                f"group size {group} (at least 2)")
    if hq % bh[1] or hq // bh[1] > 64:
        return f"{hq} query heads do not group evenly (at most 64 each) over {bh[1]} KV heads"
    ring = cache["k_ring"].shape[2]
    want = {"k_codes": ((*bh, length, d // 2), torch.uint8), "v_codes": ((*bh, length, d // 2), torch.uint8),
            "k_scale": ((*bh, length // group, d), torch.float16), "k_min": ((*bh, length // group, d), torch.float16),
            "v_scale": ((*bh, length, d // group), torch.float16), "v_min": ((*bh, length, d // group), torch.float16),
            "k_ring": ((*bh, ring, d), q.dtype), "v_ring": ((*bh, ring, d), q.dtype)}
    for name, (shape, dtype) in want.items():
        t = cache[name]
        if tuple(t.shape) != shape or t.dtype != dtype or not t.is_contiguous():
            return f"{name} must be contiguous {dtype} {shape}, got {t.dtype} {tuple(t.shape)}"
    if ring < residual + group:
        return f"the fp16 window ring holds {ring} tokens; it needs residual + group = {residual + group}"
    return None


def decode_attention_kv4(q: torch.Tensor, cache: dict, tokens: torch.Tensor, group: int, residual: int,
                         scale: float, splits: int | None = None, sms: int = 132,
                         launch: tuple | None = None) -> torch.Tensor:
    """Attention [B, Hq, D] of one query token per sequence over the ``tokens`` ([1], on the device) tokens of a KV4
    cache (:func:`kv4_problem` gives the layout; KIVI: keys per channel over blocks of ``group`` tokens, values per
    token over ``group`` channels; BitDecoding's fp16 window): the whole blocks older than the latest ``residual``
    tokens (:func:`quantkit.quant.kv.quantized_prefix`) read as 4-bit codes dequantized in registers, split across
    the GPU, and the window's tokens from the ring by one more program. The token count is read on the GPU, so one
    captured launch serves every decode step."""
    why = kv4_problem(q, cache, group, residual)
    if why:
        raise ValueError(why)
    check_device(q, *(cache[name] for name in KV4_PARTS), tokens)
    b, hq, d = q.shape
    kvh, length = cache["k_codes"].shape[1], cache["k_codes"].shape[2]
    block_n, warps, stages = launch or launch_for("kv4", d, q.device)
    block_n = max(block_n, group)
    chunk, splits = _chunks(b, kvh, length, splits, sms, block_n)
    splits += 1  # the prefix's chunks and the window's program
    part, ml, out = _partials(q, splits)
    kc, ks, ring = cache["k_codes"], cache["k_scale"], cache["k_ring"]
    vs = cache["v_scale"]
    launch_kernel(_split_kv4_kernel, (b, kvh, splits), q, kc, ks, cache["k_min"], cache["v_codes"], vs, cache["v_min"],
                  ring, cache["v_ring"], tokens, part, ml[0], ml[1], hq // kvh, chunk, float(scale), residual,
                  ring.shape[2], q.stride(0), q.stride(1), kc.stride(0), kc.stride(1), ks.stride(0), ks.stride(1),
                  vs.stride(0), vs.stride(1), ring.stride(0), ring.stride(1), part.stride(0), part.stride(1),
                  part.stride(2), ml.stride(1), ml.stride(2), G=group, BLOCK_H=_rows(hq // kvh), BLOCK_N=block_n, D=d,
                  F16=q.dtype == torch.float16, DOT_F32=INTERPRET, num_warps=warps, num_stages=stages)
    return _combine(part, ml, out)


def kv4_reference(q: torch.Tensor, cache: dict, tokens: int, group: int, residual: int,
                  scale: float) -> torch.Tensor:
    """:func:`decode_attention_kv4` in torch: the first ``tokens`` positions dequantized (the quantized prefix) or
    read from the ring (the window), then :func:`decode_attention_reference`."""
    from quantkit.quant.kv import unpack_nibbles

    b, hq, d = q.shape
    prefix = max(((tokens - residual) // group) * group, 0)
    kc = unpack_nibbles(cache["k_codes"][:, :, :prefix]).float()
    ks = cache["k_scale"].float().repeat_interleave(group, dim=2)[:, :, :prefix]
    km = cache["k_min"].float().repeat_interleave(group, dim=2)[:, :, :prefix]
    vc = unpack_nibbles(cache["v_codes"][:, :, :prefix]).float()
    vs = cache["v_scale"].float().repeat_interleave(group, dim=3)[:, :, :prefix]
    vm = cache["v_min"].float().repeat_interleave(group, dim=3)[:, :, :prefix]
    slots = torch.arange(prefix, tokens, device=q.device) % cache["k_ring"].shape[2]
    k = torch.cat([(kc * ks + km).to(q.dtype), cache["k_ring"][:, :, slots]], dim=2)
    v = torch.cat([(vc * vs + vm).to(q.dtype), cache["v_ring"][:, :, slots]], dim=2)
    return decode_attention_reference(q, k, v, None, scale)


def _chunks(batch: int, kv_heads: int, length: int, splits: int | None, sms: int,
            block_n: int) -> tuple[int, int]:
    """(tokens per chunk, whole ``block_n`` blocks; chunks) of a cache of ``length`` tokens split ``splits`` ways, by
    default :func:`split_count`'s."""
    splits = splits or split_count(batch, kv_heads, length, sms, block_n)
    blocks = -(-length // block_n)
    chunk = -(-blocks // splits) * block_n
    return chunk, -(-length // chunk)


def _rows(rep: int) -> int:
    """The tile rows for ``rep`` query heads: a power of two, at least a tensor-core dot's 16."""
    return max(MIN_ROWS, triton.next_power_of_2(rep))


def _partials(q: torch.Tensor, splits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The splits' outputs [B, Hq, S, D] and softmax states [2, B, Hq, S] (fp32), and the result [B, Hq, D]."""
    b, hq, d = q.shape
    return (torch.empty(b, hq, splits, d, dtype=torch.float32, device=q.device),
            torch.empty(2, b, hq, splits, dtype=torch.float32, device=q.device),
            torch.empty(b, hq, d, dtype=q.dtype, device=q.device))


def _combine(part: torch.Tensor, ml: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    b, hq, splits, d = part.shape
    launch_kernel(_combine_kernel, (b, hq), part, ml[0], ml[1], out, splits, part.stride(0), part.stride(1),
                  part.stride(2), ml.stride(1), ml.stride(2), out.stride(0), out.stride(1),
                  BLOCK_S=max(2, triton.next_power_of_2(splits)), D=d, num_warps=4)
    return out


def decode_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                               scale: float) -> torch.Tensor:
    """:func:`decode_attention` in torch, fp32 throughout: [B, Hq, D] in q's dtype; zeros for a head that sees no
    position."""
    b, hq, d = q.shape
    rep = hq // k.shape[1]
    qf = q.float().reshape(b, k.shape[1], rep, d)
    scores = torch.einsum("bgrd,bgld->bgrl", qf, k.float()) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    top = scores.amax(-1, keepdim=True)
    p = torch.exp(scores - torch.where(torch.isinf(top), torch.zeros_like(top), top))
    den = p.sum(-1, keepdim=True)
    out = torch.einsum("bgrl,bgld->bgrd", p, v.float()) / torch.where(den > 0, den, torch.ones_like(den))
    return out.reshape(b, hq, d).to(q.dtype)


def kv8_reference(q: torch.Tensor, k: dict, v: dict, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """:func:`decode_attention_kv8` in torch: the cache dequantized as :func:`quantkit.quant.kv.unpack` does, then
    :func:`decode_attention_reference`."""
    def dequant(p: dict) -> torch.Tensor:
        return (p["codes"].float() * p["scale"].float() + p["min"].float()).to(q.dtype)

    return decode_attention_reference(q, dequant(k), dequant(v), mask, scale)
