// RMSNorm of a Llama training step: the forward (fused with the residual
// add), the backward, and the in-order sum of the gain's partial gradients.
// Helpers: model.cuh.

// ---------------------------------------------------------------- RMSNorm

// A norm row's statistics from its threads' partial sum of squares `s` and
// max |x| `mx`: r = 1 / sqrt(mean(x^2) + eps), stored to rstd[row]; with
// `fp8` the E4M3 multiplier of the row (into `qm`; its reciprocal, the
// factor, to xs[row]), else qm = 1. Every thread of the block calls it.
__device__ __forceinline__ float norm_row_stats(float s, float mx, int C, float eps, float* rstd, bool fp8,
                                                float* xs, float* red, float& qm) {
    s = block_sum_f(s, red);
    const float r = 1.f / sqrtf(s / (float)C + eps);
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
    qm = 1.f;
    if (fp8) {
        qm = row_mult(block_max_f(mx, red));
        if (threadIdx.x == 0) xs[blockIdx.x] = __fdiv_rn(1.f, qm);
    }
    return r;
}

// The residual add and the norm that reads its result, in one pass over the
// row: xo = x + bf16 y (when `y` is given; else the norm reads x as is and
// xo is not written), h = bf16(xo * r * g), rstd[row] = r, r = 1 / sqrt(mean(xo^2) + eps),
// and h's amax when `amax` is given; with `xq` also the norm's input (xo, or
// x) as E4M3 codes with a factor per row in `xs`, what the backward reads
// instead of the f32 row. One block per row; the second sweep reads the row
// back from L1/L2.
extern "C" __global__ void rmsnorm_fwd(const float* x, const unsigned short* y, float* xo, const float* g,
                                       unsigned short* h, float* rstd, int C, float eps, unsigned* amax,
                                       unsigned* nonfinite, unsigned char* xq, float* xs) {
    __shared__ float red[32];
    const size_t off = (size_t)blockIdx.x * C;
    const float* src = y ? xo + off : x + off;
    float s = 0.f, mx = 0.f;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        float v = x[off + i];
        if (y) {
            v += bf2f(y[off + i]);
            xo[off + i] = v;
        }
        s += v * v;
        mx = fmaxf(mx, fabsf(v));
    }
    float qm;
    const float r = norm_row_stats(s, mx, C, eps, rstd, xq != nullptr, xs, red, qm);
    float m = 0.f;
    int bad = 0;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        const float v = src[i];
        const unsigned short b = f2bf(v * r * g[i]);
        h[off + i] = b;
        amax_note(b, m, bad);
        if (xq) xq[off + i] = q_e4m3(v, qm);
    }
    if (amax) amax_commit(m, bad, amax, nonfinite);
}

