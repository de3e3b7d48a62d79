"""How a mixed W4.4A8 layer (MixLLM Sec. 3.4; 10 % of rows 8-bit) should run, per size: the CUDA A8 GEMV (both
partitions in one launch) or the one-launch Triton kernel — each timed next to the MixLLM W4A8 layer of the same
shape (the issue's "mixed <= 1.15x W4A8"), under ``quantkit bench``'s rules. (At commit 69dd2d4 it also timed
one Triton launch per partition: up to 3.5x slower, never more than 1 % faster;
docs/logs/mixed_launch_h100.json.)

    python docs/bench/mixed_launch_sweep.py --out mixed_launch.json
"""

from __future__ import annotations

import argparse
import json

from quantkit.bench.command import parse_ints, parse_shapes
from quantkit.bench.runner import time_problem
from quantkit.runtime.kernels.cuda_gemv_a8 import a8_gemv_preferred

WAYS = {"gemv": 0, "one": 1}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", default="14336x4096,4096x4096,6144x4096,28672x4096,4096x14336")
    p.add_argument("--ms", default="1,4,8,16,64,256,1024,4096")
    p.add_argument("--ways", default=",".join(WAYS), help="a subset of gemv,one")
    a = p.parse_args()
    res = []
    for n, k in parse_shapes(a.shapes):
        for m in parse_ints(a.ms, "--ms"):
            w4a8 = time_problem("w4a8", m, n, k)[0]["ms"]
            row = {"m": m, "n": n, "k": k, "w4a8_ms": w4a8}
            for name, launches in ((w, WAYS[w]) for w in a.ways.split(",")):
                if name == "gemv" and not a8_gemv_preferred(m, n, k, mixed=True, layouts=("w4a16", "w8")):
                    continue
                row[f"{name}_ms"] = time_problem("mixed", m, n, k, launches=launches)[0]["ms"]
            print(f"{n}x{k} M={m:5d} w4a8 {w4a8 * 1e3:7.1f} us | " + " ".join(
                f"{name} {row[f'{name}_ms'] * 1e3:7.1f} ({row[f'{name}_ms'] / w4a8:.2f}x)"
                for name in WAYS if f"{name}_ms" in row), flush=True)
            res.append(row)
            with open(a.out, "w") as f:
                json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
