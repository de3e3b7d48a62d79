"""The per-shape markdown tables of docs/BENCHMARKS.md ("Results: µs per call (speedup vs fp16)") from the JSON rows
of ``quantkit bench ... --json``: one table per (N, K), one row per M, one column per method, "µs (speedup×)".

    python3 docs/bench/bench_markdown.py docs/logs/session10/bench.json
"""

import json
import sys


ORDER = ("fp16", "w4a16", "w4a8-lqq", "w4a8", "mixed", "w8a8", "int_mm", "w4a8-lqq+aq", "mixed+aq")


def tables(rows: list[dict]) -> str:
    """Markdown tables of the timed rows (skipped rows print as —), methods in ORDER, then any others."""
    seen = list(dict.fromkeys(r["method"] for r in rows))
    methods = [m for m in ORDER if m in seen] + [m for m in seen if m not in ORDER]
    shapes = list(dict.fromkeys((r["n"], r["k"]) for r in rows))
    by = {(r["method"], r["n"], r["k"], r["m"]): r for r in rows}
    out = []
    for n, k in shapes:
        ms = sorted({r["m"] for r in rows if (r["n"], r["k"]) == (n, k)})
        out += [f"**N = {n}, K = {k}**", "", "| M | " + " | ".join(methods) + " |",
                "|---|" + "---|" * len(methods)]
        for m in ms:
            cells = []
            for meth in methods:
                r = by.get((meth, n, k, m))
                if r is None or "ms" not in r:
                    cells.append("—")
                elif meth == "fp16":
                    cells.append(f"{r['ms'] * 1e3:.1f}")
                else:
                    cells.append(f"{r['ms'] * 1e3:.1f} ({r['speedup_vs_fp16']:.2f}×)")
            out.append(f"| {m} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(tables(json.load(open(sys.argv[1]))))