// rmsnorm_fwd for C % 4 == 0 and C <= 4 * NORM_FWD_GROUPS * blockDim.x: a
// thread owns up to NORM_FWD_GROUPS groups of 4 consecutive columns, read and
// written with 16-byte (f32) and 8-byte (bf16) accesses, and keeps them in
// registers for the second sweep (the scalar kernel reads the row again).
// Same operations per element as rmsnorm_fwd; the row's sum of squares is
// added in another order (per thread over its groups, then across threads).
#define NORM_FWD_GROUPS 4
extern "C" __global__ void rmsnorm_fwd_v4(const float* x, const unsigned short* y, float* xo, const float* g,
                                          unsigned short* h, float* rstd, int C, float eps, unsigned* amax,
                                          unsigned* nonfinite, unsigned char* xq, float* xs) {
    __shared__ float red[32];
    const size_t off = (size_t)blockIdx.x * C;
    float v[NORM_FWD_GROUPS][4];
    float s = 0.f, mx = 0.f;
#pragma unroll
    for (int r = 0; r < NORM_FWD_GROUPS; r++) {
        const int i = (r * blockDim.x + threadIdx.x) * 4;
        if (i >= C) continue;
        const float4 a = *reinterpret_cast<const float4*>(x + off + i);
        v[r][0] = a.x, v[r][1] = a.y, v[r][2] = a.z, v[r][3] = a.w;
        if (y) {
            const uint2 b = *reinterpret_cast<const uint2*>(y + off + i);
            v[r][0] += bf2f(b.x & 0xffff), v[r][1] += bf2f(b.x >> 16);
            v[r][2] += bf2f(b.y & 0xffff), v[r][3] += bf2f(b.y >> 16);
            *reinterpret_cast<float4*>(xo + off + i) = make_float4(v[r][0], v[r][1], v[r][2], v[r][3]);
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            s += v[r][j] * v[r][j];
            mx = fmaxf(mx, fabsf(v[r][j]));
        }
    }
    float qm;
    const float rs = norm_row_stats(s, mx, C, eps, rstd, xq != nullptr, xs, red, qm);
    float m = 0.f;
    int bad = 0;
#pragma unroll
    for (int r = 0; r < NORM_FWD_GROUPS; r++) {
        const int i = (r * blockDim.x + threadIdx.x) * 4;
        if (i >= C) continue;
        const float4 gv = *reinterpret_cast<const float4*>(g + i);
        const float gg[4] = {gv.x, gv.y, gv.z, gv.w};
        unsigned short b[4];
        unsigned codes = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            b[j] = f2bf(v[r][j] * rs * gg[j]);
            amax_note(b[j], m, bad);
            if (xq) codes |= (unsigned)q_e4m3(v[r][j], qm) << (8 * j);
        }
        *reinterpret_cast<uint2*>(h + off + i) =
            make_uint2((unsigned)b[0] | ((unsigned)b[1] << 16), (unsigned)b[2] | ((unsigned)b[3] << 16));
        if (xq) *reinterpret_cast<unsigned*>(xq + off + i) = codes;
    }
    if (amax) amax_commit(m, bad, amax, nonfinite);
}

// RMSNorm backward over `rows` rows a block (rows `rows` blockIdx.x ..)
// with dy = dy0 + dy1 + dy2 (null terms skipped: the input gradients of the
// projections that read the norm's output, added in that order):
// dres (+)= dx, dx_i = r g_i dy_i - r^3 x_i mean_j(g_j dy_j x_j); `dres_bf`
// (when given) = bf16 of the updated dres, the next projection's
// grad_output; `partial` (when given) row blockIdx.x = the sum over this
// block's rows of dy x r (the gain's gradient; `sum_partials` adds the
// blocks in order); dres_bf's amax when `amax` is given; with `xq` the input
// x is read as E4M3 codes times the row factors `xs` (rmsnorm_fwd's FP8
// copy) and `x` is not read. V = 4 when C is a multiple of 4 (16-byte accesses).
// Dynamic shared memory: C floats when `partial` (each thread owns its columns).

template <int V> __device__ __forceinline__ Vf<V> vadd(Vf<V> a, const Vf<V>& b) {
#pragma unroll
    for (int j = 0; j < V; j++) a.v[j] += b.v[j];
    return a;
}

// The norm's input at `at`: the f32 row, or (with `xq`) its E4M3 codes times the row's factor `f`.
template <int V>
__device__ __forceinline__ Vf<V> ld_x(const float* x, const unsigned char* xq, float f, size_t at) {
    if (!xq) return ldv<V>(x + at);
    Vf<V> r;
    if (V == 4) {
        const unsigned w = *reinterpret_cast<const unsigned*>(xq + at);
#pragma unroll
        for (int j = 0; j < V; j++) r.v[j] = e4m3_decode((w >> (8 * j)) & 0xffu) * f;
    } else {
#pragma unroll
        for (int j = 0; j < V; j++) r.v[j] = e4m3_decode(xq[at + j]) * f;
    }
    return r;
}

