// Shared device helpers of octet's CUDA kernels. Header-free on purpose: NVRTC
// compiles these without the toolkit's include directory (bf16 is widened by
// a shift, FP8 is written with inline PTX), so CI only needs libnvrtc.
//
// This file is pasted in front of each kernel source by the host (see
// `KERNEL_SOURCES` in lib.rs), not #included, so every kernel is one
// self-contained string whose hash keys the cache.

// bf16 bits -> f32: exact (bf16 is the upper half of an f32).
__device__ __forceinline__ float bf16_lo(unsigned int w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(unsigned int w) { return __uint_as_float(w & 0xffff0000u); }

// NaN or inf, on the bits (no math header needed).
__device__ __forceinline__ int nonfinite_f32(float f) {
    return (__float_as_uint(f) & 0x7f800000u) == 0x7f800000u;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Element formats, as template arguments.
#define FMT_E4M3 0
#define FMT_E5M2 1

// FP8 conversions. sm_89 and later convert in hardware (`cvt` with
// `.e4m3x2` / `.e5m2x2`). sm_80, sm_86 and sm_87 have no such instruction and
// take the exact integer paths below; `OCTET_FP8_CONVERT=soft` (which the host
// turns into `#define OCTET_SOFT_FP8`) selects them on any GPU, so that an
// FP8-capable machine can check them against the CPU. Both give the same
// bits (`octet selftest`'s exhaustive cases: every code decoded, every bf16
// value encoded).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && !defined(OCTET_SOFT_FP8)
#define OCTET_FP8_HW 1
#else
#define OCTET_FP8_HW 0
#endif

// One float -> its FP8 code, round to nearest even, saturating to the
// format's max (infinities included), NaN -> NaN with its sign: octet_fp8's
// `encode_minifloat` step for step. Normal targets round by an integer add at
// the last kept mantissa bit; subnormal targets let the FPU round, adding a
// power of two whose unit in the last place is the subnormal quantum.
template <int FMT>
__device__ __forceinline__ unsigned int fp8_encode_soft(float x) {
    constexpr int MAN = FMT == FMT_E4M3 ? 3 : 2, BIAS = FMT == FMT_E4M3 ? 7 : 15;
    constexpr unsigned int SHIFT = 23 - MAN, MAXC = FMT == FMT_E4M3 ? 0x7eu : 0x7bu;
    const unsigned int bits = __float_as_uint(x), a = bits & 0x7fffffffu;
    const unsigned int normal =
        (a - ((unsigned int)(127 - BIAS) << 23) + (1u << (SHIFT - 1)) - 1u + ((a >> SHIFT) & 1u)) >> SHIFT;
    const float magic = __uint_as_float((unsigned int)(1 - BIAS - MAN + 23 + 127) << 23);
    const unsigned int sub = __float_as_uint(__fadd_rn(__uint_as_float(a), magic)) - __float_as_uint(magic);
    unsigned int code = a < ((unsigned int)(1 - BIAS + 127) << 23) ? sub : normal;
    code = min(code, MAXC);
    if (a > 0x7f800000u) code = 0x7fu;
    return code | ((bits >> 24) & 0x80u);
}

// Two floats -> two FP8 codes with round-to-nearest-even and saturation to the
// format's max (octet_fp8's Overflow::Saturate; NaN stays NaN). `lo` lands in
// the low byte, i.e. at the lower address. PTX takes the high element first.
template <int FMT>
__device__ __forceinline__ unsigned int cvt_fp8x2(float lo, float hi) {
#if OCTET_FP8_HW
    unsigned short r;
    if (FMT == FMT_E4M3) {
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    } else {
        asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    }
    return r;
#else
    return fp8_encode_soft<FMT>(lo) | (fp8_encode_soft<FMT>(hi) << 8);
#endif
}

// Eight floats times `scale` (one IEEE f32 multiply each, as the CPU does) -> 8 codes.
template <int FMT>
__device__ __forceinline__ uint2 cast8(const float f[8], float scale) {
    uint2 o;
    o.x = cvt_fp8x2<FMT>(__fmul_rn(f[0], scale), __fmul_rn(f[1], scale)) |
          (cvt_fp8x2<FMT>(__fmul_rn(f[2], scale), __fmul_rn(f[3], scale)) << 16);
    o.y = cvt_fp8x2<FMT>(__fmul_rn(f[4], scale), __fmul_rn(f[5], scale)) |
          (cvt_fp8x2<FMT>(__fmul_rn(f[6], scale), __fmul_rn(f[7], scale)) << 16);
    return o;
}

// octet_fp8::scale::scale_from_amax(amax, fmt, margin = 0, power_of_two):
// amax 0 -> 1; fmax / amax in IEEE f32 division; a non-finite quotient -> f32::MAX;
// with pow2, rounded down to a power of two (scale::floor_pow2).
__device__ __forceinline__ float scale_from_amax(float amax, float fmax, int pow2) {
    if (amax == 0.f) return 1.f;
    float s = __fdiv_rn(fmax, amax);
    if (nonfinite_f32(s)) s = 3.402823466e38f;
    if (pow2) {
        unsigned int b = __float_as_uint(s);
        if ((b >> 23) == 0) {
            b = 1u << (31 - __clz(b));
        } else {
            b &= 0xff800000u;
        }
        s = __uint_as_float(b);
    }
    return s;
}

// Input element types: `unsigned short` holds bf16 bits, `float` is f32.
// load8 reads 8 consecutive elements (16-byte aligned vector loads).
template <typename T> struct In;
template <> struct In<unsigned short> {
    static __device__ __forceinline__ void load8(const unsigned short* p, float f[8]) {
        uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
        f[0] = bf16_lo(v.x); f[1] = bf16_hi(v.x);
        f[2] = bf16_lo(v.y); f[3] = bf16_hi(v.y);
        f[4] = bf16_lo(v.z); f[5] = bf16_hi(v.z);
        f[6] = bf16_lo(v.w); f[7] = bf16_hi(v.w);
    }
    static __device__ __forceinline__ float load1(const unsigned short* p) {
        return bf16_lo(*p);
    }
};
template <> struct In<float> {
    static __device__ __forceinline__ void load8(const float* p, float f[8]) {
        float4 a = __ldg(reinterpret_cast<const float4*>(p));
        float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
        f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w;
        f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
    }
    static __device__ __forceinline__ float load1(const float* p) { return *p; }
};

// f16x2 bits -> two f32, exactly.
__device__ __forceinline__ void f16x2_to_f32x2(unsigned int h, float& lo, float& hi) {
    asm("{\n\t.reg .f16 l, u;\n\tmov.b32 {l, u}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, u;\n\t}"
        : "=f"(lo), "=f"(hi)
        : "r"(h));
}

// Two E4M3 codes (the low two bytes of `two`, low byte first) -> bf16x2 (the
// low byte's in the low half), exactly, without FP8 instructions. A byte
// permute puts each code in the low byte of its half and its sign in every
// bit of the high byte; shifted left by 4 and masked, that is a bf16 with the
// code's sign, its exponent bits as the low four of bf16's exponent and its
// mantissa bits as the top three of bf16's: the code's value times 2^-120
// (E4M3 subnormals land on bf16 subnormals, the same quantum times 2^-120).
// One bf16x2 multiply by 2^120 is exact (`fma` with -0 added keeps +-0;
// `mul.bf16x2` needs sm_90). Four instructions a pair, as many as the
// hardware path. The NaN codes (0x7f, 0xff) read +-480 that way: with
// `WITH_NAN`, a few more (six in SASS) set them to NaN; without, the caller
// guarantees there are none (the weight-only products: `Fp8Weight` refuses
// NaN codes).
template <bool WITH_NAN>
__device__ __forceinline__ unsigned int e4m3x2_to_bf16x2_soft(unsigned int two) {
    unsigned int w, r;
    asm("prmt.b32 %0, %1, 0, 0x9180;" : "=r"(w) : "r"(two)); // [code 0, sign 0, code 1, sign 1]
    const unsigned int bits = (w << 4) & 0x87f087f0u;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(bits), "r"(0x7b807b80u), "r"(0x80008000u));
    if (WITH_NAN) {
        const unsigned int nan = ((w & 0x007f007fu) + 0x00010001u) & 0x00800080u; // magnitude 0x7f
        r |= (nan >> 7) * 0x7fc0u;
    }
    return r;
}

#if OCTET_FP8_HW
// Two FP8 codes (low byte first) -> f16x2, by the hardware conversion (exact).
template <int FMT> __device__ __forceinline__ unsigned int fp8x2_to_f16x2(unsigned short v) {
    unsigned int h;
    if (FMT == FMT_E4M3) {
        asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(v));
    } else {
        asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(h) : "h"(v));
    }
    return h;
}
#endif

