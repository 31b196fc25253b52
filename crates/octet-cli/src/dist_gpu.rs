//! `octet train --nproc N` on GPUs: sharded data parallel with one process
//! per GPU and NCCL between them.
//!
//! The command the user runs is the launcher: it starts `N` copies of itself
//! (the same arguments, `OCTET_LOCAL_RANK` set) and watches them. Each copy
//! is a rank: it opens GPU `local rank`, meets the others through
//! [`octet_dist::Rendezvous`] (rank 0 hands out the NCCL unique id), joins the
//! NCCL communicator and trains its shard
//! ([`octet_train::gpu::train_gpu_ranked`]). Across machines, each machine
//! runs the launcher with `--nnodes M --node-rank R --master-addr HOST`.
//!
//! Failure ends the job in bounded time: when a rank exits with an error the
//! launcher stops the others on its machine at once; a rank that finishes
//! no step for `--dist-timeout` seconds (a peer on another machine died and
//! it waits in a collective) exits by its own watchdog.

use crate::train::{bar, summary_table, TrainArgs};
use octet_cuda::nccl::NcclComm;
use octet_cuda::Gpu;
use octet_dist::Rendezvous;
use octet_train::metrics::StepMetrics;
use octet_train::trainer::{Observer, Quiet, TrainConfig};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const LOCAL_RANK: &str = "OCTET_LOCAL_RANK";
const PORT: &str = "OCTET_MASTER_PORT";

/// This process's local rank when the launcher started it.
pub fn local_rank_from_env() -> anyhow::Result<Option<usize>> {
    match std::env::var(LOCAL_RANK) {
        Ok(v) => Ok(Some(v.parse().map_err(|_| {
            anyhow::anyhow!("{LOCAL_RANK}={v}: expected a rank number")
        })?)),
        Err(_) => Ok(None),
    }
}

/// Start one rank per GPU of this machine and wait for them; the first
/// failure stops the others and is the job's error.
pub fn launch(a: &TrainArgs) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let port = match a.master_port {
        Some(p) => p,
        None if a.nnodes > 1 => 29500,
        None => std::net::TcpListener::bind(("127.0.0.1", 0))?
            .local_addr()?
            .port(),
    };
    println!(
        "octet train: {} ranks ({} per machine, machine {} of {}), rendezvous {}:{port}",
        a.nproc * a.nnodes,
        a.nproc,
        a.node_rank,
        a.nnodes,
        a.master_addr
    );
    let mut children: Vec<(usize, Child)> = Vec::with_capacity(a.nproc);
    for local in 0..a.nproc {
        let child = Command::new(&exe)
            .args(&args)
            .env(LOCAL_RANK, local.to_string())
            .env(PORT, port.to_string())
            .spawn();
        match child {
            Ok(c) => children.push((local, c)),
            Err(e) => {
                stop(&mut children);
                anyhow::bail!("could not start rank {local}: {e}");
            }
        }
    }
    let mut done = vec![false; children.len()];
    loop {
        let mut failed = None;
        for (i, (local, c)) in children.iter_mut().enumerate() {
            if done[i] {
                continue;
            }
            if let Some(status) = c.try_wait()? {
                done[i] = true;
                if !status.success() {
                    failed = Some((*local, status));
                    break;
                }
            }
        }
        if let Some((local, status)) = failed {
            stop(&mut children);
            anyhow::bail!(
                "rank {} (GPU {local}) ended with {status}; the other ranks of this machine were stopped",
                a.node_rank * a.nproc + local
            );
        }
        if done.iter().all(|&d| d) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn stop(children: &mut [(usize, Child)]) {
    for (_, c) in children.iter_mut() {
        let _ = c.kill();
    }
    for (_, c) in children.iter_mut() {
        let _ = c.wait();
    }
}

/// An observer that records progress for the watchdog and forwards to another.
struct Beat<'a> {
    inner: &'a mut dyn Observer,
    start: Instant,
    last: Arc<AtomicU64>,
}

