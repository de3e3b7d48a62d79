"""Whole-model quantization per recipe: the written (fake-quant) weights are exactly the records' dequantization."""

from __future__ import annotations

import pytest
import torch

from quantkit.model import iter_linears
from quantkit.errors import QuantkitError
from quantkit.quant.apply import quantize_model
from quantkit.quant.partition import dequantize_record, quantize_partitioned, split_rows
from quantkit.quant.recipe import load_recipe, parse_recipe
from quantkit.quant.records import PartitionedWeight
from quantkit.quant.rtn import rtn_quantize
from tests.conftest import build_tiny_model, shipped_tokenizer


def _check_written(model, result):
    for name, lin in iter_linears(model):
        assert torch.equal(lin.weight.data, dequantize_record(result.weights[name], lin.weight.dtype)), name


@pytest.mark.parametrize("recipe", ["rtn-w4a16-g128", "w8a8", "lqq-w4a8-rtn"])
def test_data_free_recipes(recipe):
    model = build_tiny_model("llama", seed=3)
    res = quantize_model(model, None, load_recipe(recipe), device="cpu")
    _check_written(model, res)
    assert res.avg_bits == load_recipe(recipe).weight.bits
    assert bool(res.act_handles) == load_recipe(recipe).activation.enabled


def test_partitioned_rows_match_per_subset_quantization():
    torch.manual_seed(0)
    w = torch.randn(33, 200)
    row_bits = torch.full((33,), 4)
    row_bits[[0, 5, 17, 32]] = 8
    rec = quantize_partitioned(w, row_bits, lambda sub, b: rtn_quantize(sub, b, 128, sym=b == 8))
    assert isinstance(rec, PartitionedWeight)
    dense = dequantize_record(rec)
    for b, rows in split_rows(row_bits).items():
        ref = dequantize_record(rtn_quantize(w[rows], b, 128, sym=b == 8))
        assert torch.equal(dense[rows], ref)


def test_clip_recipe_runs_layerwise_and_records_calibration():
    model = build_tiny_model("qwen2", seed=4, vocab_size=len(shipped_tokenizer()))
    recipe = parse_recipe({"weight": {"method": "rtn", "bits": 3, "clip": True},
                           "calibration": {"samples": 4, "seqlen": 32}})
    res = quantize_model(model, shipped_tokenizer(), recipe, device="cpu")
    _check_written(model, res)
    assert res.calibration == {"dataset": "kjv+pydoc", "samples": 4, "seqlen": 32, "seed": 0}
    assert all(r.meta["clip"] == "output" for r in res.weights.values())


def test_shipped_gptq_recipe_uses_static_act_order():
    """gptq-w4a16-g128 sweeps the columns by descending diag(H) with every group's grid fixed up front on the
    original column order (GPTQ's static-groups act-order, llm-compressor's default): act-order's sweep without a
    g_idx, so the records keep consecutive groups and the written weights are their dequantization."""
    recipe = load_recipe("gptq-w4a16-g128")
    assert recipe.weight.act_order and recipe.weight.static_groups
    model = build_tiny_model("llama", seed=6, vocab_size=len(shipped_tokenizer()))
    res = quantize_model(model, shipped_tokenizer(), recipe, device="cpu", samples=4, seqlen=32)
    _check_written(model, res)
    for name, rec in res.weights.items():
        assert rec.meta["act_order"] and rec.meta["static_groups"] and rec.g_idx is None, name


def test_calibration_inputs_take_explicit_options_literally():
    """0 windows is an error, not "the recipe's default" (falsy-or would have swallowed it)."""
    from quantkit.quant.apply import calibration_inputs
    from quantkit.quant.recipe import load_recipe

    rec = load_recipe("gptq-w4a16-g128")
    with pytest.raises(QuantkitError, match="--calib-samples must be at least 1, got 0"):
        calibration_inputs(None, rec, None, samples=0)


@pytest.mark.parametrize("weight", [{"method": "gptq", "grid": "lqq"}, {"method": "lqq", "clip": True}])
def test_lqq_grid_recipes_write_what_the_kernel_reads(weight):
    """GPTQ on the LiquidQuant grid and the searched LiquidQuant fit give two-level records (the w4a8-lqq layout)
    whose dequantization is exactly the weights written into the model; SmoothQuant folds run first."""
    from quantkit.checkpoint.choose import kernel_layout

    model = build_tiny_model("llama", seed=5, vocab_size=len(shipped_tokenizer()))
    recipe = parse_recipe({"weight": weight, "activation": {"bits": 8, "group_size": -1, "smooth": 0.5},
                           "calibration": {"samples": 4, "seqlen": 32}})
    norm_before = model.model.layers[0].input_layernorm.weight.clone()
    res = quantize_model(model, shipped_tokenizer(), recipe, device="cpu")
    _check_written(model, res)
    assert all(kernel_layout(r) == "w4a8-lqq" for r in res.weights.values())
    assert not torch.equal(model.model.layers[0].input_layernorm.weight, norm_before)  # smoothing folded
