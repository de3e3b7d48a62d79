"""Residual rotation (quantkit.quant.rotate): orthogonal Q, the rotated model computes the same function (tied and
untied embeddings, all families), per-token A8 loses less, and a packed rotated model equals its fake-quant."""

from __future__ import annotations

import pytest
import torch

from quantkit.quant.act import attach_act_quant, remove_hooks
from quantkit.quant.rotate import hadamard, rotate_model, rotation_matrix
from tests.layerquant_helpers import correlated_tiny_model, token_ids


@pytest.mark.parametrize("n", [1, 2, 64, 576, 96, 9])
def test_rotation_is_orthogonal_and_deterministic(n):
    q = rotation_matrix(n, seed=3)
    torch.testing.assert_close(q @ q.T, torch.eye(n, dtype=torch.float64), rtol=0, atol=1e-12)
    assert torch.equal(q, rotation_matrix(n, seed=3)) and (n < 8 or not torch.equal(q, rotation_matrix(n, seed=4)))
    if n & (n - 1) == 0:  # a power of two: a signed Hadamard, every entry ±1/√n
        torch.testing.assert_close(q.abs(), torch.full((n, n), n ** -0.5, dtype=torch.float64))
    with pytest.raises(ValueError, match="power-of-two"):
        hadamard(12)


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("arch,tied", [("llama", True), ("llama", False), ("qwen2", True), ("qwen3", False),
                                       ("mistral", False)])
def test_rotation_keeps_the_function(arch, tied):
    model = correlated_tiny_model(arch, tie_word_embeddings=tied)
    ids = token_ids(model, 2, 24, seed=1)
    before = _logits(model, ids)
    rotate_model(model, seed=0)
    torch.testing.assert_close(_logits(model, ids), before, rtol=1e-4, atol=1e-4)
    assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight
    assert not model.config.tie_word_embeddings
    assert bool((model.model.layers[0].input_layernorm.weight == 1).all())


def test_rotation_cuts_the_per_token_a8_error():
    model = correlated_tiny_model("llama", seed=2)
    ids = token_ids(model, 4, 32, seed=1)
    ref = _logits(model, ids)

    def a8_error():
        hooks = attach_act_quant(model, 8, -1, True)
        try:
            return float((_logits(model, ids) - ref).pow(2).mean())
        finally:
            remove_hooks(hooks)

    plain = a8_error()
    rotate_model(model, seed=0)
    assert a8_error() < 0.7 * plain


def test_packed_rotated_model_equals_fake_quant(tiny_model_dir, tmp_path):
    """The rotated, untied checkpoint loads back into the same logits as the in-memory fake-quant model."""
    from quantkit.checkpoint.reader import load_packed
    from quantkit.model import load_model
    from quantkit.pack import run_pack
    from quantkit.quant.apply import quantize_model
    from quantkit.quant.recipe import load_recipe

    model_dir = tiny_model_dir("llama", tie_word_embeddings=True)
    recipe = tmp_path / "rot.yaml"
    recipe.write_text("name: rot\nweight: {method: rtn, bits: 8, group_size: -1, sym: true}\n"
                      "activation: {bits: 8, group_size: -1, sym: true, rotate: true}\n")
    ids = torch.randint(0, 500, (2, 19), generator=torch.Generator().manual_seed(0))
    loaded = load_model(str(model_dir), device="cpu")
    quantize_model(loaded.model, loaded.tokenizer, load_recipe(str(recipe)), device="cpu")
    want = _logits(loaded.model, ids)
    run_pack(str(model_dir), str(recipe), str(tmp_path / "out"), device="cpu", progress=False)
    got = _logits(load_packed(tmp_path / "out", device="cpu", load_tokenizer=False).model, ids)
    assert torch.equal(got, want)


def _dense_online(n: int, seed: int) -> torch.Tensor:
    """Q of InputRotation(n, seed) as a dense matrix, built the plain way: diag(s)·kron(factors)."""
    from quantkit.quant.rotate import online_factors

    gen = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (n,), generator=gen, dtype=torch.float64) * 2 - 1
    k = torch.ones(1, 1, dtype=torch.float64)
    for f in online_factors(n):
        k = torch.kron(k, f)
    return signs.unsqueeze(1) * k


