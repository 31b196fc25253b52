// Element-wise helpers of a Llama training step: residual and gradient adds
// (f32, bf16 into f32, many tensors in one launch) and the f32-to-bf16 cast.
// Helpers: model.cuh.

// ---------------------------------------------------------------- adds, casts

// x += y.
extern "C" __global__ void add_inplace(float* x, const float* y, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// Up to 8 gradients added into the flat f32 buffer `g` in one launch:
// g[off[i] + j] += src[i][j], j < n[i]; blockIdx.y picks the tensor, grid-
// stride over its elements (the LoRA backward's adapters of one input, whose
// 32K-90K-element gradients each cost a launch more than their work).
#define ADD_MANY 8
struct AddMany {
    const float* src[ADD_MANY];
    unsigned long long off[ADD_MANY];
    unsigned long long n[ADD_MANY];
};
// `__grid_constant__`: indexed in place, not copied to local memory first.
extern "C" __global__ void add_many(float* g, const __grid_constant__ AddMany t) {
    const int k = blockIdx.y;
    const float* y = t.src[k];
    float* x = g + t.off[k];
    const size_t n = t.n[k];
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

// x += y with y in bf16 (gradients reduce-scattered in bf16, accumulated in f32).
extern "C" __global__ void add_bf16_inplace(float* x, const unsigned short* y, size_t n) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += __uint_as_float((unsigned int)y[i] << 16);
}

// y = bf16(x), grid-stride, and y's amax when `amax` is given.
extern "C" __global__ void to_bf16(const float* x, unsigned short* y, size_t n, unsigned* amax, unsigned* nonfinite) {
    float m = 0.f;
    int bad = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        y[i] = f2bf(x[i]);
        amax_note(y[i], m, bad);
    }
    if (amax) amax_commit(m, bad, amax, nonfinite);
}

// y (rows, C) bf16 += b (C, f32), one rounding: a projection's bias
// (Qwen2's q/k/v, `attention_bias`'s o). Grid-stride over the n = rows C elements.
extern "C" __global__ void bias_add(unsigned short* y, const float* b, size_t n, int C) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] = f2bf(bf2f(y[i]) + b[i % (size_t)C]);
}
