//! The quantized linear layer: `y = x W^T + b`, with a choice of backward.
//!
//! Shapes: `x: (M, K)` (leading dims flattened), `W: (N, K)`, `b: (N)`,
//! `y: (M, N)`. The three GEMMs, named as in torchao:
//!
//! - `output      = input @ weight_t`         (reduction over K)
//! - `grad_input  = grad_output @ weight`     (reduction over N)
//! - `grad_weight = grad_output_t @ input`    (reduction over M)
//!
//! What [`LinearSaved`] keeps, per backward mode (nothing for `grad_weight`
//! when the weight is frozen, nothing for `grad_input` when the input needs no
//! gradient):
//!
//! | mode | for grad_weight | for grad_input |
//! |---|---|---|
//! | none (high-precision layer) | `x` | nothing: reads the layer's `W` |
//! | `quantized` | `x` column-wise FP8 | `W` column-wise FP8 |
//! | `high_precision` | `x` | nothing: reads the layer's `W` |
//! | `dequantized` | `x` row-wise FP8 (the forward's copy) | `W` row-wise FP8 (the forward's copy) |

pub mod cuda;

use crate::{Error, Result};
use octet_fp8::{
    BackwardMode, DelayedState, Layout, QuantizedTensor, Recipe, Role, Telemetry, Usage,
};
use octet_tensor::{cpu, DType, Tensor};
use std::sync::Arc;

/// Delayed-scaling state of the three roles (present only under delayed scaling).
#[derive(Clone, Debug, Default)]
struct ScaleStates {
    input: Option<DelayedState>,
    weight: Option<DelayedState>,
    grad_output: Option<DelayedState>,
    /// Telemetry of the last quantization of each role (input, weight, grad_output).
    telemetry: [Option<Telemetry>; 3],
    /// Forwards leave the histories and the telemetry as they are (an
    /// evaluation: see [`Linear::set_recording`]).
    paused: bool,
}

impl ScaleStates {
    fn get(&mut self, role: Role) -> &mut Option<DelayedState> {
        match role {
            Role::Input => &mut self.input,
            Role::Weight => &mut self.weight,
            Role::GradOutput => &mut self.grad_output,
        }
    }
}

/// A linear layer whose GEMMs run in FP8 under a [`Recipe`], or in high precision without one.
#[derive(Clone, Debug)]
pub struct Linear {
    /// Weight `(N, K)`.
    pub weight: Tensor,
    /// Optional bias `(N)`.
    pub bias: Option<Tensor>,
    /// Whether the weight (and bias) receive gradients.
    pub trainable: bool,
    recipe: Option<Recipe>,
    states: ScaleStates,
    /// Gradient quantizations so far: the salt of stochastic rounding
    /// (forwards do not count, so a recomputed forward leaves the salts of
    /// the backward as they were).
    grad_calls: u64,
    /// A weight quantized elsewhere (an FP8 all-gather, a frozen FP8 store),
    /// used by forward instead of quantizing `weight`.
    quantized_weight: Option<Arc<QuantizedTensor>>,
}

/// What [`Linear::forward`] keeps for [`Linear::backward`]: exactly the fields backward reads.
#[derive(Clone, Debug)]
pub struct LinearSaved {
    /// Rows `M` and input features `K` of the forward input, and its dtype.
    m: usize,
    k: usize,
    dtype: DType,
    /// High-precision input (high-precision layer or `high_precision` mode).
    input: Option<Tensor>,
    /// FP8 input: column-wise (`quantized`) or row-wise (`dequantized`).
    input_q: Option<QuantizedTensor>,
    /// FP8 weight: column-wise (`quantized`) or row-wise (`dequantized`).
    weight_q: Option<Arc<QuantizedTensor>>,
    /// Whether the input asked for a gradient.
    input_requires_grad: bool,
}

