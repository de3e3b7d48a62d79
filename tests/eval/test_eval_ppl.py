"""Perplexity: the library function against a hand-written HF loop, and the eval-ppl command end to end."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from quantkit.cli import app
from quantkit.eval import perplexity
from quantkit.eval.ppl import choose_seqlen
from quantkit.errors import QuantkitError
from tests.conftest import build_tiny_model

runner = CliRunner()


def test_ppl_matches_hand_written_hf_loop():
    model = build_tiny_model("qwen2", seed=5)
    ids = torch.randint(0, model.config.vocab_size, (1000,), generator=torch.Generator().manual_seed(0))
    seqlen = 96
    nlls = []
    with torch.no_grad():
        for i in range(ids.numel() // seqlen):  # the GPTQ evaluation loop, written out
            batch = ids[i * seqlen:(i + 1) * seqlen][None]
            nlls.append(model(batch, labels=batch).loss.item())
    expected = math.exp(sum(nlls) / len(nlls))
    res = perplexity(model, ids, seqlen)
    assert res.windows == 10 and res.seqlen == seqlen
    assert res.ppl == pytest.approx(expected, rel=1e-6)
    assert perplexity(model, ids, seqlen, max_windows=3).windows == 3


def test_seqlen_rules():
    assert choose_seqlen(None, 1024) == 1024
    assert choose_seqlen(None, 4096) == 2048
    with pytest.raises(QuantkitError, match="larger than the model allows"):
        choose_seqlen(4096, 1024)


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_eval_ppl_cli_json_on_tiny_models(tiny_model_dir, arch):
    d = tiny_model_dir(arch)
    r = runner.invoke(app, ["eval-ppl", str(d), "--seqlen", "128", "--max-windows", "2", "--json", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(out) >= {"ppl", "nll", "windows", "seqlen", "dataset", "model"}
    assert out["windows"] == 2 and out["seqlen"] == 128 and out["dataset"] == "kjv"
    assert out["ppl"] == pytest.approx(math.exp(out["nll"]))


def test_eval_ppl_cli_on_shipped_model_beats_chance():
    r = runner.invoke(app, ["eval-ppl", "builtin:reference", "--max-windows", "2", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["seqlen"] == 1024 and out["ppl"] < 60  # vocab is 8192: chance would be ~8192


@pytest.mark.parametrize("args,message", [
    (["/definitely/not/here"], "does not exist"),
    (["builtin:reference", "--seqlen", "4096"], "larger than the model allows"),
    (["builtin:reference", "--dataset", "nosuchset"], "unknown dataset"),
    (["builtin:reference", "--device", "tpu"], "unknown device"),
    (["builtin:reference", "--calib-samples", "8"], "--calib-samples sets the calibration of --recipe"),
    (["builtin:reference", "--calib-dataset", "kjv", "--calib-samples", "8"], "add --recipe or drop them"),
    (["builtin:reference", "--recipe", "rtn-w4a16-g128", "--calib-samples", "0"], "--calib-samples must be at least 1"),
    (["builtin:reference", "--recipe", "gptq-w4a16-g128", "--calib-dataset", "nosuchset"], "unknown dataset"),
])
def test_user_errors_are_one_line_exit_2(args, message):
    r = runner.invoke(app, ["eval-ppl", *args])
    assert r.exit_code == 2
    err = r.stderr.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in r.output


@pytest.mark.parametrize("args,message", [
    (["--recipe", "gptq-w4a16-g128", "--max-windows", "0"], "--max-windows must be at least 1, got 0"),
    (["--max-windows", "-1"], "--max-windows must be at least 1, got -1"),
    (["--recipe", "gptq-w4a16-g128", "--seqlen", "1"], "--seqlen must be at least 2, got 1"),
])
def test_window_options_are_refused_before_the_model_loads(monkeypatch, args, message):
    """Not after a GPTQ run: the model is never loaded (load_model would fail the test)."""
    import quantkit.model as model_pkg

    monkeypatch.setattr(model_pkg, "load_model", lambda *a, **k: pytest.fail("loaded the model before the check"))
    r = runner.invoke(app, ["eval-ppl", "builtin:reference", *args])
    assert r.exit_code == 2 and r.stderr.strip() == f"error: {message}"


def test_dir_without_config_and_short_text_errors(tmp_path):
    r = runner.invoke(app, ["eval-ppl", str(tmp_path)])
    assert r.exit_code == 2 and "no config.json" in r.stderr
    short = tmp_path / "short.txt"
    short.write_text("too short")
    r = runner.invoke(app, ["eval-ppl", "builtin:reference", "--dataset", str(short)])
    assert r.exit_code == 2 and "fewer than one window" in r.stderr


def test_cuda_out_of_memory_is_one_line_exit_2(monkeypatch):
    """A size too large for the GPU is the user's to change: one line naming it, no traceback; other runtime
    errors still surface whole."""
    import quantkit.eval

    def oom(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has 3 GiB free.")

    monkeypatch.setattr(quantkit.eval, "perplexity", oom)
    r = runner.invoke(app, ["eval-ppl", "builtin:reference", "--device", "cpu"])
    last = r.stderr.strip().splitlines()[-1]  # after the progress bar
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert last.startswith("error: out of GPU memory (CUDA out of memory. Tried to allocate 20.00 GiB")
    assert "a smaller batch, sequence length or token count" in last

    def other(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(quantkit.eval, "perplexity", other)
    r = runner.invoke(app, ["eval-ppl", "builtin:reference", "--device", "cpu"])
    assert r.exit_code == 1 and isinstance(r.exception, RuntimeError)


@pytest.fixture
def keep_sigterm():
    """main() installs its SIGTERM handler for the process: put the previous one back after the test."""
    import signal

    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


def test_out_of_memory_while_loading_weights_is_the_oom_line_not_bad_weights(monkeypatch):
    """from_pretrained's CUDA OOM (with --device-map, weights go straight to the GPU) is a RuntimeError too: it must
    reach the CLI's out-of-memory line, not the loader's 'could not load the weights … fix config.json'."""
    import transformers

    def oom(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", oom)
    r = runner.invoke(app, ["eval-ppl", "builtin:reference", "--device", "cpu"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "error: out of GPU memory (CUDA out of memory. Tried to allocate 2.00 GiB)" in r.stderr
    assert "fix config.json" not in r.stderr


def test_console_script_exit_codes(monkeypatch, capsys, keep_sigterm):
    """main(): a user error (QuantkitError) exits 2 with one line, --help exits 0."""
    from quantkit.cli import main

    monkeypatch.setattr("sys.argv", ["quantkit", "bench", "--shapes", "64x0"])
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.startswith("error: --shapes takes NxK pairs") and len(err.splitlines()) == 1
    monkeypatch.setattr("sys.argv", ["quantkit", "--help"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 0 and "Usage" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["bench", "--reps", "abc"], "Invalid value for '--reps'"),
    (["bench", "--nope"], "No such option: --nope"),
    (["nosuchcmd"], "No such command 'nosuchcmd'"),
    (["search"], "Missing argument 'MODEL'"),
])
def test_click_usage_errors_are_one_line_exit_2(monkeypatch, capsys, keep_sigterm, argv, message):
    """The console script prints click's usage errors as quantkit's own one-line errors (not click's usage box)."""
    from quantkit.cli import main

    monkeypatch.setattr("sys.argv", ["quantkit", *argv])
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1
    assert err.startswith("error: ") and message in err and "--help`)" in err


def test_console_script_alone_prints_help_and_exits_0(monkeypatch, capsys, keep_sigterm):
    from quantkit.cli import main

    monkeypatch.setattr("sys.argv", ["quantkit"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 0 and "Usage" in capsys.readouterr().out


def test_demo_runs_calibrated_and_uncalibrated_recipes(capsys):
    """The README's demo (a short version): RTN recipes get no calibration options, GPTQ and the salience search
    get the demo's windows; a line per finished configuration, the table, and one next step."""
    from quantkit.demo import DemoRow, run_demo

    rows = run_demo(max_windows=1, device="cpu", calib_samples=2,
                    configs=[DemoRow("RTN W4A16", "rtn-w4a16-g128"), DemoRow("GPTQ W4A16", "gptq-w4a16-g128"),
                             DemoRow("MixLLM p10", "mixllm-w4a8-rtn", 4.4)])
    assert [r["config"] for r in rows[1:]] == ["RTN W4A16", "GPTQ W4A16", "MixLLM p10"]
    assert rows[1]["calibration"] is None and rows[2]["calibration"]["samples"] == 2
    assert all(r["windows"] == 1 and r["ppl"] > 1 and r["seconds"] > 0 for r in rows)
    assert 4.3 < rows[3]["avg_bits"] <= 4.4
    out = capsys.readouterr()
    assert "done  GPTQ W4A16" in out.err and "quantkit demo" in out.out and "Next, on your own model" in out.out


def test_demo_protocols_cover_the_story():
    """The quick demo shows FP, RTN, GPTQ, AWQ, MixLLM p0/p10, LiquidQuant and W8A8; --full adds p20 and reads
    the BENCHMARKS protocol's windows."""
    from quantkit.demo import FULL_PROTOCOL, QUICK_PROTOCOL

    recipes = [r.recipe for r in QUICK_PROTOCOL.rows]
    assert recipes == ["rtn-w4a16-g128", "gptq-w4a16-g128", "awq-w4a16-g128", "mixllm-w4a8", "mixllm-w4a8",
                       "lqq-w4a8", "w8a8"]
    assert [r.target_bits for r in QUICK_PROTOCOL.rows if r.target_bits] == [4.4]
    assert [r.target_bits for r in FULL_PROTOCOL.rows if r.target_bits] == [4.4, 4.8]
    assert (FULL_PROTOCOL.windows, FULL_PROTOCOL.calib_samples) == (40, 32)


def test_calibration_options_for_a_recipe_without_calibration_warn_and_go_on(monkeypatch, tmp_path):
    """RTN without clipping reads no calibration data: --calib-samples / --calib-dataset are ignored with one yellow
    warning line, and the command goes on (a loop over every recipe passes the same options to each)."""
    import quantkit.model as model_pkg
    from quantkit.pack import run_pack

    def reached(*a, **k):
        raise QuantkitError("the model would load here")

    monkeypatch.setattr(model_pkg, "load_model", reached)
    r = runner.invoke(app, ["eval-ppl", "builtin:reference", "--recipe", "rtn-w4a16-g128", "--calib-samples", "8",
                            "--calib-dataset", "kjv"])
    assert r.exit_code == 2 and r.stderr.strip().splitlines() == [
        "warning: --calib-samples, --calib-dataset are ignored: recipe 'rtn-w4a16-g128' quantizes without "
        "calibration data (rtn, no clipping search)",
        "error: the model would load here"]
    warned = []
    with pytest.raises(QuantkitError, match="the model would load here"):
        run_pack("builtin:reference", "lqq-w4a8-rtn", str(tmp_path / "o"), calib_samples=4, calib_seqlen=64,
                 calib_dataset="kjv", device="cpu", progress=False, warn=warned.append)
    assert warned == ["--calib-samples, --calib-seqlen, --calib-dataset are ignored: recipe 'lqq-w4a8-rtn' "
                      "quantizes without calibration data (lqq, no clipping search)"]