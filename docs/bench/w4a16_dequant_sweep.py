"""W4A16 at prefill sizes: the fused Triton kernel against dequantizing Ŵ once (a Triton kernel writing fp16)
and multiplying with cuBLAS, next to cuBLAS fp16 on the unquantized weight — the measured basis of
:data:`quantkit.runtime.kernels.configs.W4A16_DEQUANT_MIN_M`. Same timing rules as ``quantkit bench``.

    python docs/bench/w4a16_dequant_sweep.py --out w4a16_dequant.json
"""

from __future__ import annotations

import argparse
import json

from quantkit.bench.command import parse_ints, parse_shapes
from quantkit.bench.runner import time_problem


def _ms(method: str, m: int, n: int, k: int, **state) -> float:
    return time_problem(method, m, n, k, **state)[0]["ms"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", default="14336x4096,4096x4096,6144x4096,28672x4096,4096x14336")
    p.add_argument("--ms", default="64,128,256,512,1024,2048,4096")
    a = p.parse_args()
    res = []
    for n, k in parse_shapes(a.shapes):
        for m in parse_ints(a.ms, "--ms"):
            row = {"m": m, "n": n, "k": k, "fp16_ms": _ms("fp16", m, n, k),
                   "fused_ms": _ms("w4a16", m, n, k, dequant=False), "dequant_ms": _ms("w4a16", m, n, k, dequant=True)}
            res.append(row)
            print(f"{n}x{k} M={m:5d} fp16 {row['fp16_ms'] * 1e3:8.1f} fused {row['fused_ms'] * 1e3:8.1f} "
                  f"({row['fp16_ms'] / row['fused_ms']:.2f}x) dequant+cuBLAS {row['dequant_ms'] * 1e3:8.1f} "
                  f"({row['fp16_ms'] / row['dequant_ms']:.2f}x)", flush=True)
            with open(a.out, "w") as f:
                json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
