"""The warp-specialized kernels' epilogue store through a layout of 16-byte stores along Y's rows
(:func:`quantkit.runtime.kernels.wgmma_common.store_rows_coalesced`, session 25) against the store straight from the
accumulator's layout (2-byte stores, :func:`.wgmma_common.store_rows`): one process per side, each kernel's store
set before anything compiles (``--variant new``: both kernels store coalesced; ``old``: neither), the rules'
launches of :mod:`.lqq_ws` and :mod:`.w4a16_ws` timed with the bench's timing (CUDA graphs, rotating inputs) at
points where they run, and a hash of each output (seeded data) so the two sides' bits can be compared
(``--compare old.json new.json``). Session 25's run, made before the seeding, has different data on each side: its
hashes differ for that reason; the GPU tests check the bits.

    python docs/bench/store_ab.py --variant old --out store_old.json
    python docs/bench/store_ab.py --variant new --out store_new.json
    python docs/bench/store_ab.py --compare store_old.json store_new.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math

import torch

from quantkit.bench.command import parse_shapes
from quantkit.bench.problems import _packed, fp16_and_lqq_inputs, fp16_and_w4a16_inputs
from quantkit.bench.sweep_log import log_row
from quantkit.bench.timing import time_rotating
from quantkit.runtime.kernels import lqq_ws, w4a16_ws
from quantkit.runtime.kernels.configs import lqq_wgmma_launch, lqq_ws_launch, w4a16_ws_warpgroups
from quantkit.runtime.kernels.wgmma_common import store_rows, store_rows_coalesced


def digest(t: torch.Tensor) -> str:
    """A hash of a tensor's bytes."""
    return hashlib.sha1(t.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def compare(old_path: str, new_path: str) -> None:
    """Print new / old time per point, whether the bits agree, and the geometric mean per kernel."""
    old = {(r["kernel"], r["n"], r["k"], r["m"]): r for r in json.load(open(old_path))["rows"]}
    ratios: dict[str, list[float]] = {}
    for r in json.load(open(new_path))["rows"]:
        o = old.get((r["kernel"], r["n"], r["k"], r["m"]))
        if o is None:
            continue
        ratios.setdefault(r["kernel"], []).append(o["us"] / r["us"])
        print(f"{r['kernel']} {r['n']}x{r['k']} M={r['m']}: {o['us']:.1f} -> {r['us']:.1f} us "
              f"({o['us'] / r['us']:.3f}x), bits {'equal' if o['sha1'] == r['sha1'] else 'DIFFER'}")
    for kernel, xs in ratios.items():
        print(f"{kernel}: geometric mean {math.exp(sum(map(math.log, xs)) / len(xs)):.3f}x over {len(xs)} points")


def main() -> None:
    """Time the rules' lqq_ws and w4a16_ws launches with the chosen store; write the rows (or compare two files)."""
    p = argparse.ArgumentParser()
    p.add_argument("--variant", choices=("old", "new"), default="new")
    p.add_argument("--shapes", default="14336x4096,4096x4096,6144x4096,28672x4096,4096x14336")
    p.add_argument("--lqq-ms", default="256,512,1024,2048,4096")
    p.add_argument("--w4a16-ms", default="96,128,256,384,512")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--out", default="store_ab.json")
    p.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"))
    args = p.parse_args()
    if args.compare:
        compare(*args.compare)
        return
    # before the first build: the JIT resolves globals then
    lqq_ws.store_rows_coalesced = store_rows_coalesced if args.variant == "new" else store_rows
    w4a16_ws.store_rows = store_rows_coalesced if args.variant == "new" else store_rows
    rows: list[dict] = []
    for n, k in parse_shapes(args.shapes):
        torch.manual_seed(n + k)  # the same data on both sides, so that their outputs' hashes compare
        t, meta = _packed("w4a8-lqq", torch.randn(n, k, device="cuda"))
        for m in [int(v) for v in args.lqq_ms.split(",")]:
            launch = lqq_wgmma_launch(m, n, k)
            ws = lqq_ws_launch(*launch) if launch else None
            if ws is None:
                continue
            _, inputs = fp16_and_lqq_inputs(t, m, n, k)
            call = lambda a, s, w: lqq_ws.lqq_ws_matmul(a, s, w, meta, *ws)  # noqa: E731
            row = {"kernel": "lqq_ws", "n": n, "k": k, "m": m, "launch": ws, "sha1": digest(call(*inputs[0])),
                   "us": time_rotating(call, inputs, reps=args.reps)["ms"] * 1e3}
            log_row(args.out, rows, row)
        t16, meta16 = _packed("w4a16", torch.randn(n, k, device="cuda"))
        for m in [int(v) for v in args.w4a16_ms.split(",")]:
            wg = w4a16_ws_warpgroups(m, n, k)
            if wg is None:
                continue
            _, inputs = fp16_and_w4a16_inputs(t16, m, n, k)
            call = lambda x, w: w4a16_ws.w4a16_ws_matmul(x, w, meta16, 3, wg)  # noqa: E731
            row = {"kernel": "w4a16_ws", "n": n, "k": k, "m": m, "launch": [3, wg], "sha1": digest(call(*inputs[0])),
                   "us": time_rotating(call, inputs, reps=args.reps)["ms"] * 1e3}
            log_row(args.out, rows, row)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
