"""What the layer-wise weight quantizers (GPTQ, AWQ) share: per-linear settings, input hooks, weight write-back.

Both run inside :func:`quantkit.model.layerwise.run_layerwise`'s callback on one decoder layer at a time
(GPTQ Sec. 4 "Step 3", AWQ Sec. 3): they observe the inputs of the layer's linears through forward pre-hooks and
replace each linear's weight with its dequantized (fake-quantized) version, so that the next layer is calibrated
on the outputs of the already-quantized one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import NamedTuple

import torch
import torch.nn as nn

from quantkit.errors import QuantkitError
from quantkit.quant import grid
from quantkit.quant.partition import split_rows


class QuantSpec(NamedTuple):
    """The grid of one linear or one output-channel partition (records.py conventions); ``lqq`` the LiquidQuant
    two-level 4-bit grid (:mod:`quantkit.quant.lqq`) instead of the one-level affine grid."""

    bits: int
    group_size: int
    sym: bool
    lqq: bool = False

    @property
    def affine(self) -> tuple[int, int, bool]:
        """(bits, group_size, sym): the arguments of the affine grid functions (grid.quantize, search_clip)."""
        return self.bits, self.group_size, self.sym


# name of a linear -> (bits, group_size, sym) for it, or None to keep the config's defaults
Override = Callable[[str], "tuple[int, int, bool] | None"]
# the grids of one linear: (sorted output rows, or None for all rows; the grid of those rows)
RowGrids = list[tuple["torch.Tensor | None", QuantSpec]]


def check_spec(bits: int, group_size: int, where: str) -> None:
    """Reject bit-widths outside 2..8 and group sizes other than -1 or a positive integer."""
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        raise QuantkitError(f"{where} bits must be an integer in 2..8, got {bits!r}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or (group_size != -1 and group_size < 1):
        raise QuantkitError(f"{where} group_size must be -1 (per-channel) or a positive integer, got {group_size!r}")


@dataclass
class LayerQuantConfig:
    """Default grid of every linear, an optional per-linear ``override`` (e.g. a recipe's pattern overrides) and
    ``bit_specs``: bit-width → (group_size, sym) for the output-channel partitions a MixLLM plan assigns
    (MixLLM Sec. 4.1: 4-bit asymmetric g128, 8-bit symmetric g128). ``lqq`` puts every 4-bit grid on
    LiquidQuant's two-level grid (GPTQ only)."""

    bits: int = 4
    group_size: int = 128
    sym: bool = False
    override: Override | None = None
    bit_specs: dict[int, tuple[int, bool]] = field(default_factory=dict)
    lqq: bool = False

    def __post_init__(self) -> None:
        check_spec(self.bits, self.group_size, type(self).__name__)
        for b, (gs, _sym) in self.bit_specs.items():
            check_spec(b, gs, f"{type(self).__name__}.bit_specs[{b}]")

    def spec(self, name: str) -> QuantSpec:
        """The grid of linear ``name``: the override's answer, or the defaults."""
        got = self.override(name) if self.override is not None else None
        bits, group_size, sym = (self.bits, self.group_size, self.sym) if got is None else got
        check_spec(bits, group_size, f"override for {name}:")
        return QuantSpec(bits, group_size, sym, self.lqq and bits == 4)

    def partition_spec(self, name: str, bits: int) -> QuantSpec:
        """The grid of the rows of ``name`` that a plan assigns ``bits``: the linear's own grid at its own
        bit-width, else ``bit_specs[bits]`` if given, else the linear's group size and symmetry at ``bits``."""
        base = self.spec(name)
        if int(bits) == base.bits:
            return base
        gs, sym = self.bit_specs.get(int(bits), (base.group_size, base.sym))
        check_spec(int(bits), gs, f"partition of {name}:")
        return QuantSpec(int(bits), gs, sym, self.lqq and int(bits) == 4)

    def row_grids(self, name: str, out_features: int, bits_of_rows: torch.Tensor | None) -> RowGrids:
        """The grids of linear ``name``: [(None, its grid)] without a plan, else one (sorted rows, grid) per
        bit-width a plan's per-row assignment ``bits_of_rows`` [N] uses (a single bit-width gives rows None)."""
        if bits_of_rows is None:
            return [(None, self.spec(name))]
        bits_of_rows = torch.as_tensor(bits_of_rows).reshape(-1)
        if bits_of_rows.numel() != out_features:
            raise QuantkitError(f"row bit-widths for {name} have {bits_of_rows.numel()} entries, the layer has "
                                f"{out_features} output channels; re-run the search for this model")
        parts = split_rows(bits_of_rows)
        if len(parts) == 1:
            return [(None, self.partition_spec(name, next(iter(parts))))]
        return [(rows, self.partition_spec(name, b)) for b, rows in parts.items()]

    @classmethod
    def coerce(cls, config):
        """``config`` as this class: an instance passes through, a dict is validated key by key."""
        if isinstance(config, cls):
            return config
        if isinstance(config, Mapping):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(config) - known)
            if unknown:
                raise QuantkitError(f"unknown {cls.__name__} option(s) {', '.join(unknown)}; "
                                    f"allowed: {', '.join(sorted(known))}")
            return cls(**config)
        raise QuantkitError(f"{cls.__name__}: expected a {cls.__name__} or a dict, got {type(config).__name__}")


def fake_quantize_rows(weight: torch.Tensor, grids: RowGrids) -> torch.Tensor:
    """Quantize → dequantize ``weight`` [N, K] (float32) with each row subset on its own grid (RTN)."""
    if len(grids) == 1 and grids[0][0] is None:
        return grid.fake_quantize(weight.float(), *grids[0][1].affine)
    out = torch.empty(weight.shape, dtype=torch.float32, device=weight.device)
    for rows, spec in grids:
        rows = rows.to(weight.device)
        out[rows] = grid.fake_quantize(weight[rows].float(), *spec.affine)
    return out


@contextmanager
def pre_hooks(modules: Mapping[str, nn.Module],
              fn: Callable[[str, tuple, dict], None]) -> Iterator[None]:
    """Call ``fn(name, args, kwargs)`` before every forward of each module while the context is open."""
    handles = []
    try:
        for name, mod in modules.items():
            def hook(_mod, args, kwargs, _name=name):
                fn(_name, args, kwargs)

            handles.append(mod.register_forward_pre_hook(hook, with_kwargs=True))
        yield
    finally:
        for h in handles:
            h.remove()


def linear_input(args: tuple, kwargs: dict) -> torch.Tensor:
    """The input tensor of an nn.Linear forward call, however it was passed."""
    return args[0] if args else kwargs["input"]


@torch.no_grad()
def write_weight(linear: nn.Linear, weight: torch.Tensor) -> None:
    """Replace the linear's weight values in place (its dtype and device), keeping the Parameter object."""
    linear.weight.data.copy_(weight.to(device=linear.weight.device, dtype=linear.weight.dtype))


def check_row_bits(row_bits: Mapping[str, torch.Tensor] | None,
                   linear_names: Mapping[str, nn.Module]) -> Mapping[str, torch.Tensor]:
    """A plan's per-row bit-widths for one layer ({} when none), refusing names that are not its linears."""
    row_bits = row_bits or {}
    unknown = [n for n in row_bits if n not in linear_names]
    if unknown:
        raise QuantkitError(f"row bit-widths given for {', '.join(unknown)}, which are not linears of this "
                            "layer; check the plan matches the model")
    return row_bits
