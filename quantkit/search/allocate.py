"""Bit-width allocation over output channels — MixLLM Algorithm 1 (global ranking) and the baselines.

The budget is counted in weight elements: a channel of a linear with K inputs weighs K elements, and an
average of ``target`` bits means Σ_c K_c·b_c ≤ target·Σ_c K_c (scale/zero metadata is reported separately by
:func:`average_bits`). ``--target-bits 4.4 --bits 4,8`` therefore gives 8 bits to ~10% of the elements, the
most salient channels first (MixLLM W4.4A8, Sec. 3.2). Ranking follows Algorithm 1: by score alone, then the
ranked list is cut where the element budget runs out, so the achieved average is at most the target and below
it by less than one channel's worth.

Where the scores come from is the strategy (:mod:`quantkit.search.strategies`); ``local=True`` applies the
same rule inside each layer separately instead of over one global ranking.
"""

from __future__ import annotations

import math

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from quantkit.errors import QuantkitError

# (linear name, bits) -> (bits, group_size, sym): the quantizer a recipe uses for that width
SpecFor = Callable[[str, int], tuple[int, int, bool]]
SCALE_BITS = 16  # fp16 scale per group (records.py convention)


@dataclass(frozen=True)
class BitBudget:
    """What to allocate: the bit-widths (ascending) and either a target average or each width's element share."""

    bits: tuple[int, ...]
    target: float | None = None
    fractions: tuple[float, ...] | None = None  # aligned with ``bits``

    @classmethod
    def parse(cls, bits: Sequence[int], target: float | None = None,
              fractions: Sequence[float] | None = None) -> BitBudget:
        """Check and normalise ``--bits``, ``--target-bits``, ``--fractions`` (fractions follow the order of bits)."""
        bits = [int(b) for b in bits]
        if len(set(bits)) != len(bits):
            raise QuantkitError(f"--bits lists a bit-width twice, got {bits}; give each once, e.g. --bits 4,8")
        if len(bits) < 2:
            raise QuantkitError(f"--bits needs at least two distinct bit-widths, got {bits}; e.g. --bits 4,8")
        if any(not 2 <= b <= 8 for b in bits):
            raise QuantkitError(f"--bits must be in 2..8, got {bits}")
        if (target is None) == (fractions is None):
            raise QuantkitError("give exactly one of --target-bits (e.g. 4.4) or --fractions (e.g. 0.9,0.1)")
        order = sorted(range(len(bits)), key=lambda i: bits[i])
        if fractions is not None:
            fr = [float(f) for f in fractions]
            if len(fr) != len(bits):
                raise QuantkitError(f"--fractions has {len(fr)} values for {len(bits)} bit-widths; "
                                    "give one fraction per entry of --bits")
            if not all(math.isfinite(f) and f >= 0 for f in fr) or abs(sum(fr) - 1.0) > 1e-6:
                raise QuantkitError(f"--fractions must be non-negative and sum to 1, got {fr}")
            return cls(tuple(bits[i] for i in order), None, tuple(fr[i] for i in order))
        lo, hi = min(bits), max(bits)
        if not lo <= float(target) <= hi:
            raise QuantkitError(f"--target-bits {target} is outside the range of --bits ({lo}..{hi})")
        return cls(tuple(sorted(bits)), float(target), None)

    @property
    def nominal(self) -> float:
        """The average bits asked for: the target, or Σ fraction·bits."""
        if self.target is not None:
            return self.target
        return sum(f * b for f, b in zip(self.fractions, self.bits))


def _fill_fractions(weights: torch.Tensor, budget: BitBudget) -> torch.Tensor:
    """Level (index into bits) of each ranked channel for explicit element fractions, highest width first:
    width j takes the ranked channels whose cumulative element count stays within Σ_{i≥j} f_i of the total."""
    cum = torch.cumsum(weights.double(), 0)
    total = cum[-1].item()
    level = torch.zeros(weights.numel(), dtype=torch.int64)
    share = 0.0
    for j in range(len(budget.bits) - 1, 0, -1):
        share += budget.fractions[j]
        # +0.5 element: cumulative counts are integers, so a float share must not lose an exact fit
        level[(cum <= share * total + 0.5) & (level == 0)] = j
    return level


