"""Recipes: every shipped one parses; malformed ones name the offending field."""

from __future__ import annotations

import pytest

from quantkit.errors import QuantkitError
from quantkit.quant.recipe import load_recipe, parse_recipe, shipped_recipes

REQUIRED = {"rtn-w4a16-g128", "gptq-w4a16-g128", "awq-w4a16-g128", "lqq-w4a8", "lqq-w4a8-rtn", "mixllm-w4a8", "w8a8",
            "mixllm-lqq-w4a8", "smoothquant-w8a8", "smoothquant-w8a8-g128", "quarot-w8a8"}


def test_shipped_recipes_parse():
    names = set(shipped_recipes())
    assert REQUIRED <= names
    for n in names:
        r = load_recipe(n)
        assert r.name == n


def test_mixllm_configuration():
    r = load_recipe("mixllm-w4a8")
    low, high = r.spec_for("model.layers.0.mlp.up_proj"), r.spec_for("model.layers.0.mlp.up_proj", 8)
    assert (low.bits, low.group_size, low.sym) == (4, 128, False)  # MixLLM Sec. 4.1: 4-bit asym g128
    assert (high.bits, high.group_size, high.sym) == (8, 128, True)  # 8-bit sym g128
    assert r.activation.enabled and r.activation.bits == 8 and r.activation.group_size == 128


