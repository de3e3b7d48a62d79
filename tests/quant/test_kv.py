"""KV-cache quantization (quantkit.quant.kv): each scheme's stored codes against a plain per-slice reference (bit for
bit), the nibble packing, the per-query quantized prefix in attention against a query-by-query reference, prefill
agreeing with incremental decode, and the recipe / eval-ppl plumbing."""

from __future__ import annotations

import json

import pytest
import torch

from quantkit.quant.kv import (KVSpec, attach_kv_quant, attention, fake_quant, pack, pack_nibbles, quantized_prefix,
                               unpack_nibbles)
from tests.conftest import build_tiny_model


def _x(*shape, seed=0):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    x[..., 3] *= 20  # an outlier channel, as keys have
    return x


def _plain_affine(values: list[float], bits: int) -> list[float]:
    """One slice, the textbook way: fp16 scale (max − min)/(2^b − 1) and minimum, codes rounded and clamped."""
    qmax = 2 ** bits - 1
    lo, hi = min(values), max(values)
    s = max(float(torch.tensor((hi - lo) / qmax).half()), 2 ** -24)
    m = float(torch.tensor(lo).half())
    return [min(max(round((v - m) / s), 0), qmax) * s + m for v in values]


@pytest.mark.parametrize("shape", [(1, 1, 1, 8), (2, 3, 5, 6)])
def test_kv8_is_per_token_and_head_affine_bit_for_bit(shape):
    x = _x(*shape)
    got = fake_quant(x, KVSpec(8), "k")
    for idx in torch.cartesian_prod(*[torch.arange(n) for n in shape[:3]]).reshape(-1, 3).tolist():
        want = _plain_affine(x[tuple(idx)].tolist(), 8)
        assert got[tuple(idx)].tolist() == pytest.approx(want, rel=0, abs=1e-6)
    assert pack(x, KVSpec(8), "k")["codes"].dtype == torch.uint8


def test_kv4_keys_per_channel_blocks_values_per_token_groups_and_a_tail_left_alone():
    spec = KVSpec(4, group_size=4, residual=8)
    k, v = _x(2, 2, 11, 8, seed=1), _x(2, 2, 11, 8, seed=2)  # 11 tokens: two whole blocks and a tail of 3
    kq, vq = fake_quant(k, spec, "k"), fake_quant(v, spec, "v")
    for b in range(2):
        for h in range(2):
            for blk in range(2):
                for c in range(8):
                    sl = k[b, h, blk * 4:(blk + 1) * 4, c].tolist()
                    assert kq[b, h, blk * 4:(blk + 1) * 4, c].tolist() == pytest.approx(_plain_affine(sl, 4), abs=1e-6)
            assert torch.equal(kq[b, h, 8:], k[b, h, 8:])
            for t in range(11):
                for grp in range(2):
                    sl = v[b, h, t, grp * 4:(grp + 1) * 4].tolist()
                    assert vq[b, h, t, grp * 4:(grp + 1) * 4].tolist() == pytest.approx(_plain_affine(sl, 4),
                                                                                        abs=1e-6)
    stored = pack(k, spec, "k")["codes"]
    assert stored.dtype == torch.uint8 and stored.shape == (2, 2, 8, 4)  # two codes a byte


