"""Do the weight words' loads from HBM bound the 256-token LiquidQuant launches on wide layers? Session 26's
timeline (docs/bench/lqq_ws_timeline.py) had the K loop of a 256-token program take 29.2 µs on 14336×4096 at M = 1024
against 21.0 on 4096×4096 — same tiles, same K; what differs is that a wave of the wide layer's programs reads 112
different weight row tiles (HBM) where the narrow one's 128 programs share 32 (L2). Two modified builds of
:mod:`quantkit.runtime.kernels.lqq_ws` (:func:`quantkit.bench.patched.patched_copy`), timed against the product's
launch in ABBA order (:func:`quantkit.bench.timing.time_abba`):

* ``prefetch``: the producer warp, after starting activation tile t's copies, asks L2 for weight tile t + AHEAD's
  words and group words (``prefetch.global.L2``, one 128-byte line a row), so that the consumers' loads of those
  words, one tile before their dequantization, find them in L2. Same bits as the product (checked every row). Its
  producer warp has 40 registers (the product's 24 leave no room for the prefetch addresses), which moves the
  register split between the partitions too;
* ``l2_weights`` (an ablation, wrong sums): every program reads the weights of row tiles 0-3 only, so that the words
  are in L2 — the time the launch would take if the weights' HBM stream cost nothing.

    python docs/bench/lqq_ws_prefetch.py --out prefetch.json
"""

from __future__ import annotations

import argparse
import statistics

import torch

import quantkit.runtime.kernels.lqq_ws as lqq_ws
from quantkit.bench.patched import patched_copy
from quantkit.bench.problems import fp16_and_lqq_inputs, lqq_ws_points
from quantkit.bench.sweep_log import log_row
from quantkit.bench.timing import time_abba

PRODUCER_OLD = '''        for t in range(t_begin, t_end):
            i = t - t_begin
            s = i % STAGES
            # the ring's mbarriers start with phase 1 complete: the first STAGES waits pass at once
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
            load_tile(x_desc, xt_desc, xs, xt, ready.index(s), s, row0, t, BM, BT)
'''
PRODUCER_NEW = '''        for a in gl.static_range(AHEAD):
            _prefetch_weights(w_ptr, p_ptr, N, w_row, pid_n, t_begin + a, t_end, hpg, groups, ROWS)
        for t in range(t_begin, t_end):
            i = t - t_begin
            s = i % STAGES
            # the ring's mbarriers start with phase 1 complete: the first STAGES waits pass at once
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
            load_tile(x_desc, xt_desc, xs, xt, ready.index(s), s, row0, t, BM, BT)
            _prefetch_weights(w_ptr, p_ptr, N, w_row, pid_n, t + AHEAD, t_end, hpg, groups, ROWS)
'''
PREFETCH_FNS = '''    @gluon.jit
    def _l2(ptrs):
        gl.inline_asm_elementwise("prefetch.global.L2 [$1];\\n    mov.u32 $0, 0;", "=r,l", [ptrs], dtype=gl.int32,
                                  is_pure=False, pack=1)

    @gluon.jit
    def _prefetch_weights(w_ptr, p_ptr, N, w_row, pid_n, t, t_end, hpg, groups, ROWS: gl.constexpr):
        t = gl.minimum(t, t_end - 1)
        rn = gl.minimum(pid_n * ROWS + gl.arange(0, ROWS, layout=gl.BlockedLayout([ROWS // 32], [32], [1], [0])),
                        N - 1)
        _l2(w_ptr + rn * w_row + t * 32)
        j = gl.arange(0, 32, layout=gl.BlockedLayout([1], [32], [1], [0]))
        g = gl.minimum((2 * t + j // 16) // hpg, groups - 1)
        _l2(p_ptr + g * N + gl.minimum(pid_n * ROWS + (j % 16) * (ROWS // 16), N - 1))

    @gluon.jit
    def _producer('''
