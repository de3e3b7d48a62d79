"""W4A16 at prefill sizes on the GPU at hand: the launch rule's path (w4a16_matmul as dispatched), dequantize-then-
cuBLAS (``dequant=True``), the Triton kernel at its tile rule and — on Hopper with Gluon, ``--gluon`` — the Gluon
wgmma kernel's and the warp-specialized kernel's 128-token launches on one and two warpgroups, per shape and token
count, with cuBLAS fp16: which path the rule should take after a kernel changes (session 16: the Gluon kernel's
products no longer overlap its next tile's dequantization within a warpgroup; the warp-specialized kernel is new).

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
from quantkit.runtime.kernels.w4a16_wgmma import w4a16_wgmma_matmul
from quantkit.runtime.kernels.w4a16_ws import w4a16_ws_matmul


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="14336x4096,4096x4096,4096x14336")
    p.add_argument("--ms", default="128,256,512")
    p.add_argument("--gluon", action="store_true", help="also the Gluon kernels' 128-token launches (Hopper)")
    p.add_argument("--dequant-min-m", type=int, default=0,
                   help="time dequantize-then-cuBLAS only from this M on (it loses below ~512; saves device time)")
    p.add_argument("--no-wgmma", action="store_true",
                   help="with --gluon: only the warp-specialized launches (the rule's own pick is timed anyway)")
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
            paths = [("rule", lambda x, w: w4a16_matmul(x, w, meta)),
                     ("triton", lambda x, w: w4a16_matmul(x, w, meta, config=cfg))]
            if m >= args.dequant_min_m:
                paths.append(("dequant_cublas", lambda x, w: w4a16_matmul(x, w, meta, dequant=True)))
            if args.gluon:
                for wg in (1, 2):
                    if not args.no_wgmma:
                        paths.append((f"wgmma_128_wg{wg}",
                                      lambda x, w, wg=wg: w4a16_wgmma_matmul(x, w, meta, 128, 3, 1, wg)))
                    paths.append((f"ws_wg{wg}", lambda x, w, wg=wg: w4a16_ws_matmul(x, w, meta, 3, wg)))
                # the same 128-token tiles and sums in the same order: equal bits (as the GPU tests check)
                row["ws_equal_wgmma"] = [bool(torch.equal(w4a16_ws_matmul(xs[0], t, meta, 3, wg),
                                                          w4a16_wgmma_matmul(xs[0], t, meta, 128, 3, 1, wg)))
                                         for wg in (1, 2)]
            # untimed first: the first path timed after new inputs ran ~1.02x slow on average (session 17's review)
            time_rotating(paths[0][1], inputs, reps=5)
            for name, fn in paths:
                row[name] = time_rotating(fn, inputs)["ms"] * 1e3
            print(json.dumps({kk: (round(v, 2) if isinstance(v, float) else v) for kk, v in row.items()}), flush=True)
            rows.append(row)
            del xs, ws
            with open(args.out, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "rows": rows, "unit": "us"}, f, indent=1)


if __name__ == "__main__":
    main()
