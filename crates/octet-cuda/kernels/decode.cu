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

// The norms keep up to NORM_REG elements a thread in registers (C up to
// 4096 with 1024 threads; the rest go through memory). Their weight g is
// constant (no kernel writes it), so they load it before `grid_wait`, while
// the kernel before them finishes; element i of a thread is
// threadIdx.x + i blockDim.x, summed in that order.
#define NORM_REG 4
__device__ __forceinline__ void load_norm_weight(const float* __restrict__ g, int C, float (&gr)[NORM_REG]) {
#pragma unroll
    for (int j = 0; j < NORM_REG; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        gr[j] = i < C ? g[i] : 0.f;
    }
}

// out = bf16(x / sqrt(mean(x^2) + eps) * g), one block per row of C.
extern "C" __global__ void rmsnorm_bf16(const float* x, const float* g, unsigned short* out, int C, float eps) {
    __shared__ float red[32];
    float gr[NORM_REG], vr[NORM_REG];
    load_norm_weight(g, C, gr);
    grid_wait();
    const float* r = x + (size_t)blockIdx.x * C;
    out += (size_t)blockIdx.x * C;
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < NORM_REG; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        vr[j] = i < C ? r[i] : 0.f;
        s += vr[j] * vr[j];
    }
    for (int i = threadIdx.x + NORM_REG * blockDim.x; i < C; i += blockDim.x) s += r[i] * r[i];
    s = block_sum(s, red);
    const float inv = rsqrtf(s / C + eps);
#pragma unroll
    for (int j = 0; j < NORM_REG; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        if (i < C) out[i] = f32_to_bf16(vr[j] * inv * gr[j]);
    }
    for (int i = threadIdx.x + NORM_REG * blockDim.x; i < C; i += blockDim.x) out[i] = f32_to_bf16(r[i] * inv * g[i]);
}

// x += y, then out = bf16(x / sqrt(mean(x^2) + eps) * g): the residual add
// of one block of the model and the norm of the next, one block a row of C
// (launched with 1024 threads: a few elements a thread, all loads in flight).
extern "C" __global__ void add_rmsnorm_bf16(float* x, const float* y, const float* g, unsigned short* out, int C,
                                            float eps) {
    __shared__ float red[32];
    float gr[NORM_REG], vr[NORM_REG];
    load_norm_weight(g, C, gr);
    grid_wait();
    x += (size_t)blockIdx.x * C;
    y += (size_t)blockIdx.x * C;
    out += (size_t)blockIdx.x * C;
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < NORM_REG; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        vr[j] = 0.f;
        if (i < C) {
            vr[j] = x[i] + y[i];
            x[i] = vr[j];
        }
        s += vr[j] * vr[j];
    }
    for (int i = threadIdx.x + NORM_REG * blockDim.x; i < C; i += blockDim.x) {
        const float v = x[i] + y[i];
        x[i] = v;
        s += v * v;
    }
    s = block_sum(s, red);
    const float inv = rsqrtf(s / C + eps);
#pragma unroll
    for (int j = 0; j < NORM_REG; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        if (i < C) out[i] = f32_to_bf16(vr[j] * inv * gr[j]);
    }
    // Past NORM_REG: each thread reads back the elements it wrote.
    for (int i = threadIdx.x + NORM_REG * blockDim.x; i < C; i += blockDim.x) out[i] = f32_to_bf16(x[i] * inv * g[i]);
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

// y (rows, width) += b (width): a projection's bias (Qwen2's q/k/v stacked as
// the qkv rows are, `attention_bias`'s o). Grid (ceil(width / threads), rows).
extern "C" __global__ void bias_rows(float* y, const float* b, int width) {
    grid_wait();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < width) y[(size_t)blockIdx.y * width + i] += b[i];
}

