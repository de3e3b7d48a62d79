"""Quantize a whole model following a recipe (and optionally a MixLLM precision plan), in memory.

RTN/LiquidQuant without clipping quantize each linear on its own. GPTQ, AWQ and clipping need calibration inputs:
they run through :func:`quantkit.model.run_layerwise`, one decoder layer on the compute device at a time, the
inputs of layer i+1 taken from the already-quantized layer i (GPTQ Sec. 4 "Step 3"). Each linear's weight is
replaced by its dequantized value (fake-quant), and the integer records are returned for packing, so a packed
checkpoint holds exactly the codes the fake-quant evaluation used. With A8 recipes, forward pre-hooks quantize the
linears' inputs (MixLLM Sec. 3.1.2).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from quantkit.errors import QuantkitError
from quantkit.model.layerwise import run_layerwise
from quantkit.model.walk import iter_linears, output_linear, untie_output_embeddings
from quantkit.quant.layerquant import write_weight
from quantkit.quant.partition import (WeightRecord, dequantize_record, quantize_partitioned, record_bits,
                                      record_to)
from quantkit.quant.recipe import LM_HEAD_BITS, LM_HEAD_GROUP, LM_HEAD_SYM, Recipe

ProgressFactory = Callable[[str, int | None], AbstractContextManager]

# calibration windows run through a decoder layer together, about this many tokens at once: on a CPU the GEMMs of
# one 512-token window run at half the speed of a few windows' (AWQ on 16 x 512 tokens: 35.4 s one window at a
# time, 27.6 s eight), while a GPU holds such a batch's activations easily
CALIB_BATCH_TOKENS = 8192


@dataclass
class QuantizeResult:
    """What :func:`quantize_model` did: integer records per linear, activation hooks, bit statistics."""

    weights: dict[str, WeightRecord]
    recipe: Recipe
    avg_bits: float
    calibration: dict | None = None
    act_handles: list = field(default_factory=list)
    online_rotation: dict | None = None  # {"seed", "linears"}: inputs rotated at run time (quant.rotate)
    weight_only: list[str] = field(default_factory=list)  # quantized linears whose inputs stay unquantized (lm_head)

    def summary(self) -> dict:
        return {"recipe": self.recipe.name, "linears": len(self.weights), "avg_bits": self.avg_bits,
                "calibration": self.calibration}


def _row_bits_for(plan, name: str, linear: nn.Linear, default_bits: int) -> torch.Tensor:
    if plan is None:
        return torch.full((linear.out_features,), default_bits, dtype=torch.int64)
    return plan.row_bits(name)


def _rows_quantizer(recipe: Recipe, name: str, inputs=None):
    """quantize_rows(sub_weight, bits) for RTN / LiquidQuant partitions of linear ``name``."""
    from quantkit.quant.grid import quantize_fp8
    from quantkit.quant.lqq import lqq_quantize, lqq_search
    from quantkit.quant.rtn import rtn_quantize

    def quantize_rows(w: torch.Tensor, bits: int):
        spec = recipe.spec_for(name, bits)
        if spec.method == "lqq":
            return lqq_search(w, spec.group_size, inputs=inputs) if spec.clip else lqq_quantize(w, spec.group_size)
        if spec.grid == "fp8":
            return quantize_fp8(w, spec.group_size)
        if spec.clip:
            return rtn_quantize(w, spec.bits, spec.group_size, spec.sym, clip=True, inputs=inputs)
        return rtn_quantize(w, spec.bits, spec.group_size, spec.sym)

    return quantize_rows


def _smoothing_quantizers(recipe: Recipe, targets: dict[str, nn.Linear]):
    """(fake_weight, fake_act) that score SmoothQuant's per-fold α search (quantkit.quant.smooth): each linear's
    recipe grid by round-to-nearest (the proxy for GPTQ/AWQ/clipping, which run after the fold), and the
    recipe's activation grid."""
    from quantkit.quant.act import quantize_activation
    from quantkit.quant.grid import quantize_fp8
    from quantkit.quant.lqq import lqq_quantize
    from quantkit.quant.rtn import rtn_quantize

    names = {id(lin): n for n, lin in targets.items()}
    act = recipe.activation

    def fake_weight(lin: nn.Linear, w: torch.Tensor) -> torch.Tensor:
        name = names.get(id(lin))
        spec = recipe.spec_for(name) if name is not None else None
        if spec is None or spec.skip:
            return w
        if spec.grid == "fp8":
            return dequantize_record(quantize_fp8(w, spec.group_size))
        lqq = spec.grid == "lqq"
        rec = lqq_quantize(w, spec.group_size) if lqq else rtn_quantize(w, spec.bits, spec.group_size, spec.sym)
        return dequantize_record(rec)

    return fake_weight, lambda x: quantize_activation(x, act.bits, act.group_size, act.sym, act.fp8)


