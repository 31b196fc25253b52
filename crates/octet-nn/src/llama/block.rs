//! One transformer block: its seven projections (`Linear` or `LoraLinear`),
//! norms, attention and SwiGLU, forward and backward.

use super::*;

/// A block's matrix: a trainable [`Linear`], or a frozen base with an
/// optional LoRA adapter ([`LoraLinear`]).
#[derive(Clone, Debug)]
pub enum Proj {
    /// Full training.
    Full(Linear),
    /// Frozen base (FP8 or bf16) with an optional adapter.
    Lora(LoraLinear),
}

/// What a [`Proj`] keeps for backward.
#[derive(Clone, Debug)]
pub enum ProjSaved {
    /// Of a [`Linear`].
    Full(LinearSaved),
    /// Of a [`LoraLinear`].
    Lora(LoraSaved),
}

impl ProjSaved {
    pub(super) fn bytes(&self) -> usize {
        match self {
            ProjSaved::Full(s) => s.bytes(),
            ProjSaved::Lora(s) => s.bytes(),
        }
    }
}

/// A [`Proj`]'s gradients: the input's, and its trainable tensors' in
/// parameter order (`[weight]`, `[weight, bias]` or `[lora_A, lora_B]`;
/// none when frozen).
pub(super) struct ProjGrads {
    pub(super) d_input: Option<Tensor>,
    pub(super) params: Vec<Tensor>,
}

impl Proj {
    /// Forward; `dropout` masks a LoRA adapter's input (ignored by a full layer).
    pub(super) fn forward(
        &mut self,
        x: &Tensor,
        input_requires_grad: bool,
        dropout: Option<Dropout>,
    ) -> Result<(Tensor, ProjSaved)> {
        Ok(match self {
            Proj::Full(l) => {
                let (y, s) = l.forward(x, input_requires_grad)?;
                (y, ProjSaved::Full(s))
            }
            Proj::Lora(l) => {
                let (y, s) = l.forward_with(x, input_requires_grad, dropout)?;
                (y, ProjSaved::Lora(s))
            }
        })
    }

    pub(super) fn backward(&mut self, saved: ProjSaved, dy: &Tensor) -> Result<ProjGrads> {
        match (self, saved) {
            (Proj::Full(l), ProjSaved::Full(s)) => {
                let g = l.backward(s, dy)?;
                Ok(ProjGrads {
                    d_input: g.d_input,
                    params: g.d_weight.into_iter().chain(g.d_bias).collect(),
                })
            }
            (Proj::Lora(l), ProjSaved::Lora(s)) => {
                let g = l.backward(s, dy)?;
                Ok(ProjGrads {
                    d_input: g.d_input,
                    params: g.d_a.into_iter().chain(g.d_b).collect(),
                })
            }
            _ => Err(Error::Shape("saved state of another kind of layer".into())),
        }
    }

    pub(super) fn set_grad_calls(&mut self, n: u64) {
        match self {
            Proj::Full(l) => l.set_grad_calls(n),
            Proj::Lora(l) => l.set_grad_calls(n),
        }
    }

    /// The trainable tensors of a full layer in parameter order: the weight,
    /// then the bias if it has one (none for a LoRA layer, whose base and
    /// bias are frozen).
    pub(super) fn tensors(&self) -> Vec<&Tensor> {
        match self {
            Proj::Full(l) => std::iter::once(&l.weight).chain(&l.bias).collect(),
            Proj::Lora(_) => Vec::new(),
        }
    }

    pub(super) fn tensors_mut(&mut self) -> Vec<&mut Tensor> {
        match self {
            Proj::Full(l) => std::iter::once(&mut l.weight)
                .chain(l.bias.as_mut())
                .collect(),
            Proj::Lora(_) => Vec::new(),
        }
    }

    /// The weight as a dense f32 matrix (a LoRA layer's merged with its
    /// adapter) and the bias.
    pub(super) fn dense(&self) -> Result<(Tensor, Option<Tensor>)> {
        Ok(match self {
            Proj::Full(l) => (l.weight.try_clone()?, try_clone_opt(&l.bias)?),
            Proj::Lora(l) => (l.merged()?, try_clone_opt(&l.bias)?),
        })
    }

    /// The trainable [`Linear`], if this is one.
    pub fn linear(&self) -> Option<&Linear> {
        match self {
            Proj::Full(l) => Some(l),
            Proj::Lora(_) => None,
        }
    }

    pub(super) fn linear_mut(&mut self) -> Option<&mut Linear> {
        match self {
            Proj::Full(l) => Some(l),
            Proj::Lora(_) => None,
        }
    }
}

