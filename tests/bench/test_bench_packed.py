"""``quantkit bench PACKED``: the shapes and methods read from a checkpoint's manifest, and the ``--decode-step``
mode on the CPU (one decoder layer of a tiny packed model against its FP16 layer of the dequantized weights)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn
from typer.testing import CliRunner

from quantkit.bench import decode_step as ds
from quantkit.bench.command import kernel_targets
from quantkit.bench.packed_targets import checkpoint_methods, checkpoint_shapes, linear_method, linear_names
from quantkit.checkpoint import load_packed, read_manifest
from quantkit.cli import app
from quantkit.errors import QuantkitError
from quantkit.pack import run_pack
from quantkit.runtime.fused_siblings import SiblingSlice
from quantkit.runtime.quant_linear import QuantLinear


@pytest.fixture(scope="module")
def packs(tiny_model_dir, tmp_path_factory):
    """Tiny llama (hidden 64, MLP 160, 4 heads / 2 KV heads of 16) packed as W4A16 and W8A8 with kernel layouts."""
    src = str(tiny_model_dir("llama"))
    out = {}
    for recipe in ("rtn-w4a16-g128", "w8a8"):
        path = tmp_path_factory.mktemp("bench") / recipe
        run_pack(src, recipe, str(path), target="sm80", device="cpu", progress=False)
        out[recipe] = str(path)
    return out


def _part(layout, rows=None):
    return {"layout": layout, "rows": rows, "bits": 8 if layout == "w8" else 4}


A8 = {"bits": 8, "group_size": 128, "sym": True}
A8_TOKEN = {"bits": 8, "group_size": -1, "sym": True}


@pytest.mark.parametrize("parts,act,method", [
    ([_part("w4a16")], None, "w4a16"),
    ([_part("w4a16")], A8, "w4a8+aq"),
    ([_part("w4a8-lqq")], A8_TOKEN, "w4a8-lqq+aq"),
    ([_part("w8")], A8, "w8a8+aq"),
    ([dict(_part("w8"), meta={"group_size": -1})], A8_TOKEN, "w8a8-ch+aq"),  # SmoothQuant's per-channel W8A8
    ([dict(_part("w8"), meta={"group_size": 128})], A8_TOKEN, "w8a8+aq"),
    ([dict(_part("fp8"), bits=8)], dict(A8_TOKEN, fp8=True), "fp8-w8a8+aq"),
    ([dict(_part("fp8"), bits=8)], A8_TOKEN, None),  # FP8 weights with int8 activations: no kernel problem
    ([_part("w4a16", "x.part4.rows"), _part("w8", "x.part8.rows")], A8, "mixed+aq"),
    ([_part("w4a8-lqq", "x.part4.rows"), _part("w8", "x.part8.rows")], A8_TOKEN, "mixed-lqq+aq"),
    ([_part("w4a16", "x.part4.rows"), _part("w8", "x.part8.rows")], None, None),  # A16 mixed: no kernel problem
    ([_part("w8")], None, None),
    ([_part("reference")], A8, None),
    ([_part("gptq")], None, None),
])
def test_linear_method(parts, act, method):
    assert linear_method({"partitions": parts}, act) == method


def _manifest(linears, act=None):
    return {"activation": act, "linears": linears}


def _lin(n, k, parts):
    return {"out_features": n, "in_features": k, "partitions": parts}


def test_shapes_in_model_order_deduplicated():
    lin = {"model.layers.10.mlp.up_proj": _lin(7, 200, [_part("w4a16")]),
           "model.layers.2.mlp.up_proj": _lin(33, 328, [_part("w4a16")]),
           "model.layers.2.self_attn.q_proj": _lin(7, 200, [_part("w4a16")]),
           "model.layers.3.mlp.up_proj": _lin(33, 328, [_part("w4a16")])}
    m = _manifest(lin)
    assert linear_names(m)[:2] == ["model.layers.2.mlp.up_proj", "model.layers.2.self_attn.q_proj"]
    assert checkpoint_shapes(m) == [(33, 328), (7, 200)]


def test_methods_union_and_refusal():
    mixed = [_part("w4a16", "r4"), _part("w8", "r8")]
    m = _manifest({"a.0.x": _lin(7, 200, [_part("w4a16")]), "a.0.y": _lin(7, 200, mixed),
                   "a.0.z": _lin(7, 200, [_part("reference")])}, A8)
    assert checkpoint_methods(m) == ["fp16", "w4a8+aq", "mixed+aq"]
    with pytest.raises(QuantkitError, match="layout\\(s\\) reference with A8 .*--target sm90` \\(or sm80, "
                                            "without --format gptq/awq\\)"):
        checkpoint_methods(_manifest({"a.0.z": _lin(7, 200, [_part("reference")])}, A8))


def test_packed_checkpoint_targets(packs, monkeypatch):
    path = packs["rtn-w4a16-g128"]
    manifest = read_manifest(path)
    stored = []
    for name in linear_names(manifest):  # q 64x64, k/v 32x64, o 64x64, gate/up 160x64, down 64x160
        shape = (manifest["linears"][name]["out_features"], manifest["linears"][name]["in_features"])
        if shape not in stored:
            stored.append(shape)
    assert sorted(stored) == [(32, 64), (64, 64), (64, 160), (160, 64)]
    # the loaded model runs q/k/v as one 128-row GEMM and gate/up as one of 320 rows (fused at load)
    want = [(64, 160), (320, 64), (64, 64), (128, 64)]
    assert checkpoint_shapes(manifest) == want and checkpoint_shapes(manifest, fuse=False) == stored
    assert kernel_targets(path, None, None, None) == (want, ["fp16", "w4a16"])
    assert kernel_targets(packs["w8a8"], None, None, None) == (want, ["fp16", "w8a8+aq"])
    assert kernel_targets(path, None, None, "w4a8,mixed") == (want, ["w4a8", "mixed"])  # --methods wins
    monkeypatch.setenv("QUANTKIT_FUSE", "0")
    assert kernel_targets(path, None, None, None) == (stored, ["fp16", "w4a16"])
    model = load_packed(path, device="cpu", load_tokenizer=False).model
    assert not any(isinstance(m, SiblingSlice) for m in model.modules())


def test_fp16_layer_holds_the_dequantized_weights(packs):
    model = load_packed(packs["w8a8"], device="cpu", dtype="fp16", load_tokenizer=False).model
    layer = ds.decoder_layers(model, linear_names(read_manifest(packs["w8a8"])))[1]
    dense = ds.fp16_layer(layer)
    qlins = {n: m for n, m in layer.named_modules()
             if isinstance(m, SiblingSlice) or (isinstance(m, QuantLinear) and m.row_blocks is None)}
    assert sorted(n.rpartition(".")[2] for n in qlins) == sorted(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    assert not any(isinstance(m, (QuantLinear, SiblingSlice)) for m in dense.modules())
    assert not hasattr(dense.self_attn, "qkv_proj") and not hasattr(dense.mlp, "gate_up_proj")  # fused at load
    for name, q in qlins.items():
        lin = dense.get_submodule(name)
        assert isinstance(lin, nn.Linear) and lin.weight.dtype == torch.float16
        assert torch.equal(lin.weight, q.dense_weight(torch.float32).half())


@pytest.mark.parametrize("index", [0, 1])
def test_step_is_the_models_own_decode_step(packs, index):
    """The captured, rewound step of layer i equals that layer's output for the last token of a full forward, and
    repeating it gives the same result (the cache write position is rewound each call)."""
    model = load_packed(packs["rtn-w4a16-g128"], device="cpu", dtype="fp16", load_tokenizer=False).model
    layers = ds.decoder_layers(model, linear_names(read_manifest(packs["rtn-w4a16-g128"])))
    ids = ds.random_ids(model, 3, 21, seed=1)
    inp = ds.prepare_decode(model, layers, index, ids)
    step = ds.step_fn(layers[index], inp)
    first, again = step(inp.hidden), step(inp.hidden)
    got = {}
    hook = layers[index].register_forward_hook(lambda mod, args, out: got.setdefault("out", out))
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
    hook.remove()
    ref = got["out"][:, -1:]
    assert first.shape == (3, 1, 64) and torch.equal(first, again)
    assert (first.float() - ref.float()).abs().max() <= 1e-3 * ref.float().abs().max()


@pytest.mark.parametrize("recipe,lo,hi", [("rtn-w4a16-g128", 0.0, 1e-3), ("w8a8", 1e-4, 0.05)])
def test_run_decode_step_cpu(packs, recipe, lo, hi):
    rows = ds.run_decode_step(packs[recipe], [1, 4], context=24, layer=1, device="cpu", reps=5)
    assert [r["batch"] for r in rows] == [1, 4]
    for r in rows:
        assert r["fp16_us"] > 0 and r["packed_us"] > 0 and r["graph"] is False and r["samples"] == 5
        assert r["speedup"] == pytest.approx(r["fp16_us"] / r["packed_us"])
        assert r["context"] == 24 and r["layer"] == 1 and r["recipe"] == recipe and r["device"] == "cpu"
        # A16: the packed reference multiplies by the same fp16 Ŵ; A8: activation quantization error only
        assert lo <= r["max_rel_diff"] <= hi
        assert r["gemv_pdl"] is False  # no CUDA GEMVs on a CPU
        assert r["fused_gemms"] == 2 and r["fused_norms"] == 2  # qkv, gate_up; input/post-attention norms


def test_max_rel_diff_is_relative_to_the_layer_update():
    hidden = torch.full((1, 1, 4), 100.0)
    fp16 = hidden + torch.tensor([0.0, 2.0, -1.0, 0.5])
    packed = fp16 + torch.tensor([0.0, 0.0, 0.1, 0.0])
    assert ds.max_rel_diff(packed, fp16, hidden) == pytest.approx(0.05, rel=1e-4)


def test_decode_step_cli_json(packs):
    r = CliRunner().invoke(app, ["bench", packs["w8a8"], "--decode-step", "--device", "cpu", "--batch", "1,2",
                                 "--context", "16", "--reps", "3", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    assert [row["batch"] for row in rows] == [1, 2] and all(row["packed_us"] > 0 for row in rows)
    assert "packed layer µs" in r.stderr and "max rel diff" in r.stderr


def test_decode_step_default_context_fits_the_model_and_cpu_rows_say_what_they_are(packs):
    """Without --context the KV cache is 1024 tokens or, in a model of fewer positions, all but the decoded one's;
    a CPU table says its numbers are the reference path's, not kernel timings."""
    r = CliRunner().invoke(app, ["bench", packs["w8a8"], "--decode-step", "--device", "cpu", "--batch", "1",
                                 "--reps", "2", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])[0]["context"] == 255  # the tiny model has 256 positions
    assert "CPU:" in r.stderr and "not kernel" in " ".join(r.stderr.split())


@pytest.mark.parametrize("args,message", [
    (["--decode-step", "--device", "cpu", "--context", "300"], "exceeds the model's 256 positions"),
    (["--decode-step", "--device", "cpu", "--context", "8", "--layer", "2"], "decoder layers 0..1"),
])
def test_decode_step_cli_errors(packs, args, message):
    r = CliRunner().invoke(app, ["bench", packs["rtn-w4a16-g128"], *args])
    assert r.exit_code == 2 and message in r.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_packed_kernel_sweep_without_gpu(packs):
    r = CliRunner().invoke(app, ["bench", packs["rtn-w4a16-g128"], "--m", "1"])
    assert r.exit_code == 2 and "need a CUDA GPU" in r.stderr
