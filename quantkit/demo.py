"""``quantkit demo``: the main jobs on the embedded reference model, end to end, on whatever machine this is.

1. FP perplexity of ``builtin:reference`` on the shipped corpus' held-out test split.
2. The quantizers side by side (fake-quant): RTN / GPTQ / AWQ W4A16, MixLLM W4A8 (GPTQ + clipping), W8A8.
3. MixLLM's global salience search: precision plans with 10% and 20% of weight elements at 8 bits (W4.4A8,
   W4.8A8), evaluated with the same W4A8 recipe.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from rich.table import Table

from quantkit.ui import out_console

MODEL = "builtin:reference"
CONFIGS = [  # (label, recipe, plan target bits)
    ("RTN W4A16 g128", "rtn-w4a16-g128", None),
    ("GPTQ W4A16 g128", "gptq-w4a16-g128", None),
    ("AWQ W4A16 g128", "awq-w4a16-g128", None),
    ("MixLLM W4A8 (p0)", "mixllm-w4a8", None),
    ("MixLLM W4.4A8 (p10)", "mixllm-w4a8", 4.4),
    ("MixLLM W4.8A8 (p20)", "mixllm-w4a8", 4.8),
    ("W8A8 g128", "w8a8", None),
]


def run_demo(max_windows: int | None = 40, device: str = "auto", calib_samples: int = 32,
             configs: list[tuple[str, str, float | None]] | None = None) -> list[dict]:
    """Evaluate the reference model in FP and under each configuration; prints a table, returns the rows."""
    from quantkit.cli import evaluate_ppl
    from quantkit.quant.recipe import load_recipe
    from quantkit.search.command import run_search

    out_console.print(f"[bold]quantkit demo[/] — {MODEL}: 7.6 M-parameter Llama (GQA) trained on the shipped "
                      f"KJV corpus; perplexity on its held-out test split ({max_windows or 'all'} windows), "
                      f"{calib_samples} calibration windows")
    fp = evaluate_ppl(MODEL, "kjv", None, max_windows, device)
    rows = [dict(fp, config=f"FP ({fp['dtype']})", avg_bits=16.0 if fp["dtype"] != "float32" else 32.0)]
    with tempfile.TemporaryDirectory(prefix="quantkit-demo-") as tmp:
        for label, recipe, target in configs or CONFIGS:
            plan = None
            if target is not None:
                plan = str(Path(tmp) / f"plan-{target}.json")
                out_console.print(f"search: {label} — global Fisher–Taylor salience, target {target} bits")
                run_search(MODEL, plan, recipe, bits="4,8", target_bits=target, samples=calib_samples,
                           device=device)
            out_console.print(f"quantize + eval: {label} ({recipe})")
            calibrated = load_recipe(recipe).uses_calibration  # RTN recipes refuse calibration options
            r = evaluate_ppl(MODEL, "kjv", None, max_windows, device, recipe=recipe, plan=plan, baseline=False,
                             calib_samples=calib_samples if calibrated else None)
            rows.append(dict(r, config=label))
    base = rows[0]["ppl"]
    t = Table(title=f"quantkit demo — {MODEL}, perplexity on kjv test")
    for col in ("config", "avg weight bits", "windows × seqlen", "ppl", "Δ vs FP"):
        t.add_column(col, justify="left" if col == "config" else "right")
    for r in rows:
        t.add_row(r["config"], f"{r['avg_bits']:.2f}", f"{r['windows']} × {r['seqlen']}", f"{r['ppl']:.3f}",
                  f"{r['ppl'] - base:+.3f}")
    out_console.print(t)
    return rows
