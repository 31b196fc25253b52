//! The device communicator: NCCL (through cudarc, loaded at run time) on
//! the [`Gpu`]'s stream, one process per GPU.
//!
//! The collectives are the ones `octet_dist::Communicator` defines on host
//! buffers, with the same meaning and the same byte counting (the bytes this
//! rank hands to NCCL: `all_gather` its send buffer, `reduce_scatter` its
//! whole send buffer, `all_reduce` its buffer), so FP8 and bf16 gathers
//! compare directly. Every call is enqueued on the GPU's one stream: it is
//! ordered with the kernels before and after it, and nothing waits on the
//! host. A failed call is an [`Error::Nccl`] naming the collective.
//!
//! NCCL aborts the communicator when it is dropped. A peer that dies leaves
//! the others blocked in the next collective; the launcher of `octet train
//! --nproc` ends the job when any rank exits, and each rank's step watchdog
//! ends a rank that makes no progress (see `octet_train::gpu`).

use crate::{Error, Gpu, Result};
use cudarc::driver::{DevicePtr, DevicePtrMut};
use cudarc::nccl::{Comm, Id, NcclType, ReduceOp};
use std::cell::Cell;

/// Bytes of an NCCL unique id (what rank 0 sends every other rank).
pub const ID_BYTES: usize = 128;

/// A reduction of [`NcclComm::all_reduce`] and [`NcclComm::reduce_scatter`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduce {
    /// `ncclSum`.
    Sum,
    /// `ncclMax` (on `u32` f32 bits of non-negative values: the float maximum).
    Max,
}

/// Bytes handed to NCCL and calls made by this rank, per collective.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct NcclStats {
    /// All-gather send bytes.
    pub all_gather_bytes: u64,
    /// All-gather calls.
    pub all_gather_calls: u64,
    /// Reduce-scatter send bytes (the whole send buffer).
    pub reduce_scatter_bytes: u64,
    /// Reduce-scatter calls.
    pub reduce_scatter_calls: u64,
    /// All-reduce bytes.
    pub all_reduce_bytes: u64,
    /// All-reduce calls.
    pub all_reduce_calls: u64,
}

impl NcclStats {
    /// The counts since `before`.
    pub fn since(&self, before: &NcclStats) -> NcclStats {
        NcclStats {
            all_gather_bytes: self.all_gather_bytes - before.all_gather_bytes,
            all_gather_calls: self.all_gather_calls - before.all_gather_calls,
            reduce_scatter_bytes: self.reduce_scatter_bytes - before.reduce_scatter_bytes,
            reduce_scatter_calls: self.reduce_scatter_calls - before.reduce_scatter_calls,
            all_reduce_bytes: self.all_reduce_bytes - before.all_reduce_bytes,
            all_reduce_calls: self.all_reduce_calls - before.all_reduce_calls,
        }
    }
}

/// One rank's NCCL communicator.
pub struct NcclComm {
    comm: Comm,
    rank: usize,
    world: usize,
    stats: Cell<NcclStats>,
}

fn nccl_err(what: &str) -> impl Fn(cudarc::nccl::result::NcclError) -> Error + '_ {
    move |e| Error::Nccl(format!("{what}: {e:?}"))
}

/// Whether libnccl can be loaded on this machine.
pub fn nccl_present() -> bool {
    // SAFETY: only probes whether the shared library can be loaded.
    unsafe { cudarc::nccl::sys::is_culib_present() }
}

fn require_nccl() -> Result<()> {
    if nccl_present() {
        Ok(())
    } else {
        Err(Error::Nccl(
            "libnccl (libnccl.so.2) could not be loaded: install NCCL or add its directory to LD_LIBRARY_PATH".into(),
        ))
    }
}

impl NcclComm {
    /// A fresh unique id (rank 0 makes it and sends it to the others).
    pub fn unique_id() -> Result<Vec<u8>> {
        require_nccl()?;
        let id = Id::new().map_err(nccl_err("ncclGetUniqueId"))?;
        Ok(id.internal().iter().map(|&c| c as u8).collect())
    }

