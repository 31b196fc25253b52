// 128x128 block scaling (DeepSeek-V3's weights) of a bf16 (rows, cols) matrix:
// one scale per 128x128 tile, shared by the row-wise copy (rows, cols) and the
// column-wise copy (cols, rows), whose tile grid is the transpose; scales
// row-major over each copy's grid, as octet_fp8::quantize lays them out for
// Granularity::Tile { rows: 128, cols: 128 }. One CTA per tile: read it once,
// reduce its amax, write both copies (2 B read + 2 x 1 B written per element).
// Also `transpose_f32`, which turns a 1x128 scale grid (rows, kblocks) into the
// (kblocks, rows) layout cuBLASLt's VEC128 scale mode reads.

#define T2 128

template <int FMT>
__device__ __forceinline__ void block2d(const unsigned short* __restrict__ x, int rows, int cols, float fmax,
                                        unsigned char* __restrict__ out_row, unsigned char* __restrict__ out_col,
                                        float* __restrict__ row_scale_inv, float* __restrict__ col_scale_inv,
                                        unsigned int* __restrict__ nonfinite) {
    __shared__ __align__(16) unsigned char codes[T2][T2 + 4];
    __shared__ float red[8];
    const int r0 = blockIdx.y * T2, c0 = blockIdx.x * T2;
    const int chunk = threadIdx.x & 15, rr = threadIdx.x >> 4;  // 16 threads x 8 columns per row, 16 rows per pass
    float f[8][8];
    float m = 0.f;
    int bad = 0;
#pragma unroll
    for (int pass = 0; pass < 8; pass++) {
        const int r = r0 + rr + pass * 16, c = c0 + chunk * 8;
        if (r < rows && c + 8 <= cols && cols % 8 == 0) {
            In<unsigned short>::load8(x + (size_t)r * cols + c, f[pass]);
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++)
                f[pass][j] = (r < rows && c + j < cols) ? bf16_lo(x[(size_t)r * cols + c + j]) : 0.f;
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            bad |= nonfinite_f32(f[pass][j]);
            m = fmaxf(m, fabsf(f[pass][j]));
        }
    }
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    float amax = 0.f;
#pragma unroll
    for (int w = 0; w < 8; w++) amax = fmaxf(amax, red[w]);
    const float s = scale_from_amax(amax, fmax, 0);
    if (threadIdx.x == 0) {
        const float inv = __fdiv_rn(1.f, s);
        row_scale_inv[blockIdx.y * gridDim.x + blockIdx.x] = inv;
        col_scale_inv[blockIdx.x * gridDim.y + blockIdx.y] = inv;
    }
    if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(nonfinite, 1u);
#pragma unroll
    for (int pass = 0; pass < 8; pass++) {
        const int lr = rr + pass * 16, r = r0 + lr, c = c0 + chunk * 8;
        const uint2 q = cast8<FMT>(f[pass], s);
        if (r < rows && c + 8 <= cols && cols % 8 == 0) {
            *reinterpret_cast<uint2*>(out_row + (size_t)r * cols + c) = q;
        } else {
            const unsigned char* b = reinterpret_cast<const unsigned char*>(&q);
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (r < rows && c + j < cols) out_row[(size_t)r * cols + c + j] = b[j];
        }
        *reinterpret_cast<unsigned int*>(&codes[lr][chunk * 8]) = q.x;
        *reinterpret_cast<unsigned int*>(&codes[lr][chunk * 8 + 4]) = q.y;
    }
    __syncthreads();
    // Column-wise: thread = (input column oc, 64-row half); 8 bytes at a time along the input rows.
    const int oc = threadIdx.x & 127, half = threadIdx.x >> 7;
    const int c = c0 + oc;
    if (c >= cols) return;
#pragma unroll
    for (int g = 0; g < 8; g++) {
        const int lr = half * 64 + g * 8, r = r0 + lr;
        unsigned char b[8];
#pragma unroll
        for (int j = 0; j < 8; j++) b[j] = codes[lr + j][oc];
        if (r + 8 <= rows && rows % 8 == 0) {
            uint2 v;
            v.x = b[0] | (b[1] << 8) | (b[2] << 16) | ((unsigned int)b[3] << 24);
            v.y = b[4] | (b[5] << 8) | (b[6] << 16) | ((unsigned int)b[7] << 24);
            *reinterpret_cast<uint2*>(out_col + (size_t)c * rows + r) = v;
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (r + j < rows) out_col[(size_t)c * rows + r + j] = b[j];
        }
    }
}

extern "C" __global__ void __launch_bounds__(256)
    block128x128_bf16_e4m3(const unsigned short* x, int rows, int cols, float fmax, unsigned char* out_row,
                           unsigned char* out_col, float* rsi, float* csi, unsigned int* nf) {
    block2d<FMT_E4M3>(x, rows, cols, fmax, out_row, out_col, rsi, csi, nf);
}
extern "C" __global__ void __launch_bounds__(256)
    block128x128_bf16_e5m2(const unsigned short* x, int rows, int cols, float fmax, unsigned char* out_row,
                           unsigned char* out_col, float* rsi, float* csi, unsigned int* nf) {
    block2d<FMT_E5M2>(x, rows, cols, fmax, out_row, out_col, rsi, csi, nf);
}