def _layer_config(recipe: Recipe, method: str):
    """GPTQ/AWQ layer config from the recipe: defaults, per-name overrides, per-bit-width partition grids."""
    w = recipe.weight

    def override(name: str):
        s = recipe.spec_for(name)
        return (s.bits, s.group_size, s.sym)

    bit_specs = {}
    for b in range(2, 9):
        s = recipe.spec_for("", b)
        bit_specs[b] = (s.group_size, s.sym)
    common = dict(bits=w.bits, group_size=w.group_size, sym=w.sym, override=override, bit_specs=bit_specs)
    if method == "gptq":
        from quantkit.quant.gptq import GPTQConfig

        return GPTQConfig(**common, act_order=w.act_order, static_groups=w.static_groups, percdamp=w.damp,
                          blocksize=w.block_size, true_sequential=w.true_sequential, clip=w.clip,
                          lqq=w.grid == "lqq")
    from quantkit.quant.awq import AWQConfig

    return AWQConfig(**common, clip=w.clip, search_tokens=w.search_tokens)


def calibration_inputs(tokenizer, recipe: Recipe, max_positions: int | None, dataset: str | None = None,
                       samples: int | None = None, seqlen: int | None = None,
                       text_column: str | None = None) -> tuple[torch.Tensor, dict]:
    """Calibration windows per the recipe (options override it); seqlen is capped at the model's max positions;
    ``text_column`` names the text column of a record file or datasets folder (default ``text``)."""
    from quantkit.data import calibration_windows, check_sample_count

    check_sample_count(samples)
    info = calibration_options(recipe, max_positions, dataset, samples, seqlen, text_column)
    ids = calibration_windows(tokenizer, info["dataset"], info["samples"], info["seqlen"], info["seed"],
                              text_column=text_column)
    return ids, info


def calibration_options(recipe: Recipe, max_positions: int | None, dataset: str | None = None,
                        samples: int | None = None, seqlen: int | None = None,
                        text_column: str | None = None) -> dict:
    """The calibration windows as they take effect: each option, else the recipe's; seqlen capped at the model's
    max positions (the calibration record of a checkpoint's manifest)."""
    c = recipe.calibration
    seqlen = seqlen if seqlen is not None else c.seqlen
    info = {"dataset": dataset or c.dataset, "samples": samples if samples is not None else c.samples,
            "seqlen": min(seqlen, max_positions) if max_positions else seqlen, "seed": c.seed}
    if text_column is not None:
        info["text_column"] = text_column
    return info


def quantize_lm_head(model: nn.Module, recipe: Recipe, hidden: torch.Tensor | None = None,
                     device: str | None = None) -> tuple[str, WeightRecord]:
    """Quantize the output projection in place (fake-quant) to 4-bit asymmetric codes in groups of 128 — recipe
    ``lm_head: true``, GPTQModel's ``lm_head=True`` — after untying it from the input embeddings, which stay as they
    are; returns (its name, its record). A GPTQ recipe given the last decoder layer's outputs ``hidden`` [n, T, H]
    (of the already quantized layers) solves it by GPTQ (Algorithm 1) on the final norm's outputs, with the recipe's
    act-order, dampening and block size; otherwise round-to-nearest. Its activations stay unquantized."""
    from quantkit.quant.rtn import rtn_quantize

    head = output_linear(model)
    if head is None:
        raise QuantkitError("recipe field 'lm_head: true' needs a model whose output projection is a linear layer; "
                            "drop lm_head for this model")
    name, lin = head
    untie_output_embeddings(model)
    if hidden is not None and recipe.weight.method == "gptq":
        record = _gptq_head(model, lin, hidden, recipe, device or str(hidden.device))
    else:
        record = rtn_quantize(lin.weight.data.float(), LM_HEAD_BITS, LM_HEAD_GROUP, LM_HEAD_SYM)
    write_weight(lin, dequantize_record(record))
    return name, record


