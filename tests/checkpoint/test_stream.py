"""``quantkit pack --stream``: one decoder layer at a time, the same tensors as an ordinary pack, and an interrupted
run that resumes to the same bytes as an uninterrupted one; what it cannot do is refused in one line."""

from __future__ import annotations

import pytest
import torch

from quantkit.checkpoint import load_packed, read_manifest
from quantkit.checkpoint import stream as stream_mod
from quantkit.errors import QuantkitError
from quantkit.pack import run_pack

FAST = dict(device="cpu", progress=False)


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir("llama", intermediate_size=200, num_hidden_layers=3)


def _logits(path, vocab: int = 512) -> torch.Tensor:  # ids below every test model's vocabulary
    ids = torch.randint(0, vocab, (2, 19), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return load_packed(str(path), device="cpu", verify=True, load_tokenizer=False).model(ids).logits


def _files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("recipe,arch", [("rtn-w4a16-g128", {}), ("fp8-w8a8", {}),
                                         ("lqq-w4a8-rtn", {"tie_word_embeddings": True}),
                                         ("rtn-w4a16-g128", {"arch": "qwen3_moe"}),
                                         ("rtn-w4a16-g128", {"arch": "mixtral"})])
def test_a_streamed_pack_holds_the_ordinary_packs_tensors(tiny_model_dir, tmp_path, recipe, arch):
    arch = dict(arch)
    family = arch.pop("arch", "llama")
    size = {"intermediate_size": 256} if family == "llama" else {}
    src = tiny_model_dir(family, num_hidden_layers=3, **size, **arch)
    run_pack(str(src), recipe, str(tmp_path / "whole"), **FAST)
    res = run_pack(str(src), recipe, str(tmp_path / "streamed"), stream=True, max_shard_size="40KB", **FAST)
    assert res["streamed"] and res["shards"] > 4  # several files per layer at this shard size
    whole, streamed = read_manifest(tmp_path / "whole"), read_manifest(tmp_path / "streamed")
    assert {n: e["sha256"] for n, e in whole["tensors"].items()} == \
        {n: e["sha256"] for n, e in streamed["tensors"].items()}
    assert whole["linears"] == streamed["linears"] and whole["aliases"] == streamed["aliases"]
    assert whole["avg_bits"] == streamed["avg_bits"]
    assert torch.equal(_logits(tmp_path / "whole"), _logits(tmp_path / "streamed"))
    assert not stream_mod.partial_dir(tmp_path / "streamed").exists()


def test_an_interrupted_streamed_pack_resumes_to_the_same_bytes(model_dir, tmp_path, monkeypatch):
    run_pack(str(model_dir), "rtn-w4a16-g128", str(tmp_path / "full"), stream=True, max_shard_size="40KB", **FAST)
    real = stream_mod._write_group
    written = []

    def dies_at_layer_1(partial, group, tensors, max_bytes):
        if group == "1":
            raise KeyboardInterrupt
        written.append(group)
        return real(partial, group, tensors, max_bytes)

    monkeypatch.setattr(stream_mod, "_write_group", dies_at_layer_1)
    cut = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        run_pack(str(model_dir), "rtn-w4a16-g128", str(cut), stream=True, max_shard_size="40KB", **FAST)
    assert written == ["rest", "0"] and not cut.exists() and stream_mod.partial_dir(cut).is_dir()
    with pytest.raises(QuantkitError, match="pass --resume to continue it"):
        run_pack(str(model_dir), "rtn-w4a16-g128", str(cut), stream=True, max_shard_size="40KB", **FAST)
    with pytest.raises(QuantkitError, match="started with another --max-shard-size; resume with the first"):
        run_pack(str(model_dir), "rtn-w4a16-g128", str(cut), resume=True, max_shard_size="80KB", **FAST)
    written.clear()
    monkeypatch.setattr(stream_mod, "_write_group", lambda *a: written.append(a[1]) or real(*a))
    run_pack(str(model_dir), "rtn-w4a16-g128", str(cut), resume=True, max_shard_size="40KB", **FAST)
    assert written == ["1", "2"]  # the finished groups are not redone
    assert _files(cut) == _files(tmp_path / "full")
    assert not stream_mod.partial_dir(cut).exists()
    monkeypatch.setattr(stream_mod, "_write_group", dies_at_layer_1)
    again = tmp_path / "again"
    with pytest.raises(KeyboardInterrupt):
        run_pack(str(model_dir), "rtn-w4a16-g128", str(again), stream=True, max_shard_size="40KB", **FAST)
    monkeypatch.setattr(stream_mod, "_write_group", real)
    said = []
    run_pack(str(model_dir), "rtn-w4a16-g128", str(again), max_shard_size="40KB", warn=said.append, **FAST)
    assert any("does not use" in w for w in said)  # an ordinary pack names the partial folder it leaves
    run_pack(str(model_dir), "rtn-w4a16-g128", str(again), stream=True, force=True, max_shard_size="40KB",
             warn=said.append, **FAST)  # --force starts the streamed pack over
    assert any("--force starts over" in w for w in said) and _files(again) == _files(tmp_path / "full")


@pytest.mark.parametrize("recipe,kw,match", [
    ("quarot-w8a8", {}, "cannot fold the rotations of recipe 'quarot-w8a8'"),
    ("rtn-w4a16-g128", {"export": "gptq"}, "drop them to export --format gptq"),
])
def test_what_streaming_cannot_do_is_refused_before_any_work(model_dir, tmp_path, recipe, kw, match):
    with pytest.raises(QuantkitError, match=match):
        run_pack(str(model_dir), recipe, str(tmp_path / "out"), stream=True, **kw, **FAST)
    assert not (tmp_path / "out").exists() and not stream_mod.partial_dir(tmp_path / "out").exists()


GPTQ_YAML = """name: gptq-tiny
weight: {method: gptq, bits: 4, group_size: 128, sym: false, act_order: true}
calibration: {samples: 3, seqlen: 32}
"""
SMOOTH_YAML = """name: smooth-tiny
weight: {method: rtn, bits: 8, group_size: -1, sym: true}
activation: {bits: 8, group_size: -1, sym: true, smooth: 0.5}
calibration: {samples: 2, seqlen: 32}
"""


@pytest.mark.parametrize("yaml_text,family", [(GPTQ_YAML, "llama"), (SMOOTH_YAML, "llama"), (GPTQ_YAML, "qwen3_moe"),
                                               (GPTQ_YAML, "tied"), (GPTQ_YAML, "fp16"), (GPTQ_YAML, "mixtral")],
                         ids=["gptq", "smoothquant", "gptq-moe", "gptq-tied", "gptq-fp16-source", "gptq-mixtral"])
def test_a_calibrated_recipe_streams_to_the_ordinary_packs_tensors(model_dir, tiny_model_dir, tmp_path, yaml_text,
                                                                   family):
    if family == "tied":
        model_dir = tiny_model_dir("llama", num_hidden_layers=3, tie_word_embeddings=True)
    elif family == "fp16":  # stored in fp16, loaded in fp32 on the CPU: both packs calibrate in fp32
        from tests.conftest import build_tiny_model, shipped_tokenizer

        model_dir = tmp_path / "fp16-model"
        tok = shipped_tokenizer()
        build_tiny_model("llama", num_hidden_layers=3, vocab_size=len(tok)).half().save_pretrained(model_dir)
        tok.save_pretrained(model_dir)
    elif family != "llama":
        model_dir = tiny_model_dir(family, num_hidden_layers=3)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml_text)
    run_pack(str(model_dir), str(recipe), str(tmp_path / "whole"), **FAST)
    run_pack(str(model_dir), str(recipe), str(tmp_path / "streamed"), stream=True, **FAST)
    whole, streamed = read_manifest(tmp_path / "whole"), read_manifest(tmp_path / "streamed")
    assert {n: e["sha256"] for n, e in whole["tensors"].items()} == \
        {n: e["sha256"] for n, e in streamed["tensors"].items()}
    assert whole["calibration"] == streamed["calibration"]  # MoE: the same expert coverage rows
    assert torch.equal(_logits(tmp_path / "whole"), _logits(tmp_path / "streamed"))


