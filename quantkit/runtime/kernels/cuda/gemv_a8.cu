
struct Part {  // one partition of the layer: weights, their scales, output columns
    const void* w;        // w8: int8 [n, w_row] ; asym4 / lqq: tile-planar 4-bit words, w_row bytes per row
    const void* params;   // w8: float32 scales [groups, n] ; asym4 / lqq: qparams words [groups, n]
    const __half* cs;     // lqq: first-level per-channel scales [n] (LiquidGEMM Eq. 1); else unused
    const int* cols;      // output column of each row (nullptr: the row itself)
    int n, w_row, hpg, shift, groups;
};

template <int MODE> struct TileA8;
template <> struct TileA8<0> { uint4 w[2][4]; float s[2][2]; };   // [row g, g+8][64-column chunk]; scales
template <> struct TileA8<1> { uint4 w[2][2]; u32 p[2][2]; };     // as the W4A16 GEMV: words, scale|zero
template <> struct TileA8<2> { uint4 w[2][2]; u32 p[2][2]; };     // the same words; s_u8 | a << 8

template <int MODE>
__device__ __forceinline__ void load_tile(const Part& P, const int* rows, int c, int t, TileA8<MODE>& tl) {
    const int g_lo = group_of(2 * t, P.shift, P.hpg, P.groups);
    const int g_hi = group_of(2 * t + 1, P.shift, P.hpg, P.groups);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const char* row = reinterpret_cast<const char*>(P.w) + (long long)rows[r] * P.w_row;
        if constexpr (MODE == 0) {
            tl.w[r][0] = ld_stream<128>(row + t * 256 + 16 * c);
            tl.w[r][1] = ld_stream<128>(row + t * 256 + 64 + 16 * c);
            tl.w[r][2] = ld_stream<128>(row + t * 256 + 128 + 16 * c);
            tl.w[r][3] = ld_stream<128>(row + t * 256 + 192 + 16 * c);
            const float* s = reinterpret_cast<const float*>(P.params);
            tl.s[r][0] = __ldg(s + (long long)g_lo * P.n + rows[r]);
            tl.s[r][1] = __ldg(s + (long long)g_hi * P.n + rows[r]);
        } else {
            tl.w[r][0] = ld_stream<128>(row + t * 128 + 16 * c);
            tl.w[r][1] = ld_stream<128>(row + t * 128 + 64 + 16 * c);
            const u32* q = reinterpret_cast<const u32*>(P.params);
            tl.p[r][0] = __ldg(q + (long long)g_lo * P.n + rows[r]);
            tl.p[r][1] = __ldg(q + (long long)g_hi * P.n + rows[r]);
        }
    }
}

// acc[j][i] (row g + 8(i >> 1), token 8j + 2c + (i & 1) of the launch column) += Σ over tile t of w·a, scaled per
// half-tile by the weight and activation group scales; J sets of 8 tokens share every weight fragment.
// ar[j]: token 8j + g's codes; sa0[j] / sa1[j]: the activation scale rows of tokens 8j + 2c, 8j + 2c + 1
template <int MODE, int J>
__device__ __forceinline__ void tile_a8(const TileA8<MODE>& tl, const signed char* const* ar, const float* const* sa0,
                                        const float* const* sa1, int t, int a_shift, int a_hpg, int a_groups, int c,
                                        float (*acc)[4]) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        int part[J][4];
