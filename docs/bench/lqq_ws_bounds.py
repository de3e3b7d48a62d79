"""Where does the warp-specialized LiquidQuant kernel (:mod:`quantkit.runtime.kernels.lqq_ws`) lose to cuBLAS fp8 at
M >= 1024? Ablations of its loop (and one variant of it), each built in a process of its own (``--variant``), timed
next to the rule's launch, cuBLAS fp16 and cuBLAS fp8 (``torch._scaled_mm``, an 8-bit GEMM with no dequantization):

* ``no_dequant``: the LiquidQuant dequantization (LiquidGEMM Eq. 11-12, :data:`.dequant.ASM_I8`: 40 instructions a
  pack of four words) replaced by eight register moves — what the loop costs without its integer work;
* ``no_own_wait``: each consumer warpgroup waits only for its *previous* tile's products before forming the next
  tile's planes, as a kernel could that kept its register A operands alive while their products run (ptxas does not:
  docs/BENCHMARKS.md, session 16) — what that overlap would be worth. It races on registers and on the ring slot
  (released while its products may still read it);
* ``no_act_loads``: the producer brings only the first STAGES activation tiles and afterwards completes each slot's
  ``ready`` barrier without a copy (the products multiply stale tiles) — what the activation TMA stream costs;
* ``no_act_loads_no_dequant``: both — the products, the weight words' loads and the barriers' hand-offs alone;
* ``no_store``: the epilogue's stores masked off at run time (every product and scale still computed) — what the
  output stores cost;
* ``coalesced_store``: not an ablation — the epilogue converts each [64 rows, tokens] tile to a layout whose lanes
  run along the rows (contiguous in Y) before storing, 16-byte stores in place of the accumulator layout's 2-byte ones
  (same bits). Since session 25 the product stores this way (:func:`.wgmma_common.store_rows_coalesced`), so this
  variant now runs the product, like ``full``; session 25's logs came from a copy of that store in this script;
* ``words_2ahead``: not an ablation — each consumer warpgroup loads a weight tile's words two tiles ahead of its
  dequantization instead of one (16 more registers a thread), in case those loads' latency shows (same bits);
* ``full``: the kernel as it is (the control: the same numbers as the rule where the launch is the rule's).

The ablations return wrong sums; they are timings only, and each row says whether each launch's output equalled the
Triton LiquidQuant kernel's (``*_equal_triton``; session 25's first logs, docs/logs/session25/bounds/, compared with
int8_matmul's own output, ``*_equal_rule`` — which under an ablation runs the ablated kernel too, as does the
``rule`` column).
Beside the rule's own launch, 256-token programs (128 + a 128-token tail, two warpgroups) are timed in every variant
(``--options``). Timing: the bench's (CUDA graphs, rotating inputs).

    python docs/bench/lqq_ws_bounds.py --variant no_dequant --out bounds_no_dequant.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from quantkit.bench.command import parse_shapes
from quantkit.bench.problems import _packed, fp16_and_lqq_inputs
from quantkit.bench.roofline import fp8_matmul, fp8_matmul_supported
from quantkit.bench.sweep_log import save_sweep
from quantkit.bench.timing import time_rotating
from quantkit.runtime.kernels import lqq_ws
from quantkit.runtime.kernels.configs import TileConfig, lqq_wgmma_launch, lqq_ws_launch
from quantkit.runtime.kernels.int8_gemm import int8_matmul
from quantkit.runtime.kernels.lqq_wgmma import multiply_tile, planes_wgmma
from quantkit.runtime.kernels.wgmma_common import (a_layout, gl, gluon, load_words, mbarrier, mma_layout,
                                                   warpgroup_mma, warpgroup_mma_wait, weight_rows)

MOVES = gl.constexpr("\n".join(f"mov.b32 ${p}, ${8 + p % 4};" for p in range(8)))
CONSTRAINTS = gl.constexpr("=r," * 8 + ",".join(["r"] * 20))


@gluon.jit
def _planes_moved(words, s_lo, a_lo, s_hi, a_hi):
    """Eight "planes" that are the words themselves (no dequantization; the same operands and outputs)."""
    return gl.inline_asm_elementwise(
        MOVES, CONSTRAINTS,
        [words, s_lo[:, None], (a_lo * 0x01010101)[:, None], s_hi[:, None], (a_hi * 0x01010101)[:, None]],
        dtype=(gl.int8, ) * 8, is_pure=True, pack=4)


@gluon.jit
def _multiply_previous_wait(planes, xs, xt, base, acc, acc_t, BT: gl.constexpr, WG: gl.constexpr):
    """:func:`.lqq_wgmma.multiply_tile` waiting only until this tile's own products are the ones outstanding (one
    commit group per product: 8, or 16 with a tail) — the previous tile's are complete, this tile's still run."""
    for p in gl.static_range(8):
        xb = xs.index(base + p // 4).slice(32 * (p % 4), 32, dim=1).permute((1, 0))
        acc = warpgroup_mma(planes[p], xb, acc, is_async=True)
        if BT > 0:
            xtb = xt.index(base + p // 4).slice(32 * (p % 4), 32, dim=1).permute((1, 0))
            acc_t = warpgroup_mma(gl.convert_layout(planes[p], a_layout(BT, WG)), xtb, acc_t, is_async=True)
    if BT > 0:
        acc, acc_t = warpgroup_mma_wait(num_outstanding=16, deps=(acc, acc_t))
    else:
        acc = warpgroup_mma_wait(num_outstanding=8, deps=(acc, ))
    return acc, acc_t


@gluon.jit
def _multiply_range_2ahead(xs, xt, ready, empty, w_ptr, p_ptr, N, w_row, t_begin, t_first, t_end, hpg, groups, pid_n,
                           BM: gl.constexpr, BT: gl.constexpr, STAGES: gl.constexpr, STEP: gl.constexpr):
    """:func:`.lqq_ws._multiply_range` with the words of tile t + 2·STEP loading while tile t is dequantized and
    multiplied (two tiles of words in registers)."""
    mma: gl.constexpr = mma_layout(BM, 1)
    rn_in, w_ptrs = weight_rows(w_ptr, pid_n, 64, N, w_row, a_layout(BM, 1))
    acc = gl.zeros([64, BM], gl.int32, mma)
    if BT > 0:
        acc_t = gl.zeros([64, BT], gl.int32, mma_layout(BT, 1))
    else:
        acc_t = acc
    words, p_lo, p_hi = load_words(w_ptrs, p_ptr, t_first, t_end, hpg, groups, N, rn_in)
    words2, p_lo2, p_hi2 = load_words(w_ptrs, p_ptr, t_first + STEP, t_end, hpg, groups, N, rn_in)
    for t in range(t_first, t_end, STEP):
        i = t - t_begin
        s = i % STAGES
        planes = planes_wgmma(words, p_lo & 0xFF, (p_lo >> 8) & 0xFF, p_hi & 0xFF, (p_hi >> 8) & 0xFF)
        words, p_lo, p_hi = words2, p_lo2, p_hi2
        words2, p_lo2, p_hi2 = load_words(w_ptrs, p_ptr, t + 2 * STEP, t_end, hpg, groups, N, rn_in)
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        if BT > 0:
            acc, acc_t = multiply_tile(planes, xs, xt, 2 * s, acc, acc_t, BT, 1)
        else:
            acc, _ = multiply_tile(planes, xs, xs, 2 * s, acc, acc, BT, 1)
        mbarrier.arrive(empty.index(s), count=1)
    if BT == 0:
        acc_t = acc
    return acc, acc_t


@gluon.jit
def _producer_first_tiles(x_desc, xt_desc, xs, xt, ready, empty, row0, t_begin, t_end, BM: gl.constexpr,
                          BT: gl.constexpr, STAGES: gl.constexpr):
    """:func:`.lqq_ws._producer` that copies each ring slot's first tile only, then releases ``ready`` empty-handed."""
    for t in range(t_begin, t_end):
        i = t - t_begin
        s = i % STAGES
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        if i < STAGES:
            lqq_ws.load_tile(x_desc, xt_desc, xs, xt, ready.index(s), s, row0, t, BM, BT)
        else:
            mbarrier.arrive(ready.index(s), count=1)


