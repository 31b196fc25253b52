//! octet-tensor: tensors and the CPU reference kernels.
//!
//! A [`Tensor`] is a row-major array with a shape and a dtype (f32, bf16, or
//! f64 for the CPU's gradient checks).
//! The kernels in [`cpu`] are the reference every other backend is checked
//! against: the high-precision GEMM (through the `gemm` crate, f32
//! accumulation), the FP8 GEMM emulation that multiplies exactly the values
//! the FP8 codes represent and applies their scales per block as the
//! hardware does, and quantize/dequantize over `octet-fp8`.
#![warn(missing_docs)]

mod alloc;
pub mod cpu;
pub mod mixed;
mod tensor;

pub use alloc::{alloc_capacity, alloc_collect, alloc_vec};
pub use tensor::{checked_numel, DType, Tensor};

/// Errors of tensor construction and kernels.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// Shapes that do not fit together.
    #[error("shape error: {0}")]
    Shape(String),
    /// A quantization error (other than an allocation failure, which
    /// becomes [`Error::Alloc`]).
    #[error(transparent)]
    Quant(octet_fp8::Error),
    /// An operation this backend or dtype does not support.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A buffer the allocator could not provide: host memory is exhausted
    /// (or the request exceeds what the allocator will hand out). Raised by
    /// [`alloc_vec`] and the tensor constructors and kernels built on it, in
    /// place of the process abort an infallible allocation ends in.
    #[error(
        "out of memory: cannot allocate {bytes} bytes ({}) for {what}; \
         lower --batch, --seq or --rank, or use a smaller model",
        octet_fp8::alloc::human_bytes(*.bytes)
    )]
    Alloc {
        /// Bytes requested.
        bytes: u128,
        /// What the buffer was for.
        what: String,
    },
}

/// The quantizer's errors, its allocation failures as [`Error::Alloc`] (the
/// same message), so that one variant names every buffer that could not be
/// allocated.
impl From<octet_fp8::Error> for Error {
    fn from(e: octet_fp8::Error) -> Self {
        match e {
            octet_fp8::Error::Alloc { bytes, what } => Error::Alloc { bytes, what },
            e => Error::Quant(e),
        }
    }
}

/// Result alias.
pub type Result<T> = std::result::Result<T, Error>;