// Two FP8 codes (low byte first) -> two f32, exactly. Hardware: FP8 -> f16x2,
// then f16 -> f32. Without it: E5M2 is the top byte of an f16 (a byte
// permute), E4M3 goes through `e4m3x2_to_bf16x2_soft`. `WITH_NAN = false`: the
// codes are known not to be NaN (see there; no difference in hardware).
template <int FMT, bool WITH_NAN = true>
__device__ __forceinline__ void fp8x2_to_f32x2(unsigned int two, float& lo, float& hi) {
#if OCTET_FP8_HW
    f16x2_to_f32x2(fp8x2_to_f16x2<FMT>((unsigned short)two), lo, hi);
#else
    if (FMT == FMT_E4M3) {
        const unsigned int b = e4m3x2_to_bf16x2_soft<WITH_NAN>(two);
        lo = bf16_lo(b);
        hi = bf16_hi(b);
    } else {
        f16x2_to_f32x2(__byte_perm(two, 0, 0x1404), lo, hi);
    }
#endif
}

// One FP8 code (the low byte of `code`; the next byte is ignored) -> f32, exactly.
template <int FMT> __device__ __forceinline__ float fp8_decode(unsigned int code) {
#if OCTET_FP8_HW
    float v;
    asm("{\n\t.reg .f16 l, u;\n\tmov.b32 {l, u}, %1;\n\tcvt.f32.f16 %0, l;\n\t}"
        : "=f"(v)
        : "r"(fp8x2_to_f16x2<FMT>((unsigned short)code)));
    return v;
#else
    float lo, hi;
    fp8x2_to_f32x2<FMT>(code, lo, hi);
    return lo;
#endif
}
__device__ __forceinline__ float e4m3_decode(unsigned int code) { return fp8_decode<FMT_E4M3>(code); }

