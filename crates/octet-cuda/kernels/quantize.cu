// Per-tensor current scaling of a (rows, cols) bf16 or f32 matrix to FP8, in two passes
// (common.cuh is prepended by the host):
//   1. amax_<in>: |x| max over the tensor (and a flag for NaN/inf): one read;
//   2. cast_transpose_<in>_<fmt>: the scale from that amax with the CPU reference's rule, then
//      row-wise FP8 (rows, cols) and column-wise FP8 (cols, rows) from one read of each 64x64
//      tile, the transpose going through shared memory.
// Traffic for bf16: 2 B (amax) + 2 B (cast) read, 2 x 1 B written = 6 B per element. The global
// amax must be known before the first element is cast, and a 16384x8192 bf16 tensor (256 MiB)
// does not fit on chip (50 MB L2), so the second read cannot be avoided in general.
//
// `reverse` walks the tiles last-to-first: the amax pass ends on the tail of the tensor, which
// may still sit in L2 when the cast starts there.

#define TILE 64

template <typename T>
__device__ __forceinline__ void amax_body(const T* __restrict__ x, unsigned long long n,
                                          unsigned int* __restrict__ amax_bits,
                                          unsigned int* __restrict__ nonfinite) {
    float m = 0.f;
    int bad = 0;
    const unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    const unsigned long long n8 = n / 8;
    unsigned long long i = tid;
    // Four independent 8-element vectors in flight per thread per step.
    for (; i + 3 * stride < n8; i += 4 * stride) {
        float f[4][8];
#pragma unroll
        for (int u = 0; u < 4; u++) In<T>::load8(x + 8 * (i + u * stride), f[u]);
#pragma unroll
        for (int u = 0; u < 4; u++)
#pragma unroll
            for (int j = 0; j < 8; j++) {
                bad |= nonfinite_f32(f[u][j]);
                m = fmaxf(m, fabsf(f[u][j]));
            }
    }
    for (; i < n8; i += stride) {
        float f[8];
        In<T>::load8(x + 8 * i, f);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            bad |= nonfinite_f32(f[j]);
            m = fmaxf(m, fabsf(f[j]));
        }
    }
    for (unsigned long long k = n8 * 8 + tid; k < n; k += stride) {
        float f = In<T>::load1(x + k);
        bad |= nonfinite_f32(f);
        m = fmaxf(m, fabsf(f));
    }
    __shared__ float smax[32];
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0) smax[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < (blockDim.x >> 5) ? smax[threadIdx.x] : 0.f;
        v = warp_max(v);
        // Non-negative floats order like their bit patterns (NaN never gets here: fmaxf drops it).
        if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_uint(v));
    }
    if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(nonfinite, 1u);
}

extern "C" __global__ void __launch_bounds__(256) amax_bf16(const unsigned short* __restrict__ x, unsigned long long n,
                                                            unsigned int* __restrict__ amax_bits,
                                                            unsigned int* __restrict__ nonfinite) {
    amax_body<unsigned short>(x, n, amax_bits, nonfinite);
}

extern "C" __global__ void __launch_bounds__(256) amax_f32(const float* __restrict__ x, unsigned long long n,
                                                           unsigned int* __restrict__ amax_bits,
                                                           unsigned int* __restrict__ nonfinite) {
    amax_body<float>(x, n, amax_bits, nonfinite);
}

// GIVEN = false: current scaling, the scale comes from the amax pass (`amax_bits` is read).
// GIVEN = true: delayed scaling, the scale is given (`scale_in`, from the amax history) and
// this one pass records the tensor's amax into `amax_bits` (and NaN/inf into `nonfinite`) for
// the next history update: 2 B read + 2 B written per bf16 element, the true minimum.
template <typename T, int FMT, bool GIVEN>
__device__ __forceinline__ void cast_transpose(const T* __restrict__ x, int rows, int cols,
                                               unsigned int* __restrict__ amax_bits,
                                               const float* __restrict__ scale_in,
                                               unsigned int* __restrict__ nonfinite, float fmax,
                                               unsigned char* __restrict__ out_row,
                                               unsigned char* __restrict__ out_col,
                                               float* __restrict__ scale_inv, int reverse) {
    // Codes of one 64x64 tile; rows padded by 4 bytes against bank conflicts in the transpose.
    __shared__ __align__(16) unsigned char tile[TILE][TILE + 4];
    __shared__ float smax[8];
    const float scale = GIVEN ? *scale_in : scale_from_amax(__uint_as_float(*amax_bits), fmax, 0);
    const int bx = reverse ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
    const int by = reverse ? gridDim.y - 1 - blockIdx.y : blockIdx.y;
    if (bx == 0 && by == 0 && threadIdx.x == 0) *scale_inv = __fdiv_rn(1.f, scale);
    const int r0 = by * TILE, c0 = bx * TILE;
    const int chunk = threadIdx.x & 7;  // 8 chunks of 8 columns
    const bool full = (r0 + TILE <= rows) && (c0 + TILE <= cols) && (cols % 8 == 0);
    // Load both row passes first (two independent 16-byte loads per thread for bf16).
    float f[TILE / 32][8];
#pragma unroll
    for (int pass = 0; pass < TILE / 32; pass++) {
        const int r = r0 + (threadIdx.x >> 3) + pass * 32, c = c0 + chunk * 8;
        if (full) {
            In<T>::load8(x + (size_t)r * cols + c, f[pass]);
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++)
                f[pass][j] = (r < rows && c + j < cols) ? In<T>::load1(x + (size_t)r * cols + c + j) : 0.f;
        }
    }
    if (GIVEN) {
        // This tile's amax (out-of-range elements were loaded as 0) and NaN/inf flag.
        float m = 0.f;
        int bad = 0;
#pragma unroll
        for (int pass = 0; pass < TILE / 32; pass++)
#pragma unroll
            for (int j = 0; j < 8; j++) {
                bad |= nonfinite_f32(f[pass][j]);
                m = fmaxf(m, fabsf(f[pass][j]));
            }
        m = warp_max(m);
        if ((threadIdx.x & 31) == 0) smax[threadIdx.x >> 5] = m;
        if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(nonfinite, 1u);
        if (threadIdx.x < 32) {
            float v = warp_max(threadIdx.x < 8 ? smax[threadIdx.x] : 0.f);
            if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_uint(v));
        }
    }
