"""What the CUDA decode GEMVs (:mod:`.cuda_gemv`, :mod:`.cuda_gemv_a8`) share: the C++ ``PRELUDE`` (streaming
weight loads, the group index of a 128-column half-tile, the cross-warp reduction that writes a block's outputs)
that each GEMV's source begins with, and the host side — CuPy detection, NVRTC compilation of one template
instance (cached, with a compile failure reported as a reason so the Triton kernels run instead), the torch stream
as a CuPy stream, and the shift form of a group size."""

from __future__ import annotations

import functools
import warnings

PRELUDE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>

typedef unsigned int u32;

// L2PF: the L2 sector prefetch size the load asks for (0: none, 128 or 256 bytes): with 256, a warp's load of its
// 128-byte tile line also brings the next warp's line into L2
template <int L2PF>
__device__ __forceinline__ uint4 ld_stream(const void* p) {
    uint4 v;
    if (L2PF == 256)
        asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    else if (L2PF == 128)
        asm volatile("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    else
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// the scale|zero group of half-tile `half` (128 columns): half >> shift when the group is a power-of-two number of
// half-tiles (31 for one group per row), else a division — a run-time signed division costs ~40 instructions
__device__ __forceinline__ int group_of(int half, int shift, int halves_per_group, int n_groups) {
    return min(shift >= 0 ? half >> shift : half / halves_per_group, n_groups - 1);
}

template <bool BF16> struct OutType { typedef __half T; };
template <> struct OutType<true> { typedef __nv_bfloat16 T; };
__device__ __forceinline__ void store_out(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store_out(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// sum the NWARPS warps' K shares of acc[j][i] (row g + 8(i >> 1), token 8j + 2c + (i & 1) of the launch column:
// the mma C fragment) through shared memory; warp 0 writes the block's outputs, row r to column cols[r] when a
// column map is given (a partition of a mixed-precision layer), else to column r
template <int NWARPS, int J, typename T>
__device__ __forceinline__ void reduce_store(const float (*acc)[4], T* out, int row0, int m0, int M, int N,
                                             long long stride_om, const int* cols) {
    __shared__ float red[NWARPS][4 * J][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) red[warp][4 * j + i][lane] = acc[j][i];
    __syncthreads();
    if (warp == 0) {
#pragma unroll
        for (int j = 0; j < J; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                float v = 0.f;
#pragma unroll
                for (int q = 0; q < NWARPS; ++q) v += red[q][4 * j + i][lane];
                const int row = row0 + g + 8 * (i >> 1);
                const int tok = m0 + 8 * j + 2 * c + (i & 1);
                if (row < N && tok < M) store_out(out + (long long)tok * stride_om + (cols ? cols[row] : row), v);
            }
    }
}
"""


@functools.lru_cache(maxsize=1)
def cupy_available() -> bool:
    """True when CuPy imports and sees a CUDA device (kernels compile on first use)."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 — no CuPy, no driver, or no device: the Triton kernels run instead
        return False


@functools.lru_cache(maxsize=None)
def compiled(device_index: int, source: str, name: str):
    """The CuPy function of template instance ``name`` of ``source`` on that device (NVRTC, ~1 s on first use)."""
    import cupy

    with cupy.cuda.Device(device_index):
        mod = cupy.RawModule(code=source, options=("--std=c++17",), name_expressions=[name])
        mod.compile()
        return mod.get_function(name)


@functools.lru_cache(maxsize=None)
def compile_problem(device_index: int, source: str, names: tuple[str, ...], what: str) -> str | None:
    """None when every instance in ``names`` compiles (cached), else the reason, with a warning that ``what``
    falls back to Triton."""
    try:
        for name in names:
            compiled(device_index, source, name)
    except Exception as e:  # noqa: BLE001 — NVRTC/driver trouble: the Triton kernels run instead
        warnings.warn(f"quantkit {what} unavailable ({type(e).__name__}: {str(e)[:200]}); using Triton",
                      RuntimeWarning, stacklevel=3)
        return f"the {what} did not compile: {type(e).__name__}"
    return None


@functools.lru_cache(maxsize=None)
def stream(device_index: int, handle: int):
    """The torch stream ``handle`` as a CuPy stream, so kernels run in order with torch work (and graph capture)."""
    import cupy

    with warnings.catch_warnings():  # CuPy 14 deprecates ExternalStream for Stream.from_external; both wrap the handle
        warnings.simplefilter("ignore", DeprecationWarning)
        return cupy.cuda.ExternalStream(handle, device_index)


def group_shift(group_size: int, halves_per_group: int) -> int:
    """The ``shift`` argument of PRELUDE's group_of: log2 of the group size in half-tiles when it is a power of
    two, 31 for one group per row (every half-tile index >> 31 is 0), else -1 (group_of then divides)."""
    if group_size == -1:
        return 31
    return halves_per_group.bit_length() - 1 if halves_per_group & (halves_per_group - 1) == 0 else -1
