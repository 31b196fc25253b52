// The loss of a Llama training step: cross-entropy over f32 logits, with
// the logits' gradient. Helpers: model.cuh.

// ---------------------------------------------------------------- loss

// Per row of f32 logits (M, V): loss[m] = lse - logits[target], and the
// gradient (softmax - onehot) * gscale as bf16 (the LM head's backward input).
// A masked row (target < 0: octet's IGNORE, u32::MAX, as an int) has loss 0
// and a zero gradient.
extern "C" __global__ void cross_entropy(const float* logits, const int* targets, float* loss,
                                         unsigned short* dlogits, int V, float gscale) {
    __shared__ float red[32];
    const float* row = logits + (size_t)blockIdx.x * V;
    const int t = targets[blockIdx.x];
    if (t < 0) {
        if (dlogits) {
            unsigned short* d = dlogits + (size_t)blockIdx.x * V;
            for (int i = threadIdx.x; i < V; i += blockDim.x) d[i] = 0;
        }
        if (threadIdx.x == 0) loss[blockIdx.x] = 0.f;
        return;
    }
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
    if (dlogits) {
        unsigned short* d = dlogits + (size_t)blockIdx.x * V;
        for (int i = threadIdx.x; i < V; i += blockDim.x)
            d[i] = f2bf((expf(row[i] - lse) - (i == t ? 1.f : 0.f)) * gscale);
    }
    if (threadIdx.x == 0) loss[blockIdx.x] = lse - row[t];
}
