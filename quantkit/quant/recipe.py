"""Recipes: what to quantize how, as YAML (``recipes/*.yaml``, shipped as ``quantkit.recipes``).

Schema (every field optional except ``weight.method``; unknown fields are errors)::

    name: mixllm-w4a8
    description: free text
    weight:
      method: gptq            # rtn | gptq | awq | lqq (RTN on the LiquidQuant grid)
      grid: affine            # affine | lqq: LiquidQuant's two-level 4-bit grid (with method gptq or lqq) |
                              #   fp8: E4M3 values with an fp16 scale per group (method rtn, bits 8)
      bits: 4                 # default bit-width (2..8)
      group_size: 128         # 32 | 64 | 128 | ... | -1 (per-channel)
      sym: false
      clip: true              # clipping search (AWQ/MixLLM); with method lqq the searched two-level fit
      act_order: false        # GPTQ desc_act
      static_groups: true     # GPTQ act-order with groups fixed on the original column order
      damp: 0.01              # GPTQ dampening, fraction of mean diag(H)
      block_size: 128         # GPTQ lazy-batch block
      true_sequential: true
      search_tokens: 16384    # AWQ: calibration tokens its α search runs the attention/MLP blocks on (null: all)
    bit_specs:                # the quantizer of each other bit-width a plan may assign (MixLLM Sec. 4.1:
      8: {sym: true, group_size: 128}   #   4-bit asym g128, 8-bit sym g128)
    activation:
      bits: 8                 # 16 (or null) = no activation quantization
      group_size: 128         # -1 = per-token
      sym: true
      fp8: false              # dynamic E4M3 instead of int8 (bits 8, symmetric)
      smooth: 0.5             # SmoothQuant migration strength α folded into norms/linears; auto: searched per
                              #   fold by output error (null: off)
      rotate: false           # QuaRot/SpinQuant R1: a random Hadamard rotation of the residual stream, folded
      online_rotate: false    # QuaRot R3/R4: o_proj and down_proj inputs rotated at run time (W·Q folded);
                              #   both also serve weight-only recipes, with GPTQ (RTN loses: docs/BENCHMARKS.md)
    kv:                       # KV-cache quantization (quantkit.quant.kv); absent = fp16 cache
      bits: 4                 # 8 or 4
      fp8: false              # e4m3 instead of int8 (bits 8)
      group_size: 32          # KV4: key tokens per block, value channels per group (KIVI)
      residual: 128           # KV4: latest tokens kept in fp16 (a whole number of groups)
    lm_head: false            # true: the output projection too, 4-bit g128 asymmetric, weight-only, by GPTQ in
                              #   GPTQ recipes, else round-to-nearest (GPTQModel's lm_head=True; tied embeddings
                              #   are untied first)
    overrides:                # per-layer, by fnmatch pattern on the linear's name; later entries win
      - {pattern: "*.down_proj", bits: 8}
      - {pattern: "model.layers.0.*", skip: true}
    calibration:
      dataset: kjv+pydoc      # equal shares of the shipped KJV and Python-reference text
      samples: 128
      seqlen: 2048
      seed: 0
"""

from __future__ import annotations

import fnmatch
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

import yaml

from quantkit.errors import QuantkitError
from quantkit.quant.kv import KVSpec
from quantkit.resources import shipped_dir

METHODS = ("rtn", "gptq", "awq", "lqq")
LM_HEAD_BITS, LM_HEAD_GROUP, LM_HEAD_SYM = 4, 128, False  # the grid of a quantized output projection (lm_head: true)
GRIDS = ("affine", "lqq", "fp8")  # one-level group-wise affine, LiquidQuant's two-level 4-bit grid, FP8 E4M3


@dataclass
class WeightSpec:
    method: str = "rtn"
    bits: int = 4
    group_size: int = 128
    sym: bool = False
    clip: bool = False
    act_order: bool = False
    static_groups: bool = True
    damp: float = 0.01
    block_size: int = 128
    true_sequential: bool = True
    search_tokens: int | None = None
    grid: str = "affine"


