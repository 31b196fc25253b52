//! Weight-only FP8 products on the GPU: `y (M, N) = x (M, K) @ W^T` with `x`
//! in bf16 (or f16, [`XType`], [`Gpu::mixed_matmul_x`]) and `W` kept in FP8
//! on the device (see `kernels/mixed.cu`). Every path below takes either
//! type of `x`, the codes upcast to it: one instruction a pair of codes to
//! f16 against four to bf16, worth up to +0.05 of copy bandwidth at 16
//! tokens on the smaller weights (docs/design.md). They need no FP8
//! hardware: on Ampere (sm_80, sm_86, sm_87) the codes are upcast by integer
//! code, four instructions a pair as with the FP8 instructions
//! (`kernels/common.cuh`). On an H100 under `OCTET_FP8_CONVERT=soft` that
//! read within 0.00-0.03 of the hardware path; no Ampere GPU has run it.
//!
//! - `M <= 64`: one kernel copies the FP8 codes and the x tiles into shared
//!   memory by cp.async, one or two 128-column blocks ahead of the block each
//!   warp multiplies (the codes once from DRAM; groups of 8 or 16 tokens share each
//!   weight tile through L2), converts the codes to bf16 in registers and
//!   feeds `mma.m16n8k16` (f32 accumulation); block factors apply per 128
//!   columns, tensor and row factors to the result. This is the decode path,
//!   where weight bytes are the cost. Its shape (warps, stages) depends on the
//!   tokens (`SMALL_CFG`); at 9-64 tokens a block takes 64 or 32 weight rows
//!   instead of 16 where those blocks still fill the SMs (`SMALL_WIDE`), so
//!   that each x tile it reads through L2 serves more codes; where 32-row
//!   blocks fill more than half of the SMs but not all, 32 rows with 8 warps,
//!   one block an SM (`SMALL_FEW`). [`Gpu::mixed_matmul_swiglu`] runs it over a
//!   decoder's interleaved gate and up rows and writes `silu(gate) * up`
//!   from its epilogue. On sm_90 and later it is launched as a
//!   programmatic dependent of the previous kernel, its first copies of codes
//!   (and, over tiled codes, its row factors) overlapping that kernel's tail.
//!   A launch of few blocks takes enough shared memory a block to spread
//!   over all SMs (`small_smem`).
//! - `M > 64` on Hopper (`sm_90a`): `mixed_wg`, a warpgroup-MMA kernel that
//!   copies the FP8 codes into shared memory as they are, upcasts each
//!   thread's fragment to bf16 in registers and feeds it to `wgmma` as the A
//!   operand (`y^T = W x^T`, 128 weight rows x 256 tokens a block); tensor
//!   and row factors scale the f32 sums in its epilogue, block factors the
//!   upcast codes (rounding to x's type). For bf16 x the codes are scaled in
//!   bf16 arithmetic, five instructions a pair of codes (`bf16_scalable`
//!   says which factors allow it); otherwise in f32, six. No copy of the
//!   weight is made.
//! - `M > 64` elsewhere (or with `OCTET_MIXED=upcast`, as on Ampere): the
//!   codes are upcast to a bf16 scratch copy of the weight (exact; under
//!   block scaling the factor is applied there and rounds to bf16) and a
//!   cuBLASLt bf16 GEMM multiplies it, with a per-tensor factor as its alpha;
//!   under per-row scaling the GEMM writes f32 and a pass applies the row
//!   factors. The scratch lives for the call only. (Measured and dropped,
//!   docs/design.md: cuBLASLt's per-row alpha vector, and upcasting in
//!   L2-sized slabs of columns; both slower on the H100.)
//!
//! Device layout of a [`DeviceFp8Weight`] ([`CodeLayout`]): the codes either
//! row-major `(N, K)` as in [`Fp8Weight`] (each row's `K` codes contiguous:
//! with `K % 16 == 0` every 16-byte load is aligned), which cuBLASLt's FP8
//! GEMMs take (the LoRA base, [`Gpu::upload_fp8_weight`]), or tiled for these
//! kernels' loads ([`Gpu::upload_fp8_weight_tiled`], what `octet generate`
//! uploads): `(ceil(N/16), ceil(K/128), 16, 128)`, tile `(t, b)` holding rows
//! `16t..16t+15` and columns `128b..128b+127`, zero past `N` and `K`
//! ([`tile_codes`]). A small-M warp's copy of 16 rows x 128 columns is then
//! one contiguous 2 KiB run instead of 16 runs of 128 bytes `K` bytes apart:
//! +0.00 to +0.06 of copy bandwidth at 1 to 16 tokens on the H100, least on
//! the smallest weight. The factors are
//! f32 (1, `N`, or one per 128x128 tile) in either layout.
//!
//! Range: the small-M kernel sums x times the codes' values in f32 and applies
//! a tensor or row factor after the sum. A code's value exceeds the weight it
//! stands for by the inverse factor, so with activations near the top of
//! f32's range (|x| * 57344 * K past 3.4e38 for E5M2 codes) an output can be
//! infinite where the dequantized product is finite. The CPU kernel sums such
//! an output again in f64 (`octet_tensor::mixed`); this one does not, and the
//! two then differ. No activation of a trained model comes near it.

use crate::tma::TmaMap;
use crate::{Error, GemmOut, Gpu, Result};
use cudarc::driver::{CudaFunction, CudaModule, CudaSlice, LaunchConfig, PushKernelArg};
use octet_fp8::Format;
use octet_tensor::mixed::{Fp8Weight, WeightScaling};
use std::sync::Arc;

mod shapes;
pub use shapes::*;

/// The compiled weight-only kernels. `[x type]` is [`XType`]'s order.
pub(crate) struct MixedKernels {
    /// `[x type][format][SMALL_CFG row][layout][out f32 / bf16]`.
    small: [[[ByLayout; 3]; 2]; 2],
    /// `SMALL_F16_FEW`'s kernels, `[format][layout][out]`: only where two
    /// of its blocks fit an SM (`few_fits`; not on sm_80/86/89/120).
    small_f16_few: Option<[ByLayout; 2]>,
    /// `SMALL_WIDE`'s kernels, `[shape][x type][format][layout][out]`.
    small_wide: [[[ByLayout; 2]; 2]; 2],
    /// `SMALL_FEW`'s kernels, `[x type][format][layout][out]`: only where one
    /// of its blocks fits a block's shared memory (128 KiB; not on sm_86/89/120).
    small_few: Option<[[ByLayout; 2]; 2]>,
    /// `[x type][format]`.
    upcast: [[CudaFunction; 2]; 2],
    /// `[out f32 / bf16]`.
    epilogue: [CudaFunction; 2],
    /// The wgmma kernel for large M, `[x type][block scaling][format][out
    /// f32 / bf16]`: on `sm_90a` only, and absent under `OCTET_MIXED=upcast`.
    wg: Option<[[[[CudaFunction; 2]; 2]; 2]; 2]>,
    /// The wgmma kernel scaling block codes in bf16, bf16 x, `[format][out]`:
    /// present with `wg`.
    pub(crate) wg_block_bf16: Option<[[CudaFunction; 2]; 2]>,
    /// Launch the small-M kernel as a programmatic dependent of the previous
    /// kernel: on sm_90 and later.
    pdl: bool,
    /// The device's shared memory: an SM's, the most one block may take, and
    /// what the system reserves a block, in bytes.
    smem: SmemLimits,
    /// The read-only calibration pass of `octet bench mixed`.
    read_floor: CudaFunction,
    /// Which of the 16-token shapes that read x once for more weight rows
    /// (`SMALL_WIDE`, `SMALL_FEW`) this device takes: see [`shapes16`].
    shapes: Shapes16,
}

