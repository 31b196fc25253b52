// Weight-only FP8 products: y (M, N) = x (M, K) @ W^T with x in bf16, W (N, K)
// stored as FP8 codes (E4M3 or E5M2) row-major, and f32 dequantization factors
// per tensor, per row, or per 128x128 tile. FP8 codes are upcast to bf16 in
// registers on their way to the tensor cores; the FP8 bytes are all that
// moves from memory for the weight.
//
// Small M (up to 64, in groups of 16 tokens): `mixed_small_m`. A block of 8
// warps owns 16 weight rows and 16 tokens;
// the warps split K into 128-column blocks (warp w takes blocks w, w+8, ...).
// Per 128-column block a thread loads 16 contiguous codes from each of its two
// rows (g and g+8, g = lane / 4) per 64 columns, and 16 contiguous bf16 of its
// token's x row; `mma.m16n8k16` multiplies 16 rows x 16 columns x 8 tokens.
// The order of K inside one mma is free (a sum), so thread t's four columns of
// logical k {2t, 2t+1, 2t+8, 2t+9} are taken as the physical columns
// 16t + 4s + {0, 1, 2, 3} of step s: contiguous 16-byte loads for W and x
// alike. Each 128-column block's partial sum enters the total with one FMA by
// its block factor (1 for tensor and row scales, which apply at the end). The
// 8 warps' totals are summed in warp order through shared memory.
//
// Requirements checked by the host: K % 16 == 0 (a thread's 16 columns are
// all inside or all outside K), 16-byte aligned rows.

#define SCALE_TENSOR 0
#define SCALE_ROW 1
#define SCALE_BLOCK 2

// Two FP8 codes (low byte first) -> two bf16 (low half first), exactly: FP8 ->
// f16x2 by the hardware conversion, f16 -> f32 exact, f32 -> bf16 exact for
// every FP8 value (E4M3 and E5M2 values fit bf16's exponent and mantissa).
template <int FMT>
__device__ __forceinline__ unsigned int fp8x2_to_bf16x2(unsigned int two) {
    unsigned short v = (unsigned short)two;
    unsigned int h;
    if (FMT == FMT_E4M3) {
        asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(v));
    } else {
        asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(h) : "h"(v));
    }
    float lo, hi;
    asm("{\n\t.reg .f16 l, u;\n\tmov.b32 {l, u}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, u;\n\t}"
        : "=f"(lo), "=f"(hi)
        : "r"(h));
    unsigned int r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ void mma_bf16(float c[4], unsigned int a0, unsigned int a1, unsigned int a2,
                                         unsigned int a3, unsigned int b0, unsigned int b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned int word(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Output element: f32 or bf16 bits (round to nearest even).
template <typename T> struct Out;
template <> struct Out<float> {
    static __device__ __forceinline__ float from(float v) { return v; }
};
template <> struct Out<unsigned short> {
    static __device__ __forceinline__ unsigned short from(float v) {
        unsigned short r;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(v));
        return r;
    }
};

// The factor applied after the sum over K: per tensor or per row (E4M3/E5M2
// codes are decoded exactly, so no format factor here).
__device__ __forceinline__ float post_factor(const float* factors, int mode, int row) {
    return mode == SCALE_TENSOR ? factors[0] : mode == SCALE_ROW ? factors[row] : 1.f;
}

// The loads of 128-column block `kb` for thread (g, t): 16 codes of rows ra
// and rb and 16 bf16 of token j*8+g per 64 columns; zeros outside K, N, M.
template <int NT>
__device__ __forceinline__ void load_block(const unsigned char* __restrict__ w,
                                           const unsigned short* __restrict__ x, int kb, int K, int M,
                                           int N, int ra, int rb, int t, int g, uint4 wa[2], uint4 wb[2],
                                           uint4 xv[NT][2][2]) {
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int k = kb * 128 + h * 64 + 16 * t;
        const bool in = k < K;
        wa[h] = (in && ra < N) ? __ldg(reinterpret_cast<const uint4*>(w + (size_t)ra * K + k)) : zero;
        wb[h] = (in && rb < N) ? __ldg(reinterpret_cast<const uint4*>(w + (size_t)rb * K + k)) : zero;
#pragma unroll
        for (int j = 0; j < NT; j++) {
            const int tok = j * 8 + g;
            const uint4* px = reinterpret_cast<const uint4*>(x + (size_t)tok * K + k);
            xv[j][h][0] = (in && tok < M) ? __ldg(px) : zero;
            xv[j][h][1] = (in && tok < M) ? __ldg(px + 1) : zero;
        }
    }
}

