"""LiquidQuant above the small-M range: every launch option of the large-M wave model (configs.LQQ_BIG_M_WS_LONG_ROWS,
which holds LQQ_BIG_M_WS's five and the five two-warpgroup options session 24 added), timed on the warp-specialized
kernel at each point, with the rule's own launch and cuBLAS fp16 — the data the model's per-option constants are
fitted to (``docs/bench/lqq_big_m_fit.py``). Each option is (tokens per program, warpgroups of 64 weight rows,
activation stages); a program is 128 tokens plus a tail of ``tokens - 128``. Every option's output is checked bit
for bit against the rule's launch (same K split, so the same int32 sums). The bench's timing (CUDA graphs, rotating
inputs, quantized activations).

    python docs/bench/lqq_big_m_options.py --out big_m_options.json
"""

from __future__ import annotations

import argparse
import json

import torch

from quantkit.bench.command import parse_shapes
from quantkit.bench.problems import _packed, fp16_and_lqq_inputs
from quantkit.bench.sweep_log import save_sweep
from quantkit.bench.timing import time_rotating
from quantkit.runtime.kernels.configs import LQQ_BIG_M_WS_LONG_ROWS, lqq_wgmma_launch
from quantkit.runtime.kernels.int8_gemm import int8_matmul
from quantkit.runtime.kernels.lqq_ws import lqq_ws_matmul

SHAPES = ("4096x4096,6144x4096,14336x4096,28672x4096,4096x14336,4608x3584,3584x3584,8192x4096,2048x4096,"
          "1536x4096,1024x4096")


def option_per_sm(option: tuple[int, int, int]) -> int:
    """Programs meant to share an SM: the model's value for its own options, one for two warpgroups (their
    consumers need ~230 registers each)."""
    return LQQ_BIG_M_WS_LONG_ROWS[option][0] if option in LQQ_BIG_M_WS_LONG_ROWS else 1


def main() -> None:
    """Time the rule, fp16 and every option per shape and M; write the rows and the bit-exactness checks."""
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default=SHAPES)
    p.add_argument("--ms", default="513,769,1024,1536,2048,3072,4096")
    p.add_argument("--options", default=None, help="tokens,warpgroups,stages;... (default: every option of "
                                                   "configs.LQQ_BIG_M_WS_LONG_ROWS, a superset of LQQ_BIG_M_WS)")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--out", default="big_m_options.json")
    args = p.parse_args()
    options = ([tuple(int(v) for v in o.split(",")) for o in args.options.split(";")] if args.options
               else list(LQQ_BIG_M_WS_LONG_ROWS))
    rows, checks = [], []
    for n, k in parse_shapes(args.shapes):
        t, meta = _packed("w4a8-lqq", torch.randn(n, k, device="cuda"))
        for m in [int(v) for v in args.ms.split(",")]:
            fp16, inputs = fp16_and_lqq_inputs(t, m, n, k)
            row = {"n": n, "k": k, "m": m, "fp16": fp16["ms"] * 1e3, "rule_launch": lqq_wgmma_launch(m, n, k)}
            rule = lambda a, s, w: int8_matmul(a, s, -1, "w4a8-lqq", w, meta)  # noqa: E731
            want = rule(*inputs[0])
            # untimed first: in session 24's run the launch timed first at a point ran up to 1.27x slower than the
            # same launch timed later in the row (the GPU coming back from the packing and the fp16 timing)
            time_rotating(rule, inputs, reps=5)
            row["rule"] = time_rotating(rule, inputs, reps=args.reps)["ms"] * 1e3
            for tokens, wg, stages in options:
                def call(a, s, w, tokens=tokens, wg=wg, stages=stages):
                    return lqq_ws_matmul(a, s, w, meta, 128, stages, tokens - 128, wg,
                                         option_per_sm((tokens, wg, stages)))
                name = f"{tokens}_{wg}_{stages}"
                try:
                    same = bool(torch.equal(call(*inputs[0]), want))
                except Exception as e:  # noqa: BLE001 — an option that does not build is recorded, not fatal
                    row[name] = None
                    checks.append({"n": n, "k": k, "m": m, "option": name, "error": str(e)[:200]})
                    continue
                checks.append({"n": n, "k": k, "m": m, "option": name, "equal_rule": same})
                if not same:
                    print(f"NOT EQUAL {n}x{k} M={m} {name}", flush=True)
                row[name] = time_rotating(call, inputs, reps=args.reps)["ms"] * 1e3
            timed = {kk: v for kk, v in row.items() if kk[0].isdigit() and v is not None}
            if timed:  # none where no option built
                row["best"] = min(timed, key=timed.get)
                row["best_vs_rule"] = row["rule"] / timed[row["best"]]
            print(json.dumps({kk: (round(v, 2) if isinstance(v, float) else v) for kk, v in row.items()}), flush=True)
            rows.append(row)
            del inputs
            torch.cuda.empty_cache()
            save_sweep(args.out, rows, checks)  # after every row, so a cut-off run keeps what it measured


if __name__ == "__main__":
    main()
