"""Packed checkpoints: pack → load gives the fake-quant model's logits bit-exactly (plain and MixLLM-partitioned
linears), QuantLinear against a dense reference on awkward shapes, kernel dispatch with per-partition sub-GEMMs
and scatter, layout choice, sharding, and every way a checkpoint or an output path can be wrong."""

from __future__ import annotations

import dataclasses
import errno
import json
import struct
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from quantkit.checkpoint import load_packed, parse_size, read_manifest, verify_checkpoint
from quantkit.checkpoint.choose import check_recipe_export, choose_layouts
from quantkit.errors import QuantkitError
from quantkit.formats.registry import get_layout
from quantkit.model import load_model
from quantkit.pack import run_pack
from quantkit.quant.act import quantize_activation
from quantkit.quant.apply import quantize_model
from quantkit.quant.grid import dequantize
from quantkit.quant.lqq import lqq_quantize
from quantkit.quant.partition import dequantize_record, quantize_partitioned
from quantkit.quant.recipe import load_recipe
from quantkit.quant.records import QuantizedWeight
from quantkit.quant.rtn import rtn_quantize
from quantkit.runtime import ActQuant, PackedPart, QuantLinear, dispatch
from quantkit.search.command import run_search
from quantkit.search.plan_check import load_plan
from tests.conftest import build_tiny_model, shipped_tokenizer

FAST = dict(device="cpu", progress=False)
GPTQ_YAML = """name: gptq-tiny
weight: {method: gptq, bits: 4, group_size: 128, sym: false}
bit_specs:
  8: {sym: true, group_size: 128}
calibration: {samples: 2, seqlen: 32}
"""


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    # intermediate 200: down_proj has K = 200 (a short last group of 72), gate/up N = 200
    return tiny_model_dir("llama", intermediate_size=200)


@pytest.fixture(scope="module")
def gptq_recipe(tmp_path_factory):
    path = tmp_path_factory.mktemp("recipes") / "gptq-tiny.yaml"
    path.write_text(GPTQ_YAML)
    return str(path)


