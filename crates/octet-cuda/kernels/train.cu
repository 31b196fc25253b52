// Kernels of a Llama training step on the GPU (`model.rs`): the glue between
// the matrix products of `GpuLinear` (embedding, RMSNorm, RoPE, SwiGLU,
// residual adds, cross-entropy), flash-style causal attention (forward and
// backward, never holding a T x T matrix in device memory), and AdamW.
//
// Layouts: activations are row-major `(N, width)` with `N = B * T` rows
// (token `t` of sequence `b` is row `b * T + t`); attention heads are
// contiguous `D`-wide slices of a row. The residual stream and every gradient
// that flows through it are f32; inputs of the matrix products are bf16.

__device__ __forceinline__ unsigned short f2bf(float v) {
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(v));
    return r;
}
__device__ __forceinline__ float bf2f(unsigned short b) { return __uint_as_float(((unsigned int)b) << 16); }

__device__ __forceinline__ float block_sum_f(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = 0.f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) t += red[w];
    __syncthreads();
    return t;
}

// ---------------------------------------------------------------- embedding

// x (N, C) = table[tokens[n]] (f32 rows of the master table).
// Grid (N, C / 256).
extern "C" __global__ void embed_fwd(const float* table, const int* tokens, float* x, int C) {
    const int n = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c < C) x[(size_t)n * C + c] = table[(size_t)tokens[n] * C + c];
}

// dtable[v] += sum of dx rows whose token is v, in increasing row order
// (deterministic): `starts (V + 1)` and `rows (N)` list each token's rows
// (built on the host, where the tokens come from). Grid (V, C / 128).
extern "C" __global__ void embed_bwd(const float* dx, const int* starts, const int* rows, float* dtable, int C) {
    const int v = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int s = starts[v], e = starts[v + 1];
    if (s == e) return;
    float acc = 0.f;
    for (int i = s; i < e; i++) acc += dx[(size_t)rows[i] * C + c];
    dtable[(size_t)v * C + c] += acc;
}

// ---------------------------------------------------------------- RMSNorm

// y = bf16(x * r * g), r = 1 / sqrt(mean(x^2) + eps); one block per row.
extern "C" __global__ void rmsnorm_fwd(const float* x, const float* g, unsigned short* y, float* rstd, int C,
                                       float eps) {
    __shared__ float red[32];
    const float* xr = x + (size_t)blockIdx.x * C;
    float s = 0.f;
    for (int i = threadIdx.x; i < C; i += blockDim.x) s += xr[i] * xr[i];
    s = block_sum_f(s, red);
    const float r = 1.f / sqrtf(s / (float)C + eps);
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
    unsigned short* yr = y + (size_t)blockIdx.x * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x) yr[i] = f2bf(xr[i] * r * g[i]);
}

// dres += dx, dx_i = r g_i dy_i - r^3 x_i mean_j(g_j dy_j x_j); one block per row.
extern "C" __global__ void rmsnorm_bwd(const float* x, const float* g, const float* rstd, const float* dy,
                                       float* dres, int C, int accumulate) {
    __shared__ float red[32];
    const size_t off = (size_t)blockIdx.x * C;
    float dot = 0.f;
    for (int i = threadIdx.x; i < C; i += blockDim.x) dot += g[i] * dy[off + i] * x[off + i];
    dot = block_sum_f(dot, red);
    const float r = rstd[blockIdx.x];
    const float k = r * r * r * dot / (float)C;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        const float d = r * g[i] * dy[off + i] - k * x[off + i];
        dres[off + i] = accumulate ? dres[off + i] + d : d;
    }
}