@dataclass
class ActSpec:
    bits: int | None = None
    group_size: int = 128
    sym: bool = True
    fp8: bool = False  # dynamic E4M3 activations (quantkit.quant.act.quantize_activation_fp8) instead of int8
    smooth: float | str | None = None  # SmoothQuant migration strength α, "auto" = searched per fold; None = off
    rotate: bool = False  # fold a random Hadamard rotation into the residual stream (quantkit.quant.rotate)
    online_rotate: bool = False  # rotate o_proj / down_proj inputs at run time (quantkit.quant.rotate.InputRotation)

    @property
    def enabled(self) -> bool:
        return self.bits is not None and self.bits < 16


@dataclass
class CalibSpec:
    dataset: str = "kjv+pydoc"
    samples: int = 128
    seqlen: int = 2048
    seed: int = 0


@dataclass
class BitSpec:
    sym: bool | None = None
    group_size: int | None = None


@dataclass
class Override:
    pattern: str
    bits: int | None = None
    group_size: int | None = None
    sym: bool | None = None
    skip: bool = False


@dataclass
class LinearSpec:
    """The resolved quantizer of one linear (or one bit-width partition of it)."""

    method: str
    bits: int
    group_size: int
    sym: bool
    clip: bool
    skip: bool = False
    grid: str = "affine"


@dataclass
class Recipe:
    """A parsed, validated recipe."""

    name: str
    weight: WeightSpec
    activation: ActSpec = field(default_factory=ActSpec)
    calibration: CalibSpec = field(default_factory=CalibSpec)
    bit_specs: dict[int, BitSpec] = field(default_factory=dict)
    overrides: list[Override] = field(default_factory=list)
    kv: KVSpec | None = None
    lm_head: bool = False
    description: str = ""
    source: str = ""

    def unmatched_overrides(self, names) -> list[str]:
        """The override patterns that match none of the linear layer ``names`` (most likely a typo: such an
        override changes nothing)."""
        names = list(names)
        return [o.pattern for o in self.overrides if not any(fnmatch.fnmatchcase(n, o.pattern) for n in names)]

    @property
    def uses_calibration(self) -> bool:
        """Whether quantizing needs calibration inputs: GPTQ and AWQ (layer inputs), the clipping search of any
        method (the clipped grid is chosen on the layer's outputs) and SmoothQuant (activation maxima); RTN and
        LiquidQuant without clipping quantize each weight on its own."""
        return (self.weight.method in ("gptq", "awq") or bool(self.weight.clip)
                or self.activation.smooth is not None)

    def spec_for(self, name: str, bits: int | None = None) -> LinearSpec:
        """The quantizer for linear ``name``; ``bits`` (from a plan) picks that bit-width's spec.

        Resolution order: recipe weight defaults → ``bit_specs`` of the bit-width → matching overrides.
        """
        w = self.weight
        spec = LinearSpec(w.method, w.bits, w.group_size, w.sym, w.clip,
                          grid="lqq" if w.method == "lqq" else w.grid)
        for o in self.overrides:
            if fnmatch.fnmatchcase(name, o.pattern):
                spec.bits = o.bits if o.bits is not None else spec.bits
                spec.group_size = o.group_size if o.group_size is not None else spec.group_size
                spec.sym = o.sym if o.sym is not None else spec.sym
                spec.skip = o.skip or spec.skip
        if bits is not None:
            spec.bits = bits
        bs = self.bit_specs.get(spec.bits)
        if bs is not None:
            spec.sym = bs.sym if bs.sym is not None else spec.sym
            spec.group_size = bs.group_size if bs.group_size is not None else spec.group_size
        if spec.grid == "lqq" and spec.bits != 4:  # LQQ is a 4-bit scheme; other partitions use the affine grid
            spec.grid = "affine"
            if spec.method == "lqq":
                spec.method = "rtn"
        if spec.grid == "fp8" and spec.bits != 8:  # an override to another bit-width leaves the FP8 grid
            spec.grid = "affine"
        return spec

    def to_dict(self) -> dict:
        """JSON/YAML-serialisable form (written into checkpoint manifests and plans)."""
        d = {"name": self.name, "description": self.description, "weight": asdict(self.weight),
             "activation": asdict(self.activation), "calibration": asdict(self.calibration),
             "bit_specs": {int(k): asdict(v) for k, v in self.bit_specs.items()},
             "overrides": [asdict(o) for o in self.overrides]}
        if self.kv is not None:
            d["kv"] = asdict(self.kv)
        if self.lm_head:
            d["lm_head"] = True
        return d


