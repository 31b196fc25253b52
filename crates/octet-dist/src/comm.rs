//! The communicator interface: the collectives sharded data parallel needs.
//!
//! The trait follows NCCL's collectives (and cudarc's `nccl::Comm`, which
//! wraps them) one for one, so that a GPU communicator is a thin layer:
//!
//! | method | NCCL | buffers |
//! |---|---|---|
//! | [`Communicator::all_reduce`] | `ncclAllReduce` | in place, same length on every rank |
//! | [`Communicator::all_gather`] | `ncclAllGather` | `send` (same length on every rank) -> `n * len`, rank-major |
//! | [`Communicator::reduce_scatter`] | `ncclReduceScatter` | `send` of `n * chunk` -> this rank's `chunk` |
//! | [`Communicator::broadcast`] | `ncclBroadcast` | in place, same length on every rank |
//! | [`Communicator::barrier`] | an all-reduce of one element | none |
//!
//! Counts are equal on every rank, as NCCL requires: this is why
//! [`crate::ShardLayout`] pads shards to one size. Element types are the
//! [`Elem`] types, each naming its `ncclDataType_t`. Buffers here are host
//! slices: an NCCL implementation takes device buffers of the same element
//! types and lengths through a device-side sibling of this trait (cudarc's
//! `DevicePtr<T>`), with the same semantics and the same byte counting; the
//! CPU reference ([`crate::ThreadComm`]) is what its results are checked against.
//!
//! Every call counts the bytes this rank hands to the transport, per
//! [`CollectiveKind`] ([`CommStats`]): `all_reduce`, `broadcast`: the
//! buffer; `all_gather`: the send buffer (this rank's contribution);
//! `reduce_scatter`: the whole send buffer (`n * chunk`); `barrier`: 0.
//! With these definitions the FP8 and bf16 all-gathers of the same shards
//! compare directly.

use crate::Result;
use half::bf16;

/// A reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Sum (`ncclSum`); the CPU communicator sums in rank order, so results are reproducible.
    Sum,
    /// Maximum (`ncclMax`); NaN inputs are ignored, as `f32::max` does.
    Max,
}

/// The collectives, as counted in [`CommStats`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CollectiveKind {
    /// [`Communicator::all_reduce`].
    AllReduce = 0,
    /// [`Communicator::all_gather`].
    AllGather = 1,
    /// [`Communicator::reduce_scatter`].
    ReduceScatter = 2,
    /// [`Communicator::broadcast`].
    Broadcast = 3,
    /// [`Communicator::barrier`].
    Barrier = 4,
}

impl CollectiveKind {
    /// All kinds, in counter order.
    pub const ALL: [CollectiveKind; 5] = [
        CollectiveKind::AllReduce,
        CollectiveKind::AllGather,
        CollectiveKind::ReduceScatter,
        CollectiveKind::Broadcast,
        CollectiveKind::Barrier,
    ];

    /// Lower-case name (`all_gather`).
    pub fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllReduce => "all_reduce",
            CollectiveKind::AllGather => "all_gather",
            CollectiveKind::ReduceScatter => "reduce_scatter",
            CollectiveKind::Broadcast => "broadcast",
            CollectiveKind::Barrier => "barrier",
        }
    }
}

/// Bytes handed to the transport and calls made, per collective kind, by one rank.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommStats {
    /// Bytes per kind, indexed by `CollectiveKind as usize`.
    pub bytes: [u64; 5],
    /// Calls per kind, indexed by `CollectiveKind as usize`.
    pub calls: [u64; 5],
}

impl CommStats {
    /// Bytes counted for `kind`.
    pub fn bytes(&self, kind: CollectiveKind) -> u64 {
        self.bytes[kind as usize]
    }

    /// Calls counted for `kind`.
    pub fn calls(&self, kind: CollectiveKind) -> u64 {
        self.calls[kind as usize]
    }

    /// Bytes over every kind.
    pub fn total_bytes(&self) -> u64 {
        self.bytes.iter().sum()
    }

    /// The counts of `self` minus those of an earlier snapshot `before`.
    pub fn since(&self, before: &CommStats) -> CommStats {
        let mut out = *self;
        for i in 0..5 {
            out.bytes[i] = out.bytes[i].saturating_sub(before.bytes[i]);
            out.calls[i] = out.calls[i].saturating_sub(before.calls[i]);
        }
        out
    }
}

