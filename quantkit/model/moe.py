"""Mixture-of-experts layers as one nn.Linear per expert projection, so every quantizer sees each expert.

transformers 5 stores the routed experts of Mixtral, Qwen2-MoE and Qwen3-MoE as two 3-D parameters per layer
(``gate_up_proj`` [E, 2I, H] and ``down_proj`` [E, H, I]) in one module whose forward loops over the experts
that received tokens. quantkit's pipeline quantizes nn.Linear modules, so :func:`unfuse_experts` replaces each
such module by an :class:`ExpertList`: ``experts.{e}.gate_proj`` / ``up_proj`` / ``down_proj`` Linears (the
per-expert names of transformers 4, GPTQModel and vLLM's GPTQ/AWQ MoE loaders) with the same routing forward. Each
expert's Linears then see only the tokens routed to it, so its GPTQ Hessian and its MixLLM salience are its own
(issue 40). The routers (``mlp.gate``) are not Linears and stay in full precision, as do the shared expert's
one-output gate (:data:`quantkit.model.walk.FULL_PRECISION_LEAVES`).

:class:`ExpertList` also counts the tokens each expert receives while :func:`count_tokens` is active: the
calibration's per-expert coverage, which the GPTQ path uses to decide which experts it can calibrate
(:data:`MIN_TOKENS_RULE`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn as nn

# An expert whose Linears saw fewer calibration tokens than this multiple of their input features gets round-to-
# nearest (with the recipe's clipping) instead of GPTQ: its Hessian X·Xᵀ would be rank-deficient, and GPTQ's
# reference rule zeroes the weight columns of inputs it never saw. GPTQModel and llm-compressor use the same kind
# of fallback for uncalibrated experts.
MIN_TOKENS_PER_FEATURE = 0.5
MIN_TOKENS_RULE = (f"experts that saw fewer than {MIN_TOKENS_PER_FEATURE} × in_features calibration tokens are "
                   "rounded to nearest (RTN, with the recipe's clipping) instead of GPTQ")


class ExpertMLP(nn.Module):
    """One routed expert: down_proj(act(gate_proj(x)) · up_proj(x))."""

    def __init__(self, gate_proj: nn.Linear, up_proj: nn.Linear, down_proj: nn.Linear, act_fn: nn.Module):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj
        self.act_fn = act_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class ExpertList(nn.ModuleList):
    """The routed experts of one MoE block as :class:`ExpertMLP` modules, called like transformers' fused experts
    module: ``forward(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k])`` → [T, H], the sum over each
    token's chosen experts of weight · expert(token)."""

    def __init__(self, experts: list[ExpertMLP]):
        super().__init__(experts)
        self.num_experts = len(experts)
        self.token_counts: torch.Tensor | None = None  # set by count_tokens

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling() or (hidden_states.is_cuda and torch.cuda.is_current_stream_capturing()):
            return self.forward_dense(hidden_states, top_k_index, top_k_weights)
        out = torch.zeros_like(hidden_states)
        hits = torch.bincount(top_k_index.reshape(-1), minlength=self.num_experts)[:self.num_experts]
        if self.token_counts is not None:
            self.token_counts += hits.to(self.token_counts.device)
        for e in hits.nonzero().flatten().tolist():
            token, slot = torch.where(top_k_index == e)
            y = self[e](hidden_states[token]) * top_k_weights[token, slot, None]
            out.index_add_(0, token, y.to(out.dtype))
        return out


    def forward_dense(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                      top_k_weights: torch.Tensor) -> torch.Tensor:
        """The same sum with every expert run on every token and weighted by its routing weight (zero where not
        chosen): no shape depends on the routing, so a compiled graph or a captured decode step holds it. It reads
        each expert's weights once, as a decode step over a batch reaches most experts anyway."""
        weights = torch.zeros(hidden_states.shape[0], self.num_experts, dtype=top_k_weights.dtype,
                              device=hidden_states.device).scatter_add(1, top_k_index, top_k_weights)
        out = torch.zeros_like(hidden_states)
        for e, expert in enumerate(self):
            out = out + (expert(hidden_states) * weights[:, e, None]).to(out.dtype)
        return out


