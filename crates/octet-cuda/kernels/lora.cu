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

// `lora_da_e4m3_mt<MT>` (MT = 1..4 tiles of 16 adapter rows, R <= 16 MT):
// the adapters' weight gradient d_A = du^T x from the E4M3 codes of x that
// the forward kept (the base's product read them), without a bf16 copy of x:
// part[s] (R, K) = du^T[:, tokens of split s] . codes[tokens of s, :], with
// the codes' exact values (every E4M3 value is a bf16) and f32 sums on the
// tensor cores (mma.m16n8k16: rank rows as M, tokens as K, features as N).
// After a grid-wide barrier the same blocks add the splits in order and
// multiply by x's one dequantization factor, so the result does not depend
// on timing; each output row goes straight to its adapter's own d_A (`DaOut`:
// up to 4 adapters stacked, q/k/v or gate/up). With one split there is no
// barrier: the blocks write the result themselves. With more, the host
// launches the kernel cooperatively (every block resident at once, which the
// barrier needs; the grid is at most one block an SM). A separate reduce
// kernel cost one more launch a group, 5-7 us each under ncu (64 a step on
// the ~1B model), and the per-adapter rows were copied out after it.
//
// Block: 8 warps over 256 features and one range of tokens (a split), 16
// tokens a step. Each step's codes (16 rows of 256 bytes) and du^T columns
// (16 MT rows of 16 tokens) are copied to shared memory by cp.async, up to
// ST - 2 steps ahead, ST = 8, 7, 6 stages for MT <= 2, 3, 4 (what 48 KB of
// static shared memory holds; 16 to 24 KB of loads in flight a block). The
// two groups of 4 warps take alternate steps (group 0 the even ones) and add their
// sums through shared memory at the end, group 1's into group 0's, in that
// order. Warp w of a group takes features 64w .. 64w + 63; thread g = lane
// / 4 reads 8 adjacent ones (8g .. 8g + 7) of token rows 2t, 2t + 1, 2t + 8,
// 2t + 9 (t = lane % 4), so column g of n8 tile j is its feature 8g + j,
// and C[.][2t], C[.][2t + 1] of tile j are features 16t + j and 16t + 8 + j:
// the thread ends with 16 adjacent features of rows g and g + 8 of each row
// tile, written as four 16-byte stores each. Shared rows are padded (272
// and 48 bytes) so that these reads take one pass each.
//
// The codes become bf16 on the integer and FMA pipes (`e4m3x2_to_bf16x2_int`)
// rather than through the conversion unit (FP8 -> f16x2 -> f32 -> bf16x2).
// What limits the kernel is not settled (ncu on the ~1B LoRA step): memory
// waits are 4% of its stall samples; more stages, more warp groups and 7%
// fewer instructions (this version's one permute a pair and running
// addresses, kept as the simpler code) each left its time as it was
// (docs/design.md).
//
// Requirements checked by the host: M % 16 == 0, T % 16 == 0, K % 16 == 0,
// 1 <= R <= 16 MT, 16-byte aligned buffers.

#define DA_GROUPS 2
#define DA_WARPS (4 * DA_GROUPS)
#define DA_F 256
#define DA_XS (DA_F + 16)  // bytes a shared row of codes
#define DA_US 24           // bf16 a shared row of du^T (16 tokens + padding)

// Where the rows of d_A go: rows [end[i - 1], end[i]) (end[-1] = 0) to
// out[i], a (rows, K) f32 matrix; unused entries have end = R.
struct DaOut {
    float* out[4];
    int end[4];
};

__device__ __forceinline__ float* da_row(const DaOut& d, int row, int K) {
    int i = 0;
#pragma unroll
    for (int j = 0; j < 3; j++) i += row >= d.end[j];
    return d.out[i] + (size_t)(row - (i ? d.end[i - 1] : 0)) * K;
}

// A barrier over the whole grid (every block resident: a cooperative
// launch). `bar` is a word whose low 31 bits are 0 between barriers (zeroed
// once when allocated): block 0 adds 2^31 - (blocks - 1), every other block
// 1, so the word's top bit flips exactly when the last block arrives and the
// low bits are 0 again, whatever the grid's size.
__device__ __forceinline__ void grid_barrier(unsigned int* bar) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned int nb = gridDim.x * gridDim.y;
        const unsigned int inc = blockIdx.x == 0 && blockIdx.y == 0 ? 0x80000000u - (nb - 1) : 1u;
        __threadfence();
        const unsigned int old = atomicAdd(bar, inc);
        unsigned int now;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(bar) : "memory");
        } while (((old ^ now) & 0x80000000u) == 0);
        __threadfence();
    }
    __syncthreads();
}

