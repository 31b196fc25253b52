//! One rank of sharded data-parallel training of the Llama model.
//!
//! Every parameter is sharded on its first dimension ([`ShardLayout`]); the
//! rank keeps the AdamW masters and moments of its rows only. A step:
//!
//! 1. gather the full weights from the masters: block linears under an FP8
//!    recipe as FP8 ([`gather_fp8_weight`], handed to the layer with
//!    `Linear::set_quantized_weight`), everything else in high precision
//!    (f32 or bf16 on the wire, [`Wire`]);
//! 2. forward and backward on this rank's micro-batch;
//! 3. reduce-scatter the gradients, each rank's times its share of the
//!    batch's counted targets (`1/n` where nothing is masked), summed in rank order;
//! 4. the global gradient norm: an all-reduce of the shards' f64 sums of squares;
//! 5. AdamW on the shard, clipped by the global norm;
//! 6. delayed scaling: all-reduce (max) each layer's step amaxes, then roll the histories.
//!
//! Equivalence with one process (tested): N ranks on a global batch of `B`
//! sequences take exactly the step of one process that accumulates gradients
//! over the same N micro-batches of `B/N` (the trainer's `--grad-accum N`):
//! the gradient sums run in the same order (rank order = micro-batch order),
//! and every FP8 quantization sees the same data and the same scale. The one
//! reduction whose order differs is the gradient norm's f64 sum of squares
//! (per shard, then over ranks, instead of one pass over the tensors); it is
//! rounded to f32 before use, so the clip factor agrees unless the two f64
//! sums straddle an f32 rounding boundary (a relative gap of about 1e-16
//! against f32's 6e-8). Against one process that runs the whole batch in
//! *one* forward, results differ by GEMM summation order (and, under FP8, by
//! the activations' per-micro-batch scales).
//!
//! Simplifications of this CPU version: all weights are gathered at the
//! start of the step, not layer by layer before each layer runs, and one
//! collective is issued per parameter (no bucketing).

use crate::comm::{CollectiveKind, CommStats, Communicator, ReduceOp};
use crate::fp8::{fp8_row_alignment, gather_fp8_weight};
use crate::shard::ShardLayout;
use crate::{Error, Result};
use half::bf16;
use octet_fp8::{BackwardMode, Layout, Recipe, Role, Usage};
use octet_nn::Llama;
use octet_tensor::{DType, Tensor};
use octet_train::optim::{AdamW, AdamWConfig, ParamState};
use std::collections::HashMap;
use std::sync::Arc;

/// Element type of a high-precision collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    /// f32: exact for an f32 model; gradient sums bit-identical to gradient accumulation.
    F32,
    /// bf16: half the bytes; values are rounded to bf16 before sending
    /// (reductions sum in f32 and round once).
    Bf16,
}

/// Settings of sharded data parallel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FsdpConfig {
    /// AdamW hyper-parameters; `grad_clip` clips the *global* gradient norm.
    pub adamw: AdamWConfig,
    /// Element type of the gradient reduce-scatter.
    pub grad_wire: Wire,
    /// Element type of the high-precision weight all-gather.
    pub weight_wire: Wire,
    /// Gather the block linears' weights in FP8 under an FP8 recipe (with the
    /// `high_precision` backward the layer needs its high-precision weight, so
    /// this is ignored there).
    pub fp8_gather: bool,
}

impl Default for FsdpConfig {
    fn default() -> Self {
        FsdpConfig {
            adamw: AdamWConfig::default(),
            grad_wire: Wire::F32,
            weight_wire: Wire::F32,
            fp8_gather: true,
        }
    }
}

/// What one step reports (the same on every rank).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepOutput {
    /// Mean loss over the global batch's counted targets (the ranks' means,
    /// each times its share of them, summed in rank order).
    pub loss: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f32,
    /// This rank's traffic during the step.
    pub comm: CommStats,
    /// All-gather bytes spent on the block linears' weights (FP8 or high precision).
    pub block_gather_bytes: u64,
    /// Bytes this rank's forward kept for backward (its rows of the batch).
    pub saved_bytes: usize,
}