/// The element type of the activations `x` of a weight-only product on the
/// GPU ([`Gpu::mixed_matmul_x`]). Both hold every FP8 value exactly, so the
/// products are the same numbers; the cost differs. A pair of codes becomes
/// f16x2 in one instruction and bf16x2 in four, which bounds the small-M
/// kernel at 16 tokens on the smaller weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XType {
    /// bfloat16 bits.
    Bf16 = 0,
    /// IEEE binary16 bits.
    F16 = 1,
}

impl XType {
    /// The suffix of the kernels' names (`_xf16` for f16 x).
    fn tag(self) -> &'static str {
        match self {
            XType::Bf16 => "",
            XType::F16 => "_xf16",
        }
    }
}

/// `[f(Bf16), f(F16)]`: one value per x type, indexed by `XType as usize`.
fn per_x<T>(f: impl Fn(XType) -> Result<T>) -> Result<[T; 2]> {
    Ok([f(XType::Bf16)?, f(XType::F16)?])
}

/// `[f("e4m3"), f("e5m2")]`: one value per format (kernel-name part),
/// indexed as `format_index` does.
fn per_fmt<T>(f: impl Fn(&str) -> Result<T>) -> Result<[T; 2]> {
    Ok([f("e4m3")?, f("e5m2")?])
}

/// A small-M kernel for each layout of the codes and each output,
/// `[CodeLayout as usize][out f32 / bf16]`.
type ByLayout = [[CudaFunction; 2]; 2];

/// How a [`DeviceFp8Weight`]'s codes lie in device memory (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodeLayout {
    /// `(N, K)` row-major, as [`Fp8Weight`] holds them and cuBLASLt takes them.
    RowMajor = 0,
    /// `(ceil(N/16), ceil(K/128), 16, 128)` tiles ([`tile_codes`]), for the
    /// weight-only kernels alone.
    Tiled = 1,
}

/// Row-major `(n, k)` codes in the tiled layout: tile `(t, b)` (row tile
/// `t`, column block `b`) at `(t * ceil(k/128) + b) * 2048`, its row `r` at
/// `128 r` within it; rows past `n` and columns past `k` are zero. Fails
/// unless `codes` holds `n * k` bytes.
pub fn tile_codes(codes: &[u8], n: usize, k: usize) -> Result<Vec<u8>> {
    if codes.len() != n * k {
        return Err(Error::Shape(format!(
            "tile_codes: {} codes for ({n}, {k})",
            codes.len()
        )));
    }
    let kb = k.div_ceil(128);
    let mut out = vec![0u8; n.div_ceil(16) * 16 * kb * 128];
    for (row, src) in codes.chunks_exact(k.max(1)).enumerate() {
        let (t, r) = (row / 16, row % 16);
        for (b, piece) in src.chunks(128).enumerate() {
            let dst = ((t * kb + b) * 16 + r) * 128;
            out[dst..dst + piece.len()].copy_from_slice(piece);
        }
    }
    Ok(out)
}

/// Gate and up projections, stacked `(2 ff, k)` (the `ff` gate rows, then
/// the `ff` up rows), reordered for [`Gpu::mixed_matmul_swiglu`]: in groups
/// of 8 features, 8 gate rows then the same features' 8 up rows, so that
/// each 16-row tile of the small-M kernel holds both halves of 8 features
/// (an mma lane's rows g and g + 8). Needs `ff % 8 == 0`.
pub fn interleave_gate_up<T: Copy>(stacked: &[T], ff: usize, k: usize) -> Result<Vec<T>> {
    if !ff.is_multiple_of(8) || stacked.len() != 2 * ff * k {
        return Err(Error::Shape(format!(
            "interleave_gate_up: {} values for gate and up of ({ff}, {k}); needs 2 ff k values and ff % 8 == 0",
            stacked.len()
        )));
    }
    let (gate, up) = stacked.split_at(ff * k);
    let mut out = Vec::with_capacity(stacked.len());
    for (g, u) in gate.chunks_exact(8 * k).zip(up.chunks_exact(8 * k)) {
        out.extend_from_slice(g);
        out.extend_from_slice(u);
    }
    Ok(out)
}

/// Dynamic shared memory of `mixed_wg`: five 40 KiB stages, their five
/// barriers, and 1 KiB of slack for the 1024-byte alignment of the swizzled tiles.
const WG_SMEM: usize = 5 * (256 * 64 * 2 + 128 * 64) + 64 + 1024;
/// Weight rows and tokens of one `mixed_wg` block.
const WG_TILE: (usize, usize) = (128, 256);

impl MixedKernels {
    /// Which of the wide and few-block 16-token shapes launches take (the
    /// few-block one only where its kernels were built).
    pub(crate) fn shapes16(&self) -> Shapes16 {
        Shapes16 {
            few: self.shapes.few && self.small_few.is_some(),
            ..self.shapes
        }
    }

