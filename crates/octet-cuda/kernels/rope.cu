// Rotary position embedding of a Llama training step: forward on q and k,
// backward on their gradients. `rope_bwd_pair`, which the attention backward
// also uses, is in model.cuh.

// ---------------------------------------------------------------- RoPE

// Rotary embedding of (N, H * D) rows, pairs (i, i + D/2) rotated by the
// angle of position n % T; a thread takes V consecutive pairs (V = 4 when
// D/2 is a multiple of 4: 8-byte bf16 and 16-byte f32 accesses), grid-stride.
template <int V> __device__ __forceinline__ void ld_bf(const unsigned short* p, float* f) {
    if (V == 4) {
        const uint2 w = *reinterpret_cast<const uint2*>(p);
        f[0] = bf2f(w.x & 0xffff), f[1] = bf2f(w.x >> 16), f[2] = bf2f(w.y & 0xffff), f[3] = bf2f(w.y >> 16);
    } else {
#pragma unroll
        for (int j = 0; j < V; j++) f[j] = bf2f(p[j]);
    }
}
template <int V> __device__ __forceinline__ void st_bf(unsigned short* p, const unsigned short* b) {
    if (V == 4)
        *reinterpret_cast<uint2*>(p) =
            make_uint2((unsigned)b[0] | ((unsigned)b[1] << 16), (unsigned)b[2] | ((unsigned)b[3] << 16));
    else
#pragma unroll
        for (int j = 0; j < V; j++) p[j] = b[j];
}

// Forward, in place on bf16 q or k. A block takes whole rows (grid-stride
// over the N rows), its threads the row's H * D / (2 V) groups, with 32-bit
// index math (before, a flat 64-bit index cost four 64-bit divisions a group).
template <int V>
__device__ void rope_fwd_impl(unsigned short* x, const float* cs, const float* sn, int N, int T, int H, int D) {
    const int half = D / 2, groups = half / V, per_row = H * groups;
    for (int n = blockIdx.x; n < N; n += gridDim.x) {
        const int pos = n % T;
        for (int t = threadIdx.x; t < per_row; t += blockDim.x) {
            const int h = t / groups, i = (t - h * groups) * V;
            const Vf<V> c = ldv<V>(cs + pos * half + i), s = ldv<V>(sn + pos * half + i);
            unsigned short* p = x + (size_t)n * H * D + (size_t)h * D;
        float a[V], b[V];
        ld_bf<V>(p + i, a);
        ld_bf<V>(p + i + half, b);
        unsigned short lo[V], hi[V];
#pragma unroll
        for (int j = 0; j < V; j++) {
            lo[j] = f2bf(a[j] * c.v[j] - b[j] * s.v[j]);
            hi[j] = f2bf(b[j] * c.v[j] + a[j] * s.v[j]);
        }
            st_bf<V>(p + i, lo);
            st_bf<V>(p + i + half, hi);
        }
    }
}

// Backward: rotate the f32 gradient by the opposite angle, write bf16 (and
// its amax when `amax` is given); blocks and threads as in the forward.
template <int V>
__device__ void rope_bwd_impl(const float* dy, unsigned short* dx, const float* cs, const float* sn, int N, int T,
                              int H, int D, unsigned* amax, unsigned* nonfinite) {
    const int half = D / 2, groups = half / V, per_row = H * groups;
    float m = 0.f;
    int bad = 0;
    for (int n = blockIdx.x; n < N; n += gridDim.x) {
        const int pos = n % T;
        for (int t = threadIdx.x; t < per_row; t += blockDim.x) {
            const int h = t / groups, i = (t - h * groups) * V;
            const Vf<V> c = ldv<V>(cs + pos * half + i), s = ldv<V>(sn + pos * half + i);
            const size_t o = (size_t)n * H * D + (size_t)h * D;
        const Vf<V> a = ldv<V>(dy + o + i), b = ldv<V>(dy + o + i + half);
        unsigned short lo[V], hi[V];
#pragma unroll
        for (int j = 0; j < V; j++) {
            rope_bwd_pair(a.v[j], b.v[j], c.v[j], s.v[j], lo[j], hi[j]);
            amax_note(lo[j], m, bad);
            amax_note(hi[j], m, bad);
        }
            st_bf<V>(dx + o + i, lo);
            st_bf<V>(dx + o + i + half, hi);
        }
    }
    if (amax) amax_commit(m, bad, amax, nonfinite);
}

#define ROPE(V, SUFFIX)                                                                                        \
    extern "C" __global__ void rope_fwd##SUFFIX(unsigned short* x, const float* cs, const float* sn, int N,     \
                                                int T, int H, int D) {                                          \
        rope_fwd_impl<V>(x, cs, sn, N, T, H, D);                                                                \
    }                                                                                                           \
    extern "C" __global__ void rope_bwd##SUFFIX(const float* dy, unsigned short* dx, const float* cs,           \
                                                const float* sn, int N, int T, int H, int D, unsigned* amax,    \
                                                unsigned* nonfinite) {                                          \
        rope_bwd_impl<V>(dy, dx, cs, sn, N, T, H, D, amax, nonfinite);                                          \
    }
ROPE(1, )
ROPE(4, _v4)
