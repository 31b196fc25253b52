//! [`ThreadComm`]: N ranks as threads of one process, the CPU reference communicator.
//!
//! Every collective is one rendezvous: each rank deposits its buffer in its
//! slot of a shared table; the last to arrive publishes the table and wakes
//! the others; each rank then computes its result from all deposits, in rank
//! order. Reductions are therefore `((x_0 op x_1) op x_2) ...` on every rank:
//! bit-reproducible, and bit-identical to a single process that accumulates
//! the same values in the same order (gradient accumulation over micro-batches).
//!
//! Failure handling: a rank whose closure returns an error or panics marks the
//! group failed, and a rank that returns marks itself gone; a rank waiting in
//! a collective sees either at once and returns [`Error::PeerFailed`]. A rank
//! that hangs (never arrives) makes the others return [`Error::Timeout`] after
//! the group's timeout, and the group is then failed for everyone.

use crate::comm::{CollectiveKind, CommStats, Communicator, Elem, ReduceOp, Reducible};
use crate::{Error, Result};
use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Default wait for the slowest rank before a collective gives up.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// One rank's contribution to a collective.
struct Deposit {
    kind: CollectiveKind,
    /// Element count (for the length checks).
    len: usize,
    /// Extra argument that must agree across ranks (the broadcast root, the reduction op).
    arg: u64,
    /// A `Vec<T>`; the receivers downcast it, so a type mismatch is an error, not garbage.
    payload: Box<dyn Any + Send + Sync>,
}

struct State {
    /// Collectives completed so far.
    gen: u64,
    slots: Vec<Option<Deposit>>,
    /// The deposits of the last completed collective, in rank order.
    published: Option<Arc<Vec<Deposit>>>,
    /// The first failure: (rank, reason).
    failed: Option<(usize, String)>,
    /// Ranks whose closure has returned.
    left: Vec<bool>,
}

struct Group {
    n: usize,
    timeout: Duration,
    state: Mutex<State>,
    cv: Condvar,
}

impl Group {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock, so a poisoned state is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One rank's handle on a group of threads (see the module docs).
pub struct ThreadComm {
    rank: usize,
    group: Arc<Group>,
    bytes: [AtomicU64; 5],
    calls: [AtomicU64; 5],
}

impl ThreadComm {
    /// Handles for a group of `n` ranks (hand one to each thread) whose
    /// collectives give up after `timeout` waiting for a missing rank.
    pub fn group(n: usize, timeout: Duration) -> Result<Vec<ThreadComm>> {
        if n == 0 {
            return Err(Error::Config("a group needs at least one rank".into()));
        }
        let group = Arc::new(Group {
            n,
            timeout,
            state: Mutex::new(State {
                gen: 0,
                slots: (0..n).map(|_| None).collect(),
                published: None,
                failed: None,
                left: vec![false; n],
            }),
            cv: Condvar::new(),
        });
        Ok((0..n)
            .map(|rank| ThreadComm {
                rank,
                group: group.clone(),
                bytes: Default::default(),
                calls: Default::default(),
            })
            .collect())
    }

    /// Mark the group failed because of this rank (first failure wins); every
    /// waiting or later collective of the other ranks returns [`Error::PeerFailed`].
    pub fn abort(&self, reason: &str) {
        let mut st = self.group.lock();
        if st.failed.is_none() {
            st.failed = Some((self.rank, reason.to_string()));
        }
        self.group.cv.notify_all();
    }

    /// Mark this rank as gone (its closure returned): collectives that still need it fail at once.
    pub fn leave(&self) {
        let mut st = self.group.lock();
        st.left[self.rank] = true;
        self.group.cv.notify_all();
    }

    /// The first failure of the group, if any: `(rank, reason)`.
    pub fn failure(&self) -> Option<(usize, String)> {
        self.group.lock().failed.clone()
    }

