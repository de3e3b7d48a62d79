"""LiquidQuant (LQQ) two-level W4 quantization and its overflow-free 8-bit dequantization (LiquidGEMM Sec. 4).

Level 1 (Eq. 1, protective range of Sec. 3.2): per output channel, Q_i8 = round(W / s_c) in [-119, 119] with
s_c = absmax / 119 (fp16, rounded up so no value clamps).
Level 2 (Eq. 7): per group, Q_u8 = Q_i8 - min(Q_i8) in [0, 238], Q_u4 = round(Q_u8 / s_u8) in [0, 15], and the
offset a = 2^7 + min(Q_i8) (Eq. 10).
Dequantization (Eq. 12): Q^_i8 = (Q_u4 · s_u8 + a) XOR 0x80, all in 8-bit unsigned lanes, then W^ = Q^_i8 · s_c.

Choice of s_u8. Eq. 7 writes s_u8 = max(Q_u8) / 15 rounded to an integer. Rounding to nearest can round *down*
(e.g. a group range of 22 gives s_u8 = round(1.47) = 1), and then codes up to 22 would have to clamp at 15 —
an error of 7 int8 steps instead of s_u8/2. We use s_u8 = max(1, ceil(max(Q_u8) / 15)) instead:

* max(Q_u8) / s_u8 <= 15, so Q_u4 = round(Q_u8 / s_u8) never clamps and |Q^_i8 - Q_i8| <= s_u8 / 2;
* s_u8 <= ceil(238 / 15) = 16, so Q_u4 · s_u8 <= 15 · 16 = 240 fits UINT8 (the multiply of Eq. 11);
* Q_u4 · s_u8 <= Q_u8 + s_u8/2 <= max(Q_u8) + 8, hence Q_u4 · s_u8 + a <= max(Q_i8) + 8 + 128 <= 255 — the
  bound of Eq. 11 holds, and the XOR of Eq. 12 returns exactly Q_u4 · s_u8 + min(Q_i8) (Eq. 8), no wraparound.

tests/test_lqq.py checks these three facts exhaustively over every (min, max) pair in [-119, 119].

Searched grid (:func:`lqq_search`). The kernel reads only (Q_u4, s_u8, a, s_c) and needs Q_u4 · s_u8 + a <= 255
for every stored code (no carry into the neighbouring byte lane). Within that format three choices are free, and
the paper's recipe fixes them by rule: s_c = absmax / 119, Q_i8 rounded before the second level, and s_u8 from the
full group range. :func:`lqq_search` instead picks them to minimise the error, the way QServe and AWQ pick their
clip ratios: a per-channel shrink of s_c (outliers saturate at ±119), the second level fitted to the real-valued
W / s_c with one rounding (not two), and per group a shrink of the range with s_u8 = ceil or ceil - 1 of
range / 15. Codes are clamped to q_max = min(15, floor((127 - m) / s_u8)) with m = min offset, so
Q_u4 · s_u8 + a <= 255 holds by construction; ``formats.w4a8_lqq`` checks it again on every packed element.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from quantkit.quant import grid
from quantkit.quant.grid import dequantize_lqq, lqq_int8_codes  # noqa: F401  (Eq. 12: part of this format's API)
from quantkit.quant.records import QuantizedWeight

PROTECT = 119  # LiquidGEMM Sec. 3.2 protective INT8 range [-119, 119]
U4_MAX = 15
S_MAX = 16  # the largest s_u8 the kernels accept (formats.w4a8_lqq)
I8_MAX = 127  # Q^_i8 = Q_u4 · s_u8 + m <= 127  <=>  Q_u4 · s_u8 + a <= 255


def lqq_first_level(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel symmetric INT8 in the protective range (LiquidGEMM Eq. 1 + Sec. 3.2): returns
    (Q_i8 int16 [N, K] in [-119, 119], s_c float32 [N] fp16-representable)."""
    w = weight.float()
    s_c = grid.round_scale_up(w.abs().amax(dim=1) / grid.device_scalar(PROTECT, w))
    q = torch.round(w / s_c.unsqueeze(1)).clamp_(-PROTECT, PROTECT)
    return q.to(torch.int16), s_c


def _group_reduce(q: torch.Tensor, g_idx: torch.Tensor, ng: int, reduce: str) -> torch.Tensor:
    """Per-row, per-group min/max of integer q [N, K] → [N, G] (groups may be ragged)."""
    out = torch.zeros(q.shape[0], ng, dtype=q.dtype, device=q.device)
    return out.scatter_reduce_(1, g_idx.expand_as(q), q, reduce, include_self=False)


