// Row-wise current scaling (torchao's "rowwise"): the row-wise copy (rows, cols)
// has one scale per row, the column-wise copy (cols, rows) one scale per column
// of the input, each from that row's or column's amax with the CPU reference's
// rule (octet_fp8::quantize with Granularity::Row on each copy). Two passes
// over 64x64 tiles of the input:
//   1. rowwise_amax_<in>: per-row and per-column amax (atomicMax on the f32
//      bits, zeroed by the host first) and a NaN/inf flag: one read;
//   2. rowwise_cast_<in>_<fmt>: both copies from one read of each tile, the
//      row-wise codes with their row's scale, the column-wise ones with their
//      column's scale, transposed through shared memory; scale_inv = 1 / scale.
// Traffic for bf16: 2 B + 2 B read, 2 x 1 B written per element (the column
// amaxes need every row before the first column-wise code, hence two reads).

#define RT 64

template <typename T>
__device__ __forceinline__ void load_tile(const T* __restrict__ x, int rows, int cols, int r0, int c0,
                                          float f[2][8]) {
    const int chunk = threadIdx.x & 7;
    const bool full = (r0 + RT <= rows) && (c0 + RT <= cols) && (cols % 8 == 0);
#pragma unroll
    for (int pass = 0; pass < 2; pass++) {
        const int r = r0 + (threadIdx.x >> 3) + pass * 32, c = c0 + chunk * 8;
        if (full) {
            In<T>::load8(x + (size_t)r * cols + c, f[pass]);
        } else {
#pragma unroll
            for (int j = 0; j < 8; j++)
                f[pass][j] = (r < rows && c + j < cols) ? In<T>::load1(x + (size_t)r * cols + c + j) : 0.f;
        }
    }
}

template <typename T>
__device__ __forceinline__ void rowwise_amax(const T* __restrict__ x, int rows, int cols,
                                             unsigned int* __restrict__ row_amax,
                                             unsigned int* __restrict__ col_amax,
                                             unsigned int* __restrict__ nonfinite) {
    __shared__ float cm[32][RT + 1];
    const int r0 = blockIdx.y * RT, c0 = blockIdx.x * RT;
    const int chunk = threadIdx.x & 7, rr = threadIdx.x >> 3;
    float f[2][8];
    load_tile<T>(x, rows, cols, r0, c0, f);
    int bad = 0;
#pragma unroll
    for (int pass = 0; pass < 2; pass++) {
        float m = 0.f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            bad |= nonfinite_f32(f[pass][j]);
            m = fmaxf(m, fabsf(f[pass][j]));
        }
        // The 8 threads of a row are 8 consecutive lanes.
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
        const int r = r0 + rr + pass * 32;
        if (chunk == 0 && r < rows) atomicMax(row_amax + r, __float_as_uint(m));
    }
#pragma unroll
    for (int j = 0; j < 8; j++) cm[rr][chunk * 8 + j] = fmaxf(fabsf(f[0][j]), fabsf(f[1][j]));
    __syncthreads();
    if (threadIdx.x < RT) {
        float m = 0.f;
        for (int q = 0; q < 32; q++) m = fmaxf(m, cm[q][threadIdx.x]);
        const int c = c0 + threadIdx.x;
        if (c < cols) atomicMax(col_amax + c, __float_as_uint(m));
    }
    if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(nonfinite, 1u);
}

