//! octet-cuda: the CUDA kernel library.
//!
//! Libraries (libcuda, NVRTC, cuBLASLt) are loaded at run time (cudarc with
//! dynamic loading), so the crate builds without a toolkit, and a machine
//! without a GPU gets an [`Error`] value from [`Gpu::open`], never a crash.
//! Kernels are CUDA C (`kernels/*.cu`) compiled by NVRTC for the device's
//! architecture and cached on disk ([`nvrtc`]); all GEMMs go through cuBLASLt
//! ([`gemm`]); [`bench`](mod@bench) times the kernels against their floors.
//! The crate knows tensors and FP8 numerics (`octet-fp8`, `octet-tensor`) but
//! no model: the layers that launch these kernels, and the conformance cases
//! that check them against the CPU reference, are in `octet-nn`.
//!
//! ```no_run
//! # fn main() -> octet_cuda::Result<()> {
//! let gpu = octet_cuda::Gpu::open(0)?;
//! println!("{}", gpu.device_info()?);
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod bench;
pub mod block2d;
pub mod delayed;
pub mod gemm;
pub mod launch;
pub mod lora_ops;
pub mod mixed;
pub mod mx;
pub mod nccl;
pub mod nvfp4;
pub mod nvrtc;
pub mod probe;
pub mod quantize;
pub mod rowwise;
pub mod testdata;
pub mod tma;

pub use bench::{bench, bench_linear, BenchRow};
pub use gemm::{AddTo, GemmDst, GemmOut, OutType};
pub use mixed::{tile_codes, CodeLayout, DeviceFp8Weight, Shapes16, XType};
pub use quantize::{DeviceBlockFp8, DeviceFp8, Fp8Operand, QuantInput, TensorAmax};

use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr};
use std::sync::{Arc, Mutex, MutexGuard};

/// Errors of the CUDA backend. Each says what is missing or wrong and what to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No usable GPU or driver.
    #[error("no usable CUDA device: {0}")]
    NoDevice(String),
    /// A toolkit piece (NVRTC, cuBLASLt, headers) is missing.
    #[error("CUDA toolkit: {0}")]
    Toolkit(String),
    /// NVRTC rejected a kernel; the log says why.
    #[error("NVRTC could not compile {name} for {arch}:\n{log}")]
    Compile {
        /// Kernel file.
        name: String,
        /// Target architecture.
        arch: &'static str,
        /// Compiler log.
        log: String,
    },
    /// A driver call failed.
    #[error("CUDA driver: {0}")]
    Driver(String),
    /// A device allocation failed.
    #[error("out of GPU memory: {bytes} bytes asked for ({what})")]
    OutOfMemory {
        /// Bytes of the failed allocation.
        bytes: usize,
        /// What the buffer was for.
        what: String,
    },
    /// cuBLASLt refused or failed.
    #[error("cuBLASLt: {0}")]
    Blas(String),
    /// Work this GPU cannot do (e.g. FP8 GEMMs without FP8 tensor cores).
    #[error("not supported on this GPU: {0}")]
    Unsupported(String),
    /// Shapes or arguments the kernels cannot take.
    #[error("shape: {0}")]
    Shape(String),
    /// A decoding step whose logits held an inf or NaN (sampling on the device).
    #[error("the model produced non-finite logits at step {step}; are its weights finite?")]
    NonFiniteLogits {
        /// The step (0: the first generated token).
        step: usize,
    },
    /// NaN/inf in a tensor that needs a finite amax.
    #[error("non-finite values in the input: FP8 scales need finite data (look for the NaN/inf upstream)")]
    NonFinite,
    /// NaN/inf located in a model: the first place they appear.
    #[error("non-finite values first appear in {0}")]
    NonFiniteIn(String),
    /// An NCCL call failed or NCCL is missing.
    #[error("NCCL: {0}")]
    Nccl(String),
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

macro_rules! with_common {
    ($($file:literal),+) => {
        concat!(
            include_str!("../kernels/common.cuh"),
            $(include_str!(concat!("../kernels/", $file))),+
        )
    };
}

