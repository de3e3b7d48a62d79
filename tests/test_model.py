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
