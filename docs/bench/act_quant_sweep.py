"""The activation quantizer's cost at decode and prefill sizes, alone and in front of the A8 GEMMs.

Times (same rules as ``quantkit bench``: CUDA graphs, rotating copies past the L2, median) the Triton activation
quantizer (quantkit/runtime/kernels/act_quant.py) per token and per 128-column group at several token counts and
widths, under its default launch and under other warp counts / rows per program; then, at decode sizes, the
LiquidQuant and mixed GEMMs alone, with the quantizer in front (what ``+aq`` in the bench times), and with an empty
Triton kernel in front (what any kernel boundary costs).

    python docs/bench/act_quant_sweep.py --out act_quant.json

docs/logs/act_quant_h100.json came from the 87b3659 version of this script, run on its parent's kernels: the
variants launched the kernels directly into preallocated outputs ("default" went through the wrapper, which
allocates them: the two forms of one launch differed by up to 27 % at M = 64-256) and the quantizer had no
programmatic-launch trigger; every column now goes through ``quantize_activation_triton(..., launch=(rows,
warps))``.
"""

from __future__ import annotations

import argparse
import json

import torch
import triton
import triton.language as tl

from quantkit.bench.problems import build_problem
from quantkit.bench.timing import copies_to_defeat_l2, time_rotating
from quantkit.runtime.kernels import act_quant as aq


@triton.jit
def _empty(x_ptr):
    pid = tl.program_id(0)
    if pid < 0:
        tl.store(x_ptr, 0)


def quantizer_rows(ms, ks) -> list[dict]:
    rows = []
    for k in ks:
        for m in ms:
            copies = copies_to_defeat_l2(3 * m * k)
            xs = [torch.randn(m, k, device="cuda", dtype=torch.float16) for _ in range(copies)]
            for group in (-1, 128):
                ref = aq.quantize_activation_triton(xs[0], 8, group)
                row = {"m": m, "k": k, "group": group,
                       "default": time_rotating(lambda x: aq.quantize_activation_triton(x, 8, group),
                                                [(x,) for x in xs])["ms"] * 1e3}
                bk = triton.next_power_of_2(k)
                bms = sorted({b for b in (1, 2, 4, 8, 16) if b <= max(1, 16384 // bk)}) if group == -1 \
                    else [1, 4, 16]
                for warps in (1, 2, 4, 8):
                    for bm in bms:
                        if bm > 1 and bm > 2 * m:
                            continue
                        got = aq.quantize_activation_triton(xs[0], 8, group, launch=(bm, warps))
                        if not (torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])):
                            raise SystemExit(f"variant w{warps} bm{bm} differs at M={m} K={k} group={group}")
                        row[f"w{warps}_bm{bm}"] = time_rotating(
                            lambda x: aq.quantize_activation_triton(x, 8, group, launch=(bm, warps)),
                            [(x,) for x in xs])["ms"] * 1e3
                print(json.dumps({a: (round(v, 2) if isinstance(v, float) else v) for a, v in row.items()}),
                      flush=True)
                rows.append(row)
            del xs
    return rows


def composite_rows(ms, shapes) -> list[dict]:
    rows = []
    for n, k in shapes:
        for m in ms:
            for base in ("w4a8-lqq", "mixed"):
                plain = build_problem(base, m, n, k)
                with_aq = build_problem(base + "+aq", m, n, k)
                row = {"m": m, "n": n, "k": k, "method": base,
                       "gemm": time_rotating(plain.fn, plain.inputs)["ms"] * 1e3,
                       "aq_gemm": time_rotating(with_aq.fn, with_aq.inputs)["ms"] * 1e3}
                flag = torch.zeros(1, device="cuda", dtype=torch.int32)

                def empty_then(*args, fn=plain.fn):
                    _empty[(1,)](flag)
                    return fn(*args)
                row["empty_gemm"] = time_rotating(empty_then, plain.inputs)["ms"] * 1e3
                group = -1 if base == "w4a8-lqq" else 128
                xs = [(torch.randn(m, k, device="cuda", dtype=torch.float16),) for _ in range(8)]
                row["aq"] = time_rotating(lambda x: aq.quantize_activation_triton(x, 8, group), xs)["ms"] * 1e3
                print(json.dumps({a: (round(v, 2) if isinstance(v, float) else v) for a, v in row.items()}),
                      flush=True)
                rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="act_quant.json")
    p.add_argument("--ms", default="1,2,4,8,16,64,256,1024,4096")
    p.add_argument("--ks", default="4096,14336")
    p.add_argument("--composite-ms", default="1,2,4,8")
    p.add_argument("--shapes", default="4096x4096,14336x4096")
    args = p.parse_args()
    ms = [int(v) for v in args.ms.split(",")]
    ks = [int(v) for v in args.ks.split(",")]
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    out = {"device": torch.cuda.get_device_name(), "unit": "us"}
    out["composite"] = composite_rows([int(v) for v in args.composite_ms.split(",")], shapes)
    out["quantizer"] = quantizer_rows(ms, ks)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
