"""Where the ranking scores come from, per allocation strategy.

* ``global``    MixLLM Eq. 4 salience, one ranking over all layers (Algorithm 1) — the method;
* ``local``     the same Eq. 4 salience, ranked inside each layer (every layer gets the same share) — the
                per-layer selection MixLLM Sec. 3.1.1 contrasts with;
* ``random``    seeded uniform random scores, ranked globally — the floor any salience must beat;
* ``magnitude`` the L2 norm of each output channel's weights, ranked globally — a data-free heuristic.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from quantkit.errors import QuantkitError
from quantkit.model.walk import iter_linears
from quantkit.search.salience import linear_weight

STRATEGIES = ("global", "local", "random", "magnitude")


def check_strategy(strategy: str) -> str:
    """Reject an unknown strategy name with the list of known ones."""
    if strategy not in STRATEGIES:
        raise QuantkitError(f"unknown strategy '{strategy}'; use one of: {', '.join(STRATEGIES)}")
    return strategy


def uses_salience(strategy: str) -> bool:
    """Whether the strategy needs the gradient pass over calibration data (Eq. 4)."""
    return check_strategy(strategy) in ("global", "local")


def random_scores(out_features: dict[str, int], seed: int) -> dict[str, torch.Tensor]:
    """Uniform [0, 1) scores per output channel from one seeded generator, drawn in model order."""
    gen = torch.Generator().manual_seed(int(seed))
    return {name: torch.rand(n, generator=gen, dtype=torch.float64) for name, n in out_features.items()}


def magnitude_scores(model: nn.Module) -> dict[str, torch.Tensor]:
    """‖W_c‖₂ of every output channel of every decoder linear (float64 [N], CPU)."""
    return {name: linear_weight(lin).double().norm(dim=1).cpu() for name, lin in iter_linears(model)}
