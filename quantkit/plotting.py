"""The optional matplotlib dependency of every ``--plot`` option (search heatmap, bench speedup curves): import it
headless or say how to install it, and save a figure with a one-line error when the file cannot be written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

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


def check_plot_path(path: str | os.PathLike, option: str = "--plot") -> None:
    """Refuse a plot path before the work that feeds it: no matplotlib, a folder that does not exist, or a suffix
    that is not one of matplotlib's image formats (no suffix: PNG)."""
    require_matplotlib()
    p = Path(path).expanduser()
    if not str(path).strip() or p.is_dir():
        raise QuantkitError(f"{option} '{path}' is not a file name; give one such as {option} plot.png")
    if not p.parent.is_dir():
        raise QuantkitError(f"cannot write {option} '{path}': folder '{p.parent}' does not exist; create it or "
                            "choose another path")
    try:  # permission bits cannot tell (root ignores them; read-only mounts): try a file there
        tempfile.NamedTemporaryFile(dir=p.parent, prefix=".quantkit-plot-").close()
    except OSError as e:
        raise QuantkitError(f"cannot write {option} '{path}': {e.strerror or e}; choose a folder you can write "
                            "to") from None
    suffix = p.suffix.lower().lstrip(".")
    if suffix:
        from matplotlib.backend_bases import FigureCanvasBase

        formats = FigureCanvasBase.get_supported_filetypes()
        if suffix not in formats:
            raise QuantkitError(f"{option} '{path}': matplotlib does not write .{suffix} files; end the name in "
                                f".png, .svg or .pdf (or one of {', '.join(sorted(formats))})")


def written_path(path: str | os.PathLike) -> Path:
    """Where matplotlib's savefig puts ``path``: as given, or with ``.png`` added when it has no suffix."""
    p = Path(path).expanduser()
    return p if p.suffix else p.with_name(p.name + ".png")


def save_figure(fig, path: str | os.PathLike, what: str, dpi: int = 120) -> None:
    """Write ``fig`` to ``path`` (format from the suffix; none: PNG at :func:`written_path`) and close it; an
    unwritable path is a one-line QuantkitError naming ``what`` was being written."""
    plt = require_matplotlib()
    try:
        fig.savefig(path, dpi=dpi)
    except OSError as e:
        raise QuantkitError(f"cannot write {what} '{path}': {e.strerror or e}") from None
    except ValueError as e:  # an unknown format suffix
        raise QuantkitError(f"cannot write {what} '{path}': {e}") from None
    finally:
        plt.close(fig)
