
__device__ __forceinline__ void cp_async16(u32 dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_wait() {
    asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}

// every CTA of the cluster past this point, and every shared-memory write before it visible to all of them
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// four int32 at shared address `addr` of the cluster's CTA `rank` (distributed shared memory)
__device__ __forceinline__ int4 ld_cluster_v4(u32 addr, int rank) {
    u32 remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
    int4 v;
    asm volatile("ld.shared::cluster.v4.s32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(remote) : "memory");
    return v;
}

__device__ __forceinline__ void cp_async4(u32 dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"(dst), "l"(src) : "memory");
}

__device__ __forceinline__ uint4 lds128(u32 addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    return v;
}

__device__ __forceinline__ u32 lds32(u32 addr) {
    u32 v;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr));
    return v;
}

// After each CTA wrote its int32 partial tile [BT tokens][ROWS + 4] at the start of its shared memory: the cluster
// barrier publishes them; CTA `rank` adds token rows rank·BT/S … of all S (distributed shared memory) and stores
// them as (sum · token scale) · channel scale; the second barrier keeps every CTA's shared memory alive until its
// peers have read it
template <int S, int BT, int NTH, int ROWS, typename T>
__device__ __forceinline__ void cluster_add_store(u32 smem0, int rank, int row0, int m0, int M, int N, const float* sa,
                                                  long long stride_sm, const __half* cs, T* out,
                                                  long long stride_om) {
    constexpr int PART = ROWS + 4;  // int32 per token row: the weight rows + 4 (conflict-free stores)
    constexpr int QUADS = ROWS / 4;  // 4 weight rows per thread and step
    cluster_sync();
    constexpr int TOKS = BT / S;  // token rows this CTA adds up and stores
    for (int idx = threadIdx.x; idx < TOKS * QUADS; idx += NTH) {
        const int tl = rank * TOKS + idx / QUADS, rq = 4 * (idx % QUADS);
        const u32 addr = smem0 + (u32)(tl * PART + rq) * 4u;
        int4 sum = ld_cluster_v4(addr, 0);
#pragma unroll
        for (int q = 1; q < S; ++q) {
            const int4 v = ld_cluster_v4(addr, q);
            sum.x += v.x; sum.y += v.y; sum.z += v.z; sum.w += v.w;
        }
        const int tok = m0 + tl;
        if (tok < M) {
            const float s_tok = sa[(long long)tok * stride_sm];
            const int vals[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = row0 + rq + e;
                if (row < N)  // (sum · token scale) · channel scale: the Triton / Gluon epilogue's order
                    store_out(out + (long long)tok * stride_om + row,
                              __fmul_rn(__fmul_rn((float)vals[e], s_tok), __half2float(cs[row])));
            }
        }
    }
    cluster_sync();  // no CTA exits while a peer may still read its shared memory
}

// tile t's ROWS weight rows' words (W_ROW bytes a row, at w_dst) and their two half-tiles' group words (at p_dst,
// half-tile-major) into shared memory by cp.async; rows past N copy row N − 1 (never stored)
template <int NTH, int ROWS>
__device__ __forceinline__ void issue_weights(u32 w_dst, u32 p_dst, const char* w, const u32* params, int row0, int N,
                                              int w_row, int t, int shift, int hpg, int groups) {
    constexpr int W_ROW = 192;  // 128 bytes of words + 64: a 16-byte load phase's rows g, g + 1 in other bank halves
#pragma unroll
    for (int q = 0; q < ROWS * 8 / NTH; ++q) {
        const int idx = threadIdx.x + NTH * q, r = idx >> 3, ch = idx & 7;
        cp_async16(w_dst + r * W_ROW + 16 * ch, w + (long long)min(row0 + r, N - 1) * w_row + t * 128 + 16 * ch);
    }
    if (threadIdx.x < 2 * ROWS) {
        const int half = threadIdx.x / ROWS, r = threadIdx.x % ROWS;
        cp_async4(p_dst + 4 * threadIdx.x,
                  params + (long long)group_of(2 * t + half, shift, hpg, groups) * N + min(row0 + r, N - 1));
    }
}

// the Hopper shared-memory matrix descriptor of a K-major operand in the 128-byte swizzle: start address (16-byte
// units), leading offset 1 (unused by this layout), 1024 bytes between 8-row groups, layout type 1 (128B swizzle).
// A k32 slice inside the 128-byte row starts 32 bytes further; the hardware applies the XOR to the address
__device__ __forceinline__ unsigned long long smem_desc_sw128(u32 addr) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32)
           | (1ull << 62);
}

