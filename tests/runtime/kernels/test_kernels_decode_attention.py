"""Decode attention (split-KV, grouped query heads as tile rows): the kernel equals its torch reference, and the
reference equals SDPA over repeated KV heads, on awkward shapes — cache lengths that are no multiple of the block,
3 query heads per KV head, one split and many, masks that hide every position of a sequence, M = 1 query token."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (quantkit.runtime.kernels.jit)

import pytest  # noqa: E402

from quantkit.runtime.kernels import ops  # noqa: E402
from quantkit.runtime.kernels.attention_launch import default_launch  # noqa: E402
from quantkit.runtime.kernels.triton.decode_attention import (  # noqa: E402
    decode_attention, decode_attention_problem, decode_attention_reference, split_count)
from tests.kernels_helpers import DEVICE  # noqa: E402


def _inputs(b, hq, hkv, length, d, dtype, seed, mask_kind="random"):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, d, generator=gen).to(dtype)
    k = torch.randn(b, hkv, length, d, generator=gen).to(dtype)
    v = torch.randn(b, hkv, length, d, generator=gen).to(dtype)
    mask = None
    if mask_kind == "random":
        mask = torch.rand(b, length, generator=gen) > 0.3
    elif mask_kind == "prefix":  # a static cache: positions 0..t-1 written, the tail not yet
        mask = torch.arange(length)[None, :] < torch.tensor([[length // 2 + 1]] * b)
    if mask is not None and b > 1:
        mask[-1] = False  # a sequence that sees nothing gets zeros
    return q, k, v, mask


@pytest.mark.parametrize("b,hq,hkv,length,d,splits", [
    (1, 8, 2, 200, 64, None), (3, 9, 3, 77, 64, 2), (2, 4, 4, 130, 32, 5), (1, 8, 1, 65, 128, None),
    (2, 16, 2, 1, 16, None), (1, 32, 8, 3 * default_launch("fp16")[0], 128, 3)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mask_kind", ["random", "prefix", "none"])
def test_kernel_equals_reference(b, hq, hkv, length, d, splits, dtype, mask_kind):
    q, k, v, mask = _inputs(b, hq, hkv, length, d, dtype, seed=b * hq + length, mask_kind=mask_kind)
    scale = d ** -0.5
    want = decode_attention_reference(q, k, v, mask, scale)
    got = decode_attention(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), None if mask is None else mask.to(DEVICE),
                           scale, splits=splits).cpu()
    assert got.dtype == dtype and got.shape == (b, hq, d)
    # P is rounded to the cache dtype for P·V (as FlashAttention does): a few steps of that dtype
    tol = 4e-3 if dtype == torch.float16 else 3e-2
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
    if mask is not None and b > 1:
        assert torch.all(got[-1] == 0)


def test_reference_is_sdpa_over_repeated_kv_heads():
    from transformers.integrations.sdpa_attention import repeat_kv

    q, k, v, mask = _inputs(2, 12, 4, 50, 32, torch.float32, seed=1, mask_kind="prefix")
    mask[-1] = True
    got = decode_attention_reference(q, k, v, mask, 0.3)
    want = torch.nn.functional.scaled_dot_product_attention(
        q[:, :, None], repeat_kv(k, 3), repeat_kv(v, 3), attn_mask=mask[:, None, None, :], scale=0.3)[:, :, 0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_refusals_name_the_problem():
    q, k, v, mask = _inputs(2, 8, 2, 40, 64, torch.float16, seed=2)
    assert decode_attention_problem(q, k, v, mask) is None
    assert "power of two" in decode_attention_problem(q[..., :48], k[..., :48], v[..., :48], mask)
    assert "group evenly" in decode_attention_problem(q[:, :7], k, v, mask)
    assert "boolean" in decode_attention_problem(q, k, v, mask.float())
    assert "fp16/bf16" in decode_attention_problem(q.float(), k.float(), v.float(), None)
    assert "unit stride" in decode_attention_problem(q, k.transpose(2, 3).contiguous().transpose(2, 3), v, None)
    with pytest.raises(ValueError, match="disagree"):
        decode_attention(q[:1], k, v, None, 1.0)


def test_split_count_fills_the_gpu_in_whole_blocks():
    assert split_count(1, 8, 1024, 132) == 16  # 1024 / 64 blocks, fewer than the 33 two waves would want
    assert split_count(1, 8, 32768, 132) == 33
    assert split_count(64, 8, 32768, 132) == 1
    assert split_count(1, 8, 1, 132) == 1


def test_op_is_the_reference_and_passes_opcheck():
    q, k, v, mask = _inputs(2, 6, 2, 70, 32, torch.float16, seed=3, mask_kind="prefix")
    torch.testing.assert_close(ops.decode_attention(q, k, v, mask, 0.2), decode_attention_reference(q, k, v, mask, 0.2))
    torch.library.opcheck(ops.decode_attention, (q, k, v, mask, 0.2))
    torch.library.opcheck(ops.decode_attention, (q, k, v, None, 0.2))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the kernel path of decode_sdpa needs a GPU")
def test_decode_sdpa_on_a_gpu_takes_the_kernel_and_matches_sdpa():
    from transformers.integrations.sdpa_attention import repeat_kv

    from quantkit.runtime.decode_attention import decode_sdpa

    q, k, v, mask = _inputs(3, 32, 8, 1000, 128, torch.float16, seed=4, mask_kind="prefix")
    q, k, v, mask = q.cuda()[:, :, None], k.cuda(), v.cuda(), mask.cuda()[:, None, None, :]
    module = torch.nn.Module()
    module.num_key_value_groups = 4
    got, _ = decode_sdpa(module, q, k, v, mask, scaling=128 ** -0.5)
    keep = mask.clone()
    keep[-1] = True  # SDPA gives NaN where nothing is visible; compare the other sequences
    want = torch.nn.functional.scaled_dot_product_attention(q, repeat_kv(k, 4), repeat_kv(v, 4), attn_mask=keep,
                                                            scale=128 ** -0.5).transpose(1, 2)
    torch.testing.assert_close(got[:-1], want[:-1], atol=4e-3, rtol=4e-3)


def test_the_kernel_is_preferred_while_the_batch_cannot_fill_the_gpu():
    from quantkit.runtime.kernels.triton.decode_attention import kernel_preferred

    assert kernel_preferred(1, 8, 132) and kernel_preferred(16, 8, 132)
    assert not kernel_preferred(32, 8, 132)


@pytest.mark.parametrize("b,hq,hkv,length,d,splits", [(2, 8, 2, 100, 64, 2), (1, 9, 3, 70, 32, None),
                                                      (3, 4, 4, 1, 16, None)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_kv8_kernel_equals_the_dequantized_cache(b, hq, hkv, length, d, splits, dtype):
    from quantkit.quant import kv
    from quantkit.runtime.kernels.triton.decode_attention import decode_attention_kv8, kv8_reference

    q, k, v, mask = _inputs(b, hq, hkv, length, d, dtype, seed=7 * length + d, mask_kind="prefix")
    spec = kv.KVSpec(8)
    pk, pv = kv.pack(k, spec, "k"), kv.pack(v, spec, "v")
    want = kv8_reference(q, pk, pv, mask, d ** -0.5)
    # the reference reads what quant.kv.unpack returns, as eval-ppl --kv-bits 8 scores it
    torch.testing.assert_close(want, decode_attention_reference(q, kv.unpack(pk, spec, "k", k),
                                                                kv.unpack(pv, spec, "v", v), mask, d ** -0.5))
    dev = {key: {n: t.to(DEVICE) for n, t in p.items()} for key, p in (("k", pk), ("v", pv))}
    got = decode_attention_kv8(q.to(DEVICE), dev["k"], dev["v"], None if mask is None else mask.to(DEVICE),
                               d ** -0.5, splits=splits).cpu()
    tol = 4e-3 if dtype == torch.float16 else 3e-2
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def test_kv8_kernel_reads_codes_through_their_strides():
    """Codes viewed out of a [B, L, H, D] buffer (token stride H·D), keys and values laid out differently."""
    from quantkit.quant import kv
    from quantkit.runtime.kernels.triton.decode_attention import decode_attention_kv8, kv8_reference

    q, k, v, mask = _inputs(2, 8, 2, 40, 32, torch.float16, seed=11, mask_kind="prefix")
    spec = kv.KVSpec(8)
    pk, pv = kv.pack(k, spec, "k"), kv.pack(v, spec, "v")
    want = kv8_reference(q, pk, pv, mask, 32 ** -0.5)
    pk = {**pk, "codes": pk["codes"].transpose(1, 2).contiguous().transpose(1, 2)}  # [B, H, L, D] view of BLHD
    assert pk["codes"].stride(2) == 2 * 32
    got = decode_attention_kv8(q.to(DEVICE), {n: t.to(DEVICE) for n, t in pk.items()},
                               {n: t.to(DEVICE) for n, t in pv.items()}, mask.to(DEVICE), 32 ** -0.5).cpu()
    torch.testing.assert_close(got.float(), want.float(), atol=4e-3, rtol=4e-3)


def test_kv8_refusals_and_op():
    from quantkit.quant import kv
    from quantkit.runtime.kernels.triton.decode_attention import kv8_problem

    q, k, v, mask = _inputs(2, 8, 2, 40, 64, torch.float16, seed=9, mask_kind="prefix")
    pk, pv = kv.pack(k, kv.KVSpec(8), "k"), kv.pack(v, kv.KVSpec(8), "v")
    assert kv8_problem(q, pk, pv, mask) is None
    assert "uint8" in kv8_problem(q, {**pk, "codes": pk["codes"].to(torch.int8)}, pv, mask)
    assert "fp16" in kv8_problem(q, {**pk, "scale": pk["scale"].float()}, pv, mask)
    assert "fp16/bf16" in kv8_problem(q.float(), pk, pv, mask)
    args = (q, pk["codes"], pk["scale"], pk["min"], pv["codes"], pv["scale"], pv["min"], mask, 0.125)
    torch.library.opcheck(ops.decode_attention_kv8, args)


def _kv4_cache(k, v, spec, tokens, length, ring):
    """The KV4 layout decode_attention_kv4 reads, filled from quant.kv.pack's codes of the first ``tokens`` tokens of
    k, v [B, H, ≥tokens, D] in a cache of ``length`` slots, the window's tokens in a ring of ``ring`` slots."""
    from quantkit.quant import kv

    b, h, _, d = k.shape
    g = spec.group_size
    prefix = int(kv.quantized_prefix(torch.tensor(tokens), spec))
    cache = {"k_codes": torch.zeros(b, h, length, d // 2, dtype=torch.uint8),
             "v_codes": torch.zeros(b, h, length, d // 2, dtype=torch.uint8),
             "k_scale": torch.zeros(b, h, length // g, d, dtype=torch.float16),
             "k_min": torch.zeros(b, h, length // g, d, dtype=torch.float16),
             "v_scale": torch.zeros(b, h, length, d // g, dtype=torch.float16),
             "v_min": torch.zeros(b, h, length, d // g, dtype=torch.float16),
             "k_ring": torch.zeros(b, h, ring, d, dtype=k.dtype), "v_ring": torch.zeros(b, h, ring, d, dtype=k.dtype)}
    if prefix:
        pk, pv = kv.pack(k[:, :, :prefix], spec, "k"), kv.pack(v[:, :, :prefix], spec, "v")
        cache["k_codes"][:, :, :prefix] = pk["codes"]
        cache["k_scale"][:, :, :prefix // g] = pk["scale"][:, :, :, 0]
        cache["k_min"][:, :, :prefix // g] = pk["min"][:, :, :, 0]
        cache["v_codes"][:, :, :prefix] = pv["codes"]
        cache["v_scale"][:, :, :prefix] = pv["scale"][..., 0]
        cache["v_min"][:, :, :prefix] = pv["min"][..., 0]
    for pos in range(max(0, tokens - ring), tokens):
        cache["k_ring"][:, :, pos % ring] = k[:, :, pos]
        cache["v_ring"][:, :, pos % ring] = v[:, :, pos]
    return cache


@pytest.mark.parametrize("tokens,residual,group,length,d", [(300, 128, 32, 320, 64), (129, 128, 32, 192, 64),
                                                              (40, 128, 32, 64, 64), (200, 32, 16, 256, 64),
                                                              (1, 0, 32, 64, 64), (300, 128, 32, 320, 128)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_kv4_kernel_reads_what_eval_ppl_scores(tokens, residual, group, length, d, dtype):
    from quantkit.quant import kv
    from quantkit.runtime.kernels.triton.decode_attention import decode_attention_kv4, kv4_reference

    spec = kv.KVSpec(4, group_size=group, residual=residual)
    b, hq, hkv = 2, 8, 2
    q, k, v, _ = _inputs(b, hq, hkv, length, d, dtype, seed=tokens + group, mask_kind="none")
    cache = _kv4_cache(k, v, spec, tokens, length, residual + group)
    # quant.kv.attention: the decode step at position tokens - 1 reading the quantized prefix (eval-ppl --kv-bits 4)
    want = kv.attention(q[:, :, None], k[:, :, :tokens], v[:, :, :tokens], spec, None, d ** -0.5)[:, :, 0]
    ref = kv4_reference(q, cache, tokens, group, residual, d ** -0.5)
    torch.testing.assert_close(ref.float(), want.float(), atol=2e-3 if dtype == torch.float16 else 2e-2, rtol=1e-2)
    got = decode_attention_kv4(q.to(DEVICE), {n: t.to(DEVICE) for n, t in cache.items()},
                               torch.tensor([tokens], device=DEVICE), group, residual, d ** -0.5, splits=3).cpu()
    tol = 4e-3 if dtype == torch.float16 else 3e-2
    torch.testing.assert_close(got.float(), ref.float(), atol=tol, rtol=tol)


def test_kv4_refusals():
    from quantkit.quant import kv
    from quantkit.runtime.kernels.triton.decode_attention import kv4_problem

    spec = kv.KVSpec(4)
    q, k, v, _ = _inputs(1, 4, 2, 64, 64, torch.float16, seed=1, mask_kind="none")
    cache = _kv4_cache(k, v, spec, 64, 64, 160)
    assert kv4_problem(q, cache, 32, 128) is None
    assert "lacks k_ring" in kv4_problem(q, {n: t for n, t in cache.items() if n != "k_ring"}, 32, 128)
    assert "needs residual + group" in kv4_problem(q, cache, 32, 160)
    assert "k_scale must be contiguous" in kv4_problem(q, {**cache, "k_scale": cache["k_scale"].float()}, 32, 128)


def test_kv4_op_is_the_reference_and_passes_opcheck():
    from quantkit.quant import kv
    from quantkit.runtime.kernels.triton.decode_attention import KV4_PARTS, kv4_reference

    q, k, v, _ = _inputs(2, 4, 2, 96, 32, torch.float16, seed=5, mask_kind="none")
    cache = _kv4_cache(k, v, kv.KVSpec(4, group_size=16, residual=32), 90, 96, 64)
    args = (q, *(cache[n] for n in KV4_PARTS), torch.tensor([90]), 16, 32, 0.2)
    torch.testing.assert_close(ops.decode_attention_kv4(*args), kv4_reference(q, cache, 90, 16, 32, 0.2))
    torch.library.opcheck(ops.decode_attention_kv4, args)
