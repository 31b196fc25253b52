// Kernels of decoding (one sequence; one new token per step, or the rows of a
// prompt at once): the glue between the weight-only products of mixed.cu.
// A launch of R rows takes row r from blockIdx.y (blockIdx.x for the norms,
// blockIdx.z for attention); the step is R = 1. `state` holds the position of
// row 0, then the R tokens, so that one captured CUDA graph serves every step. Activations are f32
// (the residual stream) or bf16 (the inputs of the matrix products).
// On sm_90 and later the host launches the glue kernels after the first as
// programmatic dependents of the kernel before them (usually a product), so
// each starts with `grid_wait` before it touches memory.

__device__ __forceinline__ unsigned short f32_to_bf16(float v) {
    unsigned short r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(v));
    return r;
}

__device__ __forceinline__ float block_sum(float v, float* shared) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float t = 0.f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) t += shared[w];
    __syncthreads();
    return t;
}

__device__ __forceinline__ float block_max(float v, float* shared) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float t = -3.402823466e38f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) t = fmaxf(t, shared[w]);
    __syncthreads();
    return t;
}

// out = bf16(x / sqrt(mean(x^2) + eps) * g), one block per row of C.
extern "C" __global__ void rmsnorm_bf16(const float* x, const float* g, unsigned short* out, int C, float eps) {
    __shared__ float red[32];
    grid_wait();
    const float* r = x + (size_t)blockIdx.x * C;
    float s = 0.f;
    for (int i = threadIdx.x; i < C; i += blockDim.x) s += r[i] * r[i];
    s = block_sum(s, red);
    const float inv = rsqrtf(s / C + eps);
    for (int i = threadIdx.x; i < C; i += blockDim.x) out[(size_t)blockIdx.x * C + i] = f32_to_bf16(r[i] * inv * g[i]);
}

// x += y, then out = bf16(x / sqrt(mean(x^2) + eps) * g): the residual add
// of one block of the model and the norm of the next, one block a row of C
// (launched with 1024 threads: a few elements a thread, all loads in flight).
extern "C" __global__ void add_rmsnorm_bf16(float* x, const float* y, const float* g, unsigned short* out, int C,
                                            float eps) {
    __shared__ float red[32];
    grid_wait();
    x += (size_t)blockIdx.x * C;
    y += (size_t)blockIdx.x * C;
    out += (size_t)blockIdx.x * C;
    float s = 0.f;
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        const float v = x[i] + y[i];
        x[i] = v;
        s += v * v;
    }
    s = block_sum(s, red);
    const float inv = rsqrtf(s / C + eps);
    // Each thread reads back the elements it wrote.
    for (int i = threadIdx.x; i < C; i += blockDim.x) out[i] = f32_to_bf16(x[i] * inv * g[i]);
}

// Row r of x = table[token r] (C floats).
extern "C" __global__ void embed_row(const float* table, const int* state, float* x, int C) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (i < C) x[(size_t)r * C + i] = table[(size_t)state[1 + r] * C + i];
}

// Rotary embedding of a row's q and k heads (the first hq + hkv heads of
// its row of `qkv`, pairs (i, i + d/2)) with the position's row of the cos
// and sin tables (D/2 each: the CPU's `Rope` tables rounded to f32), and the
// new key (rotated) and value rows into the caches at the row's position.
// One thread per rotated pair, then one per value element.
extern "C" __global__ void rope_store(float* qkv, const float* cos_t, const float* sin_t, float* kc, float* vc,
                                      const int* state, int hq, int hkv, int d) {
    grid_wait();
    const int pos = state[0] + blockIdx.y, half = d / 2, kvw = hkv * d, pairs = (hq + hkv) * half;
    qkv += (size_t)blockIdx.y * (hq + 2 * hkv) * d;
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < pairs) {
        const int h = idx / half, i = idx % half;
        const float c = cos_t[(size_t)pos * half + i], s = sin_t[(size_t)pos * half + i];
        float* p = qkv + h * d;
        const float u = p[i], v = p[i + half];
        const float a = u * c - v * s, b = v * c + u * s;
        p[i] = a;
        p[i + half] = b;
        if (h >= hq) {
            float* k = kc + (size_t)pos * kvw + (h - hq) * d;
            k[i] = a;
            k[i + half] = b;
        }
    } else if (idx < pairs + kvw) {
        const int i = idx - pairs;
        vc[(size_t)pos * kvw + i] = qkv[(hq + hkv) * d + i];
    }
}

