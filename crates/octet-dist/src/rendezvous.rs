//! Rendezvous: how the ranks of a multi-process job find each other and agree
//! on one opaque blob, the NCCL unique id (128 bytes, made by rank 0 with
//! `ncclGetUniqueId`) that every rank passes to `ncclCommInitRank`.
//!
//! Rank 0 listens on `master_port` of every address of its host (the
//! unspecified address of `master_addr`'s family); every other rank connects
//! (retrying until the deadline: rank 0 may start later) and sends a hello
//! `(magic, world, rank)`; rank 0 checks each hello (the same world size, a
//! rank in range, no rank twice) and, once all `world - 1` have arrived, sends
//! the blob to each. Every wait is bounded by one deadline, so a rank that
//! never comes makes the others fail with an error naming it, not hang.
//!
//! Wire format (big-endian): hello = `b"OCT1"`, world `u32`, rank `u32`;
//! reply = status `u8` (0 ok, 1 rejected), length `u32`, then the blob (or,
//! when rejected, a UTF-8 reason).

use crate::{Error, Result};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

const MAGIC: &[u8; 4] = b"OCT1";
/// Longest blob or reason accepted on the wire (an NCCL id is 128 bytes).
const MAX_BLOB: usize = 1 << 16;

/// Where and how long to meet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendezvous {
    /// Rank 0's host name or address (`--master-addr`).
    pub master_addr: String,
    /// Rank 0's port (`--master-port`).
    pub master_port: u16,
    /// Ranks in the job (`--nproc` x `--nnodes`).
    pub world: usize,
    /// This process's rank.
    pub rank: usize,
    /// How long any rank waits for the others, in all (one longer than the
    /// clock can count, such as `Duration::MAX`, waits about 136 years).
    pub timeout: Duration,
}

impl Rendezvous {
    fn check(&self) -> Result<()> {
        if self.world == 0 || self.rank >= self.world {
            return Err(Error::Config(format!(
                "rank {} of a world of {}",
                self.rank, self.world
            )));
        }
        Ok(())
    }

    fn addr(&self) -> Result<SocketAddr> {
        (self.master_addr.as_str(), self.master_port)
            .to_socket_addrs()
            .map_err(|e| {
                Error::Config(format!(
                    "master address {}:{}: {e}",
                    self.master_addr, self.master_port
                ))
            })?
            .next()
            .ok_or_else(|| {
                Error::Config(format!(
                    "master address {}:{} resolves to nothing",
                    self.master_addr, self.master_port
                ))
            })
    }

    /// Where rank 0 listens: the unspecified address of the master
    /// address's family (`0.0.0.0`, or `[::]` for IPv6) on `master_port`, so
    /// that other hosts reach it even where `master_addr` names this host by
    /// a loopback address (a hostname in `/etc/hosts` as `127.0.1.1`).
    /// `master_addr` must still resolve.
    fn listen_addr(&self) -> Result<SocketAddr> {
        let ip: IpAddr = match self.addr()? {
            SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
            SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
        };
        Ok(SocketAddr::new(ip, self.master_port))
    }

    /// Rank 0: serve `blob` to every other rank and return it. Other ranks:
    /// fetch it from rank 0. Every rank returns the same bytes, or an error
    /// (timeout naming the ranks that never came, a rejected hello, a
    /// connection lost).
    pub fn exchange(&self, blob: Option<&[u8]>) -> Result<Vec<u8>> {
        self.check()?;
        tracing::debug!(
            rank = self.rank,
            world = self.world,
            master = %format!("{}:{}", self.master_addr, self.master_port),
            "rendezvous"
        );
        let deadline = deadline_after(self.timeout);
        if self.rank == 0 {
            let blob =
                blob.ok_or_else(|| Error::Config("rank 0 must provide the blob to share".into()))?;
            if blob.len() > MAX_BLOB {
                return Err(Error::Config(format!(
                    "a blob of {} bytes (at most {MAX_BLOB})",
                    blob.len()
                )));
            }
            let at = self.listen_addr()?;
            let listener = TcpListener::bind(at).map_err(|e| {
                Error::Config(format!(
                    "rank 0 cannot listen on {at} (master address {}:{}): {e}",
                    self.master_addr, self.master_port
                ))
            })?;
            self.serve(&listener, blob, deadline)?;
            Ok(blob.to_vec())
        } else {
            self.fetch(deadline)
        }
    }