template <int FMT, int NT, typename OUT>
__device__ __forceinline__ void mixed_small_m(const unsigned char* __restrict__ w,
                                              const unsigned short* __restrict__ x,
                                              const float* __restrict__ factors, OUT* __restrict__ y,
                                              int M, int N, int K, int mode) {
    __shared__ float red[8][NT * 4][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    // blockIdx.x: group of 16 tokens (consecutive blocks share a row tile, so
    // a tile's codes are read from DRAM once and from L2 by the other groups);
    // blockIdx.y: tile of 16 weight rows.
    const int row0 = blockIdx.y * 16;
    const int tok0 = blockIdx.x * 16;
    x += (size_t)tok0 * K;
    y += (size_t)tok0 * N;
    M = min(M - tok0, 16);
    const int ra = row0 + g, rb = row0 + g + 8;
    const int kblocks = (K + 127) / 128;
    float tot[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) tot[j][i] = 0.f;

    // Software pipeline: the loads of the warp's next 128-column block are in
    // flight while the current one is converted and multiplied.
    uint4 wa[2], wb[2], xv[NT][2][2];
    load_block<NT>(w, x, warp, K, M, N, ra, rb, t, g, wa, wb, xv);
    for (int kb = warp; kb < kblocks; kb += 8) {
        uint4 nwa[2], nwb[2], nxv[NT][2][2];
        load_block<NT>(w, x, kb + 8, K, M, N, ra, rb, t, g, nwa, nwb, nxv);
        float acc[NT][4];
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[j][i] = 0.f;
#pragma unroll
        for (int h = 0; h < 2; h++) {
#pragma unroll
            for (int s = 0; s < 4; s++) {
                const unsigned int ua = word(wa[h], s), ub = word(wb[h], s);
                const unsigned int a0 = fp8x2_to_bf16x2<FMT>(ua & 0xffffu);  // row g, cols 4s+0,1
                const unsigned int a1 = fp8x2_to_bf16x2<FMT>(ub & 0xffffu);  // row g+8
                const unsigned int a2 = fp8x2_to_bf16x2<FMT>(ua >> 16);      // row g, cols 4s+2,3
                const unsigned int a3 = fp8x2_to_bf16x2<FMT>(ub >> 16);      // row g+8
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    const uint4& xs = xv[j][h][s >> 1];
                    const unsigned int b0 = word(xs, (s & 1) * 2);      // x cols 4s+0,1
                    const unsigned int b1 = word(xs, (s & 1) * 2 + 1);  // x cols 4s+2,3
                    mma_bf16(acc[j], a0, a1, a2, a3, b0, b1);
                }
            }
        }
        const float f = mode == SCALE_BLOCK ? factors[(row0 / 128) * kblocks + kb] : 1.f;
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) tot[j][i] = fmaf(acc[j][i], f, tot[j][i]);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            wa[h] = nwa[h];
            wb[h] = nwb[h];
#pragma unroll
            for (int j = 0; j < NT; j++) {
                xv[j][h][0] = nxv[j][h][0];
                xv[j][h][1] = nxv[j][h][1];
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) red[warp][j * 4 + i][lane] = tot[j][i];
    __syncthreads();
    // One thread per (fragment slot, lane): sum the 8 warps in order, scale, store.
    if (threadIdx.x < NT * 4 * 32) {
        const int idx = threadIdx.x >> 5, l = threadIdx.x & 31;
        float v = 0.f;
#pragma unroll
        for (int q = 0; q < 8; q++) v += red[q][idx][l];
        const int j = idx >> 2, i = idx & 3;
        const int row = row0 + (l >> 2) + (i >= 2 ? 8 : 0);
        const int tok = j * 8 + 2 * (l & 3) + (i & 1);
        if (row < N && tok < M) y[(size_t)tok * N + row] = Out<OUT>::from(v * post_factor(factors, mode, row));
    }
}