// Two E4M3 codes, one from `lo` and one from `hi`, -> bf16x2 (lo's in the
// low half), exactly. `sel` permutes them into bytes 1 and 3 of one word
// (bytes 0 and 2 are don't-cares, masked off); each code's sign, exponent
// and mantissa bits are placed in a bf16, which then holds the code's value
// times 2^-120 (E4M3 subnormals become bf16 subnormals), and one exact
// multiply by 2^120. A NaN code (0x7f, 0xff) reads as +-480 here; such codes
// come only from a NaN input, whose forward product is NaN already.
__device__ __forceinline__ unsigned int e4m3x2_to_bf16x2_int(unsigned int lo, unsigned int hi, unsigned int sel) {
    const unsigned int w = __byte_perm(lo, hi, sel);  // [*, code 0, *, code 1]
    const unsigned int bits = (w & 0x80008000u) | ((w >> 4) & 0x07F007F0u);
    unsigned int r;
    // fma with -0 (sm_80; mul.bf16x2 needs sm_90): +-0 and every product stay exact.
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(bits), "r"(0x7B807B80u), "r"(0x80008000u));
    return r;
}

template <int MT>
__device__ __forceinline__ void lora_da(const unsigned short* __restrict__ dut, int R,
                                        const unsigned char* __restrict__ x, int M, int K, int T,
                                        const float* __restrict__ scale_inv, float* part,
                                        unsigned int* bar, const DaOut& dst) {
    constexpr int DA_ST = MT <= 2 ? 8 : MT == 3 ? 7 : 6;
    __shared__ __align__(16) unsigned char xs[DA_ST][16 * DA_XS];
    __shared__ __align__(16) unsigned short us[DA_ST][16 * MT * DA_US];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int grp = warp >> 2, wq = warp & 3;
    const int g = lane >> 2, t = lane & 3;
    const int f0 = blockIdx.x * DA_F;
    const int t0 = blockIdx.y * T, t1 = min(M, t0 + T);
    const int steps = t1 > t0 ? (t1 - t0) / 16 : 0;
    // Step i goes to stage i % DA_ST: 16 rows x 256 codes (thread c copies
    // row c / 16, bytes 16 (c % 16); features past K are zero-filled) and 16
    // MT rows x 16 tokens of du^T (thread c < 32 MT copies row c / 2, tokens
    // 8 (c % 2); rows past R zero-filled). Sources, destinations and the
    // stage are kept as running values (no address arithmetic a step). One
    // commit group a step, empty past the end.
    const int c = threadIdx.x;
    const int xrow = c >> 4, xcol = (c & 15) * 16;
    const bool xok = f0 + xcol < K;
    const unsigned char* xsrc = x + (size_t)(t0 + xrow) * K + (xok ? f0 + xcol : 0);
    const size_t xstep = 16 * (size_t)K;
    const bool ucopy = c < 32 * MT, uok = ucopy && (c >> 1) < R;
    const unsigned short* usrc = dut + (size_t)(uok ? c >> 1 : 0) * M + t0 + (c & 1) * 8;
    const unsigned xdst = smem_addr(&xs[0][xrow * DA_XS + xcol]);
    const unsigned udst = smem_addr(&us[0][(ucopy ? c >> 1 : 0) * DA_US + (c & 1) * 8]);
    int loaded = 0, lslot = 0;
    auto load = [&]() {
        if (loaded < steps) {
            cp_async16(xdst + lslot * (16 * DA_XS), xsrc, xok ? 16 : 0);
            if (ucopy) cp_async16(udst + lslot * (16 * MT * DA_US * 2), usrc, uok ? 16 : 0);
            xsrc += xstep;
            usrc += 16;
        }
        cp_commit();
        loaded++;
        lslot = lslot + 1 == DA_ST ? 0 : lslot + 1;
    };
    float acc[MT][8][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;
#pragma unroll
    for (int i = 0; i < DA_ST - 2; i++) load();
    int pslot = 0;  // the stage of step i
    for (int i = 0; i < steps; i += DA_GROUPS) {
        // Steps i and i + 1 have landed (at most ST - 4 later ones pending).
        cp_wait<DA_ST - 2 - DA_GROUPS>();
        __syncthreads();
        // The slots refilled here were read in the previous pair of steps,
        // which every thread has left.
#pragma unroll
        for (int q = 0; q < DA_GROUPS; q++) load();
        const int step = i + grp;
        const int slot = pslot + grp < DA_ST ? pslot + grp : pslot + grp - DA_ST;
        pslot = pslot + DA_GROUPS < DA_ST ? pslot + DA_GROUPS : pslot + DA_GROUPS - DA_ST;
        if (step >= steps) continue;
        const unsigned char* xr = &xs[slot][64 * wq + 8 * g];
        const uint2 r0 = *reinterpret_cast<const uint2*>(xr + (2 * t) * DA_XS);
        const uint2 r1 = *reinterpret_cast<const uint2*>(xr + (2 * t + 1) * DA_XS);
        const uint2 r8 = *reinterpret_cast<const uint2*>(xr + (2 * t + 8) * DA_XS);
        const uint2 r9 = *reinterpret_cast<const uint2*>(xr + (2 * t + 9) * DA_XS);
        unsigned int a[MT][4];
#pragma unroll
        for (int m = 0; m < MT; m++) {
            const unsigned int* u0 = reinterpret_cast<const unsigned int*>(&us[slot][(16 * m + g) * DA_US]);
            const unsigned int* u1 = u0 + 4 * DA_US;  // row g + 8
            a[m][0] = u0[t];
            a[m][1] = u1[t];
            a[m][2] = u0[t + 4];
            a[m][3] = u1[t + 4];
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            // Byte j of two token rows -> the pair (row 2t, row 2t + 1) of
            // feature 8g + j, in bytes 1 and 3.
            const unsigned int jj = j & 3;
            const unsigned int sel = jj | (jj << 4) | (jj << 8) | ((4 + jj) << 12);
            const unsigned int lo01 = j < 4 ? r0.x : r0.y, hi01 = j < 4 ? r1.x : r1.y;
            const unsigned int lo89 = j < 4 ? r8.x : r8.y, hi89 = j < 4 ? r9.x : r9.y;
            const unsigned int b0 = e4m3x2_to_bf16x2_int(lo01, hi01, sel);
            const unsigned int b1 = e4m3x2_to_bf16x2_int(lo89, hi89, sel);
#pragma unroll
            for (int m = 0; m < MT; m++) mma_bf16(acc[m][j], a[m][0], a[m][1], a[m][2], a[m][3], b0, b1);
        }
    }
    cp_wait<0>();
    // Group 1's sums into group 0's, one row tile at a time through the
    // codes' buffer (128 threads x 32 floats = 16 KB).
    float* red = reinterpret_cast<float*>(&xs[0][0]);
    const int tid = threadIdx.x & 127;
#pragma unroll
    for (int m = 0; m < MT; m++) {
        __syncthreads();
        if (grp == 1) {
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) red[(j * 4 + e) * 128 + tid] = acc[m][j][e];
        }
        __syncthreads();
        if (grp == 0) {
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[m][j][e] += red[(j * 4 + e) * 128 + tid];
        }
    }
    // Rows g and g + 8 of each row tile: features 16t .. 16t + 15 of the
    // warp's 64. One split: the result, times the factor, to the adapters'
    // rows; more: this split's sums to part[split].
    const int S = gridDim.y;
    const float fac = *scale_inv;
    const int f = f0 + 64 * wq + 16 * t;
    if (grp == 0 && f < K) {
#pragma unroll
        for (int m = 0; m < MT; m++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = 16 * m + g + 8 * h;
                if (row >= R) continue;
                const float w = S == 1 ? fac : 1.f;
                float4* p = reinterpret_cast<float4*>(
                    S == 1 ? da_row(dst, row, K) + f : part + ((size_t)blockIdx.y * R + row) * K + f);
                p[0] = make_float4(acc[m][0][2 * h] * w, acc[m][1][2 * h] * w, acc[m][2][2 * h] * w, acc[m][3][2 * h] * w);
                p[1] = make_float4(acc[m][4][2 * h] * w, acc[m][5][2 * h] * w, acc[m][6][2 * h] * w, acc[m][7][2 * h] * w);
                p[2] = make_float4(acc[m][0][2 * h + 1] * w, acc[m][1][2 * h + 1] * w, acc[m][2][2 * h + 1] * w,
                                   acc[m][3][2 * h + 1] * w);
                p[3] = make_float4(acc[m][4][2 * h + 1] * w, acc[m][5][2 * h + 1] * w, acc[m][6][2 * h + 1] * w,
                                   acc[m][7][2 * h + 1] * w);
            }
        }
    }
    if (S == 1) return;
    grid_barrier(bar);
    // out = fac * (part[0] + part[1] + ... + part[S-1]), in that order, 4
    // elements a thread over the whole grid (K % 16 == 0: a float4 stays in
    // one row). The parts were written in this launch: read through L2.
    const long long n4 = (long long)R * K / 4;
    const long long nt = (long long)gridDim.x * gridDim.y * blockDim.x;
    const float4* P = reinterpret_cast<const float4*>(part);
    for (long long i = ((long long)blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x; i < n4;
         i += nt) {
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
        for (int s = 0; s < S; s++) {
            const float4 q = __ldcg(P + s * n4 + i);
            v.x += q.x;
            v.y += q.y;
            v.z += q.z;
            v.w += q.w;
        }
        const int row = (int)(4 * i / K), col = (int)(4 * i - (long long)row * K);
        *reinterpret_cast<float4*>(da_row(dst, row, K) + col) = make_float4(v.x * fac, v.y * fac, v.z * fac, v.w * fac);
    }
}

#define LORA_DA(MT)                                                                                      \
    extern "C" __global__ void __launch_bounds__(DA_WARPS * 32)                                          \
        lora_da_e4m3_mt##MT(const unsigned short* __restrict__ dut, int R,                               \
                            const unsigned char* __restrict__ x, int M, int K, int T,                    \
                            const float* __restrict__ scale_inv, float* part, unsigned int* bar,         \
                            const __grid_constant__ DaOut dst) {                                         \
        lora_da<MT>(dut, R, x, M, K, T, scale_inv, part, bar, dst);                                      \
    }
LORA_DA(1)
LORA_DA(2)
LORA_DA(3)
LORA_DA(4)

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
