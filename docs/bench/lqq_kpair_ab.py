"""K-pair launches of the warp-specialized LiquidQuant kernel (``k_pair``: two consumer warpgroups on the same
64 weight rows, each multiplying every other 256-column tile, their int32 sums added in shared memory) against
the kernel's one-consumer launches, cuBLAS fp16 and the launch rule's pick (what int8_matmul runs), same GPU, same
process. (Since the rule takes K-pair launches, ``rule`` is one itself where configs.lqq_k_pair holds; the session-22
logs, kpair_ab_*.json, were taken before.)

Per point every launch is checked bit for bit (three calls) against the Triton LiquidQuant kernel at the same K
split, warmed up, then timed ``--reps`` times per launch in ABBA order (median). Launches are
``tail:wg:stages:per_sm:split:pair`` (pair 1: a K-pair launch).

    python docs/bench/lqq_kpair_ab.py --shapes 1024x4096 --ms 513,769,1024 --out kpair_ab.json   # on an H100
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from quantkit.bench.command import parse_shapes
from quantkit.bench.problems import _packed, fp16_and_lqq_inputs
from quantkit.bench.sweep_log import log_row
from quantkit.bench.timing import time_abba
from quantkit.runtime.kernels.configs import TileConfig, lqq_wgmma_launch
from quantkit.runtime.kernels.int8_gemm import int8_matmul
from quantkit.runtime.kernels.launch import split_plan
from quantkit.runtime.kernels.lqq_ws import lqq_ws_matmul

DEFAULT_LAUNCHES = "0:1:3:2:1:0;0:1:2:2:1:0;0:1:4:1:1:1;0:1:2:1:1:1;0:1:4:1:2:1;0:1:2:1:2:1"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="1024x4096,4096x4096,6144x4096,14336x4096,4096x14336")
    p.add_argument("--ms", default="513,769,1024,2048,4096")
    p.add_argument("--launches", default=DEFAULT_LAUNCHES, help="'tail:wg:stages:per_sm:split:pair;...'")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--out", default="lqq_kpair_ab.json")
    args = p.parse_args()
    launches = [tuple(int(v) for v in s.split(":")) for s in args.launches.split(";") if s]
    rows = []
    for n, k in parse_shapes(args.shapes):
        t, meta = _packed("w4a8-lqq", torch.randn(n, k, device="cuda"))
        for m in [int(v) for v in args.ms.split(",")]:
            fp16, inputs = fp16_and_lqq_inputs(t, m, n, k)
            calls = {"rule": lambda a, s, w: int8_matmul(a, s, -1, "w4a8-lqq", w, meta)}
            checks, triton = {}, {}
            a0, s0, w0 = inputs[0]
            for tail, wg, stages, per_sm, split, pair in launches:
                split = split_plan(k // 256, split)[1]
                if split not in triton:
                    triton[split] = int8_matmul(a0, s0, -1, "w4a8-lqq", w0, meta,
                                                config=TileConfig(64, 128, split, 4, 3))
                name = f"{'pair' if pair else 'ws'}_{tail}:{wg}:{stages}:{per_sm}:{split}"
                fn = (lambda c: lambda a, s, w: lqq_ws_matmul(a, s, w, meta, 128, c[2], c[0], c[1], c[3], c[4],
                                                              k_pair=bool(c[5])))((tail, wg, stages, per_sm, split,
                                                                                   pair))
                try:
                    same = all(torch.equal(fn(a0, s0, w0), triton[split]) for _ in range(3))
                except Exception as e:  # noqa: BLE001 — a launch that does not build is reported, not fatal
                    last = str(e).strip().splitlines()[-1][:160] if str(e).strip() else ""
                    checks[name] = f"{type(e).__name__}: {last}"
                    continue
                checks[name] = "bit-identical" if same else "DIFFERS"
                calls[name] = fn
            times = time_abba(calls, inputs, args.reps)
            row = {"n": n, "k": k, "m": m, "rule_launch": lqq_wgmma_launch(m, n, k), "fp16": fp16["ms"] * 1e3,
                   "check": checks}
            row.update({side: statistics.median(v) for side, v in times.items()})
            timed = {kk: row[kk] for kk in calls if kk != "rule"}
            if timed:
                best = min(timed, key=timed.get)
                row["best"], row["best_vs_fp16"], row["best_vs_rule"] = best, row["fp16"] / timed[best], \
                    row["rule"] / timed[best]
            row["rule_vs_fp16"] = row["fp16"] / row["rule"]
            log_row(args.out, rows, row, quiet=("check",))
            bad = {kk: v for kk, v in checks.items() if v != "bit-identical"}
            if bad:
                print("  checks:", json.dumps(bad), flush=True)
            del inputs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
