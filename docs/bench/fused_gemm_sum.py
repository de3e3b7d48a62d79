"""Fused projection GEMM vs its parts, from one ``quantkit bench --json`` output: per method and M, the time of
the fused shape (6144×4096 = q/k/v of a Llama-3-8B layer, 28672×4096 = gate/up) against the sum of its parts run
one after another (4096×4096 + 2 × 1024×4096; 2 × 14336×4096) — what fusing at load saves in GEMM time alone.

    python3 docs/bench/fused_gemm_sum.py bench.json
"""

import json
import sys

GROUPS = {(6144, 4096): [(4096, 4096), (1024, 4096), (1024, 4096)], (28672, 4096): [(14336, 4096), (14336, 4096)]}

rows = [r for r in json.load(open(sys.argv[1])) if not r.get("skipped")]
us = {(r["method"], r["m"], r["n"], r["k"]): r["ms"] * 1e3 for r in rows}
print(f"{'method':<14}{'M':>6}  {'fused shape':<12}{'fused µs':>10}{'parts µs':>10}{'parts/fused':>13}")
for (method, m, n, k), fused in sorted(us.items()):
    parts = GROUPS.get((n, k))
    if parts is None or any((method, m, pn, pk) not in us for pn, pk in parts):
        continue
    total = sum(us[(method, m, pn, pk)] for pn, pk in parts)
    print(f"{method:<14}{m:>6}  {f'{n}x{k}':<12}{fused:>10.1f}{total:>10.1f}{total / fused:>12.2f}×")
