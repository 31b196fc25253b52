// Weight-only FP8 products: y (M, N) = x (M, K) @ W^T with x in bf16 or f16,
// W (N, K) stored as FP8 codes (E4M3 or E5M2) and f32 dequantization factors
// per tensor, per row, or per 128x128 tile. FP8 codes are upcast to x's type
// in registers on their way to the tensor cores; the FP8 bytes are all that
// moves from memory for the weight.
//
// x's type is a template parameter (`XF16`) of every kernel. Both hold every
// FP8 value exactly. To f16 a pair of codes is one conversion instruction
// (FP8 -> f16x2); to bf16 it is four (FP8 -> f16x2, two f16 -> f32, f32x2 ->
// bf16x2), which is what bounds the small-M kernel at 16 tokens on the
// smaller weights (docs/design.md). This is the
// trade ComfyUI-FeatherOps makes with f16 activations and E5M2 weights.
//
// Two layouts of the codes, both read by every kernel here:
// - row-major (N, K), as cuBLASLt's FP8 GEMMs take them (the LoRA base);
// - tiled (ceil(N/16), ceil(K/128), 16, 128): tile (t, b) holds rows
//   16t..16t+15, columns 128b..128b+127, each row's 128 codes contiguous,
//   zero past N and K. One small-M warp copy (16 rows x 128 columns) is one
//   contiguous 2 KiB run, and a block's 16 rows one run of 16 ceil(K/128)
//   x 128 bytes. Measured on the H100:
//   +0.00 to +0.06 of copy bandwidth at 1 to 16 tokens over row-major (least
//   on the smallest weight), whose warp copies gather 16 pieces of 128 bytes
//   K bytes apart.
// The host passes the layout as the MODE_TILED bit of `mode` (the wgmma and
// upcast kernels) or picks the `...t` small-M kernels.
//
// Small M (up to 64): `mixed_small_m`. A block owns RT tiles of 16 weight
// rows (RT = 1, or 4 or 2 for 16 tokens on weights whose 64- or 32-row blocks
// still fill the SMs: each x tile a warp copies then serves RT tiles of codes) and a
// group of up to NT * 8 tokens (8 or 16; blockIdx.x is the group); its WARPS warps split K into 128-column
// blocks (warp w takes blocks w, w + WARPS, ...). Each warp copies its blocks'
// codes (RT x 16 rows x 128) and x tiles into a ring of STAGES slots in shared
// memory by cp.async, STAGES - 1 blocks ahead of the one it multiplies: the
// bytes in flight cost shared memory, not registers. Per 128-column block a
// thread reads 16 contiguous codes of each of its two rows (g and g+8, g =
// lane / 4) per 64 columns, and 16 contiguous bf16 of its token's x row;
// `mma.m16n8k16` multiplies 16 rows x 16 columns x 8 tokens. The order of K
// inside one mma is free (a sum), so thread t's four columns of logical k
// {2t, 2t+1, 2t+8, 2t+9} are taken as the physical columns 16t + 4s + {0, 1,
// 2, 3} of step s: contiguous 16-byte reads for W and x alike. Each 128-column
// block's partial sum enters the total with one FMA by its block factor (1 for
// tensor and row scales, which apply at the end; bf16 x at 16 tokens skips
// the partial sums there, see `PER_BLOCK`). The warps' totals are summed
// in warp order through shared memory. On sm_90 and later the host launches it
// as a programmatic dependent of the previous kernel, and its first copies of
// codes (and, over tiled codes, its row factors) overlap that kernel's tail.
//
// Against the register-pipelined kernel it replaced (the next block's codes
// and x held in registers, 8 warps, 60 / 88 registers for 8 / 16 tokens),
// measured on the H100: M = 16 on
// 8192x28672 from 0.82 to 0.89 of copy bandwidth, M = 1 from 0.91 to 0.97.
//
// Requirements checked by the host: K % 16 == 0 (a thread's 16 columns are
// all inside or all outside K), 16-byte aligned rows. The codes are never NaN
// (`Fp8Weight` refuses NaN codes, and a `DeviceFp8Weight` is made only from
// one), so every upcast here skips the NaN fix of the integer conversions
// (`fp8x2_to_x2<FMT, XF16>`; GPUs without FP8 instructions). For bf16 x the
// small-M and wgmma kernels decode by integer code on every GPU
// (`fp8x2_sel_to_bf16x2`: the byte permute picks the pair from its word, so
// the upper pair needs no shift): four instructions a pair against four and
// a shift by the FP8 conversion. Measured on the H100: row-major codes at 12-16 tokens on
// 4096x4096 0.72-0.73 -> 0.77-0.78 of copy, tiled ones 0.80-0.81 -> 0.81-0.82.

// The module compiles in parts, at once (`MIXED_PARTS` in mixed.rs): the host
// defines MIXED_PART as 0, 1 or 2 for each, and each part instantiates its own
// kernels only. Undefined, every kernel is built.
#ifndef MIXED_PART
#define MIXED_PART -1
#endif
#define MIXED_IN_PART(p) (MIXED_PART < 0 || MIXED_PART == (p))

#define SCALE_TENSOR 0
#define SCALE_ROW 1
#define SCALE_BLOCK 2
// The bits of `mode` that hold the scale kind.
#define SCALE_BITS 3
// OR-ed into `mode`: the codes are tiled (see above), not row-major.
#define MODE_TILED 4
// OR-ed into `mode` (small-M kernels with bf16 output only): the weight is a
// decoder's gate and up projections interleaved by 8 rows (tile t: gate
// features 8t..8t+7, then the same up features), and the kernel writes
// silu(gate) * up, (M, N / 2) bf16, instead of y.
#define MODE_SWIGLU 8

// Offset of code (row, col) in the tiled layout (`kblocks` = ceil(K / 128)).
__device__ __forceinline__ size_t tiled_offset(int row, int col, int kblocks) {
    return (((size_t)(row >> 4) * kblocks + (col >> 7)) * 16 + (row & 15)) * 128 + (col & 127);
}

// Output element: f32 or bf16 bits (round to nearest even).
template <typename T> struct Out;
template <> struct Out<float> {
    static __device__ __forceinline__ float from(float v) { return v; }
};
template <> struct Out<unsigned short> {
    static __device__ __forceinline__ unsigned short from(float v) {
        unsigned short r;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(v));
        return r;
    }
};

// The factor applied after the sum over K: per tensor or per row (E4M3/E5M2
// codes are decoded exactly, so no format factor here).
__device__ __forceinline__ float post_factor(const float* factors, int mode, int row) {
    return mode == SCALE_TENSOR ? factors[0] : mode == SCALE_ROW ? factors[row] : 1.f;
}