    fn count(&self, kind: CollectiveKind, bytes: usize) {
        self.bytes[kind as usize].fetch_add(bytes as u64, Ordering::Relaxed);
        self.calls[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Deposit, wait for every rank, return all deposits in rank order (checked to agree).
    fn exchange(&self, dep: Deposit) -> Result<Arc<Vec<Deposit>>> {
        let g = &*self.group;
        let what = dep.kind.name();
        let mut st = g.lock();
        if let Some((rank, reason)) = &st.failed {
            return Err(Error::PeerFailed {
                rank: *rank,
                reason: reason.clone(),
            });
        }
        let my_gen = st.gen;
        st.slots[self.rank] = Some(dep);
        let published = if st.slots.iter().all(Option::is_some) {
            let all: Vec<Deposit> = st.slots.iter_mut().filter_map(Option::take).collect();
            let all = Arc::new(all);
            st.published = Some(all.clone());
            st.gen += 1;
            g.cv.notify_all();
            all
        } else {
            let start = Instant::now();
            loop {
                if st.gen != my_gen {
                    match &st.published {
                        Some(p) => break p.clone(),
                        None => return Err(Error::Config("collective published nothing".into())),
                    }
                }
                if let Some((rank, reason)) = &st.failed {
                    return Err(Error::PeerFailed {
                        rank: *rank,
                        reason: reason.clone(),
                    });
                }
                if let Some(r) = (0..g.n).find(|&r| st.left[r] && st.slots[r].is_none()) {
                    return Err(Error::PeerFailed {
                        rank: r,
                        reason: format!("it left the group before joining {what}"),
                    });
                }
                let waited = start.elapsed();
                if waited >= g.timeout {
                    let missing: Vec<usize> = (0..g.n).filter(|&r| st.slots[r].is_none()).collect();
                    let msg = format!("timed out in {what} waiting for ranks {missing:?}");
                    if st.failed.is_none() {
                        st.failed = Some((self.rank, msg));
                    }
                    g.cv.notify_all();
                    return Err(Error::Timeout {
                        what: what.into(),
                        secs: waited.as_secs_f64(),
                        missing,
                    });
                }
                st =
                    g.cv.wait_timeout(st, g.timeout - waited)
                        .map(|(s, _)| s)
                        .unwrap_or_else(|p| p.into_inner().0);
            }
        };
        drop(st);
        let first = &published[0];
        for (r, d) in published.iter().enumerate() {
            if d.kind != first.kind || d.len != first.len || d.arg != first.arg {
                return Err(Error::Mismatch(format!(
                    "rank 0 called {} with {} elements (arg {}), rank {r} called {} with {} elements (arg {})",
                    first.kind.name(),
                    first.len,
                    first.arg,
                    d.kind.name(),
                    d.len,
                    d.arg
                )));
            }
        }
        Ok(published)
    }
}

/// The `Vec<T>` a deposit carries, or a mismatch error naming the type.
fn payload<T: Elem>(d: &Deposit, rank: usize) -> Result<&[T]> {
    d.payload
        .downcast_ref::<Vec<T>>()
        .map(Vec::as_slice)
        .ok_or_else(|| {
            Error::Mismatch(format!(
                "rank {rank} sent another element type than {}",
                T::NCCL
            ))
        })
}

fn op_arg(op: ReduceOp) -> u64 {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Max => 1,
    }
}

/// `out[i] = x_0[off + i] op x_1[off + i] op ...`, in rank order.
fn reduce_range<T: Reducible>(
    all: &[Deposit],
    off: usize,
    len: usize,
    op: ReduceOp,
) -> Result<Vec<T>> {
    let mut acc: Vec<T::Acc> = payload::<T>(&all[0], 0)?[off..off + len]
        .iter()
        .map(|&v| v.widen())
        .collect();
    for (r, d) in all.iter().enumerate().skip(1) {
        let x = &payload::<T>(d, r)?[off..off + len];
        for (a, &v) in acc.iter_mut().zip(x) {
            *a = T::combine(*a, v.widen(), op);
        }
    }
    Ok(acc.into_iter().map(T::narrow).collect())
}

impl Communicator for ThreadComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.group.n
    }

