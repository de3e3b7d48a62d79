"""Architecture-agnostic walk over a causal LM: its decoder layers and every nn.Linear inside them.

Names are the module paths of the loaded model (``model.layers.3.mlp.down_proj``), stable across runs, and are
the keys of plans, recipes' overrides and packed checkpoints.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch.nn as nn

from quantkit.errors import QuantkitError

# Families the test suite builds and checks (tiny random models of each in tests/). The MoE families load with
# their experts as one Linear per projection (quantkit.model.moe).
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe")
# Linear leaves that route rather than transform (a router in transformers 4, Qwen2-MoE's sigmoid gate of the
# shared expert, out_features 1): quantizing them changes which experts run; peers keep them in full precision.
FULL_PRECISION_LEAVES = ("gate", "router", "shared_expert_gate")


def check_supported(config) -> None:
    """Reject model families the walk and the AWQ/GPTQ graph rules were not built and tested for, naming what
    was found and what is supported."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        archs = ",".join(getattr(config, "architectures", None) or []) or "unknown architecture"
        raise QuantkitError(f"unsupported model: found model_type '{model_type}' ({archs}); "
                            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)} decoder-only causal LMs")


def find_decoder_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """Return (path, ModuleList) of the decoder layers: the longest ModuleList of same-type blocks with Linears that
    is not inside another such list (a MoE layer's expert list is inside the decoder layers)."""
    best: tuple[str, nn.ModuleList] | None = None
    found: list[str] = []
    for name, mod in model.named_modules():  # parents come before their children
        if not isinstance(mod, nn.ModuleList) or len(mod) == 0:
            continue
        if len({type(m) for m in mod}) != 1:
            continue
        if not any(isinstance(s, nn.Linear) for s in mod[0].modules()):
            continue
        if any(name.startswith(f"{outer}.") for outer in found):
            continue
        found.append(name)
        if best is None or len(mod) > len(best[1]):
            best = (name, mod)
    if best is None:
        raise QuantkitError(f"unsupported model: found {type(model).__name__} with no list of decoder layers; "
                            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)} and similar decoder-only LMs")
    return best


def layer_linears(layer: nn.Module, prefix: str = "") -> dict[str, nn.Linear]:
    """Every nn.Linear inside one decoder layer, keyed by full name (prefix + relative path), in module order; MoE
    routing linears (:data:`FULL_PRECISION_LEAVES`) stay out."""
    out = {}
    for rel, mod in layer.named_modules():
        if isinstance(mod, nn.Linear) and rel.rsplit(".", 1)[-1] not in FULL_PRECISION_LEAVES:
            out[f"{prefix}.{rel}" if prefix else rel] = mod
    return out


def iter_linears(model: nn.Module, include_lm_head: bool = False) -> Iterator[tuple[str, nn.Linear]]:
    """Yield (name, Linear) for every linear in the decoder layers (and lm_head when asked)."""
    path, layers = find_decoder_layers(model)
    for i, layer in enumerate(layers):
        yield from layer_linears(layer, f"{path}.{i}").items()
    if include_lm_head:
        head = output_linear(model)
        if head is not None:
            yield head


def output_linear(model: nn.Module) -> tuple[str, nn.Linear] | None:
    """(name, Linear) of the model's output projection (lm_head), None where it has none that is an nn.Linear."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if isinstance(head, nn.Linear):
        for name, mod in model.named_modules():
            if mod is head:
                return name, head
    return None


def untie_output_embeddings(model: nn.Module) -> bool:
    """Give the output projection its own copy of a weight it shares with the input embeddings, and mark the config
    untied whether they shared one or not (transformers would tie them at load otherwise); True where they were
    tied. Quantizing or rotating the head then leaves the embeddings as they are, and the checkpoint holds both
    matrices."""
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    shared = embed is not None and head is not None and head.weight is embed.weight
    if shared:
        head.weight = nn.Parameter(embed.weight.detach().clone())
    model.config.tie_word_embeddings = False
    text_config = getattr(model.config, "get_text_config", None)
    if text_config is not None:
        text_config().tie_word_embeddings = False
    return shared


def get_module(model: nn.Module, name: str) -> nn.Module:
    """The submodule at a dotted path."""
    return model.get_submodule(name)


def set_module(model: nn.Module, name: str, new: nn.Module) -> None:
    """Replace the submodule at a dotted path (used to swap nn.Linear for QuantLinear)."""
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, new)


def projection_kind(name: str) -> str:
    """Short projection type of a linear's name (q_proj → 'q', down_proj → 'down'), for reports like MixLLM Tab. 7."""
    leaf = name.rsplit(".", 1)[-1]
    return leaf[:-5] if leaf.endswith("_proj") else leaf
