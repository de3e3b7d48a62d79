"""Clipping search: per quantization group, the shrink ratio of the range that best preserves the layer output.

AWQ's ``auto_clip`` (Lin et al. 2023, Sec. 3.2 / released code) and MixLLM Sec. 4.1 ("we enable GPTQ and
clipping"): for each group g of each output channel, try ratios r in {1, 1 - max_shrink/grid, ..., 1 - max_shrink},
quantize the group with its range shrunk by r (:func:`quantkit.quant.grid.group_params` ``clip``) and keep the r
minimising the group's contribution to the output error on calibration inputs X,

    E_g(r) = || (W_g - Q(W_g, r)) X_g^T ||^2  summed over sampled tokens,

or, without inputs, the weight error ||W_g - Q(W_g, r)||^2. The result is a clip tensor [N, G] for
``grid.quantize(..., clip=...)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from quantkit.errors import QuantkitError
from quantkit.quant import grid as qgrid

# Rows per chunk are chosen so one chunk's weight copy holds about this many elements (the einsum temporaries
# are a small multiple of it), which keeps the search within a few hundred MB for any layer size.
_CHUNK_ELEMENTS = 1 << 22


def shrink_ratios(grid: int = 20, max_shrink: float = 0.5) -> torch.Tensor:
    """Candidate clip ratios 1 - max_shrink·i/grid for i = 0..grid (float32, descending from 1.0)."""
    if int(grid) < 1:
        raise QuantkitError(f"clip grid must be >= 1 step, got {grid}; use e.g. grid=20")
    if not 0.0 < float(max_shrink) < 1.0:
        raise QuantkitError(f"clip max_shrink must be in (0, 1), got {max_shrink}; use e.g. max_shrink=0.5")
    i = torch.arange(int(grid) + 1, dtype=torch.float64)
    return (1.0 - float(max_shrink) * i / int(grid)).float()


def sample_tokens(inputs: torch.Tensor | list[torch.Tensor], k: int, n_tokens: int | None = 512,
                  device: torch.device | str | None = None) -> torch.Tensor:
    """Input rows [T, K] (float32) of a linear from activations [..., K] (or a list of them), sub-sampled to at
    most ``n_tokens`` evenly spaced rows — deterministic, and spread over all sequences of the batch."""
    parts = inputs if isinstance(inputs, (list, tuple)) else [inputs]
    rows = []
    for x in parts:
        if x.shape[-1] != k:
            raise ValueError(f"inputs have {x.shape[-1]} features, the weight has K={k}")
        rows.append(x.reshape(-1, k).to(device=device, dtype=torch.float32))
    x = torch.cat(rows, 0)
    if n_tokens is not None and 0 < n_tokens < x.shape[0]:
        idx = torch.linspace(0, x.shape[0] - 1, n_tokens, dtype=torch.float64).round().long()
        x = x[idx.to(x.device)]
    return x


def grouped(t: torch.Tensor, gs: int, ng: int) -> torch.Tensor:
    """[R, K] → [R, G, gs], zero-padding the short last group. Zero columns are neutral for the search: the
    group range always contains 0 (asym) / absmax ignores them (sym), 0 quantizes to exactly 0, and a zero input
    column contributes nothing to the output."""
    return F.pad(t, (0, ng * gs - t.shape[1])).reshape(t.shape[0], ng, gs)


def _fake_quant_rows(rows: torch.Tensor, bits: int, sym: bool, ratio: float) -> torch.Tensor:
    """Quantize→dequantize each row of ``rows`` [R, gs] as one group with clip ``ratio`` — the exact arithmetic
    of :func:`quantkit.quant.grid.quantize` (fp16-rounded scales)."""
    s, z = qgrid.group_params(rows, bits, sym, ratio)
    q = qgrid.quantize_codes(rows, s, z, bits, sym)
    return (q - z.unsqueeze(-1)) * s.unsqueeze(-1)


def seen_inputs(inputs: torch.Tensor | list[torch.Tensor] | None):
    """``inputs`` if they hold at least one token, else None (a MoE expert that calibration never routed to: its
    clip search falls back to the weight MSE)."""
    if inputs is None:
        return None
    if isinstance(inputs, torch.Tensor):
        return inputs if inputs.numel() else None
    return inputs if any(t.numel() for t in inputs) else None


def search_clip(weight: torch.Tensor, bits: int, group_size: int = 128, sym: bool = False,
                inputs: torch.Tensor | list[torch.Tensor] | None = None, grid: int = 20, max_shrink: float = 0.5,
                n_tokens: int | None = 512, chunk: int | None = None) -> torch.Tensor:
    """Per-group clip ratios [N, G] (float32) minimising E_g(r) above (AWQ auto_clip; MixLLM Sec. 4.1).

    ``weight`` [N, K]; ``inputs`` the linear's input activations [..., K] (None → weight MSE); ``n_tokens`` caps
    the sampled rows (None → all); ``chunk`` output channels per step (default: bounded memory). Ties keep the
    larger ratio, so a group whose error no shrink improves keeps r = 1.
    """
    qgrid.check_bits(bits)
    if weight.dim() != 2:
        raise ValueError(f"expected a 2-D weight, got shape {tuple(weight.shape)}")
    n, k = weight.shape
    gs = k if group_size == -1 else int(group_size)
    ng = qgrid.num_groups(k, group_size)
    ratios = shrink_ratios(grid, max_shrink).tolist()
    if chunk is None:
        chunk = max(1, _CHUNK_ELEMENTS // (ng * gs))
    error = weight_error
    inputs = seen_inputs(inputs)
    if inputs is not None:
        x = grouped(sample_tokens(inputs, k, n_tokens, weight.device), gs, ng)  # [T, G, gs]
        error = output_error(x)
    best = torch.ones(n, ng, dtype=torch.float32, device=weight.device)
    for start in range(0, n, chunk):
        w = grouped(weight[start:start + chunk].float(), gs, ng)  # [c, G, gs]
        rows = w.reshape(-1, gs)
        best_err = torch.full(w.shape[:2], float("inf"), device=w.device)
        for r in ratios:
            err = error(w - _fake_quant_rows(rows, bits, sym, r).view_as(w))
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best[start:start + chunk][better] = r
    return best


def weight_error(d: torch.Tensor) -> torch.Tensor:
    """||d_g||^2 per group, d [c, G, gs] → [c, G]."""
    return d.pow(2).sum(-1)


def output_error(x: torch.Tensor):
    """E_g for input rows x [T, G, gs]. With gs <= T the Gram form d_g^T (X_g^T X_g) d_g costs gs MACs per
    weight instead of T; for long groups (per-channel) the direct form sum_t (d_g · x_tg)^2 is cheaper."""
    t, _, gs = x.shape
    if gs <= t:
        gram = torch.einsum("tgk,tgl->gkl", x, x)

        def err(d: torch.Tensor) -> torch.Tensor:
            return (torch.einsum("cgk,gkl->cgl", d, gram) * d).sum(-1)
    else:
        def err(d: torch.Tensor) -> torch.Tensor:
            return torch.einsum("cgk,tgk->cgt", d, x).pow(2).sum(-1)
    return err
