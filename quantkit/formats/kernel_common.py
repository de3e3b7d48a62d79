"""Checks and metadata shared by the GPU kernel layouts (``w4a16``, ``w4a8-lqq``, ``w8``): their kernels apply
scales per 128-column half-tile, so groups must be whole multiples of 128 columns (or one group per row), and
groups are consecutive (no act-order ``g_idx``)."""

from __future__ import annotations

from quantkit.formats.common import has_act_order
from quantkit.quant.records import QuantizedWeight

HALF_K = 128  # the scale granularity of every kernel: one 128-column half of a 256-column tile


def group_problem(qw: QuantizedWeight, layout: str) -> str | None:
    """Why the kernels of ``layout`` cannot apply ``qw``'s groups (size not a multiple of 128, act-order), or
    None."""
    if qw.group_size != -1 and (qw.group_size <= 0 or qw.group_size % HALF_K):
        return (f"the {layout} kernels need group_size -1 or a multiple of {HALF_K}, this weight has "
                f"{qw.group_size}; use the 'reference' layout")
    if has_act_order(qw):
        return f"the {layout} kernels read consecutive groups; act-order g_idx needs the 'gptq' or 'reference' layout"
    return None


def base_meta(qw: QuantizedWeight, name: str, version: int, padded_in: int) -> dict:
    """The metadata fields every kernel layout writes (manifest entry of one weight)."""
    n, k = qw.codes.shape
    return {"layout": name, "format_version": version, "bits": int(qw.bits), "group_size": int(qw.group_size),
            "sym": bool(qw.sym), "in_features": int(k), "out_features": int(n),
            "num_groups": int(qw.scales.shape[1]), "padded_in_features": int(padded_in)}
