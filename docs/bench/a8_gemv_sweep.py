"""Decode study of the int8-activation kernels on one GPU: µs per call of cuBLAS fp16, the Triton W8A8 / MixLLM
W4A8 / one-launch mixed W4.4A8 kernels (their default tile rule) and the CUDA A8 GEMV
(quantkit.runtime.kernels.cuda_gemv_a8, 2 / 4 / 8 warps per block; up to M = 8 waiting for the previous grid
after one or two weight tiles, above one or two 8-token sets per launch column) at decode sizes, with a correctness
check of each CUDA result against the Triton one — the measured basis of the A8 dispatch rule (docs/BENCHMARKS.md quotes it).

    python docs/bench/a8_gemv_sweep.py --out a8.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from quantkit.bench.command import parse_shapes
from quantkit.bench.problems import MIXED_8BIT_SHARE, _packed
from quantkit.bench.timing import copies_to_defeat_l2, time_rotating
from quantkit.runtime.kernels.act_quant import quantize_activation_triton
from quantkit.runtime.kernels.configs import gemm_config
from quantkit.runtime.kernels.cuda_gemv_a8 import a8_gemv_cuda
from quantkit.runtime.kernels.int8_gemm import int8_matmul, mixed_int8_matmul

KINDS = {"w8a8": ("w8", "w8"), "w4a8": ("w4a16", "asym"), "w4a8-lqq": ("w4a8-lqq", "lqq"), "mixed": (None, "mixed")}
ACT_GROUP = {"w4a8-lqq": -1}  # LiquidQuant: per-token activations, as quantkit bench times it; the others g128


def parts_for(method: str, n: int, k: int, gen: torch.Generator) -> list:
    """[(layout, tensors, meta, rows or None)] of a random layer (mixed: 10 % of rows at 8 bits)."""
    w = torch.randn(n, k, generator=gen)
    if method != "mixed":
        t, meta = _packed(KINDS[method][0], w)
        return [(KINDS[method][0], {key: v.cuda() for key, v in t.items()}, meta, None)]
    perm = torch.randperm(n, generator=gen)
    n8 = max(1, int(round(MIXED_8BIT_SHARE * n)))
    rows8, rows4 = perm[:n8].sort().values, perm[n8:].sort().values
    out = []
    for layout, rows in (("w4a16", rows4), ("w8", rows8)):
        t, meta = _packed(layout, w[rows])
        out.append((layout, {key: v.cuda() for key, v in t.items()}, meta, rows.to(torch.int32).cuda()))
    return out


def triton_call(method: str, m: int, n: int, k: int):
    cfg = gemm_config(m, n, k, KINDS[method][1])
    group = ACT_GROUP.get(method, 128)
    if method == "mixed":
        return lambda a, s, parts: mixed_int8_matmul(a, s, group, parts, n, config=cfg)
    return lambda a, s, parts: int8_matmul(a, s, group, parts[0][0], parts[0][1], parts[0][2], config=cfg)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", default="14336x4096,4096x4096,4096x14336,28672x4096,6144x4096")
    p.add_argument("--ms", default="1,2,4,8")
    p.add_argument("--methods", default="w8a8,w4a8,mixed")
    a = p.parse_args()
    t0 = time.time()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    for n, k in parse_shapes(a.shapes):
        for method in a.methods.split(","):
            parts = parts_for(method, n, k, torch.Generator().manual_seed(n + k))
            wb = sum(v.numel() * v.element_size() for p_ in parts for v in p_[1].values())
            for m in (int(v) for v in a.ms.split(",")):
                copies = copies_to_defeat_l2(wb + 3 * m * k)
                group = ACT_GROUP.get(method, 128)
                acts = [quantize_activation_triton(torch.randn(m, k, device="cuda").half(), 8, group)
                        for _ in range(copies)]
                pcs = [[(lay, {key: v.clone() for key, v in t.items()}, meta, rows) for lay, t, meta, rows in parts]
                       for _ in range(copies)]
                inputs = [(ac, sc, pc) for (ac, sc), pc in zip(acts, pcs)]
                row = {"method": method, "m": m, "n": n, "k": k}
                xs = [torch.randn(m, k, device="cuda").half() for _ in range(copies_to_defeat_l2(2 * n * k))]
                ws = [torch.randn(n, k, device="cuda").half() for _ in range(len(xs))]
                row["fp16"] = time_rotating(lambda x, w: F.linear(x, w), list(zip(xs, ws)))["ms"] * 1e3
                tri = triton_call(method, m, n, k)
                ref = tri(*inputs[0])
                row["triton"] = time_rotating(tri, inputs)["ms"] * 1e3
                for warps in (2, 4, 8):
                    for sets, wait2 in (((1, False), (2, False)) if m > 8 else ((1, False), (1, True))):
                        fn = lambda ac, sc, pc, w=warps, j=sets, w2=wait2: a8_gemv_cuda(  # noqa: E731
                            ac, sc, group, pc, n, warps=w, token_sets=j, wait_after_two=w2)
                        key = f"w{warps}" + (f"_j{sets}" if m > 8 else "") + ("_wait2" if wait2 else "")
                        out = fn(*inputs[0])
                        row[f"check_{key}"] = float((out.double() - ref.double()).norm() / ref.double().norm())
                        row[f"cuda_{key}"] = time_rotating(fn, inputs)["ms"] * 1e3
                best = min((key for key in row if key.startswith("cuda_")), key=row.get)
                print(f"{method:6s} M={m} {n}x{k}: fp16 {row['fp16']:.1f} triton {row['triton']:.1f} | " +
                      " ".join(f"{key}={row[key]:.1f}" for key in row if key.startswith("cuda_")) +
                      f" | best {best} {row['triton'] / row[best]:.2f}x triton, check "
                      f"{max(v for key, v in row.items() if key.startswith('check_')):.1e}", flush=True)
                result["rows"].append(row)
                del acts, pcs, inputs, xs, ws
                torch.cuda.empty_cache()
    result["seconds"] = time.time() - t0
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