@pytest.fixture(scope="module")
def plan_path(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    run_search(str(model_dir), str(out), "mixllm-w4a8-rtn", strategy="random", target_bits=4.4, samples=1,
               seqlen=16, device="cpu", show_progress=False)
    return str(out)


@pytest.fixture(scope="module")
def rtn_ckpt(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt") / "rtn"
    run_pack(str(model_dir), "rtn-w4a16-g128", str(out), max_shard_size="300KB", **FAST)
    return out


def _ids(vocab: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (2, 37), generator=g)


def _fake_quant_logits(model_dir, recipe, ids, plan=None):
    loaded = load_model(str(model_dir), device="cpu")
    plan_obj = load_plan(plan, loaded.model) if plan else None
    quantize_model(loaded.model, loaded.tokenizer, load_recipe(recipe), plan=plan_obj, device="cpu")
    with torch.no_grad():
        return loaded.model(ids).logits


def _packed_logits(out, ids, verify=True):
    model = load_packed(out, device="cpu", verify=verify, load_tokenizer=False).model
    with torch.no_grad():
        return model(ids).logits


# --------------------------------------------------------------------------------------------- pack → load


@pytest.mark.parametrize("recipe,exports", [("rtn-w4a16-g128", ["quantkit", "awq"]), ("lqq-w4a8", ["quantkit"]),
                                            ("fp8-w8a8", ["quantkit"]), ("gptq", ["quantkit", "gptq", "gptq_v2"])])
def test_packed_logits_equal_fake_quant_exactly(model_dir, gptq_recipe, tmp_path, recipe, exports):
    recipe = gptq_recipe if recipe == "gptq" else recipe
    ids = _ids(len(shipped_tokenizer()))
    want = _fake_quant_logits(model_dir, recipe, ids)
    for export in exports:
        out = tmp_path / export
        run_pack(str(model_dir), recipe, str(out), export=export, **FAST)
        assert torch.equal(_packed_logits(out, ids), want), export
        manifest = read_manifest(out)
        layouts = {p["layout"] for lin in manifest["linears"].values() for p in lin["partitions"]}
        assert layouts == {"reference" if export == "quantkit" else export}
        assert manifest["export"] == export
        assert (manifest["activation"] is not None) == load_recipe(recipe).activation.enabled
        qc = json.loads((out / "config.json").read_text())["quantization_config"]
        if export == "gptq":  # the keys GPTQModel writes and transformers/vLLM read
            assert qc == {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": False,
                          "checkpoint_format": "gptq"}
            assert {f"model.layers.0.mlp.down_proj.{t}" for t in ("qweight", "qzeros", "scales", "g_idx")} \
                <= set(manifest["tensors"])
        elif export == "gptq_v2":  # GPTQModel's own format: zeros as they are, no producer check on asym
            assert qc["checkpoint_format"] == "gptq_v2" and qc["sym"] is False
        elif export == "awq":  # AutoAWQ GEMM's config
            assert qc == {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
        else:
            assert qc["quant_method"] == "quantkit" and qc["recipe"] == load_recipe(recipe).name
        if export.startswith("gptq"):  # AutoGPTQ's own copy; not for AWQ or quantkit's format
            assert json.loads((out / "quantize_config.json").read_text()) == qc
        else:
            assert not (out / "quantize_config.json").exists()


def test_mixed_plan_partitions_scatter_to_fake_quant(model_dir, gptq_recipe, plan_path, tmp_path):
    out = tmp_path / "mixed"
    summary = run_pack(str(model_dir), gptq_recipe, str(out), plan=plan_path, **FAST)
    manifest = read_manifest(out)
    mixed = [n for n, lin in manifest["linears"].items() if len(lin["partitions"]) == 2]
    assert mixed, "a 4.4-bit random plan gives some linears an 8-bit partition"
    lin = manifest["linears"][mixed[0]]
    assert [p["bits"] for p in lin["partitions"]] == [4, 8]
    rows = {p["rows"] for p in lin["partitions"]}
    assert rows == {f"{mixed[0]}.part4.rows", f"{mixed[0]}.part8.rows"}
    assert all(manifest["tensors"][r]["dtype"] == "int32" for r in rows)
    assert manifest["plan_sha256"] == __import__("hashlib").sha256(Path(plan_path).read_bytes()).hexdigest()
    assert summary["avg_bits"] == pytest.approx(load_plan(plan_path).achieved_bits, abs=1e-6)
    ids = _ids(len(shipped_tokenizer()), seed=1)
    assert torch.equal(_packed_logits(out, ids), _fake_quant_logits(model_dir, gptq_recipe, ids, plan_path))


def test_calib_samples_overrides_the_recipe(model_dir, gptq_recipe, tmp_path):
    out = tmp_path / "c1"
    run_pack(str(model_dir), gptq_recipe, str(out), calib_samples=1, **FAST)
    assert read_manifest(out)["calibration"] == {"dataset": "kjv+pydoc", "samples": 1, "seqlen": 32, "seed": 0}
    with pytest.raises(QuantkitError, match="--calib-samples must be at least 1"):
        run_pack(str(model_dir), gptq_recipe, str(tmp_path / "c0"), calib_samples=0, **FAST)
    run_pack(str(model_dir), gptq_recipe, str(tmp_path / "c2"), calib_samples=2, calib_seqlen=16, **FAST)
    assert read_manifest(tmp_path / "c2")["calibration"]["seqlen"] == 16
    with pytest.raises(QuantkitError, match="--calib-seqlen must be at least 2 tokens"):
        run_pack(str(model_dir), gptq_recipe, str(tmp_path / "c3"), calib_seqlen=1, **FAST)


def test_tied_fp16_source_keeps_dtype_and_writes_embedding_once(tmp_path):
    tok = shipped_tokenizer()
    src = tmp_path / "src"
    model = build_tiny_model("qwen2", seed=5, vocab_size=len(tok), tie_word_embeddings=True).half()
    model.save_pretrained(src)
    tok.save_pretrained(src)
    out = tmp_path / "out"
    run_pack(str(src), "w8a8", str(out), **FAST)
    manifest = read_manifest(out)
    assert manifest["aliases"] == {"lm_head.weight": "model.embed_tokens.weight"}
    assert "lm_head.weight" not in manifest["tensors"]
    assert manifest["tensors"]["model.embed_tokens.weight"]["dtype"] == "float16"
    assert manifest["tensors"]["model.layers.0.self_attn.q_proj.bias"]["dtype"] == "float16"  # qwen2 qkv bias
    assert json.loads((out / "config.json").read_text())["dtype"] == "float16"
    ids = _ids(len(tok), seed=2)
    assert torch.equal(_packed_logits(out, ids), _fake_quant_logits(src, "w8a8", ids))
    reloaded = load_packed(out, device="cpu", load_tokenizer=False).model
    assert reloaded.lm_head.weight is reloaded.model.embed_tokens.weight


def test_checkpoint_files_and_shards(rtn_ckpt):
    index = json.loads((rtn_ckpt / "model.safetensors.index.json").read_text())
    manifest = read_manifest(rtn_ckpt)
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert index["weight_map"] == {n: e["shard"] for n, e in manifest["tensors"].items()}
    assert index["metadata"]["total_size"] == sum(e["nbytes"] for e in manifest["tensors"].values())
    for shard in shards:  # a shard exceeds 300 kB only when one tensor alone does (the 8192 × 64 embedding)
        names = [n for n, s in index["weight_map"].items() if s == shard]
        size = sum(manifest["tensors"][n]["nbytes"] for n in names)
        assert size <= 300_000 or len(names) == 1
    assert json.loads((rtn_ckpt / "config.json").read_text())["quantization_config"]["format_version"] == 1
    assert (rtn_ckpt / "tokenizer.json").is_file()
    assert manifest["source"]["parameters"] > 0 and manifest["plan_sha256"] is None
    assert verify_checkpoint(rtn_ckpt) == []
    assert not list(rtn_ckpt.parent.glob("*.tmp-*"))


# ------------------------------------------------------------------------------------------------ QuantLinear


def _part(qw: QuantizedWeight, rows=None, layout="reference") -> PackedPart:
    mod = get_layout(layout)
    return PackedPart(layout, mod.layout_meta(qw), mod.pack(qw), rows, qw.bits)


@pytest.mark.parametrize("n,k", [(33, 200), (7, 328)])
def test_quant_linear_single_partition_is_exact(n, k):
    torch.manual_seed(n + k)
    w, b = torch.randn(n, k), torch.randn(n)
    qw = rtn_quantize(w, 4, 128)
    ql = QuantLinear(k, n, [_part(qw)], bias=b)
    for shape in ((1, k), (3, 5, k)):
        x = torch.randn(*shape)
        assert torch.equal(ql(x), F.linear(x, dequantize(qw), b))
    assert torch.equal(ql.dense_weight(), dequantize(qw))
    assert set(ql.state_dict()) == {"qweight", "scales", "qzeros", "bias"}


def _mixed_record(n=33, k=200, seed=0):
    torch.manual_seed(seed)
    w = torch.randn(n, k)
    row_bits = torch.full((n,), 4)
    row_bits[[0, 5, 17, 32]] = 8
    return quantize_partitioned(w, row_bits, lambda sub, bits: rtn_quantize(sub, bits, 128, sym=bits == 8))


def test_quant_linear_mixed_reference_is_the_dense_product():
    rec = _mixed_record()
    b = torch.randn(33)
    ql = QuantLinear(200, 33, [_part(p.weight, p.rows) for p in rec.partitions], bias=b)
    assert set(ql.state_dict()) == {f"part{b}.{t}" for b in (4, 8) for t in ("qweight", "scales", "qzeros", "rows")} \
        | {"bias"}
    assert torch.equal(ql.dense_weight(), dequantize_record(rec))
    for shape in ((1, 200), (2, 3, 200)):
        x = torch.randn(*shape)
        assert torch.equal(ql(x), F.linear(x, dequantize_record(rec), b))


def test_quant_linear_lqq_with_a8_matches_fake_quant():
    torch.manual_seed(1)
    n, k = 7, 328
    w = torch.randn(n, k)
    qw = lqq_quantize(w, 128)
    act = ActQuant(8, -1, True)
    ql = QuantLinear(k, n, [_part(qw)], act=act)
    x = torch.randn(4, k)
    assert torch.equal(ql(x), F.linear(quantize_activation(x, 8, -1, True), dequantize(qw)))


def test_quant_linear_dense_cache_follows_dtype():
    torch.manual_seed(2)
    qw = rtn_quantize(torch.randn(16, 64), 4, 32)
    ql = QuantLinear(64, 16, [_part(qw)])
    x = torch.randn(2, 64)
    y32 = ql(x)
    assert ql(x.double()).dtype == torch.float64
    assert torch.equal(ql(x), y32)
    nocache = QuantLinear(64, 16, [_part(qw)], cache_dense=False)
    assert torch.equal(nocache(x), y32) and not nocache._dense


@pytest.fixture
def cpu_kernel():
    calls = []

    def kernel(x, tensors, meta, act):
        calls.append((x.clone(), act))
        qw = get_layout("reference").unpack(tensors, meta)
        return x @ dequantize(qw, x.dtype).t() + 1000.0  # offset proves the kernel's output is used

    yield calls, kernel
    dispatch.unregister("reference", devices=("cpu",))


@pytest.mark.parametrize("quantizes", [False, True])
def test_dispatch_calls_registered_kernel(cpu_kernel, quantizes):
    calls, kernel = cpu_kernel
    dispatch.register("reference", kernel, quantizes_activations=quantizes, devices=("cpu",))
    torch.manual_seed(3)
    qw = rtn_quantize(torch.randn(9, 40), 4, 16)
    act = ActQuant(8, 16, True)
    ql = QuantLinear(40, 9, [_part(qw)], act=act)
    x = torch.randn(2, 3, 40)
    y = ql(x)
    assert y.shape == (2, 3, 9) and len(calls) == 1
    got_x, got_act = calls[0]
    assert got_act == act and got_x.shape == (6, 40)
    want_x = x if quantizes else quantize_activation(x, 8, 16, True)
    assert torch.equal(got_x, want_x.reshape(6, 40))
    assert torch.equal(y, want_x @ dequantize(qw).t() + 1000.0)
    dispatch.unregister("reference", devices=("cpu",))
    assert dispatch.kernel_for("reference", "cpu") is None
    assert torch.equal(ql(x), F.linear(quantize_activation(x, 8, 16, True), dequantize(qw)))


def test_mixed_partitions_run_as_sub_gemms_scattered_to_their_rows(cpu_kernel):
    """MixLLM Sec. 3.4 with a kernel for one layout only: the 4-bit partition ('reference') runs the kernel, the
    8-bit one (stored as 'gptq') the torch sub-GEMM; each output lands on its partition's rows."""
    calls, kernel = cpu_kernel
    dispatch.register("reference", kernel, devices=("cpu",))
    rec = _mixed_record(seed=6)
    four, eight = rec.partitions
    b = torch.randn(33)
    ql = QuantLinear(200, 33, [_part(four.weight, four.rows), _part(eight.weight, eight.rows, layout="gptq")], bias=b)
    x = torch.randn(1, 200)
    y = ql(x)
    assert len(calls) == 1 and calls[0][0].shape == (1, 200)
    assert torch.equal(y[..., four.rows], x @ dequantize(four.weight).t() + 1000.0 + b[four.rows])
    assert torch.equal(y[..., eight.rows], F.linear(x, dequantize(eight.weight), b[eight.rows]))


# ------------------------------------------------------------------------------------------- layout choice


def test_kernel_targets_fall_back_to_reference_with_a_warning(monkeypatch):
    import quantkit.checkpoint.choose as choose

    real = choose._get

    def only_reference(name):
        if name != "reference":
            raise QuantkitError(f"unknown weight layout '{name}'")
        return real(name)

    monkeypatch.setattr(choose, "_get", only_reference)
    torch.manual_seed(4)
    records = {"a": rtn_quantize(torch.randn(8, 64), 4, 32), "b": rtn_quantize(torch.randn(8, 64), 3, 32)}
    warnings = []
    assert choose_layouts(records, "sm90", "quantkit", warnings.append) == {"a": ["reference"], "b": ["reference"]}
    assert any("'w4a16' is not available" in w for w in warnings)
    assert any("no sm90 kernel layout for 3-bit asym" in w for w in warnings)


def test_gptq_zero_point_zero_switches_the_model_to_v2():
    torch.manual_seed(5)
    qw = rtn_quantize(torch.rand(8, 64) + 0.1, 4, 32)  # all-positive groups: zero point 0
    assert bool((qw.zeros == 0).any())
    warnings = []
    assert choose_layouts({"a": qw, "b": rtn_quantize(torch.randn(8, 64), 4, 32)}, "reference", "gptq",
                          warnings.append) == {"a": ["gptq_v2"], "b": ["gptq_v2"]}
    assert len(warnings) == 1 and "gptq_v2" in warnings[0]


# ------------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("recipe,target,export,plan,match", [
    ("lqq-w4a8", None, "gptq", False, "cannot hold recipe 'lqq-w4a8'.*--format gptq holds uniform weight-only"),
    ("mixllm-w4a8-rtn", None, "gptq", False, "quantizes activations"),
    ("w8a8", None, "awq", False, "quantizes activations"),
    ("rtn-w4a16-g128", None, "gptq", True, "mixes bit-widths"),
    ("rtn-w4a16-g128", "sm90", "gptq", False, "cannot be combined with --format gptq"),
    ("rtn-w4a16-g128", "sm75", "quantkit", False, "unknown --target"),
    ("rtn-w4a16-g128", None, "exl2", False, "unknown --format"),
])
def test_impossible_combinations_are_refused_before_loading(model_dir, plan_path, tmp_path, monkeypatch, recipe,
                                                            target, export, plan, match):
    import quantkit.model

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(quantkit.model, "load_model", no_load)
    with pytest.raises(QuantkitError, match=match) as e:
        run_pack(str(model_dir), recipe, str(tmp_path / "o"), target=target, export=export,
                 plan=plan_path if plan else None, **FAST)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "o").exists()


