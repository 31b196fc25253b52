//! Scaling recipes: which format and which scale rule each operand role gets,
//! and how the backward pass runs. Validated once, at construction.
//!
//! Roles and GEMMs follow torchao's names for `y = x W^T` with `x: (M, K)`,
//! `W: (N, K)`:
//!
//! | GEMM | product | reduction | operands read |
//! |---|---|---|---|
//! | `output` | `input @ weight_t` | K | input row-wise, weight row-wise |
//! | `grad_input` | `grad_output @ weight` | N | grad_output row-wise, weight column-wise |
//! | `grad_weight` | `grad_output_t @ input` | M | grad_output column-wise, input column-wise |

use crate::format::{Format, Rounding};
use crate::quant::{Granularity, Layout, QuantSpec, ScaleRule};
use crate::scale::scale_from_amax;
use crate::Error;
use std::collections::VecDeque;
use std::fmt;

/// Operand role in a linear layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Role {
    /// The activation `x` entering the layer.
    Input,
    /// The weight `W`.
    Weight,
    /// The gradient of the layer's output, `dy`.
    GradOutput,
}

impl Role {
    /// All roles.
    pub const ALL: [Role; 3] = [Role::Input, Role::Weight, Role::GradOutput];
    fn short(self) -> &'static str {
        match self {
            Role::Input => "i",
            Role::Weight => "w",
            Role::GradOutput => "go",
        }
    }
}

/// How a delayed-scaling history turns into an amax.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum AmaxAlgo {
    /// The largest amax in the history window.
    Max,
    /// The newest amax.
    MostRecent,
}

/// The scaling family of a recipe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scaling {
    /// Per-tensor scale from an amax history of earlier steps (Transformer Engine's default).
    Delayed {
        /// Steps kept in the history (at least 1).
        history_len: usize,
        /// Max over the window or the most recent value.
        algo: AmaxAlgo,
        /// Extra headroom: the scale is divided by `2^margin` (at least 0).
        margin: i32,
    },
    /// Per-tensor scale from the tensor's own amax (current scaling).
    Tensorwise {
        /// Round scales down to powers of two.
        power_of_two: bool,
    },
    /// One scale per row along the reduction dimension (torchao's rowwise).
    Rowwise {
        /// Round scales down to powers of two.
        power_of_two: bool,
    },
    /// DeepSeek-V3 blocks: 1x128 for inputs and gradients, 128x128 for weights, f32 scales.
    Blockwise {
        /// Round scales down to powers of two.
        power_of_two: bool,
    },
    /// MXFP8: 1x32 blocks along the reduction dimension, E8M0 scales.
    Mxfp8,
    /// NVFP4: E2M1 elements; 1x16 blocks (16x16 for weights) with E4M3 scales
    /// under an f32 per-tensor scale; stochastic rounding for gradients.
    Nvfp4,
}

impl Scaling {
    /// Granularity of `role`'s copy (in the copy's own coordinates: the tile
    /// runs along that copy's reduction dimension).
    pub fn granularity(self, role: Role) -> Granularity {
        match (self, role) {
            (Scaling::Delayed { .. } | Scaling::Tensorwise { .. }, _) => Granularity::Tensor,
            (Scaling::Rowwise { .. }, _) => Granularity::Row,
            (Scaling::Blockwise { .. }, Role::Weight) => Granularity::Tile {
                rows: 128,
                cols: 128,
            },
            (Scaling::Blockwise { .. }, _) => Granularity::Tile { rows: 1, cols: 128 },
            (Scaling::Mxfp8, _) => Granularity::Tile { rows: 1, cols: 32 },
            (Scaling::Nvfp4, Role::Weight) => Granularity::Tile { rows: 16, cols: 16 },
            (Scaling::Nvfp4, _) => Granularity::Tile { rows: 1, cols: 16 },
        }
    }

    fn short(self, role: Role) -> String {
        match (self, self.granularity(role)) {
            (Scaling::Delayed { .. }, _) => "dly_ten".into(),
            (Scaling::Tensorwise { .. }, _) => "cur_ten".into(),
            (Scaling::Rowwise { .. }, _) => "cur_row".into(),
            (Scaling::Mxfp8, Granularity::Tile { rows, cols }) => format!("mx{rows}x{cols}"),
            (Scaling::Nvfp4, Granularity::Tile { rows, cols }) => format!("nv{rows}x{cols}"),
            (_, Granularity::Tile { rows, cols }) => format!("blk{rows}x{cols}"),
            (_, g) => format!("{g:?}"),
        }
    }
}

