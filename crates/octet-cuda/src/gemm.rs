//! cuBLASLt GEMMs, row-major `d (m, n) = a (m, k) @ b (n, k)^T` ("TN": both
//! operands K-major, the only layout Hopper's FP8 GEMMs take).
//!
//! cuBLASLt is column-major: a row-major `(r, c)` matrix is a column-major
//! `(c, r)` one. So `d^T (n, m) = b (n, k) @ a^T (k, m)` is computed as
//! cuBLAS `A := b` (column-major `(k, n)`, transposed), `B := a` (column-major
//! `(k, m)`, not transposed), `D` column-major `(n, m)` = row-major `(m, n)`.
//! Descriptors, layouts and the heuristic's algorithm are cached per shape.

use crate::{Error, Result};
use cudarc::cublaslt::{result as lt, sys};
use cudarc::driver::{CudaSlice, CudaStream, CudaViewMut, DevicePtr, DevicePtrMut, DeviceSlice};
use octet_fp8::Format;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

const WORKSPACE: usize = 32 << 20;

/// Output element type of a GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OutType {
    /// bf16 (stored as `u16` bits).
    Bf16,
    /// f32 (for checks against the CPU's f32 accumulation without an output rounding).
    F32,
}

/// A device element type a GEMM can write: `u16` (bf16 bits) or `f32`.
pub trait GemmOut: cudarc::driver::DeviceRepr + Copy + Default {
    /// The matching [`OutType`].
    const OUT: OutType;
    /// The value as f32 (exact).
    fn to_f32(self) -> f32;
}
impl GemmOut for u16 {
    const OUT: OutType = OutType::Bf16;
    fn to_f32(self) -> f32 {
        half::bf16::from_bits(self).to_f32()
    }
}
impl GemmOut for f32 {
    const OUT: OutType = OutType::F32;
    fn to_f32(self) -> f32 {
        self
    }
}

/// Operand and output types of a GEMM plan (the plan cache key, with the shape).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// bf16 x bf16; `ta`: `a` is stored `(k, m)`; `tb`: `b` is stored `(n, k)`.
    Bf16 {
        /// `a` stored transposed.
        ta: bool,
        /// `b` stored transposed (the TN default).
        tb: bool,
        /// Output type.
        out: OutType,
    },
    /// f16 x f16, `b` stored `(n, k)` (TN), for the weight-only products' f16
    /// activations (`Gpu::mixed_matmul_x`).
    F16 {
        /// Output type.
        out: OutType,
    },
    /// FP8 x FP8 with per-tensor scale pointers: `(a format, b format, fast accumulation, output)`.
    Fp8(Format, Format, bool, OutType),
    /// FP8 x FP8 with one scale per row of each operand (outer-vector scaling).
    Fp8Outer(Format, Format, OutType),
    /// FP8 x FP8 with DeepSeek-style block scales: `(a format, b format, a blocks,
    /// b blocks, output)`, blocks being 1x128 (`false`) or 128x128 (`true`).
    Fp8Block(Format, Format, bool, bool, OutType),
}

impl Kind {
    fn out(self) -> OutType {
        match self {
            Kind::Bf16 { out, .. }
            | Kind::F16 { out }
            | Kind::Fp8(_, _, _, out)
            | Kind::Fp8Outer(_, _, out)
            | Kind::Fp8Block(_, _, _, _, out) => out,
        }
    }
}

struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    d: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

/// cuBLASLt handle, workspace and cached plans. Used behind the [`crate::Gpu`]'s mutex.
pub struct Blas {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    plans: HashMap<(Kind, usize, usize, usize), Plan>,
    stream: Arc<CudaStream>,
    /// FP8 tensor cores are present (FP8 GEMMs allowed).
    fp8: bool,
}

// SAFETY: the handle, descriptors and layouts are plain cuBLASLt objects that
// may be used from any thread as long as no two threads use them at once; the
// owning `Gpu` keeps `Blas` behind a `Mutex`.
unsafe impl Send for Blas {}

/// Where a GEMM writes: a buffer or view that it overwrites, or an
/// [`AddTo`] that it adds its product to (cuBLASLt's `beta`).
pub trait GemmDst<D>: DevicePtrMut<D> {
    /// cuBLASLt's `beta`: 0 overwrites `d`, 1 adds the product to it.
    fn beta(&self) -> f32 {
        0.0
    }
}