/// How one parameter is gathered.
#[derive(Clone, Debug)]
struct Param {
    name: String,
    layout: ShardLayout,
    /// Module name of the block linear this weight belongs to, if it is one.
    linear: Option<String>,
}

/// One rank's view of a sharded model: the model replica whose weights are
/// filled by each step's gather, and AdamW over this rank's shards only.
///
/// Between steps the model's high-precision block weights are stale when they
/// are gathered in FP8: read full weights with [`FsdpRank::full_masters`].
pub struct FsdpRank {
    model: Llama,
    params: Vec<Param>,
    recipe: Option<Recipe>,
    /// AdamW over the owned rows (its own clipping off: the global norm clips).
    opt: AdamW,
    cfg: FsdpConfig,
    dtype: DType,
    rank: usize,
    world: usize,
}

/// FNV-1a over the names, shapes and bit patterns of a model's parameters.
fn fingerprint(model: &Llama) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: &[u8]| {
        for &x in b {
            h = (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3);
        }
    };
    for (name, t) in model.params() {
        eat(name.as_bytes());
        for d in t.shape() {
            eat(&d.to_le_bytes());
        }
        for v in t.to_f32_vec() {
            eat(&v.to_bits().to_le_bytes());
        }
    }
    h
}

impl FsdpRank {
    /// Shard `model` (the same on every rank: built from the same seed or
    /// checkpoint; checked) with fresh optimizer state.
    pub fn new<C: Communicator>(comm: &C, model: Llama, cfg: FsdpConfig) -> Result<FsdpRank> {
        let full: Vec<(String, Tensor)> = model
            .params()
            .into_iter()
            .map(|(n, t)| (n, t.clone()))
            .collect();
        let refs: Vec<(String, &Tensor)> = full.iter().map(|(n, t)| (n.clone(), t)).collect();
        let opt = AdamW::new(&refs, cfg.adamw);
        FsdpRank::from_optimizer(comm, model, &opt, cfg)
    }

    /// Shard `model` and a full (single-process or gathered) optimizer state,
    /// e.g. one loaded from an ordinary checkpoint written by any number of ranks.
    pub fn from_optimizer<C: Communicator>(
        comm: &C,
        mut model: Llama,
        full: &AdamW,
        cfg: FsdpConfig,
    ) -> Result<FsdpRank> {
        let (rank, world) = (comm.rank(), comm.world_size());
        if model.is_lora() {
            return Err(Error::Unsupported(
                "sharded data parallel of a LoRA model (train the adapters with plain data parallel)".into(),
            ));
        }
        // Every rank must start from the same model: compare fingerprints.
        let prints = comm.all_gather(&[fingerprint(&model)])?;
        if let Some(r) = prints.iter().position(|&p| p != prints[0]) {
            return Err(Error::Mismatch(format!(
                "rank {r} holds other initial weights than rank 0; build the model from the same seed or checkpoint on every rank"
            )));
        }
        let dtype = model
            .params()
            .first()
            .map_or(DType::F32, |(_, t)| t.dtype());
        let linears: Vec<(String, Option<Recipe>)> = model
            .linears_mut()
            .into_iter()
            .map(|(n, l)| (n, l.recipe().copied()))
            .collect();
        let recipe = linears.iter().find_map(|(_, r)| *r);
        let fp8 = match recipe {
            Some(r) => cfg.fp8_gather && r.backward() != BackwardMode::HighPrecision,
            None => false,
        };
        let usage = weight_usage(recipe);
        let mut params = Vec::new();
        for (name, t) in model.params() {
            let linear = linears
                .iter()
                .find(|(m, _)| fp8 && format!("{m}.weight") == name)
                .map(|(m, _)| m.clone());
            let align = match (&linear, recipe) {
                (Some(_), Some(r)) => {
                    let scale = delayed_probe(&r);
                    let row = r.spec(Role::Weight, Layout::Rowwise, scale, 0)?;
                    let col = r.spec(Role::Weight, Layout::Colwise, scale, 0)?;
                    fp8_row_alignment(&row, &col, usage)?
                }
                _ => 1,
            };
            params.push(Param {
                name,
                layout: ShardLayout::new(t.shape(), world, align)?,
                linear,
            });
        }
        if full.states.len() != params.len() {
            return Err(Error::Shape(format!(
                "optimizer state for {} tensors, the model has {}",
                full.states.len(),
                params.len()
            )));
        }
        let mut states = Vec::with_capacity(params.len());
        for (p, s) in params.iter().zip(&full.states) {
            if s.name != p.name || s.shape != p.layout.shape {
                return Err(Error::Shape(format!(
                    "optimizer state {} {:?} does not match parameter {} {:?}",
                    s.name, s.shape, p.name, p.layout.shape
                )));
            }
            let own = |v: &[f32]| p.layout.owned(v, rank).map(<[f32]>::to_vec);
            states.push(ParamState {
                name: s.name.clone(),
                shape: p.layout.owned_shape(rank),
                master: own(&s.master)?,
                m: own(&s.m)?,
                v: own(&s.v)?,
                decay: s.decay,
            });
        }
        let opt = AdamW {
            cfg: AdamWConfig {
                grad_clip: 0.0,
                ..cfg.adamw
            },
            states,
            step: full.step,
        };
        Ok(FsdpRank {
            model,
            params,
            recipe,
            opt,
            cfg,
            dtype,
            rank,
            world,
        })
    }