def _gptq_head(model: nn.Module, head: nn.Linear, hidden: torch.Tensor, recipe: Recipe, device: str) -> WeightRecord:
    """GPTQ of the output projection on H = 2/n Σ x xᵀ of x = final_norm(hidden), every data-parallel process's
    windows together."""
    from quantkit.quant.gptq import GPTQ
    from quantkit.quant.hessian import HessianAccumulator

    norm = getattr(getattr(model, "model", None), "norm", None)
    if not isinstance(norm, nn.Module):
        raise QuantkitError("recipe field 'lm_head: true' with GPTQ needs the final norm at model.model.norm; drop "
                            "lm_head for this model")
    homes = [(m, next(m.parameters()).device) for m in (norm, head)]
    acc = HessianAccumulator(head.in_features, device)
    w = recipe.weight
    try:
        for m, _ in homes:
            m.to(device)
        with torch.no_grad():
            for window in hidden.split(1):
                acc.add(norm(window.to(device)))
        acc.reduce_across_processes()
        record = GPTQ(head, "lm_head", acc).quantize(LM_HEAD_BITS, LM_HEAD_GROUP, LM_HEAD_SYM, w.block_size,
                                                     w.damp, w.act_order, w.static_groups)
    finally:
        for m, home in homes:
            m.to(home)
    return record_to(record, "cpu")


def quantize_model(model: nn.Module, tokenizer, recipe: Recipe, plan=None, device: str | None = None,
                   progress_factory: ProgressFactory | None = None, dataset: str | None = None,
                   samples: int | None = None, seqlen: int | None = None,
                   calib_ids: torch.Tensor | None = None, text_column: str | None = None) -> QuantizeResult:
    """Quantize every decoder-layer linear of ``model`` per ``recipe`` (and ``plan``), in place (fake-quant).

    Returns the integer records (what ``quantkit pack`` writes) and attaches A8 input hooks when the recipe
    quantizes activations; its residual rotation and SmoothQuant folds change the model's other weights too, and
    its online rotation gives o_proj / down_proj a rotating input hook (``online_rotation`` in the result). With
    ``lm_head: true`` the output projection is quantized too (:func:`quantize_lm_head`, weight-only; by GPTQ on the
    calibration windows in GPTQ recipes) and counts in the average bits.
    ``device`` is where layer-by-layer calibration runs (default: the model's device). ``calib_ids`` [n, T]
    replaces the recipe's calibration windows (benchmarks, tests); ``text_column`` names the text column of a
    record-file ``dataset``.
    """
    device = device or str(next(model.parameters()).device)
    if recipe.activation.rotate:
        from quantkit.quant.rotate import rotate_model

        rotate_model(model, recipe.calibration.seed)
    online = None
    if recipe.activation.online_rotate:
        from quantkit.quant.rotate import rotate_inputs_online

        skipped = {n for n, _ in iter_linears(model) if recipe.spec_for(n).skip}
        online = {"seed": recipe.calibration.seed,
                  "linears": rotate_inputs_online(model, recipe.calibration.seed, skipped)}
    targets = {n: lin for n, lin in iter_linears(model) if not recipe.spec_for(n).skip}
    if not targets:
        raise QuantkitError("the recipe skips every linear layer; nothing to quantize")
    if plan is not None:
        missing = [n for n in targets if n not in plan.layers]
        if missing:
            raise QuantkitError(f"the plan has no entry for '{missing[0]}' ({len(missing)} linears missing); "
                                "re-run `quantkit search` for this model")
    method = recipe.weight.method
    needs_data = recipe.uses_calibration
    records: dict[str, WeightRecord] = {}
    calib = hidden = None
    if not needs_data:
        ctx = progress_factory("quantize", len(targets)) if progress_factory else None
        update = ctx.__enter__() if ctx else None
        try:
            for i, (name, lin) in enumerate(targets.items()):
                rb = _row_bits_for(plan, name, lin, recipe.spec_for(name).bits)
                rec = quantize_partitioned(lin.weight.data.float(), rb, _rows_quantizer(recipe, name))
                write_weight(lin, dequantize_record(rec))
                records[name] = rec
                if update:
                    update(i + 1, len(targets))
        finally:
            if ctx:
                ctx.__exit__(None, None, None)
    else:
        from quantkit.model.loader import max_positions

        if calib_ids is not None:
            ids, calib = calib_ids, {"dataset": "given", "samples": calib_ids.shape[0], "seqlen": calib_ids.shape[1]}
        else:
            ids, calib = calibration_inputs(tokenizer, recipe, max_positions(model), dataset, samples, seqlen,
                                            text_column)
        from quantkit import distributed

        records, coverage, hidden = _quantize_layerwise(model, recipe, plan, targets, distributed.shard(ids), device,
                                                        method, progress_factory)
        if coverage:
            calib.update(expert_calibration(coverage, method))
        if not recipe.lm_head:
            hidden = None  # the last layer's outputs serve the head's GPTQ only
    handles = []
    if recipe.activation.enabled:
        from quantkit.quant.act import attach_act_quant

        handles = attach_act_quant(targets, recipe.activation.bits, recipe.activation.group_size,
                                   recipe.activation.sym, recipe.activation.fp8)
    weight_only = []
    if recipe.lm_head:
        name, records[name] = quantize_lm_head(model, recipe, hidden, device)
        weight_only.append(name)
    total = sum(record_bits(r)[0] for r in records.values())
    elems = sum(record_bits(r)[1] for r in records.values())
    return QuantizeResult(records, recipe, total / elems, calib, handles, online, weight_only)


