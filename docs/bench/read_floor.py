"""What a single kernel that only *reads* B bytes costs on this GPU under quantkit's timing rules (CUDA graph of
>= 8 calls, rotating copies past the L2, median) — the floor under any decode GEMV of the same weight bytes.

Three probes per size: an empty kernel (launch-to-launch floor inside a graph), a plain streaming read (every
thread loads 16-byte vectors with a grid-stride loop and folds them into one word, several grid sizes), and
torch's own sum over the same bytes. docs/BENCHMARKS.md quotes the output.

``--pdl`` adds, at the 31.2 MB of the 14336 × 4096 W4A16 weight and its group words, the same reads launched with
programmatic dependent launch (each call lets the next one start at once): ``read_pdl`` waits for the previous call
only before its store (calls may overlap wholly: an optimistic floor), ``read_pdlgemv`` waits where the decode
GEMV does, after one load per thread; next to the GEMV itself with and without it — the floor the bench's
back-to-back GEMV time compares with.

    python docs/bench/read_floor.py [--pdl]
"""

from __future__ import annotations

import argparse
import json
import os

import cupy
import numpy as np
import torch

from quantkit.bench.timing import copies_to_defeat_l2, time_rotating

STREAM = r"""
// every thread loads 16-byte vectors in a grid-stride loop and folds them into one word
__device__ __forceinline__ unsigned int stream_fold(const uint4* __restrict__ p, long long n_vec) {
    unsigned int acc = 0u;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n_vec;
         i += (long long)gridDim.x * blockDim.x) {
        uint4 v;
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p + i));
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    return acc;
}
"""

SOURCE = STREAM + r"""
extern "C" __global__ void empty_kernel(unsigned int* out) {
    if (threadIdx.x == 1u << 30) out[0] = 0u;
}
extern "C" __global__ void stream_read(const uint4* __restrict__ p, long long n_vec, unsigned int* out) {
    const unsigned int acc = stream_fold(p, n_vec);
    if (acc == 0x12345678u) out[0] = acc;  // keeps the loads alive
}
// the W4A16 CUDA GEMV's access pattern without its arithmetic: a block owns 16 rows of row_vec 16-byte vectors,
// warp w reads 256-column tiles w, w + NWARPS, ...; lane (g, c) reads vectors c and c + 4 of rows g and g + 8.
// tile_major: the same reads from a layout where each 16-row × 128-byte tile is one contiguous 2 KB block.
extern "C" __global__ void gemv_pattern_read(const uint4* __restrict__ p, int n_rows, int row_vec, int tile_major,
                                             unsigned int* out) {
    const int nwarps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, c = lane & 3, row0 = blockIdx.x * 16;
    const int n_tiles = row_vec / 8;
    unsigned int acc = 0u;
    for (int t = warp; t < n_tiles; t += nwarps) {
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                long long idx = tile_major
                    ? ((long long)blockIdx.x * n_tiles + t) * 128 + (g + 8 * r) * 8 + c + 4 * h
                    : (long long)(row0 + g + 8 * r) * row_vec + t * 8 + c + 4 * h;
                uint4 v;
                asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                             : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p + idx));
                acc ^= v.x ^ v.y ^ v.z ^ v.w;
            }
    }
    if (acc == 0x12345678u) out[0] = acc;
}
"""

PDL_SOURCE = STREAM + r"""
// stream_read launched with programmatic dependent launch: let the next grid start at once, read, and wait for the
// previous grid only before the (never taken) store — consecutive calls may overlap wholly (an optimistic floor)
extern "C" __global__ void stream_read_pdl(const uint4* __restrict__ p, long long n_vec, unsigned int* out) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const unsigned int acc = stream_fold(p, n_vec);
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (acc == 0x12345678u) out[0] = acc;
}
// as the GEMV waits: one 16-byte load per thread first (the GEMV loads its first weight tile), then the wait for the
// previous grid (the GEMV's activations may be its output), then the rest
extern "C" __global__ void stream_read_pdl_gemv(const uint4* __restrict__ p, long long n_vec, unsigned int* out) {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const long long i0 = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    unsigned int acc = 0u;
    if (i0 < n_vec) {
        uint4 v;
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p + i0));
        acc = v.x ^ v.y ^ v.z ^ v.w;
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
    const long long stride = (long long)gridDim.x * blockDim.x;
    if (i0 + stride < n_vec) acc ^= stream_fold(p + stride, n_vec - stride);
    if (acc == 0x12345678u) out[0] = acc;
}
"""