    /// The model replica as the last step left it: block weights gathered in
    /// FP8 are stale in high precision, and the FP8 weights attached to its
    /// linears predate the last update. Use [`FsdpRank::gathered_model`] for a current full model.
    pub fn model(&self) -> &Llama {
        &self.model
    }

    /// The recipe of the block linears, if any.
    pub fn recipe(&self) -> Option<Recipe> {
        self.recipe
    }

    /// Steps taken.
    pub fn step_count(&self) -> u64 {
        self.opt.step
    }

    /// This rank's shard layout of every parameter, in model order.
    pub fn layouts(&self) -> Vec<(String, ShardLayout)> {
        self.params
            .iter()
            .map(|p| (p.name.clone(), p.layout.clone()))
            .collect()
    }

    /// This rank's padded shard of parameter `i`, rounded to the model's dtype.
    fn shard_tensor(&self, i: usize) -> Result<Tensor> {
        let p = &self.params[i];
        let owned = Tensor::from_f32_as(
            &p.layout.owned_shape(self.rank),
            self.opt.states[i].master.clone(),
            self.dtype,
        )?;
        let padded = p.layout.pad(&owned.to_f32_vec(), self.rank, 0.0)?;
        let mut shape = p.layout.shape.clone();
        shape[0] = p.layout.shard_rows;
        Ok(Tensor::from_f32_as(&shape, padded, self.dtype)?)
    }

    /// All-gather parameter `i` in high precision.
    fn gather_hp<C: Communicator>(&self, comm: &C, i: usize) -> Result<Tensor> {
        let layout = &self.params[i].layout;
        let shard = self.shard_tensor(i)?.to_f32_vec();
        let gathered = match self.cfg.weight_wire {
            Wire::F32 => comm.all_gather(&shard)?,
            Wire::Bf16 => {
                let b: Vec<bf16> = shard.iter().map(|&v| bf16::from_f32(v)).collect();
                comm.all_gather(&b)?.iter().map(|v| v.to_f32()).collect()
            }
        };
        Ok(Tensor::from_f32_as(
            &layout.shape,
            layout.unshard(&gathered)?,
            self.dtype,
        )?)
    }

