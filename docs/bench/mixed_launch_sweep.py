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

from quantkit.bench.problems import build_problem
from quantkit.bench.timing import time_rotating
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
    for n, k in (tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")):
        for m in (int(v) for v in a.ms.split(",")):
            w4a8 = time_rotating(*_fn_inputs(build_problem("w4a8", m, n, k)))["ms"]
            row = {"m": m, "n": n, "k": k, "w4a8_ms": w4a8}
            for name, launches in ((w, WAYS[w]) for w in a.ways.split(",")):
                if name == "gemv" and not a8_gemv_preferred(m, n, k, mixed=True, layouts=("w4a16", "w8")):
                    continue
                prob = build_problem("mixed", m, n, k)
                prob.state["launches"] = launches
                row[f"{name}_ms"] = time_rotating(*_fn_inputs(prob))["ms"]
            print(f"{n}x{k} M={m:5d} w4a8 {w4a8 * 1e3:7.1f} us | " + " ".join(
                f"{name} {row[f'{name}_ms'] * 1e3:7.1f} ({row[f'{name}_ms'] / w4a8:.2f}x)"
                for name in WAYS if f"{name}_ms" in row), flush=True)
            res.append(row)
            with open(a.out, "w") as f:
                json.dump(res, f, indent=1)


def _fn_inputs(prob):
    return prob.fn, prob.inputs


if __name__ == "__main__":
    main()