def test_awq_refuses_8_bit_and_act_order_with_g_idx(model_dir, tmp_path):
    r8 = tmp_path / "r8.yaml"
    r8.write_text("name: r8\nweight: {method: rtn, bits: 8, sym: true}\n")
    ao = tmp_path / "ao.yaml"
    ao.write_text("name: ao\nweight: {method: gptq, bits: 4, act_order: true, static_groups: false}\n")
    with pytest.raises(QuantkitError, match="8-bit weights"):
        run_pack(str(model_dir), str(r8), str(tmp_path / "o"), export="awq", **FAST)
    with pytest.raises(QuantkitError, match="act-order"):
        run_pack(str(model_dir), str(ao), str(tmp_path / "o"), export="awq", **FAST)
    check_recipe_export(load_recipe("gptq-w4a16-g128"), "awq", False)  # static act-order: no g_idx to hold


def test_plan_for_another_model_is_refused(plan_path, tiny_model_dir, tmp_path):
    other = tiny_model_dir("llama", intermediate_size=200, rms_norm_eps=1e-5)  # another config, same shapes
    with pytest.raises(QuantkitError, match="plan"):
        run_pack(str(other), "mixllm-w4a8-rtn", str(tmp_path / "o"), plan=plan_path, **FAST)
    assert not (tmp_path / "o").exists()