    /// Fill the model with the current weights: FP8 all-gathers for the block
    /// linears (under an FP8 recipe, see [`FsdpConfig::fp8_gather`]), high
    /// precision for the rest. Returns the all-gather bytes spent on block linears.
    pub fn gather_weights<C: Communicator>(&mut self, comm: &C) -> Result<u64> {
        let delayed: HashMap<String, Option<f32>> = self
            .model
            .linears_mut()
            .into_iter()
            .map(|(n, l)| (n, l.delayed_state(Role::Weight).map(|s| s.scale())))
            .collect();
        let is_block =
            |name: &str| name.starts_with("model.layers.") && name.ends_with("_proj.weight");
        let usage = weight_usage(self.recipe);
        let mut hp: Vec<Option<Tensor>> = Vec::with_capacity(self.params.len());
        let mut fp8 = HashMap::new();
        let mut block_bytes = 0;
        for i in 0..self.params.len() {
            let before = comm.stats().bytes(CollectiveKind::AllGather);
            let p = &self.params[i];
            match (&p.linear, self.recipe) {
                (Some(module), Some(r)) => {
                    let scale = delayed.get(module).copied().flatten();
                    let row = r.spec(Role::Weight, Layout::Rowwise, scale, 0)?;
                    let col = r.spec(Role::Weight, Layout::Colwise, scale, 0)?;
                    let shard = self.shard_tensor(i)?;
                    let q = gather_fp8_weight(comm, &p.layout, &shard, &row, &col, usage)?;
                    fp8.insert(module.clone(), Arc::new(q));
                    hp.push(None);
                }
                _ => hp.push(Some(self.gather_hp(comm, i)?)),
            }
            if is_block(&self.params[i].name) {
                block_bytes += comm.stats().bytes(CollectiveKind::AllGather) - before;
            }
        }
        for ((_, t), g) in self.model.params_mut().into_iter().zip(hp) {
            if let Some(g) = g {
                *t = g;
            }
        }
        for (name, l) in self.model.linears_mut() {
            if let Some(q) = fp8.remove(&name) {
                l.set_quantized_weight(Some(q))?;
            }
        }
        Ok(block_bytes)
    }