// The gain's gradient in two deterministic stages: partial[y][c] = sum over
// rows y, y + Y, ... of dy x r (block (32, 8), grid (C / 32, Y)), then
// dgain[c] += sum_y partial[y][c] in order.
extern "C" __global__ void rmsnorm_dgain_partial(const float* x, const float* dy, const float* rstd,
                                                 float* partial, int M, int C) {
    __shared__ float red[8][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    float acc = 0.f;
    if (c < C)
        for (int r = blockIdx.y * 8 + threadIdx.y; r < M; r += gridDim.y * 8)
            acc += dy[(size_t)r * C + c] * x[(size_t)r * C + c] * rstd[r];
    red[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float t = 0.f;
        for (int i = 0; i < 8; i++) t += red[i][threadIdx.x];
        partial[(size_t)blockIdx.y * C + c] = t;
    }
}

extern "C" __global__ void sum_partials(const float* partial, float* out, int Y, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float t = 0.f;
    for (int y = 0; y < Y; y++) t += partial[(size_t)y * C + c];
    out[c] += t;
}

// ---------------------------------------------------------------- RoPE

// In place on bf16 (N, H * D): pairs (i, i + D/2) rotated by position n % T.
extern "C" __global__ void rope_fwd(unsigned short* x, const float* cs, const float* sn, int N, int T, int H,
                                    int D) {
    const int half = D / 2;
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * H * half) return;
    const int i = idx % half;
    const size_t nh = idx / half;
    const int n = nh / H, h = nh % H;
    const int pos = n % T;
    const float c = cs[pos * half + i], s = sn[pos * half + i];
    unsigned short* p = x + (size_t)n * H * D + (size_t)h * D;
    const float a = bf2f(p[i]), b = bf2f(p[i + half]);
    p[i] = f2bf(a * c - b * s);
    p[i + half] = f2bf(b * c + a * s);
}

// Backward: rotate the f32 gradient by the opposite angle, write bf16.
extern "C" __global__ void rope_bwd(const float* dy, unsigned short* dx, const float* cs, const float* sn, int N,
                                    int T, int H, int D) {
    const int half = D / 2;
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)N * H * half) return;
    const int i = idx % half;
    const size_t nh = idx / half;
    const int n = nh / H, h = nh % H;
    const int pos = n % T;
    const float c = cs[pos * half + i], s = -sn[pos * half + i];
    const size_t o = (size_t)n * H * D + (size_t)h * D;
    const float a = dy[o + i], b = dy[o + i + half];
    dx[o + i] = f2bf(a * c - b * s);
    dx[o + i + half] = f2bf(b * c + a * s);
}

// ---------------------------------------------------------------- SwiGLU, adds, casts

extern "C" __global__ void swiglu_fwd(const unsigned short* g, const unsigned short* u, unsigned short* out,
                                      size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float a = bf2f(g[i]);
    out[i] = f2bf(a / (1.f + expf(-a)) * bf2f(u[i]));
}

// d_up = dy silu(g), d_gate = dy u sig(g) (1 + g (1 - sig(g))), both bf16.
extern "C" __global__ void swiglu_bwd(const unsigned short* g, const unsigned short* u, const float* dy,
                                      unsigned short* dg, unsigned short* du, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float a = bf2f(g[i]), b = bf2f(u[i]), d = dy[i];
    const float s = 1.f / (1.f + expf(-a));
    du[i] = f2bf(d * a * s);
    dg[i] = f2bf(d * b * s * (1.f + a * (1.f - s)));
}

// out = x + bf16 y (the residual add after a projection).
extern "C" __global__ void add_residual(const float* x, const unsigned short* y, float* out, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + bf2f(y[i]);
}

