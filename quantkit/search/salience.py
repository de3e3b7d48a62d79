"""Per-output-channel salience of every decoder linear — MixLLM Sec. 3.2, Eq. 4 with the blocked Fisher of Eq. 3.

For channel c (row c of a weight W [N, K]) and calibration sample d,

    s1_{d,c} = g_dᵀ (c_q − c_0) = Σ_k (∂l_d/∂W)[c, k] · Δ[c, k],      Δ = quantize(W) − W,
    S_c      = 1/|D| Σ_d | s1_{d,c} + ½ s1_{d,c}² |                         (Eq. 4)

where l_d is the next-token loss of sample d alone (the per-sample gradients g_d make the Fisher of Eq. 3 a
sum of per-sample outer products, which Eq. 4 folds into the square of one dot product).

How s1 is obtained without ever materialising a weight gradient: since ∂l_d/∂W = Σ_t δ_{d,t} x_{d,t}ᵀ
(δ = gradient at the linear's output, x = its input),

    s1_{d,c} = Σ_t δ_{d,t,c} · (x_{d,t} · Δ_c) = Σ_t δ_{d,t,c} · (x_d Δᵀ)_{t,c}.

Each linear's output gets a zero-valued probe added, y + e ⊙ (x Δᵀ) with e = 0 a leaf of shape [batch, N];
then ∂L/∂e[b, c] is exactly s1 for sample b, per sample even with several samples in one backward, the forward
values are unchanged, no parameter needs ``requires_grad``, and the probe is re-created when a checkpointed
layer is recomputed. Memory beyond inference: Δ (one weight-sized tensor per linear, in the model dtype) and
the activations of one decoder layer when ``checkpoint_layers`` is on.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

from quantkit.errors import QuantkitError
from quantkit.model.memory import fits
from quantkit.model.walk import find_decoder_layers, iter_linears

# (linear name, fp32 weight [N, K]) -> its fake-quantized fp32 weight, e.g. 4-bit asym g128 RTN (MixLLM Sec. 4.1)
Quantizer = Callable[[str, torch.Tensor], torch.Tensor]
Progress = Callable[[int, int], None]


@dataclass
class SalienceResult:
    """Eq. 4 scores S_c per linear (float64 [N], CPU), in model order, and what produced them."""

    scores: dict[str, torch.Tensor]
    samples: int
    first_order: bool


def linear_weight(module: nn.Linear) -> torch.Tensor:
    """The real weight of a linear, also when accelerate CPU/disk offload keeps it out of the module (on 'meta')."""
    w = module.weight
    if w.device.type != "meta":
        return w.detach()
    hook = getattr(module, "_hf_hook", None)
    weights_map = getattr(hook, "weights_map", None)
    if weights_map is None:
        raise QuantkitError("a linear weight is on the 'meta' device with no offload map; load the model with "
                            "a device_map that keeps every weight on a device or in CPU offload")
    return weights_map["weight"].detach()


class _Probe:
    """The zero probe of one linear: holds Δ, the leaf e, and the running per-channel sum of Eq. 4 terms."""

    def __init__(self, delta: torch.Tensor, batch_size: int):
        self.delta = delta
        self.batch_size = batch_size
        self.e: torch.Tensor | None = None
        self.total: torch.Tensor | None = None

    def hook(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        x = inputs[0].detach()
        n = output.shape[-1]
        b = x.shape[0] if x.dim() > 2 else 1
        if self.e is None:
            self.e = torch.zeros(self.batch_size, n, dtype=torch.float32, device=output.device, requires_grad=True)
        if b > self.batch_size:
            raise RuntimeError(f"probe sized for batch {self.batch_size}, got {b}")
        yd = F.linear(x, self.delta.to(device=x.device, dtype=x.dtype)).reshape(b, -1, n)
        # fp32 product so ∂L/∂e is the token sum of δ·(xΔᵀ) accumulated in fp32, not rounded to bf16
        probe = (self.e[:b].unsqueeze(1) * yd.float()).reshape(output.shape)
        return output + probe.to(output.dtype)

    def collect(self, b: int, first_order: bool, loss_scale: float) -> None:
        """Fold this backward's per-sample s1 = ∂L/∂e into Σ_d |s1 + ½ s1²| (or Σ_d ½ s1² without 1st order)."""
        if self.e is None or self.e.grad is None:
            raise RuntimeError("a linear received no gradient; is it on the path from the inputs to the loss?")
        s1 = self.e.grad[:b].double() / loss_scale
        if not torch.isfinite(s1).all():
            raise QuantkitError("the salience gradients overflowed (inf/nan); run the search in bf16 or fp32 "
                                "(--dtype bf16 / --dtype fp32)")
        term = (s1 + 0.5 * s1 * s1).abs() if first_order else 0.5 * s1 * s1
        acc = term.sum(0)
        self.total = acc if self.total is None else self.total + acc
        self.e.grad = None


