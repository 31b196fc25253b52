// LoRA kernels (common.cuh is prepended by the host).
//
// `lora_cast_du_e5m2_r<R>` (R = 8, 16, ..., 64): the backward of a LoRA layer over an FP8 base
// (`quantized` backward) reads the output gradient dy (M, N) for two things:
// its E5M2 codes for the base's input-gradient GEMM, and the adapter's
// du^T = s B^T dy^T (R, M). This kernel does both from one read of dy:
// - row-wise codes with current per-tensor scaling: the scale from the
//   tensor's known amax by the CPU reference's rule, one f32 multiply and a
//   saturating round-to-nearest-even conversion per element; the bytes of
//   `cast_transpose_bf16_e5m2`'s row-wise copy, bit for bit;
// - du^T = bf16(s * sum over n of B[n][j] dy[m][n]), f32 sums on the tensor
//   cores (mma.m16n8k16), as the cuBLASLt GEMM it replaces rounds it (the
//   order of the sum differs).
//
// A block of 4 warps owns 16 rows of dy (tokens); warp w takes the 64-column
// chunks w, w + 4, ... Per chunk a thread loads 16 contiguous bf16 of rows g
// and g + 8 (g = lane / 4, t = lane % 4; columns 16t .. 16t + 15 of the
// chunk), stores their 16 codes each, and multiplies them by B's rows in
// four mma steps per 8 columns of du. The order of k inside one mma is free
// (a sum), so thread t's logical columns {2t, 2t+1, 2t+8, 2t+9} of step s
// are the physical columns 16t + 4s + {0, 1, 2, 3}: one pair of 16-byte
// loads of dy per row, and one pair from B^T's row j (B transposed, (R, N),
// so that a thread's 16 columns of it are contiguous too). The next chunk's
// loads (dy and B^T: a first version loaded B^T when it needed it, and
// waited for it) are in flight while the current one is converted and
// multiplied. The four warps' sums are added in warp order through shared
// memory: the result does not depend on timing.
//
// Requirements checked by the host: N % 64 == 0, M % 16 == 0, 16-byte
// aligned buffers.

#define CD_WARPS 4

__device__ __forceinline__ unsigned short f32_to_bf16_bits(float v) {
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(v));
    return r;
}

// 16 bf16 (two 16-byte words) times `scale` -> 16 codes, stored as one 16-byte word.
template <int FMT>
__device__ __forceinline__ void store_codes16(const uint4 v[2], float scale, unsigned char* __restrict__ out) {
    uint4 q;
    uint2 h[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        float f[8];
#pragma unroll
        for (int w = 0; w < 4; w++) {
            f[2 * w] = bf16_lo(word(v[i], w));
            f[2 * w + 1] = bf16_hi(word(v[i], w));
        }
        h[i] = cast8<FMT>(f, scale);
    }
    q.x = h[0].x;
    q.y = h[0].y;
    q.z = h[1].x;
    q.w = h[1].y;
    *reinterpret_cast<uint4*>(out) = q;
}

