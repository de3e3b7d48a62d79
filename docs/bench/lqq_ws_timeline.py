"""Where the time of a warp-specialized LiquidQuant launch goes, program by program: an instrumented build of
quantkit/runtime/kernels/lqq_ws.py (made here at run time from that file's source, so it follows the kernel) stamps
``%globaltimer`` at six points of every program — its entry (after the shared-memory allocation, before the ring's
barriers are set up), the consumers' start, the end of their K loop, the split-K slot stored, the ticket taken, the
epilogue done — into a buffer (a two-warpgroup program: one row of stamps per warpgroup, the entry in the first);
one eager call per repetition. Session 18 found with it that the tile's last program spent 1.35-1.8 µs a slot adding
the K-split slots; session 26 that a 256-token program is ~0.3 µs of setup, a K loop and a 3 µs epilogue, and that a
second wave of 60 such programs runs as long as a full one (docs/BENCHMARKS.md). The halved launches
(``halves_from``) are not instrumented.

    python docs/bench/lqq_ws_timeline.py --out timeline.json
    python docs/bench/lqq_ws_timeline.py --cases 6144x4096:1024:1:128:2:3:1   # NxK:M:split:tail:wg:stages:per_sm

Stamps are ns after the earliest entry of the call. The printed line per case gives, for the programs that entered
in the first 2 µs and for those that entered later (a later wave), the median entry, setup, K loop, epilogue and
whole-program times of the last repetition, the last end among them, and the launch's last end.
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch

from quantkit.bench.patched import patched_copy
from quantkit.bench.problems import _packed, fp16_and_lqq_inputs
from quantkit.runtime.kernels.launch import split_plan

PROG = "((pid_k * gl.num_programs(1) + gl.program_id(1)) * gl.num_programs(0) + pid_n)"  # the program's number
# (text in lqq_ws.py, what the instrumented build has instead); each must occur exactly once (patched_copy)
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
    ("        ready, empty = ring_barriers(STAGES, WG)\n",
     f"        gl.store(dbg_ptr + {PROG} * WG * 6 + 5, _now())\n"
     "        ready, empty = ring_barriers(STAGES, WG)\n"),
    # the one-warpgroup launch (the two-warpgroup branch of the kernel is not compiled for it)
    ("                (_consumers, (xs, xt, ready, empty, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, ws_ptr, ticket_ptr, M, N,\n"
     "                              stride_sm, stride_om, w_row, t_begin, t_end, hpg, groups, pid_n, pid_k,",
     f"                (_consumers, (dbg_ptr, {PROG}, "
     "xs, xt, ready, empty, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, ws_ptr, ticket_ptr, M, N,\n"
     "                              stride_sm, stride_om, w_row, t_begin, t_end, hpg, groups, pid_n, pid_k,"),
    # the two-warpgroup launch: warpgroup h of a program stamps row 2 · program + h
    ("                (_consumers, (xs, xt, ready, empty, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, ws_ptr, ticket_ptr, M, N,\n"
     "                              stride_sm, stride_om, w_row, t_begin, t_end, hpg, groups, 2 * pid_n,",
     f"                (_consumers, (dbg_ptr, {PROG} * 2, xs, xt, ready, empty, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, "
     "ws_ptr, ticket_ptr, M, N,\n"
     "                              stride_sm, stride_om, w_row, t_begin, t_end, hpg, groups, 2 * pid_n,"),
    ("                (_consumers, (xs, xt, ready, empty, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, ws_ptr,\n"
     "                              ticket_ptr + tickets,",
     f"                (_consumers, (dbg_ptr, {PROG} * 2 + 1, xs, xt, ready, empty, sa_ptr, w_ptr, p_ptr, cs_ptr, "
     "out_ptr, ws_ptr,\n"
     "                              ticket_ptr + tickets,"),
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

    return patched_copy(lqq_ws, "lqq_ws_timeline", PATCHES)


def summary(rows: list, wg: int) -> dict:
    """Per-program medians of one call's stamps (µs after the earliest entry): the consumers' start after entry, their
    K loop, the epilogue; programs that entered after the first 2 µs (a later wave) counted apart; the last end."""
    entries = [rows[p * wg][5] for p in range(len(rows) // wg)]
    later = [p for p, e in enumerate(entries) if e > 2000]
    def med(ps, a, b):
        vals = [rows[p * wg + h][b] - (rows[p * wg][5] if a == 5 else rows[p * wg + h][a])
                for p in ps for h in range(wg) if rows[p * wg + h][b] > 0]
        return round(statistics.median(vals) / 1e3, 2) if vals else None
    first = [p for p in range(len(entries)) if p not in set(later)]
    out = {"programs": len(entries), "later_programs": len(later),
           "last_done": round(max(r[4] for r in rows) / 1e3, 2)}
    for name, ps in (("first", first), ("later", later)):
        if ps:
            out[name] = {"entry": round(statistics.median(entries[p] for p in ps) / 1e3, 2),
                         "setup": med(ps, 5, 0), "k_loop": med(ps, 0, 1), "epilogue": med(ps, 1, 4),
                         "whole": med(ps, 5, 4), "done_max": round(max(rows[p * wg + h][4] for p in ps
                                                                        for h in range(wg)) / 1e3, 2)}
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="1024x4096:128:1,1024x4096:128:2,1024x4096:128:4,1024x4096:128:8,"
                   "1024x256:128:1,1024x4096:1024:1,1024x4096:1024:2,4096x4096:128:1",
                   help="NxK:M:split[:tail:warpgroups:stages:per_sm], by default one-warpgroup 128-token programs, "
                        "two an SM (0:1:3:2)")
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--out", default="lqq_ws_timeline.json")
    args = p.parse_args()
    mod = instrumented()
    result = {}
    for case in args.cases.split(","):
        shape, m, split, *launch = case.split(":")
        tail, wg, stages, per_sm = (int(v) for v in launch) if launch else (0, 1, 3, 2)
        n, k = (int(v) for v in shape.split("x"))
        m, split = int(m), int(split)
        t, meta = _packed("w4a8-lqq", torch.randn(n, k, device="cuda"))
        _, inputs = fp16_and_lqq_inputs(t, m, n, k)
        split = split_plan(-(-k // 256), split)[1]  # the split that runs (a short K lowers the one asked for)
        programs = -(-n // (64 * wg)) * -(-m // (128 + tail)) * split
        dbg = torch.zeros(programs * wg * 6, dtype=torch.int64, device="cuda")
        runs = []
        for rep in range(args.reps):
            a, s, w = inputs[rep % len(inputs)]
            dbg.zero_()
            torch.cuda.synchronize()
            mod.lqq_ws_matmul(a, s, w, meta, 128, stages, tail, wg, per_sm, split, dbg=dbg)
            torch.cuda.synchronize()
            d = dbg.view(programs * wg, 6).cpu()
            t0 = int(d[:, 5][d[:, 5] > 0].min())  # a two-warpgroup program stamps its entry in its first row only
            runs.append(((d - t0) * (d > 0)).tolist())
        result[case] = {"points": POINTS, "warpgroups": wg, "stamps_ns": runs[2:]}  # the first calls compile, warm up
        print(case, json.dumps(summary(runs[-1], wg)), flush=True)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "unit": "ns", "cases": result}, f)


if __name__ == "__main__":
    main()
