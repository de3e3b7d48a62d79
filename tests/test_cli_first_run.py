"""What a first run of the CLI meets: --version, `recipes`, -v/-q, shell completion, py.typed, the --help text,
option names shared by the commands, labels of the eval-ppl table and the pack summary, edited recipes' names, and
progress written to a log file."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

import quantkit
from quantkit import ui
from quantkit.cli import app
from quantkit.errors import QuantkitError

runner = CliRunner()
REPO = Path(__file__).resolve().parent.parent
COMMANDS = ("eval-ppl", "demo", "search", "pack", "inspect", "bench", "recipes")


@pytest.fixture(autouse=True)
def _normal_verbosity():
    """The quantkit callback sets the verbosity of the process; leave it as every other test expects."""
    yield
    ui.set_verbosity(ui.NORMAL)


def _main(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the console-script entry point (quantkit.cli.main) as `quantkit ARGS` in a fresh interpreter."""
    code = "import sys; from quantkit.cli import main; sys.argv = ['quantkit', *sys.argv[1:]]; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "COLUMNS": "200", **(env or {})}, timeout=60)


def test_version_prints_the_package_version_and_exits_0():
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.stdout == f"quantkit {quantkit.__version__}\n"


def test_the_entry_point_runs_version_and_shell_completion():
    """main() (the console script) with the callback's options and typer's completion protocol."""
    r = _main("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"quantkit {quantkit.__version__}", r.stderr
    r = _main(env={"_QUANTKIT_COMPLETE": "complete_bash", "COMP_WORDS": "quantkit rec", "COMP_CWORD": "1"})
    assert r.returncode == 0 and r.stdout.split() == ["recipes"], (r.stdout, r.stderr)


def test_shell_completion_options_are_offered():
    r = runner.invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert "--install-completion" in r.stdout and "--show-completion" in r.stdout
    r = runner.invoke(app, ["--show-completion", "bash"])
    assert r.exit_code == 0 and "_QUANTKIT_COMPLETE" in r.stdout


def test_recipes_lists_every_shipped_recipe_with_its_first_sentence():
    from quantkit.quant.recipe import shipped_recipes

    r = runner.invoke(app, ["recipes", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert [row["name"] for row in rows] == shipped_recipes() and len(rows) >= 7
    by_name = {row["name"]: row for row in rows}
    assert by_name["mixllm-w4a8"]["description"].endswith("group-wise g128.")  # the first of two sentences
    assert by_name["lqq-w4a8"]["description"].startswith("LiquidQuant (LiquidGEMM Sec. 4) two-level")  # "Sec. 4"
    assert by_name["gptq-w4a16-g128"] == {"name": "gptq-w4a16-g128", "scheme": "W4A16 g128", "method": "gptq",
                                          "calibration": True, "description": by_name["gptq-w4a16-g128"]
                                          ["description"]}
    assert by_name["rtn-w4a16-g128"]["calibration"] is False and by_name["w8a8"]["scheme"] == "W8A8 g128"
    table = runner.invoke(app, ["recipes"], env={"COLUMNS": "250"})
    assert table.exit_code == 0 and all(name in table.stdout for name in by_name)


def test_quiet_and_verbose_set_the_verbosity_and_contradict_each_other():
    r = runner.invoke(app, ["-q", "recipes"])
    assert r.exit_code == 0 and "gptq-w4a16-g128" in r.stdout and ui.quiet()  # results still print
    r = runner.invoke(app, ["-q", "search", "no/such/model", "-o", "p.json", "--strategy", "random",
                            "--calib-samples", "2"])
    assert r.stderr.startswith("warning: --calib-samples is ignored")  # warnings print under -q
    r = runner.invoke(app, ["-v", "recipes"])
    assert r.exit_code == 0 and ui.verbose()
    r = runner.invoke(app, ["-v", "-q", "recipes"])
    assert r.exit_code == 2 and r.stderr.strip() == ("error: -v/--verbose and -q/--quiet contradict each other; give "
                                                     "one of them")


def test_py_typed_ships_with_the_package():
    import tomllib

    assert (Path(quantkit.__file__).parent / "py.typed").is_file()
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "py.typed" in data["tool"]["setuptools"]["package-data"]["quantkit"]


@pytest.mark.parametrize("name", COMMANDS)
def test_help_shows_flags_plainly_and_upper_case_arguments(name):
    r = runner.invoke(app, [name, "--help"], env={"COLUMNS": "120"})
    assert r.exit_code == 0 and "<bool>" not in r.stdout
    usage = r.stdout.strip().splitlines()[0]
    assert usage == usage.replace("model", "").replace("packed", "").replace("checkpoint", "")  # MODEL, PACKED
    for flag in ("--json", "--force", "--verify", "--decode-step", "--no-baseline"):
        for line in r.stdout.splitlines():
            if f" {flag} " in line:
                assert "<" not in line.split(flag, 1)[1].split()[0], line  # no type placeholder after a flag


def test_command_list_gives_each_command_one_unbroken_sentence():
    """The command list shows each command's first help paragraph; a line break inside it cut sentences."""
    from typer.main import get_command

    group = get_command(app)
    for name in COMMANDS:
        first = group.commands[name].help.split("\n\n")[0]
        assert "\n" not in first and len(first) <= 110 and first.endswith("."), (name, first)
    r = runner.invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert "Kernel speed on this GPU against torch FP16 (cuBLAS), or one decode step of a packed model." in r.stdout
    assert "<bool>" not in r.stdout


def test_search_takes_the_calib_names_and_the_old_ones_as_hidden_deprecated_aliases():
    help_text = runner.invoke(app, ["search", "--help"], env={"COLUMNS": "160"}).stdout
    assert "--calib-samples" in help_text and "--calib-dataset" in help_text
    assert "--samples " not in help_text and "--dataset " not in help_text
    r = runner.invoke(app, ["search", "no/such/model", "-o", "p.json", "--samples", "0"])
    assert r.exit_code == 2 and r.stderr.strip().splitlines() == [
        "warning: --samples is deprecated: use --calib-samples (same meaning)",
        "error: --calib-samples must be at least 1, got 0"]
    r = runner.invoke(app, ["search", "no/such/model", "-o", "p.json", "--dataset", "nosuchset"])
    assert r.exit_code == 2 and "use --calib-dataset" in r.stderr and "unknown dataset 'nosuchset'" in r.stderr
    r = runner.invoke(app, ["search", "m", "-o", "p.json", "--samples", "2", "--calib-samples", "2"])
    assert r.exit_code == 2 and r.stderr.strip() == "error: --samples is the old name of --calib-samples; give " \
                                                    "--calib-samples only"


def test_pack_takes_calib_dataset_and_checks_it_before_loading(tmp_path):
    assert "--calib-dataset" in runner.invoke(app, ["pack", "--help"], env={"COLUMNS": "160"}).stdout
    r = runner.invoke(app, ["pack", "builtin:reference", "--recipe", "gptq-w4a16-g128", "-o", str(tmp_path / "o"),
                            "--calib-dataset", "nosuchset"])
    assert r.exit_code == 2 and "unknown dataset 'nosuchset'" in r.stderr and not (tmp_path / "o").exists()


def test_bench_device_defaults_to_auto(monkeypatch):
    import torch

    from quantkit.bench import command

    command.check_kernel_only(None, None, None, "auto")  # the default is no --device choice in a kernel sweep
    with pytest.raises(QuantkitError, match="--device is for --decode-step only"):
        command.check_kernel_only(None, None, None, "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    err = io.StringIO()
    monkeypatch.setattr(ui, "err_console", Console(file=err, width=300))
    a = command.decode_step_args("ckpt", None, None, None, None, None, None, None, None, "auto")
    assert a.device == "cpu" and err.getvalue().startswith("warning: no CUDA GPU is visible, so --decode-step runs "
                                                           "on the CPU")
    assert command.decode_step_args("ckpt", None, None, None, None, None, None, None, None, "cpu").device == "cpu"
    help_text = runner.invoke(app, ["bench", "--help"], env={"COLUMNS": "200"}).stdout
    assert "[default: auto]" in [line for line in help_text.splitlines() if "--device" in line][0]


def test_eval_ppl_rows_name_the_real_dtype_and_show_average_bits():
    from quantkit.cli import _ppl_table, ppl_rows

    base = {"model": "m", "dataset": "kjv", "device": "cpu", "windows": 2, "seqlen": 64, "nll": 2.0, "ppl": 7.4}
    res = dict(base, dtype="float32", ppl_baseline=7.0, nll_baseline=1.9, recipe="mixllm-w4a8", plan="/x/plan.json",
               avg_bits=4.4)
    rows = ppl_rows(res)
    assert [label for label, _ in rows] == ["fp32", "mixllm-w4a8 + plan plan.json"]
    assert rows[0][1]["ppl"] == 7.0 and rows[0][1]["avg_bits"] == 32
    assert ppl_rows(dict(res, dtype="bfloat16"))[0][0] == "bf16"
    out = io.StringIO()
    Console(file=out, width=200).print(_ppl_table("t", rows))
    assert "avg bits" in out.getvalue() and "4.40" in out.getvalue() and "32.00" in out.getvalue()
    assert "fp16" not in out.getvalue()
    plain = io.StringIO()
    Console(file=plain, width=200).print(_ppl_table("t", ppl_rows(dict(base, dtype="float32"))))
    assert "avg bits" not in plain.getvalue()  # no recipe: nothing was quantized


def _manifest(export: str, target: str, act_bits, layout: str, bits: int = 4) -> dict:
    part = {"bits": bits, "n_rows": 8, "layout": layout}
    return {"linears": {f"l{i}": {"in_features": 16, "partitions": [part]} for i in range(3)},
            "tensors": {"l0.qweight": {"nbytes": 64, "shard": "model.safetensors", "linear": "l0"}},
            "source": {"model": "m", "parameters": 100}, "recipe": {"name": "r"}, "export": export,
            "target": target, "format_version": 1, "activation": {"bits": act_bits} if act_bits else None}


def test_pack_summary_says_what_the_layers_run_and_engine_formats_have_no_target(tmp_path):
    from quantkit.checkpoint.report import summarize, summary_table

    def table(manifest):
        s = summarize(tmp_path, manifest)
        out = io.StringIO()
        Console(file=out, width=200).print(summary_table(s))
        return s, out.getvalue()

    s, text = table(_manifest("quantkit", "sm90", 8, "w4a16"))
    assert s["layouts"] == {"w4a16": 3} and "w4a16 (runs W4A8) ×3" in text
    assert table(_manifest("quantkit", "sm90", 8, "w4a8-lqq"))[1].count("w4a8-lqq ×3") == 1
    assert "w4a16 ×3" in table(_manifest("quantkit", "sm80", None, "w4a16"))[1]
    s, text = table(_manifest("gptq", "reference", None, "gptq"))
    assert s["target"] is None and "reference" not in text and "format / target" not in text
    assert "gptq (runs W4A16) ×3" in text


def test_an_edited_copy_of_a_shipped_recipe_says_so_in_its_name(tmp_path):
    import yaml

    from quantkit.quant.recipe import load_recipe, shipped_dir

    shipped = shipped_dir("quantkit.recipes", "recipes").joinpath("gptq-w4a16-g128.yaml").read_text()
    same, words, edited, renamed = (tmp_path / n for n in ("same.yaml", "words.yaml", "my-gptq.yaml", "mine.yaml"))
    same.write_text(shipped)
    data = yaml.safe_load(shipped)
    words.write_text(yaml.safe_dump(dict(data, description="my words")))
    edited.write_text(yaml.safe_dump(dict(data, weight=dict(data["weight"], bits=3))))
    renamed.write_text(yaml.safe_dump(dict(data, name="my-w3", weight=dict(data["weight"], bits=3))))
    assert load_recipe(str(same)).name == "gptq-w4a16-g128"  # the shipped file itself, or a copy
    assert load_recipe(str(words)).name == "gptq-w4a16-g128"  # quantizes the same
    assert load_recipe(str(edited)).name == "gptq-w4a16-g128 (edited: my-gptq.yaml)"
    assert load_recipe(str(renamed)).name == "my-w3"
    assert load_recipe("gptq-w4a16-g128").name == "gptq-w4a16-g128"


def test_threads_option_and_environment(monkeypatch):
    """--threads and QUANTKIT_THREADS set torch's CPU threads; a bad value is one error line, exit 2."""
    import subprocess
    import sys

    code = ("import sys, torch; from quantkit.cli import main; sys.argv = ['quantkit'] + sys.argv[1:]; "
            "import atexit; atexit.register(lambda: print('threads', torch.get_num_threads(), file=sys.stderr)); "
            "main()")
    run = lambda args, env: subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                                           env={**__import__("os").environ, **env})
    r = run(["--threads", "1", "recipes"], {})
    assert r.returncode == 0 and "threads 1" in r.stderr
    r = run(["recipes"], {"QUANTKIT_THREADS": "1"})
    assert r.returncode == 0 and "threads 1" in r.stderr
    r = run(["recipes"], {"QUANTKIT_THREADS": "zero"})
    assert r.returncode == 2 and "QUANTKIT_THREADS must be a positive number" in r.stderr
    assert "Traceback" not in r.stderr
    r = run(["--threads", "0", "recipes"], {})
    assert r.returncode == 2 and "--threads must be a positive number" in r.stderr


def test_waiting_threads_sleep_unless_the_user_chose():
    from quantkit.threads import configure_cpu_threads

    import os
    saved = os.environ.get("OMP_WAIT_POLICY")
    try:
        os.environ.pop("OMP_WAIT_POLICY", None)
        configure_cpu_threads()
        assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
        os.environ["OMP_WAIT_POLICY"] = "ACTIVE"
        configure_cpu_threads()
        assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
    finally:
        if saved is None:
            os.environ.pop("OMP_WAIT_POLICY", None)
        else:
            os.environ["OMP_WAIT_POLICY"] = saved


def test_python_api_quantize_then_load(tmp_path):
    """The README's Python example: quantkit.quantize writes what `quantkit pack` writes, quantkit.load reads it
    back as the HF model with QuantLinear modules that generates tokens."""
    import torch

    import quantkit
    from quantkit.runtime.quant_linear import QuantLinear

    out = tmp_path / "ref-rtn"
    info = quantkit.quantize("builtin:reference", "rtn-w4a16-g128", str(out))
    assert info["recipe"] == "rtn-w4a16-g128" and (out / "quantkit.json").is_file()
    model = quantkit.load(str(out), device="cpu")
    assert any(isinstance(m, QuantLinear) for m in model.modules())
    ids = torch.tensor([[1, 2, 3, 4]])
    assert model.generate(ids, max_new_tokens=3, do_sample=False).shape == (1, 7)
    with pytest.raises(quantkit.QuantkitError, match="--force"):
        quantkit.quantize("builtin:reference", "rtn-w4a16-g128", str(out))


def test_the_command_line_starts_without_torch():
    """`quantkit --version`, `--help` and shell completion import only the CLI: torch loads inside commands."""
    code = "import sys, quantkit.cli; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr


@pytest.mark.parametrize("args", [
    ["eval-ppl", "builtin:reference", "--recipe", "rtn-w4a16-g128", "--max-windows", "1", "--seqlen", "32",
     "--no-baseline", "--calib-dataset", "no-such.parquet"],
    ["search", "builtin:reference", "--strategy", "random", "--target-bits", "4.4", "-o", "PLAN",
     "--calib-dataset", "no-such.txt", "--calib-samples", "3"],
])
def test_ignored_calibration_options_are_not_read(args, tmp_path):
    """Options a recipe or strategy ignores get one warning and are never opened or checked."""
    args = [str(tmp_path / "plan.json") if a == "PLAN" else a for a in args]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "is ignored" in r.output or "are ignored" in r.output