    fn all_reduce<T: Reducible>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.count(CollectiveKind::AllReduce, buf.len() * T::SIZE);
        let all = self.exchange(Deposit {
            kind: CollectiveKind::AllReduce,
            len: buf.len(),
            arg: op_arg(op),
            payload: Box::new(buf.to_vec()),
        })?;
        let out = reduce_range::<T>(&all, 0, buf.len(), op)?;
        buf.copy_from_slice(&out);
        Ok(())
    }

    fn all_gather<T: Elem>(&self, send: &[T]) -> Result<Vec<T>> {
        self.count(CollectiveKind::AllGather, send.len() * T::SIZE);
        let all = self.exchange(Deposit {
            kind: CollectiveKind::AllGather,
            len: send.len(),
            arg: 0,
            payload: Box::new(send.to_vec()),
        })?;
        let mut out = Vec::with_capacity(send.len() * all.len());
        for (r, d) in all.iter().enumerate() {
            out.extend_from_slice(payload::<T>(d, r)?);
        }
        Ok(out)
    }

    fn reduce_scatter<T: Reducible>(&self, send: &[T], op: ReduceOp) -> Result<Vec<T>> {
        let n = self.group.n;
        if !send.len().is_multiple_of(n) {
            return Err(Error::Mismatch(format!(
                "reduce_scatter: {} elements do not split into {n} equal chunks",
                send.len()
            )));
        }
        self.count(CollectiveKind::ReduceScatter, send.len() * T::SIZE);
        let all = self.exchange(Deposit {
            kind: CollectiveKind::ReduceScatter,
            len: send.len(),
            arg: op_arg(op),
            payload: Box::new(send.to_vec()),
        })?;
        let chunk = send.len() / n;
        reduce_range::<T>(&all, self.rank * chunk, chunk, op)
    }

    fn broadcast<T: Elem>(&self, buf: &mut [T], root: usize) -> Result<()> {
        if root >= self.group.n {
            return Err(Error::Config(format!(
                "broadcast root {root} is not a rank of a group of {}",
                self.group.n
            )));
        }
        self.count(CollectiveKind::Broadcast, buf.len() * T::SIZE);
        let all = self.exchange(Deposit {
            kind: CollectiveKind::Broadcast,
            len: buf.len(),
            arg: root as u64,
            // Only the root's data is read; the others send nothing.
            payload: Box::new(if self.rank == root {
                buf.to_vec()
            } else {
                Vec::<T>::new()
            }),
        })?;
        buf.copy_from_slice(payload::<T>(&all[root], root)?);
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        self.count(CollectiveKind::Barrier, 0);
        self.exchange(Deposit {
            kind: CollectiveKind::Barrier,
            len: 0,
            arg: 0,
            payload: Box::new(Vec::<u8>::new()),
        })
        .map(|_| ())
    }

    fn stats(&self) -> CommStats {
        let mut s = CommStats::default();
        for i in 0..5 {
            s.bytes[i] = self.bytes[i].load(Ordering::Relaxed);
            s.calls[i] = self.calls[i].load(Ordering::Relaxed);
        }
        s
    }
}

/// Marks the rank gone when its closure ends, however it ends.
struct LeaveGuard<'a>(&'a ThreadComm);

impl Drop for LeaveGuard<'_> {
    fn drop(&mut self) {
        self.0.leave();
    }
}

