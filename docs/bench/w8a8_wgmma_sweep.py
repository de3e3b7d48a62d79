"""MixLLM W8A8 (sym-8 g128 × A8 g128) above M = 16: the Gluon TMA kernel (quantkit/runtime/kernels/w8a8_wgmma.py)
against the Triton kernel (its default tile, gemm_config) and cuBLAS fp16. First checks it bit-exact against the Triton
kernel and within 1e-3 of the torch reference.

    python docs/bench/w8a8_wgmma_sweep.py --out w8a8_wgmma.json
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from quantkit.bench.command import parse_shapes
from quantkit.bench.problems import _packed
from quantkit.bench.timing import copies_to_defeat_l2, time_rotating
from quantkit.bench.sweep_log import save_sweep
from quantkit.runtime.kernels.act_quant import quantize_activation_triton
from quantkit.runtime.kernels.configs import TileConfig, gemm_config
from quantkit.runtime.kernels.int8_gemm import int8_matmul
from quantkit.runtime.kernels.reference import int8_reference
from quantkit.runtime.kernels.w8a8_wgmma import w8a8_wgmma_matmul

# (BM, BN, stages, warps, scales a block ahead): the tiles of docs/logs/w8a8_wgmma_h100.json, and since session 21 the
# group scales loaded one K block ahead ("_ahead" in the column names). (docs/logs/session21/w8a8_pipe_h100.json timed
# a pipelined loop at 54a8601, two int32 accumulators in turn, "_pipe"; docs/logs/w8a8_wgmma_paired_h100.json an
# earlier variant that paired K blocks, and register caps; all slower or no faster, none kept in the code.)
VARIANTS = [(128, 128, 4, 8, False, 1), (128, 128, 4, 8, True, 1), (128, 64, 4, 8, False, 1),
            (64, 128, 4, 4, False, 1), (64, 128, 4, 4, True, 1), (64, 64, 4, 4, False, 1), (64, 64, 4, 4, True, 1)]
# (... , K split): since session 21 the kernel splits K too ("_s<split>" in the column names), for the small-M sweep:
#   --variants "64,64,4,4,1,1;64,64,4,4,1,2;64,64,4,4,1,4;64,128,4,4,1,1;64,128,4,4,1,2;64,128,4,4,1,4"
def variant_name(bm: int, bn: int, st: int, nw: int, ahead: bool, split: int = 1) -> str:
    """The column of a variant in the sweep's rows."""
    return f"gluon_{bm}_{bn}_{st}_{nw}" + ("_ahead" if ahead else "") + (f"_s{split}" if split > 1 else "")

def runs(meta: dict, variants: list) -> dict:
    """Column → call (codes, scales, act group, weight tensors) of every variant timed."""
    return {variant_name(*v): (lambda a, s, g, w, v=v: w8a8_wgmma_matmul(a, s, g, w, meta, *v)) for v in variants}


def check(dev: str, variants: list) -> list[dict]:
    out = []
    for (n, k), m, ag in [((200, 512), 33, 128), ((1000, 1024), 130, 128), ((64, 256), 1, 128), ((127, 1280), 257, -1),
                          ((4096, 4096), 300, 128), ((70, 640), 65, 128)]:
        t, meta = _packed("w8", torch.randn(n, k, device=dev))
        a, s = quantize_activation_triton(torch.randn(m, k, device=dev, dtype=torch.float16), 8, ag)
        ref = int8_reference(a, s, ag, "w8", t, meta).float()
        # the Triton kernel split the same way as each variant: the same sums only then (session 21's first split
        # sweep, docs/logs/session21/w8a8_split_h100.json, compared the split variants with the unsplit kernel)
        tri_at = {split: int8_matmul(a, s, ag, "w8", t, meta, config=TileConfig(64, 64, split, 4, 3))
                  for split in {v[5] for v in variants}}
        for (name, call), variant in zip(runs(meta, variants).items(), variants):
            tri = tri_at[variant[5]]
            got = call(a, s, ag, t)
            rel = ((got.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-9)).item()
            out.append({"n": n, "k": k, "m": m, "act_group": ag, "variant": name,
                        "equal_triton": bool(torch.equal(got, tri)), "rel_vs_reference": rel})
            if not out[-1]["equal_triton"] or rel > 1e-3:
                print("check", json.dumps(out[-1]), flush=True)
    print("checks:", len(out), "all equal:", all(c["equal_triton"] for c in out), "max rel:",
          max(c["rel_vs_reference"] for c in out), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="w8a8_wgmma.json")
    p.add_argument("--shapes", default="14336x4096,4096x4096,6144x4096,28672x4096,4096x14336")
    p.add_argument("--ms", default="32,64,128,256,512,1024,2048,4096")
    p.add_argument("--variants", default="", help="';'-separated bm,bn,stages,warps,ahead,split (default VARIANTS)")
    args = p.parse_args()
    variants = VARIANTS if not args.variants else [
        tuple(int(x) for x in v.split(",")[:4]) + (bool(int(v.split(",")[4])), int(v.split(",")[5]))
        for v in args.variants.split(";")]
    dev = "cuda"
    checks = check(dev, variants)
    rows = []
    for n, k in parse_shapes(args.shapes):
        t, meta = _packed("w8", torch.randn(n, k, device=dev))
        for m in [int(v) for v in args.ms.split(",")]:
            copies = copies_to_defeat_l2(n * k + 3 * m * k + 2 * m * n)
            xs = [torch.randn(m, k, device=dev, dtype=torch.float16) for _ in range(copies)]
            ws = [torch.randn(n, k, device=dev, dtype=torch.float16) for _ in range(min(copies, 4))]
            row = {"n": n, "k": k, "m": m}
            row["fp16"] = time_rotating(lambda x, w: F.linear(x, w), [(x, ws[i % len(ws)]) for i, x in
                                                                     enumerate(xs)], reps=20)["ms"] * 1e3
            del ws
            tt = [{kk: v.clone() for kk, v in t.items()} for _ in range(copies)]
            inputs = [quantize_activation_triton(x, 8, 128) + (w,) for x, w in zip(xs, tt)]
            row["triton"] = time_rotating(lambda a, s, w: int8_matmul(a, s, 128, "w8", w, meta,
                                                                      config=gemm_config(m, n, k, "w8")),
                                          inputs, reps=20)["ms"] * 1e3
            # the launch rule as int8_matmul applies it (the A8 GEMV up to 16 tokens, this kernel or Triton above)
            row["rule"] = time_rotating(lambda a, s, w: int8_matmul(a, s, 128, "w8", w, meta), inputs,
                                        reps=20)["ms"] * 1e3
            for name, call in runs(meta, variants).items():
                row[name] = time_rotating(lambda a, s, w: call(a, s, 128, w), inputs, reps=20)["ms"] * 1e3
            best = min((v, kk) for kk, v in row.items() if kk.startswith("gluon_"))
            row["best_gluon"], row["best_gluon_vs_fp16"] = best[1], row["fp16"] / best[0]
            row["triton_vs_fp16"] = row["fp16"] / row["triton"]
            print(json.dumps({kk: (round(v, 2) if isinstance(v, float) else v) for kk, v in row.items()}), flush=True)
            rows.append(row)
            del xs, tt, inputs
            torch.cuda.empty_cache()
            save_sweep(args.out, rows, checks)  # after every row: a run cut short keeps what it measured


if __name__ == "__main__":
    main()
