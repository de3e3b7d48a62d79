"""SmoothQuant: move activation outliers into the weights before per-token 8-bit activation quantization.

Xiao et al. 2023, "SmoothQuant", Sec. 4, Eq. 3-4: Y = (X diag(s)⁻¹) · (diag(s) W) with the per-input-channel
factor

    s_j = max|X_j|^α / max|W_j|^(1-α),

α the migration strength (0.5 in the paper for most models). Dividing X by s flattens the few channels whose
magnitude is 10-100× the rest (the outliers that make one per-token scale coarse for every other channel), and
the weights, quantized per output channel or per group, absorb the factor.

The division is folded into the op that produces X, so nothing runs online and the kernels read the smoothed
weights unchanged (llm-compressor's mappings for Llama-like layers):

* input_layernorm → q_proj, k_proj, v_proj (the RMSNorm weight is divided; the fused norm + A8 kernel reads it);
* post_attention_layernorm → gate_proj, up_proj;
* v_proj → o_proj (v's output rows are divided; with grouped-query attention one factor per KV channel, shared by
  the query heads that read it);
* up_proj → down_proj (the MLP's product act(gate)·up is linear in up's output).

max|X_j| is measured on the calibration windows as they reach the layer, before its weights are quantized.

One α for the whole model is a compromise: the folds differ by orders of magnitude in how far their inputs' outliers
stand out (down_proj's input carries the "massive activations" of Sun et al. 2024). ``alpha="auto"`` picks α per
fold from a grid, by the consumers' output error under the recipe's own weight and activation quantizers on
sampled calibration tokens, ‖Q_a(X diag(s)⁻¹) Q_w(diag(s) W)ᵀ − X Wᵀ‖²_F — the layer-wise α tuning of Intel Neural
Compressor's SmoothQuant, scored like AWQ's scale search (AWQ Sec. 3.2, Eq. 4-5). No smoothing (s = 1) is one of
the candidates, so a fold where smoothing does not help is left alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

from quantkit.errors import QuantkitError
from quantkit.model.layerwise import LayerBatch, layer_output
from quantkit.quant.layerquant import linear_input, pre_hooks

MIN_SCALE = 1e-5  # SmoothQuant's clamp on s: an all-zero channel keeps a finite factor
ALPHA_GRID = tuple(i / 10 for i in range(11))  # candidates of alpha="auto" (None = no smoothing is tried too)
SEARCH_TOKENS = 2048  # calibration tokens each fold's α search scores (evenly spaced over every window)


@dataclass
class SmoothPair:
    """One fold: ``producer`` (an RMSNorm or a linear) makes the input of ``consumers``; ``rep`` > 1 when each
    producer channel feeds ``rep`` consumer channels (o_proj under grouped-query attention, head size ``head``)."""

    name: str
    producer: nn.Module
    consumers: list[nn.Linear]
    rep: int = 1
    head: int = 0


def smooth_pairs(layer: nn.Module) -> list[SmoothPair]:
    """The SmoothQuant folds of a Llama-like decoder layer (module docstring; the two into o_proj and down_proj only
    where their inputs do not rotate online); a QuantkitError naming the missing module when the layer does not
    have that shape."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    needed = {"input_layernorm": layer, "post_attention_layernorm": layer, "self_attn": attn, "mlp": mlp}
    missing = [n for n, m in needed.items() if m is None or (n.endswith("norm") and not hasattr(layer, n))]
    for owner, names in ((attn, ("q_proj", "k_proj", "v_proj", "o_proj")), (mlp, ("gate_proj", "up_proj",
                                                                                 "down_proj"))):
        missing += [n for n in names if owner is None or not isinstance(getattr(owner, n, None), nn.Linear)]
    if missing:
        raise QuantkitError(f"SmoothQuant folds need a Llama-like layer; {type(layer).__name__} lacks "
                            f"{', '.join(missing)} — drop activation.smooth from the recipe for this model")
    heads = attn.o_proj.in_features // attn.v_proj.out_features  # query heads per KV head
    head = attn.o_proj.in_features // _num_heads(attn)
    pairs = [SmoothPair("input_layernorm", layer.input_layernorm, [attn.q_proj, attn.k_proj, attn.v_proj]),
             SmoothPair("post_attention_layernorm", layer.post_attention_layernorm, [mlp.gate_proj, mlp.up_proj]),
             SmoothPair("v_proj", attn.v_proj, [attn.o_proj], rep=heads, head=head),
             SmoothPair("up_proj", mlp.up_proj, [mlp.down_proj])]
    # a consumer whose input rotates online (quantkit.quant.rotate.InputRotation) reads x·Q, not the producer's
    # channels: a per-channel factor of the producer does not commute with Q, and Q already spreads the outliers
    return [p for p in pairs if not any(hasattr(c, "input_rotation") for c in p.consumers)]


