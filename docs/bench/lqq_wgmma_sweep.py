"""LiquidQuant W4A8: the Gluon kernel whose dequantization overlaps its own wgmma products
(quantkit/runtime/kernels/lqq_wgmma.py) against the Triton kernel (default launch rule) and cuBLAS fp16, above
M = 16. First checks it bit-exact against the Triton kernel and within 1e-3 of the torch reference.

    python docs/bench/lqq_wgmma_sweep.py --out lqq_wgmma.json
    python docs/bench/lqq_wgmma_sweep.py --tails --ms 96,160,192,320 --out tails.json

``--tails`` times, instead of the fixed variant list, every program token tile of 32-192 (a 32/64/128-token tile
plus a 32- or 64-token tail tile multiplying the same dequantized weights) that pads M by at most 32 tokens, at
K split 1 and 2, plus the launch rule's own pick (``rule``: what int8_matmul runs); with ``--all-tiles`` every token
tile whatever it pads. (docs/logs/lqq_ahead_h100.json came from this script's ``--ahead`` mode at commit dfcf03b:
the rule's pick with 1-3 weight tiles loaded ahead into registers, an option since removed.)
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from quantkit.bench.command import parse_shapes
from quantkit.bench.problems import _packed
from quantkit.bench.timing import copies_to_defeat_l2, time_rotating
from quantkit.bench.sweep_log import save_sweep
from quantkit.runtime.kernels.act_quant import quantize_activation_triton
from quantkit.runtime.kernels.configs import (LQQ_WGMMA_TILES, TileConfig, gemm_config, lqq_wgmma_config,
                                             lqq_ws_launch,
                                             lqq_wgmma_warpgroups)
from quantkit.runtime.kernels.int8_gemm import int8_matmul
from quantkit.runtime.kernels.launch import split_plan
from quantkit.runtime.kernels.lqq_wgmma import lqq_wgmma_matmul, lqq_wgmma_problem
from quantkit.runtime.kernels.lqq_ws import lqq_ws_matmul
from quantkit.runtime.kernels.reference import int8_reference

VARIANTS = [(32, 3, 1), (32, 3, 2), (32, 3, 4), (64, 3, 1), (64, 3, 2), (64, 3, 4), (64, 4, 1), (128, 3, 1),
            (128, 3, 2), (128, 2, 1)]
TAIL_CHECKS = [(64, 3, 1, 32), (128, 3, 1, 32), (128, 3, 2, 32), (128, 2, 1, 64), (64, 3, 2, 64), (32, 3, 4, 32)]


def tail_variants(m: int, all_tiles: bool = False, n: int | None = None,
                  stages: tuple[int, ...] | None = None,
                  splits: tuple[int, ...] | None = None,
                  tiles: tuple[int, ...] | None = None) -> list[tuple[int, int, int, int]]:
    """(bm, stages, split, tail) of every token tile padding M by <= 32 (any, with ``all_tiles``), split 1 and 2
    (split 2 only on layers of fewer than 66 row tiles when ``n`` is given; ``splits``: exactly these); two stages
    above M = 512, three below, unless ``stages`` lists the counts to time (each of them); ``tiles``: only these
    token tiles (tokens per program, e.g. 128 and 192)."""
    out = []
    splits = splits or ((1, 2) if n is None or -(-n // 64) < 66 else (1,))
    for tile, (bm, tail) in LQQ_WGMMA_TILES.items():
        if tiles and tile not in tiles:
            continue
        if all_tiles or -(-m // tile) * tile - m <= 32:
            for st in stages or ((2,) if m > 512 else (3,)):
                out += [(bm, st, split, tail) for split in splits]
    return out


def key(bm: int, stages: int, split: int, tail: int) -> str:
    """A variant's column name in the rows (and the logs): gluon_<bm>[+<tail>]_<stages>_<split>."""
    return f"gluon_{bm}_{stages}_{split}" if not tail else f"gluon_{bm}+{tail}_{stages}_{split}"


