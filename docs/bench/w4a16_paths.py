"""W4A16 at prefill sizes on the GPU at hand: the launch rule's path (w4a16_matmul as dispatched), dequantize-then-
cuBLAS (``dequant=True``) and the Triton kernel at its tile rule, per shape and token count, with cuBLAS fp16 — to
check which path the rule should take after a kernel changes (session 16: the Gluon kernel's products no longer
overlap its next tile's dequantization within a warpgroup).

    python docs/bench/w4a16_paths.py --out w4a16_paths.json
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from quantkit.bench.command import parse_shapes
from quantkit.bench.problems import _packed
from quantkit.bench.timing import copies_to_defeat_l2, time_rotating
from quantkit.runtime.kernels.configs import gemm_config, w4a16_wgmma_config
from quantkit.runtime.kernels.w4a16 import w4a16_matmul


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="14336x4096,4096x4096,4096x14336")
    p.add_argument("--ms", default="128,256,512")
    p.add_argument("--out", default="w4a16_paths.json")
    args = p.parse_args()
    rows = []
    for n, k in parse_shapes(args.shapes):
        t, meta = _packed("w4a16", torch.randn(n, k, device="cuda"))
        for m in [int(v) for v in args.ms.split(",")]:
            copies = copies_to_defeat_l2(n * k // 2 + 2 * m * k + 2 * m * n)
            xs = [torch.randn(m, k, device="cuda", dtype=torch.float16) for _ in range(copies)]
            ws = [torch.randn(n, k, device="cuda", dtype=torch.float16) for _ in range(min(copies, 4))]
            row = {"n": n, "k": k, "m": m, "gluon_launch": w4a16_wgmma_config(m, n, k),
                   "fp16": time_rotating(lambda x, w: F.linear(x, w),
                                         [(x, ws[i % len(ws)]) for i, x in enumerate(xs)])["ms"] * 1e3}
            inputs = [(x, t) for x in xs]
            cfg = gemm_config(m, n, k, "w4a16")
            for name, fn in (("rule", lambda x, w: w4a16_matmul(x, w, meta)),
                             ("dequant_cublas", lambda x, w: w4a16_matmul(x, w, meta, dequant=True)),
                             ("triton", lambda x, w: w4a16_matmul(x, w, meta, config=cfg))):
                row[name] = time_rotating(fn, inputs)["ms"] * 1e3
            print(json.dumps({kk: (round(v, 2) if isinstance(v, float) else v) for kk, v in row.items()}), flush=True)
            rows.append(row)
            del xs, ws
            with open(args.out, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "rows": rows, "unit": "us"}, f, indent=1)


if __name__ == "__main__":
    main()