/// An element type collectives carry.
pub trait Elem: Copy + Send + Sync + 'static {
    /// The matching `ncclDataType_t`.
    const NCCL: &'static str;
    /// Bytes per element on the wire.
    const SIZE: usize;
}

/// An element type reductions combine: widened to `Acc`, combined in rank order, narrowed once.
pub trait Reducible: Elem {
    /// Accumulator type (f32 for bf16: one rounding at the end).
    type Acc: Copy;
    /// Widen exactly.
    fn widen(self) -> Self::Acc;
    /// Round the accumulator back.
    fn narrow(acc: Self::Acc) -> Self;
    /// `a op b`.
    fn combine(a: Self::Acc, b: Self::Acc, op: ReduceOp) -> Self::Acc;
}

impl Elem for u8 {
    const NCCL: &'static str = "ncclUint8";
    const SIZE: usize = 1;
}
impl Elem for u64 {
    const NCCL: &'static str = "ncclUint64";
    const SIZE: usize = 8;
}
impl Elem for f32 {
    const NCCL: &'static str = "ncclFloat32";
    const SIZE: usize = 4;
}
impl Elem for f64 {
    const NCCL: &'static str = "ncclFloat64";
    const SIZE: usize = 8;
}
impl Elem for bf16 {
    const NCCL: &'static str = "ncclBfloat16";
    const SIZE: usize = 2;
}

impl Reducible for f32 {
    type Acc = f32;
    fn widen(self) -> f32 {
        self
    }
    fn narrow(acc: f32) -> f32 {
        acc
    }
    fn combine(a: f32, b: f32, op: ReduceOp) -> f32 {
        match op {
            ReduceOp::Sum => a + b,
            ReduceOp::Max => a.max(b),
        }
    }
}

impl Reducible for f64 {
    type Acc = f64;
    fn widen(self) -> f64 {
        self
    }
    fn narrow(acc: f64) -> f64 {
        acc
    }
    fn combine(a: f64, b: f64, op: ReduceOp) -> f64 {
        match op {
            ReduceOp::Sum => a + b,
            ReduceOp::Max => a.max(b),
        }
    }
}

impl Reducible for u64 {
    type Acc = u64;
    fn widen(self) -> u64 {
        self
    }
    fn narrow(acc: u64) -> u64 {
        acc
    }
    fn combine(a: u64, b: u64, op: ReduceOp) -> u64 {
        match op {
            ReduceOp::Sum => a.saturating_add(b),
            ReduceOp::Max => a.max(b),
        }
    }
}

/// bf16 reduces in f32 and rounds once (NCCL's ring rounds at every hop:
/// results differ from it in the last bit, which is why f32 is the default wire for gradients).
impl Reducible for bf16 {
    type Acc = f32;
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn narrow(acc: f32) -> bf16 {
        bf16::from_f32(acc)
    }
    fn combine(a: f32, b: f32, op: ReduceOp) -> f32 {
        f32::combine(a, b, op)
    }
}

/// The collectives of a group of `world_size` ranks, seen from one rank.
///
/// Every rank must call the same collectives in the same order with the same
/// lengths; a rank that deviates, fails or leaves makes the others' calls
/// return an error (never hang past the implementation's timeout).
pub trait Communicator {
    /// This rank, `0..world_size`.
    fn rank(&self) -> usize;

    /// Ranks in the group.
    fn world_size(&self) -> usize;

    /// Reduce `buf` element-wise over all ranks, in place (same length everywhere).
    fn all_reduce<T: Reducible>(&self, buf: &mut [T], op: ReduceOp) -> Result<()>;

    /// Concatenate every rank's `send` (same length everywhere) in rank order: `n * send.len()` elements.
    fn all_gather<T: Elem>(&self, send: &[T]) -> Result<Vec<T>>;

    /// Reduce `send` (`n * chunk` elements, same length everywhere) over all
    /// ranks and return this rank's `chunk`: elements `[rank * chunk, (rank + 1) * chunk)`.
    fn reduce_scatter<T: Reducible>(&self, send: &[T], op: ReduceOp) -> Result<Vec<T>>;

    /// Copy `root`'s `buf` into every rank's `buf` (same length everywhere).
    fn broadcast<T: Elem>(&self, buf: &mut [T], root: usize) -> Result<()>;

    /// Wait until every rank has arrived.
    fn barrier(&self) -> Result<()>;

    /// Bytes and calls counted so far by this rank.
    fn stats(&self) -> CommStats;
}
