"""Would persistent programs help the warp-specialized LiquidQuant kernel above 1024 tokens? Session 25's ablations
(docs/BENCHMARKS.md, "256-token LiquidQuant programs …") left each program's fixed costs — its start, the ring's
fill, its epilogue — over only 16 K tiles at K = 4096 as the lead. This script builds a persistent form of
:mod:`quantkit.runtime.kernels.lqq_ws`'s two-warpgroup launch and times it against the rule's launch: one program
per SM (at most one per output tile) walks output tiles ``pid``, ``pid + programs``, … in the rule's order (row
tiles fastest, so programs running together share a token tile), the producer warp keeping the activation ring
filling across tiles — the next tile's first copies run while the consumers are still in the last tile's epilogue —
and the consumer warpgroups running the product's own K loop (:func:`.lqq_ws._multiply_range`, its ring counter
carried across tiles) and epilogue (:func:`.lqq_ws._store_result`). Same bits as the product's launch (the same
int32 sums, the same epilogue), which every row checks. Unsplit, two warpgroups (128 rows), tails 0/32/64/128.

    python docs/bench/lqq_ws_persistent.py --out persistent.json
"""

from __future__ import annotations

import argparse
import statistics

import torch

from quantkit.bench.problems import fp16_and_lqq_inputs, lqq_ws_points
from quantkit.bench.sweep_log import log_row
from quantkit.bench.timing import time_abba
from quantkit.runtime.kernels import lqq_ws
from quantkit.runtime.kernels.launch import groups_in_halves
from quantkit.runtime.kernels.lqq_wgmma import lqq_operands
from quantkit.runtime.kernels.wgmma_common import BN, PART_REGS, gl, gluon, mbarrier, ring_barriers, ws_maxnreg
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

PRODUCER_REGS_C = lqq_ws.PRODUCER_REGS_C