impl LinearSaved {
    /// Exact bytes this struct keeps alive (tensor data, FP8 codes and scales).
    pub fn bytes(&self) -> usize {
        self.input.as_ref().map_or(0, Tensor::bytes)
            + self.input_q.as_ref().map_or(0, QuantizedTensor::bytes)
            + self.weight_q.as_ref().map_or(0, |w| w.bytes())
    }
}

/// Gradients from [`Linear::backward`].
#[derive(Clone, Debug)]
pub struct LinearGrads {
    /// `d_input (M, K)` in the input's dtype, if the input asked for it.
    pub d_input: Option<Tensor>,
    /// `d_weight (N, K)` in f32, if the layer is trainable.
    pub d_weight: Option<Tensor>,
    /// `d_bias (N)` in f32, if the layer is trainable and has a bias.
    pub d_bias: Option<Tensor>,
}

impl Linear {
    /// A layer from a weight `(N, K)` and an optional bias `(N)`; `recipe: None` is the high-precision layer.
    pub fn new(
        weight: Tensor,
        bias: Option<Tensor>,
        recipe: Option<Recipe>,
        trainable: bool,
    ) -> Result<Linear> {
        let (n, _) = weight.dims2()?;
        if weight.shape().len() != 2 {
            return Err(Error::Shape(format!(
                "weight must be (N, K), got {:?}",
                weight.shape()
            )));
        }
        if let Some(b) = &bias {
            if b.shape() != [n] {
                return Err(Error::Shape(format!(
                    "bias must be ({n}), got {:?}",
                    b.shape()
                )));
            }
        }
        let mut states = ScaleStates::default();
        if let Some(r) = &recipe {
            for role in Role::ALL {
                *states.get(role) = DelayedState::for_role(r, role);
            }
        }
        Ok(Linear {
            weight,
            bias,
            trainable,
            recipe,
            states,
            grad_calls: 0,
            quantized_weight: None,
        })
    }

    /// Gradient quantizations so far: the count that salts the stochastic
    /// rounding of `grad_output` (each quantized backward counts one up,
    /// then rounds with the new count as its salt).
    pub fn grad_calls(&self) -> u64 {
        self.grad_calls
    }

    /// Set the count of gradient quantizations so far, so that the next
    /// backward rounds `grad_output` with the salt `n + 1`. Sharded data
    /// parallel sets it to the index of the micro-batch that gradient
    /// accumulation in one process would give this rank's share, so that the
    /// ranks round with the random bits of those micro-batches rather than
    /// all with the same ones.
    pub fn set_grad_calls(&mut self, n: u64) {
        self.grad_calls = n;
    }

    /// The recipe, if any.
    pub fn recipe(&self) -> Option<&Recipe> {
        self.recipe.as_ref()
    }

    /// Input features `K`.
    pub fn in_features(&self) -> usize {
        self.weight.shape()[1]
    }

    /// Output features `N`.
    pub fn out_features(&self) -> usize {
        self.weight.shape()[0]
    }

    /// The delayed-scaling state of `role`, if the recipe is delayed.
    pub fn delayed_state(&self, role: Role) -> Option<&DelayedState> {
        match role {
            Role::Input => self.states.input.as_ref(),
            Role::Weight => self.states.weight.as_ref(),
            Role::GradOutput => self.states.grad_output.as_ref(),
        }
    }

    /// Replace the delayed-scaling state of `role` (restoring a checkpoint); an
    /// error if the layer's recipe is not delayed, or if `state` was made for
    /// another history length, algorithm, margin or format than the role's.
    pub fn set_delayed_state(&mut self, role: Role, state: DelayedState) -> Result<()> {
        match self.states.get(role) {
            Some(s) if s.config() != state.config() => Err(Error::Shape(format!(
                "a delayed-scaling state for {:?} does not fit {role:?}, which has {:?}",
                state.config(),
                s.config()
            ))),
            Some(s) => {
                *s = state;
                Ok(())
            }
            None => Err(Error::Shape(format!(
                "this layer has no delayed-scaling state for {role:?}"
            ))),
        }
    }

