"""Refit the LiquidQuant cost model (quantkit/runtime/kernels/configs.py, LQQ_WGMMA_COST) to sweep logs of
docs/bench/lqq_wgmma_sweep.py --tails --all-tiles --stages 3 --ws --ws-only (--wg2 on the wide layers) and
its ``two_warpgroups`` entry (configs.LQQ_WG2_COST before session 18): for each parameter set of a grid, the
launch the model would pick at every logged point it governs (configs.lqq_uses_cost_model), timed by that point's own
column for the launch, against the fastest launch logged there. Prints the best parameter sets by geometric-mean
time / fastest and the picks of the best one.

    python docs/bench/lqq_cost_fit.py docs/logs/session18/split_refit_*_h100.json --splits 1,2,4

A point where a parameter set would pick a launch its sweep did not time (two warpgroups where it ran without --wg2)
is left out of that set's score and counted.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math

from quantkit.runtime.kernels import configs
from quantkit.runtime.kernels.configs import LQQ_WGMMA_TILES, lqq_cost_model_launch, lqq_uses_cost_model

GRID = {"share": (0.4, 0.5, 0.6, 0.7, 0.8), "tokens": (0.05, 0.1, 0.15, 0.2), "exact_rounds": (0.2, 0.4, 0.6),
        "fixed_tiles": (1, 2, 3, 4), "split_tiles": (0, 0.5, 1, 2, 3, 4), "slot_tiles": (0, 0.25, 0.5, 1),
        "two_warpgroups": (1.5, 1.75, 2.0)}


def column(tile: int, split: int, warpgroups: int) -> tuple[str, str]:
    """The sweep's columns for a launch at three stages: lqq_ws's (the rule's kernel for unsplit 128-token tiles) and
    lqq_wgmma's."""
    bm, tail = LQQ_WGMMA_TILES[tile]
    name = f"gluon_{bm}_3_{split}" if not tail else f"gluon_{bm}+{tail}_3_{split}"
    name += "_wg2" if warpgroups == 2 else ""
    return "ws_" + name, name


def timed(row: dict, tile: int, split: int, warpgroups: int) -> float | None:
    ws, plain = column(tile, split, warpgroups)
    return row.get(ws, row.get(plain))


def score(rows: list[dict], cost: dict) -> tuple[float, float, int, list]:
    """(geometric-mean time / fastest, worst ratio, points left out, picks) of the parameter set ``cost``."""
    logs, worst, skipped, picks = [], 1.0, 0, []
    for row in rows:
        m, n, k = row["m"], row["n"], row["k"]
        launch = lqq_cost_model_launch(m, n, k, cost=cost)
        if launch is not None:
            (bm, _, split, tail), wg = launch
            tile = bm + tail
            t = timed(row, tile, split, wg)
        else:  # no launch with programs enough: the Triton kernel
            tile, split, wg, t = 0, 0, 0, row["triton"]
        if t is None:
            skipped += 1
            continue
        best = row["_best"]
        logs.append(math.log(t / best))
        worst = max(worst, t / best)
        picks.append((n, k, m, tile, split, wg, round(t, 2), round(best, 2), row["_best_name"], round(row["fp16"], 2)))
    return math.exp(sum(logs) / len(logs)), worst, skipped, picks


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("logs", nargs="+")
    p.add_argument("--splits", default="1,2,4", help="configs.LQQ_WGMMA_SPLITS to fit with")
    p.add_argument("--top", type=int, default=8)
    args = p.parse_args()
    configs.LQQ_WGMMA_SPLITS = tuple(int(v) for v in args.splits.split(","))
    rows = []
    for path in args.logs:
        for row in json.load(open(path))["rows"]:
            if not lqq_uses_cost_model(row["m"], row["n"], row["k"]):
                continue
            cols = {kk: v for kk, v in row.items() if kk.startswith(("gluon_", "ws_gluon_")) and "_3_" in kk}
            row["_best_name"] = min(cols, key=cols.get)
            row["_best"] = cols[row["_best_name"]]
            rows.append(row)
    print(f"{len(rows)} points the cost model governs")
    results = []
    for values in itertools.product(*GRID.values()):
        cost = dict(zip(GRID, values))
        gm, worst, skipped, _ = score(rows, cost)
        results.append((gm, worst, skipped, cost))
    results.sort(key=lambda r: (r[0], r[1]))
    current = score(rows, configs.LQQ_WGMMA_COST)
    print(f"configs.LQQ_WGMMA_COST {configs.LQQ_WGMMA_COST} with splits {configs.LQQ_WGMMA_SPLITS}: "
          f"{current[0]:.4f} geomean, worst {current[1]:.3f}, {current[2]} left out")
    for gm, worst, skipped, cost in results[:args.top]:
        print(f"{gm:.4f} geomean, worst {worst:.3f}, {skipped} left out: {cost}")
    for pick in score(rows, results[0][3])[3]:
        print("pick", pick)


if __name__ == "__main__":
    main()