impl<D> GemmDst<D> for CudaSlice<D> {}
impl<D> GemmDst<D> for CudaViewMut<'_, D> {}

/// A GEMM destination that accumulates: `d += a @ b`, the sum formed in f32
/// before `d`'s one rounding. Gradients accumulate into their slots of the
/// flat gradient buffer this way, without a temporary and an add kernel.
pub struct AddTo<'a, D>(pub CudaViewMut<'a, D>);

impl<D> DeviceSlice<D> for AddTo<'_, D> {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn stream(&self) -> &Arc<CudaStream> {
        self.0.stream()
    }
}

impl<D> DevicePtrMut<D> for AddTo<'_, D> {
    fn device_ptr_mut<'a>(
        &'a mut self,
        stream: &'a CudaStream,
    ) -> (
        cudarc::driver::sys::CUdeviceptr,
        cudarc::driver::SyncOnDrop<'a>,
    ) {
        self.0.device_ptr_mut(stream)
    }
}

impl<D> GemmDst<D> for AddTo<'_, D> {
    fn beta(&self) -> f32 {
        1.0
    }
}

fn blas<T>(r: std::result::Result<T, lt::CublasError>, what: &str) -> Result<T> {
    r.map_err(|e| Error::Blas(format!("{what}: {e:?}")))
}

fn dtype(f: Format) -> Result<sys::cudaDataType> {
    match f {
        Format::E4M3 => Ok(sys::cudaDataType::CUDA_R_8F_E4M3),
        Format::E5M2 => Ok(sys::cudaDataType::CUDA_R_8F_E5M2),
        f => Err(Error::Shape(format!(
            "cuBLASLt FP8 GEMM takes e4m3/e5m2 operands, not {f}"
        ))),
    }
}