def _shard_with(ckpt: Path, tensor: str) -> tuple[Path, int, int]:
    """(shard path, start, end) byte range of ``tensor`` inside its shard file."""
    shard = ckpt / read_manifest(ckpt)["tensors"][tensor]["shard"]
    raw = shard.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    begin, end = json.loads(raw[8:8 + n])[tensor]["data_offsets"]
    return shard, 8 + n + begin, 8 + n + end


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_corrupted_shard_is_caught_by_verify(rtn_ckpt, tmp_path):
    ckpt = _copy(rtn_ckpt, tmp_path / "c")
    name = "model.layers.1.mlp.up_proj.qweight"
    shard, start, _ = _shard_with(ckpt, name)
    raw = bytearray(shard.read_bytes())
    raw[start + 3] ^= 0x10
    shard.write_bytes(bytes(raw))
    with pytest.raises(QuantkitError, match=f"tensor '{name}' in shard '{shard.name}' fails its sha256"):
        load_packed(ckpt, device="cpu", verify=True)
    assert [m["tensor"] for m in verify_checkpoint(ckpt)] == [name]
    load_packed(ckpt, device="cpu", verify=False)  # without verify the flipped bit goes unnoticed


@pytest.mark.parametrize("damage", ["truncate", "delete", "drop_tensor"])
def test_truncated_or_missing_shard_is_an_error(rtn_ckpt, tmp_path, damage):
    ckpt = _copy(rtn_ckpt, tmp_path / "c")
    name = "model.layers.0.self_attn.o_proj.scales"
    shard, _, end = _shard_with(ckpt, name)
    if damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:end - 4])
        match = f"{shard.name}.*truncated"
    elif damage == "delete":
        shard.unlink()
        match = f"shard '{shard.name}' .* is missing"
    else:  # a shard rewritten without one of its tensors
        from safetensors.torch import load_file, save_file

        kept = {k: v for k, v in load_file(shard).items() if k != name}
        save_file(kept, shard)
        match = f"tensor '{name}' is missing from shard"
    with pytest.raises(QuantkitError, match=match):
        load_packed(ckpt, device="cpu")
    with pytest.raises(QuantkitError):
        verify_checkpoint(ckpt)


