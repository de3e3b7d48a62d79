"""Halving the last wave of the 256-token LiquidQuant launches (session 26, configs.lqq_ws_halves): at every point of
the given shapes and token counts where the rule runs lqq_ws's 256-token launch and configs.lqq_ws_halves gives a
``halves_from``, that launch as it is against the same launch with the tiles from ``halves_from`` on run as two
128-token programs each — ABBA order (:func:`quantkit.bench.timing.time_abba`), the bench's timing, bits checked.

    python docs/bench/lqq_halves_ab.py --out halves_ab.json
"""

from __future__ import annotations

import argparse
import statistics

import torch

from quantkit.bench.problems import fp16_and_lqq_inputs, lqq_ws_points
from quantkit.bench.sweep_log import log_row
from quantkit.bench.timing import time_abba
from quantkit.runtime.kernels.configs import lqq_ws_halves
from quantkit.runtime.kernels.lqq_ws import lqq_ws_matmul

SHAPES = ("4096x4096,6144x4096,14336x4096,28672x4096,4096x14336,4608x3584,3584x3584,8192x4096,5120x13824,"
          "3584x18944,4096x11008,11008x4096,5120x5120,13824x5120,18944x3584")
MS = "1024,1280,1536,1792,2048,2560,3072,3584,4096"


def main() -> None:
    """Per point where the halves apply: whole tiles against halved ones (ABBA), bits checked; fp16 once."""
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default=SHAPES)
    p.add_argument("--ms", default=MS)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--out", default="halves_ab.json")
    args = p.parse_args()
    rows: list[dict] = []
    for n, k, m, t, meta, ws in lqq_ws_points(args.shapes, args.ms,
                                              lambda n, k, m, ws: lqq_ws_halves(m, n, k, ws) is not None):
        halves = lqq_ws_halves(m, n, k, ws)
        fp16, inputs = fp16_and_lqq_inputs(t, m, n, k)
        calls = {"whole": lambda a, s, w: lqq_ws_matmul(a, s, w, meta, *ws),
                 "halves": lambda a, s, w: lqq_ws_matmul(a, s, w, meta, *ws, halves_from=halves)}
        same = bool(torch.equal(calls["halves"](*inputs[0]), calls["whole"](*inputs[0])))
        times = time_abba(calls, inputs, args.reps)
        row = {"n": n, "k": k, "m": m, "launch": ws, "halves_from": halves, "fp16": fp16["ms"] * 1e3,
               "bits_equal": same, **{f"{name}_us": v for name, v in times.items()},
               **{name: statistics.median(v) for name, v in times.items()}}
        row["halves_vs_whole"] = row["whole"] / row["halves"]
        row["whole_vs_fp16"] = row["fp16"] / row["whole"]
        row["halves_vs_fp16"] = row["fp16"] / row["halves"]
        log_row(args.out, rows, row, quiet=("whole_us", "halves_us"))
        del inputs
        torch.cuda.empty_cache()
    ratios = [r["halves_vs_whole"] for r in rows]
    if ratios:
        print(f"halves vs whole: geometric mean {statistics.geometric_mean(ratios):.3f} over {len(ratios)} points, "
              f"{min(ratios):.3f}-{max(ratios):.3f}; bits equal at {sum(r['bits_equal'] for r in rows)}", flush=True)


if __name__ == "__main__":
    main()
