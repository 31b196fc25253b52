//! octet-nn: layers with explicit `forward -> (y, Saved)` and `backward(Saved, dy)`.
//!
//! No autograd: each layer's `Saved` struct holds exactly what its backward
//! reads, so the memory a layer keeps is visible in its type and
//! `saved.bytes()` is exact.
//!
//! Each layer's CPU implementation is its module (`linear`, `lora`, `llama`,
//! `decode`); the CUDA implementation sits beside it in a `cuda` submodule
//! (`linear::cuda`, `lora::cuda`, `llama::cuda`, `decode::cuda`) and launches
//! the kernels of `octet-cuda`. [`conformance`] checks the one against the
//! other on the GPU (`octet selftest`).
#![warn(missing_docs)]

pub mod attention;
pub mod bench;
pub mod conformance;
pub mod decode;
pub mod embedding;
pub mod hf_config;
pub mod linear;
pub mod llama;
pub mod lora;
pub mod loss;
pub mod norm;
pub mod rope;
pub mod swiglu;

pub use linear::{Linear, LinearGrads, LinearSaved};
pub use llama::{Llama, LlamaConfig};

/// Errors of layers.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// Shapes that do not fit the layer.
    #[error("shape error: {0}")]
    Shape(String),
    /// A kernel or tensor error.
    #[error(transparent)]
    Tensor(#[from] octet_tensor::Error),
    /// A quantization or recipe error (an allocation failure of the
    /// quantizer is the tensor crate's `Alloc`, under [`Error::Tensor`]).
    #[error(transparent)]
    Quant(octet_fp8::Error),
    /// A model configuration that cannot be built (or weights that do not fit it).
    #[error("model config: {0}")]
    Config(String),
    /// A NaN or inf where a finite value is required.
    #[error("non-finite: {0}")]
    NonFinite(String),
    /// A parameter outside the values it may take (a negative sampling
    /// temperature, say).
    #[error("out of range: {0}")]
    OutOfRange(String),
    /// An error inside a named layer of a model.
    #[error("in {0}: {1}")]
    InLayer(String, Box<Error>),
}

/// The quantizer's errors; an allocation failure becomes the tensor crate's
/// `Error::Alloc` (the same message), as it does through that crate.
impl From<octet_fp8::Error> for Error {
    fn from(e: octet_fp8::Error) -> Self {
        match e {
            octet_fp8::Error::Alloc { .. } => Error::Tensor(e.into()),
            e => Error::Quant(e),
        }
    }
}

/// Result alias.
pub type Result<T> = std::result::Result<T, Error>;