def _fill_target(sorted_scores: torch.Tensor, weights: torch.Tensor, budget: BitBudget) -> torch.Tensor:
    """Level of each ranked channel for a target average: upgrade events taken in order until one does not fit.

    With two widths the events are the ranked channels themselves — Algorithm 1. With more widths (quantkit's
    extension; MixLLM sets its Tab. 5 mixes by hand, Sec. 4.6) channel c's loss at b bits is modelled as
    S_c·2^-b (the first-order term of Eq. 4 scales with the quantization step) and the upgrade of c from
    level j to j+1 is worth S_c·γ_j per added bit, γ_j = (2^-b_j − 2^-b_{j+1}) / (b_{j+1} − b_j). Since 2^-b
    is convex, γ_j falls with j and each channel takes its upgrades in order.
    """
    bits = budget.bits
    n, levels = sorted_scores.numel(), len(bits) - 1
    gamma = torch.tensor([(2.0 ** -bits[j] - 2.0 ** -bits[j + 1]) / (bits[j + 1] - bits[j]) for j in range(levels)],
                         dtype=torch.float64)
    rank = torch.arange(n).repeat_interleave(levels)
    lev = torch.arange(levels).repeat(n)
    value = sorted_scores.double().clamp(min=0)[rank] * gamma[lev]
    # value descending, ties by rank then level: reproducible and keeps each channel's upgrades in order
    order = torch.from_numpy(np.lexsort((lev.numpy(), rank.numpy(), -value.numpy())))
    step = torch.tensor(np.diff(bits), dtype=torch.float64)
    cost = weights.double()[rank[order]] * step[lev[order]]
    extra = (budget.target - bits[0]) * weights.double().sum().item()
    take = int(torch.searchsorted(torch.cumsum(cost, 0), torch.tensor([extra + 0.5], dtype=torch.float64),
                                  right=True).item())
    level = torch.zeros(n, dtype=torch.int64)
    level.index_add_(0, rank[order][:take], torch.ones(take, dtype=torch.int64))
    return level


def assign_ranked(sorted_scores: torch.Tensor, weights: torch.Tensor, budget: BitBudget) -> torch.Tensor:
    """Bits of each channel of a ranked list (scores descending, ``weights`` = elements per channel)."""
    if sorted_scores.numel() == 0:
        return torch.zeros(0, dtype=torch.int64)
    if budget.fractions is not None:
        level = _fill_fractions(weights, budget)
    else:
        level = _fill_target(sorted_scores, weights, budget)
    return torch.tensor(budget.bits, dtype=torch.int64)[level]


def _rank_and_assign(scores: torch.Tensor, weights: torch.Tensor, budget: BitBudget) -> torch.Tensor:
    # stable descending sort: ties keep model order (layer, then channel), so equal scores allocate reproducibly
    order = torch.sort(scores.double(), descending=True, stable=True).indices
    out = torch.empty_like(order)
    out[order] = assign_ranked(scores.double()[order], weights[order], budget)
    return out


def allocate(scores: dict[str, torch.Tensor], in_features: dict[str, int], budget: BitBudget,
             local: bool = False) -> dict[str, torch.Tensor]:
    """Bit-width of every output channel (int64 [N] per linear, same order as ``scores``).

    ``local=False``: MixLLM Algorithm 1 — all channels of all layers in one ranking. ``local=True``: the same
    budget applied inside each layer (the per-layer baseline MixLLM Sec. 3.1.1 argues against).
    """
    missing = [n for n in scores if n not in in_features]
    if missing:
        raise ValueError(f"no in_features for {missing[:3]}")
    if local:
        return {name: _rank_and_assign(s, torch.full((s.numel(),), in_features[name], dtype=torch.float64), budget)
                for name, s in scores.items()}
    names = list(scores)
    flat = torch.cat([scores[n].double().flatten() for n in names])
    weights = torch.cat([torch.full((scores[n].numel(),), float(in_features[n]), dtype=torch.float64)
                         for n in names])
    bits = _rank_and_assign(flat, weights, budget)
    return dict(zip(names, torch.split(bits, [scores[n].numel() for n in names])))


def average_bits(row_bits: dict[str, torch.Tensor], in_features: dict[str, int],
                 spec_for: SpecFor | None = None) -> float:
    """Average bits per weight element; with ``spec_for`` including the per-group metadata of each width's
    quantizer: an fp16 scale per group, plus a b-bit zero point per group when asymmetric."""
    total_bits = 0.0
    elements = 0
    for name, rb in row_bits.items():
        k = in_features[name]
        elements += rb.numel() * k
        for b, count in zip(*torch.unique(rb, return_counts=True)):
            b, count = int(b), int(count)
            total_bits += count * k * b
            if spec_for is not None:
                qb, gs, sym = spec_for(name, b)
                groups = 1 if gs == -1 else -(-k // gs)
                total_bits += count * groups * (SCALE_BITS + (0 if sym else qb))
    return total_bits / max(elements, 1)
