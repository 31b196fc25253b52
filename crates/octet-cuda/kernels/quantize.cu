// Per-tensor current scaling of a bf16 (rows, cols) matrix to FP8, in two passes:
//   1. amax_bf16: |x| max over the tensor (and a flag for NaN/inf), 2 bytes read per element;
//   2. cast_transpose_bf16_<fmt>: the scale from that amax with the CPU reference's rule, then
//      row-wise FP8 (rows, cols) and column-wise FP8 (cols, rows) from one read of each 64x64 tile.
// Minimum traffic: 2 B read (amax) + 2 B read + 2 B written (cast) = 6 B per element.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#define TILE 64

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

extern "C" __global__ void amax_bf16(const __nv_bfloat16* __restrict__ x, unsigned long long n,
                                     unsigned int* __restrict__ amax_bits, unsigned int* __restrict__ nonfinite) {
    float m = 0.f;
    int bad = 0;
    unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long n8 = n / 8;
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    // Four independent 16-byte loads in flight per thread per step.
    unsigned long long i = tid;
    for (; i + 3 * stride < n8; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) v[u] = xv[i + u * stride];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&v[u]);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                float f = __bfloat162float(e[j]);
                bad |= !isfinite(f);
                m = fmaxf(m, fabsf(f));
            }
        }
    }
    for (; i < n8; i += stride) {
        uint4 v = xv[i];
        const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&v);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            float f = __bfloat162float(e[j]);
            bad |= !isfinite(f);
            m = fmaxf(m, fabsf(f));
        }
    }
    for (unsigned long long i = n8 * 8 + tid; i < n; i += stride) {
        float f = __bfloat162float(x[i]);
        bad |= !isfinite(f);
        m = fmaxf(m, fabsf(f));
    }
    __shared__ float smax[32];
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0) smax[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < (blockDim.x >> 5) ? smax[threadIdx.x] : 0.f;
        v = warp_max(v);
        // Non-negative floats order like their bit patterns.
        if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_uint(v));
    }
    if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(nonfinite, 1u);
}

// octet_fp8::scale::scale_from_amax with margin 0, no power-of-two rounding.
__device__ __forceinline__ float scale_from_amax(float amax, float fmax) {
    if (amax == 0.f) return 1.f;
    float s = __fdiv_rn(fmax, amax);
    return isfinite(s) ? s : 3.402823466e38f;
}

template <__nv_fp8_interpretation_t FMT>
__device__ __forceinline__ void cast_transpose(const __nv_bfloat16* __restrict__ x, int rows, int cols,
                                               const unsigned int* __restrict__ amax_bits, float fmax,
                                               unsigned char* __restrict__ out_row, unsigned char* __restrict__ out_col,
                                               float* __restrict__ scale_inv) {
    __shared__ unsigned char tile[TILE][TILE + 4];
    const float scale = scale_from_amax(__uint_as_float(*amax_bits), fmax);
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *scale_inv = __fdiv_rn(1.f, scale);
    const int r0 = blockIdx.y * TILE, c0 = blockIdx.x * TILE;
    const int chunk = threadIdx.x & 7;  // 8 chunks of 8 columns
    const bool full = (r0 + TILE <= rows) && (c0 + TILE <= cols) && (cols % 8 == 0);
    // Load, cast, write row-wise: each thread does 8 consecutive elements of 2 rows.
#pragma unroll
    for (int pass = 0; pass < TILE / 32; pass++) {
        const int rr = (threadIdx.x >> 3) + pass * 32;
        const int r = r0 + rr, c = c0 + chunk * 8;
        float f[8];
        if (full) {
            uint4 v = *reinterpret_cast<const uint4*>(x + (size_t)r * cols + c);
            const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&v);
#pragma unroll
            for (int j = 0; j < 8; j++) f[j] = __bfloat162float(e[j]);
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++)
                f[j] = (r < rows && c + j < cols) ? __bfloat162float(x[(size_t)r * cols + c + j]) : 0.f;
        }
        unsigned char q[8];
#pragma unroll
        for (int j = 0; j < 8; j += 2) {
            float2 p = make_float2(__fmul_rn(f[j], scale), __fmul_rn(f[j + 1], scale));
            __nv_fp8x2_storage_t s = __nv_cvt_float2_to_fp8x2(p, __NV_SATFINITE, FMT);
            q[j] = (unsigned char)(s & 0xff);
            q[j + 1] = (unsigned char)(s >> 8);
        }
        if (full) {
            *reinterpret_cast<uint2*>(out_row + (size_t)r * cols + c) = *reinterpret_cast<uint2*>(q);
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (r < rows && c + j < cols) out_row[(size_t)r * cols + c + j] = q[j];
        }
#pragma unroll
        for (int j = 0; j < 8; j++) tile[rr][chunk * 8 + j] = q[j];
    }
    __syncthreads();
    // Column-wise: output row = input column; 8 consecutive bytes along the input rows.
    const bool full_t = (r0 + TILE <= rows) && (c0 + TILE <= cols) && (rows % 8 == 0);
#pragma unroll
    for (int pass = 0; pass < TILE / 32; pass++) {
        const int cc = (threadIdx.x >> 3) + pass * 32;
        const int c = c0 + cc, r = r0 + chunk * 8;
        unsigned char q[8];
#pragma unroll
        for (int j = 0; j < 8; j++) q[j] = tile[chunk * 8 + j][cc];
        if (full_t) {
            *reinterpret_cast<uint2*>(out_col + (size_t)c * rows + r) = *reinterpret_cast<uint2*>(q);
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (c < cols && r + j < rows) out_col[(size_t)c * rows + r + j] = q[j];
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) cast_transpose_bf16_e4m3(
    const __nv_bfloat16* __restrict__ x, int rows, int cols, const unsigned int* __restrict__ amax_bits,
    unsigned char* __restrict__ out_row, unsigned char* __restrict__ out_col, float* __restrict__ scale_inv) {
    cast_transpose<__NV_E4M3>(x, rows, cols, amax_bits, 448.f, out_row, out_col, scale_inv);
}

extern "C" __global__ void __launch_bounds__(256) cast_transpose_bf16_e5m2(
    const __nv_bfloat16* __restrict__ x, int rows, int cols, const unsigned int* __restrict__ amax_bits,
    unsigned char* __restrict__ out_row, unsigned char* __restrict__ out_col, float* __restrict__ scale_inv) {
    cast_transpose<__NV_E5M2>(x, rows, cols, amax_bits, 57344.f, out_row, out_col, scale_inv);
}
