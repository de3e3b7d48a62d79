"""Round-to-nearest weight quantization, optionally with the clipping search.

RTN is MixLLM's base quantizer (Sec. 3.1.2, Fig. 8 "basic RTN"); with ``clip=True`` it adds the per-group
clipping of MixLLM Sec. 4.1 / AWQ auto_clip (:mod:`quantkit.quant.clip`).
"""

from __future__ import annotations

import torch

from quantkit.quant import grid
from quantkit.quant.clip import search_clip, seen_inputs
from quantkit.quant.records import QuantizedWeight


def rtn_quantize(weight: torch.Tensor, bits: int, group_size: int = 128, sym: bool = False, clip: bool = False,
                 inputs: torch.Tensor | list[torch.Tensor] | None = None, **clip_options) -> QuantizedWeight:
    """Quantize ``weight`` [N, K] to the nearest grid point per group (LiquidGEMM Eq. 1; MixLLM Sec. 3.1.2).

    ``clip=True`` first searches per-group range shrink ratios (:func:`quantkit.quant.clip.search_clip`, output
    error on ``inputs`` [..., K] when given, weight MSE otherwise; ``clip_options`` go to the search: grid,
    max_shrink, n_tokens, chunk). ``meta`` = {"method": "rtn", "clip": None | "weight" | "output"}.
    """
    inputs = seen_inputs(inputs)
    if not clip and (inputs is not None or clip_options):
        raise ValueError("inputs/clip options only drive the clipping search; pass clip=True to use them")
    ratios = search_clip(weight, bits, group_size, sym, inputs=inputs, **clip_options) if clip else 1.0
    qw = grid.quantize(weight, bits, group_size, sym, clip=ratios)
    objective = None if not clip else "output" if inputs is not None else "weight"
    qw.meta = {"method": "rtn", "clip": objective}
    return qw