    pub(crate) fn load(
        parts: &[Arc<CudaModule>],
        arch: &str,
        smem: SmemLimits,
        shapes: Shapes16,
    ) -> Result<MixedKernels> {
        use cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as MAXSMEM;
        // A kernel from whichever part of the module built it.
        let f = |name: &str| -> Result<CudaFunction> {
            parts
                .iter()
                .find_map(|m| m.load_function(name).ok())
                .ok_or_else(|| {
                    Error::Driver(format!("kernel {name} is in no part of the mixed module"))
                })
        };
        // The wgmma kernels (sm_90a, unless OCTET_MIXED=upcast), and those
        // scaling block codes in bf16 with them.
        let (wg, wg_block_bf16) =
            if arch == "sm_90a" && !crate::env_switch("OCTET_MIXED", "upcast")? {
                let by_fmt = |block: &str, fmt: &str, x: &str| -> Result<[CudaFunction; 2]> {
                    let k = |out: &str| -> Result<CudaFunction> {
                        let func = f(&format!("mixed_wg_{block}{fmt}{x}_{out}"))?;
                        func.set_attribute(MAXSMEM, WG_SMEM as i32)?;
                        Ok(func)
                    };
                    Ok([k("f32")?, k("bf16")?])
                };
                let wg = per_x(|x| {
                    Ok([
                        per_fmt(|fmt| by_fmt("", fmt, x.tag()))?,
                        per_fmt(|fmt| by_fmt("block_", fmt, x.tag()))?,
                    ])
                })?;
                let block_bf16 = per_fmt(|fmt| by_fmt("blockbf_", fmt, XType::Bf16.tag()))?;
                (Some(wg), Some(block_bf16))
            } else {
                (None, None)
            };
        // A small-M kernel built for `c`, allowed up to the most a block may
        // take (`small_smem`).
        let sized = |name: String, c: &SmallCfg| -> Result<CudaFunction> {
            let func = f(&name)?;
            func.set_attribute(MAXSMEM, c.smem(c.tokens).max(smem.per_block) as i32)?;
            Ok(func)
        };
        // Row-major and tiled (`t` appended), f32 and bf16 out, of `base`.
        let by_layout = |base: &str, c: &SmallCfg| -> Result<ByLayout> {
            Ok([
                [
                    sized(format!("{base}_f32"), c)?,
                    sized(format!("{base}_bf16"), c)?,
                ],
                [
                    sized(format!("{base}_f32t"), c)?,
                    sized(format!("{base}_bf16t"), c)?,
                ],
            ])
        };
        let small = |fmt: &str, x: XType| -> Result<[ByLayout; 3]> {
            let by_cfg =
                |c: &SmallCfg| by_layout(&format!("mixed_{fmt}_n{}{}", c.tokens, x.tag()), c);
            Ok([
                by_cfg(&SMALL_CFG[0])?,
                by_cfg(&SMALL_CFG[1])?,
                by_cfg(&SMALL_CFG[2])?,
            ])
        };
        Ok(MixedKernels {
            small: per_x(|x| per_fmt(|fmt| small(fmt, x)))?,
            small_wide: {
                let wide = |c: &SmallCfg| {
                    per_x(|x| {
                        per_fmt(|fmt| {
                            by_layout(&format!("mixed_{fmt}_n16r{}{}", c.row_tiles, x.tag()), c)
                        })
                    })
                };
                [wide(&SMALL_WIDE[0])?, wide(&SMALL_WIDE[1])?]
            },
            small_few: if SMALL_FEW.smem(SMALL_FEW.tokens) <= smem.per_block {
                Some(per_x(|x| {
                    per_fmt(|fmt| by_layout(&format!("mixed_{fmt}_n16r2w8{}", x.tag()), &SMALL_FEW))
                })?)
            } else {
                None
            },
            small_f16_few: if few_fits(smem) {
                Some(per_fmt(|fmt| {
                    by_layout(&format!("mixed_{fmt}_n16w6_xf16"), &SMALL_F16_FEW)
                })?)
            } else {
                None
            },
            upcast: per_x(|x| per_fmt(|fmt| f(&format!("upcast_{fmt}{}", x.tag()))))?,
            epilogue: [f("mixed_epilogue_f32")?, f("mixed_epilogue_bf16")?],
            wg,
            wg_block_bf16,
            pdl: !arch.starts_with("sm_8"),
            smem,
            read_floor: f("read_floor")?,
            shapes,
        })
    }
}

/// An FP8 weight on the device, ready for [`Gpu::mixed_matmul`].
///
/// Its device buffers are written once, by [`Gpu::upload_fp8_weight`] or
/// [`Gpu::upload_fp8_weight_tiled`], and
/// are not reachable for writing outside this crate: the small-M kernel
/// starts reading the codes and factors before the previous kernel in the stream has
/// finished (a programmatic dependent launch), which is sound only because
/// no kernel ever writes them.
pub struct DeviceFp8Weight {
    /// Output channels `N`.
    pub n: usize,
    /// Input features `K` (a multiple of 16).
    pub k: usize,
    /// E4M3 or E5M2.
    pub format: Format,
    /// Scale granularity.
    pub scaling: WeightScaling,
    /// The codes, laid out as `layout` says.
    pub(crate) codes: CudaSlice<u8>,
    /// Row-major or tiled.
    pub(crate) layout: CodeLayout,
    /// Dequantization factors.
    pub factors: CudaSlice<f32>,
    /// The factor of a per-tensor scaled weight (1 otherwise), kept on the
    /// host as well: the large-M path passes it to the GEMM as its alpha.
    pub(crate) tensor_factor: f32,
    /// A bound on `|W|`: the largest factor times the format's largest
    /// value (NaN if a factor is). Above `M = 64` with f16 x a block-scaled
    /// weight is rounded to f16 code by code, which this must keep finite.
    pub(crate) max_abs: f32,
    /// Block-scaled, with factors the wgmma kernel can apply in bf16
    /// arithmetic ([`bf16_scalable`]).
    pub(crate) block_bf16: bool,
}

impl DeviceFp8Weight {
    /// The codes, in [`DeviceFp8Weight::layout`].
    pub fn codes(&self) -> &CudaSlice<u8> {
        &self.codes
    }

    /// How the codes are laid out.
    pub fn layout(&self) -> CodeLayout {
        self.layout
    }

    /// The codes as cuBLASLt takes them, row-major `(N, K)`; an error for a
    /// tiled weight (uploaded for the weight-only kernels alone).
    pub fn row_major(&self, what: &str) -> Result<&CudaSlice<u8>> {
        match self.layout {
            CodeLayout::RowMajor => Ok(&self.codes),
            CodeLayout::Tiled => Err(Error::Shape(format!(
                "{what} needs the weight's codes row-major; this one was uploaded tiled \
                 (upload_fp8_weight_tiled), for mixed_matmul only"
            ))),
        }
    }

    /// A bound on `|W|`: the largest dequantization factor times the
    /// format's largest value.
    pub fn max_abs(&self) -> f32 {
        self.max_abs
    }

    /// The dequantization factors (1, `N`, or one per 128x128 tile).
    pub fn factors(&self) -> &CudaSlice<f32> {
        &self.factors
    }

    /// Device bytes: codes plus factors.
    pub fn bytes(&self) -> usize {
        self.codes.len() + 4 * self.factors.len()
    }

    /// Fails unless `(n, k)` (crate-visible fields) still match the codes and
    /// factors the upload made: `K % 16 == 0`, `n * k` codes (row-major) or
    /// whole 16 x 128 tiles of them (tiled), and the factors `scaling` reads.
    /// The kernels index both buffers by `(n, k)` and the scaling alone.
    pub(crate) fn check(&self, what: &str) -> Result<()> {
        let (n, k) = (self.n as u128, self.k as u128);
        let codes = match self.layout {
            CodeLayout::RowMajor => n * k,
            CodeLayout::Tiled => n.div_ceil(16) * 16 * k.div_ceil(128) * 128,
        };
        let factors = match self.scaling {
            WeightScaling::Tensor => 1,
            WeightScaling::Channel => n,
            WeightScaling::Block128 => n.div_ceil(128) * k.div_ceil(128),
        };
        if n == 0
            || k == 0
            || k % 16 != 0
            || codes != self.codes.len() as u128
            || factors != self.factors.len() as u128
        {
            return Err(Error::Shape(format!(
                "{what}: weight ({}, {}) under {:?} scaling ({:?} codes) needs {codes} codes and \
                 {factors} factors with K % 16 == 0; the device holds {} and {} (n, k or scaling \
                 changed after upload?)",
                self.n,
                self.k,
                self.scaling,
                self.layout,
                self.codes.len(),
                self.factors.len()
            )));
        }
        Ok(())
    }
}

