
// c[0..3] += A (a0..a3) · B (b0, b1), fp32 accumulators, operands of element type TY ("f16" or "bf16")
#define QK_MMA_M16N8K16(TY)                                                                                  \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TY "." TY ".f32 {%0, %1, %2, %3}, "                 \
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"                                             \
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                            \
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))

// (a & mask) | bits in one LOP3 (0xEA = (a & b) | c); written out because the compiler, given two immediates,
// emits an AND and an OR (64 more instructions per tile)
__device__ __forceinline__ u32 and_or(u32 a, u32 mask, u32 bits) {
    u32 r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(a), "r"(mask), "r"(bits));
    return r;
}

template <bool BF16> struct Pair;
template <> struct Pair<false> {
    typedef __half T; typedef __half2 T2;
    static __device__ __forceinline__ T2 bits(u32 v) { return *reinterpret_cast<T2*>(&v); }
    static __device__ __forceinline__ u32 word(T2 v) { return *reinterpret_cast<u32*>(&v); }
    // low nibbles of p's bytes 0 and 2 with the 0x6400 exponent: the fp16 pair 1024 + q; minus (1024 + z): q - z
    static __device__ __forceinline__ u32 low_q(u32 p, T2 zm) {
        return word(__hsub2(bits(and_or(p, 0x000F000Fu, 0x64006400u)), zm));
    }
    // high nibbles in place: 1024 + 16q; fma(v, 1/16, -(64 + z)) = q - z exactly
    static __device__ __forceinline__ u32 high_q(u32 p, T2 zm) {
        return word(__hfma2(bits(and_or(p, 0x00F000F0u, 0x64006400u)), bits(0x2C002C00u), zm));
    }
    // fp16 bit patterns: 1024 + z = 0x6400 + z (ulp 1), -(64 + z) = 0xD400 + 16z (ulp 1/16), 1/16 = 0x2C00
    static __device__ __forceinline__ void zeros(u32 w, T2& z_lo, T2& z_hi) {
        const u32 z = (w >> 16) & 0xFFu;
        z_lo = bits(0x64006400u + z * 0x00010001u);
        z_hi = bits(0xD400D400u + (z << 4) * 0x00010001u);
    }
    static __device__ __forceinline__ float scale(u32 w) {
        return __half2float(__ushort_as_half((unsigned short)(w & 0xFFFFu)));
    }
    static __device__ __forceinline__ void mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
        QK_MMA_M16N8K16("f16");
    }
};
template <> struct Pair<true> {
    typedef __nv_bfloat16 T; typedef __nv_bfloat162 T2;
    static __device__ __forceinline__ T2 bits(u32 v) { return *reinterpret_cast<T2*>(&v); }
    static __device__ __forceinline__ u32 word(T2 v) { return *reinterpret_cast<u32*>(&v); }
    // 0x4300 = 128.0 in bf16 (ulp 1 on [128, 256)): 128 + q exactly, minus (128 + z) exactly
    static __device__ __forceinline__ u32 low_q(u32 p, T2 zm) {
        return word(__hsub2(bits(and_or(p, 0x000F000Fu, 0x43004300u)), zm));
    }
    static __device__ __forceinline__ u32 high_q(u32 p, T2 zm) {
        return word(__hsub2(bits(and_or(p >> 4, 0x000F000Fu, 0x43004300u)), zm));
    }
    static __device__ __forceinline__ void zeros(u32 w, T2& z_lo, T2& z_hi) {
        z_lo = bits(0x43004300u + ((w >> 16) & 0xFFu) * 0x00010001u);
        z_hi = z_lo;
    }
    static __device__ __forceinline__ float scale(u32 w) {  // the fp16 scale rounded to bf16, as the reference
        return __bfloat162float(__float2bfloat16_rn(__half2float(__ushort_as_half((unsigned short)(w & 0xFFFFu)))));
    }
    static __device__ __forceinline__ void mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
        QK_MMA_M16N8K16("bf16");
    }
};

// byte b of word a -> bytes 0, 1; byte b of word c -> bytes 2, 3
__device__ __forceinline__ u32 gather(u32 a, u32 c, int b) {
    return __byte_perm(a, c, (u32)(b | (b << 4) | ((4 + b) << 8) | ((4 + b) << 12)));
}

struct Tile {  // one lane's share of a 256-column tile of the block's 16 rows, loaded one tile ahead
    uint4 w[2][2];  // [row g, row g + 8][words 4c..4c+3, words 16+4c..16+4c+3]
    u32 p[2][2];    // [row][half-tile 0, 1] scale | zero words
};

