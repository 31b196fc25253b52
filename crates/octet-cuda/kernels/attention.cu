// Causal grouped-query attention of a Llama training step, flash style
// (forward and backward, never holding a T x T matrix in device memory), in
// three implementations of one contract: SIMT (any even head dim up to 128),
// mma.sync tensor cores (16, 32, 64, 128) and, on sm_90a, warpgroup MMA (64,
// 128). Helpers: model.cuh.

// ---------------------------------------------------------------- attention

// Causal attention with grouped-query heads, flash style: a block holds a
// 64-row tile of queries (or keys) in shared memory and streams the other
// side in 64-row tiles; the forward keeps the per-row log-sum-exp, the
// backward recomputes probabilities from it. 256 threads as a 16 x 16 grid:
// thread (ty, tx) owns tile rows ty + 16 i (i < 4) and columns tx + 16 j.
// Head dim D <= 128 (checked by the host); shared rows are padded to D + 1
// floats so that the 16 threads of a row group read distinct banks.
#define TILE 64
#define MAXC 8 // D / 16 output columns per thread, at most

// q (N, Hq*D), k/v (N, Hkv*D) bf16 -> out (N, Hq*D) bf16, lse (B, Hq, T) f32.
// Grid (T / 64, Hq, B). Shared: Q, K, V tiles and the probabilities.
extern "C" __global__ void __launch_bounds__(256) attn_fwd(const unsigned short* q, const unsigned short* k,
                                                           const unsigned short* v, unsigned short* out,
                                                           float* lse, int T, int Hq, int Hkv, int D,
                                                           float scale) {
    extern __shared__ float sm[];
    const int DP = D + 1;
    float* Qs = sm;
    float* Ks = Qs + TILE * DP;
    float* Vs = Ks + TILE * DP;
    float* Ps = Vs + TILE * DP; // TILE x (TILE + 1)
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int q0 = blockIdx.x * TILE, h = blockIdx.y, b = blockIdx.z;
    const int g = h / (Hq / Hkv);
    const size_t qw = (size_t)Hq * D, kw = (size_t)Hkv * D;
    const unsigned short* qb = q + (size_t)b * T * qw + (size_t)h * D;
    const unsigned short* kb = k + (size_t)b * T * kw + (size_t)g * D;
    const unsigned short* vb = v + (size_t)b * T * kw + (size_t)g * D;
    for (int i = threadIdx.x; i < TILE * D; i += 256) {
        const int r = i / D, c = i % D;
        Qs[r * DP + c] = q0 + r < T ? bf2f(qb[(size_t)(q0 + r) * qw + c]) : 0.f;
    }
    float mrow[4], lrow[4], acc[4][MAXC];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        mrow[i] = -1e30f;
        lrow[i] = 0.f;
#pragma unroll
        for (int c = 0; c < MAXC; c++) acc[i][c] = 0.f;
    }
    const int kend = min(T, q0 + TILE);
    for (int k0 = 0; k0 < kend; k0 += TILE) {
        __syncthreads();
        for (int i = threadIdx.x; i < TILE * D; i += 256) {
            const int r = i / D, c = i % D;
            const bool ok = k0 + r < T;
            Ks[r * DP + c] = ok ? bf2f(kb[(size_t)(k0 + r) * kw + c]) : 0.f;
            Vs[r * DP + c] = ok ? bf2f(vb[(size_t)(k0 + r) * kw + c]) : 0.f;
        }
        __syncthreads();
        float s[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) s[i][j] = 0.f;
        for (int d = 0; d < D; d++) {
            float qa[4], ka[4];
#pragma unroll
            for (int i = 0; i < 4; i++) qa[i] = Qs[(ty + 16 * i) * DP + d];
#pragma unroll
            for (int j = 0; j < 4; j++) ka[j] = Ks[(tx + 16 * j) * DP + d];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) s[i][j] += qa[i] * ka[j];
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int qi = q0 + ty + 16 * i;
            float mx = -1e30f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const int kj = k0 + tx + 16 * j;
                s[i][j] = (kj <= qi && kj < T) ? s[i][j] * scale : -1e30f;
                mx = fmaxf(mx, s[i][j]);
            }
            // The 16 threads of a row are one half-warp.
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float mnew = fmaxf(mrow[i], mx);
            const float alpha = expf(mrow[i] - mnew);
            float rs = 0.f;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float p = s[i][j] <= -1e30f ? 0.f : expf(s[i][j] - mnew);
                Ps[(ty + 16 * i) * (TILE + 1) + tx + 16 * j] = p;
                rs += p;
            }
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) rs += __shfl_xor_sync(0xffffffffu, rs, o);
            lrow[i] = lrow[i] * alpha + rs;
            mrow[i] = mnew;
#pragma unroll
            for (int c = 0; c < MAXC; c++) acc[i][c] *= alpha;
        }
        __syncthreads();
        for (int j = 0; j < TILE; j++) {
            float vv[MAXC];
#pragma unroll
            for (int c = 0; c < MAXC; c++) vv[c] = tx + 16 * c < D ? Vs[j * DP + tx + 16 * c] : 0.f;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float p = Ps[(ty + 16 * i) * (TILE + 1) + j];
#pragma unroll
                for (int c = 0; c < MAXC; c++) acc[i][c] += p * vv[c];
            }
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int qi = q0 + ty + 16 * i;
        if (qi >= T) continue;
        const float inv = 1.f / lrow[i];
        unsigned short* o = out + (size_t)(b * T + qi) * qw + (size_t)h * D;
#pragma unroll
        for (int c = 0; c < MAXC; c++)
            if (tx + 16 * c < D) o[tx + 16 * c] = f2bf(acc[i][c] * inv);
        if (tx == 0) lse[((size_t)b * Hq + h) * T + qi] = mrow[i] + logf(lrow[i]);
    }
}

// delta (B, Hq, T) = sum_d dout * out per query row; one warp per row. dout
// is the o projection's input gradient in bf16, as every backward kernel reads it.
// With `outq` the output is read as E4M3 codes times the one factor `out_si[0]`
// (the o projection's per-tensor FP8 input, saved in FP8 for its backward) and
// `out` is not read.
extern "C" __global__ void attn_delta(const unsigned short* out, const unsigned short* dout, float* delta, int T,
                                      int Hq, int D, int rows,
                                      const unsigned char* outq, const float* out_si) {
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const int lane = threadIdx.x & 31;
    const int h = row % Hq, n = row / Hq; // row = n * Hq + h, n = b * T + t
    const size_t o = (size_t)n * Hq * D + (size_t)h * D;
    float s = 0.f;
    for (int d = lane; d < D; d += 32) {
        const float ov = outq ? e4m3_decode(outq[o + d]) * out_si[0] : bf2f(out[o + d]);
        s += ov * bf2f(dout[o + d]);
    }
#pragma unroll
    for (int w = 16; w > 0; w >>= 1) s += __shfl_xor_sync(0xffffffffu, s, w);
    if (lane == 0) {
        const int b = n / T, t = n % T;
        delta[((size_t)b * Hq + h) * T + t] = s;
    }
}