/// Where the backward GEMMs get their operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackwardMode {
    /// `grad_input` and `grad_weight` as FP8 GEMMs from saved FP8 column-wise copies and an FP8 `grad_output`.
    Quantized,
    /// High-precision GEMMs from the original, unquantized saved tensors.
    HighPrecision,
    /// High-precision GEMMs from the FP8 tensors of the forward, dequantized at backward.
    Dequantized,
}

impl BackwardMode {
    /// All modes.
    pub const ALL: [BackwardMode; 3] = [
        BackwardMode::Quantized,
        BackwardMode::HighPrecision,
        BackwardMode::Dequantized,
    ];

    /// Name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            BackwardMode::Quantized => "quantized",
            BackwardMode::HighPrecision => "high_precision",
            BackwardMode::Dequantized => "dequantized",
        }
    }

    /// Parse a command-line name.
    pub fn from_name(s: &str) -> Result<Self, Error> {
        Self::ALL
            .into_iter()
            .find(|m| m.name() == s || m.name().replace('_', "-") == s)
            .ok_or_else(|| {
                Error::Unsupported(format!(
                    "backward mode '{s}' (expected quantized, high_precision or dequantized)"
                ))
            })
    }
}

/// The largest delayed-scaling margin for `format`: the amax lands at
/// `max * 2^-margin`, which must stay above half the smallest subnormal,
/// where round-to-nearest-even still gives it a non-zero code (18 for E4M3,
/// 32 for E5M2; neither ratio is a power of two).
fn max_margin(format: Format) -> i32 {
    (2.0 * format.max() / format.min_subnormal()).log2().floor() as i32
}

/// A validated scaling recipe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Recipe {
    scaling: Scaling,
    fwd_format: Format,
    grad_format: Format,
    backward: BackwardMode,
    seed: u64,
}

impl Recipe {
    /// Names accepted by [`Recipe::from_name`], in the order tables list them.
    pub const NAMES: [&'static str; 6] = [
        "delayed",
        "tensorwise",
        "rowwise",
        "blockwise",
        "mxfp8",
        "nvfp4",
    ];

    /// Build and validate a recipe.
    ///
    /// `fwd_format` is the element format of inputs and weights, `grad_format`
    /// that of `grad_output` (used by the quantized backward only).
    /// Errors: E8M0 as an element format; E2M1 outside NVFP4 or NVFP4 without
    /// E2M1; delayed scaling with a backward other than quantized, an empty
    /// history or a negative margin.
    pub fn new(
        scaling: Scaling,
        fwd_format: Format,
        grad_format: Format,
        backward: BackwardMode,
    ) -> Result<Self, Error> {
        for f in [fwd_format, grad_format] {
            match (scaling, f) {
                (_, Format::E8M0) => {
                    return Err(Error::Unsupported(
                        "E8M0 is a scale format; elements must be E4M3, E5M2 or E2M1".into(),
                    ))
                }
                (Scaling::Nvfp4, Format::E2M1) => {}
                (Scaling::Nvfp4, f) => {
                    return Err(Error::Unsupported(format!(
                        "the NVFP4 recipe quantizes to E2M1, not {f}"
                    )))
                }
                (_, Format::E2M1) => {
                    return Err(Error::Unsupported(
                        "E2M1 (FP4) elements need the NVFP4 recipe's block scales".into(),
                    ))
                }
                _ => {}
            }
        }
        if let Scaling::Delayed {
            history_len,
            margin,
            ..
        } = scaling
        {
            if backward != BackwardMode::Quantized {
                return Err(Error::Unsupported(format!(
                    "delayed scaling supports the quantized backward only, not {}: its scales come from the amax \
                     history of FP8 tensors; use tensorwise scaling for {} backward",
                    backward.name(),
                    backward.name()
                )));
            }
            if history_len == 0 {
                return Err(Error::Unsupported(
                    "delayed scaling needs an amax history of at least 1".into(),
                ));
            }
            if margin < 0 {
                return Err(Error::Unsupported(format!(
                    "delayed scaling margin must be >= 0, got {margin}"
                )));
            }
            // The margin puts the amax at `max * 2^-margin`: past 18 binades
            // (E4M3) or 32 (E5M2) even the amax quantizes to zero, and far
            // past them the scale is no normal f32.
            for f in [fwd_format, grad_format] {
                let most = max_margin(f);
                if margin > most {
                    return Err(Error::Unsupported(format!(
                        "delayed scaling margin {margin} is past {f}'s range: with a margin above \
                         {most} the amax itself quantizes to zero"
                    )));
                }
            }
        }
        Ok(Recipe {
            scaling,
            fwd_format,
            grad_format,
            backward,
            seed: 0x0C7E_7000,
        })
    }

