"""MixLLM W4A8 and mixed W4.4A8 at prefill sizes: the Triton kernels (default tiles) against writing the int8
operand q − z once per call and running the W8A8 TMA kernel (quantkit/runtime/kernels/int8_operand.py,
w8a8_wgmma.py), and cuBLAS fp16. Checks the second path bit-exact against the first. Only the activations rotate
past the L2 here, not the weights (fp16 ones included): the two quantized paths compare like for like, but for
speedups against fp16 read `quantkit bench`, which rotates every operand.

    python docs/bench/int8_operand_sweep.py --out int8_operand.json
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from quantkit.bench.command import parse_shapes
from quantkit.bench.problems import MIXED_8BIT_SHARE, _packed
from quantkit.bench.timing import copies_to_defeat_l2, time_rotating
from quantkit.runtime.kernels.act_quant import quantize_activation_triton
from quantkit.runtime.kernels.configs import gemm_config, w8a8_wgmma_config
from quantkit.runtime.kernels.int8_gemm import int8_matmul, mixed_int8_matmul
from quantkit.runtime.kernels.int8_operand import mixed_w8_operand, w8_operand
from quantkit.runtime.kernels.w8a8_wgmma import w8a8_wgmma_matmul


def weights(method: str, n: int, k: int, dev: str):
    w = torch.randn(n, k, device=dev)
    if method == "w4a8":
        return _packed("w4a16", w)
    n8 = max(1, int(round(MIXED_8BIT_SHARE * n)))
    perm = torch.randperm(n, device=dev)
    rows8, rows4 = perm[:n8].sort().values, perm[n8:].sort().values
    return [("w4a16",) + _packed("w4a16", w[rows4]) + (rows4.to(torch.int32),),
            ("w8",) + _packed("w8", w[rows8]) + (rows8.to(torch.int32),)]


def triton_path(method, a, s, wt, n, m, k):
    if method == "w4a8":
        return int8_matmul(a, s, 128, "w4a16", wt[0], wt[1], config=gemm_config(m, n, k, "asym"))
    return mixed_int8_matmul(a, s, 128, wt, n, config=gemm_config(m, n, k, "mixed"))


def operand_path(method, a, s, wt, n, m, k, prebuilt=None):
    if prebuilt is None:
        t, meta = (w8_operand("w4a16", wt[0], wt[1]), wt[1]) if method == "w4a8" else mixed_w8_operand(wt, n)
    else:
        t, meta = prebuilt
    return w8a8_wgmma_matmul(a, s, 128, t, meta, *w8a8_wgmma_config(max(m, 65), n, k))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="int8_operand.json")
    p.add_argument("--shapes", default="14336x4096,4096x4096,6144x4096,28672x4096,4096x14336")
    p.add_argument("--ms", default="128,256,512,1024,2048,4096")
    args = p.parse_args()
    dev = "cuda"
    rows = []
    for n, k in parse_shapes(args.shapes):
        for method in ("w4a8", "mixed"):
            wt = weights(method, n, k, dev)
            pre = (w8_operand("w4a16", wt[0], wt[1]), wt[1]) if method == "w4a8" else mixed_w8_operand(wt, n)
            for m in [int(v) for v in args.ms.split(",")]:
                copies = copies_to_defeat_l2(n * k + 3 * m * k + 2 * m * n)
                xs = [torch.randn(m, k, device=dev, dtype=torch.float16) for _ in range(copies)]
                inputs = [quantize_activation_triton(x, 8, 128) for x in xs]
                a0, s0 = inputs[0]
                row = {"method": method, "n": n, "k": k, "m": m,
                       "equal": bool(torch.equal(triton_path(method, a0, s0, wt, n, m, k),
                                                 operand_path(method, a0, s0, wt, n, m, k)))}
                w16 = torch.randn(n, k, device=dev, dtype=torch.float16)
                row["fp16"] = time_rotating(lambda x: F.linear(x, w16), [(x,) for x in xs], reps=20)["ms"] * 1e3
                del w16
                row["triton"] = time_rotating(lambda a, s: triton_path(method, a, s, wt, n, m, k), inputs,
                                              reps=20)["ms"] * 1e3
                row["operand"] = time_rotating(lambda a, s: operand_path(method, a, s, wt, n, m, k), inputs,
                                               reps=20)["ms"] * 1e3
                row["w8a8_only"] = time_rotating(lambda a, s: operand_path(method, a, s, wt, n, m, k, pre), inputs,
                                                 reps=20)["ms"] * 1e3
                row["operand_vs_triton"] = row["triton"] / row["operand"]
                row["operand_vs_fp16"] = row["fp16"] / row["operand"]
                print(json.dumps({kk: (round(v, 2) if isinstance(v, float) else v) for kk, v in row.items()}),
                      flush=True)
                rows.append(row)
                del xs, inputs
                torch.cuda.empty_cache()
                with open(args.out, "w") as f:
                    json.dump({"device": torch.cuda.get_device_name(), "rows": rows, "unit": "us"}, f, indent=1)


if __name__ == "__main__":
    main()
