"""``python -m quantkit.bench.sweep``: time candidate tile configs of every quantkit kernel method over a grid
of token counts on one GPU, and save all timings plus the fastest config per (method, M) as JSON — the measured
basis of :func:`quantkit.runtime.kernels.configs.gemm_config`.

Candidates are grouped by token count (a decode GEMV wants many small programs and split-K, a prefill GEMM big
tiles); each config compiles once per method and is reused across sizes.
"""

from __future__ import annotations

import argparse
import json
import time

from quantkit.bench.command import parse_shapes
from quantkit.bench.report import format_table
from quantkit.bench.runner import run_bench, tune
from quantkit.runtime.kernels.configs import TileConfig

SMALL = [TileConfig(64, 16, s, 4, 4) for s in (1, 2, 4)] + [TileConfig(128, 16, s, 4, 4) for s in (1, 2)] + \
        [TileConfig(32, 16, 2, 4, 4), TileConfig(64, 16, 2, 4, 6)]
MEDIUM = [TileConfig(64, 64, 1, 4, 3), TileConfig(128, 64, 1, 8, 3), TileConfig(64, 64, 2, 4, 3),
          TileConfig(128, 32, 1, 4, 4)]
LARGE = [TileConfig(128, 128, 1, 8, 3), TileConfig(128, 64, 1, 8, 3), TileConfig(64, 128, 1, 4, 3),
         TileConfig(64, 256, 1, 8, 2)]


def candidates_for(m: int) -> list[TileConfig]:
    """The candidate configs swept at token count ``m``."""
    if m <= 16:
        return SMALL
    if m <= 64:
        return MEDIUM
    return LARGE


def main(argv: list[str] | None = None) -> int:
    """Sweep and write ``--out`` (rewritten after every problem, so a run cut short keeps what it measured)."""
    p = argparse.ArgumentParser(prog="python -m quantkit.bench.sweep", description=__doc__.splitlines()[0])
    p.add_argument("--methods", default="w4a16,w4a8-lqq,w4a8,w8a8,mixed")
    p.add_argument("--ms", default="1,16,64,256,1024,4096")
    p.add_argument("--shapes", default="14336x4096", help="NxK, comma-separated")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", required=True)
    p.add_argument("--bench", action="store_true",
                   help="after the sweep, run_bench the same shapes with the fastest configs found")
    p.add_argument("--bench-methods", default="w4a16,int_mm,w8a8,w4a8,w4a8-lqq,mixed,w4a8+aq,w4a8-lqq+aq,mixed+aq")
    args = p.parse_args(argv)
    shapes = parse_shapes(args.shapes)
    results = {"shapes": shapes, "runs": [], "best": {}}
    for method in args.methods.split(","):
        for n, k in shapes:
            for m in (int(v) for v in args.ms.split(",")):
                t0 = time.time()
                rows = tune(method, m, n, k, candidates_for(m), reps=args.reps)
                results["runs"].append({"method": method, "m": m, "n": n, "k": k, "rows": rows})
                best = rows[0]
                results["best"][f"{method}:{m}:{n}:{k}"] = best
                print(f"{method:10s} {n}x{k} M={m:5d} best {best.get('ms', float('nan')) * 1e3:.1f} us "
                      f"{best['config']} ({time.time() - t0:.0f}s)", flush=True)
                with open(args.out, "w") as f:
                    json.dump(results, f, indent=1)
    if args.bench:
        ms = [int(v) for v in args.ms.split(",")]
        configs = {}
        for key, row in results["best"].items():
            method, m, n, k = key.split(":")
            if "ms" in row:
                for variant in (method, method + "+aq"):
                    configs[(variant, int(m), int(n), int(k))] = TileConfig(**row["config"])
        rows = run_bench(shapes, ms, args.bench_methods.split(","), configs=configs)
        results["bench"] = rows
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
        print(format_table(rows), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