/// `mode` of the kernels: the scaling, with `MODE_TILED` for tiled codes.
fn mode_bits(w: &DeviceFp8Weight) -> i32 {
    mode(w.scaling) | if w.layout == CodeLayout::Tiled { 4 } else { 0 }
}

/// `MODE_SWIGLU` in mixed.cu.
const MODE_SWIGLU: i32 = 8;

/// The kernels' format index (0 E4M3, 1 E5M2).
fn format_index(w: &DeviceFp8Weight) -> Result<usize> {
    match w.format {
        Format::E4M3 => Ok(0),
        Format::E5M2 => Ok(1),
        other => Err(Error::Shape(format!(
            "weight-only products take E4M3 or E5M2, not {}",
            other.name()
        ))),
    }
}

fn mode(s: WeightScaling) -> i32 {
    match s {
        WeightScaling::Tensor => 0,
        WeightScaling::Channel => 1,
        WeightScaling::Block128 => 2,
    }
}

/// The arguments every weight-only kernel ends with: factors, `y`, then
/// `M, N, K` and the scale mode.
fn push_tail<'a, D: cudarc::driver::DeviceRepr>(
    b: &mut cudarc::driver::LaunchArgs<'a>,
    factors: &'a CudaSlice<f32>,
    y: &'a mut CudaSlice<D>,
    dims: &'a [i32; 4],
) {
    b.arg(factors).arg(y);
    for d in dims {
        b.arg(d);
    }
}

/// Whether the wgmma kernel's bf16 scaling (`fp8x2_to_bf16x2_times` in
/// mixed.cu) takes these block factors: each factor times 2^120 (E4M3) or
/// 2^112 (E5M2), the power its shifted codes lack, must split into two
/// finite, normal bf16 with products well inside bf16's normal range: from
/// 2^20 to below 2^127. So E4M3 factors from 2^-100 to below 2^7 (weights
/// up to |W| = 57344) and E5M2 ones from 2^-92 to below 2^15. Others are
/// applied in f32.
pub(crate) fn bf16_scalable(format: Format, factors: &[f32]) -> bool {
    let bias = match format {
        Format::E4M3 => 120,
        Format::E5M2 => 112,
        _ => return false,
    };
    let (lo, hi) = (2f32.powi(20 - bias), 2f32.powi(127 - bias));
    factors.iter().all(|&f| f >= lo && f < hi)
}

/// Up to this many rows of `x` take the fused small-M kernel (in groups of 8 or 16).
pub const SMALL_M: usize = 64;

/// How many parts `kernels/mixed.cu` is compiled in (`MIXED_PART` 0: the
/// small-M kernels for up to 8 tokens and the upcast path; 1: 9 to 16
/// tokens; 2: the wgmma kernels; 3: the wgmma kernels scaling block codes
/// in bf16), each by its own NVRTC call, at once, when the GPU is opened.
/// On the CPU machine one call over the whole file took 14.1 s and the
/// first three parts 3.3 / 4.2 / 5.9 s.
pub const MIXED_PARTS: usize = 4;

impl Gpu {
    /// Whether a product of more than [`SMALL_M`] rows of `xt` scales `w`'s
    /// block codes in bf16 arithmetic (the wgmma kernel's five-instruction
    /// path; `bf16_scalable`) rather than in f32.
    pub fn block_in_bf16(&self, w: &DeviceFp8Weight, xt: XType) -> bool {
        self.k.mixed.wg_block_bf16.is_some() && xt == XType::Bf16 && w.block_bf16
    }

    /// Copy an [`Fp8Weight`] to the device, codes row-major (what cuBLASLt's
    /// FP8 GEMMs take as well as [`Gpu::mixed_matmul`]). `K` must be a
    /// multiple of 16 (the kernels' 16-byte loads); `N` and `K` must fit in
    /// an i32.
    pub fn upload_fp8_weight(&self, w: &Fp8Weight) -> Result<DeviceFp8Weight> {
        self.upload_fp8(w, CodeLayout::RowMajor)
    }

    /// Copy an [`Fp8Weight`] to the device with its codes tiled
    /// ([`CodeLayout::Tiled`], [`tile_codes`]): for a weight that only
    /// [`Gpu::mixed_matmul`] reads, as in decoding, whose small-M loads it
    /// suits. Same requirements as [`Gpu::upload_fp8_weight`].
    pub fn upload_fp8_weight_tiled(&self, w: &Fp8Weight) -> Result<DeviceFp8Weight> {
        self.upload_fp8(w, CodeLayout::Tiled)
    }

    fn upload_fp8(&self, w: &Fp8Weight, layout: CodeLayout) -> Result<DeviceFp8Weight> {
        let (n, k) = (w.rows(), w.cols());
        if k % 16 != 0 {
            return Err(Error::Shape(format!(
                "weight-only FP8 products on the GPU need K % 16 == 0, got K = {k} (pad the weight's columns)"
            )));
        }
        // The tiled layout pads to whole 16 x 128 tiles.
        if n.div_ceil(16) * 16 * k.div_ceil(128) * 128 > i32::MAX as usize {
            return Err(Error::Shape(format!(
                "weight ({n}, {k}) is beyond the kernel's 2^31 elements"
            )));
        }
        Ok(DeviceFp8Weight {
            n,
            k,
            format: w.format(),
            scaling: w.scaling(),
            tensor_factor: match w.scaling() {
                WeightScaling::Tensor => w.factors().first().copied().unwrap_or(1.0),
                _ => 1.0,
            },
            block_bf16: w.scaling() == WeightScaling::Block128
                && bf16_scalable(w.format(), w.factors()),
            max_abs: w.factors().iter().fold(0f32, |a, f| {
                if a.is_nan() || f.is_nan() {
                    f32::NAN
                } else {
                    a.max(f.abs())
                }
            }) * w.format().max(),
            codes: match layout {
                CodeLayout::RowMajor => self.upload(w.codes())?,
                CodeLayout::Tiled => self.upload(&tile_codes(w.codes(), n, k)?)?,
            },
            layout,
            factors: self.upload(w.factors())?,
        })
    }

