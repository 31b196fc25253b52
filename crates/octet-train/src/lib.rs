//! octet-train: the training loop and everything around it.
//!
//! [`data`] (byte-level tokenizer or GPT-2's BPE, corpus, deterministic
//! batches), [`hf_tokenizer`] (a model folder's `tokenizer.json`, special
//! tokens and chat template), [`finetune`] (JSONL examples with a loss
//! mask), [`optim`] (AdamW with f32 masters, clipping, warmup + cosine),
//! [`checkpoint`] (safetensors with Hugging Face names, atomic writes),
//! [`metrics`] (JSONL), [`plot`] (loss curves as PNG), [`trainer`] (the CPU
//! loop) and [`gpu`] (the same loop on the GPU).
#![warn(missing_docs)]

pub mod checkpoint;
pub mod data;
pub mod export;
pub mod finetune;
pub mod gpu;
pub mod hf_tokenizer;
pub mod metrics;
pub mod optim;
pub mod plot;
pub mod run;
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
    /// File system error with no path known. Its text is the I/O error's,
    /// given once: the error is not also exposed as [`source`], so a chain
    /// printer (anyhow's `{:#}`) does not repeat it.
    ///
    /// [`source`]: std::error::Error::source
    #[error("{0}")]
    Io(std::io::Error),
    /// A file operation failed on `path` (`action` says which: `creating`,
    /// `writing`, `opening`, ...). Its text names the path and the I/O error
    /// once, as [`Error::Io`]'s.
    #[error("{action} {}: {err}", path.display())]
    File {
        /// What was being done: `creating`, `writing`, `opening`, ...
        action: &'static str,
        /// The file or directory.
        path: std::path::PathBuf,
        /// The I/O error.
        err: std::io::Error,
    },
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(e)
    }
}

impl Error {
    /// A closure for `map_err` that names the file operation (`action`, e.g.
    /// `creating`) and the `path` of an I/O error: [`Error::File`].
    pub fn file(
        action: &'static str,
        path: &std::path::Path,
    ) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.to_path_buf();
        move |err| Error::File { action, path, err }
    }
}

/// Create `dir` and its parents; an error names the directory.
pub fn create_dir_all(dir: &std::path::Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(Error::file("creating", dir))
}

/// Result alias.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    /// The text `anyhow`'s `{:#}` prints: the error and each source, joined by ": ".
    fn chain(e: &dyn std::error::Error) -> String {
        let mut text = e.to_string();
        let mut source = e.source();
        while let Some(s) = source {
            text = format!("{text}: {s}");
            source = s.source();
        }
        text
    }

    #[test]
    fn io_errors_print_their_text_once_and_name_the_path() {
        let os = || std::io::Error::from_raw_os_error(30);
        let msg = os().to_string();
        let plain = chain(&Error::from(os()));
        assert_eq!(plain.matches(&msg).count(), 1, "{plain}");
        let e = Error::file("creating", std::path::Path::new("/ro/runs/x"))(os());
        let named = chain(&e);
        assert_eq!(named.matches(&msg).count(), 1, "{named}");
        assert!(named.starts_with("creating /ro/runs/x: "), "{named}");
        // A directory under a regular file cannot be made: the error names it.
        let file = std::env::temp_dir().join(format!("octet-io-{}", std::process::id()));
        std::fs::write(&file, "not a directory").unwrap();
        let e = chain(&create_dir_all(&file.join("run")).unwrap_err());
        assert!(e.contains(&file.join("run").display().to_string()), "{e}");
        let m = crate::metrics::MetricsWriter::open(&file.join("run/metrics.jsonl"));
        let e = chain(&m.err().unwrap());
        assert!(e.contains(&file.join("run").display().to_string()), "{e}");
        let _ = std::fs::remove_file(&file);
    }
}
