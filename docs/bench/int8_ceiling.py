"""How fast can 8-bit tensor-core GEMMs run on this GPU, with no dequantization at all? The question the
"W4A8 >= 1.6x fp16 at M >= 1024" goal turns on: a fused W4A8 kernel cannot beat the plain int8 GEMM its
products are.

Per (M, N, K): torch fp16 (cuBLAS), torch._int_mm (cuBLAS int8), torch._scaled_mm fp8 e4m3 (cuBLAS; Hopper's
8-bit tensor cores run fp8 and int8 at the same datasheet rate), and a plain Triton int8 GEMM — TMA tensor
descriptors, wgmma with both operands in shared memory, int32 accumulation, per-token × per-channel scale
epilogue to fp16 — over several tile shapes. Also the cost of a LiquidQuant → int8 dequantization pass over the
weight (the first half of a "dequantize once, then int8 GEMM" prefill path, as W4A16 does at M >= 1024 with
cuBLAS fp16), checked bit-exact against the reference. Timing: quantkit.bench.timing (CUDA events, warm-up,
median; eager calls, each >= 100 us).

    python docs/bench/int8_ceiling.py --out int8_ceiling.json
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from int8_vs_fp8 import TILES, triton_gemm8  # docs/bench is the script's own folder

from quantkit.bench.timing import time_rotating
from quantkit.runtime.kernels.dequant import planes_i8, side_by_side
from quantkit.runtime.kernels.jit import USE_ASM
from quantkit.runtime.kernels.launch import groups_in_halves

SHAPES = [(8192, 8192, 8192), (4096, 14336, 4096), (1024, 14336, 4096), (4096, 4096, 4096), (1024, 4096, 4096),
          (4096, 4096, 14336)]


def triton_i8(a, b, sa, sb, tile):
    """The plain Triton GEMM of int8_vs_fp8.py on int8 operands (int32 accumulation)."""
    return triton_gemm8(a, b, sa, sb, tile)


@triton.jit
def _lqq_dequant_i8(w_ptr, p_ptr, out_ptr, N, K, w_row, hpg, groups, BN: tl.constexpr, USE_ASM: tl.constexpr):
    """int8 Ŵ[rows, 256-column tile] of a LiquidQuant weight: ((q·s + a) mod 256) XOR 0x80 (LiquidGEMM Eq. 12)."""
    pid_n = tl.program_id(0)
    t = tl.program_id(1)
    rn = pid_n * BN + tl.arange(0, BN)
    rn_in = tl.minimum(rn, N - 1)
    words = tl.load(w_ptr + rn_in[:, None] * w_row + t * 32 + tl.arange(0, 32)[None, :])
    p_lo = tl.load(p_ptr + tl.minimum((2 * t) // hpg, groups - 1) * N + rn_in)
    p_hi = tl.load(p_ptr + tl.minimum((2 * t + 1) // hpg, groups - 1) * N + rn_in)
    planes = planes_i8(words, (p_lo & 0xFF)[:, None], ((p_lo >> 8) & 0xFF)[:, None], (p_hi & 0xFF)[:, None],
                       ((p_hi >> 8) & 0xFF)[:, None], USE_ASM)
    w = side_by_side(planes, 0, 8)
    k = t * 256 + tl.arange(0, 256)
    tl.store(out_ptr + rn[:, None] * K + k[None, :], w, mask=(rn < N)[:, None] & (k < K)[None, :])


def lqq_dequant(tensors, meta):
    qw, qp = tensors["qweight"], tensors["qparams"]
    n, k = int(meta["out_features"]), int(meta["in_features"])
    n_tiles = qw.shape[1] // 32
    out = torch.empty(n, k, dtype=torch.int8, device=qw.device)
    _lqq_dequant_i8[(triton.cdiv(n, 64), n_tiles)](qw, qp, out, n, k, qw.shape[1], groups_in_halves(meta, n_tiles),
                                                  qp.shape[0], BN=64, USE_ASM=USE_ASM, num_warps=4)
    return out


def ms_of(fn, inputs):
    return time_rotating(fn, inputs, warmup=3, reps=20, use_graph=False)["ms"]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="int8_ceiling.json")
    args = p.parse_args()
    dev = "cuda"
    rows = []
    for m, n, k in SHAPES:
        ops = 2 * m * n * k
        row = {"m": m, "n": n, "k": k}
        x16 = [torch.randn(m, k, device=dev, dtype=torch.float16) for _ in range(2)]
        w16 = [torch.randn(n, k, device=dev, dtype=torch.float16) for _ in range(2)]
        row["fp16_ms"] = ms_of(lambda x, w: torch.nn.functional.linear(x, w), list(zip(x16, w16)))
        a8 = [torch.randint(-127, 128, (m, k), device=dev, dtype=torch.int8) for _ in range(2)]
        b8 = [torch.randint(-127, 128, (n, k), device=dev, dtype=torch.int8) for _ in range(2)]
        row["int_mm_ms"] = ms_of(lambda a, b: torch._int_mm(a, b.t()), list(zip(a8, b8)))
        one = torch.ones((), device=dev)
        f8a = [x.to(torch.float8_e4m3fn) for x in x16]
        f8b = [w.to(torch.float8_e4m3fn) for w in w16]
        try:
            row["fp8_scaled_mm_ms"] = ms_of(lambda a, b: torch._scaled_mm(a, b.t(), one, one, out_dtype=torch.float16),
                                            list(zip(f8a, f8b)))
        except Exception as e:  # noqa: BLE001 — recorded, not fatal
            row["fp8_scaled_mm_error"] = str(e)[:200]
        sa = (torch.rand(m, device=dev) + 0.5) * 1e-4  # keeps products inside fp16's range
        sb = torch.rand(n, device=dev) + 0.5
        ref = (torch._int_mm(a8[0], b8[0].t()).float() * sa[:, None] * sb[None, :]).half()
        row["triton"] = []
        for tile in TILES:
            try:
                got = triton_i8(a8[0], b8[0], sa, sb, tile)
                ok = bool(torch.equal(got, ref))
                t = ms_of(lambda a, b: triton_i8(a, b, sa, sb, tile), list(zip(a8, b8)))
                row["triton"].append({"tile": tile, "ms": t, "exact": ok, "tops": ops / t / 1e9})
            except Exception as e:  # noqa: BLE001
                row["triton"].append({"tile": tile, "error": str(e)[:200]})
        for key in ("fp16_ms", "int_mm_ms", "fp8_scaled_mm_ms"):
            if key in row:
                row[key.replace("_ms", "_tops")] = ops / row[key] / 1e9
        best = min((r for r in row["triton"] if "ms" in r), key=lambda r: r["ms"], default=None)
        if best:
            row["triton_best_vs_fp16"] = row["fp16_ms"] / best["ms"]
        row["int_mm_vs_fp16"] = row["fp16_ms"] / row["int_mm_ms"]
        if "fp8_scaled_mm_ms" in row:
            row["fp8_vs_fp16"] = row["fp16_ms"] / row["fp8_scaled_mm_ms"]
        print(json.dumps({kk: v for kk, v in row.items() if kk != "triton"}), flush=True)
        for r in row["triton"]:
            print("   ", json.dumps(r), flush=True)
        rows.append(row)
        del x16, w16, a8, b8, f8a, f8b
        torch.cuda.empty_cache()
    # LiquidQuant -> int8 dequantization pass, the weight of the two widest shapes
    from quantkit.bench.problems import _packed
    from quantkit.runtime.kernels.reference import int8_weight

    deq = []
    for n, k in ((14336, 4096), (4096, 14336), (4096, 4096)):
        t, meta = _packed("w4a8-lqq", torch.randn(n, k, device=dev))
        exact = bool(torch.equal(lqq_dequant(t, meta), int8_weight("w4a8-lqq", t, meta)[:, :k].to(torch.int8)))
        copies = [{kk: v.clone() for kk, v in t.items()} for _ in range(4)]
        ms = time_rotating(lambda tt: lqq_dequant(tt, meta), [(c,) for c in copies], reps=30)["ms"]
        deq.append({"n": n, "k": k, "ms": ms, "exact": exact, "gbps": (n * k * 1.5) / ms / 1e6})
        print("dequant", json.dumps(deq[-1]), flush=True)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "triton": triton.__version__, "gemm": rows, "lqq_dequant": deq}, f, indent=1)


if __name__ == "__main__":
    main()