// NT: groups of 8 tokens (1 or 2). TILED: the codes' layout (row-major or
// tiled, where the copies need no row or column guard: the padding is
// zeros). A warp's ring is its own: only
// `__syncwarp` orders its copies and its reads. Slot layout (16-byte chunks,
// swizzled so that a quarter-warp's 16-byte reads hit 32 distinct banks):
// codes, 16 rows x 128 bytes, row r's chunk c at c ^ ((r & 1) << 2); then x,
// `xrows` token rows x 256 bytes, row r's chunk c at c ^ (r & 1) (lanes of
// tokens past `xrows` read row xrows - 1). Rows past N and tokens past M are
// not copied: their slots hold whatever they held, which
// reaches only outputs that are not stored (a row of the mma's A or a column
// of its B touches only its own outputs). Columns past K are zero-filled in
// both operands.
//
// PER_BLOCK: each 128-column block's products go to a zeroed partial sum that
// enters the total with one FMA by the block's factor (1 unless the scales
// are 128x128 blocks). Without it the mma accumulates into the total
// directly. The entry point below takes that path for tensor and row scales
// with bf16 x and two token groups only; see there.
//
// ST: stepped copies (below) at two token groups as well, over tiled codes.
template <int FMT, int NT, typename OUT, int WARPS, int STAGES, bool TILED, bool XF16, bool PER_BLOCK, int RT,
          bool ST>
