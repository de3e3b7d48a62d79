"""Packing and loading when things go wrong: a real full file system (tmpfs), temporary folders of killed packs,
damaged shards and config.json, the one overwrite rule of `pack -o` and `search -o`, and the dtype pack holds a
model in on the CPU."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from quantkit.checkpoint import atomic, load_packed, read_manifest
from quantkit.checkpoint.reader import check_files
from quantkit.errors import QuantkitError
from quantkit.pack import run_pack

FAST = dict(device="cpu", progress=False)
EVAL = ["--device", "cpu", "--seqlen", "32", "--max-windows", "1"]


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir("llama")


@pytest.fixture(scope="module")
def ckpt(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt") / "rtn"
    run_pack(str(model_dir), "rtn-w4a16-g128", str(out), max_shard_size="300KB", **FAST)
    return out


def _app():
    from quantkit.cli import app

    return app


def _one_line_error(res, *fragments: str) -> None:
    assert res.exit_code == 2, res.output
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert "Traceback" not in res.output and len(errors) == 1, res.stderr
    for f in fragments:
        assert f in errors[0], res.stderr


# ------------------------------------------------------------------------------------------------ full disk


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs (a real file system that fills up); skipped where mounting is not permitted."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if sys.platform != "linux" or shutil.which("mount") is None:
        pytest.skip("needs Linux mount(8) for a tmpfs")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True,
                         text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN): {res.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_full_disk_is_refused_before_quantizing(model_dir, small_disk, monkeypatch):
    import quantkit.quant.apply as apply

    monkeypatch.setattr(apply, "quantize_model", lambda *a, **k: pytest.fail("quantized for a disk without room"))
    res = CliRunner().invoke(_app(), ["pack", str(model_dir), "--recipe", "rtn-w4a16-g128", "-o",
                                      str(small_disk / "out"), "--device", "cpu"])
    _one_line_error(res, "no space left on the device (the checkpoint needs at least", "MB free in",
                    "nothing was written (free space there or choose another -o)")
    assert os.listdir(small_disk) == []


def test_disk_that_fills_while_writing_is_one_line(model_dir, small_disk, monkeypatch):
    """safetensors reports ENOSPC as its own exception type; the free-space checks are skipped here so that the
    file system really fills up half-way through the shards."""
    monkeypatch.setattr(atomic, "check_free_space", lambda *a, **k: None)
    res = CliRunner().invoke(_app(), ["pack", str(model_dir), "--recipe", "rtn-w4a16-g128", "-o",
                                      str(small_disk / "out"), "--device", "cpu", "--max-shard-size", "300KB"])
    _one_line_error(res, "cannot write checkpoint", "no space left on the device (the checkpoint needs about",
                    "nothing was written")
    assert os.listdir(small_disk) == []


# ------------------------------------------------------------------------------------- stale temporaries


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _temp(out: Path, suffix: str, marker: dict | None, age_s: float = 0) -> Path:
    d = out.parent / f"{out.name}.tmp-{suffix}"
    d.mkdir()
    (d / "model-00001-of-00001.safetensors").write_bytes(b"half")
    if marker is not None:
        (d / atomic.WRITER_MARKER).write_text(json.dumps(marker))
    if age_s:
        old = time.time() - age_s
        for p in list(d.iterdir()) + [d]:
            os.utime(p, (old, old))
    return d


def test_stale_temporaries_of_killed_writers_are_removed(tmp_path):
    out = tmp_path / "out"
    me = atomic._writer_identity()
    dead = _temp(out, "dead0000", dict(me, pid=_dead_pid()))
    reused = _temp(out, "reused00", dict(me, start="1"))  # our PID, another process's start time
    rebooted = _temp(out, "reboot00", dict(me, boot_id="another-boot"))
    unmarked_old = _temp(out, "oldnomrk", None, age_s=atomic.STALE_AFTER_S + 60)
    live = _temp(out, "live0000", me)
    unmarked_new = _temp(out, "newnomrk", None)  # a writer between mkdtemp and its marker
    remote = _temp(out, "remote00", dict(me, host="another-host", pid=_dead_pid()))
    other_output = _temp(tmp_path / "other", "dead0001", dict(me, pid=_dead_pid()))
    not_ours = tmp_path / "out.tmp-notes.txt"
    not_ours.write_text("keep")
    removed = atomic.remove_stale_temps(out)
    assert sorted(removed) == sorted([dead, reused, rebooted, unmarked_old])
    assert all(not p.exists() for p in removed)
    assert live.is_dir() and unmarked_new.is_dir() and remote.is_dir() and other_output.is_dir()
    assert not_ours.read_text() == "keep"


def test_a_killed_writer_is_cleaned_up_and_a_live_one_kept(tmp_path):
    """A second writer to the same output keeps the first one's directory while that one runs, and removes it
    once it was killed."""
    out = tmp_path / "out"
    code = ("import sys, time\nfrom quantkit.checkpoint.atomic import atomic_directory\n"
            f"with atomic_directory({str(out)!r}) as tmp:\n    print(tmp, flush=True)\n    time.sleep(60)\n")
    writer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parent.parent)
    try:
        tmp = Path(writer.stdout.readline().strip())
        assert tmp.is_dir() and (tmp / atomic.WRITER_MARKER).is_file()
        assert atomic.remove_stale_temps(out) == [] and tmp.is_dir()
    finally:
        writer.kill()
        writer.wait()
    assert atomic.remove_stale_temps(out) == [tmp] and not tmp.exists()


def test_pack_removes_a_stale_temporary_and_says_so(model_dir, tmp_path):
    out = tmp_path / "out"
    stale = _temp(out, "stale000", dict(atomic._writer_identity(), pid=_dead_pid()))
    res = CliRunner().invoke(_app(), ["pack", str(model_dir), "--recipe", "rtn-w4a16-g128", "-o", str(out),
                                      "--device", "cpu", "--json"])
    assert res.exit_code == 0, res.output
    assert not stale.exists() and read_manifest(out)["shards"]
    warnings = json.loads(res.stdout.strip().splitlines()[-1])["warnings"]
    assert any(f"removed '{stale}'" in w for w in warnings)
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert not (out / atomic.WRITER_MARKER).exists()


# ----------------------------------------------------------------------------------------- damaged shards


def _header_span(shard: Path) -> int:
    (n,) = struct.unpack("<Q", shard.read_bytes()[:8])
    return 8 + n


def _flip(path: Path, at: int, mask: int = 0x01) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= mask
    path.write_bytes(bytes(raw))


def test_every_flipped_header_byte_is_caught(ckpt, tmp_path):
    """Each byte of a shard's length prefix and JSON header, flipped in turn: the cheap default check (no tensor
    data read) refuses it with a one-line error."""
    c = shutil.copytree(ckpt, tmp_path / "c")
    manifest = read_manifest(c)
    shard = c / sorted(manifest["shards"])[-1]
    good = shard.read_bytes()
    span = _header_span(shard)
    for at in range(span):
        raw = bytearray(good)
        raw[at] ^= 0x04
        shard.write_bytes(bytes(raw))
        with pytest.raises(QuantkitError, match=f"shard '{shard.name}'|in shard '{shard.name}'|from shard"):
            check_files(c, manifest)
    shard.write_bytes(good)
    check_files(c, manifest)


@pytest.mark.parametrize("damage,message", [
    ("header", "its header differs from the one written"),
    ("truncate", "is truncated"),
    ("extend", "bytes after the last tensor"),
])
def test_eval_ppl_refuses_a_damaged_shard(ckpt, tmp_path, damage, message):
    c = shutil.copytree(ckpt, tmp_path / "c")
    shard = c / sorted(read_manifest(c)["shards"])[0]
    if damage == "header":  # "pt" → "pu" in the metadata: still valid JSON with the same tensors
        raw = shard.read_bytes()
        at = raw.index(b'"pt"', 0, _header_span(shard)) + 2
        _flip(shard, at)
    elif damage == "truncate":
        shard.write_bytes(shard.read_bytes()[:-1])
    else:
        shard.write_bytes(shard.read_bytes() + b"\0")
    res = CliRunner().invoke(_app(), ["eval-ppl", str(c), *EVAL])
    _one_line_error(res, f"shard '{shard.name}'", message)


def test_flipped_data_byte_needs_verify(ckpt, tmp_path):
    c = shutil.copytree(ckpt, tmp_path / "c")
    shard = c / sorted(read_manifest(c)["shards"])[0]
    _flip(shard, shard.stat().st_size - 1, 0x80)
    assert CliRunner().invoke(_app(), ["eval-ppl", str(c), *EVAL]).exit_code == 0  # data is not hashed by default
    res = CliRunner().invoke(_app(), ["eval-ppl", str(c), "--verify", *EVAL])
    _one_line_error(res, f"in shard '{shard.name}' fails its sha256 check")


def test_verify_is_for_packed_checkpoints(model_dir):
    res = CliRunner().invoke(_app(), ["eval-ppl", str(model_dir), "--verify", *EVAL])
    _one_line_error(res, "--verify checks a packed checkpoint's sha256s")


def test_checkpoint_without_shard_records_is_still_checked(ckpt, tmp_path):
    """A checkpoint written before the manifest recorded shard sizes and header hashes: the header's own layout is
    still checked against the manifest and the file size."""
    c = shutil.copytree(ckpt, tmp_path / "c")
    m = json.loads((c / "quantkit.json").read_text())
    del m["shards"]
    (c / "quantkit.json").write_text(json.dumps(m))
    load_packed(c, device="cpu", load_tokenizer=False)
    shard = c / next(iter(m["tensors"].values()))["shard"]
    shard.write_bytes(shard.read_bytes() + b"\0")
    with pytest.raises(QuantkitError, match="1 bytes after the last tensor"):
        load_packed(c, device="cpu", load_tokenizer=False)


# ------------------------------------------------------------------------------------------- config.json


@pytest.mark.parametrize("config,message", [
    ("truncated", "config.json of checkpoint '{c}' is not readable JSON"),
    ({"architectures": ["LlamaForCausalLM"]}, "config.json of checkpoint '{c}' has no model_type"),
    ({"model_type": "qwen2"}, "is for model_type 'qwen2', its manifest for 'llama'"),
    ([1, 2], "has no model_type"),
])
def test_inspect_and_eval_refuse_a_broken_config(ckpt, tmp_path, config, message):
    c = shutil.copytree(ckpt, tmp_path / "c")
    text = (c / "config.json").read_text()
    (c / "config.json").write_text(text[:len(text) // 2] if config == "truncated" else json.dumps(config))
    for args in (["inspect", str(c)], ["eval-ppl", str(c), *EVAL]):
        _one_line_error(CliRunner().invoke(_app(), args), message.format(c=c))


# ------------------------------------------------------------------------------------- one overwrite rule


def test_search_refuses_an_existing_plan_without_force(model_dir, tmp_path, monkeypatch):
    from quantkit.search.command import run_search

    plan = tmp_path / "plan.json"
    args = ["search", str(model_dir), "-o", str(plan), "--strategy", "random", "--recipe", "mixllm-w4a8-rtn",
            "--device", "cpu"]
    assert CliRunner().invoke(_app(), args).exit_code == 0
    before = plan.read_bytes()
    import quantkit.model as model_pkg

    with monkeypatch.context() as m:
        m.setattr(model_pkg, "load_model", lambda *a, **k: pytest.fail("loaded the model before the check"))
        _one_line_error(CliRunner().invoke(_app(), args),
                        f"plan '{plan}' already exists; pass --force to replace it or choose another -o")
        with pytest.raises(QuantkitError, match="already exists; pass --force"):
            run_search(str(model_dir), str(plan), "mixllm-w4a8-rtn", strategy="random", show_progress=False)
    assert plan.read_bytes() == before
    res = CliRunner().invoke(_app(), args + ["--force", "--seed", "7", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(plan.read_text())["search"]["seed"] == 7
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]  # the atomic write left no temporary
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me")
    _one_line_error(CliRunner().invoke(_app(), args[:3] + [str(notes)] + args[4:] + ["--force"]),
                    "exists and is not a quantkit plan; --force only replaces plans")
    assert notes.read_text() == "keep me"


# ------------------------------------------------------------------------------------------------ memory


@pytest.fixture(scope="module")
def fp16_model_dir(tmp_path_factory):
    from tests.conftest import build_tiny_model, shipped_tokenizer

    d = tmp_path_factory.mktemp("tiny-fp16")
    tok = shipped_tokenizer()
    build_tiny_model("llama", vocab_size=len(tok)).half().save_pretrained(d)
    tok.save_pretrained(d)
    assert json.loads((d / "config.json").read_text())["dtype"] == "float16"
    return d


class _Loaded(Exception):
    pass


@pytest.mark.parametrize("recipe", ["rtn-w4a16-g128", "lqq-w4a8-rtn"])
def test_pack_on_cpu_holds_an_fp16_source_in_fp16(fp16_model_dir, tmp_path, monkeypatch, recipe):
    """RTN/LiquidQuant quantize each weight upcast to fp32 on its own: holding the fp16 source as fp16 (half the
    memory of fp32) writes the same checkpoint as an fp32 load."""
    dtypes = _record_load_dtypes(monkeypatch)
    run_pack(str(fp16_model_dir), recipe, str(tmp_path / "auto"), **FAST)
    run_pack(str(fp16_model_dir), recipe, str(tmp_path / "fp32"), dtype="fp32", **FAST)
    assert dtypes == [torch.float16, torch.float32]
    a, b = read_manifest(tmp_path / "auto"), read_manifest(tmp_path / "fp32")
    assert a["tensors"] == b["tensors"] and a["source"]["dtype"] == "float16"


def test_pack_on_cpu_keeps_fp32_for_calibrated_recipes(fp16_model_dir, tmp_path, monkeypatch):
    """GPTQ runs whole decoder layers on the calibration data: on the CPU in fp32, as eval-ppl's fake-quant does,
    so that both produce the same codes."""
    dtypes = _record_load_dtypes(monkeypatch, stop=True)
    with pytest.raises(_Loaded):
        run_pack(str(fp16_model_dir), "gptq-w4a16-g128", str(tmp_path / "o"), **FAST)
    assert dtypes == [torch.float32]


def _record_load_dtypes(monkeypatch, stop: bool = False) -> list:
    import quantkit.model as model_pkg

    real, dtypes = model_pkg.load_model, []

    def recording(*a, **k):
        loaded = real(*a, **k)
        dtypes.append(next(loaded.model.parameters()).dtype)
        if stop:
            raise _Loaded
        return loaded

    monkeypatch.setattr(model_pkg, "load_model", recording)
    return dtypes


@pytest.mark.parametrize("force", [False, True])
def test_two_writers_racing_to_one_output(tmp_path, force):
    """The second writer to finish refuses to replace what the first one published, unless --force."""
    out = tmp_path / "out"
    with pytest.raises(QuantkitError, match="created by another writer while this one wrote") if not force \
            else contextlib.nullcontext():
        with atomic.atomic_directory(out, force=force) as tmp:
            (tmp / atomic.MANIFEST_NAME).write_text("second")
            with atomic.atomic_directory(out) as other:
                (other / atomic.MANIFEST_NAME).write_text("first")
    assert (out / atomic.MANIFEST_NAME).read_text() == ("second" if force else "first")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
