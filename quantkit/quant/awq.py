"""AWQ: activation-aware weight quantization (Lin et al. 2023).

Sec. 3.2: scaling up the input channels that carry large activations before quantization protects the salient
weights; with W' = W·diag(s) and the preceding operator divided by s, the FP function is unchanged and
Q(W·diag(s))·diag(s)⁻¹ X has a smaller error. Sec. 3.3: s = s_X^α with s_X the mean |x| per input channel, α
found by a grid search over [0, 1) minimising the output error of the block the scaled linears feed
(self-attention, the MLP, or the linear itself), measured on calibration activations. The released AWQ then
searches a clipping range per group (:mod:`quantkit.quant.clip`) and quantizes with round-to-nearest.

Scaling groups are found by module names shared by Llama, Mistral, Qwen2 and Qwen3 decoder layers:
input_layernorm → q,k,v; v_proj → o_proj (only without GQA, when o_proj's inputs are v_proj's outputs);
post_attention_layernorm → gate,up; up_proj → down_proj. Linears outside any group are clipped and rounded only.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from quantkit import distributed
from quantkit.errors import QuantkitError
from quantkit.model.layerwise import LayerBatch, layer_output
from quantkit.quant import grid
from quantkit.quant.clip import sample_tokens, search_clip, seen_inputs
from quantkit.quant.layerquant import (LayerQuantConfig, RowGrids, check_row_bits, fake_quantize_rows, linear_input,
                                       pre_hooks, write_weight)
from quantkit.quant.partition import WeightRecord, dequantize_record
from quantkit.quant.records import Partition, PartitionedWeight

# (preceding op, scaled linears, block whose output measures the error), paths relative to the decoder layer
GROUP_PATTERNS = (
    ("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "self_attn"),
    ("self_attn.v_proj", ("self_attn.o_proj",), "self_attn.o_proj"),
    ("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj"), "mlp"),
    ("mlp.up_proj", ("mlp.down_proj",), "mlp.down_proj"),
)


@dataclass
class ScaleGroup:
    """Linears sharing one input whose columns get the same AWQ scales, the op before them that absorbs 1/s,
    and the block whose output the scale search compares against FP."""

    prev_name: str
    prev: nn.Module
    names: list[str]
    linears: list[nn.Linear]
    block_name: str
    block: nn.Module


@dataclass
class ScaleSearch:
    """Result of the α grid search of one group: the scales, the chosen α and the block error of each α."""

    scales: torch.Tensor
    alpha: float
    losses: list[float]


@dataclass
class AWQConfig(LayerQuantConfig):
    """AWQ settings (defaults of the AWQ paper / release: 4-bit g128, 20-point α grid, clipping with 20 ratios
    down to 0.5 on 512 tokens). ``clip_skip`` lists linear leaf names left unclipped: the release skips q/k,
    whose errors act through the attention softmax rather than the projection output the clip search measures.
    ``search_tokens`` caps the calibration tokens the α search runs its multi-linear blocks on (evenly spaced
    windows; None = all, as the release); s_X and single-linear blocks always use every token."""

    n_grid: int = 20
    search_tokens: int | None = None
    clip: bool = True
    clip_grid: int = 20
    clip_max_shrink: float = 0.5
    clip_n_tokens: int = 512
    clip_skip: tuple[str, ...] = field(default=("q_proj", "k_proj"))

    def __post_init__(self) -> None:
        super().__post_init__()
        if int(self.n_grid) < 1:
            raise QuantkitError(f"AWQ n_grid must be >= 1, got {self.n_grid}; use e.g. 20")
        if self.search_tokens is not None and int(self.search_tokens) < 1:
            raise QuantkitError(f"AWQ search_tokens must be >= 1 or None (every token), got {self.search_tokens}")


def scaling_groups(layer: nn.Module, linear_names: dict[str, nn.Linear]) -> list[ScaleGroup]:
    """The AWQ scaling groups of a decoder layer (GROUP_PATTERNS) whose linears are all being quantized and
    whose shapes chain: the preceding op produces exactly the linears' input features."""
    modules = dict(layer.named_modules())
    full = {id(m): n for n, m in linear_names.items()}
    groups = []
    for prev_name, lin_names, block_name in GROUP_PATTERNS:
        if prev_name not in modules or block_name not in modules or any(n not in modules for n in lin_names):
            continue
        linears = [modules[n] for n in lin_names]
        if any(not isinstance(m, nn.Linear) or id(m) not in full for m in linears):
            continue  # a linear the recipe leaves in FP keeps its weights; its group is not rescaled
        k = linears[0].in_features
        if any(m.in_features != k for m in linears):
            continue
        prev = modules[prev_name]
        if isinstance(prev, nn.Linear):
            if prev.out_features != k:  # GQA: o_proj reads the repeated heads, v_proj's rows do not map 1:1
                continue
        elif getattr(prev, "weight", None) is None or tuple(prev.weight.shape) != (k,):
            continue
        groups.append(ScaleGroup(prev_name, prev, [full[id(m)] for m in linears], linears, block_name,
                                 modules[block_name]))
    return groups


