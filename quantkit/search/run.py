"""``quantkit search`` end to end: calibration windows → scores (MixLLM Eq. 4 or a baseline) → allocation
(Algorithm 1) → :class:`~quantkit.search.plan.Plan`. The CLI only parses options and renders."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from quantkit.data.tokens import check_sample_count
from quantkit.errors import QuantkitError
from quantkit.model.loader import LoadedModel
from quantkit.model.walk import iter_linears
from quantkit.search.allocate import BitBudget, allocate, average_bits
from quantkit.search.plan import Plan, build_plan
from quantkit.search.salience import Progress, Quantizer, compute_salience, linear_weight
from quantkit.search.strategies import magnitude_scores, random_scores, uses_salience


@dataclass
class SearchOptions:
    """Everything ``quantkit search`` decides besides the model and recipe; None = take it from the recipe."""

    budget: BitBudget
    strategy: str = "global"
    dataset: str | None = None
    samples: int | None = None
    seqlen: int | None = None
    seed: int | None = None
    first_order: bool = True
    batch_size: int = 1
    checkpoint_layers: bool | None = None  # None: recompute layers in backward only when memory needs it
    text_column: str | None = None  # the text column of a record-file dataset (None: "text")
    stream_device: str | None = None  # weights in CPU memory, one decoder layer at a time on this device
    stream_windows: int | None = None  # windows per move of the weights when streaming (None: by free CPU memory)


def salience_quantizer(recipe, bits: int) -> Quantizer:
    """c_q of Eq. 4: RTN at ``bits`` with the recipe's spec for that width (MixLLM Sec. 4.1: 4-bit asym g128),
    with the recipe's clipping search on weight MSE (no activations exist in this pass); on a LiquidQuant grid
    the recipe's two-level grid: the paper's rule for plain ``lqq``, else the searched fit
    (:func:`quantkit.quant.lqq.lqq_search`, weight MSE)."""
    from quantkit.quant.grid import dequantize
    from quantkit.quant.lqq import lqq_quantize, lqq_search
    from quantkit.quant.rtn import rtn_quantize

    def quantize(name: str, w: torch.Tensor) -> torch.Tensor:
        spec = recipe.spec_for(name, bits)
        if spec.grid == "lqq":
            plain = spec.method == "lqq" and not spec.clip
            qw = lqq_quantize(w, spec.group_size) if plain else lqq_search(w, spec.group_size)
            return dequantize(qw, torch.float32)
        return dequantize(rtn_quantize(w, spec.bits, spec.group_size, spec.sym, clip=spec.clip), torch.float32)

    return quantize


def spec_triplet(recipe) -> Callable[[str, int], tuple[int, int, bool]]:
    """(name, bits) → (bits, group_size, sym) of the recipe, for the metadata overhead figure."""
    def spec(name: str, bits: int) -> tuple[int, int, bool]:
        s = recipe.spec_for(name, bits)
        return s.bits, s.group_size, s.sym

    return spec


def calibration_settings(recipe, opts: SearchOptions, max_positions: int | None) -> dict:
    """Source, samples, seqlen, seed: the options, else the recipe's; seqlen capped at the model's context
    length when it came from the recipe, an error when the user asked for more."""
    cal = recipe.calibration
    seqlen = opts.seqlen if opts.seqlen is not None else cal.seqlen
    if max_positions is not None and seqlen > max_positions:
        if opts.seqlen is not None:
            raise QuantkitError(f"--seqlen {seqlen} exceeds the model's context length {max_positions}; "
                                f"use --seqlen {max_positions} or less")
        seqlen = max_positions
    check_sample_count(opts.samples, "--samples")
    samples = opts.samples if opts.samples is not None else cal.samples
    return {"source": opts.dataset or cal.dataset, "samples": samples, "seqlen": seqlen,
            "seed": opts.seed if opts.seed is not None else cal.seed}


def search(loaded: LoadedModel, recipe, opts: SearchOptions, progress: Progress | None = None,
           layer_progress: Progress | None = None) -> tuple[Plan, dict[str, torch.Tensor]]:
    """Run the search on a loaded model; returns the plan and the per-channel scores it was ranked by."""
    model = loaded.model
    budget = opts.budget
    linears = [(n, lin) for n, lin in iter_linears(model) if not recipe.spec_for(n).skip]
    skipped = [n for n, lin in iter_linears(model) if recipe.spec_for(n).skip]
    if not linears:
        raise QuantkitError("the recipe skips every linear layer; nothing to search")
    shapes = {n: tuple(linear_weight(lin).shape) for n, lin in linears}
    calibration = None
    # the recipe's weight quantizer per planned width, checked when pack / eval-ppl apply the plan with a recipe
    first = linears[0][0]
    specs = {b: recipe.spec_for(first, b) for b in budget.bits}
    search_info = {"strategy": opts.strategy, "skipped": skipped, "recipe": {
        "name": recipe.name, "weights": {str(b): {"group_size": s.group_size, "sym": s.sym} for b, s in specs.items()}}}
    if uses_salience(opts.strategy):
        from quantkit.data import calibration_windows
        from quantkit.model.loader import max_positions

        calibration = calibration_settings(recipe, opts, max_positions(model))
        if loaded.tokenizer is None:
            raise QuantkitError("the model has no tokenizer; the salience search needs one to read calibration text")
        ids = calibration_windows(loaded.tokenizer, calibration["source"], calibration["samples"],
                                  calibration["seqlen"], calibration["seed"], text_column=opts.text_column)
        if opts.text_column is not None:
            calibration["text_column"] = opts.text_column
        calibration["tokens"] = int(ids.numel())
        low = budget.bits[0]
        # recorded as the first linear's spec; per-layer recipe overrides still apply inside the quantizer
        spec = specs[low]
        result = compute_salience(model, ids, salience_quantizer(recipe, low), first_order=opts.first_order,
                                  batch_size=opts.batch_size, checkpoint_layers=opts.checkpoint_layers,
                                  progress=progress,
                                  on_linear=layer_progress, skip=set(skipped), stream_device=opts.stream_device,
                                  stream_windows=opts.stream_windows)
        scores = result.scores
        search_info.update({"first_order": opts.first_order, "salience_quantizer": {
            "bits": low, "group_size": spec.group_size, "sym": spec.sym, "clip": spec.clip, "method": "rtn"}})
    elif opts.strategy == "random":
        seed = opts.seed if opts.seed is not None else recipe.calibration.seed
        scores = random_scores({n: s[0] for n, s in shapes.items()}, seed)
        search_info["seed"] = seed
    else:
        scores = {n: s for n, s in magnitude_scores(model).items() if n in shapes}
    in_features = {n: s[1] for n, s in shapes.items()}
    row_bits = allocate(scores, in_features, budget, local=opts.strategy == "local")
    plan = build_plan(model, _model_name(loaded), row_bits, scores, bits=list(budget.bits),
                      target_bits=budget.target, fractions=None if budget.fractions is None else list(budget.fractions),
                      achieved_bits=average_bits(row_bits, in_features),
                      achieved_bits_with_metadata=average_bits(row_bits, in_features, spec_triplet(recipe)),
                      calibration=calibration, search=search_info)
    return plan, scores


def _model_name(loaded: LoadedModel) -> str:
    # what the user typed, minus any local folder prefix: paths differ between machines, names do not
    src = loaded.source.rstrip("/")
    return src if src.startswith("builtin:") or src.count("/") == 1 and not src.startswith((".", "/", "~")) \
        else src.rsplit("/", 1)[-1]