// dK, dV (N, Hkv*D) f32 for one 64-key tile of kv head g, summed over the
// group's query heads and every query tile at or after the keys (in a fixed
// order: deterministic). Grid (T / 64, Hkv, B).
extern "C" __global__ void __launch_bounds__(256) attn_bwd_dkdv(const unsigned short* q, const unsigned short* k,
                                                                const unsigned short* v, const unsigned short* dout,
                                                                const float* lse, const float* delta, float* dk,
                                                                float* dv, int T, int Hq, int Hkv, int D,
                                                                float scale) {
    extern __shared__ float sm[];
    const int DP = D + 1;
    float* Ks = sm;
    float* Vs = Ks + TILE * DP;
    float* Qs = Vs + TILE * DP;
    float* Os = Qs + TILE * DP; // dout tile
    float* Ps = Os + TILE * DP; // TILE x (TILE + 1), [key][query]
    float* Ss = Ps + TILE * (TILE + 1);
    float* Ls = Ss + TILE * (TILE + 1); // lse of the query tile
    float* Dl = Ls + TILE;              // delta of the query tile
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int k0 = blockIdx.x * TILE, g = blockIdx.y, b = blockIdx.z;
    const int group = Hq / Hkv;
    const size_t qw = (size_t)Hq * D, kw = (size_t)Hkv * D;
    const unsigned short* kb = k + (size_t)b * T * kw + (size_t)g * D;
    const unsigned short* vb = v + (size_t)b * T * kw + (size_t)g * D;
    for (int i = threadIdx.x; i < TILE * D; i += 256) {
        const int r = i / D, c = i % D;
        const bool ok = k0 + r < T;
        Ks[r * DP + c] = ok ? bf2f(kb[(size_t)(k0 + r) * kw + c]) : 0.f;
        Vs[r * DP + c] = ok ? bf2f(vb[(size_t)(k0 + r) * kw + c]) : 0.f;
    }
    float adk[4][MAXC], adv[4][MAXC];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int c = 0; c < MAXC; c++) adk[i][c] = adv[i][c] = 0.f;
    for (int hh = 0; hh < group; hh++) {
        const int h = g * group + hh;
        const unsigned short* qb = q + (size_t)b * T * qw + (size_t)h * D;
        const unsigned short* ob = dout + (size_t)b * T * qw + (size_t)h * D;
        const float* lb = lse + ((size_t)b * Hq + h) * T;
        const float* db = delta + ((size_t)b * Hq + h) * T;
        for (int q0 = k0; q0 < T; q0 += TILE) {
            __syncthreads();
            for (int i = threadIdx.x; i < TILE * D; i += 256) {
                const int r = i / D, c = i % D;
                const bool ok = q0 + r < T;
                Qs[r * DP + c] = ok ? bf2f(qb[(size_t)(q0 + r) * qw + c]) : 0.f;
                Os[r * DP + c] = ok ? bf2f(ob[(size_t)(q0 + r) * qw + c]) : 0.f;
            }
            if (threadIdx.x < TILE) {
                const bool ok = q0 + threadIdx.x < T;
                Ls[threadIdx.x] = ok ? lb[q0 + threadIdx.x] : 0.f;
                Dl[threadIdx.x] = ok ? db[q0 + threadIdx.x] : 0.f;
            }
            __syncthreads();
            // Rows: keys ty + 16 a; columns: queries tx + 16 c.
            float s[4][4], dp[4][4];
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int c = 0; c < 4; c++) s[a][c] = dp[a][c] = 0.f;
            for (int d = 0; d < D; d++) {
                float ka[4], va[4], qa[4], oa[4];
#pragma unroll
                for (int a = 0; a < 4; a++) {
                    ka[a] = Ks[(ty + 16 * a) * DP + d];
                    va[a] = Vs[(ty + 16 * a) * DP + d];
                }
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    qa[c] = Qs[(tx + 16 * c) * DP + d];
                    oa[c] = Os[(tx + 16 * c) * DP + d];
                }
#pragma unroll
                for (int a = 0; a < 4; a++)
#pragma unroll
                    for (int c = 0; c < 4; c++) {
                        s[a][c] += ka[a] * qa[c];
                        dp[a][c] += va[a] * oa[c];
                    }
            }
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    const int kj = k0 + ty + 16 * a, qr = tx + 16 * c, qi = q0 + qr;
                    const bool ok = kj <= qi && qi < T && kj < T;
                    const float p = ok ? expf(s[a][c] * scale - Ls[qr]) : 0.f;
                    Ps[(ty + 16 * a) * (TILE + 1) + qr] = p;
                    Ss[(ty + 16 * a) * (TILE + 1) + qr] = p * (dp[a][c] - Dl[qr]);
                }
            __syncthreads();
            for (int i = 0; i < TILE; i++) {
                float ov[MAXC], qv[MAXC];
#pragma unroll
                for (int c = 0; c < MAXC; c++) {
                    const bool ok = tx + 16 * c < D;
                    ov[c] = ok ? Os[i * DP + tx + 16 * c] : 0.f;
                    qv[c] = ok ? Qs[i * DP + tx + 16 * c] : 0.f;
                }
#pragma unroll
                for (int a = 0; a < 4; a++) {
                    const float p = Ps[(ty + 16 * a) * (TILE + 1) + i];
                    const float ds = Ss[(ty + 16 * a) * (TILE + 1) + i];
#pragma unroll
                    for (int c = 0; c < MAXC; c++) {
                        adv[a][c] += p * ov[c];
                        adk[a][c] += ds * qv[c];
                    }
                }
            }
        }
    }
#pragma unroll
    for (int a = 0; a < 4; a++) {
        const int kj = k0 + ty + 16 * a;
        if (kj >= T) continue;
        const size_t o = (size_t)(b * T + kj) * kw + (size_t)g * D;
#pragma unroll
        for (int c = 0; c < MAXC; c++)
            if (tx + 16 * c < D) {
                dk[o + tx + 16 * c] = adk[a][c] * scale;
                dv[o + tx + 16 * c] = adv[a][c];
            }
    }
}

// dQ (N, Hq*D) f32 for one 64-query tile of head h over the key tiles up to
// the diagonal. Grid (T / 64, Hq, B).
extern "C" __global__ void __launch_bounds__(256) attn_bwd_dq(const unsigned short* q, const unsigned short* k,
                                                              const unsigned short* v, const unsigned short* dout,
                                                              const float* lse, const float* delta, float* dq,
                                                              int T, int Hq, int Hkv, int D, float scale) {
    extern __shared__ float sm[];
    const int DP = D + 1;
    float* Qs = sm;
    float* Os = Qs + TILE * DP;
    float* Ks = Os + TILE * DP;
    float* Vs = Ks + TILE * DP;
    float* Ss = Vs + TILE * DP; // TILE x (TILE + 1), [query][key]
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int q0 = blockIdx.x * TILE, h = blockIdx.y, b = blockIdx.z;
    const int g = h / (Hq / Hkv);
    const size_t qw = (size_t)Hq * D, kw = (size_t)Hkv * D;
    const unsigned short* qb = q + (size_t)b * T * qw + (size_t)h * D;
    const unsigned short* ob = dout + (size_t)b * T * qw + (size_t)h * D;
    const unsigned short* kb = k + (size_t)b * T * kw + (size_t)g * D;
    const unsigned short* vb = v + (size_t)b * T * kw + (size_t)g * D;
    for (int i = threadIdx.x; i < TILE * D; i += 256) {
        const int r = i / D, c = i % D;
        const bool ok = q0 + r < T;
        Qs[r * DP + c] = ok ? bf2f(qb[(size_t)(q0 + r) * qw + c]) : 0.f;
        Os[r * DP + c] = ok ? bf2f(ob[(size_t)(q0 + r) * qw + c]) : 0.f;
    }
    float lrow[4], drow[4], acc[4][MAXC];
#pragma unroll
    for (int a = 0; a < 4; a++) {
        const int qi = q0 + ty + 16 * a;
        lrow[a] = qi < T ? lse[((size_t)b * Hq + h) * T + qi] : 0.f;
        drow[a] = qi < T ? delta[((size_t)b * Hq + h) * T + qi] : 0.f;
#pragma unroll
        for (int c = 0; c < MAXC; c++) acc[a][c] = 0.f;
    }
    const int kend = min(T, q0 + TILE);
    for (int k0 = 0; k0 < kend; k0 += TILE) {
        __syncthreads();
        for (int i = threadIdx.x; i < TILE * D; i += 256) {
            const int r = i / D, c = i % D;
            const bool ok = k0 + r < T;
            Ks[r * DP + c] = ok ? bf2f(kb[(size_t)(k0 + r) * kw + c]) : 0.f;
            Vs[r * DP + c] = ok ? bf2f(vb[(size_t)(k0 + r) * kw + c]) : 0.f;
        }
        __syncthreads();
        float s[4][4], dp[4][4];
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int c = 0; c < 4; c++) s[a][c] = dp[a][c] = 0.f;
        for (int d = 0; d < D; d++) {
            float qa[4], oa[4], ka[4], va[4];
#pragma unroll
            for (int a = 0; a < 4; a++) {
                qa[a] = Qs[(ty + 16 * a) * DP + d];
                oa[a] = Os[(ty + 16 * a) * DP + d];
            }
#pragma unroll
            for (int c = 0; c < 4; c++) {
                ka[c] = Ks[(tx + 16 * c) * DP + d];
                va[c] = Vs[(tx + 16 * c) * DP + d];
            }
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    s[a][c] += qa[a] * ka[c];
                    dp[a][c] += oa[a] * va[c];
                }
        }
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int qi = q0 + ty + 16 * a, kj = k0 + tx + 16 * c;
                const bool ok = kj <= qi && qi < T && kj < T;
                const float p = ok ? expf(s[a][c] * scale - lrow[a]) : 0.f;
                Ss[(ty + 16 * a) * (TILE + 1) + tx + 16 * c] = p * (dp[a][c] - drow[a]);
            }
        __syncthreads();
        for (int j = 0; j < TILE; j++) {
            float kv[MAXC];
#pragma unroll
            for (int c = 0; c < MAXC; c++) kv[c] = tx + 16 * c < D ? Ks[j * DP + tx + 16 * c] : 0.f;
#pragma unroll
            for (int a = 0; a < 4; a++) {
                const float ds = Ss[(ty + 16 * a) * (TILE + 1) + j];
#pragma unroll
                for (int c = 0; c < MAXC; c++) acc[a][c] += ds * kv[c];
            }
        }
    }
#pragma unroll
    for (int a = 0; a < 4; a++) {
        const int qi = q0 + ty + 16 * a;
        if (qi >= T) continue;
        const size_t o = (size_t)(b * T + qi) * qw + (size_t)h * D;
#pragma unroll
        for (int c = 0; c < MAXC; c++)
            if (tx + 16 * c < D) dq[o + tx + 16 * c] = acc[a][c] * scale;
    }
}

// ---------------------------------------------------------------- attention on tensor cores

