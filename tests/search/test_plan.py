"""The plan file: end-to-end search → plan, determinism, schema round trip, validation and model mismatch errors,
reports and the CLI command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from quantkit.errors import QuantkitError
from quantkit.model import iter_linears, load_model
from quantkit.search.command import run_search
from quantkit.search.plan_check import load_plan
from quantkit.search.report import layer_grid, projection_shares, summary

RECIPE = "mixllm-w4a8-rtn"
FAST = dict(samples=2, seqlen=32, device="cpu", show_progress=False)


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir("llama", intermediate_size=200)


@pytest.fixture(scope="module")
def plan_path(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    run_search(str(model_dir), str(out), RECIPE, target_bits=4.4, **FAST)
    return out


def test_search_writes_a_valid_plan(plan_path, model_dir):
    model = load_model(str(model_dir), device="cpu", load_tokenizer=False).model
    plan = load_plan(plan_path, model)
    names = [n for n, _ in iter_linears(model)]
    assert list(plan.layers) == names
    assert plan.bits == [4, 8] and plan.default_bits == 4 and plan.target_bits == 4.4
    assert plan.calibration == {"source": "kjv+pydoc", "samples": 2, "seqlen": 32, "seed": 0, "tokens": 64}
    assert plan.search["strategy"] == "global" and plan.search["first_order"] is True
    assert plan.search["salience_quantizer"] == {"bits": 4, "group_size": 128, "sym": False, "clip": False,
                                                 "method": "rtn"}
    total = sum(lp.out_features * lp.in_features for lp in plan.layers.values())
    assert 4.4 - 4 * 200 / total < plan.achieved_bits <= 4.4
    assert plan.achieved_bits_with_metadata > plan.achieved_bits
    for name, lin in iter_linears(model):
        rb = plan.row_bits(name)
        assert rb.shape == (lin.out_features,) and set(rb.tolist()) <= {4, 8}
        parts = plan.partitions(name)
        assert torch.equal(torch.sort(torch.cat(list(parts.values()))).values, torch.arange(lin.out_features))
    assert plan.element_shares()[8] == pytest.approx((plan.achieved_bits - 4) / 4)


def test_same_inputs_same_bytes(plan_path, model_dir, tmp_path):
    again = tmp_path / "again.json"
    run_search(str(model_dir), str(again), RECIPE, target_bits=4.4, **FAST)
    assert again.read_bytes() == plan_path.read_bytes()
    other_seed = tmp_path / "seed1.json"
    run_search(str(model_dir), str(other_seed), RECIPE, target_bits=4.4, seed=1, **dict(FAST, samples=1))
    assert load_plan(other_seed).calibration["seed"] == 1


def test_round_trip_is_byte_identical(plan_path, tmp_path):
    plan = load_plan(plan_path)
    out = tmp_path / "copy.json"
    plan.save(out)
    assert out.read_bytes() == plan_path.read_bytes()
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic write left no temporary behind


def test_strategies_and_options(model_dir, plan_path, tmp_path):
    runs = {"global": load_plan(plan_path)}
    for strategy in ("local", "random", "magnitude"):
        out = tmp_path / f"{strategy}.json"
        runs[strategy] = run_search(str(model_dir), str(out), RECIPE, target_bits=4.4, strategy=strategy, **FAST)
        assert load_plan(out).search["strategy"] == strategy
    assert runs["random"].calibration is None and runs["magnitude"].calibration is None
    assert runs["random"].search["seed"] == 0
    local = runs["local"]
    for lp in local.layers.values():  # the same share in every layer
        assert len(lp.channels.get(8, [])) == int(0.1 * lp.out_features + 1e-9)
    # global concentrates 8-bit channels unevenly across layers, unlike local
    shares = [lp.stats["high_bit_share"] for lp in runs["global"].layers.values()]
    assert max(shares) - min(shares) > 0.1
    no_first = run_search(str(model_dir), str(tmp_path / "nf.json"), RECIPE, target_bits=4.4, first_order=False,
                          **FAST)
    assert no_first.search["first_order"] is False
    mix = run_search(str(model_dir), str(tmp_path / "mix.json"), RECIPE, bits="3,4,6", fractions="0.3,0.6,0.1",
                     **FAST)
    assert mix.bits == [3, 4, 6] and mix.default_bits == 4 and mix.fractions == [0.3, 0.6, 0.1]
    shares = mix.element_shares()
    assert shares[6] <= 0.1 and shares[3] >= 0.3


def test_seqlen_longer_than_the_model_is_an_error(model_dir, tmp_path):
    with pytest.raises(QuantkitError, match="exceeds the model's context length 256"):
        run_search(str(model_dir), str(tmp_path / "p.json"), RECIPE, samples=2, seqlen=300, device="cpu",
                   show_progress=False)


def test_bad_options(model_dir, tmp_path):
    with pytest.raises(QuantkitError, match="--bits must be a comma-separated list of ints"):
        run_search(str(model_dir), str(tmp_path / "p.json"), RECIPE, bits="4,eight", **FAST)
    with pytest.raises(QuantkitError, match="folder .* does not exist"):
        run_search(str(model_dir), str(tmp_path / "nope" / "p.json"), RECIPE, **FAST)
    # a missing model path proves these fail before anything loads
    with pytest.raises(QuantkitError, match="--calib-samples must be at least 1, got 0"):
        run_search(str(tmp_path / "no-model"), str(tmp_path / "p.json"), RECIPE, **dict(FAST, samples=0))
    with pytest.raises(QuantkitError, match="unknown dataset 'wikitxt'"):
        run_search(str(tmp_path / "no-model"), str(tmp_path / "p.json"), RECIPE, dataset="wikitxt", **FAST)


# ---------------------------------------------------------------------------------------------- mismatches

def _edit(plan_path, tmp_path, fn):
    d = json.loads(plan_path.read_text())
    fn(d)
    out = tmp_path / "edited.json"
    out.write_text(json.dumps(d))
    return out


def test_mismatch_other_weights(plan_path, tiny_model_dir):
    from conftest import build_tiny_model, shipped_tokenizer

    other = build_tiny_model("llama", seed=5, intermediate_size=200, vocab_size=len(shipped_tokenizer()))
    with pytest.raises(QuantkitError, match="weights of layer 'model.layers.0.self_attn.q_proj' differ"):
        load_plan(plan_path, other)


def test_mismatch_dtype_is_not_a_mismatch(plan_path, model_dir):
    model = load_model(str(model_dir), device="cpu", dtype="bf16", load_tokenizer=False).model
    assert load_plan(plan_path, model).default_bits == 4


def test_mismatch_config(plan_path, tiny_model_dir):
    model = load_model(str(tiny_model_dir("llama", intermediate_size=96)), device="cpu", load_tokenizer=False).model
    with pytest.raises(QuantkitError, match="config 'intermediate_size' is 200 in the plan, 96 in the model"):
        load_plan(plan_path, model)


def test_mismatch_layer_missing_and_shape(plan_path, model_dir, tmp_path):
    model = load_model(str(model_dir), device="cpu", load_tokenizer=False).model

    def rename(d):
        d["layers"][0]["name"] = "model.layers.0.self_attn.qq_proj"
    with pytest.raises(QuantkitError, match="layer 'model.layers.0.self_attn.qq_proj' is missing from the model"):
        load_plan(_edit(plan_path, tmp_path, rename), model)

    def drop(d):
        del d["layers"][3]
    with pytest.raises(QuantkitError, match="the model's layer 'model.layers.0.self_attn.o_proj' is not in the plan"):
        load_plan(_edit(plan_path, tmp_path, drop), model)

    def reshape(d):
        d["model"].pop("config")
        d["layers"][6]["in_features"] = 100
    with pytest.raises(QuantkitError, match="'model.layers.0.mlp.down_proj' is 64x100 in the plan, 64x200"):
        load_plan(_edit(plan_path, tmp_path, reshape), model)


# ---------------------------------------------------------------------------------------------- schema

def _set(path, value):
    def fn(d):
        *head, last = path
        for k in head:
            d = d[k]
        d[last] = value
    return fn


@pytest.mark.parametrize("edit,match", [
    (_set(["schema"], "other"), "not a quantkit plan"),
    (_set(["version"], 99), "newer than this quantkit reads"),
    (_set(["bits"], [8, 4]), "distinct ascending"),
    (_set(["default_bits"], 5), "'default_bits' 5 is not one of"),
    (_set(["layers", 0, "channels"], {"8": [3, 2]}), "not sorted ascending"),
    (_set(["layers", 0, "channels"], {"8": [0, 64]}), "index outside 0..63"),
    (_set(["layers", 0, "channels"], {"4": [1]}), "not a non-default bit-width"),
    (_set(["layers", 0, "out_features"], 0), "positive integers"),
    (_set(["achieved_bits"], "4.4"), "'achieved_bits' has the wrong type"),
    (lambda d: d.pop("layers"), "'layers' is missing"),
])
def test_schema_validation(plan_path, tmp_path, edit, match):
    with pytest.raises(QuantkitError, match=match):
        load_plan(_edit(plan_path, tmp_path, edit))


def test_unreadable_files(tmp_path):
    with pytest.raises(QuantkitError, match="does not exist"):
        load_plan(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(QuantkitError, match="not valid JSON"):
        load_plan(bad)
    empty = tmp_path / "empty.json"
    empty.write_text("{}")
    with pytest.raises(QuantkitError, match="not a quantkit plan"):
        load_plan(empty)


def test_unknown_layer(plan_path):
    with pytest.raises(QuantkitError, match="no entry for layer 'x'; re-run"):
        load_plan(plan_path).row_bits("x")


# ---------------------------------------------------------------------------------------------- reports, CLI

def test_reports(plan_path):
    plan = load_plan(plan_path)
    shares = projection_shares(plan)
    assert list(shares) == ["q", "k", "v", "o", "gate", "up", "down"]
    layers, kinds, grid = layer_grid(plan)
    assert layers == [0, 1] and kinds == list(shares)
    for k, kind in enumerate(kinds):
        assert shares[kind] == pytest.approx(sum(row[k] for row in grid) / len(grid))
    s = summary(plan, "p.json")
    assert s["achieved_bits"] == plan.achieved_bits and set(s["element_share"]) == {"4", "8"}


def test_heatmap(plan_path, tmp_path):
    pytest.importorskip("matplotlib")
    from quantkit.search.report import save_heatmap

    out = tmp_path / "h.png"
    save_heatmap(load_plan(plan_path), out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_heatmap_without_matplotlib(plan_path, tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_mpl(name, *a, **k):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_mpl)
    from quantkit.search.report import save_heatmap

    with pytest.raises(QuantkitError, match="pip install matplotlib"):
        save_heatmap(load_plan(plan_path), tmp_path / "h.png")


def test_cli_search(model_dir, tmp_path):
    from typer.testing import CliRunner

    from quantkit.cli import app

    out = tmp_path / "plan.json"
    res = CliRunner().invoke(app, ["search", str(model_dir), "-o", str(out), "--recipe", RECIPE, "--calib-samples", "2",
                                   "--seqlen", "32", "--device", "cpu", "--target-bits", "4.2", "--json"])
    assert res.exit_code == 0, res.output
    summary_line = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary_line["plan"] == str(out) and summary_line["target_bits"] == 4.2
    assert load_plan(out).achieved_bits == summary_line["achieved_bits"]
    bad = CliRunner().invoke(app, ["search", str(model_dir), "-o", str(out), "--bits", "4,8", "--target-bits", "9"])
    assert bad.exit_code == 2 and "outside the range" in bad.output
    other = tmp_path / "notes.txt"
    other.write_text("keep me")
    for o, plot, message in ((str(other), None, "exists and is not a quantkit plan"),
                             (str(tmp_path), None, "is not a file path"), ("", None, "is not a file path"),
                             (str(tmp_path / "p.json"), str(tmp_path / "p.json"), "both name")):
        args = ["search", str(model_dir), "-o", o, "--device", "cpu"] + (["--plot", plot] if plot else [])
        bad = CliRunner().invoke(app, args)
        assert bad.exit_code == 2 and message in bad.output, (o, bad.output)
    assert other.read_text() == "keep me" and not (tmp_path / "p.json").exists()


def test_cli_search_refuses_what_it_would_ignore(model_dir, tmp_path):
    """A window of one token and a --plot that savefig would write onto the plan (no suffix: it adds .png) — each
    one line, before anything loads or is written. Calibration options with a strategy that reads no data are a
    warning line, and the search goes on (here to the missing model)."""
    from typer.testing import CliRunner

    from quantkit.cli import app

    plan = tmp_path / "p.png"
    for extra, warning in ((["--strategy", "magnitude", "--calib-samples", "4", "--seed", "5"],
                            "warning: --calib-samples, --seed are ignored: --strategy magnitude reads no calibration "
                            "data (they are for the salience strategies global and local)"),
                           (["--strategy", "random", "--no-first-order"],
                            "warning: --no-first-order is ignored: --strategy random reads no calibration data (it "
                            "is for the salience strategies global and local)")):
        r = CliRunner().invoke(app, ["search", str(tmp_path / "no-model"), "-o", str(plan), *extra])
        lines = r.stderr.strip().splitlines()
        assert r.exit_code == 2 and lines[0] == warning and "no-model" in lines[1] and len(lines) == 2, r.stderr
    for extra, message in ((["--seqlen", "1"], "--seqlen must be at least 2 tokens, got 1"),
                           (["--plot", str(tmp_path / "p")], "-o and --plot both name")):
        bad = CliRunner().invoke(app, ["search", str(tmp_path / "no-model"), "-o", str(plan), *extra])
        assert bad.exit_code == 2 and message in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, extra
    assert not plan.exists()
    ok = run_search(str(model_dir), str(tmp_path / "r.json"), RECIPE, strategy="random", seed=3, device="cpu",
                    show_progress=False)
    assert ok.search["seed"] == 3  # random keeps its --seed


def test_a_plan_is_applied_only_with_a_recipe_that_quantizes_its_widths_alike(plan_path, model_dir, tmp_path,
                                                                               monkeypatch):
    """The plan records the recipe's weight grid per planned width; a recipe with another group size or symmetry
    (here w8a8: sym 4-bit channels, and 8-bit weights the plan would put mostly at 4 bits) is refused before the
    model loads, by pack and by eval-ppl; the plan's own recipe and its calibrated sibling pass."""
    import quantkit.model as model_pkg
    from quantkit.pack import run_pack
    from quantkit.quant.recipe import load_recipe
    from quantkit.search.plan_check import check_plan_recipe

    plan = load_plan(plan_path)
    assert plan.search["recipe"] == {"name": RECIPE, "weights": {"4": {"group_size": 128, "sym": False},
                                                                 "8": {"group_size": 128, "sym": True}}}
    for ok in (RECIPE, "mixllm-w4a8"):
        check_plan_recipe(plan, load_recipe(ok), "plan")
    g32 = tmp_path / "g32.yaml"
    shipped = (Path(__file__).parents[2] / "recipes" / f"{RECIPE}.yaml").read_text()
    g32.write_text(shipped.replace("group_size: 128", "group_size: 32"))
    with pytest.raises(QuantkitError, match=r"searched for 4-bit asym g128 weights, but recipe .* quantizes 4-bit "
                                            r"channels asym g32; use the recipe the plan was searched with "
                                            rf"\('{RECIPE}'\) or re-run `quantkit search --recipe"):
        check_plan_recipe(plan, load_recipe(str(g32)), "plan")
    monkeypatch.setattr(model_pkg, "load_model", lambda *a, **k: pytest.fail("loaded the model before the check"))
    with pytest.raises(QuantkitError, match="quantizes 4-bit channels sym g128"):
        run_pack(str(model_dir), "w8a8", str(tmp_path / "out"), plan=str(plan_path), device="cpu", progress=False)
    from typer.testing import CliRunner

    from quantkit.cli import app

    r = CliRunner().invoke(app, ["eval-ppl", str(model_dir), "--recipe", "w8a8", "--plan", str(plan_path)])
    assert r.exit_code == 2 and "quantizes 4-bit channels sym g128" in r.stderr
    # a plan of an earlier version, with only the salience quantizer recorded, is checked on that width
    old = json.loads(plan_path.read_text())
    del old["search"]["recipe"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    with pytest.raises(QuantkitError, match="searched for 4-bit asym g128"):
        check_plan_recipe(load_plan(tmp_path / "old.json"), load_recipe("w8a8"), "plan")