    /// Amax, saturated and underflowed shares of the last quantization of `role` (FP8 recipes only).
    pub fn telemetry(&self, role: Role) -> Option<Telemetry> {
        self.states.telemetry[role as usize]
    }

    /// Whether forwards record what they quantize: the amax into the
    /// delayed-scaling history and the telemetry (on by default).
    /// [`crate::llama::Llama::logits`] turns it off while it evaluates, so
    /// that validation batches do not set the scales of the training steps
    /// that follow. Backward always records its gradients.
    pub fn set_recording(&mut self, on: bool) {
        self.states.paused = !on;
    }

    /// End of an optimizer step: roll the delayed-scaling histories into new scales (no-op otherwise).
    pub fn update_scales(&mut self) {
        for role in Role::ALL {
            if let Some(s) = self.states.get(role) {
                s.update();
            }
        }
    }

    /// Use `q` as the quantized weight of the following forwards instead of
    /// quantizing [`Linear::weight`]: the weight gathered in FP8 by sharded
    /// data parallel, which is exactly what this layer would have made from the
    /// whole weight. It must be `(N, K)` with a row-wise copy, and a column-wise
    /// one if the quantized backward needs the input gradient. Its amax feeds
    /// the delayed-scaling history as a locally made one would. `None` returns
    /// to quantizing `weight`. Refused under the `high_precision` backward,
    /// whose input gradient reads `weight` itself, not the FP8 weight the
    /// forward used.
    pub fn set_quantized_weight(&mut self, q: Option<Arc<QuantizedTensor>>) -> Result<()> {
        if let Some(q) = &q {
            match self.recipe.map(|r| r.backward()) {
                None => {
                    return Err(Error::Shape(
                        "a quantized weight needs an FP8 recipe on the layer".into(),
                    ))
                }
                Some(BackwardMode::HighPrecision) => {
                    return Err(Error::Shape(
                        "a quantized weight needs a quantized or dequantized backward: the high_precision backward reads the layer's own weight".into(),
                    ))
                }
                Some(_) => {}
            }
            if (q.rows, q.cols) != (self.out_features(), self.in_features()) {
                return Err(Error::Shape(format!(
                    "quantized weight is ({}, {}), the layer is ({}, {})",
                    q.rows,
                    q.cols,
                    self.out_features(),
                    self.in_features()
                )));
            }
            q.get(Layout::Rowwise)?;
        }
        self.quantized_weight = q;
        Ok(())
    }

    /// The weight set by [`Linear::set_quantized_weight`], if any.
    pub fn quantized_weight(&self) -> Option<&Arc<QuantizedTensor>> {
        self.quantized_weight.as_ref()
    }