@gluon.jit
def _store_rows_never(out_ptr, y, rm, rn, first, M, N, stride_om):
    """:func:`.wgmma_common.store_rows` with a mask no element passes at run time (a negative row stride, which the
    compiler cannot rule out, so the products stay): the stores issue and write nothing."""
    mask = ((rm >= first) & (rm < M))[None, :] & (rn < N)[:, None] & (stride_om < 0)
    gl.store(out_ptr + rm[None, :] * stride_om + rn[:, None], y.to(out_ptr.dtype.element_ty), mask=mask)


# the names each variant replaces in lqq_ws's globals (main checks that lqq_ws still calls each of them). Since
# session 25 lqq_ws stores through store_rows_coalesced, the layout coalesced_store measured: that variant is now
# the product itself, and no_store masks the product's store
VARIANTS = {"full": {}, "no_dequant": {"planes_wgmma": _planes_moved},
            "no_store": {"store_rows_coalesced": _store_rows_never}, "coalesced_store": {},
            "no_act_loads": {"_producer": _producer_first_tiles},
            "no_act_loads_no_dequant": {"_producer": _producer_first_tiles, "planes_wgmma": _planes_moved},
            "no_own_wait": {"multiply_tile": _multiply_previous_wait},
            "words_2ahead": {"_multiply_range": _multiply_range_2ahead}}


