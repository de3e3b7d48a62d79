"""``quantkit bench PACKED --decode-step``: one decode step of one decoder layer of a packed model — hidden states
[B, 1, hidden] attending over a KV cache that already holds L tokens — timed against the same layer with FP16
``nn.Linear`` weights.

The FP16 layer is the FP16 layer of the *dequantized* weights Ŵ (:meth:`QuantLinear.dense_weight`), not of the
original model: attention, norms, KV cache and inputs are shared, only the linears differ. The packed layer runs
them as a loaded checkpoint does — q/k/v and gate/up fused into one GEMM each
(:mod:`quantkit.runtime.fused_siblings`; QUANTKIT_FUSE=0: separate) — and the FP16 layer as transformers does,
seven ``nn.Linear``; so the time ratio is what a user of the packed model gains over FP16 linears in a whole
decode step (fewer launches included, which an FP16 engine that fuses them would share). Both layers run the
loaded model's norms: quantkit's RMSNorm kernel where it was installed (:mod:`quantkit.runtime.fused_norm`), which
quantizes for the A8 projections in the packed layer only (QUANTKIT_FUSE_NORM=0: transformers' norms in both).
The outputs differ only by the packed path's own arithmetic (activation quantization for A8 recipes, kernel
accumulation order) — a sanity check of the kernels.

How one step is set up so that every timed call does identical work and can be captured in a CUDA graph:

1. a transformers ``StaticCache`` of ``L + 1`` slots is filled by a prefill of B random token sequences of length L
   through the packed model (the layer's cached keys/values are the model's own);
2. the inputs the model hands layer i for the next token (hidden states, RoPE cos/sin, mask, the cache) are
   captured with a forward pre-hook that stops the forward there;
3. each call first rewinds the cache layer's write position to L (an in-place ``fill_`` of a device scalar, which a
   CUDA graph replays), so every call writes slot L and attends over exactly L + 1 keys.

On CUDA the step is timed with :func:`quantkit.bench.timing.time_rotating` (CUDA events, warm-up, median of CUDA
graph replays); on the CPU with :func:`quantkit.bench.timing.time_host`. There are no CPU kernels (QuantLinear runs
its torch reference, a dense matmul with Ŵ), so CPU numbers check the mode, not the kernels.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn

from quantkit.errors import QuantkitError

DTYPE = torch.float16


class _Captured(Exception):
    """Raised by the pre-hook once layer i's inputs are stored: the rest of that forward is not needed."""


def decoder_layers(model: nn.Module, linear_names: Sequence[str]) -> nn.ModuleList:
    """The ModuleList of decoder layers holding a packed model's quantized linears (``model.layers.3.mlp.up_proj``
    → ``model.layers``), found from the manifest's linear names."""
    for name in linear_names:
        parts = name.split(".")
        for j in range(1, len(parts)):
            if parts[j].isdigit():
                mod = model.get_submodule(".".join(parts[:j]))
                if isinstance(mod, nn.ModuleList):
                    return mod
    raise QuantkitError("cannot find the decoder layers of this packed model: no quantized linear sits in a "
                        "numbered list of layers (model.layers.N.…)")


def fp16_layer(layer: nn.Module, dtype: torch.dtype = DTYPE) -> nn.Module:
    """A copy of ``layer`` whose quantized projections are ``nn.Linear`` holding the dequantized Ŵ in ``dtype``
    (dequantized in fp32 and cast, the same Ŵ the QuantLinear torch reference multiplies by) and the same bias.
    Projections fused at load (:mod:`quantkit.runtime.fused_siblings`) become separate ``nn.Linear`` again — the
    FP16 layer as transformers runs it — and the fused QuantLinear leaves the copy."""
    from quantkit.model.walk import set_module
    from quantkit.runtime.fused_norm import FusedRMSNorm
    from quantkit.runtime.fused_siblings import SiblingSlice
    from quantkit.runtime.quant_linear import QuantLinear

    dense = copy.deepcopy(layer)
    modules = list(dense.named_modules())
    fused = {id(m.group.linear) for _, m in modules if isinstance(m, SiblingSlice)}
    for name, mod in modules:
        if not isinstance(mod, (QuantLinear, SiblingSlice)) or id(mod) in fused:
            continue
        lin = nn.Linear(mod.in_features, mod.out_features, bias=mod.bias is not None, device="meta")
        lin.weight = nn.Parameter(mod.dense_weight(torch.float32).to(dtype), requires_grad=False)
        if mod.bias is not None:
            lin.bias = nn.Parameter(mod.bias.to(dtype), requires_grad=False)
        set_module(dense, name, lin)
    for name, mod in modules:
        if isinstance(mod, FusedRMSNorm):
            mod.act = None  # the same norm kernel, with nothing to quantize for: only the linears differ
        if id(mod) in fused:
            parent, _, short = name.rpartition(".")
            delattr(dense.get_submodule(parent) if parent else dense, short)
    return dense.eval()


