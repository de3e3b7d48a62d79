"""What users type as inputs, end to end through the CLI: built-in names, text encodings, empty and tabular
datasets (--text-column), mistyped paths, and missing options (issue 35)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from quantkit.cli import app

runner = CliRunner()
FAST = ["--seqlen", "32", "--max-windows", "1", "--device", "cpu"]


@pytest.fixture(autouse=True)
def _datasets_cache_in_tmp(tmp_path, monkeypatch):
    """datasets prepares every file it reads in its cache; keep the tests' copies out of the user's."""
    import datasets

    datasets.disable_progress_bars()
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-datasets-cache")


def _one_error_line(r, *parts: str) -> str:
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


def test_pack_and_search_refuse_an_output_named_like_a_builtin_model(tmp_path, monkeypatch):
    """`pack builtin:reference -o builtin:reference` made a folder that eval-ppl then read instead of the shipped
    model."""
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["pack", "builtin:reference", "-o", "builtin:reference", "--recipe", "rtn-w4a16-g128"])
    _one_error_line(r, "-o 'builtin:reference' is a built-in model name")
    r = runner.invoke(app, ["search", "builtin:reference", "-o", "./builtin:plan", "--strategy", "magnitude"])
    _one_error_line(r, "-o './builtin:plan' is a built-in model name")
    assert list(tmp_path.iterdir()) == []


def test_eval_ppl_reads_the_shipped_model_even_beside_a_folder_of_its_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fake = tmp_path / "builtin:reference"
    fake.mkdir()
    (fake / "quantkit.json").write_text("{}")  # a broken "packed checkpoint": reading it would fail
    text = tmp_path / "short.txt"
    text.write_text("In the beginning God created the heaven and the earth. " * 20)
    r = runner.invoke(app, ["eval-ppl", "builtin:reference", "--dataset", str(text), "--json", *FAST])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["model"] == "builtin:reference"


def test_latin1_text_is_refused_naming_the_byte(tmp_path):
    """It gave a perplexity of 20,226,323 with exit 0."""
    f = tmp_path / "latin.txt"
    f.write_bytes("Ye shall know the truth.\n\nCaf\u00e9 na\u00efve.\n".encode("latin-1"))
    r = runner.invoke(app, ["eval-ppl", "builtin:reference", "--dataset", str(f), *FAST])
    _one_error_line(r, "latin.txt' is not UTF-8 text: byte 29 (line 3) is 0xe9", "iconv -f latin1 -t utf-8")


@pytest.mark.parametrize("option", ["--dataset", "--calib-dataset"])
def test_an_empty_text_file_fails_before_the_model_loads_with_the_right_fix(tmp_path, option):
    """The model path does not exist: an error about the text proves that it came first."""
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    extra = ["--recipe", "gptq-w4a16-g128"] if option == "--calib-dataset" else []
    r = runner.invoke(app, ["eval-ppl", str(tmp_path / "no-model"), option, str(empty), *extra, *FAST])
    line = _one_error_line(r, "has no text: '", "empty.txt' is empty; put text in it, or pass another dataset")
    assert "--seqlen" not in line


def test_eval_ppl_on_a_parquet_column_and_a_refused_text_column(tmp_path):
    import datasets

    from quantkit.data.sources import builtin_text

    docs = builtin_text("test")[:6000].split("\n\n")
    f = tmp_path / "eval.parquet"
    datasets.Dataset.from_dict({"body": docs}).to_parquet(str(f))
    r = runner.invoke(app, ["eval-ppl", "builtin:reference", "--dataset", str(f), "--text-column", "body", "--json",
                            *FAST])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["ppl"] < 1000
    r = runner.invoke(app, ["eval-ppl", "builtin:reference", "--dataset", str(f), *FAST])
    _one_error_line(r, "has no column 'text' (its columns: body); name the text column with --text-column")
    r = runner.invoke(app, ["eval-ppl", "builtin:reference", "--text-column", "body", *FAST])
    _one_error_line(r, "--text-column picks the text column", "'kjv' has no columns, so drop it")


def test_pack_checks_the_calibration_text_column_before_loading(tmp_path):
    from quantkit.data.sources import builtin_text

    f = tmp_path / "calib.csv"
    f.write_text("id,body\n" + "".join(f"{i},\"{p}\"\n" for i, p in enumerate(builtin_text("train")[:8000]
                                                                              .replace('"', "").split("\n\n"))))
    out = tmp_path / "packed"
    r = runner.invoke(app, ["pack", "builtin:reference", "-o", str(out), "--recipe", "gptq-w4a16-g128",
                            "--calib-dataset", str(f), "--text-column", "nope", "--device", "cpu"])
    _one_error_line(r, "has no column 'nope' (its columns: id, body)")
    assert not out.exists()


def test_search_refuses_a_missing_text_column_before_loading(tmp_path):
    f = tmp_path / "calib.json"
    f.write_text(json.dumps([{"body": "some text"}]))
    r = runner.invoke(app, ["search", str(tmp_path / "no-model"), "-o", str(tmp_path / "p.json"),
                            "--calib-dataset", str(f)])
    _one_error_line(r, "has no column 'text' (its columns: body)")


def test_a_mistyped_local_path_fails_at_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    start = time.perf_counter()
    r = runner.invoke(app, ["eval-ppl", "./modles/llama", *FAST])
    _one_error_line(r, "model path './modles/llama' does not exist (no such folder: ")
    r = runner.invoke(app, ["eval-ppl", "org/model", *FAST])  # conftest sets HF_HUB_OFFLINE=1
    _one_error_line(r, "'org/model' is not a local folder (no such folder: ", "the hub is off (HF_HUB_OFFLINE)")
    assert time.perf_counter() - start < 5


def _main(*args: str) -> subprocess.CompletedProcess:
    code = "import sys; from quantkit.cli import main; sys.argv = ['quantkit', *sys.argv[1:]]; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)


def test_every_missing_option_is_named_at_once():
    """click stopped at the first missing option, so --recipe was reported only after -o was fixed."""
    r = _main("pack", "builtin:reference")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "error: Missing options '-o' / '--output' and '--recipe' (see `quantkit pack --help`)"]
    r = _main("pack", "builtin:reference", "-o", "x")
    assert r.stderr.strip() == "error: Missing option '--recipe' (see `quantkit pack --help`)"