@pytest.mark.parametrize("n", [1, 7, 64, 576, 1536, 14336 // 16])
def test_online_rotation_is_the_dense_orthogonal_product(n):
    """x·Q by factors equals x times the dense diag(s)·(H ⊗ … ⊗ C), Q is orthogonal, fold(W) = W·Q, and M = 1 and
    3-D inputs work (float64, so the comparison is tight)."""
    from quantkit.quant.rotate import ONLINE_MAX_FACTOR, InputRotation, online_factors

    q = _dense_online(n, seed=5)
    torch.testing.assert_close(q @ q.T, torch.eye(n, dtype=torch.float64), rtol=0, atol=1e-12)
    assert all(f.shape[0] <= ONLINE_MAX_FACTOR for f in online_factors(n))
    rot = InputRotation(n, seed=5, dtype=torch.float64)
    for shape in [(1, n), (3, 5, n)]:
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        torch.testing.assert_close(rot(x), x @ q, rtol=0, atol=1e-12)
    w = torch.randn(9, n, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    torch.testing.assert_close(rot.fold(w), w @ q, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="width"):
        rot(torch.zeros(2, n + 1, dtype=torch.float64))


def test_online_rotation_keeps_the_function_and_cuts_the_down_proj_a8_error():
    """Folding W·Q into o_proj / down_proj with the x ↦ x·Q hook leaves the logits unchanged, and per-token A8 of
    those inputs loses less than without it."""
    from quantkit.quant.rotate import rotate_inputs_online

    model = correlated_tiny_model("llama", seed=2)
    ids = token_ids(model, 4, 32, seed=1)
    ref = _logits(model, ids)
    layer = model.model.layers[0]

    def a8_error():
        hooks = attach_act_quant({"o": layer.self_attn.o_proj, "d": layer.mlp.down_proj}, 8, -1, True)
        try:
            return float((_logits(model, ids) - ref).pow(2).mean())
        finally:
            remove_hooks(hooks)

    plain = a8_error()
    names = rotate_inputs_online(model, seed=0)
    assert names[:2] == ["model.layers.0.self_attn.o_proj", "model.layers.0.mlp.down_proj"]
    torch.testing.assert_close(_logits(model, ids), ref, rtol=1e-4, atol=1e-4)
    assert a8_error() < plain


def test_online_rotation_refuses_a_skipped_target():
    from quantkit.errors import QuantkitError
    from quantkit.quant.rotate import rotate_inputs_online

    model = correlated_tiny_model("llama", seed=2)
    with pytest.raises(QuantkitError, match="skips it"):
        rotate_inputs_online(model, skipped={"model.layers.1.mlp.down_proj"})


@pytest.mark.parametrize("weight,act", [
    ("{method: rtn, bits: 8, group_size: -1, sym: true}", "{bits: 8, group_size: -1, sym: true, smooth: 0.5, "),
    ("{method: gptq, bits: 4, group_size: 32}", "{bits: 8, group_size: -1, sym: true, smooth: 0.5, "),
    ("{method: gptq, bits: 4, group_size: 32}", "{bits: 16, ")])  # weight-only: rotations with GPTQ
def test_packed_online_rotated_model_equals_fake_quant(tiny_model_dir, tmp_path, weight, act):
    """A checkpoint whose o_proj / down_proj inputs rotate online (with the residual rotation, and with A8 also
    SmoothQuant's norm folds) loads back into the fake-quant model's logits bit for bit; its manifest is format
    version 2."""
    from quantkit.checkpoint.manifest import read_manifest
    from quantkit.checkpoint.reader import load_packed
    from quantkit.model import load_model
    from quantkit.pack import run_pack
    from quantkit.quant.apply import quantize_model
    from quantkit.quant.recipe import load_recipe

    model_dir = tiny_model_dir("llama")
    recipe = tmp_path / "rot.yaml"
    recipe.write_text(f"name: rot\nweight: {weight}\nactivation: {act}rotate: true, online_rotate: true}}\n"
                      "calibration: {dataset: kjv, samples: 4, seqlen: 32}\n")
    ids = torch.randint(0, 500, (2, 19), generator=torch.Generator().manual_seed(0))
    loaded = load_model(str(model_dir), device="cpu")
    res = quantize_model(loaded.model, loaded.tokenizer, load_recipe(str(recipe)), device="cpu")
    assert len(res.online_rotation["linears"]) == 2 * len(loaded.model.model.layers)
    want = _logits(loaded.model, ids)
    run_pack(str(model_dir), str(recipe), str(tmp_path / "out"), device="cpu", progress=False)
    manifest = read_manifest(tmp_path / "out")
    assert manifest["format_version"] == 2
    assert manifest["linears"]["model.layers.0.mlp.down_proj"]["input_rotation"]["seed"] == 0
    assert "input_rotation" not in manifest["linears"]["model.layers.0.mlp.up_proj"]
    got = _logits(load_packed(tmp_path / "out", device="cpu", load_tokenizer=False).model, ids)
    assert torch.equal(got, want)


def test_online_rotation_is_refused_with_awq_and_in_engine_exports(tmp_path):
    from quantkit.checkpoint.choose import check_recipe_export
    from quantkit.errors import QuantkitError
    from quantkit.quant.recipe import load_recipe

    r = tmp_path / "r.yaml"
    r.write_text("name: r\nweight: {method: awq, bits: 4}\nactivation: {bits: 16, online_rotate: true}\n")
    with pytest.raises(QuantkitError, match="does not combine with weight.method awq"):
        load_recipe(str(r))
    r.write_text("name: r\nweight: {method: gptq, bits: 4}\nactivation: {bits: 16, online_rotate: true}\n")
    with pytest.raises(QuantkitError, match="rotated at run time"):
        check_recipe_export(load_recipe(str(r)), "gptq", False)
    r.write_text("name: r\nweight: {method: gptq, bits: 4}\nactivation: {bits: 16, rotate: true}\n")
    check_recipe_export(load_recipe(str(r)), "gptq", False)  # the residual rotation is folded: exportable
