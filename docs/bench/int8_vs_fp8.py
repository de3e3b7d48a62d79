"""Do this GPU's int8 tensor cores run as fast as its fp8 ones? The "W4A8 >= 1.6x fp16 at M >= 1024" goal turns on
it: LiquidQuant (LiquidGEMM Sec. 4) multiplies int8 operands, and under the bench's timing cuBLAS's fp8 GEMM reaches
1.5-2.1x fp16 at M >= 1024 while its int8 GEMM (torch._int_mm) stays near 1x (docs/BENCHMARKS.md, session 24).

The same Triton GEMM (TMA descriptors, both wgmma operands in shared memory, per-token x per-channel scale epilogue
to fp16; the tiles of int8_ceiling.py) is built once on int8 operands with int32 accumulation and once on fp8 e4m3
operands with fp32 accumulation, next to cuBLAS fp16 / int8 / fp8, per shape. Timing: quantkit.bench.timing's
rotating-input CUDA graphs (the bench's rules). While each method runs, `nvidia-smi` samples the SM clock and the
board power (``--clocks``), so a lower int8 rate can be told apart from a clock that drops under int8 load.

    python docs/bench/int8_vs_fp8.py --out int8_vs_fp8.json [--clocks] [--raw] [--shapes 1024x4096x4096,...]
        [--tiles 128,128,128,4,4;...]
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
import subprocess
import time

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from quantkit.bench.roofline import fp8_matmul
from quantkit.bench.timing import copies_to_defeat_l2, time_rotating

SHAPES = [(8192, 8192, 8192), (1024, 14336, 4096), (1024, 6144, 4096), (1024, 4096, 4096), (4096, 14336, 4096)]
TILES = [(128, 256, 128, 8, 3), (128, 256, 128, 8, 4), (256, 128, 128, 8, 3), (128, 128, 128, 4, 4),
         (128, 128, 128, 8, 4), (128, 256, 64, 8, 4), (128, 128, 256, 8, 3)]


@triton.jit
def _gemm8(a_desc, b_desc, c_desc, sa_ptr, sb_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
           GROUP_M: tl.constexpr, ACC: tl.constexpr, RAW: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    in_group = GROUP_M * num_n
    first_m = (pid // in_group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % size_m
    pid_n = (pid % in_group) // size_m
    acc = tl.zeros((BM, BN), dtype=ACC)
    for k in range(0, tl.cdiv(K, BK)):
        a = a_desc.load([pid_m * BM, k * BK])
        b = b_desc.load([pid_n * BN, k * BK])
        acc = tl.dot(a, b.T, acc, out_dtype=ACC)
    if RAW:  # the accumulator as it is: no conversion, no scales
        c_desc.store([pid_m * BM, pid_n * BN], acc)
    else:
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        sa = tl.load(sa_ptr + rm, mask=rm < M, other=0.0)
        sb = tl.load(sb_ptr + rn, mask=rn < N, other=0.0)
        c_desc.store([pid_m * BM, pid_n * BN], (acc.to(tl.float32) * sa[:, None] * sb[None, :]).to(tl.float16))


def triton_gemm8(a, b, sa, sb, tile, raw: bool = False):
    """fp16 [M, N] = (a [M, K] · b [N, K]ᵀ) · sa[:, None] · sb[None, :] on int8 or fp8 e4m3 operands; ``raw``: the
    int32 / fp32 accumulator [M, N] itself (no conversion, no scales)."""
    bm, bn, bk, warps, stages = tile
    m, k = a.shape
    n = b.shape[0]
    acc = tl.int32 if a.dtype == torch.int8 else tl.float32
    c = torch.empty(m, n, dtype=(torch.int32 if acc == tl.int32 else torch.float32) if raw else torch.float16,
                    device=a.device)
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    kernel = _gemm8[grid](TensorDescriptor.from_tensor(a, [bm, bk]), TensorDescriptor.from_tensor(b, [bn, bk]),
                 TensorDescriptor.from_tensor(c, [bm, bn]), sa, sb, m, n, k, BM=bm, BN=bn, BK=bk, GROUP_M=8, ACC=acc,
                 RAW=raw, num_warps=warps, num_stages=stages)
    key = (str(a.dtype), tuple(tile), raw)
    if key not in WAIT_GROUPS:  # once per build: the regex over its PTX must stay out of timed (eager) calls
        WAIT_GROUPS[key] = wait_groups(kernel.asm["ptx"])
    return c


WAIT_GROUPS: dict = {}  # (operand dtype, tile, raw) → the wgmma.wait_group operands in the built kernel's PTX


def wait_groups(ptx: str) -> list[int]:
    """The distinct N of ``wgmma.wait_group.sync.aligned N`` in a kernel's PTX: 0 alone means every wgmma group is
    waited for before the next is issued; 1 keeps one group in flight behind the next K block's loads."""
    return sorted({int(x) for x in re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)})


