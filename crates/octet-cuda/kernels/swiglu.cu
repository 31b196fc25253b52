// SwiGLU of a Llama training step: the bf16 forward and backward, and the
// pair that keeps its inputs in FP8 for the backward. Helpers: model.cuh.

// ---------------------------------------------------------------- SwiGLU

// SwiGLU over 8 elements a thread-step (16-byte loads of the bf16 operands),
// grid-stride; the last partial group element by element; the outputs'
// amaxes when `amax*` are given.
__device__ __forceinline__ float silu(float a) { return a / (1.f + expf(-a)); }

extern "C" __global__ void swiglu_fwd(const unsigned short* g, const unsigned short* u, unsigned short* out,
                                      size_t n, unsigned* amax, unsigned* nonfinite) {
    float m = 0.f;
    int bad = 0;
    for (size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8; i0 < n;
         i0 += (size_t)gridDim.x * blockDim.x * 8) {
        if (i0 + 8 <= n) {
            const uint4 gv = *reinterpret_cast<const uint4*>(g + i0), uv = *reinterpret_cast<const uint4*>(u + i0);
            const unsigned gw[4] = {gv.x, gv.y, gv.z, gv.w}, uw[4] = {uv.x, uv.y, uv.z, uv.w};
            unsigned ow[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const unsigned short lo = f2bf(silu(bf2f(gw[j] & 0xffff)) * bf2f(uw[j] & 0xffff));
                const unsigned short hi = f2bf(silu(bf2f(gw[j] >> 16)) * bf2f(uw[j] >> 16));
                amax_note(lo, m, bad);
                amax_note(hi, m, bad);
                ow[j] = (unsigned)lo | ((unsigned)hi << 16);
            }
            *reinterpret_cast<uint4*>(out + i0) = make_uint4(ow[0], ow[1], ow[2], ow[3]);
        } else {
            for (size_t i = i0; i < n; i++) {
                out[i] = f2bf(silu(bf2f(g[i])) * bf2f(u[i]));
                amax_note(out[i], m, bad);
            }
        }
    }
    if (amax) amax_commit(m, bad, amax, nonfinite);
}

// d_up = dy silu(g), d_gate = dy u sig(g) (1 + g (1 - sig(g))), both bf16.
__device__ __forceinline__ void swiglu_grad(float a, float b, float d, unsigned short& dg, unsigned short& du) {
    const float s = 1.f / (1.f + expf(-a));
    du = f2bf(d * a * s);
    dg = f2bf(d * b * s * (1.f + a * (1.f - s)));
}

// dy: the down projection's input gradient in bf16.
extern "C" __global__ void swiglu_bwd(const unsigned short* g, const unsigned short* u, const unsigned short* dy,
                                      unsigned short* dg, unsigned short* du, size_t n, unsigned* amax_g,
                                      unsigned* nonfinite_g, unsigned* amax_u, unsigned* nonfinite_u) {
    float mg = 0.f, mu = 0.f;
    int badg = 0, badu = 0;
    for (size_t i0 = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8; i0 < n;
         i0 += (size_t)gridDim.x * blockDim.x * 8) {
        if (i0 + 8 <= n) {
            const uint4 gv = *reinterpret_cast<const uint4*>(g + i0), uv = *reinterpret_cast<const uint4*>(u + i0);
            const unsigned gw[4] = {gv.x, gv.y, gv.z, gv.w}, uw[4] = {uv.x, uv.y, uv.z, uv.w};
            float dv[8];
            In<unsigned short>::load8(dy + i0, dv);
            unsigned gw2[4], uw2[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                unsigned short g0, g1, u0, u1;
                swiglu_grad(bf2f(gw[j] & 0xffff), bf2f(uw[j] & 0xffff), dv[2 * j], g0, u0);
                swiglu_grad(bf2f(gw[j] >> 16), bf2f(uw[j] >> 16), dv[2 * j + 1], g1, u1);
                amax_note(g0, mg, badg);
                amax_note(g1, mg, badg);
                amax_note(u0, mu, badu);
                amax_note(u1, mu, badu);
                gw2[j] = (unsigned)g0 | ((unsigned)g1 << 16);
                uw2[j] = (unsigned)u0 | ((unsigned)u1 << 16);
            }
            *reinterpret_cast<uint4*>(dg + i0) = make_uint4(gw2[0], gw2[1], gw2[2], gw2[3]);
            *reinterpret_cast<uint4*>(du + i0) = make_uint4(uw2[0], uw2[1], uw2[2], uw2[3]);
        } else {
            for (size_t i = i0; i < n; i++) {
                swiglu_grad(bf2f(g[i]), bf2f(u[i]), bf2f(dy[i]), dg[i], du[i]);
                amax_note(dg[i], mg, badg);
                amax_note(du[i], mu, badu);
            }
        }
    }
    if (amax_g) amax_commit(mg, badg, amax_g, nonfinite_g);
    if (amax_u) amax_commit(mu, badu, amax_u, nonfinite_u);
}