/// Every kernel source by name, each with `kernels/common.cuh` in front: what
/// NVRTC compiles (and what CI compiles for `sm_90a`). A source is one
/// family of kernels, one module on the GPU; the families of the training
/// model (`embed` to `attention`) also have `kernels/model.cuh`, their shared
/// helpers, in front of their own file. Look one up with [`kernel_source`].
pub const KERNEL_SOURCES: [(&str, &str); 18] = [
    ("quantize", with_common!("quantize.cu")),
    ("block_quantize", with_common!("block_quantize.cu")),
    ("mixed", with_common!("mixed.cu")),
    ("decode", with_common!("decode.cu")),
    ("rowwise", with_common!("rowwise.cu")),
    ("delayed", with_common!("delayed.cu")),
    ("block2d", with_common!("block2d.cu")),
    ("mx", with_common!("mx.cu")),
    ("nvfp4", with_common!("nvfp4.cu")),
    ("embed", with_common!("model.cuh", "embed.cu")),
    ("norm", with_common!("model.cuh", "norm.cu")),
    ("rope", with_common!("model.cuh", "rope.cu")),
    ("swiglu", with_common!("model.cuh", "swiglu.cu")),
    ("elementwise", with_common!("model.cuh", "elementwise.cu")),
    ("loss", with_common!("model.cuh", "loss.cu")),
    ("optim", with_common!("model.cuh", "optim.cu")),
    ("attention", with_common!("model.cuh", "attention.cu")),
    ("lora", with_common!("lora.cu")),
];

/// The source of the kernel family `name` in [`KERNEL_SOURCES`] (`"quantize"`,
/// `"attention"`, ...), or [`Error::Toolkit`] naming it where there is none.
pub fn kernel_source(name: &str) -> Result<&'static str> {
    KERNEL_SOURCES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, src)| *src)
        .ok_or_else(|| Error::Toolkit(format!("no kernel source named {name}")))
}

/// The names of the `__global__` functions that a kernel source defines, in
/// the order they appear, read from the text without a compiler: a kernel
/// written out (`extern "C" __global__ void [__launch_bounds__(..)] name(`)
/// or made by a function-like macro whose body defines one, expanded at each
/// use (`##` pastes, nested macros), whatever `#if` surrounds it. This is what
/// a host check compares the names the Rust code loads against; CI checks it
/// against the `.entry` names of each source's PTX.
pub fn kernel_names(src: &str) -> Vec<String> {
    kernels::names(src)
}

mod kernels;

/// Peak DRAM bandwidth in GB/s: two transfers a memory clock (DDR; HBM
/// reports its clock so that this holds) over the bus width. `None` where the
/// driver reports either as zero or not at all.
fn dram_peak_gbps(ctx: &CudaContext) -> Option<f64> {
    use cudarc::driver::sys::CUdevice_attribute::*;
    let khz = ctx.attribute(CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE).ok()?;
    let bits = ctx
        .attribute(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)
        .ok()?;
    (khz > 0 && bits > 0).then(|| 2.0 * khz as f64 * 1e3 * bits as f64 / 8.0 / 1e9)
}

/// The NVRTC target for a compute capability: `sm_90a` on Hopper, for its
/// architecture-specific instructions (wgmma, TMA). Ampere (8.0, 8.6, 8.7)
/// has bf16 tensor cores but no FP8: its kernels convert FP8 in integer code
/// (`kernels/common.cuh`), and FP8 GEMMs are refused ([`fp8_tensor_cores`]),
/// so it runs the weight-only FP8 products, decoding and bf16 training.
pub fn arch_for(cc: (i32, i32)) -> Result<&'static str> {
    Ok(match cc {
        (9, 0) => "sm_90a",
        (8, 9) => "sm_89",
        (8, 0) => "sm_80",
        (8, 6) => "sm_86",
        (8, 7) => "sm_87",
        (10, 0) => "sm_100a",
        (10, 3) => "sm_103a",
        (12, 0) => "sm_120a",
        other => {
            return Err(Error::NoDevice(format!(
                "compute capability {}.{} is not supported: octet needs bf16 tensor cores and cp.async \
                 (8.0, 8.6, 8.7), and FP8 tensor cores for FP8 GEMMs (8.9, 9.0, 10.x, 12.0)",
                other.0, other.1
            )))
        }
    })
}

/// Whether a compute capability has FP8 tensor cores (cuBLASLt FP8 GEMMs):
/// 8.9 (Ada) and later. Earlier GPUs run octet's weight-only FP8 products,
/// which upcast FP8 to bf16 inside the kernel.
pub fn fp8_tensor_cores(cc: (i32, i32)) -> bool {
    cc >= (8, 9)
}

/// Whether a recipe's GPU layers run cuBLASLt FP8 GEMMs (by its name:
/// tensorwise, delayed, rowwise, blockwise). The others run on any GPU: bf16,
/// and MXFP8 / NVFP4, which octet emulates with bf16 GEMMs.
pub fn recipe_uses_fp8_gemm(name: &str) -> bool {
    matches!(name, "tensorwise" | "delayed" | "rowwise" | "blockwise")
}