__device__ __forceinline__ void mixed_small_m(const unsigned char* __restrict__ w,
                                              const unsigned short* __restrict__ x,
                                              const float* __restrict__ factors, OUT* __restrict__ y, int M,
                                              int N, int K, int mode) {
    extern __shared__ __align__(16) unsigned char smem[];
    // A slot holds the x rows of the launch's largest token group only
    // (M = 1 in decoding needs 256 bytes of x a slot, not 2 or 4 KiB).
    // A block's tiles share one 128-row block of factors.
    static_assert(RT >= 1 && 128 % (16 * RT) == 0, "RT must be 1, 2, 4 or 8");
    constexpr int TBYTES = 16 * 128, WBYTES = RT * TBYTES;
    const bool swiglu = mode & MODE_SWIGLU;
    mode &= ~(MODE_TILED | MODE_SWIGLU); // the layout is TILED
    const int xrows = min(M, NT * 8), SLOT = WBYTES + xrows * 256;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    // The block's RT tiles of 16 rows: tile0, tile0 + 1, ... (the last
    // block's may pass N's last tile, `ntiles - 1`: those are not copied).
    const int tile0 = blockIdx.y * RT, ntiles = (N + 15) / 16;
    const int row0 = tile0 * 16;
    const int tok0 = blockIdx.x * (NT * 8);
    x += (size_t)tok0 * K;
    y += (size_t)tok0 * (swiglu ? N / 2 : N);
    M = min(M - tok0, NT * 8);
    const int kblocks = (K + 127) / 128;
    const int nk = kblocks > warp ? (kblocks - warp + WARPS - 1) / WARPS : 0;
    unsigned char* ring = smem + warp * STAGES * SLOT;
    const unsigned ring_s = smem_addr(ring);

    // Stepped copies (tiled codes, one group of 8 tokens): each lane's
    // pieces sit at fixed offsets from a per-lane base, 512 bytes apart, on
    // both sides, and only the block steps. Codes: piece p of lane l is row
    // l / 8 + 4p, chunk l % 8 (one swizzle parity per lane); x: row l / 16 +
    // 2p, chunk l % 16. The compiler otherwise rederives every address from
    // the lane id in each block. Measured on the H100 against the per-piece
    // addresses below: the 4-token
    // loop 304 -> 247 SASS instructions, 4096x4096 at 1-4 tokens 0.88-0.89
    // -> 0.90-0.92 of copy, 4096x14336 at 1 token 0.94 -> 0.98, 8 tokens
    // level, decode +1.1%. For 16 tokens (424 -> 333 instructions) it read
    // 4096x4096 +0.03 but 4096x14336 -0.08 and 8192x28672 -0.03, so two
    // groups keep the per-piece addresses. The loss is inside the kernel,
    // not in the overlap with the previous one: without PDL it stays, and
    // ncu shows the burst of copies doubling the warps' long-scoreboard
    // stalls.
    constexpr bool STEP = TILED && (NT == 1 || ST);
    const unsigned char* wl = w + ((size_t)tile0 * kblocks + warp) * TBYTES + lane * 16;
    const unsigned wdl = (lane >> 3) * 128 + (((lane & 7) ^ (((lane >> 3) & 1) << 2)) << 4);
    const unsigned xdl = WBYTES + (lane >> 4) * 256 + (((lane & 15) ^ ((lane >> 4) & 1)) << 4);
    const unsigned short* xl = x + (size_t)(lane >> 4) * K + (lane & 15) * 8;
    const int xrow = lane >> 4;
    // Copies of the warp's i-th block (k block warp + i * WARPS) into slot i % STAGES.
    auto copy_w = [&](int i) {
        const int kb = warp + i * WARPS;
        const unsigned dst = ring_s + (i % STAGES) * SLOT;
#pragma unroll
        for (int rt = 0; rt < RT; rt++) {
            if (RT > 1 && tile0 + rt >= ntiles) break;
            const unsigned d = dst + rt * TBYTES;
            if (STEP) {
                const unsigned char* src = wl + (size_t)rt * kblocks * TBYTES + (size_t)i * (WARPS * TBYTES);
#pragma unroll
                for (int p = 0; p < 4; p++) cp_async16(d + wdl + 512 * p, src + 512 * p, 16);
            } else if (TILED) {
                // Tile (tile0 + rt, kb): 2 KiB, row r's chunk c at 16 (8 r + c).
                const unsigned char* src = w + ((size_t)(tile0 + rt) * kblocks + kb) * TBYTES;
#pragma unroll
                for (int p = 0; p < 4; p++) {
                    const int q = lane + 32 * p, r = q >> 3, c = q & 7;
                    cp_async16(d + r * 128 + ((c ^ ((r & 1) << 2)) << 4), src + q * 16, 16);
                }
            } else {
#pragma unroll
                for (int p = 0; p < 4; p++) {
                    const int q = lane + 32 * p, r = q >> 3, c = q & 7;
                    const int k = kb * 128 + c * 16, row = row0 + rt * 16 + r;
                    if (row < N)
                        cp_async16(d + r * 128 + ((c ^ ((r & 1) << 2)) << 4), w + (size_t)row * K + min(k, K - 16),
                                   k < K ? 16 : 0);
                }
            }
        }
    };
    auto copy_x = [&](int i) {
        const int kb = warp + i * WARPS;
        if (STEP) {
            const unsigned dst = ring_s + (i % STAGES) * SLOT + xdl;
            const bool in = kb * 128 + (lane & 15) * 8 < K;
            const unsigned short* src = in ? xl + kb * 128 : xl;
#pragma unroll
            for (int p = 0; p < NT * 4; p++)
                if (xrow + 2 * p < M) cp_async16(dst + 512 * p, src + (size_t)p * 2 * K, in ? 16 : 0);
            return;
        }
        const unsigned dst = ring_s + (i % STAGES) * SLOT + WBYTES;
#pragma unroll
        for (int p = 0; p < NT * 4; p++) {
            const int q = lane + 32 * p, r = q >> 4, c = q & 15;
            const int k = kb * 128 + c * 8;
            if (r < M)
                cp_async16(dst + r * 256 + ((c ^ (r & 1)) << 4), x + (size_t)r * K + min(k, K - 8), k < K ? 16 : 0);
        }
    };

    float tot[RT][NT][4];
#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) tot[rt][j][i] = 0.f;

    // Launched as a programmatic dependent of the previous kernel (sm_90 and
    // later), the kernel starts while that one finishes: the weight codes are
    // constant (written once by the upload, never by a kernel), so their first
    // copies go out before `grid_wait`, overlapping the previous kernel's
    // tail; x and y are touched only after it. The trigger right after lets
    // the next product start its own copies once every block of this one is
    // running. One cp.async group per stage (the first also holds the codes
    // of the others).
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++)
        if (s < nk) copy_w(s);
    // The factors are constant as well: the two this thread's outputs use
    // (rows lane / 4 and lane / 4 + 8 of the tile; every epilogue element a
    // thread takes has its lane). Over tiled codes they load here, where
    // they were a dependent load at the end of every launch (4096x4096:
    // 0.84 -> 0.87-0.88 of copy at 1-4 tokens). Over
    // row-major codes the two registers held through the loop took the
    // 4-token kernel to 83 registers and two blocks an SM (0.89 -> 0.84 on
    // 4096x14336), so there they load after the loop.
    float fa[RT], fb[RT];
    auto load_factors = [&]() {
#pragma unroll
        for (int rt = 0; rt < RT; rt++) {
            const int frow = row0 + rt * 16 + (lane >> 2);
            fa[rt] = frow < N ? post_factor(factors, mode, frow) : 0.f;
            fb[rt] = frow + 8 < N ? post_factor(factors, mode, frow + 8) : 0.f;
        }
    };
    if (TILED) load_factors();
    grid_wait();
    grid_trigger();
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nk) copy_x(s);
        cp_commit();
    }
    for (int i = 0; i < nk; i++) {
        if (i + STAGES - 1 < nk) {
            copy_w(i + STAGES - 1);
            copy_x(i + STAGES - 1);
        }
        cp_commit();
        cp_wait<STAGES - 1>();
        __syncwarp();
        const unsigned char* ws = ring + (i % STAGES) * SLOT;
        const unsigned char* xs_base = ws + WBYTES;
        float part[RT][NT][4];
        float (&acc)[RT][NT][4] = PER_BLOCK ? part : tot;
        if (PER_BLOCK) {
#pragma unroll
            for (int rt = 0; rt < RT; rt++)
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[rt][j][e] = 0.f;
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int cw = ((h * 4 + t) ^ ((g & 1) << 2)) << 4;
            uint4 wa[RT], wb[RT];
#pragma unroll
            for (int rt = 0; rt < RT; rt++) {
                wa[rt] = *reinterpret_cast<const uint4*>(ws + rt * TBYTES + g * 128 + cw);
                wb[rt] = *reinterpret_cast<const uint4*>(ws + rt * TBYTES + (g + 8) * 128 + cw);
            }
            uint4 xv[NT][2];
#pragma unroll
            for (int j = 0; j < NT; j++) {
                // Lanes of tokens past the slot's rows read its last row
                // (their outputs are not stored).
                const int xr = min(j * 8 + g, xrows - 1);
#pragma unroll
                for (int e = 0; e < 2; e++)
                    xv[j][e] = *reinterpret_cast<const uint4*>(xs_base + xr * 256 +
                                                               (((h * 8 + 2 * t + e) ^ (xr & 1)) << 4));
            }
#pragma unroll
            for (int s = 0; s < 4; s++)
#pragma unroll
                for (int rt = 0; rt < RT; rt++) {
                    const unsigned int ua = word(wa[rt], s), ub = word(wb[rt], s);
                    unsigned int a0, a1, a2, a3;
                    if (XF16) {
                        a0 = fp8x2_to_x2<FMT, true>(ua & 0xffffu);
                        a1 = fp8x2_to_x2<FMT, true>(ub & 0xffffu);
                        a2 = fp8x2_to_x2<FMT, true>(ua >> 16);
                        a3 = fp8x2_to_x2<FMT, true>(ub >> 16);
                    } else {
                        a0 = fp8x2_sel_to_bf16x2<FMT>(ua, 0x9180u);
                        a1 = fp8x2_sel_to_bf16x2<FMT>(ub, 0x9180u);
                        a2 = fp8x2_sel_to_bf16x2<FMT>(ua, 0xb3a2u);
                        a3 = fp8x2_sel_to_bf16x2<FMT>(ub, 0xb3a2u);
                    }
#pragma unroll
                    for (int j = 0; j < NT; j++) {
                        const uint4& xq = xv[j][s >> 1];
                        mma_x<XF16>(acc[rt][j], a0, a1, a2, a3, word(xq, (s & 1) * 2), word(xq, (s & 1) * 2 + 1));
                    }
                }
        }
        if (PER_BLOCK) {
            // A block's RT tiles lie in one 128-row block of factors (128 % (16 RT) == 0).
            const float f = mode == SCALE_BLOCK ? factors[(row0 / 128) * kblocks + warp + i * WARPS] : 1.f;
#pragma unroll
            for (int rt = 0; rt < RT; rt++)
#pragma unroll
                for (int j = 0; j < NT; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) tot[rt][j][e] = fmaf(acc[rt][j][e], f, tot[rt][j][e]);
        }
        // Every lane is done with this slot before a later copy refills it.
        __syncwarp();
    }
    cp_wait<0>();
    if (!TILED) load_factors();
    __syncthreads();
    // The warps' totals, summed in warp order (the ring is free now).
    // [WARPS][RT * NT * 4][32]: warp q's value e of tile rt, token group j
    // at ((q RT + rt) NT + j) 4 + e.
    constexpr int PER_WARP = RT * NT * 4;
    float* red = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int rt = 0; rt < RT; rt++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) red[(warp * PER_WARP + (rt * NT + j) * 4 + e) * 32 + lane] = tot[rt][j][e];
    __syncthreads();
    // A thread's own factors for tile rt, by selects (a register array
    // indexed by a value known only at run time would go to local memory).
    auto pick = [&](const float (&f)[RT], int rt) {
        float r = f[0];
#pragma unroll
        for (int q = 1; q < RT; q++) r = rt == q ? f[q] : r;
        return r;
    };
    auto fa_of = [&](int rt) { return pick(fa, rt); };
    auto fb_of = [&](int rt) { return pick(fb, rt); };
    if (swiglu) {
        // Lane l's rows g and g + 8 of tile rt are the gate and up of feature
        // 8 (tile0 + rt) + g: each pair summed as below, scaled, then joined.
        for (int e = threadIdx.x; e < RT * NT * 2 * 32; e += WARPS * 32) {
            const int rt = e / (NT * 64), j = (e >> 6) % NT, i = (e >> 5) & 1, l = e & 31;
            float a = 0.f, u = 0.f;
#pragma unroll
            for (int q = 0; q < WARPS; q++) {
                a += red[(q * PER_WARP + (rt * NT + j) * 4 + i) * 32 + l];
                u += red[(q * PER_WARP + (rt * NT + j) * 4 + i + 2) * 32 + l];
            }
            const int row = row0 + rt * 16 + (l >> 2);
            const int tok = j * 8 + 2 * (l & 3) + i;
            if (row + 8 < N && tok < M)
                y[(size_t)tok * (N / 2) + (tile0 + rt) * 8 + (l >> 2)] = Out<OUT>::from(
                    swiglu_f32(a * fa_of(rt), u * fb_of(rt)));
        }
        return;
    }
    for (int e = threadIdx.x; e < PER_WARP * 32; e += WARPS * 32) {
        const int idx = e >> 5, l = e & 31;
        float v = 0.f;
#pragma unroll
        for (int q = 0; q < WARPS; q++) v += red[(q * PER_WARP + idx) * 32 + l];
        const int rt = idx / (NT * 4), j = (idx >> 2) % NT, i = idx & 3;
        const int row = row0 + rt * 16 + (l >> 2) + (i >= 2 ? 8 : 0);
        const int tok = j * 8 + 2 * (l & 3) + (i & 1);
        if (row < N && tok < M) y[(size_t)tok * N + row] = Out<OUT>::from(v * (i >= 2 ? fb_of(rt) : fa_of(rt)));
    }
}

