// Kernels of token-by-token decoding (one sequence, one new token per step):
// the glue between the weight-only products of mixed.cu. Activations are f32
// (the residual stream) or bf16 (the inputs of the matrix products).

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
    const float* r = x + (size_t)blockIdx.x * C;
    float s = 0.f;
    for (int i = threadIdx.x; i < C; i += blockDim.x) s += r[i] * r[i];
    s = block_sum(s, red);
    const float inv = rsqrtf(s / C + eps);
    for (int i = threadIdx.x; i < C; i += blockDim.x) out[(size_t)blockIdx.x * C + i] = f32_to_bf16(r[i] * inv * g[i]);
}

// The step's token and position live on the device (state[0], state[1]) so
// that one captured CUDA graph serves every step.

// x = table[token] (C floats).
extern "C" __global__ void embed_row(const float* table, const int* state, float* x, int C) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < C) x[i] = table[(size_t)state[0] * C + i];
}

// The new key and value rows into the caches at the step's position.
extern "C" __global__ void kv_store(const float* k, const float* v, float* kc, float* vc, const int* state,
                                    int width) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= width) return;
    const size_t at = (size_t)state[1] * width + i;
    kc[at] = k[i];
    vc[at] = v[i];
}

// Rotary embedding at the step's position of `heads` heads of dim d, pairs (i, i + d/2).
extern "C" __global__ void rope_f32(float* x, int heads, int d, const int* state, float theta) {
    const int pos = state[1];
    const int half = d / 2;
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= heads * half) return;
    const int h = idx / half, i = idx % half;
    const double a = (double)pos * pow((double)theta, -2.0 * i / d);
    const float c = (float)cos(a), s = (float)sin(a);
    float* p = x + h * d;
    const float u = p[i], v = p[i + half];
    p[i] = u * c - v * s;
    p[i + half] = v * c + u * s;
}

// Attention of one query token over `len` cached keys/values, grouped-query
// heads; one block per query head; `len` = position + 1; scores in shared
// memory (sized by the host for the longest sequence).
extern "C" __global__ void attend_decode(const float* q, const float* kc, const float* vc, unsigned short* out,
                                         const int* state, int hq, int hkv, int d, float scale) {
    extern __shared__ float sm[];
    const int len = state[1] + 1;
    float* scores = sm;            // len
    float* red = sm + len;         // 32
    const int h = blockIdx.x, kh = h / (hq / hkv), kvw = hkv * d;
    const float* qh = q + h * d;
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
        const float* kj = kc + (size_t)j * kvw + kh * d;
        float s = 0.f;
        for (int t = 0; t < d; t++) s += qh[t] * kj[t];
        scores[j] = s * scale;
    }
    __syncthreads();
    float m = -3.402823466e38f;
    for (int j = threadIdx.x; j < len; j += blockDim.x) m = fmaxf(m, scores[j]);
    m = block_max(m, red);
    float sum = 0.f;
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
        const float e = __expf(scores[j] - m);
        scores[j] = e;
        sum += e;
    }
    sum = block_sum(sum, red);
    const float inv = 1.f / sum;
    for (int t = threadIdx.x; t < d; t += blockDim.x) {
        float o = 0.f;
        for (int j = 0; j < len; j++) o += scores[j] * vc[(size_t)j * kvw + kh * d + t];
        out[h * d + t] = f32_to_bf16(o * inv);
    }
}

// out = bf16(silu(g) * u).
extern "C" __global__ void swiglu_bf16(const float* g, const float* u, unsigned short* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float a = g[i];
    out[i] = f32_to_bf16(a / (1.f + __expf(-a)) * u[i]);
}

// x += y.
extern "C" __global__ void add_f32(float* x, const float* y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}
