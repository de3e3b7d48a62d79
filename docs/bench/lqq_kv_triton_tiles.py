"""LiquidQuant W4A8 on a narrow layer (the 1024×4096 k/v projection by default) at the token counts where it runs
slower than cuBLAS fp16: every Triton LiquidQuant tile of a small grid (BN 32/64, BM 32/64/128, K split 1/2/4,
stages 3/4) against fp16 — whether any tile of the Triton kernel closes the gap the launch rules leave
(docs/BENCHMARKS.md, session 17). Kernels on quantized activations, the bench's timing (CUDA graphs, rotating
inputs), an untimed warm-up per point.

    python docs/bench/lqq_kv_triton_tiles.py --out kv_tiles.json
"""

from __future__ import annotations

import argparse
import itertools
import json

import torch

from quantkit.bench.command import parse_shapes
from quantkit.bench.problems import _packed, fp16_and_lqq_inputs
from quantkit.bench.timing import time_rotating
from quantkit.runtime.kernels.configs import TileConfig
from quantkit.runtime.kernels.int8_gemm import int8_matmul


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="1024x4096")
    p.add_argument("--ms", default="129,176,256,320,384,480,769,896")
    p.add_argument("--out", default="kv_tiles.json")
    args = p.parse_args()
    tiles = [TileConfig(bn, bm, split, 4, stages) for bn, bm, split, stages
             in itertools.product((32, 64), (32, 64, 128), (1, 2, 4), (3, 4))]
    rows = []
    for n, k in parse_shapes(args.shapes):
        t, meta = _packed("w4a8-lqq", torch.randn(n, k, device="cuda"))
        for m in [int(v) for v in args.ms.split(",")]:
            fp16, inputs = fp16_and_lqq_inputs(t, m, n, k)
            rule = lambda a, s, w: int8_matmul(a, s, -1, "w4a8-lqq", w, meta)  # noqa: E731
            time_rotating(rule, inputs, reps=5)
            row = {"n": n, "k": k, "m": m, "fp16": fp16["ms"] * 1e3, "rule": time_rotating(rule, inputs)["ms"] * 1e3}
            for cfg in tiles:
                name = f"triton_{cfg.bn}x{cfg.bm}_s{cfg.split_k}_st{cfg.num_stages}"
                try:
                    row[name] = time_rotating(lambda a, s, w, cfg=cfg: int8_matmul(a, s, -1, "w4a8-lqq", w, meta,
                                                                                 config=cfg), inputs)["ms"] * 1e3
                except Exception as e:  # noqa: BLE001 - a tile this Triton cannot build: recorded, not timed
                    row[name] = None
                    row.setdefault("failed", {})[name] = f"{type(e).__name__}: {str(e)[:120]}"
            best = min((v, kk) for kk, v in row.items() if kk.startswith("triton_") and v is not None)
            row["best"], row["best_vs_fp16"] = best[1], row["fp16"] / best[0]
            print(json.dumps({kk: (round(v, 2) if isinstance(v, float) else v) for kk, v in row.items()
                              if not kk.startswith("triton_") and kk != "failed"}), flush=True)
            rows.append(row)
            with open(args.out, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "rows": rows, "unit": "us"}, f, indent=1)
            del inputs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