fn panic_message(p: &(dyn Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}

/// Run `f` on `n` ranks (threads) with [`DEFAULT_TIMEOUT`]; see [`spawn_ranks_with_timeout`].
pub fn spawn_ranks<T, F>(n: usize, f: F) -> Result<Vec<T>>
where
    T: Send,
    F: Fn(&ThreadComm) -> Result<T> + Sync,
{
    spawn_ranks_with_timeout(n, DEFAULT_TIMEOUT, f)
}

/// Run `f` on `n` ranks, each a thread with its own [`ThreadComm`], and
/// return their results in rank order.
///
/// If any rank fails, the result is the error of the rank that failed first
/// (its own error, or [`Error::Panicked`]), not the [`Error::PeerFailed`]
/// the others saw; the other ranks stop at their next collective.
pub fn spawn_ranks_with_timeout<T, F>(n: usize, timeout: Duration, f: F) -> Result<Vec<T>>
where
    T: Send,
    F: Fn(&ThreadComm) -> Result<T> + Sync,
{
    let comms = ThreadComm::group(n, timeout)?;
    let f = &f;
    let results: Vec<Result<T>> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|comm| {
                s.spawn(move || {
                    let _leave = LeaveGuard(comm);
                    match catch_unwind(AssertUnwindSafe(|| f(comm))) {
                        Ok(Ok(v)) => Ok(v),
                        Ok(Err(e)) => {
                            comm.abort(&e.to_string());
                            Err(e)
                        }
                        Err(p) => {
                            let message = panic_message(p.as_ref());
                            comm.abort(&format!("panicked: {message}"));
                            Err(Error::Panicked {
                                rank: comm.rank(),
                                message,
                            })
                        }
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(rank, h)| {
                h.join().unwrap_or_else(|p| {
                    Err(Error::Panicked {
                        rank,
                        message: panic_message(p.as_ref()),
                    })
                })
            })
            .collect()
    });
    let first_failed = comms.first().and_then(ThreadComm::failure).map(|(r, _)| r);
    let mut results: Vec<Option<Result<T>>> = results.into_iter().map(Some).collect();
    if let Some(r) = first_failed {
        if let Some(Some(Err(e))) = results.get_mut(r).map(Option::take) {
            return Err(e);
        }
    }
    let mut out = Vec::with_capacity(n);
    for r in results.into_iter().flatten() {
        out.push(r?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn collectives_agree_with_a_serial_computation() {
        for n in [1, 2, 3, 4] {
            let out = spawn_ranks(n, |c| {
                let r = c.rank() as f32;
                let mut s = vec![r + 0.1, -r, 1e-8 * r];
                c.all_reduce(&mut s, ReduceOp::Sum)?;
                let mut m = vec![r, 10.0 - r];
                c.all_reduce(&mut m, ReduceOp::Max)?;
                let g = c.all_gather(&[c.rank() as u8, 7])?;
                let send: Vec<f32> = (0..2 * n).map(|i| (i * (c.rank() + 1)) as f32).collect();
                let rs = c.reduce_scatter(&send, ReduceOp::Sum)?;
                let mut b = vec![c.rank() as f64; 3];
                c.broadcast(&mut b, n - 1)?;
                c.barrier()?;
                Ok((s, m, g, rs, b, c.stats()))
            })
            .unwrap();
            for (rank, (s, m, g, rs, b, st)) in out.iter().enumerate() {
                // Rank-order summation, written out serially.
                let mut want = [0f32; 3];
                for r in 0..n {
                    let r = r as f32;
                    for (w, v) in want.iter_mut().zip([r + 0.1, -r, 1e-8 * r]) {
                        *w += v;
                    }
                }
                assert_eq!(s.as_slice(), &want, "n={n}");
                assert_eq!(m, &vec![(n - 1) as f32, 10.0]);
                let wg: Vec<u8> = (0..n).flat_map(|r| [r as u8, 7]).collect();
                assert_eq!(g, &wg);
                let tri = (n * (n + 1) / 2) as f32;
                assert_eq!(
                    rs,
                    &vec![(2 * rank) as f32 * tri, (2 * rank + 1) as f32 * tri]
                );
                assert_eq!(b, &vec![(n - 1) as f64; 3]);
                assert_eq!(st.bytes(CollectiveKind::AllReduce), 3 * 4 + 2 * 4);
                assert_eq!(st.bytes(CollectiveKind::AllGather), 2);
                assert_eq!(st.bytes(CollectiveKind::ReduceScatter), 2 * n as u64 * 4);
                assert_eq!(st.bytes(CollectiveKind::Broadcast), 24);
                assert_eq!(st.calls(CollectiveKind::Barrier), 1);
            }
        }
    }

    #[test]
    fn bf16_reduces_in_f32_and_rounds_once() {
        let out = spawn_ranks(3, |c| {
            // 1 + 2^-9 + 2^-9: bf16 steps (rounding each add) would lose both halves.
            let v = if c.rank() == 0 { 1.0 } else { 2f32.powi(-9) };
            let mut b = [bf16::from_f32(v)];
            c.all_reduce(&mut b, ReduceOp::Sum)?;
            Ok((b[0], c.stats().bytes(CollectiveKind::AllReduce)))
        })
        .unwrap();
        assert_eq!(out[0], (bf16::from_f32(1.0 + 2f32.powi(-8)), 2));
    }

    #[test]
    fn mismatched_calls_are_errors_on_every_rank() {
        let r = spawn_ranks(2, |c| {
            let send = vec![0f32; 2 + c.rank()];
            c.all_gather(&send)
        });
        assert!(matches!(r, Err(Error::Mismatch(_))), "{r:?}");
        let r = spawn_ranks(2, |c| {
            if c.rank() == 0 {
                c.barrier()
            } else {
                c.all_gather(&[1u8]).map(|_| ())
            }
        });
        assert!(matches!(r, Err(Error::Mismatch(_))), "{r:?}");
        let r = spawn_ranks(2, |c| {
            if c.rank() == 0 {
                c.all_gather(&[1u8]).map(|_| ())
            } else {
                c.all_gather(&[1f32]).map(|_| ())
            }
        });
        assert!(matches!(r, Err(Error::Mismatch(_))), "{r:?}");
        assert!(spawn_ranks(3, |c| c.reduce_scatter(&[1f32; 4], ReduceOp::Sum)).is_err());
        assert!(spawn_ranks(2, |c| c.broadcast(&mut [0u8], 2)).is_err());
        assert!(matches!(spawn_ranks(0, |_| Ok(())), Err(Error::Config(_))));
    }

    #[test]
    fn a_failing_or_panicking_rank_stops_the_others_promptly() {
        let t0 = Instant::now();
        let r = spawn_ranks(4, |c| {
            if c.rank() == 2 {
                return Err(Error::Shape("rank 2 had bad data".into()));
            }
            // The others would wait forever for rank 2 without the failure flag.
            c.barrier()?;
            c.barrier()
        });
        assert!(
            matches!(&r, Err(Error::Shape(m)) if m.contains("rank 2")),
            "{r:?}"
        );
        let r = spawn_ranks(3, |c| {
            c.barrier()?;
            if c.rank() == 1 {
                panic!("simulated crash mid-step");
            }
            let mut x = [1f32];
            c.all_reduce(&mut x, ReduceOp::Sum)
        });
        assert!(
            matches!(&r, Err(Error::Panicked { rank: 1, message }) if message.contains("mid-step")),
            "{r:?}"
        );
        // A rank that returns early: the others' next collective fails instead of hanging.
        let r = spawn_ranks(2, |c| match c.rank() {
            0 => Ok(()),
            _ => c.barrier(),
        });
        assert!(matches!(r, Err(Error::PeerFailed { rank: 0, .. })), "{r:?}");
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    }

    #[test]
    fn a_hung_rank_times_out() {
        let t0 = Instant::now();
        let r = spawn_ranks_with_timeout(2, Duration::from_millis(200), |c| {
            if c.rank() == 1 {
                std::thread::sleep(Duration::from_millis(1500));
            }
            c.barrier()
        });
        assert!(
            matches!(&r, Err(Error::Timeout { missing, .. }) if missing == &vec![1]),
            "{r:?}"
        );
        assert!(t0.elapsed() < Duration::from_secs(5));
    }
}
