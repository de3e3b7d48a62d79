"""One-launch mixed W4.4A8 kernel: the 8-bit partition's programs with the same rows as the 4-bit ones, or half
of them (at least 32) at every size, against MixLLM W4A8 on the same shapes — the measurement behind the rule
in quantkit.runtime.kernels.configs.mixed_second_bn (docs/BENCHMARKS.md, docs/logs/mixed_balance_h100.json).

    python docs/bench/mixed_balance.py --out mixed_balance.json
"""

from __future__ import annotations

import argparse
import json

from quantkit.bench.command import parse_shapes
from quantkit.bench.runner import time_problem
from quantkit.runtime.kernels import int8_gemm


def _same_rows(cfg, second_is_wider, m):
    return cfg.bn


def _half_rows(cfg, second_is_wider, m):
    return max(32, cfg.bn // 2) if second_is_wider and cfg.bn > 32 else cfg.bn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", default="14336x4096,4096x4096,6144x4096,28672x4096,4096x14336")
    p.add_argument("--ms", default="1,2,4,8,16,64,256,1024,4096")
    a = p.parse_args()
    rows = []
    for n, k in parse_shapes(a.shapes):
        for m in (int(v) for v in a.ms.split(",")):
            row = {"m": m, "n": n, "k": k, "w4a8_us": time_problem("w4a8", m, n, k, reps=30)[0]["ms"] * 1e3}
            for half, rule in ((False, _same_rows), (True, _half_rows)):
                int8_gemm.mixed_second_bn = rule  # the kernel module's own reference to the rule
                row[f"mixed_half{int(half)}_us"] = time_problem("mixed", m, n, k, reps=30)[0]["ms"] * 1e3
            print(f"{n}x{k} M={m:5d} w4a8 {row['w4a8_us']:7.1f} mixed {row['mixed_half0_us']:7.1f} "
                  f"({row['mixed_half0_us'] / row['w4a8_us']:.2f}x) half-BN {row['mixed_half1_us']:7.1f} "
                  f"({row['mixed_half1_us'] / row['w4a8_us']:.2f}x)", flush=True)
            rows.append(row)
            with open(a.out, "w") as f:
                json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
