//! The four low-precision formats and their exact encode/decode rules.
//!
//! | format | bits (s/e/m) | bias | max finite | min subnormal | specials |
//! |---|---|---|---|---|---|
//! | E4M3 (`e4m3fn`) | 1/4/3 | 7 | 448 | 2^-9 | NaN = `S.1111.111`, no inf |
//! | E5M2 | 1/5/2 | 15 | 57344 | 2^-16 | inf = `S.11111.00`, NaN = `S.11111.xx` |
//! | E8M0 (MX scale) | 0/8/0 | 127 | 2^127 | 2^-127 (no zero) | NaN = `0xFF` |
//! | E2M1 (FP4) | 1/2/1 | 1 | 6 | 0.5 | none; stored in the low nibble |
//!
//! Encoding rounds to nearest, ties to even (or stochastically, see
//! [`Rounding`]). [`Overflow::Saturate`] clamps out-of-range magnitudes (and
//! infinities) to the largest finite value, which is what quantization uses;
//! [`Overflow::Cast`] behaves like a plain hardware conversion: magnitudes that
//! round past the largest finite value become NaN (E4M3) or inf (E5M2). NaN
//! always encodes to NaN where the format has one. E2M1 has neither inf nor
//! NaN: it always saturates, and NaN encodes to 6 with the NaN's sign bit
//! (+6, or -6 for a negative NaN; quantization rejects NaN inputs before they
//! get here, see `quant`).

use half::{bf16, f16};

/// A low-precision number format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Format {
    /// 4 exponent bits, 3 mantissa bits, finite only (OCP `E4M3`, PyTorch `float8_e4m3fn`).
    E4M3,
    /// 5 exponent bits, 2 mantissa bits, IEEE-like with inf and NaN (`float8_e5m2`).
    E5M2,
    /// 8-bit unsigned power of two: the shared scale of the MX formats.
    E8M0,
    /// 4-bit float (1 sign, 2 exponent, 1 mantissa bit), the NVFP4/MXFP4 element.
    E2M1,
}

/// What happens to magnitudes beyond the largest finite value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Overflow {
    /// Clamp to +-max (infinities too). The default for quantization.
    Saturate,
    /// Round as a plain cast does: overflow becomes NaN (E4M3) or inf (E5M2).
    Cast,
}

/// How the dropped mantissa bits are rounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rounding {
    /// Round to nearest, ties to even.
    NearestEven,
    /// Stochastic rounding: round up with probability equal to the dropped
    /// fraction. The random bits of element `i` are [`sr_bits`]`(seed, i)`, a
    /// counter-based hash, so any backend reproduces the same bytes.
    Stochastic {
        /// Seed of the counter-based generator.
        seed: u64,
    },
}

/// The parameters of a signed minifloat (E4M3, E5M2, E2M1).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Spec {
    man_bits: u32,
    bias: i32,
    /// Code of the largest finite positive value.
    max_code: u32,
    /// Code that overflow produces in [`Overflow::Cast`] mode.
    overflow_code: u32,
    /// Positive NaN code (E2M1 has none: it is `max_code`).
    nan_code: u32,
    /// Position of the sign bit (7 for 8-bit formats, 3 for E2M1).
    sign_shift: u32,
}

pub(crate) const E4M3_SPEC: Spec = Spec {
    man_bits: 3,
    bias: 7,
    max_code: 0x7E,
    overflow_code: 0x7F,
    nan_code: 0x7F,
    sign_shift: 7,
};
pub(crate) const E5M2_SPEC: Spec = Spec {
    man_bits: 2,
    bias: 15,
    max_code: 0x7B,
    overflow_code: 0x7C,
    nan_code: 0x7F,
    sign_shift: 7,
};
const E2M1_SPEC: Spec = Spec {
    man_bits: 1,
    bias: 1,
    max_code: 0x7,
    overflow_code: 0x7,
    nan_code: 0x7,
    sign_shift: 3,
};

impl Format {
    /// Every format, for tables and tests.
    pub const ALL: [Format; 4] = [Format::E4M3, Format::E5M2, Format::E8M0, Format::E2M1];