// Two FP8 codes (low byte first) -> two bf16 (low half first), exactly: f32 ->
// bf16 is exact for every FP8 value (E4M3 and E5M2 values fit bf16's
// exponent and mantissa). `WITH_NAN` as for `fp8x2_to_f32x2`.
template <int FMT, bool WITH_NAN = true>
__device__ __forceinline__ unsigned int fp8x2_to_bf16x2(unsigned int two) {
#if !OCTET_FP8_HW
    if (FMT == FMT_E4M3) return e4m3x2_to_bf16x2_soft<WITH_NAN>(two);
#endif
    float lo, hi;
    fp8x2_to_f32x2<FMT, WITH_NAN>(two, lo, hi);
    unsigned int r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// E4M3 -> f16x2 in integer code (GPUs without FP8 instructions): the
// magnitude shifted into an f16's exponent and mantissa is the value times
// 2^-8 (normal and subnormal codes alike: f16's exponent bias is 8 above
// E4M3's and its subnormals reach 2^-24), and one f16x2 multiply by 2^8
// restores it exactly. `WITH_NAN` as for `e4m3x2_to_bf16x2_soft`.
template <bool WITH_NAN>
__device__ __forceinline__ unsigned int e4m3x2_to_f16x2_soft(unsigned int two) {
    unsigned int w, r;
    asm("prmt.b32 %0, %1, 0, 0x9180;" : "=r"(w) : "r"(two)); // [code 0, sign 0, code 1, sign 1]
    const unsigned int bits = (w << 7) & 0xbf80bf80u;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(bits), "r"(0x5c005c00u));
    if (WITH_NAN) {
        const unsigned int nan = ((w & 0x007f007fu) + 0x00010001u) & 0x00800080u; // magnitude 0x7f
        r |= (nan >> 7) * 0x7e00u;
    }
    return r;
}

