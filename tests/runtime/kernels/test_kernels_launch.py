"""Triton launches without Triton's per-call specialization (jit.launch_kernel): the key it caches compiled
launchers by separates everything Triton specializes on, and on a GPU a cached launch computes the bits of
Triton's own launch, for aligned and unaligned tensors, every token count and split-K."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (quantkit.runtime.kernels.jit)

import pytest  # noqa: E402

from quantkit.runtime.kernels import jit  # noqa: E402
from quantkit.runtime.kernels.triton import act_quant, w4a16  # noqa: E402
from quantkit.runtime.kernels.triton.launch import TileConfig  # noqa: E402
from tests.kernels_helpers import DEVICE, packed  # noqa: E402

CUDA = torch.cuda.is_available()


def _key(*args, grid=(4,), **kwargs):
    return jit.specialization_key("fn", grid, args, kwargs, 0)


def test_key_separates_what_triton_specializes_on():
    buf = torch.zeros(64, dtype=torch.float16)
    aligned, other_aligned, unaligned = buf[:16], buf[8:24], buf[1:17]
    assert _key(aligned, 7) == _key(other_aligned, 7)  # same dtype and alignment: one compiled kernel
    assert _key(aligned, 7) != _key(unaligned, 7)  # 16-byte divisibility of a pointer
    assert _key(aligned, 7) != _key(aligned.float(), 7)  # dtype
    assert _key(aligned, 16) != _key(aligned, 17) and _key(aligned, 1) != _key(aligned, 2)  # int values
    assert _key(aligned, True) != _key(aligned, 1)  # a bool is not the int 1
    assert _key(aligned, 2**31) != _key(aligned, 2**31 - 1)  # i64 against i32
    assert _key(aligned, BM=16) != _key(aligned, BM=32)  # constexprs
    assert _key(aligned, num_warps=4) != _key(aligned, num_warps=8)  # launch options
    assert _key(aligned, grid=(4,)) != _key(aligned, grid=(4, 2))
    assert jit.specialization_key("fn", (4,), (aligned,), {}, 0) != jit.specialization_key("fn", (4,), (aligned,),
                                                                                            {}, 1)


@pytest.mark.skipif(not CUDA, reason="the cached launchers exist for compiled kernels only")
@pytest.mark.parametrize("group_size", [-1, 128])
def test_cached_act_quant_launch_gives_triton_bits(monkeypatch, group_size):
    big = torch.randn(40, 4100, device=DEVICE, dtype=torch.float16) * 3
    for m, offset in ((1, 0), (1, 0), (7, 0), (7, 1), (1, 1), (7, 0)):  # repeats hit the cache, offsets unalign
        x = big[:m, offset:offset + 4096]
        codes, scales = act_quant.quantize_activation_triton(x, 8, group_size)
        with monkeypatch.context() as mp:
            mp.setattr(jit, "_FAST_LAUNCH", False)
            ref_codes, ref_scales = act_quant.quantize_activation_triton(x, 8, group_size)
        assert torch.equal(codes, ref_codes) and torch.equal(scales, ref_scales)


@pytest.mark.skipif(not CUDA, reason="the cached launchers exist for compiled kernels only")
@pytest.mark.parametrize("config", [TileConfig(64, 16, 1), TileConfig(64, 16, 4)])
def test_cached_w4a16_launch_gives_triton_bits(monkeypatch, config):
    _, tensors, meta = packed("w4a16", 200, 1024, 128)
    big = torch.randn(20, 1032, device=DEVICE, dtype=torch.float16)
    before = len(jit._LAUNCHERS)
    for m, offset in ((16, 0), (16, 0), (5, 0), (16, 4), (16, 0)):
        x = big[:m, offset:offset + 1024]
        y = w4a16.triton_w4a16_matmul(x, tensors, meta, config)
        with monkeypatch.context() as mp:
            mp.setattr(jit, "_FAST_LAUNCH", False)
            ref = w4a16.triton_w4a16_matmul(x, tensors, meta, config)
        assert torch.equal(y, ref)
    assert len(jit._LAUNCHERS) - before <= 3  # (16, aligned), (5, aligned), (16, unaligned)


def test_launchers_are_cached_for_compiled_kernels_only():
    """The interpreter (no GPU) takes Triton's own path and caches nothing; a GPU with Triton >= 3.3 caches."""
    version = tuple(int(v) for v in jit.triton.__version__.split(".")[:2])
    assert jit._FAST_LAUNCH == (not jit.INTERPRET and version >= jit.FAST_LAUNCH_MIN_TRITON)
    jit._LAUNCHERS.clear()
    codes, _ = act_quant.quantize_activation_triton(torch.randn(2, 256, dtype=torch.float16).to(DEVICE), 8, 128)
    assert codes.shape == (2, 256) and bool(jit._LAUNCHERS) == jit._FAST_LAUNCH