// The entry point runs the body without the per-block partial sums
// (PER_BLOCK = false) for bf16 x at two token groups when the scales are per
// tensor or per row: their zeroing and FMA by 1 go, and ptxas schedules the
// 16-token loop in 390 SASS instructions instead of 424 at the same 65
// registers. Measured on the H100 (three rounds): 4096x4096 at 12-16 tokens 0.76-0.77 -> 0.80-0.81 of
// copy, the larger weights level. Where it is not used: one token group
// (4096x14336 at 1 token 0.98 -> 0.95, decode -1.8%) and f16 x (4096x4096
// at 16 tokens 0.86 -> 0.83-0.85). The mma then adds each block's products
// to the running total rather than to a fresh zero, so outputs can differ
// from the other path in the last bits (accumulation order only).
#define MIXED_SMALL_T(NAME, FMT, NT, OUT, WARPS, STAGES, TILED, XF16, RT, ST)                            \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) NAME(const unsigned char* w, const unsigned short* x, \
                                                                  const float* factors, OUT* y, int M, int N, \
                                                                  int K, int mode) {                     \
        if (NT == 2 && !XF16 && (mode & SCALE_BITS) != SCALE_BLOCK)                                      \
            mixed_small_m<FMT, NT, OUT, WARPS, STAGES, TILED, XF16, false, RT, ST>(w, x, factors, y, M, N, K, mode); \
        else                                                                                             \
            mixed_small_m<FMT, NT, OUT, WARPS, STAGES, TILED, XF16, true, RT, ST>(w, x, factors, y, M, N, K, mode); \
    }