// x += y.
extern "C" __global__ void add_inplace(float* x, const float* y, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

extern "C" __global__ void to_bf16(const float* x, unsigned short* y, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = f2bf(x[i]);
}

// ---------------------------------------------------------------- loss

// Per row of f32 logits (M, V): loss[m] = lse - logits[target], and the
// gradient (softmax - onehot) * gscale as bf16 (the LM head's backward input).
extern "C" __global__ void cross_entropy(const float* logits, const int* targets, float* loss,
                                         unsigned short* dlogits, int V, float gscale) {
    __shared__ float red[32];
    const float* row = logits + (size_t)blockIdx.x * V;
    float mx = -3.402823466e38f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) mx = fmaxf(mx, row[i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = mx;
    __syncthreads();
    mx = red[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); w++) mx = fmaxf(mx, red[w]);
    __syncthreads();
    float s = 0.f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) s += expf(row[i] - mx);
    s = block_sum_f(s, red);
    const float lse = mx + logf(s);
    const int t = targets[blockIdx.x];
    if (dlogits) {
        unsigned short* d = dlogits + (size_t)blockIdx.x * V;
        for (int i = threadIdx.x; i < V; i += blockDim.x)
            d[i] = f2bf((expf(row[i] - lse) - (i == t ? 1.f : 0.f)) * gscale);
    }
    if (threadIdx.x == 0) loss[blockIdx.x] = lse - row[t];
}

// ---------------------------------------------------------------- optimizer

// partial[block] = sum of g^2 over a grid-stride share (f64; host adds the partials in order).
extern "C" __global__ void sumsq_partial(const float* g, size_t n, double* partial) {
    __shared__ double red[32];
    double s = 0.0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        s += (double)g[i] * (double)g[i];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) t += red[w];
        partial[blockIdx.x] = t;
    }
}

// AdamW with bias correction and decoupled weight decay, the gradient
// multiplied by `clip` first (octet_train::optim::AdamW::step); the new
// master also written as bf16 to `out` when given (the compute copy).
extern "C" __global__ void adamw(float* p, const float* g, float* m, float* v, unsigned short* out, size_t n,
                                 float lr, float b1, float b2, float eps, float wd, float bc1, float bc2,
                                 float clip) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float gi = g[i] * clip;
    const float mi = b1 * m[i] + (1.f - b1) * gi;
    const float vi = b2 * v[i] + (1.f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float update = (mi / bc1) / (sqrtf(vi / bc2) + eps);
    const float w = p[i] - lr * (update + wd * p[i]);
    p[i] = w;
    if (out) out[i] = f2bf(w);
}

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

// delta (B, Hq, T) = sum_d dout * out per query row; one warp per row.
extern "C" __global__ void attn_delta(const unsigned short* out, const float* dout, float* delta, int T, int Hq,
                                      int D, int rows) {
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;
    const int lane = threadIdx.x & 31;
    const int h = row % Hq, n = row / Hq; // row = n * Hq + h, n = b * T + t
    const size_t o = (size_t)n * Hq * D + (size_t)h * D;
    float s = 0.f;
    for (int d = lane; d < D; d += 32) s += bf2f(out[o + d]) * dout[o + d];
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
                                                                const unsigned short* v, const float* dout,
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
        const float* ob = dout + (size_t)b * T * qw + (size_t)h * D;
        const float* lb = lse + ((size_t)b * Hq + h) * T;
        const float* db = delta + ((size_t)b * Hq + h) * T;
        for (int q0 = k0; q0 < T; q0 += TILE) {
            __syncthreads();
            for (int i = threadIdx.x; i < TILE * D; i += 256) {
                const int r = i / D, c = i % D;
                const bool ok = q0 + r < T;
                Qs[r * DP + c] = ok ? bf2f(qb[(size_t)(q0 + r) * qw + c]) : 0.f;
                Os[r * DP + c] = ok ? ob[(size_t)(q0 + r) * qw + c] : 0.f;
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
                                                              const unsigned short* v, const float* dout,
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
    const float* ob = dout + (size_t)b * T * qw + (size_t)h * D;
    const unsigned short* kb = k + (size_t)b * T * kw + (size_t)g * D;
    const unsigned short* vb = v + (size_t)b * T * kw + (size_t)g * D;
    for (int i = threadIdx.x; i < TILE * D; i += 256) {
        const int r = i / D, c = i % D;
        const bool ok = q0 + r < T;
        Qs[r * DP + c] = ok ? bf2f(qb[(size_t)(q0 + r) * qw + c]) : 0.f;
        Os[r * DP + c] = ok ? ob[(size_t)(q0 + r) * qw + c] : 0.f;
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
