"""The K-pair rule (:func:`quantkit.runtime.kernels.configs.lqq_k_pair`) checked through int8_matmul: at every point
of the given shapes and token counts where it applies, int8_matmul with the rule on against the same call with it
off (what ran before), same GPU, same process, ABBA order, the median of ``--reps`` timings each; cuBLAS fp16 once
per point. The K-pair output is checked bit for bit against the unsplit Triton LiquidQuant kernel.

    python docs/bench/lqq_k_pair_check.py --out k_pair_check.json     # on an H100
"""

from __future__ import annotations

import argparse
import statistics

import torch

from quantkit.bench.command import parse_shapes
from quantkit.bench.problems import _packed, fp16_and_lqq_inputs
from quantkit.bench.sweep_log import log_row
from quantkit.bench.timing import time_abba
from quantkit.runtime.kernels import configs
from quantkit.runtime.kernels.configs import TileConfig, lqq_k_pair, lqq_wgmma_launch
from quantkit.runtime.kernels.int8_gemm import int8_matmul

SHAPES = "1024x4096,1024x5120,512x3584,2048x4096,1536x4096,4096x4096,4096x14336,6144x4096,4608x3584,5120x5120"
MS = ("128,129,160,192,224,256,257,288,320,384,448,512,513,576,640,700,769,832,896,960,1024,1025,1280,1536,"
      "1792,2048")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default=SHAPES)
    p.add_argument("--ms", default=MS)
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--out", default="lqq_k_pair_check.json")
    args = p.parse_args()
    rows = []
    for n, k in parse_shapes(args.shapes):
        ms = [m for m in (int(v) for v in args.ms.split(",")) if lqq_k_pair(m, n, k)]
        if not ms:
            continue
        t, meta = _packed("w4a8-lqq", torch.randn(n, k, device="cuda"))
        for m in ms:
            fp16, inputs = fp16_and_lqq_inputs(t, m, n, k)
            a0, s0, w0 = inputs[0]
            pair = int8_matmul(a0, s0, -1, "w4a8-lqq", w0, meta)
            same = torch.equal(pair, int8_matmul(a0, s0, -1, "w4a8-lqq", w0, meta,
                                                 config=TileConfig(64, 128, 1, 4, 3)))

            def call(on: bool):
                def fn(a, s, w):
                    configs.LQQ_K_PAIR = on
                    try:
                        return int8_matmul(a, s, -1, "w4a8-lqq", w, meta)
                    finally:
                        configs.LQQ_K_PAIR = True
                return fn

            calls = {"k_pair": call(True), "before": call(False)}
            times = time_abba(calls, inputs, args.reps)
            row = {"n": n, "k": k, "m": m, "before_launch": lqq_wgmma_launch(m, n, k), "fp16": fp16["ms"] * 1e3,
                   "check": "bit-identical" if same else "DIFFERS"}
            row.update({side: statistics.median(v) for side, v in times.items()})
            row["k_pair_vs_before"] = row["before"] / row["k_pair"]
            row["k_pair_vs_fp16"] = row["fp16"] / row["k_pair"]
            row["before_vs_fp16"] = row["fp16"] / row["before"]
            log_row(args.out, rows, row)
            del inputs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