// 16 bytes from src, or 16 zero bytes when !valid (nothing read)
__device__ __forceinline__ void cp_async16_zfill(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// wait until at most PENDING groups of the warpgroup's products are left (the newest), with the A registers of the
// products it completes as operands: the compiler keeps them unchanged up to here (ptxas does not keep a register
// operand alive past the wgmma's issue)
template <int PENDING>
__device__ __forceinline__ void wgmma_wait_keep(u32 (*q)[4]) {
    asm volatile("wgmma.wait_group.sync.aligned %32;"
                 : "+r"(q[0][0]), "+r"(q[0][1]), "+r"(q[0][2]), "+r"(q[0][3]), "+r"(q[1][0]), "+r"(q[1][1]),
                   "+r"(q[1][2]), "+r"(q[1][3]), "+r"(q[2][0]), "+r"(q[2][1]), "+r"(q[2][2]), "+r"(q[2][3]),
                   "+r"(q[3][0]), "+r"(q[3][1]), "+r"(q[3][2]), "+r"(q[3][3]), "+r"(q[4][0]), "+r"(q[4][1]),
                   "+r"(q[4][2]), "+r"(q[4][3]), "+r"(q[5][0]), "+r"(q[5][1]), "+r"(q[5][2]), "+r"(q[5][3]),
                   "+r"(q[6][0]), "+r"(q[6][1]), "+r"(q[6][2]), "+r"(q[6][3]), "+r"(q[7][0]), "+r"(q[7][1]),
                   "+r"(q[7][2]), "+r"(q[7][3])
                 : "n"(PENDING) : "memory");
}

// a tile's A registers as operands of an empty statement placed after a wait: kept until then
__device__ __forceinline__ void keep_regs(u32 (*q)[4]) {
#pragma unroll
    for (int p = 0; p < 8; ++p)
        asm volatile("" : "+r"(q[p][0]), "+r"(q[p][1]), "+r"(q[p][2]), "+r"(q[p][3]) :: "memory");
}

// the accumulators as operands of an empty statement: no access to them moves across it
template <int N>
__device__ __forceinline__ void fence_acc(int* acc) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(acc[i]) :: "memory");
}
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// d (m64nN int32 accumulators) += A (registers) · B (descriptor), N = 64 or 128
template <int N> __device__ __forceinline__ void wgmma_s8(int* d, u32 a0, u32 a1, u32 a2, u32 a3,
                                                         unsigned long long desc);
template <> __device__ __forceinline__ void wgmma_s8<64>(int* d, u32 a0, u32 a1, u32 a2, u32 a3,
        unsigned long long desc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.s32.s8.s8 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p;\n}"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
}
template <> __device__ __forceinline__ void wgmma_s8<128>(int* d, u32 a0, u32 a1, u32 a2, u32 a3,
        unsigned long long desc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.s32.s8.s8 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p;\n}"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]), "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]), "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31]), "+r"(d[32]), "+r"(d[33]), "+r"(d[34]), "+r"(d[35]), "+r"(d[36]), "+r"(d[37]), "+r"(d[38]), "+r"(d[39]), "+r"(d[40]), "+r"(d[41]), "+r"(d[42]), "+r"(d[43]), "+r"(d[44]), "+r"(d[45]), "+r"(d[46]), "+r"(d[47]), "+r"(d[48]), "+r"(d[49]), "+r"(d[50]), "+r"(d[51]), "+r"(d[52]), "+r"(d[53]), "+r"(d[54]), "+r"(d[55]), "+r"(d[56]), "+r"(d[57]), "+r"(d[58]), "+r"(d[59]), "+r"(d[60]), "+r"(d[61]), "+r"(d[62]), "+r"(d[63])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc));
}