// Two FP8 codes (low byte first) -> f16x2 (low half first), exactly: every
// E4M3 and E5M2 value is an f16. One instruction where the GPU converts
// FP8; without, E5M2 is the top byte of an f16 (a byte permute) and E4M3
// goes through `e4m3x2_to_f16x2_soft`.
template <int FMT, bool WITH_NAN = true>
__device__ __forceinline__ unsigned int fp8x2_to_f16x2_exact(unsigned int two) {
#if OCTET_FP8_HW
    return fp8x2_to_f16x2<FMT>((unsigned short)two);
#else
    if (FMT == FMT_E4M3) return e4m3x2_to_f16x2_soft<WITH_NAN>(two);
    return __byte_perm(two, 0, 0x1404);
#endif
}

// Two FP8 codes, bytes 0-1 of `word` (`sel` 0x9180) or bytes 2-3 (0xb3a2),
// -> bf16x2 (low code first), exactly, in integer code and one bf16 FMA on
// any GPU: the byte permute puts each code beside a byte of its sign, and
// its exponent and mantissa shifted into a bf16 (E4M3 by 4, E5M2 by 5) are
// the value times 2^-120 (E4M3) or 2^-112 (E5M2), subnormal codes too, which
// the FMA restores (adding -0 keeps -0). Four instructions a pair, where
// the hardware conversion takes four and a shift for bytes 2-3. NaN codes
// (and E5M2's infinities) read as finite values: for weights, which hold
// none (`Fp8Weight` refuses them).
// The bf16x2 bits of that pair before the FMA (`fp8x2_bf16_bits`), the value
// times 2^-120 / 2^-112: E4M3 (s eeee mmm) lands in bf16 exponent bits 7-10
// and mantissa 4-6, E5M2 (s eeeee mm) in exponent 7-11 and mantissa 5-6; the
// sign comes from the replicated byte.
template <int FMT>
__device__ __forceinline__ unsigned int fp8x2_bf16_bits(unsigned int word, unsigned int sel) {
    unsigned int w;
    asm("prmt.b32 %0, %1, 0, %2;" : "=r"(w) : "r"(word), "r"(sel)); // [code 0, sign 0, code 1, sign 1]
    return FMT == FMT_E4M3 ? (w << 4) & 0x87f087f0u : (w << 5) & 0x8fe08fe0u;
}
template <int FMT>
__device__ __forceinline__ unsigned int fp8x2_sel_to_bf16x2(unsigned int word, unsigned int sel) {
    unsigned int r;
    const unsigned int bits = fp8x2_bf16_bits<FMT>(word, sel);
    // 2^120 = 0x7b80, 2^112 = 0x7780 in bf16.
    const unsigned int pow2 = FMT == FMT_E4M3 ? 0x7b807b80u : 0x77807780u;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(bits), "r"(pow2), "r"(0x80008000u));
    return r;
}

// Two FP8 codes -> the activations' 16-bit type, f16 (`XF16`) or bf16.
template <int FMT, bool XF16>
__device__ __forceinline__ unsigned int fp8x2_to_x2(unsigned int two) {
    return XF16 ? fp8x2_to_f16x2_exact<FMT, false>(two) : fp8x2_to_bf16x2<FMT, false>(two);
}

// ---------------------------------------------------------------- mma.sync

// c (16 x 8 f32) += A (16 x 16, registers a0..a3 in mma's A-fragment
// layout) B (16 x 8, b0, b1), A and B in f16 (`XF16`) or bf16: thread (g =
// lane / 4, t = lane % 4) holds A[g][2t, 2t+1] (a0), A[g+8][2t, 2t+1] (a1),
// A[g][2t+8, 2t+9] (a2), A[g+8][2t+8, 2t+9] (a3), B[2t, 2t+1][g] (b0),
// B[2t+8, 2t+9][g] (b1), and c[0..1] = C[g][2t, 2t+1], c[2..3] = C[g+8][2t, 2t+1].
#define MMA_16816(TY)                                                                                    \
    "mma.sync.aligned.m16n8k16.row.col.f32." TY "." TY ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "         \
    "{%8, %9}, {%0, %1, %2, %3};"
#define MMA_16816_OPERANDS                                                                               \
    : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                                     \
    : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1)