    /// One training step on this rank's micro-batch `tokens`/`targets` `(b, t)`
    /// (rank `r` takes sequences `[r*b, (r+1)*b)` of the global batch, see
    /// [`local_batch`]) with learning rate `lr`.
    ///
    /// A failure on any rank (bad data, a NaN, a panic) ends the step with an
    /// error on every rank; the shards are then not updated consistently and
    /// the job should stop (resume from the last checkpoint).
    pub fn step<C: Communicator>(
        &mut self,
        comm: &C,
        tokens: &[u32],
        targets: &[u32],
        b: usize,
        t: usize,
        lr: f32,
    ) -> Result<StepOutput> {
        let start = comm.stats();
        let block_gather_bytes = self.gather_weights(comm)?;
        // Stochastic rounding: this rank's share is micro-batch `rank` of
        // `world` in gradient accumulation, whose backward comes after
        // `step * world + rank` others in one process.
        self.model
            .set_grad_round(self.opt.step * self.world as u64 + self.rank as u64);
        let (loss, saved) = self.model.forward(tokens, targets, b, t)?;
        let saved_bytes = saved.bytes();
        let grads = self.model.backward(saved)?;
        // The batch's mean: each rank's mean over its counted targets (not
        // IGNORE), weighted by its share of the batch's (equal shares unless
        // the data masks prompts, unevenly over the ranks).
        let local = targets
            .iter()
            .filter(|&&v| v != octet_nn::loss::IGNORE)
            .count() as u64;
        let mut counted = [local];
        comm.all_reduce(&mut counted, ReduceOp::Sum)?;
        let share = match counted[0] {
            0 => 0.0,
            all => local as f32 / all as f32,
        };
        let mut l = [loss * share as f64];
        comm.all_reduce(&mut l, ReduceOp::Sum)?;
        let loss = l[0];
        if grads.len() != self.params.len() {
            return Err(Error::Shape(format!(
                "{} gradients for {} parameters",
                grads.len(),
                self.params.len()
            )));
        }
        // Reduce-scatter: each rank's gradient times its share (before the
        // sum: the shares differ where the data masks unevenly; 1 / world
        // where nothing is masked), summed in rank order, as gradient
        // accumulation weights its micro-batches.
        let mut shards = Vec::with_capacity(grads.len());
        for (p, (name, g)) in self.params.iter().zip(&grads) {
            if *name != p.name || g.shape() != p.layout.shape.as_slice() {
                return Err(Error::Shape(format!(
                    "gradient {name} {:?} does not match parameter {} {:?}",
                    g.shape(),
                    p.name,
                    p.layout.shape
                )));
            }
            let mut send = p.layout.pad_full(&g.to_f32_vec(), 0.0)?;
            if self.world > 1 {
                send.iter_mut().for_each(|x| *x *= share);
            }
            let mine = match self.cfg.grad_wire {
                Wire::F32 => comm.reduce_scatter(&send, ReduceOp::Sum)?,
                Wire::Bf16 => {
                    let b: Vec<bf16> = send.iter().map(|&v| bf16::from_f32(v)).collect();
                    let r = comm.reduce_scatter(&b, ReduceOp::Sum)?;
                    r.iter().map(|v| v.to_f32()).collect()
                }
            };
            let owned = p.layout.owned_len(self.rank) * p.layout.row_len;
            shards.push(mine[..owned].to_vec());
        }
        // Global norm: the shards' sums of squares, summed over ranks.
        let mut sq = [shards
            .iter()
            .flatten()
            .map(|&g| f64::from(g) * f64::from(g))
            .sum::<f64>()];
        comm.all_reduce(&mut sq, ReduceOp::Sum)?;
        let grad_norm = sq[0].sqrt() as f32;
        if !grad_norm.is_finite() {
            return Err(Error::NonFinite(format!(
                "step {}: global gradient norm is {grad_norm}",
                self.opt.step + 1
            )));
        }
        let clip_to = self.cfg.adamw.grad_clip;
        let clip = if clip_to > 0.0 && grad_norm > clip_to {
            clip_to / grad_norm
        } else {
            1.0
        };
        let named: Vec<(String, Tensor)> = self
            .params
            .iter()
            .zip(shards)
            .map(|(p, mut v)| {
                v.iter_mut().for_each(|x| *x *= clip);
                Ok((
                    p.name.clone(),
                    Tensor::from_f32(&p.layout.owned_shape(self.rank), v)?,
                ))
            })
            .collect::<Result<_>>()?;
        self.opt.step(&named, lr)?;
        self.sync_delayed_scaling(comm)?;
        self.model.update_scales();
        Ok(StepOutput {
            loss,
            grad_norm,
            comm: comm.stats().since(&start),
            block_gather_bytes,
            saved_bytes,
        })
    }

    /// Delayed scaling: every rank's layers must roll the same amax into their
    /// histories (the max over ranks, as one process accumulating all
    /// micro-batches records it), so the next scales agree everywhere.
    fn sync_delayed_scaling<C: Communicator>(&mut self, comm: &C) -> Result<()> {
        let mut pending = Vec::new();
        for (_, l) in self.model.linears_mut() {
            for role in Role::ALL {
                if let Some(s) = l.delayed_state(role) {
                    // The step's pending amax is private; a rolled copy exposes it as its newest entry.
                    let mut probe = s.clone();
                    probe.update();
                    pending.push(probe.history().last().unwrap_or(0.0));
                }
            }
        }
        if pending.is_empty() {
            return Ok(());
        }
        comm.all_reduce(&mut pending, ReduceOp::Max)?;
        let mut it = pending.into_iter();
        for (_, l) in self.model.linears_mut() {
            for role in Role::ALL {
                if let Some(mut s) = l.delayed_state(role).cloned() {
                    s.record(it.next().unwrap_or(0.0));
                    l.set_delayed_state(role, s)?;
                }
            }
        }
        Ok(())
    }