def _build(cls, data, where: str):
    if data is None:  # an empty section ('weight:' alone, a bare '-' list item): the defaults, if it has them
        data = {}
    if not isinstance(data, dict):
        raise QuantkitError(f"recipe field '{where}' must be a mapping, got {type(data).__name__}")
    known = {f.name: f for f in fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in known:
            raise QuantkitError(f"recipe field '{where}.{key}' is unknown; allowed: {', '.join(known)}")
        kwargs[key] = _check_type(value, known[key].type, f"{where}.{key}")
    missing = [f.name for f in fields(cls) if f.name not in kwargs and f.default is MISSING
               and f.default_factory is MISSING]
    if missing:
        raise QuantkitError(f"recipe field '{where}' is incomplete: it needs {', '.join(repr(m) for m in missing)}")
    return cls(**kwargs)


def _check_type(value, typ, where: str):
    t = str(typ)
    if value is None and "None" in t:
        return None
    if t.startswith("bool"):
        if not isinstance(value, bool):
            raise QuantkitError(f"recipe field '{where}' must be true or false, got {value!r}")
    elif t.startswith("int"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise QuantkitError(f"recipe field '{where}' must be an integer, got {value!r}")
    elif t.startswith("float | str"):  # a number or a keyword, checked by the field's own validation
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise QuantkitError(f"recipe field '{where}' must be a number or a keyword, got {value!r}")
    elif t.startswith("float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise QuantkitError(f"recipe field '{where}' must be a number, got {value!r}")
        value = float(value)
    elif t.startswith("str"):
        if not isinstance(value, str):
            raise QuantkitError(f"recipe field '{where}' must be a string, got {value!r}")
    return value


def _check_bits(bits, where: str, allow_16: bool = False) -> None:
    if bits is None or (allow_16 and bits == 16):
        return
    if not 2 <= bits <= 8:
        raise QuantkitError(f"recipe field '{where}' must be in 2..8{' or 16' if allow_16 else ''}, got {bits}")


def _check_group(gs, where: str) -> None:
    if gs is not None and gs != -1 and gs < 1:
        raise QuantkitError(f"recipe field '{where}' must be a positive group size or -1, got {gs}")


def parse_recipe(data: dict, source: str = "") -> Recipe:
    """Validate a recipe mapping (from YAML) into a :class:`Recipe`; errors name the offending field."""
    if not isinstance(data, dict):
        raise QuantkitError(f"recipe {source} must be a YAML mapping at the top level")
    allowed = {"name", "description", "weight", "activation", "calibration", "bit_specs", "overrides", "kv",
               "lm_head"}
    for key in data:
        if key not in allowed:
            raise QuantkitError(f"recipe field '{key}' is unknown; allowed: {', '.join(sorted(allowed))}")
    if "weight" not in data:
        raise QuantkitError("recipe field 'weight' is missing; it needs at least weight.method")
    weight = _build(WeightSpec, data["weight"], "weight")
    if weight.method not in METHODS:
        raise QuantkitError(f"recipe field 'weight.method' is '{weight.method}'; use one of {', '.join(METHODS)}")
    _check_bits(weight.bits, "weight.bits")
    _check_group(weight.group_size, "weight.group_size")
    if weight.search_tokens is not None and weight.search_tokens < 1:
        raise QuantkitError(f"recipe field 'weight.search_tokens' must be at least 1 (or null: every calibration "
                            f"token), got {weight.search_tokens}")
    if not 0 <= weight.damp < 1:
        raise QuantkitError(f"recipe field 'weight.damp' must be in [0, 1), got {weight.damp}")
    if weight.grid not in GRIDS:
        raise QuantkitError(f"recipe field 'weight.grid' is '{weight.grid}'; use one of {', '.join(GRIDS)}")
    if weight.grid == "lqq" and weight.method not in ("gptq", "lqq"):
        raise QuantkitError(f"recipe field 'weight.grid: lqq' works with method gptq (or method lqq, which implies "
                            f"it), not {weight.method}")
    if weight.grid == "fp8" and (weight.method != "rtn" or weight.bits != 8 or weight.clip):
        raise QuantkitError("recipe field 'weight.grid: fp8' takes method rtn, bits 8 and no clip (FP8 E4M3 with a "
                            f"per-group scale), got method {weight.method}, bits {weight.bits}, clip {weight.clip}")
    if (weight.method == "lqq" or weight.grid == "lqq") and (weight.bits != 4 or weight.sym):
        raise QuantkitError("recipe fields 'weight.bits' must be 4 and 'weight.sym' false for the LiquidQuant grid "
                            "(LiquidQuant is UINT4 over INT8)")
    act = _build(ActSpec, data.get("activation"), "activation")
    _check_bits(act.bits, "activation.bits", allow_16=True)
    _check_group(act.group_size, "activation.group_size")
    if act.fp8 and (act.bits != 8 or not act.sym):
        raise QuantkitError(f"recipe field 'activation.fp8' needs activation.bits 8 and sym true (E4M3 is a signed "
                            f"8-bit float), got bits {act.bits}, sym {act.sym}")
    if act.smooth is not None:
        if act.smooth != "auto" and (isinstance(act.smooth, bool) or not isinstance(act.smooth, (int, float))
                                     or not 0 <= act.smooth <= 1):
            raise QuantkitError(f"recipe field 'activation.smooth' is SmoothQuant's alpha in [0, 1] (e.g. 0.5) "
                                f"or 'auto' (searched per fold), got {act.smooth!r}")
        if not act.enabled:
            raise QuantkitError("recipe field 'activation.smooth' needs quantized activations (activation.bits "
                                "8); drop it for weight-only recipes")
        act.smooth = act.smooth if act.smooth == "auto" else float(act.smooth)
    if act.online_rotate and weight.method == "awq":
        raise QuantkitError("recipe field 'activation.online_rotate' does not combine with weight.method awq: AWQ "
                            "scales the channels of o_proj / down_proj inputs, which the rotation mixes; use gptq")
    calib = _build(CalibSpec, data.get("calibration"), "calibration")
    if calib.samples < 1 or calib.seqlen < 2:
        raise QuantkitError(f"recipe fields 'calibration.samples' (≥ 1) and 'calibration.seqlen' (≥ 2 tokens) are out "
                            f"of range: {calib.samples}, {calib.seqlen}")
    bit_specs = {}
    raw_bs = data.get("bit_specs") or {}
    if not isinstance(raw_bs, dict):
        raise QuantkitError("recipe field 'bit_specs' must map a bit-width to {sym, group_size}")
    for k, v in raw_bs.items():
        if isinstance(k, str) and k.isdigit():  # JSON keys are strings: a recipe read back from a manifest
            k = int(k)
        if isinstance(k, bool) or not isinstance(k, int):
            raise QuantkitError(f"recipe field 'bit_specs' key {k!r} must be an integer bit-width")
        _check_bits(k, f"bit_specs.{k}")
        bit_specs[k] = _build(BitSpec, v, f"bit_specs.{k}")
        _check_group(bit_specs[k].group_size, f"bit_specs.{k}.group_size")
    overrides = []
    raw_ov = data.get("overrides") or []
    if not isinstance(raw_ov, list):
        raise QuantkitError("recipe field 'overrides' must be a list of {pattern, bits, group_size, sym, skip}")
    for i, o in enumerate(raw_ov):
        ov = _build(Override, o, f"overrides[{i}]")
        _check_bits(ov.bits, f"overrides[{i}].bits")
        _check_group(ov.group_size, f"overrides[{i}].group_size")
        overrides.append(ov)
    kv = None
    if data.get("kv") is not None:
        raw_kv = data["kv"]
        if isinstance(raw_kv, dict) and "bits" not in raw_kv:
            raise QuantkitError("recipe field 'kv' needs kv.bits (8 or 4); drop 'kv' for an fp16 cache")
        try:
            kv = _build(KVSpec, raw_kv, "kv")
        except ValueError as e:
            raise QuantkitError(f"recipe field 'kv': {e}") from None
    lm_head = data.get("lm_head")
    lm_head = False if lm_head is None else lm_head  # 'lm_head:' alone is the default, as for the sections
    if not isinstance(lm_head, bool):
        raise QuantkitError(f"recipe field 'lm_head' is true (quantize the output projection, 4-bit g128) or false, "
                            f"got {lm_head!r}")
    name = data.get("name") or Path(source).stem or "recipe"
    return Recipe(name=str(name), weight=weight, activation=act, calibration=calib, bit_specs=bit_specs,
                  overrides=overrides, kv=kv, lm_head=lm_head, description=str(data.get("description", "")),
                  source=source)


def shipped_recipes() -> list[str]:
    """Names of the recipes shipped in recipes/."""
    root = shipped_dir("quantkit.recipes", "recipes")
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def load_recipe(name_or_path: str) -> Recipe:
    """A shipped recipe by name (``gptq-w4a16-g128``) or a YAML file path.

    A YAML file keeps the ``name`` it declares (its file stem when it declares none), except when that is the name
    of a shipped recipe and the file quantizes differently (any field but ``name`` and ``description``): an edited
    copy of a shipped recipe must not pass for the original in a checkpoint's manifest, a plan or a results table,
    so its name becomes ``<name> (edited: <file name>)``, e.g. ``gptq-w4a16-g128 (edited: my-gptq.yaml)``. The
    whole recipe is recorded next to the name wherever one is written; to give an edited recipe a name of its
    own, change its ``name`` field."""
    p = Path(name_or_path).expanduser()
    if p.is_file():
        try:
            text, source = p.read_text(encoding="utf-8"), str(p)
        except UnicodeDecodeError:
            raise QuantkitError(f"recipe file '{p}' is not UTF-8 text; pass a YAML recipe file") from None
        recipe = _parse_text(text, source)
        recipe.name = _edited_name(recipe, p.name)
        return recipe
    ref = _shipped_file(name_or_path)
    if ref is None:
        if name_or_path.endswith((".yaml", ".yml")) or "/" in name_or_path:
            raise QuantkitError(f"recipe file '{name_or_path}' does not exist")
        raise QuantkitError(f"unknown recipe '{name_or_path}'; shipped: {', '.join(shipped_recipes())} "
                            "(or pass a YAML file path)")
    return _parse_text(ref.read_text(encoding="utf-8"), name_or_path)


def _shipped_file(name: str):
    """The shipped recipe file called ``name``, or None."""
    if not name or "/" in name or "\\" in name:
        return None
    ref = shipped_dir("quantkit.recipes", "recipes").joinpath(f"{name}.yaml")
    return ref if ref.is_file() else None


def _parse_text(text: str, source: str) -> Recipe:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise QuantkitError(f"recipe '{source}' is not valid YAML{where}: {getattr(e, 'problem', e)}") from None
    return parse_recipe(data, source)


def _settings(recipe: Recipe) -> dict:
    """What a recipe quantizes: everything but its name and description."""
    d = recipe.to_dict()
    d.pop("name"), d.pop("description")
    return d


def _edited_name(recipe: Recipe, file_name: str) -> str:
    """``recipe.name``, or ``<name> (edited: <file_name>)`` when a shipped recipe of that name quantizes
    differently (see :func:`load_recipe`)."""
    ref = _shipped_file(recipe.name)
    if ref is None:
        return recipe.name
    try:
        shipped = _parse_text(ref.read_text(encoding="utf-8"), recipe.name)
    except QuantkitError:
        return recipe.name
    if _settings(shipped) == _settings(recipe):
        return recipe.name
    return f"{recipe.name} (edited: {file_name})"


def check_calibration_options(recipe: Recipe, given: list[str], warn=None) -> list[str]:
    """Warn about (through ``warn``, default one yellow line on stderr) and return the calibration options
    (``--calib-samples``, ``--calib-seqlen``, ``--calib-dataset``) given for a recipe that quantizes without
    calibration data: they are ignored, and the command goes on, so one loop can pass the same options to every
    recipe."""
    if not given or recipe.uses_calibration:
        return []
    if warn is None:
        from quantkit.ui import warn

    one = len(given) == 1
    warn(f"{', '.join(given)} {'is' if one else 'are'} ignored: recipe '{recipe.name}' quantizes without calibration "
         f"data ({recipe.weight.method}, no clipping search)")
    return list(given)