PATCHES = {
    "prefetch": [
        ('KERNEL = "lqq_ws"', 'KERNEL = "lqq_ws_prefetch"'),
        ("PRODUCER_REGS_C = gl.constexpr(PRODUCER_REGS)", "PRODUCER_REGS_C = gl.constexpr(40)"),
        ("    @gluon.jit\n    def _producer(", PREFETCH_FNS),
        ("row0, t_begin, t_end, BM: gl.constexpr, BT: gl.constexpr,\n                  STAGES: gl.constexpr):",
         "row0, t_begin, t_end, BM: gl.constexpr, BT: gl.constexpr,\n                  STAGES: gl.constexpr, "
         "w_ptr, p_ptr, N, w_row, pid_n, hpg, groups, ROWS: gl.constexpr, AHEAD: gl.constexpr):"),
        (PRODUCER_OLD, PRODUCER_NEW),
        ("(_producer, (x_desc, xt_desc, xs, xt, ready, empty, row0, t_begin, t_end, BM, BT, STAGES)),",
         "(_producer, (x_desc, xt_desc, xs, xt, ready, empty, row0, t_begin, t_end, BM, BT, STAGES, w_ptr, p_ptr, "
         "N, w_row, pid_n, hpg, groups, 64 * WG, 2)),", 2),
        ("(_producer, (x_desc, x_desc, xs, xs, ready, empty, row0, t_begin, t_end, BM, 0, STAGES)),",
         "(_producer, (x_desc, x_desc, xs, xs, ready, empty, row0, t_begin, t_end, BM, 0, STAGES, w_ptr, p_ptr, "
         "N, w_row, pid_n, hpg, groups, 64, 2)),"),
    ],
    "l2_weights": [
        ('KERNEL = "lqq_ws"', 'KERNEL = "lqq_ws_l2_weights"'),
        ("rn_in, w_ptrs = weight_rows(w_ptr, pid_n, 64,", "rn_in, w_ptrs = weight_rows(w_ptr, pid_n % 4, 64,"),
    ],
}


def build(variant: str):
    """The ``variant`` build of lqq_ws (module docstring)."""
    return patched_copy(lqq_ws, f"lqq_ws_{variant}", PATCHES[variant])


def main() -> None:
    """Per shape and M where the rule runs a two-warpgroup lqq_ws launch: the product's launch against each variant
    (ABBA), the prefetch build's bits checked; fp16 once."""
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="14336x4096,28672x4096,6144x4096,4096x4096,4096x14336")
    p.add_argument("--ms", default="1024,2048,4096")
    p.add_argument("--variants", default="prefetch,l2_weights")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--out", default="prefetch.json")
    args = p.parse_args()
    mods = {v: build(v) for v in args.variants.split(",")}
    rows: list[dict] = []
    for n, k, m, t, meta, ws in lqq_ws_points(args.shapes, args.ms, lambda n, k, m, ws: ws[3] == 2):
        fp16, inputs = fp16_and_lqq_inputs(t, m, n, k)
        calls = {"rule": lambda a, s, w: lqq_ws.lqq_ws_matmul(a, s, w, meta, *ws)}
        for v, mod in mods.items():
            calls[v] = lambda a, s, w, mod=mod: mod.lqq_ws_matmul(a, s, w, meta, *ws)
        want = calls["rule"](*inputs[0])
        same = {f"{v}_bits_equal": bool(torch.equal(calls[v](*inputs[0]), want)) for v in mods}
        times = time_abba(calls, inputs, args.reps)
        row = {"n": n, "k": k, "m": m, "launch": ws, "fp16": fp16["ms"] * 1e3, **same,
               **{f"{name}_us": v for name, v in times.items()},
               **{name: statistics.median(v) for name, v in times.items()}}
        for v in mods:
            row[f"{v}_vs_rule"] = row["rule"] / row[v]
        row["rule_vs_fp16"] = row["fp16"] / row["rule"]
        log_row(args.out, rows, row, quiet=tuple(f"{name}_us" for name in calls))
        del inputs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
