"""Kernel layouts (w4a16, w4a8-lqq, w8): bit-exact round trips (also through safetensors), the tile-planar
word order pinned on hand-computed words, and refusals with reasons."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from quantkit.errors import QuantkitError
from quantkit.formats import get_layout, nibble_planes
from quantkit.quant import grid, lqq
from quantkit.quant.records import QuantizedWeight

SHAPES = [(7, 200), (33, 328), (1, 72), (2, 512)]


def assert_same(a: QuantizedWeight, b: QuantizedWeight) -> None:
    assert (a.bits, a.group_size, a.sym) == (b.bits, b.group_size, b.sym)
    assert a.codes.dtype == b.codes.dtype == torch.uint8
    assert torch.equal(a.codes, b.codes)
    assert torch.equal(a.zeros.to(torch.int64), b.zeros.to(torch.int64))
    assert torch.equal(a.scales.half(), b.scales.half())
    assert a.g_idx is None and b.g_idx is None
    assert (a.channel_scales is None) == (b.channel_scales is None)
    if a.channel_scales is not None:
        assert torch.equal(a.channel_scales.half(), b.channel_scales.half())


def roundtrip(name: str, qw: QuantizedWeight, tmp_path=None) -> QuantizedWeight:
    layout = get_layout(name)
    assert layout.supports(qw) is None
    tensors = layout.pack(qw)
    meta = json.loads(json.dumps(layout.layout_meta(qw)))
    assert all(t.is_contiguous() for t in tensors.values())
    if tmp_path is not None:
        save_file(tensors, str(tmp_path / "w.safetensors"))
        tensors = load_file(str(tmp_path / "w.safetensors"))
    return layout.unpack(tensors, meta)


def random_4bit(n: int, k: int, group_size: int, sym: bool, seed: int) -> QuantizedWeight:
    gen = torch.Generator().manual_seed(seed)
    g = grid.num_groups(k, group_size)
    zeros = torch.full((n, g), 8) if sym else torch.randint(0, 16, (n, g), generator=gen)
    return QuantizedWeight(codes=torch.randint(0, 16, (n, k), generator=gen).to(torch.uint8),
                           scales=(torch.rand(n, g, generator=gen) * 0.1 + 1e-4).half().float(),
                           zeros=zeros.to(torch.uint8), bits=4, group_size=group_size, sym=sym)


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("group_size", [128, 256, -1])
@pytest.mark.parametrize("sym", [False, True])
def test_w4a16_roundtrip(n, k, group_size, sym):
    qw = random_4bit(n, k, group_size, sym, seed=n * k + group_size)
    assert_same(roundtrip("w4a16", qw), qw)


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("group_size", [128, -1])
def test_w4a8_lqq_roundtrip_keeps_eq12_int8_codes(n, k, group_size):
    qw = lqq.lqq_quantize(torch.randn(n, k, generator=torch.Generator().manual_seed(k)) * 0.05, group_size)
    out = roundtrip("w4a8-lqq", qw)
    assert_same(out, qw)
    assert torch.equal(lqq.lqq_int8_codes(out), lqq.lqq_int8_codes(qw))


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("group_size", [128, 384, -1])
def test_w8_roundtrip(n, k, group_size):
    qw = grid.quantize(torch.randn(n, k, generator=torch.Generator().manual_seed(n + k)), 8, group_size, sym=True)
    qw.codes[0, 0] = 0  # the whole code range, including the -128 int8 value
    qw.codes[-1, -1] = 255
    out = roundtrip("w8", qw)
    assert_same(out, qw)
    assert get_layout("w8").pack(qw)["qweight"].shape == (n, nibble_planes.padded_k(k))


@pytest.mark.parametrize("name", ["w4a16", "w4a8-lqq", "w8"])
def test_real_records_survive_a_safetensors_file(name, tmp_path):
    w = torch.randn(33, 200, generator=torch.Generator().manual_seed(3))
    qw = {"w4a16": lambda: grid.quantize(w, 4, 128), "w8": lambda: grid.quantize(w, 8, 128, sym=True),
          "w4a8-lqq": lambda: lqq.lqq_quantize(w, 128)}[name]()
    out = roundtrip(name, qw, tmp_path)
    assert_same(out, qw)
    assert torch.equal(grid.dequantize(out), grid.dequantize(qw))


def test_tile_planar_word_order_by_hand():
    """Column 256·1 + 32·p + 7 of a row sits in word 32 + 7 at bits 8·(p % 4) + 4·(p // 4)."""
    for p in range(8):
        codes = torch.zeros(1, 512, dtype=torch.uint8)
        codes[0, 256 + 32 * p + 7] = 0xB
        words = nibble_planes.pack_codes(codes)
        expect = [0] * 64
        expect[32 + 7] = 0xB << (8 * (p % 4) + 4 * (p // 4))
        assert [int(v) & 0xFFFFFFFF for v in words[0]] == expect
    row = torch.arange(256) % 16  # one full tile: word j = planes 0..7 of column j
    words = nibble_planes.pack_codes(row.to(torch.uint8).unsqueeze(0))
    j = 5
    nibbles = [(row[32 * p + j].item()) for p in range(8)]
    assert int(words[0, j]) & 0xFFFFFFFF == sum(c << nibble_planes.plane_shift(p) for p, c in enumerate(nibbles))


def test_pack_codes_rejects_wide_codes_and_wrong_word_counts():
    with pytest.raises(ValueError, match=r"\[0, 15\]"):
        nibble_planes.pack_codes(torch.tensor([[16]], dtype=torch.uint8))
    with pytest.raises(ValueError, match="do not hold"):
        nibble_planes.unpack_codes(torch.zeros(1, 33, dtype=torch.int32), 300)


def test_kernel_layouts_refuse_with_reasons():
    w = torch.randn(8, 256)
    asym4 = grid.quantize(w, 4, 128)
    assert "8-bit symmetric: 'w8'" in get_layout("w4a16").supports(grid.quantize(w, 8, 128, sym=True))
    assert "multiple of 128" in get_layout("w4a16").supports(grid.quantize(w, 4, 64))
    assert "w4a8-lqq" in get_layout("w4a16").supports(lqq.lqq_quantize(w))
    act_order = grid.quantize(w, 4, 128)
    act_order.g_idx = torch.flip(torch.arange(256) // 128, [0]).to(torch.int32)
    assert "act-order" in get_layout("w4a16").supports(act_order)
    assert "LiquidQuant two-level" in get_layout("w4a8-lqq").supports(asym4)
    bad_s = lqq.lqq_quantize(w)
    bad_s.scales[0, 0] = 17
    assert "[1, 16]" in get_layout("w4a8-lqq").supports(bad_s)
    assert "symmetric" in get_layout("w8").supports(grid.quantize(w, 8, 128, sym=False))
    assert "4-bit: 'w4a16'" in get_layout("w8").supports(asym4)
    with pytest.raises(QuantkitError, match="layout 'w8' cannot store this weight"):
        get_layout("w8").pack(asym4)


@pytest.mark.parametrize("name,missing", [("w4a16", "qparams"), ("w4a8-lqq", "qparams"), ("w8", "scales")])
def test_unpack_reports_a_corrupt_checkpoint(name, missing):
    w = torch.randn(7, 200)
    qw = lqq.lqq_quantize(w) if name == "w4a8-lqq" else grid.quantize(w, 8 if name == "w8" else 4, 128,
                                                                        sym=name == "w8")
    layout = get_layout(name)
    tensors, meta = layout.pack(qw), layout.layout_meta(qw)
    with pytest.raises(QuantkitError, match=f"missing tensor '{missing}'"):
        layout.unpack({key: t for key, t in tensors.items() if key != missing}, meta)
    with pytest.raises(QuantkitError, match="tensor 'qweight' is .* expected"):
        layout.unpack({**tensors, "qweight": tensors["qweight"][:, :-1]}, meta)
    with pytest.raises(QuantkitError, match="lacks 'in_features'"):
        layout.unpack(tensors, {key: v for key, v in meta.items() if key != "in_features"})


def test_group_words_by_hand():
    """w4a16 qparams: fp16 scale bits | zero << 16; w4a8-lqq: s_u8 | a << 8; w8: float32 scales, group-major."""
    codes = torch.zeros(2, 256, dtype=torch.uint8)
    qw = QuantizedWeight(codes=codes, scales=torch.tensor([[1.0, 0.5], [2.0, 0.25]]),
                         zeros=torch.tensor([[5, 0], [15, 8]], dtype=torch.uint8), bits=4, group_size=128, sym=False)
    words = get_layout("w4a16").pack(qw)["qparams"]
    assert [[int(v) for v in row] for row in words] == [[0x00053C00, 0x000F4000], [0x00003800, 0x00083400]]
    lq = QuantizedWeight(codes=codes, scales=torch.tensor([[3.0, 16.0], [1.0, 7.0]]),
                         zeros=torch.tensor([[200, 9], [128, 255]], dtype=torch.uint8), bits=4, group_size=128,
                         sym=False, channel_scales=torch.tensor([0.5, 0.25]))
    words = get_layout("w4a8-lqq").pack(lq)["qparams"]
    assert [[int(v) for v in row] for row in words] == [[3 | 200 << 8, 1 | 128 << 8], [16 | 9 << 8, 7 | 255 << 8]]
    w8 = grid.quantize(torch.randn(3, 256), 8, 128, sym=True)
    scales = get_layout("w8").pack(w8)["scales"]
    assert scales.dtype == torch.float32 and torch.equal(scales, w8.scales.t().half().float())