template <typename T, int FMT>
__device__ __forceinline__ void rowwise_cast(const T* __restrict__ x, int rows, int cols,
                                             const unsigned int* __restrict__ row_amax,
                                             const unsigned int* __restrict__ col_amax, float fmax,
                                             unsigned char* __restrict__ out_row,
                                             unsigned char* __restrict__ out_col,
                                             float* __restrict__ row_scale_inv,
                                             float* __restrict__ col_scale_inv) {
    __shared__ __align__(16) unsigned char tile[RT][RT + 4];
    const int r0 = blockIdx.y * RT, c0 = blockIdx.x * RT;
    const int chunk = threadIdx.x & 7, rr = threadIdx.x >> 3;
    float f[2][8];
    load_tile<T>(x, rows, cols, r0, c0, f);
    // This thread's 8 column scales.
    float cs[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int c = c0 + chunk * 8 + j;
        cs[j] = c < cols ? scale_from_amax(__uint_as_float(col_amax[c]), fmax, 0) : 1.f;
        if (blockIdx.y == 0 && rr == 0 && c < cols) col_scale_inv[c] = __fdiv_rn(1.f, cs[j]);
    }
    const bool full = (r0 + RT <= rows) && (c0 + RT <= cols) && (cols % 8 == 0);
#pragma unroll
    for (int pass = 0; pass < 2; pass++) {
        const int lr = rr + pass * 32, r = r0 + lr, c = c0 + chunk * 8;
        const float rs = r < rows ? scale_from_amax(__uint_as_float(row_amax[r]), fmax, 0) : 1.f;
        if (blockIdx.x == 0 && chunk == 0 && r < rows) row_scale_inv[r] = __fdiv_rn(1.f, rs);
        const uint2 q = cast8<FMT>(f[pass], rs);
        if (full) {
            *reinterpret_cast<uint2*>(out_row + (size_t)r * cols + c) = q;
        } else {
            const unsigned char* b = reinterpret_cast<const unsigned char*>(&q);
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (r < rows && c + j < cols) out_row[(size_t)r * cols + c + j] = b[j];
        }
        // Column-wise codes: each element with its column's scale.
        unsigned int lo = cvt_fp8x2<FMT>(__fmul_rn(f[pass][0], cs[0]), __fmul_rn(f[pass][1], cs[1])) |
                          (cvt_fp8x2<FMT>(__fmul_rn(f[pass][2], cs[2]), __fmul_rn(f[pass][3], cs[3])) << 16);
        unsigned int hi = cvt_fp8x2<FMT>(__fmul_rn(f[pass][4], cs[4]), __fmul_rn(f[pass][5], cs[5])) |
                          (cvt_fp8x2<FMT>(__fmul_rn(f[pass][6], cs[6]), __fmul_rn(f[pass][7], cs[7])) << 16);
        *reinterpret_cast<unsigned int*>(&tile[lr][chunk * 8]) = lo;
        *reinterpret_cast<unsigned int*>(&tile[lr][chunk * 8 + 4]) = hi;
    }
    __syncthreads();
    // Column-wise: output row = input column; 8 consecutive bytes along the input rows.
#pragma unroll
    for (int pass = 0; pass < 2; pass++) {
        const int oc = (threadIdx.x >> 3) + pass * 32;  // input column within the tile
        const int c = c0 + oc;
        const int rb = chunk * 8;                       // input rows rb..rb+7 within the tile
        if (c >= cols) continue;
        unsigned char b[8];
#pragma unroll
        for (int j = 0; j < 8; j++) b[j] = tile[rb + j][oc];
        const int r = r0 + rb;
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

#define ROWWISE_AMAX(T, NAME)                                                                                  \
    extern "C" __global__ void __launch_bounds__(256) NAME(const T* x, int rows, int cols, unsigned int* ra,  \
                                                           unsigned int* ca, unsigned int* nf) {              \
        rowwise_amax<T>(x, rows, cols, ra, ca, nf);                                                            \
    }
ROWWISE_AMAX(unsigned short, rowwise_amax_bf16)
ROWWISE_AMAX(float, rowwise_amax_f32)

#define ROWWISE_CAST(T, FMT, NAME)                                                                              \
    extern "C" __global__ void __launch_bounds__(256)                                                           \
        NAME(const T* x, int rows, int cols, const unsigned int* ra, const unsigned int* ca, float fmax,       \
             unsigned char* out_row, unsigned char* out_col, float* rsi, float* csi) {                          \
        rowwise_cast<T, FMT>(x, rows, cols, ra, ca, fmax, out_row, out_col, rsi, csi);                           \
    }
ROWWISE_CAST(unsigned short, FMT_E4M3, rowwise_cast_bf16_e4m3)
ROWWISE_CAST(unsigned short, FMT_E5M2, rowwise_cast_bf16_e5m2)
ROWWISE_CAST(float, FMT_E4M3, rowwise_cast_f32_e4m3)
ROWWISE_CAST(float, FMT_E5M2, rowwise_cast_f32_e5m2)
