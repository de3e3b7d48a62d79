"""Which cuBLAS kernels torch runs for the bench's fp16 and fp8 products at given shapes, and their GPU time: the
kernel names carry cuBLAS's tile shape, cluster and scheduling (e.g. ``..._128x256x64_...``, ``stream-k`` or
``persistent``), which says how it spreads a layer of few output tiles over the SMs (session 26: the LiquidQuant
launch's waves at 6144×4096 M = 1024).

    python docs/bench/cublas_kernels.py --shapes 6144x4096,14336x4096 --m 1024
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from quantkit.bench.command import parse_shapes
from quantkit.bench.roofline import fp8_matmul


def kernels(fn, reps: int = 20) -> list[dict]:
    """The CUDA kernels of ``reps`` calls of ``fn`` (after warm-up): name, calls, mean GPU time per call (µs)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    return [{"name": e.key, "calls": e.count, "us": round(e.device_time_total / max(e.count, 1), 2)}
            for e in prof.key_averages() if e.device_time_total > 0]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="6144x4096,14336x4096,4096x4096")
    p.add_argument("--m", default="1024")
    p.add_argument("--out", default="cublas_kernels.json")
    args = p.parse_args()
    rows = []
    one = torch.ones((), device="cuda")
    for n, k in parse_shapes(args.shapes):
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            w = torch.randn(n, k, device="cuda", dtype=torch.float16)
            x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn).t()
            for method, fn in (("fp16", lambda: F.linear(x, w)), ("fp8", lambda: fp8_matmul(x8, w8, one))):
                row = {"n": n, "k": k, "m": m, "method": method, "kernels": kernels(fn)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
