"""Stream-K LiquidQuant launches (:mod:`quantkit.runtime.kernels.lqq_stream_k`) against what int8_matmul runs now
(the rule's launch: K-pair, cluster, or a Gluon tile) and cuBLAS fp16, on layers of few output tiles: same GPU,
same process, ABBA order, the median of ``--reps`` timings each. Every stream-K output at every ``--programs`` count
is checked bit for bit against the unsplit Triton LiquidQuant kernel first.

    python docs/bench/lqq_stream_k_ab.py --out stream_k_ab.json     # on an H100
"""

from __future__ import annotations

import argparse
import statistics

import torch

from quantkit.bench.command import parse_shapes
from quantkit.bench.problems import _packed, fp16_and_lqq_inputs
from quantkit.bench.sweep_log import log_row
from quantkit.bench.timing import time_abba
from quantkit.runtime.kernels.configs import TileConfig, lqq_cluster_launch, lqq_k_pair, lqq_wgmma_launch
from quantkit.runtime.kernels.int8_gemm import int8_matmul
from quantkit.runtime.kernels.lqq_stream_k import lqq_stream_k_matmul, stream_k_plan
from quantkit.runtime.kernels.lqq_ws import lqq_ws_matmul

SHAPES = "1024x4096,1536x4096,2048x4096,1024x5120,512x3584,4096x4096"
MS = "129,192,256,257,288,320,384,448,512,513,576,640,700,769,896,1024,1280"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default=SHAPES)
    p.add_argument("--ms", default=MS)
    p.add_argument("--programs", default="132", help="stream-K program counts to time (comma-separated; 0: one a "
                   "tile, no tile cut)")
    p.add_argument("--max-tiles", type=int, default=132, help="skip points with more 64x128 tiles than this")
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--out", default="lqq_stream_k_ab.json")
    args = p.parse_args()
    asked = [int(v) for v in args.programs.split(",")]
    rows = []
    for n, k in parse_shapes(args.shapes):
        t, meta = _packed("w4a8-lqq", torch.randn(n, k, device="cuda"))
        for m in (int(v) for v in args.ms.split(",")):
            tiles = stream_k_plan(m, n, k, 1)[0]
            if tiles > args.max_tiles:
                continue
            programs = list(dict.fromkeys(v or tiles for v in asked))
            fp16, inputs = fp16_and_lqq_inputs(t, m, n, k)
            a0, s0, w0 = inputs[0]
            tri = int8_matmul(a0, s0, -1, "w4a8-lqq", w0, meta, config=TileConfig(64, 128, 1, 4, 3))
            checks = {}
            for pr in programs:
                got = [lqq_stream_k_matmul(a0, s0, w0, meta, pr) for _ in range(3)]
                checks[pr] = all(torch.equal(g, tri) for g in got)
            calls = {"rule": lambda a, s, w: int8_matmul(a, s, -1, "w4a8-lqq", w, meta),
                     "k_pair": lambda a, s, w: lqq_ws_matmul(a, s, w, meta, 128, 4, k_pair=True)}
            for pr in programs:
                calls[f"sk{pr}"] = lambda a, s, w, pr=pr: lqq_stream_k_matmul(a, s, w, meta, pr)
            times = time_abba(calls, inputs, args.reps)
            row = {"n": n, "k": k, "m": m, "tiles": tiles, "fp16": fp16["ms"] * 1e3,
                   "rule_launch": ("cluster" if lqq_cluster_launch(m, n, k) else "k_pair" if lqq_k_pair(m, n, k)
                                   else str(lqq_wgmma_launch(m, n, k))),
                   "check": "bit-identical" if all(checks.values()) else f"DIFFERS {checks}"}
            row.update({side: statistics.median(v) for side, v in times.items()})
            row["k_pair_vs_fp16"] = row["fp16"] / row["k_pair"]
            for pr in programs:
                row[f"sk{pr}_vs_rule"] = row["rule"] / row[f"sk{pr}"]
                row[f"sk{pr}_vs_fp16"] = row["fp16"] / row[f"sk{pr}"]
            row["rule_vs_fp16"] = row["fp16"] / row["rule"]
            log_row(args.out, rows, row)
            del inputs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