#pragma unroll
        for (int j = 0; j < J; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) part[j][i] = 0;
        float sw[2];
        if constexpr (MODE == 0) {
#pragma unroll
            for (int q = 2 * half; q < 2 * half + 2; ++q) {  // 64-column chunks of this half
#pragma unroll
                for (int j = 0; j < J; ++j) {
                    const uint4 av = *reinterpret_cast<const uint4*>(ar[j] + t * 256 + 64 * q + 16 * c);
                    imma_s8(part[j], tl.w[0][q].x, tl.w[1][q].x, tl.w[0][q].y, tl.w[1][q].y, av.x, av.y);
                    imma_s8(part[j], tl.w[0][q].z, tl.w[1][q].z, tl.w[0][q].w, tl.w[1][q].w, av.z, av.w);
                }
            }
#pragma unroll
            for (int r = 0; r < 2; ++r) sw[r] = tl.s[r][half];
        } else if constexpr (MODE == 2) {
            // LiquidQuant: four int8 lanes at once, ((q·s + a) mod 256) XOR 0x80 = IMAD + XOR (LiquidGEMM Eq. 12;
            // q·s + a <= 255 by construction, Eq. 11, so no carry crosses a lane)
            u32 s8[2], a4[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                s8[r] = tl.p[r][half] & 0xFFu;
                a4[r] = ((tl.p[r][half] >> 8) & 0xFFu) * 0x01010101u;
                sw[r] = 1.f;  // the per-channel scale comes once, after the last tile
            }
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                const int plane = b + 4 * half;
                u32 q[2][2];
#pragma unroll
                for (int r = 0; r < 2; ++r)
#pragma unroll
                    for (int v = 0; v < 2; ++v) {
                        const u32 bytes = gather4(tl.w[r][v], b);
                        q[r][v] = (((half == 0 ? bytes : bytes >> 4) & 0x0F0F0F0Fu) * s8[r] + a4[r]) ^ 0x80808080u;
                    }
#pragma unroll
                for (int j = 0; j < J; ++j) {
                    const u32 b0 = *reinterpret_cast<const u32*>(ar[j] + t * 256 + plane * 32 + 4 * c);
                    const u32 b1 = *reinterpret_cast<const u32*>(ar[j] + t * 256 + plane * 32 + 16 + 4 * c);
                    imma_s8(part[j], q[0][0], q[1][0], q[0][1], q[1][1], b0, b1);
                }
            }
        } else {
            int asum[J][4];
#pragma unroll
            for (int j = 0; j < J; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i) asum[j][i] = 0;
#pragma unroll
            for (int b = 0; b < 4; ++b) {  // plane b + 4·half: low (half 0) or high (half 1) nibbles of byte b
                const int plane = b + 4 * half;
                u32 q[2][2];
#pragma unroll
                for (int r = 0; r < 2; ++r)
#pragma unroll
                    for (int v = 0; v < 2; ++v) {
                        const u32 bytes = gather4(tl.w[r][v], b);
                        q[r][v] = (half == 0 ? bytes : bytes >> 4) & 0x0F0F0F0Fu;
                    }
#pragma unroll
                for (int j = 0; j < J; ++j) {
                    const u32 b0 = *reinterpret_cast<const u32*>(ar[j] + t * 256 + plane * 32 + 4 * c);
                    const u32 b1 = *reinterpret_cast<const u32*>(ar[j] + t * 256 + plane * 32 + 16 + 4 * c);
                    imma_u8(part[j], q[0][0], q[1][0], q[0][1], q[1][1], b0, b1);
                    imma_u8(asum[j], 0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u, b0, b1);
                }
            }
            int z[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const u32 p = tl.p[r][half];
                sw[r] = __half2float(__ushort_as_half((unsigned short)(p & 0xFFFFu)));
                z[r] = (int)((p >> 16) & 0xFFu);
            }
#pragma unroll
            for (int j = 0; j < J; ++j)
#pragma unroll
                for (int i = 0; i < 4; ++i) part[j][i] -= z[i >> 1] * asum[j][i];  // Σ q·a − z·Σ a, exact
        }
        const int ag = group_of(2 * t + half, a_shift, a_hpg, a_groups);
#pragma unroll
        for (int j = 0; j < J; ++j) {
            const float s_tok[2] = {__ldg(sa0[j] + ag), __ldg(sa1[j] + ag)};
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[j][i] = fmaf((float)part[j][i], sw[i >> 1] * s_tok[i & 1], acc[j][i]);
        }
    }
}

template <int NWARPS, bool BF16, int MODE, int J, bool WAIT2>
__device__ __forceinline__ void block_a8(const Part& P, int blk, const signed char* a, const float* sa, int M,
                                         long long stride_am, long long stride_sm, int a_hpg, int a_shift,
                                         int a_groups, void* out_, long long stride_om, int n_tiles) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, c = lane & 3;
    const int row0 = blk * 16, m0 = blockIdx.y * 8 * J;
    const int rows[2] = {min(row0 + g, P.n - 1), min(row0 + g + 8, P.n - 1)};
    // tokens past M read the last token (their outputs are never stored)
    const signed char* ar[J];
    const float* sa0[J];
    const float* sa1[J];