@pytest.mark.skipif(not CUDA, reason="prepared launches exist for compiled kernels only")
@pytest.mark.parametrize("config", [TileConfig(64, 16, 1), TileConfig(64, 16, 4)])
def test_bound_w4a16_launch_gives_the_unbound_bits_and_declines_what_it_cannot_take(config):
    _, tensors, meta = packed("w4a16", 200, 1024, 128)
    big = torch.randn(20, 1040, device=DEVICE, dtype=torch.float16)
    bound = w4a16.BoundTritonW4a16.create(big[:16, :1024], tensors, meta, config)
    assert bound is not None
    for offset in (0, 8, 0):  # 8 fp16 values: still 16-byte aligned
        x = big[:16, offset:offset + 1024]
        assert torch.equal(bound(x), w4a16.triton_w4a16_matmul(x, tensors, meta, config))
    assert bound(big[:16, 4:1028]) is None  # 8-byte aligned: not what the kernel was compiled for
    assert bound(big[:15, :1024]) is None  # another token count
    assert bound(big[:16, :1024].contiguous()) is None  # another row stride
    with torch.cuda.stream(torch.cuda.Stream()):
        assert bound(big[:16, :1024]) is None  # another stream: the split-K workspace is the prepared stream's


@pytest.mark.skipif(not CUDA, reason="prepared launches exist for compiled kernels only")
@pytest.mark.parametrize("layout,group_size,act_group,config", [
    ("w4a8-lqq", 128, -1, TileConfig(64, 16, 1)), ("w4a8-lqq", 128, -1, TileConfig(64, 16, 4)),
    ("w8", -1, -1, TileConfig(64, 32, 2)), ("w4a16", 128, 128, TileConfig(128, 16, 1))])
def test_bound_int8_launch_gives_the_unbound_bits_and_declines_what_it_cannot_take(layout, group_size, act_group,
                                                                                   config):
    from quantkit.quant.act import quantize_activation_int
    from quantkit.runtime.kernels.triton import int8_gemm

    _, tensors, meta = packed(layout, 200, 1024, group_size)

    def acts(seed, m=16):
        x = torch.randn(m, 1024, generator=torch.Generator().manual_seed(seed)).half()
        codes, scales = quantize_activation_int(x, 8, act_group)
        return codes.to(DEVICE), scales.float().to(DEVICE)

    first = acts(0)
    bound = int8_gemm.BoundTritonInt8.create(*first, act_group, layout, tensors, meta, torch.float16, config)
    assert bound is not None
    for seed in (1, 2):
        codes, scales = acts(seed)
        assert torch.equal(bound(codes, scales),
                           int8_gemm.triton_int8_matmul(codes, scales, act_group, layout, tensors, meta,
                                                        config=config))
    codes, scales = acts(3)
    assert bound(*acts(4, m=15)) is None  # another token count
    wide_scales = torch.zeros(16, scales.shape[1] + 1, device=DEVICE)
    wide_scales[:, :-1] = scales
    assert bound(codes, wide_scales[:, :-1]) is None  # another scale row stride
    wide = torch.zeros(16, 1040, dtype=torch.int8, device=DEVICE)
    wide[:, :1024] = codes
    assert bound(wide[:, :1024], scales) is None  # another row stride
    with torch.cuda.stream(torch.cuda.Stream()):
        assert bound(codes, scales) is None  # another stream: the split-K workspace is the prepared stream's


@pytest.mark.skipif(not CUDA, reason="prepared launches exist for compiled kernels only")
@pytest.mark.parametrize("layouts,act_group,config", [
    (("w4a16", "w8"), 128, TileConfig(64, 16, 1)), (("w4a8-lqq", "w8"), -1, TileConfig(64, 16, 2))])
def test_bound_mixed_launch_gives_the_unbound_bits(layouts, act_group, config):
    from quantkit.quant.act import quantize_activation_int
    from quantkit.runtime.kernels.triton import int8_gemm

    perm = torch.randperm(200, generator=torch.Generator().manual_seed(0))
    parts = []
    for layout, rows in zip(layouts, (perm[20:].sort().values, perm[:20].sort().values)):
        group = -1 if layout == "w8" and act_group == -1 else 128
        _, tensors, meta = packed(layout, len(rows), 1024, group, seed=len(rows))
        parts.append((layout, tensors, meta, rows.to(torch.int32).to(DEVICE)))

    def acts(seed, m=16):
        codes, scales = quantize_activation_int(torch.randn(m, 1024, generator=torch.Generator().manual_seed(seed)),
                                                8, act_group)
        return codes.to(DEVICE), scales.float().to(DEVICE)

    bound = int8_gemm.BoundTritonInt8.create_mixed(*acts(0), act_group, parts, 200, torch.float16, config)
    assert bound is not None
    for seed in (1, 2):
        codes, scales = acts(seed)
        assert torch.equal(bound(codes, scales), int8_gemm.triton_mixed_int8_matmul(codes, scales, act_group, parts,
                                                                                    200, config=config))
    assert bound(*acts(3, m=9)) is None  # another token count


