"""Model loading, the linear walk and layer-by-layer execution on tiny models of each supported family."""

from __future__ import annotations

import json

import pytest
import torch

from quantkit.errors import QuantkitError
from quantkit.model import find_decoder_layers, iter_linears, load_model, run_layerwise
from quantkit.model.loader import builtin_model_dir, resolve_dtype
from tests.conftest import build_tiny_model

FAMILIES = ["llama", "mistral", "qwen2", "qwen3"]


@pytest.mark.parametrize("arch", FAMILIES)
def test_walk_names_every_linear_of_each_family(arch):
    model = build_tiny_model(arch)
    names = [n for n, _ in iter_linears(model)]
    per_layer = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
    assert names == [f"model.layers.{i}.{p}" for i in range(2) for p in per_layer]
    assert "lm_head" not in names
    assert [n for n, _ in iter_linears(model, include_lm_head=True)][-1] == "lm_head"


@pytest.mark.parametrize("arch", FAMILIES)
def test_layerwise_equals_full_forward(arch):
    model = build_tiny_model(arch, seed=1)
    ids = torch.randint(0, model.config.vocab_size, (3, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(ids).logits
        hidden = run_layerwise(model, ids, "cpu", batch_size=2)
        logits = model.lm_head(model.model.norm(hidden))
    torch.testing.assert_close(logits, ref, rtol=1e-5, atol=1e-5)


def test_layerwise_callback_changes_feed_next_layer():
    model = build_tiny_model("llama", seed=2)
    ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    seen = []

    def zero_mlp(i, name, layer, batches):
        seen.append((i, name, len(batches)))
        layer.mlp.down_proj.weight.data.zero_()

    with torch.no_grad():
        hidden = run_layerwise(model, ids, "cpu", on_layer=zero_mlp)
        full = model.model(ids).last_hidden_state  # the model now has zeroed down_proj everywhere
    assert seen == [(0, "model.layers.0", 2), (1, "model.layers.1", 2)]
    torch.testing.assert_close(model.model.norm(hidden), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", FAMILIES)
def test_load_local_dir(tiny_model_dir, arch):
    d = tiny_model_dir(arch)
    loaded = load_model(str(d), device="cpu")
    assert loaded.dtype == torch.float32 and loaded.tokenizer is not None
    assert find_decoder_layers(loaded.model)[0] == "model.layers"


def test_builtin_reference_model_loads():
    loaded = load_model("builtin:reference", device="cpu")
    cfg = loaded.model.config
    assert cfg.model_type == "llama" and cfg.num_key_value_heads < cfg.num_attention_heads  # GQA
    n = sum(p.numel() for p in loaded.model.parameters())
    assert 5e6 <= n <= 15e6
    assert (builtin_model_dir() / "model.safetensors").stat().st_size <= 20 * 2**20


def test_dtype_defaults():
    assert resolve_dtype(None, "cpu") == torch.float32
    assert resolve_dtype(None, "cuda", "bfloat16") == torch.bfloat16
    assert resolve_dtype(None, "cuda", None) == torch.float16
    assert resolve_dtype("bf16", "cpu") == torch.bfloat16
    with pytest.raises(QuantkitError, match="unknown dtype"):
        resolve_dtype("int3", "cpu")


def test_missing_path(tmp_path):
    with pytest.raises(QuantkitError, match="does not exist"):
        load_model(str(tmp_path / "nope"))


def test_dir_without_config(tmp_path):
    with pytest.raises(QuantkitError, match="no config.json"):
        load_model(str(tmp_path))


def test_truncated_safetensors(tiny_model_dir, tmp_path):
    import shutil

    src = tiny_model_dir("llama")
    dst = tmp_path / "broken"
    shutil.copytree(src, dst)
    f = dst / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(QuantkitError, match="truncated"):
        load_model(str(dst), device="cpu")


def test_unsupported_model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"]}))
    with pytest.raises(QuantkitError, match="unsupported model: found model_type 'bert'"):
        load_model(str(tmp_path), device="cpu")


def test_cuda_requested_without_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(QuantkitError, match="no CUDA GPU"):
        load_model("builtin:reference", device="cuda")


@pytest.mark.parametrize("arch", FAMILIES)
def test_a_folder_without_tokenizer_files_is_one_line_naming_the_files(tiny_model_dir, tmp_path, arch):
    """transformers 5 builds an empty Qwen2 tokenizer (one token) where the files are missing, so a pack would have
    written a broken tokenizer and eval-ppl blamed the text; every family now gets the same line, the packed
    checkpoint's loader too."""
    import shutil

    from quantkit.checkpoint import load_packed
    from quantkit.pack import run_pack

    src = tiny_model_dir(arch)
    dst = tmp_path / "no-tokenizer"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("tokenizer*", "special_tokens*", "*.jinja"))
    with pytest.raises(QuantkitError, match=r"tokenizer of '.*no-tokenizer'.*copy the model's tokenizer files "
                                            r"\(tokenizer.json / tokenizer.model, tokenizer_config.json\)") as e:
        load_model(str(dst), device="cpu")
    assert "\n" not in str(e.value)
    packed = tmp_path / "packed"
    run_pack(str(src), "rtn-w4a16-g128", str(packed), device="cpu", progress=False)
    for f in packed.glob("tokenizer*"):
        f.unlink()
    with pytest.raises(QuantkitError, match="tokenizer of checkpoint .*copy the model's tokenizer files"):
        load_packed(packed, device="cpu")


def test_a_packed_checkpoint_without_its_manifest_says_so(tiny_model_dir, tmp_path):
    from quantkit.pack import run_pack

    packed = tmp_path / "packed"
    run_pack(str(tiny_model_dir("llama")), "rtn-w4a16-g128", str(packed), device="cpu", progress=False)
    (packed / "quantkit.json").unlink()
    with pytest.raises(QuantkitError, match="packed quantkit checkpoint without its quantkit.json manifest "
                                            r"\(incomplete\); copy the whole folder again or re-run `quantkit pack`"):
        load_model(str(packed), device="cpu")


def test_builtin_name_always_means_the_embedded_model(tmp_path, monkeypatch):
    """A packed folder named `builtin:reference` in the working directory used to be read instead of the shipped
    model by eval-ppl (is_checkpoint looked at the folder first)."""
    from quantkit.checkpoint import is_checkpoint
    from quantkit.model.loader import resolve_model_path

    monkeypatch.chdir(tmp_path)
    fake = tmp_path / "builtin:reference"
    fake.mkdir()
    (fake / "quantkit.json").write_text("{}")
    (fake / "config.json").write_text("{}")
    assert not is_checkpoint("builtin:reference")
    assert is_checkpoint(str(fake))  # the same folder by a path is still a checkpoint
    assert resolve_model_path("builtin:reference") == (str(builtin_model_dir()), True)


@pytest.mark.parametrize("output", ["builtin:reference", "./builtin:reference", "builtin:", "a/../builtin:x"])
def test_output_named_like_a_builtin_model_is_refused(output):
    from quantkit.model.loader import check_not_builtin_name

    with pytest.raises(QuantkitError, match=r"^-o '.*' is a built-in model name, which always means the model "
                                            r"shipped with quantkit; choose another output path$"):
        check_not_builtin_name(output)


def test_output_with_builtin_in_a_folder_is_allowed():
    from quantkit.model.loader import check_not_builtin_name

    check_not_builtin_name("out/builtin:reference")  # read back as out/builtin:reference, no clash
    check_not_builtin_name("plan.json", "-o")


@pytest.mark.parametrize("name", ["./nosuch-model", "../nosuch-model", "models/llama/7b", "~/nosuch-model",
                                  "model.safetensors", "/nonexistent/llama"])
def test_a_path_like_name_fails_at_once_without_the_hub(name, tmp_path, monkeypatch):
    from quantkit import hub

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(hub, "hub_unreachable_reason", lambda: pytest.fail("the hub was asked about a path"))
    with pytest.raises(QuantkitError, match=r"does not exist \(no such folder: .*\); pass a HuggingFace model "
                                            r"directory, a hub id \(org/name\) or builtin:reference"):
        load_model(name, device="cpu")


def test_a_hub_id_with_the_hub_off_and_no_cache_says_both(tmp_path, monkeypatch):
    import time

    from quantkit import hub

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "cached_model_folder", lambda repo_id: None)
    monkeypatch.setattr(hub, "hub_unreachable_reason", lambda: pytest.fail("the hub was probed while offline"))
    start = time.perf_counter()
    with pytest.raises(QuantkitError, match=r"'nosuch-org/nosuch-model' is not a local folder \(no such folder: "
                                            r".*nosuch-org/nosuch-model\), and the hub is off \(HF_HUB_OFFLINE\) "
                                            "with no copy in the local HF cache"):
        load_model("nosuch-org/nosuch-model", device="cpu")
    assert time.perf_counter() - start < 2


def test_a_hub_id_with_the_hub_unreachable_says_both(tmp_path, monkeypatch):
    from quantkit import hub

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(hub, "hub_offline", lambda datasets=False: False)
    monkeypatch.setattr(hub, "hub_unreachable_reason", lambda: "Name or service not known")
    monkeypatch.setattr(hub, "cached_model_folder", lambda repo_id: None)
    with pytest.raises(QuantkitError, match=r"'org/model' is not a local folder \(no such folder: .*\), and the hub "
                                            r"https://\S+ could not be reached \(Name or service not known\); check "
                                            "the path, or the network for a hub id"):
        load_model("org/model", device="cpu")


def test_a_cached_hub_model_loads_from_its_snapshot_when_the_hub_is_unreachable(tiny_model_dir, tmp_path,
                                                                                  monkeypatch):
    from quantkit import hub
    from quantkit.model.loader import resolve_model_path

    monkeypatch.chdir(tmp_path)
    snapshot = tiny_model_dir("llama")
    monkeypatch.setattr(hub, "hub_offline", lambda datasets=False: False)
    monkeypatch.setattr(hub, "hub_unreachable_reason", lambda: "timed out")
    monkeypatch.setattr(hub, "cached_model_folder", lambda repo_id: snapshot)
    assert resolve_model_path("org/model") == (str(snapshot), True)
    monkeypatch.setattr(hub, "hub_unreachable_reason", lambda: None)  # reachable: transformers asks the hub
    assert resolve_model_path("org/model") == ("org/model", False)


def test_the_hub_probe_is_one_quick_request(monkeypatch):
    """An address that refuses connections answers at once with a reason, instead of huggingface_hub's five
    retries; the answer is kept for the process."""
    import time

    from quantkit import hub

    monkeypatch.setattr(hub, "_probed", {})
    monkeypatch.setattr(hub, "hub_endpoint", lambda: "http://127.0.0.1:9")
    start = time.perf_counter()
    reason = hub.hub_unreachable_reason()
    assert reason and time.perf_counter() - start < 2
    monkeypatch.setattr(hub, "_probe", lambda endpoint: pytest.fail("probed twice"))
    assert hub.hub_unreachable_reason() == reason


@pytest.mark.parametrize("name,path_like", [("./m", True), ("/abs/m", True), ("~/m", True), ("a/b/c", True),
                                            ("notes.txt", True), ("m.safetensors", True), ("org/name", False),
                                            ("gpt2", False), ("Qwen/Qwen2.5-0.5B", False)])
def test_which_names_can_only_be_paths(name, path_like):
    from quantkit.hub import looks_like_path

    assert looks_like_path(name) is path_like
