// NVFP4 on the device, for the emulated path (sm_90 has no FP4 tensor cores):
// E2M1 elements in 1x16 (activations, gradients) or 16x16 (weights) blocks,
// E4M3 block scales under an f32 per-tensor scale, packed two codes per byte
// (low nibble first), stochastic rounding for gradients. Bit-exact with
// octet_fp8::quantize: the same integer encoder (format.rs's nearest_code /
// stochastic_code, the SplitMix bits of sr_bits(seed, index)), the same f32
// operations in the same order. Written for clarity over speed: one thread per
// block for the scales, one per output byte for the codes.

__device__ __forceinline__ unsigned int sr_bits(unsigned long long seed, unsigned long long index) {
    unsigned long long z = seed ^ (index * 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (unsigned int)(z ^ (z >> 31));
}

// E2M1: 1 mantissa bit, bias 1, max code 7 (6.0), no NaN/inf (saturates to 7).
__device__ __forceinline__ unsigned int e2m1_encode(float x, int stochastic, unsigned int r) {
    const unsigned int bits = __float_as_uint(x);
    const unsigned int sign = (bits >> 31) << 3;
    const unsigned int abs = bits & 0x7fffffffu;
    unsigned int code;
    if (!stochastic) {
        const unsigned int odd = (abs >> 22) & 1u;
        const unsigned int rebias = 126u << 23;
        const unsigned int normal = (abs - rebias + ((1u << 21) - 1u + odd)) >> 22;
        const float magic = __uint_as_float(149u << 23);  // 2^22: ulp = the subnormal quantum 0.5
        const unsigned int sub = __float_as_uint(__fadd_rn(__uint_as_float(abs), magic)) - __float_as_uint(magic);
        code = abs < (127u << 23) ? sub : normal;
    } else {
        const int exp32 = (int)(abs >> 23);
        const unsigned int m = exp32 == 0 ? abs : ((abs & 0x7fffffu) | 0x800000u);
        const int e = max(exp32, 1) - 127;
        // As the CPU's stochastic_code: up to 31 dropped bits the low bits
        // of r decide; beyond, the value rounds up with probability
        // floor(m 2^(32 - shift)) / 2^32.
        const unsigned int shift = (unsigned int)(22 + max(-e, 0));
        unsigned int q;
        if (shift <= 31u) {
            const unsigned int mask = (1u << shift) - 1u;
            q = (m + (r & mask)) >> shift;
        } else {
            const unsigned long long t = shift < 64u ? ((unsigned long long)m << 32) >> shift : 0ull;
            q = (unsigned int)((t + r) >> 32);
        }
        code = ((unsigned int)max(e, 0) << 1) + q;
    }
    if (code > 7u) code = 7u;
    if (abs > 0x7f800000u) code = 7u;
    return code | sign;
}

__device__ __forceinline__ float e2m1_decode(unsigned int c) {
    const float mag[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
    const float v = mag[c & 7u];
    return (c & 8u) ? -v : v;
}


// Element (r, c) of the copy: the input or its transpose.
__device__ __forceinline__ float elem(const unsigned short* x, int src_cols, int transposed, int r, int c) {
    return bf16_lo(transposed ? x[(size_t)c * src_cols + r] : x[(size_t)r * src_cols + c]);
}

// The per-tensor encode scale, as octet_fp8's quantize: 448 * 6 / amax rounded
// once (Transformer Engine's order), f32::MAX if not finite, 6 for amax 0.
__device__ __forceinline__ float nv_global(const unsigned int* amax_bits) {
    const float amax = __uint_as_float(*amax_bits);
    if (amax == 0.f) return 6.f;
    float g = __fdiv_rn(2688.f, amax);
    if (nonfinite_f32(g)) g = 3.402823466e38f;
    return g;
}

// One thread per block of the copy (rows x cols, blocks br x 16): the E4M3
// scale code and the element multiplier global / decode(code) (0 if it decodes to 0).
extern "C" __global__ void nv_scales(const unsigned short* x, int src_rows, int src_cols, int transposed, int br,
                                     const unsigned int* amax_bits, unsigned char* codes, float* muls,
                                     float* global_out) {
    const int rows = transposed ? src_cols : src_rows, cols = transposed ? src_rows : src_cols;
    const int gr = (rows + br - 1) / br, gc = (cols + 15) / 16;
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    const float g = nv_global(amax_bits);
    if (b == 0) *global_out = g;
    if (b >= gr * gc) return;
    const int r0 = (b / gc) * br, c0 = (b % gc) * 16;
    float m = 0.f;
    for (int r = r0; r < min(r0 + br, rows); r++)
        for (int c = c0; c < min(c0 + 16, cols); c++) m = fmaxf(m, fabsf(elem(x, src_cols, transposed, r, c)));
    const unsigned int code = cvt_fp8x2<FMT_E4M3>(__fmul_rn(__fdiv_rn(m, 6.f), g), 0.f) & 0xffu;
    const float d = e4m3_decode(code);
    codes[b] = (unsigned char)code;
    // Capped at the largest float, as Transformer Engine does: with a tiny
    // amax the global is capped too, and g / d would be infinite (0 * inf =
    // NaN, which E2M1 saturates).
    muls[b] = d == 0.f ? 0.f : fminf(__fdiv_rn(g, d), 3.402823466e38f);
}

// One thread per output byte (two codes) of the copy; index of element (r, c)
// for stochastic rounding: r * cols + c.
extern "C" __global__ void nv_encode(const unsigned short* x, int src_rows, int src_cols, int transposed, int br,
                                     const float* muls, unsigned long long seed, int stochastic,
                                     unsigned char* out) {
    const int rows = transposed ? src_cols : src_rows, cols = transposed ? src_rows : src_cols;
    const int stride = (cols + 1) / 2, gc = (cols + 15) / 16;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * stride) return;
    const int r = (int)(i / stride), j = (int)(i % stride);
    const int c = 2 * j;
    const float mul = muls[(r / br) * gc + c / 16];
    const unsigned long long idx = (unsigned long long)r * cols + c;
    const unsigned int lo = e2m1_encode(__fmul_rn(elem(x, src_cols, transposed, r, c), mul), stochastic,
                                        stochastic ? sr_bits(seed, idx) : 0u);
    unsigned int hi = 0;
    if (c + 1 < cols)
        hi = e2m1_encode(__fmul_rn(elem(x, src_cols, transposed, r, c + 1), mul), stochastic,
                         stochastic ? sr_bits(seed, idx + 1) : 0u);
    out[i] = (unsigned char)(lo | (hi << 4));
}

// bf16 (rows, cols) = e2m1(code) * e4m3(block scale): exact (at most 5
// significant bits); the per-tensor 1/global applies after the GEMM.
extern "C" __global__ void nv_dequant(const unsigned char* packed, const unsigned char* codes, int rows, int cols,
                                      int br, unsigned short* out) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * cols) return;
    const int r = (int)(i / cols), c = (int)(i % cols);
    const int stride = (cols + 1) / 2, gc = (cols + 15) / 16;
    const unsigned int byte = packed[(size_t)r * stride + c / 2];
    const float v = __fmul_rn(e2m1_decode((c & 1) ? (byte >> 4) : (byte & 15u)), e4m3_decode(codes[(r / br) * gc + c / 16]));
    unsigned short o;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(o) : "f"(v));
    out[i] = o;
}

