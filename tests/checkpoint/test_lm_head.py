"""Recipe ``lm_head: true``: the output projection quantized too (4-bit g128 asymmetric, weight-only; GPTQ in GPTQ
recipes, else round to nearest), untied from the input embeddings; packed, it loads as a QuantLinear on unquantized
inputs and gives the fake-quant model's logits exactly."""

from __future__ import annotations

import json

import pytest
import torch

from quantkit.checkpoint import load_packed, read_manifest
from quantkit.errors import QuantkitError
from quantkit.model import load_model
from quantkit.pack import estimate_bytes, run_pack
from quantkit.quant.apply import quantize_model
from quantkit.quant.grid import dequantize
from quantkit.quant.recipe import LM_HEAD_BITS, LM_HEAD_GROUP, load_recipe
from quantkit.quant.rtn import rtn_quantize
from quantkit.runtime import QuantLinear
from tests.conftest import build_tiny_model, shipped_tokenizer

FAST = dict(device="cpu", progress=False)
RECIPES = {  # the shipped recipe of the same name with lm_head: true
    "rtn-w4a16-g128": "weight: {method: rtn, bits: 4, group_size: 128, sym: false}\n",
    "gptq-w4a16-g128": "weight: {method: gptq, bits: 4, group_size: 128, sym: false, act_order: true}\n"
                       "calibration: {samples: 4, seqlen: 32}\n",
    "lqq-w4a8-rtn": "weight: {method: lqq, bits: 4, group_size: 128, sym: false}\n"
                    "activation: {bits: 8, group_size: -1, sym: true}\n",
}


@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory):
    """A tiny Qwen2 with tied embeddings (its lm_head reads the embedding matrix), 96-wide so the head has a last
    group shorter than 128."""
    d = tmp_path_factory.mktemp("tied")
    tok = shipped_tokenizer()
    build_tiny_model("qwen2", seed=3, vocab_size=len(tok), hidden_size=96, tie_word_embeddings=True).save_pretrained(d)
    tok.save_pretrained(d)
    return d


def _recipe(tmp_path, base: str) -> str:
    path = tmp_path / f"{base}-head.yaml"
    path.write_text(f"name: {base}-head\n" + RECIPES[base] + "lm_head: true\n")
    return str(path)


def _ids(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 29), generator=torch.Generator().manual_seed(1))


def _fake_quant_logits(model_dir, recipe: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids, the logits of the model quantized in place by ``recipe``) — what a packed checkpoint must give."""
    ids = _ids(len(shipped_tokenizer()))
    loaded = load_model(str(model_dir), device="cpu")
    quantize_model(loaded.model, loaded.tokenizer, load_recipe(recipe), device="cpu")
    with torch.no_grad():
        return ids, loaded.model(ids).logits


def test_the_head_is_quantized_by_rtn_and_the_embeddings_are_untouched(tied_dir, tmp_path):
    loaded = load_model(str(tied_dir), device="cpu")
    model = loaded.model
    embed = model.get_input_embeddings().weight.detach().clone()
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    result = quantize_model(model, loaded.tokenizer, load_recipe(_recipe(tmp_path, "rtn-w4a16-g128")), device="cpu")
    want = dequantize(rtn_quantize(embed.float(), LM_HEAD_BITS, LM_HEAD_GROUP, False))
    assert torch.equal(model.lm_head.weight.detach().float(), want.to(model.lm_head.weight.dtype).float())
    assert torch.equal(model.get_input_embeddings().weight, embed)  # untied first: the embeddings stay exact
    assert model.config.tie_word_embeddings is False
    assert result.weight_only == ["lm_head"] and "lm_head" in result.weights
    assert result.avg_bits == 4.0


@pytest.mark.parametrize("base", ["rtn-w4a16-g128", "lqq-w4a8-rtn", "gptq-w4a16-g128"])
def test_a_packed_quantized_head_gives_the_fake_quant_logits(tied_dir, tmp_path, base):
    recipe = _recipe(tmp_path, base)
    ids, want = _fake_quant_logits(tied_dir, recipe)
    out = tmp_path / "out"
    summary = run_pack(str(tied_dir), recipe, str(out), **FAST)
    manifest = read_manifest(out)
    assert manifest["linears"]["lm_head"]["activation"] is None
    assert manifest["format_version"] == 3
    assert "model.embed_tokens.weight" in manifest["tensors"] and not manifest["aliases"]
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is False
    model = load_packed(out, device="cpu", verify=True, load_tokenizer=False).model
    assert isinstance(model.lm_head, QuantLinear) and model.lm_head.act is None
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want)
    fp = load_model(str(tied_dir), device="cpu").model
    assert estimate_bytes(fp, load_recipe(recipe), None, torch.float32) <= summary["bytes_on_disk"]
    assert "w4a16 W4A16" in " ".join(summary["layout_schemes"]) or "reference W4A16" in " ".join(
        summary["layout_schemes"])  # the head's scheme names no activation bits


def test_gptq_recipes_solve_the_head_on_the_final_norms_outputs(tied_dir, tmp_path):
    """GPTQ's head: the Hessian of final_norm(last layer's outputs) over the calibration windows; its output error
    on those inputs is below round-to-nearest's (GPTQ's objective), and the codes differ from RTN's."""
    from quantkit.model.layerwise import run_layerwise
    from quantkit.quant.apply import calibration_inputs, quantize_lm_head
    from quantkit.quant.partition import dequantize_record

    recipe = load_recipe(_recipe(tmp_path, "gptq-w4a16-g128"))
    loaded = load_model(str(tied_dir), device="cpu")
    model = loaded.model
    ids, _ = calibration_inputs(loaded.tokenizer, recipe, 256)
    with torch.no_grad():
        hidden = run_layerwise(model, ids, "cpu")
        x = model.model.norm(hidden).reshape(-1, hidden.shape[-1])
    w = model.lm_head.weight.detach().clone().float()
    _, gptq = quantize_lm_head(model, recipe, hidden, "cpu")
    rtn = rtn_quantize(w, LM_HEAD_BITS, LM_HEAD_GROUP, False)
    err = {name: float((x @ (dequantize_record(r) - w).t()).square().sum()) for name, r in (("gptq", gptq),
                                                                                             ("rtn", rtn))}
    assert err["gptq"] < err["rtn"] and not torch.equal(gptq.codes, rtn.codes)