def _num_heads(attn: nn.Module) -> int:
    config = getattr(attn, "config", None)
    n = getattr(config, "num_attention_heads", None) or getattr(attn, "num_heads", None)
    if not n:
        raise QuantkitError("SmoothQuant's v_proj → o_proj fold needs the attention's head count "
                            "(config.num_attention_heads)")
    return int(n)


def _to_producer(v: torch.Tensor, pair: SmoothPair) -> torch.Tensor:
    """Per-consumer-channel values [K] → per-producer-channel [K / rep] (max over the query heads sharing a KV
    head: head h of o_proj's input reads KV head h // rep)."""
    if pair.rep == 1:
        return v
    n_q = v.numel() // pair.head
    return v.view(n_q // pair.rep, pair.rep, pair.head).amax(dim=1).reshape(-1)


def _to_consumer(s: torch.Tensor, pair: SmoothPair) -> torch.Tensor:
    if pair.rep == 1:
        return s
    return s.view(-1, 1, pair.head).expand(-1, pair.rep, -1).reshape(-1)


def input_absmax(layer: nn.Module, batches: list[LayerBatch], pairs: list[SmoothPair]) -> list[torch.Tensor]:
    """max |X_j| per input channel of each pair's consumers, over every token of ``batches`` (float32)."""
    first = {f"{i}": p.consumers[0] for i, p in enumerate(pairs)}
    stats: dict[str, torch.Tensor] = {}

    def observe(name, args, kwargs):
        x = linear_input(args, kwargs).detach()
        m = x.reshape(-1, x.shape[-1]).abs().amax(dim=0).float()
        stats[name] = m if name not in stats else torch.maximum(stats[name], m)

    with torch.no_grad(), pre_hooks(first, observe):
        for b in batches:
            layer_output(layer, b)
    return [stats[f"{i}"] for i in range(len(pairs))]


def smoothing_scales(x_absmax: torch.Tensor, weights: list[torch.Tensor], alpha: float) -> torch.Tensor:
    """SmoothQuant Eq. 4: s_j = max|X_j|^α / max_j|W|^(1-α) over the consumers' columns j (float32 [K])."""
    w_absmax = torch.stack([w.detach().abs().amax(dim=0).float() for w in weights]).amax(dim=0)
    s = x_absmax.clamp(min=MIN_SCALE).pow(alpha) / w_absmax.clamp(min=MIN_SCALE).pow(1 - alpha)
    return s.clamp(min=MIN_SCALE)


@torch.no_grad()
def fold_scales(pair: SmoothPair, s: torch.Tensor) -> None:
    """Divide the producer's output channel j by s_j and multiply the consumers' input column j by s_j (s per
    producer channel), in place, in float32 then back to each tensor's dtype."""
    p = pair.producer
    weight = p.weight
    if isinstance(p, nn.Linear):
        weight.copy_((weight.float() / s.to(weight.device).unsqueeze(1)).to(weight.dtype))
        if p.bias is not None:
            p.bias.copy_((p.bias.float() / s.to(p.bias.device)).to(p.bias.dtype))
    else:
        weight.copy_((weight.float() / s.to(weight.device)).to(weight.dtype))
        if getattr(p, "bias", None) is not None:
            p.bias.copy_((p.bias.float() / s.to(p.bias.device)).to(p.bias.dtype))
    sc = _to_consumer(s, pair)
    for lin in pair.consumers:
        lin.weight.copy_((lin.weight.float() * sc.to(lin.weight.device).unsqueeze(0)).to(lin.weight.dtype))


def smooth_layer(layer: nn.Module, batches: list[LayerBatch], alpha: float | str,
                 fake_weight: Callable[[nn.Linear, torch.Tensor], torch.Tensor] | None = None,
                 fake_act: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict[str, float | None]:
    """Apply SmoothQuant's four folds to one decoder layer from its calibration inputs ``batches``; returns the α
    used per fold (None: left unsmoothed). The layer computes the same function afterwards, up to rounding.

    ``alpha``: one migration strength for every fold, or ``"auto"`` to search it per fold (module docstring), which
    needs ``fake_weight(linear, weight) -> fake-quantized weight`` and ``fake_act(x) -> fake-quantized x``."""
    auto = alpha == "auto"
    if not auto and (isinstance(alpha, (bool, str)) or not 0.0 <= alpha <= 1.0):
        raise QuantkitError(f"SmoothQuant alpha must be in [0, 1] or 'auto', got {alpha!r}; the paper uses 0.5")
    if auto and (fake_weight is None or fake_act is None):
        raise ValueError("alpha='auto' scores candidates with the recipe's quantizers: pass fake_weight and fake_act")
    pairs = smooth_pairs(layer)
    x_absmax = input_absmax(layer, batches, pairs)
    inputs = consumer_inputs(layer, batches, pairs) if auto else None
    out: dict[str, float | None] = {}
    for i, (pair, xa) in enumerate(zip(pairs, x_absmax)):
        xa = _to_producer(xa, pair)
        weights = [_to_producer_columns(lin.weight, pair) for lin in pair.consumers]
        a = search_alpha(pair, inputs[i], xa, weights, fake_weight, fake_act) if auto else float(alpha)
        if a is not None:
            fold_scales(pair, smoothing_scales(xa, weights, a))
        out[pair.name] = a
    return out


def consumer_inputs(layer: nn.Module, batches: list[LayerBatch], pairs: list[SmoothPair],
                    n_tokens: int = SEARCH_TOKENS) -> list[torch.Tensor]:
    """Each pair's consumer input rows [T, K] (float32), at most ``n_tokens`` evenly spaced over all batches."""
    from quantkit.quant.clip import sample_tokens

    first = {f"{i}": p.consumers[0] for i, p in enumerate(pairs)}
    seen: dict[str, list[torch.Tensor]] = {n: [] for n in first}
    per_batch = -(-n_tokens // max(1, len(batches)))

    def keep(name, args, kwargs):
        x = linear_input(args, kwargs).detach()
        seen[name].append(sample_tokens(x, x.shape[-1], per_batch))

    with torch.no_grad(), pre_hooks(first, keep):
        for b in batches:
            layer_output(layer, b)
    return [sample_tokens(seen[f"{i}"], pairs[i].consumers[0].in_features, n_tokens) for i in range(len(pairs))]


@torch.no_grad()
def search_alpha(pair: SmoothPair, x: torch.Tensor, x_absmax: torch.Tensor, weights: list[torch.Tensor],
                 fake_weight: Callable[[nn.Linear, torch.Tensor], torch.Tensor],
                 fake_act: Callable[[torch.Tensor], torch.Tensor], grid=ALPHA_GRID) -> float | None:
    """The α of ``grid`` (or None, no smoothing) whose folded consumers lose least on inputs ``x`` [T, K]:
    argmin Σ_consumers ‖Q_a(X / s) Q_w(W · s)ᵀ − X Wᵀ‖²_F with s = Eq. 4 at that α (module docstring)."""
    x = x.float()
    refs = [x @ lin.weight.float().T for lin in pair.consumers]
    best, best_err = None, None
    for a in (None, *grid):
        sc = torch.ones(x.shape[1]) if a is None else _to_consumer(smoothing_scales(x_absmax, weights, a), pair)
        sc = sc.to(x.device)
        xq = fake_act(x / sc)
        err = sum(float((xq @ fake_weight(lin, lin.weight.float() * sc).float().T - ref).square().sum())
                  for lin, ref in zip(pair.consumers, refs))
        if best_err is None or err < best_err:
            best, best_err = a, err
    return best


def _to_producer_columns(weight: torch.Tensor, pair: SmoothPair) -> torch.Tensor:
    """A consumer weight [N, K] as [N·rep, K / rep] so that column j is every weight that producer channel j
    meets (only the column maxima are used)."""
    if pair.rep == 1:
        return weight
    n, k = weight.shape
    return weight.view(n, k // (pair.rep * pair.head), pair.rep, pair.head).transpose(1, 2).reshape(n * pair.rep,
                                                                                                    -1)