// y = acc * (1/ga * 1/gb) in f32 (the CPU's tensor factors), then to the output type.
// `add`: y += the product (a GEMM into an accumulating destination).
extern "C" __global__ void nv_finish_f32(const float* acc, const float* ga, const float* gb, float* y, int n, int add) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = __fmul_rn(acc[i], __fmul_rn(__fdiv_rn(1.f, *ga), __fdiv_rn(1.f, *gb)));
    y[i] = add ? y[i] + v : v;
}
extern "C" __global__ void nv_finish_bf16(const float* acc, const float* ga, const float* gb, unsigned short* y, int n,
                                          int add) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float v = __fmul_rn(acc[i], __fmul_rn(__fdiv_rn(1.f, *ga), __fdiv_rn(1.f, *gb)));
    if (add) v += __uint_as_float((unsigned)y[i] << 16);
    unsigned short o;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(o) : "f"(v));
    y[i] = o;
}

// bf16 (rows, cols) = (e2m1(code) * e4m3(block scale)) * (1 / global) in f32,
// rounded once: the dequantized backward's operand (the CPU keeps it in f32).
extern "C" __global__ void nv_dequant_full(const unsigned char* packed, const unsigned char* codes, int rows, int cols,
                                           int br, const float* global, unsigned short* out) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * cols) return;
    const int r = (int)(i / cols), c = (int)(i % cols);
    const int stride = (cols + 1) / 2, gc = (cols + 15) / 16;
    const unsigned int byte = packed[(size_t)r * stride + c / 2];
    const float v = __fmul_rn(__fmul_rn(e2m1_decode((c & 1) ? (byte >> 4) : (byte & 15u)),
                                        e4m3_decode(codes[(r / br) * gc + c / 16])),
                              __fdiv_rn(1.f, *global));
    unsigned short o;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(o) : "f"(v));
    out[i] = o;
}
