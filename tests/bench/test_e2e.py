"""`quantkit bench --e2e` (quantkit/bench/e2e.py): the harness and its options, on the CPU with the shipped
reference model (a check of the mode: speeds are measured on the GPU and recorded in docs/BENCHMARKS.md)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from quantkit.bench.e2e import E2EPlan, e2e_table, points, run_e2e, weight_bytes
from quantkit.cli import app

runner = CliRunner()
SMALL = ["--prefill-tokens", "8,16", "--batch", "1,2", "--contexts", "24,5000", "--steps", "3", "--reps", "1"]


@pytest.fixture(scope="module")
def packed_ref(tmp_path_factory):
    out = tmp_path_factory.mktemp("e2e") / "rtn"
    r = runner.invoke(app, ["pack", "builtin:reference", "--recipe", "rtn-w4a16-g128", "-o", str(out)])
    assert r.exit_code == 0, r.output
    return out


def test_packed_model_is_timed_beside_its_fp_source_with_speedups(packed_ref):
    r = runner.invoke(app, ["bench", str(packed_ref), "--e2e", *SMALL, "--json"])
    assert r.exit_code == 0, r.stderr
    rows = json.loads(r.stdout)
    models = list(dict.fromkeys(row["model"] for row in rows))
    assert len(models) == 2 and models[0].startswith("FP") and models[1].startswith("packed")
    plan = E2EPlan(prefill=(8, 16), batches=(1, 2), contexts=(24, 5000), steps=3, reps=1)
    assert len(rows) == 2 * points(plan)
    long = [row for row in rows if row.get("context") == 5000]
    assert long and all("beyond the model's 1024 positions" in row["skipped"] for row in long)
    timed = [row for row in rows if "skipped" not in row]
    assert all(row["ms"] > 0 for row in timed if row["measure"] == "prefill")
    assert all(row["tok_s"] > 0 and row["weight_gb_s"] >= 0 for row in timed if row["measure"] == "decode")
    assert {row["measure"] for row in timed} == {"prefill", "decode", "hf_generate"}
    packed_rows = [row for row in timed if row["model"] == models[1]]
    assert packed_rows and all(row["speedup"] > 0 for row in packed_rows)
    assert packed_rows[0]["weight_bytes"] < next(row for row in rows if row["model"] == models[0])["weight_bytes"]


def test_an_fp_model_is_timed_alone_and_the_table_renders():
    from quantkit.model import load_model

    plan = E2EPlan(prefill=(8,), batches=(1,), contexts=(16,), steps=2, reps=1, hf_batches=())
    seen = []
    rows = run_e2e([("fp", lambda: load_model("builtin:reference", device="cpu", load_tokenizer=False).model)],
                   plan, progress=seen.append)
    assert [row["measure"] for row in rows] == ["prefill", "decode"] and len(seen) == len(rows)
    assert all("speedup" not in row for row in rows)
    assert e2e_table(rows).row_count == 2


def test_weight_bytes_counts_shared_tensors_once():
    import torch.nn as nn

    lin = nn.Linear(4, 4, bias=False)
    tied = nn.Sequential(lin, lin)
    assert weight_bytes(tied) == 16 * 4


@pytest.mark.parametrize("args,message", [
    (["--e2e"], "--e2e times a whole model: give PACKED"),
    (["builtin:reference", "--e2e", "--shapes", "64x64"], "--shapes does not apply to --e2e"),
    (["builtin:reference", "--e2e", "--m", "1", "--layer", "0"], "--m, --layer do not apply to --e2e"),
    (["builtin:reference", "--e2e", "--steps", "0"], "--steps is the number of timed decode steps"),
    (["builtin:reference", "--e2e", "--source", "x"], "--source names the FP model of a packed checkpoint"),
    (["builtin:reference", "--e2e", "--batch", "0"], "--batch takes comma-separated integers ≥ 1"),
    (["builtin:reference", "--e2e", "--contexts", "1"], "--contexts takes comma-separated integers ≥ 2"),
    (["builtin:reference", "--e2e", "--decode-step"], "--e2e times the whole model; drop --explain/--decode-step"),
    (["--shapes", "64x64", "--prefill-tokens", "8"], "--prefill-tokens is for --e2e only"),
    (["--shapes", "64x64", "--source", "x", "--no-hf"], "--source, --no-hf are for --e2e only"),
])
def test_e2e_option_errors(args, message):
    r = runner.invoke(app, ["bench", *args])
    assert r.exit_code == 2 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_kv_bits_takes_kv8_and_kv4():
    from quantkit.bench.command import check_no_e2e_options, e2e_args
    from quantkit.errors import QuantkitError

    a = e2e_args("builtin:reference", None, None, None, None, None, None, None, None, None, None, 32, None, "cpu",
                 True, kv_bits="8")
    assert a.plan.kv.label == "kv8"
    with pytest.raises(QuantkitError, match="KV8 and KV4"):
        e2e_args("builtin:reference", None, None, None, None, None, None, None, None, None, None, 32, None, "cpu",
                 True, kv_bits="fp8")
    with pytest.raises(QuantkitError, match="--kv-bits is for --e2e only"):
        check_no_e2e_options(None, None, 32, None, True, "8")


def test_with_kv_bits_the_packed_model_decodes_with_kv8_and_its_source_with_fp16(packed_ref):
    r = runner.invoke(app, ["bench", str(packed_ref), "--e2e", "--prefill-tokens", "8", "--batch", "2", "--contexts",
                            "24", "--steps", "3", "--reps", "1", "--no-hf", "--kv-bits", "8", "--json"])
    assert r.exit_code == 0, r.stderr
    rows = json.loads(r.stdout)
    decode = {row["model"].split(" ")[0]: row for row in rows if row["measure"] == "decode"}
    assert decode["FP"]["kv"] == "fp" and decode["packed"]["kv"] == "kv8" and decode["packed"]["tok_s"] > 0
