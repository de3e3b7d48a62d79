"""MoE models (Mixtral, Qwen2-MoE, Qwen3-MoE): experts as one Linear per projection, calibrated per expert."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from quantkit.cli import app
from quantkit.model.moe import ExpertList, count_tokens, is_expert_linear, unfuse_experts
from quantkit.model.walk import find_decoder_layers, iter_linears
from conftest import build_tiny_model

MOE = ("mixtral", "qwen2_moe", "qwen3_moe")
EVAL = ["--dataset", "kjv", "--seqlen", "32", "--max-windows", "2", "--device", "cpu", "--json"]


@pytest.mark.parametrize("arch", MOE)
def test_unfused_experts_compute_the_fused_model(arch):
    model = build_tiny_model(arch, seed=3)
    ids = torch.randint(0, 512, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(ids).logits
    assert unfuse_experts(model) == 2
    with torch.no_grad():
        got = model(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert find_decoder_layers(model)[0] == "model.layers"  # not an expert list, though it is longer
    names = [n for n, _ in iter_linears(model)]
    assert "model.layers.1.mlp.experts.3.down_proj" in names
    assert not any(n.endswith((".gate", "shared_expert_gate")) for n in names)  # routers stay in full precision
    assert sum(is_expert_linear(n) for n in names) == 2 * 4 * 3
    assert ("model.layers.0.mlp.shared_expert.up_proj" in names) == (arch == "qwen2_moe")


def test_token_counts_cover_every_routed_slot():
    model = build_tiny_model("mixtral", seed=1)
    unfuse_experts(model)
    with torch.no_grad(), count_tokens(model) as counts:
        model(torch.randint(0, 512, (3, 20)))
    assert set(counts) == {"model.layers.0.mlp.experts", "model.layers.1.mlp.experts"}
    assert all(int(c.sum()) == 3 * 20 * 2 for c in counts.values())  # every token, top-2
    assert all(lst.token_counts is None for _, lst in model.named_modules() if isinstance(lst, ExpertList))


def _never_route(model, expert: int) -> None:
    """Make every router of ``model`` skip ``expert``: its logit pushed to -inf before the top-k."""
    for layer in model.model.layers:
        router = layer.mlp.gate
        base = router.forward

        def forward(hidden, base=base, router=router):
            logits = torch.nn.functional.linear(hidden, router.weight)
            logits[:, expert] = float("-inf")
            probs = torch.softmax(logits.float(), dim=-1)
            weights, index = torch.topk(probs, router.top_k, dim=-1)
            return logits, (weights / weights.sum(-1, keepdim=True)).to(hidden.dtype), index

        router.forward = forward


def test_gptq_rounds_an_expert_no_token_reached_to_nearest():
    from quantkit.quant import grid
    from quantkit.quant.apply import quantize_model
    from quantkit.quant.recipe import load_recipe

    model = build_tiny_model("mixtral", seed=2)
    unfuse_experts(model)
    _never_route(model, 3)
    original = model.model.layers[0].mlp.experts[3].down_proj.weight.detach().clone()
    ids = torch.randint(0, 512, (4, 32), generator=torch.Generator().manual_seed(1))
    result = quantize_model(model, None, load_recipe("gptq-w4a16-g128"), calib_ids=ids, device="cpu")
    rec = result.weights["model.layers.0.mlp.experts.3.down_proj"]
    assert rec.meta["method"] == "rtn" and rec.meta["reason"] == "under-covered expert"
    rtn = grid.quantize(original.float(), 4, 128, False)
    assert torch.equal(rec.codes, rtn.codes) and torch.equal(rec.scales, rtn.scales)
    routed = result.weights["model.layers.0.mlp.experts.0.down_proj"]
    assert "reason" not in routed.meta  # calibrated experts keep GPTQ
    rows = {r["experts"]: r for r in result.calibration["experts"]}
    assert rows["model.layers.0.mlp.experts"]["under_covered"] == [3]
    assert rows["model.layers.0.mlp.experts"]["min_tokens"] == 0
    assert "rounded to nearest" in result.calibration["experts_rule"]


@pytest.fixture(scope="module")
def sparse_moe_dir(tiny_model_dir):
    """A Mixtral with 16 experts, one per token: a short calibration leaves some experts with few tokens."""
    return tiny_model_dir("mixtral", num_local_experts=16, num_experts_per_tok=1)


def test_pack_names_under_covered_experts_and_packed_equals_fake_quant(sparse_moe_dir, tmp_path):
    runner = CliRunner()
    out = tmp_path / "packed"
    res = runner.invoke(app, ["pack", str(sparse_moe_dir), "--recipe", "gptq-w4a16-g128", "-o", str(out),
                              "--device", "cpu", "--calib-samples", "1", "--calib-seqlen", "32", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["linears"] == 2 * (4 + 16 * 3)
    coverage = summary["expert_coverage"]
    assert [r["experts"] for r in coverage] == ["model.layers.0.mlp.experts", "model.layers.1.mlp.experts"]
    assert any(r["under_covered"] for r in coverage)
    assert any("saw too few calibration tokens" in w and "rounded to nearest" in w for w in summary["warnings"])
    packed = runner.invoke(app, ["eval-ppl", str(out), *EVAL])
    assert packed.exit_code == 0, packed.output
    assert json.loads(packed.stdout.strip().splitlines()[-1])["ppl"] > 1


@pytest.mark.parametrize("arch", ["qwen2_moe", "qwen3_moe"])
def test_mixed_plan_packs_and_packed_equals_fake_quant(arch, tiny_model_dir, tmp_path):
    from quantkit.search.command import run_search

    src = tiny_model_dir(arch)
    plan = tmp_path / "plan.json"
    run_search(str(src), str(plan), "mixllm-w4a8-rtn", target_bits=4.4, samples=2, seqlen=32, device="cpu",
               show_progress=False)
    layers = json.loads(plan.read_text())["layers"]
    assert any(is_expert_linear(entry["name"]) for entry in layers)
    runner = CliRunner()
    res = runner.invoke(app, ["pack", str(src), "--recipe", "mixllm-w4a8-rtn", "--plan", str(plan), "-o",
                              str(tmp_path / "o"), "--device", "cpu", "--json"])
    assert res.exit_code == 0, res.output
    a = runner.invoke(app, ["eval-ppl", str(tmp_path / "o"), *EVAL])
    b = runner.invoke(app, ["eval-ppl", str(src), "--recipe", "mixllm-w4a8-rtn", "--plan", str(plan),
                            "--no-baseline", *EVAL])
    assert a.exit_code == 0 and b.exit_code == 0, a.output + b.output
    ra, rb = (json.loads(r.stdout.strip().splitlines()[-1]) for r in (a, b))
    assert ra["ppl"] == rb["ppl"] and ra["windows"] == 2


def test_the_dense_form_is_the_routed_sum_and_compiled_decoding_gives_hf_tokens():
    """Compiled (and, on a GPU, captured) steps take the routing-independent dense form: it equals the routed
    loop, and quantkit's compiled decode loop gives transformers' greedy tokens on a MoE model."""
    import torch._dynamo.testing

    from quantkit.runtime.generate import Generator

    model = build_tiny_model("qwen2_moe", seed=5)
    unfuse_experts(model)
    experts = model.model.layers[0].mlp.experts
    x = torch.randn(7, 64)
    index = torch.randint(0, 4, (7, 2))
    index[:, 1] = (index[:, 0] + 1) % 4
    weights = torch.rand(7, 2)
    with torch.no_grad():
        torch.testing.assert_close(experts.forward_dense(x, index, weights), experts(x, index, weights))
    ids = torch.randint(1, 500, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                              cache_implementation="static", pad_token_id=0)
    torch._dynamo.reset()
    backend = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    out, _ = Generator(model, max_context=32, compile_decode=True, backend=backend).generate(ids, 8)
    torch._dynamo.reset()
    assert torch.equal(out, want) and backend.frame_count == 1


def test_recipes_a_moe_block_cannot_take_are_refused_and_skipped_experts_pack(tiny_model_dir, tmp_path):
    src = str(tiny_model_dir("mixtral"))
    runner = CliRunner()
    res = runner.invoke(app, ["pack", src, "--recipe", "quarot-w8a8", "-o", str(tmp_path / "r"), "--device", "cpu"])
    assert res.exit_code == 2 and "one gate/up/down MLP" in res.output and "Traceback" not in res.output
    recipe = tmp_path / "skip.yaml"
    recipe.write_text("name: skip-experts\nweight: {method: gptq, bits: 4, group_size: 32, sym: false}\n"
                      "overrides:\n  - {pattern: \"*.experts.*\", skip: true}\n"
                      "calibration: {dataset: kjv, samples: 2, seqlen: 32, seed: 0}\n")
    res = runner.invoke(app, ["pack", src, "--recipe", str(recipe), "-o", str(tmp_path / "s"), "--device", "cpu",
                              "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout.strip().splitlines()[-1])["linears"] == 2 * 4  # attention only


def test_an_expert_needs_tokens_for_its_widest_input():
    from quantkit.model.moe import MIN_TOKENS_PER_FEATURE, coverage_rows, min_tokens

    model = build_tiny_model("mixtral", seed=0)
    unfuse_experts(model)
    expert = model.model.layers[0].mlp.experts[0]
    assert min_tokens(expert) == MIN_TOKENS_PER_FEATURE * 160  # down_proj reads the intermediate size
    rows = coverage_rows({"e": torch.tensor([0, 79, 80, 500])}, {"e": [80.0] * 4})
    assert rows == [{"experts": "e", "min_tokens": 0, "median_tokens": 79, "max_tokens": 500,
                     "under_covered": [0, 1]}]


def test_a_packed_moe_decodes_compiled_when_the_prompt_misses_experts(tiny_model_dir, tmp_path):
    """The compiled step runs every expert; ones the prompt never reached are warmed up first."""
    import torch._dynamo.testing

    from quantkit.checkpoint import load_packed
    from quantkit.runtime.generate import Generator

    out = tmp_path / "p"
    res = CliRunner().invoke(app, ["pack", str(tiny_model_dir("qwen2_moe")), "--recipe", "rtn-w4a16-g128", "-o",
                                   str(out), "--device", "cpu"])
    assert res.exit_code == 0, res.output
    ids = torch.tensor([[5, 9]])
    eager, _ = Generator(load_packed(out, device="cpu").model, max_context=16).generate(ids, 6)
    torch._dynamo.reset()
    backend = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    model = load_packed(out, device="cpu").model
    compiled, _ = Generator(model, max_context=16, compile_decode=True, backend=backend).generate(ids, 6)
    torch._dynamo.reset()
    assert torch.equal(compiled, eager) and backend.frame_count == 1


def test_true_sequential_gptq_quantizes_all_experts_in_two_stages():
    from quantkit.quant.gptq import expert_stages

    e = "model.layers.0.mlp.experts"
    groups = [["q", "k", "v"], ["o"]] + [g for i in range(3) for g in ([f"{e}.{i}.gate_proj", f"{e}.{i}.up_proj"],
                                                                        [f"{e}.{i}.down_proj"])]
    assert expert_stages(groups) == [["q", "k", "v"], ["o"],
                                     [f"{e}.{i}.{p}" for i in range(3) for p in ("gate_proj", "up_proj")],
                                     [f"{e}.{i}.down_proj" for i in range(3)]]