// The same three attention kernels on bf16 tensor cores (mma.sync m16n8k16,
// f32 accumulation), flash-attention-2 style, for head dims that are a
// multiple of 16 up to 128. A block is 4 warps of 16 rows each (queries in
// the forward and dQ kernels, keys in the dK/dV kernel); tiles are staged in
// shared memory as bf16 (row pitch D + 8 elements: 16-byte aligned rows for
// ldmatrix, and the 8 rows of one ldmatrix fall in distinct banks); the
// probabilities are rounded to bf16 to feed the second product, and the
// backward reads the output gradient as bf16, as flash attention does.
//
// What keeps these kernels fast is the instruction count around the MMAs
// (an earlier version issued 13 instructions per MMA and was issue-bound):
// each thread's staging addresses are computed once per tile and the copy
// loops are unrolled; the causal mask exists only in the instantiation that
// runs on tiles crossing the diagonal or T; the softmax scale is folded into
// one FFMA per score; exponentials are single `ex2.approx.ftz` instructions
// (results below 2^-126 flush to zero, far under bf16's resolution of P).

#define ATTN_W 4
#define ATTN_NT (32 * ATTN_W)
#define ATTN_ROWS (16 * ATTN_W)

__device__ __forceinline__ void mma_bf16(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ldmatrix x4 from a shared-memory address (bytes, the `.shared` window).
__device__ __forceinline__ void ldsm4(unsigned r[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

__device__ __forceinline__ void ldsm4t(unsigned r[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// Two floats -> bf16x2, `lo` in the low half (the lower column).
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Rows [r0, r0 + ROWS) of a bf16 (., ld) matrix, D columns, into shared
// memory `s` (pitch D + 8) by 16-byte asynchronous copies of the block's
// ATTN_NT threads; rows at or past T are zero-filled. Each thread copies one
// 16-byte column chunk of rows r, r + RPP, ...: one address computation, then
// constant strides. The caller commits and waits.
template <int D, int ROWS>
__device__ __forceinline__ void stage_async(unsigned s, const unsigned short* g, size_t ld, int r0, int T) {
    constexpr int P = D + 8, C8 = D / 8, RPP = ATTN_NT / C8, PASSES = (ROWS + RPP - 1) / RPP;
    static_assert(ATTN_NT % C8 == 0, "a pass covers whole rows");
    const int r = threadIdx.x / C8, c = (threadIdx.x % C8) * 8;
    if (ROWS % RPP != 0 && r >= ROWS) return; // more threads than this tile's chunks
    const unsigned short* src = g + (size_t)(r0 + r) * ld + c;
    const unsigned dst = s + 2 * (r * P + c);
    if (r0 + ROWS <= T) {
#pragma unroll
        for (int j = 0; j < PASSES; j++) cp_async16(dst + 2 * j * RPP * P, src + (size_t)j * RPP * ld, 16);
    } else {
#pragma unroll
        for (int j = 0; j < PASSES; j++) {
            const bool ok = r0 + r + j * RPP < T;
            cp_async16(dst + 2 * j * RPP * P, ok ? src + (size_t)j * RPP * ld : g, ok ? 16 : 0);
        }
    }
}

#define LOG2E 1.4426950408889634f
#define NEG_INF __int_as_float(0xff800000u)
#define LN2 0.6931471805599453f

// Columns [16 kc, 16 kc + 16) of a tile in the accumulator (C) layout
// (`p[n-tile][4]`, as mma.sync m16n8 and each warp's part of wgmma write
// it) as the bf16 A fragment of a 16-deep product slice: the layouts agree
// row for row, so each thread packs its own values.
__device__ __forceinline__ void pack_a(const float (*p)[4], int kc, unsigned a[4]) {
    a[0] = pack_bf16(p[2 * kc][0], p[2 * kc][1]);
    a[1] = pack_bf16(p[2 * kc][2], p[2 * kc][3]);
    a[2] = pack_bf16(p[2 * kc + 1][0], p[2 * kc + 1][1]);
    a[3] = pack_bf16(p[2 * kc + 1][2], p[2 * kc + 1][3]);
}

// The forward's epilogue for a thread's two rows `rq` (rows at or past T
// skipped): the row sums reduced over the quad, out = o / l as bf16 at
// `out` (row pitch `ld`; its amax when asked), lse = m c + log2 l in
// natural-log units at `lse` (indexed by row).
template <int D>
__device__ __forceinline__ void fwd_store(const float (*o)[4], const float m[2], float l[2], const int rq[2], int T,
                                          float c, unsigned short* out, size_t ld, float* lse, unsigned* amax,
                                          unsigned* nonfinite) {
    const int tg = threadIdx.x & 3;
    float om = 0.f;
    int bad = 0;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        if (rq[r] >= T) continue;
        const float inv = 1.f / l[r];
        unsigned short* orow = out + (size_t)rq[r] * ld;
#pragma unroll
        for (int dn = 0; dn < D / 8; dn++) {
            const unsigned w = pack_bf16(o[dn][2 * r] * inv, o[dn][2 * r + 1] * inv);
            *reinterpret_cast<unsigned*>(orow + dn * 8 + tg * 2) = w;
            amax_note(w & 0xffff, om, bad);
            amax_note(w >> 16, om, bad);
        }
        if (tg == 0) lse[rq[r]] = (m[r] * c + log2f(l[r])) * LN2;
    }
    if (amax) amax_commit(om, bad, amax, nonfinite);
}

// A thread's two accumulator rows `rr` (C layout, D columns) times `scale`
// as f32 rows of `dst` (pitch `ld`); rows at or past T skipped.
template <int D>
__device__ __forceinline__ void store_rows(const float (*acc)[4], const int rr[2], int T, float scale,
                                           float* dst, size_t ld) {
    const int tg = threadIdx.x & 3;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (rr[r] >= T) continue;
        float* row = dst + (size_t)rr[r] * ld;
#pragma unroll
        for (int dn = 0; dn < D / 8; dn++)
            *reinterpret_cast<float2*>(row + dn * 8 + tg * 2) =
                make_float2(acc[dn][2 * r] * scale, acc[dn][2 * r + 1] * scale);
    }
}

// The fused stores of the wgmma backward kernels, which write what the
// projections' backward reads: bf16, with RoPE's backward applied to dQ and dK
// (the passes `rope_bwd` and `to_bf16` would do the same f32 operations on the
// f32 rows `store_rows` writes, and round the same way). A thread's columns
// 8 dn + 2 tg + {0, 1} hold both halves of a rotated pair (dn and dn + D/16).
// The written values' max |v| and NaN/inf flag accumulate into (m, bad).
// The RoPE angles of position `pos` at a thread's columns: cos and sin of
// pairs 8 dn + 2 tg + {0, 1}, all loads in flight at once (read-only path).
template <int D>
__device__ __forceinline__ void rope_angles(const float* __restrict__ cs, const float* __restrict__ sn, int pos,
                                            float2 cv[D / 16], float2 sv[D / 16]) {
    const int tg = threadIdx.x & 3;
    const float2* c = reinterpret_cast<const float2*>(cs + (size_t)pos * (D / 2)) + tg;
    const float2* s = reinterpret_cast<const float2*>(sn + (size_t)pos * (D / 2)) + tg;
#pragma unroll
    for (int dn = 0; dn < D / 16; dn++) {
        cv[dn] = __ldg(c + dn * 4);
        sv[dn] = __ldg(s + dn * 4);
    }
}

// Accumulator row r (0: rows g, 1: g + 8) of a thread, times `scale`, rotated
// back by the angles `cv`, `sv` of its position, as bf16 into `row`.
template <int D>
__device__ __forceinline__ void store_row_rope(const float (*acc)[4], int r, float scale,
                                               unsigned short* __restrict__ row, const float2 cv[D / 16],
                                               const float2 sv[D / 16], float& m, int& bad) {
    constexpr int HALF = D / 2;
    const int tg = threadIdx.x & 3;
#pragma unroll
    for (int dn = 0; dn < D / 16; dn++) {
        const int i = dn * 8 + tg * 2;
        unsigned short lo0, hi0, lo1, hi1;
        rope_bwd_pair(__fmul_rn(acc[dn][2 * r], scale), __fmul_rn(acc[dn + D / 16][2 * r], scale), cv[dn].x,
                      sv[dn].x, lo0, hi0);
        rope_bwd_pair(__fmul_rn(acc[dn][2 * r + 1], scale), __fmul_rn(acc[dn + D / 16][2 * r + 1], scale),
                      cv[dn].y, sv[dn].y, lo1, hi1);
        *reinterpret_cast<unsigned*>(row + i) = (unsigned)lo0 | ((unsigned)lo1 << 16);
        *reinterpret_cast<unsigned*>(row + i + HALF) = (unsigned)hi0 | ((unsigned)hi1 << 16);
        amax_note(lo0, m, bad);
        amax_note(lo1, m, bad);
        amax_note(hi0, m, bad);
        amax_note(hi1, m, bad);
    }
}

// Both of a thread's rows `rr` (positions; rows at or past T skipped), each
// row's angles loaded just before its stores.
template <int D>
__device__ __forceinline__ void store_rows_rope(const float (*acc)[4], const int rr[2], int T, float scale,
                                                unsigned short* __restrict__ dst, size_t ld,
                                                const float* __restrict__ cs, const float* __restrict__ sn,
                                                float& m, int& bad) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (rr[r] >= T) continue;
        float2 cv[D / 16], sv[D / 16];
        rope_angles<D>(cs, sn, rr[r], cv, sv);
        store_row_rope<D>(acc, r, scale, dst + (size_t)rr[r] * ld, cv, sv, m, bad);
    }
}

// As `store_rows` with scale 1, rounded to bf16 (dV, which has no rotation).
template <int D>
__device__ __forceinline__ void store_rows_bf16(const float (*acc)[4], const int rr[2], int T, unsigned short* dst,
                                                size_t ld, float& m, int& bad) {
    const int tg = threadIdx.x & 3;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (rr[r] >= T) continue;
        unsigned short* row = dst + (size_t)rr[r] * ld;
#pragma unroll
        for (int dn = 0; dn < D / 8; dn++) {
            const unsigned short lo = f2bf(acc[dn][2 * r]), hi = f2bf(acc[dn][2 * r + 1]);
            *reinterpret_cast<unsigned*>(row + dn * 8 + tg * 2) = (unsigned)lo | ((unsigned)hi << 16);
            amax_note(lo, m, bad);
            amax_note(hi, m, bad);
        }
    }
}

