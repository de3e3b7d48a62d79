"""Plain-text tables of benchmark rows (what docs/BENCHMARKS.md pastes)."""

from __future__ import annotations

COLUMNS = (("method", "{}"), ("m", "{}"), ("n", "{}"), ("k", "{}"), ("ms", "{:.4f}"), ("tflops", "{:.1f}"),
           ("gbps", "{:.0f}"), ("pct_hbm", "{:.0f}"), ("pct_peak", "{:.0f}"), ("speedup_vs_fp16", "{:.2f}"))


def format_table(rows: list[dict]) -> str:
    """A fixed-width table, one line per row; skipped rows show their reason."""
    head = " | ".join(name for name, _ in COLUMNS)
    lines = [head, "-" * len(head)]
    for r in rows:
        if "skipped" in r:
            lines.append(f"{r['method']} | {r['m']} | {r['n']} | {r['k']} | skipped: {r['skipped']}")
            continue
        cells = []
        for name, fmt in COLUMNS:
            v = r.get(name)
            cells.append("-" if v is None else fmt.format(v))
        lines.append(" | ".join(cells))
    return "\n".join(lines)
