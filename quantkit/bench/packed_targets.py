"""What ``quantkit bench PACKED`` times for a packed checkpoint: the distinct (N, K) shapes of its quantized linears
and the benchmark methods (:data:`quantkit.bench.problems.METHODS`) whose kernels its layouts use.

Only the manifest is read (docs/checkpoint-format.md), never the weights, so this is instant for any model size.
"""

from __future__ import annotations

import re

from quantkit.errors import QuantkitError

# single-partition linears: (layout, activations quantized to 8 bits?) → the method timing that kernel
# A8 checkpoints map to the "+aq" problems: their packed model quantizes each layer's activation before the
# GEMM, so that is the time a user of the checkpoint pays (the plain names time the GEMM alone)
_SINGLE = {("w4a16", False): "w4a16", ("w4a16", True): "w4a8+aq", ("w4a8-lqq", True): "w4a8-lqq+aq",
           ("w8", True): "w8a8+aq"}
_MIXED_LAYOUTS = {"w4a16", "w8"}  # the partitions the ``mixed`` problem packs (MixLLM W4.4A8)


def _natural_key(name: str) -> list:
    """Sort key comparing digit runs as numbers, so model.layers.2 precedes model.layers.10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def linear_names(manifest: dict) -> list[str]:
    """The quantized linears of a manifest in model order (the manifest stores them with sorted keys)."""
    return sorted(manifest["linears"], key=_natural_key)


def checkpoint_shapes(manifest: dict) -> list[tuple[int, int]]:
    """Distinct (N, K) = (out_features, in_features) of the quantized linears, in model order of first use."""
    seen: dict[tuple[int, int], None] = {}
    for name in linear_names(manifest):
        entry = manifest["linears"][name]
        seen.setdefault((int(entry["out_features"]), int(entry["in_features"])), None)
    return list(seen)


def linear_method(entry: dict, act: dict | None) -> str | None:
    """The benchmark method of one manifest linear entry under the checkpoint's activation spec, or None when no
    benchmarked kernel reads its layout (the ``reference``/GPTQ/AWQ layouts, A16 8-bit, A16 mixed precision).

    A mixed-precision linear (several partitions, MixLLM Sec. 3.4) with A8 activations maps to ``mixed+aq``;
    one ``w4a16`` partition to ``w4a16`` (A16) or ``w4a8+aq`` (A8, MixLLM W4A8); ``w4a8-lqq`` with A8 to
    ``w4a8-lqq+aq`` (LiquidGEMM); ``w8`` with A8 to ``w8a8+aq`` — A8 methods include the activation quantizer,
    as the packed model runs them."""
    a8 = bool(act) and act.get("bits") == 8
    parts = entry["partitions"]
    if len(parts) > 1 or parts[0].get("rows"):
        return "mixed+aq" if a8 and {p["layout"] for p in parts} <= _MIXED_LAYOUTS else None
    return _SINGLE.get((parts[0]["layout"], a8))


def checkpoint_methods(manifest: dict, where: str = "the checkpoint") -> list[str]:
    """``fp16`` (the baseline) then every method some quantized linear of the checkpoint runs, in
    :data:`~quantkit.bench.problems.METHODS` order; a QuantkitError when none of its layouts has a kernel."""
    from quantkit.bench.problems import METHODS

    act = manifest.get("activation")
    found = {linear_method(manifest["linears"][n], act) for n in linear_names(manifest)}
    methods = [m for m in METHODS if m in found and m != "fp16"]
    if not methods:
        layouts = sorted({p["layout"] for e in manifest["linears"].values() for p in e["partitions"]})
        acts = f"A{act['bits']}" if act else "A16"
        raise QuantkitError(f"{where} stores its linears in layout(s) {', '.join(layouts)} with {acts} activations, "
                            "which no benchmarked kernel reads; repack with --target sm80|sm90 or pass --methods")
    return ["fp16", *methods]