    /// Forward: `y (M, N) = x (M, K) @ W^T + b`, in `x`'s dtype.
    ///
    /// `input_requires_grad` says whether backward must produce `d_input`;
    /// together with [`Linear::trainable`] it decides what is saved.
    pub fn forward(
        &mut self,
        x: &Tensor,
        input_requires_grad: bool,
    ) -> Result<(Tensor, LinearSaved)> {
        let (m, k) = x.dims2()?;
        if k != self.in_features() {
            return Err(Error::Shape(format!(
                "input has {k} features, the layer expects {}",
                self.in_features()
            )));
        }
        if m == 0 {
            return Err(Error::Shape("empty input: M = 0".into()));
        }
        let n = self.out_features();
        // Accumulation dtype: f64 for the f64 reference, f32 otherwise.
        let acc = if x.dtype() == DType::F64 {
            DType::F64
        } else {
            DType::F32
        };
        let need_w = self.trainable; // grad_weight reads the input
        let mut saved = LinearSaved {
            m,
            k,
            dtype: x.dtype(),
            input: None,
            input_q: None,
            weight_q: None,
            input_requires_grad,
        };
        let y = match self.recipe {
            None => {
                saved.input = need_w.then(|| x.try_clone()).transpose()?;
                cpu::matmul(x, false, &self.weight, true, acc)?
            }
            Some(recipe) => {
                let mode = recipe.backward();
                let quantized = mode == BackwardMode::Quantized;
                // The forward needs row-wise copies; the quantized backward also column-wise ones.
                let x_usage = Usage {
                    rowwise: true,
                    colwise: quantized && need_w,
                };
                let w_usage = Usage {
                    rowwise: true,
                    colwise: quantized && input_requires_grad,
                };
                let (states, calls) = (&mut self.states, &mut self.grad_calls);
                let qx = quantize_role(states, calls, recipe, Role::Input, x, x_usage)?;
                let (qw, external) = match &self.quantized_weight {
                    Some(q) => {
                        if w_usage.colwise && q.colwise.is_none() {
                            return Err(Error::Shape(
                                "the quantized weight lacks the column-wise copy the quantized backward needs".into(),
                            ));
                        }
                        if !states.paused {
                            if let Some(s) = states.get(Role::Weight) {
                                s.record(q.amax);
                            }
                            states.telemetry[Role::Weight as usize] = Some(q.telemetry());
                        }
                        (q.clone(), true)
                    }
                    None => {
                        let q = quantize_role(
                            states,
                            calls,
                            recipe,
                            Role::Weight,
                            &self.weight,
                            w_usage,
                        )?;
                        (Arc::new(q), false)
                    }
                };
                let y = cpu::fp8_gemm(qx.get(Layout::Rowwise)?, qw.get(Layout::Rowwise)?)?;
                let y = Tensor::from_f32(&[m, n], y)?;
                // An external weight is shared, not copied: saved keeps a reference.
                let keep_w = |usage: Usage| match external {
                    true => qw,
                    false => match Arc::try_unwrap(qw) {
                        Ok(q) => Arc::new(q.retain(usage)),
                        Err(shared) => shared,
                    },
                };
                match mode {
                    BackwardMode::Quantized => {
                        saved.input_q = need_w.then(|| qx.retain(Usage::COL));
                        saved.weight_q = input_requires_grad.then(|| keep_w(Usage::COL));
                    }
                    BackwardMode::HighPrecision => {
                        saved.input = need_w.then(|| x.try_clone()).transpose()?
                    }
                    BackwardMode::Dequantized => {
                        saved.input_q = need_w.then(|| qx.retain(Usage::ROW));
                        saved.weight_q = input_requires_grad.then(|| keep_w(Usage::ROW));
                    }
                }
                y
            }
        };
        // The bias is added at accumulation precision, then the output rounds once to x's dtype.
        let y = match &self.bias {
            Some(b) => cpu::add_bias(&y, b)?,
            None => y,
        };
        Ok((y.into_dtype(x.dtype())?, saved))
    }

