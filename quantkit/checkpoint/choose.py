"""Which on-disk layout each quantized weight gets, and which recipe/format/target combinations a checkpoint can
hold at all.

``--format quantkit`` stores every partition in quantkit's own layouts: ``--target reference`` → ``reference``
(plain bit-packing, torch reference kernels); ``--target sm80|sm90`` → the GPU kernel layout of the partition's
kind (4-bit asymmetric → ``w4a16``, LiquidQuant → ``w4a8-lqq``, 8-bit symmetric → ``w8``, FP8 E4M3 with FP8
activations → ``fp8`` on sm90),
falling back to ``reference`` with a warning when no kernel layout exists or it cannot hold the weight. ``--format gptq|gptq_v2|awq``
writes the engines' formats for every linear, which exist only for uniform weight-only models: refusals are
decided from the recipe and plan alone, before any model is loaded.
"""

from __future__ import annotations

from collections.abc import Callable

from quantkit.errors import QuantkitError
from quantkit.quant.partition import WeightRecord
from quantkit.quant.recipe import LM_HEAD_BITS, LM_HEAD_GROUP, LM_HEAD_SYM, Recipe
from quantkit.quant.records import QuantizedWeight

TARGETS = ("reference", "sm80", "sm90")
EXPORTS = ("quantkit", "gptq", "gptq_v2", "awq")
GPTQ_BITS = (2, 3, 4, 8)
ALLOWED = {
    "gptq": "--format gptq holds uniform weight-only (A16) 2/3/4/8-bit rtn/gptq/awq recipes without a "
            "mixed-precision plan, LQQ or per-layer overrides",
    "gptq_v2": "--format gptq_v2 holds uniform weight-only (A16) 2/3/4/8-bit rtn/gptq/awq recipes without a "
               "mixed-precision plan, LQQ or per-layer overrides",
    "awq": "--format awq holds uniform weight-only (A16) 4-bit rtn/gptq/awq recipes without act-order's g_idx "
           "(static groups need none), a mixed-precision plan, LQQ or per-layer overrides",
}


def check_target_export(target: str | None, export: str) -> str:
    """Validate --target/--format; returns the effective target ('reference' when none was given)."""
    if export not in EXPORTS:
        raise QuantkitError(f"unknown --format '{export}'; use one of {', '.join(EXPORTS)}")
    if target is not None and target not in TARGETS:
        raise QuantkitError(f"unknown --target '{target}'; use one of {', '.join(TARGETS)}")
    if export != "quantkit" and target not in (None, "reference"):
        raise QuantkitError(f"--target {target} cannot be combined with --format {export} (GPTQ/AWQ checkpoints "
                            f"have their engines' own layout); allowed: --format quantkit with --target "
                            f"{'|'.join(TARGETS)}, or --format gptq|gptq_v2|awq without --target")
    return target or "reference"


def _refuse(export: str, recipe: Recipe, why: str) -> QuantkitError:
    return QuantkitError(f"--format {export} cannot hold recipe '{recipe.name}' ({why}); {ALLOWED[export]} — "
                         "use --format quantkit for this one")


def check_recipe_export(recipe: Recipe, export: str, plan_is_mixed: bool) -> None:
    """Refuse, from the recipe and plan alone, what a GPTQ/AWQ checkpoint cannot represent: activation
    quantization (W4A8/W8A8), an online input rotation, LiquidQuant two-level weights, a mixed-precision plan,
    per-layer overrides (config.json holds one bits/group_size/sym), a quantized lm_head on another grid than the
    layers', bit-widths the format lacks, AWQ with GPTQ act-order whose groups follow the sweep order (a g_idx; static groups keep consecutive
    groups and need none)."""
    if export == "quantkit":
        return
    w = recipe.weight
    if recipe.activation.enabled:
        raise _refuse(export, recipe, f"it quantizes activations to {recipe.activation.bits} bits")
    if recipe.activation.online_rotate:
        raise _refuse(export, recipe, "o_proj / down_proj read inputs rotated at run time (activation.online_rotate), "
                                      "which other engines do not apply")
    if w.method == "lqq" or w.grid == "lqq":
        raise _refuse(export, recipe, "LiquidQuant two-level weights")
    if w.grid == "fp8":
        raise _refuse(export, recipe, "FP8 E4M3 weights (the formats store integer codes)")
    if plan_is_mixed:
        raise _refuse(export, recipe, "the plan mixes bit-widths across output channels")
    if recipe.overrides:
        raise _refuse(export, recipe, f"it has {len(recipe.overrides)} per-layer override(s)")
    if recipe.lm_head and (w.bits, w.group_size, w.sym) != (LM_HEAD_BITS, LM_HEAD_GROUP, LM_HEAD_SYM):
        grid = f"{w.bits}-bit g{w.group_size} {'symmetric' if w.sym else 'asymmetric'}"
        raise _refuse(export, recipe, f"its quantized lm_head is {LM_HEAD_BITS}-bit g{LM_HEAD_GROUP} asymmetric, the "
                                      f"other layers {grid}, and config.json holds one grid")
    if export in ("gptq", "gptq_v2") and w.bits not in GPTQ_BITS:
        raise _refuse(export, recipe, f"{w.bits}-bit weights")
    if export == "awq":
        if w.bits != 4:
            raise _refuse(export, recipe, f"{w.bits}-bit weights")
        if w.method == "gptq" and w.act_order and not w.static_groups:
            raise _refuse(export, recipe, "GPTQ act-order without static groups (AWQ checkpoints have no g_idx)")