// Y [M, N] for 64·WG weight rows × BT tokens per CTA (WG warpgroups, 64 rows each), S CTAs of a cluster splitting K
// (module docstring): wgmma m64nBTk32, A — the dequantized weights, a warp's own 16 rows — from registers, B — the
// activation codes, shared by the warpgroups — from shared memory through a descriptor. Activation stages hold the
// tile as two halves of 128 codes (planes 0-3, 4-7), each BT rows of 128 bytes whose 16-byte chunks are
// XOR-swizzled by the row (the 128-byte swizzle): a row's copies and reads are contiguous in memory and free of bank
// conflicts. Token rows past M are zero-filled, not read. DEPTH: tiles whose products are in flight (1: each tile's
// products complete before the next tile's issue; 2: see the loop).
template <int S, int BT, int STAGES, bool BF16, int DEPTH, int WG>
__global__ void __cluster_dims__(S, 1, 1) __launch_bounds__(128 * WG)
lqq_cluster(const signed char* __restrict__ a, const float* __restrict__ sa, int M, long long stride_am,
               long long stride_sm, const char* __restrict__ w, const u32* __restrict__ params,
               const __half* __restrict__ cs, int N, int w_row, int hpg, int shift, int groups,
               void* __restrict__ out_, long long stride_om, int n_tiles, int tiles_per_split) {
    constexpr int NTH = 128 * WG, ROWS = 64 * WG;
    constexpr int W_ROW = 192, W_OFF = BT * 256, P_OFF = W_OFF + ROWS * W_ROW;
    constexpr int STAGE = (P_OFF + 2 * ROWS * 4 + 1023) / 1024 * 1024;  // a multiple of the 1024-byte swizzle atom
    constexpr int PART = ROWS + 4;
    static_assert(STAGES * STAGE >= BT * PART * 4, "the ring holds the partial tile at the end");
    static_assert(WG == 1 || DEPTH == 2, "warpgroups that share a stage refill it after a barrier (DEPTH 2)");
    static_assert(DEPTH == 1 || STAGES >= 3, "DEPTH 2 refills a tile's stage one tile late");
    extern __shared__ __align__(16) unsigned char smem_raw[];
    typedef typename OutType<BF16>::T T;
    T* out = reinterpret_cast<T*>(out_);
    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2,
              c = lane & 3;
    const int rank = blockIdx.x % S, row0 = (blockIdx.x / S) * ROWS, m0 = blockIdx.y * BT;
    const int t_begin = rank * tiles_per_split, t_end = min(t_begin + tiles_per_split, n_tiles);
    // the ring starts at a 1024-byte boundary: the 128-byte swizzle repeats every 8 rows of 128 bytes
    const u32 raw0 = (u32)__cvta_generic_to_shared(smem_raw), smem0 = (raw0 + 1023) & ~1023u;
    unsigned char* smem = smem_raw + (smem0 - raw0);

    int acc[BT / 2];
#pragma unroll
    for (int i = 0; i < BT / 2; ++i) acc[i] = 0;

    auto issue_w = [&](int t, int s) {
        if (t < t_end)
            issue_weights<NTH, ROWS>(smem0 + s * STAGE + W_OFF, smem0 + s * STAGE + P_OFF, w, params, row0, N, w_row,
                                     t, shift, hpg, groups);
    };
    auto issue_a = [&](int t, int s) {
        if (t < t_end) {
#pragma unroll
            for (int q = 0; q < BT * 16 / NTH; ++q) {  // 16 threads a token row: chunk ch of its 256 codes
                const int idx = threadIdx.x + NTH * q, r = idx >> 4, ch = idx & 15, c8 = ch & 7;
                cp_async16_zfill(smem0 + s * STAGE + (ch >> 3) * BT * 128 + r * 128 + ((c8 ^ (r & 7)) << 4),
                                 a + (long long)min(m0 + r, M - 1) * stride_am + t * 256 + 16 * ch, m0 + r < M);
            }
        }
    };
    pdl_trigger();
#pragma unroll
    for (int s = 0; s < STAGES; ++s) issue_w(t_begin + s, s);
    pdl_wait();
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
        issue_a(t_begin + s, s);
        cp_commit();
    }

    const int wrow = 64 * wg + 16 * warp + g;  // + 8r: the lane's weight rows in the CTA's ROWS
    // the A fragments of the tile in stage st: plane p's rows g / g + 8 × K 4c … / 16 + 4c …, dequantized four
    // int8 lanes at a time as (q·s + a) XOR 0x80 (LiquidGEMM Eq. 11-12)
    auto dequant = [&](u32 st, u32 (*q)[4]) {
        uint4 words[2][2];  // [row g / g + 8][first / second 64 bytes of the row's tile]
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int v = 0; v < 2; ++v) words[r][v] = lds128(st + W_OFF + (wrow + 8 * r) * W_ROW + 64 * v + 16 * c);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            u32 s8[2], a4[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const u32 p = lds32(st + P_OFF + 4 * (ROWS * half + wrow + 8 * r));
                s8[r] = p & 0xFFu;
                a4[r] = ((p >> 8) & 0xFFu) * 0x01010101u;
            }
#pragma unroll
            for (int b = 0; b < 4; ++b)
#pragma unroll
                for (int r = 0; r < 2; ++r)
