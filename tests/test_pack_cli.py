"""The ``quantkit pack`` / ``inspect`` commands and ``eval-ppl`` on a packed checkpoint: exit codes, one-line
errors, the summary table and --json records, and the same perplexity as fake-quant evaluation."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from quantkit.cli import app
from quantkit.checkpoint import read_manifest
from quantkit.search.command import run_search
from quantkit.search.plan_check import load_plan

EVAL = ["--device", "cpu", "--seqlen", "64", "--max-windows", "2", "--json"]


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir("qwen3")


@pytest.fixture(scope="module")
def plan(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    run_search(str(model_dir), str(out), "mixllm-w4a8-rtn", strategy="random", target_bits=4.4, samples=1,
               seqlen=16, device="cpu", show_progress=False)
    return str(out)


@pytest.fixture(scope="module")
def packed(model_dir, plan, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "out"
    res = CliRunner().invoke(app, ["pack", str(model_dir), "--recipe", "mixllm-w4a8-rtn", "--plan", plan, "-o",
                                   str(out), "--device", "cpu", "--max-shard-size", "500KB", "--json"])
    assert res.exit_code == 0, res.output
    return out, json.loads(res.stdout.strip().splitlines()[-1])


def _last_json(res) -> dict:
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_pack_writes_and_reports(packed, plan):
    out, summary = packed
    assert summary["linears"] == 14 and set(summary["bits_histogram"]) == {"4", "8"}
    assert summary["avg_bits"] == pytest.approx(load_plan(plan).achieved_bits, abs=1e-6)
    assert summary["activation_bits"] == 8 and summary["plan_sha256"]
    assert summary["shards"] > 1 and summary["bytes_on_disk"] > 0 and summary["bytes_fp16"] > 0
    assert read_manifest(out)["recipe"]["name"] == "mixllm-w4a8-rtn"


def test_pack_table_without_json(model_dir, tmp_path):
    res = CliRunner().invoke(app, ["pack", str(model_dir), "--recipe", "rtn-w4a16-g128", "-o", str(tmp_path / "o"),
                                   "--device", "cpu", "--target", "sm80"])
    assert res.exit_code == 0, res.output
    for field in ("quantized linears", "bits histogram", "average bits", "size on disk", "vs FP16"):
        assert field in res.output


def test_eval_ppl_of_packed_equals_fake_quant(packed, model_dir, plan):
    out, _ = packed
    runner = CliRunner()
    res_packed = runner.invoke(app, ["eval-ppl", str(out), *EVAL])
    res_fake = runner.invoke(app, ["eval-ppl", str(model_dir), "--recipe", "mixllm-w4a8-rtn", "--plan", plan,
                                   "--no-baseline", *EVAL])
    assert res_packed.exit_code == 0, res_packed.output
    assert res_fake.exit_code == 0, res_fake.output
    a, b = _last_json(res_packed), _last_json(res_fake)
    assert a["ppl"] == b["ppl"] and a["nll"] == b["nll"] and a["windows"] == b["windows"] == 2
    again = runner.invoke(app, ["eval-ppl", str(out), "--recipe", "w8a8", *EVAL])
    assert again.exit_code == 2 and "already quantized" in again.output


def test_inspect_and_verify(packed, tmp_path):
    import shutil

    out, summary = packed
    res = CliRunner().invoke(app, ["inspect", str(out), "--verify", "--json"])
    assert res.exit_code == 0, res.output
    info = _last_json(res)
    assert info["mismatches"] == [] and info["linears"] == summary["linears"]
    assert info["recipe"] == "mixllm-w4a8-rtn" and set(info["layouts"]) == {"reference"}
    bad = shutil.copytree(out, tmp_path / "bad")
    shard = bad / read_manifest(bad)["tensors"]["model.norm.weight"]["shard"]
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 0xFF  # the last byte belongs to the last tensor of the shard
    shard.write_bytes(bytes(raw))
    res = CliRunner().invoke(app, ["inspect", str(bad), "--verify", "--json"])
    assert res.exit_code == 2 and "sha256 mismatch" in res.output
    assert [m["shard"] for m in _last_json(res)["mismatches"]] == [shard.name]
    assert CliRunner().invoke(app, ["inspect", str(bad)]).exit_code == 0  # no --verify: bytes not read


@pytest.mark.parametrize("args,message", [
    (["--recipe", "lqq-w4a8", "--format", "awq"], "--format awq cannot hold recipe 'lqq-w4a8'"),
    (["--recipe", "rtn-w4a16-g128", "--format", "gptq", "--target", "sm90"], "cannot be combined"),
    (["--recipe", "rtn-w4a16-g128", "--max-shard-size", "big"], "--max-shard-size 'big' is not a size"),
    (["--recipe", "rtn-w4a16-g128", "--plan", "/nonexistent/plan.json"], "cannot read plan"),
])
def test_pack_errors_are_one_line(model_dir, tmp_path, args, message):
    res = CliRunner().invoke(app, ["pack", str(model_dir), "-o", str(tmp_path / "o"), "--device", "cpu", *args])
    assert res.exit_code == 2
    assert message in res.output and "Traceback" not in res.output
    assert not (tmp_path / "o").exists()


def test_existing_output_and_force(packed, model_dir):
    out, _ = packed
    res = CliRunner().invoke(app, ["pack", str(model_dir), "--recipe", "rtn-w4a16-g128", "-o", str(out),
                                   "--device", "cpu"])
    assert res.exit_code == 2 and "already exists; pass --force" in res.output
    assert read_manifest(out)["recipe"]["name"] == "mixllm-w4a8-rtn"


def test_inspect_of_a_non_checkpoint(model_dir):
    res = CliRunner().invoke(app, ["inspect", str(model_dir)])
    assert res.exit_code == 2 and "not a packed quantkit checkpoint" in res.output


def test_quantized_models_are_refused_as_sources(packed, model_dir, tmp_path):
    import shutil

    out, _ = packed  # transformers would load its linears at random: refuse instead of packing garbage
    res = CliRunner().invoke(app, ["pack", str(out), "--recipe", "rtn-w4a16-g128", "-o", str(tmp_path / "o"),
                                   "--device", "cpu"])
    assert res.exit_code == 2 and "is a packed quantkit checkpoint (already quantized)" in res.output
    res = CliRunner().invoke(app, ["search", str(out), "-o", str(tmp_path / "p.json"), "--device", "cpu"])
    assert res.exit_code == 2 and "is a packed quantkit checkpoint" in res.output
    gptq = shutil.copytree(model_dir, tmp_path / "gptq")
    cfg = json.loads((gptq / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    (gptq / "config.json").write_text(json.dumps(cfg))
    res = CliRunner().invoke(app, ["pack", str(gptq), "--recipe", "rtn-w4a16-g128", "-o", str(tmp_path / "o"),
                                   "--device", "cpu"])
    assert res.exit_code == 2 and "is already quantized (gptq quantization_config" in res.output
    assert "Traceback" not in res.output and not (tmp_path / "o").exists()
    res = CliRunner().invoke(app, ["eval-ppl", str(gptq), "--device", "cpu"])  # evaluating it: where it can run
    assert res.exit_code == 2 and "an engine that loads gptq checkpoints" in res.output


def test_recipe_and_output_errors_name_the_fix(model_dir, tmp_path):
    binary = tmp_path / "r.yaml"
    binary.write_bytes(b"\xff\xfe\x00bits")
    res = CliRunner().invoke(app, ["pack", str(model_dir), "--recipe", str(binary), "-o", str(tmp_path / "o"),
                                   "--device", "cpu"])
    assert res.exit_code == 2 and "is not UTF-8 text" in res.output
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("keep me")
    res = CliRunner().invoke(app, ["pack", str(model_dir), "--recipe", "rtn-w4a16-g128", "-o", str(other),
                                   "--device", "cpu"])  # --force would not replace it either: do not suggest it
    assert res.exit_code == 2 and "is not a quantkit checkpoint" in res.output and "pass --force" not in res.output


def test_inspect_checks_files_without_verify(packed, tmp_path):
    import shutil

    out, _ = packed
    no_config = shutil.copytree(out, tmp_path / "no_config")
    (no_config / "config.json").unlink()
    res = CliRunner().invoke(app, ["inspect", str(no_config), "--verify"])
    assert res.exit_code == 2 and "has no config.json" in res.output
    short = shutil.copytree(out, tmp_path / "short")
    shard = short / read_manifest(short)["tensors"]["model.norm.weight"]["shard"]
    shard.write_bytes(shard.read_bytes()[:-100])
    res = CliRunner().invoke(app, ["inspect", str(short)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    bad = shutil.copytree(out, tmp_path / "bad")
    shard = bad / read_manifest(bad)["tensors"]["model.norm.weight"]["shard"]
    raw = bytearray(shard.read_bytes())
    raw[-1] ^= 0xFF
    shard.write_bytes(bytes(raw))
    res = CliRunner().invoke(app, ["inspect", str(bad), "--verify"])
    assert res.exit_code == 2 and "error: 1 tensor of" in res.stderr and "copy it again" in res.stderr


def test_sigterm_exits_through_unwinding(monkeypatch):
    import os
    import signal
    import time

    import quantkit.cli as cli

    def app_that_gets_killed(**kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)

    previous = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(cli, "app", app_that_gets_killed)
    try:
        with pytest.raises(SystemExit) as e:  # a BaseException: atomic_directory removes its temporary folder
            cli.main()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert e.value.code == 128 + signal.SIGTERM


def test_pack_warns_about_an_override_that_matches_nothing(model_dir, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("weight: {method: rtn, bits: 4, group_size: 32}\n"
                      "overrides:\n  - {pattern: '*.down_prj', bits: 8}\n")
    res = CliRunner().invoke(app, ["pack", str(model_dir), "--recipe", str(recipe), "-o", str(tmp_path / "o"),
                                   "--device", "cpu", "--json"])
    assert res.exit_code == 0, res.output
    assert any("'*.down_prj' matches no linear layer" in w for w in _last_json(res)["warnings"])
