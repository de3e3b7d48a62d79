"""Nsight Compute view of LiquidQuant launches on small layers (the 1024×4096 k/v projection) next to cuBLAS fp16:
one call of each case after an unprofiled warm-up, under ``ncu --profile-from-start off``. Used in session 18 to split
the ~13.6 µs a warp-specialized launch then took there (whatever its K split, docs/BENCHMARKS.md) into the kernel's
own duration and what the timed CUDA graph adds.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight --section LaunchStats \
        --section WarpStateStats python3 docs/bench/ncu_lqq_small.py --cases "fp16:1024x4096:128,ws:1024x4096:128:1"

A case is ``method:NxK:M[:args]``: ``fp16``; ``rule`` (int8_matmul's own pick); ``triton`` (the Triton kernel's
default tile); ``ws`` with args ``split[,tail[,stages[,warpgroups[,per_sm]]]]`` (:func:`.lqq_ws.lqq_ws_matmul`, 128
tokens a program); ``wgmma`` with args ``bm,stages,split,tail,warpgroups`` (:func:`.lqq_wgmma.lqq_wgmma_matmul`);
``cluster`` with args ``tokens,split,stages[,depth[,rows]]`` (:func:`.cuda_lqq_cluster.lqq_cluster_matmul`); ``kpair``
with args ``[split[,stages]]`` (:func:`.lqq_ws.lqq_ws_matmul` with ``k_pair``). (Session 23's ``stream_k`` cases
need the kernel at commit 6fced32, where this script has them: c9cfd92.) Cases
with such arguments are separated by ``;`` (``--cases "cluster:1024x4096:769:128,2,3,2,128;rule:1024x4096:769"``).
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from quantkit.bench.problems import _packed
from quantkit.runtime.kernels.act_quant import quantize_activation_triton
from quantkit.runtime.kernels.configs import gemm_config
from quantkit.runtime.kernels.cuda_lqq_cluster import lqq_cluster_matmul
from quantkit.runtime.kernels.int8_gemm import int8_matmul
from quantkit.runtime.kernels.lqq_wgmma import lqq_wgmma_matmul
from quantkit.runtime.kernels.lqq_ws import lqq_ws_matmul

from ncu_prefill import profile  # noqa: E402 - docs/bench is the script's own folder


def call_of(case: str):
    """A zero-argument callable running one product of ``case`` (module docstring)."""
    method, shape, m, *rest = case.split(":")
    n, k = (int(v) for v in shape.split("x"))
    m = int(m)
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    if method == "fp16":
        w = torch.randn(n, k, device="cuda", dtype=torch.float16)
        return lambda: F.linear(x, w)
    t, meta = _packed("w4a8-lqq", torch.randn(n, k, device="cuda"))
    a, s = quantize_activation_triton(x, 8, -1)
    args = [int(v) for v in rest[0].split(",")] if rest else []
    if method == "rule":
        return lambda: int8_matmul(a, s, -1, "w4a8-lqq", t, meta)
    if method == "triton":
        cfg = gemm_config(m, n, k, "lqq")
        return lambda: int8_matmul(a, s, -1, "w4a8-lqq", t, meta, config=cfg)
    if method == "ws":
        split, tail, stages, wg, per_sm = (args + [1, 0, 3, 1, 2][len(args):])[:5]
        return lambda: lqq_ws_matmul(a, s, t, meta, 128, stages, tail, wg, per_sm, split)
    if method == "wgmma":
        return lambda: lqq_wgmma_matmul(a, s, t, meta, *args)
    if method == "kpair":
        split, stages = (args + [1, 4][len(args):])[:2]
        return lambda: lqq_ws_matmul(a, s, t, meta, 128, stages, split_k=split, k_pair=True)
    if method == "cluster":
        return lambda: lqq_cluster_matmul(a, s, t, meta, *args)
    raise SystemExit(f"unknown method in case {case!r}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", required=True, help="cases separated by ';' (or ',' when none has arguments)")
    args = ap.parse_args()
    profile([(case, call_of(case)) for case in args.cases.split(";" if ";" in args.cases else ",")])


if __name__ == "__main__":
    main()
