"""LiquidQuant W4A8 on the CUDA cluster kernel (quantkit/runtime/kernels/cuda_lqq_cluster.py) over its launches —
tokens per CTA, cluster size (the K split) and stages — next to cuBLAS fp16 and the launch rule's own pick (what
int8_matmul runs), on layers with few output tiles (session 19: the 1024×4096 k/v projection, slower than fp16 at
144-480 tokens on every Gluon launch). Session 19's logs of the kernel's first, mma.sync form
(cluster_sweep_{a,b,c,d}_h100.json) came from an earlier version of this script, with ``cl_…_w<warps>`` columns.

    python docs/bench/lqq_cluster_sweep.py --shapes 1024x4096,512x3584 --ms 64,128,256,384 --out kv.json

Every launch is first checked bit for bit against the unsplit Triton LiquidQuant kernel (at the first M of each
shape). Columns ``wg_<tokens>_s<split>_st<stages>``, with ``_d2`` where two tiles' products are in flight and
``_r128`` where the CTA has two warpgroups' 128 weight rows (both session 20). The split is the one asked for:
:func:`~quantkit.runtime.kernels.cuda_lqq_cluster._cluster_split` may lower it, e.g. 8 to 4 on 14 tiles. The rule's
pick is ``rule`` (its cluster launch ``cluster_launch``, None where it runs another kernel), and
``rule_without_cluster`` the rule with the cluster kernel switched off (session 18's).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json

import torch

from quantkit.bench.command import parse_shapes
from quantkit.bench.problems import _packed, fp16_and_lqq_inputs
from quantkit.bench.timing import time_rotating
from quantkit.bench.sweep_log import print_checks, record_check, save_sweep
from quantkit.runtime.kernels.configs import TileConfig, lqq_cluster_launch, lqq_wgmma_launch
from quantkit.runtime.kernels.cuda_lqq_cluster import _check_launch, lqq_cluster_matmul
from quantkit.runtime.kernels import int8_gemm
from quantkit.runtime.kernels.int8_gemm import int8_matmul


@contextlib.contextmanager
def patched(module, name: str, value):
    """``module.name`` replaced by ``value`` inside the block."""
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def _valid(launch: tuple) -> bool:
    """Whether the kernel has an instance for (tokens, split, stages, depth, rows)."""
    try:
        _check_launch(*launch)
    except ValueError:
        return False
    return True


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="1024x4096")
    p.add_argument("--ms", default="32,64,96,128,160,192,256,320,384,448,512,640,768,1024")
    p.add_argument("--tokens", default="64,128")
    p.add_argument("--splits", default="1,2,4,8")
    p.add_argument("--stages", default="2,3,4")
    p.add_argument("--depths", default="1,2", help="tiles whose products are in flight (the kernel's two loops)")
    p.add_argument("--rows", default="64,128", help="weight rows per CTA (one warpgroup per 64)")
    p.add_argument("--out", default="lqq_cluster_sweep.json")
    args = p.parse_args()
    ints = lambda s: [int(v) for v in s.split(",")]  # noqa: E731
    todo = [c for c in itertools.product(ints(args.tokens), ints(args.splits), ints(args.stages), ints(args.depths),
                                         ints(args.rows)) if _valid(c)]
    rows, checks = [], []
    for n, k in parse_shapes(args.shapes):
        t, meta = _packed("w4a8-lqq", torch.randn(n, k, device="cuda"))
        for j, m in enumerate(ints(args.ms)):
            fp16, inputs = fp16_and_lqq_inputs(t, m, n, k)
            row = {"n": n, "k": k, "m": m, "fp16": fp16["ms"] * 1e3, "rule_launch": lqq_wgmma_launch(m, n, k),
                   "cluster_launch": lqq_cluster_launch(m, n, k)}
            row["rule"] = time_rotating(lambda a, s, w: int8_matmul(a, s, -1, "w4a8-lqq", w, meta), inputs)["ms"] * 1e3
            with patched(int8_gemm, "lqq_cluster_launch", lambda m, n, k: None):  # the rule as before session 19
                row["rule_without_cluster"] = time_rotating(
                    lambda a, s, w: int8_matmul(a, s, -1, "w4a8-lqq", w, meta), inputs)["ms"] * 1e3
            if j == 0:
                a, s, w = inputs[0]
                tri = int8_matmul(a, s, -1, "w4a8-lqq", w, meta, config=TileConfig(64, 128, 1, 4, 3))
            for launch in todo:
                tokens, split, stages, depth, weight_rows = launch
                name = (f"wg_{tokens}_s{split}_st{stages}" + ("_d2" if depth == 2 else "")
                        + f"_r{weight_rows}" * (weight_rows > 64))
                fn = lambda a, s, w, c=launch: lqq_cluster_matmul(a, s, w, meta, *c)  # noqa: E731
                if j == 0:
                    record_check(checks, {"n": n, "k": k, "m": m, "launch": name}, fn(a, s, w), tri)
                row[name] = time_rotating(fn, inputs)["ms"] * 1e3
            timed = {kk: v for kk, v in row.items() if kk.startswith("wg_")}
            best = min(timed, key=timed.get)
            row["best"], row["best_vs_fp16"] = best, row["fp16"] / timed[best]
            row["rule_vs_fp16"] = row["fp16"] / row["rule"]
            print(json.dumps({kk: row[kk] if not isinstance(row[kk], float) else round(row[kk], 2)
                              for kk in ("n", "k", "m", "fp16", "rule", "rule_without_cluster", "best", "best_vs_fp16",
                                         "rule_vs_fp16")}
                             | {"best_us": round(timed[best], 2)}), flush=True)
            rows.append(row)
            save_sweep(args.out, rows, checks)  # after every row, so a cut-off run keeps what it measured
    print_checks(checks)


if __name__ == "__main__":
    main()