class LayerQuantizer:
    """The per-layer step of calibrated quantization (GPTQ Sec. 4 "Step 3", AWQ Sec. 3), as
    :func:`quantkit.model.layerwise.run_layerwise` calls it: for one decoder layer and its calibration inputs, count
    MoE expert tokens, fold SmoothQuant into the layer, quantize its linears in ``targets`` (their weights become
    the fake-quant ones) and return the outputs when the quantizer computed them. Records (on the CPU) and expert
    coverage accumulate in :attr:`records` and :attr:`coverage`."""

    def __init__(self, recipe: Recipe, plan, targets: dict[str, nn.Linear], method: str):
        self.recipe, self.plan, self.targets, self.method = recipe, plan, targets, method
        self.config = _layer_config(recipe, method) if method in ("gptq", "awq") else None
        self.records: dict[str, WeightRecord] = {}
        self.coverage: dict[str, tuple[torch.Tensor, list[float]]] = {}

    def __call__(self, i: int, prefix: str, layer: nn.Module, batches):
        _count_expert_tokens(layer, prefix, batches, self.coverage)
        if self.recipe.activation.smooth is not None:
            from quantkit.quant.smooth import smooth_layer

            smooth_layer(layer, batches, self.recipe.activation.smooth,
                         *_smoothing_quantizers(self.recipe, self.targets))
        names = {n: lin for n, lin in self.targets.items() if n.startswith(prefix + ".")}
        layer_records: dict[str, WeightRecord] = {}
        outputs = self._quantize_one_layer(layer, batches, names, layer_records)
        self.records.update({n: record_to(r, "cpu") for n, r in layer_records.items()})
        return outputs

    def _quantize_one_layer(self, layer, batches, names, records):
        """Quantize one layer's linears into ``records``; returns the layer's outputs when the quantizer
        computed them (GPTQ replays its sub-blocks), else None."""
        recipe, plan, method = self.recipe, self.plan, self.method
        row_bits = {n: plan.row_bits(n) for n in names} if plan is not None else None
        if method == "gptq":
            from quantkit.quant.gptq import gptq_quantize_layer

            outputs: list = []
            records.update(gptq_quantize_layer(layer, batches, names, self.config, row_bits=row_bits,
                                               outputs=outputs))
            return outputs
        elif method == "awq":
            from quantkit.quant.awq import awq_quantize_layer

            records.update(awq_quantize_layer(layer, batches, names, self.config, row_bits=row_bits))
        else:  # rtn / lqq with clipping: the clip search needs each linear's inputs
            from quantkit.model.layerwise import layer_output
            from quantkit.quant.clip import sample_tokens
            from quantkit.quant.layerquant import linear_input, pre_hooks

            # the clip search reads at most 512 tokens: keep only a per-batch sample, never every activation
            per_batch = -(-512 // max(1, len(batches)))
            seen: dict[str, list[torch.Tensor]] = {n: [] for n in names}

            def keep(n, a, k):
                x = linear_input(a, k)
                seen[n].append(sample_tokens(x, x.shape[-1], per_batch))

            with torch.no_grad(), pre_hooks(names, keep):
                for b in batches:
                    layer_output(layer, b)
            for n, lin in names.items():
                rb = _row_bits_for(plan, n, lin, recipe.spec_for(n).bits)
                rec = quantize_partitioned(lin.weight.data.float(), rb, _rows_quantizer(recipe, n, seen[n]))
                write_weight(lin, dequantize_record(rec))
                records[n] = rec
        return None


def calibration_batch_size(seqlen: int) -> int:
    """Calibration windows per forward chunk: about :data:`CALIB_BATCH_TOKENS` tokens."""
    return max(1, CALIB_BATCH_TOKENS // seqlen)


def expert_calibration(coverage: dict, method: str) -> dict:
    """The calibration record's ``experts`` rows and ``experts_rule`` from a :class:`LayerQuantizer`'s coverage."""
    from quantkit.model.moe import MIN_TOKENS_RULE, coverage_rows

    counts = {name: c for name, (c, _) in coverage.items()}
    gptq = method == "gptq"
    # GPTQ rounds the experts below min_tokens to nearest; the clip searches only lose their output error where an
    # expert got no token at all
    needs = {name: (need if gptq else [1] * len(need)) for name, (_, need) in coverage.items()}
    return {"experts": coverage_rows(counts, needs),
            "experts_rule": (MIN_TOKENS_RULE + " (by the FP router's counts)" if gptq else
                             "experts no calibration token reached search their clipping on the weight error "
                             "instead of the output error")}


def _quantize_layerwise(model, recipe, plan, targets, ids, device, method, progress_factory):
    step = LayerQuantizer(recipe, plan, targets, method)
    ctx = progress_factory(f"{method} layers", None) if progress_factory else None
    update = ctx.__enter__() if ctx else None
    try:
        hidden = run_layerwise(model, ids, device, on_layer=step, progress=update,
                               batch_size=calibration_batch_size(ids.shape[1]))
    finally:
        if ctx:
            ctx.__exit__(None, None, None)
    return step.records, step.coverage, hidden


def _count_expert_tokens(layer: nn.Module, prefix: str, batches,
                         coverage: dict[str, tuple[torch.Tensor, list[float]]]) -> None:
    """Tokens the layer's FP router sends to each expert over the calibration batches (MoE layers only), and the
    tokens each expert needs (:func:`quantkit.model.moe.min_tokens`), into ``coverage`` by expert-list path."""
    from quantkit.model.layerwise import layer_output
    from quantkit.model.moe import count_tokens, expert_lists, min_tokens

    lists = dict(expert_lists(layer))
    if not lists:
        return
    with torch.no_grad(), count_tokens(layer) as counts:
        for b in batches:
            layer_output(layer, b)
    from quantkit import distributed

    for c in counts.values():  # data-parallel calibration: every process's tokens
        distributed.all_reduce_sum(c)
    coverage.update({f"{prefix}.{name}": (c, [min_tokens(e) for e in lists[name]]) for name, c in counts.items()})