@torch.no_grad()
def warm_experts(model: nn.Module) -> None:
    """Call every expert of ``model`` once on one zero token, eagerly: packed linears build their caches and kernel
    choices on a first call, which must not fall inside a compiled step (:meth:`ExpertList.forward_dense` runs
    experts the prompt never reached)."""
    weight = model.get_input_embeddings().weight
    for _, experts in expert_lists(model):
        x = torch.zeros(1, experts[0].gate_proj.in_features, dtype=weight.dtype, device=weight.device)
        for expert in experts:
            expert(x)


def _is_fused_experts(module: nn.Module) -> bool:
    gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    return (isinstance(gate_up, torch.Tensor) and isinstance(down, torch.Tensor) and gate_up.dim() == 3
            and down.dim() == 3 and not isinstance(module, ExpertList))


def _linear(weight: torch.Tensor) -> nn.Linear:
    lin = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta", dtype=weight.dtype)
    lin.weight = nn.Parameter(weight.detach().clone() if not weight.is_meta else weight.detach(), requires_grad=False)
    return lin


def unfuse(module: nn.Module) -> ExpertList:
    """The :class:`ExpertList` of a fused experts module (``gate_up_proj`` [E, 2I, H], gate rows first, and
    ``down_proj`` [E, H, I]), with copies of its weights (meta weights stay meta)."""
    gate_up, down = module.gate_up_proj, module.down_proj
    inter = gate_up.shape[1] // 2
    experts = [ExpertMLP(_linear(gate_up[e, :inter]), _linear(gate_up[e, inter:]), _linear(down[e]), module.act_fn)
               for e in range(gate_up.shape[0])]
    return ExpertList(experts)


def unfuse_experts(model: nn.Module) -> int:
    """Replace every fused experts module of ``model`` by its :class:`ExpertList` (in place); returns how many.
    The model computes the same function (the experts' products are the same rows of the same weights)."""
    from quantkit.model.walk import set_module

    fused = [name for name, mod in model.named_modules() if _is_fused_experts(mod)]
    for name in fused:
        if hasattr(model.get_submodule(name), "_hf_hook"):
            from quantkit.errors import QuantkitError

            raise QuantkitError("this MoE model's experts were placed by --device-map (accelerate hooks), which "
                                "quantkit cannot split per expert yet; load it on one device (--device cpu or "
                                "cuda) instead")
        set_module(model, name, unfuse(model.get_submodule(name)))
    return len(fused)


def expert_lists(model: nn.Module) -> Iterator[tuple[str, ExpertList]]:
    """(path, ExpertList) of every unfused MoE block."""
    for name, mod in model.named_modules():
        if isinstance(mod, ExpertList):
            yield name, mod


def is_expert_linear(name: str) -> bool:
    """Whether a linear's path lies inside an expert list (``...mlp.experts.3.down_proj``)."""
    parts = name.split(".")
    return any(p == "experts" and i + 1 < len(parts) and parts[i + 1].isdigit() for i, p in enumerate(parts))


@contextlib.contextmanager
def count_tokens(model: nn.Module) -> Iterator[dict[str, torch.Tensor]]:
    """Count the tokens routed to each expert while active: yields {expert list path: counts [E]} (filled as the
    model runs; int64 on the CPU)."""
    lists = dict(expert_lists(model))
    counts = {name: torch.zeros(lst.num_experts, dtype=torch.int64) for name, lst in lists.items()}
    for name, lst in lists.items():
        lst.token_counts = counts[name]
    try:
        yield counts
    finally:
        for lst in lists.values():
            lst.token_counts = None


def min_tokens(expert: nn.Module) -> float:
    """The calibration tokens ``expert`` needs for GPTQ: :data:`MIN_TOKENS_PER_FEATURE` × the widest input of its
    Linears (down_proj reads the intermediate size)."""
    return MIN_TOKENS_PER_FEATURE * max(m.in_features for m in expert.modules() if isinstance(m, nn.Linear))


def coverage_rows(counts: dict[str, torch.Tensor], needs: dict[str, list[float]]) -> list[dict]:
    """One row per expert list: tokens per expert (min, median, max) and the experts that got fewer than
    ``needs[list][expert]`` tokens."""
    rows = []
    for name, c in counts.items():
        low = [e for e, (n, need) in enumerate(zip(c.tolist(), needs[name])) if n < need]
        rows.append({"experts": name, "min_tokens": int(c.min()), "median_tokens": int(c.median()),
                     "max_tokens": int(c.max()), "under_covered": low})
    return rows