def test_nibbles_round_trip_and_fp8_is_scaled_e4m3():
    codes = torch.randint(0, 16, (3, 5, 10), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(unpack_nibbles(pack_nibbles(codes)), codes)
    assert int(pack_nibbles(torch.tensor([1, 2], dtype=torch.uint8))) == 0x21
    x = _x(1, 2, 4, 8, seed=3)
    got = fake_quant(x, KVSpec(8, fp8=True), "v")
    scale = x.abs().amax(-1, keepdim=True) / 448
    assert torch.equal(got, (x / scale).to(torch.float8_e4m3fn).float() * scale)
    assert (got - x).abs().max() <= x.abs().amax() * 2 ** -3


def test_a_constant_slice_dequantizes_to_itself():
    x = torch.full((1, 1, 3, 8), 0.25)
    assert torch.equal(fake_quant(x, KVSpec(8), "k"), x) and torch.equal(fake_quant(x, KVSpec(4, group_size=4, residual=0), "v"), x)


def test_bad_specs_are_refused():
    with pytest.raises(ValueError, match="int8, int4 or fp8"):
        KVSpec(4, fp8=True)
    with pytest.raises(ValueError, match="whole number of groups"):
        KVSpec(4, group_size=32, residual=48)
    with pytest.raises(ValueError, match="head_dim"):
        fake_quant(torch.zeros(1, 1, 2, 6), KVSpec(4, group_size=4), "v")


def test_quantized_prefix_keeps_the_residual_window_in_whole_blocks():
    spec = KVSpec(4, group_size=4, residual=8)
    lengths = torch.arange(1, 20)
    assert quantized_prefix(lengths, spec).tolist() == [0] * 11 + [4] * 4 + [8] * 4
    assert torch.equal(quantized_prefix(lengths, KVSpec(8)), lengths)


def test_attention_reads_each_querys_own_quantized_prefix():
    """Against a query-by-query reference: query i attends causally over keys/values that are quantized below
    quantized_prefix(i + 1) and full precision above (GQA: 4 query heads on 2 KV heads)."""
    spec = KVSpec(4, group_size=4, residual=8)
    q, k, v = _x(1, 4, 21, 8, seed=4), _x(1, 2, 21, 8, seed=5), _x(1, 2, 21, 8, seed=6)
    got = attention(q, k, v, spec)
    kq, vq = fake_quant(k, spec, "k"), fake_quant(v, spec, "v")
    for i in range(21):
        n = int(quantized_prefix(torch.tensor(i + 1), spec))
        kk = torch.cat([kq[:, :, :n], k[:, :, n:i + 1]], 2).repeat_interleave(2, 1)
        vv = torch.cat([vq[:, :, :n], v[:, :, n:i + 1]], 2).repeat_interleave(2, 1)
        p = torch.softmax(q[:, :, i:i + 1] @ kk.transpose(-1, -2) / 8 ** 0.5, -1)
        torch.testing.assert_close(got[:, :, i:i + 1], p @ vv, rtol=1e-5, atol=1e-5)


def test_model_attention_is_sdpa_when_nothing_is_quantized_and_prefill_equals_decode():
    """Decoding token by token through a cache scores each token as the one-window (prefill) pass does: both read
    the same quantized prefix."""
    import inspect

    model = build_tiny_model("llama", seed=3)
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    ids = torch.randint(1, 500, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(ids, use_cache=False).logits
        attach_kv_quant(model, KVSpec(4, group_size=8, residual=64))  # 40 tokens: all in the fp16 window
        torch.testing.assert_close(model(ids, use_cache=False).logits, ref, rtol=1e-5, atol=1e-5)
        for spec in (KVSpec(8), KVSpec(4, group_size=4, residual=8)):
            attach_kv_quant(model, spec)
            full = model(ids, use_cache=False).logits
            assert 0 < (full - ref).abs().max() < 0.5
            out = model(ids[:, :30], use_cache=True)  # prefill 30, then decode 10 tokens one at a time
            cache, steps = out.past_key_values, [out.logits[:, -1]]
            for t in range(30, 40):
                out = model(ids[:, t:t + 1], use_cache=True, **{cache_kw: cache})
                steps.append(out.logits[:, -1])
            torch.testing.assert_close(torch.stack(steps[:-1], 1), full[:, 29:39], rtol=1e-4, atol=1e-4)


def test_recipe_kv_section_round_trips_and_bad_values_are_one_line_errors(tmp_path):
    from quantkit.errors import QuantkitError
    from quantkit.quant.recipe import load_recipe, parse_recipe

    r = tmp_path / "kv.yaml"
    r.write_text("name: kv\nweight: {method: rtn, bits: 4}\nkv: {bits: 4, group_size: 32, residual: 64}\n")
    rec = load_recipe(str(r))
    assert rec.kv == KVSpec(4, group_size=32, residual=64)
    assert parse_recipe(json.loads(json.dumps(rec.to_dict()))).kv == rec.kv
    for body, match in [("kv: {bits: 3}", "int8, int4 or fp8"), ("kv: {group_size: 32}", "needs kv.bits"),
                        ("kv: {bits: 4, residual: 40}", "whole number of groups"), ("kv: {bits: 8, x: 1}", "unknown")]:
        r.write_text(f"name: kv\nweight: {{method: rtn, bits: 4}}\n{body}\n")
        with pytest.raises(QuantkitError, match=match):
            load_recipe(str(r))


def test_eval_ppl_kv_bits_reports_the_cache_and_its_baseline():
    from typer.testing import CliRunner

    from quantkit.cli import app

    r = CliRunner().invoke(app, ["eval-ppl", "builtin:reference", "--kv-bits", "8", "--seqlen", "256",
                                 "--max-windows", "2", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["kv"] == "kv8" and res["ppl"] != res["ppl_baseline"]
    assert abs(res["ppl"] / res["ppl_baseline"] - 1) < 0.01
    bad = CliRunner().invoke(app, ["eval-ppl", "builtin:reference", "--kv-bits", "2"])
    assert bad.exit_code != 0 and "--kv-bits is 8, 4 or fp8" in bad.output and "Traceback" not in bad.output


def test_a_packed_checkpoint_keeps_its_recipes_kv_for_eval_and_inspect(tmp_path):
    from typer.testing import CliRunner

    from quantkit.cli import app

    recipe = tmp_path / "kv.yaml"
    recipe.write_text("name: kvr\nweight: {method: rtn, bits: 4, group_size: 32}\nkv: {bits: 8}\n")
    out = tmp_path / "packed"
    r = CliRunner().invoke(app, ["pack", "builtin:reference", "--recipe", str(recipe), "-o", str(out)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["eval-ppl", str(out), "--seqlen", "128", "--max-windows", "1", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["kv"] == "kv8" and res["baseline"] == "packed, unquantized cache"
    r = CliRunner().invoke(app, ["inspect", str(out)])
    assert "KV cache" in r.output and "int8" in r.output


def test_cache_bytes_count_codes_scales_and_the_fp16_residual():
    from quantkit.quant.kv import cache_bytes

    assert cache_bytes(None, 10, 128) == 10 * 128 * 4
    assert cache_bytes(KVSpec(8), 10, 128) == 2 * 10 * 132
    spec = KVSpec(4, group_size=32, residual=128)
    assert cache_bytes(spec, 100, 128) == 100 * 128 * 4  # all within the residual window
    # 32768 tokens: 32640 quantized (whole blocks older than the latest 128), 128 in fp16
    want = 32640 * 64 + 1020 * 128 * 4 + 32640 * 64 + 32640 * 4 * 4 + 128 * 128 * 4
    assert cache_bytes(spec, 32768, 128) == want
    x = _x(1, 1, 32768 // 64, 128)  # the stored tensors of pack() hold the byte count's quantized part
    p = pack(x, KVSpec(4, group_size=32, residual=0), "v")
    assert sum(t.numel() * t.element_size() for t in p.values()) == 512 * 64 + 512 * 4 * 4


def test_a_kv4_group_that_does_not_divide_head_dim_is_refused_before_the_run():
    from quantkit.errors import QuantkitError

    model = build_tiny_model("llama", seed=3)  # head_dim 16
    with pytest.raises(QuantkitError, match="head_dim is 16; use a group size that divides 16"):
        attach_kv_quant(model, KVSpec(4, group_size=32, residual=128))