@torch.no_grad()
def _fold_into_norm(norm: nn.Module, s: torch.Tensor) -> None:
    """norm.weight /= s (and its bias): exact only for norms computing weight · normalized(x) (+ bias). Checked
    on a random input first, so a norm of another form (e.g. Gemma's (1 + weight)) raises instead of silently
    changing the model."""
    probe = copy.deepcopy(norm).float()
    x = torch.randn(4, s.numel(), generator=torch.Generator().manual_seed(0)).to(s.device)
    before = probe(x)
    probe.weight.div_(s)
    if getattr(probe, "bias", None) is not None:
        probe.bias.div_(s)
    if not torch.allclose(probe(x) * s, before, rtol=1e-4, atol=1e-6 * float(before.abs().max())):
        raise QuantkitError(f"AWQ cannot fold scales into {type(norm).__name__}: it does not compute "
                            "weight * normalized(x); quantize this model with method gptq or rtn instead")
    norm.weight.copy_((norm.weight.float() / s).to(norm.weight.dtype))
    if getattr(norm, "bias", None) is not None:
        norm.bias.copy_((norm.bias.float() / s).to(norm.bias.dtype))


@torch.no_grad()
def fold_scales(group: ScaleGroup, s: torch.Tensor) -> None:
    """Apply AWQ scales s [K] in place (AWQ Sec. 3.2): the preceding op's output is divided by s (norm weight,
    or the preceding linear's rows and bias) and the group's linear columns multiplied by s — the FP function
    of the layer is unchanged."""
    s = s.float()
    prev = group.prev
    if isinstance(prev, nn.Linear):
        s_dev = s.to(prev.weight.device)
        write_weight(prev, prev.weight.float() / s_dev[:, None])
        if prev.bias is not None:
            prev.bias.copy_((prev.bias.float() / s_dev).to(prev.bias.dtype))
    else:
        _fold_into_norm(prev, s.to(prev.weight.device))
    for lin in group.linears:
        write_weight(lin, lin.weight.float() * s.to(lin.weight.device)[None, :])


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def channel_magnitude(inputs: list[torch.Tensor]) -> torch.Tensor:
    """s_X: mean |x| per input channel over every token of the inputs (AWQ Sec. 3.3), float32 [K]; in data-parallel
    calibration over every process's tokens (:func:`quantkit.distributed.sum_with_count`)."""
    k = inputs[0].shape[-1]
    total = torch.zeros(k, dtype=torch.float32, device=inputs[0].device)
    count = 0
    for x in inputs:
        x = x.reshape(-1, k)
        total += x.float().abs().sum(0)
        count += x.shape[0]
    total, count = distributed.sum_with_count(total, count)
    return total / max(count, 1)