    /// A recipe by name with its defaults: hybrid formats (E4M3 forward, E5M2
    /// gradients; E2M1 for NVFP4) and the quantized backward. `delayed` keeps
    /// 16 steps of history with the max algorithm and margin 0.
    pub fn from_name(name: &str) -> Result<Self, Error> {
        let scaling = match name {
            "delayed" => Scaling::Delayed {
                history_len: 16,
                algo: AmaxAlgo::Max,
                margin: 0,
            },
            "tensorwise" => Scaling::Tensorwise {
                power_of_two: false,
            },
            "rowwise" => Scaling::Rowwise {
                power_of_two: false,
            },
            "blockwise" => Scaling::Blockwise {
                power_of_two: false,
            },
            "mxfp8" => Scaling::Mxfp8,
            "nvfp4" => Scaling::Nvfp4,
            other => {
                return Err(Error::Unsupported(format!(
                    "recipe '{other}' (expected one of {})",
                    Self::NAMES.join(", ")
                )))
            }
        };
        let (f, g) = if scaling == Scaling::Nvfp4 {
            (Format::E2M1, Format::E2M1)
        } else {
            (Format::E4M3, Format::E5M2)
        };
        Recipe::new(scaling, f, g, BackwardMode::Quantized)
    }

    /// The same recipe with another backward mode (validated).
    pub fn with_backward(self, backward: BackwardMode) -> Result<Self, Error> {
        Recipe::new(self.scaling, self.fwd_format, self.grad_format, backward)
            .map(|r| r.with_seed(self.seed))
    }

    /// The same recipe with other formats (validated).
    pub fn with_formats(self, fwd: Format, grad: Format) -> Result<Self, Error> {
        Recipe::new(self.scaling, fwd, grad, self.backward).map(|r| r.with_seed(self.seed))
    }

    /// The same recipe with another stochastic-rounding seed.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The scaling family.
    pub fn scaling(&self) -> Scaling {
        self.scaling
    }

    /// The backward mode.
    pub fn backward(&self) -> BackwardMode {
        self.backward
    }

    /// Element format of `role`.
    pub fn format(&self, role: Role) -> Format {
        match role {
            Role::GradOutput => self.grad_format,
            _ => self.fwd_format,
        }
    }

    /// The quantization spec of `role`'s `layout` copy.
    ///
    /// Both copies scale along their own reduction dimension, so today the
    /// spec is the same for both layouts in each copy's own coordinates (a
    /// 1x128 tile of the column-wise copy is a 128x1 tile of the original, as
    /// DeepSeek-V3 quantizes backward activations; square weight tiles are
    /// symmetric). `layout` stays in the signature so a recipe can differ per copy.
    ///
    /// `delayed_scale` is the current scale of the role's [`DelayedState`];
    /// it is required by delayed scaling and rejected otherwise. `salt`
    /// varies stochastic rounding between calls (mixed into the seed).
    pub fn spec(
        &self,
        role: Role,
        _layout: Layout,
        delayed_scale: Option<f32>,
        salt: u64,
    ) -> Result<QuantSpec, Error> {
        let granularity = self.scaling.granularity(role);
        let rule = match (self.scaling, delayed_scale) {
            (Scaling::Delayed { .. }, Some(s)) => ScaleRule::Fixed(s),
            (Scaling::Delayed { .. }, None) => {
                return Err(Error::Unsupported(
                    "delayed scaling needs the scale of its DelayedState".into(),
                ))
            }
            (_, Some(_)) => {
                return Err(Error::Unsupported(
                    "a fixed scale was given to a current-scaling recipe".into(),
                ))
            }
            (
                Scaling::Tensorwise { power_of_two }
                | Scaling::Rowwise { power_of_two }
                | Scaling::Blockwise { power_of_two },
                None,
            ) => ScaleRule::Amax { power_of_two },
            (Scaling::Mxfp8, None) => ScaleRule::E8M0,
            (Scaling::Nvfp4, None) => ScaleRule::Nvfp4,
        };
        let rounding = if self.scaling == Scaling::Nvfp4 && role == Role::GradOutput {
            Rounding::Stochastic {
                seed: crate::format::sr_bits(self.seed, salt) as u64 | (salt << 32),
            }
        } else {
            Rounding::NearestEven
        };
        Ok(QuantSpec {
            format: self.format(role),
            granularity,
            rule,
            rounding,
        })
    }
}

