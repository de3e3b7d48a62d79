"""The one-launch mixed W4.4A8 Triton kernel at M <= 16: rows per program of the 8-bit partition (bn_b) and split-K,
next to the MixLLM W4A8 layer of the same shape.

    python docs/bench/mixed_bn_sweep.py out.json
"""
import json, sys
from quantkit.bench.problems import build_problem
from quantkit.bench.timing import time_rotating
from quantkit.runtime.kernels.configs import TileConfig
res = []
for n, k in ((4096, 14336), (14336, 4096), (4096, 4096), (28672, 4096), (6144, 4096)):
    for m in (8, 16):
        w = time_rotating(*(lambda p: (p.fn, p.inputs))(build_problem("w4a8", m, n, k)))["ms"]
        row = {"m": m, "n": n, "k": k, "w4a8_ms": w, "rows": []}
        for cfg in (TileConfig(64, 16, 2, 4, 4), TileConfig(64, 16, 4, 4, 4), TileConfig(128, 16, 1, 4, 4), TileConfig(128, 16, 2, 4, 4)):
            for bnb in (cfg.bn, cfg.bn // 2, cfg.bn // 4):
                p = build_problem("mixed", m, n, k, config=cfg)
                p.state["bn_b"] = bnb
                try:
                    t = time_rotating(p.fn, p.inputs)["ms"]
                except Exception as e:
                    print("ERR", cfg, bnb, str(e)[:100]); continue
                row["rows"].append({"config": cfg.to_dict(), "bn_b": bnb, "ms": t})
        row["rows"].sort(key=lambda r: r["ms"])
        res.append(row)
        print(f"{n}x{k} M={m} w4a8 {w*1e3:.1f} | " + " ".join(f"{r['config']['bn']}k{r['config']['split_k']}/b{r['bn_b']}={r['ms']*1e3:.1f}({r['ms']/w:.2f})" for r in row["rows"][:6]), flush=True)
        json.dump(res, open(sys.argv[1], "w"), indent=1)