@pytest.mark.parametrize("base,export", [("gptq-w4a16-g128", "gptq"), ("rtn-w4a16-g128", "awq")])
def test_engine_exports_mark_the_quantized_head_for_vllm(tied_dir, tmp_path, base, export):
    """GPTQ and AWQ checkpoints hold the head in their own layout and say so in quantization_config (``lm_head``,
    the key vLLM and GPTQModel read); quantkit loads them to the fake-quant logits."""
    recipe = _recipe(tmp_path, base)
    ids, want = _fake_quant_logits(tied_dir, recipe)
    out, said = tmp_path / export, []
    run_pack(str(tied_dir), recipe, str(out), export=export, warn=said.append, **FAST)
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["lm_head"] is True and any("lm_head: true" in w for w in said)
    assert {f"lm_head.{t}" for t in ("qweight", "qzeros", "scales")} <= set(read_manifest(out)["tensors"])
    model = load_packed(out, device="cpu", load_tokenizer=False).model
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want)


def test_exports_on_another_grid_and_streaming_refuse_a_quantized_head(tied_dir, tmp_path):
    sym = tmp_path / "sym-head.yaml"
    sym.write_text("name: sym-head\nweight: {method: rtn, bits: 4, group_size: 128, sym: true}\nlm_head: true\n")
    with pytest.raises(QuantkitError, match="quantized lm_head is 4-bit g128 asymmetric, the other layers 4-bit g128 symmetric"):
        run_pack(str(tied_dir), str(sym), str(tmp_path / "gptq"), export="gptq", **FAST)
    recipe = _recipe(tmp_path, "rtn-w4a16-g128")
    with pytest.raises(QuantkitError, match="lm_head: true\\): drop --stream/--resume, or lm_head"):
        run_pack(str(tied_dir), recipe, str(tmp_path / "stream"), stream=True, **FAST)
    assert not (tmp_path / "gptq").exists() and not (tmp_path / "stream").exists()


def test_bench_maps_the_head_to_the_weight_only_kernel(tied_dir, tmp_path):
    """``quantkit bench PACKED`` times what each linear runs: the head of an A8 checkpoint is W4A16."""
    from quantkit.bench.packed_targets import checkpoint_methods

    out = tmp_path / "sm90"
    run_pack(str(tied_dir), _recipe(tmp_path, "lqq-w4a8-rtn"), str(out), target="sm90", **FAST)
    manifest = read_manifest(out)
    assert {p["layout"] for p in manifest["linears"]["lm_head"]["partitions"]} == {"w4a16"}
    assert checkpoint_methods(manifest) == ["fp16", "w4a16", "w4a8-lqq+aq"]


def test_the_memory_plan_counts_the_head_and_untying_always_marks_the_config():
    from quantkit.model.memory_plan import ModelShape, pack_plan
    from quantkit.model.walk import untie_output_embeddings

    shape = ModelShape(10**6, 8 * 10**5, 10**5, 64, 256, 1000, 2, 2000, tied_head=True)
    base = pack_plan(shape, torch.float16, "cuda", True, 4, 32, 4.0)
    gptq = pack_plan(shape, torch.float16, "cuda", True, 4, 32, 4.0, "gptq")
    assert gptq.gpu_bytes >= 8 * 1000 * 64 > base.gpu_bytes and gptq.cpu_bytes == base.cpu_bytes + 2 * 1000 * 64
    assert gptq.disk_bytes == base.disk_bytes + 1000 * 64 // 2
    model = build_tiny_model("llama", seed=1)  # separate weights, a config that claims them tied
    model.config.tie_word_embeddings = True
    assert not untie_output_embeddings(model) and model.config.tie_word_embeddings is False