def test_manifest_version_and_presence(rtn_ckpt, tmp_path):
    ckpt = _copy(rtn_ckpt, tmp_path / "c")
    m = json.loads((ckpt / "quantkit.json").read_text())
    m["format_version"] = 99
    (ckpt / "quantkit.json").write_text(json.dumps(m))
    with pytest.raises(QuantkitError, match="format version 99.*upgrade quantkit"):
        load_packed(ckpt, device="cpu")
    (ckpt / "quantkit.json").write_text("{}")
    with pytest.raises(QuantkitError, match="not a quantkit checkpoint manifest.*written by `quantkit pack`"):
        load_packed(ckpt, device="cpu")
    (ckpt / "quantkit.json").unlink()
    with pytest.raises(QuantkitError, match="not a packed quantkit checkpoint"):
        load_packed(ckpt, device="cpu")


def test_checkpoint_without_config_json_names_the_fix(rtn_ckpt, tmp_path):
    ckpt = _copy(rtn_ckpt, tmp_path / "c")
    (ckpt / "config.json").unlink()
    with pytest.raises(QuantkitError, match="has no config.json; re-run `quantkit pack`"):
        load_packed(ckpt, device="cpu")


def _leftovers(parent: Path) -> list[Path]:
    return [p for p in parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def _safetensors_disk_full():
    from safetensors import SafetensorError

    return SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


@pytest.mark.parametrize("exc", [OSError(errno.ENOSPC, "No space left on device"), "safetensors",
                                 KeyboardInterrupt()])
def test_interrupted_write_leaves_nothing(model_dir, tmp_path, monkeypatch, exc):
    """A full disk (as an OSError, or as safetensors' own error, which is how it reports one) is one line naming
    the size; Ctrl-C stays an interrupt; neither leaves anything behind. (A real full file system:
    tests/test_pack_robustness.py.)"""
    import safetensors.torch

    exc = _safetensors_disk_full() if exc == "safetensors" else exc
    interrupt = isinstance(exc, KeyboardInterrupt)

    real = safetensors.torch.save_file
    calls = []

    def failing_save(tensors, filename, metadata=None):
        calls.append(filename)
        if len(calls) == 2:  # the first shard is on disk, the second fails half-way
            Path(filename).write_bytes(b"partial")
            raise exc
        return real(tensors, filename, metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", failing_save)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt if interrupt else QuantkitError) as e:
        run_pack(str(model_dir), "rtn-w4a16-g128", str(out), max_shard_size="300KB", **FAST)
    if not interrupt:
        assert "no space left on the device (the checkpoint needs about" in str(e.value)
        assert "nothing was written (free space there or choose another -o)" in str(e.value)
    assert len(calls) == 2
    assert not out.exists() and not _leftovers(tmp_path)


def test_output_folder_that_takes_no_directory_is_refused_before_quantizing(model_dir, tmp_path, monkeypatch):
    """A read-only or forbidden output folder is one line naming the fix, before the model is even loaded (root
    ignores permission bits, so the check has to try a directory there)."""
    import quantkit.checkpoint.atomic as atomic
    import quantkit.model as model_pkg

    def refuse(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(atomic.tempfile, "mkdtemp", refuse)
    monkeypatch.setattr(model_pkg, "load_model", lambda *a, **k: pytest.fail("loaded the model before the check"))
    with pytest.raises(QuantkitError, match="Read-only file system; nothing was written .choose a folder you can "
                                            "write to with -o"):
        run_pack(str(model_dir), "rtn-w4a16-g128", str(tmp_path / "out"), **FAST)
    assert not (tmp_path / "out").exists() and not _leftovers(tmp_path)


def test_existing_output_needs_force(model_dir, rtn_ckpt, tmp_path, monkeypatch):
    out = _copy(rtn_ckpt, tmp_path / "out")
    before = read_manifest(out)["recipe"]["name"]
    with pytest.raises(QuantkitError, match="already exists; pass --force"):
        run_pack(str(model_dir), "w8a8", str(out), **FAST)
    assert read_manifest(out)["recipe"]["name"] == before
    # an interrupted --force write keeps the old checkpoint
    import quantkit.checkpoint.writer as writer

    def boom(*a, **k):
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(writer, "write_shards", boom)
    with pytest.raises(RuntimeError):
        run_pack(str(model_dir), "w8a8", str(out), force=True, **FAST)
    assert read_manifest(out)["recipe"]["name"] == before and not _leftovers(tmp_path)
    monkeypatch.undo()
    run_pack(str(model_dir), "w8a8", str(out), force=True, **FAST)
    assert read_manifest(out)["recipe"]["name"] == "w8a8" and verify_checkpoint(out) == []
    assert not _leftovers(tmp_path)
    other = tmp_path / "not-a-checkpoint"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(QuantkitError, match="not a quantkit checkpoint"):
        run_pack(str(model_dir), "w8a8", str(other), force=True, **FAST)
    assert (other / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize("text,size", [("500MB", 500 * 10 ** 6), ("2GB", 2 * 10 ** 9), ("1.5GiB", 3 * 2 ** 29),
                                       ("300kb", 300_000), ("1024", 1024), (4096, 4096)])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "2 GBs", "-1MB", "0", "lots"])
def test_parse_size_rejects(text):
    with pytest.raises(QuantkitError, match="max-shard-size"):
        parse_size(text)


# ------------------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("recipe,use_plan", [("lqq-w4a8", False), ("gptq", False), ("mixllm-w4a8-rtn", True)])
def test_gpu_pack_sm90_equals_fake_quant_on_gpu(gptq_recipe, tmp_path, monkeypatch, recipe, use_plan):
    """builtin:reference (fp16 source) packed for sm90 with quantization on the GPU, evaluated in fp16 on the GPU
    through the torch reference (QUANTKIT_KERNELS=0): the same perplexity and logits as fake-quant on the GPU
    (data-free codes are computed on the CPU by pack and on the GPU by fake-quant — grid divides by device tensors
    so both agree)."""
    monkeypatch.setenv(dispatch.ENV_SWITCH, "0")
    from quantkit.data import joined_text
    from quantkit.data.tokens import encode
    from quantkit.eval import perplexity

    recipe = gptq_recipe if recipe == "gptq" else recipe
    plan = None
    if use_plan:
        plan = str(tmp_path / "plan.json")
        run_search("builtin:reference", plan, "mixllm-w4a8-rtn", strategy="random", target_bits=4.4, samples=2,
                   seqlen=64, device="cuda", show_progress=False)
    out = tmp_path / "ck"
    run_pack("builtin:reference", recipe, str(out), plan=plan, target="sm90", device="cuda", progress=False)
    packed = load_packed(out, device="cuda")
    ref = load_model("builtin:reference", device="cuda")
    quantize_model(ref.model, ref.tokenizer, load_recipe(recipe), plan=load_plan(plan, ref.model) if plan else None,
                   device="cuda")
    ids = encode(packed.tokenizer, joined_text("kjv", "test"))
    assert perplexity(packed.model, ids, 256, 8).ppl == perplexity(ref.model, ids, 256, 8).ppl
    x = _ids(8192).cuda()
    with torch.no_grad():
        assert torch.equal(packed.model(x).logits, ref.model(x).logits)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_kernels_are_dispatched(tmp_path, monkeypatch):
    """With the kernel package registered, a W4.4A8 LQQ/w8 checkpoint runs the kernels of its layouts on the GPU
    (each layout's kernel is called) and its perplexity stays within a coarse 1% of the torch reference path's
    (kernels accumulate in another order than torch's GEMM; a wrong layout or scatter is far outside this)."""
    from transformers import AutoTokenizer

    from quantkit.data import joined_text
    from quantkit.data.tokens import encode
    from quantkit.eval import perplexity

    if not dispatch.load_kernel_modules():
        pytest.skip("quantkit.runtime.kernels is not importable here")
    plan = str(tmp_path / "plan.json")
    run_search("builtin:reference", plan, "lqq-w4a8", strategy="random", target_bits=4.4, samples=2, seqlen=64,
               device="cuda", show_progress=False)
    out = tmp_path / "ck"
    run_pack("builtin:reference", "lqq-w4a8", str(out), plan=plan, target="sm90", device="cuda", progress=False)
    model = load_packed(out, device="cuda").model
    calls: dict[str, int] = {}
    for (layout, dev), kernel in list(dispatch.registered().items()):
        if dev == "cuda":
            def counted(x, tensors, meta, act, _fn=kernel.fn, _layout=layout, **kw):
                calls[_layout] = calls.get(_layout, 0) + 1
                return _fn(x, tensors, meta, act, **kw)
            # no prepared launches: every call goes through the counted entry
            monkeypatch.setitem(dispatch._KERNELS, (layout, dev), dataclasses.replace(kernel, fn=counted, bind=None))
    mixed = dispatch.registered_mixed().get("cuda")
    if mixed is not None:  # the one-launch W4.4A8 kernel counts as a call of each of its partitions' layouts
        def counted_mixed(x, parts, n, act, _fn=mixed.fn, **kw):
            for part in parts:
                calls[part[0]] = calls.get(part[0], 0) + 1
            return _fn(x, parts, n, act, **kw)
        monkeypatch.setitem(dispatch._MIXED, "cuda", dataclasses.replace(mixed, fn=counted_mixed, bind=None))
    ids = encode(AutoTokenizer.from_pretrained(out), joined_text("kjv", "test"))
    with_kernels = perplexity(model, ids, 256, 8).ppl
    layouts = {p["layout"] for lin in read_manifest(out)["linears"].values() for p in lin["partitions"]}
    print(f"kernel calls {calls}, layouts {layouts}")
    assert set(calls) == layouts - {"reference"}
    monkeypatch.setenv(dispatch.ENV_SWITCH, "0")
    reference = perplexity(model, ids, 256, 8).ppl
    print(f"ppl with kernels {with_kernels!r}, torch reference {reference!r}")
    assert abs(with_kernels - reference) / reference < 1e-2


def test_asymmetric_gptq_v1_export_says_who_loads_it(model_dir, tmp_path):
    """GPTQModel.load() refuses asymmetric v1 files it did not write itself (a producer check, checked against
    GPTQModel 7.7); transformers and vLLM read them. The export says so and names --format gptq_v2."""
    warned = run_pack(str(model_dir), "rtn-w4a16-g128", str(tmp_path / "v1"), export="gptq", **FAST)["warnings"]
    assert any("GPTQModel.load() refuses asymmetric v1" in w and "--format gptq_v2" in w for w in warned)
    # in_features 64 and 200 are no multiples of 128: the engines refuse those layers (quantkit stores ceil(K/128))
    assert any(w.startswith("14 linear(s), e.g. 'model.layers.0.self_attn.q_proj' (in_features 64), have "
                            "in_features that are not a multiple of the group size 128") for w in warned)
    sym = tmp_path / "sym.yaml"
    sym.write_text("name: sym4\nweight: {method: rtn, bits: 4, group_size: 8, sym: true}\n")
    assert run_pack(str(model_dir), str(sym), str(tmp_path / "s"), export="gptq", **FAST)["warnings"] == []
