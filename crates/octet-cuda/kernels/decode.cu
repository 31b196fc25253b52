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

// Rotary embedding at position `pos` of `heads` heads of dim d, pairs (i, i + d/2).
extern "C" __global__ void rope_f32(float* x, int heads, int d, int pos, float theta) {
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
// heads; one block per query head; scores in shared memory (len <= 8192).
extern "C" __global__ void attend_decode(const float* q, const float* kc, const float* vc, unsigned short* out,
                                         int len, int hq, int hkv, int d, float scale) {
    extern __shared__ float sm[];
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
