
// c += A (a0..a3, int8 16x32) · B (b0, b1, int8 32x8), int32 accumulators; ATY "s8" or "u8"
#define QK_IMMA(ATY)                                                                                          \
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32." ATY ".s8.s32 {%0, %1, %2, %3}, "                   \
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"                                             \
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])                                            \
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1))

__device__ __forceinline__ void imma_s8(int* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) { QK_IMMA("s8"); }
__device__ __forceinline__ void imma_u8(int* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) { QK_IMMA("u8"); }

// byte b of words x, y, z, w -> bytes 0..3 of one word
__device__ __forceinline__ u32 gather4(uint4 v, int b) {
    const u32 sel = (u32)(b | ((4 + b) << 4));
    return __byte_perm(__byte_perm(v.x, v.y, sel), __byte_perm(v.z, v.w, sel), 0x5410);
}