    /// Backward from `dy (M, N)`: `d_input = dy @ W`, `d_weight = dy^T @ x`, `d_bias = sum_rows(dy)`.
    pub fn backward(&mut self, saved: LinearSaved, dy: &Tensor) -> Result<LinearGrads> {
        let (m, n, k) = (saved.m, self.out_features(), saved.k);
        if k != self.in_features() {
            return Err(Error::Shape(format!(
                "the saved state is of an input with {k} features; this layer takes {}",
                self.in_features()
            )));
        }
        if dy.dims2()? != (m, n) {
            return Err(Error::Shape(format!(
                "grad_output is {:?}, expected ({m}, {n})",
                dy.shape()
            )));
        }
        let want_dx = saved.input_requires_grad;
        let want_dw = self.trainable;
        let d_bias = match (&self.bias, want_dw) {
            (Some(_), true) => Some(cpu::sum_rows(dy)?),
            _ => None,
        };
        // Gradients accumulate in f32 (f64 for the f64 reference); d_input returns in x's dtype.
        let acc = if saved.dtype == DType::F64 {
            DType::F64
        } else {
            DType::F32
        };
        let f32_tensor = |rows: usize, cols: usize, v: Vec<f32>| Tensor::from_f32(&[rows, cols], v);
        let mode = self.recipe.map(|r| r.backward());
        let (dx, dw) = match (self.recipe, mode) {
            (Some(recipe), Some(BackwardMode::Quantized)) if want_dx || want_dw => {
                let usage = Usage {
                    rowwise: want_dx,
                    colwise: want_dw,
                };
                let (states, calls) = (&mut self.states, &mut self.grad_calls);
                let qdy = quantize_role(states, calls, recipe, Role::GradOutput, dy, usage)?;
                // grad_input = grad_output @ weight; grad_weight = grad_output_t @ input.
                let dx = match &saved.weight_q {
                    Some(qw) if want_dx => {
                        let v = cpu::fp8_gemm(qdy.get(Layout::Rowwise)?, qw.get(Layout::Colwise)?)?;
                        Some(f32_tensor(m, k, v)?)
                    }
                    _ => None,
                };
                let dw = match &saved.input_q {
                    Some(qx) if want_dw => {
                        let v = cpu::fp8_gemm(qdy.get(Layout::Colwise)?, qx.get(Layout::Colwise)?)?;
                        Some(f32_tensor(n, k, v)?)
                    }
                    _ => None,
                };
                (dx, dw)
            }
            (_, Some(BackwardMode::Dequantized)) => {
                let dx = match &saved.weight_q {
                    Some(qw) if want_dx => {
                        let w = f32_tensor(n, k, qw.dequantize()?)?;
                        Some(cpu::matmul(dy, false, &w, false, acc)?)
                    }
                    _ => None,
                };
                let dw = match &saved.input_q {
                    Some(qx) if want_dw => {
                        let x = f32_tensor(m, k, qx.dequantize()?)?;
                        Some(cpu::matmul(dy, true, &x, false, acc)?)
                    }
                    _ => None,
                };
                (dx, dw)
            }
            (Some(_), Some(BackwardMode::Quantized)) => (None, None),
            // High-precision layer or high_precision mode: the unquantized input and the layer's weight.
            _ => {
                let dx = match want_dx {
                    true => Some(cpu::matmul(dy, false, &self.weight, false, acc)?),
                    false => None,
                };
                let dw = match &saved.input {
                    Some(x) if want_dw => Some(cpu::matmul(dy, true, x, false, acc)?),
                    _ => None,
                };
                (dx, dw)
            }
        };
        if want_dx && dx.is_none() || want_dw && dw.is_none() {
            return Err(Error::Shape(
                "backward: the saved state lacks what this gradient needs".into(),
            ));
        }
        Ok(LinearGrads {
            d_input: dx.map(|t| t.into_dtype(saved.dtype)).transpose()?,
            d_weight: dw,
            d_bias,
        })
    }
}

/// Quantize `x` in `role` into the copies `usage` asks for, recording its amax for delayed scaling.
/// `calls` counts gradient quantizations so that stochastic rounding differs between calls.
fn quantize_role(
    states: &mut ScaleStates,
    calls: &mut u64,
    recipe: Recipe,
    role: Role,
    x: &Tensor,
    usage: Usage,
) -> Result<QuantizedTensor> {
    if role == Role::GradOutput {
        *calls += 1;
    }
    let scale = states.get(role).as_ref().map(DelayedState::scale);
    let row = recipe.spec(role, Layout::Rowwise, scale, *calls)?;
    let col = recipe.spec(role, Layout::Colwise, scale, *calls)?;
    let q = cpu::quantize(x, &row, &col, usage, None)?;
    // A paused layer (an evaluation forward) records nothing; backward always does.
    if !states.paused || role == Role::GradOutput {
        if let Some(s) = states.get(role) {
            s.record(q.amax);
        }
        states.telemetry[role as usize] = Some(q.telemetry());
    }
    Ok(q)
}