@pytest.mark.skipif(not CUDA, reason="prepared launches exist for compiled kernels only")
@pytest.mark.parametrize("m", [1, 4, 16, 100, 512])
def test_a_bound_mixed_layer_gives_the_registry_kernels_bits_at_every_size(m):
    """``gemm.bind_int8`` over two partitions (what a mixed QuantLinear prepares): the A8 GEMV at decode sizes, the
    Triton one-launch kernel above, the TMA kernel over the int8 operand from 512 tokens — each the bits of
    ``mixed_int8_matmul`` for the same call."""
    from quantkit.quant.act import quantize_activation_int
    from quantkit.runtime.kernels import gemm

    rows8 = torch.arange(0, 4096, 10, dtype=torch.int32)
    rows4 = torch.tensor(sorted(set(range(4096)) - set(rows8.tolist())), dtype=torch.int32)
    parts = []
    for layout, rows in (("w4a16", rows4), ("w8", rows8)):
        _, tensors, meta = packed(layout, len(rows), 1024, 128, seed=len(rows))
        parts.append((layout, tensors, meta, rows.to(DEVICE)))

    def acts(seed):
        codes, scales = quantize_activation_int(torch.randn(m, 1024, generator=torch.Generator().manual_seed(seed)),
                                                8, 128)
        return codes.to(DEVICE), scales.float().to(DEVICE)

    bound = gemm.bind_int8(*acts(0), 128, parts, 4096, torch.float16)
    assert bound is not None
    for seed in (1, 2):
        codes, scales = acts(seed)
        assert torch.equal(bound(codes, scales), gemm.mixed_int8_matmul(codes, scales, 128, parts, 4096))


def test_launches_are_prepared_for_compiled_kernels_only():
    _, tensors, meta = packed("w4a16", 40, 256, 128)
    bound = w4a16.BoundTritonW4a16.create(torch.randn(16, 256).half().to(DEVICE), tensors, meta)
    assert (bound is not None) == jit._FAST_LAUNCH


@pytest.mark.skipif(not CUDA, reason="prepared launches exist for compiled kernels only")
@pytest.mark.parametrize("group_size", [-1, 128])
def test_repeated_act_quant_calls_take_the_prepared_launch_with_the_same_bits(group_size):
    from quantkit.quant.act import quantize_activation_int

    big = torch.randn(8, 4100, device=DEVICE, dtype=torch.float16) * 3
    act_quant._PREPARED.clear()
    for offset in (0, 0, 8, 4, 0):  # the second call is prepared; 4 fp16 values = an 8-byte offset: Triton's path
        x = big[:3, offset:offset + 4096]
        codes, scales = act_quant.quantize_activation_triton(x, 8, group_size)
        want_codes, want_scales = quantize_activation_int(x, 8, group_size)
        assert torch.equal(codes, want_codes.to(torch.int8)) and torch.equal(scales, want_scales.float())
    assert any(prepared is not None for prepared, _ in act_quant._PREPARED.values())


@pytest.mark.skipif(not CUDA, reason="prepared launches exist for compiled kernels only")
@pytest.mark.parametrize("group_size", [None, -1, 128])
def test_repeated_rms_norm_calls_take_the_prepared_launch_with_the_same_bits(group_size):
    from quantkit.runtime.kernels.triton import rms_norm

    rms_norm._PREPARED.clear()
    weights = [torch.rand(4096, device=DEVICE, dtype=torch.float16) + 0.5 for _ in range(2)]
    x = torch.randn(3, 4096, device=DEVICE, dtype=torch.float16)
    first = [rms_norm.rms_norm_triton(x, w, 1e-5, group_size) for w in weights]  # the second layer: prepared
    again = [rms_norm.rms_norm_triton(x, w, 1e-5, group_size) for w in weights]
    for a, b in zip(first, again):
        for ta, tb in zip(a, b):
            assert (ta is None and tb is None) or torch.equal(ta, tb)
    assert not torch.equal(first[0][0], first[1][0])  # each call read its own weight
    assert any(prepared is not None for prepared, _ in rms_norm._PREPARED.values())
