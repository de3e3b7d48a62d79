"""Where the time of a stream-K LiquidQuant launch goes, program by program: an instrumented build of
quantkit/runtime/kernels/lqq_stream_k.py (made here at run time from that file's source, so it follows the kernel)
stamps ``%globaltimer`` at kernel entry and, for each of a program's first three tile parts, in its first consumer
warpgroup: the K loop's start and end and the part finished (stored, or the tile added up and stored) — into a
buffer; one eager call per repetition.

    python docs/bench/lqq_stream_k_timeline.py --out stream_k_timeline.json

Stamps are ns after the earliest kernel entry of the call; the printed line per case gives, per stamp, the median
over programs and the latest program.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from quantkit.bench.command import parse_shapes
from quantkit.bench.problems import _packed, fp16_and_lqq_inputs
from quantkit.runtime.kernels.lqq_stream_k import stream_k_plan

STAMPS = 10  # entry, then (loop start, loop end, part done) for parts 0-2
_AT = "gl.store(dbg_ptr + gl.program_id(0) * 10 + 1 + 3 * gl.minimum(j, 2) + {}, _now())"
# (text in lqq_stream_k.py, what the instrumented build has instead); each must occur exactly once, but the
# partitions' argument lists (twice: both warpgroups)
PATCHES = [
    ('KERNEL = "lqq_stream_k"', 'KERNEL = "lqq_stream_k_timeline"'),
    ("    @gluon.jit\n    def _rows(xs,",
     "    @gluon.jit\n    def _now():\n        return gl.inline_asm_elementwise(\"mov.u64 $0, %globaltimer;\", \"=l\", [], "
     "dtype=gl.int64, is_pure=False, pack=1)\n\n    @gluon.jit\n    def _rows(dbg_ptr, xs,"),
    ("            acc, _ = _multiply_range(",
     "            if H == 0:\n                " + _AT.format(0) + "\n            acc, _ = _multiply_range("),
    ("            _finish_part(acc,", "            if H == 0:\n                " + _AT.format(1) + "\n"
     "            _finish_part(acc,"),
    ("first, row0, k0, k1, n_tiles, per_program, BM, H)\n",
     "first, row0, k0, k1, n_tiles, per_program, BM, H)\n            if H == 0:\n                "
     + _AT.format(2) + "\n"),
    ("    def _lqq_stream_k_kernel(x_desc,", "    def _lqq_stream_k_kernel(dbg_ptr, x_desc,"),
    ("        start = gl.program_id(0) * per_program\n",
     "        gl.store(dbg_ptr + gl.program_id(0) * 10, _now())\n        start = gl.program_id(0) * per_program\n"),
    ("            (_rows, (xs, ready", "            (_rows, (dbg_ptr, xs, ready"),
    ("    _lqq_stream_k_kernel[(grid,)](x_desc,", "    _lqq_stream_k_kernel[(grid,)](dbg, x_desc,"),
    ("                        programs: int | None = None, stages: int = 4, out",
     "                        programs: int | None = None, stages: int = 4, dbg=None, out"),
]


def instrumented():
    """The instrumented lqq_stream_k module (module docstring)."""
    import quantkit.runtime.kernels.lqq_stream_k as sk

    src = Path(sk.__file__).read_text()
    for old, new in PATCHES:
        count = src.count(old)
        if old == "            (_rows, (xs, ready":
            if count != 2:
                raise SystemExit(f"lqq_stream_k.py changed: expected two partitions, found {count}")
            src = src.replace(old, new)
            continue
        if count != 1:
            raise SystemExit(f"lqq_stream_k.py changed: {old[:60]!r} occurs {count} times")
        src = src.replace(old, new)
    path = Path(tempfile.mkdtemp()) / "lqq_stream_k_timeline.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("lqq_stream_k_timeline", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # Gluon reads the source of jitted functions from their module's file
    spec.loader.exec_module(module)
    return module


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="1536x4096,1024x4096")
    p.add_argument("--ms", default="384,513")
    p.add_argument("--programs", default="0,132", help="0: one program a tile")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", default="stream_k_timeline.json")
    args = p.parse_args()
    sk = instrumented()
    rows = []
    for n, k in parse_shapes(args.shapes):
        t, meta = _packed("w4a8-lqq", torch.randn(n, k, device="cuda"))
        for m in (int(v) for v in args.ms.split(",")):
            _, inputs = fp16_and_lqq_inputs(t, m, n, k)
            a, s, w = inputs[0]
            for asked in (int(v) for v in args.programs.split(",")):
                tiles, per, grid = stream_k_plan(m, n, k, asked or stream_k_plan(m, n, k, 1)[0])
                dbg = torch.zeros(grid, STAMPS, dtype=torch.int64, device="cuda")
                for _ in range(args.reps):
                    dbg.zero_()
                    sk.lqq_stream_k_matmul(a, s, w, meta, grid, dbg=dbg)
                    torch.cuda.synchronize()
                d = dbg.cpu()
                d = torch.where(d > 0, d - d[:, 0].min(), torch.zeros_like(d))
                row = {"n": n, "k": k, "m": m, "tiles": tiles, "per_program": per, "programs": grid,
                       "median_ns": [statistics.median(d[:, c].tolist()) for c in range(STAMPS)],
                       "max_ns": [int(d[:, c].max()) for c in range(STAMPS)]}
                print(json.dumps(row), flush=True)
                rows.append(row)
            del inputs
            torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