/// Short names of a block's projections, in order, with their Hugging Face module paths.
pub const PROJ_NAMES: [(&str, &str); 7] = [
    ("q", "self_attn.q_proj"),
    ("k", "self_attn.k_proj"),
    ("v", "self_attn.v_proj"),
    ("o", "self_attn.o_proj"),
    ("gate", "mlp.gate_proj"),
    ("up", "mlp.up_proj"),
    ("down", "mlp.down_proj"),
];

/// One decoder block.
#[derive(Clone, Debug)]
pub struct Block {
    pub(super) attn_norm: RmsNorm,
    pub(super) q: Proj,
    pub(super) k: Proj,
    pub(super) v: Proj,
    pub(super) o: Proj,
    /// Per-head norms of q and k, width `D` (`qk_norm`: Qwen3).
    pub(super) q_norm: Option<RmsNorm>,
    pub(super) k_norm: Option<RmsNorm>,
    pub(super) mlp_norm: RmsNorm,
    pub(super) gate: Proj,
    pub(super) up: Proj,
    pub(super) down: Proj,
}

impl Block {
    /// Every tensor under full training, in [`block_param_shapes`] order.
    pub(super) fn tensors(&self) -> Vec<&Tensor> {
        let mut out = vec![&self.attn_norm.weight];
        for p in [&self.q, &self.k, &self.v, &self.o] {
            out.extend(p.tensors());
        }
        out.extend(self.q_norm.iter().chain(&self.k_norm).map(|n| &n.weight));
        out.push(&self.mlp_norm.weight);
        for p in [&self.gate, &self.up, &self.down] {
            out.extend(p.tensors());
        }
        out
    }

    pub(super) fn tensors_mut(&mut self) -> Vec<&mut Tensor> {
        let Block {
            attn_norm,
            q,
            k,
            v,
            o,
            q_norm,
            k_norm,
            mlp_norm,
            gate,
            up,
            down,
        } = self;
        let mut out = vec![&mut attn_norm.weight];
        for p in [q, k, v, o] {
            out.extend(p.tensors_mut());
        }
        out.extend(
            q_norm
                .iter_mut()
                .chain(k_norm.iter_mut())
                .map(|n| &mut n.weight),
        );
        out.push(&mut mlp_norm.weight);
        for p in [gate, up, down] {
            out.extend(p.tensors_mut());
        }
        out
    }

    /// Every tensor in [`block_param_shapes`] order, each LoRA matrix merged
    /// with its adapter (f32).
    pub(super) fn dense(&self) -> Result<Vec<Tensor>> {
        let mut out = vec![self.attn_norm.weight.try_clone()?];
        let proj = |out: &mut Vec<Tensor>, p: &Proj| -> Result<()> {
            let (w, b) = p.dense()?;
            out.push(w);
            out.extend(b);
            Ok(())
        };
        for p in [&self.q, &self.k, &self.v, &self.o] {
            proj(&mut out, p)?;
        }
        for n in self.q_norm.iter().chain(&self.k_norm) {
            out.push(n.weight.try_clone()?);
        }
        out.push(self.mlp_norm.weight.try_clone()?);
        for p in [&self.gate, &self.up, &self.down] {
            proj(&mut out, p)?;
        }
        Ok(out)
    }

    pub(super) fn projs(&self) -> [&Proj; 7] {
        [
            &self.q, &self.k, &self.v, &self.o, &self.gate, &self.up, &self.down,
        ]
    }

    pub(super) fn projs_mut(&mut self) -> [&mut Proj; 7] {
        [
            &mut self.q,
            &mut self.k,
            &mut self.v,
            &mut self.o,
            &mut self.gate,
            &mut self.up,
            &mut self.down,
        ]
    }
}

/// What a block's backward reads.
#[derive(Clone, Debug)]
pub struct BlockSaved {
    /// `(B, T, Hq, D)` of the attention output.
    pub(super) attn_shape: [usize; 4],
    pub(super) attn_norm: RmsNormSaved,
    pub(super) q: ProjSaved,
    pub(super) k: ProjSaved,
    pub(super) v: ProjSaved,
    /// Of the per-head q and k norms (`qk_norm`).
    pub(super) q_norm: Option<RmsNormSaved>,
    pub(super) k_norm: Option<RmsNormSaved>,
    pub(super) attn: AttentionSaved,
    pub(super) o: ProjSaved,
    pub(super) mlp_norm: RmsNormSaved,
    pub(super) gate: ProjSaved,
    pub(super) up: ProjSaved,
    pub(super) swiglu: SwigluSaved,
    pub(super) down: ProjSaved,
}

