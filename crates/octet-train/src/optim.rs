//! AdamW with f32 master weights, global-norm gradient clipping, and the
//! warmup + cosine learning-rate schedule.

use crate::{Error, Result};
use octet_tensor::Tensor;

/// AdamW hyper-parameters (unknown keys are errors when read from a file).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdamWConfig {
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Denominator epsilon.
    pub eps: f32,
    /// Decoupled weight decay (applied to matrices only, not to norm gains).
    pub weight_decay: f32,
    /// Clip the global gradient norm to this value; 0 disables clipping
    /// (a negative or non-finite value is an error, not "off").
    pub grad_clip: f32,
}

impl AdamWConfig {
    /// Check every value: `beta1` and `beta2` in `[0, 1)`, `eps` finite and
    /// positive, `weight_decay` and `grad_clip` finite and at least 0 (a
    /// `grad_clip` of 0 disables clipping). The error names the setting (its
    /// flag where it has one, and its key under `[adamw]`) and the value.
    pub fn validate(&self) -> Result<()> {
        let bad = |name: &str, v: f32, want: &str| {
            Err(Error::Train(format!("{name} = {v}: expected {want}")))
        };
        for (name, v) in [("adamw.beta1", self.beta1), ("adamw.beta2", self.beta2)] {
            if !(0.0..1.0).contains(&v) {
                return bad(name, v, "a value in [0, 1)");
            }
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return bad("adamw.eps", self.eps, "a finite number above 0");
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return bad(
                "--weight-decay (adamw.weight_decay)",
                self.weight_decay,
                "a finite number of at least 0",
            );
        }
        if !(self.grad_clip.is_finite() && self.grad_clip >= 0.0) {
            return bad(
                "--grad-clip (adamw.grad_clip)",
                self.grad_clip,
                "a finite norm of at least 0 (0 disables clipping)",
            );
        }
        Ok(())
    }
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            grad_clip: 1.0,
        }
    }
}

/// The optimizer state of one parameter.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamState {
    /// Hugging Face tensor name.
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// f32 master weights.
    pub master: Vec<f32>,
    /// First moment.
    pub m: Vec<f32>,
    /// Second moment.
    pub v: Vec<f32>,
    /// Whether weight decay applies.
    pub decay: bool,
}

/// AdamW over a fixed, ordered list of named parameters.
#[derive(Clone, Debug)]
pub struct AdamW {
    /// Hyper-parameters.
    pub cfg: AdamWConfig,
    /// Per-parameter state, in the model's parameter order.
    pub states: Vec<ParamState>,
    /// Steps taken.
    pub step: u64,
}

impl AdamW {
    /// Start from the model's current weights (which become the f32 masters).
    pub fn new(params: &[(String, &Tensor)], cfg: AdamWConfig) -> AdamW {
        let states = params
            .iter()
            .map(|(name, t)| ParamState {
                name: name.clone(),
                shape: t.shape().to_vec(),
                master: t.to_f32_vec(),
                m: vec![0.0; t.numel()],
                v: vec![0.0; t.numel()],
                decay: t.shape().len() >= 2,
            })
            .collect();
        AdamW {
            cfg,
            states,
            step: 0,
        }
    }

