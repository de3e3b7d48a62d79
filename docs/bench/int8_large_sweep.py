"""Tile shapes of the Triton int8 kernels at prefill sizes (M >= 64) beyond the default sweep's candidates:
which BN × BM / warps / stages bring LiquidQuant W4A8 and the MixLLM kernels closest to (or past) cuBLAS fp16.
The measured basis of the large-M rows of quantkit.runtime.kernels.configs.TABLE (docs/BENCHMARKS.md).

    python docs/bench/int8_large_sweep.py --out int8_large.json
"""

from __future__ import annotations

import argparse
import json

from quantkit.bench.command import parse_shapes
from quantkit.bench.runner import time_problem, tune
from quantkit.runtime.kernels.configs import TileConfig

CANDIDATES = [TileConfig(128, 128, 1, 8, 3), TileConfig(128, 128, 1, 8, 4), TileConfig(128, 128, 1, 4, 3),
              TileConfig(128, 256, 1, 8, 3), TileConfig(256, 128, 1, 8, 3), TileConfig(128, 64, 1, 4, 4),
              TileConfig(64, 128, 1, 4, 4), TileConfig(64, 256, 1, 8, 3), TileConfig(256, 64, 1, 8, 3),
              TileConfig(128, 256, 1, 8, 2)]
# mid-size M (64–1024) on narrow layers: few output tiles, so split K or shrink tiles to occupy every SM
MID = [TileConfig(128, 64, 1, 4, 4), TileConfig(128, 64, 2, 4, 4), TileConfig(64, 64, 1, 4, 4),
       TileConfig(64, 64, 2, 4, 4), TileConfig(64, 64, 4, 4, 4), TileConfig(128, 32, 2, 4, 4),
       TileConfig(64, 128, 1, 4, 4), TileConfig(128, 128, 1, 8, 3), TileConfig(256, 128, 1, 8, 3),
       TileConfig(128, 128, 2, 8, 3), TileConfig(256, 64, 1, 8, 3)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--methods", default="w4a8-lqq,w8a8,w4a8")
    p.add_argument("--shapes", default="14336x4096,4096x4096")
    p.add_argument("--ms", default="64,256,1024,4096")
    p.add_argument("--mid", action="store_true", help="the mid-M candidates (split-K, small tiles)")
    a = p.parse_args()
    candidates = MID if a.mid else CANDIDATES
    res = []
    for n, k in parse_shapes(a.shapes):
        for m in (int(v) for v in a.ms.split(",")):
            fp16 = time_problem("fp16", m, n, k)[0]["ms"]
            for method in a.methods.split(","):
                rows = tune(method, m, n, k, candidates, reps=20)
                best = rows[0]
                res.append({"method": method, "m": m, "n": n, "k": k, "fp16_ms": fp16, "rows": rows})
                print(f"{method:9s} {n}x{k} M={m:5d} fp16 {fp16 * 1e3:7.1f} us best {best.get('ms', float('nan')) * 1e3:7.1f} "
                      f"us ({fp16 / best.get('ms', float('nan')):.2f}x) {best['config']} | " +
                      " ".join(f"{r['config']['bn']}x{r['config']['bm']}k{r['config']['split_k']}"
                               f"w{r['config']['num_warps']}s{r['config']['num_stages']}="
                               f"{r['ms'] * 1e3:.0f}" for r in rows if "ms" in r), flush=True)
                with open(a.out, "w") as f:
                    json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
