"""W4A16 above decode sizes: the Gluon kernel whose dequantization overlaps its own fp16 wgmma products
(quantkit/runtime/kernels/w4a16_wgmma.py) against the Triton W4A16 kernel, dequantize-then-cuBLAS and cuBLAS fp16 on
the unquantized weight — the measured basis of :func:`quantkit.runtime.kernels.configs.w4a16_wgmma_config`. First
checks every variant against the torch reference (fp16 1e-3, bf16 8e-3, as the W4A16 tests) and the Triton kernel.
Same timing rules as ``quantkit bench`` (CUDA graph, rotating copies past the L2, median).

    python docs/bench/w4a16_wgmma_sweep.py --out w4a16_wgmma.json
    python docs/bench/w4a16_wgmma_sweep.py --rule --ms 17,100,300,700 --out rule.json   # the launch rule's picks
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from quantkit.bench.command import parse_ints, parse_shapes
from quantkit.bench.problems import _packed
from quantkit.bench.timing import copies_to_defeat_l2, time_rotating
from quantkit.bench.sweep_log import save_sweep
from quantkit.runtime.kernels.reference import w4a16_reference
from quantkit.runtime.kernels.w4a16 import w4a16_matmul
from quantkit.runtime.kernels.w4a16_wgmma import w4a16_wgmma_matmul, w4a16_wgmma_problem

# (bm, stages, split_k, warpgroups); docs/logs/session11/w4a16_wgmma_wg1_h100.json timed more one-warpgroup
# variants (then also 1-4 plane pairs in flight, dropped in session 16: stages 3 vs 4 within a few %, split 2 only
# at M = 32-64)
VARIANTS = [(32, 3, 2, 1), (32, 3, 1, 2), (32, 3, 2, 2), (64, 3, 1, 1), (64, 3, 2, 1), (64, 3, 1, 2), (64, 4, 1, 2),
            (64, 3, 2, 2), (128, 3, 1, 1), (128, 3, 1, 2), (128, 2, 1, 2), (128, 3, 2, 2)]
CHECK_VARIANTS = [(32, 3, 2, 1), (64, 3, 1, 2), (64, 4, 1, 1), (128, 3, 1, 2), (128, 2, 1, 2), (128, 3, 2, 2)]
CHECKS = [((200, 512), 33), ((1000, 1024), 130), ((4096, 4096), 64), ((1024, 14336), 257), ((64, 256), 1),
          ((33, 768), 3)]


def key(bm: int, stages: int, split: int, wg: int) -> str:
    """A variant's column name in the rows: gluon_<bm>_<stages>_<split>, then _wg2 for two warpgroups (logs before
    session 16 carry a fourth number: plane pairs in flight)."""
    return f"gluon_{bm}_{stages}_{split}" + ("_wg2" if wg == 2 else "")


def check(variants) -> list[dict]:
    out = []
    for (n, k), m in CHECKS:
        t, meta = _packed("w4a16", torch.randn(n, k, device="cuda"))
        for dtype, tol in ((torch.float16, 1e-3), (torch.bfloat16, 8e-3)):
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            ref = w4a16_reference(x, t, meta).float()
            tri = w4a16_matmul(x, t, meta, dequant=False).float()
            for bm, st, sk, wg in variants[:3] if dtype == torch.bfloat16 else variants:
                got = w4a16_wgmma_matmul(x, t, meta, bm, st, sk, wg).float()
                scale = ref.abs().max().clamp_min(1e-9)
                row = {"n": n, "k": k, "m": m, "dtype": str(dtype), "variant": key(bm, st, sk, wg),
                       "rel_vs_reference": ((got - ref).abs().max() / scale).item(),
                       "rel_vs_triton": ((got - tri).abs().max() / scale).item()}
                row["ok"] = row["rel_vs_reference"] < tol and bool(torch.isfinite(got).all())
                out.append(row)
                print("check", json.dumps(row), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", default="14336x4096,4096x4096,6144x4096,28672x4096,4096x14336")
    p.add_argument("--ms", default="16,32,64,128,192,256,384,512,768,1024,2048,4096")
    p.add_argument("--rule", action="store_true", help="time w4a16_matmul's default path (the launch rule) too")
    p.add_argument("--no-variants", action="store_true", help="time only the baselines (and --rule)")
    p.add_argument("--no-check", action="store_true")
    args = p.parse_args()
    checks = [] if args.no_check else check(CHECK_VARIANTS)
    rows = []
    for n, k in parse_shapes(args.shapes):
        t, meta = _packed("w4a16", torch.randn(n, k, device="cuda"))
        for m in parse_ints(args.ms, "--ms"):
            copies = copies_to_defeat_l2(n * k // 2 + 2 * m * k + 2 * m * n)
            xs = [torch.randn(m, k, device="cuda", dtype=torch.float16) for _ in range(copies)]
            ws = [torch.randn(n, k, device="cuda", dtype=torch.float16) for _ in range(min(copies, 4))]
            row = {"n": n, "k": k, "m": m}
            row["fp16"] = time_rotating(lambda x, w: F.linear(x, w), [(x, ws[i % len(ws)]) for i, x in
                                                                     enumerate(xs)])["ms"] * 1e3
            del ws
            tt = [{kk: v.clone() for kk, v in t.items()} for _ in range(copies)]
            inputs = list(zip(xs, tt))
            row["triton"] = time_rotating(lambda x, w: w4a16_matmul(x, w, meta, dequant=False), inputs)["ms"] * 1e3
            row["dequant"] = time_rotating(lambda x, w: w4a16_matmul(x, w, meta, dequant=True), inputs)["ms"] * 1e3
            if args.rule:
                row["rule"] = time_rotating(lambda x, w: w4a16_matmul(x, w, meta), inputs)["ms"] * 1e3
            if not args.no_variants and w4a16_wgmma_problem(xs[0], meta) is None:
                for bm, st, sk, wg in VARIANTS:
                    if bm > max(2 * m, 32) or (bm == 32 and m > 256) or (m >= 1024 and bm < 128):
                        continue
                    if (k // 256) // sk < 4:
                        continue
                    row[key(bm, st, sk, wg)] = time_rotating(
                        lambda x, w: w4a16_wgmma_matmul(x, w, meta, bm, st, sk, wg), inputs)["ms"] * 1e3
            timed = [(v, kk) for kk, v in row.items() if kk.startswith("gluon_")]
            if timed:
                best = min(timed)
                row["best_gluon"] = best[1]
                row["best_gluon_vs_fp16"] = row["fp16"] / best[0]
            row["triton_vs_fp16"] = row["fp16"] / row["triton"]
            row["dequant_vs_fp16"] = row["fp16"] / row["dequant"]
            print(json.dumps({kk: (round(v, 2) if isinstance(v, float) else v) for kk, v in row.items()}), flush=True)
            rows.append(row)
            del xs, tt, inputs
            torch.cuda.empty_cache()
        save_sweep(args.out, rows, checks)  # after every shape, so a cut-off run keeps what it measured


if __name__ == "__main__":
    main()