    /// Short lowercase name (`e4m3`, `e5m2`, `e8m0`, `e2m1`).
    pub fn name(self) -> &'static str {
        match self {
            Format::E4M3 => "e4m3",
            Format::E5M2 => "e5m2",
            Format::E8M0 => "e8m0",
            Format::E2M1 => "e2m1",
        }
    }

    /// Storage bits per element (8, or 4 for E2M1).
    pub fn bits(self) -> u32 {
        match self {
            Format::E2M1 => 4,
            _ => 8,
        }
    }

    /// Number of distinct codes (256, or 16 for E2M1).
    pub fn num_codes(self) -> usize {
        1 << self.bits()
    }

    /// Largest finite value.
    pub fn max(self) -> f32 {
        match self {
            Format::E4M3 => 448.0,
            Format::E5M2 => 57344.0,
            Format::E8M0 => f32::from_bits(0x7F00_0000), // 2^127
            Format::E2M1 => 6.0,
        }
    }

    /// Smallest positive normal value.
    pub fn min_normal(self) -> f32 {
        match self {
            Format::E4M3 => 2f32.powi(-6),
            Format::E5M2 => 2f32.powi(-14),
            Format::E8M0 => f32::from_bits(0x0040_0000), // 2^-127
            Format::E2M1 => 1.0,
        }
    }

    /// Smallest positive value (a subnormal, except for E8M0 which has none).
    pub fn min_subnormal(self) -> f32 {
        match self {
            Format::E4M3 => 2f32.powi(-9),
            Format::E5M2 => 2f32.powi(-16),
            Format::E8M0 => f32::from_bits(0x0040_0000),
            Format::E2M1 => 0.5,
        }
    }

    /// Mantissa (fraction) bits; the unit roundoff of nearest rounding is `2^-(man_bits+1)`.
    pub fn man_bits(self) -> u32 {
        match self {
            Format::E4M3 => 3,
            Format::E5M2 => 2,
            Format::E8M0 => 0,
            Format::E2M1 => 1,
        }
    }

    /// Whether the format can hold element data (E8M0 is a scale-only format).
    pub fn is_element(self) -> bool {
        self != Format::E8M0
    }

    /// Whether `code` is a NaN of this format.
    pub fn is_nan(self, code: u8) -> bool {
        match self {
            Format::E4M3 => code & 0x7F == 0x7F,
            Format::E5M2 => code & 0x7F > 0x7C,
            Format::E8M0 => code == 0xFF,
            Format::E2M1 => false,
        }
    }

    #[inline(always)]
    pub(crate) fn spec(self) -> Spec {
        match self {
            Format::E4M3 => E4M3_SPEC,
            Format::E5M2 => E5M2_SPEC,
            Format::E2M1 => E2M1_SPEC,
            Format::E8M0 => unreachable!("E8M0 is not a signed minifloat"),
        }
    }

    /// Encode one f32. `index` feeds the stochastic-rounding generator and is
    /// ignored for nearest rounding.
    #[inline]
    pub fn encode(self, x: f32, overflow: Overflow, rounding: Rounding, index: u64) -> u8 {
        let rbits = match rounding {
            Rounding::NearestEven => None,
            Rounding::Stochastic { seed } => Some(sr_bits(seed, index)),
        };
        match self {
            Format::E8M0 => encode_e8m0(x, overflow, rbits),
            f => encode_minifloat(x, &f.spec(), overflow, rbits),
        }
    }

    /// Encode one f32 with nearest-even rounding.
    #[inline]
    pub fn encode_rne(self, x: f32, overflow: Overflow) -> u8 {
        match self {
            Format::E8M0 => encode_e8m0(x, overflow, None),
            f => encode_minifloat(x, &f.spec(), overflow, None),
        }
    }

    /// Decode one code to f32 (exact: every value of these formats is an f32).
    #[inline]
    pub fn decode(self, code: u8) -> f32 {
        self.table()[code as usize & (self.num_codes() - 1)]
    }

    /// The decode table, indexed by code (16 entries for E2M1, else 256).
    pub fn table(self) -> &'static [f32] {
        match self {
            Format::E4M3 => &E4M3_TABLE,
            Format::E5M2 => &E5M2_TABLE,
            Format::E8M0 => &E8M0_TABLE,
            Format::E2M1 => &E2M1_TABLE,
        }
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The 32 random bits that stochastic rounding adds to element `index`.
///
/// A SplitMix64 finaliser over `seed` and `index`: counter-based, so the CPU
/// and GPU backends (and any thread split) draw the same bits for the same
/// element.
#[inline]
pub fn sr_bits(seed: u64, index: u64) -> u32 {
    let mut z = seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) as u32
}