// dy0 + dy1 + dy2 at `at` (null terms skipped), added in that order (f32,
// or bf16 widened exactly).
template <int V, typename T>
__device__ __forceinline__ Vf<V> ld_dy(const T* dy0, const T* dy1, const T* dy2, size_t at) {
    Vf<V> d = ldv<V>(dy0 + at);
    if (dy1) d = vadd<V>(d, ldv<V>(dy1 + at));
    if (dy2) d = vadd<V>(d, ldv<V>(dy2 + at));
    return d;
}

template <int V, typename T>
__device__ void rmsnorm_bwd_impl(const float* x, const float* g, const float* rstd, const T* dy0,
                                 const T* dy1, const T* dy2, float* dres, unsigned short* dres_bf,
                                 float* partial, int M, int C, int rows, int accumulate, unsigned* amax,
                                 unsigned* nonfinite, const unsigned char* xq, const float* xs) {
    float m = 0.f;
    int bad = 0;
    extern __shared__ float colacc[];
    __shared__ float red[32];
    if (partial)
        for (int i = threadIdx.x * V; i < C; i += blockDim.x * V) stv<V>(colacc + i, Vf<V>{});
    const int r0 = blockIdx.x * rows, r1 = min(M, r0 + rows);
    for (int row = r0; row < r1; row++) {
        const size_t off = (size_t)row * C;
        const float xf = xq ? xs[row] : 1.f;
        float dot = 0.f;
        for (int i = threadIdx.x * V; i < C; i += blockDim.x * V) {
            const Vf<V> d = ld_dy<V, T>(dy0, dy1, dy2, off + i);
            const Vf<V> xv = ld_x<V>(x, xq, xf, off + i), gv = ldv<V>(g + i);
#pragma unroll
            for (int j = 0; j < V; j++) dot += gv.v[j] * d.v[j] * xv.v[j];
        }
        dot = block_sum_f(dot, red);
        const float r = rstd[row];
        const float k = r * r * r * dot / (float)C;
        for (int i = threadIdx.x * V; i < C; i += blockDim.x * V) {
            const Vf<V> d = ld_dy<V, T>(dy0, dy1, dy2, off + i);
            const Vf<V> xv = ld_x<V>(x, xq, xf, off + i), gv = ldv<V>(g + i);
            Vf<V> o = accumulate ? ldv<V>(dres + off + i) : Vf<V>{};
#pragma unroll
            for (int j = 0; j < V; j++) o.v[j] += r * gv.v[j] * d.v[j] - k * xv.v[j];
            stv<V>(dres + off + i, o);
            if (dres_bf)
#pragma unroll
                for (int j = 0; j < V; j++) {
                    const unsigned short b = f2bf(o.v[j]);
                    dres_bf[off + i + j] = b;
                    amax_note(b, m, bad);
                }
            if (partial)
#pragma unroll
                for (int j = 0; j < V; j++) colacc[i + j] += d.v[j] * xv.v[j] * r;
        }
    }
    if (partial) {
        __syncthreads();
        for (int i = threadIdx.x; i < C; i += blockDim.x) partial[(size_t)blockIdx.x * C + i] = colacc[i];
    }
    if (amax) amax_commit(m, bad, amax, nonfinite);
}

// The gradients `dy` come in f32 (the LM head's) or bf16 (the projections'
// input gradients, summed in bf16 by their GEMMs).
#define NORM_BWD(NAME, V, T)                                                                                   \
    extern "C" __global__ void NAME(const float* x, const float* g, const float* rstd, const T* dy0,            \
                                    const T* dy1, const T* dy2, float* dres, unsigned short* dres_bf,           \
                                    float* partial, int M, int C, int rows, int accumulate, unsigned* amax,     \
                                    unsigned* nonfinite, const unsigned char* xq, const float* xs) {            \
        rmsnorm_bwd_impl<V, T>(x, g, rstd, dy0, dy1, dy2, dres, dres_bf, partial, M, C, rows, accumulate, amax, \
                               nonfinite, xq, xs);                                                              \
    }
