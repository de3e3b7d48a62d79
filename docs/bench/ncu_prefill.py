"""Nsight Compute view of the prefill-size kernels next to cuBLAS fp16 at the same shapes: run under
``ncu --profile-from-start off`` so that only one call of each lands in the profile (after an unprofiled warm-up
that compiles and autotunes). Used to find what bounds the Gluon W4A16 / LiquidQuant kernels at M >= 256
(docs/BENCHMARKS.md).

    ncu --profile-from-start off --section SpeedOfLight --section ComputeWorkloadAnalysis \
        --section WarpStateStats python3 docs/bench/ncu_prefill.py
"""

from __future__ import annotations

import argparse

import torch

from quantkit.bench.problems import _packed, build_problem
from quantkit.runtime.kernels.act_quant import quantize_activation_triton
from quantkit.runtime.kernels.w4a16_wgmma import w4a16_wgmma_matmul
from quantkit.runtime.kernels.w8a8_wgmma import w8a8_wgmma_matmul

# (label, method, N, K, M); method "gluon-w4a16:<bm>,<stages>,<split>,<wg>" or
# "gluon-w8a8:<bm>,<bn>,<stages>,<warps>[,<scales ahead>]" calls that launch directly (the W8A8 one on activation groups of 128)
CASES = [("fp16 14336x4096 M=256", "fp16", 14336, 4096, 256),
         ("w4a16 rule 14336x4096 M=256", "w4a16", 14336, 4096, 256),
         ("fp16 4096x4096 M=2048", "fp16", 4096, 4096, 2048),
         ("gluon w4a16 128x128 4096x4096 M=2048", "gluon-w4a16:128,3,1,2", 4096, 4096, 2048),
         ("fp16 4096x4096 M=1024", "fp16", 4096, 4096, 1024),
         ("w4a8-lqq rule 4096x4096 M=1024", "w4a8-lqq", 4096, 4096, 1024),
         ("fp16 4096x4096 M=4096", "fp16", 4096, 4096, 4096),
         ("w8a8 rule 4096x4096 M=4096", "w8a8", 4096, 4096, 4096),
         ("gluon w8a8 128x128 4096x4096 M=4096", "gluon-w8a8:128,128,4,8", 4096, 4096, 4096),
         ("w8a8 rule 14336x4096 M=1024", "w8a8", 14336, 4096, 1024),
         ("fp16 14336x4096 M=1024", "fp16", 14336, 4096, 1024),
         # the rule's tile without the scales a block ahead (the rule's own launch before b0d851c)
         ("gluon w8a8 64x128 scales not ahead 4096x4096 M=4096", "gluon-w8a8:64,128,4,4,0", 4096, 4096, 4096)]


def call_of(method: str, n: int, k: int, m: int):
    """A zero-argument callable running one product of ``method`` at this shape."""
    if method.startswith("gluon-w4a16:"):
        cfg = tuple(int(v) for v in method.split(":")[1].split(","))
        t, meta = _packed("w4a16", torch.randn(n, k, device="cuda"))
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        return lambda: w4a16_wgmma_matmul(x, t, meta, *cfg)
    if method.startswith("gluon-w8a8:"):
        cfg = tuple(int(v) for v in method.split(":")[1].split(","))
        t, meta = _packed("w8", torch.randn(n, k, device="cuda"))
        a, s = quantize_activation_triton(torch.randn(m, k, device="cuda", dtype=torch.float16), 8, 128)
        return lambda: w8a8_wgmma_matmul(a, s, 128, t, meta, *cfg)
    p = build_problem(method, m, n, k)
    return lambda: p.fn(*p.inputs[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="", help="comma-separated case indices (default: all)")
    args = ap.parse_args()
    picks = [int(i) for i in args.only.split(",")] if args.only else range(len(CASES))
    profile([(CASES[i][0], call_of(*CASES[i][1:])) for i in picks])


def profile(calls: list) -> None:
    """Each (label, zero-argument call): three unprofiled warm-up calls, then one call inside the profiled range
    (``ncu --profile-from-start off``), labelled by an NVTX range."""
    for _, fn in calls:
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for label, fn in calls:
        torch.cuda.nvtx.range_push(label)
        fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        print("profiled:", label, flush=True)
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