#pragma unroll
    for (int j = 0; j < J; ++j) {
        ar[j] = a + (long long)min(m0 + 8 * j + g, M - 1) * stride_am;
        sa0[j] = sa + (long long)min(m0 + 8 * j + 2 * c, M - 1) * stride_sm;
        sa1[j] = sa + (long long)min(m0 + 8 * j + 2 * c + 1, M - 1) * stride_sm;
    }
    float acc[J][4];
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[j][i] = 0.f;
    pdl_trigger();
    TileA8<MODE> ta, tb;
    int t = warp;
    if (t < n_tiles) load_tile<MODE>(P, rows, c, t, ta);
    if (WAIT2 && t + NWARPS < n_tiles) load_tile<MODE>(P, rows, c, t + NWARPS, tb);
    pdl_wait();  // the weights are no earlier kernel's output; the activation codes may be the quantizer's
    // as in the W4A16 GEMV: each tile requested one tile's work ahead, into the register tile just consumed
    for (; t < n_tiles; t += 2 * NWARPS) {
        if (!WAIT2 && t + NWARPS < n_tiles) load_tile<MODE>(P, rows, c, t + NWARPS, tb);
        tile_a8<MODE, J>(ta, ar, sa0, sa1, t, a_shift, a_hpg, a_groups, c, acc);
        if (WAIT2 && t + 2 * NWARPS < n_tiles) load_tile<MODE>(P, rows, c, t + 2 * NWARPS, ta);
        if (t + NWARPS >= n_tiles) break;
        if (!WAIT2 && t + 2 * NWARPS < n_tiles) load_tile<MODE>(P, rows, c, t + 2 * NWARPS, ta);
        tile_a8<MODE, J>(tb, ar, sa0, sa1, t + NWARPS, a_shift, a_hpg, a_groups, c, acc);
        if (WAIT2 && t + 3 * NWARPS < n_tiles) load_tile<MODE>(P, rows, c, t + 3 * NWARPS, tb);
    }
    if constexpr (MODE == 2) {  // LiquidQuant: W = Q_i8 · s_c, one first-level scale per output channel
        const float cs[2] = {__half2float(P.cs[rows[0]]), __half2float(P.cs[rows[1]])};
#pragma unroll
        for (int j = 0; j < J; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[j][i] *= cs[i >> 1];
    }
    reduce_store<NWARPS, J>(acc, reinterpret_cast<typename OutType<BF16>::T*>(out_), row0, m0, M, P.n,
                            stride_om, P.cols);
}

// Y[M, out] for 8·J tokens per launch column; blocks [0, nb_first) run partition A, the rest partition B;
// WAIT2: the previous grid is waited for after two weight tiles are in flight, not one
template <int NWARPS, bool BF16, int MODE_A, int MODE_B, int J, bool WAIT2>
__global__ void __launch_bounds__(NWARPS * 32, 1)
a8_gemv(const signed char* __restrict__ a, const float* __restrict__ sa, int M, long long stride_am,
        long long stride_sm, int a_hpg, int a_shift, int a_groups, void* __restrict__ out, long long stride_om,
        int n_tiles, int nb_first,
        const void* w_a, const void* p_a, const __half* cs_a, const int* cols_a, int n_a, int w_row_a, int hpg_a,
        int shift_a, int groups_a,
        const void* w_b, const void* p_b, const __half* cs_b, const int* cols_b, int n_b, int w_row_b, int hpg_b,
        int shift_b, int groups_b) {
    const Part pa = {w_a, p_a, cs_a, cols_a, n_a, w_row_a, hpg_a, shift_a, groups_a};
    const Part pb = {w_b, p_b, cs_b, cols_b, n_b, w_row_b, hpg_b, shift_b, groups_b};
    if ((int)blockIdx.x < nb_first)
        block_a8<NWARPS, BF16, MODE_A, J, WAIT2>(pa, blockIdx.x, a, sa, M, stride_am, stride_sm, a_hpg, a_shift,
                                              a_groups, out, stride_om, n_tiles);
    else
        block_a8<NWARPS, BF16, MODE_B, J, WAIT2>(pb, blockIdx.x - nb_first, a, sa, M, stride_am, stride_sm, a_hpg,
                                              a_shift, a_groups, out, stride_om, n_tiles);
}
