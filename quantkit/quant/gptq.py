"""GPTQ: one-shot weight quantization with second-order error compensation (Frantar et al. 2022).

Algorithm 1 of the paper, with the three steps of Sec. 4: arbitrary column order (quantize columns left to
right, or by descending diag(H) with act-order), lazy batch updates (blocks of 128 columns: inside a block the
error is propagated column by column, to the rest of the matrix once per block), and the Cholesky
reformulation (H⁻¹ via the upper Cholesky factor of the dampened inverse, :mod:`quantkit.quant.hessian`).

Group-wise grids are fixed when the column sweep reaches the first column of a group, from the weights *as they
are then* (already error-compensated), like the paper's g128 results; ``static_groups`` instead fixes every
group up front on the original column order (GPTQ's static-groups option for act-order). Rows never interact
in GPTQ (H is shared, the update of row n depends only on row n's errors), so an output-channel partition with
several bit-widths (MixLLM Sec. 3.4) runs as one sweep in which each row uses its own grid.

A RowSpec with ``lqq`` quantizes its rows on LiquidQuant's two-level grid (LiquidGEMM Sec. 4): the per-channel
first-level scale s_c is fixed up front (:func:`quantkit.quant.lqq.lqq_search` on the original weights), and at
each group's first column the integer second level (offset m, s_u8, code ceiling) is fitted to the compensated
weights divided by s_c (:func:`quantkit.quant.lqq.lqq_search_groups`, weight MSE). Each column is then coded
q = clamp(round((w / s_c - m) / s_u8), 0, q_max) and dequantized as (q · s_u8 + m) · s_c, exactly the kernels'
Eq. 12 followed by the epilogue's s_c, so GPTQ compensates the error of the grid the kernel really reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from quantkit.errors import QuantkitError
from quantkit.model.layerwise import LayerBatch, layer_output
from quantkit.model.memory import fits
from quantkit.model.moe import MIN_TOKENS_PER_FEATURE, is_expert_linear
from quantkit.model.replay import BlockReplay, record_bytes
from quantkit.quant import grid
from quantkit.quant import lqq
from quantkit.quant.clip import weight_error, sample_tokens, search_clip
from quantkit import distributed
from quantkit.quant.hessian import HessianAccumulator, damped_inverse_cholesky
from quantkit.quant.layerquant import LayerQuantConfig, check_row_bits, linear_input, pre_hooks, write_weight
from quantkit.quant.records import Partition, PartitionedWeight, QuantizedWeight


@dataclass
class RowSpec:
    """Rows of a weight quantized on one grid. ``rows`` None = all rows; ``clip`` a float or [n_rows, G]
    per-group range ratios (:func:`quantkit.quant.clip.search_clip`); ``lqq`` the LiquidQuant two-level 4-bit
    grid (module docstring; ``sym`` and ``clip`` do not apply to it)."""

    rows: torch.Tensor | None
    bits: int
    group_size: int = 128
    sym: bool = False
    clip: torch.Tensor | float | None = None
    lqq: bool = False


@dataclass
class GPTQResult:
    """What a GPTQ sweep decided: ``weight`` [N, K] float32, the dequantized weights used for the error
    compensation (original column order); ``parts`` one QuantizedWeight per RowSpec whose dequantization equals
    those rows of ``weight`` bit for bit; ``loss`` GPTQ's Σ (w - q)² / (2 U_qq²) (U the upper Cholesky factor
    of H⁻¹: U_qq² is [H_F⁻¹]_qq of the OBS step, Eq. 2-3); ``percdamp`` the dampening actually used."""

    weight: torch.Tensor
    parts: list[QuantizedWeight]
    loss: float
    percdamp: float


class _RowGrid:
    """Sweep state of one RowSpec: its rows, grid, per-group scales/zeros as they get fixed."""

    def __init__(self, spec: RowSpec, n: int, k: int, device: torch.device, weight: torch.Tensor):
        grid.check_bits(spec.bits)
        if spec.lqq and spec.bits != 4:
            raise ValueError(f"the LiquidQuant grid is 4-bit, got bits={spec.bits}")
        self.spec = spec
        self.rows = slice(None) if spec.rows is None else spec.rows.to(device=device, dtype=torch.long)
        self.n_rows = n if spec.rows is None else int(spec.rows.numel())
        self.gs = k if spec.group_size == -1 else int(spec.group_size)
        self.ng = grid.num_groups(k, spec.group_size)
        clip = 1.0 if spec.clip is None else spec.clip
        clip = torch.as_tensor(clip, dtype=torch.float32, device=device)
        self.clip = clip.expand(self.n_rows, self.ng) if clip.dim() == 0 else clip
        if tuple(self.clip.shape) != (self.n_rows, self.ng):
            raise ValueError(f"clip has shape {tuple(self.clip.shape)}, expected {(self.n_rows, self.ng)}")
        self.scales = torch.zeros(self.n_rows, self.ng, dtype=torch.float32, device=device)
        self.zeros = torch.zeros(self.n_rows, self.ng, dtype=torch.float32, device=device)
        self.channel_scales = self.q_max = None
        if spec.lqq:  # scales = s_u8, zeros = the offset m, per group; s_c per row, fixed up front
            self.channel_scales = lqq.lqq_search(weight[self.rows], spec.group_size).channel_scales.to(device)
            self.q_max = torch.zeros(self.n_rows, self.ng, dtype=torch.float32, device=device)

    def fix_group(self, g: int, w: torch.Tensor) -> None:
        """Grid of group ``g`` from its weights ``w`` [n_rows, cols]: scale/zero (grid.group_params, clip of g),
        or LiquidQuant's s_u8, offset and code ceiling fitted to w / s_c (lqq.lqq_search_groups)."""
        if self.spec.lqq:
            x = (w.float() / self.channel_scales.unsqueeze(1)).unsqueeze(1)  # [rows, 1, cols]
            m, s, q_max, _ = lqq.lqq_search_groups(x.clamp(-lqq.PROTECT, lqq.PROTECT), weight_error, target=x)
            self.zeros[:, g], self.scales[:, g], self.q_max[:, g] = m[:, 0], s[:, 0], q_max[:, 0]
            return
        s, z = grid.group_params(w, self.spec.bits, self.spec.sym, self.clip[:, g])
        self.scales[:, g] = s
        self.zeros[:, g] = z


