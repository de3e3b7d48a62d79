"""Time quantkit's CPU calibration steps on the embedded model: GPTQ, AWQ (and any other recipe) at the recipe's
own calibration, and the MixLLM salience search, each followed by the perplexity it gives.

    python benchmarks/cpu_quantize.py gptq-w4a16-g128 awq-w4a16-g128 search:mixllm-w4a8 [--windows 90]

One JSON line per step: seconds of the quantization (or search) alone, the process's CPU seconds, torch's thread
count, and the ppl of the result on the kjv test split (90 windows of 1024 tokens by default; a search is scored
by the p10 plan under its recipe). Run it through ``python -m`` from another checkout (PYTHONPATH) to compare two
versions on the same machine.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import quantkit  # noqa: F401  (sets the OpenMP wait policy before torch starts)
import torch

from quantkit.data import joined_text
from quantkit.data.tokens import encode
from quantkit.eval import perplexity
from quantkit.model import load_model
from quantkit.quant.apply import quantize_model
from quantkit.quant.recipe import load_recipe

MODEL = "builtin:reference"


def _timed(fn):
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t, time.process_time() - c


def run(step: str, windows: int | None) -> dict:
    """Time one step (a recipe name, or ``search:RECIPE``) and score it; returns the JSON record."""
    loaded = load_model(MODEL, device="cpu")
    ids = encode(loaded.tokenizer, joined_text("kjv", "test"))
    record = {"step": step, "threads": torch.get_num_threads(), "quantkit": quantkit.__file__}
    if step.startswith("search:"):
        from quantkit.search.command import run_search
        from quantkit.search.plan_check import read_plan

        recipe = step.split(":", 1)[1]
        with tempfile.TemporaryDirectory() as tmp:
            plan_path = str(Path(tmp) / "plan.json")
            _, secs, cpu = _timed(lambda: run_search(MODEL, plan_path, recipe, bits="4,8", target_bits=4.4,
                                                     device="cpu"))
            plan = read_plan(plan_path)
        quantize_model(loaded.model, loaded.tokenizer, load_recipe(recipe), plan=plan, device="cpu")
    else:
        _, secs, cpu = _timed(lambda: quantize_model(loaded.model, loaded.tokenizer, load_recipe(step), device="cpu"))
    r = perplexity(loaded.model, ids, 1024, windows)
    record.update(seconds=round(secs, 2), cpu_seconds=round(cpu, 2), ppl=round(r.ppl, 4), windows=r.windows)
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("steps", nargs="+", help="recipe names, or search:RECIPE")
    ap.add_argument("--windows", type=int, default=None, help="test windows for the ppl (default: all 90)")
    args = ap.parse_args()
    for step in args.steps:
        print(json.dumps(run(step, args.windows)), flush=True)


if __name__ == "__main__":
    main()
