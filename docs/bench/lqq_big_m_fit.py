"""Fit the large-M wave model's per-option constants (configs.LQQ_BIG_M_WS: programs per SM, solo, blend, cost) to a
``docs/bench/lqq_big_m_options.py`` log, the way session 17 fitted them: per option, the (solo, blend) grid point
(0.02 / 0.1 steps) whose log cost per wave of 256 K columns is most uniform over the points, the cost their median.
Then score the fitted model and session 17's (configs.LQQ_BIG_M_WS, which configs.py keeps for rows of up to 8192
columns) against the measurements at the points where the rule takes the model's launch (not the K-pair launches, the row-tile
exceptions or the small-M cost model): the picked option's measured time over the best measured option's, and over
the current model's pick.

    python docs/bench/lqq_big_m_fit.py docs/logs/session24/big_m/big_m_options.json

``--add``: fit only options the model does not have yet, on the model's own scale, from a log that timed them next
to the rule (session 25's 256-token options): at each point where the rule takes the model's launch, an option's
measured time is multiplied by the model's time for the rule's pick over the rule's measured time, so the new
constants price launches in the units of the constants already there (timed on other machines) and leave their
picks among themselves unchanged; each table (rows of <= / > LQQ_WGMMA_NARROW columns) is calibrated on its own
rows. The score is then the measured time of the extended model's pick over the rule's, at every such point.
``--old-file``: the model (and the rule that decides where it runs) from a saved configs.py instead of HEAD's — the
one the log's ``rule`` column ran; ``--options``: fit only these log columns. Session 25's fit, at HEAD (whose
tables already hold the option):

    git show eba61e8:quantkit/runtime/kernels/configs.py > old.py
    python docs/bench/lqq_big_m_fit.py --add --old-file old.py --options 256_2_3 \
        docs/logs/session25/big_m_256/big_m_256.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics

from quantkit.runtime.kernels import configs
from quantkit.runtime.kernels.configs import SMS_H100, lqq_big_m_waves

from lqq_rule_ab import old_rule  # noqa: E402 - docs/bench is the script's own folder

SOLO = [round(0.5 + 0.02 * i, 2) for i in range(41)]  # 0.50 … 1.30
BLEND = [round(0.1 * i, 1) for i in range(11)]


def option_key(name: str) -> tuple[int, int, int]:
    """(tokens, warpgroups, stages) of a log column named ``<tokens>_<warpgroups>_<stages>``."""
    return tuple(int(v) for v in name.split("_"))


def programs(option: tuple[int, int, int], m: int, n: int) -> int:
    """Programs of ``option``'s launch for M tokens on N rows (64 rows a warpgroup)."""
    tokens, wg, _ = option
    return -(-n // (64 * wg)) * -(-m // tokens)


def fit_option(option: tuple[int, int, int], per_sm: int, points: list[tuple[int, int, int, float]]) -> dict:
    """(solo, blend, cost, sd of log cost) of ``option`` over ``points`` = [(m, n, k, µs)]."""
    best = None
    for solo in SOLO:
        for blend in BLEND:
            logs = [math.log(t / (lqq_big_m_waves(programs(option, m, n), per_sm, solo, blend) * -(-k // 256)))
                    for m, n, k, t in points]
            sd = statistics.pstdev(logs)
            if best is None or sd < best[0] - 1e-12:
                best = (sd, solo, blend, math.exp(statistics.median(logs)))
    sd, solo, blend, cost = best
    return {"per_sm": per_sm, "solo": solo, "blend": blend, "cost": cost, "sd": sd}


def pick(model: dict, m: int, n: int, k: int) -> tuple[int, int, int]:
    """The option the wave model ``model`` (option → (per_sm, solo, blend, cost)) times fastest."""
    def time(o):
        per_sm, solo, blend, cost = model[o]
        return cost * lqq_big_m_waves(programs(o, m, n), per_sm, solo, blend, SMS_H100) * -(-k // 256)
    return min(model, key=time)


def uses_big_m_model(m: int, n: int, k: int, base=configs) -> bool:
    """Whether the rule of ``base`` (a configs module: HEAD's, or ``--old-file``'s) takes the large-M model's launch
    here (so the model's constants decide it)."""
    if base.lqq_k_pair(m, n, k):
        return False
    launch = base.lqq_wgmma_launch(m, n, k)
    return launch is not None and launch == base.lqq_big_m_launch(m, n, k)


def model_time(model: dict, option: tuple[int, int, int], m: int, n: int, k: int) -> float:
    """The wave model's time of ``option`` (units of the model's costs)."""
    per_sm, solo, blend, cost = model[option]
    return cost * lqq_big_m_waves(programs(option, m, n), per_sm, solo, blend, SMS_H100) * -(-k // 256)


def geo(xs: list[float]) -> float:
    """Geometric mean (nan of none)."""
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def add_options(rows: list[dict], out: str | None, base=configs, only: set | None = None) -> None:
    """``--add`` (module docstring): per table, fit the logged options it lacks on its scale, print the constants
    and score the extended model's picks against the rule's measured time; ``base`` the configs module whose tables
    and rule the log's ``rule`` column ran, ``only`` the log columns to fit (None: every new one)."""
    result = {}
    for label, long_rows in (("LQQ_BIG_M_WS", False), ("LQQ_BIG_M_WS_LONG_ROWS", True)):
        table = base.LQQ_BIG_M_WS_LONG_ROWS if long_rows else base.LQQ_BIG_M_WS
        mine = [r for r in rows if (r["k"] > base.LQQ_WGMMA_NARROW) == long_rows
                and uses_big_m_model(r["m"], r["n"], r["k"], base) and r.get("rule")]
        names = sorted({kk for r in mine for kk in r if kk[0].isdigit() and option_key(kk) not in table
                        and (only is None or kk in only)}, key=option_key)
        extended = dict(table)
        for name in names:
            o = option_key(name)
            pts = [(r["m"], r["n"], r["k"], r[name] * model_time(table, pick(table, r["m"], r["n"], r["k"]), r["m"],
                                                                  r["n"], r["k"]) / r["rule"])
                   for r in mine if r.get(name)]
            f = fit_option(o, 1, pts)
            extended[o] = (1, f["solo"], f["blend"], round(f["cost"], 3))
            print(f"{label} + {name}: per_sm 1 solo {f['solo']:.2f} blend {f['blend']:.1f} cost {f['cost']:.3f} "
                  f"sd {f['sd']:.3f} ({len(pts)} points)")
        scored = []
        for r in mine:
            m, n, k = r["m"], r["n"], r["k"]
            new = pick(extended, m, n, k)
            name = "_".join(map(str, new))
            t = r[name] if new not in table else r["rule"]
            scored.append({"n": n, "k": k, "m": m, "pick": name, "rule_us": r["rule"], "pick_us": t,
                           "gain": r["rule"] / t, "fp16_us": r["fp16"]})
            print(f"  {n}x{k} M={m}: {name} {t:.1f} us against the rule's {r['rule']:.1f} ({r['rule'] / t:.2f}x); "
                  f"fp16 {r['fp16']:.1f} ({r['fp16'] / t:.2f}x)")
        changed = [s_["gain"] for s_ in scored if s_["pick"] in names]
        print(f"{label}: {len(scored)} points, the pick changes at {len(changed)}: geo {geo(changed):.3f} "
              f"({min(changed, default=float('nan')):.2f}-{max(changed, default=float('nan')):.2f}); over all "
              f"{geo([s_['gain'] for s_ in scored]):.3f}")
        result[label] = {"added": {n_: list(extended[option_key(n_)]) for n_ in names}, "scored": scored}
    if out:
        with open(out, "w") as f:
            json.dump(result, f, indent=1)


def main() -> None:
    """Fit every option in the logs, print the constants, then score the fitted picks against session 17's."""
    p = argparse.ArgumentParser()
    p.add_argument("logs", nargs="+")
    p.add_argument("--add", action="store_true", help="fit only the options the model lacks, on its scale")
    p.add_argument("--old-file", default=None, help="the model and rule from this saved configs.py, not HEAD's")
    p.add_argument("--options", default=None, help="log columns to fit, e.g. 256_2_3,256_2_2 (default: all)")
    p.add_argument("--out", default=None, help="write the fit and the scores as JSON here")
    args = p.parse_args()
    rows = [r for path in args.logs for r in json.load(open(path))["rows"]]
    base = old_rule("old", args.old_file) if args.old_file else configs
    only = set(args.options.split(",")) if args.options else None
    if args.add:
        add_options(rows, args.out, base, only)
        return
    names = sorted({kk for r in rows for kk in r if kk[0].isdigit() and (only is None or kk in only)},
                   key=option_key)
    fitted = {}
    for name in names:
        o = option_key(name)
        per_sm = base.LQQ_BIG_M_WS_LONG_ROWS[o][0] if o in base.LQQ_BIG_M_WS_LONG_ROWS else 1
        pts = [(r["m"], r["n"], r["k"], r[name]) for r in rows if r.get(name)]
        fitted[o] = fit_option(o, per_sm, pts)
        f = fitted[o]
        print(f"{name}: per_sm {per_sm} solo {f['solo']:.2f} blend {f['blend']:.1f} cost {f['cost']:.3f} "
              f"sd {f['sd']:.3f} ({len(pts)} points)")
    new = {o: (f["per_sm"], f["solo"], f["blend"], f["cost"]) for o, f in fitted.items()}
    scored = []
    for r in rows:
        m, n, k = r["m"], r["n"], r["k"]
        if not uses_big_m_model(m, n, k, base):
            continue
        timed = {option_key(kk): v for kk, v in r.items() if kk[0].isdigit() and v}
        po, pn = pick(base.LQQ_BIG_M_WS, m, n, k), pick(new, m, n, k)
        if po not in timed or pn not in timed:  # a pick that did not build there: nothing to score
            continue
        best = min(timed.values())
        scored.append({"n": n, "k": k, "m": m, "old": "_".join(map(str, po)), "new": "_".join(map(str, pn)),
                       "old_vs_best": timed[po] / best, "new_vs_best": timed[pn] / best,
                       "new_vs_old": timed[po] / timed[pn]})
    print(f"{len(scored)} points where the rule takes the model's launch")
    print(f"old pick / best: geo {geo([s['old_vs_best'] for s in scored]):.3f}, worst "
          f"{max(s['old_vs_best'] for s in scored):.2f}")
    print(f"new pick / best: geo {geo([s['new_vs_best'] for s in scored]):.3f}, worst "
          f"{max(s['new_vs_best'] for s in scored):.2f}; within 2 % of the best at "
          f"{sum(s['new_vs_best'] <= 1.02 for s in scored)} of {len(scored)}")
    changed = [s for s in scored if s["old"] != s["new"]]
    print(f"picks changed at {len(changed)}: new faster by geo {geo([s['new_vs_old'] for s in changed]):.3f} "
          f"({min((s['new_vs_old'] for s in changed), default=float('nan')):.2f}-"
          f"{max((s['new_vs_old'] for s in changed), default=float('nan')):.2f}) in this log")
    for s in scored:
        print(f"  {s['n']}x{s['k']} M={s['m']}: old {s['old']} ({s['old_vs_best']:.2f}) new {s['new']} "
              f"({s['new_vs_best']:.2f})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"fit": {"_".join(map(str, o)): v for o, v in fitted.items()}, "scored": scored}, f, indent=1)


if __name__ == "__main__":
    main()