/// `OCTET_FP8_GEMM=off` refuses FP8 GEMMs on a GPU that has them, as a GPU
/// without FP8 tensor cores does; with `OCTET_FP8_CONVERT=soft` an FP8 GPU
/// then runs what an Ampere GPU runs (for testing those paths). `auto` or
/// unset: FP8 GEMMs where the hardware has them; other values are an error.
pub fn fp8_gemm_allowed() -> Result<bool> {
    Ok(!env_switch("OCTET_FP8_GEMM", "off")?)
}

/// `OCTET_PROFILE=1`: GPU training prints where a step's time goes (per
/// phase, and the host's time to the loss, to enqueue the backward and to
/// its end on the device). `0` or unset: off; other values are an error.
pub fn profile_enabled() -> Result<bool> {
    match std::env::var("OCTET_PROFILE").as_deref() {
        Err(std::env::VarError::NotPresent) | Ok("0") => Ok(false),
        Ok("1") => Ok(true),
        Ok(v) => Err(Error::Toolkit(format!(
            "OCTET_PROFILE={v:?}: expected 1 (print the time per phase) or 0"
        ))),
        Err(e) => Err(Error::Toolkit(format!("OCTET_PROFILE: {e}"))),
    }
}

/// An environment switch that is `auto` (or unset: `false`) or `word`
/// (`true`); any other value is an error naming the variable.
pub fn env_switch(var: &str, word: &str) -> Result<bool> {
    match std::env::var(var) {
        Err(std::env::VarError::NotPresent) => parse_switch(var, None, word),
        Err(std::env::VarError::NotUnicode(v)) => Err(Error::Toolkit(format!(
            "{var}={v:?}: expected `auto` or `{word}`"
        ))),
        Ok(v) => parse_switch(var, Some(&v), word),
    }
}

/// `env_switch` on a given value of `var` (`None`: unset).
pub fn parse_switch(var: &str, value: Option<&str>, word: &str) -> Result<bool> {
    match value {
        None | Some("auto") => Ok(false),
        Some(v) if v == word => Ok(true),
        Some(v) => Err(Error::Toolkit(format!(
            "{var}={v:?}: expected `auto` or `{word}`"
        ))),
    }
}

/// What [`Gpu::device_info`] reports.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuInfo {
    /// Device ordinal.
    pub ordinal: usize,
    /// Marketing name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// `(major, minor)` compute capability.
    pub compute_capability: (i32, i32),
    /// The NVRTC target kernels are compiled for.
    pub arch: &'static str,
    /// Total device memory in bytes.
    pub total_mem: usize,
    /// Streaming multiprocessors.
    pub sm_count: i32,
    /// Peak DRAM bandwidth in GB/s, from the memory clock and bus width the
    /// driver reports (`None` where it reports neither).
    pub dram_gbps: Option<f64>,
    /// Whether 16-token weight-only launches take the shapes that read x
    /// once for more weight rows (by DRAM bandwidth an SM: see `mixed/shapes.rs`).
    pub mixed_shapes16: mixed::Shapes16,
    /// NVRTC `(major, minor)`.
    pub nvrtc: (i32, i32),
    /// FP8 <-> f32 conversions by the hardware's instructions (`false`: by
    /// integer code, on GPUs without them or under `OCTET_FP8_CONVERT=soft`).
    pub fp8_convert_hw: bool,
    /// FP8 GEMMs: FP8 tensor cores ([`fp8_tensor_cores`]) and not turned
    /// off by `OCTET_FP8_GEMM=off` ([`fp8_gemm_allowed`]).
    pub fp8_gemm: bool,
}

impl std::fmt::Display for GpuInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (cuda:{}), compute capability {}.{} ({}), {} SMs, {:.1} GiB, DRAM peak {} ({} 16-token shapes), NVRTC {}.{}, FP8 conversions {}, {}",
            self.name,
            self.ordinal,
            self.compute_capability.0,
            self.compute_capability.1,
            self.arch,
            self.sm_count,
            self.total_mem as f64 / (1u64 << 30) as f64,
            match self.dram_gbps {
                Some(g) => format!("{g:.0} GB/s"),
                None => "unknown".into(),
            },
            match (self.mixed_shapes16.wide, self.mixed_shapes16.few) {
                (true, true) => "wide and few-block",
                (true, false) => "wide",
                (false, _) => "table",
            },
            self.nvrtc.0,
            self.nvrtc.1,
            if self.fp8_convert_hw {
                "in hardware"
            } else {
                "in integer code"
            },
            if self.fp8_gemm {
                "FP8 GEMMs"
            } else {
                "no FP8 GEMMs (weight-only FP8 and bf16 only)"
            }
        )
    }
}

