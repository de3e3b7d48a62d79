"""Where the time of a warp-specialized LiquidQuant launch goes, program by program: an instrumented build of
quantkit/runtime/kernels/lqq_ws.py (made here at run time from that file's source, so it follows the kernel) stamps
``%globaltimer`` at six points of every program — kernel entry, the consumers' start, the end of their K loop, the
split-K slot stored, the ticket taken, the epilogue done — into a buffer; one eager call per repetition. Session 18
found with it that the tile's last program spent 1.35-1.8 µs a slot adding the K-split slots (docs/BENCHMARKS.md).

    python docs/bench/lqq_ws_timeline.py --out timeline.json

Stamps are ns after the earliest kernel entry of the call; the printed line per case gives medians over programs
of the last repetition and, for the epilogue, the slowest program (the one that added the slots).
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

from quantkit.bench.problems import _packed, fp16_and_lqq_inputs
from quantkit.runtime.kernels.launch import split_plan

# (text in lqq_ws.py, what the instrumented build has instead); each must occur exactly once
PATCHES = [
    ('KERNEL = "lqq_ws"', 'KERNEL = "lqq_ws_timeline"'),
    ("    @gluon.jit\n    def _consumers(",
     "    @gluon.jit\n    def _now():\n        return gl.inline_asm_elementwise(\"mov.u64 $0, %globaltimer;\", \"=l\", [], "
     "dtype=gl.int64, is_pure=False, pack=1)\n\n    @gluon.jit\n    def _consumers(dbg_ptr, dbg_row, "),
    ("        acc, acc_t = _multiply_range(xs, xt,",
     "        gl.store(dbg_ptr + dbg_row * 6 + 0, _now())\n"
     "        acc, acc_t = _multiply_range(xs, xt,"),
    ("        _store_result(acc, acc_t, sa_ptr",
     "        gl.store(dbg_ptr + dbg_row * 6 + 1, _now())\n"
     "        _store_result(dbg_ptr, dbg_row, acc, acc_t, sa_ptr"),
    # the epilogue stamps its own points; the K-pair consumers (not timed here, so never compiled) pass it nothing
    ("    def _store_result(acc, acc_t,", "    def _store_result(dbg_ptr, dbg_row, acc, acc_t,"),
    ("            _store_result(acc, acc, sa_ptr", "            _store_result(None, 0, acc, acc, sa_ptr"),
    ("""        elif BT == 0:
            store_rows_split(out_ptr, ws_ptr, ticket_ptr, apply_scales(acc, sa_ptr, cs_ptr, rm, rn_o, M, N, stride_sm),
                             rm, rn_o, first, M, N, stride_om, pid_k, SPLIT_K)""",
     """        elif BT == 0:
            y = apply_scales(acc, sa_ptr, cs_ptr, rm, rn_o, M, N, stride_sm)
            _store_slot_from(ws_ptr, y, rm, rn_o, first, M, N, pid_k)
            gl.store(dbg_ptr + dbg_row * 6 + 2, _now())
            last = _take_ticket(ticket_ptr, SPLIT_K)
            gl.store(dbg_ptr + dbg_row * 6 + 3, _now())
            if last:
                _sum_slots_from(out_ptr, ws_ptr, y, rm, rn_o, first, M, N, stride_om, SPLIT_K)
                _release_ticket(ticket_ptr)"""),
    ("                                  first, M, N, stride_om, pid_k, SPLIT_K)\n",
     "                                  first, M, N, stride_om, pid_k, SPLIT_K)\n"
     "        gl.store(dbg_ptr + dbg_row * 6 + 4, _now())\n"),
    ("    def _lqq_ws_kernel(x_desc,", "    def _lqq_ws_kernel(dbg_ptr, x_desc,"),
    ("        row0 = gl.maximum(gl.minimum(first, M - (BM + BT)), 0)\n",
     "        row0 = gl.maximum(gl.minimum(first, M - (BM + BT)), 0)\n"
     "        gl.store(dbg_ptr + ((pid_k * gl.num_programs(1) + gl.program_id(1)) * gl.num_programs(0) + pid_n) * 6 + 5,"
     " _now())\n"),
    # the one-warpgroup launch (the two-warpgroup branch of the kernel is not compiled for it)
    ("                (_consumers, (xs, xt, ready, empty, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, ws_ptr, ticket_ptr, M, N,\n"
     "                              stride_sm, stride_om, w_row, t_begin, t_end, hpg, groups, pid_n, pid_k,",
     "                (_consumers, (dbg_ptr, (pid_k * gl.num_programs(1) + gl.program_id(1)) * gl.num_programs(0) + pid_n, "
     "xs, xt, ready, empty, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, ws_ptr, ticket_ptr, M, N,\n"
     "                              stride_sm, stride_om, w_row, t_begin, t_end, hpg, groups, pid_n, pid_k,"),
    ("    _lqq_ws_kernel[grid](x_desc,", "    _lqq_ws_kernel[grid](dbg, x_desc,"),
    ("                  out: torch.Tensor | None = None, out_dtype",
     "                  dbg=None, out: torch.Tensor | None = None, out_dtype"),
    ("store_rows_split_pair, tma_load, weight_rows)",
     "store_rows_split_pair, tma_load, weight_rows, _store_slot_from, _take_ticket, _sum_slots_from, _release_ticket)"),
]
POINTS = ("consumers", "loop_end", "slot_stored", "ticket", "done", "entry")


def instrumented():
    """The instrumented lqq_ws module (module docstring)."""
    import quantkit.runtime.kernels.lqq_ws as lqq_ws

    src = Path(lqq_ws.__file__).read_text()
    for old, new in PATCHES:
        if src.count(old) != 1:
            raise SystemExit(f"lqq_ws.py changed: {old[:60]!r} is not there exactly once; update PATCHES")
        src = src.replace(old, new)
    path = Path(tempfile.mkdtemp()) / "lqq_ws_timeline.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("lqq_ws_timeline", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # Triton's JIT looks the module up there
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="1024x4096:128:1,1024x4096:128:2,1024x4096:128:4,1024x4096:128:8,"
                   "1024x256:128:1,1024x4096:1024:1,1024x4096:1024:2,4096x4096:128:1",
                   help="NxK:M:split, one-warpgroup 128-token programs, two an SM")
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--out", default="lqq_ws_timeline.json")
    args = p.parse_args()
    mod = instrumented()
    result = {}
    for case in args.cases.split(","):
        shape, m, split = case.split(":")
        n, k = (int(v) for v in shape.split("x"))
        m, split = int(m), int(split)
        t, meta = _packed("w4a8-lqq", torch.randn(n, k, device="cuda"))
        _, inputs = fp16_and_lqq_inputs(t, m, n, k)
        split = split_plan(-(-k // 256), split)[1]  # the split that runs (a short K lowers the one asked for)
        programs = -(-n // 64) * -(-m // 128) * split
        dbg = torch.zeros(programs * 6, dtype=torch.int64, device="cuda")
        runs = []
        for rep in range(args.reps):
            a, s, w = inputs[rep % len(inputs)]
            dbg.zero_()
            torch.cuda.synchronize()
            mod.lqq_ws_matmul(a, s, w, meta, 128, 3, 0, 1, 2, split, dbg=dbg)
            torch.cuda.synchronize()
            d = dbg.view(programs, 6).cpu()
            t0 = int(d[:, 5].min())
            runs.append(((d - t0) * (d > 0)).tolist())
        result[case] = {"points": POINTS, "stamps_ns": runs[2:]}  # the first calls compile and warm up
        last = runs[-1]
        med = {name: statistics.median([r[i] for r in last if r[i] > 0 or i == 5]) for i, name in enumerate(POINTS)
               if any(r[i] > 0 for r in last) or i == 5}
        print(case, json.dumps({kk: round(v / 1e3, 2) for kk, v in med.items()}), "slowest done (us)",
              round(max(r[4] for r in last) / 1e3, 2), flush=True)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "unit": "ns", "cases": result}, f)


if __name__ == "__main__":
    main()
