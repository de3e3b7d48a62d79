"""quantkit.formats: every layout round-trips every record it accepts bit-exactly (pack → unpack, also through
JSON metadata and a safetensors file), pins its bit order on hand-computed words, and refuses what it cannot hold
with a reason. Records are random (full code/zero ranges, awkward shapes: K = 200, 328, 72; N = 1, 7, 33) or come
from the real quantizers (grid RTN, LiquidQuant)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from quantkit.errors import QuantkitError
from quantkit.formats import bitpack, get_layout, known_layouts, layouts_for, register_layout
from quantkit.quant import grid, lqq
from quantkit.quant.records import QuantizedWeight

SHAPES = [(7, 200), (33, 328), (1, 72)]
GROUPS = [128, -1]


def random_record(n: int, k: int, bits: int, group_size: int, sym: bool, act_order: bool, seed: int,
                  zero_low: int = 1) -> QuantizedWeight:
    """A record with codes and zeros drawn over their whole range (zeros from ``zero_low``), fp16 scales, and —
    with ``act_order`` — a GPTQ desc_act g_idx: column k's group is its position in a random sweep order // gs."""
    gen = torch.Generator().manual_seed(seed)
    g = grid.num_groups(k, group_size)
    lo = 1 if sym else 0
    codes = torch.randint(lo, 2 ** bits, (n, k), generator=gen).to(torch.uint8)
    scales = (torch.rand(n, g, generator=gen) * 0.1 + 1e-4).half().float()
    if sym:
        zeros = torch.full((n, g), 2 ** (bits - 1), dtype=torch.uint8)
    else:
        zeros = torch.randint(zero_low, 2 ** bits, (n, g), generator=gen).to(torch.uint8)
    g_idx = None
    if act_order and g > 1:
        sweep_pos = torch.argsort(torch.randperm(k, generator=gen))
        g_idx = (sweep_pos // group_size).to(torch.int32)
    return QuantizedWeight(codes=codes, scales=scales, zeros=zeros, bits=bits, group_size=group_size, sym=sym,
                           g_idx=g_idx)


def assert_same(a: QuantizedWeight, b: QuantizedWeight) -> None:
    """Bit-exact record equality: codes, zeros, g_idx identical; scales identical once stored as fp16."""
    assert (a.bits, a.group_size, a.sym) == (b.bits, b.group_size, b.sym)
    assert a.codes.dtype == b.codes.dtype == torch.uint8
    assert torch.equal(a.codes, b.codes)
    assert torch.equal(a.zeros.to(torch.int64), b.zeros.to(torch.int64))
    assert torch.equal(a.scales.half(), b.scales.half())
    assert (a.g_idx is None) == (b.g_idx is None)
    if a.g_idx is not None:
        assert torch.equal(a.g_idx.to(torch.int32), b.g_idx.to(torch.int32))
    assert (a.channel_scales is None) == (b.channel_scales is None)
    if a.channel_scales is not None:
        assert torch.equal(a.channel_scales.half(), b.channel_scales.half())


def roundtrip(name: str, qw: QuantizedWeight) -> QuantizedWeight:
    layout = get_layout(name)
    assert layout.supports(qw) is None
    tensors = layout.pack(qw)
    meta = json.loads(json.dumps(layout.layout_meta(qw)))  # what the manifest stores
    assert meta["layout"] == name
    for t in tensors.values():
        assert t.is_contiguous()
    return layout.unpack(tensors, meta)


# ---------------------------------------------------------------------------------------------- bit streams


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("count", [1, 7, 31, 32, 33, 200])
def test_bitpack_roundtrip_and_stream_order(bits, count):
    gen = torch.Generator().manual_seed(bits * 100 + count)
    v = torch.randint(0, 2 ** bits, (3, count), generator=gen)
    words = bitpack.pack_bits(v, bits)
    assert words.dtype == torch.int32 and words.shape == (3, -(-count * bits // 32))
    assert torch.equal(bitpack.unpack_bits(words, bits, count), v)
    # the stream rule, read one bit at a time with Python integers
    for r in range(3):
        stream = sum((int(w) & 0xFFFFFFFF) << (32 * i) for i, w in enumerate(words[r]))
        assert [(stream >> (bits * j)) & (2 ** bits - 1) for j in range(count)] == v[r].tolist()


def test_bitpack_rejects_values_that_do_not_fit():
    with pytest.raises(ValueError, match="cannot be packed in 3 bits"):
        bitpack.pack_bits(torch.tensor([[0, 8]]), 3)
    with pytest.raises(ValueError, match="hold fewer"):
        bitpack.unpack_bits(torch.zeros(1, 2, dtype=torch.int32), 4, 17)


# ------------------------------------------------------------------------------------------------ round trips


@pytest.mark.parametrize("bits", range(2, 9))
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("group_size", GROUPS)
@pytest.mark.parametrize("sym", [False, True])
@pytest.mark.parametrize("act_order", [False, True])
def test_reference_roundtrip(bits, n, k, group_size, sym, act_order):
    qw = random_record(n, k, bits, group_size, sym, act_order, seed=bits + n + k, zero_low=0)
    assert_same(roundtrip("reference", qw), qw)


@pytest.mark.parametrize("name", ["gptq", "gptq_v2"])
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("group_size", GROUPS)
@pytest.mark.parametrize("sym", [False, True])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_roundtrip(name, bits, n, k, group_size, sym, act_order):
    qw = random_record(n, k, bits, group_size, sym, act_order, seed=bits * n + k,
                       zero_low=0 if name == "gptq_v2" else 1)
    out = roundtrip(name, qw)
    assert_same(out, qw)
    assert get_layout(name).layout_meta(qw)["desc_act"] == (qw.g_idx is not None)


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("group_size", GROUPS + [32])
@pytest.mark.parametrize("sym", [False, True])
def test_awq_roundtrip(n, k, group_size, sym):
    qw = random_record(n, k, 4, group_size, sym, act_order=False, seed=n + k + group_size, zero_low=0)
    assert_same(roundtrip("awq", qw), qw)


@pytest.mark.parametrize("name", ["reference", "gptq", "gptq_v2", "awq"])
def test_quantized_weights_roundtrip_through_safetensors(name, tmp_path):
    """Real RTN records (K = 200: a short last group) with an odd N survive a safetensors file."""
    w = torch.randn(33, 200, generator=torch.Generator().manual_seed(3))
    qw = grid.quantize(w, 4, 64, sym=False)
    layout = get_layout(name)
    save_file(layout.pack(qw), str(tmp_path / "w.safetensors"))
    out = layout.unpack(load_file(str(tmp_path / "w.safetensors")), layout.layout_meta(qw))
    assert_same(out, qw)
    assert torch.equal(grid.dequantize(out), grid.dequantize(qw))


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("group_size", [128, -1])
def test_reference_holds_liquidquant_two_level(n, k, group_size):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(n * k)) * 0.05
    qw = lqq.lqq_quantize(w, group_size)
    out = roundtrip("reference", qw)
    assert_same(out, qw)
    assert get_layout("reference").pack(qw)["qzeros"].shape == (n, -(-grid.num_groups(k, group_size) * 8 // 32))
    assert torch.equal(lqq.lqq_int8_codes(out), lqq.lqq_int8_codes(qw))
    assert torch.equal(grid.dequantize(out), grid.dequantize(qw))


def test_row_subsets_of_a_partitioned_layer_pack_separately():
    """MixLLM partitions are row subsets of one layer; each packs on its own, whatever its row count."""
    w = torch.randn(33, 200, generator=torch.Generator().manual_seed(5))
    rows = torch.tensor([0, 3, 4, 17, 31])
    full = grid.quantize(w, 4, 128, sym=False)
    sub = grid.quantize(w[rows], 4, 128, sym=False)
    for name in ("reference", "gptq", "awq"):
        out = roundtrip(name, sub)
        assert_same(out, sub)
        assert torch.equal(grid.dequantize(out), grid.dequantize(full)[rows])


# ------------------------------------------------------------------------------------- hand-computed bit order


def u32(x: torch.Tensor) -> list[int]:
    return [int(v) & 0xFFFFFFFF for v in x.flatten()]


def one_row(codes: list[int], bits: int, sym: bool = False) -> QuantizedWeight:
    zero = 2 ** (bits - 1) if sym else 1
    return QuantizedWeight(codes=torch.tensor([codes], dtype=torch.uint8), scales=torch.ones(1, 1),
                           zeros=torch.full((1, 1), zero, dtype=torch.uint8), bits=bits, group_size=-1, sym=sym)


def test_reference_and_gptq_4bit_word_order():
    qw = one_row([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    assert u32(get_layout("reference").pack(qw)["qweight"]) == [0x87654321, 0x9]
    assert u32(get_layout("gptq").pack(qw)["qweight"]) == [0x87654321, 0x9]  # K padded to 16, codes 0


def test_gptq_3bit_packs_32_codes_in_3_words():
    codes = [0] * 32
    codes[10] = 0b101  # two low bits close word 0, the high bit opens word 1
    codes[21] = 0b110  # low bit closes word 1, two high bits open word 2
    codes[31] = 0b111  # the last three bits of word 2
    assert u32(get_layout("gptq").pack(one_row(codes, 3))["qweight"]) == [1 << 30, 1, 0b11 | 0b111 << 29]


def test_gptq_v1_stores_zero_minus_one_v2_the_zero():
    qw = random_record(9, 64, 4, 32, sym=True, act_order=False, seed=0)
    assert u32(get_layout("gptq").pack(qw)["qzeros"]) == [0x77777777, 0x7] * 2  # zero 8 stored as 7, N 9 → 16
    assert u32(get_layout("gptq_v2").pack(qw)["qzeros"]) == [0x88888888, 0x8] * 2


def test_awq_nibble_order():
    qw = QuantizedWeight(codes=torch.arange(8, dtype=torch.uint8).unsqueeze(1), scales=torch.ones(8, 1),
                         zeros=torch.arange(8, dtype=torch.uint8).unsqueeze(1), bits=4, group_size=-1, sym=False)
    t = get_layout("awq").pack(qw)  # output column c holds code c: nibble i holds column [0,2,4,6,1,3,5,7][i]
    assert u32(t["qweight"]) == [0x75316420]
    assert u32(t["qzeros"]) == [0x75316420]


# ------------------------------------------------------------------------------------------- refusals, errors


def test_gptq_refusals_name_the_reason():
    gptq = get_layout("gptq")
    assert "2, 3, 4 or 8" in gptq.supports(random_record(7, 200, 5, 128, False, False, 0))
    assert "LiquidQuant" in gptq.supports(lqq.lqq_quantize(torch.randn(7, 200)))
    with_zero0 = random_record(7, 200, 4, 128, False, False, 0, zero_low=1)
    with_zero0.zeros[3, 1] = 0
    assert "gptq_v2" in gptq.supports(with_zero0)
    assert get_layout("gptq_v2").supports(with_zero0) is None
    assert_same(roundtrip("gptq_v2", with_zero0), with_zero0)
    bad_sym = random_record(7, 200, 4, 128, True, False, 0)
    bad_sym.zeros[0, 0] = 7
    assert "symmetric" in gptq.supports(bad_sym)
    with pytest.raises(QuantkitError, match="layout 'gptq' cannot store this weight: .*gptq_v2"):
        gptq.pack(with_zero0)


def test_awq_refusals_name_the_reason():
    awq = get_layout("awq")
    assert "4-bit" in awq.supports(random_record(7, 200, 8, 128, False, False, 0))
    assert "act-order" in awq.supports(random_record(7, 200, 4, 128, False, True, 0))
    assert "LiquidQuant" in awq.supports(lqq.lqq_quantize(torch.randn(7, 200)))
    with pytest.raises(QuantkitError, match="layout 'awq' cannot store"):
        awq.pack(random_record(7, 200, 3, 128, False, False, 0))


def test_lqq_layout_refuses_lanes_that_would_carry():
    """LiquidGEMM Eq. 11: every q·s_u8 + a must fit a byte, or the kernels' four-lane multiply-add carries into
    the neighbouring lane. lqq_quantize's weights fit (s_u8 = ceil(range / 15)); a hand-made record with a large
    offset is refused with the reason."""
    lay = get_layout("w4a8-lqq")
    qw = lqq.lqq_quantize(torch.randn(7, 256), 128)
    assert lay.supports(qw) is None
    big = dataclasses.replace(qw, zeros=torch.full_like(qw.zeros, 250))
    assert "exceed 255" in lay.supports(big)


def test_reference_refusals_and_inconsistent_records():
    ref = get_layout("reference")
    lqq8 = lqq.lqq_quantize(torch.randn(7, 200))
    lqq8.bits = 8
    assert "4-bit" in ref.supports(lqq8)
    bad = random_record(7, 200, 4, 128, False, False, 0)
    bad.scales = bad.scales[:, :1]
    assert "[N, G]" in ref.supports(bad)
    huge = random_record(7, 200, 4, 128, False, False, 0)
    huge.scales[0, 0] = 1e6
    assert "fp16" in ref.supports(huge)
    wide = random_record(7, 200, 3, 128, False, False, 0)
    wide.zeros[1, 1] = 8
    assert "zeros must lie in [0, 7]" in ref.supports(wide)
    wide.zeros[1, 1] = 7
    wide.codes[0, 5] = 9
    assert "codes must lie in [0, 7]" in get_layout("gptq").supports(wide)


def test_layouts_for_lists_every_layout_with_its_verdict():
    verdicts = layouts_for(lqq.lqq_quantize(torch.randn(7, 200)))
    assert set(verdicts) >= {"reference", "gptq", "gptq_v2", "awq"}
    assert verdicts["reference"] is None
    assert all(verdicts[name] for name in ("gptq", "gptq_v2", "awq"))


def test_unknown_layout_lists_known_names():
    with pytest.raises(QuantkitError, match="unknown weight layout 'gguf'; known layouts: awq, fp8, gptq, gptq_v2"):
        get_layout("gguf")
    assert known_layouts() == sorted(known_layouts())
    with pytest.raises(ValueError, match="already registered"):
        register_layout("gptq", "quantkit.formats.awq")


@pytest.mark.parametrize("name", ["reference", "gptq", "awq"])
def test_unpack_reports_a_corrupt_checkpoint(name):
    qw = random_record(7, 200, 4, 128, False, False, 0)
    layout = get_layout(name)
    tensors, meta = layout.pack(qw), layout.layout_meta(qw)
    with pytest.raises(QuantkitError, match="missing tensor 'qzeros'"):
        layout.unpack({key: t for key, t in tensors.items() if key != "qzeros"}, meta)
    with pytest.raises(QuantkitError, match="tensor 'qweight' is .* expected"):
        layout.unpack({**tensors, "qweight": tensors["qweight"][:-1]}, meta)
    with pytest.raises(QuantkitError, match="tensor 'scales' is torch.float32"):
        layout.unpack({**tensors, "scales": tensors["scales"].float()}, meta)
    with pytest.raises(QuantkitError, match="lacks 'in_features'"):
        layout.unpack(tensors, {key: v for key, v in meta.items() if key != "in_features"})


def test_gptq_v1_reader_wraps_a_foreign_zero_of_zero_like_autogptq():
    """Other tools write zero 0 as (0 - 1) mod 2^b; unpack decodes (stored + 1) mod 2^b."""
    qw = random_record(8, 64, 4, 32, False, False, 1, zero_low=0)
    qw.zeros[2, 1] = 0
    tensors = get_layout("gptq_v2").pack(qw)
    stored = (qw.zeros.to(torch.int64).t() - 1) % 16
    tensors["qzeros"] = bitpack.pack_bits(stored, 4)
    out = get_layout("gptq").unpack(tensors, get_layout("gptq").layout_meta(qw))
    assert_same(out, qw)


def test_gptq_unpack_rejects_g_idx_out_of_range():
    qw = random_record(7, 200, 4, 128, False, True, 0)
    gptq = get_layout("gptq")
    tensors = gptq.pack(qw)
    tensors["g_idx"] = tensors["g_idx"].clone()
    tensors["g_idx"][0] = 2
    with pytest.raises(QuantkitError, match="g_idx holds groups outside"):
        gptq.unpack(tensors, gptq.layout_meta(qw))


# ------------------------------------------------------------------------------------------- config.json


def test_gptq_quantization_config():
    gptq = get_layout("gptq")
    plain = gptq.layout_meta(random_record(7, 200, 4, 128, True, False, 0))
    act = gptq.layout_meta(random_record(7, 200, 4, 128, True, True, 1))
    assert gptq.quantization_config(plain) == {"quant_method": "gptq", "bits": 4, "group_size": 128,
                                               "desc_act": False, "sym": True, "checkpoint_format": "gptq"}
    assert gptq.quantization_config([plain, act])["desc_act"] is True
    v2 = get_layout("gptq_v2")
    assert v2.quantization_config(v2.layout_meta(random_record(7, 200, 3, 64, False, False, 0))) == {
        "quant_method": "gptq", "bits": 3, "group_size": 64, "desc_act": False, "sym": False,
        "checkpoint_format": "gptq_v2"}
    eight = gptq.layout_meta(random_record(7, 200, 8, 128, True, False, 0))
    with pytest.raises(QuantkitError, match="layers differ"):
        gptq.quantization_config([plain, eight])


def test_awq_quantization_config():
    awq = get_layout("awq")
    metas = [awq.layout_meta(random_record(7, 200, 4, 128, False, False, s)) for s in range(2)]
    assert awq.quantization_config(metas) == {"quant_method": "awq", "bits": 4, "group_size": 128,
                                              "zero_point": True, "version": "gemm"}
    other = awq.layout_meta(random_record(7, 200, 4, 64, False, False, 0))
    with pytest.raises(QuantkitError, match="one group_size"):
        awq.quantization_config(metas + [other])


def test_transformers_reads_the_configs():
    """transformers' own config classes parse what we write into config.json (no GPU or gptqmodel needed)."""
    from transformers import AwqConfig, GPTQConfig

    gptq = get_layout("gptq_v2")
    cfg = gptq.quantization_config(gptq.layout_meta(random_record(7, 200, 3, 64, False, True, 0)))
    parsed = GPTQConfig.from_dict(cfg)
    assert (parsed.bits, parsed.group_size, parsed.desc_act, parsed.sym, parsed.format) == (3, 64, True, False,
                                                                                            "gptq_v2")
    awq = get_layout("awq")
    parsed = AwqConfig.from_dict(awq.quantization_config(awq.layout_meta(random_record(7, 200, 4, 128, False,
                                                                                         False, 0))))
    assert (parsed.bits, parsed.group_size, parsed.zero_point, parsed.format) == (4, 128, True, "gemm")