/// Shift `m` right by `shift` (1..=31), rounding the dropped bits to nearest
/// even, or up with probability dropped/2^shift when `rbits` is given.
#[inline(always)]
fn round_shift(m: u32, shift: u32, rbits: Option<u32>) -> u32 {
    let mask = (1u32 << shift) - 1;
    match rbits {
        None => {
            let q = m >> shift;
            let rem = m & mask;
            let half = 1u32 << (shift - 1);
            q + u32::from(rem > half || (rem == half && q & 1 == 1))
        }
        Some(r) => (m + (r & mask)) >> shift,
    }
}

/// The signed-minifloat encoder, written without data-dependent branches so
/// that slice loops vectorise (every step is an add, a constant shift or a select).
#[inline(always)]
pub(crate) fn encode_minifloat(x: f32, s: &Spec, overflow: Overflow, rbits: Option<u32>) -> u8 {
    let bits = x.to_bits();
    let sign = (bits >> 31) << s.sign_shift;
    let abs = bits & 0x7FFF_FFFF;
    let code = match rbits {
        None => nearest_code(abs, s),
        Some(r) => stochastic_code(abs, s, r),
    };
    // Infinities and values past the largest finite one land above max_code.
    let over = match overflow {
        Overflow::Saturate => s.max_code,
        Overflow::Cast => s.overflow_code,
    };
    let code = if code > s.max_code { over } else { code };
    let code = if abs > 0x7F80_0000 { s.nan_code } else { code };
    (code | sign) as u8
}

/// Magnitude code with nearest-even rounding, for a non-negative f32 bit pattern `abs`.
#[inline(always)]
fn nearest_code(abs: u32, s: &Spec) -> u32 {
    let emin = 1 - s.bias;
    let shift = 23 - s.man_bits;
    // Normal target: re-bias the exponent field, then round at bit `shift`
    // (add half-minus-one plus the kept LSB: ties go to even). A carry out of
    // the mantissa lands in the exponent field by itself.
    let odd = (abs >> shift) & 1;
    let rebias = ((127 - s.bias) as u32) << 23;
    let normal = abs
        .wrapping_sub(rebias)
        .wrapping_add((1 << (shift - 1)) - 1 + odd)
        >> shift;
    // Subnormal target: let the FPU round. `magic` = 2^(emin - man_bits + 23)
    // has a unit in the last place equal to the subnormal quantum
    // 2^(emin - man_bits), so `x + magic` rounds x to a multiple of it (ties
    // to even), and the bit difference counts quanta; 2^emin itself becomes
    // the min-normal code.
    let magic = f32::from_bits(((emin - s.man_bits as i32 + 23 + 127) as u32) << 23);
    let sub = (f32::from_bits(abs) + magic).to_bits() - magic.to_bits();
    let min_normal = ((emin + 127) as u32) << 23;
    if abs < min_normal {
        sub
    } else {
        normal
    }
}

/// Magnitude code with stochastic rounding by the random bits `r`.
#[inline(always)]
fn stochastic_code(abs: u32, s: &Spec, r: u32) -> u32 {
    let exp32 = (abs >> 23) as i32;
    // value = m * 2^(e - 23) with m holding its implicit bit (f32 subnormals: e = -126, no implicit bit).
    let m = if exp32 == 0 {
        abs
    } else {
        (abs & 0x7F_FFFF) | 0x80_0000
    };
    let e = exp32.max(1) - 127;
    let emin = 1 - s.bias;
    let shift = (23 - s.man_bits as i32 + (emin - e).max(0)) as u32;
    // Up to 31 dropped bits, the low `shift` bits of `r` decide (exact).
    // Beyond, the value is below one quantum: it rounds up with probability
    // floor(m 2^(32 - shift)) / 2^32, within 2^-32 of the exact m / 2^shift.
    // (Clamping the shift to 31 instead made that probability m / 2^31 at
    // any size: 2^11 times too large at 2^-20 in E2M1.)
    let near = round_shift(m, shift.min(31), Some(r));
    let t = (u64::from(m) << 32).checked_shr(shift).unwrap_or(0);
    let tiny = ((t + u64::from(r)) >> 32) as u32;
    let q = if shift > 31 { tiny } else { near };
    (((e + s.bias - 1).max(0) as u32) << s.man_bits) + q
}

