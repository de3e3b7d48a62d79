"""How fast can one SM issue int8 wgmma the way the LiquidQuant kernels do? The Gluon LiquidQuant kernels
(:mod:`quantkit.runtime.kernels.lqq_ws`) multiply a warpgroup's 64 dequantized weight rows from registers (wgmma's A
operand in registers, "RS") against activation slices in shared memory, with instructions of at most 128 tokens
(``wgmma_common.mma_layout``: m64 n128 k32; a 256-token program issues two), and wait for each tile's products before
writing registers again (wait 0 after every 8 k32 products). At M >= 1024 they ran 890-1470 TOP/s in session 25's
grid, cuBLAS fp8 1341-1417 at 8192³ (docs/BENCHMARKS.md). This kernel isolates the tensor cores from everything else
— no loads, no dequantization, operands that never change (the shared-memory ones never even written, so likely less
power than real data) — and times a close proxy of the issue pattern alone, per variant:

* ``a``: ``rs`` (A from registers, as the kernels) or ``ss`` (A from shared memory, as cuBLAS);
* ``n``: tokens a warpgroup multiplies, 128 or 256 — two m64 n128 instructions a product at 256, as the kernels (an
  int8 instruction of n 256 does not build: Triton 3.9's passes fail on ``instr_shape [16, 256, 32]``, offline);
* ``pending``: products left in flight at each tile's wait (0: the kernels' wait for their own products; 8: the
  previous tile's only, as a pipelined GEMM);
* ``ctas``: programs (one warpgroup each) per SM — 2 stands for the kernels' two consumer warpgroups.

Each CTA runs ``--iters`` tiles of 8 k32 products into one int32 accumulator; the time (CUDA events, median of 5
launches after a warm-up) gives int8 TOP/s, printed next to cuBLAS int8 and fp8 at 8192³ measured in the same run.

    python docs/bench/wgmma_int8_rate.py --out wgmma_int8_rate.json
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from quantkit.bench.roofline import measure_matmul_peaks
from quantkit.runtime.kernels.wgmma_common import X_SMEM, gl, gluon, warpgroup_mma, warpgroup_mma_wait

SMS = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132


@gluon.jit
def _rate_kernel(out_ptr, ITERS: gl.constexpr, N: gl.constexpr, RS: gl.constexpr, PENDING: gl.constexpr):
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 32])
    xs = gl.allocate_shared_memory(gl.int8, [2, N, 128], X_SMEM)  # B: two [N tokens, 128 K] slices, as the kernels'
    ws = gl.allocate_shared_memory(gl.int8, [2, 64, 128], X_SMEM)  # A in shared memory (ss)
    a_regs = gl.full([64, 32], 1, gl.int8, gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4))
    acc = gl.zeros([64, N], gl.int32, mma)
    for _ in range(ITERS):
        for p in gl.static_range(8):
            xb = xs.index(p // 4).slice(32 * (p % 4), 32, dim=1).permute((1, 0))
            if RS:
                acc = warpgroup_mma(a_regs, xb, acc, is_async=True)
            else:
                acc = warpgroup_mma(ws.index(p // 4).slice(32 * (p % 4), 32, dim=1), xb, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=PENDING, deps=(acc, ))
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    rows = gl.arange(0, 64, layout=gl.SliceLayout(1, mma))
    cols = gl.arange(0, N, layout=gl.SliceLayout(0, mma))
    # one int32 per CTA and element: keeps the products from being optimized away
    gl.store(out_ptr + gl.program_id(0) * 64 * N + rows[:, None] * N + cols[None, :], acc)


def time_variant(a: str, n: int, pending: int, ctas: int, iters: int) -> dict:
    """One variant's median launch time and int8 op rate (module docstring)."""
    grid = SMS * ctas
    out = torch.empty(grid * 64 * n, dtype=torch.int32, device="cuda")

    def launch():
        _rate_kernel[(grid,)](out, ITERS=iters, N=n, RS=a == "rs", PENDING=pending, num_warps=4)

    launch()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        launch()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    t = statistics.median(times)
    ops = 2 * grid * iters * 8 * 64 * n * 32
    return {"a": a, "n": n, "pending": pending, "ctas_per_sm": ctas, "ms": t * 1e3,
            "tops": ops / t / 1e12}


def main() -> None:
    """Time every variant, print and write the rows with the cuBLAS 8-bit rates of the same run."""
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=2048)
    p.add_argument("--out", default="wgmma_int8_rate.json")
    args = p.parse_args()
    _, int8_ops, fp8_ops = measure_matmul_peaks()
    print(json.dumps({"cublas_int8_tops": int8_ops / 1e12, "cublas_fp8_tops": fp8_ops / 1e12 if fp8_ops else None}),
          flush=True)
    rows = []
    for a in ("rs", "ss"):
        for n in (128, 256):
            for pending in (0, 8):
                for ctas in (1, 2):
                    try:
                        row = time_variant(a, n, pending, ctas, args.iters)
                    except Exception as e:  # noqa: BLE001 — a variant that does not build is recorded, not fatal
                        row = {"a": a, "n": n, "pending": pending, "ctas_per_sm": ctas, "error": str(e)[:300]}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "cublas_int8_tops": int8_ops / 1e12,
                   "cublas_fp8_tops": fp8_ops / 1e12 if fp8_ops else None, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