impl fmt::Display for Recipe {
    /// Short form, e.g. `i:cur_ten_e4m3,w:cur_ten_e4m3,go:cur_ten_e5m2,bwd:quantized`
    /// (`go:hp` when the backward does not quantize gradients).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for role in [Role::Input, Role::Weight] {
            write!(
                f,
                "{}:{}_{},",
                role.short(),
                self.scaling.short(role),
                self.format(role)
            )?;
        }
        if self.backward == BackwardMode::Quantized {
            let r = Role::GradOutput;
            let sr = if self.scaling == Scaling::Nvfp4 {
                "_sr"
            } else {
                ""
            };
            write!(
                f,
                "{}:{}_{}{sr},",
                r.short(),
                self.scaling.short(r),
                self.format(r)
            )?;
        } else {
            write!(f, "go:hp,")?;
        }
        write!(f, "bwd:{}", self.backward.name())
    }
}

/// Delayed-scaling state of one tensor role: the amax history and the scale it gives.
///
/// Each quantization uses [`DelayedState::scale`] and reports the amax it saw
/// with [`DelayedState::record`]; once per step [`DelayedState::update`]
/// pushes the step's amax into the history and derives the next scale.
///
/// It serializes (checkpoints) with an inf or NaN amax as the strings `"inf"`,
/// `"-inf"` or `"nan"`, which JSON numbers cannot hold.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DelayedState {
    #[serde(with = "amax_json::many")]
    history: VecDeque<f32>,
    len: usize,
    algo: AmaxAlgo,
    margin: i32,
    format: Format,
    scale: f32,
    #[serde(with = "amax_json")]
    pending: f32,
}