#[inline(always)]
pub(crate) fn encode_e8m0(x: f32, overflow: Overflow, rbits: Option<u32>) -> u8 {
    let bits = x.to_bits();
    if x.is_nan() || (bits >> 31 == 1 && x != 0.0) {
        return 0xFF;
    }
    let abs = bits & 0x7FFF_FFFF;
    let exp32 = (abs >> 23) as i32;
    if exp32 == 0 {
        // f32 subnormals: [2^-127, 2^-126) rounds between codes 0 and 1 like
        // any binade; below 2^-127 (zero too) clamps to the minimum, as E8M0
        // has no zero.
        return if abs >= 0x40_0000 {
            (round_shift(abs, 22, rbits) - 1) as u8
        } else {
            0
        };
    }
    if exp32 == 0xFF {
        return match overflow {
            Overflow::Saturate => 0xFE,
            Overflow::Cast => 0xFF,
        };
    }
    let m = (abs & 0x7F_FFFF) | 0x80_0000;
    let code = exp32 - 1 + round_shift(m, 23, rbits) as i32;
    if code > 0xFE {
        match overflow {
            Overflow::Saturate => 0xFE,
            Overflow::Cast => 0xFF,
        }
    } else {
        code.max(0) as u8
    }
}

/// Decode a finite code to f32 bits from the format's definition (used to build the tables).
const fn decode_finite_bits(code: u32, man_bits: u32, bias: i32, sign_shift: u32) -> u32 {
    let sign = ((code >> sign_shift) & 1) << 31;
    let mag = code & ((1 << sign_shift) - 1);
    let exp = (mag >> man_bits) as i32;
    let man = mag & ((1 << man_bits) - 1);
    if exp == 0 {
        if man == 0 {
            return sign;
        }
        // man * 2^(1 - bias - man_bits): normalise around its leading bit p.
        let p = 31 - man.leading_zeros() as i32;
        let e32 = 1 - bias - man_bits as i32 + p + 127;
        let frac = (man - (1 << p)) << (23 - p as u32);
        return sign | ((e32 as u32) << 23) | frac;
    }
    sign | (((exp - bias + 127) as u32) << 23) | (man << (23 - man_bits))
}

/// `inf_code`/`nan_from`: magnitudes equal to `inf_code` decode to inf, magnitudes
/// at or above `nan_from` to NaN (0 disables either).
const fn build_table<const N: usize>(
    man_bits: u32,
    bias: i32,
    sign_shift: u32,
    inf_code: u32,
    nan_from: u32,
) -> [f32; N] {
    let mut t = [0f32; N];
    let mut c = 0;
    while c < N {
        let code = c as u32;
        let sign = ((code >> sign_shift) & 1) << 31;
        let mag = code & ((1 << sign_shift) - 1);
        let bits = if nan_from != 0 && mag >= nan_from {
            0x7FC0_0000 | sign
        } else if inf_code != 0 && mag == inf_code {
            0x7F80_0000 | sign
        } else {
            decode_finite_bits(code, man_bits, bias, sign_shift)
        };
        t[c] = f32::from_bits(bits);
        c += 1;
    }
    t
}

const fn build_e8m0_table() -> [f32; 256] {
    let mut t = [0f32; 256];
    let mut c = 0;
    while c < 256 {
        t[c] = if c == 255 {
            f32::from_bits(0x7FC0_0000)
        } else if c == 0 {
            f32::from_bits(0x0040_0000) // 2^-127 is an f32 subnormal
        } else {
            f32::from_bits((c as u32) << 23)
        };
        c += 1;
    }
    t
}

static E4M3_TABLE: [f32; 256] = build_table::<256>(3, 7, 7, 0, 0x7F);
static E5M2_TABLE: [f32; 256] = build_table::<256>(2, 15, 7, 0x7C, 0x7D);
static E2M1_TABLE: [f32; 16] = build_table::<16>(1, 1, 3, 0, 0);
static E8M0_TABLE: [f32; 256] = build_e8m0_table();

/// Encode a bf16 value (exactly widened to f32 first, so there is one rounding).
#[inline]
pub fn encode_bf16(format: Format, x: bf16, overflow: Overflow) -> u8 {
    format.encode_rne(x.to_f32(), overflow)
}

/// Encode an f16 value (exactly widened to f32 first, so there is one rounding).
#[inline]
pub fn encode_f16(format: Format, x: f16, overflow: Overflow) -> u8 {
    format.encode_rne(x.to_f32(), overflow)
}