// out (cols, rows) = in (rows, cols)^T, 32x32 tiles through shared memory.
extern "C" __global__ void transpose_f32(const float* __restrict__ in, float* __restrict__ out, int rows, int cols) {
    __shared__ float t[32][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    for (int i = threadIdx.y; i < 32; i += blockDim.y) {
        const int r = blockIdx.y * 32 + i;
        if (r < rows && c < cols) t[i][threadIdx.x] = in[(size_t)r * cols + c];
    }
    __syncthreads();
    const int r = blockIdx.y * 32 + threadIdx.x;
    for (int i = threadIdx.y; i < 32; i += blockDim.y) {
        const int cc = blockIdx.x * 32 + i;
        if (cc < cols && r < rows) out[(size_t)cc * rows + r] = t[threadIdx.x][i];
    }
}

// out (rows, stride) = in (rows, cols) with each row padded by zeros to
// `stride` columns: a 128x128 scale grid laid out as cuBLASLt reads it, whose
// rows (the k blocks) are padded to a multiple of 4.
extern "C" __global__ void pad_cols_f32(const float* __restrict__ in, float* __restrict__ out, int rows, int cols,
                                        int stride) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * stride) return;
    const int r = i / stride, c = i % stride;
    out[i] = c < cols ? in[r * cols + c] : 0.f;
}

// The same for FP8 codes (zeros are +0 in E4M3 and E5M2): a block-scaled
// product's operands with k padded to a multiple of 128.
extern "C" __global__ void pad_cols_u8(const unsigned char* __restrict__ in, unsigned char* __restrict__ out,
                                       int rows, int cols, int stride) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * stride) return;
    const size_t r = i / stride, c = i % stride;
    out[i] = c < (size_t)cols ? in[r * cols + c] : 0;
}

// bf16 (rows, cols) = code * scale_inv of its block, for any block shape
// (br x bc, scale grid row-major with gc = ceil(cols / bc) columns): the
// dequantized backward's operands. code * scale_inv is computed in f32 (as the
// CPU's QuantData::dequantize does) and rounded once to bf16, the GEMM's input.
template <int FMT>
__device__ __forceinline__ void dequant_f32s(const unsigned char* __restrict__ codes, const float* __restrict__ scales,
                                             unsigned short* __restrict__ out, int rows, int cols, int br, int bc) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)rows * cols) return;
    const int r = (int)(i / cols), c = (int)(i % cols);
    const int gc = (cols + bc - 1) / bc;
    const float s = scales[(size_t)(r / br) * gc + c / bc];
    const float v = fp8_decode<FMT>(codes[i]);
    unsigned short o;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(o) : "f"(__fmul_rn(v, s)));
    out[i] = o;
}
extern "C" __global__ void dequant_e4m3(const unsigned char* c, const float* s, unsigned short* o, int rows, int cols,
                                        int br, int bc) {
    dequant_f32s<FMT_E4M3>(c, s, o, rows, cols, br, bc);
}
extern "C" __global__ void dequant_e5m2(const unsigned char* c, const float* s, unsigned short* o, int rows, int cols,
                                        int br, int bc) {
    dequant_f32s<FMT_E5M2>(c, s, o, rows, cols, br, bc);
}

// The same values, 8 per thread: one 8-byte load of codes, one 16-byte store
// of bf16, one scale (needs cols % 8 == 0 and bc % 8 == 0, so the 8 elements
// share a row and a scale block). The per-element kernel above takes the rest.
template <int FMT>
__device__ __forceinline__ void dequant8_f32s(const unsigned char* __restrict__ codes, const float* __restrict__ scales,
                                              unsigned short* __restrict__ out, int rows, int cols, int br, int bc) {
    const size_t g = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g * 8 >= (size_t)rows * cols) return;
    const size_t i = g * 8;
    const int r = (int)(i / cols), c = (int)(i % cols);
    const int gc = (cols + bc - 1) / bc;
    const float s = scales[(size_t)(r / br) * gc + c / bc];
    const uint2 q = *reinterpret_cast<const uint2*>(codes + i);
    const unsigned int words[2] = {q.x, q.y};
    unsigned int packed[4];
#pragma unroll
    for (int w = 0; w < 2; w++) {
#pragma unroll
        for (int half = 0; half < 2; half++) {
            float lo, hi;
            fp8x2_to_f32x2<FMT>(words[w] >> (16 * half), lo, hi);
            unsigned short a, b;
            asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(a) : "f"(__fmul_rn(lo, s)));
            asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(__fmul_rn(hi, s)));
            packed[2 * w + half] = (unsigned int)a | ((unsigned int)b << 16);
        }
    }
    *reinterpret_cast<uint4*>(out + i) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
}
extern "C" __global__ void dequant8_e4m3(const unsigned char* c, const float* s, unsigned short* o, int rows, int cols,
                                         int br, int bc) {
    dequant8_f32s<FMT_E4M3>(c, s, o, rows, cols, br, bc);
}
extern "C" __global__ void dequant8_e5m2(const unsigned char* c, const float* s, unsigned short* o, int rows, int cols,
                                         int br, int bc) {
    dequant8_f32s<FMT_E5M2>(c, s, o, rows, cols, br, bc);
}

