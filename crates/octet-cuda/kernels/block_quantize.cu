// 1x128 block scaling (DeepSeek-V3's activations and gradients) of a bf16 (rows, cols) matrix,
// row-wise and column-wise copies in one pass (common.cuh is prepended by the host).
//
// Row-wise copy (rows, cols): one scale per 1x128 block along a row, scales (rows, ceil(cols/128)).
// Column-wise copy (cols, rows): one scale per 1x128 block along a row of the transpose, i.e. a
// 128x1 column segment of the input; scales (cols, ceil(rows/128)). Both row-major over the block
// grid, as octet_fp8::quantize lays out Scales::F32 for Granularity::Tile { rows: 1, cols: 128 }.
//
// Every block's amax is local to one 128x128 input tile, so each CTA reads its tile once and
// writes both copies: 2 B read + 2 x 1 B written per element, the minimum.
//
// CTA = 256 threads on a 128x128 tile:
//   phase A (row-wise): 16 threads per row, 8 elements (one 16-byte load) each; 8 rows-passes.
//     Row amax by shuffles within the 16 lanes; codes stored 8 bytes per thread; the raw bf16
//     tile goes to shared memory.
//   phase B (column-wise): thread = (column pair p, row quarter q); reads 32 rows x 2 columns
//     (4-byte words, conflict-free across the warp), column amax combined over the 4 quarters
//     in shared memory, then 2 x 32 codes written with 16-byte stores.

#define BT 128
#define BPITCH (BT + 8)  // bf16 elements per shared row: 16-byte aligned, shifts banks by 4 words
#define CPITCH (BT + 16) // bytes per staged code row (16-byte aligned); 128 x 144 B fits in the tile

// |x| max of the two bf16 halves of a word, as bf16 magnitude bits in each half: finite bf16
// magnitudes order like their bit patterns, so one SIMD unsigned max handles two elements.
__device__ __forceinline__ unsigned int abs2(unsigned int w) { return w & 0x7fff7fffu; }
// A bf16 magnitude (15 bits) that is inf or NaN.
__device__ __forceinline__ int nonfinite_mag(unsigned int m) { return m >= 0x7f80u; }

// Eight bf16 (four words) times `scale` -> 8 codes.
template <int FMT>
__device__ __forceinline__ uint2 cast8_words(unsigned int w0, unsigned int w1, unsigned int w2, unsigned int w3,
                                             float s) {
    const float f[8] = {bf16_lo(w0), bf16_hi(w0), bf16_lo(w1), bf16_hi(w1),
                        bf16_lo(w2), bf16_hi(w2), bf16_lo(w3), bf16_hi(w3)};
    return cast8<FMT>(f, s);
}