class Clocks:
    """``nvidia-smi`` sampling SM clock and power every 50 ms in the background; :meth:`window` summarizes the
    samples between two host times."""

    def __init__(self, enabled: bool):
        self.proc = None
        if enabled:
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw",
                                          "--format=csv,noheader,nounits", "-lms", "50"],
                                         stdout=subprocess.PIPE, text=True)
        self.lines: list[str] = []

    def stop(self) -> None:
        """End the sampling and keep its lines."""
        if self.proc is not None:
            self.proc.terminate()
            out, _ = self.proc.communicate(timeout=10)
            self.lines = out.splitlines()

    def window(self, t0: float, t1: float) -> dict | None:
        """Median SM clock and power of the samples between host times ``t0`` and ``t1`` (None: no sample)."""
        got = []
        for line in self.lines:
            try:
                stamp, mhz, watts = [x.strip() for x in line.split(",")]
                t = datetime.datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").timestamp()
            except ValueError:
                continue
            if t0 <= t <= t1:
                got.append((float(mhz), float(watts)))
        if not got:
            return None
        return {"sm_mhz": statistics.median(g[0] for g in got), "watts": statistics.median(g[1] for g in got),
                "samples": len(got)}


def timed(results: list, clocks: Clocks, name: str, fn, inputs, ops: int, reps: int, **extra) -> dict:
    """Time ``fn`` over ``inputs`` (the bench's rules), append and print its row with the host-time window the clock
    samples are matched to."""
    t0 = time.time()
    t = time_rotating(fn, inputs, warmup=5, reps=reps)
    row = {"method": name, "ms": t["ms"], "ms_p10": t["ms_p10"], "ms_p90": t["ms_p90"], "tops": ops / t["ms"] / 1e9,
           "t0": t0, "t1": time.time(), **extra}
    results.append(row)
    print("   ", json.dumps({k: v for k, v in row.items() if k not in ("t0", "t1")}), flush=True)
    return row


