"""Layer-by-layer execution with captured inputs — the sequential mechanism GPTQ (Frantar et al., Sec. 3
"Step 3") and AWQ use: only one decoder layer and its activations sit on the compute device at a time, and the
inputs of layer i+1 are the outputs of layer i *after* whatever the callback did to it (e.g. quantized it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

from quantkit.model.walk import find_decoder_layers


@dataclass
class LayerBatch:
    """One chunk of calibration samples at the input of a decoder layer: hidden states and the layer kwargs
    (attention mask, position ids/embeddings) exactly as the model's own forward passed them."""

    hidden: torch.Tensor
    kwargs: dict


class _Captured(Exception):
    pass


class _Catcher(nn.Module):
    """Stands in for layer 0, records its inputs and stops the forward pass."""

    def __init__(self, layer: nn.Module, store: list):
        super().__init__()
        self.layer = layer
        self.store = store

    def __getattr__(self, name):  # models read attributes such as attention_type off their layers
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.layer, name)

    def forward(self, hidden_states, *args, **kwargs):
        if args:
            raise RuntimeError("decoder layer called with positional extras; cannot capture its inputs")
        self.store.append(LayerBatch(hidden_states, dict(kwargs)))
        raise _Captured


def _to(obj, device):
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, tuple):
        return tuple(_to(o, device) for o in obj)
    if isinstance(obj, list):
        return [_to(o, device) for o in obj]
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    return obj


def _non_layer_modules(model: nn.Module, layers: nn.ModuleList) -> list[nn.Module]:
    """Leaf-level modules outside the decoder layers (embeddings, rotary, norm, lm_head)."""
    inside = {id(m) for m in layers.modules()}
    out = []
    for m in model.modules():
        if id(m) in inside or m is model:
            continue
        if any(True for _ in m.parameters(recurse=False)) or any(True for _ in m.buffers(recurse=False)):
            out.append(m)
    return out


@torch.no_grad()
def capture_layer_inputs(model: nn.Module, input_ids: torch.Tensor, device: str | torch.device,
                         batch_size: int = 1) -> list[LayerBatch]:
    """Run the model up to its first decoder layer on ``device`` and return that layer's inputs per chunk."""
    _, layers = find_decoder_layers(model)
    outer = _non_layer_modules(model, layers)
    homes = [next(iter(list(m.parameters(recurse=False)) + list(m.buffers(recurse=False)))).device for m in outer]
    for m in outer:
        m.to(device)
    store: list[LayerBatch] = []
    first = layers[0]
    layers[0] = _Catcher(first, store)
    try:
        for start in range(0, input_ids.shape[0], batch_size):
            try:
                model(input_ids[start:start + batch_size].to(device), use_cache=False)
            except _Captured:
                pass
    finally:
        layers[0] = first
        for m, home in zip(outer, homes):
            m.to(home)
    return store


def layer_output(layer: nn.Module, batch: LayerBatch) -> torch.Tensor:
    """The decoder layer's output hidden states for one captured chunk."""
    out = layer(batch.hidden, **batch.kwargs)
    return out[0] if isinstance(out, (tuple, list)) else out


# returns the layer's outputs as a list of batches when it computed them itself (e.g. replaying sub-blocks)
LayerCallback = Callable[[int, str, nn.Module, list[LayerBatch]], "list[LayerBatch] | None"]


@torch.no_grad()
def run_layerwise(model: nn.Module, input_ids: torch.Tensor, device: str | torch.device,
                  on_layer: LayerCallback | None = None, batch_size: int = 1,
                  progress: Callable[[int, int], None] | None = None) -> torch.Tensor:
    """Run ``model`` decoder layer by decoder layer over ``input_ids`` [n, T]; returns the last layer's hidden
    states [n, T, H] (before the final norm).

    For each layer: move it to ``device``, call ``on_layer(i, name, layer, inputs)`` (where a quantizer collects
    statistics and rewrites the weights; it may enable grad itself), compute the outputs with the *modified* layer,
    move the layer back to where it came from. A callback that returns a list of batches gives those outputs
    itself (computed with the modified layer), and the layer is not run again. ``progress(i, n_layers)`` is
    called after each layer.
    """
    path, layers = find_decoder_layers(model)
    batches = capture_layer_inputs(model, input_ids, device, batch_size)
    for i, layer in enumerate(layers):
        home = next(layer.parameters()).device
        layer.to(device)
        given = on_layer(i, f"{path}.{i}", layer, batches) if on_layer is not None else None
        batches = given if isinstance(given, list) else [LayerBatch(layer_output(layer, b), b.kwargs) for b in batches]
        layer.to(home)
        if progress is not None:
            progress(i + 1, len(layers))
    return torch.cat([b.hidden for b in batches], dim=0)
