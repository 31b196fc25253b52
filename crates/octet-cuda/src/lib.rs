//! octet-cuda: the CUDA backend.
//!
//! Libraries (libcuda, NVRTC, cuBLASLt) are loaded at run time, so the crate
//! builds without a toolkit and a machine without a GPU gets an error value,
//! never a crash. Kernels are CUDA C compiled by NVRTC for the device's
//! architecture and cached on disk ([`nvrtc`]); all GEMMs go through
//! cuBLASLt ([`gemm`]). [`check`] holds the conformance cases (GPU against
//! the CPU reference) and the benchmarks.
#![warn(missing_docs)]

pub mod check;
pub mod gemm;
pub mod nvrtc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use half::bf16;
use octet_fp8::Format;
use std::sync::Arc;

/// Errors of the CUDA backend.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No usable GPU or driver.
    #[error("no usable CUDA device: {0}")]
    NoDevice(String),
    /// A toolkit piece (NVRTC, headers, cuBLASLt) is missing.
    #[error("CUDA toolkit: {0}")]
    Toolkit(String),
    /// NVRTC rejected a kernel; the log says why.
    #[error("NVRTC could not compile {name}: {log}")]
    Compile {
        /// Kernel file.
        name: String,
        /// Compiler log.
        log: String,
    },
    /// A driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(String),
    /// cuBLASLt refused or failed.
    #[error("cuBLASLt: {0}")]
    Blas(String),
    /// Shapes or arguments the kernels cannot take.
    #[error("shape: {0}")]
    Shape(String),
    /// NaN/inf in a tensor that needs a finite amax.
    #[error("non-finite values in the input: FP8 scales need finite data")]
    NonFinite,
    /// An error of the CPU reference.
    #[error(transparent)]
    Reference(#[from] octet_tensor::Error),
}

impl From<octet_fp8::Error> for Error {
    fn from(e: octet_fp8::Error) -> Self {
        Error::Reference(e.into())
    }
}

impl From<cudarc::driver::DriverError> for Error {
    fn from(e: cudarc::driver::DriverError) -> Self {
        Error::Driver(format!("{e:?}"))
    }
}

/// Result alias.
pub type Result<T> = std::result::Result<T, Error>;

const QUANTIZE_SRC: &str = include_str!("../kernels/quantize.cu");

/// Every kernel source, by name (for the compile check).
pub const KERNEL_SOURCES: [(&str, &str); 1] = [("quantize", QUANTIZE_SRC)];

/// An opened GPU with its stream, kernels and cuBLASLt handle.
pub struct Gpu {
    /// The context.
    pub ctx: Arc<CudaContext>,
    /// The stream all work goes to.
    pub stream: Arc<CudaStream>,
    /// `(major, minor)` compute capability.
    pub cc: (i32, i32),
    amax: CudaFunction,
    cast_e4m3: CudaFunction,
    cast_e5m2: CudaFunction,
    /// The cuBLASLt state (handle, workspace, cached plans).
    pub blas: gemm::Blas,
}

/// A per-tensor quantized bf16 matrix on the device.
pub struct DeviceFp8 {
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Element format.
    pub format: Format,
    /// `(rows, cols)` codes.
    pub rowwise: CudaSlice<u8>,
    /// `(cols, rows)` codes.
    pub colwise: CudaSlice<u8>,
    /// The dequantization scale (one f32).
    pub scale_inv: CudaSlice<f32>,
    /// The tensor's amax as f32 bits (kept on the device: delayed scaling and telemetry read it there).
    pub amax_bits: CudaSlice<u32>,
    /// Non-zero when the input had a NaN or inf.
    pub nonfinite: CudaSlice<u32>,
}

/// The NVRTC target for a compute capability (`sm_90a` on Hopper for its arch-specific instructions).
pub fn arch_for(cc: (i32, i32)) -> Result<&'static str> {
    Ok(match cc {
        (9, 0) => "sm_90a",
        (8, 9) => "sm_89",
        (10, 0) => "sm_100a",
        (12, 0) => "sm_120a",
        (8, 0) => "sm_80",
        (8, 6) => "sm_86",
        other => {
            return Err(Error::NoDevice(format!(
                "compute capability {}.{} is not supported",
                other.0, other.1
            )))
        }
    })
}