@contextmanager
def checkpointed_layers(model: nn.Module):
    """Recompute each decoder layer in backward (activation checkpointing), so only one layer's activations are
    alive at a time. Done here, around whatever forward the layer has (accelerate's device hooks included),
    rather than through the HF flag, which only acts in train mode."""
    _, layers = find_decoder_layers(model)
    saved = []
    for layer in layers:
        prev = layer.__dict__.get("forward")
        inner = layer.forward

        def forward(*args, _inner=inner, **kwargs):
            return torch.utils.checkpoint.checkpoint(_inner, *args, use_reentrant=False, **kwargs)

        layer.forward = forward
        saved.append((layer, prev))
    try:
        yield
    finally:
        for layer, prev in saved:
            if prev is None:
                del layer.forward
            else:
                layer.forward = prev


@contextmanager
def _frozen(model: nn.Module):
    """Parameters need no gradient (only the probes do); restore the flags afterwards."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, f in flags:
            p.requires_grad_(f)


def _input_device(model: nn.Module) -> torch.device:
    w = model.get_input_embeddings().weight
    hook = getattr(model.get_input_embeddings(), "_hf_hook", None)
    dev = getattr(hook, "execution_device", None)
    return torch.device(dev) if dev is not None else w.device


def sample_loss(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Σ_b l_b with l_b the mean next-token cross-entropy of sample b, so ∂/∂e[b] is sample b's own gradient."""
    b, t, v = logits.shape
    ce = F.cross_entropy(logits[:, :-1].float().reshape(-1, v), input_ids[:, 1:].reshape(-1), reduction="none")
    return ce.reshape(b, t - 1).mean(1).sum()


# elements kept per token and decoder layer for the backward pass, in units of hidden and intermediate size: a
# generous bound for Llama-like layers (norm, q/k/v/o, rotary, attention output, gate/up/act/product, the probes)
_SAVED_PER_HIDDEN = 16
_SAVED_PER_INTERMEDIATE = 8
# share of the free memory the saved activations may take before layers are recomputed instead
_ACTIVATION_SHARE = 0.25


def activation_bytes(model: nn.Module, tokens: int) -> int:
    """An upper estimate of the activation bytes one backward over ``tokens`` tokens keeps without checkpointing."""
    cfg = getattr(model, "config", None)
    hidden = int(getattr(cfg, "hidden_size", 0) or 0)
    inter = int(getattr(cfg, "intermediate_size", 0) or 4 * hidden)
    _, layers = find_decoder_layers(model)
    elem = max(p.element_size() for p in model.parameters())
    return len(layers) * tokens * (_SAVED_PER_HIDDEN * hidden + _SAVED_PER_INTERMEDIATE * inter) * elem


def needs_checkpointing(model: nn.Module, tokens: int, device: torch.device) -> bool:
    """Whether one backward over ``tokens`` tokens should recompute each layer (activation checkpointing): when
    the saved activations would take more than a quarter of the free memory. Recomputing costs one more forward
    of every layer, about a third of the search's time."""
    return not fits(activation_bytes(model, tokens), device, _ACTIVATION_SHARE)


def _final_modules(model: nn.Module) -> list[nn.Module]:
    """The modules after the decoder layers: the final norm and the LM head."""
    base = getattr(model, "base_model", model)
    norm = getattr(base, "norm", None)
    head = model.get_output_embeddings()
    if norm is None or head is None:
        raise QuantkitError(f"{type(model).__name__} has no final norm / LM head where --max-gpu-memory streams "
                            "them (model.norm, lm_head); run the search without --max-gpu-memory")
    return [norm, head]


def _streamed_backward(model: nn.Module, ids: torch.Tensor, device: torch.device, loss_scale: float,
                       autocast_dtype: torch.dtype | None) -> None:
    """One batch's forward and backward with the model's weights on the CPU and one decoder layer at a time on
    ``device``: a no-grad forward keeps each layer's input (the boundary activations) in CPU memory, the loss's
    gradient at the last layer's output comes from the final norm and LM head, then each layer, last first, is
    recomputed from its saved input with its probes and back-propagated (the chain rule of the whole backward,
    taken one layer at a time), which leaves each probe's gradient where :meth:`_Probe.collect` reads it."""
    from quantkit.model.layerwise import LayerBatch, capture_layer_inputs, layer_output

    _, layers = find_decoder_layers(model)
    pin = device.type == "cuda"

    def autocast():
        return torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype is not None else ExitStack()

    (first,) = capture_layer_inputs(model, ids, device, batch_size=ids.shape[0])
    kwargs = first.kwargs
    saved = []
    h = first.hidden
    with torch.no_grad():
        for layer in layers:
            saved.append(h.cpu().pin_memory() if pin else h.cpu())
            layer.to(device)
            with autocast():
                h = layer_output(layer, LayerBatch(h, kwargs))
            layer.to("cpu")
    final = _final_modules(model)
    for m in final:
        m.to(device)
    h = h.detach().requires_grad_(True)
    with autocast():
        loss = sample_loss(final[1](final[0](h)), ids) * loss_scale
    loss.backward()
    grad = h.grad
    for m in final:
        m.to("cpu")
    del loss, h
    for i in range(len(layers) - 1, -1, -1):
        layer = layers[i]
        layer.to(device)
        x = saved[i].to(device).requires_grad_(i > 0)
        with autocast():
            out = layer_output(layer, LayerBatch(x, kwargs))
        out.backward(grad)
        grad = x.grad if i > 0 else None
        layer.to("cpu")
        saved[i] = None