def test_overrides_by_pattern(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("weight: {method: rtn, bits: 4}\noverrides:\n  - {pattern: '*.down_proj', bits: 8, sym: true}\n"
                 "  - {pattern: 'model.layers.0.*', skip: true}\n")
    r = load_recipe(str(f))
    assert r.spec_for("model.layers.3.mlp.down_proj").bits == 8
    assert r.spec_for("model.layers.3.mlp.up_proj").bits == 4
    assert r.spec_for("model.layers.0.mlp.up_proj").skip
    names = ["model.layers.0.mlp.up_proj", "model.layers.3.mlp.down_proj"]
    assert r.unmatched_overrides(names) == []
    assert r.unmatched_overrides(["model.layers.3.mlp.up_proj"]) == ["*.down_proj", "model.layers.0.*"]


@pytest.mark.parametrize("data,field", [
    ({"weight": {"method": "xyz"}}, "weight.method"),
    ({"weight": {"method": "rtn", "bits": 9}}, "weight.bits"),
    ({"weight": {"method": "rtn", "bits": "four"}}, "weight.bits"),
    ({"weight": {"method": "rtn", "group_size": 0}}, "weight.group_size"),
    ({"weight": {"method": "rtn", "colour": 1}}, "weight.colour"),
    ({"weight": {"method": "rtn"}, "activation": {"bits": 3.5}}, "activation.bits"),
    ({"weight": {"method": "rtn"}, "overrides": [{"bits": 8}]}, "overrides[0]"),
    ({"weight": {"method": "rtn"}, "extra": 1}, "extra"),
    ({"activation": {"bits": 8}}, "weight"),
    ({"weight": {"method": "lqq", "bits": 8}}, "weight.bits"),
    ({"weight": {"method": "rtn"}, "calibration": {"seqlen": 1}}, "calibration.seqlen"),
    ({"weight": {"method": "awq", "search_tokens": 0}}, "weight.search_tokens"),
    ({"weight": {"method": "awq", "search_tokens": "all"}}, "weight.search_tokens"),
    ({"weight": {"method": "gptq", "grid": "nf4"}}, "weight.grid"),
    ({"weight": {"method": "awq", "grid": "lqq"}}, "weight.grid: lqq"),
    ({"weight": {"method": "gptq", "grid": "lqq", "bits": 3}}, "weight.bits"),
    ({"weight": {"method": "rtn", "bits": 8}, "activation": {"bits": 8, "smooth": -0.1}}, "activation.smooth"),
    ({"weight": {"method": "rtn", "bits": 8}, "activation": {"bits": 8, "smooth": "yes"}}, "activation.smooth"),
    ({"weight": {"method": "rtn"}, "lm_head": "yes"}, "lm_head"),
])
def test_malformed_recipe_names_the_field(data, field):
    with pytest.raises(QuantkitError, match=f"'{field}'".replace("[", r"\[").replace("]", r"\]")):
        parse_recipe(data, "test.yaml")


def test_incomplete_and_out_of_range_messages_say_what_is_needed():
    with pytest.raises(QuantkitError, match="'overrides\\[0\\]' is incomplete: it needs 'pattern'$"):
        parse_recipe({"weight": {"method": "rtn"}, "overrides": [{"bits": 8}]}, "test.yaml")
    # an empty list item (YAML 'overrides:' then a bare '-') is an override with no fields, not a traceback
    with pytest.raises(QuantkitError, match="'overrides\\[0\\]' is incomplete: it needs 'pattern'$"):
        parse_recipe({"weight": {"method": "rtn"}, "overrides": [None]}, "test.yaml")
    with pytest.raises(QuantkitError, match="'calibration.seqlen' \\(≥ 2 tokens\\) are out of range: 128, 1"):
        parse_recipe({"weight": {"method": "rtn"}, "calibration": {"samples": 128, "seqlen": 1}}, "test.yaml")


def test_unknown_recipe_and_bad_yaml(tmp_path):
    with pytest.raises(QuantkitError, match="unknown recipe 'nope'; shipped:"):
        load_recipe("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("weight: {method: rtn\n")
    with pytest.raises(QuantkitError, match="not valid YAML"):
        load_recipe(str(bad))


def test_lm_head_is_off_unless_asked_and_round_trips():
    assert not load_recipe("rtn-w4a16-g128").lm_head and "lm_head" not in load_recipe("rtn-w4a16-g128").to_dict()
    assert not parse_recipe({"weight": {"method": "rtn"}, "lm_head": None}, "test.yaml").lm_head  # 'lm_head:' alone
    r = parse_recipe({"weight": {"method": "rtn"}, "lm_head": True}, "test.yaml")
    assert r.lm_head and parse_recipe(r.to_dict(), "test.yaml").lm_head


def test_a_recipe_round_trips_through_json_as_manifests_store_it():
    """A checkpoint manifest stores the recipe as JSON, whose keys are strings: it parses back to the same recipe."""
    import json

    for n in shipped_recipes():
        r = load_recipe(n)
        assert parse_recipe(json.loads(json.dumps(r.to_dict())), n).to_dict() == r.to_dict(), n


def test_awq_search_tokens_reach_the_layer_config():
    """The AWQ recipe's α search reads a quarter of its calibration tokens (same ppl as all of them, BENCHMARKS);
    null searches on every token."""
    from quantkit.quant.apply import _layer_config

    rec = load_recipe("awq-w4a16-g128")
    assert rec.weight.search_tokens == 16384 == _layer_config(rec, "awq").search_tokens
    every = parse_recipe({"weight": {"method": "awq", "search_tokens": None}}, "t.yaml")
    assert _layer_config(every, "awq").search_tokens is None


def test_lqq_grid_resolves_per_bit_width():
    """A plan's 8-bit rows of a LiquidQuant recipe fall back to the affine grid; the GPTQ config carries it."""
    from quantkit.quant.apply import _layer_config

    rec = parse_recipe({"weight": {"method": "gptq", "grid": "lqq"}, "bit_specs": {8: {"sym": True,
                                                                                       "group_size": -1}}})
    assert rec.spec_for("x").grid == "lqq" and rec.spec_for("x", 8).grid == "affine"
    assert rec.spec_for("x", 8).method == "gptq"
    config = _layer_config(rec, "gptq")
    assert config.lqq and config.partition_spec("x", 4).lqq and not config.partition_spec("x", 8).lqq
    plain = parse_recipe({"weight": {"method": "lqq"}})
    assert plain.spec_for("x").grid == "lqq" and plain.spec_for("x", 8).method == "rtn"
