"""Tile candidates of the Triton 4-bit kernels (W4A16, LiquidQuant W4A8, MixLLM W4A8, mixed W4.4A8) above
M = 16, each timed under ``quantkit bench``'s rules next to cuBLAS fp16: the measured basis of
:data:`quantkit.runtime.kernels.configs.WAVE_TILES` (docs/logs/wide_tune_*_h100.json).

    python docs/bench/tile_sweep_4bit.py --methods w4a8-lqq --out tune.json [--candidates 128x256w8s3,64x64k2w4s4]
"""

from __future__ import annotations

import argparse
import json
import re

from quantkit.bench.command import parse_shapes
from quantkit.bench.runner import time_problem, tune
from quantkit.runtime.kernels.configs import TileConfig

CANDIDATES = {
    "w4a16": [TileConfig(128, 128, 1, 8, 3), TileConfig(128, 128, 1, 8, 2), TileConfig(256, 128, 1, 8, 2),
              TileConfig(128, 64, 1, 4, 4), TileConfig(64, 128, 1, 4, 3), TileConfig(256, 64, 1, 8, 3),
              TileConfig(128, 64, 1, 8, 4), TileConfig(64, 64, 1, 4, 4)],
    "w4a8-lqq": [TileConfig(256, 128, 1, 8, 3), TileConfig(256, 128, 1, 8, 4), TileConfig(128, 256, 1, 8, 3),
                 TileConfig(128, 128, 1, 8, 4), TileConfig(128, 128, 1, 4, 4), TileConfig(256, 64, 1, 8, 4),
                 TileConfig(128, 64, 1, 4, 4), TileConfig(64, 64, 1, 4, 4), TileConfig(128, 64, 2, 4, 4)],
}
CANDIDATES["w4a8"] = CANDIDATES["w4a8-lqq"]
CANDIDATES["mixed"] = CANDIDATES["w4a8-lqq"]


def parse_candidates(text: str) -> list[TileConfig]:
    """'BNxBM[kS]wWsS,...' (e.g. 128x256w8s3, 64x64k2w4s4) → TileConfigs."""
    out = []
    for item in text.split(","):
        m = re.fullmatch(r"(\d+)x(\d+)(?:k(\d+))?w(\d+)s(\d+)", item.strip())
        if not m:
            raise SystemExit(f"bad candidate '{item}': expected BNxBM[kSPLIT]wWARPSsSTAGES, e.g. 128x256w8s3")
        bn, bm, split, warps, stages = m.groups()
        out.append(TileConfig(int(bn), int(bm), int(split or 1), int(warps), int(stages)))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--methods", default="w4a16,w4a8-lqq,w4a8,mixed")
    p.add_argument("--shapes", default="14336x4096,4096x4096,6144x4096,28672x4096,4096x14336")
    p.add_argument("--ms", default="16,64,256,1024,4096")
    p.add_argument("--candidates", default="", help="instead of the built-in list: BNxBM[kS]wWsS,...")
    a = p.parse_args()
    res = []
    for n, k in parse_shapes(a.shapes):
        for m in (int(v) for v in a.ms.split(",")):
            fp16 = time_problem("fp16", m, n, k)[0]["ms"]
            for method in a.methods.split(","):
                row = {"method": method, "m": m, "n": n, "k": k, "fp16_ms": fp16}
                row["rows"] = tune(method, m, n, k, parse_candidates(a.candidates) if a.candidates
                                   else CANDIDATES[method], reps=20)
                best = row["rows"][0]
                print(f"{method:9s} {n}x{k} M={m:5d} fp16 {fp16 * 1e3:7.1f} best {best.get('ms', 0) * 1e3:7.1f} us "
                      f"({fp16 / best.get('ms', float('inf')):.2f}x) | " +
                      " ".join(f"{r['config']['bn']}x{r['config']['bm']}k{r['config']['split_k']}"
                               f"w{r['config']['num_warps']}s{r['config']['num_stages']}={r['ms'] * 1e3:.0f}"
                               for r in row["rows"] if "ms" in r), flush=True)
                res.append(row)
                with open(a.out, "w") as f:
                    json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