#pragma unroll
                    for (int v = 0; v < 2; ++v) {
                        const u32 bytes = gather4(words[r][v], b);
                        q[b + 4 * half][r + 2 * v] =
                            (((half == 0 ? bytes : bytes >> 4) & 0x0F0F0F0Fu) * s8[r] + a4[r]) ^ 0x80808080u;
                    }
        }
    };
    // this warpgroup's products of the tile in ring slot i: its 64 rows' A registers × the shared codes
    auto issue_products = [&](int i, u32 (*cur)[4]) {
        const u32 st = smem0 + (i % STAGES) * STAGE;
        wgmma_fence();
#pragma unroll
        for (int p = 0; p < 8; ++p)
            wgmma_s8<BT>(acc, cur[p][0], cur[p][1], cur[p][2], cur[p][3],
                         smem_desc_sw128(st + (p >> 2) * BT * 128 + 32 * (p & 3)));
        wgmma_commit();
        fence_acc<BT / 2>(acc);
    };
    if (DEPTH == 1) {
        // the ring holds STAGES tiles: the prologue filled it, a stage is refilled once its products are done.
        // Tile t + 1 is dequantized while tile t's products run; the wait that follows names tile t's A registers
        // as operands, so the compiler keeps them intact until the tensor cores have read them
        u32 q[8][4], qn[8][4];
        if (t_begin < t_end) {
            cp_wait<STAGES - 1>();
            fence_async_shared();  // this thread's landed copies, visible to the tensor cores' (async proxy) reads
            __syncthreads();       // and everyone's
            dequant(smem0, q);
        }
        for (int t = t_begin; t < t_end; ++t) {
            const int i = t - t_begin;
            issue_products(i, q);
            if (t + 1 < t_end) {
                cp_wait<STAGES - 2>();  // tile t + 1's group
                fence_async_shared();
                __syncthreads();
                dequant(smem0 + ((i + 1) % STAGES) * STAGE, qn);
            }
            wgmma_wait_keep<0>(q);
            fence_acc<BT / 2>(acc);
            // tile t's stage is free (the warpgroup's products are complete): refill it with tile t + STAGES
            issue_w(t + STAGES, i % STAGES);
            issue_a(t + STAGES, i % STAGES);
            cp_commit();
            if (t + 1 < t_end) {
#pragma unroll
                for (int p = 0; p < 8; ++p)
#pragma unroll
                    for (int e = 0; e < 4; ++e) q[p][e] = qn[p][e];
            }
        }
    } else {
        // two tiles' products in flight: tile t's are issued before the wait for tile t − 1's, so the tensor cores
        // run on while the warpgroups refill t − 1's stage and dequantize tile t + 1. One barrier a tile: after it
        // every warpgroup's products of t − 1 are complete (its stage may be refilled) and every copy of t + 1 has
        // landed (it may be read). Tile j's copies are cp.async group j (the prologue's STAGES, then one a step
        // from the second tile), so at tile t's wait STAGES + t − t_begin − 1 groups exist and t + 1's is done when
        // at most STAGES − 3 are pending. The A registers of three tiles rotate (t in flight, t − 1 until its wait,
        // t + 1 being written), the loop unrolled by three so that each set is named statically, and each wait
        // names the set whose products it completes. The first tile is peeled off so that every step waits: a wait
        // skipped on some iteration would leave a path along which a set in flight is rewritten
        u32 qa[8][4], qb[8][4], qc[8][4];
        auto step = [&](int t, u32 (*cur)[4], u32 (*nxt)[4], u32 (*prv)[4]) {
            const int i = t - t_begin;
            issue_products(i, cur);
            wgmma_wait_keep<1>(prv);
            fence_acc<BT / 2>(acc);
            if (t + 1 < t_end) {
                cp_wait<STAGES - 3>();
                fence_async_shared();
                __syncthreads();
                issue_w(t - 1 + STAGES, (i - 1) % STAGES);
                issue_a(t - 1 + STAGES, (i - 1) % STAGES);
                cp_commit();  // empty past the last tile: the counts stay fixed
                dequant(smem0 + ((i + 1) % STAGES) * STAGE, nxt);
            }
        };
        if (t_begin < t_end) {
            cp_wait<STAGES - 1>();
            fence_async_shared();
            __syncthreads();
            dequant(smem0, qa);
            issue_products(0, qa);
            if (t_begin + 1 < t_end) {
                cp_wait<STAGES - 2>();
                fence_async_shared();
                __syncthreads();
                dequant(smem0 + STAGE, qb);
            }
        }
        for (int t = t_begin + 1; t < t_end; t += 3) {
            step(t, qb, qc, qa);
            if (t + 1 < t_end) step(t + 1, qc, qa, qb);
            if (t + 2 < t_end) step(t + 2, qa, qb, qc);
        }
        wgmma_wait_keep<0>(qa);  // the last tile's products (whichever set holds its A registers)
        keep_regs(qb);
        keep_regs(qc);
        fence_acc<BT / 2>(acc);
    }
    cp_wait<0>();
    __syncthreads();  // every warpgroup's products complete: the ring's start takes the partial tile
    int* part = reinterpret_cast<int*>(smem);
#pragma unroll
    for (int j = 0; j < BT / 8; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i)  // the wgmma D fragment: row g + 8(i >> 1), token 8j + 2c + (i & 1)
            part[(8 * j + 2 * c + (i & 1)) * PART + 64 * wg + 16 * warp + 8 * (i >> 1) + g] = acc[4 * j + i];
    cluster_add_store<S, BT, NTH, ROWS>(smem0, rank, row0, m0, M, N, sa, stride_sm, cs, out, stride_om);
}