#define MIXED_SMALL(NAME, FMT, NT, OUT, WARPS, STAGES, XF16, RT, ST)                                     \
    MIXED_SMALL_T(NAME, FMT, NT, OUT, WARPS, STAGES, false, XF16, RT, ST)                                \
    MIXED_SMALL_T(NAME##t, FMT, NT, OUT, WARPS, STAGES, true, XF16, RT, ST)
#define MIXED_SMALL_X(TAG, X, XF16, NT, W, S, RT, ST)                                                   \
    MIXED_SMALL(mixed_e4m3_##TAG##X##_f32, FMT_E4M3, NT, float, W, S, XF16, RT, ST)                      \
    MIXED_SMALL(mixed_e5m2_##TAG##X##_f32, FMT_E5M2, NT, float, W, S, XF16, RT, ST)                      \
    MIXED_SMALL(mixed_e4m3_##TAG##X##_bf16, FMT_E4M3, NT, unsigned short, W, S, XF16, RT, ST)            \
    MIXED_SMALL(mixed_e5m2_##TAG##X##_bf16, FMT_E5M2, NT, unsigned short, W, S, XF16, RT, ST)
// The three shapes `Gpu::mixed_matmul` picks from (warps x stages; see
// `SMALL_CFG` in mixed.rs): up to 4 tokens, 8 warps and 3 stages; 5 to 8
// tokens, 8 warps and 2 stages; 9 to 16 tokens, 4 warps and 3 stages. Each
// name for row-major codes, and with a `t` appended for tiled codes; for
// bf16 x, and with `_xf16` after the shape's tag for f16 x.
#define MIXED_SMALL_CFG(TAG, NT, W, S, RT, ST)                                                          \
    MIXED_SMALL_X(TAG, , false, NT, W, S, RT, ST)                                                       \
    MIXED_SMALL_X(TAG, _xf16, true, NT, W, S, RT, ST)
#if MIXED_IN_PART(0)
MIXED_SMALL_CFG(n4, 1, 8, 3, 1, false)
MIXED_SMALL_CFG(n8, 1, 8, 2, 1, false)
// 9 to 16 tokens with 64 weight rows a block (`SMALL_WIDE` in mixed.rs),
// here to even out the parts' compile times.
MIXED_SMALL_CFG(n16r4, 2, 4, 2, 4, false)
#endif
#if MIXED_IN_PART(1)
MIXED_SMALL_CFG(n16, 2, 4, 3, 1, false)
// 9 to 16 tokens with 32 weight rows a block, where those blocks still fill
// the SMs (`SMALL_WIDE` in mixed.rs; the 64-row shape is in part 0).
MIXED_SMALL_CFG(n16r2, 2, 4, 3, 2, false)
// f16 x, 9 to 16 tokens, a launch of at most two blocks an SM: 6 warps x 3
// stages (`SMALL_F16_FEW` in mixed.rs).
MIXED_SMALL_X(n16w6, _xf16, true, 2, 6, 3, 1, false)
// 9 to 16 tokens whose 32-row blocks fill between half and all of the SMs:
// 8 warps x 2 stages x 32 rows, one block an SM (`SMALL_FEW` in mixed.rs).
MIXED_SMALL_CFG(n16r2w8, 2, 8, 2, 2, true)
#endif

// Calibration for `octet bench mixed`: read `n16` 16-byte words (grid-stride,
// four loads in flight per thread) and fold them into one word per thread,
// stored only when it equals an arbitrary constant (into scratch, so harmless
// when it does): the loads stay and next to nothing is written. What a
// kernel that only reads reaches.
#if MIXED_IN_PART(0)
extern "C" __global__ void __launch_bounds__(256) read_floor(const uint4* __restrict__ p, long long n16,
                                                             unsigned int* sink) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int a = 0;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        const uint4 v0 = __ldg(p + i), v1 = __ldg(p + i + stride), v2 = __ldg(p + i + 2 * stride),
                    v3 = __ldg(p + i + 3 * stride);
        a += (v0.x ^ v0.y ^ v0.z ^ v0.w) + (v1.x ^ v1.y ^ v1.z ^ v1.w) + (v2.x ^ v2.y ^ v2.z ^ v2.w) +
             (v3.x ^ v3.y ^ v3.z ^ v3.w);
    }
    for (; i < n16; i += stride) {
        const uint4 v = __ldg(p + i);
        a += v.x ^ v.y ^ v.z ^ v.w;
    }
    if (a == 0x9e3779b9u) sink[blockIdx.x * blockDim.x + threadIdx.x] = a;
}
#endif

// Two floats -> bf16x2 (nearest even), `lo` in the low half.
__device__ __forceinline__ unsigned int pack_bf16x2(float lo, float hi) {
    unsigned int r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Two FP8 codes times a factor -> bf16x2, or f16x2 (`XF16`), rounded to
// nearest even: the codes go to f32 exactly and are multiplied there,
// without the bf16 round trip of `fp8x2_to_bf16x2` (same bits, three
// instructions fewer a pair). An f16 beyond 65504 would be infinite: the
// host refuses f16 x for a block-scaled weight whose factors allow that.
template <int FMT, bool XF16>
__device__ __forceinline__ unsigned int fp8x2_to_x2_scaled(unsigned int two, float f) {
    float lo, hi;
    fp8x2_to_f32x2<FMT, false>(two, lo, hi);
    if (XF16) {
        unsigned int r;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi * f), "f"(lo * f));
        return r;
    }
    return pack_bf16x2(lo * f, hi * f);
}

// Two FP8 codes times a factor -> bf16x2, in bf16 arithmetic (five
// instructions a pair against the six of `fp8x2_to_x2_scaled`). The codes'
// exponent and mantissa bits, shifted into a bf16 (`fp8x2_bf16_bits`),
// are the value times 2^-BF_BIAS (subnormal codes too); `hi2` and `lo2`
// hold the factor times 2^BF_BIAS split into two bf16 (`bf_split`), and the
// result is RN(v hi + RN(v lo)): within 2^-8 + 2^-15 of code x factor
// (bf16's rounding is 2^-8 relative; the f32 path's is the same). The
// host takes this path only for factors whose split is finite and normal
// (`bf16_scalable` in mixed.rs). A -0 code gives +0 or -0.
template <int FMT> struct BfBias {
    static constexpr float scale = FMT == FMT_E4M3 ? 0x1p120f : 0x1p112f;
};
// The pair is bytes 0-1 of `word` (`sel` 0x9180) or bytes 2-3 (0xb3a2).
template <int FMT>
__device__ __forceinline__ unsigned int fp8x2_to_bf16x2_times(unsigned int word, unsigned int sel, unsigned int hi2,
                                                              unsigned int lo2) {
    unsigned int t, r;
    const unsigned int bits = fp8x2_bf16_bits<FMT>(word, sel);
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(t) : "r"(bits), "r"(lo2));
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(bits), "r"(hi2), "r"(t));
    return r;
}

// `f` times 2^BF_BIAS as two bf16 pairs, hi (the nearest bf16) and lo (the
// rest, nearest), for `fp8x2_to_bf16x2_times`.
template <int FMT> __device__ __forceinline__ void bf_split(float f, unsigned int& hi2, unsigned int& lo2) {
    const float S = f * BfBias<FMT>::scale;
    hi2 = pack_bf16x2(S, S);
    const float rest = S - bf16_lo(hi2); // exact in f32
    lo2 = pack_bf16x2(rest, rest);
}

// Large M: upcast W to bf16, or f16 (`XF16`) for f16 x (exact; block
// factors applied here, rounding the product to bf16 or f16) for a cuBLAS
// GEMM of x's type, then `mixed_epilogue` applies the tensor or row factor
// to the f32 GEMM output. One thread per 16 codes. Either layout of the
// codes (MODE_TILED); the copy is row-major.
template <int FMT, bool XF16>
__device__ __forceinline__ void upcast(const unsigned char* __restrict__ w, const float* __restrict__ factors,
                                       unsigned short* __restrict__ out, int N, int K, int mode) {
    const size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 16;
    if (i >= (size_t)N * K) return;
    const int row = (int)(i / K), col = (int)(i % K);
    const size_t src = mode & MODE_TILED ? tiled_offset(row, col, (K + 127) / 128) : i;
    mode &= ~MODE_TILED;
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(w + src));
    unsigned int o[8];
    if (mode == SCALE_BLOCK) {
        // Rounded once, after the block factor.
        const float f = factors[(row / 128) * ((K + 127) / 128) + col / 128];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            o[2 * q] = fp8x2_to_x2_scaled<FMT, XF16>(word(v, q) & 0xffffu, f);
            o[2 * q + 1] = fp8x2_to_x2_scaled<FMT, XF16>(word(v, q) >> 16, f);
        }
    } else {
        // Exact: bf16 and f16 hold every code.
#pragma unroll
        for (int q = 0; q < 4; q++) {
            o[2 * q] = fp8x2_to_x2<FMT, XF16>(word(v, q) & 0xffffu);
            o[2 * q + 1] = fp8x2_to_x2<FMT, XF16>(word(v, q) >> 16);
        }
    }
    uint4* dst = reinterpret_cast<uint4*>(out + i);
    dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
}
#define UPCAST(NAME, FMT, XF16)                                                                          \
    extern "C" __global__ void NAME(const unsigned char* w, const float* factors, unsigned short* out, int N, \
                                    int K, int mode) {                                                     \
        upcast<FMT, XF16>(w, factors, out, N, K, mode);                                                    \
    }