impl Gpu {
    /// Open GPU `ordinal`: load the driver, compile (or fetch cached) kernels, create cuBLASLt.
    pub fn open(ordinal: usize) -> Result<Gpu> {
        // SAFETY: only probes whether the shared library can be loaded.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::NoDevice(
                "libcuda could not be loaded (no NVIDIA driver on this machine)".into(),
            ));
        }
        let n = CudaContext::device_count().map_err(|e| Error::NoDevice(format!("{e:?}")))?;
        if ordinal >= n as usize {
            return Err(Error::NoDevice(format!(
                "device {ordinal} asked for, {n} present"
            )));
        }
        let ctx = CudaContext::new(ordinal)?;
        let stream = ctx.default_stream();
        let cc = ctx.compute_capability()?;
        let arch = arch_for(cc)?;
        let ptx = nvrtc::compile("quantize", QUANTIZE_SRC, arch)?;
        let module = ctx.load_module(ptx)?;
        let amax = module.load_function("amax_bf16")?;
        let cast_e4m3 = module.load_function("cast_transpose_bf16_e4m3")?;
        let cast_e5m2 = module.load_function("cast_transpose_bf16_e5m2")?;
        let blas = gemm::Blas::new(&stream)?;
        Ok(Gpu {
            ctx,
            stream,
            cc,
            amax,
            cast_e4m3,
            cast_e5m2,
            blas,
        })
    }

    /// Launch the amax reduction of `x` into `amax_bits` (f32 bits) and `nonfinite` (flag).
    pub fn launch_amax(
        &self,
        x: &CudaSlice<u16>,
        amax_bits: &mut CudaSlice<u32>,
        nonfinite: &mut CudaSlice<u32>,
    ) -> Result<()> {
        let n = x.len() as u64;
        // Enough blocks to fill every SM several times; each thread loops over 4 x 16 B per step.
        let blocks = ((n / 32 / 256) as u32 + 1).min(132 * 8);
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(&self.amax);
        b.arg(x).arg(&n).arg(amax_bits).arg(nonfinite);
        // SAFETY: argument types match the kernel signature; the kernel bounds-checks `n`.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Launch the cast + transpose kernel (`cast` is the E4M3 or E5M2 variant).
    #[allow(clippy::too_many_arguments)]
    fn launch_cast(
        &self,
        cast: &CudaFunction,
        x: &CudaSlice<u16>,
        rows: usize,
        cols: usize,
        amax_bits: &CudaSlice<u32>,
        rowwise: &mut CudaSlice<u8>,
        colwise: &mut CudaSlice<u8>,
        scale_inv: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let (r, c) = (rows as i32, cols as i32);
        let grid = (cols.div_ceil(64) as u32, rows.div_ceil(64) as u32, 1);
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(cast);
        b.arg(x)
            .arg(&r)
            .arg(&c)
            .arg(amax_bits)
            .arg(rowwise)
            .arg(colwise)
            .arg(scale_inv);
        // SAFETY: argument types match; every output element is written by exactly one thread.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// The cast + transpose kernel alone, for benchmarks (E4M3, amax taken as given).
    #[allow(clippy::too_many_arguments)]
    pub fn cast_only(
        &self,
        x: &CudaSlice<u16>,
        rows: usize,
        cols: usize,
        amax_bits: &CudaSlice<u32>,
        rowwise: &mut CudaSlice<u8>,
        colwise: &mut CudaSlice<u8>,
        scale_inv: &mut CudaSlice<f32>,
    ) -> Result<()> {
        self.launch_cast(
            &self.cast_e4m3,
            x,
            rows,
            cols,
            amax_bits,
            rowwise,
            colwise,
            scale_inv,
        )
    }

    /// Device name, compute capability and memory in GiB.
    pub fn info(&self) -> Result<String> {
        let name = self.ctx.name()?;
        let mem = self.ctx.total_mem()? as f64 / (1u64 << 30) as f64;
        Ok(format!(
            "{name}, compute capability {}.{}, {mem:.1} GiB",
            self.cc.0, self.cc.1
        ))
    }

    /// Copy host bf16 to the device.
    pub fn upload_bf16(&self, x: &[bf16]) -> Result<CudaSlice<u16>> {
        let bits: Vec<u16> = x.iter().map(|v| v.to_bits()).collect();
        Ok(self.stream.clone_htod(&bits)?)
    }

    /// Per-tensor current scaling of a bf16 `(rows, cols)` matrix to E4M3 or
    /// E5M2, row-wise and column-wise copies, with the CPU reference's scale rule.
    /// Two kernels: amax (one read), then cast + transpose (one read, two writes).
    ///
    /// With `check_finite`, a NaN/inf in `x` is reported as [`Error::NonFinite`]
    /// (one 4-byte device-to-host read, which waits for the kernels); without,
    /// nothing synchronises (for benchmarks and pipelines that check later).
    pub fn quantize_tensorwise(
        &self,
        x: &CudaSlice<u16>,
        rows: usize,
        cols: usize,
        format: Format,
        check_finite: bool,
    ) -> Result<DeviceFp8> {
        self.quantize_impl(x, rows, cols, format, check_finite, None)
    }

    /// [`Gpu::quantize_tensorwise`] with both outputs filled with `poison` first
    /// (conformance tests use it to catch elements the kernel never writes).
    pub fn quantize_tensorwise_poisoned(
        &self,
        x: &CudaSlice<u16>,
        rows: usize,
        cols: usize,
        format: Format,
        poison: u8,
    ) -> Result<DeviceFp8> {
        self.quantize_impl(x, rows, cols, format, true, Some(poison))
    }

    fn quantize_impl(
        &self,
        x: &CudaSlice<u16>,
        rows: usize,
        cols: usize,
        format: Format,
        check_finite: bool,
        poison: Option<u8>,
    ) -> Result<DeviceFp8> {
        let mut out = self.alloc_fp8(rows, cols, format)?;
        if let Some(p) = poison {
            self.stream
                .memcpy_htod(&vec![p; rows * cols], &mut out.rowwise)?;
            self.stream
                .memcpy_htod(&vec![p; rows * cols], &mut out.colwise)?;
        }
        self.quantize_tensorwise_into(x, &mut out, check_finite)?;
        Ok(out)
    }

    /// Buffers for a quantized `(rows, cols)` tensor (codes undefined until quantized into).
    pub fn alloc_fp8(&self, rows: usize, cols: usize, format: Format) -> Result<DeviceFp8> {
        if rows == 0 || cols == 0 || rows > i32::MAX as usize || cols > i32::MAX as usize {
            return Err(Error::Shape(format!(
                "quantize: shape ({rows}, {cols}) is empty or exceeds 32-bit dims"
            )));
        }
        let s = &self.stream;
        // SAFETY: the codes are written by the cast kernel before anyone reads them.
        let (rowwise, colwise) =
            unsafe { (s.alloc::<u8>(rows * cols)?, s.alloc::<u8>(rows * cols)?) };
        Ok(DeviceFp8 {
            rows,
            cols,
            format,
            rowwise,
            colwise,
            scale_inv: s.alloc_zeros::<f32>(1)?,
            amax_bits: s.alloc_zeros::<u32>(1)?,
            nonfinite: s.alloc_zeros::<u32>(1)?,
        })
    }

    /// Quantize into preallocated buffers (what a training step does: no allocation per call).
    pub fn quantize_tensorwise_into(
        &self,
        x: &CudaSlice<u16>,
        out: &mut DeviceFp8,
        check_finite: bool,
    ) -> Result<()> {
        let (rows, cols) = (out.rows, out.cols);
        if x.len() != rows * cols {
            return Err(Error::Shape(format!(
                "quantize: {} elements for ({rows}, {cols})",
                x.len()
            )));
        }
        let cast = match out.format {
            Format::E4M3 => &self.cast_e4m3,
            Format::E5M2 => &self.cast_e5m2,
            f => {
                return Err(Error::Shape(format!(
                    "tensorwise quantize on the GPU supports e4m3 and e5m2, not {f}"
                )))
            }
        };
        self.stream.memset_zeros(&mut out.amax_bits)?;
        self.stream.memset_zeros(&mut out.nonfinite)?;
        self.launch_amax(x, &mut out.amax_bits, &mut out.nonfinite)?;
        self.launch_cast(
            cast,
            x,
            rows,
            cols,
            &out.amax_bits,
            &mut out.rowwise,
            &mut out.colwise,
            &mut out.scale_inv,
        )?;
        if check_finite && self.stream.clone_dtoh(&out.nonfinite)?[0] != 0 {
            return Err(Error::NonFinite);
        }
        Ok(())
    }
}