    /// One update with learning rate `lr` from gradients in parameter order.
    /// Returns the global gradient norm before clipping.
    pub fn step(&mut self, grads: &[(String, Tensor)], lr: f32) -> Result<f32> {
        if grads.len() != self.states.len() {
            return Err(Error::Train(format!(
                "{} gradients for {} parameters",
                grads.len(),
                self.states.len()
            )));
        }
        let gs: Vec<Vec<f32>> = grads.iter().map(|(_, g)| g.to_f32_vec()).collect();
        for ((name, g), s) in grads.iter().zip(&self.states) {
            if *name != s.name || g.numel() != s.master.len() {
                return Err(Error::Train(format!(
                    "gradient {name} {:?} does not match parameter {}",
                    g.shape(),
                    s.name
                )));
            }
        }
        let norm = gs
            .iter()
            .flatten()
            .map(|&g| (g as f64) * (g as f64))
            .sum::<f64>()
            .sqrt() as f32;
        if !norm.is_finite() {
            return Err(Error::NonFinite(format!("gradient norm is {norm}")));
        }
        let clip = if self.cfg.grad_clip > 0.0 && norm > self.cfg.grad_clip {
            self.cfg.grad_clip / norm
        } else {
            1.0
        };
        // The bias correction takes the step as an i32 power: a step count
        // past i32::MAX (only from a corrupt state) would wrap.
        let t = self
            .step
            .checked_add(1)
            .and_then(|s| i32::try_from(s).ok())
            .ok_or_else(|| {
                Error::Train(format!(
                    "optimizer step {} exceeds the limit of {}",
                    self.step,
                    i32::MAX
                ))
            })?;
        self.step += 1;
        let c = self.cfg;
        let (bc1, bc2) = (1.0 - c.beta1.powi(t), 1.0 - c.beta2.powi(t));
        for (s, g) in self.states.iter_mut().zip(&gs) {
            let wd = if s.decay { c.weight_decay } else { 0.0 };
            for i in 0..g.len() {
                let gi = g[i] * clip;
                s.m[i] = c.beta1 * s.m[i] + (1.0 - c.beta1) * gi;
                s.v[i] = c.beta2 * s.v[i] + (1.0 - c.beta2) * gi * gi;
                let update = (s.m[i] / bc1) / ((s.v[i] / bc2).sqrt() + c.eps);
                s.master[i] -= lr * (update + wd * s.master[i]);
            }
        }
        Ok(norm)
    }

    /// Copy the masters into the model's weights, rounding to each weight's dtype.
    pub fn write_back(&self, params: Vec<(String, &mut Tensor)>) -> Result<()> {
        for ((name, t), s) in params.into_iter().zip(&self.states) {
            if name != s.name {
                return Err(Error::Train(format!(
                    "parameter order changed: {name} vs {}",
                    s.name
                )));
            }
            *t = Tensor::from_f32_as(&s.shape, s.master.clone(), t.dtype())?;
        }
        Ok(())
    }

    /// Bytes of the state: the f32 masters and the two f32 moments.
    pub fn bytes(&self) -> usize {
        self.states
            .iter()
            .map(|s| 4 * (s.master.len() + s.m.len() + s.v.len()))
            .sum()
    }
}