// Qwen3's per-head RMSNorm of the q and k heads of each row of qkv, in place
// before RoPE: head h < hq takes gain gq, the k heads gk (d floats each);
// x / sqrt(mean(x^2) + eps) * g. One warp a head (d <= 32 HN_R); grid
// (ceil((hq + hkv) / (threads / 32)), rows).
#define HN_R 8
extern "C" __global__ void head_norm_qk(float* qkv, const float* gq, const float* gk, int hq, int hkv, int d,
                                        float eps) {
    grid_wait();
    const int head = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (head >= hq + hkv) return;
    float* p = qkv + (size_t)blockIdx.y * (hq + 2 * hkv) * d + (size_t)head * d;
    const float* g = head < hq ? gq : gk;
    float v[HN_R];
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < HN_R; j++) {
        const int i = lane + 32 * j;
        v[j] = i < d ? p[i] : 0.f;
        ss += v[j] * v[j];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float r = rsqrtf(ss / (float)d + eps);
#pragma unroll
    for (int j = 0; j < HN_R; j++) {
        const int i = lane + 32 * j;
        if (i < d) p[i] = v[j] * r * g[i];
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
//   w, w + warps, ... of the run, ATT_U at a time, loading their keys and
//   values together (one memory round trip for both; two positions keep the
//   kernel at 76 registers, three 8-warp blocks an SM, so that the ~1B
//   model's 16 x 17 blocks fit at once on an H100), and keeps its own
//   softmax state (max m_w, sum l_w of exp(score - m_w), unnormalised
//   output), rescaled when the max grows. No block barrier until the warps
//   are done; the block then merges its warps in warp order.
// - Each block writes its run's max score m_s, sum of exp(score - m_s) and
//   unnormalised output to `part` ((R, hq, S, d + 2) floats). The last block
//   of a head to finish (a counter per row and head, reset by that block)
//   adds the runs in order s = 0, 1, ..., each weighted by exp(m_s - max m),
//   and divides by the weighted sums, so the result does not depend on
//   which block finished last. Every thread computes the weights itself
//   from the runs' maxima and sums (read once into shared memory).
// Shared memory (sized by the host, `attend_smem`): warps x d partial
// outputs and the warps' maxima and sums; reused for the runs' (<= 64).
#define ATT_R 8
#define ATT_U 2
extern "C" __global__ void __launch_bounds__(256, 3)
    attend_decode(const float* q, const float* kc, const float* vc, unsigned short* out, const int* state, int hq,
                  int hkv, int d, float scale, float* part, unsigned* count) {
    extern __shared__ float sm[];
    __shared__ bool last;
    const float LOW = -3.402823466e38f;
    grid_wait();
    const int row = blockIdx.z, len = state[0] + row + 1, runs = gridDim.y, run = blockIdx.y;
    q += (size_t)row * (hq + 2 * hkv) * d;
    out += (size_t)row * hq * d;
    part += (size_t)row * hq * runs * (d + 2);
    count += (size_t)row * hq;
    const int chunk = (len + runs - 1) / runs, j0 = min(len, run * chunk), j1 = min(len, j0 + chunk), n = j1 - j0;
    const int warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int h = blockIdx.x, kh = h / (hq / hkv), kvw = hkv * d;
    const float* qh = q + h * d;
    const float* kbase = kc + (size_t)j0 * kvw + kh * d;
    const float* vbase = vc + (size_t)j0 * kvw + kh * d;
    float qr[ATT_R], acc[ATT_R];
#pragma unroll
    for (int r = 0; r < ATT_R; r++) {
        qr[r] = lane + 32 * r < d ? qh[lane + 32 * r] : 0.f;
        acc[r] = 0.f;
    }
    float m = LOW, l = 0.f;
    for (int j = warp; j < n; j += ATT_U * warps) {
        float kr[ATT_U][ATT_R], vr[ATT_U][ATT_R];
#pragma unroll
        for (int u = 0; u < ATT_U; u++) {
            const int jj = j + u * warps;
            const float* kj = kbase + (size_t)jj * kvw;
            const float* vj = vbase + (size_t)jj * kvw;
#pragma unroll
            for (int r = 0; r < ATT_R; r++) {
                const bool in = jj < n && lane + 32 * r < d;
                kr[u][r] = in ? kj[lane + 32 * r] : 0.f;
                vr[u][r] = in ? vj[lane + 32 * r] : 0.f;
            }
        }
        float sc[ATT_U];
#pragma unroll
        for (int u = 0; u < ATT_U; u++) {
            sc[u] = 0.f;
#pragma unroll
            for (int r = 0; r < ATT_R; r++) sc[u] += qr[r] * kr[u][r];
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int u = 0; u < ATT_U; u++) sc[u] += __shfl_xor_sync(0xffffffffu, sc[u], o);
        // Position j (u = 0) is in the run, so the new max is finite.
        float mn = m;
#pragma unroll
        for (int u = 0; u < ATT_U; u++) {
            sc[u] *= scale;
            if (j + u * warps < n) mn = fmaxf(mn, sc[u]);
        }
        const float c = __expf(m - mn);
        l *= c;
#pragma unroll
        for (int r = 0; r < ATT_R; r++) acc[r] *= c;
#pragma unroll
        for (int u = 0; u < ATT_U; u++) {
            const float p = j + u * warps < n ? __expf(sc[u] - mn) : 0.f;
            l += p;
#pragma unroll
            for (int r = 0; r < ATT_R; r++) acc[r] += p * vr[u][r];
        }
        m = mn;
    }
    // The block's warps merged in warp order (a warp without positions has
    // l = 0 and weight 0).
    float* po = sm;
    float* wm = po + warps * d;
    float* wl = wm + warps;
#pragma unroll
    for (int r = 0; r < ATT_R; r++)
        if (lane + 32 * r < d) po[warp * d + lane + 32 * r] = acc[r];
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
    __syncthreads();
    float mx = LOW;
    for (int w = 0; w < warps; w++)
        if (wl[w] > 0.f) mx = fmaxf(mx, wm[w]);
    float* mine = part + ((size_t)h * runs + run) * (d + 2);
    for (int t = threadIdx.x; t < d; t += blockDim.x) {
        float o = 0.f;
        for (int w = 0; w < warps; w++)
            if (wl[w] > 0.f) o += __expf(wm[w] - mx) * po[w * d + t];
        mine[t] = o;
    }
    if (threadIdx.x == 0) {
        float tot = 0.f;
        for (int w = 0; w < warps; w++)
            if (wl[w] > 0.f) tot += __expf(wm[w] - mx) * wl[w];
        mine[d] = mx;
        mine[d + 1] = tot;
    }
    // Publish this run, then count it; the last run of the head combines.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(&count[h], 1u) == (unsigned)runs - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    // The runs' maxima and sums (read through L2, where the other blocks'
    // stores are) into shared memory; then thread t adds element t of the
    // runs in order.
    const float* all = part + (size_t)h * runs * (d + 2);
    float* rm = sm;
    float* rl = sm + runs;
    for (int r = threadIdx.x; r < runs; r += blockDim.x) {
        rm[r] = __ldcg(all + r * (d + 2) + d);
        rl[r] = __ldcg(all + r * (d + 2) + d + 1);
    }
    __syncthreads();
    float top = LOW;
    for (int r = 0; r < runs; r++)
        if (rl[r] > 0.f) top = fmaxf(top, rm[r]);
    for (int t = threadIdx.x; t < d; t += blockDim.x) {
        float o = 0.f, tot = 0.f;
#pragma unroll 4
        for (int r = 0; r < runs; r++) {
            const float wr = rl[r] > 0.f ? __expf(rm[r] - top) : 0.f;
            tot += wr * rl[r];
            o += wr * __ldcg(all + r * (d + 2) + t);
        }
        out[h * d + t] = f32_to_bf16(o / tot);
    }
    if (threadIdx.x == 0) count[h] = 0;
}

// out = bf16(silu(g) * u), n features a row from a row of 2n gate and up
// values in groups of `group` features: `group` gates, then their ups (8:
// mixed.cu's MODE_SWIGLU layout; n: all gates, then all ups).
extern "C" __global__ void swiglu_bf16(const float* gu, unsigned short* out, int n, int group) {
    grid_wait();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float* g = gu + (size_t)blockIdx.y * 2 * n + (size_t)(i / group) * 2 * group + i % group;
    out[(size_t)blockIdx.y * n + i] = f32_to_bf16(swiglu_f32(g[0], g[group]));
}

// The next token from one row of logits, on the device, as the host's
// `octet_nn::decode::sample` picks it: the logits ordered by f32 total order,
// largest first, ties to the lower index; greedy (the first) when the
// temperature is not above 0 or V = 1; otherwise the first `top_k` (all when
// 0) weighted by exp((l - l_max) / T) in f64, summed in that order, and the
// first whose running share exceeds the step's uniform u. The same f64
// arithmetic in the same order: the two agree unless the exponentials differ
// in their last bit (CUDA's and the host's `exp`) and u falls within that of
// a boundary.
// `gen` = (step n, top_k, temperature as f32 bits): takes u = uniforms[n],
// writes tokens[n], advances n, and makes the token the next step's input
// (state[1]) at the next position (state[0] + 1). A row with an inf or NaN
// logit writes -1 to tokens[n] (the host stops there with an error) and
// feeds token 0 onward, so later queued steps stay in bounds. One block of
// 1024 threads, V <= SAMPLE_MAX (the host checks).
#define SAMPLE_MAX 2048
extern "C" __global__ void __launch_bounds__(1024) sample_token(const float* logits, int V, const double* uniforms,
                                                                int* gen, int* state, int* tokens) {
    __shared__ unsigned long long key[SAMPLE_MAX];
    __shared__ double w[SAMPLE_MAX];
    __shared__ double total;
    __shared__ int nonfinite;
    if (threadIdx.x == 0) nonfinite = 0;
    __syncthreads();
    int P = 1;
    while (P < V) P <<= 1;
    // Key: the total-order image of the bits (ascending as unsigned) above
    // the complement of the index, so that one descending sort orders by
    // value, then by lower index. Padding (0) sorts last.
    for (int i = threadIdx.x; i < P; i += blockDim.x) {
        unsigned long long c = 0;
        if (i < V) {
            const unsigned b = __float_as_uint(logits[i]);
            if ((b & 0x7f800000u) == 0x7f800000u) nonfinite = 1;
            const unsigned k = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
            c = ((unsigned long long)k << 32) | (0xffffffffu - (unsigned)i);
        }
        key[i] = c;
    }
    __syncthreads();
    // Bitonic sort, descending.
    for (int size = 2; size <= P; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int t = threadIdx.x; t < P / 2; t += blockDim.x) {
                const int lo = 2 * t - (t & (stride - 1)), hi = lo + stride;
                const bool desc = (lo & size) == 0;
                const unsigned long long a = key[lo], b = key[hi];
                if ((a < b) == desc) {
                    key[lo] = b;
                    key[hi] = a;
                }
            }
            __syncthreads();
        }
    const int n = gen[0], top_k = gen[1];
    const float T = __int_as_float(gen[2]);
    auto index = [&](int j) { return (int)(0xffffffffu - (unsigned)(key[j] & 0xffffffffu)); };
    int pick = index(0);
    if (!(T <= 0.f) && V > 1) {
        const int keep = top_k <= 0 ? V : min(top_k, V);
        const double top = (double)logits[pick];
        for (int j = threadIdx.x; j < keep; j += blockDim.x) w[j] = exp(((double)logits[index(j)] - top) / (double)T);
        __syncthreads();
        if (threadIdx.x == 0) {
            double s = 0.0;
            for (int j = 0; j < keep; j++) s += w[j];
            total = s;
        }
        __syncthreads();
        for (int j = threadIdx.x; j < keep; j += blockDim.x) w[j] = w[j] / total;
        __syncthreads();
        if (threadIdx.x == 0) {
            const double u = uniforms[n];
            double acc = 0.0;
            pick = index(keep - 1);
            for (int j = 0; j < keep; j++) {
                acc += w[j];
                if (u < acc) {
                    pick = index(j);
                    break;
                }
            }
        }
    }
    if (threadIdx.x == 0) {
        tokens[n] = nonfinite ? -1 : pick;
        gen[0] = n + 1;
        state[0] += 1;
        state[1] = nonfinite ? 0 : pick;
    }
}