impl BlockSaved {
    /// Bytes kept for backward.
    pub fn bytes(&self) -> usize {
        self.attn_norm.bytes()
            + self.q.bytes()
            + self.k.bytes()
            + self.v.bytes()
            + self.q_norm.as_ref().map_or(0, RmsNormSaved::bytes)
            + self.k_norm.as_ref().map_or(0, RmsNormSaved::bytes)
            + self.attn.bytes()
            + self.o.bytes()
            + self.mlp_norm.bytes()
            + self.gate.bytes()
            + self.up.bytes()
            + self.swiglu.bytes()
            + self.down.bytes()
    }
}

pub(super) fn need(t: Option<Tensor>, what: &str) -> Result<Tensor> {
    t.ok_or_else(|| Error::Shape(format!("missing gradient: {what}")))
}

/// The LoRA dropout of one block in one training forward.
#[derive(Clone, Copy)]
pub(super) struct BlockDropout {
    pub(super) p: f64,
    pub(super) seed: u64,
    pub(super) round: u64,
    pub(super) block: usize,
}

impl BlockDropout {
    /// Block `block`'s dropout in training forward `round`, where the model
    /// has dropout `(p, seed)`.
    pub(super) fn new(
        dropout: Option<(f64, u64)>,
        round: u64,
        block: usize,
    ) -> Option<BlockDropout> {
        dropout.map(|(p, seed)| BlockDropout {
            p,
            seed,
            round,
            block,
        })
    }

    /// The mask of projection `proj`'s input (index into [`PROJ_NAMES`]).
    pub(super) fn of(this: Option<BlockDropout>, proj: usize) -> Result<Option<Dropout>> {
        this.map(|d| Dropout::for_projection(d.p, (d.seed, d.round), d.block, proj))
            .transpose()
    }
}

/// `x (B*T, C) -> (B*T, C)` through one block (`drop`: its LoRA dropout,
/// in training forwards).
pub(super) fn block_forward(
    blk: &mut Block,
    rope: &Rope,
    x: &Tensor,
    (b, t): (usize, usize),
    cfg: &LlamaConfig,
    drop: Option<BlockDropout>,
) -> Result<(Tensor, BlockSaved)> {
    let dr = |proj: usize| BlockDropout::of(drop, proj);
    let (hq, hkv, d) = (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim(),
    );
    let (h, attn_norm) = blk.attn_norm.forward(x)?; // (B*T, C)
    let (q, sq) = blk.q.forward(&h, true, dr(0)?)?; // (B*T, Hq*D)
    let (k, sk) = blk.k.forward(&h, true, dr(1)?)?; // (B*T, Hkv*D)
    let (v, sv) = blk.v.forward(&h, true, dr(2)?)?; // (B*T, Hkv*D)
    let (q, q_norm) = head_norm(blk.q_norm.as_ref(), q)?; // (B*T, Hq*D)
    let (k, k_norm) = head_norm(blk.k_norm.as_ref(), k)?; // (B*T, Hkv*D)
    let q = rope.forward(&q.reshape(&[b, t, hq, d])?)?; // (B, T, Hq, D)
    let k = rope.forward(&k.reshape(&[b, t, hkv, d])?)?; // (B, T, Hkv, D)
    let v = v.reshape(&[b, t, hkv, d])?;
    let (a, attn) = attention_forward(&q, &k, &v)?; // (B, T, Hq, D)
    let (o, so) = blk.o.forward(&a.reshape(&[b * t, hq * d])?, true, dr(3)?)?; // (B*T, C)
    let x1 = cpu::add(x, &o)?;
    let (h2, mlp_norm) = blk.mlp_norm.forward(&x1)?;
    let (g, sg) = blk.gate.forward(&h2, true, dr(4)?)?; // (B*T, F)
    let (u, su) = blk.up.forward(&h2, true, dr(5)?)?; // (B*T, F)
    let (act, swiglu) = swiglu_forward(&g, &u)?; // (B*T, F)
    let (dn, sd) = blk.down.forward(&act, true, dr(6)?)?; // (B*T, C)
    let x2 = cpu::add(&x1, &dn)?;
    let attn_shape = [b, t, hq, d];
    let saved = BlockSaved {
        attn_shape,
        attn_norm,
        q: sq,
        k: sk,
        v: sv,
        q_norm,
        k_norm,
        attn,
        o: so,
        mlp_norm,
        gate: sg,
        up: su,
        swiglu,
        down: sd,
    };
    Ok((x2, saved))
}

