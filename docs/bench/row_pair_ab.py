"""Row-pair launches of the warp-specialized kernels (``row_pair``: the two warpgroups of a 128-row program as two
partitions that release each ring slot with their own arrival, so neither waits for the other's products) against
the same launch with its two warpgroups meeting at a barrier every tile, next to the launch rule's pick (what
int8_matmul / w4a16_matmul run) and cuBLAS fp16; same GPU, same process, ABBA order (median of ``--reps``).

``--kernel lqq``: LiquidQuant ``lqq_ws`` launches of 128 tokens plus each tail of ``--tails``; ``--kernel w4a16``:
``w4a16_ws``'s 128-token launches. Every row-pair output is checked bit for bit against the barrier form's.

    python docs/bench/row_pair_ab.py --kernel w4a16 --shapes 4096x4096,6144x4096 --ms 160,256,384,512   # on an H100
"""

from __future__ import annotations

import argparse
import statistics

import torch

from quantkit.bench.command import parse_shapes
from quantkit.bench.problems import _packed, fp16_and_lqq_inputs
from quantkit.bench.sweep_log import log_row
from quantkit.bench.timing import copies_to_defeat_l2, time_abba, time_rotating
from quantkit.runtime.kernels.int8_gemm import int8_matmul
from quantkit.runtime.kernels.lqq_ws import lqq_ws_matmul
from quantkit.runtime.kernels.w4a16 import w4a16_matmul
from quantkit.runtime.kernels.w4a16_ws import w4a16_ws_matmul


def _w4a16_inputs(t: dict, m: int, n: int, k: int) -> tuple[dict, list[tuple]]:
    """cuBLAS fp16's timing and rotating (x, weight copy) inputs for a W4A16 A/B."""
    copies = copies_to_defeat_l2(n * k // 2 + 2 * m * k + 2 * m * n)
    xs = [torch.randn(m, k, device="cuda", dtype=torch.float16) for _ in range(copies)]
    ws = [torch.randn(n, k, device="cuda", dtype=torch.float16) for _ in range(min(copies, 4))]
    fp16 = time_rotating(lambda x, w: torch.nn.functional.linear(x, w), [(x, ws[i % len(ws)]) for i, x in
                                                                          enumerate(xs)])
    return fp16, [(x, {key: v.clone() for key, v in t.items()}) for x in xs]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kernel", choices=("lqq", "w4a16"), default="lqq")
    p.add_argument("--shapes", default="4096x4096,6144x4096,14336x4096,4096x14336")
    p.add_argument("--ms", default="256,320,384,512,769,1024")
    p.add_argument("--tails", default="0,64", help="lqq: tail tokens of the 128-token launches to time")
    p.add_argument("--stages", type=int, default=3)
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--out", default="row_pair_ab.json")
    args = p.parse_args()
    rows = []
    for n, k in parse_shapes(args.shapes):
        t, meta = _packed("w4a8-lqq" if args.kernel == "lqq" else "w4a16", torch.randn(n, k, device="cuda"))
        for m in [int(v) for v in args.ms.split(",")]:
            if args.kernel == "lqq":
                fp16, inputs = fp16_and_lqq_inputs(t, m, n, k)
                calls = {"rule": lambda a, s, w: int8_matmul(a, s, -1, "w4a8-lqq", w, meta)}
                for tail in (int(v) for v in args.tails.split(",")):
                    for pair in (False, True):
                        calls[f"{'pair' if pair else 'barrier'}_t{tail}"] = (
                            lambda tl, rp: lambda a, s, w: lqq_ws_matmul(a, s, w, meta, 128, args.stages, tl, 2, 1,
                                                                         row_pair=rp))(tail, pair)
            else:
                fp16, inputs = _w4a16_inputs(t, m, n, k)
                calls = {"rule": lambda x, w: w4a16_matmul(x, w, meta)}
                for pair in (False, True):
                    calls["pair" if pair else "barrier"] = (
                        lambda rp: lambda x, w: w4a16_ws_matmul(x, w, meta, args.stages, 2, row_pair=rp))(pair)
            checks = {}
            for name in [c for c in calls if c.startswith("pair")]:
                ref = calls[name.replace("pair", "barrier")](*inputs[0])
                checks[name] = all(torch.equal(calls[name](*inputs[0]), ref) for _ in range(3))
            times = time_abba(calls, inputs, args.reps)
            row = {"kernel": args.kernel, "n": n, "k": k, "m": m, "fp16": fp16["ms"] * 1e3,
                   "pair_equals_barrier": checks}
            row.update({name: statistics.median(v) for name, v in times.items()})
            for name in [c for c in calls if c.startswith("pair")]:
                row[name + "_vs_barrier"] = row[name.replace("pair", "barrier")] / row[name]
                row[name + "_vs_rule"] = row["rule"] / row[name]
            row["rule_vs_fp16"] = row["fp16"] / row["rule"]
            log_row(args.out, rows, row)
            del inputs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