// out (cols, rows) = in (rows, cols)^T, bytes (the column-wise copy of a
// per-tensor FP8 weight: gathered shards, a frozen LoRA base). 32x32 tiles
// through shared memory, one byte a thread; block (32, 8). For any shape;
// transpose_u8_v4 below is the fast path.
extern "C" __global__ void transpose_u8(const unsigned char* __restrict__ in, unsigned char* __restrict__ out,
                                        int rows, int cols) {
    __shared__ unsigned char t[32][33];
    const int c0 = blockIdx.x * 32, r0 = blockIdx.y * 32;
    for (int i = threadIdx.y; i < 32; i += 8) {
        const int r = r0 + i, c = c0 + threadIdx.x;
        if (r < rows && c < cols) t[i][threadIdx.x] = in[(size_t)r * cols + c];
    }
    __syncthreads();
    for (int i = threadIdx.y; i < 32; i += 8) {
        const int c = c0 + i, r = r0 + threadIdx.x;
        if (r < rows && c < cols) out[(size_t)c * rows + r] = t[threadIdx.x][i];
    }
}


// transpose_u8 for rows and cols multiples of 4 (and 4-byte aligned buffers):
// 64x64 tiles, block 256. Each thread moves a 4x4 block of bytes: four 4-byte
// loads (input rows 4ty..4ty+3, columns 4tx..4tx+3; a warp reads two 64-byte
// row segments), a transpose in registers by byte permutes, four 4-byte words
// into the tile's shared copy, which is read back as output rows (a warp writes
// two 64-byte row segments). 17-word rows keep shared-memory conflicts 2-way.
// A 4x4 block lies wholly inside or outside the matrix, so one test guards it.
__device__ __forceinline__ void transpose_u8_v4_tile(const unsigned char* __restrict__ in,
                                                     unsigned char* __restrict__ out, int rows, int cols) {
    __shared__ unsigned t[64][17];
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int c0 = blockIdx.x * 64, r0 = blockIdx.y * 64;
    if (c0 >= cols || r0 >= rows) return;  // (a smaller matrix of a list)
    {
        const int r = r0 + 4 * ty, c = c0 + 4 * tx;
        if (r < rows && c < cols) {
            unsigned w[4];
#pragma unroll
            for (int j = 0; j < 4; j++) w[j] = *reinterpret_cast<const unsigned*>(in + (size_t)(r + j) * cols + c);
            // Byte i of w[j] is in[r + j][c + i]; output row c + i is byte i of w[0..3].
            const unsigned lo01 = __byte_perm(w[0], w[1], 0x5140), hi01 = __byte_perm(w[0], w[1], 0x7362);
            const unsigned lo23 = __byte_perm(w[2], w[3], 0x5140), hi23 = __byte_perm(w[2], w[3], 0x7362);
            t[4 * tx + 0][ty] = __byte_perm(lo01, lo23, 0x5410);
            t[4 * tx + 1][ty] = __byte_perm(lo01, lo23, 0x7632);
            t[4 * tx + 2][ty] = __byte_perm(hi01, hi23, 0x5410);
            t[4 * tx + 3][ty] = __byte_perm(hi01, hi23, 0x7632);
        }
    }
    __syncthreads();
#pragma unroll
    for (int it = 0; it < 4; it++) {
        const int row = 16 * it + ty;  // row of the output tile: output row c0 + row
        const int oc = c0 + row, orr = r0 + 4 * tx;
        if (oc < cols && orr < rows) *reinterpret_cast<unsigned*>(out + (size_t)oc * rows + orr) = t[row][tx];
    }
}

extern "C" __global__ void __launch_bounds__(256)
    transpose_u8_v4(const unsigned char* __restrict__ in, unsigned char* __restrict__ out, int rows, int cols) {
    transpose_u8_v4_tile(in, out, rows, cols);
}

// transpose_u8_v4 of up to 4 matrices in one launch, matrix blockIdx.z (the
// grid covers the largest; blocks past a smaller one's edge return): the
// frozen codes of the LoRA adapters that read one input (q, k, v; gate, up),
// each a launch of a few MB before.
struct TransposeMany {
    const unsigned char* in[4];
    unsigned char* out[4];
    int rows[4], cols[4];
};
// `__grid_constant__`: the list is read in place from the parameters; indexed
// by blockIdx.z without it, every thread first copied it to local memory (96
// bytes for the 16 it moves), and gate and up's launch took 57 us instead of
// 17.6 (ncu).
extern "C" __global__ void __launch_bounds__(256) transpose_u8_v4_many(const __grid_constant__ TransposeMany l) {
    const int z = blockIdx.z;
    transpose_u8_v4_tile(l.in[z], l.out[z], l.rows[z], l.cols[z]);
}
