"""Reading a plan back: schema validation and the check that it belongs to the model at hand.

Every problem is a one-line :class:`QuantkitError` naming the file, the offending field or layer, and the fix.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch.nn as nn

from quantkit.errors import QuantkitError
from quantkit.model.walk import iter_linears
from quantkit.search.identity import PROBE_RTOL, identity_config, weight_probe
from quantkit.search.plan import SCHEMA, VERSION, LayerPlan, Plan
from quantkit.search.salience import linear_weight

_REQUIRED = {"schema": str, "version": int, "model": dict, "search": dict, "bits": list, "default_bits": int,
             "achieved_bits": (int, float), "achieved_bits_with_metadata": (int, float), "layers": list}


class _Invalid(Exception):
    pass


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise _Invalid(what)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _layer(d, bits: list[int], default: int, i: int) -> LayerPlan:
    _need(isinstance(d, dict), f"layers[{i}] is not an object")
    name = d.get("name")
    _need(isinstance(name, str) and name, f"layers[{i}].name is missing")
    n, k = d.get("out_features"), d.get("in_features")
    _need(_is_int(n) and n > 0 and _is_int(k) and k > 0, f"layer {name}: out_features/in_features must be "
                                                         "positive integers")
    ch = d.get("channels")
    _need(isinstance(ch, dict), f"layer {name}: channels must map a bit-width to a list of channel indices")
    channels: dict[int, list[int]] = {}
    seen: set[int] = set()
    for key, idx in ch.items():
        _need(key.isdigit() and int(key) in bits and int(key) != default,
              f"layer {name}: channels key '{key}' is not a non-default bit-width of the plan {bits}")
        _need(isinstance(idx, list) and all(_is_int(j) for j in idx), f"layer {name}: channels['{key}'] must be "
                                                                      "a list of integers")
        _need(all(a < b for a, b in zip(idx, idx[1:])), f"layer {name}: channels['{key}'] is not sorted ascending "
                                                        "without repeats")
        _need(not idx or (idx[0] >= 0 and idx[-1] < n), f"layer {name}: channels['{key}'] has an index outside "
                                                        f"0..{n - 1}")
        _need(seen.isdisjoint(idx), f"layer {name}: a channel is listed under two bit-widths")
        seen.update(idx)
        channels[int(key)] = idx
    stats = d.get("stats", {})
    _need(isinstance(stats, dict) and all(_is_num(v) for v in stats.values()), f"layer {name}: stats must map "
                                                                                "names to numbers")
    probe = d.get("probe", [])
    _need(isinstance(probe, list) and all(_is_num(v) for v in probe), f"layer {name}: probe must be a list of "
                                                                      "numbers")
    return LayerPlan(name, n, k, channels, stats, probe)


def parse_plan(d: dict) -> Plan:
    """Validate a decoded plan.json object (schema :data:`quantkit.search.plan.VERSION`) into a :class:`Plan`."""
    _need(isinstance(d, dict), "the top level is not a JSON object")
    _need(d.get("schema") == SCHEMA, f"'schema' is {d.get('schema')!r}, expected '{SCHEMA}' (not a quantkit plan)")
    for key, typ in _REQUIRED.items():
        _need(key in d, f"field '{key}' is missing")
        _need(isinstance(d[key], typ) and not isinstance(d[key], bool), f"field '{key}' has the wrong type")
    if d["version"] > VERSION:
        raise _Invalid(f"schema version {d['version']} is newer than this quantkit reads ({VERSION}); "
                       "upgrade quantkit")
    _need(d["version"] == VERSION, f"schema version {d['version']} is not supported (expected {VERSION})")
    bits = d["bits"]
    _need(bits and all(_is_int(b) and 2 <= b <= 8 for b in bits) and bits == sorted(set(bits)),
          f"'bits' must be distinct ascending bit-widths in 2..8, got {bits}")
    _need(d["default_bits"] in bits, f"'default_bits' {d['default_bits']} is not one of 'bits' {bits}")
    for key in ("target_bits",):
        _need(d.get(key) is None or _is_num(d[key]), f"field '{key}' must be a number or null")
    fr = d.get("fractions")
    _need(fr is None or (isinstance(fr, list) and len(fr) == len(bits) and all(_is_num(f) for f in fr)),
          "field 'fractions' must be null or one number per bit-width")
    _need(d.get("calibration") is None or isinstance(d["calibration"], dict), "field 'calibration' must be an "
                                                                              "object or null")
    layers: dict[str, LayerPlan] = {}
    for i, ld in enumerate(d["layers"]):
        lp = _layer(ld, bits, d["default_bits"], i)
        _need(lp.name not in layers, f"layer {lp.name} appears twice")
        layers[lp.name] = lp
    return Plan(model=d["model"], calibration=d.get("calibration"), search=d["search"], bits=bits,
                default_bits=d["default_bits"], target_bits=d.get("target_bits"), fractions=fr,
                achieved_bits=float(d["achieved_bits"]),
                achieved_bits_with_metadata=float(d["achieved_bits_with_metadata"]), layers=layers,
                version=d["version"])


def check_plan_model(plan: Plan, model: nn.Module, where: str = "the plan") -> None:
    """Raise a QuantkitError naming the first mismatch between ``plan`` and ``model``: a layer missing on either
    side, a shape that differs, a config key that differs, or weights whose probe values differ."""
    fix = "; re-run `quantkit search` for this model"
    linears = dict(iter_linears(model))
    skipped = set(plan.search.get("skipped", []))
    for name in plan.layers:
        if name not in linears:
            raise QuantkitError(f"{where} does not match this model: layer '{name}' is missing from the model{fix}")
    for name in linears:
        if name not in plan.layers and name not in skipped:
            raise QuantkitError(f"{where} does not match this model: the model's layer '{name}' is not in the "
                                f"plan{fix}")
    planned_cfg = plan.model.get("config")
    if isinstance(planned_cfg, dict):
        cfg = identity_config(model)
        for key in sorted(set(cfg) & set(planned_cfg)):
            if cfg[key] != planned_cfg[key]:
                raise QuantkitError(f"{where} does not match this model: config '{key}' is {planned_cfg[key]!r} in "
                                    f"the plan, {cfg[key]!r} in the model{fix}")
    for name, lp in plan.layers.items():
        w = linear_weight(linears[name])
        if tuple(w.shape) != (lp.out_features, lp.in_features):
            raise QuantkitError(f"{where} does not match this model: layer '{name}' is {lp.out_features}x"
                                f"{lp.in_features} in the plan, {w.shape[0]}x{w.shape[1]} in the model{fix}")
        if lp.probe:
            got = weight_probe(w, len(lp.probe))
            scale = max(abs(v) for v in lp.probe) or 1.0
            if any(abs(a - b) > PROBE_RTOL * (abs(a) + scale) for a, b in zip(lp.probe, got)):
                raise QuantkitError(f"{where} does not match this model: the weights of layer '{name}' differ from "
                                    f"the ones the plan was searched on (weight hash differs){fix}")


def read_plan(path: str | os.PathLike) -> Plan:
    """Read and validate a plan file (no model check; see :func:`quantkit.search.plan.load_plan`)."""
    p = Path(path)
    if not p.is_file():
        raise QuantkitError(f"plan file '{p}' does not exist; create one with `quantkit search`")
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise QuantkitError(f"plan file '{p}' is not valid JSON ({e}); re-run `quantkit search`") from None
    try:
        return parse_plan(d)
    except _Invalid as e:
        raise QuantkitError(f"plan file '{p}' is invalid: {e}") from None


def _grid(group_size: int, sym: bool) -> str:
    return f"{'sym' if sym else 'asym'} g{group_size}"


def check_plan_recipe(plan: Plan, recipe, where: str) -> None:
    """Refuse a recipe that quantizes the plan's bit-widths otherwise than the recipe the plan was searched with:
    its channels were ranked (MixLLM Eq. 4's c_q) and its bits counted with that quantizer, so another group size
    or symmetry — or an 8-bit recipe that would put most weights at the plan's 4 bits — is not the plan's model.
    Compares ``search.recipe.weights`` (plans that record it) and ``search.salience_quantizer`` (plans of the
    salience strategies) with the recipe's spec of the plan's first layer at each width. An FP8 recipe takes no
    plan: it has one precision."""
    if recipe.weight.grid == "fp8":
        raise QuantkitError(f"recipe '{recipe.name}' quantizes every channel to FP8 E4M3, so there are no bit-widths "
                            f"for {where} to assign; drop --plan")
    recorded = {}
    sq = plan.search.get("salience_quantizer")
    if isinstance(sq, dict) and _is_int(sq.get("bits")):
        recorded[sq["bits"]] = (sq.get("group_size"), sq.get("sym"))
    rec = plan.search.get("recipe")
    weights = rec.get("weights") if isinstance(rec, dict) else None
    if isinstance(weights, dict):
        for b, w in weights.items():
            if str(b).isdigit() and isinstance(w, dict):
                recorded[int(b)] = (w.get("group_size"), w.get("sym"))
    if not recorded or not plan.layers:
        return
    first = next(iter(plan.layers))
    searched = f" ('{rec['name']}')" if isinstance(rec, dict) and isinstance(rec.get("name"), str) else ""
    for bits, (group_size, sym) in sorted(recorded.items()):
        spec = recipe.spec_for(first, bits)
        if spec.skip or (spec.group_size, spec.sym) == (group_size, sym):
            continue
        raise QuantkitError(f"{where} was searched for {bits}-bit {_grid(group_size, sym)} weights, but recipe "
                            f"'{recipe.name}' quantizes {bits}-bit channels {_grid(spec.group_size, spec.sym)}; use "
                            f"the recipe the plan was searched with{searched} or re-run `quantkit search --recipe "
                            f"{recipe.name}`")


def load_plan(path: str | os.PathLike, model: nn.Module | None = None) -> Plan:
    """Read and validate ``plan.json``; with ``model``, also check the plan was made for that model (a
    QuantkitError names the first mismatch: missing layer, shape, config key or weights)."""
    plan = read_plan(path)
    if model is not None:
        check_plan_model(plan, model, f"plan '{path}'")
    return plan
