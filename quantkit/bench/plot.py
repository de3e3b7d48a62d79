"""``quantkit bench --plot``: speedup over torch FP16 against token count M, one line per method, one panel per
(N, K) weight shape, from the rows :func:`quantkit.bench.runner.run_bench` returns. Needs matplotlib (optional)."""

from __future__ import annotations

import math
import os

from quantkit.errors import QuantkitError
from quantkit.plotting import require_matplotlib, save_figure


def speedup_series(rows: list[dict]) -> dict[tuple[int, int], dict[str, list[tuple[int, float]]]]:
    """(N, K) → method → [(M, speedup_vs_fp16)] sorted by M, shapes and methods in order of first appearance.
    The fp16 baseline (speedup 1 by definition), skipped rows and rows without a speedup are left out."""
    out: dict[tuple[int, int], dict[str, list[tuple[int, float]]]] = {}
    for r in rows:
        shape = (int(r["n"]), int(r["k"]))
        methods = out.setdefault(shape, {})
        speedup = r.get("speedup_vs_fp16")
        if r["method"] == "fp16" or "skipped" in r or speedup is None:
            continue
        methods.setdefault(r["method"], []).append((int(r["m"]), float(speedup)))
    for methods in out.values():
        for points in methods.values():
            points.sort()
    return out


def speedup_figure(rows: list[dict]):
    """A matplotlib figure of :func:`speedup_series`: log2 M axis, a dashed line at 1.0 (FP16), one subplot per
    shape titled ``N×K``; the device name (when the rows carry one) in the figure title."""
    plt = require_matplotlib()
    series = speedup_series(rows)
    if not any(series.values()):
        raise QuantkitError("--plot has nothing to draw: no method other than fp16 was timed (all skipped?); "
                            "add --methods")
    shapes = list(series)
    cols = min(3, len(shapes))
    nrows = math.ceil(len(shapes) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.4 * nrows), squeeze=False)
    ms = sorted({int(r["m"]) for r in rows})
    for ax, shape in zip(axes.flat, shapes):
        ax.axhline(1.0, color="gray", linestyle="--", linewidth=1, label="fp16")
        for method, points in series[shape].items():
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=method)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ms, [str(m) for m in ms])
        ax.set_title(f"{shape[0]}×{shape[1]}")
        ax.set_xlabel("M (tokens)")
        ax.set_ylabel("speedup vs FP16")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(shapes):]:
        ax.set_visible(False)
    device = next((r["device"] for r in rows if r.get("device")), None)
    fig.suptitle("kernel speedup over torch FP16 (cuBLAS)" + (f" — {device}" if device else ""))
    fig.tight_layout()
    return fig


def save_speedup_plot(rows: list[dict], path: str | os.PathLike) -> None:
    """Write :func:`speedup_figure` of ``rows`` to ``path`` (PNG, or any format matplotlib infers from it)."""
    save_figure(speedup_figure(rows), path, "plot")