def _check_rows(specs: list[RowSpec], n: int) -> None:
    if len(specs) == 1 and specs[0].rows is None:
        return
    if any(s.rows is None for s in specs):
        raise ValueError("rows=None (all rows) cannot be combined with other row specs")
    rows = torch.cat([s.rows.reshape(-1).long().cpu() for s in specs])
    if rows.numel() != n or not torch.equal(rows.sort().values, torch.arange(n)):
        raise ValueError(f"row specs must partition the {n} output channels exactly once")


@torch.no_grad()
def gptq_solve(weight: torch.Tensor, hessian: torch.Tensor, specs: list[RowSpec], blocksize: int = 128,
               percdamp: float = 0.01, act_order: bool = False, static_groups: bool = False,
               name: str = "") -> GPTQResult:
    """GPTQ Algorithm 1 on ``weight`` [N, K] with Hessian ``hessian`` [K, K], in float32 on weight's device.

    Dead inputs (H_ii = 0) get H_ii = 1 and a zero weight column (GPTQ reference). ``act_order`` sweeps
    columns by descending diag(H); then ``g_idx`` records each column's group in sweep order (GPTQ desc_act),
    unless ``static_groups`` fixed the groups on the original order up front (g_idx = k // group_size, None).
    """
    if weight.dim() != 2 or hessian.shape != (weight.shape[1], weight.shape[1]):
        raise ValueError(f"weight {tuple(weight.shape)} and Hessian {tuple(hessian.shape)} do not match")
    if blocksize < 1:
        raise QuantkitError(f"GPTQ blocksize must be >= 1, got {blocksize}; use e.g. 128")
    n, k = weight.shape
    dev = weight.device
    _check_rows(specs, n)
    if act_order and not static_groups and any(isinstance(s.clip, torch.Tensor) and s.clip.dim() > 0
                                               for s in specs):
        raise QuantkitError("GPTQ clip ratios are per consecutive column group, but act_order without "
                            "static_groups regroups the columns; set static_groups=True to use clipping")
    if act_order and not static_groups and any(s.lqq for s in specs):
        raise QuantkitError("the LiquidQuant grid needs consecutive column groups, but act_order without "
                            "static_groups regroups the columns; set static_groups=True or turn act_order off")
    w = weight.detach().to(dtype=torch.float32).clone()
    h = hessian.detach().to(device=dev, dtype=torch.float32).clone()
    dead = h.diagonal() == 0
    h.diagonal()[dead] = 1.0
    w[:, dead] = 0.0
    grids = [_RowGrid(s, n, k, dev, w) for s in specs]

    if static_groups:
        for rg in grids:
            for g in range(rg.ng):
                rg.fix_group(g, w[rg.rows, g * rg.gs:(g + 1) * rg.gs])
    perm = None
    if act_order:
        perm = torch.argsort(h.diagonal(), descending=True, stable=True)
        w, h = w[:, perm], h[perm][:, perm]
    u, damp_used = damped_inverse_cholesky(h, percdamp, name)
    # column j of the sweep is original column orig[j]; static groups are looked up by the original index
    orig = perm.tolist() if perm is not None else range(k)

    codes = torch.zeros(n, k, dtype=torch.uint8, device=dev)  # q is integer-valued in [0, 255]
    decided = torch.zeros(n, k, dtype=torch.float32, device=dev)
    scale = torch.zeros(n, dtype=torch.float32, device=dev)
    zero = torch.zeros(n, dtype=torch.float32, device=dev)
    lo = torch.zeros(n, dtype=torch.float32, device=dev)
    hi = torch.zeros(n, dtype=torch.float32, device=dev)
    for rg in grids:
        lo[rg.rows] = 1.0 if rg.spec.sym else 0.0  # sym codes stay in [1, 2^b - 1] (records.py)
        hi[rg.rows] = float(2 ** rg.spec.bits - 1)
    lqq_rows = None  # LiquidQuant rows: mask, and s_c per row (scale/zero/hi then hold s_u8, m, q_max)
    if any(rg.spec.lqq for rg in grids):
        lqq_rows = torch.zeros(n, dtype=torch.bool, device=dev)
        s_c = torch.ones(n, dtype=torch.float32, device=dev)
        for rg in grids:
            if rg.spec.lqq:
                lqq_rows[rg.rows] = True
                s_c[rg.rows] = rg.channel_scales
    loss = torch.zeros((), dtype=torch.float64, device=dev)

    for i1 in range(0, k, blocksize):
        i2 = min(i1 + blocksize, k)
        w1 = w[:, i1:i2].clone()
        err1 = torch.zeros_like(w1)
        u1 = u[i1:i2, i1:i2]
        for i in range(i2 - i1):
            j = i1 + i
            for rg in grids:
                if static_groups:
                    g = orig[j] // rg.gs
                elif j % rg.gs == 0:
                    g = j // rg.gs
                    rg.fix_group(g, _current_columns(w, w1, err1, u, rg.rows, i1, i2, j, min(j + rg.gs, k)))
                else:
                    continue
                scale[rg.rows] = rg.scales[:, g]
                zero[rg.rows] = rg.zeros[:, g]
                if rg.spec.lqq:
                    hi[rg.rows] = rg.q_max[:, g]
            col = w1[:, i]
            q = torch.minimum(torch.maximum(torch.round(col / scale) + zero, lo), hi)
            dq = (q - zero) * scale
            if lqq_rows is not None:
                q_l = torch.minimum(torch.round((col / s_c - zero) / scale).clamp_(min=0), hi)
                q = torch.where(lqq_rows, q_l, q)
                dq = torch.where(lqq_rows, (q_l * scale + zero) * s_c, dq)
            codes[:, j] = q
            decided[:, j] = dq
            e = (col - dq) / u1[i, i]
            w1[:, i + 1:].addr_(e, u1[i, i + 1:], alpha=-1.0)
            err1[:, i] = e
        loss += err1.double().pow(2).sum() / 2
        w[:, i2:].addmm_(err1, u[i1:i2, i2:], alpha=-1.0)

    if perm is not None:
        inv = torch.argsort(perm)
        codes, decided = codes[:, inv], decided[:, inv]
    parts = []
    for rg in grids:
        if perm is not None and not static_groups and rg.ng > 1:
            g_idx = (inv // rg.gs).to(torch.int32)  # the group each column joined in sweep order
        else:
            g_idx = None
        meta = {"method": "gptq", "act_order": act_order, "static_groups": static_groups,
                "percdamp": damp_used, "blocksize": blocksize}
        if rg.spec.lqq:
            parts.append(lqq.lqq_record(codes[rg.rows], rg.zeros, rg.scales, rg.channel_scales,
                                        rg.spec.group_size, {**meta, "grid": "lqq"}))
            continue
        parts.append(QuantizedWeight(codes=codes[rg.rows], scales=rg.scales,
                                     zeros=rg.zeros.to(torch.uint8), bits=rg.spec.bits,
                                     group_size=rg.spec.group_size, sym=rg.spec.sym, g_idx=g_idx, meta=meta))
    return GPTQResult(weight=decided, parts=parts, loss=float(loss), percdamp=damp_used)


def _current_columns(w, w1, err1, u, rows, i1: int, i2: int, j: int, end: int) -> torch.Tensor:
    """Sweep columns j..end-1 of ``rows`` with every error compensation of the columns quantized so far.

    Inside the current block they are up to date in ``w1``; past the block the lazy batch update has not been
    applied yet, so it is applied here for the block's columns quantized so far (err1[:, :j-i1]).
    """
    inside = w1[rows, j - i1:min(end, i2) - i1]
    if end <= i2:
        return inside
    done = j - i1
    beyond = w[rows, i2:end] - err1[rows, :done] @ u[i1:i1 + done, i2:end]
    return torch.cat([inside, beyond], dim=1)


class GPTQ:
    """GPTQ for one nn.Linear: feed it the linear's inputs with :meth:`add_batch`, then :meth:`quantize`.
    Linears that read one input tensor (q/k/v, gate/up) may share one ``accumulator``: H depends only on X."""

    def __init__(self, linear: nn.Linear, name: str = "", accumulator: HessianAccumulator | None = None):
        self.linear = linear
        self.name = name
        self.accumulator = accumulator or HessianAccumulator(linear.in_features, linear.weight.device)

    @property
    def hessian(self) -> torch.Tensor:
        """H = 2/n Σ x xᵀ over the n input rows seen (GPTQ Sec. 3)."""
        return self.accumulator.hessian

    @property
    def nsamples(self) -> int:
        """Input rows (tokens) accumulated so far."""
        return self.accumulator.count

    def add_batch(self, inp: torch.Tensor) -> None:
        """Accumulate the Hessian from the linear's inputs [..., K]."""
        self.accumulator.add(inp)

    def solve(self, specs: list[RowSpec], blocksize: int = 128, percdamp: float = 0.01, act_order: bool = False,
              static_groups: bool = False) -> GPTQResult:
        """Run :func:`gptq_solve` on this linear's weight and accumulated Hessian."""
        if self.nsamples == 0:
            raise QuantkitError(f"GPTQ saw no calibration inputs for {self.name or 'this linear'}; the layer's "
                                "forward never called it — check the calibration data and the layer's forward")
        return gptq_solve(self.linear.weight, self.hessian, specs, blocksize, percdamp, act_order,
                          static_groups, self.name)

    def quantize(self, bits: int, group_size: int = 128, sym: bool = False, blocksize: int = 128,
                 percdamp: float = 0.01, act_order: bool = False, static_groups: bool = False,
                 clip: torch.Tensor | None = None) -> QuantizedWeight:
        """GPTQ-quantize the whole weight on one grid (GPTQ Algorithm 1). Does not modify the linear."""
        spec = RowSpec(None, bits, group_size, sym, clip)
        return self.solve([spec], blocksize, percdamp, act_order, static_groups).parts[0]

    def quantize_partitions(self, specs: list[RowSpec], blocksize: int = 128, percdamp: float = 0.01,
                            act_order: bool = False, static_groups: bool = False) -> PartitionedWeight:
        """GPTQ with a grid per output-channel partition (MixLLM Sec. 3.4), as one sweep over K."""
        result = self.solve(specs, blocksize, percdamp, act_order, static_groups)
        return _partitioned(self.linear, specs, result)


def _partitioned(linear: nn.Linear, specs: list[RowSpec], result: GPTQResult) -> PartitionedWeight:
    parts = []
    for spec, qw in zip(specs, result.parts):
        rows = spec.rows.reshape(-1).long().cpu()
        if rows.numel() > 1 and not bool((rows[1:] > rows[:-1]).all()):
            raise ValueError("partition rows must be sorted ascending (records.Partition)")
        parts.append(Partition(rows=rows, weight=qw))
    return PartitionedWeight(out_features=linear.out_features, in_features=linear.in_features, partitions=parts)


@dataclass
class GPTQConfig(LayerQuantConfig):
    """GPTQ settings for :func:`gptq_quantize_layer` (defaults: the paper's 4-bit g128, 1% dampening, blocks of
    128, true-sequential). ``clip`` adds MixLLM Sec. 4.1's clipping search on each linear's inputs before GPTQ.
    ``replay`` (true-sequential only) replays final sub-blocks instead of recomputing them: the same bits, less
    compute, one copy of each replayed block's input and last-linear input per window in memory — taken only
    while that fits a quarter of the free memory where the batches are (:func:`quantkit.model.memory.fits`)."""

    act_order: bool = False
    static_groups: bool = False
    percdamp: float = 0.01
    blocksize: int = 128
    true_sequential: bool = True
    replay: bool = True
    clip: bool = False
    clip_grid: int = 20
    clip_max_shrink: float = 0.5
    clip_n_tokens: int = 512

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.clip and self.act_order and not self.static_groups:
            raise QuantkitError("GPTQ clipping needs static_groups=True with act_order (clip ratios are searched "
                                "on consecutive column groups); set static_groups or turn clip off")


class _StageDone(Exception):
    """Raised from a hook once every linear of the current stage has seen its input: the rest of the layer's
    forward is not needed for this stage."""


def sequential_stages(layer: nn.Module, batch: LayerBatch, linears: dict[str, nn.Linear]) -> list[list[str]]:
    """The linears grouped in call order by shared input tensor: [[q, k, v], [o], [gate, up], [down]] for
    Llama-like layers — GPTQ's "true sequential" order, found by running the layer once, not by names. MoE experts
    the batch routes no token to come last, gate and up of each expert sharing a group and down alone."""
    calls: list[tuple[str, torch.Tensor]] = []
    seen: set[str] = set()

    def record(name, args, kwargs):
        calls.append((name, linear_input(args, kwargs)))  # keeping the tensor alive makes `is` meaningful
        seen.add(name)
        if len(seen) == len(linears):
            raise _StageDone

    with torch.no_grad(), pre_hooks(linears, record):
        try:
            layer_output(layer, batch)
        except _StageDone:
            pass
    missing = [n for n in linears if n not in seen]
    unrouted = [n for n in missing if is_expert_linear(n)]  # MoE experts this batch routed no token to
    missing = [n for n in missing if not is_expert_linear(n)]
    if missing:
        raise QuantkitError(f"linear(s) {', '.join(missing)} are not called by their layer's forward; "
                            "leave them out of the linears to quantize")
    stages: list[list[str]] = []
    last = None
    placed: set[str] = set()
    for name, x in calls:
        if name in placed:
            continue
        if stages and x is last:
            stages[-1].append(name)
        else:
            stages.append([name])
        placed.add(name)
        last = x
    by_expert: dict[str, list[str]] = {}
    for name in unrouted:  # after the routed ones, as their own stages: gate and up, then down, of each expert
        expert, leaf = name.rsplit(".", 1)
        by_expert.setdefault(f"{expert}.{'down' if leaf == 'down_proj' else 'in'}", []).append(name)
    return stages + [group for key, group in sorted(by_expert.items(), key=lambda kv: kv[0].endswith(".down"))]


def _collect(layer: nn.Module, batches: list[LayerBatch], groups: list[list[str]], linears: dict[str, nn.Linear],
             config: GPTQConfig, replay: BlockReplay | None = None,
             ) -> tuple[dict[str, GPTQ], dict[str, list[torch.Tensor]]]:
    """Run the layer over the batches, accumulating one Hessian per group of linears that read one input tensor
    (:func:`sequential_stages`; and token samples for clipping). The forward stops at the first linear of the
    last group, whose input is then known; ``replay`` skips
    the sub-blocks it can replay (:mod:`quantkit.model.replay`)."""
    gptqs: dict[str, GPTQ] = {}
    samples: dict[str, list[torch.Tensor]] = {}
    group_of: dict[str, int] = {}
    for gi, group in enumerate(groups):
        shared = HessianAccumulator(linears[group[0]].in_features, linears[group[0]].weight.device)
        kept: list[torch.Tensor] = []
        for n in group:
            gptqs[n] = GPTQ(linears[n], n, shared)
            samples[n] = kept
            group_of[n] = gi
    per_batch = -(-config.clip_n_tokens // max(1, len(batches)))
    seen: dict[int, torch.Tensor] = {}

    def observe(name, args, kwargs):
        x = linear_input(args, kwargs)
        gi = group_of[name]
        if gi in seen:
            return
        seen[gi] = x  # the group's first linear of this forward: the input every linear of the group reads
        gptqs[name].add_batch(x)
        if config.clip:
            samples[name].append(sample_tokens(x, x.shape[-1], per_batch))
        if len(seen) == len(groups):  # every group's input is known: the rest of the forward is not needed
            raise _StageDone

    def forward(b: LayerBatch) -> None:
        seen.clear()
        try:
            layer_output(layer, b)
        except _StageDone:
            pass

    with torch.no_grad(), pre_hooks({n: linears[n] for n in gptqs}, observe):
        if replay is None:
            for b in batches:
                forward(b)
        else:
            replay.run(batches, forward)
    for group in groups:  # data-parallel calibration: every process solves on all processes' inputs
        gptqs[group[0]].accumulator.reduce_across_processes()
        if config.clip:
            samples[group[0]][:] = distributed.gather_tensors(samples[group[0]])
    return gptqs, samples


def expert_stages(groups: list[list[str]]) -> list[list[str]]:
    """True-sequential stages from the input groups: each group its own stage, except that the routed experts'
    gate/up groups form one stage and their down groups another (each expert's down reads only its own gate/up), so
    a layer of E experts runs 4 stages, not 2E + 2."""
    stages: list[list[str]] = []
    where: dict[str, int] = {}
    for group in groups:
        if not all(is_expert_linear(n) for n in group):
            stages.append(list(group))
            continue
        key = "down" if all(n.endswith("down_proj") for n in group) else "in"
        if key not in where:
            where[key] = len(stages)
            stages.append([])
        stages[where[key]].extend(group)
    return stages


def _expert_need(name: str, linears: dict[str, nn.Linear]) -> float:
    """The tokens the expert of linear ``name`` needs (quantkit.model.moe.min_tokens over its linears here)."""
    expert = name.rsplit(".", 1)[0]
    return MIN_TOKENS_PER_FEATURE * max(lin.in_features for n, lin in linears.items() if n.rsplit(".", 1)[0] == expert)


def _identity(linear: nn.Linear) -> HessianAccumulator:
    """An accumulator holding H = I: GPTQ on it rounds to nearest."""
    acc = HessianAccumulator(linear.in_features, linear.weight.device)
    acc.hessian.fill_diagonal_(1.0)
    acc.count = 1
    return acc


def _row_specs(name: str, linear: nn.Linear, bits_of_rows: torch.Tensor | None, config: GPTQConfig,
               samples: list[torch.Tensor]) -> list[RowSpec]:
    """The RowSpecs of one linear (one per bit-width of a plan's row assignment), with clip ratios searched on
    the linear's sampled inputs when ``config.clip``."""
    specs = []
    for rows, spec in config.row_grids(name, linear.out_features, bits_of_rows):
        clip = None
        if config.clip and not spec.lqq:  # the LiquidQuant grid searches its own fit at each group
            w = linear.weight if rows is None else linear.weight[rows.to(linear.weight.device)]
            clip = search_clip(w, spec.bits, spec.group_size, spec.sym, inputs=samples, grid=config.clip_grid,
                               max_shrink=config.clip_max_shrink, n_tokens=config.clip_n_tokens)
        specs.append(RowSpec(rows, spec.bits, spec.group_size, spec.sym, clip, spec.lqq))
    return specs


@torch.no_grad()
def gptq_quantize_layer(layer: nn.Module, batches: list[LayerBatch], linear_names: dict[str, nn.Linear],
                        config: GPTQConfig | dict,
                        row_bits: dict[str, torch.Tensor] | None = None,
                        outputs: list[LayerBatch] | None = None,
                        ) -> dict[str, QuantizedWeight | PartitionedWeight]:
    """GPTQ-quantize the linears of one decoder layer (GPTQ Sec. 4 "Step 3" / Sec. 5 setup) and write the
    dequantized weights back into them (in each weight's dtype).

    The layer runs on the captured ``batches`` with hooks accumulating one Hessian per group of linears that read
    the same input. With ``true_sequential`` the groups are quantized stage by stage (q,k,v → o → gate,up →
    down), each stage's Hessians taken with the earlier stages already quantized; sub-blocks whose linears are
    final are replayed from their last linear's recorded input instead of recomputed (:mod:`quantkit.model.replay`:
    the attention core runs once per window). ``row_bits[name]`` (a bit-width per output channel, MixLLM plans)
    makes that linear a :class:`PartitionedWeight` with one grid per bit-width. A list passed as ``outputs``
    receives the quantized layer's output for every batch (the next layer's inputs).
    """
    config = GPTQConfig.coerce(config)
    if not linear_names:
        if outputs is not None:
            outputs.extend(LayerBatch(layer_output(layer, b), b.kwargs) for b in batches)
        return {}
    row_bits = check_row_bits(row_bits, linear_names)
    # each process's first window routes MoE tokens its own way, which orders the groups: process 0's order is used
    # by all, so that data-parallel reductions pair the same linears (quantkit.distributed)
    groups = distributed.broadcast_object(sequential_stages(layer, batches[0], linear_names))
    stages = expert_stages(groups) if config.true_sequential else [[n for g in groups for n in g]]
    replay = None
    if config.true_sequential and config.replay and fits(record_bytes(batches, linear_names), batches[0].hidden.device):
        replay = BlockReplay(layer, linear_names, batches[0])
    out: dict[str, QuantizedWeight | PartitionedWeight] = {}
    under_covered: list[str] = []
    for stage in stages:
        if replay is not None:
            replay.stage(stage)
        stage_groups = [[n for n in g if n in stage] for g in groups]
        gptqs, samples = _collect(layer, batches, [g for g in stage_groups if g], linear_names, config, replay)
        for name in stage:
            linear = linear_names[name]
            specs = _row_specs(name, linear, row_bits.get(name), config, samples[name])
            gptq = gptqs.pop(name)
            if is_expert_linear(name) and gptq.nsamples < _expert_need(name, linear_names):
                # quantkit.model.moe.MIN_TOKENS_RULE: an identity Hessian propagates no error, so GPTQ is RTN on
                # the same grids (and the recipe's clipping, searched above on what inputs there were)
                gptq = GPTQ(linear, name, _identity(linear))
                under_covered.append(name)
            result = gptq.solve(specs, config.blocksize, config.percdamp, config.act_order, config.static_groups)
            write_weight(linear, result.weight)
            out[name] = result.parts[0] if specs[0].rows is None else _partitioned(linear, specs, result)
            if name in under_covered:
                rec = out[name]
                for qw in [p.weight for p in rec.partitions] if isinstance(rec, PartitionedWeight) else [rec]:
                    qw.meta = {**qw.meta, "method": "rtn", "reason": "under-covered expert"}
        if replay is not None:
            replay.finish(stage)
    if outputs is not None:
        outputs.extend(replay.outputs(batches) if replay is not None
                       else [LayerBatch(layer_output(layer, b), b.kwargs) for b in batches])
    return out
