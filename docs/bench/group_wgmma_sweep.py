"""MixLLM W8A8 / W4A8 / mixed W4.4A8 (g128 weights and activations): the Gluon kernel whose group epilogues overlap
the next group's products (quantkit/runtime/kernels/group_wgmma.py) against the Triton kernels (default launch
rules) and cuBLAS fp16. First checks it bit-exact against the Triton kernel at the same K split and within 1e-3 of
the torch reference.

    python docs/bench/group_wgmma_sweep.py --out group_wgmma.json
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
from quantkit.runtime.kernels.configs import TileConfig
from quantkit.runtime.kernels.group_wgmma import group_wgmma_matmul, group_wgmma_mixed, group_wgmma_problem
from quantkit.runtime.kernels.int8_gemm import int8_matmul, mixed_int8_matmul
from quantkit.runtime.kernels.reference import int8_reference

VARIANTS = [(32, 3, 1, True), (32, 3, 1, False), (64, 3, 1, True), (64, 3, 1, False), (64, 4, 1, False),
            (32, 3, 2, False), (64, 3, 2, False)]
LAYOUT = {"w8a8": "w8", "w4a8": "w4a16"}


def weights(method: str, n: int, k: int, dev: str):
    """(tensors, meta) of one weight, or the mixed layer's two (layout, tensors, meta, rows) partitions."""
    w = torch.randn(n, k, device=dev)
    if method != "mixed":
        return _packed(LAYOUT[method], w)
    n8 = max(1, int(round(MIXED_8BIT_SHARE * n)))
    perm = torch.randperm(n, device=dev)
    rows8, rows4 = perm[:n8].sort().values, perm[n8:].sort().values
    return [("w4a16",) + _packed("w4a16", w[rows4]) + (rows4.to(torch.int32),),
            ("w8",) + _packed("w8", w[rows8]) + (rows8.to(torch.int32),)]


def run_triton(method, a, s, wt, n, cfg=None):
    if method == "mixed":
        return mixed_int8_matmul(a, s, 128, wt, n, config=cfg)
    return int8_matmul(a, s, 128, LAYOUT[method], wt[0], wt[1], config=cfg)


def run_gluon(method, a, s, wt, n, bm, st, sk, ov):
    if method == "mixed":
        return group_wgmma_mixed(a, s, 128, wt, n, bm, st, sk, overlap_hi=ov)
    return group_wgmma_matmul(a, s, 128, LAYOUT[method], wt[0], wt[1], bm, st, sk, overlap_hi=ov)


def reference(method, a, s, wt, n):
    if method == "mixed":
        out = torch.empty(a.shape[0], n, device=a.device)
        for layout, tensors, meta, rows in wt:
            out[:, rows.long()] = int8_reference(a, s, 128, layout, tensors, meta).float()
        return out
    return int8_reference(a, s, 128, LAYOUT[method], wt[0], wt[1]).float()


def check(dev: str) -> list[dict]:
    out = []
    for method in ("w8a8", "w4a8", "mixed"):
        for (n, k), m in [((200, 512), 33), ((1000, 1024), 130), ((64, 256), 1), ((127, 1280), 257)]:
            wt = weights(method, n, k, dev)
            a, s = quantize_activation_triton(torch.randn(m, k, device=dev, dtype=torch.float16), 8, 128)
            ref = reference(method, a, s, wt, n)
            for bm, st, sk, ov in VARIANTS:
                tri = run_triton(method, a, s, wt, n, TileConfig(64, bm, sk, 4, 3))
                got = run_gluon(method, a, s, wt, n, bm, st, sk, ov)
                rel = ((got.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-9)).item()
                out.append({"method": method, "n": n, "k": k, "m": m, "variant": [bm, st, sk, ov],
                            "equal_triton": bool(torch.equal(got, tri)), "rel_vs_reference": rel})
                if not out[-1]["equal_triton"] or rel > 1e-3:
                    print("check", json.dumps(out[-1]), flush=True)
    print("checks:", len(out), "all equal:", all(c["equal_triton"] for c in out), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="group_wgmma.json")
    p.add_argument("--shapes", default="14336x4096,4096x4096,4096x14336")
    p.add_argument("--ms", default="32,64,128,256,512,1024,4096")
    p.add_argument("--methods", default="w8a8,w4a8,mixed")
    args = p.parse_args()
    dev = "cuda"
    checks = check(dev)
    rows = []
    for n, k in parse_shapes(args.shapes):
        for method in args.methods.split(","):
            wt = weights(method, n, k, dev)
            for m in [int(v) for v in args.ms.split(",")]:
                if group_wgmma_problem(torch.empty(m, k, dtype=torch.int8, device=dev), 128,
                                       ("w8",), k) is not None:
                    continue
                copies = copies_to_defeat_l2(n * k + 3 * m * k + 2 * m * n)
                xs = [torch.randn(m, k, device=dev, dtype=torch.float16) for _ in range(copies)]
                row = {"method": method, "n": n, "k": k, "m": m}
                w16 = torch.randn(n, k, device=dev, dtype=torch.float16)
                row["fp16"] = time_rotating(lambda x: F.linear(x, w16), [(x,) for x in xs], reps=20)["ms"] * 1e3
                del w16
                inputs = [quantize_activation_triton(x, 8, 128) for x in xs]
                row["triton"] = time_rotating(lambda a, s: run_triton(method, a, s, wt, n), inputs, reps=20)["ms"] * 1e3
                for bm, st, sk, ov in VARIANTS:
                    if bm > max(m, 32):
                        continue
                    row[f"gluon_{bm}_{st}_{sk}_{int(ov)}"] = time_rotating(
                        lambda a, s: run_gluon(method, a, s, wt, n, bm, st, sk, ov), inputs, reps=20)["ms"] * 1e3
                best = min((v, kk) for kk, v in row.items() if kk.startswith("gluon_"))
                row["best_gluon"], row["best_gluon_vs_fp16"] = best[1], row["fp16"] / best[0]
                row["triton_vs_fp16"] = row["fp16"] / row["triton"]
                print(json.dumps({kk: (round(v, 2) if isinstance(v, float) else v) for kk, v in row.items()}),
                      flush=True)
                rows.append(row)
                del xs, inputs
                torch.cuda.empty_cache()
                with open(args.out, "w") as f:  # after every row: a run cut short keeps what it measured
                    json.dump({"device": torch.cuda.get_device_name(), "checks": checks, "rows": rows, "unit": "us"},
                              f, indent=1)


if __name__ == "__main__":
    main()
