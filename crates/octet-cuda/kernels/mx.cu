// MXFP8 (OCP microscaling): one E8M0 scale per 32 consecutive elements along
// each copy's rows: the row-wise copy (rows, cols) has 1x32 blocks, the
// column-wise copy (cols, rows) 1x32 blocks of the transpose (32x1 of the
// input). Bit-exact with octet_fp8::quantize for ScaleRule::E8M0: the block's
// exponent e = mx_exponent(amax) (rounded up so no element saturates), the
// multiplier 2^-e, the stored code e + 127. One CTA per 64x64 input tile.
// Also `mx_dequant_bf16`: codes times 2^(code - 127) to bf16, exact, for the
// emulated GEMM (Hopper has no MX tensor-core path: sm_100 does).

#define MT 64

// The E8M0 exponent of a block amax for a format whose max is fmax (see
// octet_fp8::scale::mx_exponent): on the bits, no division.
__device__ __forceinline__ int mx_exponent(float amax, float fmax) {
    if (amax == 0.f) return -127;
    unsigned int b = __float_as_uint(amax);
    int ea = (int)(b >> 23);
    unsigned int ma;
    if (ea == 0) {
        unsigned int m = b & 0x7fffffu;
        int shift = __clz(m) - 8;
        ma = m << shift;
        ea = -126 - shift;
    } else {
        ma = (b & 0x7fffffu) | 0x800000u;
        ea -= 127;
    }
    const unsigned int fb = __float_as_uint(fmax);
    const unsigned int mf = (fb & 0x7fffffu) | 0x800000u;
    const int ef = (int)(fb >> 23) - 127;
    int e = ma <= mf ? ea - ef : ea - ef + 1;
    return max(-127, min(127, e));
}

// 2^k exactly for k in [-149, 127].
__device__ __forceinline__ float pow2i(int k) {
    k = max(-149, min(127, k));
    return k >= -126 ? __uint_as_float((unsigned int)(k + 127) << 23) : __uint_as_float(1u << (k + 149));
}

template <int FMT>
__device__ __forceinline__ void mx_quant(const unsigned short* __restrict__ x, int rows, int cols, float fmax,
                                         unsigned char* __restrict__ out_row, unsigned char* __restrict__ out_col,
                                         unsigned char* __restrict__ row_scales, unsigned char* __restrict__ col_scales,
                                         unsigned int* __restrict__ nonfinite) {
    __shared__ float cm[2][32][MT + 1];
    __shared__ float cmul[2][MT];
    __shared__ __align__(16) unsigned char tile[MT][MT + 4];
    const int r0 = blockIdx.y * MT, c0 = blockIdx.x * MT;
    const int chunk = threadIdx.x & 7, rr = threadIdx.x >> 3;
    const int rblocks = (cols + 31) / 32, cblocks = (rows + 31) / 32;
    float f[2][8];
    int bad = 0;
#pragma unroll
    for (int pass = 0; pass < 2; pass++) {
        const int r = r0 + rr + pass * 32, c = c0 + chunk * 8;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            f[pass][j] = (r < rows && c + j < cols) ? bf16_lo(x[(size_t)r * cols + c + j]) : 0.f;
            bad |= nonfinite_f32(f[pass][j]);
        }
    }
    // Row-wise: a 1x32 block is 4 consecutive chunks (lanes differing in bits 0-1).
