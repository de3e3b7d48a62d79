"""`quantkit bench` option handling (the timing itself needs a GPU and is recorded in docs/BENCHMARKS.md)."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from quantkit.cli import app

runner = CliRunner()
ONE_OF = "give exactly one of PACKED"


@pytest.mark.parametrize("args,message", [
    ([], ONE_OF),
    (["--shapes", "64x64", "--preset", "llama-3.1-8b"], ONE_OF),
    (["some/ckpt", "--shapes", "64x64"], ONE_OF),
    (["some/ckpt", "--preset", "llama-3.1-8b"], ONE_OF),
    (["--preset", "gpt-5"], "unknown --preset 'gpt-5'"),
    (["--shapes", "64x64", "--methods", "w4a16,w9a9"], "unknown --methods w9a9"),
    (["--shapes", "64x64", "--m", "1,x"], "--m takes comma-separated integers"),
    (["--shapes", "64x6x4"], "--shapes takes NxK pairs of positive integers"),
    (["--shapes", "64x0"], "--shapes takes NxK pairs of positive integers"),
    (["--shapes", "64by64"], "--shapes takes NxK pairs of positive integers"),
    (["--shapes", "64x64", "--m", "0,4"], "--m takes comma-separated integers ≥ 1"),
    (["missing/ckpt"], "checkpoint 'missing/ckpt' does not exist"),
    (["--decode-step"], "--decode-step times a decoder layer of a packed model; give PACKED"),
    (["--decode-step", "--shapes", "64x64"], "give PACKED"),
    (["ckpt", "--decode-step", "--plot", "b.png"], "--plot is for the kernel sweep, not --decode-step"),
    (["ckpt", "--decode-step", "--m", "1", "--methods", "w4a16"], "--m, --methods are for the kernel sweep"),
    (["ckpt", "--decode-step", "--batch", "1,0"], "--batch takes comma-separated integers ≥ 1"),
    (["ckpt", "--decode-step", "--context", "0"], "--context is the number of tokens already in the KV cache"),
    (["ckpt", "--decode-step", "--layer", "-1"], "--layer is a decoder layer index"),
    (["--shapes", "64x64", "--batch", "8"], "--batch is for --decode-step only"),
    (["--shapes", "64x64", "--context", "8", "--device", "cpu"], "--context, --device are for --decode-step only"),
    (["--shapes", "64x64", "--methods", ","], "--methods takes comma-separated method names"),
    (["--shapes", "64x64", "--methods", ""], "--methods takes comma-separated method names"),
    (["--shapes", "64x64", "--m", ""], "--m takes comma-separated integers"),
    (["--shapes", "64x64", "--reps", "0"], "--reps is the number of timed samples per point"),
    (["ckpt", "--decode-step", "--reps", "-2"], "--reps is the number of timed samples per point"),
    (["--shapes", "64x64", "--methods", "fp16", "--plot", "b.png"], "only fp16 is timed"),
    (["--shapes", "64x64", "--plot", "no/such/folder/b.png"], "folder 'no/such/folder' does not exist"),
    (["--shapes", "64x64", "--plot", "b.txt"], "matplotlib does not write .txt files"),
    (["--shapes", "64x64", "--plot", "."], "--plot '.' is not a file name; give one such as --plot plot.png"),
    (["--shapes", "64x64", "--plot", ""], "is not a file name"),
    (["--shapes", "64x64", "--no-graph"], "--no-graph is for --decode-step only"),
])
def test_bench_option_errors(args, message):
    r = runner.invoke(app, ["bench", *args])
    assert r.exit_code == 2 and message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1  # one line, no traceback


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_bench_without_gpu_says_so():
    r = runner.invoke(app, ["bench", "--preset", "llama-3.1-8b", "--m", "1"])
    assert r.exit_code == 2 and "need a CUDA GPU" in r.stderr


def test_methods_list_takes_spaces_after_commas(monkeypatch):
    from quantkit.bench import command

    assert command.kernel_targets(None, "64x64", None, "fp16, w4a16")[1] == ["fp16", "w4a16"]


def test_plot_without_matplotlib_fails_before_timing(monkeypatch, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    r = runner.invoke(app, ["bench", "--shapes", "64x64", "--m", "1", "--plot", str(tmp_path / "b.png")])
    assert r.exit_code == 2 and "`pip install matplotlib`" in r.stderr
    assert not (tmp_path / "b.png").exists()


def test_plot_into_a_folder_that_takes_no_file_fails_before_timing(monkeypatch, tmp_path):
    """Root ignores permission bits and mounts can be read-only, so the check tries a file in the folder."""
    import quantkit.plotting as plotting

    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(plotting.tempfile, "NamedTemporaryFile", refuse)
    r = runner.invoke(app, ["bench", "--shapes", "64x64", "--m", "1", "--plot", str(tmp_path / "b.png")])
    assert r.exit_code == 2 and r.stderr.strip().endswith("Permission denied; choose a folder you can write to")
    assert len(r.stderr.strip().splitlines()) == 1


def test_written_path_is_where_savefig_puts_it(tmp_path):
    import matplotlib.pyplot as plt

    from quantkit.plotting import save_figure, written_path

    for name in ("speedup", "speedup.svg", "a.b.png"):
        save_figure(plt.figure(), tmp_path / name, "plot")
        assert written_path(tmp_path / name).is_file(), name
    assert written_path("speedup").name == "speedup.png"


def test_list_options_time_each_value_once():
    from quantkit.bench.command import parse_ints

    assert parse_ints("16,1,16, 4,1", "--m") == [16, 1, 4]
