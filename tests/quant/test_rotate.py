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