pub(crate) struct Kernels {
    pub amax_bf16: CudaFunction,
    pub amax_f32: CudaFunction,
    pub cast_bf16_e4m3: CudaFunction,
    pub cast_bf16_e5m2: CudaFunction,
    pub cast_f32_e4m3: CudaFunction,
    pub cast_f32_e5m2: CudaFunction,
    pub given_bf16_e4m3: CudaFunction,
    pub given_bf16_e5m2: CudaFunction,
    pub block_bf16_e4m3: CudaFunction,
    pub block_bf16_e5m2: CudaFunction,
    pub block_direct_bf16_e4m3: CudaFunction,
    /// Telemetry counters of a per-tensor quantization (`linear.rs`).
    pub fp8_telemetry: CudaFunction,
    /// Telemetry of per-row / per-block quantizations (rowwise, blockwise, MXFP8, NVFP4).
    pub block_telemetry: CudaFunction,
    /// Weight-only products, see `mixed/`.
    pub mixed: mixed::MixedKernels,
}

/// An opened GPU: its context and stream, compiled kernels and cuBLASLt state.
///
/// All work goes to one stream in order (NCCL's collectives run on a stream
/// of their own, ordered with this one by events: see [`nccl`]); methods that
/// launch work return without waiting unless they say otherwise.
pub struct Gpu {
    /// The context.
    pub ctx: Arc<CudaContext>,
    /// The stream all work goes to.
    pub stream: Arc<CudaStream>,
    /// `(major, minor)` compute capability.
    pub cc: (i32, i32),
    /// Streaming multiprocessors.
    pub sm_count: i32,
    /// Peak DRAM bandwidth in GB/s (`GpuInfo::dram_gbps`).
    pub(crate) dram_gbps: Option<f64>,
    /// Walk the cast kernel's tiles last-to-first, so that it starts on the
    /// part of the tensor the amax pass read last (likely still in L2).
    /// Bit-identical either way; only the speed differs (docs/design.md).
    pub reverse_cast: bool,
    pub(crate) ordinal: usize,
    /// The NVRTC target the kernels are compiled for (`sm_90a`, ...).
    pub arch: &'static str,
    /// The kernels convert FP8 with the hardware's instructions (not integer code).
    pub(crate) fp8_convert_hw: bool,
    /// FP8 GEMMs are available (FP8 tensor cores, not turned off by `OCTET_FP8_GEMM=off`).
    pub fp8_gemm: bool,
    pub(crate) k: Kernels,
    /// Row-wise scaling kernels, compiled on first use.
    pub(crate) rowwise: std::sync::OnceLock<rowwise::RowwiseKernels>,
    /// Delayed-scaling state kernels, compiled on first use.
    pub(crate) delayed: std::sync::OnceLock<delayed::DelayedKernels>,
    /// 128x128 block kernels, compiled on first use.
    pub(crate) block2d: std::sync::OnceLock<block2d::Block2dKernels>,
    /// MXFP8 kernels, compiled on first use.
    pub(crate) mx: std::sync::OnceLock<mx::MxKernels>,
    /// NVFP4 kernels, compiled on first use.
    pub(crate) nv: std::sync::OnceLock<nvfp4::NvKernels>,
    /// LoRA kernels, compiled on first use.
    pub(crate) lora_k: std::sync::OnceLock<lora_ops::LoraKernels>,
    blas: Mutex<gemm::Blas>,
}

impl Gpu {
    /// `fp8_telemetry` of quantize.cu (the saturation and underflow counts
    /// of a per-tensor cast), for the layers that report them.
    pub fn fp8_telemetry_kernel(&self) -> &CudaFunction {
        &self.k.fp8_telemetry
    }

    /// `block_telemetry` of quantize.cu (the same counts for a block-scaled
    /// cast).
    pub fn block_telemetry_kernel(&self) -> &CudaFunction {
        &self.k.block_telemetry
    }

    /// Open GPU `ordinal`: load the driver, compile (or fetch from the cache)
    /// the kernels, create the cuBLASLt handle and workspace.
    ///
    /// Errors, never panics: no driver ([`Error::NoDevice`]), no such device,
    /// an architecture without FP8 conversions, NVRTC or cuBLASLt missing
    /// ([`Error::Toolkit`]), a kernel that does not compile ([`Error::Compile`]).
    pub fn open(ordinal: usize) -> Result<Gpu> {
        // cudarc's dynamic loader panics when a library or symbol is missing:
        // presence is probed first, and any panic left becomes an error here.
        match std::panic::catch_unwind(|| Gpu::open_inner(ordinal)) {
            Ok(r) => r,
            Err(p) => Err(Error::NoDevice(format!(
                "CUDA libraries failed to load: {}",
                nvrtc::panic_text(p)
            ))),
        }
    }

