"""The Gluon LiquidQuant kernels against the Triton LiquidQuant kernel (exact int32 sums, the same epilogue: equal
bit for bit) at the rule's launches, eight calls each: a kernel whose products race with the registers they read
shows as calls that differ from the Triton kernel by varying counts. Session 16 found lqq_wgmma's 96-token
launches (64 + 32) doing that (docs/logs/session16/lqq_wgmma_race_h100.txt); the warp-specialized kernel
(lqq_ws, 128 tokens, one warpgroup) is checked beside it.

    python docs/bench/lqq_race_check.py        # on an H100
"""

from __future__ import annotations

import json

import torch

from quantkit.bench.problems import _packed
from quantkit.runtime.kernels import lqq_wgmma, lqq_ws
from quantkit.runtime.kernels.act_quant import quantize_activation_triton
from quantkit.runtime.kernels.configs import LQQ_WGMMA_MAX_TAIL, lqq_wgmma_launch
from quantkit.runtime.kernels.int8_gemm import int8_matmul

POINTS = [(6144, 4096, 384), (4608, 3584, 448), (14336, 4096, 448), (6144, 4096, 1025), (6144, 4096, 2560),
          (1024, 4096, 2049), (4096, 4096, 1024), (14336, 4096, 700)]


def main() -> None:
    torch.manual_seed(0)
    for n, k, m in POINTS:
        t, meta = _packed("w4a8-lqq", torch.randn(n, k, device="cuda"))
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        a, s = quantize_activation_triton(x, 8, -1)
        tri = int8_matmul(a, s, -1, "w4a8-lqq", t, meta, use_asm=True)
        launch = lqq_wgmma_launch(m, n, k)
        if launch[0][3] > LQQ_WGMMA_MAX_TAIL:  # lqq_ws's 256-token launch (session 25): lqq_wgmma's own pick here
            launch = lqq_wgmma_launch(m, n, k, max_warpgroups=1)
        (bm, st, sp, tail), wg = launch
        olds = [lqq_wgmma.lqq_wgmma_matmul(a, s, t, meta, bm, st, sp, tail, wg) for _ in range(8)]
        wss = [lqq_ws.lqq_ws_matmul(a, s, t, meta, bm=128, stages=3, tail=0, warpgroups=1, per_sm=2)
               for _ in range(8)]
        torch.cuda.synchronize()
        print(json.dumps({"nkm": (n, k, m), "launch": [bm, st, sp, tail, wg],
                          "old_vs_triton_bad": [int((o != tri).sum()) for o in olds],
                          "ws_vs_triton_bad": [int((w != tri).sum()) for w in wss]}), flush=True)


if __name__ == "__main__":
    main()