#if MIXED_IN_PART(0)
UPCAST(upcast_e4m3, FMT_E4M3, false)
UPCAST(upcast_e5m2, FMT_E5M2, false)
UPCAST(upcast_e4m3_xf16, FMT_E4M3, true)
UPCAST(upcast_e5m2_xf16, FMT_E5M2, true)
#endif

// `mode`: the scaling alone (no MODE_TILED).
template <typename OUT>
__device__ __forceinline__ void epilogue(const float* __restrict__ acc, const float* __restrict__ factors,
                                         OUT* __restrict__ y, int M, int N, int mode) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)M * N) return;
    y[i] = Out<OUT>::from(acc[i] * post_factor(factors, mode, (int)(i % N)));
}
#if MIXED_IN_PART(0)
extern "C" __global__ void mixed_epilogue_f32(const float* acc, const float* factors, float* y, int M, int N,
                                              int mode) {
    epilogue<float>(acc, factors, y, M, N, mode);
}
extern "C" __global__ void mixed_epilogue_bf16(const float* acc, const float* factors, unsigned short* y,
                                               int M, int N, int mode) {
    epilogue<unsigned short>(acc, factors, y, M, N, mode);
}
#endif

// ---------------------------------------------------------------- large M on Hopper's wgmma

// `mixed_wg` (sm_90a): the product for M > 64 without a bf16 copy of W. It
// computes y^T = W x^T tile by tile: a block of two warpgroups owns 128
// weight rows (output channels; 64 per warpgroup, the wgmma M side) and 256
// tokens (the wgmma N side). Per 64-column stage of K:
// - x (256 tokens x 64 bf16) is copied by the TMA unit into wgmma's
//   128-byte-swizzled K-major layout (see attention.cu) and read by wgmma as B;
// - the FP8 codes of W (128 rows x 64 bytes) are copied by the TMA unit as
//   they are in memory (row-major, no repacking) with its 64-byte swizzle:
//   each row's four 16-byte chunks permuted by chunk ^ ((row / 2) % 4), so
//   the fragment loads below hit 32 different banks;
// - each thread loads its A fragment from the codes (two 4-byte loads per row
//   and 16-column step: row g holds columns {2t, 2t+1} in word t/2 and
//   {2t+8, 2t+9} in word 2 + t/2), upcasts them to bf16 in registers (exact)
//   and four `wgmma m64n256k16` (A from registers) accumulate in f32.
// Five stages are in flight (40 KiB each; one thread issues both copies of a
// stage, whose arrival an mbarrier signals): the copies run three stages
// ahead and one wgmma group stays outstanding while the next fragments are
// converted, so the tensor cores are fed while the conversion runs. (A first
// version copied with per-thread cp.async: 0.67-0.71x of cuBLAS bf16, with
// the address arithmetic of the copies more than half of the issued
// instructions.)
// Factors: per-tensor and per-row ones scale the f32 sums in the epilogue;
// under 128x128 block scaling each code is multiplied by its block's factor
// and rounded to x's type in the upcast: in bf16 arithmetic for bf16 x where
// the factors allow (`fp8x2_to_bf16x2_times`, five instructions a pair;
// 0.95x of cuBLAS bf16 at M = 2048 on 8192x28672), in f32 otherwise (six;
// 0.88-0.89x there).
// The epilogue stages the 128 x 256 tile through shared memory transposed
// and writes y's rows with 16-byte stores.
// Requirements checked by the host: K % 16 == 0 (whole 16-byte chunks).

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

#define MW_THREADS 256
#define MW_CH 128
#define MW_TOK 256
#define MW_STAGES 5
#define MW_XBYTES (MW_TOK * 64 * 2)
#define MW_STAGE (MW_XBYTES + MW_CH * 64)

// d (64 x 256 f32, accumulator layout) += A (64 x 16, bf16 or f16 (`XF16`),
// registers in the A-fragment layout) B^T, B (256 x 16, the same type) in
// shared memory, K-major (descriptor `db`). The accumulator's 128 registers
// as the instruction's operand string and as asm operands:
#define WG_N256_D                                                                                       \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "\
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "\
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "\
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "\
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "\
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "\
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "\
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127 "
#define WG_N256_OPS(d)                                                                                  \
    "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),\
    "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),\
    "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),\
    "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),\
    "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),\
    "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),\
    "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),\
    "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3]),\
    "+f"(d[16][0]), "+f"(d[16][1]), "+f"(d[16][2]), "+f"(d[16][3]), "+f"(d[17][0]), "+f"(d[17][1]), "+f"(d[17][2]), "+f"(d[17][3]),\
    "+f"(d[18][0]), "+f"(d[18][1]), "+f"(d[18][2]), "+f"(d[18][3]), "+f"(d[19][0]), "+f"(d[19][1]), "+f"(d[19][2]), "+f"(d[19][3]),\
    "+f"(d[20][0]), "+f"(d[20][1]), "+f"(d[20][2]), "+f"(d[20][3]), "+f"(d[21][0]), "+f"(d[21][1]), "+f"(d[21][2]), "+f"(d[21][3]),\
    "+f"(d[22][0]), "+f"(d[22][1]), "+f"(d[22][2]), "+f"(d[22][3]), "+f"(d[23][0]), "+f"(d[23][1]), "+f"(d[23][2]), "+f"(d[23][3]),\
    "+f"(d[24][0]), "+f"(d[24][1]), "+f"(d[24][2]), "+f"(d[24][3]), "+f"(d[25][0]), "+f"(d[25][1]), "+f"(d[25][2]), "+f"(d[25][3]),\
    "+f"(d[26][0]), "+f"(d[26][1]), "+f"(d[26][2]), "+f"(d[26][3]), "+f"(d[27][0]), "+f"(d[27][1]), "+f"(d[27][2]), "+f"(d[27][3]),\
    "+f"(d[28][0]), "+f"(d[28][1]), "+f"(d[28][2]), "+f"(d[28][3]), "+f"(d[29][0]), "+f"(d[29][1]), "+f"(d[29][2]), "+f"(d[29][3]),\
    "+f"(d[30][0]), "+f"(d[30][1]), "+f"(d[30][2]), "+f"(d[30][3]), "+f"(d[31][0]), "+f"(d[31][1]), "+f"(d[31][2]), "+f"(d[31][3])
