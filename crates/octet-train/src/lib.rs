//! octet-train: the training loop and everything around it.
//!
//! [`data`] (byte-level tokenizer, corpus, deterministic batches), [`optim`]
//! (AdamW with f32 masters, clipping, warmup + cosine), [`checkpoint`]
//! (safetensors with Hugging Face names, atomic writes), [`metrics`] (JSONL),
//! [`plot`] (loss curves as PNG) and [`trainer`] (the loop).
#![warn(missing_docs)]

pub mod checkpoint;
pub mod data;
pub mod gpu;
pub mod metrics;
pub mod optim;
pub mod plot;
pub mod trainer;

/// Errors of training.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad data or data files.
    #[error("data: {0}")]
    Data(String),
    /// Bad configuration or inconsistent state.
    #[error("train: {0}")]
    Train(String),
    /// A NaN/inf appeared.
    #[error("non-finite values: {0}")]
    NonFinite(String),
    /// A checkpoint could not be written or read.
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    /// A layer or model error.
    #[error(transparent)]
    Nn(#[from] octet_nn::Error),
    /// A tensor error.
    #[error(transparent)]
    Tensor(#[from] octet_tensor::Error),
    /// A recipe error.
    #[error(transparent)]
    Quant(#[from] octet_fp8::Error),
    /// A GPU (CUDA backend) error.
    #[error(transparent)]
    Gpu(#[from] octet_cuda::Error),
    /// File system error.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// Result alias.
pub type Result<T> = std::result::Result<T, Error>;