// Attention of one query row (blockIdx.z; its q heads start the row of
// `qkv`) over `len` = its position + 1 cached keys and values, so rows
// of a prompt see only the positions up to their own, grouped-query heads
// (head h reads kv head h / (hq / hkv)), split
// along the sequence: block (h, s) of a (hq, S) grid takes the s-th of S
// runs of ceil(len / S) positions, so a long sequence keeps every SM reading.
// - Lane l holds elements l, l + 32, ... of a row (d <= 32 * ATT_R): a warp
//   reads a cached row in coalesced 128-byte pieces. Warp w takes positions
//   w, w + warps, ... of the run, ATT_U at a time (their loads in flight
//   together), for the scores (a warp sum each) and again for p * v.
// - Each block writes its run's max score m_s, sum of exp(score - m_s) and
//   unnormalised output to `part` ((R, hq, S, d + 2) floats). The last block
//   of a head to finish (a counter per row and head, reset by that block) adds the runs
//   in order s = 0, 1, ..., each weighted by exp(m_s - max m) / total (runs
//   <= blockDim.x, one thread a run computing the weights), so the result
//   does not depend on which block finished last.
// Shared memory (sized by the host): a run's scores, 32 floats for
// reductions, warps x d partial outputs.
#define ATT_R 8
#define ATT_U 4
extern "C" __global__ void attend_decode(const float* q, const float* kc, const float* vc, unsigned short* out,
                                         const int* state, int hq, int hkv, int d, float scale, float* part,
                                         unsigned* count) {
    extern __shared__ float sm[];
    __shared__ bool last;
    grid_wait();
    const int row = blockIdx.z, len = state[0] + row + 1, runs = gridDim.y, run = blockIdx.y;
    q += (size_t)row * (hq + 2 * hkv) * d;
    out += (size_t)row * hq * d;
    part += (size_t)row * hq * runs * (d + 2);
    count += (size_t)row * hq;
    const int chunk = (len + runs - 1) / runs, j0 = min(len, run * chunk), j1 = min(len, j0 + chunk), n = j1 - j0;
    const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float* scores = sm;
    float* red = sm + chunk;
    float* po = red + 32;
    const int h = blockIdx.x, kh = h / (hq / hkv), kvw = hkv * d;
    const float* qh = q + h * d;
    const float* kbase = kc + (size_t)j0 * kvw + kh * d;
    const float* vbase = vc + (size_t)j0 * kvw + kh * d;
    float qr[ATT_R];
#pragma unroll
    for (int r = 0; r < ATT_R; r++) qr[r] = lane + 32 * r < d ? qh[lane + 32 * r] : 0.f;
    for (int j = warp; j < n; j += ATT_U * warps) {
        float sc[ATT_U];
#pragma unroll
        for (int u = 0; u < ATT_U; u++) {
            const int jj = j + u * warps;
            sc[u] = 0.f;
            if (jj < n) {
                const float* kj = kbase + (size_t)jj * kvw;
#pragma unroll
                for (int r = 0; r < ATT_R; r++)
                    if (lane + 32 * r < d) sc[u] += qr[r] * kj[lane + 32 * r];
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int u = 0; u < ATT_U; u++) sc[u] += __shfl_xor_sync(0xffffffffu, sc[u], o);
        if (lane == 0)
#pragma unroll
            for (int u = 0; u < ATT_U; u++)
                if (j + u * warps < n) scores[j + u * warps] = sc[u] * scale;
    }
    __syncthreads();
    float m = -3.402823466e38f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, scores[j]);
    m = block_max(m, red);
    float sum = 0.f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float e = __expf(scores[j] - m);
        scores[j] = e;
        sum += e;
    }
    sum = block_sum(sum, red); // its barrier also publishes the exponentials
    float acc[ATT_R];
#pragma unroll
    for (int r = 0; r < ATT_R; r++) acc[r] = 0.f;
    for (int j = warp; j < n; j += ATT_U * warps) {
#pragma unroll
        for (int u = 0; u < ATT_U; u++) {
            const int jj = j + u * warps;
            if (jj < n) {
                const float p = scores[jj];
                const float* vj = vbase + (size_t)jj * kvw;
#pragma unroll
                for (int r = 0; r < ATT_R; r++)
                    if (lane + 32 * r < d) acc[r] += p * vj[lane + 32 * r];
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ATT_R; r++)
        if (lane + 32 * r < d) po[warp * d + lane + 32 * r] = acc[r];
    __syncthreads();
    float* mine = part + ((size_t)h * runs + run) * (d + 2);
    for (int t = threadIdx.x; t < d; t += blockDim.x) {
        float o = 0.f;
        for (int w = 0; w < warps; w++) o += po[w * d + t];
        mine[t] = o;
    }
    if (threadIdx.x == 0) {
        mine[d] = m;
        mine[d + 1] = sum;
    }
    // Publish this run, then count it; the last run of the head combines.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&count[h], 1u) == (unsigned)runs - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    // Thread r < runs takes run r's max and sum (read through L2, where the
    // other blocks' stores are); the runs' weights exp(m_r - max) / total go
    // to shared memory, then thread t adds element t of the runs in order.
    const float* all = part + (size_t)h * runs * (d + 2);
    const bool has = threadIdx.x < runs && __ldcg(all + threadIdx.x * (d + 2) + d + 1) > 0.f;
    const float mr = has ? __ldcg(all + threadIdx.x * (d + 2) + d) : -3.402823466e38f;
    const float lr = has ? __ldcg(all + threadIdx.x * (d + 2) + d + 1) : 0.f;
    const float mx = block_max(mr, red);
    const float wr = has ? __expf(mr - mx) : 0.f;
    const float total = block_sum(wr * lr, red);
    if (threadIdx.x < runs) po[threadIdx.x] = wr / total;
    __syncthreads();
    for (int t = threadIdx.x; t < d; t += blockDim.x) {
        float o = 0.f;
        for (int r = 0; r < runs; r++) o += __ldcg(all + r * (d + 2) + t) * po[r];
        out[h * d + t] = f32_to_bf16(o);
    }
    if (threadIdx.x == 0) count[h] = 0;
}

// out = bf16(silu(g) * u), a row's gate and up halves side by side in `gu`.
extern "C" __global__ void swiglu_bf16(const float* gu, unsigned short* out, int n) {
    grid_wait();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float* g = gu + (size_t)blockIdx.y * 2 * n;
    const float a = g[i];
    out[(size_t)blockIdx.y * n + i] = f32_to_bf16(a / (1.f + __expf(-a)) * g[n + i]);
}