impl Blas {
    /// A handle and a 32 MiB workspace on `stream`.
    /// `fp8`: the GPU has FP8 tensor cores; without them every FP8 GEMM is
    /// refused with [`Error::Unsupported`].
    pub fn new(stream: &Arc<CudaStream>, fp8: bool) -> Result<Blas> {
        // SAFETY: probes library presence only.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::Toolkit("libcublasLt could not be loaded".into()));
        }
        let handle = blas(lt::create_handle(), "create handle")?;
        let workspace = stream.alloc_zeros::<u8>(WORKSPACE)?;
        Ok(Blas {
            handle,
            workspace,
            plans: HashMap::new(),
            stream: stream.clone(),
            fp8,
        })
    }

    /// How many (kind, shape) plans are cached.
    pub fn cached_plans(&self) -> usize {
        self.plans.len()
    }

    fn plan(&mut self, kind: Kind, m: usize, n: usize, k: usize) -> Result<&Plan> {
        if !self.fp8 && !matches!(kind, Kind::Bf16 { .. } | Kind::F16 { .. }) {
            return Err(Error::Unsupported(
                "FP8 GEMMs need FP8 tensor cores (compute capability 8.9 or later). On this GPU \
                 train without an FP8 recipe (bf16), or use the weight-only FP8 products \
                 (`octet generate --weights fp8`, `octet lora --compute bf16`)"
                    .into(),
            ));
        }
        let key = (kind, m, n, k);
        if !self.plans.contains_key(&key) {
            let p = self.make_plan(kind, m, n, k)?;
            self.plans.insert(key, p);
        }
        self.plans
            .get(&key)
            .ok_or_else(|| Error::Blas("plan cache".into()))
    }

    fn make_plan(&self, kind: Kind, m: usize, n: usize, k: usize) -> Result<Plan> {
        use sys::cublasLtMatmulDescAttributes_t as D;
        let (ta, tb) = match kind {
            Kind::Bf16 { .. } => (
                sys::cudaDataType::CUDA_R_16BF,
                sys::cudaDataType::CUDA_R_16BF,
            ),
            Kind::F16 { .. } => (sys::cudaDataType::CUDA_R_16F, sys::cudaDataType::CUDA_R_16F),
            // cuBLAS A is our b, cuBLAS B is our a.
            Kind::Fp8(fa, fb, _, _) | Kind::Fp8Outer(fa, fb, _) | Kind::Fp8Block(fa, fb, ..) => {
                (dtype(fb)?, dtype(fa)?)
            }
        };
        let desc = blas(
            lt::create_matmul_desc(
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cudaDataType::CUDA_R_32F,
            ),
            "desc",
        )?;
        // Our row-major operands as cuBLAS column-major ones (module docs):
        // cuBLAS A := our b, cuBLAS B := our a. cublasOperation_t: N = 0, T = 1 (int32).
        let (our_ta, our_tb) = match kind {
            Kind::Bf16 { ta, tb, .. } => (ta, tb),
            Kind::F16 { .. } | Kind::Fp8(..) | Kind::Fp8Outer(..) | Kind::Fp8Block(..) => {
                (false, true)
            }
        };
        let t: i32 = i32::from(our_tb);
        let nop: i32 = i32::from(our_ta);
        let set = |attr: D, p: *const c_void, size: usize| {
            // SAFETY: `p` points to a live value of `size` bytes of the attribute's type.
            blas(
                unsafe { lt::set_matmul_desc_attribute(desc, attr, p, size) },
                "desc attribute",
            )
        };
        set(
            D::CUBLASLT_MATMUL_DESC_TRANSA,
            &t as *const _ as *const c_void,
            std::mem::size_of_val(&t),
        )?;
        set(
            D::CUBLASLT_MATMUL_DESC_TRANSB,
            &nop as *const _ as *const c_void,
            std::mem::size_of_val(&nop),
        )?;
        if let Kind::Fp8Outer(..) = kind {
            let mode =
                sys::cublasLtMatmulMatrixScale_t::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F as i32;
            for attr in [
                D::CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                D::CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
            ] {
                set(
                    attr,
                    &mode as *const _ as *const c_void,
                    std::mem::size_of_val(&mode),
                )?;
            }
            // Vector scales cannot be null when the heuristic validates the
            // descriptor: point them at the workspace until `run` sets the real ones.
            let (ws, _guard) = self.workspace.device_ptr(&self.stream);
            for attr in [
                D::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                D::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
            ] {
                set(attr, &ws as *const _ as *const c_void, 8)?;
            }
        }
        if let Kind::Fp8Block(_, _, a2d, b2d, _) = kind {
            use sys::cublasLtMatmulMatrixScale_t as S;
            let mode = |two_d: bool| {
                if two_d {
                    S::CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F as i32
                } else {
                    S::CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F as i32
                }
            };
            // cuBLAS A is our b.
            let (ma, mb) = (mode(b2d), mode(a2d));
            set(
                D::CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                &ma as *const _ as *const c_void,
                4,
            )?;
            set(
                D::CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                &mb as *const _ as *const c_void,
                4,
            )?;
            let (ws, _guard) = self.workspace.device_ptr(&self.stream);
            for attr in [
                D::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                D::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
            ] {
                set(attr, &ws as *const _ as *const c_void, 8)?;
            }
        }
        if let Kind::Fp8(_, _, fast, _) = kind {
            let f: i8 = i8::from(fast);
            set(
                D::CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                &f as *const _ as *const c_void,
                1,
            )?;
        }
        let (m64, n64, k64) = (m as u64, n as u64, k as u64);
        let a = if our_tb {
            blas(lt::create_matrix_layout(ta, k64, n64, k as i64), "layout a")?
        } else {
            blas(lt::create_matrix_layout(ta, n64, k64, n as i64), "layout a")?
        };
        let b = if our_ta {
            blas(lt::create_matrix_layout(tb, m64, k64, m as i64), "layout b")?
        } else {
            blas(lt::create_matrix_layout(tb, k64, m64, k as i64), "layout b")?
        };
        let dt = match kind.out() {
            OutType::Bf16 => sys::cudaDataType::CUDA_R_16BF,
            OutType::F32 => sys::cudaDataType::CUDA_R_32F,
        };
        // C and D share one layout and one buffer (read only when beta != 0).
        let d = blas(lt::create_matrix_layout(dt, n64, m64, n as i64), "layout d")?;
        let pref = blas(lt::create_matmul_pref(), "preference")?;
        let ws = WORKSPACE as u64;
        // SAFETY: attribute value is a u64 as cuBLASLt documents.
        blas(
            unsafe {
                lt::set_matmul_pref_attribute(
                    pref,
                    sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    &ws as *const _ as *const c_void,
                    8,
                )
            },
            "preference attribute",
        )?;
        // SAFETY: every handle passed was created above and is live.
        let heur = unsafe { lt::get_matmul_algo_heuristic(self.handle, desc, a, b, d, d, pref) };
        // SAFETY: created above, not used after.
        unsafe { lt::destroy_matmul_pref(pref) }.ok();
        let heur = match heur {
            Ok(h) => h,
            Err(e) => {
                // SAFETY: created above and not stored anywhere.
                unsafe {
                    lt::destroy_matrix_layout(a).ok();
                    lt::destroy_matrix_layout(b).ok();
                    lt::destroy_matrix_layout(d).ok();
                    lt::destroy_matmul_desc(desc).ok();
                }
                return Err(Error::Blas(format!(
                    "no cuBLASLt algorithm for {kind:?} m={m} n={n} k={k}: {e:?}"
                )));
            }
        };
        Ok(Plan {
            desc,
            a,
            b,
            d,
            algo: heur.algo,
        })
    }

    /// `d (m, n) = a (m, k) @ b (n, k)^T`, bf16 operands (raw `u16` bits), f32
    /// accumulation, output bf16 (`u16`) or f32.
    pub fn gemm_bf16<D: GemmOut>(
        &mut self,
        a: &impl DevicePtr<u16>,
        b: &impl DevicePtr<u16>,
        d: &mut impl GemmDst<D>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<()> {
        self.gemm_bf16_op(a, false, b, true, d, (m, n, k))
    }

    /// `d (m, n) = op(a) @ op(b)`: `a` is `(m, k)`, or `(k, m)` when `ta`;
    /// `b` is `(k, n)`, or `(n, k)` when `tb`. For the high-precision backward GEMMs.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_bf16_op<D: GemmOut>(
        &mut self,
        a: &impl DevicePtr<u16>,
        ta: bool,
        b: &impl DevicePtr<u16>,
        tb: bool,
        d: &mut impl GemmDst<D>,
        mnk: (usize, usize, usize),
    ) -> Result<()> {
        let beta = d.beta();
        self.gemm_bf16_acc(a, ta, b, tb, d, mnk, (1.0, beta))
    }

    /// `d (m, n) = alpha op(a) @ op(b) + beta d` in bf16 (operands as
    /// [`Blas::gemm_bf16_op`]): with `beta = 1` the product accumulates into
    /// what `d` holds, in f32 before `d`'s one rounding (LoRA adds its
    /// low-rank term to the base output, and its input gradient to the base's).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_bf16_acc<D: GemmOut>(
        &mut self,
        a: &impl DevicePtr<u16>,
        ta: bool,
        b: &impl DevicePtr<u16>,
        tb: bool,
        d: &mut impl GemmDst<D>,
        (m, n, k): (usize, usize, usize),
        (alpha, beta): (f32, f32),
    ) -> Result<()> {
        check_dims(m, n, k)?;
        check_len(a.len(), m * k, "a")?;
        check_len(b.len(), n * k, "b")?;
        check_len(d.len(), m * n, "d")?;
        if !(alpha.is_finite() && beta.is_finite()) {
            return Err(Error::Shape(format!(
                "GEMM alpha {alpha} / beta {beta} must be finite"
            )));
        }
        let kind = Kind::Bf16 {
            ta,
            tb,
            out: D::OUT,
        };
        self.run(kind, m, n, k, a, b, d, None, (alpha, beta))
    }

    /// `d (m, n) = a (m, k) @ b (n, k)^T` with f16 operands (raw `u16` bits),
    /// f32 accumulation and output (cuBLASLt has no f16 x f16 -> bf16).
    pub fn gemm_f16(
        &mut self,
        a: &impl DevicePtr<u16>,
        b: &impl DevicePtr<u16>,
        d: &mut impl GemmDst<f32>,
        (m, n, k): (usize, usize, usize),
    ) -> Result<()> {
        check_dims(m, n, k)?;
        check_len(a.len(), m * k, "a")?;
        check_len(b.len(), n * k, "b")?;
        check_len(d.len(), m * n, "d")?;
        self.run(
            Kind::F16 { out: OutType::F32 },
            m,
            n,
            k,
            a,
            b,
            d,
            None,
            (1.0, 0.0),
        )
    }

    /// `d (m, n) = diag(a_scale) (a (m, k) @ b (n, k)^T) diag(b_scale)` from
    /// FP8 codes (both K-major) with one `scale_inv` per row of each operand
    /// (cuBLASLt's `OUTER_VEC_32F` scale mode, CUDA 12.9+ on Hopper).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_fp8_outer<D: GemmOut>(
        &mut self,
        a: &CudaSlice<u8>,
        a_fmt: Format,
        a_scale: &CudaSlice<f32>,
        b: &CudaSlice<u8>,
        b_fmt: Format,
        b_scale: &CudaSlice<f32>,
        d: &mut impl GemmDst<D>,
        (m, n, k): (usize, usize, usize),
    ) -> Result<()> {
        check_dims(m, n, k)?;
        if m % 16 != 0 || n % 16 != 0 || k % 16 != 0 {
            return Err(Error::Shape(format!(
                "FP8 GEMM dims must be multiples of 16, got m={m} n={n} k={k}"
            )));
        }
        check_len(a.len(), m * k, "a")?;
        check_len(b.len(), n * k, "b")?;
        check_len(d.len(), m * n, "d")?;
        // Outer-vector scaling reads one scale per row of each operand.
        check_len(a_scale.len(), m, "a scales")?;
        check_len(b_scale.len(), n, "b scales")?;
        let kind = Kind::Fp8Outer(a_fmt, b_fmt, D::OUT);
        self.run(
            kind,
            m,
            n,
            k,
            a,
            b,
            d,
            Some((a_scale, b_scale)),
            (1.0, d.beta()),
        )
    }

    /// `d (m, n) = a (m, k) @ b (n, k)^T` from FP8 codes (both K-major) with
    /// block scales: 1x128 (`false`) or 128x128 (`true`) per operand, the
    /// scale tensors in the layout cuBLASLt expects: 1x128 as `(k/128, rows)`,
    /// 128x128 as `(ceil(rows/128), k/128)` row-major with each row padded to
    /// a multiple of 4 values.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_fp8_block<D: GemmOut>(
        &mut self,
        (a, a_fmt, a_scale, a2d): (&CudaSlice<u8>, Format, &CudaSlice<f32>, bool),
        (b, b_fmt, b_scale, b2d): (&CudaSlice<u8>, Format, &CudaSlice<f32>, bool),
        d: &mut impl GemmDst<D>,
        (m, n, k): (usize, usize, usize),
    ) -> Result<()> {
        check_dims(m, n, k)?;
        if m % 16 != 0 || n % 16 != 0 || k % 128 != 0 {
            return Err(Error::Shape(format!(
                "block-scaled FP8 GEMM needs m, n multiples of 16 and k of 128, got m={m} n={n} k={k}"
            )));
        }
        // cuBLASLt reads a 128x128 scale grid with its rows (the k blocks)
        // padded to a multiple of 4 (`Gpu::gemm_fp8_block` pads octet's grids).
        let scales = |rows: usize, two_d: bool| {
            if two_d {
                rows.div_ceil(128) * (k / 128).next_multiple_of(4)
            } else {
                rows * (k / 128)
            }
        };
        check_len(a_scale.len(), scales(m, a2d), "a scales")?;
        check_len(b_scale.len(), scales(n, b2d), "b scales")?;
        check_len(a.len(), m * k, "a")?;
        check_len(b.len(), n * k, "b")?;
        check_len(d.len(), m * n, "d")?;
        let kind = Kind::Fp8Block(a_fmt, b_fmt, a2d, b2d, D::OUT);
        self.run(
            kind,
            m,
            n,
            k,
            a,
            b,
            d,
            Some((a_scale, b_scale)),
            (1.0, d.beta()),
        )
    }

    /// `d (m, n) = (a (m, k) @ b (n, k)^T) * a_scale_inv * b_scale_inv` from
    /// FP8 codes, both operands K-major ("TN"); output bf16 (`u16`) or f32.
    /// `m`, `n`, `k` must be multiples of 16 (cuBLASLt's FP8 alignment).
    /// `fast_accum` lets the tensor cores keep partial sums in their own,
    /// reduced precision instead of promoting them to f32 periodically.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_fp8<D: GemmOut>(
        &mut self,
        a: &CudaSlice<u8>,
        a_fmt: Format,
        a_scale_inv: &CudaSlice<f32>,
        b: &CudaSlice<u8>,
        b_fmt: Format,
        b_scale_inv: &CudaSlice<f32>,
        d: &mut impl GemmDst<D>,
        (m, n, k): (usize, usize, usize),
        fast_accum: bool,
    ) -> Result<()> {
        check_dims(m, n, k)?;
        check_len(a.len(), m * k, "a")?;
        check_len(b.len(), n * k, "b")?;
        check_len(d.len(), m * n, "d")?;
        check_len(a_scale_inv.len(), 1, "a scale_inv")?;
        check_len(b_scale_inv.len(), 1, "b scale_inv")?;
        if m % 16 != 0 || n % 16 != 0 || k % 16 != 0 {
            return Err(Error::Shape(format!(
                "FP8 GEMM needs dims that are multiples of 16, got m={m} n={n} k={k} (pad the operands)"
            )));
        }
        if (a_fmt, b_fmt) == (Format::E5M2, Format::E5M2) {
            return Err(Error::Shape(
                "cuBLASLt has no E5M2 x E5M2 GEMM; quantize one operand to E4M3".into(),
            ));
        }
        let kind = Kind::Fp8(a_fmt, b_fmt, fast_accum, D::OUT);
        self.run(
            kind,
            m,
            n,
            k,
            a,
            b,
            d,
            Some((a_scale_inv, b_scale_inv)),
            (1.0, d.beta()),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn run<T, D>(
        &mut self,
        kind: Kind,
        m: usize,
        n: usize,
        k: usize,
        a: &impl DevicePtr<T>,
        b: &impl DevicePtr<T>,
        d: &mut impl GemmDst<D>,
        scales: Option<(&CudaSlice<f32>, &CudaSlice<f32>)>,
        (alpha, beta): (f32, f32),
    ) -> Result<()> {
        let stream = self.stream.clone();
        let handle = self.handle;
        let plan = {
            let p = self.plan(kind, m, n, k)?;
            Plan {
                desc: p.desc,
                a: p.a,
                b: p.b,
                d: p.d,
                algo: p.algo,
            }
        };
        let (ws_ptr, _ws_guard) = self.workspace.device_ptr_mut(&stream);
        let ws_ptr = ws_ptr as *mut c_void;
        let (a_ptr, _g1) = a.device_ptr(&stream);
        let (b_ptr, _g2) = b.device_ptr(&stream);
        let (d_ptr, _g3) = d.device_ptr_mut(&stream);
        let mut guards = Vec::new();
        if let Some((sa, sb)) = scales {
            let (pa, ga) = sa.device_ptr(&stream);
            let (pb, gb) = sb.device_ptr(&stream);
            guards.push(ga);
            guards.push(gb);
            use sys::cublasLtMatmulDescAttributes_t as D;
            // cuBLAS A is our b, so its scale is b's.
            for (attr, p) in [
                (D::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, pb),
                (D::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, pa),
            ] {
                // SAFETY: the attribute is a device pointer, passed by address.
                blas(
                    unsafe {
                        lt::set_matmul_desc_attribute(
                            plan.desc,
                            attr,
                            &p as *const _ as *const c_void,
                            8,
                        )
                    },
                    "scale pointer",
                )?;
            }
        }
        // SAFETY: pointers are live device buffers of the checked sizes; the plan matches the shapes.
        blas(
            unsafe {
                lt::matmul(
                    handle,
                    plan.desc,
                    &alpha as *const f32 as *const c_void,
                    &beta as *const f32 as *const c_void,
                    b_ptr as *const c_void,
                    plan.a,
                    a_ptr as *const c_void,
                    plan.b,
                    d_ptr as *const c_void,
                    plan.d,
                    d_ptr as *mut c_void,
                    plan.d,
                    &plan.algo,
                    ws_ptr,
                    WORKSPACE,
                    stream.cu_stream() as sys::cudaStream_t,
                )
            },
            "matmul",
        )
    }
}

fn check_dims(m: usize, n: usize, k: usize) -> Result<()> {
    let max = i32::MAX as usize;
    if m == 0 || n == 0 || k == 0 || m > max || n > max || k > max {
        return Err(Error::Shape(format!(
            "GEMM dims must be in 1..=2^31-1, got m={m} n={n} k={k}"
        )));
    }
    Ok(())
}

fn check_len(got: usize, want: usize, what: &str) -> Result<()> {
    if got != want {
        return Err(Error::Shape(format!(
            "GEMM operand {what} has {got} elements, expected {want}"
        )));
    }
    Ok(())
}

impl Drop for Blas {
    fn drop(&mut self) {
        for (_, p) in self.plans.drain() {
            // SAFETY: each was created once and is destroyed once here.
            unsafe {
                lt::destroy_matrix_layout(p.a).ok();
                lt::destroy_matrix_layout(p.b).ok();
                lt::destroy_matrix_layout(p.d).ok();
                lt::destroy_matmul_desc(p.desc).ok();
            }
        }
        // SAFETY: created in `new`, destroyed once.
        unsafe { lt::destroy_handle(self.handle) }.ok();
    }
}
