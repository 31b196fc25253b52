//! octet-fp8: the numerical ground truth of octet.
//!
//! Pure Rust, no device code: the FP8/FP4 formats and their exact
//! conversions ([`format`](mod@format), [`convert`]), the scale rules ([`scale`]),
//! quantized tensors and the reference quantizer ([`quant`]), the scaling
//! recipes and their state ([`recipe`]), and the shared test tolerances
//! ([`tolerance`]). Every backend is checked against this crate.
#![warn(missing_docs)]

pub mod alloc;
pub mod convert;
pub mod format;
pub mod quant;
pub mod recipe;
pub mod scale;
pub mod tolerance;

pub use format::{Format, Overflow, Rounding};
pub use quant::{
    quantize, Granularity, Layout, QuantData, QuantSpec, QuantizedTensor, ScaleRule, Scales,
    Telemetry, Usage,
};
pub use recipe::{AmaxAlgo, BackwardMode, DelayedState, Recipe, Role, Scaling};

/// Errors of quantization and recipe construction.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// The tensor has no elements.
    #[error("cannot quantize an empty tensor of shape ({rows}, {cols})")]
    Empty {
        /// Rows asked for.
        rows: usize,
        /// Columns asked for.
        cols: usize,
    },
    /// Element count or shapes disagree.
    #[error("shape error: {0}")]
    Shape(String),
    /// A NaN or inf in the input: no finite scale exists, so quantizing would produce garbage.
    #[error("non-finite input at element {index} ({value}); FP8 scales need finite data: look for the NaN/inf upstream")]
    NonFinite {
        /// Flat index of the first non-finite element.
        index: usize,
        /// Its value.
        value: f32,
    },
    /// An amax that cannot give a scale (non-finite, or an override below the local amax).
    #[error("amax {0} cannot give a finite scale (a given tensor amax must be finite and at least the local amax)")]
    BadAmax(f32),
    /// A given scale that is not positive and finite.
    #[error("scale {0} is not a positive finite number")]
    BadScale(f32),
    /// A copy (row-wise or column-wise) that was not made was asked for.
    #[error("the {0:?} copy of this quantized tensor was not made; request it in the Usage at quantization")]
    MissingUsage(quant::Layout),
    /// A recipe, format or mode combination that is not supported.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A buffer the allocator could not provide (a quantized copy, its
    /// transposed source, a dequantized matrix): host memory is exhausted or
    /// the request exceeds what the allocator hands out. The message is the
    /// tensor crate's `Error::Alloc` one, which that crate converts this into.
    #[error(
        "out of memory: cannot allocate {bytes} bytes ({}) for {what}; \
         lower --batch, --seq or --rank, or use a smaller model",
        alloc::human_bytes(*.bytes)
    )]
    Alloc {
        /// Bytes requested.
        bytes: u128,
        /// What the buffer was for.
        what: String,
    },
}
