// Device helpers shared by the kernel families of a Llama training step on
// the GPU (`llama/cuda` in octet-nn): embed.cu, norm.cu, rope.cu, swiglu.cu,
// elementwise.cu, loss.cu, optim.cu and attention.cu. Each of them is
// compiled as common.cuh, this file, then the family's own file.
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

__device__ __forceinline__ float block_max_f(float v, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = 0.f;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) t = fmaxf(t, red[w]);
    __syncthreads();
    return t;
}

// FP8 saved activations (`SavedActivations::Fp8` in model.rs): a tensor that
// only a backward reads (a norm's input, SwiGLU's inputs) is kept as E4M3
// codes with one f32 factor per row: value = code * factor, where the
// quantizer multiplies by `row_mult(row amax)` = 448 / amax and the factor is
// its IEEE reciprocal. Relative error at most 2^-4 per element in E4M3's
// normal range; values below amax 2^-15 flush toward zero.
__device__ __forceinline__ float row_mult(float amax) {
    const float s = scale_from_amax(amax, 448.f, 0);
    return s > 0.f ? s : 1.f;
}
__device__ __forceinline__ unsigned char q_e4m3(float v, float mult) {
    return (unsigned char)(cvt_fp8x2<FMT_E4M3>(__fmul_rn(v, mult), 0.f) & 0xffu);
}

// The amax that a producer kernel computes for the quantizer of its output
// (current per-tensor scaling then needs no amax pass): each thread passes the
// max of |v| over the bf16 values it wrote (fmaxf leaves NaN out, as the amax
// pass does) and whether any was NaN/inf; one atomic per block. Every thread
// of the block calls it (it synchronizes), only when `amax` is given.
__device__ __forceinline__ void amax_commit(float m, int bad, unsigned* amax, unsigned* nonfinite) {
    __shared__ float sm[32];
    m = warp_max(m);
    if ((threadIdx.x & 31) == 0) sm[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x < 32) {
        float v = threadIdx.x < (blockDim.x >> 5) ? sm[threadIdx.x] : 0.f;
        v = warp_max(v);
        if (threadIdx.x == 0) atomicMax(amax, __float_as_uint(v));
    }
    if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(nonfinite, 1u);
}

// Record one written bf16 value `b` into a producer's running (max, flag).
__device__ __forceinline__ void amax_note(unsigned short b, float& m, int& bad) {
    const float f = bf2f(b);
    bad |= nonfinite_f32(f);
    m = fmaxf(m, fabsf(f));
}

// V consecutive floats (V = 4: one 16-byte access; V = 1: one float).
template <int V> struct Vf {
    float v[V];
};
template <int V> __device__ __forceinline__ Vf<V> ldv(const float* p) {
    Vf<V> r;
    if (V == 4) {
        const float4 f = *reinterpret_cast<const float4*>(p);
        r.v[0] = f.x, r.v[1] = f.y, r.v[2] = f.z, r.v[3] = f.w;
    } else {
#pragma unroll
        for (int j = 0; j < V; j++) r.v[j] = p[j];
    }
    return r;
}
// V consecutive bf16 as floats (V = 4: one 8-byte access).
template <int V> __device__ __forceinline__ Vf<V> ldv(const unsigned short* p) {
    Vf<V> r;
    if (V == 4) {
        const uint2 w = *reinterpret_cast<const uint2*>(p);
        r.v[0] = bf16_lo(w.x), r.v[1] = bf16_hi(w.x), r.v[2] = bf16_lo(w.y), r.v[3] = bf16_hi(w.y);
    } else {
#pragma unroll
        for (int j = 0; j < V; j++) r.v[j] = bf2f(p[j]);
    }
    return r;
}
template <int V> __device__ __forceinline__ void stv(float* p, const Vf<V>& r) {
    if (V == 4)
        *reinterpret_cast<float4*>(p) = make_float4(r.v[0], r.v[1], r.v[2], r.v[3]);
    else
#pragma unroll
        for (int j = 0; j < V; j++) p[j] = r.v[j];
}

// The backward of one rotated pair: the f32 gradients (a, b) of (i, i + D/2)
// rotated by the opposite angle (cos c, sin s) and rounded to bf16. Every
// operation is rounded on its own (no contraction), so `rope_bwd` and the
// attention backward's fused store (`store_rows_rope`) give the same bits.
__device__ __forceinline__ void rope_bwd_pair(float a, float b, float c, float s, unsigned short& lo,
                                              unsigned short& hi) {
    lo = f2bf(__fadd_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
    hi = f2bf(__fsub_rn(__fmul_rn(b, c), __fmul_rn(a, s)));
}
