"""What ``quantkit bench PACKED`` times for a packed checkpoint: the distinct (N, K) shapes of the quantized linears its
loaded model runs — q/k/v and gate/up stacked into one GEMM each as :func:`quantkit.checkpoint.load_packed` fuses
them (:mod:`quantkit.runtime.fused_siblings`; QUANTKIT_FUSE=0: as stored) — and the benchmark methods
(:data:`quantkit.bench.problems.METHODS`) whose kernels its layouts use.

Only the manifest is read (docs/checkpoint-format.md), never the weights, so this is instant for any model size.
"""

from __future__ import annotations

import os
import re

from quantkit.checkpoint.manifest import linear_activation
from quantkit.errors import QuantkitError

# single-partition linears: (layout, activations quantized to 8 bits?) → the method timing that kernel
# A8 checkpoints map to the "+aq" problems: their packed model quantizes each layer's activation before the
# GEMM, so that is the time a user of the checkpoint pays (the plain names time the GEMM alone)
_SINGLE = {("w4a16", False): "w4a16", ("w4a16", True): "w4a8+aq", ("w4a8-lqq", True): "w4a8-lqq+aq",
           ("w8", True): "w8a8+aq", ("fp8", True): "fp8-w8a8+aq"}
_MIXED_LAYOUTS = {"w4a16", "w8"}  # the partitions the ``mixed`` problem packs (MixLLM W4.4A8)


def _natural_key(name: str) -> list:
    """Sort key comparing digit runs as numbers, so model.layers.2 precedes model.layers.10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def linear_names(manifest: dict) -> list[str]:
    """The quantized linears of a manifest in model order (the manifest stores them with sorted keys)."""
    return sorted(manifest["linears"], key=_natural_key)


def runtime_linears(manifest: dict, fuse: bool | None = None) -> dict[str, dict]:
    """The quantized linears a loaded checkpoint runs, in model order: the manifest's entries, with each group of
    sibling projections that loading fuses (``fuse`` None: unless QUANTKIT_FUSE=0) replaced at its first member's
    place by one entry — named like the fused module, N the members' sum, partitions merged per bit-width."""
    from quantkit.runtime.fused_siblings import ENV_SWITCH, fused_name, sibling_groups, spec_of_entry

    linears = manifest["linears"]
    names = linear_names(manifest)
    if fuse is None:
        fuse = os.environ.get(ENV_SWITCH) != "0"
    specs = {n: spec_of_entry(linears[n], manifest.get("tensors"), linear_activation(linears[n], manifest))
             for n in names}
    groups = sibling_groups(names, specs.__getitem__) if fuse else []
    first = {members[0]: (parent, members) for parent, members in groups}
    fused = {n for _, members in groups for n in members}
    out: dict[str, dict] = {}
    for name in names:
        if name in first:
            parent, members = first[name]
            fname = fused_name([m.rpartition(".")[2] for m in members])
            out[f"{parent}.{fname}" if parent else fname] = _merged_entry([linears[m] for m in members])
        elif name not in fused:
            out[name] = linears[name]
    return out


def _merged_entry(entries: list[dict]) -> dict:
    """One manifest-like entry for stacked linears: per bit-width one partition (rows when several remain)."""
    by_bits: dict[int, dict] = {}
    for e in entries:
        for p in e["partitions"]:
            by_bits.setdefault(int(p["bits"]), {"layout": p["layout"], "bits": int(p["bits"]), "rows": None})
    parts = [by_bits[b] for b in sorted(by_bits)]
    if len(parts) > 1:
        parts = [dict(p, rows=f"part{p['bits']}.rows") for p in parts]
    return {"out_features": sum(int(e["out_features"]) for e in entries),
            "in_features": int(entries[0]["in_features"]), "partitions": parts}


def checkpoint_shapes(manifest: dict, fuse: bool | None = None) -> list[tuple[int, int]]:
    """Distinct (N, K) = (out_features, in_features) of the quantized linears the loaded model runs
    (:func:`runtime_linears`), in model order of first use."""
    seen: dict[tuple[int, int], None] = {}
    for entry in runtime_linears(manifest, fuse).values():
        seen.setdefault((int(entry["out_features"]), int(entry["in_features"])), None)
    return list(seen)


def linear_method(entry: dict, act: dict | None) -> str | None:
    """The benchmark method of one manifest linear entry under the checkpoint's activation spec, or None when no
    benchmarked kernel reads its layout (the ``reference``/GPTQ/AWQ layouts, A16 8-bit, A16 mixed precision).

    A mixed-precision linear (several partitions, MixLLM Sec. 3.4) with A8 activations maps to ``mixed+aq``
    (``mixed-lqq+aq`` with LiquidQuant 4-bit rows);
    one ``w4a16`` partition to ``w4a16`` (A16) or ``w4a8+aq`` (A8, MixLLM W4A8); ``w4a8-lqq`` with A8 to
    ``w4a8-lqq+aq`` (LiquidGEMM); ``w8`` with A8 to ``w8a8+aq`` (``w8a8-ch+aq`` per channel with per-token
    activations); ``fp8`` with FP8 activations to ``fp8-w8a8+aq`` — A8 methods include the activation quantizer,
    as the packed model runs them."""
    a8 = bool(act) and act.get("bits") == 8
    parts = entry["partitions"]
    if len(parts) > 1 or parts[0].get("rows"):
        layouts = {p["layout"] for p in parts}
        if a8 and layouts <= _MIXED_LAYOUTS:
            return "mixed+aq"
        return "mixed-lqq+aq" if a8 and layouts <= {"w4a8-lqq", "w8"} else None
    method = _SINGLE.get((parts[0]["layout"], a8))
    if method == "w8a8+aq" and act.get("group_size") == -1 and (parts[0].get("meta") or {}).get("group_size") == -1:
        return "w8a8-ch+aq"  # per-channel weights, per-token activations (SmoothQuant's W8A8)
    if method == "fp8-w8a8+aq" and not act.get("fp8"):
        return None
    return method


def checkpoint_methods(manifest: dict, where: str = "the checkpoint") -> list[str]:
    """``fp16`` (the baseline) then every method some quantized linear of the checkpoint runs, in
    :data:`~quantkit.bench.problems.METHODS` order; a QuantkitError when none of its layouts has a kernel."""
    from quantkit.bench.problems import METHODS

    act = manifest.get("activation")
    found = {linear_method(entry, linear_activation(entry, manifest)) for entry in runtime_linears(manifest).values()}
    methods = [m for m in METHODS if m in found and m != "fp16"]
    if not methods:
        if any((p.get("meta") or {}).get("fp8") for e in manifest["linears"].values() for p in e["partitions"]):
            raise QuantkitError(f"{where} holds FP8 E4M3 weights in the 'reference' layout or without FP8 "
                                "activations, which no quantkit kernel reads; repack it with `quantkit pack … "
                                "--recipe fp8-w8a8 --target sm90` (per-channel weights)")
        layouts = sorted({p["layout"] for e in manifest["linears"].values() for p in e["partitions"]})
        acts = f"A{act['bits']}" if act else "A16"
        raise QuantkitError(f"{where} stores its linears in layout(s) {', '.join(layouts)} with {acts} activations, "
                            "which no benchmarked kernel reads; repack it with `quantkit pack … --target sm90` (or "
                            "sm80, without --format gptq/awq) or pass --methods")
    return ["fp16", *methods]
