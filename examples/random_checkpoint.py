"""Write a Llama-architecture checkpoint with random weights to disk one decoder layer at a time, so that models
larger than the machine's memory (a Llama-3.1-70B shape: 141 GB in bf16) can be made for timing `quantkit pack
--stream` and `quantkit search --max-gpu-memory` (random weights say nothing about accuracy).

    python examples/random_checkpoint.py --preset llama-3.1-70b --out /data/l70b           # 80 layers, bf16
    python examples/random_checkpoint.py --preset llama-3.1-8b --layers 4 --out /tmp/l8b-4  # a slice of the shapes

Each shard is made and written alone, so peak memory is about twice the largest shard (safetensors serializes a
copy): the 70B shape's 2.1 GB embedding or LM head, or a 1.7 GB decoder layer. The folder holds config.json, one
safetensors shard per decoder layer, one each for the embeddings and the LM head and one for the final norm,
model.safetensors.index.json, and the embedded reference model's tokenizer (its ids fit every preset's vocabulary).
Weights ~ N(0, 0.02), drawn in 64 MB float32 slices, norms 1, from a generator seeded by the tensor's name: the same
bytes on every run.
"""

from __future__ import annotations

import argparse
import json
import time
import zlib
from pathlib import Path

import torch

PRESETS = {
    "llama-3.1-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8),
    "llama-3.1-70b": dict(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                          num_attention_heads=64, num_key_value_heads=8),
}
COMMON = dict(max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def config_for(preset: str, layers: int | None):
    """The LlamaConfig of ``preset`` with ``layers`` decoder layers (None: the preset's)."""
    from transformers import LlamaConfig

    dims = dict(PRESETS[preset], **COMMON)
    if layers is not None:
        dims["num_hidden_layers"] = layers
    return LlamaConfig(**dims)


def tensor_shapes(config) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape, from the model built on the meta device (no memory)."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def random_tensor(name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """N(0, 0.02) for a matrix, ones for a norm's weight; seeded by the name, drawn in slices of at most 64 MB of
    float32 (no full-size float32 copy)."""
    if len(shape) == 1:
        return torch.ones(shape, dtype=dtype)
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    out = torch.empty(shape, dtype=dtype)
    rows = max(1, (64 << 20) // (4 * out[0].numel()))
    for start in range(0, shape[0], rows):
        part = out[start:start + rows]
        part.copy_(torch.empty(part.shape, dtype=torch.float32).normal_(0.0, 0.02, generator=gen))
    return out


def shard_of(name: str) -> str:
    """The shard a tensor goes to: one per decoder layer, the embeddings and the LM head each their own, one for
    the rest (the final norm)."""
    parts = name.split(".")
    if "layers" in parts:
        return f"layer-{int(parts[parts.index('layers') + 1]):05d}"
    if "embed_tokens" in parts:
        return "embed"
    if parts[0] == "lm_head":
        return "head"
    return "rest"


def write_checkpoint(out: Path, config, dtype: torch.dtype, progress=print) -> Path:
    """Write the checkpoint of ``config`` (module docstring) to ``out``, which must not exist yet; returns ``out``."""
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    from quantkit.model import builtin_model_dir

    out.mkdir(parents=True)
    config.dtype = dtype
    shapes = tensor_shapes(config)
    groups: dict[str, list[str]] = {}
    for name in shapes:
        groups.setdefault(shard_of(name), []).append(name)
    weight_map, total = {}, 0
    t0 = time.time()
    for i, (shard, names) in enumerate(sorted(groups.items())):
        file = f"model-{shard}.safetensors"
        tensors = {n: random_tensor(n, shapes[n], dtype) for n in names}
        save_file(tensors, str(out / file), metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        weight_map.update({n: file for n in names})
        progress(f"{i + 1}/{len(groups)} shards, {total / 1e9:.1f} GB, {time.time() - t0:.0f} s")
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, indent=1))
    config.save_pretrained(out)
    AutoTokenizer.from_pretrained(builtin_model_dir()).save_pretrained(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), required=True)
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default: the preset's)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--out", required=True, help="a folder that does not exist yet")
    args = ap.parse_args()
    out = Path(args.out)
    if out.exists():
        raise SystemExit(f"error: {out} exists; give a new folder")
    write_checkpoint(out, config_for(args.preset, args.layers), DTYPES[args.dtype])


if __name__ == "__main__":
    main()
