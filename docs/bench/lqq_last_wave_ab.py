"""LiquidQuant's 256-token launch with its last wave split along K (:func:`quantkit.runtime.kernels.configs.
lqq_last_wave_split`) against the same launch unsplit, on the same GPU in the same process: per point an untimed
warm-up of each, then ``--reps`` timings of each in ABBA order (:func:`quantkit.bench.timing.time_abba`), the bench's
timing (CUDA graphs, rotating inputs, quantized activations), cuBLAS fp16 once. The points: of each range of M in
513-4096 where the rule splits, its first and last token counts (``--per-range 3``: and its middle). Each split
output is checked: its unsplit row tiles bit for bit the unsplit launch's, the rest the same launch's at
``split_k=2``.

    python docs/bench/lqq_last_wave_ab.py --out last_wave_ab.json
"""

from __future__ import annotations

import argparse
import statistics

import torch

from quantkit.bench.command import parse_shapes
from quantkit.bench.problems import _packed, fp16_and_lqq_inputs
from quantkit.bench.sweep_log import log_row
from quantkit.bench.timing import time_abba
from quantkit.runtime.kernels.configs import lqq_last_wave_split, lqq_wgmma_launch, lqq_ws_launch
from quantkit.runtime.kernels.lqq_ws import lqq_ws_matmul

SHAPES = "14336x4096,6144x4096,28672x4096,4096x4096,8192x4096,11008x4096,13824x5120,18944x3584,5120x5120,4608x3584"


def split_points(n: int, k: int, per_range: int) -> list[int]:
    """Up to ``per_range`` token counts (first, last, middle) of each range of M in 513-4096 the rule splits."""
    ms = [m for m in range(513, 4097) if lqq_last_wave_split(m, n, k) is not None]
    ranges, picked = [], []
    for m in ms:
        if ranges and ranges[-1][-1] == m - 1:
            ranges[-1].append(m)
        else:
            ranges.append([m])
    for r in ranges:
        picked += list(dict.fromkeys((r[0], r[-1], r[len(r) // 2])))[:per_range]
    return picked


def main() -> None:
    """Time the unsplit and split launches per point, check the split's bits, write the rows."""
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default=SHAPES)
    p.add_argument("--per-range", type=int, default=2)
    p.add_argument("--reps", type=int, default=2, help="timings of each form per point, in ABBA order")
    p.add_argument("--out", default="last_wave_ab.json")
    args = p.parse_args()
    rows: list[dict] = []
    for n, k in parse_shapes(args.shapes):
        t, meta = _packed("w4a8-lqq", torch.randn(n, k, device="cuda"))
        for m in split_points(n, k, args.per_range):
            first = lqq_last_wave_split(m, n, k)
            ws = lqq_ws_launch(*lqq_wgmma_launch(m, n, k))
            fp16, inputs = fp16_and_lqq_inputs(t, m, n, k)
            calls = {"unsplit": lambda a, s, w: lqq_ws_matmul(a, s, w, meta, *ws),
                     "split": lambda a, s, w: lqq_ws_matmul(a, s, w, meta, *ws, split_from_row_tile=first)}
            got = calls["split"](*inputs[0])
            rows_first = 128 * first
            same = (torch.equal(got[:, :rows_first], calls["unsplit"](*inputs[0])[:, :rows_first])
                    and torch.equal(got[:, rows_first:],
                                    lqq_ws_matmul(*inputs[0][:3], meta, *ws[:5], 2)[:, rows_first:]))
            times = time_abba(calls, inputs, args.reps)
            row = {"n": n, "k": k, "m": m, "first_split_row_tile": first, "fp16": fp16["ms"] * 1e3,
                   "launch": ws, "bits_ok": same, **{f"{name}_us": v for name, v in times.items()},
                   **{name: statistics.median(v) for name, v in times.items()}}
            row["split_vs_unsplit"] = row["unsplit"] / row["split"]
            row["split_vs_fp16"], row["unsplit_vs_fp16"] = row["fp16"] / row["split"], row["fp16"] / row["unsplit"]
            log_row(args.out, rows, row, quiet=("unsplit_us", "split_us"))
            del inputs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
