"""The one-launch mixed W4.4A8 Triton kernel at M <= 16: rows per program of the 8-bit partition (bn_b) and split-K,
next to the MixLLM W4A8 layer of the same shape (docs/logs/mixed_bn_h100.json).

    python docs/bench/mixed_bn_sweep.py --out mixed_bn.json
"""

from __future__ import annotations

import argparse
import json

from quantkit.bench.command import parse_ints, parse_shapes
from quantkit.bench.runner import time_problem
from quantkit.runtime.kernels.configs import TileConfig

CONFIGS = (TileConfig(64, 16, 2, 4, 4), TileConfig(64, 16, 4, 4, 4), TileConfig(128, 16, 1, 4, 4),
           TileConfig(128, 16, 2, 4, 4))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", default="4096x14336,14336x4096,4096x4096,28672x4096,6144x4096")
    p.add_argument("--ms", default="8,16")
    a = p.parse_args()
    res = []
    for n, k in parse_shapes(a.shapes):
        for m in parse_ints(a.ms, "--ms"):
            w4a8 = time_problem("w4a8", m, n, k)[0]["ms"]
            row = {"m": m, "n": n, "k": k, "w4a8_ms": w4a8, "rows": []}
            for cfg in CONFIGS:
                for bn_b in (cfg.bn, cfg.bn // 2, cfg.bn // 4):
                    try:
                        t = time_problem("mixed", m, n, k, config=cfg, bn_b=bn_b)[0]["ms"]
                    except Exception as e:  # noqa: BLE001 — a config the compiler rejects is a result of the sweep
                        print("ERR", cfg, bn_b, str(e)[:100])
                        continue
                    row["rows"].append({"config": cfg.to_dict(), "bn_b": bn_b, "ms": t})
            row["rows"].sort(key=lambda r: r["ms"])
            res.append(row)
            print(f"{n}x{k} M={m} w4a8 {w4a8 * 1e3:.1f} | " + " ".join(
                f"{r['config']['bn']}k{r['config']['split_k']}/b{r['bn_b']}={r['ms'] * 1e3:.1f}({r['ms'] / w4a8:.2f})"
                for r in row["rows"][:6]), flush=True)
            with open(a.out, "w") as f:
                json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