def check(dev: str, variants: list[tuple[int, int, int, int]], wg2: bool = False) -> list[dict]:
    """Each variant against the Triton kernel at the same split (bit-exact) and the torch reference; with ``wg2``
    the first three again with two warpgroups."""
    out = []
    for (n, k), m in [((200, 512), 33), ((1000, 1024), 130), ((4096, 4096), 64), ((1024, 14336), 257),
                      ((64, 256), 1)]:
        t, meta = _packed("w4a8-lqq", torch.randn(n, k, device=dev))
        x = torch.randn(m, k, device=dev, dtype=torch.float16)
        a, s = quantize_activation_triton(x, 8, -1)
        ref = int8_reference(a, s, -1, "w4a8-lqq", t, meta).float()
        for bm, st, sk, tail, wg in [v + (1,) for v in variants] + ([v + (2,) for v in variants[:3]] if wg2 else []):
            # the Triton kernel with the same rows and K split sums the same partials in the same order
            tri = int8_matmul(a, s, -1, "w4a8-lqq", t, meta, config=TileConfig(64, bm, sk, 4, 3))
            got = lqq_wgmma_matmul(a, s, t, meta, bm, st, sk, tail, wg)
            rel = ((got.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-9)).item()
            out.append({"n": n, "k": k, "m": m, "bm": bm, "tail": tail, "stages": st, "split_k": sk, "warpgroups": wg,
                        "equal_triton": bool(torch.equal(got, tri)), "rel_vs_reference": rel})
            print("check", json.dumps(out[-1]), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="lqq_wgmma.json")
    p.add_argument("--shapes", default="14336x4096,4096x4096,6144x4096,28672x4096,4096x14336,1024x4096")
    p.add_argument("--ms", default="32,64,96,128,160,192,256,320,384,448,512,640,768,1024,2048,4096")
    p.add_argument("--tails", action="store_true", help="time the token tiles with a tail tile (docstring)")
    p.add_argument("--wg2", action="store_true", help="also time every variant with two warpgroups (128 rows a "
                   "program sharing each activation tile; columns ending _wg2)")
    p.add_argument("--all-tiles", action="store_true", help="with --tails: every token tile, whatever it pads")
    p.add_argument("--split-narrow", action="store_true", help="with --tails: split 2 only below 66 row tiles")
    p.add_argument("--stages", default=None, help="with --tails: activation stages to time, e.g. 2,3 (default: two "
                   "above M = 512, three below)")
    p.add_argument("--splits", default=None, help="with --tails: K splits to time, e.g. 1,2,4 (default: 1 and 2, "
                   "or 1 alone on layers of >= 66 row tiles with --split-narrow)")
    p.add_argument("--tiles", default=None, help="with --tails: token tiles to time, e.g. 128,192 (default: all)")
    p.add_argument("--ws", action="store_true", help="also the warp-specialized kernel (lqq_ws) in place of every "
                   "variant it can run (configs.lqq_ws_launch: unsplit 128-token tiles), column ws_<variant>[_wg2] — "
                   "the launch lqq_ws runs for it: a two-stage 128-token variant runs three stages there, so its "
                   "column repeats the three-stage one's launch")
    p.add_argument("--min-split-tiles", type=int, default=4, help="skip splits leaving fewer 256-column tiles a "
                   "program")
    p.add_argument("--ws-only", action="store_true", help="with --ws: time lqq_wgmma only where lqq_ws cannot run "
                   "the variant (the rule runs lqq_ws wherever it can)")
    p.add_argument("--no-check", action="store_true", help="skip the bit-exactness checks (a run that already did them)")
    args = p.parse_args()
    if args.ws_only and not args.ws:
        p.error("--ws-only needs --ws")
    dev = "cuda"
    checks = "skipped" if args.no_check else check(dev, TAIL_CHECKS if args.tails else [v + (0,) for v in VARIANTS],
                                                 args.wg2)
    rows = []
    for n, k in parse_shapes(args.shapes):
        t, meta = _packed("w4a8-lqq", torch.randn(n, k, device=dev))
        for m in [int(v) for v in args.ms.split(",")]:
            copies = copies_to_defeat_l2(n * k // 2 + 3 * m * k + 2 * m * n)
            xs = [torch.randn(m, k, device=dev, dtype=torch.float16) for _ in range(copies)]
            ws = [torch.randn(n, k, device=dev, dtype=torch.float16) for _ in range(min(copies, 4))]
            row = {"n": n, "k": k, "m": m}
            row["fp16"] = time_rotating(lambda x, w: F.linear(x, w), [(x, ws[i % len(ws)]) for i, x in
                                                                     enumerate(xs)])["ms"] * 1e3
            del ws
            qa = [quantize_activation_triton(x, 8, -1) for x in xs]
            tt = [{kk: v.clone() for kk, v in t.items()} for _ in range(copies)]
            inputs = [(a, s, w) for (a, s), w in zip(qa, tt)]
            row["triton"] = time_rotating(lambda a, s, w: int8_matmul(a, s, -1, "w4a8-lqq", w, meta,
                                                                      config=gemm_config(m, n, k, "lqq")),
                                          inputs)["ms"] * 1e3
            if args.tails:
                cfg = lqq_wgmma_config(m, n, k)
                row["rule_config"] = cfg
                row["rule_warpgroups"] = lqq_wgmma_warpgroups(m, n, k)
                row["rule"] = time_rotating(lambda a, s, w: int8_matmul(a, s, -1, "w4a8-lqq", w, meta),
                                            inputs)["ms"] * 1e3
            if lqq_wgmma_problem(qa[0][0], -1, "w4a8-lqq", meta) is None:
                stages = tuple(int(v) for v in args.stages.split(",")) if args.stages else None
                splits = tuple(int(v) for v in args.splits.split(",")) if args.splits else None
                tiles = tuple(int(v) for v in args.tiles.split(",")) if args.tiles else None
                variants = (tail_variants(m, args.all_tiles, n if args.split_narrow else None, stages, splits, tiles)
                            if args.tails
                            else [v + (0,) for v in VARIANTS])
                for bm, st, sk, tail in variants:
                    if not args.tails and (bm > max(m, 32) or (bm == 32 and m > 512) or (m >= 2048 and bm < 128)):
                        continue
                    if sk > 1 and split_plan(k // 256, sk)[0] < args.min_split_tiles:
                        continue
                    for wg in (1, 2) if args.wg2 else (1,):
                        ws = lqq_ws_launch((bm, st, sk, tail), wg) if args.ws else None
                        if ws is None or not args.ws_only:
                            row[key(bm, st, sk, tail) + ("_wg2" if wg == 2 else "")] = time_rotating(
                                lambda a, s, w: lqq_wgmma_matmul(a, s, w, meta, bm, st, sk, tail, wg),
                                inputs)["ms"] * 1e3
                        if ws is not None:
                            row["ws_" + key(bm, st, sk, tail) + ("_wg2" if wg == 2 else "")] = time_rotating(
                                lambda a, s, w: lqq_ws_matmul(a, s, w, meta, *ws), inputs)["ms"] * 1e3
            timed = [(v, kk) for kk, v in row.items() if kk.startswith(("gluon_", "ws_gluon_"))]
            if timed:  # none where the Gluon kernel cannot run or no variant applies
                best = min(timed)
                row["best_gluon"] = best[1]
                row["best_gluon_vs_fp16"] = row["fp16"] / best[0]
            row["triton_vs_fp16"] = row["fp16"] / row["triton"]
            print(json.dumps({kk: (round(v, 2) if isinstance(v, float) else v) for kk, v in row.items()}), flush=True)
            rows.append(row)
            del xs, qa, tt, inputs
            torch.cuda.empty_cache()
            save_sweep(args.out, rows, checks)  # after every row, so a cut-off run keeps what it measured


if __name__ == "__main__":
    main()