    /// `y (m, N) = x (m, K) @ W^T` with `x` bf16 bits, `y` f32 or bf16 bits
    /// (see the module docs for the two paths).
    pub fn mixed_matmul<D: GemmOut>(
        &self,
        x: &CudaSlice<u16>,
        m: usize,
        w: &DeviceFp8Weight,
        y: &mut CudaSlice<D>,
    ) -> Result<()> {
        self.mixed_matmul_x(x, XType::Bf16, m, w, y)
    }

    /// `y (m, N) = x (m, K) @ W^T` with `x` bf16 or f16 bits (`xt`), `y` f32
    /// or bf16 bits. The same paths as [`Gpu::mixed_matmul`], with the codes
    /// upcast to `xt`. One combination is refused: f16 x above
    /// [`SMALL_M`] rows with a block-scaled weight whose dequantized values
    /// may pass f16's largest, 65504 ([`DeviceFp8Weight::max_abs`]); there
    /// each code times its factor is rounded to f16 before the product (to
    /// bf16 for bf16 x, which cannot overflow).
    pub fn mixed_matmul_x<D: GemmOut>(
        &self,
        x: &CudaSlice<u16>,
        xt: XType,
        m: usize,
        w: &DeviceFp8Weight,
        y: &mut CudaSlice<D>,
    ) -> Result<()> {
        w.check("mixed product")?;
        let (n, k) = (w.n, w.k);
        if m == 0 || x.len() != m * k || y.len() != m * n {
            return Err(Error::Shape(format!(
                "mixed product: x has {} elements for ({m}, {k}), y has {} for ({m}, {n})",
                x.len(),
                y.len()
            )));
        }
        if m > i32::MAX as usize / k.max(1) {
            return Err(Error::Shape(format!("x ({m}, {k}) is too large")));
        }
        let fmt = format_index(w)?;
        let out = match D::OUT {
            crate::OutType::F32 => 0,
            crate::OutType::Bf16 => 1,
        };
        // The scaling, and the layout's bit (MODE_TILED in mixed.cu).
        let tiled = w.layout == CodeLayout::Tiled;
        let dims = [m as i32, n as i32, k as i32, mode_bits(w)];
        let (mi, ni, ki, md) = (dims[0], dims[1], dims[2], dims[3]);
        let xi = xt as usize;
        if m <= SMALL_M {
            return self.small_m(xi, fmt, out, w, x, y, &dims);
        }
        if xt == XType::F16
            && w.scaling == WeightScaling::Block128
            && (w.max_abs.is_nan() || w.max_abs > 65504.0)
        {
            return Err(Error::Shape(format!(
                "mixed product with f16 x above {SMALL_M} rows: this 128x128-block-scaled weight \
                 reaches |W| = {:e}, beyond f16's 65504, and each code times its factor is \
                 rounded to x's type there; use bf16 x, or at most {SMALL_M} rows a call",
                w.max_abs
            )));
        }
        if let Some(wg) = &self.k.mixed.wg {
            let block = usize::from(w.scaling == WeightScaling::Block128);
            let func = match &self.k.mixed.wg_block_bf16 {
                Some(bf) if self.block_in_bf16(w, xt) => &bf[fmt][out],
                _ => &wg[xi][block][fmt][out],
            };
            let cfg = LaunchConfig {
                grid_dim: (
                    m.div_ceil(WG_TILE.1) as u32,
                    n.div_ceil(WG_TILE.0) as u32,
                    1,
                ),
                block_dim: (256, 1, 1),
                shared_mem_bytes: WG_SMEM as u32,
            };
            use cudarc::driver::sys::CUtensorMapSwizzle::*;
            use cudarc::driver::DevicePtr;
            // The pointers are used by this launch only, on this stream.
            let (xp, _gx) = x.device_ptr(&self.stream);
            let (wp, _gw) = w.codes.device_ptr(&self.stream);
            let xmap = TmaMap::new(xp, 2, &[k, m], &[64, 256], CU_TENSOR_MAP_SWIZZLE_128B)?;
            // Tiled codes: (column, row) in a tile, tile column, tile row;
            // the box is 64 columns of 8 row tiles (128 rows), as the 2-D one.
            let wmap = if tiled {
                let dims = [128, 16, k.div_ceil(128), n.div_ceil(16)];
                TmaMap::new(wp, 1, &dims, &[64, 16, 1, 8], CU_TENSOR_MAP_SWIZZLE_64B)?
            } else {
                TmaMap::new(wp, 1, &[k, n], &[64, 128], CU_TENSOR_MAP_SWIZZLE_64B)?
            };
            let mut b = self.stream.launch_builder(func);
            b.arg(&xmap).arg(&wmap);
            push_tail(&mut b, &w.factors, y, &dims);
            // SAFETY: argument types match the kernel; shapes were checked above,
            // K % 16 == 0 at upload, and the kernel zero-fills and guards rows,
            // tokens and columns outside (M, N, K).
            unsafe { b.launch(cfg) }?;
            return Ok(());
        }
        // Large M: exact upcast to x's type (block factors applied), then a
        // bf16 GEMM with the tensor factor as its alpha, or into f32 for a
        // pass applying the row (or, for f16 x, any) factors.
        // SAFETY: uninitialised, and every element is written by the upcast below.
        let mut wb = unsafe { self.stream.alloc::<u16>(n * k) }
            .map_err(|e| crate::oom(e, 2 * n * k, "mixed: 16-bit copy of the weight"))?;
        let threads = (n * k / 16) as u32;
        let cfg = LaunchConfig {
            grid_dim: (threads.div_ceil(256), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.k.mixed.upcast[xi][fmt]);
        b.arg(&w.codes)
            .arg(&w.factors)
            .arg(&mut wb)
            .arg(&ni)
            .arg(&ki)
            .arg(&md);
        // SAFETY: types match; one thread per 16 codes, guarded by N * K.
        unsafe { b.launch(cfg) }?;
        if xt == XType::Bf16 && w.scaling != WeightScaling::Channel {
            let alpha = match w.scaling {
                WeightScaling::Tensor => w.tensor_factor,
                _ => 1.0,
            };
            return self.gemm_bf16_acc((x, false), (&wb, true), y, (m, n, k), (alpha, 0.0));
        }
        // SAFETY: uninitialised, and every element is written by the GEMM (beta = 0).
        let mut acc = unsafe { self.stream.alloc::<f32>(m * n) }
            .map_err(|e| crate::oom(e, 4 * m * n, "mixed: f32 accumulator"))?;
        match xt {
            XType::Bf16 => self.gemm_bf16(x, &wb, &mut acc, (m, n, k))?,
            XType::F16 => self.blas()?.gemm_f16(x, &wb, &mut acc, (m, n, k))?,
        }
        let cfg = LaunchConfig {
            grid_dim: ((m * n).div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let scaling = mode(w.scaling);
        let mut b = self.stream.launch_builder(&self.k.mixed.epilogue[out]);
        b.arg(&acc)
            .arg(&w.factors)
            .arg(y)
            .arg(&mi)
            .arg(&ni)
            .arg(&scaling);
        // SAFETY: types match; guarded by M * N.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }
}

impl Gpu {
    /// `act (m, N / 2) = silu(x G^T) * (x U^T)`, bf16 bits, for `m` up to
    /// [`SMALL_M`] rows, where `w` holds a decoder's gate and up projections
    /// interleaved by [`interleave_gate_up`] (`N = 2 ff`, `N % 16 == 0`): the
    /// small-M kernel joins each feature's gate and up in its epilogue, so
    /// the `(m, N)` product never reaches memory. The same bits as
    /// [`Gpu::mixed_matmul`] into f32 followed by the decoder's SwiGLU
    /// (`swiglu_bf16`, one formula in `common.cuh`).
    pub fn mixed_matmul_swiglu(
        &self,
        x: &CudaSlice<u16>,
        m: usize,
        w: &DeviceFp8Weight,
        act: &mut CudaSlice<u16>,
    ) -> Result<()> {
        w.check("fused SwiGLU product")?;
        let (n, k) = (w.n, w.k);
        if m == 0 || m > SMALL_M || n % 16 != 0 || x.len() != m * k || act.len() != m * n / 2 {
            return Err(Error::Shape(format!(
                "fused SwiGLU product: x has {} elements for ({m}, {k}), act {} for ({m}, {}); \
                 needs 1 to {SMALL_M} rows and N % 16 == 0 (N = {n})",
                x.len(),
                act.len(),
                n / 2
            )));
        }
        let dims = [m as i32, n as i32, k as i32, mode_bits(w) | MODE_SWIGLU];
        self.small_m(XType::Bf16 as usize, format_index(w)?, 1, w, x, act, &dims)
    }

    /// The small-M kernel for `dims = [M, N, K, mode]` (`M <= SMALL_M`), in
    /// the shape the tokens, the launch's blocks and the device call for.
    #[allow(clippy::too_many_arguments)]
    fn small_m<D: GemmOut>(
        &self,
        xi: usize,
        fmt: usize,
        out: usize,
        w: &DeviceFp8Weight,
        x: &CudaSlice<u16>,
        y: &mut CudaSlice<D>,
        dims: &[i32; 4],
    ) -> Result<()> {
        let n = dims[1] as usize;
        if n.div_ceil(16) > 65535 {
            return Err(Error::Shape(format!(
                "mixed product: N = {n} is beyond the small-M kernel's grid (65535 tiles of 16 rows)"
            )));
        }
        let m = dims[0] as usize;
        let lay = w.layout as usize;
        let c = SMALL_CFG
            .iter()
            .position(|c| m.min(16) as u32 <= c.tokens)
            .unwrap_or(SMALL_CFG.len() - 1);
        let groups = (m as u32).div_ceil(SMALL_CFG[c].group());
        let blocks = groups * (n as u32).div_ceil(SMALL_CFG[c].rows());
        let shapes = self.k.mixed.shapes;
        let few16 = shapes.few && c == 2;
        let wide = shapes.wide && c == 2;
        if let Some(few) = &self.k.mixed.small_few {
            if few16 && few_shape(groups, n as u32, self.sm_count as u32) {
                return self.launch_small(&few[xi][fmt][lay][out], &SMALL_FEW, w, x, y, dims);
            }
        }
        if let Some(few) = &self.k.mixed.small_f16_few {
            if xi == XType::F16 as usize && c == 2 && blocks <= 2 * self.sm_count as u32 {
                return self.launch_small(&few[fmt][lay][out], &SMALL_F16_FEW, w, x, y, dims);
            }
        }
        if wide {
            if let Some(s) = wide_shape(groups, n as u32, self.sm_count as u32) {
                let f = &self.k.mixed.small_wide[s][xi][fmt][lay][out];
                return self.launch_small(f, &SMALL_WIDE[s], w, x, y, dims);
            }
        }
        let f = &self.k.mixed.small[xi][fmt][c][lay][out];
        self.launch_small(f, &SMALL_CFG[c], w, x, y, dims)
    }

    /// Whether the wgmma weight-only kernel that scales block codes in bf16
    /// was compiled (sm_90a).
    pub fn has_wgmma_block_bf16(&self) -> bool {
        self.k.mixed.wg_block_bf16.is_some()
    }

    /// Whether kernels launch as programmatic dependents of the previous
    /// kernel (sm_90 and later).
    pub fn pdl(&self) -> bool {
        self.k.mixed.pdl
    }

    /// Launch the small-M kernel `f`, built for `cfg`, on `(M, N)` (grid:
    /// groups of `cfg.group()` tokens x tiles of `cfg.rows()` rows; slots of the first
    /// group's token rows), as a programmatic dependent of the previous kernel
    /// in the stream where the device has it (the kernel reads only the
    /// constant weight before its `griddepcontrol.wait`). cudarc's launch
    /// builder takes no launch attributes, hence `Dep` (`cuLaunchKernelEx`).
    fn launch_small<D: GemmOut>(
        &self,
        f: &CudaFunction,
        cfg: &SmallCfg,
        w: &DeviceFp8Weight,
        x: &CudaSlice<u16>,
        y: &mut CudaSlice<D>,
        dims: &[i32; 4],
    ) -> Result<()> {
        let grid = (
            (dims[0] as u32).div_ceil(cfg.group()),
            (dims[1] as u32).div_ceil(cfg.rows()),
        );
        // The first token group is the largest; a slot holds its rows.
        let xrows = (dims[0] as u32).min(cfg.group());
        let threads = cfg.warps * 32;
        let smem = small_smem(
            cfg.smem(xrows),
            grid.0 * grid.1,
            self.sm_count as u32,
            self.k.mixed.smem,
        );
        let mut a = crate::launch::Dep::new(&self.stream);
        a.ptr(&w.codes).ptr(x).ptr(&w.factors).ptr_mut(y);
        for &d in dims {
            a.i32(d);
        }
        let cfg = LaunchConfig {
            grid_dim: (grid.0, grid.1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem,
        };
        // SAFETY: the arguments are the kernel's (four device pointers, then
        // four i32); the caller checked the shapes and the kernel guards rows,
        // tokens and columns. The weight (codes and factors) the kernel reads before its wait is
        // written only by its upload (a copy, which a dependent launch does
        // not overlap).
        unsafe { a.launch(f, cfg, self.k.mixed.pdl) }
    }

    /// Read every byte of `data` (a multiple of 16 bytes) and write nothing:
    /// the calibration of `octet bench mixed` for a kernel that only reads.
    /// `sink` holds [`Gpu::read_floor_sink`] words.
    pub(crate) fn read_floor(&self, data: &CudaSlice<u8>, sink: &mut CudaSlice<u32>) -> Result<()> {
        if !data.len().is_multiple_of(16) {
            return Err(Error::Shape(format!(
                "read_floor takes whole 16-byte words, got {} bytes",
                data.len()
            )));
        }
        let blocks = self.read_floor_blocks();
        if sink.len() < self.read_floor_sink() {
            return Err(Error::Shape("read_floor: sink too small".into()));
        }
        let n16 = (data.len() / 16) as i64;
        let mut b = self.stream.launch_builder(&self.k.mixed.read_floor);
        b.arg(data).arg(&n16).arg(sink);
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: types match; the kernel reads `n16` words of `data` and
        // writes at most one word per thread of `sink`.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Blocks of 256 threads in [`Gpu::read_floor`]'s grid: 8 an SM, full occupancy.
    fn read_floor_blocks(&self) -> usize {
        8 * self.sm_count.max(1) as usize
    }

    /// Words of the `sink` of [`Gpu::read_floor`]: one per thread of its grid.
    pub(crate) fn read_floor_sink(&self) -> usize {
        self.read_floor_blocks() * 256
    }
}

#[cfg(test)]
mod tests {
    use super::{bf16_scalable, interleave_gate_up, small_smem, tile_codes, SmemLimits, SMALL_CFG};

    /// The host's table of small-M shapes and the kernels compiled for it
    /// must agree: the host sizes the dynamic shared memory from the warps
    /// and slots the kernel was built with.
    #[test]
    fn small_shapes_match_the_kernels() {
        let src = include_str!("../../kernels/mixed.cu");
        for c in &SMALL_CFG {
            let groups = if c.tokens > 8 { 2 } else { 1 };
            let line = format!(
                "MIXED_SMALL_CFG(n{}, {groups}, {}, {}, {}, {})",
                c.tokens, c.warps, c.stages, c.row_tiles, c.stepped
            );
            assert!(src.contains(&line), "mixed.cu lacks `{line}`");
        }
    }

    /// Every launch's token count finds a shape holding it, within the
    /// H100's 227 KiB of shared memory a block, with room for the warps'
    /// totals that the ring's memory holds at the end.
    #[test]
    fn small_shapes_cover_every_token_count() {
        for xrows in 1..=16u32 {
            let c = SMALL_CFG
                .iter()
                .find(|c| xrows <= c.tokens)
                .expect("a shape for up to 16 tokens");
            let smem = c.smem(xrows);
            assert!(smem <= 227 * 1024, "{xrows} tokens: {smem} bytes");
            let totals = c.warps * c.row_tiles * c.tokens.div_ceil(8) * 4 * 32 * 4;
            assert!(totals <= smem, "{xrows} tokens: totals {totals} > {smem}");
        }
        assert!(SMALL_CFG.windows(2).all(|w| w[0].tokens < w[1].tokens));
        let few = &super::SMALL_F16_FEW;
        let line = format!(
            "MIXED_SMALL_X(n16w6, _xf16, true, 2, {}, {}, {}, {})",
            few.warps, few.stages, few.row_tiles, few.stepped
        );
        assert!(include_str!("../../kernels/mixed.cu").contains(&line));
        assert_eq!(few.group(), SMALL_CFG[2].group());
        for wide in &super::SMALL_WIDE {
            let line = format!(
                "MIXED_SMALL_CFG(n16r{}, 2, {}, {}, {}, {})",
                wide.row_tiles, wide.warps, wide.stages, wide.row_tiles, wide.stepped
            );
            assert!(include_str!("../../kernels/mixed.cu").contains(&line));
            assert_eq!(wide.group(), SMALL_CFG[2].group());
            let totals = wide.warps * wide.row_tiles * 2 * 4 * 32 * 4;
            assert!(totals <= wide.smem(1) && wide.smem(16) <= 227 * 1024);
        }
        let few = &super::SMALL_FEW;
        let line = format!(
            "MIXED_SMALL_CFG(n16r2w8, 2, {}, {}, {}, {})",
            few.warps, few.stages, few.row_tiles, few.stepped
        );
        assert!(include_str!("../../kernels/mixed.cu").contains(&line));
        assert_eq!((few.group(), few.rows()), (SMALL_CFG[2].group(), 32));
        let totals = few.warps * few.row_tiles * 2 * 4 * 32 * 4;
        assert!(totals <= few.smem(1) && few.smem(16) <= 227 * 1024);
        // The most rows first (`wide_shape` takes the first that fills).
        assert!(super::SMALL_WIDE
            .windows(2)
            .all(|w| w[0].rows() > w[1].rows()));
    }

    /// The wide and few-block shapes go to the GPU they were measured on:
    /// the H200's peak (4814 GB/s on 132 SMs, as its driver reports it)
    /// takes them, the H100 SXM's (2619 MHz x 5120 bits, 3352 GB/s) does
    /// not, nor a device whose driver reports no memory clock.
    #[test]
    fn wide_shapes_follow_dram_bandwidth_an_sm() {
        use super::{shapes16, Shapes16};
        let peak = |mhz: f64, bits: f64| 2.0 * mhz * 1e6 * bits / 8.0 / 1e9;
        let (h200, h100) = (4814.0, peak(2619.0, 5120.0));
        assert!((h100 - 3352.0).abs() < 1.0);
        let s = |on| Shapes16 { wide: on, few: on };
        assert_eq!(shapes16(Some(h200), 132), s(true));
        assert_eq!(shapes16(Some(h100), 132), s(false));
        assert_eq!(shapes16(None, 132), s(false));
        // The same bandwidth over half the SMs is twice as much an SM.
        assert_eq!(shapes16(Some(h100), 66), s(true));
    }

    /// A wide 16-token shape goes where its blocks still fill the SMs, the
    /// widest that does: on 132 SMs none for 4096 rows at one token group
    /// (128 blocks of 32 rows), 32 rows at two groups (17-32 tokens, 128
    /// blocks of 64) and for 4193 to 8448 rows, 64 rows beyond.
    #[test]
    fn a_wide_shape_needs_a_block_for_every_sm() {
        use super::wide_shape;
        assert_eq!(wide_shape(1, 4096, 132), None);
        assert_eq!(wide_shape(1, 4192, 132), None); // 131 blocks of 32 rows
        assert_eq!(wide_shape(1, 4193, 132), Some(1)); // 132
        assert_eq!(wide_shape(2, 4096, 132), Some(1));
        assert_eq!(wide_shape(4, 4096, 132), Some(0));
        assert_eq!(wide_shape(1, 8384, 132), Some(1)); // 131 blocks of 64 rows
        assert_eq!(wide_shape(1, 8385, 132), Some(0));
        assert_eq!(wide_shape(1, 14336, 132), Some(0));
        assert_eq!(wide_shape(1, 28672, 132), Some(0));
    }

    /// The few-block shape goes where the 32-row blocks fill more than half
    /// of the SMs and fewer than all, which no wide shape takes: on 132 SMs
    /// 4096 rows at one token group (128 blocks), not 2048 (64) nor 8192.
    #[test]
    fn the_few_block_shape_sits_below_the_wide_ones() {
        use super::{few_shape, wide_shape};
        assert!(few_shape(1, 4096, 132));
        assert!(few_shape(1, 2113, 132)); // 67 blocks
        assert!(!few_shape(1, 2112, 132)); // 66
        assert!(!few_shape(1, 2048, 132));
        assert!(few_shape(1, 4192, 132)); // 131
        assert!(!few_shape(1, 4193, 132)); // 132: a wide shape's
        assert!(!few_shape(2, 4096, 132));
        for n in (16..20_000).step_by(16) {
            for groups in 1..=4 {
                assert!(!(few_shape(groups, n, 132) && wide_shape(groups, n, 132).is_some()));
            }
        }
    }

    /// Blocks that fit an SM side by side with `smem` dynamic bytes each (the
    /// driver's rule: each block also takes the reserved bytes, rounded up to
    /// 128-byte units).
    fn blocks_per_sm(smem: u32, lim: SmemLimits) -> u32 {
        lim.per_sm / ((smem + lim.reserved).div_ceil(128) * 128)
    }

    /// The bf16 scaling takes E4M3 factors in [2^-100, 2^7) and E5M2 ones in
    /// [2^-92, 2^15), every factor of the weight; FP4 never.
    #[test]
    fn bf16_scalable_takes_factors_whose_split_stays_normal() {
        use octet_fp8::Format;
        let typical = [0.05f32 / 448.0, 1e-3, 0.5];
        assert!(bf16_scalable(Format::E4M3, &typical));
        assert!(bf16_scalable(Format::E5M2, &typical));
        for (format, lo, hi) in [(Format::E4M3, -100, 7), (Format::E5M2, -92, 15)] {
            let (lo, hi) = (2f32.powi(lo), 2f32.powi(hi));
            assert!(bf16_scalable(format, &[lo, hi * (1.0 - f32::EPSILON)]));
            assert!(!bf16_scalable(format, &[0.01, hi]), "{format:?} {hi}");
            assert!(!bf16_scalable(format, &[lo * 0.5, 0.01]), "{format:?} {lo}");
        }
        assert!(!bf16_scalable(Format::E2M1, &typical));
    }

    /// The spread rule never lowers a block's need, caps an SM at exactly
    /// `ceil(blocks / SMs)` blocks where that is fewer than would fit, and
    /// leaves launches of many blocks alone; on the H100's limits and on an
    /// sm_86-like device (100 KiB an SM).
    /// The few-block f16 shape is loaded only where two of its blocks fit an
    /// SM: the H100's 228 KiB, not sm_80's 164 or sm_86's 100.
    #[test]
    fn few_block_f16_shape_needs_two_blocks_an_sm() {
        let lim = |per_sm, per_block| SmemLimits {
            per_sm,
            per_block,
            reserved: 1024,
        };
        assert!(super::few_fits(lim(233_472, 232_448)));
        assert!(!super::few_fits(lim(167_936, 166_912)));
        assert!(!super::few_fits(lim(102_400, 101_376)));
    }

    #[test]
    fn small_smem_spreads_few_blocks() {
        let h100 = SmemLimits {
            per_sm: 233_472,
            per_block: 232_448,
            reserved: 1024,
        };
        let sm86 = SmemLimits {
            per_sm: 102_400,
            per_block: 101_376,
            reserved: 1024,
        };
        for (lim, sms) in [(h100, 132u32), (sm86, 84)] {
            for c in &SMALL_CFG {
                for xrows in [1, c.tokens] {
                    let need = c.smem(xrows);
                    let natural = blocks_per_sm(need, lim);
                    for blocks in [
                        1u32, 7, 64, 128, 131, 133, 256, 264, 265, 300, 896, 1792, 65535,
                    ] {
                        let got = small_smem(need, blocks, sms, lim);
                        assert!(
                            got >= need && got <= lim.per_block.max(need),
                            "{blocks}: {got}"
                        );
                        let want = blocks.div_ceil(sms).min(natural);
                        assert_eq!(
                            blocks_per_sm(got, lim),
                            want,
                            "{blocks} blocks of {need} bytes on {sms} SMs ({lim:?})"
                        );
                    }
                }
            }
        }
    }

    /// Every code lands where the kernels read it (mixed.cu's `tiled_offset`:
    /// tile `(r / 16, c / 128)`, then row `r % 16`, then column `c % 128`),
    /// and the rest of the buffer is zero; shapes off both tile sizes.
    #[test]
    fn tiled_codes_sit_where_the_kernels_read_them() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for (n, k) in [
            (1usize, 16usize),
            (16, 128),
            (37, 272),
            (130, 4112),
            (300, 96),
        ] {
            let codes: Vec<u8> = (0..n * k)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    // Never zero, so a misplaced code cannot pass for padding.
                    (state % 255) as u8 + 1
                })
                .collect();
            let tiled = tile_codes(&codes, n, k).expect("shape matches");
            let kb = k.div_ceil(128);
            assert_eq!(tiled.len(), n.div_ceil(16) * 16 * kb * 128, "({n}, {k})");
            let mut placed = vec![false; tiled.len()];
            for r in 0..n {
                for c in 0..k {
                    let at = (((r / 16) * kb + c / 128) * 16 + r % 16) * 128 + c % 128;
                    assert_eq!(tiled[at], codes[r * k + c], "({n}, {k}) code ({r}, {c})");
                    placed[at] = true;
                }
            }
            assert!(
                tiled.iter().zip(&placed).all(|(&v, &p)| p || v == 0),
                "({n}, {k}): padding must be zero"
            );
        }
        assert!(tile_codes(&[1, 2, 3], 2, 2).is_err());
    }

    /// Row `16 t + r` of the interleaved matrix is gate feature `8 t + r` for
    /// `r < 8` and up feature `8 t + r - 8` otherwise: where an mma lane's
    /// rows g and g + 8 find one feature's two halves.
    #[test]
    fn gate_and_up_interleave_by_eight_features() {
        let (ff, k) = (24usize, 3usize);
        // Value = 1000 * (0 gate / 1 up) + 10 * feature + column.
        let stacked: Vec<u32> = (0..2 * ff * k)
            .map(|i| {
                let (row, col) = (i / k, i % k);
                1000 * (row / ff) as u32 + 10 * (row % ff) as u32 + col as u32
            })
            .collect();
        let got = interleave_gate_up(&stacked, ff, k).expect("ff % 8 == 0");
        for row in 0..2 * ff {
            let (t, r) = (row / 16, row % 16);
            let (half, feature) = if r < 8 {
                (0, 8 * t + r)
            } else {
                (1, 8 * t + r - 8)
            };
            for col in 0..k {
                assert_eq!(
                    got[row * k + col],
                    1000 * half + 10 * feature as u32 + col as u32,
                    "row {row} col {col}"
                );
            }
        }
        assert!(interleave_gate_up(&stacked[..2 * 20 * k], 20, k).is_err());
        assert!(interleave_gate_up(&stacked[1..], ff, k).is_err());
    }
}