    fn serve(&self, listener: &TcpListener, blob: &[u8], deadline: Instant) -> Result<()> {
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::Config(format!("listener: {e}")))?;
        let mut peers: Vec<Option<TcpStream>> = (0..self.world).map(|_| None).collect();
        let mut arrived = 1;
        while arrived < self.world {
            match listener.accept() {
                Ok((mut s, _)) => {
                    let _ = s.set_nonblocking(false);
                    match read_hello(&mut s, deadline) {
                        Ok((world, rank)) => {
                            let reject = if world != self.world as u32 {
                                Some(format!("world size {world}, rank 0 has {}", self.world))
                            } else if rank == 0 || rank as usize >= self.world {
                                Some(format!("rank {rank} is not in 1..{}", self.world))
                            } else if peers[rank as usize].is_some() {
                                Some(format!("rank {rank} joined twice"))
                            } else {
                                None
                            };
                            match reject {
                                Some(reason) => {
                                    let _ = write_reply(&mut s, 1, reason.as_bytes());
                                    return Err(Error::Config(format!(
                                        "rendezvous rejected a rank: {reason}"
                                    )));
                                }
                                None => {
                                    peers[rank as usize] = Some(s);
                                    arrived += 1;
                                }
                            }
                        }
                        // Not one of ours (a port scanner, a stale client): ignore it.
                        Err(_) => continue,
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let missing: Vec<usize> =
                            (1..self.world).filter(|&r| peers[r].is_none()).collect();
                        return Err(Error::Timeout {
                            what: "rendezvous".into(),
                            secs: self.timeout.as_secs_f64(),
                            missing,
                        });
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(Error::Config(format!("accept: {e}"))),
            }
        }
        for (rank, s) in peers.iter_mut().enumerate().skip(1) {
            if let Some(s) = s {
                write_reply(s, 0, blob).map_err(|e| Error::PeerFailed {
                    rank,
                    reason: format!("lost during rendezvous: {e}"),
                })?;
            }
        }
        Ok(())
    }

    fn fetch(&self, deadline: Instant) -> Result<Vec<u8>> {
        let addr = self.addr()?;
        let mut s = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Timeout {
                    what: format!("rendezvous at {}:{}", self.master_addr, self.master_port),
                    secs: self.timeout.as_secs_f64(),
                    missing: vec![0],
                });
            }
            match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(1))) {
                Ok(s) => break s,
                // Rank 0 may not listen yet: try again shortly.
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let mut hello = Vec::with_capacity(12);
        hello.extend_from_slice(MAGIC);
        hello.extend_from_slice(&(self.world as u32).to_be_bytes());
        hello.extend_from_slice(&(self.rank as u32).to_be_bytes());
        s.write_all(&hello)
            .map_err(|e| Error::Config(format!("sending the hello to rank 0: {e}")))?;
        let (status, body) = read_reply(&mut s, deadline).map_err(|e| match e {
            Error::Timeout { .. } => Error::Timeout {
                what: "rendezvous (waiting for every rank to join)".into(),
                secs: self.timeout.as_secs_f64(),
                missing: vec![],
            },
            e => e,
        })?;
        if status != 0 {
            return Err(Error::Config(format!(
                "rank 0 rejected rank {}: {}",
                self.rank,
                String::from_utf8_lossy(&body)
            )));
        }
        Ok(body)
    }
}

/// `timeout` from now; a timeout the clock cannot add (`--dist-timeout`
/// of `u64::MAX` seconds) is cut to `2^32` seconds instead of panicking.
fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(Duration::from_secs(1 << 32)))
        .unwrap_or(now)
}

/// Read exactly `buf.len()` bytes before `deadline`.
fn read_exact_by(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> Result<()> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout {
                what: "rendezvous read".into(),
                secs: 0.0,
                missing: vec![],
            });
        }
        s.set_read_timeout(Some(left))
            .map_err(|e| Error::Config(format!("socket: {e}")))?;
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(Error::Config("connection closed during rendezvous".into())),
            Ok(n) => got += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => return Err(Error::Config(format!("rendezvous read: {e}"))),
        }
    }
    Ok(())
}

fn read_hello(s: &mut TcpStream, deadline: Instant) -> Result<(u32, u32)> {
    // A hello comes right after connecting: give it a second at most.
    let by = deadline.min(Instant::now() + Duration::from_secs(1));
    let mut b = [0u8; 12];
    read_exact_by(s, &mut b, by)?;
    if &b[..4] != MAGIC {
        return Err(Error::Config("not an octet rendezvous hello".into()));
    }
    let word = |i: usize| u32::from_be_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    Ok((word(4), word(8)))
}

fn write_reply(s: &mut TcpStream, status: u8, body: &[u8]) -> std::io::Result<()> {
    let mut out = Vec::with_capacity(5 + body.len());
    out.push(status);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
    s.write_all(&out)?;
    s.flush()
}

