"""One-launch mixed W4.4A8 kernel: the 8-bit partition's programs with the same rows as the 4-bit ones, or half
(quantkit.runtime.kernels.configs.MIXED_HALF_BN_8BIT / mixed_second_bn), against MixLLM W4A8 on the same
shapes — the measurement behind that rule (docs/BENCHMARKS.md). "half" applies the rule where it halves.

    python docs/bench/mixed_balance.py --out mixed_balance.json
"""

from __future__ import annotations

import argparse
import json

from quantkit.bench.runner import time_problem
from quantkit.runtime.kernels import configs


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", default="14336x4096,4096x4096,6144x4096,28672x4096,4096x14336")
    p.add_argument("--ms", default="1,2,4,8,16,64,256,1024,4096")
    a = p.parse_args()
    rows = []
    for n, k in (tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")):
        for m in (int(v) for v in a.ms.split(",")):
            row = {"m": m, "n": n, "k": k, "w4a8_us": time_problem("w4a8", m, n, k, reps=30)[0]["ms"] * 1e3}
            for half in (False, True):
                configs.MIXED_HALF_BN_8BIT = half
                row[f"mixed_half{int(half)}_us"] = time_problem("mixed", m, n, k, reps=30)[0]["ms"] * 1e3
            print(f"{n}x{k} M={m:5d} w4a8 {row['w4a8_us']:7.1f} mixed {row['mixed_half0_us']:7.1f} "
                  f"({row['mixed_half0_us'] / row['w4a8_us']:.2f}x) half-BN {row['mixed_half1_us']:7.1f} "
                  f"({row['mixed_half1_us'] / row['w4a8_us']:.2f}x)", flush=True)
            rows.append(row)
            with open(a.out, "w") as f:
                json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
