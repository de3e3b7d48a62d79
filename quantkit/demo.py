"""``quantkit demo``: the main jobs on the embedded reference model, end to end, on whatever machine this is.

1. FP perplexity of ``builtin:reference`` on the shipped corpus' held-out test split.
2. The quantizers side by side (fake-quant): RTN / GPTQ / AWQ W4A16, MixLLM W4A8 (GPTQ + clipping), LiquidQuant
   W4A8, W8A8.
3. MixLLM's global salience search: a precision plan with 10 % of weight elements at 8 bits (W4.4A8, p10),
   evaluated with the same W4A8 recipe as p0.

The default protocol is sized to finish in under two minutes on two CPU cores (``docs/BENCHMARKS.md``, "First
run"); ``full=True`` runs the protocol of the accuracy tables in BENCHMARKS (more windows, and p20).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from quantkit.ui import info, out_console, transient_progress

MODEL = "builtin:reference"
REFERENCE_DOMAIN = "kjv"  # the embedded model was trained on the KJV only: it calibrates on its own domain


@dataclass(frozen=True)
class DemoRow:
    """One configuration of the demo: its label, recipe, and the plan's target bits (None: no plan)."""

    label: str
    recipe: str
    target_bits: float | None = None


QUICK = [
    DemoRow("RTN W4A16 g128", "rtn-w4a16-g128"),
    DemoRow("GPTQ W4A16 g128", "gptq-w4a16-g128"),
    DemoRow("AWQ W4A16 g128", "awq-w4a16-g128"),
    DemoRow("MixLLM W4A8 (p0)", "mixllm-w4a8"),
    DemoRow("MixLLM W4.4A8 (p10)", "mixllm-w4a8", 4.4),
    DemoRow("LiquidQuant W4A8", "lqq-w4a8"),
    DemoRow("W8A8 g128", "w8a8"),
]
FULL = QUICK[:5] + [DemoRow("MixLLM W4.8A8 (p20)", "mixllm-w4a8", 4.8)] + QUICK[5:]


@dataclass(frozen=True)
class Protocol:
    """How much data the demo reads: test windows per evaluation and calibration windows per calibrated step."""

    windows: int | None
    calib_samples: int
    rows: tuple[DemoRow, ...]


QUICK_PROTOCOL = Protocol(windows=16, calib_samples=8, rows=tuple(QUICK))
FULL_PROTOCOL = Protocol(windows=40, calib_samples=32, rows=tuple(FULL))


def run_demo(full: bool = False, device: str = "auto", max_windows: int | None = None,
             calib_samples: int | None = None, configs: list[DemoRow] | None = None) -> list[dict]:
    """Evaluate the reference model in FP and under each configuration, printing one line per finished
    configuration and a table at the end; returns the result rows (FP first). ``max_windows``,
    ``calib_samples`` and ``configs`` override the protocol (quick, or ``full``)."""
    from quantkit.eval.job import DTYPE_BITS, dtype_label, evaluate_ppl
    from quantkit.quant.recipe import load_recipe
    from quantkit.search.command import run_search

    proto = FULL_PROTOCOL if full else QUICK_PROTOCOL
    windows = max_windows if max_windows is not None else proto.windows
    calib = calib_samples if calib_samples is not None else proto.calib_samples
    rows_to_run = list(configs) if configs is not None else list(proto.rows)
    info(f"quantkit demo — {MODEL}: a 7.6 M-parameter Llama (GQA) trained on the shipped KJV corpus; "
         f"perplexity on its held-out test split ({_count(windows, 'window')} of 1024 tokens), "
         f"{_count(calib, 'calibration window')} for GPTQ, AWQ and the search"
         f"{'' if full else '; --full for the BENCHMARKS protocol'}")
    started = time.monotonic()
    with transient_progress():
        t0 = time.monotonic()
        fp = evaluate_ppl(MODEL, "kjv", None, windows, device)
        rows = [dict(fp, config=f"FP ({dtype_label(fp['dtype'])})", avg_bits=float(DTYPE_BITS[fp["dtype"]]),
                     seconds=time.monotonic() - t0)]
        _done(rows[-1], rows[0]["ppl"])
        with tempfile.TemporaryDirectory(prefix="quantkit-demo-") as tmp:
            for row in rows_to_run:
                t0 = time.monotonic()
                plan = None
                if row.target_bits is not None:
                    plan = str(Path(tmp) / f"plan-{row.target_bits}.json")
                    run_search(MODEL, plan, row.recipe, bits="4,8", target_bits=row.target_bits, samples=calib,
                               dataset=REFERENCE_DOMAIN, device=device)
                calibrated = load_recipe(row.recipe).uses_calibration
                r = evaluate_ppl(MODEL, "kjv", None, windows, device, recipe=row.recipe, plan=plan,
                                 baseline=False, calib_samples=calib if calibrated else None,
                                 calib_dataset=REFERENCE_DOMAIN if calibrated else None)
                rows.append(dict(r, config=row.label, seconds=time.monotonic() - t0))
                _done(rows[-1], rows[0]["ppl"])
    out_console.print(_table(rows))
    out_console.print(_next_step(rows, time.monotonic() - started), highlight=False, soft_wrap=True)
    return rows


def _count(n: int | None, noun: str) -> str:
    return f"all {noun}s" if n is None else f"{n} {noun}{'' if n == 1 else 's'}"


def _done(row: dict, fp_ppl: float) -> None:
    delta = "" if row["config"].startswith("FP") else f"  ({row['ppl'] - fp_ppl:+.3f})"
    info(f"  done  {row['config']:<22} ppl {row['ppl']:.3f}{delta}  {row['seconds']:.1f} s")


def _table(rows: list[dict]) -> Table:
    base = rows[0]["ppl"]
    t = Table(title=f"quantkit demo — {MODEL}, perplexity on kjv test ({rows[0]['windows']} × {rows[0]['seqlen']} "
                    "tokens)")
    for col in ("config", "avg weight bits", "ppl", "Δ vs FP", "Δ %", "time"):
        t.add_column(col, justify="left" if col == "config" else "right")
    for r in rows:
        t.add_row(r["config"], f"{r['avg_bits']:.2f}", f"{r['ppl']:.3f}", f"{r['ppl'] - base:+.3f}",
                  f"{100 * (r['ppl'] / base - 1):+.2f}", f"{r['seconds']:.1f} s")
    return t


def _next_step(rows: list[dict], seconds: float) -> str:
    """One suggestion of what to try next: the configuration of lowest ppl under 8 bits, on the user's model."""
    four = [r for r in rows[1:] if r["avg_bits"] < 8]
    best = min(four, key=lambda r: r["ppl"]) if four else None
    recipe = best.get("recipe") if best else "mixllm-w4a8"
    plan = best is not None and best.get("plan") is not None
    cmd = (f"quantkit search ./your-model --recipe {recipe} --target-bits 4.4 -o plan.json && "
           f"quantkit pack ./your-model --recipe {recipe} --plan plan.json --target sm90 -o your-model-q"
           if plan else f"quantkit pack ./your-model --recipe {recipe} --target sm90 -o your-model-q")
    label = best["config"] if best else "MixLLM"
    return (f"finished in {seconds:.0f} s. Lowest ppl under 8 bits here: {label}. Next, on your own model:\n  {cmd}\n"
            f"  then: quantkit eval-ppl your-model-q   (quantkit recipes lists every recipe)")
