
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

// programmatic dependent launch (module docstring): wait for the previous grid before reading what it wrote; let
// the next grid launch. Only the source compiled with QK_PDL (PDL_DEFINE) has them, and it refuses to compile
// below sm_90, so a kernel launched with the attribute always waits.
#ifdef QK_PDL
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 900
#error "programmatic dependent launch needs sm_90 code"
#endif
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
#else
__device__ __forceinline__ void pdl_wait() {}
__device__ __forceinline__ void pdl_trigger() {}
#endif

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