    /// The full f32 masters of every parameter, gathered (on every rank), in model order.
    pub fn full_masters<C: Communicator>(&self, comm: &C) -> Result<Vec<(String, Tensor)>> {
        let full = self.gather_optimizer(comm)?;
        full.states
            .into_iter()
            .map(|s| Ok((s.name, Tensor::from_f32(&s.shape, s.master)?)))
            .collect()
    }

    /// A full copy of the model with the current weights (the masters gathered
    /// and rounded to the model's dtype, no FP8 weight attached), the same on
    /// every rank: what `octet_train::checkpoint::save_model` writes (from rank 0),
    /// or what evaluation and sampling run on.
    pub fn gathered_model<C: Communicator>(&self, comm: &C) -> Result<Llama> {
        let mut m = self.model.clone();
        let weights = self
            .full_masters(comm)?
            .into_iter()
            .map(|(n, t)| (n, t.to_dtype(self.dtype)))
            .collect();
        m.load_params(weights)?;
        for (_, l) in m.linears_mut() {
            l.set_quantized_weight(None)?;
        }
        Ok(m)
    }

    /// The whole optimizer state gathered on every rank (masters, moments,
    /// step, the configured clipping): what one process would hold, ready for
    /// an ordinary checkpoint that any number of ranks can load
    /// ([`FsdpRank::from_optimizer`]).
    pub fn gather_optimizer<C: Communicator>(&self, comm: &C) -> Result<AdamW> {
        let mut states = Vec::with_capacity(self.params.len());
        for (p, s) in self.params.iter().zip(&self.opt.states) {
            let full = |v: &[f32]| -> Result<Vec<f32>> {
                let padded = p.layout.pad(v, self.rank, 0.0)?;
                p.layout.unshard(&comm.all_gather(&padded)?)
            };
            states.push(ParamState {
                name: s.name.clone(),
                shape: p.layout.shape.clone(),
                master: full(&s.master)?,
                m: full(&s.m)?,
                v: full(&s.v)?,
                decay: s.decay,
            });
        }
        Ok(AdamW {
            cfg: self.cfg.adamw,
            states,
            step: self.opt.step,
        })
    }
}

/// The copies a gathered weight needs: row-wise for the forward, column-wise
/// too for the quantized backward's `grad_input`.
fn weight_usage(recipe: Option<Recipe>) -> Usage {
    Usage {
        rowwise: true,
        colwise: recipe.is_some_and(|r| r.backward() == BackwardMode::Quantized),
    }
}

/// A placeholder scale for specs that only decide layouts (delayed scaling needs one).
fn delayed_probe(r: &Recipe) -> Option<f32> {
    matches!(r.scaling(), octet_fp8::Scaling::Delayed { .. }).then_some(1.0)
}

/// Rank `rank`'s micro-batch of a global batch `(b, t)` split over `n` ranks:
/// sequences `[rank * b/n, (rank+1) * b/n)`. Returns inputs, targets and `b/n`.
pub fn local_batch(
    tokens: &[u32],
    targets: &[u32],
    b: usize,
    t: usize,
    rank: usize,
    n: usize,
) -> Result<(Vec<u32>, Vec<u32>, usize)> {
    if n == 0 || !b.is_multiple_of(n) {
        return Err(Error::Config(format!(
            "a global batch of {b} sequences does not split evenly over {n} ranks; use a multiple of {n}"
        )));
    }
    let bt = b.checked_mul(t);
    if bt != Some(tokens.len()) || bt != Some(targets.len()) {
        return Err(Error::Shape(format!(
            "{} tokens and {} targets for a batch of {b} x {t}",
            tokens.len(),
            targets.len()
        )));
    }
    if rank >= n {
        return Err(Error::Config(format!(
            "rank {rank} out of range for {n} ranks"
        )));
    }
    let per = b / n;
    let span = rank * per * t..(rank + 1) * per * t;
    Ok((tokens[span.clone()].to_vec(), targets[span].to_vec(), per))
}

#[cfg(test)]
mod tests;
