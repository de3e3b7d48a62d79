"""Decode-GEMV study on one GPU: correctness of the CUDA W4A16 GEMV (quantkit.runtime.kernels.cuda_gemv) and the
Triton W4A16 kernel against the torch reference, then µs per call of cuBLAS fp16, the Triton kernel and the CUDA
GEMV (warps per block, L2 prefetch size; above M = 8 one or two 8-token sets per launch column) at small M —
the measured basis of the W4A16 dispatch rule (quantkit.runtime.kernels.w4a16.w4a16_matmul; docs/BENCHMARKS.md
quotes the output).

    python docs/bench/gemv_sweep.py --out gemv.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from quantkit.bench.command import parse_shapes
from quantkit.bench.timing import copies_to_defeat_l2, time_rotating
from quantkit.formats.registry import get_layout
from quantkit.quant import grid
from quantkit.runtime.kernels.cuda_common import compiled
from quantkit.runtime.kernels.cuda_gemv import SOURCE, VARIANTS, VARIANTS_M16, w4a16_gemv_cuda
from quantkit.runtime.kernels.reference import w4a16_reference
from quantkit.runtime.kernels.configs import gemm_config
from quantkit.runtime.kernels.w4a16 import w4a16_matmul

def packed(n: int, k: int, gs: int = 128, seed: int = 0):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
    qw = grid.quantize(w, 4, gs, sym=False)
    lay = get_layout("w4a16")
    return {key: t.cuda() for key, t in lay.pack(qw).items()}, lay.layout_meta(qw)


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm()) if torch.isfinite(a).all() else float("inf")


def check() -> list[dict]:
    out = []
    for m, n, k, gs in [(1, 33, 256, 128), (2, 4103, 512, -1), (3, 4096, 4096, 128), (4, 257, 1024, 256),
                        (5, 33, 768, 128), (8, 1000, 2048, 128), (1, 14336, 4096, 128),
                        (12, 100, 512, 128), (16, 64, 256, 256)]:
        t, meta = packed(n, k, gs, seed=m)
        for dt in (torch.float16, torch.bfloat16):
            x = torch.randn(m, k, device="cuda").to(dt)
            ref = w4a16_reference(x, t, meta)
            row = {"m": m, "n": n, "k": k, "gs": gs, "dtype": str(dt)}
            for v in [None] + VARIANTS:
                key = "cuda_gemv" if v is None else v.key
                try:
                    row[key] = rel(w4a16_gemv_cuda(x, t, meta, v), ref)
                except Exception as e:  # noqa: BLE001
                    row[key] = f"{type(e).__name__}: {str(e)[:300]}"
            row["triton"] = rel(w4a16_matmul(x, t, meta, gemm_config(m, n, k, "w4a16")), ref)
            print(json.dumps(row), flush=True)
            out.append(row)
    return out


def time_all(shapes, ms, variants) -> list[dict]:
    rows = []
    for n, k in shapes:
        t, meta = packed(n, k)
        wb = sum(v.numel() * v.element_size() for v in t.values())
        for m in ms:
            copies = copies_to_defeat_l2(wb + 4 * m * (k + n))
            xs = [torch.randn(m, k, device="cuda").half() for _ in range(copies)]
            ts = [{key: v.clone() for key, v in t.items()} for _ in range(copies)]
            ws = [torch.randn(n, k, device="cuda").half() for _ in range(copies_to_defeat_l2(2 * n * k))]
            res = {"m": m, "n": n, "k": k}
            res["fp16"] = time_rotating(lambda x, w: F.linear(x, w), list(zip(xs, ws)))["ms"] * 1e3
            cfg = gemm_config(m, n, k, "w4a16")  # an explicit config: the Triton tensor-core kernel
            res["triton"] = time_rotating(lambda x, tt: w4a16_matmul(x, tt, meta, cfg), list(zip(xs, ts)))["ms"] * 1e3
            for v in (variants if m <= 8 else VARIANTS_M16):
                key = v.key
                try:
                    res[key] = time_rotating(lambda x, tt, v=v: w4a16_gemv_cuda(x, tt, meta, v),
                                             list(zip(xs, ts)))["ms"] * 1e3
                except Exception as e:  # noqa: BLE001
                    res[key] = f"{type(e).__name__}: {str(e)[:200]}"
            timed = {key: v for key, v in res.items() if isinstance(v, float) and key not in ("fp16",)}
            best = min(timed, key=timed.get)
            res["best"] = best
            print(f"M={m} {n}x{k}: fp16 {res['fp16']:.1f} us, triton {res['triton']:.1f}, best {best} "
                  f"{timed[best]:.1f} us ({res['fp16'] / timed[best]:.2f}x) | " +
                  " ".join(f"{key}={v:.1f}" for key, v in timed.items()), flush=True)
            rows.append(res)
            del xs, ts, ws
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", default="14336x4096,4096x4096,4096x14336,28672x4096,6144x4096")
    p.add_argument("--ms", default="1,2,4,8,16,32")
    p.add_argument("--skip-check", action="store_true")
    p.add_argument("--variants", default="", help="comma-separated variant keys to time (default: all)")
    a = p.parse_args()
    t0 = time.time()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    if not a.skip_check:
        result["check"] = check()
    shapes = parse_shapes(a.shapes)
    variants = VARIANTS
    if a.variants:
        variants = [v for v in variants if v.key in a.variants.split(",")]
    fns = {v.key: compiled(0, SOURCE, v.kernel_name(False)) for v in variants + VARIANTS_M16}
    result["registers"] = {key: [f.num_regs, f.local_size_bytes] for key, f in fns.items()}
    print("registers, local bytes:", result["registers"], flush=True)
    result["timing"] = time_all(shapes, [int(v) for v in a.ms.split(",")], variants)
    result["seconds"] = time.time() - t0
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
