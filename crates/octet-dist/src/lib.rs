//! octet-dist: sharded data parallel (FSDP-style) for octet.
//!
//! - [`comm`]: the [`Communicator`] trait (all-reduce, all-gather,
//!   reduce-scatter, broadcast, barrier) with per-collective byte counters,
//!   shaped so that an NCCL communicator can implement it.
//! - [`thread`]: [`ThreadComm`], N ranks as threads of one process, with a
//!   deterministic (rank-order) reduction and bounded waits, and
//!   [`spawn_ranks`] to run a closure on every rank.
//! - [`shard`]: [`ShardLayout`], every parameter cut on its first dimension,
//!   padded inside to equal-sized shards.
//! - [`fp8`]: the FP8 all-gather of a weight with one global scale, byte-identical
//!   to quantizing the whole weight on one rank.
//! - [`fsdp`]: [`FsdpRank`], one rank of a sharded data-parallel Llama training
//!   step (gather, forward/backward, reduce-scatter, global-norm clip, AdamW on
//!   the shard).
//! - [`rendezvous`]: [`Rendezvous`], how the processes of a multi-process job
//!   (`--nnodes`, `--master-addr`) meet and share one blob (the NCCL unique id),
//!   with every wait bounded.
#![warn(missing_docs)]

pub mod comm;
pub mod fp8;
pub mod fsdp;
pub mod rendezvous;
pub mod shard;
pub mod thread;

pub use comm::{CollectiveKind, CommStats, Communicator, Elem, ReduceOp, Reducible};
pub use fp8::{fp8_row_alignment, gather_fp8_weight, ColwisePlan};
pub use fsdp::{local_batch, FsdpConfig, FsdpRank, StepOutput, Wire};
pub use rendezvous::Rendezvous;
pub use shard::ShardLayout;
pub use thread::{spawn_ranks, spawn_ranks_with_timeout, ThreadComm};

/// Errors of sharded data parallel.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A communicator or group set up wrongly (zero ranks, a rank out of range).
    #[error("communicator: {0}")]
    Config(String),
    /// Ranks passed buffers that do not fit together (different lengths,
    /// different collectives at the same point, a length not divisible by the world size).
    #[error("collective mismatch: {0}")]
    Mismatch(String),
    /// Another rank failed (returned an error or panicked), or left the group:
    /// this rank's collective cannot complete.
    #[error("rank {rank} failed: {reason}; this rank stops too")]
    PeerFailed {
        /// The rank that failed first.
        rank: usize,
        /// Its error or panic message.
        reason: String,
    },
    /// A collective waited longer than the group's timeout (a rank hung or died silently).
    #[error("collective {what} timed out after {secs:.1} s waiting for ranks {missing:?}")]
    Timeout {
        /// The collective that was waiting.
        what: String,
        /// Seconds waited.
        secs: f64,
        /// Ranks that had not arrived.
        missing: Vec<usize>,
    },
    /// A rank's closure panicked (reported by [`spawn_ranks`]).
    #[error("rank {rank} panicked: {message}")]
    Panicked {
        /// The rank.
        rank: usize,
        /// The panic message.
        message: String,
    },
    /// Shapes that do not fit (a shard of the wrong size, a weight not 2-D).
    #[error("shape error: {0}")]
    Shape(String),
    /// A recipe or layout this path does not support.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A NaN or inf where a finite value is required.
    #[error("non-finite: {0}")]
    NonFinite(String),
    /// A quantization error.
    #[error(transparent)]
    Quant(#[from] octet_fp8::Error),
    /// A tensor error.
    #[error(transparent)]
    Tensor(#[from] octet_tensor::Error),
    /// A layer or model error.
    #[error(transparent)]
    Nn(#[from] octet_nn::Error),
    /// An optimizer or training error.
    #[error(transparent)]
    Train(#[from] octet_train::Error),
}

/// Result alias.
pub type Result<T> = std::result::Result<T, Error>;