// NR <= 2 (rank 16 and below): the next chunk's B^T rows are loaded with its
// dy, ahead. Wider ranks (the forward's stacked q, k, v and gate, up adapters)
// load the current chunk's B^T rows (from L1/L2: every block reads all of
// B^T) just before they multiply, which holds 16 NR fewer registers a thread
// (measured at 1.6-1.8 TB/s with them ahead, on the ~1B LoRA step). The sums
// are the same either way: each acc[j] adds the same products in the same order.
template <int FMT, int NR>
__device__ __forceinline__ void cast_du(const unsigned short* __restrict__ dy, int M, int N,
                                        const unsigned int* __restrict__ amax_bits, float fmax,
                                        const unsigned short* __restrict__ bt, float s,
                                        unsigned char* __restrict__ out_row, float* __restrict__ scale_inv,
                                        unsigned short* __restrict__ dut) {
    __shared__ float red[CD_WARPS][NR * 4][32];
    const float scale = scale_from_amax(__uint_as_float(*amax_bits), fmax, 0);
    if (blockIdx.x == 0 && threadIdx.x == 0) *scale_inv = __fdiv_rn(1.f, scale);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = blockIdx.x * 16;
    const size_t ra = (size_t)(row0 + g) * N, rb = (size_t)(row0 + g + 8) * N;
    const int chunks = N / 64;
    float acc[NR][4];
#pragma unroll
    for (int j = 0; j < NR; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    // Chunk c's loads: 16 bf16 of rows g and g + 8 of dy, and of each n8
    // tile's row 8j + g of B^T, at the thread's columns.
    constexpr bool ahead = NR <= 2;
    auto load_b = [&](int c, uint4 bv[NR][2]) {
        const int col = c * 64 + 16 * t;
#pragma unroll
        for (int j = 0; j < NR; j++) {
            const uint4* p = reinterpret_cast<const uint4*>(bt + (size_t)(8 * j + g) * N + col);
            bv[j][0] = __ldg(p);
            bv[j][1] = __ldg(p + 1);
        }
    };
    auto load = [&](int c, uint4 a[2], uint4 b[2], uint4 bv[NR][2]) {
        const int col = c * 64 + 16 * t;
        const uint4* pa = reinterpret_cast<const uint4*>(dy + ra + col);
        const uint4* pb = reinterpret_cast<const uint4*>(dy + rb + col);
        a[0] = __ldg(pa);
        a[1] = __ldg(pa + 1);
        b[0] = __ldg(pb);
        b[1] = __ldg(pb + 1);
        if (ahead) load_b(c, bv);
    };
    uint4 ya[2], yb[2], bv[NR][2];
    if (warp < chunks) load(warp, ya, yb, bv);
    for (int c = warp; c < chunks; c += CD_WARPS) {
        const int col = c * 64 + 16 * t;
        uint4 na[2], nb[2], nbv[ahead ? NR : 1][2];
        const bool more = c + CD_WARPS < chunks;
        if (more) load(c + CD_WARPS, na, nb, nbv);
        if (!ahead) load_b(c, bv);
        store_codes16<FMT>(ya, scale, out_row + ra + col);
        store_codes16<FMT>(yb, scale, out_row + rb + col);
#pragma unroll
        for (int st = 0; st < 4; st++) {
            const int v = st >> 1, w = (st & 1) * 2;
            const unsigned a0 = word(ya[v], w), a2 = word(ya[v], w + 1);  // row g
            const unsigned a1 = word(yb[v], w), a3 = word(yb[v], w + 1);  // row g + 8
#pragma unroll
            for (int j = 0; j < NR; j++) mma_bf16(acc[j], a0, a1, a2, a3, word(bv[j][v], w), word(bv[j][v], w + 1));
        }
        if (more) {
#pragma unroll
            for (int i = 0; i < 2; i++) {
                ya[i] = na[i];
                yb[i] = nb[i];
#pragma unroll
                for (int j = 0; j < (ahead ? NR : 0); j++) bv[j][i] = nbv[j][i];
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NR; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) red[warp][j * 4 + i][lane] = acc[j][i];
    __syncthreads();
    // One thread per (fragment slot, lane): the warps' sums in warp order,
    // times s, rounded to bf16; C[token][j] of the mma layout.
    for (int e = threadIdx.x; e < NR * 4 * 32; e += CD_WARPS * 32) {
        const int idx = e >> 5, l = e & 31;
        float v = 0.f;
#pragma unroll
        for (int q = 0; q < CD_WARPS; q++) v += red[q][idx][l];
        const int j = 8 * (idx >> 2) + 2 * (l & 3) + (idx & 1);
        const int tok = row0 + (l >> 2) + ((idx & 2) ? 8 : 0);
        dut[(size_t)j * M + tok] = f32_to_bf16_bits(s * v);
    }
}

#define CAST_DU(FMT, FNAME, FMAX, R)                                                                       \
    extern "C" __global__ void __launch_bounds__(CD_WARPS * 32)                                             \
        lora_cast_du_##FNAME##_r##R(const unsigned short* __restrict__ dy, int M, int N,                   \
                                     const unsigned int* __restrict__ amax_bits,                            \
                                     const unsigned short* __restrict__ bt, float s,                        \
                                     unsigned char* __restrict__ out_row, float* __restrict__ scale_inv,    \
                                     unsigned short* __restrict__ dut) {                                    \
        cast_du<FMT, R / 8>(dy, M, N, amax_bits, FMAX, bt, s, out_row, scale_inv, dut);                     \
    }
#define CAST_DU_RANKS(FMT, FNAME, FMAX)                                                                     \
    CAST_DU(FMT, FNAME, FMAX, 8)                                                                            \
    CAST_DU(FMT, FNAME, FMAX, 16)                                                                           \
    CAST_DU(FMT, FNAME, FMAX, 24)                                                                           \
    CAST_DU(FMT, FNAME, FMAX, 32)                                                                           \
    CAST_DU(FMT, FNAME, FMAX, 40)                                                                           \
    CAST_DU(FMT, FNAME, FMAX, 48)                                                                           \
    CAST_DU(FMT, FNAME, FMAX, 56)                                                                           \
    CAST_DU(FMT, FNAME, FMAX, 64)
CAST_DU_RANKS(FMT_E5M2, e5m2, 57344.f)
// The forward's twin, `lora_cast_du_e4m3_r<R>`: x's E4M3 codes for the base's
// product and the adapters' u^T = A x^T (bt = the stacked A, (R, K); s = 1).
CAST_DU_RANKS(FMT_E4M3, e4m3, 448.f)

// out (cols, rows) = in (rows, cols)^T for 16-bit elements: one thread per
// output element (coalesced stores; the small input is read from cache).
extern "C" __global__ void transpose_b16(const unsigned short* __restrict__ in, int rows, int cols,
                                         unsigned short* __restrict__ out) {
    const long long o = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (o >= (long long)rows * cols) return;
    const long long c = o / rows, r = o % rows;
    out[o] = in[r * cols + c];
}

// LoRA dropout (octet_nn::lora::Dropout): element i of an adapter's (M, K)
// input is kept when its 16 random bits, lane i % 4 of splitmix64(key ^
// (i / 4) * golden), are >= thr. The kept elements are not rescaled
// (1 / P(kept) is folded into the adapter's scale), so the masked input is
// exact in bf16. Vector paths where the length allows (n % 8 or n % 4 == 0:
// the buffers are whole allocations, 256-byte aligned), grid-stride.

__device__ __forceinline__ unsigned long long dropout_hash(unsigned long long key, unsigned long long group) {
    unsigned long long z = key ^ (group * 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ bool dropout_keeps(unsigned long long key, unsigned int thr, long long i) {
    return ((dropout_hash(key, (unsigned long long)i >> 2) >> (16 * (i & 3))) & 0xffffu) >= thr;
}

// The keep mask of the 4 elements of group g as 16-bit lanes of two words
// (0xffff: kept), for masking bf16 pairs.
__device__ __forceinline__ uint2 dropout_lanes(unsigned long long key, unsigned int thr, unsigned long long g) {
    const unsigned long long h = dropout_hash(key, g);
    unsigned int w[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const unsigned int lo = ((h >> (32 * j)) & 0xffffu) >= thr ? 0xffffu : 0u;
        const unsigned int hi = ((h >> (32 * j + 16)) & 0xffffu) >= thr ? 0xffff0000u : 0u;
        w[j] = lo | hi;
    }
    return make_uint2(w[0], w[1]);
}

// out = keep ? x : 0 (bf16 bits).
extern "C" __global__ void dropout_mask_b16(const unsigned short* __restrict__ x, long long n,
                                            unsigned long long key, unsigned int thr,
                                            unsigned short* __restrict__ out) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long t0 = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if ((n & 7) == 0) {
        for (long long v = t0; v < n / 8; v += stride) {
            const uint4 a = reinterpret_cast<const uint4*>(x)[v];
            const uint2 m0 = dropout_lanes(key, thr, 2 * v), m1 = dropout_lanes(key, thr, 2 * v + 1);
            reinterpret_cast<uint4*>(out)[v] = make_uint4(a.x & m0.x, a.y & m0.y, a.z & m1.x, a.w & m1.y);
        }
    } else {
        for (long long i = t0; i < n; i += stride) out[i] = dropout_keeps(key, thr, i) ? x[i] : 0;
    }
}

// d = (fresh ? 0 : d) + (keep ? t : 0), t f32, d f32 or bf16 bits (rounded to
// nearest even once): the adapter's masked input gradient.
__device__ __forceinline__ float dropout_load(const float* d, long long i) { return d[i]; }
__device__ __forceinline__ float dropout_load(const unsigned short* d, long long i) {
    return __uint_as_float((unsigned int)d[i] << 16);
}
__device__ __forceinline__ void dropout_store(float* d, long long i, float v) { d[i] = v; }
__device__ __forceinline__ void dropout_store(unsigned short* d, long long i, float v) {
    d[i] = f32_to_bf16_bits(v);
}

template <typename D>
__device__ __forceinline__ void dropout_add(const float* __restrict__ t, long long n, unsigned long long key,
                                            unsigned int thr, D* __restrict__ d, int fresh) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long t0 = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if ((n & 3) == 0) {
        for (long long g = t0; g < n / 4; g += stride) {
            const float4 tv = reinterpret_cast<const float4*>(t)[g];
            const unsigned long long h = dropout_hash(key, g);
            const float tt[4] = {tv.x, tv.y, tv.z, tv.w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const long long i = 4 * g + j;
                const float add = ((h >> (16 * j)) & 0xffffu) >= thr ? tt[j] : 0.f;
                dropout_store(d, i, fresh ? add : dropout_load(d, i) + add);
            }
        }
    } else {
        for (long long i = t0; i < n; i += stride) {
            const float add = dropout_keeps(key, thr, i) ? t[i] : 0.f;
            dropout_store(d, i, fresh ? add : dropout_load(d, i) + add);
        }
    }
}

extern "C" __global__ void dropout_add_f32(const float* __restrict__ t, long long n, unsigned long long key,
                                           unsigned int thr, float* __restrict__ d, int fresh) {
    dropout_add<float>(t, n, key, thr, d, fresh);
}

extern "C" __global__ void dropout_add_b16(const float* __restrict__ t, long long n, unsigned long long key,
                                           unsigned int thr, unsigned short* __restrict__ d, int fresh) {
    dropout_add<unsigned short>(t, n, key, thr, d, fresh);
}
