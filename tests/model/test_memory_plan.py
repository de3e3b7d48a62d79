"""quantkit.model.memory_plan: lower bounds of pack and search from the config, and refusals before any work."""

from __future__ import annotations

import json

import torch
from typer.testing import CliRunner

from quantkit.cli import app
from quantkit.model.memory_plan import MemoryPlan, model_shape, pack_plan, search_plan
from quantkit.model.moe import unfuse_experts
from quantkit.model.walk import find_decoder_layers, iter_linears


def test_the_shape_comes_from_the_config_and_matches_the_loaded_model(tiny_model_dir):
    from quantkit.model import load_model

    for arch, over in (("llama", {}), ("llama", {"tie_word_embeddings": True}), ("mixtral", {})):
        shape = model_shape(str(tiny_model_dir(arch, **over)))
        model = load_model(str(tiny_model_dir(arch, **over)), device="cpu", load_tokenizer=False).model
        unfuse_experts(model)
        assert shape.parameters == sum(p.numel() for p in model.parameters())
        assert shape.linear_parameters == sum(lin.weight.numel() for _, lin in iter_linears(model))
        assert shape.layer_parameters == sum(p.numel() for p in find_decoder_layers(model)[1][0].parameters())
        assert shape.hidden == 64


def test_pack_and_search_bounds_count_what_must_be_held_at_once(tiny_model_dir):
    shape = model_shape(str(tiny_model_dir("llama")))
    rtn = pack_plan(shape, torch.float16, "cpu", False, 128, 2048, 4)
    assert rtn == MemoryPlan("pack", shape.parameters * 2 + shape.linear_parameters, 0, shape.linear_parameters // 2)
    gptq = pack_plan(shape, torch.float16, "cuda", True, 8, 64, 4.4)
    assert gptq.gpu_bytes == shape.layer_parameters * 2 + 2 * 8 * 64 * 64 * 2 and gptq.cpu_bytes == rtn.cpu_bytes
    assert search_plan(shape, torch.float16, "cuda", None) == MemoryPlan("search", 0, shape.parameters * 2, 0)
    assert search_plan(shape, torch.float32, "cpu", None).cpu_bytes == shape.parameters * 4
    assert "needs at least" in gptq.describe() and "GPU memory" in gptq.describe()
    assert shape.positions == 256  # the tiny models' max_position_embeddings: longer windows are cut to it
    assert pack_plan(shape, torch.float16, "cuda", True, 8, 4096, 4).gpu_bytes == \
        pack_plan(shape, torch.float16, "cuda", True, 8, 256, 4).gpu_bytes


def test_runs_that_cannot_fit_are_refused_before_loading(tiny_model_dir, tmp_path, monkeypatch):
    import quantkit.model.memory as memory

    src = str(tiny_model_dir("llama"))
    monkeypatch.setattr(memory, "free_memory", lambda device: 1000)
    runner = CliRunner()
    res = runner.invoke(app, ["pack", src, "--recipe", "gptq-w4a16-g128", "-o", str(tmp_path / "o"), "--device",
                              "cpu"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "needs at least" in res.output and "CPU memory" in res.output and "--dtype bf16" in res.output
    res = runner.invoke(app, ["search", src, "-o", str(tmp_path / "plan.json"), "--device", "cpu"])
    assert res.exit_code == 2 and "--dtype bf16 halves it" in res.output
    res = runner.invoke(app, ["pack", src, "--recipe", "rtn-w4a16-g128", "-o", str(tmp_path / "o"), "--device", "cpu"])
    assert res.exit_code == 2 and "one decoder layer at a time (--stream)" in res.output
    assert not (tmp_path / "o").exists()


def test_pack_reports_its_plan(tiny_model_dir, tmp_path):
    res = CliRunner().invoke(app, ["pack", str(tiny_model_dir("llama")), "--recipe", "rtn-w4a16-g128", "-o",
                                   str(tmp_path / "o"), "--device", "cpu", "--json"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout.strip().splitlines()[-1])["memory_plan"]
    assert plan["cpu_bytes"] > 0 and plan["gpu_bytes"] == 0 and plan["disk_bytes"] > 0
