"""``quantkit bench --plot``: speedup-vs-M curves drawn from run_bench rows (synthetic rows: no GPU needed)."""

from __future__ import annotations

import pytest

from quantkit.bench.plot import save_speedup_plot, speedup_figure, speedup_series
from quantkit.errors import QuantkitError

PNG = b"\x89PNG\r\n\x1a\n"


def _rows():
    rows = []
    for n, k in ((33, 328), (7, 200)):
        for m in (4096, 1, 16):  # out of order on purpose
            rows.append({"method": "fp16", "m": m, "n": n, "k": k, "ms": 1.0, "speedup_vs_fp16": 1.0,
                         "device": "Test GPU"})
            rows.append({"method": "w4a16", "m": m, "n": n, "k": k, "ms": 0.5, "speedup_vs_fp16": 2.0 + m / 4096})
            if m > 16:
                rows.append({"method": "int_mm", "m": m, "n": n, "k": k, "ms": 0.8, "speedup_vs_fp16": 1.25})
            else:
                rows.append({"method": "int_mm", "m": m, "n": n, "k": k, "skipped": "torch._int_mm needs M > 16"})
    return rows


def test_series_drop_baseline_and_skipped_and_sort_by_m():
    s = speedup_series(_rows())
    assert list(s) == [(33, 328), (7, 200)]
    assert list(s[(33, 328)]) == ["w4a16", "int_mm"]
    assert s[(7, 200)]["w4a16"] == [(1, 2.0 + 1 / 4096), (16, 2.0 + 16 / 4096), (4096, 3.0)]
    assert s[(7, 200)]["int_mm"] == [(4096, 1.25)]


def test_figure_has_one_panel_per_shape_with_baseline():
    import matplotlib.pyplot as plt

    fig = speedup_figure(_rows())
    try:
        axes = [ax for ax in fig.axes if ax.get_visible()]
        assert [ax.get_title() for ax in axes] == ["33×328", "7×200"]
        for ax in axes:
            assert ax.get_xscale() == "log"
            lines = {ln.get_label(): ln for ln in ax.get_lines()}
            assert set(lines) == {"fp16", "w4a16", "int_mm"}
            assert lines["fp16"].get_linestyle() == "--" and list(lines["fp16"].get_ydata()) == [1.0, 1.0]
            assert list(lines["w4a16"].get_xdata()) == [1, 16, 4096]
        assert "Test GPU" in fig._suptitle.get_text()
    finally:
        plt.close(fig)


def test_save_writes_png(tmp_path):
    out = tmp_path / "bench.png"
    save_speedup_plot(_rows(), out)
    assert out.read_bytes()[:8] == PNG


def test_nothing_to_plot_and_unwritable_path(tmp_path):
    only_baseline = [r for r in _rows() if r["method"] == "fp16"]
    with pytest.raises(QuantkitError, match="nothing to draw"):
        save_speedup_plot(only_baseline, tmp_path / "b.png")
    with pytest.raises(QuantkitError, match="cannot write plot"):
        save_speedup_plot(_rows(), tmp_path / "no" / "such" / "b.png")