    fn open_inner(ordinal: usize) -> Result<Gpu> {
        // SAFETY: only probes whether the shared library can be loaded.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::NoDevice(
                "libcuda could not be loaded (no NVIDIA driver on this machine)".into(),
            ));
        }
        let n = CudaContext::device_count()
            .map_err(|e| Error::NoDevice(format!("the driver found no device: {e:?}")))?;
        if ordinal >= n.max(0) as usize {
            return Err(Error::NoDevice(format!(
                "device {ordinal} asked for, {n} present"
            )));
        }
        let ctx = CudaContext::new(ordinal)?;
        // SAFETY: all of octet's kernels and copies go to the one stream below,
        // in order. The one other stream, NCCL's (`nccl`), is ordered with it
        // by explicit events, and every buffer it touches is allocated on this
        // stream and dropped only after this stream waited for it, so cudarc's
        // cross-stream event tracking has nothing left to order.
        unsafe { ctx.disable_event_tracking() };
        // A created stream rather than the legacy default one: CUDA graphs can
        // only be captured from created streams (GPU decoding captures one step).
        let stream = ctx.new_stream()?;
        let cc = ctx.compute_capability()?;
        let sm_count = ctx.attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )?;
        let arch = arch_for(cc)?;
        let dram_gbps = dram_peak_gbps(&ctx);
        tracing::debug!(
            ordinal,
            compute_capability = ?cc,
            sms = sm_count,
            arch,
            "opening the GPU and loading its kernels"
        );
        // Every module, compiled by NVRTC on threads at once (on a first run,
        // before the disk cache has them, this is most of the wait), the
        // slowest first: the ones loaded here (quantize, block_quantize and
        // the weight-only product in its parts, `mixed::MIXED_PARTS`), and
        // the ones loaded on first use, into the disk cache only, so that a
        // run does not stop later to compile them. An error in those is left
        // for their first use to report.
        let mut jobs: Vec<(String, String)> = Vec::new();
        let mixed_src = kernel_source("mixed")?;
        for part in (0..mixed::MIXED_PARTS).rev() {
            jobs.push((
                format!("mixed.{part}"),
                format!("#define MIXED_PART {part}\n{mixed_src}"),
            ));
        }
        // The order of their compile times on an H100 host (the training
        // model's attention was most of its former single module's); the
        // sources not named here, after them.
        let slowest = [
            "attention",
            "block_quantize",
            "lora",
            "block2d",
            "quantize",
            "rowwise",
            "decode",
            "nvfp4",
            "mx",
        ];
        let rest = KERNEL_SOURCES
            .iter()
            .map(|(name, _)| *name)
            .filter(|n| *n != "mixed" && !slowest.contains(n));
        for name in slowest.into_iter().chain(rest) {
            jobs.push((name.into(), kernel_source(name)?.into()));
        }
        let mut compiled: std::collections::HashMap<String, Result<cudarc::nvrtc::Ptx>> = jobs
            .iter()
            .map(|(name, _)| name.clone())
            .zip(nvrtc::compile_all(&jobs, arch))
            .collect();
        let mut module = |name: &str| -> Result<Arc<cudarc::driver::CudaModule>> {
            let ptx = compiled
                .remove(name)
                .ok_or_else(|| Error::Toolkit(format!("NVRTC: no module {name}")))??;
            Ok(ctx.load_module(ptx)?)
        };
        let quantize = module("quantize")?;
        let block_quantize = module("block_quantize")?;
        let mixed_parts = (0..mixed::MIXED_PARTS)
            .map(|p| module(&format!("mixed.{p}")))
            .collect::<Result<Vec<_>>>()?;
        for (name, r) in &compiled {
            if let Err(e) = r {
                tracing::debug!(module = %name, error = %e, "left for first use");
            }
        }
        let load =
            |module: &Arc<cudarc::driver::CudaModule>, fns: &[&str]| -> Result<Vec<CudaFunction>> {
                fns.iter().map(|f| Ok(module.load_function(f)?)).collect()
            };
        let q = load(
            &quantize,
            &[
                "amax_bf16",
                "amax_f32",
                "cast_transpose_bf16_e4m3",
                "cast_transpose_bf16_e5m2",
                "cast_transpose_f32_e4m3",
                "cast_transpose_f32_e5m2",
                "cast_transpose_given_bf16_e4m3",
                "cast_transpose_given_bf16_e5m2",
                "fp8_telemetry",
                "block_telemetry",
            ],
        )?;
        let b = load(
            &block_quantize,
            &[
                "block1x128_cast_transpose_bf16_e4m3",
                "block1x128_cast_transpose_bf16_e5m2",
                "block1x128_direct_cast_transpose_bf16_e4m3",
            ],
        )?;
        let smem = {
            use cudarc::driver::sys::CUdevice_attribute::*;
            let a = |attr| -> Result<u32> { Ok(ctx.attribute(attr)?.max(0) as u32) };
            mixed::SmemLimits {
                per_sm: a(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?,
                per_block: a(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
                reserved: a(CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK)?,
            }
        };
        let shapes16 = mixed::shapes16(dram_gbps, sm_count);
        let mixed = mixed::MixedKernels::load(&mixed_parts, arch, smem, shapes16)?;
        let mut q = q.into_iter();
        let mut b = b.into_iter();
        let next = |it: &mut std::vec::IntoIter<CudaFunction>| {
            it.next()
                .ok_or_else(|| Error::Driver("kernel function list".into()))
        };
        let k = Kernels {
            amax_bf16: next(&mut q)?,
            amax_f32: next(&mut q)?,
            cast_bf16_e4m3: next(&mut q)?,
            cast_bf16_e5m2: next(&mut q)?,
            cast_f32_e4m3: next(&mut q)?,
            cast_f32_e5m2: next(&mut q)?,
            given_bf16_e4m3: next(&mut q)?,
            given_bf16_e5m2: next(&mut q)?,
            fp8_telemetry: next(&mut q)?,
            block_telemetry: next(&mut q)?,
            block_bf16_e4m3: next(&mut b)?,
            block_bf16_e5m2: next(&mut b)?,
            block_direct_bf16_e4m3: next(&mut b)?,
            mixed,
        };
        keep_pool_memory(&ctx);
        // FP8 conversion instructions and FP8 tensor cores arrive together (8.9).
        let fp8_convert_hw = fp8_tensor_cores(cc) && !nvrtc::soft_fp8()?;
        let fp8_gemm = fp8_tensor_cores(cc) && fp8_gemm_allowed()?;
        let blas = Mutex::new(gemm::Blas::new(&stream, fp8_gemm)?);
        let gpu = Gpu {
            ctx,
            stream,
            cc,
            dram_gbps,
            sm_count,
            reverse_cast: true,
            ordinal,
            arch,
            fp8_convert_hw,
            fp8_gemm,
            k,
            rowwise: std::sync::OnceLock::new(),
            delayed: std::sync::OnceLock::new(),
            block2d: std::sync::OnceLock::new(),
            mx: std::sync::OnceLock::new(),
            nv: std::sync::OnceLock::new(),
            lora_k: std::sync::OnceLock::new(),
            blas,
        };
        if !fp8_convert_hw {
            gpu.probe_integer_fp8()?;
        }
        Ok(gpu)
    }

    /// Where FP8 is converted in integer code (no FP8 instructions, or
    /// `OCTET_FP8_CONVERT=soft`), check once, when the GPU is opened, that
    /// the weight-only kernel decodes every E4M3 and E5M2 code exactly (a
    /// millisecond): the integer path leans on bf16 `fma` keeping subnormals,
    /// which was checked on Hopper only. A wrong value is an error here, not a
    /// wrong product later.
    fn probe_integer_fp8(&self) -> Result<()> {
        for format in [octet_fp8::Format::E4M3, octet_fp8::Format::E5M2] {
            if let (_, Some(bad)) = probe::every_code_product(self, format, false, 16)? {
                return Err(Error::Unsupported(format!(
                    "the integer FP8 conversion decoded {format} codes wrongly on this GPU ({bad}); \
                     octet cannot run its FP8 kernels here (please report it)"
                )));
            }
        }
        Ok(())
    }

    /// Name, compute capability, NVRTC target, SMs and memory.
    pub fn device_info(&self) -> Result<GpuInfo> {
        Ok(GpuInfo {
            ordinal: self.ordinal,
            name: self.ctx.name()?,
            compute_capability: self.cc,
            arch: self.arch,
            total_mem: self.ctx.total_mem()?,
            sm_count: self.sm_count,
            dram_gbps: self.dram_gbps,
            mixed_shapes16: self.k.mixed.shapes16(),
            nvrtc: nvrtc::nvrtc_version()?,
            fp8_convert_hw: self.fp8_convert_hw,
            fp8_gemm: self.fp8_gemm,
        })
    }

    /// [`Gpu::device_info`] as one line of text.
    pub fn info(&self) -> Result<String> {
        Ok(self.device_info()?.to_string())
    }

    /// The cuBLASLt state (handle, workspace, plan cache), locked.
    pub fn blas(&self) -> Result<MutexGuard<'_, gemm::Blas>> {
        self.blas
            .lock()
            .map_err(|_| Error::Blas("a previous GEMM panicked while holding the handle".into()))
    }

    /// Device memory free now, in bytes, as the driver reports it.
    pub fn mem_free(&self) -> Result<usize> {
        self.ctx.bind_to_thread()?;
        let (free, _) = cudarc::driver::result::mem_get_info()?;
        Ok(free)
    }

    /// Device memory in use now, in bytes (total minus free, as the driver
    /// reports it: includes what the memory pool keeps for reuse).
    pub fn mem_used(&self) -> Result<usize> {
        self.ctx.bind_to_thread()?;
        let (free, total) = cudarc::driver::result::mem_get_info()?;
        Ok(total.saturating_sub(free))
    }

    /// The most bytes that allocations from the device's memory pool held at
    /// once since the pool was made (PyTorch's `max_memory_allocated`: without
    /// what the pool keeps for reuse, the context or cuBLAS's workspace);
    /// `None` without memory pools.
    pub fn pool_peak_allocated(&self) -> Result<Option<usize>> {
        self.pool_high(cudarc::driver::sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)
    }

    /// The most bytes the device's memory pool held from the driver at once
    /// since it was made, allocated or kept for reuse (PyTorch's
    /// `max_memory_reserved`); `None` without memory pools.
    pub fn pool_peak_reserved(&self) -> Result<Option<usize>> {
        self.pool_high(cudarc::driver::sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
    }

    /// A 64-bit high-water attribute of the device's default memory pool.
    fn pool_high(&self, attr: cudarc::driver::sys::CUmemPool_attribute) -> Result<Option<usize>> {
        use cudarc::driver::sys;
        self.ctx.bind_to_thread()?;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        let mut high: u64 = 0;
        // SAFETY: `pool` is written by the driver for a valid device ordinal,
        // and the attribute is a 64-bit value written into `high`.
        let ok = unsafe {
            sys::cuDeviceGetDefaultMemPool(&mut pool, self.ctx.cu_device())
                == sys::CUresult::CUDA_SUCCESS
                && sys::cuMemPoolGetAttribute(pool, attr, (&mut high as *mut u64).cast())
                    == sys::CUresult::CUDA_SUCCESS
        };
        Ok(ok.then_some(high as usize))
    }

    /// Give the memory the pool keeps for reuse back to the driver (after a
    /// model is dropped), so that [`Gpu::mem_used`] measures the next run from
    /// the baseline. Waits for the stream first. Best effort without pools.
    pub fn release_pool(&self) -> Result<()> {
        use cudarc::driver::sys;
        self.synchronize()?;
        self.ctx.bind_to_thread()?;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `pool` is written by the driver for a valid device ordinal;
        // trimming releases only memory no allocation holds.
        unsafe {
            if sys::cuDeviceGetDefaultMemPool(&mut pool, self.ctx.cu_device())
                == sys::CUresult::CUDA_SUCCESS
            {
                sys::cuMemPoolTrimTo(pool, 0);
            }
        }
        Ok(())
    }

    /// Wait for all work queued on the stream.
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.stream.synchronize()?)
    }

    /// A zero-filled device buffer of `n` elements; out-of-memory names the bytes.
    pub fn alloc_zeros<T: DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        n: usize,
        what: &str,
    ) -> Result<CudaSlice<T>> {
        self.stream
            .alloc_zeros::<T>(n)
            .map_err(|e| oom(e, n * std::mem::size_of::<T>(), what))
    }

    /// An uninitialised device buffer of `n` elements, for outputs a kernel
    /// or GEMM overwrites in full (saves the memset of [`Gpu::alloc_zeros`]).
    ///
    /// # Safety
    /// Every element must be written before it is read.
    pub unsafe fn alloc_uninit<T: DeviceRepr>(&self, n: usize, what: &str) -> Result<CudaSlice<T>> {
        // SAFETY: the caller writes before reading (this function's contract).
        unsafe { self.stream.alloc::<T>(n) }.map_err(|e| oom(e, n * std::mem::size_of::<T>(), what))
    }

    /// Copy a host slice to a new device buffer.
    pub fn upload<T: DeviceRepr>(&self, x: &[T]) -> Result<CudaSlice<T>> {
        self.stream
            .clone_htod(x)
            .map_err(|e| oom(e, std::mem::size_of_val(x), "upload"))
    }

    /// Copy host bf16 to the device (as `u16` bits, what the kernels and GEMMs take).
    pub fn upload_bf16(&self, x: &[half::bf16]) -> Result<CudaSlice<u16>> {
        let bits: Vec<u16> = x.iter().map(|v| v.to_bits()).collect();
        self.upload(&bits)
    }

    /// Copy a device buffer back to the host (waits for the stream).
    pub fn download<T: DeviceRepr + Default + Clone>(&self, x: &CudaSlice<T>) -> Result<Vec<T>> {
        Ok(self.stream.clone_dtoh(x)?)
    }

    /// `d (m, n) = a (m, k) @ b (n, k)^T` in bf16 with f32 accumulation
    /// (see [`gemm::Blas::gemm_bf16`]); `d` is bf16 (`u16`) or f32.
    pub fn gemm_bf16<D: GemmOut>(
        &self,
        a: &impl DevicePtr<u16>,
        b: &impl DevicePtr<u16>,
        d: &mut impl GemmDst<D>,
        (m, n, k): (usize, usize, usize),
    ) -> Result<()> {
        self.blas()?.gemm_bf16(a, b, d, m, n, k)
    }

    /// `d (m, n) = op(a) @ op(b)` in bf16 (see [`gemm::Blas::gemm_bf16_op`]).
    pub fn gemm_bf16_op<D: GemmOut>(
        &self,
        (a, ta): (&impl DevicePtr<u16>, bool),
        (b, tb): (&impl DevicePtr<u16>, bool),
        d: &mut impl GemmDst<D>,
        mnk: (usize, usize, usize),
    ) -> Result<()> {
        self.blas()?.gemm_bf16_op(a, ta, b, tb, d, mnk)
    }

    /// `d (m, n) = alpha op(a) @ op(b) + beta d` in bf16 (see [`gemm::Blas::gemm_bf16_acc`]).
    pub fn gemm_bf16_acc<D: GemmOut>(
        &self,
        (a, ta): (&impl DevicePtr<u16>, bool),
        (b, tb): (&impl DevicePtr<u16>, bool),
        d: &mut impl GemmDst<D>,
        mnk: (usize, usize, usize),
        alpha_beta: (f32, f32),
    ) -> Result<()> {
        self.blas()?.gemm_bf16_acc(a, ta, b, tb, d, mnk, alpha_beta)
    }

    /// `d (m, n) = a (m, k) @ b (n, k)^T` from two per-tensor FP8 operands,
    /// both K-major, with their `scale_inv` as cuBLASLt's A/B scale pointers
    /// (see [`gemm::Blas::gemm_fp8`]); `d` is bf16 (`u16`) or f32.
    pub fn gemm_fp8<D: GemmOut>(
        &self,
        a: Fp8Operand<'_>,
        b: Fp8Operand<'_>,
        d: &mut impl GemmDst<D>,
        (m, n, k): (usize, usize, usize),
        fast_accum: bool,
    ) -> Result<()> {
        self.blas()?.gemm_fp8(
            a.data,
            a.format,
            a.scale_inv,
            b.data,
            b.format,
            b.scale_inv,
            d,
            (m, n, k),
            fast_accum,
        )
    }
}