#pragma unroll
    for (int pass = 0; pass < TILE / 32; pass++) {
        const int rr = (threadIdx.x >> 3) + pass * 32;
        const int r = r0 + rr, c = c0 + chunk * 8;
        uint2 q = cast8<FMT>(f[pass], scale);
        if (full) {
            *reinterpret_cast<uint2*>(out_row + (size_t)r * cols + c) = q;
        } else {
            const unsigned char* b = reinterpret_cast<const unsigned char*>(&q);
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (r < rows && c + j < cols) out_row[(size_t)r * cols + c + j] = b[j];
        }
        *reinterpret_cast<unsigned int*>(&tile[rr][chunk * 8]) = q.x;
        *reinterpret_cast<unsigned int*>(&tile[rr][chunk * 8 + 4]) = q.y;
    }
    // Row-wise only (a null column-wise output, the same for every thread).
    if (out_col == nullptr) return;
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
            uint2 v;
            v.x = q[0] | (q[1] << 8) | (q[2] << 16) | ((unsigned int)q[3] << 24);
            v.y = q[4] | (q[5] << 8) | (q[6] << 16) | ((unsigned int)q[7] << 24);
            *reinterpret_cast<uint2*>(out_col + (size_t)c * rows + r) = v;
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (c < cols && r + j < rows) out_col[(size_t)c * rows + r + j] = q[j];
        }
    }
}

#define CAST_KERNEL(NAME, T, FMT, FMAX)                                                                   \
    extern "C" __global__ void __launch_bounds__(256)                                                   \
        NAME(const T* __restrict__ x, int rows, int cols, const unsigned int* __restrict__ amax_bits,   \
             unsigned char* __restrict__ out_row, unsigned char* __restrict__ out_col,                  \
             float* __restrict__ scale_inv, int reverse) {                                              \
        cast_transpose<T, FMT, false>(x, rows, cols, const_cast<unsigned int*>(amax_bits), nullptr,     \
                                      nullptr, FMAX, out_row, out_col, scale_inv, reverse);             \
    }

#define CAST_GIVEN_KERNEL(NAME, FMT, FMAX)                                                                \
    extern "C" __global__ void __launch_bounds__(256)                                                   \
        NAME(const unsigned short* __restrict__ x, int rows, int cols, unsigned int* __restrict__ amax_bits, \
             const float* __restrict__ scale_in, unsigned int* __restrict__ nonfinite,                   \
             unsigned char* __restrict__ out_row, unsigned char* __restrict__ out_col,                  \
             float* __restrict__ scale_inv, int reverse) {                                              \
        cast_transpose<unsigned short, FMT, true>(x, rows, cols, amax_bits, scale_in, nonfinite, FMAX,  \
                                                  out_row, out_col, scale_inv, reverse);                \
    }

CAST_GIVEN_KERNEL(cast_transpose_given_bf16_e4m3, FMT_E4M3, 448.f)
CAST_GIVEN_KERNEL(cast_transpose_given_bf16_e5m2, FMT_E5M2, 57344.f)

CAST_KERNEL(cast_transpose_bf16_e4m3, unsigned short, FMT_E4M3, 448.f)
CAST_KERNEL(cast_transpose_bf16_e5m2, unsigned short, FMT_E5M2, 57344.f)
CAST_KERNEL(cast_transpose_f32_e4m3, float, FMT_E4M3, 448.f)
CAST_KERNEL(cast_transpose_f32_e5m2, float, FMT_E5M2, 57344.f)