template <bool XF16>
__device__ __forceinline__ void wgmma_rs_n256_kmajor(float d[32][4], const unsigned a[4], unsigned long long db) {
    if (XF16)
        asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {" WG_N256_D
                     "}, {%128, %129, %130, %131}, %132, 1, 1, 1, 0;\n"
                     : WG_N256_OPS(d)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
    else
        asm volatile("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" WG_N256_D
                     "}, {%128, %129, %130, %131}, %132, 1, 1, 1, 0;\n"
                     : WG_N256_OPS(d)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

// Stage `st` (columns [64 st, 64 st + 64)) of x and W into its buffer, by
// one thread: two TMA copies completing on the buffer's barrier. The maps
// swizzle x by 128 bytes (wgmma's layout) and W by 64 bytes (16-byte chunk
// c of row r lands at c ^ ((r / 2) % 4)). Tiled codes: W's map is 4-D
// (column in tile, row in tile, tile column, tile row), and its 64 x 16 x 1
// x 8 box lands as the 2-D map's 64 x 128 box does (the swizzle follows the
// shared-memory address).
__device__ __forceinline__ void mw_issue(unsigned sm, unsigned bars, const TmaMap* xmap, const TmaMap* wmap,
                                         int st, int tok0, int ch0, bool tiled) {
    const int b = st % MW_STAGES;
    const unsigned buf = sm + b * MW_STAGE, bar = bars + 8 * b;
    mbar_expect_tx(bar, MW_STAGE);
    tma_load_2d(buf, xmap, st * 64, tok0, bar);
    if (tiled)
        tma_load_4d(buf + MW_XBYTES, wmap, (st & 1) * 64, 0, st >> 1, ch0 / 16, bar);
    else
        tma_load_2d(buf + MW_XBYTES, wmap, st * 64, ch0, bar);
}

// How `mixed_wg` applies factors: tensor and row ones in the epilogue
// (WG_PLAIN); 128x128 block ones on each code in the upcast, in f32
// (WG_BLOCK_F32) or in bf16 arithmetic (WG_BLOCK_BF16, bf16 x only).
#define WG_PLAIN 0
#define WG_BLOCK_F32 1
#define WG_BLOCK_BF16 2

// This thread's A fragments of one stage: rows g and g + 8 of its warp's 16,
// four 16-column steps, upcast (and scaled by `f` under block scaling).
template <int FMT, int BM, bool XF16>
__device__ __forceinline__ void mw_fragments(unsigned buf, int row, int t, float f, unsigned a[4][4]) {
    const unsigned wb = buf + MW_XBYTES;
    const int sh = (t & 1) * 16;
    unsigned hi2 = 0, lo2 = 0;
    if (BM == WG_BLOCK_BF16) bf_split<FMT>(f, hi2, lo2);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = row + h * 8;
#pragma unroll
        for (int s = 0; s < 4; s++) {
            const unsigned at = wb + r * 64 + ((s ^ ((r >> 1) & 3)) << 4) + 4 * (t >> 1);
            unsigned lo, hi;
            asm volatile("ld.shared.b32 %0, [%1];" : "=r"(lo) : "r"(at));
            asm volatile("ld.shared.b32 %0, [%1];" : "=r"(hi) : "r"(at + 8));
            if (BM == WG_BLOCK_BF16) {
                // The byte permute picks this thread's half of each word.
                const unsigned sel = (t & 1) ? 0xb3a2u : 0x9180u;
                a[s][h] = fp8x2_to_bf16x2_times<FMT>(lo, sel, hi2, lo2);
                a[s][h + 2] = fp8x2_to_bf16x2_times<FMT>(hi, sel, hi2, lo2);
                continue;
            }
            if (BM == WG_PLAIN && !XF16) {
                const unsigned sel = (t & 1) ? 0xb3a2u : 0x9180u;
                a[s][h] = fp8x2_sel_to_bf16x2<FMT>(lo, sel);
                a[s][h + 2] = fp8x2_sel_to_bf16x2<FMT>(hi, sel);
                continue;
            }
            lo = (lo >> sh) & 0xffffu;
            hi = (hi >> sh) & 0xffffu;
            if (BM == WG_BLOCK_F32) {
                a[s][h] = fp8x2_to_x2_scaled<FMT, XF16>(lo, f);
                a[s][h + 2] = fp8x2_to_x2_scaled<FMT, XF16>(hi, f);
            } else {
                a[s][h] = fp8x2_to_x2<FMT, XF16>(lo);
                a[s][h + 2] = fp8x2_to_x2<FMT, XF16>(hi);
            }
        }
    }
}

template <int FMT, typename OUT, int BM, bool XF16>
__device__ __forceinline__ void mixed_wg(const TmaMap* xmap, const TmaMap* wmap, const float* __restrict__ factors,
                                         OUT* __restrict__ y, int M, int N, int K, int mode) {
    extern __shared__ __align__(1024) unsigned char mw_smem[];
    const unsigned sm = (smem_addr(mw_smem) + 1023) & ~1023u; // the launch adds 1 KiB of slack
    const bool tiled = mode & MODE_TILED;
    mode &= ~MODE_TILED;
    const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    // Token tiles vary fastest: the blocks in flight share a slab of W rows
    // (read from DRAM once) and all of x (L2-resident).
    const int tok0 = blockIdx.x * MW_TOK, ch0 = blockIdx.y * MW_CH;
    const int row = wg * 64 + warp * 16 + g; // this thread's first weight row in the tile
    const int nk = (K + 63) / 64, kblocks = (K + 127) / 128;
    const float* bf = factors + (size_t)(ch0 / 128) * kblocks;
    const unsigned bars = sm + MW_STAGES * MW_STAGE; // one barrier per buffer
    mbar_setup<MW_STAGES>(bars);
    if (threadIdx.x == 0)
        for (int p = 0; p < MW_STAGES - 2 && p < nk; p++) mw_issue(sm, bars, xmap, wmap, p, tok0, ch0, tiled);
    float acc[32][4];
#pragma unroll
    for (int j = 0; j < 32; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    unsigned a0[4][4], a1[4][4];
    // One stage: wait for its copies; after the barrier, start the copy of
    // the stage three ahead (into the buffer read two stages ago, whose wgmma
    // group has completed in both warpgroups by then); convert, issue.
    // Block scaling: the factor of stage it + 1 is loaded during stage it.
    float f_next = BM != WG_PLAIN ? bf[0] : 1.f;
    auto step = [&](int it, unsigned (&a)[4][4]) {
        const float f = f_next;
        if (BM != WG_PLAIN && it + 1 < nk) f_next = bf[(it + 1) >> 1];
        mbar_wait(bars + 8 * (it % MW_STAGES), (it / MW_STAGES) & 1);
        __syncthreads();
        const int nx = it + MW_STAGES - 2;
        if (threadIdx.x == 0 && nx < nk) mw_issue(sm, bars, xmap, wmap, nx, tok0, ch0, tiled);
        const unsigned buf = sm + (it % MW_STAGES) * MW_STAGE;
        mw_fragments<FMT, BM, XF16>(buf, row, t, f, a);
        wg_fence();
#pragma unroll
        for (int s = 0; s < 4; s++) wgmma_rs_n256_kmajor<XF16>(acc, a[s], wg_desc(buf + s * 32, 16, 1024));
        wg_commit();
        wg_wait<1>();
    };
    int it = 0;
    for (; it + 1 < nk; it += 2) {
        step(it, a0);
        step(it + 1, a1);
    }
    if (it < nk) step(it, a0);
    wg_wait0();
    wg_hold(acc);
    __syncthreads(); // both warpgroups are done with the stage buffers

    // Epilogue: the tile transposed into shared memory (token rows of 128
    // channels, padded so a warp's stores hit distinct banks), then rows out.
    constexpr int RS = 128 + 16 / (int)sizeof(OUT); // row pitch in elements
    OUT* tile = reinterpret_cast<OUT*>(mw_smem + (sm - smem_addr(mw_smem)));
    float fr[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int ch = ch0 + row + h * 8;
        fr[h] = mode == SCALE_ROW ? (ch < N ? factors[ch] : 0.f) : mode == SCALE_TENSOR ? factors[0] : 1.f;
    }
    if constexpr (sizeof(OUT) == 2) {
        // bf16: `stmatrix .trans` stores four 8 x 8 blocks of the accumulator
        // (channels x tokens) a warp instruction, transposed into token rows;
        // lane l addresses row l % 8 of block l / 8, which is (token block
        // j + l / 16, channel half (l / 8) % 2). Rows are 272 bytes apart, so
        // a block's eight 16-byte rows fall in distinct banks.
        const int l = lane, wrow = wg * 64 + warp * 16 + ((l >> 3) & 1) * 8;
        const unsigned base = sm + 2 * (((l >> 4) * 8 + (l & 7)) * RS + wrow);
#pragma unroll
        for (int j = 0; j < 32; j += 2) {
            const unsigned r0 = pack_bf16x2(acc[j][0] * fr[0], acc[j][1] * fr[0]);
            const unsigned r1 = pack_bf16x2(acc[j][2] * fr[1], acc[j][3] * fr[1]);
            const unsigned r2 = pack_bf16x2(acc[j + 1][0] * fr[0], acc[j + 1][1] * fr[0]);
            const unsigned r3 = pack_bf16x2(acc[j + 1][2] * fr[1], acc[j + 1][3] * fr[1]);
            asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(
                             base + 2 * (8 * j * RS)),
                         "r"(r0), "r"(r1), "r"(r2), "r"(r3)
                         : "memory");
        }
    } else {
#pragma unroll
        for (int j = 0; j < 32; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int tok = 8 * j + 2 * t + (e & 1), h = e >> 1;
                tile[tok * RS + row + h * 8] = Out<OUT>::from(acc[j][e] * fr[h]);
            }
    }
    __syncthreads();
    constexpr int VEC = 16 / (int)sizeof(OUT), PER_ROW = MW_CH / VEC;
    const int rows = min(MW_TOK, M - tok0);
    if (N % VEC == 0) {
        for (int i = threadIdx.x; i < rows * PER_ROW; i += MW_THREADS) {
            const int r = i / PER_ROW, c = (i % PER_ROW) * VEC;
            if (ch0 + c < N)
                *reinterpret_cast<uint4*>(y + (size_t)(tok0 + r) * N + ch0 + c) =
                    *reinterpret_cast<const uint4*>(tile + r * RS + c);
        }
    } else {
        for (int i = threadIdx.x; i < rows * MW_CH; i += MW_THREADS) {
            const int r = i / MW_CH, c = i % MW_CH;
            if (ch0 + c < N) y[(size_t)(tok0 + r) * N + ch0 + c] = tile[r * RS + c];
        }
    }
}

#define MIXED_WG(NAME, FMT, OUT, BM, XF16)                                                                \
    extern "C" __global__ void __launch_bounds__(MW_THREADS, 1)                                            \
        NAME(const __grid_constant__ TmaMap xmap, const __grid_constant__ TmaMap wmap, const float* factors, \
             OUT* y, int M, int N, int K, int mode) {                                                     \
        mixed_wg<FMT, OUT, BM, XF16>(&xmap, &wmap, factors, y, M, N, K, mode);                            \
    }
// Names: mixed_wg_[block_]{format}[_xf16]_{out}; `_xf16` takes f16 x.
#define MIXED_WG_X(X, XF16)                                                                              \
    MIXED_WG(mixed_wg_e4m3##X##_f32, FMT_E4M3, float, WG_PLAIN, XF16)                                         \
    MIXED_WG(mixed_wg_e4m3##X##_bf16, FMT_E4M3, unsigned short, WG_PLAIN, XF16)                               \
    MIXED_WG(mixed_wg_e5m2##X##_f32, FMT_E5M2, float, WG_PLAIN, XF16)                                         \
    MIXED_WG(mixed_wg_e5m2##X##_bf16, FMT_E5M2, unsigned short, WG_PLAIN, XF16)                               \
    MIXED_WG(mixed_wg_block_e4m3##X##_f32, FMT_E4M3, float, WG_BLOCK_F32, XF16)                                    \
    MIXED_WG(mixed_wg_block_e4m3##X##_bf16, FMT_E4M3, unsigned short, WG_BLOCK_F32, XF16)                          \
    MIXED_WG(mixed_wg_block_e5m2##X##_f32, FMT_E5M2, float, WG_BLOCK_F32, XF16)                                    \
    MIXED_WG(mixed_wg_block_e5m2##X##_bf16, FMT_E5M2, unsigned short, WG_BLOCK_F32, XF16)
#if MIXED_IN_PART(2)
MIXED_WG_X(, false)
MIXED_WG_X(_xf16, true)
#endif
// Names: mixed_wg_blockbf_{format}_{out}, bf16 x.
#if MIXED_IN_PART(3)
MIXED_WG(mixed_wg_blockbf_e4m3_f32, FMT_E4M3, float, WG_BLOCK_BF16, false)
MIXED_WG(mixed_wg_blockbf_e4m3_bf16, FMT_E4M3, unsigned short, WG_BLOCK_BF16, false)
MIXED_WG(mixed_wg_blockbf_e5m2_f32, FMT_E5M2, float, WG_BLOCK_BF16, false)
MIXED_WG(mixed_wg_blockbf_e5m2_bf16, FMT_E5M2, unsigned short, WG_BLOCK_BF16, false)
#endif

#endif