def main() -> None:
    """Time every method and tile per shape, then write the rows, each shape's best per method and its ratios."""
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="int8_vs_fp8.json")
    p.add_argument("--clocks", action="store_true", help="sample SM clock and power with nvidia-smi")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--raw", action="store_true", help="also time each Triton tile storing its raw accumulator "
                                                      "(int32 / fp32: no conversion, no scales)")
    p.add_argument("--shapes", default=None, help="MxNxK,... (default: SHAPES)")
    p.add_argument("--tiles", default=None, help="BM,BN,BK,warps,stages;... (default: TILES)")
    args = p.parse_args()
    tiles = TILES if args.tiles is None else [tuple(int(v) for v in t.split(",")) for t in args.tiles.split(";")]
    dev = "cuda"
    clocks = Clocks(args.clocks)
    shapes = []
    try:
        todo = SHAPES if args.shapes is None else [tuple(int(v) for v in x.split("x")) for x in args.shapes.split(",")]
        for m, n, k in todo:
            ops = 2 * m * n * k
            print(json.dumps({"m": m, "n": n, "k": k}), flush=True)
            rows: list[dict] = []
            copies = copies_to_defeat_l2(2 * (n * k + m * k))
            x16 = [torch.randn(m, k, device=dev, dtype=torch.float16) for _ in range(copies)]
            w16 = [torch.randn(n, k, device=dev, dtype=torch.float16) for _ in range(copies)]
            timed(rows, clocks, "cublas_fp16", lambda x, w: torch.nn.functional.linear(x, w), list(zip(x16, w16)),
                  ops, args.reps)
            a8 = [torch.randint(-127, 128, (m, k), device=dev, dtype=torch.int8) for _ in range(copies)]
            b8 = [torch.randint(-127, 128, (n, k), device=dev, dtype=torch.int8) for _ in range(copies)]
            timed(rows, clocks, "cublas_int8", lambda a, b: torch._int_mm(a, b.t()), list(zip(a8, b8)), ops,
                  args.reps)
            f8a = [x.to(torch.float8_e4m3fn) for x in x16]
            f8b = [w.to(torch.float8_e4m3fn) for w in w16]
            one = torch.ones((), device=dev)
            timed(rows, clocks, "cublas_fp8", lambda a, b: fp8_matmul(a, b.t(), one), list(zip(f8a, f8b)), ops,
                  args.reps)
            sa = (torch.rand(m, device=dev) + 0.5) * 1e-4  # keeps int8 products inside fp16's range
            sb = torch.rand(n, device=dev) + 0.5
            ref8 = (torch._int_mm(a8[0], b8[0].t()).float() * sa[:, None] * sb[None, :]).half()
            reff = ((f8a[0].float() @ f8b[0].float().t()) * sa[:, None] * sb[None, :]).half()
            for tile in tiles:
                for kind, aa, bb, ref in (("triton_int8", a8, b8, ref8), ("triton_fp8", f8a, f8b, reff)):
                    try:
                        got = triton_gemm8(aa[0], bb[0], sa, sb, tile)
                        err = float(((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item())
                        timed(rows, clocks, kind, lambda a, b: triton_gemm8(a, b, sa, sb, tile), list(zip(aa, bb)),
                              ops, args.reps, tile=tile, max_rel_err=err,
                              wait_groups=WAIT_GROUPS.get((str(aa[0].dtype), tuple(tile), False)))
                        if args.raw:
                            timed(rows, clocks, kind + "_raw", lambda a, b: triton_gemm8(a, b, sa, sb, tile, True),
                                  list(zip(aa, bb)), ops, args.reps, tile=tile)
                    except Exception as e:  # noqa: BLE001 — a tile that does not build is recorded, not fatal
                        rows.append({"method": kind, "tile": tile, "error": str(e)[:200]})
            shapes.append({"m": m, "n": n, "k": k, "rows": rows})
            del x16, w16, a8, b8, f8a, f8b
            torch.cuda.empty_cache()
    finally:
        clocks.stop()
    for s in shapes:
        for r in s["rows"]:
            if "t0" in r:
                r["clocks"] = clocks.window(r.pop("t0"), r.pop("t1"))
        best = {}
        for r in s["rows"]:
            if "ms" in r and (r["method"] not in best or r["ms"] < best[r["method"]]["ms"]):
                best[r["method"]] = r
        s["best"] = {name: {"ms": r["ms"], "tops": r["tops"], "tile": r.get("tile"), "clocks": r.get("clocks")}
                     for name, r in best.items()}
        fp16 = best["cublas_fp16"]["ms"]
        s["vs_fp16"] = {name: fp16 / r["ms"] for name, r in best.items()}
        print(json.dumps({"m": s["m"], "n": s["n"], "k": s["k"], "vs_fp16": s["vs_fp16"],
                          "clocks": {name: (r.get("clocks") or {}).get("sm_mhz") for name, r in best.items()}}))
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                   "shapes": shapes}, f, indent=1)


if __name__ == "__main__":
    main()
