"""The warp-specialized LiquidQuant kernel (:mod:`quantkit.runtime.kernels.lqq_ws`: a TMA producer warp, consumer
warpgroups) against :mod:`quantkit.runtime.kernels.lqq_wgmma` at the rule's launch, same GPU, same process: per
point the outputs compared bit for bit with lqq_wgmma's, an untimed warm-up of each, then ``--reps`` timings of
each in ABBA order, the median per side; cuBLAS fp16 once per point. Points: the rule's unsplit Gluon launches
(``--force bm:stages:tail:wg`` times that launch instead); the ``ws`` side runs the launch
:func:`quantkit.runtime.kernels.configs.lqq_ws_launch` maps it to (none where it keeps lqq_wgmma); ``--variants``
adds lqq_ws launches. (Session 16's first runs, docs/logs/session16/ws_ab_*.json before ws_ab_fixed, gave the
``ws`` side the same tile, stages and warpgroups as the rule's launch, programs per SM from the rule's table.)

    python docs/bench/ws_ab.py --out ws_ab.json        # on an H100
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from quantkit.bench.command import parse_shapes
from quantkit.bench.problems import _packed, fp16_and_lqq_inputs
from quantkit.bench.timing import time_rotating
from quantkit.runtime.kernels import lqq_wgmma, lqq_ws
from quantkit.runtime.kernels.configs import LQQ_WGMMA_MAX_TAIL, lqq_wgmma_launch, lqq_ws_launch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="4096x4096,6144x4096,14336x4096,1024x4096,4608x3584,4096x14336")
    p.add_argument("--ms", default="256,512,769,1024,2048,4096")
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--variants", default="", help="extra lqq_ws launches 'bm:tail:wg:stages:per_sm;...'")
    p.add_argument("--force", default="", help="time this launch 'bm:stages:tail:wg' instead of the rule's")
    p.add_argument("--out", default="ws_ab.json")
    args = p.parse_args()
    extra = [tuple(int(v) for v in s.split(":")) for s in args.variants.split(";") if s]
    rows = []
    for n, k in parse_shapes(args.shapes):
        t, meta = _packed("w4a8-lqq", torch.randn(n, k, device="cuda"))
        for m in [int(v) for v in args.ms.split(",")]:
            launch = lqq_wgmma_launch(m, n, k)
            if args.force:
                bm_, st_, tl_, wg_ = (int(v) for v in args.force.split(":"))
                launch = ((bm_, st_, 1, tl_), wg_)
            if launch is None or launch[0][2] != 1:
                print(json.dumps({"n": n, "k": k, "m": m, "skipped": "no unsplit Gluon launch"}), flush=True)
                continue
            if launch[0][3] > LQQ_WGMMA_MAX_TAIL:  # session 25's 256-token launches: lqq_wgmma has no such tail
                print(json.dumps({"n": n, "k": k, "m": m, "skipped": "a launch of lqq_ws only"}), flush=True)
                continue
            cfg, wg = launch
            fp16, inputs = fp16_and_lqq_inputs(t, m, n, k)
            calls = {"wgmma": lambda a, s, w: lqq_wgmma.lqq_wgmma_matmul(a, s, w, meta, *cfg, wg)}
            mapped = lqq_ws_launch(cfg, wg)  # (bm, stages, tail, wg, per_sm, split 1)
            launches = {} if mapped is None else {"ws": (mapped[0], mapped[2], mapped[3], mapped[1], mapped[4])}
            for v in extra:
                launches["ws_" + "_".join(map(str, v))] = v
            errors = {}
            ref = calls["wgmma"](*inputs[0])
            for name, (b, tl_, g, st, ps) in launches.items():
                fn = (lambda b, tl_, g, st, ps: lambda a, s, w: lqq_ws.lqq_ws_matmul(
                    a, s, w, meta, bm=b, stages=st, tail=tl_, warpgroups=g, per_sm=ps))(b, tl_, g, st, ps)
                try:
                    y = fn(*inputs[0])
                    torch.cuda.synchronize()
                except Exception as e:  # noqa: BLE001 — a launch that does not build is reported, not fatal
                    last = str(e).strip().splitlines()[-1][:200] if str(e).strip() else ""
                    errors[name] = f"{type(e).__name__}: {last}"
                    continue
                errors[name] = "bit-identical" if torch.equal(y, ref) else \
                    f"DIFFERS: max abs {(y.float() - ref.float()).abs().max().item():.4g}"
                calls[name] = fn
            sides = list(calls)
            for fn in calls.values():
                time_rotating(fn, inputs, reps=5)
            times: dict[str, list[float]] = {side: [] for side in sides}
            for rep in range(args.reps):
                for side in sides if rep % 2 == 0 else sides[::-1]:
                    times[side].append(time_rotating(calls[side], inputs)["ms"] * 1e3)
            row = {"n": n, "k": k, "m": m, "launch": [list(cfg), wg], "fp16": fp16["ms"] * 1e3, "check": errors,
                   "us": times}
            for side in sides:
                row[side] = statistics.median(times[side])
            if "ws" in row:
                row["ws_vs_wgmma"] = row["wgmma"] / row["ws"]
            print(json.dumps({kk: (round(v, 3) if isinstance(v, float) else v) for kk, v in row.items()
                              if kk != "us"}), flush=True)
            rows.append(row)
            del inputs
            torch.cuda.empty_cache()
            with open(args.out, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(), "rows": rows, "unit": "us"}, f, indent=1)


if __name__ == "__main__":
    main()