def awq_scales(magnitude: torch.Tensor, alpha: float) -> torch.Tensor:
    """s = s_X^α (AWQ Sec. 3.3, Eq. 5), floored at 1e-4 and normalised by sqrt(max · min) so that the scaled
    weights stay in the original range on average."""
    s = magnitude.float().pow(alpha).clamp(min=1e-4)
    return s / (s.max() * s.min()).sqrt()


def _linear_block_loss(group: ScaleGroup, inputs: list[torch.Tensor]):
    """For a group whose block is its one linear (down_proj, o_proj): the block's mean squared output error
    as a function of its quantized weight, in closed form. (Ŵ - W) x summed over tokens is
    Σ_rows ΔW G ΔWᵀ with G = Σ_t x_t x_tᵀ, so each α costs N·K² instead of a pass over every token; the same
    loss up to float32 rounding."""
    lin = group.linears[0]
    k = lin.in_features
    gram = torch.zeros(k, k, dtype=torch.float32, device=lin.weight.device)
    tokens = 0
    for x in inputs:
        x = x.reshape(-1, k).to(device=gram.device, dtype=torch.float32)
        gram.addmm_(x.t(), x)
        tokens += x.shape[0]
    gram, tokens = distributed.sum_with_count(gram, tokens)
    w0 = lin.weight.detach().float().clone()  # the search overwrites the weight in place
    numel = max(tokens * lin.out_features, 1)

    def loss() -> float:
        delta = lin.weight.detach().float() - w0
        return float(((delta @ gram) * delta).sum()) / numel

    return loss


def _block_loss(group: ScaleGroup, calls: list[tuple[tuple, dict]]):
    """The block's mean squared output error against its FP output on the captured ``calls``."""
    reference = [_first(group.block(*a, **kw)) for a, kw in calls]

    def loss() -> float:
        err = 0.0
        numel = 0
        for (a, kw), ref in zip(calls, reference):
            err += float((_first(group.block(*a, **kw)).float() - ref.float()).pow(2).sum())
            numel += ref.numel()
        if distributed.world_size() > 1:  # every process's calls: each process then keeps the same α
            err, numel = distributed.all_reduce_sum(torch.tensor([err, float(numel)], dtype=torch.float64)).tolist()
        return err / max(numel, 1)

    return loss