    /// Join the communicator of `world` ranks named by `id` as `rank`, on
    /// `gpu`'s stream. Blocks until every rank has joined (NCCL's own
    /// initialisation; the caller's rendezvous bounds how long ranks wait
    /// for each other before this).
    pub fn new(gpu: &Gpu, rank: usize, world: usize, id: &[u8]) -> Result<NcclComm> {
        require_nccl()?;
        if id.len() != ID_BYTES {
            return Err(Error::Nccl(format!(
                "an NCCL id has {ID_BYTES} bytes, got {}",
                id.len()
            )));
        }
        if rank >= world {
            return Err(Error::Nccl(format!("rank {rank} of a world of {world}")));
        }
        let mut internal = [0 as std::ffi::c_char; ID_BYTES];
        for (d, &s) in internal.iter_mut().zip(id) {
            *d = s as std::ffi::c_char;
        }
        let comm = Comm::from_rank(gpu.stream.clone(), rank, world, Id::uninit(internal))
            .map_err(nccl_err("ncclCommInitRank"))?;
        Ok(NcclComm {
            comm,
            rank,
            world,
            stats: Cell::new(NcclStats::default()),
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the communicator.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Bytes and calls so far.
    pub fn stats(&self) -> NcclStats {
        self.stats.get()
    }

    fn count(&self, f: impl FnOnce(&mut NcclStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        self.stats.set(s);
    }

    /// Gather `send` (the same length on every rank) into `recv` (`world`
    /// times as long, rank-major).
    pub fn all_gather<T: NcclType, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
    ) -> Result<()> {
        if recv.len() != send.len() * self.world {
            return Err(Error::Nccl(format!(
                "all_gather: {} elements into {} (world {})",
                send.len(),
                recv.len(),
                self.world
            )));
        }
        self.comm
            .all_gather(send, recv)
            .map_err(nccl_err("ncclAllGather"))?;
        let bytes = (send.len() * std::mem::size_of::<T>()) as u64;
        self.count(|s| {
            s.all_gather_bytes += bytes;
            s.all_gather_calls += 1;
        });
        Ok(())
    }

    /// Reduce `send` (`world * chunk`, rank-major) over the ranks and keep
    /// this rank's chunk in `recv`.
    pub fn reduce_scatter<T: NcclType, S: DevicePtr<T>, R: DevicePtrMut<T>>(
        &self,
        send: &S,
        recv: &mut R,
        op: Reduce,
    ) -> Result<()> {
        if send.len() != recv.len() * self.world {
            return Err(Error::Nccl(format!(
                "reduce_scatter: {} elements to chunks of {} (world {})",
                send.len(),
                recv.len(),
                self.world
            )));
        }
        self.comm
            .reduce_scatter(send, recv, &op.nccl())
            .map_err(nccl_err("ncclReduceScatter"))?;
        let bytes = (send.len() * std::mem::size_of::<T>()) as u64;
        self.count(|s| {
            s.reduce_scatter_bytes += bytes;
            s.reduce_scatter_calls += 1;
        });
        Ok(())
    }

    /// Reduce `buf` over the ranks, in place.
    pub fn all_reduce<T: NcclType, B: DevicePtrMut<T>>(
        &self,
        buf: &mut B,
        op: Reduce,
    ) -> Result<()> {
        self.comm
            .all_reduce_in_place(buf, &op.nccl())
            .map_err(nccl_err("ncclAllReduce"))?;
        let bytes = (buf.len() * std::mem::size_of::<T>()) as u64;
        self.count(|s| {
            s.all_reduce_bytes += bytes;
            s.all_reduce_calls += 1;
        });
        Ok(())
    }

    /// Run `f`'s collectives as one NCCL group (`ncclGroupStart`/`End`):
    /// they are launched together when the group ends.
    pub fn group<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<R> {
        cudarc::nccl::group_start().map_err(nccl_err("ncclGroupStart"))?;
        let r = f();
        cudarc::nccl::group_end().map_err(nccl_err("ncclGroupEnd"))?;
        r
    }

    /// Sum of one host value over the ranks (a one-element device all-reduce; waits).
    pub fn sum_f64(&self, gpu: &Gpu, x: f64) -> Result<f64> {
        let mut buf = gpu.upload(&[x])?;
        self.all_reduce(&mut buf, Reduce::Sum)?;
        Ok(gpu.download(&buf)?[0])
    }
}

impl Reduce {
    fn nccl(self) -> ReduceOp {
        match self {
            Reduce::Sum => ReduceOp::Sum,
            Reduce::Max => ReduceOp::Max,
        }
    }
}