def compute_salience(model: nn.Module, input_ids: torch.Tensor, quantizer: Quantizer, *, first_order: bool = True,
                     batch_size: int = 1, checkpoint_layers: bool | None = None,
                     autocast_dtype: torch.dtype | None = None,
                     progress: Progress | None = None, on_linear: Progress | None = None,
                     skip: set[str] | frozenset[str] = frozenset(),
                     stream_device: torch.device | str | None = None) -> SalienceResult:
    """MixLLM Eq. 4 salience of every output channel of every decoder linear, over calibration windows.

    ``input_ids`` [n, seqlen]; ``quantizer`` gives the low-bit weight c_q (the precision the plan would otherwise
    use); ``first_order=False`` keeps only ½ s1² (the ablation of Sec. 4.5 / Fig. 8). ``batch_size`` samples run
    per backward, each still contributing its own gradient. ``autocast_dtype`` (e.g. bf16 for an fp32 model on
    a GPU) runs the matmuls under autocast. ``progress(done, total)`` is called after each batch and
    ``on_linear(done, total)`` after each linear's Δ is ready; linears named in ``skip`` get no score.
    ``checkpoint_layers`` recomputes each decoder layer in the backward pass; None decides by memory
    (:func:`needs_checkpointing`). ``stream_device``: the model stays in CPU memory and each batch runs one
    decoder layer at a time on that device (:func:`_streamed_backward`; the same gradients, so the same scores).

    fp16 compute: the per-token gradients of a mean loss are ~1/seqlen and fall below fp16's smallest normal,
    so the loss is scaled by the number of predicted tokens (a token sum) and s1 divided back in fp32.
    """
    if input_ids.dim() != 2 or input_ids.shape[1] < 2:
        raise QuantkitError(f"calibration input must be [samples, seqlen >= 2], got {tuple(input_ids.shape)}")
    if batch_size < 1:
        raise QuantkitError(f"batch size must be >= 1, got {batch_size}")
    from quantkit import distributed

    n_all = input_ids.shape[0]
    input_ids = distributed.shard(input_ids)  # data-parallel search: this process's windows, sums all-reduced
    n = input_ids.shape[0]
    half = autocast_dtype == torch.float16 or any(p.dtype == torch.float16 for p in model.parameters())
    loss_scale = float(input_ids.shape[1] - 1) if half else 1.0
    linears = [(name, lin) for name, lin in iter_linears(model) if name not in skip]
    probes: dict[str, _Probe] = {}
    with ExitStack() as stack:
        for i, (name, lin) in enumerate(linears):
            w = linear_weight(lin)
            wf = w.float()
            delta = (quantizer(name, wf).to(wf.device) - wf).to(w.dtype)
            probes[name] = _Probe(delta, min(batch_size, n))
            handle = lin.register_forward_hook(probes[name].hook)
            stack.callback(handle.remove)
            if on_linear is not None:
                on_linear(i + 1, len(linears))
        stack.enter_context(_frozen(model))
        dev = torch.device(stream_device) if stream_device is not None else _input_device(model)
        if stream_device is None:
            if checkpoint_layers is None:
                checkpoint_layers = needs_checkpointing(model, min(batch_size, n) * input_ids.shape[1], dev)
            if checkpoint_layers:
                stack.enter_context(checkpointed_layers(model))
        for start in range(0, n, batch_size):
            ids = input_ids[start:start + batch_size].to(dev)
            if stream_device is not None:
                _streamed_backward(model, ids, dev, loss_scale, autocast_dtype)
            else:
                with ExitStack() as ctx:
                    if autocast_dtype is not None:
                        ctx.enter_context(torch.autocast(dev.type, dtype=autocast_dtype))
                    logits = model(input_ids=ids, use_cache=False).logits
                    loss = sample_loss(logits, ids) * loss_scale
                del logits
                loss.backward()
            for p in probes.values():
                p.collect(ids.shape[0], first_order, loss_scale)
            if progress is not None:
                progress(min(start + batch_size, n), n)
    scores = {name: (distributed.all_reduce_sum(p.total) / n_all).cpu() for name, p in probes.items()}
    return SalienceResult(scores=scores, samples=n_all, first_order=first_order)
