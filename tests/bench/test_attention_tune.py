"""``quantkit tune --attention``: every candidate launch is checked against the torch reference before it is timed,
the launch with the best worst case over the points is written to the device's table, and the kernels read it
(Triton's CPU interpreter on tiny heads here; the timer is a stand-in, since only the GPU can time)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from quantkit.bench import attention_tune
from quantkit.cli import app
from quantkit.runtime.kernels import attention_launch
from quantkit.runtime.kernels.attention_launch import default_launch, launch_for

HEADS = (4, 2, 32)
CANDS = [(32, 4, 2), (64, 4, 3), (128, 4, 3)]


def _timer(costs: dict):
    return lambda fn, inputs, reps, launch: costs[launch]


def test_the_launch_with_the_best_worst_case_is_chosen_and_checked_launches_only():
    costs = {(32, 4, 2): 3.0, (64, 4, 3): 1.0, (128, 4, 3): 2.0}
    entries = attention_tune.tune_attention(HEADS, [1, 2], [160], forms=("fp16", "kv8", "kv4"), reps=1,
                                            device="cpu", timer=_timer(costs), candidates=lambda form: CANDS)
    assert [e["form"] for e in entries] == ["fp16", "kv8", "kv4"]
    for e in entries:
        assert e["launch"] == [64, 4, 3] and e["worst_ratio"] == 1.0 and e["head_dim"] == 32
        assert [(p["batch"], p["context"]) for p in e["points"]] == [(1, 160), (2, 160)]
        default = costs[default_launch(e["form"])]
        assert all(p["default_us"] == default for p in e["points"])


def test_a_launch_that_gives_wrong_results_is_not_chosen(monkeypatch):
    from quantkit.runtime.kernels.triton import decode_attention as da

    real = da.decode_attention

    def wrong_at_64(*args, launch=None, **kw):
        out = real(*args, launch=launch, **kw)
        return out + 1.0 if launch == (64, 4, 3) else out

    monkeypatch.setattr(da, "decode_attention", wrong_at_64)
    costs = {(32, 4, 2): 3.0, (64, 4, 3): 1.0, (128, 4, 3): 2.0}
    (entry,) = attention_tune.tune_attention(HEADS, [1], [160], forms=("fp16",), reps=1, device="cpu",
                                             timer=_timer(costs), candidates=lambda form: CANDS)
    assert entry["launch"] == [128, 4, 3]


def test_the_kernels_read_the_written_table_and_fall_back_to_the_rule(tmp_path, monkeypatch):
    from quantkit.runtime.kernels import tables
    from quantkit.runtime.kernels.registry import ENV_TABLES

    monkeypatch.setenv(tables.ENV_DIR, str(tmp_path))
    entries = [{"form": "kv8", "head_dim": 128, "launch": [64, 8, 2], "worst_ratio": 1.0, "points": []}]
    path = attention_launch.write_table(tmp_path, "NVIDIA H200", (9, 0), 132, entries, "quantkit tune --attention",
                                        "abc1234", "2026-11-29T00:00:00Z")
    data = json.loads(path.read_text())
    assert data["device"] == "NVIDIA H200" and data["commit"] == "abc1234" and data["command"]
    assert launch_for("kv8", 128, device_name="NVIDIA H200") == (64, 8, 2)
    assert launch_for("kv8", 64, device_name="NVIDIA H200") == default_launch("kv8")  # another head size
    assert launch_for("kv4", 128, device_name="NVIDIA H200") == default_launch("kv4")
    assert launch_for("kv8", 128, device_name="NVIDIA H100") == default_launch("kv8")
    monkeypatch.setenv(ENV_TABLES, "0")
    assert launch_for("kv8", 128, device_name="NVIDIA H200") == default_launch("kv8")
    assert launch_for("kv8", 128, device=torch.device("cpu")) == default_launch("kv8")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message a machine without a GPU gives")
def test_tune_attention_without_a_gpu_and_stray_options_are_one_line_errors():
    runner = CliRunner()
    res = runner.invoke(app, ["tune", "--attention", "--preset", "llama-3.1-8b"])
    assert res.exit_code == 2 and "CUDA GPU" in res.output
    res = runner.invoke(app, ["tune", "--batch", "1", "--preset", "llama-3.1-8b"])
    assert res.exit_code == 2 and "apply to --attention only" in res.output
    res = runner.invoke(app, ["tune", "--attention", "--preset", "llama-3.1-8b", "--m", "16"])
    assert res.exit_code == 2 and "--m does not apply to --attention" in res.output
    assert "Traceback" not in res.output


def test_heads_a_kernel_cannot_take_are_refused_before_timing():
    from quantkit.errors import QuantkitError

    with pytest.raises(QuantkitError, match="cannot run the kv4 kernel at 1000 tokens"):
        attention_tune.tune_attention((4, 2, 32), [1], [1000], forms=("kv4",), device="cpu",
                                      timer=_timer({}), candidates=lambda form: CANDS)
    with pytest.raises(QuantkitError, match="cannot run the fp16 kernel"):
        attention_tune.tune_attention((4, 2, 96), [1], [64], forms=("fp16",), device="cpu",
                                      timer=_timer({}), candidates=lambda form: CANDS)


def test_malformed_table_entries_are_ignored(tmp_path, monkeypatch):
    from quantkit.runtime.kernels import tables

    monkeypatch.setenv(tables.ENV_DIR, str(tmp_path))
    folder = tmp_path / "NVIDIA_H200"
    folder.mkdir()
    (folder / "attention.json").write_text(json.dumps({
        "schema": attention_launch.SCHEMA, "version": attention_launch.VERSION,
        "entries": ["oops", {"form": "kv8", "head_dim": 128, "launch": [48, 3, 2]},
                    {"form": "kv4", "head_dim": 128, "launch": [64, 8, 2]}]}))
    tables.clear_cache()
    assert launch_for("kv8", 128, device_name="NVIDIA H200") == default_launch("kv8")
    assert launch_for("kv4", 128, device_name="NVIDIA H200") == (64, 8, 2)


def test_shipped_attention_tables_are_well_formed_and_read_back(monkeypatch):
    from pathlib import Path

    from quantkit.runtime.kernels import tables

    shipped = Path(tables.__file__).with_name("tuned")  # the package's own (the tests' fixture hides them)
    monkeypatch.setattr(tables, "SHIPPED_DIR", shipped)
    tables.clear_cache()
    files = sorted(shipped.glob(f"*/{attention_launch.TABLE_NAME}"))
    assert files, "no shipped attention table"
    for path in files:
        data = json.loads(path.read_text())
        assert data["command"].startswith("quantkit tune --attention") and data["commit"] and data["date"]
        entries = attention_launch._read(path)
        assert len(entries) == len(data["entries"])  # every entry valid
        for (form, head_dim), e in entries.items():
            assert launch_for(form, head_dim, device_name=data["device"]) == tuple(e["launch"])
