"""The optional matplotlib dependency of every ``--plot`` option (search heatmap, bench speedup curves): import it
headless or say how to install it, and save a figure with a one-line error when the file cannot be written."""

from __future__ import annotations

import os

from quantkit.errors import QuantkitError


def require_matplotlib():
    """matplotlib.pyplot on the headless Agg backend, or a QuantkitError saying how to install it (the plot is
    optional, so matplotlib is an extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise QuantkitError("--plot needs matplotlib, which is not installed; run `pip install matplotlib`") from None
    return plt


def save_figure(fig, path: str | os.PathLike, what: str, dpi: int = 120) -> None:
    """Write ``fig`` to ``path`` (format from the suffix) and close it; an unwritable path is a one-line
    QuantkitError naming ``what`` was being written."""
    plt = require_matplotlib()
    try:
        fig.savefig(path, dpi=dpi)
    except OSError as e:
        raise QuantkitError(f"cannot write {what} '{path}': {e.strerror or e}") from None
    finally:
        plt.close(fig)
