"""The Gluon kernels (LiquidQuant W4A8 ``lqq_wgmma``, W4A16 ``w4a16_wgmma``) of the working tree against the same
kernels as an earlier commit had them, same launches, same GPU, same process: per point an untimed warm-up of each,
then ``--reps`` timings of each in ABBA order (old, new, new, old, ...; with several ``--old-dir`` folders
forward then backward), the median per side; cuBLAS fp16 (and, for
W4A16, the launch rule's own path, dequantize-then-cuBLAS above 512 tokens) once per point. The old kernels are read
from ``--old-dir`` (``wgmma_common.py``, ``lqq_wgmma.py``, ``w4a16_wgmma.py`` of that commit, written there by
``--extract REV`` on a machine with the repository's history), loaded as modules of their own. Launches: the rules'
where they pick a Gluon kernel, and ``--w4a16-forced`` for W4A16 token counts where the rule does not.

    python docs/bench/kernel_ab.py --extract 7c93ec9 --old-dir docs/bench/_ab_old     # here, with git history
    python docs/bench/kernel_ab.py --old-dir docs/bench/_ab_old --out kernel_ab.json   # on the GPU
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from quantkit.bench.command import parse_shapes
from quantkit.bench.problems import _packed
from quantkit.bench.timing import copies_to_defeat_l2, time_rotating
from quantkit.runtime.kernels import lqq_wgmma, w4a16_wgmma
from quantkit.runtime.kernels.act_quant import quantize_activation_triton
from quantkit.runtime.kernels.configs import LQQ_WGMMA_MAX_TAIL, lqq_wgmma_launch, w4a16_wgmma_config
from quantkit.runtime.kernels.w4a16 import w4a16_matmul

FILES = ("wgmma_common.py", "lqq_wgmma.py", "w4a16_wgmma.py")
COMMON = "quantkit.runtime.kernels.wgmma_common"


def extract(rev: str, out_dir: Path) -> None:
    """Write the kernel files of commit ``rev`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        src = subprocess.run(["git", "show", f"{rev}:quantkit/runtime/kernels/{name}"], capture_output=True,
                             text=True, check=True).stdout
        (out_dir / name).write_text(src)


def load_old(old_dir: Path, tag: str = "old") -> dict:
    """The kernel modules in ``old_dir``, as ``<tag>_wgmma_common`` / ``<tag>_lqq_wgmma`` / ``<tag>_w4a16_wgmma``,
    the two kernels importing that common module."""
    mods = {}
    for name in FILES:
        src = (old_dir / name).read_text().replace(COMMON, f"{tag}_wgmma_common")
        path = old_dir / f"{tag}_{name}"
        path.write_text(src)
        spec = importlib.util.spec_from_file_location(f"{tag}_{name[:-3]}", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # Triton's JIT and the dataclasses look the module up there
        spec.loader.exec_module(mod)
        mods[name[:-3]] = mod
    return mods


def _w4a16_args(mod, cfg: tuple) -> tuple:
    """``cfg`` (bm, stages, split, warpgroups) as ``mod``'s w4a16_wgmma_matmul takes it: kernels before session 16
    also took plane pairs in flight after the split (their rule's: 2 on 32-token tiles, else 1)."""
    if "pairs" in inspect.signature(mod.w4a16_wgmma_matmul).parameters:
        return cfg[:3] + (2 if cfg[0] == 32 else 1,) + cfg[3:]
    return cfg


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--extract", metavar="REV", help="write REV's kernel files to --old-dir and stop")
    p.add_argument("--old-dir", default="docs/bench/_ab_old",
                   help="comma-separated folders of kernel files, each timed as a side named by the folder")
    p.add_argument("--shapes", default="4096x4096,6144x4096,14336x4096,1024x4096,4608x3584,4096x14336")
    p.add_argument("--ms", default="128,256,512,769,1024,1536,2048,4096")
    p.add_argument("--kernels", default="lqq,w4a16")
    p.add_argument("--w4a16-forced", default="128,3,1,2", help="W4A16 launch where the rule picks no Gluon one")
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--out", default="kernel_ab.json")
    args = p.parse_args()
    if args.extract:
        extract(args.extract, Path(args.old_dir))
        return
    dirs = [Path(d) for d in args.old_dir.split(",")]
    variants = {d.name.lstrip("_") or "old": load_old(d, d.name.lstrip("_") or "old") for d in dirs}
    first = next(iter(variants))  # the baseline of new_vs_old
    sides = list(variants) + ["new"]
    forced = tuple(int(v) for v in args.w4a16_forced.split(","))
    kernels = args.kernels.split(",")
    rows = []
    for n, k in parse_shapes(args.shapes):
        packed = {kind: _packed(layout, torch.randn(n, k, device="cuda"))
                  for kind, layout in (("lqq", "w4a8-lqq"), ("w4a16", "w4a16")) if kind in kernels}
        for m in [int(v) for v in args.ms.split(",")]:
            copies = copies_to_defeat_l2(n * k // 2 + 3 * m * k + 2 * m * n)
            xs = [torch.randn(m, k, device="cuda", dtype=torch.float16) for _ in range(copies)]
            ws = [torch.randn(n, k, device="cuda", dtype=torch.float16) for _ in range(min(copies, 4))]
            fp16 = time_rotating(lambda x, w: F.linear(x, w), [(x, ws[i % len(ws)]) for i, x in enumerate(xs)])
            del ws
            for kind in kernels:
                t, meta = packed[kind]
                if kind == "lqq":
                    launch = lqq_wgmma_launch(m, n, k)
                    if launch is None or launch[0][3] > LQQ_WGMMA_MAX_TAIL:  # none, or lqq_ws's 256-token launch
                        continue
                    cfg, wg = launch
                    qa = [quantize_activation_triton(x, 8, -1) for x in xs]
                    inputs = [(a, s, {kk: v.clone() for kk, v in t.items()}) for a, s in qa]
                    calls = {side: (lambda mod: lambda a, s, w: mod.lqq_wgmma_matmul(a, s, w, meta, *cfg, wg))(mod)
                             for side, mod in [(v, variants[v]["lqq_wgmma"]) for v in variants] + [("new", lqq_wgmma)]}
                    rule_us = None
                    label = [list(cfg), wg]
                else:
                    cfg = w4a16_wgmma_config(m, n, k) or forced
                    inputs = [(x, {kk: v.clone() for kk, v in t.items()}) for x in xs]
                    calls = {side: (lambda mod: lambda x, w: mod.w4a16_wgmma_matmul(
                        x, w, meta, *_w4a16_args(mod, cfg)))(mod)
                             for side, mod in [(v, variants[v]["w4a16_wgmma"]) for v in variants]
                             + [("new", w4a16_wgmma)]}
                    rule_us = time_rotating(lambda x, w: w4a16_matmul(x, w, meta), inputs)["ms"] * 1e3
                    label = list(cfg)
                for fn in calls.values():
                    time_rotating(fn, inputs, reps=5)
                times: dict[str, list[float]] = {side: [] for side in sides}
                for rep in range(args.reps):  # forward, then backward: no side always first
                    for side in sides if rep % 2 == 0 else sides[::-1]:
                        times[side].append(time_rotating(calls[side], inputs)["ms"] * 1e3)
                row = {"kernel": kind, "n": n, "k": k, "m": m, "launch": label, "fp16": fp16["ms"] * 1e3,
                       "rule_path": rule_us, "us": times}
                for side in sides:
                    row[side] = statistics.median(times[side])
                row["new_vs_old"] = row[first] / row["new"]
                row["new_vs_fp16"] = row["fp16"] / row["new"]
                print(json.dumps({kk: (round(v, 3) if isinstance(v, float) else v) for kk, v in row.items()
                                  if kk != "us"}), flush=True)
                rows.append(row)
                del inputs
            del xs
            torch.cuda.empty_cache()
            with open(args.out, "w") as f:  # after every point, so a cut-off run keeps what it measured
                json.dump({"device": torch.cuda.get_device_name(), "rows": rows, "unit": "us"}, f, indent=1)


if __name__ == "__main__":
    main()
