// The optimizer step of a Llama training: the gradient's sum of squares (for
// clipping by its norm) and AdamW, one tensor or many a launch. Helpers: model.cuh.

// ---------------------------------------------------------------- optimizer

// partial[block] = sum of g^2 over a grid-stride share (f64; host adds the
// partials in order). 16-byte loads after the elements before the first
// 16-byte boundary; the shares depend only on the grid and `n`, so the
// result is deterministic.
extern "C" __global__ void sumsq_partial(const float* g, size_t n, double* partial) {
    __shared__ double red[32];
    const size_t mis = ((size_t)g >> 2) & 3, head = mis ? (4 - mis < n ? 4 - mis : n) : 0;
    const size_t nv = (n - head) / 4, tid = (size_t)blockIdx.x * blockDim.x + threadIdx.x,
                 stride = (size_t)gridDim.x * blockDim.x;
    const float4* v = reinterpret_cast<const float4*>(g + head);
    double s = 0.0;
    for (size_t i = tid; i < nv; i += stride) {
        const float4 f = v[i];
        s += (double)f.x * f.x + (double)f.y * f.y + (double)f.z * f.z + (double)f.w * f.w;
    }
    // The unaligned head and the tail past the last whole float4.
    if (tid < head) s += (double)g[tid] * g[tid];
    const size_t t = head + 4 * nv + tid;
    if (t < n) s += (double)g[t] * g[t];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t2 = 0.0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) t2 += red[w];
        partial[blockIdx.x] = t2;
    }
}

// One element of AdamW (octet_train::optim::AdamW::step): the gradient times
// `clip`, the moments and the master updated in place; returns the master.
__device__ __forceinline__ float adamw_elem(float* p, const float* g, float* m, float* v, size_t i, float lr,
                                            float b1, float b2, float eps, float wd, float bc1, float bc2,
                                            float clip) {
    const float gi = g[i] * clip;
    const float mi = b1 * m[i] + (1.f - b1) * gi;
    const float vi = b2 * v[i] + (1.f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float update = (mi / bc1) / (sqrtf(vi / bc2) + eps);
    const float w = p[i] - lr * (update + wd * p[i]);
    p[i] = w;
    return w;
}

// AdamW with bias correction and decoupled weight decay, the gradient
// multiplied by `clip` first (octet_train::optim::AdamW::step); the new
// master also written as bf16 to `out` when given (the compute copy), with
// that copy's amax when `amax` is given (the weight's tensorwise quantizer
// reads it), and transposed to `out_t` when given (the tensor read as
// (n / t_cols, t_cols), written as (t_cols, n / t_cols): a LoRA B's B^T).
// Grid-stride.
extern "C" __global__ void adamw(float* p, const float* g, float* m, float* v, unsigned short* out, size_t n,
                                 float lr, float b1, float b2, float eps, float wd, float bc1, float bc2,
                                 float clip, unsigned* amax, unsigned* nonfinite, unsigned short* out_t,
                                 size_t t_cols) {
    float am = 0.f;
    int bad = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float w = adamw_elem(p, g, m, v, i, lr, b1, b2, eps, wd, bc1, bc2, clip);
        if (out) {
            out[i] = f2bf(w);
            amax_note(out[i], am, bad);
            if (out_t) out_t[(i % t_cols) * (n / t_cols) + i / t_cols] = out[i];
        }
    }
    if (amax) amax_commit(am, bad, amax, nonfinite);
}

// `adamw` over up to 64 tensors of the flat buffers in one launch, without
// amax (the bf16 copies that no quantizer reads): tensor blockIdx.y is
// elements off .. off + n of p, g, m, v, with its own weight decay and
// copies (the list read in place: `__grid_constant__`). The same
// `adamw_elem` as `adamw`. A LoRA model has
// 14 adapter tensors a block (224 on the ~1B model), each a launch of
// 32K-90K elements before.
#define ADAM_MANY 64
struct AdamTensor {
    unsigned long long off, n;
    unsigned short* out;    // null: no bf16 copy
    unsigned short* out_t;  // null: no transposed copy
    unsigned long long t_cols;
    float wd, pad;
};
struct AdamMany {
    AdamTensor t[ADAM_MANY];
};
extern "C" __global__ void adamw_many(float* p, const float* g, float* m, float* v,
                                      const __grid_constant__ AdamMany list, float lr,
                                      float b1, float b2, float eps, float bc1, float bc2, float clip) {
    const AdamTensor& t = list.t[blockIdx.y];
    const size_t n = t.n, t_cols = t.t_cols;
    p += t.off;
    g += t.off;
    m += t.off;
    v += t.off;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float w = adamw_elem(p, g, m, v, i, lr, b1, b2, eps, t.wd, bc1, bc2, clip);
        if (t.out) {
            const unsigned short b = f2bf(w);
            t.out[i] = b;
            if (t.out_t) t.out_t[(i % t_cols) * (n / t_cols) + i / t_cols] = b;
        }
    }
}