def search_calls(calls: list[tuple[tuple, dict]], max_tokens: int | None) -> list[tuple[tuple, dict]]:
    """The captured block calls the α search runs: all of them, or evenly spaced ones holding at most
    ``max_tokens`` tokens (at least one call); in data-parallel calibration each process keeps its share of
    ``max_tokens``."""
    if max_tokens is None or not calls:
        return calls
    max_tokens = max(1, int(max_tokens) // distributed.world_size())
    a, kw = calls[0]
    hidden = a[0] if a else kw.get("hidden_states", next(iter(kw.values()), None))
    per_call = hidden.shape[:-1].numel() if isinstance(hidden, torch.Tensor) else 1
    keep = max(1, min(len(calls), int(max_tokens) // per_call))
    if keep >= len(calls):
        return calls
    return [calls[(i * len(calls)) // keep] for i in range(keep)]


@torch.no_grad()
def search_scale(group: ScaleGroup, inputs: list[torch.Tensor], calls: list[tuple[tuple, dict]],
                 grids: list[RowGrids], n_grid: int = 20) -> ScaleSearch:
    """AWQ Sec. 3.3 grid search: for α = i / n_grid (i = 0..n_grid-1), fake-quantize W·diag(s) (each linear on
    its ``grids``, row partitions included) and measure the block with weights Q(W·diag(s))·diag(s)⁻¹ against
    the FP block: on its captured ``calls``, or, when the block is the group's one linear, in closed form over
    every input token (:func:`_linear_block_loss`). Keeps the α of least mean squared output error. The linears
    are restored before returning (nothing is folded)."""
    magnitude = channel_magnitude(inputs)
    single = len(group.linears) == 1 and group.block is group.linears[0]
    measure = _linear_block_loss(group, inputs) if single else _block_loss(group, calls)
    originals = [lin.weight.detach().clone() for lin in group.linears]
    losses: list[float] = []
    best = (float("inf"), 0.0, None)
    try:
        for i in range(int(n_grid)):
            alpha = i / n_grid
            s = awq_scales(magnitude, alpha)
            for lin, w0, rows_grids in zip(group.linears, originals, grids):
                s_dev = s.to(w0.device)
                write_weight(lin, fake_quantize_rows(w0.float() * s_dev, rows_grids) / s_dev)
            loss = measure()
            losses.append(loss)
            if loss < best[0]:
                best = (loss, alpha, s)
    finally:
        for lin, w0 in zip(group.linears, originals):
            write_weight(lin, w0)
    if best[2] is None:
        raise QuantkitError(f"AWQ scale search for {', '.join(group.names)} gave no finite error; the "
                            "calibration activations contain NaN/inf")
    return ScaleSearch(scales=best[2], alpha=best[1], losses=losses)


def _capture(layer: nn.Module, batches: list[LayerBatch], linear_names: dict[str, nn.Linear],
             groups: list[ScaleGroup]) -> tuple[dict[str, list[torch.Tensor]], dict[str, list[tuple[tuple, dict]]]]:
    """One FP forward over the batches recording every linear's input and every group block's call."""
    inputs: dict[str, list[torch.Tensor]] = {n: [] for n in linear_names}
    calls: dict[str, list[tuple[tuple, dict]]] = {g.block_name: [] for g in groups}
    blocks = {g.block_name: g.block for g in groups}

    def on_linear(name, args, kwargs):
        inputs[name].append(linear_input(args, kwargs))

    def on_block(name, args, kwargs):
        calls[name].append((args, dict(kwargs)))

    with pre_hooks(linear_names, on_linear), pre_hooks(blocks, on_block):
        for b in batches:
            layer_output(layer, b)
    return inputs, calls


def _round_linear(name: str, weight: torch.Tensor, grids: RowGrids, inputs: list[torch.Tensor],
                  config: AWQConfig, scaled: tuple[str | None, float | None]) -> WeightRecord:
    """Clip search (unless skipped) and RTN of one linear's (scaled) weight, per row partition."""
    clip = config.clip and name.rsplit(".", 1)[-1] not in config.clip_skip
    if clip:
        inputs = _clip_inputs(inputs, weight.shape[1], config.clip_n_tokens)
    objective = "output" if seen_inputs(inputs) is not None else "weight"  # a MoE expert no token reached: weight
    meta = {"method": "awq", "scaled_by": scaled[0], "alpha": scaled[1], "clip": objective if clip else None}
    parts = []
    for rows, spec in grids:
        w = weight if rows is None else weight[rows.to(weight.device)]
        ratios = search_clip(w, *spec.affine, inputs=inputs, grid=config.clip_grid, max_shrink=config.clip_max_shrink,
                             n_tokens=config.clip_n_tokens) if clip else 1.0
        qw = grid.quantize(w, *spec.affine, clip=ratios)
        qw.meta = dict(meta)
        parts.append((rows, qw))
    if parts[0][0] is None:
        return parts[0][1]
    return PartitionedWeight(out_features=weight.shape[0], in_features=weight.shape[1],
                             partitions=[Partition(rows, qw) for rows, qw in parts])


def _clip_inputs(inputs: list[torch.Tensor], k: int, n_tokens: int | None) -> list[torch.Tensor]:
    """The tokens a linear's clip search reads: its inputs alone. In data-parallel calibration every process reads
    the same tokens, gathered: for inputs of whole windows, the very rows one process would sample
    (:func:`_window_sample`); for routed tokens (MoE experts) each process's evenly spaced share of ``n_tokens``."""
    world = distributed.world_size()
    if world == 1:
        return inputs
    if inputs and all(t.dim() == 3 for t in inputs) and len({t.shape[1] for t in inputs}) == 1:
        return [_window_sample(inputs, k, n_tokens)]
    share = None if n_tokens is None else max(1, int(n_tokens) // world)
    mine = [sample_tokens(inputs, k, share)] if seen_inputs(inputs) is not None else []
    return distributed.gather_tensors(mine)


def _window_sample(inputs: list[torch.Tensor], k: int, n_tokens: int | None) -> torch.Tensor:
    """The rows :func:`quantkit.quant.clip.sample_tokens` takes from all processes' windows in window order
    (process r holds windows r, r + N, … of T tokens each, :func:`quantkit.distributed.shard`), gathered from the
    processes that hold them."""
    world, me = distributed.world_size(), distributed.rank()
    t = inputs[0].shape[1]
    local = torch.cat([x.reshape(-1, k) for x in inputs]).float()
    windows = int(distributed.all_reduce_sum(torch.tensor([local.shape[0] // t], dtype=torch.float64)).item())
    total = windows * t
    if n_tokens is not None and 0 < n_tokens < total:
        idx = torch.linspace(0, total - 1, n_tokens, dtype=torch.float64).round().long()
    else:
        idx = torch.arange(total)
    window = idx // t
    mine = window % world == me
    rows = local[((window[mine] // world) * t + idx[mine] % t).to(local.device)]
    parts = distributed.gather_tensors([rows, idx[mine].to(torch.float64)])
    gathered = torch.cat(parts[0::2])
    order = torch.cat(parts[1::2]).argsort()
    return gathered[order.to(gathered.device)]


@torch.no_grad()
def awq_quantize_layer(layer: nn.Module, batches: list[LayerBatch], linear_names: dict[str, nn.Linear],
                       config: AWQConfig | dict,
                       row_bits: dict[str, torch.Tensor] | None = None) -> dict[str, WeightRecord]:
    """AWQ on one decoder layer: per scaling group search α (:func:`search_scale`) and fold the scales into the
    layer (:func:`fold_scales`: the layer's norms / preceding linears change, the FP output does not), then per
    linear search clip ratios on its (scaled) inputs and round to nearest; the fake-quantized weights are
    written back. ``row_bits[name]`` (a bit-width per output channel, MixLLM plans) quantizes that linear's rows
    of each bit-width on their own grid, in the search too, and returns a :class:`PartitionedWeight`.

    The returned records quantize the *scaled* weights, which pair with the folded norms left in the layer — a
    checkpoint must save those norms too.
    """
    config = AWQConfig.coerce(config)
    if not linear_names:
        return {}
    row_bits = check_row_bits(row_bits, linear_names)
    grids = {n: config.row_grids(n, lin.out_features, row_bits.get(n)) for n, lin in linear_names.items()}
    groups = scaling_groups(layer, linear_names)
    inputs, calls = _capture(layer, batches, linear_names, groups)
    scaled_by: dict[str, tuple[str, float]] = {}
    for g in groups:
        x = inputs[g.names[0]]
        if any(any(a is not b for a, b in zip(inputs[n], x)) for n in g.names[1:]):
            continue  # the linears did not read one shared tensor: not a scaling group in this architecture
        found = search_scale(g, x, search_calls(calls[g.block_name], config.search_tokens),
                             [grids[n] for n in g.names], config.n_grid)
        fold_scales(g, found.scales)
        scaled = [xi / found.scales.to(device=xi.device, dtype=xi.dtype) for xi in x]
        for n in g.names:
            inputs[n] = scaled
            scaled_by[n] = (g.prev_name, found.alpha)
    out: dict[str, WeightRecord] = {}
    for name, lin in linear_names.items():
        record = _round_linear(name, lin.weight.detach().float(), grids[name], inputs[name], config,
                               scaled_by.get(name, (None, None)))
        write_weight(lin, dequantize_record(record))
        out[name] = record
    return out
