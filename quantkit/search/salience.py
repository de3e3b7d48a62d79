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


class _Rows:
    """Which rows of the probes' e the windows of the current forward are: the streamed pass runs a chunk of windows
    through each layer in several batches, each its own rows."""

    first = 0


class _Probe:
    """The zero probe of one linear: holds Δ, the leaf e, and the running per-channel sum of Eq. 4 terms."""

    def __init__(self, delta: torch.Tensor, batch_size: int, rows: _Rows):
        self.delta = delta
        self.batch_size = batch_size
        self.rows = rows
        self.resident: torch.Tensor | None = None  # Δ on the compute device while a streamed layer runs there
        self.e: torch.Tensor | None = None
        self.total: torch.Tensor | None = None

    def hook(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return output  # e = 0 and no gradient is taken: the probe adds nothing (a checkpointed or streamed forward)
        x = inputs[0].detach()
        n = output.shape[-1]
        b = x.shape[0] if x.dim() > 2 else 1
        if self.e is None:
            self.e = torch.zeros(self.batch_size, n, dtype=torch.float32, device=output.device, requires_grad=True)
        first = self.rows.first
        if first + b > self.batch_size:
            raise RuntimeError(f"probe sized for {self.batch_size} windows, got rows {first}..{first + b - 1}")
        delta = self.resident if self.resident is not None else self.delta
        yd = F.linear(x, delta.to(device=x.device, dtype=x.dtype)).reshape(b, -1, n)
        # fp32 product so ∂L/∂e is the token sum of δ·(xΔᵀ) accumulated in fp32, not rounded to bf16
        probe = (self.e[first:first + b].unsqueeze(1) * yd.float()).reshape(output.shape)
        return output + probe.to(output.dtype)

    def collect(self, b: int, first_order: bool, loss_scale: float, batch_size: int | None = None) -> None:
        """Fold the per-sample s1 = ∂L/∂e of this backward's ``b`` windows into Σ_d |s1 + ½ s1²| (or Σ_d ½ s1²
        without 1st order), ``batch_size`` windows at a time (the sums of the whole-model pass, in its order)."""
        if self.e is None or self.e.grad is None:
            raise RuntimeError("a linear received no gradient; is it on the path from the inputs to the loss?")
        s1 = self.e.grad[:b].double() / loss_scale
        if not torch.isfinite(s1).all():
            raise QuantkitError("the salience gradients overflowed (inf/nan); run the search in bf16 or fp32 "
                                "(--dtype bf16 / --dtype fp32)")
        term = (s1 + 0.5 * s1 * s1).abs() if first_order else 0.5 * s1 * s1
        step = batch_size or b
        for start in range(0, b, step):
            acc = term[start:start + step].sum(0)
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


STREAM_BOUNDARY_SHARE = 0.25  # of the free CPU memory, for a chunk's layer-boundary activations
STREAM_BOUNDARY_MAX = 16 * 2**30  # ... and at most this many bytes (pinning memory is slow)


def stream_chunk(n: int, batch_size: int, boundary_bytes_per_window: int, free_cpu: int | None) -> int:
    """Windows per streamed chunk: each chunk moves every decoder layer to the GPU twice (forward, backward), so
    as many windows as their layer-boundary activations allow (:data:`STREAM_BOUNDARY_SHARE` of the free CPU
    memory, at most :data:`STREAM_BOUNDARY_MAX`), a multiple of ``batch_size`` (the windows of one backward), at
    least one batch and at most all ``n``."""
    budget = STREAM_BOUNDARY_MAX
    if free_cpu is not None:
        budget = min(budget, int(free_cpu * STREAM_BOUNDARY_SHARE))
    batches = max(1, budget // max(1, boundary_bytes_per_window * batch_size))
    return min(n, batches * batch_size)


def _to_host(t: torch.Tensor, pin: bool) -> torch.Tensor:
    """A CPU copy of ``t``, in page-locked memory when ``pin`` (copied straight into it, and back at full speed)."""
    if not pin:
        return t.cpu()
    return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t)


@contextmanager
def _layer_on(layer: nn.Module, device: torch.device, probes: dict[int, _Probe]):
    """The decoder layer and its linears' Δ on ``device`` for the duration (one copy each, however many batches
    run), back in CPU memory after."""
    staged = [probes[id(m)] for m in layer.modules() if id(m) in probes]
    layer.to(device)
    for p in staged:
        p.resident = p.delta.to(device, non_blocking=True)
    try:
        yield
    finally:
        for p in staged:
            p.resident = None
        layer.to("cpu")


def _streamed_backward(model: nn.Module, ids: torch.Tensor, device: torch.device, loss_scale: float,
                       autocast_dtype: torch.dtype | None, batch_size: int, rows: _Rows,
                       probes: dict[int, _Probe]) -> None:
    """One chunk's forward and backward with the model's weights on the CPU and one decoder layer at a time on
    ``device``: each layer moves to the device once per direction and runs the chunk's windows ``batch_size`` at
    a time. A no-grad forward keeps each layer's inputs (the boundary activations) in CPU memory; the loss's
    gradient at the last layer's output comes from the final norm and LM head; then each layer, last first, is
    recomputed from its saved inputs with its probes and back-propagated (the chain rule of the whole backward,
    taken one layer at a time), which leaves each window's probe gradient in its own row of e (``rows``), where
    :meth:`_Probe.collect` reads it."""
    from quantkit.model.layerwise import LayerBatch, capture_layer_inputs, layer_output

    _, layers = find_decoder_layers(model)
    pin = device.type == "cuda"

    def autocast():
        return torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype is not None else ExitStack()

    captured = capture_layer_inputs(model, ids, device, batch_size=batch_size)
    starts = list(range(0, ids.shape[0], batch_size))
    hidden = [b.hidden for b in captured]
    kwargs = [b.kwargs for b in captured]
    del captured  # the chunk's layer-0 inputs live on in hidden only, replaced layer by layer
    saved: list[list[torch.Tensor]] = []
    with torch.no_grad():  # the probes add nothing without a gradient: their Δ stays in CPU memory here
        for layer in layers:
            saved.append([_to_host(h, pin) for h in hidden])
            with _layer_on(layer, device, {}):
                for j, kw in enumerate(kwargs):
                    with autocast():
                        hidden[j] = layer_output(layer, LayerBatch(hidden[j], kw))
    final = _final_modules(model)
    for m in final:
        m.to(device)
    grads = []
    for j, start in enumerate(starts):
        h = hidden[j].detach().requires_grad_(True)
        with autocast():
            loss = sample_loss(final[1](final[0](h)), ids[start:start + batch_size]) * loss_scale
        loss.backward()
        grads.append(h.grad)
        del loss, h
    for m in final:
        m.to("cpu")
    del hidden
    for i in range(len(layers) - 1, -1, -1):
        layer = layers[i]
        with _layer_on(layer, device, probes):
            for j, kw in enumerate(kwargs):
                rows.first = starts[j]
                x = saved[i][j].to(device, non_blocking=True).requires_grad_(i > 0)
                with autocast():
                    out = layer_output(layer, LayerBatch(x, kw))
                out.backward(grads[j])
                grads[j] = x.grad if i > 0 else None
        saved[i] = None
    rows.first = 0


def _delta(name: str, lin: nn.Linear, quantizer: Quantizer, device: torch.device | None) -> torch.Tensor:
    """Δ = quantize(W) − W of one linear in its weight's dtype (MixLLM Eq. 4's c_q − c_0): where it is, or, for a
    streamed pass (``device``), computed on that device and kept in page-locked CPU memory."""
    w = linear_weight(lin)
    wf = w.float() if device is None else w.to(device).float()
    delta = (quantizer(name, wf).to(wf.device) - wf).to(w.dtype)
    return delta if device is None else _to_host(delta, device.type == "cuda")


def _boundary_bytes(model: nn.Module, seqlen: int) -> int:
    """Bytes of one window's layer-boundary activations over all decoder layers (what a streamed chunk keeps)."""
    _, layers = find_decoder_layers(model)
    embed = model.get_input_embeddings().weight
    return seqlen * embed.shape[1] * (len(layers) + 1) * embed.element_size()


def _free_cpu() -> int | None:
    """Free CPU memory for this process: the machine's, shared by its torchrun processes."""
    from quantkit import distributed
    from quantkit.model.memory import free_memory

    free = free_memory("cpu")
    return free // distributed.local_world_size() if free else None


def compute_salience(model: nn.Module, input_ids: torch.Tensor, quantizer: Quantizer, *, first_order: bool = True,
                     batch_size: int = 1, checkpoint_layers: bool | None = None,
                     autocast_dtype: torch.dtype | None = None,
                     progress: Progress | None = None, on_linear: Progress | None = None,
                     skip: set[str] | frozenset[str] = frozenset(),
                     stream_device: torch.device | str | None = None,
                     stream_windows: int | None = None) -> SalienceResult:
    """MixLLM Eq. 4 salience of every output channel of every decoder linear, over calibration windows.

    ``input_ids`` [n, seqlen]; ``quantizer`` gives the low-bit weight c_q (the precision the plan would otherwise
    use); ``first_order=False`` keeps only ½ s1² (the ablation of Sec. 4.5 / Fig. 8). ``batch_size`` samples run
    per backward, each still contributing its own gradient. ``autocast_dtype`` (e.g. bf16 for an fp32 model on
    a GPU) runs the matmuls under autocast. ``progress(done, total)`` is called after each batch and
    ``on_linear(done, total)`` after each linear's Δ is ready; linears named in ``skip`` get no score.
    ``checkpoint_layers`` recomputes each decoder layer in the backward pass; None decides by memory
    (:func:`needs_checkpointing`). ``stream_device``: the model stays in CPU memory, Δ is computed on that device
    and kept in (page-locked) CPU memory, and each chunk of ``stream_windows`` windows (default
    :func:`stream_chunk`) runs one decoder layer at a time there, ``batch_size`` windows per backward
    (:func:`_streamed_backward`; the same gradients, so the same scores).

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
    dev = torch.device(stream_device) if stream_device is not None else _input_device(model)
    # the streamed pass runs a chunk of windows per move of the weights; the whole-model pass one batch
    deltas = []
    for i, (name, lin) in enumerate(linears):
        deltas.append(_delta(name, lin, quantizer, dev if stream_device is not None else None))
        if on_linear is not None:
            on_linear(i + 1, len(linears))
    chunk = batch_size
    if stream_device is not None:  # sized once Δ holds its memory
        chunk = stream_windows or stream_chunk(n, batch_size, _boundary_bytes(model, input_ids.shape[1]),
                                               _free_cpu())
        chunk = max(batch_size, chunk - chunk % batch_size)
    rows = _Rows()
    probes: dict[str, _Probe] = {}
    with ExitStack() as stack:
        for (name, lin), delta in zip(linears, deltas):
            probes[name] = _Probe(delta, min(chunk, n), rows)
            handle = lin.register_forward_hook(probes[name].hook)
            stack.callback(handle.remove)
        del deltas
        stack.enter_context(_frozen(model))
        if stream_device is None:
            if checkpoint_layers is None:
                checkpoint_layers = needs_checkpointing(model, min(batch_size, n) * input_ids.shape[1], dev)
            if checkpoint_layers:
                stack.enter_context(checkpointed_layers(model))
        for start in range(0, n, chunk):
            ids = input_ids[start:start + chunk].to(dev)
            if stream_device is not None:
                _streamed_backward(model, ids, dev, loss_scale, autocast_dtype, batch_size, rows,
                                   {id(lin): probes[name] for name, lin in linears})
            else:
                with ExitStack() as ctx:
                    if autocast_dtype is not None:
                        ctx.enter_context(torch.autocast(dev.type, dtype=autocast_dtype))
                    logits = model(input_ids=ids, use_cache=False).logits
                    loss = sample_loss(logits, ids) * loss_scale
                del logits
                loss.backward()
            for p in probes.values():
                p.collect(ids.shape[0], first_order, loss_scale, batch_size)
            if progress is not None:
                progress(min(start + chunk, n), n)
    scores = {name: (distributed.all_reduce_sum(p.total) / n_all).cpu() for name, p in probes.items()}
    return SalienceResult(scores=scores, samples=n_all, first_order=first_order)