// acc[n-tile][4] += A (16 rows from row `arow0` of the tile at shared address
// `as`, k = D) x B^T where B's rows (the n side) are rows `nrow0 ..` of `bs`:
// S = Q K^T and its relatives.
template <int D, int NT>
__device__ __forceinline__ void mma_abt(float acc[NT][4], unsigned as, int arow0, unsigned bs, int nrow0) {
    constexpr int P = D + 8;
    const int lane = threadIdx.x & 31;
    const unsigned a0 = as + 2 * ((arow0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * P + (lane >> 4) * 8);
    const unsigned b0 = bs + 2 * ((nrow0 + (lane >> 4) * 8 + (lane & 7)) * P + ((lane >> 3) & 1) * 8);
#pragma unroll
    for (int kc = 0; kc < D / 16; kc++) {
        unsigned a[4];
        ldsm4(a, a0 + 2 * kc * 16);
#pragma unroll
        for (int np = 0; np < NT / 2; np++) {
            unsigned b[4];
            ldsm4(b, b0 + 2 * (np * 16 * P + kc * 16));
            mma_bf16(acc[2 * np], a, b[0], b[1]);
            mma_bf16(acc[2 * np + 1], a, b[2], b[3]);
        }
    }
}

// acc[d-tile][4] += P (16 x 16*KC, as A fragments from C-layout registers
// `p[n-tile][4]`) x rows `krow0 ..` of `bs` (k side = rows, n side = D columns).
template <int D, int KC>
__device__ __forceinline__ void mma_pb(float acc[D / 8][4], const float p[2 * KC][4], unsigned bs, int krow0) {
    constexpr int P = D + 8;
    const int lane = threadIdx.x & 31;
    const unsigned b0 = bs + 2 * ((krow0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * P + (lane >> 4) * 8);
#pragma unroll
    for (int kc = 0; kc < KC; kc++) {
        unsigned a[4];
        pack_a(p, kc, a);
#pragma unroll
        for (int dp = 0; dp < D / 16; dp++) {
            unsigned b[4];
            ldsm4t(b, b0 + 2 * (kc * 16 * P + dp * 16));
            mma_bf16(acc[2 * dp], a, b[0], b[1]);
            mma_bf16(acc[2 * dp + 1], a, b[2], b[3]);
        }
    }
}

template <bool B> struct Flag {
    static constexpr bool value = B;
};

// The forward's online softmax over one 64-key tile of scores `s` (raw
// Q K^T; the probabilities come back in `s`): running row max `m` (raw
// units), row sum `l`, and the output accumulators rescaled. MASK: the tile
// crosses this warp's diagonal or T.
template <bool MASK, int D>
__device__ __forceinline__ void fwd_softmax(float s[8][4], float o[D / 8][4], float m[2], float l[2], int k0,
                                            const int rq[2], int T, float c) {
    const int tg = threadIdx.x & 3;
    float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = e >> 1;
            if (MASK) {
                const int key = k0 + nt * 8 + tg * 2 + (e & 1);
                if (key > rq[r] || key >= T) s[nt][e] = NEG_INF;
            }
            mx[r] = fmaxf(mx[r], s[nt][e]);
        }
    float mc[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float mn = fmaxf(m[r], mx[r]);
        // A row with nothing valid yet (padding rows past T) keeps m = -inf.
        const float alpha = mn == NEG_INF ? 1.f : ex2((m[r] - mn) * c);
        m[r] = mn;
        mc[r] = mn == NEG_INF ? 0.f : mn * c;
        l[r] *= alpha;
#pragma unroll
        for (int dn = 0; dn < D / 8; dn++) {
            o[dn][2 * r] *= alpha;
            o[dn][2 * r + 1] *= alpha;
        }
    }
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = e >> 1;
            const float p = ex2(fmaf(s[nt][e], c, -mc[r]));
            s[nt][e] = p;
            l[r] += p;
        }
}