/// Let the device's default memory pool keep freed memory instead of
/// returning it to the driver at every synchronization (its default release
/// threshold is 0), so that stream-ordered scratch allocations in a loop are
/// cheap; and make its reuse depend on stream order alone: without
/// opportunistic reuse, which blocks a request gets does not depend on which
/// frees the GPU has finished when the host asks (the ~1B LoRA step's pool
/// then reserved 6.47 GiB in most runs and 6.91-7.00 in some, for the same
/// 6.17 GiB of allocations). octet's buffers are allocated and freed on its
/// one stream, where the pool reuses them anyway. Best effort: without
/// memory pools nothing changes.
fn keep_pool_memory(ctx: &Arc<CudaContext>) {
    use cudarc::driver::sys;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut threshold: u64 = u64::MAX;
    let mut off: std::ffi::c_int = 0;
    // SAFETY: `pool` is written by the driver for a valid device ordinal; the
    // release threshold takes a pointer to a u64, the reuse flag to an int.
    unsafe {
        if ctx.bind_to_thread().is_ok()
            && sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device())
                == sys::CUresult::CUDA_SUCCESS
        {
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                &mut threshold as *mut u64 as *mut std::ffi::c_void,
            );
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC,
                &mut off as *mut std::ffi::c_int as *mut std::ffi::c_void,
            );
        }
    }
}

/// A driver error from an allocation, as [`Error::OutOfMemory`] when it is one.
pub(crate) fn oom(e: cudarc::driver::DriverError, bytes: usize, what: &str) -> Error {
    if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        Error::OutOfMemory {
            bytes,
            what: what.into(),
        }
    } else {
        e.into()
    }
}
