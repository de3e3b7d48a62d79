"""LiquidQuant W4A8 at decode sizes on layers wider than 8192 rows: the CUDA A8 GEMV (programmatic dependent launch
on Hopper) against the Triton kernel the launch rule picks there (``cuda_gemv_a8.a8_gemv_preferred``), same inputs,
same timing rules as ``quantkit bench``; checks the two agree to 1e-3 first.

    python docs/bench/lqq_gemv_wide.py --out lqq_gemv_wide.json
"""

from __future__ import annotations

import argparse
import json

import torch

from quantkit.bench.problems import _packed
from quantkit.bench.timing import copies_to_defeat_l2, time_rotating
from quantkit.runtime.kernels.act_quant import quantize_activation_triton
from quantkit.runtime.kernels.configs import gemm_config
from quantkit.runtime.kernels.cuda_common import pdl_supported
from quantkit.runtime.kernels.cuda_gemv_a8 import a8_gemv_cuda
from quantkit.runtime.kernels.int8_gemm import int8_matmul


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="lqq_gemv_wide.json")
    p.add_argument("--shapes", default="14336x4096,28672x4096")
    p.add_argument("--ms", default="1,2,4,8")
    args = p.parse_args()
    rows = []
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        t, meta = _packed("w4a8-lqq", torch.randn(n, k, device="cuda"))
        for m in (int(v) for v in args.ms.split(",")):
            copies = copies_to_defeat_l2(sum(v.numel() * v.element_size() for v in t.values()) + m * k)
            acts = [quantize_activation_triton(torch.randn(m, k, device="cuda").half(), 8, -1) for _ in range(copies)]
            ws = [{key: v.clone() for key, v in t.items()} for _ in range(copies)]
            inputs = [(a, s, w) for (a, s), w in zip(acts, ws)]

            def triton(a, s, w):
                return int8_matmul(a, s, -1, "w4a8-lqq", w, meta, config=gemm_config(m, n, k, "lqq"))

            def gemv(a, s, w):
                return a8_gemv_cuda(a, s, -1, [("w4a8-lqq", w, meta, None)], n)
            ref = triton(*inputs[0]).float()
            rel = ((gemv(*inputs[0]).float() - ref).abs().max() / ref.abs().max()).item()
            if rel > 1e-3:
                raise SystemExit(f"GEMV and Triton disagree at {n}x{k} M={m}: {rel:.2e}")
            row = {"n": n, "k": k, "m": m, "rel": rel, "pdl": pdl_supported(torch.cuda.current_device()),
                   "triton_us": time_rotating(triton, inputs)["ms"] * 1e3,
                   "gemv_us": time_rotating(gemv, inputs)["ms"] * 1e3}
            print(json.dumps({key: (round(v, 2) if isinstance(v, float) else v) for key, v in row.items()}),
                  flush=True)
            rows.append(row)
            del acts, ws, inputs
            torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows, "unit": "us"}, f, indent=1)


if __name__ == "__main__":
    main()