/// An amax in JSON: a number when finite, else `"inf"`, `"-inf"` or `"nan"`.
mod amax_json {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(untagged)]
    enum Amax {
        Number(f32),
        Word(String),
    }

    fn to(v: f32) -> Amax {
        match v {
            v if v.is_finite() => Amax::Number(v),
            v if v.is_nan() => Amax::Word("nan".into()),
            v if v > 0.0 => Amax::Word("inf".into()),
            _ => Amax::Word("-inf".into()),
        }
    }

    fn from<E: serde::de::Error>(a: Amax) -> Result<f32, E> {
        match a {
            Amax::Number(v) => Ok(v),
            Amax::Word(w) => match w.as_str() {
                "inf" => Ok(f32::INFINITY),
                "-inf" => Ok(f32::NEG_INFINITY),
                "nan" => Ok(f32::NAN),
                _ => Err(E::custom(format!(
                    "amax {w:?} is not a number, \"inf\", \"-inf\" or \"nan\""
                ))),
            },
        }
    }

    pub fn serialize<S: Serializer>(v: &f32, s: S) -> Result<S::Ok, S::Error> {
        to(*v).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f32, D::Error> {
        from(Amax::deserialize(d)?)
    }

    /// The same for a history.
    pub mod many {
        use super::{from, to, Amax};
        use serde::{Deserialize, Deserializer, Serializer};
        use std::collections::VecDeque;

        pub fn serialize<S: Serializer>(v: &VecDeque<f32>, s: S) -> Result<S::Ok, S::Error> {
            s.collect_seq(v.iter().map(|&a| to(a)))
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<VecDeque<f32>, D::Error> {
            Vec::<Amax>::deserialize(d)?.into_iter().map(from).collect()
        }
    }
}

impl DelayedState {
    /// A fresh state: scale 1 until the first update (as Transformer Engine starts).
    pub fn new(history_len: usize, algo: AmaxAlgo, margin: i32, format: Format) -> Self {
        DelayedState {
            history: VecDeque::new(),
            len: history_len.max(1),
            algo,
            margin,
            format,
            scale: 1.0,
            pending: 0.0,
        }
    }

    /// The state for `role` under `recipe`, or `None` if the recipe is not delayed.
    pub fn for_role(recipe: &Recipe, role: Role) -> Option<Self> {
        match recipe.scaling() {
            Scaling::Delayed {
                history_len,
                algo,
                margin,
            } => Some(Self::new(history_len, algo, margin, recipe.format(role))),
            _ => None,
        }
    }

    /// The scale to quantize with now.
    pub fn scale(&self) -> f32 {
        self.scale
    }

    /// The configuration: `(history length, algorithm, margin, format)`.
    pub fn config(&self) -> (usize, AmaxAlgo, i32, Format) {
        (self.len, self.algo, self.margin, self.format)
    }

    /// The amax recorded this step so far (0 right after [`DelayedState::update`]).
    pub fn pending(&self) -> f32 {
        self.pending
    }

    /// A state rebuilt from its parts (what another backend kept, e.g. a GPU's
    /// device buffers): `history` oldest first, of which the last
    /// `history_len` entries are kept; `scale` and `pending` as they were.
    pub fn restore(
        (history_len, algo, margin, format): (usize, AmaxAlgo, i32, Format),
        history: &[f32],
        scale: f32,
        pending: f32,
    ) -> Self {
        let len = history_len.max(1);
        DelayedState {
            history: history[history.len().saturating_sub(len)..]
                .iter()
                .copied()
                .collect(),
            len,
            algo,
            margin,
            format,
            scale,
            pending,
        }
    }

    /// The history, oldest first.
    pub fn history(&self) -> impl Iterator<Item = f32> + '_ {
        self.history.iter().copied()
    }

    /// Report an amax seen this step (the step's amax is the max of the
    /// reports). An infinite or NaN amax (an overflow upstream) makes the
    /// step's amax non-finite; see [`DelayedState::update`].
    pub fn record(&mut self, amax: f32) {
        self.pending = if amax.is_nan() || self.pending.is_nan() {
            f32::NAN
        } else {
            self.pending.max(amax)
        };
    }

    /// End of step: push the step's amax, drop the oldest beyond the window,
    /// recompute the scale. While the amax it uses (the window's max, or the
    /// most recent) is not finite, or is 0 (a step of zeros, or with no
    /// report), the scale stays what it was, as in Transformer Engine: an
    /// overflow does not reset it to 1 (or to 0, which would flush every later
    /// value), and neither does an empty step (1 would flush small gradients).
    /// One difference: Transformer Engine's max over the window skips a NaN
    /// entry (`fmaxf`) and scales from the others; here a NaN anywhere in the
    /// window keeps the scale, as an infinity does, until it leaves.
    pub fn update(&mut self) {
        self.history.push_back(self.pending);
        while self.history.len() > self.len {
            self.history.pop_front();
        }
        self.pending = 0.0;
        let window: &[f32] = match self.algo {
            AmaxAlgo::Max => self.history.make_contiguous(),
            AmaxAlgo::MostRecent => {
                let n = self.history.len();
                &self.history.make_contiguous()[n.saturating_sub(1)..]
            }
        };
        if window.iter().all(|a| a.is_finite()) {
            let amax = window.iter().copied().fold(0f32, f32::max);
            if amax > 0.0 {
                self.scale = scale_from_amax(amax, self.format, self.margin, false).unwrap_or(1.0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_strings() {
        let r = Recipe::from_name("tensorwise").unwrap();
        assert_eq!(
            r.to_string(),
            "i:cur_ten_e4m3,w:cur_ten_e4m3,go:cur_ten_e5m2,bwd:quantized"
        );
        let r = Recipe::from_name("blockwise")
            .unwrap()
            .with_backward(BackwardMode::Dequantized)
            .unwrap();
        assert_eq!(
            r.to_string(),
            "i:blk1x128_e4m3,w:blk128x128_e4m3,go:hp,bwd:dequantized"
        );
        let r = Recipe::from_name("nvfp4").unwrap();
        assert_eq!(
            r.to_string(),
            "i:nv1x16_e2m1,w:nv16x16_e2m1,go:nv1x16_e2m1_sr,bwd:quantized"
        );
        let r = Recipe::from_name("mxfp8")
            .unwrap()
            .with_formats(Format::E4M3, Format::E4M3)
            .unwrap();
        assert_eq!(
            r.to_string(),
            "i:mx1x32_e4m3,w:mx1x32_e4m3,go:mx1x32_e4m3,bwd:quantized"
        );
    }

    #[test]
    fn delayed_state_restores_from_its_parts() {
        let mut a = DelayedState::new(3, AmaxAlgo::Max, 1, Format::E4M3);
        for (i, amax) in [2.0f32, 7.5, 0.25, 3.0, 0.5].into_iter().enumerate() {
            a.record(amax);
            if i < 4 {
                a.update();
            }
        }
        let h: Vec<f32> = a.history().collect();
        assert_eq!(h, vec![7.5, 0.25, 3.0]);
        // From a longer history the oldest entries are dropped.
        let long = [9.0f32, 7.5, 0.25, 3.0];
        let b = DelayedState::restore(a.config(), &long, a.scale(), a.pending());
        assert_eq!(a, b);
        let (mut a2, mut b2) = (a.clone(), b.clone());
        a2.update();
        b2.update();
        assert_eq!(a2, b2);
        assert_eq!(
            a2.scale(),
            crate::scale::scale_from_amax(3.0, Format::E4M3, 1, false).unwrap()
        );
    }

    #[test]
    fn invalid_combinations_are_errors() {
        let d = Recipe::from_name("delayed").unwrap();
        assert!(d.with_backward(BackwardMode::HighPrecision).is_err());
        assert!(d.with_backward(BackwardMode::Dequantized).is_err());
        let t = Recipe::from_name("tensorwise").unwrap();
        assert!(t.with_formats(Format::E8M0, Format::E5M2).is_err());
        assert!(t.with_formats(Format::E2M1, Format::E5M2).is_err());
        assert!(Recipe::from_name("nvfp4")
            .unwrap()
            .with_formats(Format::E4M3, Format::E5M2)
            .is_err());
        let bad = Scaling::Delayed {
            history_len: 0,
            algo: AmaxAlgo::Max,
            margin: 0,
        };
        assert!(Recipe::new(bad, Format::E4M3, Format::E5M2, BackwardMode::Quantized).is_err());
        let bad = Scaling::Delayed {
            history_len: 4,
            algo: AmaxAlgo::Max,
            margin: -1,
        };
        assert!(Recipe::new(bad, Format::E4M3, Format::E5M2, BackwardMode::Quantized).is_err());
        assert!(Recipe::from_name("fp7").is_err());
        // The margin may not push the amax below the smallest subnormal.
        let margin = |margin, fwd, grad| {
            let sc = Scaling::Delayed {
                history_len: 4,
                algo: AmaxAlgo::Max,
                margin,
            };
            Recipe::new(sc, fwd, grad, BackwardMode::Quantized)
        };
        assert!(margin(18, Format::E4M3, Format::E5M2).is_ok());
        assert!(margin(19, Format::E4M3, Format::E5M2).is_err());
        assert!(margin(140, Format::E4M3, Format::E5M2).is_err());
        assert!(margin(32, Format::E5M2, Format::E5M2).is_ok());
        assert!(margin(33, Format::E5M2, Format::E5M2).is_err());
        for (f, most) in [(Format::E4M3, 18), (Format::E5M2, 32)] {
            assert_eq!(max_margin(f), most);
            // At the limit an amax of 1 still quantizes to a non-zero code;
            // one binade further it quantizes to zero.
            let code = |m| {
                let s = crate::scale::scale_from_amax(1.0, f, m, false).unwrap();
                f.encode_rne(s, crate::Overflow::Saturate)
            };
            assert_ne!(code(most) & 0x7F, 0, "{f}");
            assert_eq!(code(most + 1) & 0x7F, 0, "{f}");
        }
        assert!(t.spec(Role::Input, Layout::Rowwise, Some(1.0), 0).is_err());
        assert!(d.spec(Role::Input, Layout::Rowwise, None, 0).is_err());
    }

    #[test]
    fn delayed_state_follows_history() {
        let mut s = DelayedState::new(3, AmaxAlgo::Max, 1, Format::E4M3);
        assert_eq!(s.scale(), 1.0);
        for (amax, want_amax) in [(2.0, 2.0), (8.0, 8.0), (1.0, 8.0), (4.0, 8.0), (0.5, 4.0)] {
            s.record(amax);
            s.record(amax / 2.0);
            s.update();
            assert_eq!(s.scale(), 448.0 / want_amax / 2.0, "amax {amax}");
        }
        assert_eq!(s.history().collect::<Vec<_>>(), vec![1.0, 4.0, 0.5]);
        let mut r = DelayedState::new(3, AmaxAlgo::MostRecent, 0, Format::E5M2);
        r.record(7.0);
        r.update();
        r.record(3.5);
        r.update();
        assert_eq!(r.scale(), 57344.0 / 3.5);
        r.update(); // a step with no data: amax 0 keeps the scale (as TE)
        assert_eq!(r.scale(), 57344.0 / 3.5);
    }
}