def test_an_interrupted_gptq_stream_resumes_from_the_saved_layer_inputs(model_dir, tmp_path, monkeypatch):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(GPTQ_YAML)
    run_pack(str(model_dir), str(recipe), str(tmp_path / "full"), stream=True, **FAST)
    real = stream_mod._write_group

    def dies_at_layer_2(partial, group, tensors, max_bytes):
        if group == "2":
            raise KeyboardInterrupt
        return real(partial, group, tensors, max_bytes)

    monkeypatch.setattr(stream_mod, "_write_group", dies_at_layer_2)
    cut = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        run_pack(str(model_dir), str(recipe), str(cut), stream=True, **FAST)
    partial = stream_mod.partial_dir(cut)
    assert sorted(p.name for p in partial.glob("inputs-*.pt")) == ["inputs-00002.pt"]
    monkeypatch.setattr(stream_mod, "_write_group", real)
    run_pack(str(model_dir), str(recipe), str(cut), resume=True, calib_samples=3, **FAST)
    assert _files(cut) == _files(tmp_path / "full")
    with pytest.raises(QuantkitError, match="started with another calibration windows"):
        cut2 = tmp_path / "cut2"
        monkeypatch.setattr(stream_mod, "_write_group", dies_at_layer_2)
        with pytest.raises(KeyboardInterrupt):
            run_pack(str(model_dir), str(recipe), str(cut2), stream=True, **FAST)
        run_pack(str(model_dir), str(recipe), str(cut2), resume=True, calib_samples=2, **FAST)