// A thread's telemetry counts summed over its warp, then added to `out`
// (amax bits by atomicMax; the counts only when `counts`).
__device__ __forceinline__ void telemetry_commit(unsigned int amax, unsigned int sat, unsigned int under,
                                                 bool counts, unsigned int* out) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const unsigned int a = __shfl_xor_sync(0xffffffffu, amax, o);
        amax = a > amax ? a : amax;
        sat += __shfl_xor_sync(0xffffffffu, sat, o);
        under += __shfl_xor_sync(0xffffffffu, under, o);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicMax(out, amax);
        if (counts) {
            atomicAdd(out + 1, sat);
            atomicAdd(out + 2, under);
        }
    }
}

// Numerics telemetry of one per-tensor FP8 quantization of bf16 `x`, as
// octet_fp8's quantizer counts it: out[0] = amax bits (atomicMax), out[1] =
// values a plain (non-saturating) cast would overflow, |x * scale| > sat_at
// (or >= with sat_inclusive: where the tie rounds away from max), out[2] =
// non-zero values flushed to zero, |x * scale| <= flush_at (half the smallest
// subnormal; the tie rounds to even, i.e. to zero). The scale is `*scale_ptr`
// (delayed scaling), else derived from `*amax_bits` exactly as the cast
// kernels derive it (current scaling); with neither only out[0] is written.
extern "C" __global__ void __launch_bounds__(256) fp8_telemetry(const unsigned short* __restrict__ x,
                                                                unsigned long long n, const float* scale_ptr,
                                                                const unsigned int* amax_bits, float fmax,
                                                                float sat_at, int sat_inclusive, float flush_at,
                                                                unsigned int* out) {
    const bool have = scale_ptr != 0 || amax_bits != 0;
    const float scale =
        scale_ptr ? *scale_ptr : (amax_bits ? scale_from_amax(__uint_as_float(*amax_bits), fmax, 0) : 0.f);
    unsigned int amax = 0, sat = 0, under = 0;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const float v = In<unsigned short>::load1(x + i);
        const unsigned int bits = __float_as_uint(v) & 0x7fffffffu;
        amax = bits > amax ? bits : amax;
        if (have) {
            const float s = fabsf(__fmul_rn(v, scale));
            sat += sat_inclusive ? (s >= sat_at) : (s > sat_at);
            under += (v != 0.f && s <= flush_at);
        }
    }
    telemetry_commit(amax, sat, under, have, out);
}

// Numerics telemetry of a quantization with per-row or per-block scales, from
// bf16 `x (rows, cols)` and its row-wise codes, as octet_fp8's quantizer counts
// it: out[0] = amax bits, out[1] = values a plain cast would overflow, out[2]
// = non-zero values stored as zero (code magnitude 0). By `mode`:
// 0: FP8 codes whose scale comes from each row's or block's own amax
//    (rowwise, 1x128, 128x128): |x * scale| <= max by construction, none overflow;
// 1: MXFP8 codes with one E8M0 scale code per 1x32 (`scales`, (rows,
//    ceil(cols/32)) row-major): multiplier 2^(127 - code), overflow past sat_at
//    (inclusive with sat_inclusive) as in fp8_telemetry (octet's MX exponent
//    never lets a value overflow, except where it is clamped at 2^-127 / 2^127);
// 2: NVFP4 E2M1 codes packed two per byte (low nibble first), one E4M3 scale
//    code per br x 16 block (`scales`, row-major over the block grid):
//    multiplier global / decode(code) (0 where it decodes to 0), overflow at 7
//    (the midpoint from 6 to the next binade rounds up).

extern "C" __global__ void __launch_bounds__(256)
    block_telemetry(const unsigned short* __restrict__ x, const unsigned char* __restrict__ codes, int rows,
                    int cols, int mode, const unsigned char* __restrict__ scales, int br,
                    const float* __restrict__ global, float sat_at, int sat_inclusive, unsigned int* out) {
    const unsigned long long n = (unsigned long long)rows * cols;
    const int gc32 = (cols + 31) / 32, gc16 = (cols + 15) / 16, packed = (cols + 1) / 2;
    const float g = mode == 2 ? *global : 0.f;
    unsigned int amax = 0, sat = 0, under = 0;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const int r = (int)(i / cols), c = (int)(i % cols);
        const float v = In<unsigned short>::load1(x + i);
        const unsigned int bits = __float_as_uint(v) & 0x7fffffffu;
        amax = bits > amax ? bits : amax;
        unsigned int mag;
        if (mode == 2) {
            const unsigned int byte = codes[(size_t)r * packed + c / 2];
            mag = ((c & 1) ? (byte >> 4) : byte) & 7u;
            const float d = e4m3_decode(scales[(size_t)(r / br) * gc16 + c / 16]);
            const float mul = d == 0.f ? 0.f : __fdiv_rn(g, d);
            sat += fabsf(__fmul_rn(v, mul)) >= 7.f;
        } else {
            mag = codes[i] & 0x7fu;
            if (mode == 1) {
                const float mul = ldexpf(1.f, 127 - (int)scales[(size_t)r * gc32 + c / 32]);
                const float s = fabsf(__fmul_rn(v, mul));
                sat += sat_inclusive ? (s >= sat_at) : (s > sat_at);
            }
        }
        under += (v != 0.f && mag == 0u);
    }
    telemetry_commit(amax, sat, under, true, out);
}