/// Learning rate at `step` (0-based) of a run of `total` steps: linear warmup
/// to `max_lr` over `warmup` steps, then cosine decay from `max_lr` to
/// `min_lr`, reached at the last step (`total - 1`): `--min-lr` is the rate
/// the run ends at (a run whose warmup leaves one step or none ends at the
/// peak, or below it while still warming up).
pub fn lr_at(step: u64, warmup: u64, total: u64, max_lr: f32, min_lr: f32) -> f32 {
    if step < warmup {
        return max_lr * (step + 1) as f32 / warmup as f32;
    }
    let span = total.saturating_sub(1).saturating_sub(warmup).max(1);
    let p = ((step - warmup) as f32 / span as f32).min(1.0);
    min_lr + 0.5 * (max_lr - min_lr) * (1.0 + (std::f32::consts::PI * p).cos())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adamw_first_step_moves_by_lr_against_the_gradient_sign() {
        let w = Tensor::from_f32(&[2, 2], vec![1.0, -1.0, 0.5, 2.0]).unwrap();
        let cfg = AdamWConfig {
            weight_decay: 0.0,
            grad_clip: 0.0,
            ..Default::default()
        };
        let mut opt = AdamW::new(&[("w".into(), &w)], cfg);
        let g = Tensor::from_f32(&[2, 2], vec![0.3, -2.0, 1e-3, -5.0]).unwrap();
        opt.step(&[("w".into(), g)], 0.1).unwrap();
        // Bias-corrected first step: m/bc1 = g, sqrt(v/bc2) = |g|, so the update is sign(g) (up to eps).
        let want = [0.9, -0.9, 0.4, 2.1];
        for (a, b) in opt.states[0].master.iter().zip(want) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }

    #[test]
    fn clipping_and_bad_gradients() {
        let w = Tensor::from_f32(&[1, 2], vec![0.0, 0.0]).unwrap();
        let mut opt = AdamW::new(&[("w".into(), &w)], AdamWConfig::default());
        let g = Tensor::from_f32(&[1, 2], vec![3.0, 4.0]).unwrap();
        assert_eq!(opt.step(&[("w".into(), g)], 0.1).unwrap(), 5.0);
        let nan = Tensor::from_f32(&[1, 2], vec![f32::NAN, 1.0]).unwrap();
        assert!(matches!(
            opt.step(&[("w".into(), nan)], 0.1),
            Err(Error::NonFinite(_))
        ));
        let wrong = Tensor::from_f32(&[1, 3], vec![1.0; 3]).unwrap();
        assert!(opt.step(&[("w".into(), wrong)], 0.1).is_err());
    }

    #[test]
    fn a_step_count_past_i32_is_an_error_not_a_wrapped_bias_correction() {
        let w = Tensor::from_f32(&[2], vec![1.0, -1.0]).unwrap();
        let mut opt = AdamW::new(&[("w".into(), &w)], AdamWConfig::default());
        opt.step = i32::MAX as u64;
        let before = opt.states[0].master.clone();
        let e = opt.step(&[("w".into(), w.clone())], 0.1).unwrap_err();
        assert!(e.to_string().contains("2147483647"), "{e}");
        assert_eq!(opt.step, i32::MAX as u64);
        assert_eq!(opt.states[0].master, before, "nothing moves");
        opt.step = i32::MAX as u64 - 1;
        assert!(opt.step(&[("w".into(), w)], 0.1).is_ok());
    }

    #[test]
    fn bad_hyper_parameters_are_errors_that_name_the_setting_and_value() {
        assert!(AdamWConfig::default().validate().is_ok());
        let off = AdamWConfig {
            grad_clip: 0.0,
            weight_decay: 0.0,
            beta1: 0.0,
            ..Default::default()
        };
        assert!(off.validate().is_ok(), "0 disables clipping");
        // A change to the defaults, the setting the error must name, and its value.
        type Case = (fn(&mut AdamWConfig), &'static str, &'static str);
        let cases: [Case; 8] = [
            (|c| c.grad_clip = f32::NAN, "--grad-clip", "NaN"),
            (|c| c.grad_clip = -1.0, "--grad-clip", "-1"),
            (|c| c.grad_clip = f32::INFINITY, "--grad-clip", "inf"),
            (|c| c.weight_decay = f32::NAN, "--weight-decay", "NaN"),
            (|c| c.weight_decay = f32::INFINITY, "--weight-decay", "inf"),
            (|c| c.beta1 = 1.0, "adamw.beta1", "= 1"),
            (|c| c.beta2 = -0.5, "adamw.beta2", "-0.5"),
            (|c| c.eps = 0.0, "adamw.eps", "= 0"),
        ];
        for (set, name, value) in cases {
            let mut cfg = AdamWConfig::default();
            set(&mut cfg);
            let e = cfg.validate().expect_err(name).to_string();
            assert!(e.contains(name) && e.contains(value), "{e}");
        }
    }

    #[test]
    fn schedule_warms_up_then_decays() {
        assert_eq!(lr_at(0, 10, 100, 1.0, 0.1), 0.1);
        assert_eq!(lr_at(9, 10, 100, 1.0, 0.1), 1.0);
        assert!((lr_at(10, 10, 100, 1.0, 0.1) - 1.0).abs() < 1e-6);
        // Halfway between the warmup (step 10) and the last step (100 of 101).
        assert!((lr_at(55, 10, 101, 1.0, 0.1) - 0.55).abs() < 1e-6);
        // The last step of the run (99 of 100) is at the final rate.
        assert!((lr_at(99, 10, 100, 1.0, 0.1) - 0.1).abs() < 1e-6);
        assert!(lr_at(98, 10, 100, 1.0, 0.1) > 0.1);
    }
}