def pdl_rows(mod, sink: torch.Tensor) -> dict:
    """At 14336 × 4096 (W4A16): the pure read with and without programmatic dependent launch, and the decode GEMV
    (M = 1) with and without it, all in this process under the same timing rules."""
    from quantkit.bench.problems import _packed
    from quantkit.runtime.kernels.cuda_common import launch, pdl_off_reason, pdl_supported
    from quantkit.runtime.kernels.cuda_gemv import w4a16_gemv_cuda

    dev = torch.cuda.current_device()
    n, k = 14336, 4096
    t, meta = _packed("w4a16", torch.randn(n, k, device="cuda"))
    nbytes = sum(v.numel() * v.element_size() for v in t.values()) // 16 * 16
    copies = copies_to_defeat_l2(nbytes)
    bufs = [torch.randint(0, 1 << 30, (nbytes // 4,), dtype=torch.int32, device="cuda") for _ in range(copies)]
    row = {"n": n, "k": k, "mbytes": nbytes / 1e6}
    plain = mod.get_function("stream_read")
    pdl_mod = cupy.RawModule(code=PDL_SOURCE)  # griddepcontrol: sm_90 and up
    pdl, pdl_gemv = pdl_mod.get_function("stream_read_pdl"), pdl_mod.get_function("stream_read_pdl_gemv")
    row["pdl_launch"] = pdl_supported(dev)  # False: every "pdl" row below was an ordinary launch
    row["pdl_off_reason"] = pdl_off_reason(dev)
    # the GEMV (896 blocks of 2 warps) loads 3.7 MB, 12 % of these bytes, before its wait; read_pdlgemv on 896 blocks
    # of 256 threads loads the same 3.7 MB before its wait
    for blocks in (264, 528, 896, 1056, 2112):
        for name, fn, attr in (("read", plain, False), ("read_pdl", pdl, True), ("read_pdlgemv", pdl_gemv, True)):
            def call(b, fn=fn, attr=attr, blocks=blocks):
                launch(fn, attr, dev, torch.cuda.current_stream().cuda_stream, (blocks,), (256,),
                       (np.uint64(b.data_ptr()), np.int64(nbytes // 16), np.uint64(sink.data_ptr())))
            row[f"{name}_{blocks}x256_us"] = time_rotating(call, [(b,) for b in bufs])["ms"] * 1e3
    del bufs
    tt = [{kk: v.clone() for kk, v in t.items()} for _ in range(copies)]
    xs = [torch.randn(1, k, device="cuda", dtype=torch.float16) for _ in range(copies)]
    before = os.environ.get("QUANTKIT_PDL")
    for switch in ("1", "0"):
        os.environ["QUANTKIT_PDL"] = switch
        row[f"gemv_pdl{switch}_us"] = time_rotating(lambda x, w: w4a16_gemv_cuda(x, w, meta),
                                                    list(zip(xs, tt)))["ms"] * 1e3
    if before is None:
        os.environ.pop("QUANTKIT_PDL")
    else:
        os.environ["QUANTKIT_PDL"] = before
    for tag in ("read", "read_pdl", "read_pdlgemv"):
        # "read_<blocks>x256_us" / "read_pdl_<blocks>x256_us" (the first run's log took both for best_read_us)
        row[f"best_{tag}_us"] = min(v for kk, v in row.items() if kk.startswith(tag + "_")
                                    and kk[len(tag) + 1].isdigit())
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pdl", action="store_true", help="only the programmatic-dependent-launch rows (docstring)")
    args = ap.parse_args()
    mod = cupy.RawModule(code=SOURCE)
    empty, read = mod.get_function("empty_kernel"), mod.get_function("stream_read")
    pattern = mod.get_function("gemv_pattern_read")
    sink = torch.zeros(4, dtype=torch.int32, device="cuda")

    def launch(fn, grid, block, args):
        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            fn(grid, block, args)

    out = {"device": torch.cuda.get_device_name(), "rows": []}
    if args.pdl:
        out["pdl"] = pdl_rows(mod, sink)
        print(json.dumps(out))
        return
    t = time_rotating(lambda: launch(empty, (1,), (32,), (np.uint64(sink.data_ptr()),)), [()], calls_per_graph=64)
    out["empty_kernel_us"] = t["ms"] * 1e3
    print(f"empty kernel in a graph: {t['ms'] * 1e3:.2f} us per launch", flush=True)
    for mb in (8.4, 15.4, 30.8, 61.6, 117.4):
        nbytes = int(mb * 1e6) // 16 * 16
        copies = copies_to_defeat_l2(nbytes)
        bufs = [torch.randint(0, 1 << 30, (nbytes // 4,), dtype=torch.int32, device="cuda") for _ in range(copies)]
        row = {"mbytes": nbytes / 1e6}
        for blocks in (132, 264, 528, 1056, 2112, 4224):
            fn = lambda b, blocks=blocks: launch(read, (blocks,), (256,),  # noqa: E731
                                                 (np.uint64(b.data_ptr()), np.int64(nbytes // 16),
                                                  np.uint64(sink.data_ptr())))
            row[f"read_{blocks}x256_us"] = time_rotating(fn, [(b,) for b in bufs])["ms"] * 1e3
        row_vec = 4096 // 32  # K = 4096 at 4 bits: 2 KB = 128 vectors per row
        n_rows = nbytes // (row_vec * 16) // 16 * 16
        for tile_major in (0, 1):
            for warps in (2, 4, 8):
                fn = lambda b, tm=tile_major, w=warps: launch(pattern, (n_rows // 16,), (32 * w,),  # noqa: E731
                                                              (np.uint64(b.data_ptr()), np.int32(n_rows),
                                                               np.int32(row_vec), np.int32(tm),
                                                               np.uint64(sink.data_ptr())))
                key = f"gemv_pattern_{'tilemajor' if tile_major else 'rowmajor'}_w{warps}_us"
                row[key] = time_rotating(fn, [(b,) for b in bufs])["ms"] * 1e3
        row["torch_sum_us"] = time_rotating(lambda b: b.sum(), [(b,) for b in bufs])["ms"] * 1e3
        best = min(v for key, v in row.items() if key.startswith("read_"))
        row["best_read_us"] = best
        row["best_read_tbps"] = nbytes / best / 1e6
        print(json.dumps(row), flush=True)
        out["rows"].append(row)
        del bufs
        torch.cuda.empty_cache()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