impl Observer for Beat<'_> {
    fn step(&mut self, m: &StepMetrics, total: u64) {
        self.last
            .store(self.start.elapsed().as_secs(), Ordering::Relaxed);
        self.inner.step(m, total);
    }
    fn note(&mut self, msg: &str) {
        self.last
            .store(self.start.elapsed().as_secs(), Ordering::Relaxed);
        self.inner.note(msg);
    }
}

/// One rank: GPU, rendezvous, NCCL, training.
pub fn run_rank(cfg: &TrainConfig, a: &TrainArgs, local: usize) -> anyhow::Result<()> {
    let world = a.nproc * a.nnodes;
    let rank = a.node_rank * a.nproc + local;
    anyhow::ensure!(local < a.nproc, "local rank {local} of --nproc {}", a.nproc);
    let port = match a.master_port {
        Some(p) => p,
        None => std::env::var(PORT)
            .ok()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("no --master-port and no {PORT} from the launcher"))?,
    };
    let timeout = Duration::from_secs(a.dist_timeout.max(1));
    let start = Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    {
        let last = last.clone();
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_secs(1));
            let idle = start
                .elapsed()
                .as_secs()
                .saturating_sub(last.load(Ordering::Relaxed));
            if idle > timeout.as_secs() {
                eprintln!(
                    "rank {rank}: no progress for {idle} s (a peer failed, or a collective hangs); ending this rank"
                );
                std::process::exit(3);
            }
        });
    }
    let gpu = Gpu::open(local).map_err(|e| anyhow::anyhow!("rank {rank}: GPU {local}: {e}"))?;
    let rv = Rendezvous {
        master_addr: a.master_addr.clone(),
        master_port: port,
        world,
        rank,
        timeout,
    };
    let id = if rank == 0 {
        rv.exchange(Some(&NcclComm::unique_id()?))?
    } else {
        rv.exchange(None)?
    };
    let comm =
        NcclComm::new(&gpu, rank, world, &id).map_err(|e| anyhow::anyhow!("rank {rank}: {e}"))?;
    last.store(start.elapsed().as_secs(), Ordering::Relaxed);
    let mut quiet = Quiet;
    let mut shown = bar(&format!("train x{world}"));
    let inner: &mut dyn Observer = if rank == 0 { &mut shown } else { &mut quiet };
    let mut obs = Beat {
        inner,
        start,
        last: last.clone(),
    };
    if rank == 0 {
        println!(
            "octet train: sharded over {world} GPUs ({}), recipe {}, global batch {}x{} tokens, {} steps",
            gpu.info()?,
            cfg.recipe,
            cfg.batch,
            cfg.seq,
            cfg.steps
        );
    }
    let s =
        octet_train::gpu::train_gpu_ranked(cfg, a.resume.as_deref(), &mut obs, &gpu, Some(&comm))
            .map_err(|e| anyhow::anyhow!("rank {rank}: {e}"))?;
    drop(obs);
    shown.bar.finish();
    // One line per rank: its own peak memory.
    println!(
        "rank {rank}: peak device memory {:.2} GiB",
        s.peak_device_bytes as f64 / (1u64 << 30) as f64
    );
    if rank == 0 {
        println!("\nsample:\n{}\n", s.sample);
        summary_table(std::slice::from_ref(&s));
        if let Some(n) = s.nccl_per_step {
            println!(
                "NCCL per step (rank 0): all-gather {:.1} MiB in {} calls, reduce-scatter {:.1} MiB in {} calls, all-reduce {} B in {} calls",
                n.all_gather_bytes as f64 / (1u64 << 20) as f64,
                n.all_gather_calls,
                n.reduce_scatter_bytes as f64 / (1u64 << 20) as f64,
                n.reduce_scatter_calls,
                n.all_reduce_bytes,
                n.all_reduce_calls
            );
        }
    }
    Ok(())
}