// SwiGLU whose inputs are kept in FP8 for the backward (the `_q` pair): one
// block per row of F columns. Forward: out = bf16(silu(g) u), bit-identical
// to swiglu_fwd (with its amax), and gq / uq = E4M3 codes of g and u with one
// factor per row each (gs, us; see row_mult). Backward: swiglu_bwd's formula
// on the dequantized g and u. V = 8 when F is a multiple of 8 (16-byte loads
// of bf16, 8-byte accesses of codes).
// Eight bf16 values, element 0 at the lowest address, as one 16-byte word.
__device__ __forceinline__ uint4 pack8_bf16(const unsigned short o[8]) {
    return make_uint4(o[0] | ((unsigned)o[1] << 16), o[2] | ((unsigned)o[3] << 16), o[4] | ((unsigned)o[5] << 16),
                      o[6] | ((unsigned)o[7] << 16));
}

template <int V>
__device__ void swiglu_fwd_q_impl(const unsigned short* g, const unsigned short* u, unsigned short* out,
                                  unsigned char* gq, float* gs, unsigned char* uq, float* us, int F,
                                  unsigned* amax, unsigned* nonfinite) {
    __shared__ float red[32];
    const size_t off = (size_t)blockIdx.x * F;
    float m = 0.f, mg = 0.f, mu = 0.f;
    int bad = 0;
    for (int i = threadIdx.x * V; i < F; i += blockDim.x * V) {
        float a[V], b[V];
        unsigned short o[V];
        if (V == 8) {
            In<unsigned short>::load8(g + off + i, a);
            In<unsigned short>::load8(u + off + i, b);
        } else {
            a[0] = bf2f(g[off + i]), b[0] = bf2f(u[off + i]);
        }
#pragma unroll
        for (int j = 0; j < V; j++) {
            o[j] = f2bf(silu(a[j]) * b[j]);
            amax_note(o[j], m, bad);
            mg = fmaxf(mg, fabsf(a[j]));
            mu = fmaxf(mu, fabsf(b[j]));
        }
        if (V == 8) {
            *reinterpret_cast<uint4*>(out + off + i) = pack8_bf16(o);
        } else {
            out[off + i] = o[0];
        }
    }
    const float qg = row_mult(block_max_f(mg, red)), qu = row_mult(block_max_f(mu, red));
    if (threadIdx.x == 0) gs[blockIdx.x] = __fdiv_rn(1.f, qg), us[blockIdx.x] = __fdiv_rn(1.f, qu);
    for (int i = threadIdx.x * V; i < F; i += blockDim.x * V) {
        if (V == 8) {
            float a[8], b[8];
            In<unsigned short>::load8(g + off + i, a);
            In<unsigned short>::load8(u + off + i, b);
            *reinterpret_cast<uint2*>(gq + off + i) = cast8<FMT_E4M3>(a, qg);
            *reinterpret_cast<uint2*>(uq + off + i) = cast8<FMT_E4M3>(b, qu);
        } else {
            gq[off + i] = q_e4m3(bf2f(g[off + i]), qg);
            uq[off + i] = q_e4m3(bf2f(u[off + i]), qu);
        }
    }
    if (amax) amax_commit(m, bad, amax, nonfinite);
}