template <bool XF16>
__device__ __forceinline__ void mma_x(float c[4], unsigned int a0, unsigned int a1, unsigned int a2,
                                      unsigned int a3, unsigned int b0, unsigned int b1) {
    if (XF16)
        asm volatile(MMA_16816("f16") MMA_16816_OPERANDS);
    else
        asm volatile(MMA_16816("bf16") MMA_16816_OPERANDS);
}
#undef MMA_16816
#undef MMA_16816_OPERANDS

// The bf16 product (`mma_x<false>`).
__device__ __forceinline__ void mma_bf16(float c[4], unsigned int a0, unsigned int a1, unsigned int a2,
                                         unsigned int a3, unsigned int b0, unsigned int b1) {
    mma_x<false>(c, a0, a1, a2, a3, b0, b1);
}

// Word i (0..3) of a 16-byte vector.
__device__ __forceinline__ unsigned int word(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// ---------------------------------------------------------------- shared memory, cp.async, wgmma

__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// 16 bytes global -> shared, asynchronously; `bytes` < 16 zero-fills the rest
// (0: all zeros, and `src` is not read).
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;"); }
// The "memory" clobber keeps the compiler from moving shared-memory reads of
// the copied data above the wait (the barriers that follow every use were
// compiler barriers already: the SASS of mixed, lora and train is unchanged).
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Hopper's warpgroup MMA (sm_90a only). Shared-memory operands use the
// 128-byte-swizzled layout described in attention.cu (attention on wgmma).

// A 128-byte-swizzle descriptor: start address, leading and stride byte offsets.
__device__ __forceinline__ unsigned long long wg_desc(unsigned addr, unsigned lbo, unsigned sbo) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
           ((unsigned long long)(sbo >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Wait until at most N committed wgmma groups of this warpgroup are pending.
template <int N> __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void wg_wait0() { wg_wait<0>(); }
// Registers an asynchronous wgmma writes must not be read (or moved) across
// its wait: this empty asm makes each use depend on a point after the wait.
template <int N> __device__ __forceinline__ void wg_hold(float (&d)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[i][e])::"memory");
}

// ---- TMA (the tensor memory accelerator) and mbarriers, sm_90a

// A CUtensorMap (cuda.h's CUtensorMap_st), passed by value as a
// __grid_constant__ kernel parameter and read by the TMA unit.
struct alignas(128) TmaMap {
    unsigned long long opaque[16];
};

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}
// One arrival that also expects `bytes` more bytes of transactions.
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// Spin until the barrier's phase with this parity has completed.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    asm volatile("{\n.reg .pred p;\nMBAR_WAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra MBAR_WAIT;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}
// The box of `map` at (column c0, row c1) into shared memory at `dst`
// (swizzled as the map says; zeros outside the tensor), completing `bytes`
// on barrier `bar`.
__device__ __forceinline__ void tma_load_2d(unsigned dst, const TmaMap* map, int c0, int c1, unsigned bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
                 "l"(map), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void tma_load_3d(unsigned dst, const TmaMap* map, int c0, int c1, int c2, unsigned bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(dst),
                 "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void tma_load_4d(unsigned dst, const TmaMap* map, int c0, int c1, int c2, int c3,
                                            unsigned bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(dst),
                 "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
                 : "memory");
}
// Thread 0 initialises N one-arrival barriers at `bars` (8 bytes apart) and
// makes them visible (to the async proxy too); then the block syncs.
template <int N> __device__ __forceinline__ void mbar_setup(unsigned bars) {
    if (threadIdx.x == 0) {
#pragma unroll
        for (int b = 0; b < N; b++) mbar_init(bars + 8 * b, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
}

#endif

// Programmatic dependent launch (sm_90 and later; no-ops before, and when the
// launch did not allow it): `grid_wait` returns once the kernels this one
// depends on have completed and their writes are visible; `grid_trigger`
// lets the next kernel, if launched as a dependent, start its blocks.
__device__ __forceinline__ void grid_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_trigger() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// SwiGLU of one feature, silu(a) * u in f32, as the decoder's kernels
// compute it wherever they apply it (the gate/up product's epilogue in
// mixed.cu, `swiglu_bf16` in decode.cu), so the two give the same bits.
__device__ __forceinline__ float swiglu_f32(float a, float u) { return a / (1.f + __expf(-a)) * u; }