// Forward: 4 warps x 16 queries (their Q fragments kept in registers), 64-key
// tiles double-buffered in shared memory by cp.async (the next tile loads
// while this one is multiplied). Grid (T / 64, Hq, B).
template <int D>
__device__ void attn_fwd_tc(const unsigned short* q, const unsigned short* k, const unsigned short* v,
                            unsigned short* out, float* lse, int T, int Hq, int Hkv, float scale, unsigned* amax,
                            unsigned* nonfinite) {
    constexpr int P = D + 8, TS = 64 * P;
    extern __shared__ __align__(16) unsigned short smh[];
    const unsigned sm = smem_addr(smh);
    const unsigned Kb[2] = {sm, sm + 2 * 2 * TS};
    const unsigned Vb[2] = {sm + 2 * TS, sm + 2 * 3 * TS};
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
    // Causal work grows with the query tile: the longest tiles start first.
    const int q0 = (gridDim.x - 1 - blockIdx.x) * ATTN_ROWS, h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / (Hq / Hkv);
    const size_t qw = (size_t)Hq * D, kw = (size_t)Hkv * D;
    const unsigned short* qb = q + (size_t)b * T * qw + (size_t)h * D;
    const unsigned short* kb = k + (size_t)b * T * kw + (size_t)kvh * D;
    const unsigned short* vb = v + (size_t)b * T * kw + (size_t)kvh * D;
    // Q passes through the second stage's K slot into registers.
    stage_async<D, ATTN_ROWS>(Kb[1], qb, qw, q0, T);
    cp_commit();
    cp_wait<0>();
    __syncthreads();
    unsigned qf[D / 16][4];
    {
        const unsigned a0 = Kb[1] + 2 * ((warp * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * P + (lane >> 4) * 8);
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++) ldsm4(qf[kc], a0 + 2 * kc * 16);
    }
    __syncthreads();
    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
    const float c = scale * LOG2E;
    const int rq[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
    const int ntiles = (min(T, q0 + ATTN_ROWS) + 63) / 64;
    stage_async<D, 64>(Kb[0], kb, kw, 0, T);
    stage_async<D, 64>(Vb[0], vb, kw, 0, T);
    cp_commit();
    const unsigned bk = 2 * (((lane >> 4) * 8 + (lane & 7)) * P + ((lane >> 3) & 1) * 8);
    for (int it = 0; it < ntiles; it++) {
        const int k0 = it * 64;
        if (it + 1 < ntiles) {
            stage_async<D, 64>(Kb[(it + 1) & 1], kb, kw, k0 + 64, T);
            stage_async<D, 64>(Vb[(it + 1) & 1], vb, kw, k0 + 64, T);
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        const unsigned ks = Kb[it & 1] + bk;
        float s[8][4];
#pragma unroll
        for (int i = 0; i < 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++)
#pragma unroll
            for (int np = 0; np < 4; np++) {
                unsigned bb[4];
                ldsm4(bb, ks + 2 * (np * 16 * P + kc * 16));
                mma_bf16(s[2 * np], qf[kc], bb[0], bb[1]);
                mma_bf16(s[2 * np + 1], qf[kc], bb[2], bb[3]);
            }
        // Only a tile reaching past this warp's first row, or past T, needs the mask.
        if (k0 + 64 > q0 + warp * 16 || k0 + 64 > T)
            fwd_softmax<true, D>(s, o, m, l, k0, rq, T, c);
        else
            fwd_softmax<false, D>(s, o, m, l, k0, rq, T, c);
        mma_pb<D, 4>(o, s, Vb[it & 1], 0);
        __syncthreads();
    }
    fwd_store<D>(o, m, l, rq, T, c, out + (size_t)b * T * qw + (size_t)h * D, qw,
                 lse + ((size_t)b * Hq + h) * T, amax, nonfinite);
}

// The backward's probabilities and dS of one tile, in place: `s` (raw
// scores) becomes P = exp(s scale - lse) and `dp` (dO V^T) becomes
// dS = P (dP - delta). `l2` / `dl`: lse * log2(e) and delta of the tile's
// 8 NT query columns (dK/dV kernels: columns are queries, rows keys) or of the
// thread's two rows (dQ kernel); MASK zeroes P outside causality and T.
template <bool MASK, bool COLS_ARE_QUERIES, int NT = 4>
__device__ __forceinline__ void bwd_probs(float s[NT][4], float dp[NT][4], const float* l2, const float* dl, int c0,
                                          const int rr[2], int T, float c) {
    const int tg = threadIdx.x & 3;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int cc = nt * 8 + tg * 2 + (e & 1), col = c0 + cc, row = rr[e >> 1];
            const float lv = COLS_ARE_QUERIES ? l2[cc] : l2[e >> 1];
            const float dv = COLS_ARE_QUERIES ? dl[cc] : dl[e >> 1];
            float p = ex2(fmaf(s[nt][e], c, -lv));
            if (MASK) {
                // Causal: key <= query; both inside T.
                const int key = COLS_ARE_QUERIES ? row : col, qi = COLS_ARE_QUERIES ? col : row;
                if (key > qi || qi >= T || key >= T) p = 0.f;
            }
            s[nt][e] = p;
            dp[nt][e] = p * (dp[nt][e] - dv);
        }
}

// The dK/dV kernels' per-query statistics of a ROWS-query tile from q0 (of
// the head whose rows start at `at0`): lse * log2(e) and delta into shared
// `l2`, `dl` by the block's first ROWS threads; queries past T get 0.
template <int ROWS>
__device__ __forceinline__ void stage_stats(float* l2, float* dl, const float* lse, const float* delta, size_t at0,
                                            int q0, int T) {
    if (threadIdx.x < ROWS) {
        const bool ok = q0 + (int)threadIdx.x < T;
        l2[threadIdx.x] = ok ? lse[at0 + q0 + threadIdx.x] * LOG2E : 0.f;
        dl[threadIdx.x] = ok ? delta[at0 + q0 + threadIdx.x] : 0.f;
    }
}

// dK, dV: 4 warps x 16 keys, 32-query tiles from the keys' diagonal on, over
// the group's query heads in order, double-buffered (Q, bf16 dO, lse, delta).
// Grid (T / 64, Hkv, B).
template <int D>
__device__ void attn_dkdv_tc(const unsigned short* q, const unsigned short* k, const unsigned short* v,
                             const unsigned short* dout, const float* lse, const float* delta, float* dk,
                             float* dv, int T, int Hq, int Hkv, float scale) {
    constexpr int P = D + 8, QS = 32 * P;
    extern __shared__ __align__(16) unsigned short smh[];
    const unsigned sm = smem_addr(smh);
    const unsigned Ks = sm, Vs = sm + 2 * ATTN_ROWS * P;
    const unsigned Qb[2] = {Vs + 2 * ATTN_ROWS * P, Vs + 2 * (ATTN_ROWS * P + 2 * QS)};
    const unsigned Ob[2] = {Vs + 2 * (ATTN_ROWS * P + QS), Vs + 2 * (ATTN_ROWS * P + 3 * QS)};
    float* Lb = reinterpret_cast<float*>(smh + 2 * ATTN_ROWS * P + 4 * QS); // [stage][32]: lse * log2(e)
    float* Db = Lb + 64;                                                    // [stage][32]: delta
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
    const int k0 = blockIdx.x * ATTN_ROWS, kvh = blockIdx.y, b = blockIdx.z;
    const int group = Hq / Hkv;
    const size_t qw = (size_t)Hq * D, kw = (size_t)Hkv * D;
    stage_async<D, ATTN_ROWS>(Ks, k + (size_t)b * T * kw + (size_t)kvh * D, kw, k0, T);
    stage_async<D, ATTN_ROWS>(Vs, v + (size_t)b * T * kw + (size_t)kvh * D, kw, k0, T);
    const int nq = (T - k0 + 31) / 32, total = group * nq;
    // Work item j = (query head kvh * group + j / nq, query tile j % nq),
    // walked with counters (no division per item).
    int ih = 0, iq = 0; // the next item to issue
    auto issue = [&](int st) {
        const int h = kvh * group + ih, q0 = k0 + iq * 32;
        stage_async<D, 32>(Qb[st], q + (size_t)b * T * qw + (size_t)h * D, qw, q0, T);
        stage_async<D, 32>(Ob[st], dout + (size_t)b * T * qw + (size_t)h * D, qw, q0, T);
        stage_stats<32>(Lb + st * 32, Db + st * 32, lse, delta, ((size_t)b * Hq + h) * T, q0, T);
        cp_commit();
        if (++iq == nq) {
            iq = 0;
            ih++;
        }
    };
    issue(0);
    float adk[D / 8][4], adv[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) adk[i][e] = adv[i][e] = 0.f;
    const float c = scale * LOG2E;
    const int rk[2] = {k0 + warp * 16 + g, k0 + warp * 16 + g + 8};
    int cq = 0; // the current item's query tile
    for (int j = 0; j < total; j++) {
        const int st = j & 1, q0 = k0 + cq * 32;
        if (++cq == nq) cq = 0;
        if (j + 1 < total) {
            issue(st ^ 1);
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        const unsigned Qs = Qb[st], Os = Ob[st];
        const float* Ls = Lb + st * 32;
        const float* Dl = Db + st * 32;
        // Rows: this warp's keys; columns: the 32 queries.
        float s[4][4], dp[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[i][e] = dp[i][e] = 0.f;
        mma_abt<D, 4>(s, Ks, warp * 16, Qs, 0);
        mma_abt<D, 4>(dp, Vs, warp * 16, Os, 0);
        if (q0 < k0 + warp * 16 + 16 || q0 + 32 > T)
            bwd_probs<true, true>(s, dp, Ls, Dl, q0, rk, T, c);
        else
            bwd_probs<false, true>(s, dp, Ls, Dl, q0, rk, T, c);
        mma_pb<D, 2>(adv, s, Os, 0);
        mma_pb<D, 2>(adk, dp, Qs, 0);
        __syncthreads();
    }
    const size_t o = (size_t)b * T * kw + (size_t)kvh * D;
    store_rows<D>(adk, rk, T, scale, dk + o, kw);
    store_rows<D>(adv, rk, T, 1.f, dv + o, kw);
}

// dQ: 4 warps x 16 queries, 32-key tiles up to the diagonal, double-buffered.
// Grid (T / 64, Hq, B).
template <int D>
__device__ void attn_dq_tc(const unsigned short* q, const unsigned short* k, const unsigned short* v,
                           const unsigned short* dout, const float* lse, const float* delta, float* dq, int T,
                           int Hq, int Hkv, float scale) {
    constexpr int P = D + 8, KS = 32 * P;
    extern __shared__ __align__(16) unsigned short smh[];
    const unsigned sm = smem_addr(smh);
    const unsigned Qs = sm, Os = sm + 2 * ATTN_ROWS * P;
    const unsigned Kb[2] = {Os + 2 * ATTN_ROWS * P, Os + 2 * (ATTN_ROWS * P + 2 * KS)};
    const unsigned Vb[2] = {Os + 2 * (ATTN_ROWS * P + KS), Os + 2 * (ATTN_ROWS * P + 3 * KS)};
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
    // Causal work grows with the query tile: the longest tiles start first.
    const int q0 = (gridDim.x - 1 - blockIdx.x) * ATTN_ROWS, h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / (Hq / Hkv);
    const size_t qw = (size_t)Hq * D, kw = (size_t)Hkv * D;
    const unsigned short* kb = k + (size_t)b * T * kw + (size_t)kvh * D;
    const unsigned short* vb = v + (size_t)b * T * kw + (size_t)kvh * D;
    stage_async<D, ATTN_ROWS>(Qs, q + (size_t)b * T * qw + (size_t)h * D, qw, q0, T);
    stage_async<D, ATTN_ROWS>(Os, dout + (size_t)b * T * qw + (size_t)h * D, qw, q0, T);
    stage_async<D, 32>(Kb[0], kb, kw, 0, T);
    stage_async<D, 32>(Vb[0], vb, kw, 0, T);
    cp_commit();
    const int rq[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
    float l2[2], dl[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const bool ok = rq[r] < T;
        l2[r] = ok ? lse[((size_t)b * Hq + h) * T + rq[r]] * LOG2E : 0.f;
        dl[r] = ok ? delta[((size_t)b * Hq + h) * T + rq[r]] : 0.f;
    }
    float acc[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    const float c = scale * LOG2E;
    const int ntiles = (min(T, q0 + ATTN_ROWS) + 31) / 32;
    for (int it = 0; it < ntiles; it++) {
        const int k0 = it * 32;
        if (it + 1 < ntiles) {
            stage_async<D, 32>(Kb[(it + 1) & 1], kb, kw, k0 + 32, T);
            stage_async<D, 32>(Vb[(it + 1) & 1], vb, kw, k0 + 32, T);
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        const unsigned Ks = Kb[it & 1];
        float s[4][4], dp[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[i][e] = dp[i][e] = 0.f;
        mma_abt<D, 4>(s, Qs, warp * 16, Ks, 0);
        mma_abt<D, 4>(dp, Os, warp * 16, Vb[it & 1], 0);
        if (k0 + 32 > q0 + warp * 16 || k0 + 32 > T)
            bwd_probs<true, false>(s, dp, l2, dl, k0, rq, T, c);
        else
            bwd_probs<false, false>(s, dp, l2, dl, k0, rq, T, c);
        mma_pb<D, 2>(acc, dp, Ks, 0);
        __syncthreads();
    }
    store_rows<D>(acc, rq, T, scale, dq + (size_t)b * T * qw + (size_t)h * D, qw);
}

#define ATTN_ALL(D)                                                                                             \
    extern "C" __global__ void __launch_bounds__(ATTN_NT, 3) attn_fwd_tc##D(                                       \
        const unsigned short* q, const unsigned short* k, const unsigned short* v, unsigned short* out,          \
        float* lse, int T, int Hq, int Hkv, int d, float scale, unsigned* amax, unsigned* nonfinite) {           \
        attn_fwd_tc<D>(q, k, v, out, lse, T, Hq, Hkv, scale, amax, nonfinite);                                  \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(ATTN_NT) attn_dkdv_tc##D(                                      \
        const unsigned short* q, const unsigned short* k, const unsigned short* v, const unsigned short* dout,   \
        const float* lse, const float* delta, float* dk, float* dv, int T, int Hq, int Hkv, int d, float scale) { \
        attn_dkdv_tc<D>(q, k, v, dout, lse, delta, dk, dv, T, Hq, Hkv, scale);                                   \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(ATTN_NT, 3) attn_dq_tc##D(                                        \
        const unsigned short* q, const unsigned short* k, const unsigned short* v, const unsigned short* dout,   \
        const float* lse, const float* delta, float* dq, int T, int Hq, int Hkv, int d, float scale) {           \
        attn_dq_tc<D>(q, k, v, dout, lse, delta, dq, T, Hq, Hkv, scale);                                         \
    }

ATTN_ALL(16)
ATTN_ALL(32)
ATTN_ALL(64)
ATTN_ALL(128)

// ---------------------------------------------------------------- attention forward on Hopper's wgmma

// The forward on sm_90a's warpgroup MMA (wgmma): a block is two warpgroups
// (256 threads), each owning 64 query rows, so a block covers 128 queries;
// 64-key tiles of K and V are double-buffered in shared memory by cp.async.
// Per tile and warpgroup, S = Q K^T is D/16 wgmma instructions (m64n64k16,
// Q and K read from shared memory) and O += P V is 4 (m64nDk16, P from
// registers, V from shared memory); the online softmax between them is the
// same code as the mma.sync kernel's, because wgmma's accumulator layout per
// warp is mma.sync's m16n8 layout repeated along n.
//
// Shared tiles use wgmma's 128-byte-swizzled layout (the no-swizzle layout
// measured 0.8x of the mma.sync kernel: its core matrices along the
// reduction dim sit 128 bytes apart, in the same banks). A tile of ROWS rows
// and D columns (D a multiple of 64) is D / 64 column blocks of ROWS x 128
// bytes; in a block, row r is 128 bytes at r * 128 whose eight 16-byte
// chunks are permuted by chunk ^ (r % 8). So element (r, c) is at byte
//     (c / 64) * 128 ROWS + r * 128 + (((c % 64) / 8) ^ (r % 8)) * 16 + (c % 8) * 2.
// Read as a K-major operand (Q, K: rows are M or N, columns the reduction
// dim), 8-row groups are 1024 bytes apart (the descriptor's stride offset)
// and a 16-column slice starts 32 bytes further per slice inside a column
// block. V is read as an MN-major B operand (transpose bit: its D columns
// are N, its rows the reduction dim): 8-row groups are again 1024 bytes apart
// (stride offset) and the 64-column blocks 128 ROWS bytes (leading offset).
// Block bases are 1024-byte aligned, as the swizzle pattern requires.

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Where the wgmma backward kernels write when `x` is not null (`BwdStore` in
// model.rs, same layout): bf16 gradients in the projections' layout, dQ or dK
// rotated back by RoPE (tables `cs`, `sn` of (T, D/2)) into `x`, dV into `y`,
// the amax and NaN/inf flag of `x` (of `y`: `amax2`) when not null. When `x`
// is null they write f32 dQ, or dK and dV, unrotated.
struct BwdStore {
    unsigned short* x;
    unsigned short* y;
    const float* cs;
    const float* sn;
    unsigned* amax;
    unsigned* nonfinite;
    unsigned* amax2;
    unsigned* nonfinite2;
};

#define WG_THREADS 256
#define WG_ROWS 128

// d (64 x 64 f32, accumulator layout) (+)= A (64 x 16) B^T (B: 64 x 16), both
// in shared memory, K-major; `acc` = 0 overwrites d (a product's first slice).
__device__ __forceinline__ void wgmma_ss_n64(float d[8][4], unsigned long long da, unsigned long long db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                   "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
                   "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                   "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
                 : "l"(da), "l"(db), "r"(acc));
}

// d (64 x 64 f32) += A (64 x 16 bf16, registers in the A-fragment layout) B
// (16 x 64, shared memory, MN-major: the 64 columns contiguous); `acc` as above.
__device__ __forceinline__ void wgmma_rs_n64(float d[8][4], const unsigned a[4], unsigned long long db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
                 "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                   "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
                   "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                   "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}

// d (64 x 128 f32) += A (64 x 16 bf16, registers in the A-fragment layout) B
// (16 x 128, shared memory, MN-major: the 128 columns contiguous); `acc` as above.
__device__ __forceinline__ void wgmma_rs_n128(float d[16][4], const unsigned a[4], unsigned long long db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                   "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
                   "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                   "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
                   "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
                   "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
                   "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
                   "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}


// Copies of the forward's tiles by the TMA unit: the maps see q, k, v as 3-D
// (H D columns, T rows, B batches), so rows at or past T read as zeros; a
// 64-column box lands as one column block of the swizzled layout.
template <int D, int ROWS>
__device__ __forceinline__ void tma_tile(unsigned dst, const TmaMap* map, int col0, int r0, int b, unsigned bar) {
#pragma unroll
    for (int cb = 0; cb < D / 64; cb++) tma_load_3d(dst + cb * ROWS * 128, map, col0 + cb * 64, r0, b, bar);
}

template <int D>
__device__ void attn_fwd_wg(const unsigned short* q, const unsigned short* k, const unsigned short* v,
                            unsigned short* out, float* lse, int T, int Hq, int Hkv, float scale, unsigned* amax,
                            unsigned* nonfinite, const TmaMap* qmap, const TmaMap* kmap, const TmaMap* vmap) {
    constexpr int TB = 64 * D * 2; // bytes of one 64-row tile
    extern __shared__ __align__(1024) unsigned short smh[];
    const unsigned sm = (smem_addr(smh) + 1023) & ~1023u; // the launch adds 1 KiB of slack
    const unsigned Qs = sm;
    // Stage i of K at Kb(i), of V at Kb(i) + TB (arithmetic, not an array:
    // an indexed array of addresses would live on the stack).
    auto Kb = [&](int i) { return sm + (2 + 2 * i) * TB; };
    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2;
    // Causal work grows with the query tile: the longest tiles start first.
    const int q0 = (gridDim.x - 1 - blockIdx.x) * WG_ROWS, h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / (Hq / Hkv);
    const size_t qw = (size_t)Hq * D;
    // Tile it's K and V (and Q, with tile 0) arrive on barrier it % 2; one
    // thread issues the copies.
    const unsigned bars = sm + 6 * TB;
    mbar_setup<2>(bars);
    if (threadIdx.x == 0) {
        mbar_expect_tx(bars, 4 * TB);
        tma_tile<D, WG_ROWS>(Qs, qmap, h * D, q0, b, bars);
        tma_tile<D, 64>(Kb(0), kmap, kvh * D, 0, b, bars);
        tma_tile<D, 64>(Kb(0) + TB, vmap, kvh * D, 0, b, bars);
    }
    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
    const float c = scale * LOG2E;
    const int w0 = q0 + wg * 64; // this warpgroup's first query
    const int rq[2] = {w0 + warp * 16 + g, w0 + warp * 16 + g + 8};
    const int ntiles = (min(T, q0 + WG_ROWS) + 63) / 64;
    const unsigned qa = Qs + wg * 64 * 128; // the warpgroup's 64 rows of each column block
    for (int it = 0; it < ntiles; it++) {
        const int k0 = it * 64;
        // The next tile goes into the buffers the previous one used (every
        // thread is past them: the barrier closing the last iteration).
        if (threadIdx.x == 0 && it + 1 < ntiles) {
            const unsigned bar = bars + 8 * ((it + 1) & 1);
            mbar_expect_tx(bar, 2 * TB);
            tma_tile<D, 64>(Kb((it + 1) & 1), kmap, kvh * D, k0 + 64, b, bar);
            tma_tile<D, 64>(Kb((it + 1) & 1) + TB, vmap, kvh * D, k0 + 64, b, bar);
        }
        mbar_wait(bars + 8 * (it & 1), (it >> 1) & 1);
        // Both warpgroups run every tile, also the last one that lies wholly
        // above warpgroup 0's diagonal (its probabilities come out 0): a
        // branch around wgmma would make ptxas serialize the instructions.
        {
            float s[8][4];
            wg_fence();
#pragma unroll
            for (int kc = 0; kc < D / 16; kc++)
                wgmma_ss_n64(s, wg_desc(qa + (kc >> 2) * (WG_ROWS * 128) + (kc & 3) * 32, 16, 1024),
                             wg_desc(Kb(it & 1) + (kc >> 2) * (64 * 128) + (kc & 3) * 32, 16, 1024), kc);
            wg_commit();
            wg_wait0();
            wg_hold(s);
            // The mask test is per block, not per warpgroup: o, which both
            // paths rescale, feeds the next wgmma, and ptxas serializes
            // wgmma after a divergent definition of its accumulators.
            if (k0 + 64 > q0 || k0 + 64 > T)
                fwd_softmax<true, D>(s, o, m, l, k0, rq, T, c);
            else
                fwd_softmax<false, D>(s, o, m, l, k0, rq, T, c);
            // P as bf16 A fragments, all packed before the first wgmma reads
            // them (registers written between wgmmas cost a warpgroup sync).
            unsigned a[4][4];
#pragma unroll
            for (int kc = 0; kc < 4; kc++) pack_a(s, kc, a[kc]);
            wg_fence();
#pragma unroll
            for (int kc = 0; kc < 4; kc++) {
                const unsigned long long dv = wg_desc((Kb(it & 1) + TB) + kc * 16 * 128, 64 * 128, 1024);
                if constexpr (D == 128)
                    wgmma_rs_n128(o, a[kc], dv, 1);
                else
                    wgmma_rs_n64(o, a[kc], dv, 1);
            }
            wg_commit();
            wg_wait0();
            wg_hold(o);
        }
        __syncthreads();
    }
    fwd_store<D>(o, m, l, rq, T, c, out + (size_t)b * T * qw + (size_t)h * D, qw,
                 lse + ((size_t)b * Hq + h) * T, amax, nonfinite);
}


// The backward on wgmma, deterministic like the mma.sync kernels (dK, dV and
// dQ each summed by one thread in a fixed order; no atomics), same
// probabilities and bf16 rounding of P, dS and dO as they.
//
// dK, dV: two warpgroups of 64 keys (128 keys a block) walk 64-query tiles
// from the block's diagonal on, over the group's query heads; per tile and
// warpgroup S^T = K Q^T and dP^T = V dO^T (K, V, Q and dO from shared
// memory), P^T and dS^T in registers, then dV += P^T dO and dK += dS^T Q
// with P^T, dS^T as register A operands and dO, Q as MN-major B operands.
// Grid (T / 128, Hkv, B); shared: K, V (128 rows), two stages of Q, dO (64
// rows) and of the tile's lse * log2(e) and delta.
template <int D, int NWG>
__device__ void attn_dkdv_wg(const unsigned short* q, const unsigned short* k, const unsigned short* v,
                             const unsigned short* dout, const float* lse, const float* delta, float* dk,
                             float* dv, const BwdStore& fused, int T, int Hq, int Hkv, float scale,
                             const TmaMap* qmap, const TmaMap* kmap, const TmaMap* vmap, const TmaMap* omap) {
    constexpr int TB = 64 * D * 2;
    extern __shared__ __align__(1024) unsigned short smh[];
    const unsigned base = smem_addr(smh), sm = (base + 1023) & ~1023u;
    constexpr int ROWS = 64 * NWG, NT = 128 * NWG;
    const unsigned Ks = sm, Vs = sm + NWG * TB;
    // Stage i's Q and dO tiles (arithmetic: an indexed array would live on the stack).
    auto Qb = [&](int i) { return sm + (2 * NWG + 2 * i) * TB; };
    auto Ob = [&](int i) { return sm + (2 * NWG + 2 * i + 1) * TB; };
    float* Lb = reinterpret_cast<float*>(reinterpret_cast<char*>(smh) + (sm - base) + (2 * NWG + 4) * TB);
    float* Db = Lb + 128;                                                                      // [stage][64]
    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2;
    const int k0 = blockIdx.x * ROWS, kvh = blockIdx.y, b = blockIdx.z;
    const int group = Hq / Hkv;
    const size_t kw = (size_t)Hkv * D;
    // Q and dO tiles (and K, V with the first) arrive by TMA on barrier
    // st of their stage; lse and delta are plain loads, published by the
    // barrier that follows.
    const unsigned bars = sm + (2 * NWG + 4) * TB + 1024;
    mbar_setup<2>(bars);
    const int nq = (T - k0 + 63) / 64, total = group * nq;
    int ih = 0, iq = 0; // the next item to issue: query head kvh * group + ih, tile iq
    // One arrival per phase: the first stage's expectation covers K and V too.
    auto issue = [&](int st) {
        const int h = kvh * group + ih, q0 = k0 + iq * 64;
        if (threadIdx.x == 0) {
            const bool first = ih == 0 && iq == 0;
            mbar_expect_tx(bars + 8 * st, 2 * TB + (first ? 2 * NWG * TB : 0));
            if (first) {
                tma_tile<D, ROWS>(Ks, kmap, kvh * D, k0, b, bars);
                tma_tile<D, ROWS>(Vs, vmap, kvh * D, k0, b, bars);
            }
            tma_tile<D, 64>(Qb(st), qmap, h * D, q0, b, bars + 8 * st);
            tma_tile<D, 64>(Ob(st), omap, h * D, q0, b, bars + 8 * st);
        }
        stage_stats<64>(Lb + st * 64, Db + st * 64, lse, delta, ((size_t)b * Hq + h) * T, q0, T);
        if (++iq == nq) {
            iq = 0;
            ih++;
        }
    };
    issue(0);
    float adk[D / 8][4], adv[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) adk[i][e] = adv[i][e] = 0.f;
    const float c = scale * LOG2E;
    const int rk[2] = {k0 + wg * 64 + warp * 16 + g, k0 + wg * 64 + warp * 16 + g + 8};
    const unsigned ka = Ks + wg * 64 * 128, va = Vs + wg * 64 * 128; // this warpgroup's 64 keys
    int cq = 0;
    for (int j = 0; j < total; j++) {
        const int st = j & 1, q0 = k0 + cq * 64;
        if (++cq == nq) cq = 0;
        if (j + 1 < total) issue(st ^ 1);
        mbar_wait(bars + 8 * st, (j >> 1) & 1);
        __syncthreads();
        float s[8][4], dp[8][4];
        wg_fence();
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++)
            wgmma_ss_n64(s, wg_desc(ka + (kc >> 2) * (ROWS * 128) + (kc & 3) * 32, 16, 1024),
                         wg_desc(Qb(st) + (kc >> 2) * (64 * 128) + (kc & 3) * 32, 16, 1024), kc);
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++)
            wgmma_ss_n64(dp, wg_desc(va + (kc >> 2) * (ROWS * 128) + (kc & 3) * 32, 16, 1024),
                         wg_desc(Ob(st) + (kc >> 2) * (64 * 128) + (kc & 3) * 32, 16, 1024), kc);
        wg_commit();
        wg_wait0();
        wg_hold(s);
        wg_hold(dp);
        // Block-uniform mask test (see the forward): tiles crossing the
        // block's diagonal, or T.
        if (q0 < k0 + ROWS || q0 + 64 > T)
            bwd_probs<true, true, 8>(s, dp, Lb + st * 64, Db + st * 64, q0, rk, T, c);
        else
            bwd_probs<false, true, 8>(s, dp, Lb + st * 64, Db + st * 64, q0, rk, T, c);
        unsigned ap[4][4], ad[4][4];
#pragma unroll
        for (int kc = 0; kc < 4; kc++) {
            pack_a(s, kc, ap[kc]);
            pack_a(dp, kc, ad[kc]);
        }
        wg_fence();
#pragma unroll
        for (int kc = 0; kc < 4; kc++) {
            const unsigned long long dob = wg_desc(Ob(st) + kc * 16 * 128, 64 * 128, 1024);
            if constexpr (D == 128)
                wgmma_rs_n128(adv, ap[kc], dob, 1);
            else
                wgmma_rs_n64(adv, ap[kc], dob, 1);
        }
#pragma unroll
        for (int kc = 0; kc < 4; kc++) {
            const unsigned long long qb = wg_desc(Qb(st) + kc * 16 * 128, 64 * 128, 1024);
            if constexpr (D == 128)
                wgmma_rs_n128(adk, ad[kc], qb, 1);
            else
                wgmma_rs_n64(adk, ad[kc], qb, 1);
        }
        wg_commit();
        wg_wait0();
        wg_hold(adv);
        wg_hold(adk);
        __syncthreads();
    }
    const size_t o = (size_t)b * T * kw + (size_t)kvh * D;
    if (fused.x) {
        float m = 0.f;
        int bad = 0;
        store_rows_rope<D>(adk, rk, T, scale, fused.x + o, kw, fused.cs, fused.sn, m, bad);
        if (fused.amax) amax_commit(m, bad, fused.amax, fused.nonfinite);
        m = 0.f;
        bad = 0;
        store_rows_bf16<D>(adv, rk, T, fused.y + o, kw, m, bad);
        if (fused.amax2) amax_commit(m, bad, fused.amax2, fused.nonfinite2);
    } else {
        store_rows<D>(adk, rk, T, scale, dk + o, kw);
        store_rows<D>(adv, rk, T, 1.f, dv + o, kw);
    }
}

// dQ: two warpgroups of 64 queries (128 a block) walk 64-key tiles up to
// the diagonal: S = Q K^T and dP = dO V^T from shared memory, dS in
// registers, dQ += dS K with K as an MN-major B operand. Grid (T / 128, Hq,
// B); shared: Q, dO (128 rows), two stages of K, V (64 rows).
template <int D, int NWG>
__device__ void attn_dq_wg(const unsigned short* q, const unsigned short* k, const unsigned short* v,
                           const unsigned short* dout, const float* lse, const float* delta, float* dq,
                           const BwdStore& fused, int T, int Hq, int Hkv, float scale, const TmaMap* qmap,
                           const TmaMap* kmap, const TmaMap* vmap, const TmaMap* omap) {
    constexpr int TB = 64 * D * 2;
    extern __shared__ __align__(1024) unsigned short smh[];
    const unsigned sm = (smem_addr(smh) + 1023) & ~1023u;
    constexpr int ROWS = 64 * NWG, NT = 128 * NWG;
    const unsigned Qs = sm, Os = sm + NWG * TB;
    // Stage i's K and V tiles (arithmetic: an indexed array would live on the stack).
    auto Kb = [&](int i) { return sm + (2 * NWG + 2 * i) * TB; };
    auto Vb = [&](int i) { return sm + (2 * NWG + 2 * i + 1) * TB; };
    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * ROWS, h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / (Hq / Hkv);
    const size_t qw = (size_t)Hq * D;
    // K and V tiles (and Q, dO with the first) arrive by TMA on barrier it % 2.
    const unsigned bars = sm + (2 * NWG + 4) * TB;
    mbar_setup<2>(bars);
    if (threadIdx.x == 0) {
        mbar_expect_tx(bars, (2 * NWG + 2) * TB);
        tma_tile<D, ROWS>(Qs, qmap, h * D, q0, b, bars);
        tma_tile<D, ROWS>(Os, omap, h * D, q0, b, bars);
        tma_tile<D, 64>(Kb(0), kmap, kvh * D, 0, b, bars);
        tma_tile<D, 64>(Vb(0), vmap, kvh * D, 0, b, bars);
    }
    const int rq[2] = {q0 + wg * 64 + warp * 16 + g, q0 + wg * 64 + warp * 16 + g + 8};
    float l2[2], dl[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const bool ok = rq[r] < T;
        l2[r] = ok ? lse[((size_t)b * Hq + h) * T + rq[r]] * LOG2E : 0.f;
        dl[r] = ok ? delta[((size_t)b * Hq + h) * T + rq[r]] : 0.f;
    }
    float acc[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    // The fused store's RoPE angles of both rows, loaded now so that their
    // latency hides behind the main loop (64 registers at D = 128; the
    // kernel has room, dK/dV has not).
    float2 ang_c[2][D / 16], ang_s[2][D / 16];
    if (fused.x)
#pragma unroll
        for (int r = 0; r < 2; r++)
            if (rq[r] < T) rope_angles<D>(fused.cs, fused.sn, rq[r], ang_c[r], ang_s[r]);
    const float c = scale * LOG2E;
    const unsigned qa = Qs + wg * 64 * 128, oa = Os + wg * 64 * 128;
    const int ntiles = (min(T, q0 + ROWS) + 63) / 64;
    for (int it = 0; it < ntiles; it++) {
        const int k0 = it * 64;
        // Into the buffers of the previous tile (all threads passed the
        // barrier that closed it).
        if (threadIdx.x == 0 && it + 1 < ntiles) {
            const unsigned bar = bars + 8 * ((it + 1) & 1);
            mbar_expect_tx(bar, 2 * TB);
            tma_tile<D, 64>(Kb((it + 1) & 1), kmap, kvh * D, k0 + 64, b, bar);
            tma_tile<D, 64>(Vb((it + 1) & 1), vmap, kvh * D, k0 + 64, b, bar);
        }
        mbar_wait(bars + 8 * (it & 1), (it >> 1) & 1);
        const unsigned kt = Kb(it & 1), vt = Vb(it & 1);
        float s[8][4], dp[8][4];
        wg_fence();
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++)
            wgmma_ss_n64(s, wg_desc(qa + (kc >> 2) * (ROWS * 128) + (kc & 3) * 32, 16, 1024),
                         wg_desc(kt + (kc >> 2) * (64 * 128) + (kc & 3) * 32, 16, 1024), kc);
#pragma unroll
        for (int kc = 0; kc < D / 16; kc++)
            wgmma_ss_n64(dp, wg_desc(oa + (kc >> 2) * (ROWS * 128) + (kc & 3) * 32, 16, 1024),
                         wg_desc(vt + (kc >> 2) * (64 * 128) + (kc & 3) * 32, 16, 1024), kc);
        wg_commit();
        wg_wait0();
        wg_hold(s);
        wg_hold(dp);
        if (k0 + 64 > q0 || k0 + 64 > T)
            bwd_probs<true, false, 8>(s, dp, l2, dl, k0, rq, T, c);
        else
            bwd_probs<false, false, 8>(s, dp, l2, dl, k0, rq, T, c);
        unsigned ad[4][4];
#pragma unroll
        for (int kc = 0; kc < 4; kc++) pack_a(dp, kc, ad[kc]);
        wg_fence();
#pragma unroll
        for (int kc = 0; kc < 4; kc++) {
            const unsigned long long kd = wg_desc(kt + kc * 16 * 128, 64 * 128, 1024);
            if constexpr (D == 128)
                wgmma_rs_n128(acc, ad[kc], kd, 1);
            else
                wgmma_rs_n64(acc, ad[kc], kd, 1);
        }
        wg_commit();
        wg_wait0();
        wg_hold(acc);
        __syncthreads();
    }
    const size_t o = (size_t)b * T * qw + (size_t)h * D;
    if (fused.x) {
        float m = 0.f;
        int bad = 0;
#pragma unroll
        for (int r = 0; r < 2; r++)
            if (rq[r] < T) store_row_rope<D>(acc, r, scale, fused.x + o + (size_t)rq[r] * qw, ang_c[r], ang_s[r], m, bad);
        if (fused.amax) amax_commit(m, bad, fused.amax, fused.nonfinite);
    } else {
        store_rows<D>(acc, rq, T, scale, dq + o, qw);
    }
}

// The backward kernels with NWG warpgroups a block (64 NWG rows). One is
// instantiated: it leaves two independent blocks on an SM, out of step with
// each other, and measured 1.07x two warpgroups sharing each staged tile
// (H100, 4x2048x16x128).
#define ATTN_WG_BWD(D, NWG)                                                                                     \
    extern "C" __global__ void __launch_bounds__(128 * NWG, 2 / NWG) attn_dkdv_wg##D##_##NWG(                    \
        const unsigned short* q, const unsigned short* k, const unsigned short* v, const unsigned short* dout,   \
        const float* lse, const float* delta, float* dk, float* dv, const __grid_constant__ BwdStore fused,       \
        int T, int Hq, int Hkv, int d, float scale, const __grid_constant__ TmaMap qmap,                        \
        const __grid_constant__ TmaMap kmap, const __grid_constant__ TmaMap vmap,                               \
        const __grid_constant__ TmaMap omap) {                                                                  \
        attn_dkdv_wg<D, NWG>(q, k, v, dout, lse, delta, dk, dv, fused, T, Hq, Hkv, scale, &qmap, &kmap, &vmap,   \
                             &omap);                                                                            \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(128 * NWG, 2 / NWG) attn_dq_wg##D##_##NWG(                      \
        const unsigned short* q, const unsigned short* k, const unsigned short* v, const unsigned short* dout,   \
        const float* lse, const float* delta, float* dq, const __grid_constant__ BwdStore fused, int T, int Hq,   \
        int Hkv, int d, float scale, const __grid_constant__ TmaMap qmap, const __grid_constant__ TmaMap kmap,  \
        const __grid_constant__ TmaMap vmap, const __grid_constant__ TmaMap omap) {                             \
        attn_dq_wg<D, NWG>(q, k, v, dout, lse, delta, dq, fused, T, Hq, Hkv, scale, &qmap, &kmap, &vmap, &omap); \
    }

#define ATTN_WG(D)                                                                                              \
    extern "C" __global__ void __launch_bounds__(WG_THREADS, 2) attn_fwd_wg##D(                                  \
        const unsigned short* q, const unsigned short* k, const unsigned short* v, unsigned short* out,          \
        float* lse, int T, int Hq, int Hkv, int d, float scale, unsigned* amax, unsigned* nonfinite,            \
        const __grid_constant__ TmaMap qmap, const __grid_constant__ TmaMap kmap,                               \
        const __grid_constant__ TmaMap vmap) {                                                                  \
        attn_fwd_wg<D>(q, k, v, out, lse, T, Hq, Hkv, scale, amax, nonfinite, &qmap, &kmap, &vmap);             \
    }                                                                                                            \
    ATTN_WG_BWD(D, 1)

ATTN_WG(64)
ATTN_WG(128)

#endif // __CUDA_ARCH_FEAT_SM90_ALL
