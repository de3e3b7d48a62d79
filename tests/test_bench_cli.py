"""`quantkit bench` option handling (the timing itself needs a GPU and is recorded in docs/BENCHMARKS.md)."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from quantkit.cli import app

runner = CliRunner()


@pytest.mark.parametrize("args,message", [
    ([], "give exactly one of --shapes"),
    (["--shapes", "64x64", "--preset", "llama-3.1-8b"], "give exactly one of --shapes"),
    (["--preset", "gpt-5"], "unknown --preset 'gpt-5'"),
    (["--shapes", "64x64", "--methods", "w4a16,w9a9"], "unknown --methods w9a9"),
    (["--shapes", "64x64", "--m", "1,x"], "--m takes comma-separated integers"),
])
def test_bench_option_errors(args, message):
    r = runner.invoke(app, ["bench", *args])
    assert r.exit_code == 2 and message in r.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_bench_without_gpu_says_so():
    r = runner.invoke(app, ["bench", "--preset", "llama-3.1-8b", "--m", "1"])
    assert r.exit_code == 2 and "need a CUDA GPU" in r.stderr