// STAGED: column-wise codes go through shared memory and leave as 128 contiguous bytes per output
// row (8 threads x 16 B, 4 output rows per warp store); otherwise each thread stores its two
// 32-byte column segments directly (32 output rows per warp store).
template <int FMT, bool STAGED>
__device__ __forceinline__ void block_cast_transpose(const unsigned short* __restrict__ x, int rows, int cols,
                                                     float fmax, int pow2,
                                                     unsigned char* __restrict__ out_row,
                                                     float* __restrict__ row_scale_inv,
                                                     unsigned char* __restrict__ out_col,
                                                     float* __restrict__ col_scale_inv,
                                                     unsigned int* __restrict__ nonfinite) {
    __shared__ __align__(16) unsigned short tile[BT * BPITCH];
    __shared__ unsigned int col_part[4][BT / 2];  // packed |x| maxima of column pairs, per row quarter
    const int r0 = blockIdx.y * BT, c0 = blockIdx.x * BT;
    const int rb = blockIdx.y, cb = blockIdx.x;
    const int nrb = (rows + BT - 1) / BT, ncb = (cols + BT - 1) / BT;
    const int t = threadIdx.x;
    unsigned int allmax = 0;  // packed; only for the non-finite flag

    // ---- phase A: row-wise ----
    const int sub = t & 15, grp = t >> 4;  // 16 groups of 16 threads; group = row within a pass
    const int c = c0 + sub * 8;
    const bool vec = (cols % 8 == 0) && (c + 8 <= cols);
    uint4 raw[8];
#pragma unroll
    for (int p = 0; p < 8; p++) {
        const int r = r0 + grp + 16 * p;
        if (r < rows && vec) {
            raw[p] = __ldg(reinterpret_cast<const uint4*>(x + (size_t)r * cols + c));
        } else {
            unsigned short e[8];
#pragma unroll
            for (int j = 0; j < 8; j++) e[j] = (r < rows && c + j < cols) ? x[(size_t)r * cols + c + j] : 0;
            raw[p] = make_uint4(e[0] | (e[1] << 16), e[2] | (e[3] << 16), e[4] | (e[5] << 16),
                                e[6] | ((unsigned int)e[7] << 16));
        }
    }
#pragma unroll
    for (int p = 0; p < 8; p++) {
        const int rr = grp + 16 * p, r = r0 + rr;
        const uint4 v = raw[p];
        unsigned int m2 = __vmaxu2(__vmaxu2(abs2(v.x), abs2(v.y)), __vmaxu2(abs2(v.z), abs2(v.w)));
        allmax = __vmaxu2(allmax, m2);
        unsigned int m = max(m2 & 0xffffu, m2 >> 16);
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
        const float s = scale_from_amax(__uint_as_float(m << 16), fmax, pow2);
        if (r < rows) {
            if (sub == 0) row_scale_inv[(size_t)r * ncb + cb] = __fdiv_rn(1.f, s);
            const uint2 q = cast8_words<FMT>(v.x, v.y, v.z, v.w, s);
            if (vec) {
                *reinterpret_cast<uint2*>(out_row + (size_t)r * cols + c) = q;
            } else {
                const unsigned char* b = reinterpret_cast<const unsigned char*>(&q);
#pragma unroll
                for (int j = 0; j < 8; j++)
                    if (c + j < cols) out_row[(size_t)r * cols + c + j] = b[j];
            }
        }
        *reinterpret_cast<uint4*>(&tile[rr * BPITCH + sub * 8]) = v;
    }
    __syncthreads();

    // ---- phase B: column-wise ----
    const int pr = t & 63, q4 = t >> 6;  // column pair, row quarter
    unsigned int w[32];                  // 32 rows x (column 2pr, column 2pr+1), packed bf16
    unsigned int m2 = 0;
#pragma unroll
    for (int i = 0; i < 32; i++) {
        w[i] = *reinterpret_cast<const unsigned int*>(&tile[(q4 * 32 + i) * BPITCH + 2 * pr]);
        m2 = __vmaxu2(m2, abs2(w[i]));
    }
    col_part[q4][pr] = m2;
    __syncthreads();
    m2 = __vmaxu2(__vmaxu2(col_part[0][pr], col_part[1][pr]), __vmaxu2(col_part[2][pr], col_part[3][pr]));
    const float sa = scale_from_amax(__uint_as_float(m2 << 16), fmax, pow2);
    const float sb = scale_from_amax(__uint_as_float(m2 & 0xffff0000u), fmax, pow2);
    const int ca = c0 + 2 * pr;
    const int rq = r0 + q4 * 32;
    const bool vec_t = (rows % 16 == 0) && (rq + 32 <= rows);
    // STAGED: [BT][CPITCH] codes over the bf16 tile, which is free: every thread read its words
    // before the barrier above.
    unsigned char* codes = reinterpret_cast<unsigned char*>(tile);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int cc = ca + h;
        if (cc >= cols) continue;
        const float s = h ? sb : sa;
        if (q4 == 0) col_scale_inv[(size_t)cc * nrb + rb] = __fdiv_rn(1.f, s);
        uint2 q[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            // Column h of rows 8k..8k+7: the low (h = 0) or high (h = 1) halves of 8 words.
            unsigned int e[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const unsigned int lo = w[8 * k + 2 * j], hi = w[8 * k + 2 * j + 1];
                e[j] = h ? __byte_perm(lo, hi, 0x7632) : __byte_perm(lo, hi, 0x5410);
            }
            q[k] = cast8_words<FMT>(e[0], e[1], e[2], e[3], s);
        }
        unsigned char* dst = STAGED ? codes + (2 * pr + h) * CPITCH + q4 * 32 : out_col + (size_t)cc * rows + rq;
        if (STAGED || vec_t) {
            reinterpret_cast<uint4*>(dst)[0] = make_uint4(q[0].x, q[0].y, q[1].x, q[1].y);
            reinterpret_cast<uint4*>(dst)[1] = make_uint4(q[2].x, q[2].y, q[3].x, q[3].y);
        } else {
            const unsigned char* bytes = reinterpret_cast<const unsigned char*>(q);
            for (int j = 0; j < 32; j++)
                if (rq + j < rows) dst[j] = bytes[j];
        }
    }
    if (STAGED) {
        __syncthreads();
        const int seg = t & 7;  // 16-byte segment of an output row
        const int r = r0 + seg * 16;
        const bool vec_o = (rows % 16 == 0) && (r + 16 <= rows);
#pragma unroll
        for (int pass = 0; pass < 4; pass++) {
            const int row = (t >> 3) + 32 * pass;  // output row within the tile = input column
            const int cc = c0 + row;
            if (cc >= cols) continue;
            const uint4 v = *reinterpret_cast<const uint4*>(codes + row * CPITCH + seg * 16);
            unsigned char* dst = out_col + (size_t)cc * rows + r;
            if (vec_o) {
                *reinterpret_cast<uint4*>(dst) = v;
            } else {
                const unsigned char* bytes = reinterpret_cast<const unsigned char*>(&v);
                for (int j = 0; j < 16; j++)
                    if (r + j < rows) dst[j] = bytes[j];
            }
        }
    }
    const int bad = nonfinite_mag(allmax & 0xffffu) | nonfinite_mag(allmax >> 16);
    if (__syncthreads_or(bad) && t == 0) atomicOr(nonfinite, 1u);
}

#define BLOCK_KERNEL(NAME, FMT, FMAX, STAGED)                                                               \
    extern "C" __global__ void __launch_bounds__(256, 4)                                                  \
        NAME(const unsigned short* __restrict__ x, int rows, int cols, int pow2,                          \
             unsigned char* __restrict__ out_row, float* __restrict__ row_scale_inv,                      \
             unsigned char* __restrict__ out_col, float* __restrict__ col_scale_inv,                      \
             unsigned int* __restrict__ nonfinite) {                                                      \
        block_cast_transpose<FMT, STAGED>(x, rows, cols, FMAX, pow2, out_row, row_scale_inv, out_col,     \
                                          col_scale_inv, nonfinite);                                      \
    }

BLOCK_KERNEL(block1x128_cast_transpose_bf16_e4m3, FMT_E4M3, 448.f, true)
BLOCK_KERNEL(block1x128_cast_transpose_bf16_e5m2, FMT_E5M2, 57344.f, true)
// The direct-store variant, kept for the A/B in the benchmark (docs/design.md).
BLOCK_KERNEL(block1x128_direct_cast_transpose_bf16_e4m3, FMT_E4M3, 448.f, false)
