"""Is the Triton int8 GEMM slower than the same GEMM on fp8 only because Triton waits out every int8 K block?

Session 24 (docs/BENCHMARKS.md) found the int8 build of ``int8_vs_fp8.py``'s Triton GEMM 1.16-1.19× slower than its
fp8 build on one-warpgroup tiles at M = 1024, and its PTX ending every K block with ``wgmma.wait_group 0`` where the
fp8 build keeps one block in flight (``wait_group 1``). The reason is a rule of Triton's wgmma pipeliner
(``lib/Dialect/TritonGPU/Transforms/Pipeliner/WGMMAPipeline.cpp``, ``dotCanBeProperlyAsync``, "Rule 2.1: We don't make
the dot async if the accumulator is not fp32"): a dot with an int32 accumulator gets a ``wait 0`` right after it.

This driver measures what that rule costs. It runs ``int8_vs_fp8.py`` twice on the same shapes, each in a process of
its own with a fresh Triton cache:

1. as it is, with Triton dumping each kernel's IR (``TRITON_KERNEL_DUMP``);
2. with each int8 kernel's final TTGIR overridden (``TRITON_KERNEL_OVERRIDE``) by the dumped one edited the way the
   pipeliner edits an fp32 dot: the in-loop wait keeps one dot in flight (``pendings = 1``) and a ``pendings = 0``
   wait after the loop guards the epilogue. The loop's next TMA load goes into the slot of the dot from the block
   before, which that ``pendings = 1`` wait has retired — the fp8 build's schedule, so by that argument the edit adds
   no race (and every output was exact). ``--save-ttgir DIR`` keeps the edited files.

Both runs check every output against cuBLAS (``max_rel_err``: int8 exact up to the fp16 epilogue) and record the
``wait_group`` operands of the PTX that ran (``wait_groups``), so the second run shows the edit took effect.

    python docs/bench/int8_async_wgmma.py --out int8_async.json [--shapes 1024x14336x4096,...] [--tiles ...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
KERNEL = "_gemm8"  # int8_vs_fp8.py's Triton GEMM: its IR files are named after it


def async_ttgir(text: str) -> str | None:
    """The TTGIR of an int8 build with its K loop's dot made asynchronous (module docstring), or None where the text
    is not such a build (an fp8 build, or no ``pendings = 0`` wait inside the loop)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if " = scf.for " in line and "xi32, #mma>" in line), None)
    if start is None:
        return None
    head = re.match(r"^(\s*)(%[\w.]+):\d+ = scf\.for .*?-> \((tensor<[^>]*xi32, #mma>)", lines[start])
    if head is None:
        return None
    indent, result, acc_type = head.groups()
    end = next(i for i in range(start + 1, len(lines)) if re.match(rf"^{indent}\}}", lines[i]))
    waits = [i for i in range(start, end) if "ttng.warp_group_dot_wait" in lines[i] and "pendings = 0" in lines[i]]
    if len(waits) != 1:
        return None
    lines[waits[0]] = lines[waits[0]].replace("pendings = 0", "pendings = 1")
    done = "%acc_async_done"
    tail = [re.sub(rf"{re.escape(result)}#0\b", done, line) for line in lines[end + 1:]]
    wait = f"{indent}{done} = ttng.warp_group_dot_wait {result}#0 {{pendings = 0 : i32}} : {acc_type}"
    return "\n".join(lines[:end + 1] + [wait] + tail) + "\n"


def patch_dumps(dump_dir: Path, override_dir: Path) -> list[str]:
    """Write :func:`async_ttgir` of every int8 build dumped under ``dump_dir`` (one folder per kernel source hash)
    into the same folder under ``override_dir``; returns the hashes patched."""
    patched = []
    for ttgir in sorted(dump_dir.glob(f"*/{KERNEL}.ttgir")):
        new = async_ttgir(ttgir.read_text())
        if new is None:
            continue
        target = override_dir / ttgir.parent.name
        target.mkdir(parents=True, exist_ok=True)
        (target / ttgir.name).write_text(new)
        patched.append(ttgir.parent.name)
    return patched


def run(shapes: str, tiles: str, out: Path, env: dict) -> list[dict]:
    """``int8_vs_fp8.py`` on ``shapes`` and ``tiles`` in a process of its own with ``env`` added; its shapes' rows."""
    cmd = [sys.executable, str(HERE / "int8_vs_fp8.py"), "--shapes", shapes, "--tiles", tiles, "--out", str(out)]
    subprocess.run(cmd, env={**os.environ, **env}, check=True)
    return json.loads(out.read_text())["shapes"]


def main() -> None:
    """Run the two builds, then write and print each Triton tile's int8 time before and after the edit, with fp8's."""
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="1024x14336x4096,1024x4096x4096,4096x14336x4096")
    p.add_argument("--tiles", default="128,128,128,4,4;128,256,128,8,3;128,128,256,8,3",
                   help="BM,BN,BK,warps,stages;... (one warpgroup, then int8_vs_fp8.py's best 8-warp tiles)")
    p.add_argument("--out", default="int8_async.json")
    p.add_argument("--save-ttgir", default=None, help="copy the edited TTGIR files (one folder a build) here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sync = run(args.shapes, args.tiles, tmp / "sync.json", {"TRITON_CACHE_DIR": str(tmp / "cache_sync"),
                                                     "TRITON_KERNEL_DUMP": "1", "TRITON_DUMP_DIR": str(tmp / "dump")})
        patched = patch_dumps(tmp / "dump", tmp / "override")
        if args.save_ttgir:
            shutil.copytree(tmp / "override", args.save_ttgir, dirs_exist_ok=True)
        print(json.dumps({"patched_builds": len(patched)}), flush=True)
        edited = run(args.shapes, args.tiles, tmp / "async.json", {"TRITON_CACHE_DIR": str(tmp / "cache_async"),
                                                       "TRITON_KERNEL_OVERRIDE": "1",
                                                       "TRITON_OVERRIDE_DIR": str(tmp / "override")})
    summary = []
    for before, after in zip(sync, edited):
        def pick(rows, method, tile=None):
            return next((r for r in rows if r["method"] == method and "ms" in r
                         and (tile is None or r.get("tile") == tile)), None)
        fp16 = pick(before["rows"], "cublas_fp16")["ms"]
        for r in before["rows"]:
            if r["method"] != "triton_int8" or "ms" not in r:
                continue
            a = pick(after["rows"], "triton_int8", r["tile"])
            f = pick(before["rows"], "triton_fp8", r["tile"])
            row = {"m": before["m"], "n": before["n"], "k": before["k"], "tile": r["tile"],
                   "int8_sync_us": r["ms"] * 1e3, "int8_async_us": a["ms"] * 1e3 if a else None,
                   "fp8_us": f["ms"] * 1e3 if f else None, "fp16_us": fp16 * 1e3,
                   "waits_sync": r.get("wait_groups"), "waits_async": a.get("wait_groups") if a else None,
                   "err_sync": r.get("max_rel_err"), "err_async": a.get("max_rel_err") if a else None}
            if a:
                row["async_speedup"] = r["ms"] / a["ms"]
            summary.append(row)
            print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
    Path(args.out).write_text(json.dumps({"patched_builds": len(patched), "rows": summary, "sync": sync,
                                          "async": edited}, indent=1))


if __name__ == "__main__":
    main()
