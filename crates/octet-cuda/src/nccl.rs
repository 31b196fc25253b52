//! The device communicator: NCCL (through cudarc, loaded at run time) on a
//! stream of its own beside the [`Gpu`]'s compute stream, one process per GPU.
//!
//! The collectives are the ones `octet_dist::Communicator` defines on host
//! buffers, with the same meaning and the same byte counting (the bytes this
//! rank hands to NCCL: `all_gather` its send buffer, `reduce_scatter` its
//! whole send buffer, `all_reduce` its buffer), so FP8 and bf16 gathers
//! compare directly. A failed call is an [`Error::Nccl`] naming the collective.
//!
//! ## Two streams
//!
//! NCCL runs on the communicator's stream, so that a collective can run while
//! the compute stream computes (the next block's weights gathered during this
//! block's forward, one block's gradients reduce-scattered during the next
//! one's backward). Nothing waits on the host; the streams are ordered by
//! events:
//! - [`NcclComm::all_gather`], [`NcclComm::reduce_scatter`],
//!   [`NcclComm::all_reduce`] and [`NcclComm::group`] are *ordered*: the
//!   communicator's stream waits for the compute stream's work so far, and
//!   the compute stream waits for the collective, as if both ran on one stream.
//! - [`NcclComm::start`] launches a group of collectives the same way but
//!   returns at once with an [`InFlight`]: the compute stream waits for them
//!   only at [`InFlight::wait`].
//!
//! Every buffer is allocated on the compute stream (cudarc frees a buffer on
//! the stream that allocated it). The rule that keeps that safe: a buffer a
//! collective in flight reads or writes is dropped only after the compute
//! stream has waited for it, which [`InFlight`] enforces by owning those
//! buffers (its drop waits too). cudarc's own cross-stream event tracking is
//! off (see [`Gpu::open`]).
//!
//! NCCL aborts the communicator when it is dropped. A peer that dies leaves
//! the others blocked in the next collective; the launcher of `octet train
//! --nproc` ends the job when any rank exits, and each rank's step watchdog
//! ends a rank that makes no progress (see `octet_train::gpu`).

use crate::{Error, Gpu, Result};
use cudarc::driver::{CudaEvent, CudaStream, DevicePtr, DevicePtrMut};
use cudarc::nccl::{Comm, Id, NcclType, ReduceOp};
use std::cell::Cell;
use std::sync::Arc;

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
    /// The compute stream (the [`Gpu`]'s).
    compute: Arc<CudaStream>,
    /// The stream NCCL runs on.
    side: Arc<CudaStream>,
    rank: usize,
    world: usize,
    stats: Cell<NcclStats>,
    /// Inside [`NcclComm::group`] or [`NcclComm::start`]: the collectives are
    /// enqueued without ordering each one (the group is ordered as a whole).
    grouped: Cell<bool>,
}

/// Collectives launched by [`NcclComm::start`], with the buffers they read
/// and write (`T`). The compute stream has not waited for them yet:
/// [`InFlight::wait`] makes it wait and hands the buffers back. Dropped
/// without `wait` (an error path), it still makes the compute stream wait
/// before the buffers are freed.
pub struct InFlight<T> {
    done: Option<CudaEvent>,
    compute: Arc<CudaStream>,
    buffers: Option<T>,
}

impl<T> InFlight<T> {
    /// The compute stream waits for the collectives (no host wait); the
    /// buffers they used are the caller's again.
    pub fn wait(mut self) -> Result<T> {
        if let Some(e) = self.done.take() {
            self.compute.wait(&e)?;
        }
        self.buffers
            .take()
            .ok_or_else(|| Error::Nccl("collective buffers already taken".into()))
    }
}

impl<T> Drop for InFlight<T> {
    fn drop(&mut self) {
        if let Some(e) = self.done.take() {
            // Best effort on an error path: if the wait cannot be enqueued the
            // context is already broken and the run is ending.
            let _ = self.compute.wait(&e);
        }
    }
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

    /// Join the communicator of `world` ranks named by `id` as `rank`, on a
    /// new stream beside `gpu`'s. Blocks until every rank has joined (NCCL's
    /// own initialisation; the caller's rendezvous bounds how long ranks wait
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
        let side = gpu.stream.fork()?;
        let comm = Comm::from_rank(side.clone(), rank, world, Id::uninit(internal))
            .map_err(nccl_err("ncclCommInitRank"))?;
        Ok(NcclComm {
            comm,
            compute: gpu.stream.clone(),
            side,
            rank,
            world,
            stats: Cell::new(NcclStats::default()),
            grouped: Cell::new(false),
        })
    }

    /// The communicator's stream waits for the compute stream's work so far.
    fn enter(&self) -> Result<()> {
        Ok(self.side.join(&self.compute)?)
    }

    /// The compute stream waits for the communicator's stream's work so far.
    fn leave(&self) -> Result<()> {
        Ok(self.compute.join(&self.side)?)
    }

    /// Enqueue one collective `f`, ordered with the compute stream unless a
    /// group orders it.
    fn ordered(&self, f: impl FnOnce() -> Result<()>) -> Result<()> {
        if self.grouped.get() {
            return f();
        }
        self.enter()?;
        f()?;
        self.leave()
    }

    /// `f`'s collectives as one NCCL group, after the compute stream's work so far.
    fn launch_group<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<R> {
        if self.grouped.get() {
            return Err(Error::Nccl("NCCL groups do not nest here".into()));
        }
        self.enter()?;
        cudarc::nccl::group_start().map_err(nccl_err("ncclGroupStart"))?;
        self.grouped.set(true);
        let r = f();
        self.grouped.set(false);
        cudarc::nccl::group_end().map_err(nccl_err("ncclGroupEnd"))?;
        r
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
        self.ordered(|| {
            self.comm
                .all_gather(send, recv)
                .map(|_| ())
                .map_err(nccl_err("ncclAllGather"))
        })?;
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
        self.ordered(|| {
            self.comm
                .reduce_scatter(send, recv, &op.nccl())
                .map(|_| ())
                .map_err(nccl_err("ncclReduceScatter"))
        })?;
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
        self.ordered(|| {
            self.comm
                .all_reduce_in_place(buf, &op.nccl())
                .map(|_| ())
                .map_err(nccl_err("ncclAllReduce"))
        })?;
        let bytes = (buf.len() * std::mem::size_of::<T>()) as u64;
        self.count(|s| {
            s.all_reduce_bytes += bytes;
            s.all_reduce_calls += 1;
        });
        Ok(())
    }

    /// Run `f`'s collectives as one NCCL group (`ncclGroupStart`/`End`):
    /// they are launched together when the group ends, ordered as a whole
    /// with the compute stream.
    pub fn group<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<R> {
        let r = self.launch_group(f)?;
        self.leave()?;
        Ok(r)
    }

    /// Launch `f`'s collectives on `buffers` as one NCCL group after the
    /// compute stream's work so far, without making the compute stream wait
    /// for them: it waits at [`InFlight::wait`], which hands `buffers` back.
    /// `buffers` must own every buffer the collectives write, and every one
    /// they read that the caller would otherwise drop before the wait.
    pub fn start<T>(
        &self,
        mut buffers: T,
        f: impl FnOnce(&mut T) -> Result<()>,
    ) -> Result<InFlight<T>> {
        self.launch_group(|| f(&mut buffers))?;
        Ok(InFlight {
            done: Some(self.side.record_event(None)?),
            compute: self.compute.clone(),
            buffers: Some(buffers),
        })
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
