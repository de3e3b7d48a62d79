"""examples/random_checkpoint.py writes a model too large for memory one decoder layer at a time: a shard per layer,
an index, a config and tokenizer that load, seeded values, and a folder `pack --stream` reads."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "random_checkpoint.py"


def _script():
    spec = importlib.util.spec_from_file_location("random_checkpoint", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_random_checkpoint_is_written_layer_by_layer_and_loads(tmp_path):
    from transformers import LlamaConfig

    from quantkit.model import load_model
    from quantkit.pack import run_pack

    rc = _script()
    config = LlamaConfig(vocab_size=8192, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    out = rc.write_checkpoint(tmp_path / "m", config, torch.bfloat16, progress=lambda line: None)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert files == ["model-embed.safetensors", "model-head.safetensors", "model-layer-00000.safetensors",
                     "model-layer-00001.safetensors", "model-layer-00002.safetensors", "model-rest.safetensors"]
    model = load_model(str(out), device="cpu", dtype="bf16", load_tokenizer=True)
    w = model.model.model.layers[1].mlp.down_proj.weight
    assert torch.equal(w, rc.random_tensor("model.layers.1.mlp.down_proj.weight", tuple(w.shape), torch.bfloat16))
    assert torch.equal(model.model.model.norm.weight, torch.ones(64, dtype=torch.bfloat16))
    run_pack(str(out), "rtn-w4a16-g128", str(tmp_path / "packed"), stream=True, device="cpu", progress=False)
    assert (tmp_path / "packed" / "quantkit.json").exists()
