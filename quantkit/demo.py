"""``quantkit demo``: the main jobs on the embedded reference model, end to end, on whatever machine this is."""

from __future__ import annotations

from rich.table import Table

from quantkit.ui import out_console

MODEL = "builtin:reference"


def run_demo(max_windows: int | None = None, device: str = "auto") -> list[dict]:
    """Evaluate the reference model in FP and under each shipped recipe; prints a table, returns the rows."""
    from quantkit.cli import evaluate_ppl

    out_console.print(f"[bold]quantkit demo[/] — {MODEL}: 7.6 M-parameter Llama (GQA) trained on the shipped "
                      "KJV corpus; perplexity on its held-out test split")
    rows = [("FP", evaluate_ppl(MODEL, "kjv", None, max_windows, device))]
    t = Table(title="quantkit demo — perplexity on kjv test")
    for col in ("config", "windows × seqlen", "ppl", "Δ vs FP"):
        t.add_column(col, justify="left" if col == "config" else "right")
    base = rows[0][1]["ppl"]
    for label, r in rows:
        t.add_row(label, f"{r['windows']} × {r['seqlen']}", f"{r['ppl']:.3f}", f"{r['ppl'] - base:+.3f}")
    out_console.print(t)
    return [dict(r, config=label) for label, r in rows]