NORM_BWD(rmsnorm_bwd, 1, float)
NORM_BWD(rmsnorm_bwd_v4, 4, float)
NORM_BWD(rmsnorm_bwd_b16, 1, unsigned short)
NORM_BWD(rmsnorm_bwd_b16_v4, 4, unsigned short)

// out[c] += sum over y of partial[y][c], y in order within each of 8 row
// strides, then the 8 strides in order (deterministic). Block (32, 8), grid C / 32.
extern "C" __global__ void sum_partials(const float* partial, float* out, int Y, int C) {
    __shared__ float red[8][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    float t = 0.f;
    if (c < C)
#pragma unroll 8
        for (int y = threadIdx.y; y < Y; y += 8) t += partial[(size_t)y * C + c];
    red[threadIdx.y][threadIdx.x] = t;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float s = 0.f;
        for (int i = 0; i < 8; i++) s += red[i][threadIdx.x];
        out[c] += s;
    }
}

// ---------------------------------------------------------------- per-head norm

// Qwen3's q_norm / k_norm: RMSNorm over each row of D bf16 values (one a
// token and head), gain g (D, f32): y = bf16(x rstd g), rstd = 1 / sqrt(mean(x^2)
// + eps), written per row for the backward. One warp a row, D <= 32 HN_MAXV.
#define HN_MAXV 8
extern "C" __global__ void head_norm_fwd(const unsigned short* x, const float* g, unsigned short* y, float* rstd,
                                         int rows, int D, float eps) {
    const int row = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const size_t at = (size_t)row * D;
    float v[HN_MAXV];
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < HN_MAXV; j++) {
        const int i = lane + 32 * j;
        v[j] = i < D ? bf2f(x[at + i]) : 0.f;
        ss += v[j] * v[j];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float r = rsqrtf(ss / (float)D + eps);
#pragma unroll
    for (int j = 0; j < HN_MAXV; j++) {
        const int i = lane + 32 * j;
        if (i < D) y[at + i] = f2bf(v[j] * r * g[i]);
    }
    if (lane == 0) rstd[row] = r;
}

// Its backward from dy (bf16): dx = rstd (g dy - xhat mean(g dy xhat)) in
// bf16, xhat = x rstd; with `partial`, each warp's sum of dy xhat over its
// rows (warp w takes rows w, w + W, ...) into partial[w] (D floats), which
// `sum_partials` adds in order (deterministic). One warp a row, D <= 32 HN_MAXV.
extern "C" __global__ void head_norm_bwd(const unsigned short* x, const float* g, const float* rstd,
                                         const unsigned short* dy, unsigned short* dx, float* partial,
                                         int rows, int D) {
    const int lane = threadIdx.x & 31;
    const int w0 = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int W = (gridDim.x * blockDim.x) >> 5;
    float acc[HN_MAXV];
#pragma unroll
    for (int j = 0; j < HN_MAXV; j++) acc[j] = 0.f;
    for (int row = w0; row < rows; row += W) {
        const size_t at = (size_t)row * D;
        const float r = rstd[row];
        float xh[HN_MAXV], gd[HN_MAXV];
        float dot = 0.f;
#pragma unroll
        for (int j = 0; j < HN_MAXV; j++) {
            const int i = lane + 32 * j;
            const float d = i < D ? bf2f(dy[at + i]) : 0.f;
            xh[j] = i < D ? bf2f(x[at + i]) * r : 0.f;
            gd[j] = i < D ? d * g[i] : 0.f;
            dot += gd[j] * xh[j];
            acc[j] += d * xh[j];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        dot /= (float)D;
#pragma unroll
        for (int j = 0; j < HN_MAXV; j++) {
            const int i = lane + 32 * j;
            if (i < D) dx[at + i] = f2bf(r * (gd[j] - xh[j] * dot));
        }
    }
    if (partial) {
#pragma unroll
        for (int j = 0; j < HN_MAXV; j++) {
            const int i = lane + 32 * j;
            if (i < D) partial[(size_t)w0 * D + i] = acc[j];
        }
    }
}