def fp8_inputs(m: int, n: int, k: int, copies: int) -> list[tuple]:
    """Rotating (a [M, K], bᵀ [K, N] column-major, scale) e4m3 operands for :func:`.roofline.fp8_matmul`."""
    one = torch.ones((), device="cuda")
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
    return [(torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn), b.t(), one) for _ in range(copies)]


def main() -> None:
    """Time fp16, fp8, the rule, its lqq_ws launch and the extra options under one variant; write the rows."""
    p = argparse.ArgumentParser()
    p.add_argument("--variant", choices=sorted(VARIANTS), default="full")
    p.add_argument("--shapes", default="14336x4096,4096x4096,4096x14336")
    p.add_argument("--ms", default="1024,4096")
    p.add_argument("--options", default="256,2,2;256,2,3", help="tokens,warpgroups,stages;... (two warpgroups)")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--out", default="bounds.json")
    args = p.parse_args()
    source = Path(lqq_ws.__file__).read_text()
    for name, fn in VARIANTS[args.variant].items():  # before the first build: the JIT resolves globals then
        if source.count(f"{name}(") <= source.count(f"def {name}("):  # a renamed call would leave a silent no-op
            raise SystemExit(f"lqq_ws no longer calls {name}(); update --variant {args.variant}")
        setattr(lqq_ws, name, fn)
    options = [tuple(int(v) for v in o.split(",")) for o in args.options.split(";") if o]
    rows = []
    for n, k in parse_shapes(args.shapes):
        t, meta = _packed("w4a8-lqq", torch.randn(n, k, device="cuda"))
        for m in [int(v) for v in args.ms.split(",")]:
            fp16, inputs = fp16_and_lqq_inputs(t, m, n, k)
            cfg, wg = lqq_wgmma_launch(m, n, k)
            ws = lqq_ws_launch(cfg, wg)
            row = {"variant": args.variant, "n": n, "k": k, "m": m, "fp16": fp16["ms"] * 1e3, "rule_ws": ws}
            if fp8_matmul_supported():
                row["fp8"] = time_rotating(fp8_matmul, fp8_inputs(m, n, k, len(inputs)), reps=args.reps)["ms"] * 1e3
            rule = lambda a, s, w: int8_matmul(a, s, -1, "w4a8-lqq", w, meta)  # noqa: E731
            # the Triton kernel's bits (the same int32 sums unsplit): not ablated, unlike int8_matmul's Gluon launches
            want = int8_matmul(*inputs[0][:2], -1, "w4a8-lqq", inputs[0][2], meta, use_asm=True,
                               config=TileConfig(64, 128, 1, 4, 3))
            time_rotating(rule, inputs, reps=5)
            row["rule"] = time_rotating(rule, inputs, reps=args.reps)["ms"] * 1e3
            launches = {"ws": ws} if ws else {}
            for tokens, wgs, stages in options:
                launches[f"{tokens}_{wgs}_{stages}"] = (128, stages, tokens - 128, wgs, 1, 1)
            for name, launch in launches.items():
                call = lambda a, s, w, launch=launch: lqq_ws.lqq_ws_matmul(a, s, w, meta, *launch)  # noqa: E731
                try:
                    row[f"{name}_equal_triton"] = bool(torch.equal(call(*inputs[0]), want))
                    row[name] = time_rotating(call, inputs, reps=args.reps)["ms"] * 1e3
                except Exception as e:  # noqa: BLE001 — an option that does not build is recorded, not fatal
                    row[name] = None
                    row[f"{name}_error"] = str(e)[:200]
            print(json.dumps({kk: (round(v, 2) if isinstance(v, float) else v) for kk, v in row.items()}), flush=True)
            rows.append(row)
            del inputs
            torch.cuda.empty_cache()
            save_sweep(args.out, rows, [])


if __name__ == "__main__":
    main()
