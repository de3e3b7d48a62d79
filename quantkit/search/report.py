"""What a plan looks like: high-bit share per projection type (MixLLM Tab. 7), per decoder layer × projection
(MixLLM Fig. 2, as a heatmap), and a JSON-ready summary."""

from __future__ import annotations

import os

from rich.table import Table

from quantkit.model.walk import projection_kind
from quantkit.plotting import require_matplotlib, save_figure
from quantkit.search.plan import Plan


def _layer_index(name: str) -> int:
    """Decoder layer number of a linear's name: its first all-digit path component (model.layers.3.… → 3)."""
    for part in name.split("."):
        if part.isdigit():
            return int(part)
    raise ValueError(f"no layer index in '{name}'")


def kinds_in_order(plan: Plan) -> list[str]:
    """Projection kinds in the order they first appear in the model (q, k, v, o, gate, up, down for Llama)."""
    out: list[str] = []
    for name in plan.layers:
        kind = projection_kind(name)
        if kind not in out:
            out.append(kind)
    return out


def _share(plan: Plan, name: str, bits: int | None) -> float:
    lp = plan.layers[name]
    n = sum(len(v) for b, v in lp.channels.items() if (b > plan.default_bits if bits is None else b == bits))
    return 100.0 * n / lp.out_features


def projection_shares(plan: Plan, bits: int | None = None) -> dict[str, float]:
    """Mean over decoder layers of each projection's share (%) of channels at ``bits`` (None: above the default
    width) — the statistic of MixLLM Tab. 7 ("average percentage of 8-bit out features" per class of linear)."""
    acc: dict[str, list[float]] = {k: [] for k in kinds_in_order(plan)}
    for name in plan.layers:
        acc[projection_kind(name)].append(_share(plan, name, bits))
    return {k: sum(v) / len(v) for k, v in acc.items()}


def layer_grid(plan: Plan) -> tuple[list[int], list[str], list[list[float]]]:
    """(decoder layer numbers, projection kinds, share % [layer][kind]) — the data of MixLLM Fig. 2."""
    kinds = kinds_in_order(plan)
    rows: dict[int, list[float]] = {}
    for name in plan.layers:
        row = rows.setdefault(_layer_index(name), [float("nan")] * len(kinds))
        row[kinds.index(projection_kind(name))] = _share(plan, name, None)
    layers = sorted(rows)
    return layers, kinds, [rows[i] for i in layers]


def summary(plan: Plan, path: str | None = None) -> dict:
    """One JSON-ready record of a plan: bits asked and achieved (with and without metadata), element share per
    width, per-projection high-bit share, strategy and calibration."""
    return {"plan": path, "model": plan.model.get("name"), "strategy": plan.search.get("strategy"),
            "bits": plan.bits, "default_bits": plan.default_bits, "target_bits": plan.target_bits,
            "fractions": plan.fractions, "achieved_bits": plan.achieved_bits,
            "achieved_bits_with_metadata": plan.achieved_bits_with_metadata,
            "element_share": {str(b): round(s, 6) for b, s in plan.element_shares().items()},
            "high_bit_share_by_projection": {k: round(v, 4) for k, v in projection_shares(plan).items()},
            "layers": len(plan.layers), "calibration": plan.calibration}


def summary_table(plan: Plan) -> Table:
    """Rich table: share (%) of channels at each non-default width per projection type, like MixLLM Tab. 7."""
    kinds = kinds_in_order(plan)
    t = Table(title="channels per projection type (mean % over layers)",
              caption=f"{plan.achieved_bits:.4f} bits/weight, {plan.achieved_bits_with_metadata:.4f} with scales "
                      f"and zeros; default {plan.default_bits} bits")
    t.add_column("bits")
    for kind in kinds:
        t.add_column(kind, justify="right")
    for b in sorted((b for b in plan.bits if b != plan.default_bits), reverse=True):
        shares = projection_shares(plan, b)
        t.add_row(f"{b}-bit", *(f"{shares[k]:.2f}" for k in kinds))
    return t


def save_heatmap(plan: Plan, path: str | os.PathLike) -> None:
    """PNG heatmap of high-bit share per decoder layer × projection (MixLLM Fig. 2). Needs matplotlib."""
    plt = require_matplotlib()
    layers, kinds, grid = layer_grid(plan)
    fig, ax = plt.subplots(figsize=(1.0 + 0.9 * len(kinds), 1.2 + 0.28 * len(layers)))
    im = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0)
    ax.set_xticks(range(len(kinds)), [f"{k}" for k in kinds])
    ax.set_yticks(range(len(layers)), [str(i) for i in layers])
    ax.set_xlabel("projection")
    ax.set_ylabel("decoder layer")
    high = "/".join(str(b) for b in plan.bits if b > plan.default_bits)
    ax.set_title(f"% channels at {high} bits ({plan.search.get('strategy')}, {plan.achieved_bits:.3f} bits avg)")
    fig.colorbar(im, ax=ax, label="%")
    fig.tight_layout()
    save_figure(fig, path, "heatmap")