@gluon.jit
def _producer_tiles(x_desc, xt_desc, xs, xt, ready, empty, M, n_tiles, row_tiles, total, BM: gl.constexpr,
                    BT: gl.constexpr, STAGES: gl.constexpr):
    """:func:`.lqq_ws._producer` over this program's output tiles in turn, its ring counter carried across them."""
    i = 0
    for tile in range(gl.program_id(0), total, gl.num_programs(0)):
        first = (tile // row_tiles) * (BM + BT)
        row0 = gl.maximum(gl.minimum(first, M - (BM + BT)), 0)
        for t in range(0, n_tiles):
            s = i % STAGES
            mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
            lqq_ws.load_tile(x_desc, xt_desc, xs, xt, ready.index(s), s, row0, t, BM, BT)
            i += 1


@gluon.jit
def _consumer_tiles(xs, xt, ready, empty, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, M, N, stride_sm, stride_om, w_row,
                    n_tiles, hpg, groups, row_tiles, total, HALF: gl.constexpr, BM: gl.constexpr, BT: gl.constexpr,
                    STAGES: gl.constexpr):
    """One consumer warpgroup (rows 64·(2·row tile + HALF) …) over this program's output tiles: the product's K loop,
    ring slot i0 + t for K tile t of the tile whose first slot is i0, then its epilogue."""
    i0 = 0
    for tile in range(gl.program_id(0), total, gl.num_programs(0)):
        pid_n = 2 * (tile % row_tiles) + HALF
        first = (tile // row_tiles) * (BM + BT)
        row0 = gl.maximum(gl.minimum(first, M - (BM + BT)), 0)
        acc, acc_t = lqq_ws._multiply_range(xs, xt, ready, empty, w_ptr, p_ptr, N, w_row, -i0, 0, n_tiles, hpg, groups,
                                            pid_n, BM, BT, STAGES, 1)
        lqq_ws._store_result(acc, acc_t, sa_ptr, cs_ptr, out_ptr, out_ptr, out_ptr, M, N, stride_sm, stride_om, pid_n,
                             0, row0, first, BM, BT, 1)
        i0 += n_tiles


@gluon.jit
def _persistent_kernel(x_desc, xt_desc, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, M, N, stride_sm, stride_om, w_row,
                       n_tiles, hpg, groups, row_tiles, total, BM: gl.constexpr, BT: gl.constexpr,
                       STAGES: gl.constexpr, PART_REGS: gl.constexpr):
    xs = gl.allocate_shared_memory(gl.int8, [2 * STAGES, BM, 128], x_desc.layout)
    if BT > 0:
        xt = gl.allocate_shared_memory(gl.int8, [2 * STAGES, BT, 128], xt_desc.layout)
    else:
        xt = xs
    ready, empty = ring_barriers(STAGES, 2)
    gl.warp_specialize([
        (_consumer_tiles, (xs, xt, ready, empty, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, M, N, stride_sm, stride_om,
                           w_row, n_tiles, hpg, groups, row_tiles, total, 0, BM, BT, STAGES)),
        (_consumer_tiles, (xs, xt, ready, empty, sa_ptr, w_ptr, p_ptr, cs_ptr, out_ptr, M, N, stride_sm, stride_om,
                           w_row, n_tiles, hpg, groups, row_tiles, total, 1, BM, BT, STAGES)),
        (_producer_tiles, (x_desc, xt_desc, xs, xt, ready, empty, M, n_tiles, row_tiles, total, BM, BT, STAGES)),
    ], [4, 1], [PART_REGS, PRODUCER_REGS_C])


def persistent_matmul(a_codes, a_scales, tensors, meta, tail: int, stages: int,
                      programs: int | None = None) -> torch.Tensor:
    """fp16 Y [M, N] of a ``w4a8-lqq`` product by the persistent two-warpgroup launch (module docstring): 128 + ``tail``
    tokens × 128 rows a tile, ``programs`` programs (default: one per SM, at most one per tile)."""
    m, k, n, qweight, qparams, cs, n_tiles = lqq_operands(a_codes, a_scales, tensors, meta)
    out = torch.empty(m, n, dtype=torch.float16, device=a_codes.device)
    layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    x_desc = TensorDescriptor(a_codes, [m, k], [a_codes.stride(0), 1], [128, 128], layout)
    xt_desc = TensorDescriptor(a_codes, [m, k], [a_codes.stride(0), 1], [max(tail, 8), 128], layout)
    row_tiles = -(-n // (2 * BN))
    total = row_tiles * -(-m // (128 + tail))
    grid = (min(total, programs or torch.cuda.get_device_properties(a_codes.device).multi_processor_count),)
    _persistent_kernel[grid](x_desc, xt_desc, a_scales, qweight, qparams, cs, out, m, n, a_scales.stride(0),
                             out.stride(0), qweight.shape[1], n_tiles, groups_in_halves(meta, n_tiles),
                             qparams.shape[0], row_tiles, total, BM=128, BT=tail, STAGES=stages, PART_REGS=PART_REGS,
                             num_warps=4, maxnreg=ws_maxnreg(2, 1))
    return out


def main() -> None:
    """Per shape and M where the rule runs a two-warpgroup lqq_ws launch: the rule's launch against its persistent
    form (ABBA), bits checked; fp16 once."""
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="14336x4096,28672x4096,6144x4096,4096x4096,4096x14336")
    p.add_argument("--ms", default="1024,2048,4096")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--out", default="persistent.json")
    args = p.parse_args()
    rows: list[dict] = []
    for n, k, m, t, meta, ws in lqq_ws_points(args.shapes, args.ms, lambda n, k, m, ws: ws[3] == 2):
        fp16, inputs = fp16_and_lqq_inputs(t, m, n, k)
        calls = {"rule": lambda a, s, w: lqq_ws.lqq_ws_matmul(a, s, w, meta, *ws),
                 "persistent": lambda a, s, w: persistent_matmul(a, s, w, meta, ws[2], ws[1])}
        same = bool(torch.equal(calls["persistent"](*inputs[0]), calls["rule"](*inputs[0])))
        times = time_abba(calls, inputs, args.reps)
        row = {"n": n, "k": k, "m": m, "launch": ws, "fp16": fp16["ms"] * 1e3, "bits_equal": same,
               **{f"{name}_us": v for name, v in times.items()},
               **{name: statistics.median(v) for name, v in times.items()}}
        row["persistent_vs_rule"] = row["rule"] / row["persistent"]
        row["persistent_vs_fp16"] = row["fp16"] / row["persistent"]
        log_row(args.out, rows, row, quiet=("rule_us", "persistent_us"))
        del inputs
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