fn read_reply(s: &mut TcpStream, deadline: Instant) -> Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 5];
    read_exact_by(s, &mut head, deadline)?;
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > MAX_BLOB {
        return Err(Error::Config(format!(
            "rendezvous reply of {len} bytes (at most {MAX_BLOB})"
        )));
    }
    let mut body = vec![0u8; len];
    read_exact_by(s, &mut body, deadline)?;
    Ok((head[0], body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap()
    }

    fn rv(port: u16, world: usize, rank: usize, ms: u64) -> Rendezvous {
        Rendezvous {
            master_addr: "127.0.0.1".into(),
            master_port: port,
            world,
            rank,
            timeout: Duration::from_millis(ms),
        }
    }

    #[test]
    fn every_rank_gets_rank_zeros_blob() {
        let port = free_port();
        let blob: Vec<u8> = (0..128u32).map(|i| (i * 37 % 251) as u8).collect();
        // Ranks start in reverse order: the others must wait for rank 0 to listen.
        let handles: Vec<_> = (0..4usize)
            .rev()
            .map(|rank| {
                let blob = blob.clone();
                std::thread::spawn(move || {
                    if rank == 0 {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    rv(port, 4, rank, 5000).exchange((rank == 0).then_some(&blob[..]))
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap().unwrap(), blob);
        }
    }

    #[test]
    fn a_timeout_too_long_for_the_clock_waits_without_a_deadline() {
        // `--dist-timeout 18446744073709551615` (u64::MAX seconds) used to panic
        // ("overflow when adding duration to instant") before any rank connected.
        let port = free_port();
        let blob = b"id".to_vec();
        let forever = Duration::from_secs(u64::MAX);
        let zero = {
            let blob = blob.clone();
            std::thread::spawn(move || {
                let mut r = rv(port, 2, 0, 0);
                r.timeout = forever;
                r.exchange(Some(&blob[..]))
            })
        };
        let mut one = rv(port, 2, 1, 0);
        one.timeout = forever;
        assert_eq!(one.exchange(None).unwrap(), blob);
        assert_eq!(zero.join().unwrap().unwrap(), blob);
    }

    #[test]
    fn rank_zero_listens_on_the_unspecified_address_of_the_masters_family() {
        let mut r = rv(29500, 2, 0, 100);
        let v4: SocketAddr = "0.0.0.0:29500".parse().unwrap();
        assert_eq!(r.listen_addr().unwrap(), v4);
        r.master_addr = "localhost".into();
        assert!(r.listen_addr().unwrap().ip().is_unspecified());
        r.master_addr = "::1".into();
        let v6: SocketAddr = "[::]:29500".parse().unwrap();
        assert_eq!(r.listen_addr().unwrap(), v6);
    }

    /// Rank 0 told 127.0.0.1 is reached at another address of the host
    /// (all of 127/8 is loopback on Linux): it does not listen on 127.0.0.1 only.
    #[cfg(target_os = "linux")]
    #[test]
    fn other_ranks_reach_rank_zero_at_another_address_of_its_host() {
        let port = free_port();
        let blob = b"shared".to_vec();
        let zero = {
            let blob = blob.clone();
            std::thread::spawn(move || rv(port, 2, 0, 5000).exchange(Some(&blob[..])))
        };
        let mut one = rv(port, 2, 1, 5000);
        one.master_addr = "127.0.0.2".into();
        assert_eq!(one.exchange(None).unwrap(), blob);
        assert_eq!(zero.join().unwrap().unwrap(), blob);
    }

    #[test]
    fn a_missing_rank_is_named_after_the_timeout() {
        let port = free_port();
        let blob = vec![7u8; 128];
        let others: Vec<_> = [1usize]
            .into_iter()
            .map(|rank| std::thread::spawn(move || rv(port, 3, rank, 600).exchange(None)))
            .collect();
        let t0 = Instant::now();
        let err = rv(port, 3, 0, 600).exchange(Some(&blob)).unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(5));
        match err {
            Error::Timeout { missing, .. } => assert_eq!(missing, vec![2]),
            other => panic!("expected a timeout naming rank 2, got {other}"),
        }
        // Rank 1 does not hang either: it times out waiting for the blob.
        for h in others {
            assert!(h.join().unwrap().is_err());
        }
    }

    #[test]
    fn a_rank_that_never_finds_rank_zero_times_out() {
        let port = free_port();
        let t0 = Instant::now();
        let err = rv(port, 2, 1, 300).exchange(None).unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn mismatched_world_sizes_and_bad_ranks_are_errors() {
        assert!(rv(1, 2, 2, 100).exchange(None).is_err());
        assert!(rv(1, 0, 0, 100).exchange(None).is_err());
        assert!(
            rv(1, 2, 0, 100).exchange(None).is_err(),
            "rank 0 needs a blob"
        );
        let port = free_port();
        let server = std::thread::spawn(move || rv(port, 2, 0, 3000).exchange(Some(&[1, 2, 3])));
        let err = rv(port, 3, 1, 3000).exchange(None).unwrap_err();
        assert!(err.to_string().contains("world size 3"), "{err}");
        let err0 = server.join().unwrap().unwrap_err();
        assert!(err0.to_string().contains("world size 3"), "{err0}");
    }
}
