"""Fixed cost per launch against cost per 256-column tile of the LiquidQuant launches on small layers: cuBLAS fp16,
the warp-specialized kernel's unsplit 128-token launch (rotating inputs, and one input kept hot in L2), lqq_wgmma's
unsplit 32-token launch and the launch rule's own pick, at K = 256 … 4096 on N = 1024 and 4096 (session 18).

    python docs/bench/lqq_k_scaling.py k_scaling.json
"""

from __future__ import annotations

import json
import sys

import torch

from quantkit.bench.problems import _packed, fp16_and_lqq_inputs
from quantkit.bench.timing import time_rotating
from quantkit.runtime.kernels.int8_gemm import int8_matmul
from quantkit.runtime.kernels.lqq_wgmma import lqq_wgmma_matmul
from quantkit.runtime.kernels.lqq_ws import lqq_ws_matmul


def main() -> None:
    rows = []
    for n in (1024, 4096):
        for k in (256, 512, 1024, 2048, 4096):
            for m in (128, 512):
                t, meta = _packed("w4a8-lqq", torch.randn(n, k, device="cuda"))
                fp16, inputs = fp16_and_lqq_inputs(t, m, n, k)
                ws = lambda a, s, w: lqq_ws_matmul(a, s, w, meta, 128, 3, 0, 1, 2)  # noqa: E731
                row = {"n": n, "k": k, "m": m, "copies": len(inputs), "fp16": fp16["ms"] * 1e3,
                       "ws": time_rotating(ws, inputs)["ms"] * 1e3,
                       "ws_hot": time_rotating(ws, inputs[:1])["ms"] * 1e3,
                       "wgmma32": time_rotating(lambda a, s, w: lqq_wgmma_matmul(a, s, w, meta, 32, 3, 1, 0, 1),
                                                inputs)["ms"] * 1e3,
                       "rule": time_rotating(lambda a, s, w: int8_matmul(a, s, -1, "w4a8-lqq", w, meta),
                                             inputs)["ms"] * 1e3,
                       # a one-element add: what a launch costs inside the timed graph
                       "empty_graph_ref": time_rotating(lambda a, s, w: a.view(-1)[:1].add_(0), inputs)["ms"] * 1e3}
                print(json.dumps({kk: round(v, 2) if isinstance(v, float) else v for kk, v in row.items()}), flush=True)
                rows.append(row)
    with open(sys.argv[1] if len(sys.argv) > 1 else "lqq_k_scaling.json", "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