template <int V>
__device__ void swiglu_bwd_q_impl(const unsigned char* gq, const float* gs, const unsigned char* uq,
                                  const float* us, const unsigned short* dy, unsigned short* dg, unsigned short* du, int F,
                                  unsigned* amax_g, unsigned* nonfinite_g, unsigned* amax_u,
                                  unsigned* nonfinite_u) {
    const size_t off = (size_t)blockIdx.x * F;
    const float fg = gs[blockIdx.x], fu = us[blockIdx.x];
    float mg = 0.f, mu = 0.f;
    int badg = 0, badu = 0;
    for (int i = threadIdx.x * V; i < F; i += blockDim.x * V) {
        unsigned char cg[V], cu[V];
        float d[V];
        if (V == 8) {
            const uint2 wg = *reinterpret_cast<const uint2*>(gq + off + i),
                        wu = *reinterpret_cast<const uint2*>(uq + off + i);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                cg[j] = (wg.x >> (8 * j)) & 0xffu, cg[j + 4] = (wg.y >> (8 * j)) & 0xffu;
                cu[j] = (wu.x >> (8 * j)) & 0xffu, cu[j + 4] = (wu.y >> (8 * j)) & 0xffu;
            }
            In<unsigned short>::load8(dy + off + i, d);
        } else {
            cg[0] = gq[off + i], cu[0] = uq[off + i], d[0] = bf2f(dy[off + i]);
        }
        unsigned short og[V], ou[V];
#pragma unroll
        for (int j = 0; j < V; j++) {
            swiglu_grad(e4m3_decode(cg[j]) * fg, e4m3_decode(cu[j]) * fu, d[j], og[j], ou[j]);
            amax_note(og[j], mg, badg);
            amax_note(ou[j], mu, badu);
        }
        if (V == 8) {
            *reinterpret_cast<uint4*>(dg + off + i) = pack8_bf16(og);
            *reinterpret_cast<uint4*>(du + off + i) = pack8_bf16(ou);
        } else {
            dg[off + i] = og[0], du[off + i] = ou[0];
        }
    }
    if (amax_g) amax_commit(mg, badg, amax_g, nonfinite_g);
    if (amax_u) amax_commit(mu, badu, amax_u, nonfinite_u);
}

#define SWIGLU_Q(SUFFIX, V)                                                                                    \
    extern "C" __global__ void swiglu_fwd_q##SUFFIX(const unsigned short* g, const unsigned short* u,           \
                                                    unsigned short* out, unsigned char* gq, float* gs,          \
                                                    unsigned char* uq, float* us, int F, unsigned* amax,        \
                                                    unsigned* nonfinite) {                                      \
        swiglu_fwd_q_impl<V>(g, u, out, gq, gs, uq, us, F, amax, nonfinite);                                   \
    }                                                                                                          \
    extern "C" __global__ void swiglu_bwd_q##SUFFIX(const unsigned char* gq, const float* gs,                   \
                                                    const unsigned char* uq, const float* us,                   \
                                                    const unsigned short* dy,                                   \
                                                    unsigned short* dg, unsigned short* du, int F,              \
                                                    unsigned* amax_g, unsigned* nonfinite_g, unsigned* amax_u,  \
                                                    unsigned* nonfinite_u) {                                    \
        swiglu_bwd_q_impl<V>(gq, gs, uq, us, dy, dg, du, F, amax_g, nonfinite_g, amax_u, nonfinite_u);         \
    }
SWIGLU_Q(, 1)
SWIGLU_Q(_v8, 8)