@dataclass
class DecodeInputs:
    """What one decode step of a layer consumes: its input hidden states [B, 1, hidden], the other arguments the
    model passed it (RoPE cos/sin, mask, the cache …), the layer's cache entry and the context length L."""

    hidden: torch.Tensor
    args: tuple
    kwargs: dict
    cache_layer: object
    context: int


def _cache_layer(cache, index: int, context: int):
    layer = cache.layers[index]
    if not hasattr(layer, "cumulative_length") or not hasattr(layer, "max_cache_len"):
        raise QuantkitError(f"decoder layer {index} uses a {type(layer).__name__} KV cache, which --decode-step "
                            "cannot rewind; choose another --layer")
    if layer.max_cache_len < context + 1:  # a sliding-window layer holds at most its window
        raise QuantkitError(f"decoder layer {index} attends over a sliding window of {layer.max_cache_len} tokens; "
                            f"use --context {layer.max_cache_len - 1} or less")
    return layer


def random_ids(model: nn.Module, batch: int, context: int, seed: int = 0) -> torch.Tensor:
    """[batch, context + 1] random token ids on the model's device: a prompt of ``context`` tokens and the token
    decoded next."""
    gen = torch.Generator().manual_seed(seed)
    vocab = model.get_input_embeddings().num_embeddings
    return torch.randint(0, vocab, (batch, context + 1), generator=gen).to(next(model.parameters()).device)


@torch.no_grad()
def prepare_decode(model: nn.Module, layers: nn.ModuleList, index: int, ids: torch.Tensor) -> DecodeInputs:
    """Prefill a ``StaticCache`` of T slots with ``ids[:, :-1]`` ([B, T] token ids), then capture the inputs of
    decoder layer ``index`` for the last token ``ids[:, -1:]`` (module docstring, steps 1–2)."""
    from transformers import StaticCache

    context = ids.shape[1] - 1
    cache = StaticCache(config=model.config, max_cache_len=context + 1)
    cache_layer = _cache_layer(cache, index, context)
    # transformers 5.x renamed the forward's past_key_values to cache (the old name warns and goes in 5.40)
    with_cache = {("cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"): cache}
    model(input_ids=ids[:, :context], use_cache=True, logits_to_keep=1, **with_cache)
    store: dict = {}

    def catch(module, args, kwargs):
        store["args"], store["kwargs"] = args, dict(kwargs)
        raise _Captured

    hook = layers[index].register_forward_pre_hook(catch, with_kwargs=True)
    try:
        with contextlib.suppress(_Captured):  # the hook ends the forward as soon as layer i's inputs are stored
            model(input_ids=ids[:, context:], use_cache=True, logits_to_keep=1, **with_cache)
    finally:
        hook.remove()
    args, kwargs = store["args"], store["kwargs"]
    hidden = args[0] if args else kwargs.pop("hidden_states")
    return DecodeInputs(hidden.clone(), tuple(args[1:]), kwargs, cache_layer, context)


def step_fn(layer: nn.Module, inp: DecodeInputs) -> Callable[[torch.Tensor], torch.Tensor]:
    """``f(hidden) -> layer output``: rewind the cache layer to L tokens, then run ``layer`` on ``hidden`` with the
    captured arguments (module docstring, step 3) — the same work on every call."""
    cache_layer, context = inp.cache_layer, inp.context

    def step(hidden: torch.Tensor) -> torch.Tensor:
        cache_layer.cumulative_length.fill_(context)
        if hasattr(cache_layer, "cumulative_length_int"):  # sliding-window layers also branch on a Python int
            cache_layer.cumulative_length_int = context
        out = layer(hidden, *inp.args, **inp.kwargs)
        return out[0] if isinstance(out, (tuple, list)) else out

    return step


def max_rel_diff(packed_out: torch.Tensor, fp16_out: torch.Tensor, hidden: torch.Tensor) -> float:
    """max |packed − fp16| over max |fp16 − hidden|: the largest output difference relative to what the layer adds
    to the residual stream (relative to the output itself, the residual would hide any difference)."""
    delta = (fp16_out.float() - hidden.float()).abs().max()
    return float((packed_out.float() - fp16_out.float()).abs().max() / delta.clamp_min(1e-30))


def _time(step: Callable, hidden: torch.Tensor, device: str, reps: int, use_graph: bool) -> dict:
    from quantkit.bench.timing import time_host, time_rotating

    if device.startswith("cuda"):
        return time_rotating(step, [(hidden,)], reps=reps, use_graph=use_graph)
    return time_host(step, [(hidden,)], reps=reps)