/// Backward of one block from `dx2 (B*T, C)`: the input gradient and the
/// trainable tensors' gradients in [`Llama::params`] order.
pub(super) fn block_backward(
    blk: &mut Block,
    rope: &Rope,
    s: BlockSaved,
    dx2: &Tensor,
    lora: bool,
) -> Result<(Tensor, Vec<Tensor>)> {
    let bt = dx2.shape()[0];
    let down = blk.down.backward(s.down, dx2)?;
    let (dg, du) = swiglu_backward(s.swiglu, &need(down.d_input, "down input")?)?;
    let gate = blk.gate.backward(s.gate, &dg)?;
    let up = blk.up.backward(s.up, &du)?;
    let dh2 = cpu::add(
        &need(gate.d_input, "gate input")?,
        &need(up.d_input, "up input")?,
    )?;
    let (dx1_norm, d_mlp_norm) = blk.mlp_norm.backward(s.mlp_norm, &dh2)?;
    let dx1 = cpu::add(dx2, &dx1_norm)?;
    let o = blk.o.backward(s.o, &dx1)?;
    let da = need(o.d_input, "o input")?.reshape(&s.attn_shape)?; // (B, T, Hq, D)
    let (dq, dk, dv) = attention_backward(s.attn, &da)?;
    let (dq, d_q_norm) = head_norm_backward(blk.q_norm.as_ref(), s.q_norm, rope.backward(&dq)?)?;
    let (dk, d_k_norm) = head_norm_backward(blk.k_norm.as_ref(), s.k_norm, rope.backward(&dk)?)?;
    let flat = |t: Tensor| -> Result<Tensor> {
        let n = t.numel() / bt;
        Ok(t.reshape(&[bt, n])?)
    };
    let q = blk.q.backward(s.q, &flat(dq)?)?;
    let k = blk.k.backward(s.k, &flat(dk)?)?;
    let v = blk.v.backward(s.v, &flat(dv)?)?;
    let dh = cpu::add(
        &cpu::add(&need(q.d_input, "q input")?, &need(k.d_input, "k input")?)?,
        &need(v.d_input, "v input")?,
    )?;
    let (dx_norm, d_attn_norm) = blk.attn_norm.backward(s.attn_norm, &dh)?;
    let dx = cpu::add(&dx1, &dx_norm)?;
    // Trainable tensors' gradients in parameter order: full training has the
    // norm gains and one weight per projection; LoRA only the adapters.
    let mut grads = Vec::new();
    if !lora {
        grads.push(d_attn_norm);
    }
    for g in [q.params, k.params, v.params, o.params] {
        grads.extend(g);
    }
    if !lora {
        grads.extend(d_q_norm.into_iter().chain(d_k_norm));
        grads.push(d_mlp_norm);
    }
    for g in [gate.params, up.params, down.params] {
        grads.extend(g);
    }
    Ok((dx, grads))
}

/// Qwen3's per-head RMSNorm: `x (B*T, H*D)` with each head's `D` values
/// normalised by `norm` (width `D`), or `x` as it is without one.
pub(super) fn head_norm(
    norm: Option<&RmsNorm>,
    x: Tensor,
) -> Result<(Tensor, Option<RmsNormSaved>)> {
    let Some(n) = norm else {
        return Ok((x, None));
    };
    let shape = x.shape().to_vec();
    let d = n.weight.numel();
    let (y, saved) = n.forward(&x.reshape(&[shape.iter().product::<usize>() / d, d])?)?; // (B*T*H, D)
    Ok((y.reshape(&shape)?, Some(saved)))
}

/// Backward of [`head_norm`] from `dy` (any shape of `B*T*H*D` values): the
/// input gradient in `dy`'s shape and the norm's weight gradient `(D)`.
pub(super) fn head_norm_backward(
    norm: Option<&RmsNorm>,
    saved: Option<RmsNormSaved>,
    dy: Tensor,
) -> Result<(Tensor, Option<Tensor>)> {
    match (norm, saved) {
        (None, None) => Ok((dy, None)),
        (Some(n), Some(s)) => {
            let shape = dy.shape().to_vec();
            let d = n.weight.numel();
            let (dx, dw) =
                n.backward(s, &dy.reshape(&[shape.iter().product::<usize>() / d, d])?)?;
            Ok((dx.reshape(&shape)?, Some(dw)))
        }
        _ => Err(Error::Shape(
            "saved state of a per-head norm the block does not have".into(),
        )),
    }
}