#define MIXED_SMALL(NAME, FMT, NT, OUT)                                                                   \
    extern "C" __global__ void __launch_bounds__(256) NAME(const unsigned char* w, const unsigned short* x, \
                                                           const float* factors, OUT* y, int M, int N,  \
                                                           int K, int mode) {                           \
        mixed_small_m<FMT, NT, OUT>(w, x, factors, y, M, N, K, mode);                                    \
    }
MIXED_SMALL(mixed_e4m3_n8_f32, FMT_E4M3, 1, float)
MIXED_SMALL(mixed_e4m3_n16_f32, FMT_E4M3, 2, float)
MIXED_SMALL(mixed_e5m2_n8_f32, FMT_E5M2, 1, float)
MIXED_SMALL(mixed_e5m2_n16_f32, FMT_E5M2, 2, float)
MIXED_SMALL(mixed_e4m3_n8_bf16, FMT_E4M3, 1, unsigned short)
MIXED_SMALL(mixed_e4m3_n16_bf16, FMT_E4M3, 2, unsigned short)
MIXED_SMALL(mixed_e5m2_n8_bf16, FMT_E5M2, 1, unsigned short)
MIXED_SMALL(mixed_e5m2_n16_bf16, FMT_E5M2, 2, unsigned short)

// Large M: upcast W to bf16 (exact; block factors applied here, rounding the
// product to bf16) for a cuBLAS bf16 GEMM, then `mixed_epilogue` applies the
// tensor or row factor to the f32 GEMM output. One thread per 16 codes.
template <int FMT>
__device__ __forceinline__ void upcast(const unsigned char* __restrict__ w, const float* __restrict__ factors,
                                       unsigned short* __restrict__ out, int N, int K, int mode) {
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 16;
    if (i >= (size_t)N * K) return;
    const int row = (int)(i / K), col = (int)(i % K);
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(w + i));
    unsigned int o[8];
#pragma unroll
    for (int q = 0; q < 4; q++) {
        o[2 * q] = fp8x2_to_bf16x2<FMT>(word(v, q) & 0xffffu);
        o[2 * q + 1] = fp8x2_to_bf16x2<FMT>(word(v, q) >> 16);
    }
    if (mode == SCALE_BLOCK) {
        const float f = factors[(row / 128) * ((K + 127) / 128) + col / 128];
#pragma unroll
        for (int q = 0; q < 8; q++) {
            const float lo = bf16_lo(o[q]) * f, hi = bf16_hi(o[q]) * f;
            asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(o[q]) : "f"(hi), "f"(lo));
        }
    }
    uint4* dst = reinterpret_cast<uint4*>(out + i);
    dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
}
extern "C" __global__ void upcast_e4m3(const unsigned char* w, const float* factors, unsigned short* out,
                                       int N, int K, int mode) {
    upcast<FMT_E4M3>(w, factors, out, N, K, mode);
}
extern "C" __global__ void upcast_e5m2(const unsigned char* w, const float* factors, unsigned short* out,
                                       int N, int K, int mode) {
    upcast<FMT_E5M2>(w, factors, out, N, K, mode);
}

template <typename OUT>
__device__ __forceinline__ void epilogue(const float* __restrict__ acc, const float* __restrict__ factors,
                                         OUT* __restrict__ y, int M, int N, int mode) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)M * N) return;
    y[i] = Out<OUT>::from(acc[i] * post_factor(factors, mode, (int)(i % N)));
}
extern "C" __global__ void mixed_epilogue_f32(const float* acc, const float* factors, float* y, int M, int N,
                                              int mode) {
    epilogue<float>(acc, factors, y, M, N, mode);
}
extern "C" __global__ void mixed_epilogue_bf16(const float* acc, const float* factors, unsigned short* y,
                                               int M, int N, int mode) {
    epilogue<unsigned short>(acc, factors, y, M, N, mode);
}