def kernel_layout(qw: QuantizedWeight, target: str = "sm90", fp8_activations: bool = False) -> str | None:
    """The GPU kernel layout for a weight of this kind on ``target``, or None when no kernel covers it. FP8 weights
    take ``fp8`` for sm90 with FP8 activations only: elsewhere its torch fallback would dequantize the weight on every
    call, while the 'reference' layout's dense weight is cached."""
    if qw.fp8:
        return "fp8" if target == "sm90" and fp8_activations else None
    if qw.channel_scales is not None:
        return "w4a8-lqq"
    if qw.bits == 4 and not qw.sym:
        return "w4a16"
    if qw.bits == 8 and qw.sym:
        return "w8"
    return None


def fp8_token_activations(recipe: Recipe) -> bool:
    """Whether ``recipe`` quantizes activations to FP8 with one scale per token: what the ``fp8`` layout's GEMM
    runs (other activation schemes would dequantize its weight on every call)."""
    return bool(recipe.activation.fp8 and recipe.activation.group_size == -1)


def record_parts(record: WeightRecord) -> list[QuantizedWeight]:
    """The quantized sub-matrices of a record in storage order (one for a plain weight)."""
    if isinstance(record, QuantizedWeight):
        return [record]
    return [p.weight for p in record.partitions]


def _get(name: str):
    from quantkit.formats.registry import get_layout

    return get_layout(name)


def _kind(qw: QuantizedWeight) -> str:
    if qw.fp8:
        return "FP8 E4M3"
    if qw.channel_scales is not None:
        return "LiquidQuant 4-bit"
    return f"{qw.bits}-bit {'sym' if qw.sym else 'asym'}"


def _quantkit_layouts(records: dict[str, WeightRecord], target: str, warn: Callable[[str], None],
                      fp8_activations: bool) -> dict[str, list[str]]:
    fallbacks: dict[str, list[str]] = {}  # warning text → linears it concerns
    out: dict[str, list[str]] = {}
    for name, rec in records.items():
        chosen = []
        for qw in record_parts(rec):
            layout = "reference"
            if target != "reference":
                want = kernel_layout(qw, target, fp8_activations)
                if want is None:
                    why = f"no {target} kernel layout for {_kind(qw)} weights"
                    if qw.fp8:
                        why += " (the FP8 GEMM needs --target sm90 and FP8 activations)"
                else:
                    try:
                        why = _get(want).supports(qw)
                        why = None if why is None else f"layout '{want}' cannot hold them: {why}"
                    except QuantkitError:
                        why = f"kernel layout '{want}' is not available in this install"
                if why is None:
                    layout = want
                else:
                    fallbacks.setdefault(why, []).append(name)
            problem = _get(layout).supports(qw)
            if problem is not None:
                raise QuantkitError(f"linear '{name}' cannot be stored in layout '{layout}': {problem}")
            chosen.append(layout)
        out[name] = chosen
    for why, names in fallbacks.items():
        warn(f"{len(names)} linear(s) stored in the 'reference' layout (torch reference kernel), e.g. "
             f"'{names[0]}': {why}")
    return out


def _engine_layouts(records: dict[str, WeightRecord], export: str,
                    warn: Callable[[str], None]) -> dict[str, list[str]]:
    parts = {}
    for name, rec in records.items():
        if not isinstance(rec, QuantizedWeight):
            raise QuantkitError(f"--format {export} cannot hold linear '{name}': it mixes bit-widths across output "
                                f"channels; {ALLOWED[export]}")
        parts[name] = rec
    layout = export
    refusals = {n: _get(export).supports(qw) for n, qw in parts.items()}
    refusals = {n: why for n, why in refusals.items() if why is not None}
    if refusals and export == "gptq" and all(_get("gptq_v2").supports(parts[n]) is None for n in refusals):
        # GPTQ v1 stores zero - 1, so an asymmetric zero point of 0 has no portable encoding (formats/gptq.py)
        layout = "gptq_v2"
        first = next(iter(refusals))
        warn(f"writing checkpoint_format gptq_v2 (zero points stored as they are): {len(refusals)} linear(s), "
             f"e.g. '{first}', have a zero point GPTQ v1 cannot encode; GPTQModel reads v2, some engines only v1")
        refusals = {}
    elif export == "gptq" and any(not qw.sym for qw in parts.values()):
        warn("asymmetric weights in checkpoint_format gptq (v1): transformers (with GPTQModel) and vLLM load it, but "
             "GPTQModel.load() refuses asymmetric v1 files that GPTQModel >= 0.9 did not write; for GPTQModel.load() "
             "export with --format gptq_v2")
    if refusals:
        name, why = next(iter(refusals.items()))
        raise QuantkitError(f"--format {export} cannot hold linear '{name}': {why}")
    ragged = [n for n, qw in parts.items() if qw.group_size > 0 and qw.shape[1] % qw.group_size]
    if ragged:  # quantkit stores ceil(K / group) groups; AutoAWQ allocates K // group, GPTQModel refuses the layer
        qw = parts[ragged[0]]
        warn(f"{len(ragged)} linear(s), e.g. '{ragged[0]}' (in_features {qw.shape[1]}), have in_features that are "
             f"not a multiple of the group size {qw.group_size}: quantkit loads them, but GPTQModel and AutoAWQ "
             "refuse or misread such layers; use a group size that divides in_features for those engines")
    return {n: [layout] for n in parts}


def choose_layouts(records: dict[str, WeightRecord], target: str, export: str,
                   warn: Callable[[str], None], fp8_activations: bool = False) -> dict[str, list[str]]:
    """Linear name → layout name per partition (order of :func:`record_parts`), every choice checked with the
    layout's ``supports``; unavailable kernel layouts fall back to 'reference' through ``warn``.
    ``fp8_activations``: the recipe quantizes activations to FP8 per token (what the ``fp8`` layout's kernel
    runs)."""
    if export == "quantkit":
        return _quantkit_layouts(records, target, warn, fp8_activations)
    return _engine_layouts(records, export, warn)