// acc[j] += Σ over one 256-column tile t of (q - z)·x, one fp32 scale per (row, half-tile); acc[j][i]: row
// g + 8(i >> 1), token 8j + 2c + (i & 1) of the launch column. J sets of 8 tokens share every dequantized fragment
// (xr[j]: token 8j + g's activations).
template <bool BF16, int J>
__device__ __forceinline__ void mma_tile(const Tile& cur, const typename Pair<BF16>::T* const* xr, int t,
                                         float (*acc)[4]) {
    typedef Pair<BF16> P;
    typedef typename P::T2 T2;
    T2 zl[2], zh[2], unused;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        P::zeros(cur.p[r][0], zl[r], unused);
        P::zeros(cur.p[r][1], unused, zh[r]);
    }
    float part[J][2][4];  // Σ (q - z)·x per token set and half-tile (fp32)
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
        for (int i = 0; i < 8; ++i) part[j][i >> 2][i & 3] = 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {      // words 0-15 / 16-31 of the tile
#pragma unroll
        for (int b = 0; b < 4; ++b) {  // byte b: plane b (low nibble, first half-tile), b + 4 (high, second)
            u32 pa[2], pb[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                pa[r] = gather(cur.w[r][h].x, cur.w[r][h].y, b);  // columns 4c, 4c+1 of the plane
                pb[r] = gather(cur.w[r][h].z, cur.w[r][h].w, b);  // columns 4c+2, 4c+3
            }
#pragma unroll
            for (int hi = 0; hi < 2; ++hi) {
                const int plane = b + 4 * hi;
                u32 a0, a1, a2, a3;
                if (hi == 0) {
                    a0 = P::low_q(pa[0], zl[0]); a1 = P::low_q(pa[1], zl[1]);
                    a2 = P::low_q(pb[0], zl[0]); a3 = P::low_q(pb[1], zl[1]);
                } else {
                    a0 = P::high_q(pa[0], zh[0]); a1 = P::high_q(pa[1], zh[1]);
                    a2 = P::high_q(pb[0], zh[0]); a3 = P::high_q(pb[1], zh[1]);
                }
#pragma unroll
                for (int j = 0; j < J; ++j) {
                    // token 8j + g's columns 256t + 32·plane + 16h + 4c .. +3
                    const uint2 xv = *reinterpret_cast<const uint2*>(xr[j] + t * 256 + plane * 32 + 16 * h);
                    P::mma(part[j][hi], a0, a1, a2, a3, xv.x, xv.y);
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // one fp32 scale per (row, half-tile)
            const int r = i >> 1;
            acc[j][i] = fmaf(P::scale(cur.p[r][0]), part[j][0][i], fmaf(P::scale(cur.p[r][1]), part[j][1][i],
                                                                         acc[j][i]));
        }
}

// Y[M, N] = X[M, K] · Ŵ[N, K]^T for 8·J tokens per launch column: a block owns 16 rows, its NWARPS warps share K;
// each warp multiplies one tile while the next is loading (two register tiles used in turn, so no tile is copied)
// L2PF: see ld_stream. The explicit minimum of 1 block per SM matters: without it ptxas aims at more resident
// blocks, caps the kernel at 80 registers, hoists fewer loads and runs 10-45 % slower
// WAIT2: wait for the previous grid after two tiles are in flight, not one
template <int NWARPS, bool BF16, int L2PF, int J, bool WAIT2>
__global__ void __launch_bounds__(NWARPS * 32, 1)
w4a16_gemv_mma(const void* __restrict__ x_, const uint4* __restrict__ w, const u32* __restrict__ qp,
               void* __restrict__ out_, int M, int N, long long stride_xm, long long stride_om, int w_row_vec,
               int n_tiles, int halves_per_group, int group_shift, int n_groups) {
    typedef typename Pair<BF16>::T T;
    const T* x = reinterpret_cast<const T*>(x_);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, c = lane & 3;  // mma fragment coordinates: row / token g, column pair c
    const int row0 = blockIdx.x * 16;
    const int m0 = blockIdx.y * 8 * J;
    const int rows[2] = {min(row0 + g, N - 1), min(row0 + g + 8, N - 1)};
    // lanes of tokens past M read the last token (their output columns are never stored): no predicate, no zeroing
    const T* xr[J];
    float acc[J][4];
#pragma unroll
    for (int j = 0; j < J; ++j) {
        xr[j] = x + (long long)min(m0 + 8 * j + g, M - 1) * stride_xm + 4 * c;
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[j][i] = 0.f;
    }

    auto load = [&](int t, Tile& tl) {
        const int g_lo = group_of(2 * t, group_shift, halves_per_group, n_groups);
        const int g_hi = group_of(2 * t + 1, group_shift, halves_per_group, n_groups);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const uint4* base = w + (long long)rows[r] * w_row_vec + t * 8 + c;
            tl.w[r][0] = ld_stream<L2PF>(base);
            tl.w[r][1] = ld_stream<L2PF>(base + 4);
            tl.p[r][0] = __ldg(qp + (long long)g_lo * N + rows[r]);
            tl.p[r][1] = __ldg(qp + (long long)g_hi * N + rows[r]);
        }
    };
    pdl_trigger();
    Tile ta, tb;
    int t = warp;
    if (t < n_tiles) load(t, ta);
    if (WAIT2 && t + NWARPS < n_tiles) load(t + NWARPS, tb);
    pdl_wait();  // the weights are no earlier kernel's output; the activations may be
    // each tile is requested one tile's work before it is used: the register tile it lands in was just consumed
    for (; t < n_tiles; t += 2 * NWARPS) {
        if (!WAIT2 && t + NWARPS < n_tiles) load(t + NWARPS, tb);
        mma_tile<BF16, J>(ta, xr, t, acc);
        if (WAIT2 && t + 2 * NWARPS < n_tiles) load(t + 2 * NWARPS, ta);
        if (t + NWARPS >= n_tiles) break;
        if (!WAIT2 && t + 2 * NWARPS < n_tiles) load(t + 2 * NWARPS, ta);
        mma_tile<BF16, J>(tb, xr, t + NWARPS, acc);
        if (WAIT2 && t + 3 * NWARPS < n_tiles) load(t + 3 * NWARPS, tb);
    }
    reduce_store<NWARPS, J>(acc, reinterpret_cast<T*>(out_), row0, m0, M, N, stride_om, nullptr);
}
