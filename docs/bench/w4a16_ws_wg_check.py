"""W4A16's warp-specialized kernel on one warpgroup (64-row programs) against two (128-row programs, the warpgroups
partitions of their own since session 22), next to what w4a16_matmul runs (``rule``: the pick of
:func:`quantkit.runtime.kernels.configs.w4a16_ws_warpgroups`) and cuBLAS fp16; same GPU, same process, ABBA order
(median of ``--reps``). The two launches' outputs are compared bit for bit (the same rows, tiles and sums).

    python docs/bench/w4a16_ws_wg_check.py --shapes 6144x4096,14336x4096,28672x4096 --ms 256,320,384,448,512  # H100
"""

from __future__ import annotations

import argparse
import statistics

import torch

from quantkit.bench.command import parse_shapes
from quantkit.bench.problems import _packed, fp16_and_w4a16_inputs
from quantkit.bench.sweep_log import log_row
from quantkit.bench.timing import time_abba
from quantkit.runtime.kernels.configs import w4a16_ws_warpgroups
from quantkit.runtime.kernels.w4a16 import w4a16_matmul
from quantkit.runtime.kernels.w4a16_ws import w4a16_ws_matmul


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="6144x4096,14336x4096,28672x4096,4096x4096,4096x14336")
    p.add_argument("--ms", default="160,256,320,384,448,512")
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--out", default="w4a16_ws_wg_check.json")
    args = p.parse_args()
    rows = []
    for n, k in parse_shapes(args.shapes):
        t, meta = _packed("w4a16", torch.randn(n, k, device="cuda"))
        for m in [int(v) for v in args.ms.split(",")]:
            fp16, inputs = fp16_and_w4a16_inputs(t, m, n, k)
            calls = {"rule": lambda x, w: w4a16_matmul(x, w, meta),
                     "one": lambda x, w: w4a16_ws_matmul(x, w, meta, 3, 1),
                     "two": lambda x, w: w4a16_ws_matmul(x, w, meta, 3, 2)}
            same = torch.equal(calls["one"](*inputs[0]), calls["two"](*inputs[0]))
            times = time_abba(calls, inputs, args.reps)
            row = {"n": n, "k": k, "m": m, "rule_warpgroups": w4a16_ws_warpgroups(m, n, k), "fp16": fp16["ms"] * 1e3,
                   "one_equals_two": same}
            row.update({name: statistics.median(v) for name, v in times.items()})
            row["two_vs_one"] = row["one"] / row["two"]
            row["rule_vs_fp16"] = row["fp16"] / row["rule"]
            log_row(args.out, rows, row)
            del inputs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