def _gemv_pdl(device: torch.device) -> bool:
    """Whether the CUDA decode GEMVs launch with programmatic dependent launch on ``device``
    (:mod:`quantkit.runtime.kernels.cuda.common`; ``QUANTKIT_PDL=0`` turns it off)."""
    from quantkit.runtime.kernels.cuda.common import pdl_supported

    return pdl_supported(device.index if device.index is not None else torch.cuda.current_device())


def layer_fusion(layer: nn.Module) -> dict:
    """What of ``layer`` runs fused at load: ``gemms`` the fused projection GEMMs
    (:mod:`quantkit.runtime.fused_siblings`: 2 for q/k/v and gate/up), ``norms`` the RMSNorms run by quantkit's
    module (:mod:`quantkit.runtime.fused_norm`; whether its kernel runs depends on the device)."""
    from quantkit.runtime.fused_norm import FusedRMSNorm
    from quantkit.runtime.quant_linear import QuantLinear

    mods = list(layer.modules())
    return {"gemms": sum(isinstance(m, QuantLinear) and m.row_blocks is not None for m in mods),
            "norms": sum(isinstance(m, FusedRMSNorm) for m in mods)}


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "cpu"


@torch.no_grad()
def run_decode_step(packed: str, batches: Sequence[int], context: int | None = None, layer: int = 0,
                    device: str = "cuda", reps: int = 50, use_graph: bool = True, seed: int = 0) -> list[dict]:
    """Per batch size B one row: median µs of one decode step of decoder layer ``layer`` of the packed checkpoint
    ``packed`` (``packed_us``) and of its FP16 layer of the dequantized weights (``fp16_us``, module docstring),
    ``speedup`` = fp16_us / packed_us, ``max_rel_diff`` of the two outputs (:func:`max_rel_diff`), with a KV cache
    of ``context`` tokens (None: :data:`~quantkit.bench.command.DEFAULT_CONTEXT`, or the model's positions − 1 where
    it has fewer), in fp16 on ``device`` (cpu, cuda, cuda:N)."""
    from quantkit.bench.packed_targets import linear_names
    from quantkit.checkpoint import load_packed, read_manifest
    from quantkit.model.loader import max_positions, resolve_device

    dev = resolve_device(device)
    manifest = read_manifest(packed)
    model = load_packed(packed, device=dev, dtype="fp16", load_tokenizer=False).model
    limit = max_positions(model)
    if context is None:
        from quantkit.bench.command import DEFAULT_CONTEXT

        context = DEFAULT_CONTEXT if limit is None else max(1, min(DEFAULT_CONTEXT, limit - 1))
    if limit is not None and context + 1 > limit:
        raise QuantkitError(f"--context {context} plus the decoded token exceeds the model's {limit} positions; "
                            f"use --context {limit - 1} or less")
    layers = decoder_layers(model, linear_names(manifest))
    if not 0 <= layer < len(layers):
        raise QuantkitError(f"--layer {layer} is out of range: the model has decoder layers 0..{len(layers) - 1}")
    packed_layer = layers[layer]
    dense_layer = fp16_layer(packed_layer)
    fusion = layer_fusion(packed_layer)
    rows = []
    with torch.cuda.device(torch.device(dev)) if dev.startswith("cuda") else contextlib.nullcontext():
        for b in batches:
            inp = prepare_decode(model, layers, layer, random_ids(model, b, context, seed))
            steps = {"packed": step_fn(packed_layer, inp), "fp16": step_fn(dense_layer, inp)}
            outs = {k: f(inp.hidden) for k, f in steps.items()}
            times = {k: _time(f, inp.hidden, dev, reps, use_graph) for k, f in steps.items()}
            row = {"layer": layer, "batch": b, "context": context, "device": _device_name(dev),
                   "gemv_pdl": dev.startswith("cuda") and _gemv_pdl(torch.device(dev)),
                   "fused_gemms": fusion["gemms"], "fused_norms": fusion["norms"],
                   "recipe": manifest["recipe"].get("name"), "dtype": str(DTYPE).replace("torch.", "")}
            for k in ("fp16", "packed"):
                row.update({f"{k}_us": times[k]["ms"] * 1e3, f"{k}_us_p10": times[k]["ms_p10"] * 1e3,
                            f"{k}_us_p90": times[k]["ms_p90"] * 1e3})
            row.update({"speedup": row["fp16_us"] / row["packed_us"],
                        "max_rel_diff": max_rel_diff(outs["packed"], outs["fp16"], inp.hidden),
                        "graph": times["packed"]["graph"], "samples": times["packed"]["samples"]})
            rows.append(row)
            del inp, steps, outs
            if dev.startswith("cuda"):
                torch.cuda.empty_cache()
    return rows
