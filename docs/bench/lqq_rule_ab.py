"""LiquidQuant W4A8: the launch rule at HEAD against the rule of an earlier commit, on the same GPU in the same
process: per point one untimed warm-up timing of each rule, then ``--reps`` timings of each in ABBA order (old, new,
new, old, ...), so that neither rule always runs first and a machine's drift hits both alike; the median per rule.
Only the token counts where the two rules pick different launches are timed (``--all``: every one). Kernels on
quantized activations, the bench's timing (CUDA graphs, rotating inputs), cuBLAS fp16 once per point. A launch
counts with its halved tiles (``configs.lqq_ws_halves``, session 26) where the rule has them. Run from the
repository root (the old rule is read with ``git show``).

    python docs/bench/lqq_rule_ab.py --rev ca490eb --reps 4 --out lqq_rule_ab.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import inspect
import subprocess
import sys
import types

import torch

from quantkit.bench.command import parse_shapes
from quantkit.bench.problems import _packed, fp16_and_lqq_inputs
from quantkit.bench.timing import time_rotating
from quantkit.runtime.kernels import configs
from quantkit.runtime.kernels.configs import gemm_config, lqq_wgmma_launch, lqq_ws_launch
from quantkit.runtime.kernels.int8_gemm import int8_matmul
from quantkit.runtime.kernels.lqq_wgmma import lqq_wgmma_matmul
from quantkit.runtime.kernels.lqq_ws import lqq_ws_matmul

M_DEFAULT = ("513,576,640,700,704,768,769,832,896,960,1000,1024,1025,1280,1536,1792,2048,2049,2560,3000,3072,3584,"
             "4096")


def old_rule(rev: str, old_file: str | None = None) -> types.ModuleType:
    """quantkit/runtime/kernels/configs.py as it was at commit ``rev`` (or the file ``old_file``: a copy of it, for a
    machine whose repository lacks that commit), as a module of its own."""
    if old_file is not None:
        with open(old_file) as f:
            src = f.read()
    else:
        src = subprocess.run(["git", "show", f"{rev}:quantkit/runtime/kernels/configs.py"], capture_output=True,
                             text=True, check=True).stdout
    module = types.ModuleType(f"configs_{rev}")
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(compile(src, f"configs@{rev}", "exec"), module.__dict__)  # noqa: S102 - our own file at an earlier commit
    return module


def rule_halves(rule: types.ModuleType, launch, m: int, n: int, k: int) -> int | None:
    """``halves_from`` that the configs module ``rule`` gives its Gluon ``launch`` (None before session 26, which
    added ``lqq_ws_halves``; its first form took no K)."""
    halves = getattr(rule, "lqq_ws_halves", None)
    ws = rule.lqq_ws_launch(*launch) if launch is not None else None
    if halves is None or ws is None:
        return None
    return halves(m, n, k, ws) if "k" in inspect.signature(halves).parameters else halves(m, n, ws)


def runner(launch, halves, triton_config, m: int, n: int, k: int, meta: dict):
    """A call of the launch ``launch`` ((config, warpgroups) of the Gluon kernel, or None: the Triton kernel with the
    tile ``triton_config`` (the rule's own ``gemm_config``) gives), on the kernel int8_matmul runs it with at HEAD:
    :mod:`.lqq_ws` where :func:`.configs.lqq_ws_launch` maps the launch to it (its tiles from ``halves`` on halved),
    else :mod:`.lqq_wgmma`."""
    if launch is None:
        cfg = triton_config(m, n, k, "lqq")
        return lambda a, s, w: int8_matmul(a, s, -1, "w4a8-lqq", w, meta, config=cfg)
    cfg, wg = launch
    ws = lqq_ws_launch(cfg, wg)
    if ws is not None:
        return lambda a, s, w: lqq_ws_matmul(a, s, w, meta, *ws, halves_from=halves)
    return lambda a, s, w: lqq_wgmma_matmul(a, s, w, meta, *cfg, wg)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rev", default="ca490eb", help="the commit whose rule is the baseline")
    p.add_argument("--old-file", help="that commit's configs.py, saved (`git show REV:quantkit/runtime/kernels/"
                                      "configs.py`), where the repository here lacks the commit")
    p.add_argument("--shapes", default="6144x4096,4096x4096,4608x3584,1024x4096,14336x4096,28672x4096,4096x14336")
    p.add_argument("--ms", default=M_DEFAULT)
    p.add_argument("--reps", type=int, default=4, help="timings of each rule per point, in ABBA order")
    p.add_argument("--all", action="store_true", help="also the token counts where both rules agree")
    p.add_argument("--out", default="lqq_rule_ab.json")
    args = p.parse_args()
    before = old_rule(args.rev, args.old_file)
    rules = {"old": (before.lqq_wgmma_launch, before.gemm_config, before),
             "new": (lqq_wgmma_launch, gemm_config, configs)}
    rows = []
    for n, k in parse_shapes(args.shapes):
        t, meta = _packed("w4a8-lqq", torch.randn(n, k, device="cuda"))
        for m in [int(v) for v in args.ms.split(",")]:
            old, new = rules["old"][0](m, n, k), rules["new"][0](m, n, k)
            halves = {name: rule_halves(rules[name][2], launch, m, n, k) for name, launch in (("old", old),
                                                                                          ("new", new))}
            if (old, halves["old"]) == (new, halves["new"]) and not args.all:
                continue
            fp16, inputs = fp16_and_lqq_inputs(t, m, n, k)
            calls = {name: runner(launch, halves[name], rules[name][1], m, n, k, meta)
                     for name, launch in (("old", old), ("new", new))}
            # unsplit launches of any kernel give the same bits (exact int32 sums, one epilogue); K splits may not
            bits_equal = bool(torch.equal(calls["old"](*inputs[0]), calls["new"](*inputs[0])))
            for fn in calls.values():  # untimed: in the first A/B (old always first) each rule's first of two
                time_rotating(fn, inputs, reps=5)  # timings ran 1.02-1.06x its second
            times: dict[str, list[float]] = {"old": [], "new": []}
            for rep in range(args.reps):
                for name in ("old", "new") if rep % 2 == 0 else ("new", "old"):
                    times[name].append(time_rotating(calls[name], inputs)["ms"] * 1e3)
            row = {"n": n, "k": k, "m": m, "fp16": fp16["ms"] * 1e3, "old_launch": old, "new_launch": new,
                   "old_halves": halves["old"], "new_halves": halves["new"], "bits_equal": bits_equal,
                   "old_us": times["old"], "new_us": times["new"], "old": statistics.median(times["old"]),
                   "new": statistics.median(times["new"])}
            row["new_vs_old"] = row["old"] / row["new"]
            row["old_vs_fp16"], row["new_vs_fp16"] = row["fp16"] / row["old"], row["fp16"] / row["new"]
            print(json.dumps({kk: (round(v, 3) if isinstance(v, float) else v) for kk, v in row.items()}), flush=True)
            rows.append(row)
            del inputs
            torch.cuda.empty_cache()
            with open(args.out, "w") as f:  # after every row, so a cut-off run keeps what it measured
                json.dump({"device": torch.cuda.get_device_name(), "rev": args.rev, "rows": rows, "unit": "us"}, f,
                          indent=1)


if __name__ == "__main__":
    main()