def lqq_from_int8(q_i8: torch.Tensor, channel_scales: torch.Tensor, group_size: int = 128) -> QuantizedWeight:
    """Second LQQ level (LiquidGEMM Eq. 7, 10) on first-level codes Q_i8 [N, K] in [-119, 119]: UINT4 codes,
    integer s_u8 = max(1, ceil(range / 15)) (module docstring says why not round) and a = 128 + min(Q_i8) per
    group. Rounding is half-up in exact integer arithmetic: Q_u4 = floor((2·Q_u8 + s) / (2·s))."""
    if q_i8.dim() != 2:
        raise ValueError(f"expected 2-D INT8 codes, got shape {tuple(q_i8.shape)}")
    q = q_i8.to(torch.int32)
    if q.numel() and (int(q.min()) < -PROTECT or int(q.max()) > PROTECT):
        raise ValueError(f"LQQ first-level codes must lie in [-{PROTECT}, {PROTECT}]")
    n, k = q.shape
    ng = grid.num_groups(k, group_size)
    g = (torch.arange(k, device=q.device) // (k if group_size == -1 else group_size)).unsqueeze(0)
    qmin = _group_reduce(q, g, ng, "amin")
    qmax = _group_reduce(q, g, ng, "amax")
    s = torch.div(qmax - qmin + U4_MAX - 1, U4_MAX, rounding_mode="floor").clamp_(min=1)  # ceil, >= 1
    q_u8 = q - qmin.gather(1, g.expand(n, k))
    s_k = s.gather(1, g.expand(n, k))
    codes = torch.div(2 * q_u8 + s_k, 2 * s_k, rounding_mode="floor")
    return QuantizedWeight(codes=codes.to(torch.uint8), scales=s.float(), zeros=(128 + qmin).to(torch.uint8),
                           bits=4, group_size=group_size, sym=False,
                           channel_scales=channel_scales.float(), meta={"method": "lqq"})


def lqq_quantize(weight: torch.Tensor, group_size: int = 128) -> QuantizedWeight:
    """LiquidQuant two-level quantization of a weight [N, K] (LiquidGEMM Sec. 4, Eq. 1 and 7-10): codes = Q_u4,
    scales = s_u8 (integer-valued floats), zeros = a = 128 + min(Q_i8) (uint8), channel_scales = s_c."""
    if weight.dim() != 2:
        raise ValueError(f"expected a 2-D weight, got shape {tuple(weight.shape)}")
    q_i8, s_c = lqq_first_level(weight)
    return lqq_from_int8(q_i8, s_c, group_size)


def lqq_fit_groups(x: torch.Tensor, ratio: float | torch.Tensor = 1.0,
                   ceil_minus: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Second-level parameters of rows of real-valued first-level values ``x`` [R, C] (W / s_c, |x| <= 119),
    one group per row: offset m = round(ratio · min(x, 0)), s_u8 = clamp(ceil((ratio · max(x, 0) - m) / 15)
    - ceil_minus, 1, 16) and the code ceiling q_max = min(15, floor((127 - m) / s_u8)) (module docstring).
    Returns (m, s, q_max) as float32 [R]."""
    ratio = torch.as_tensor(ratio, dtype=torch.float32, device=x.device)
    lo = x.amin(dim=1).clamp(max=0) * ratio
    hi = x.amax(dim=1).clamp(min=0) * ratio
    m = torch.round(lo).clamp_(-PROTECT, PROTECT)
    s = (torch.ceil((hi - m) / U4_MAX) - ceil_minus).clamp_(1, S_MAX)
    q_max = torch.floor((I8_MAX - m) / s).clamp_(max=U4_MAX)
    return m, s, q_max


def lqq_codes(x: torch.Tensor, m: torch.Tensor, s: torch.Tensor, q_max: torch.Tensor) -> torch.Tensor:
    """Codes Q_u4 = clamp(round((x - m) / s_u8), 0, q_max) for per-row m, s_u8, q_max broadcast over columns."""
    q = torch.round((x - m.unsqueeze(-1)) / s.unsqueeze(-1))
    return torch.minimum(q.clamp_(min=0), q_max.unsqueeze(-1))


def _candidates(grid_steps: int, max_shrink: float) -> list[tuple[float, int]]:
    from quantkit.quant.clip import shrink_ratios

    return [(float(r), c) for r in shrink_ratios(grid_steps, max_shrink).tolist() for c in (0, 1)]


def lqq_search_groups(x: torch.Tensor, error, grid_steps: int = 10, max_shrink: float = 0.3,
                      target: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """The best second-level fit of each group of ``x`` [R, G, gs] (first-level units, |x| <= 119): every range
    shrink r in :func:`quantkit.quant.clip.shrink_ratios` with s_u8 = ceil and ceil - 1 of the shrunk range / 15.
    ``error(d)`` maps dequantization errors d [R, G, gs] to per-group losses [R, G] (weight MSE or the output
    error of :mod:`quantkit.quant.clip`), d measured from ``target`` (default ``x``; the unsaturated values when
    the first level clipped). Returns (m, s, q_max, loss), each [R, G]; ties keep the earlier, wider candidate."""
    target = x if target is None else target
    r_, g_, gs = x.shape
    rows = x.reshape(-1, gs)
    best = None
    for ratio, minus in _candidates(grid_steps, max_shrink):
        m, s, q_max = lqq_fit_groups(rows, ratio, minus)
        dq = lqq_codes(rows, m, s, q_max) * s.unsqueeze(-1) + m.unsqueeze(-1)
        loss = error(target - dq.view_as(x))
        params = (m.view(r_, g_), s.view(r_, g_), q_max.view(r_, g_))
        if best is None:
            best = [*params, loss]
            continue
        better = loss < best[3]
        for i, t in enumerate(params + (loss,)):
            best[i] = torch.where(better, t, best[i])
    return tuple(best)


def lqq_channel_scales(weight: torch.Tensor, ratio: float | torch.Tensor = 1.0) -> torch.Tensor:
    """First-level scales s_c = ratio · absmax / 119 per output channel, rounded up to fp16 (LiquidGEMM Eq. 1
    with the protective range of Sec. 3.2; ratio < 1 lets the channel's outliers saturate at ±119)."""
    w = weight.float()
    ratio = torch.as_tensor(ratio, dtype=torch.float32, device=w.device)
    return grid.round_scale_up(w.abs().amax(dim=1) * ratio / grid.device_scalar(PROTECT, w))


def lqq_record(q: torch.Tensor, m: torch.Tensor, s: torch.Tensor, channel_scales: torch.Tensor, group_size: int,
               meta: dict) -> QuantizedWeight:
    """A LiquidQuant QuantizedWeight from codes q [N, K] and per-group m, s_u8 [N, G] (a = 128 + m)."""
    return QuantizedWeight(codes=q.to(torch.uint8), scales=s.float(), zeros=(128 + m).to(torch.uint8), bits=4,
                           group_size=group_size, sym=False, channel_scales=channel_scales.float(), meta=meta)


def lqq_search(weight: torch.Tensor, group_size: int = 128, inputs: torch.Tensor | list[torch.Tensor] | None = None,
               channel_ratios: tuple[float, ...] = (1.0, 0.95, 0.9, 0.85, 0.8), grid_steps: int = 10,
               max_shrink: float = 0.3, n_tokens: int | None = 512) -> QuantizedWeight:
    """LiquidQuant weights [N, K] with the searched grid of the module docstring: for each first-level ratio
    (per channel, the best kept) every second-level candidate of :func:`lqq_search_groups`, scored by the output
    error ||(W - W^) X^T||² on sampled ``inputs`` [..., K] (AWQ auto_clip's objective, :mod:`quantkit.quant.clip`)
    or the weight MSE without inputs. The record dequantizes through the kernels' Eq. 12 unchanged."""
    from quantkit.quant.clip import grouped, output_error, sample_tokens, seen_inputs, weight_error

    if weight.dim() != 2:
        raise ValueError(f"expected a 2-D weight, got shape {tuple(weight.shape)}")
    w = weight.float()
    n, k = w.shape
    gs = k if group_size == -1 else int(group_size)
    ng = grid.num_groups(k, group_size)
    error = weight_error
    inputs = seen_inputs(inputs)
    if inputs is not None:
        error = output_error(grouped(sample_tokens(inputs, k, n_tokens, w.device), gs, ng))
    wg = grouped(w, gs, ng)
    best = None
    for cr in channel_ratios:
        s_c = lqq_channel_scales(w, cr)
        target = wg / s_c.view(n, 1, 1)
        m, s, q_max, loss = lqq_search_groups(target.clamp(-PROTECT, PROTECT), error, grid_steps, max_shrink,
                                              target)
        total = (loss * s_c.view(n, 1).pow(2)).sum(dim=1)  # back to weight units, per channel
        if best is None:
            best = [s_c, m, s, q_max, total]
            continue
        better = total < best[4]
        b2 = better.view(n, 1)
        best = [torch.where(better, s_c, best[0]), torch.where(b2, m, best[1]), torch.where(b2, s, best[2]),
                torch.where(b2, q_max, best[3]), torch.where(better, total, best[4])]
    s_c, m, s, q_max = best[:4]
    x = (F.pad(w, (0, ng * gs - k)) / s_c.unsqueeze(1)).clamp_(-PROTECT, PROTECT).view(n, ng, gs)
    q = lqq_codes(x.reshape(n * ng, gs), m.reshape(-1), s.reshape(-1), q_max.reshape(-1)).view(n, ng * gs)[:, :k]
    objective = "output" if inputs is not None else "weight"
    return lqq_record(q, m, s, s_c, group_size, {"method": "lqq", "search": objective})
