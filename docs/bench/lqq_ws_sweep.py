"""LiquidQuant W4A8 on the warp-specialized Gluon kernel (quantkit/runtime/kernels/lqq_ws.py) over its K split, next
to cuBLAS fp16 and the launch rule's own pick (what int8_matmul runs), on small layers and
small M (session 18: the 1024×4096 k/v projection, where every launch timed before took >= 12 µs).

    python docs/bench/lqq_ws_sweep.py --shapes 1024x4096 --ms 80,128,256 --splits 1,2,4,8 --out kv.json

Every launch is first checked bit for bit against the Triton LiquidQuant kernel at the same K split (one call, at
the first M of each shape). Columns ``ws_<128[+tail]>_s<split>``; the rule's pick is ``rule``. (Session 18's first
run, ``kv_ws_sweep_a_h100.json``, also timed each launch with two weight tiles' words in flight, ``_a2``, an option
since removed: at each token count's fastest launch it ran 0.976-1.007×.) Columns name the split that ran
(:func:`quantkit.runtime.kernels.launch.split_plan` may lower the one asked for; a split that lowers to one already
timed is not timed again).
"""

from __future__ import annotations

import argparse
import json

import torch

from quantkit.bench.command import parse_shapes
from quantkit.bench.problems import _packed, fp16_and_lqq_inputs
from quantkit.bench.timing import time_rotating
from quantkit.bench.sweep_log import print_checks, record_check, save_sweep
from quantkit.runtime.kernels.configs import TileConfig, lqq_wgmma_launch, lqq_ws_launch
from quantkit.runtime.kernels.int8_gemm import int8_matmul
from quantkit.runtime.kernels.launch import split_plan
from quantkit.runtime.kernels.lqq_ws import lqq_ws_matmul


def launches(tails, splits, k: int, min_tiles: int) -> list[tuple]:
    """(tail, stages, warpgroups, per_sm, split) of every lqq_ws launch to time: the per-SM budget and stages
    of configs.lqq_ws_launch for a one-warpgroup 128-token tile with that tail at three stages."""
    out = []
    for tail in tails:
        bm, stages, tl, wg, per_sm, _ = lqq_ws_launch((128, 3, 1, tail), 1)
        for asked in splits:
            split = split_plan(k // 256, asked)[1]
            if (split > 1 and split_plan(k // 256, split)[0] < min_tiles) or (tl, stages, wg, per_sm, split) in out:
                continue
            out.append((tl, stages, wg, per_sm, split))
    return out


def name(tail: int, split: int) -> str:
    return f"ws_128{'+' + str(tail) if tail else ''}_s{split}"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="1024x4096")
    p.add_argument("--ms", default="80,128,192,256,320,384,448,512,640,769,896,1024")
    p.add_argument("--tails", default="0,32,64")
    p.add_argument("--splits", default="1,2,4")
    p.add_argument("--min-split-tiles", type=int, default=2, help="skip splits leaving fewer 256-column tiles")
    p.add_argument("--out", default="lqq_ws_sweep.json")
    args = p.parse_args()
    ints = lambda s: [int(v) for v in s.split(",")]  # noqa: E731
    rows, checks = [], []
    for n, k in parse_shapes(args.shapes):
        t, meta = _packed("w4a8-lqq", torch.randn(n, k, device="cuda"))
        todo = launches(ints(args.tails), ints(args.splits), k, args.min_split_tiles)
        for j, m in enumerate(ints(args.ms)):
            fp16, inputs = fp16_and_lqq_inputs(t, m, n, k)
            row = {"n": n, "k": k, "m": m, "fp16": fp16["ms"] * 1e3}
            launch = lqq_wgmma_launch(m, n, k)
            row["rule_launch"] = launch
            row["rule"] = time_rotating(lambda a, s, w: int8_matmul(a, s, -1, "w4a8-lqq", w, meta), inputs)["ms"] * 1e3
            for tail, stages, wg, per_sm, split in todo:
                fn = (lambda a, s, w, c=(tail, stages, wg, per_sm, split):
                      lqq_ws_matmul(a, s, w, meta, 128, c[1], c[0], c[2], c[3], c[4]))
                if j == 0:
                    a, s, w = inputs[0]
                    tri = int8_matmul(a, s, -1, "w4a8-lqq", w, meta, config=TileConfig(64, 128, split, 4, 3))
                    record_check(checks, {"n": n, "k": k, "m": m, "launch": name(tail, split)}, fn(a, s, w), tri)
                row[name(tail, split)] = time_rotating(fn, inputs)["ms"] * 1e3
            timed = {kk: v for kk, v in row.items() if kk.startswith("ws_")}
            if timed:
                best = min(timed, key=timed.get)
                row["best"], row["best_vs_fp16"] = best, row["fp16"] / timed[best]
            row["rule_vs_fp16"] = row["fp16"] / row["rule"]
            print(json.dumps({kk: (round(v, 2) if isinstance(v, float) else v) for kk, v in row.items()}), flush=True)
            rows.append(row)
            save_sweep(args.out, rows, checks)  # after every row, so a cut-off run keeps what it measured
    print_checks(checks)


if __name__ == "__main__":
    main()