#pragma unroll
    for (int pass = 0; pass < 2; pass++) {
        float m = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) m = fmaxf(m, fabsf(f[pass][j]));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        const int e = mx_exponent(m, fmax);
        const float mul = pow2i(-e);
        const int r = r0 + rr + pass * 32, c = c0 + chunk * 8;
        if ((chunk & 3) == 0 && r < rows && c < cols) row_scales[(size_t)r * rblocks + c / 32] = (unsigned char)(e + 127);
        const uint2 q = cast8<FMT>(f[pass], mul);
        const unsigned char* b = reinterpret_cast<const unsigned char*>(&q);
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (r < rows && c + j < cols) out_row[(size_t)r * cols + c + j] = b[j];
#pragma unroll
        for (int j = 0; j < 8; j++) cm[pass][rr][chunk * 8 + j] = fabsf(f[pass][j]);
    }
    __syncthreads();
    // Column-wise: a block is 32 rows (one pass) of one column.
    if (threadIdx.x < 2 * MT) {
        const int pass = threadIdx.x / MT, col = threadIdx.x % MT;
        float m = 0.f;
        for (int q = 0; q < 32; q++) m = fmaxf(m, cm[pass][q][col]);
        const int e = mx_exponent(m, fmax);
        cmul[pass][col] = pow2i(-e);
        const int c = c0 + col, rb = (r0 + pass * 32) / 32;
        if (c < cols && r0 + pass * 32 < rows) col_scales[(size_t)c * cblocks + rb] = (unsigned char)(e + 127);
    }
    __syncthreads();
#pragma unroll
    for (int pass = 0; pass < 2; pass++) {
        const int lr = rr + pass * 32;
#pragma unroll
        for (int j = 0; j < 8; j += 2) {
            const int cc = chunk * 8 + j;
            const unsigned int two = cvt_fp8x2<FMT>(__fmul_rn(f[pass][j], cmul[pass][cc]),
                                                    __fmul_rn(f[pass][j + 1], cmul[pass][cc + 1]));
            tile[lr][cc] = (unsigned char)(two & 0xff);
            tile[lr][cc + 1] = (unsigned char)(two >> 8);
        }
    }
    __syncthreads();
    // Column-wise codes out: thread = (input column, 8-row group).
#pragma unroll
    for (int pass = 0; pass < 2; pass++) {
        const int oc = (threadIdx.x >> 3) + pass * 32, rb = chunk * 8;
        const int c = c0 + oc;
        if (c >= cols) continue;
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (r0 + rb + j < rows) out_col[(size_t)c * rows + r0 + rb + j] = tile[rb + j][oc];
    }
    if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(nonfinite, 1u);
}

extern "C" __global__ void __launch_bounds__(256)
    mx_quant_bf16_e4m3(const unsigned short* x, int rows, int cols, float fmax, unsigned char* out_row,
                       unsigned char* out_col, unsigned char* rs, unsigned char* cs, unsigned int* nf) {
    mx_quant<FMT_E4M3>(x, rows, cols, fmax, out_row, out_col, rs, cs, nf);
}
extern "C" __global__ void __launch_bounds__(256)
    mx_quant_bf16_e5m2(const unsigned short* x, int rows, int cols, float fmax, unsigned char* out_row,
                       unsigned char* out_col, unsigned char* rs, unsigned char* cs, unsigned int* nf) {
    mx_quant<FMT_E5M2>(x, rows, cols, fmax, out_row, out_col, rs, cs, nf);
}

// bf16 (rows, cols) = codes * 2^(scale - 127), 1x32 blocks along each row: exact.
template <int FMT>
__device__ __forceinline__ void mx_dequant(const unsigned char* __restrict__ codes, const unsigned char* __restrict__ scales,
                                           unsigned short* __restrict__ out, int rows, int cols) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * cols) return;
    const int r = (int)(i / cols), c = (int)(i % cols);
    const float s = pow2i((int)scales[(size_t)r * ((cols + 31) / 32) + c / 32] - 127);
    const float v = fp8_decode<FMT>(codes[i]);
    unsigned short o;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(o) : "f"(__fmul_rn(v, s)));
    out[i] = o;
}
extern "C" __global__ void mx_dequant_e4m3(const unsigned char* c, const unsigned char* s, unsigned short* o, int rows, int cols) {
    mx_dequant<FMT_E4M3>(c, s, o, rows, cols);
}
extern "C" __global__ void mx_dequant_e5m2(const unsigned char* c, const unsigned char* s, unsigned short* o, int rows, int cols) {
    mx_dequant<FMT_E5M2>(c, s, o, rows, cols);
}
