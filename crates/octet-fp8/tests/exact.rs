//! Exactness of every format against an oracle written here, independent of the
//! bit-manipulating encoder: the representable values come from the formats'
//! definitions in f64, and rounding is a nearest-value search with ties to the
//! even code.

use half::{bf16, f16};
use octet_fp8::convert::{decode_slice, encode_fp4_slice, encode_slice, fp4_code};
use octet_fp8::{Format, Overflow, Rounding};
use rand::{Rng, SeedableRng};

/// The oracle of one signed minifloat.
struct Oracle {
    /// Non-negative finite values, index = code.
    values: Vec<f64>,
    /// The value the next code past max would have (the overflow candidate).
    beyond: f64,
    max_code: u8,
    overflow_code: u8,
    nan_code: u8,
    sign_bit: u8,
}

impl Oracle {
    fn new(f: Format) -> Oracle {
        let (e_bits, m_bits, bias, max_code, overflow_code, nan_code, sign_bit): (
            u32,
            u32,
            i32,
            u8,
            u8,
            u8,
            u8,
        ) = match f {
            Format::E4M3 => (4, 3, 7, 0x7E, 0x7F, 0x7F, 0x80),
            Format::E5M2 => (5, 2, 15, 0x7B, 0x7C, 0x7F, 0x80),
            Format::E2M1 => (2, 1, 1, 0x7, 0x7, 0x7, 0x8),
            Format::E8M0 => unreachable!(),
        };
        let _ = e_bits;
        let value = |code: u32| -> f64 {
            let e = (code >> m_bits) as i32;
            let m = (code & ((1 << m_bits) - 1)) as f64 / (1u32 << m_bits) as f64;
            if e == 0 {
                m * 2f64.powi(1 - bias)
            } else {
                (1.0 + m) * 2f64.powi(e - bias)
            }
        };
        let values = (0..=max_code as u32).map(value).collect();
        Oracle {
            values,
            beyond: value(max_code as u32 + 1),
            max_code,
            overflow_code,
            nan_code,
            sign_bit,
        }
    }

    fn encode(&self, x: f64, overflow: Overflow) -> u8 {
        let sign = if x.is_sign_negative() {
            self.sign_bit
        } else {
            0
        };
        if x.is_nan() {
            return self.nan_code | sign;
        }
        let a = x.abs();
        let over = |s: &Oracle| match overflow {
            Overflow::Saturate => s.max_code | sign,
            Overflow::Cast => s.overflow_code | sign,
        };
        if a >= self.beyond {
            return over(self);
        }
        // Candidates: every value plus the overflow candidate (code max+1).
        let n = self.values.len();
        let i = self.values.partition_point(|&v| v <= a); // first value > a
        let lo = i - 1; // values[0] = 0 <= a
        let (lo_v, hi_v) = (
            self.values[lo],
            if i < n { self.values[i] } else { self.beyond },
        );
        let pick_hi = if a - lo_v > hi_v - a {
            true
        } else if a - lo_v < hi_v - a {
            false
        } else {
            (lo & 1) == 1 // tie: the even code wins
        };
        if !pick_hi {
            lo as u8 | sign
        } else if i < n {
            i as u8 | sign
        } else {
            over(self)
        }
    }
}

/// E8M0 oracle: nearest power of two in [2^-127, 2^127], ties up; 0 and values
/// below clamp to 2^-127; negative and NaN to NaN.
fn e8m0_oracle(x: f64, overflow: Overflow) -> u8 {
    if x.is_nan() || x < 0.0 {
        return 0xFF;
    }
    let mut best = 0u8;
    for code in 0u8..=0xFE {
        let v = 2f64.powi(code as i32 - 127);
        if v <= x {
            best = code;
        }
    }
    let lo = 2f64.powi(best as i32 - 127);
    if x <= lo {
        return best; // x below 2^-127, or exact
    }
    let up = x - lo >= 2.0 * lo - x;
    if !up {
        return best;
    }
    if best == 0xFE {
        return match overflow {
            Overflow::Saturate => 0xFE,
            Overflow::Cast => 0xFF,
        };
    }
    best + 1
}

const MODES: [Overflow; 2] = [Overflow::Saturate, Overflow::Cast];
const MINIFLOATS: [Format; 3] = [Format::E4M3, Format::E5M2, Format::E2M1];

fn expected(f: Format, x: f32, mode: Overflow) -> u8 {
    match f {
        Format::E8M0 => e8m0_oracle(x as f64, mode),
        Format::E2M1 => Oracle::new(f).encode(x as f64, Overflow::Saturate),
        _ => Oracle::new(f).encode(x as f64, mode),
    }
}

fn check_all(inputs: impl Iterator<Item = f32> + Clone, what: &str) {
    for f in Format::ALL {
        let oracle = (f != Format::E8M0).then(|| Oracle::new(f));
        for mode in MODES {
            let mut checked = 0;
            for x in inputs.clone() {
                let want = match &oracle {
                    Some(o) if f == Format::E2M1 => o.encode(x as f64, Overflow::Saturate),
                    Some(o) => o.encode(x as f64, mode),
                    None => e8m0_oracle(x as f64, mode),
                };
                let got = f.encode_rne(x, mode);
                assert_eq!(
                    got,
                    want,
                    "{what}: {f} {mode:?} x={x:e} ({:#010x}): got {got:#04x} want {want:#04x}",
                    x.to_bits()
                );
                checked += 1;
            }
            assert!(checked > 0);
        }
    }
}

#[test]
fn every_bf16_input_rounds_like_the_oracle() {
    check_all((0..=u16::MAX).map(|b| bf16::from_bits(b).to_f32()), "bf16");
    // The bf16 entry point is the f32 one after an exact widening.
    for b in (0..=u16::MAX).step_by(7) {
        let x = bf16::from_bits(b);
        assert_eq!(
            octet_fp8::format::encode_bf16(Format::E4M3, x, Overflow::Cast),
            Format::E4M3.encode_rne(x.to_f32(), Overflow::Cast)
        );
    }
}

#[test]
fn every_f16_input_rounds_like_the_oracle() {
    check_all((0..=u16::MAX).map(|b| f16::from_bits(b).to_f32()), "f16");
    for b in (0..=u16::MAX).step_by(7) {
        let x = f16::from_bits(b);
        assert_eq!(
            octet_fp8::format::encode_f16(Format::E5M2, x, Overflow::Saturate),
            Format::E5M2.encode_rne(x.to_f32(), Overflow::Saturate)
        );
    }
}

#[test]
fn random_f32_round_like_the_oracle() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xF8);
    // Uniform bit patterns cover NaN, inf, subnormals and every binade; a second
    // set concentrates on each format's range where rounding is interesting.
    let bits: Vec<f32> = (0..200_000).map(|_| f32::from_bits(rng.random())).collect();
    check_all(bits.iter().copied(), "random f32 bits");
    let ranged: Vec<f32> = (0..200_000)
        .map(|_| {
            let e: i32 = rng.random_range(-20..20);
            let m: f32 = rng.random_range(1.0..2.0);
            let s = if rng.random::<bool>() { -1.0 } else { 1.0 };
            s * m * 2f32.powi(e)
        })
        .collect();
    check_all(ranged.iter().copied(), "random f32 in range");
}

#[test]
fn decode_table_matches_definition_and_round_trips() {
    for f in MINIFLOATS {
        let o = Oracle::new(f);
        for code in 0..f.num_codes() {
            let code = code as u8;
            let v = f.decode(code);
            let mag = code & (o.sign_bit - 1);
            let neg = code & o.sign_bit != 0;
            if f.is_nan(code) {
                assert!(v.is_nan(), "{f} {code:#x} should be NaN");
                assert_eq!(
                    f.encode_rne(v, Overflow::Cast) & (o.sign_bit - 1),
                    o.nan_code,
                    "{f} NaN re-encodes as NaN"
                );
                continue;
            }
            if f == Format::E5M2 && mag == 0x7C {
                assert_eq!(
                    v,
                    if neg {
                        f32::NEG_INFINITY
                    } else {
                        f32::INFINITY
                    }
                );
                assert_eq!(f.encode_rne(v, Overflow::Cast), code);
                assert_eq!(f.encode_rne(v, Overflow::Saturate), 0x7B | (code & 0x80));
                continue;
            }
            let want = o.values[mag as usize] * if neg { -1.0 } else { 1.0 };
            assert_eq!(v as f64, want, "{f} decode {code:#x}");
            assert_eq!(v.is_sign_negative(), neg, "{f} sign of {code:#x} (-0 kept)");
            for mode in MODES {
                assert_eq!(f.encode_rne(v, mode), code, "{f} round trip {code:#x}");
            }
        }
    }
    for code in 0..=0xFEu8 {
        let v = Format::E8M0.decode(code);
        assert_eq!(v as f64, 2f64.powi(code as i32 - 127));
        assert_eq!(Format::E8M0.encode_rne(v, Overflow::Cast), code);
    }
    assert!(Format::E8M0.decode(0xFF).is_nan());
}

#[test]
fn boundaries() {
    use Overflow::{Cast, Saturate};
    let e4 = Format::E4M3;
    let e5 = Format::E5M2;
    let next_up = |x: f32| f32::from_bits(x.to_bits() + 1);
    let next_down = |x: f32| f32::from_bits(x.to_bits() - 1);
    // Max and the overflow threshold (half-way to the virtual next value).
    assert_eq!(e4.decode(0x7E), 448.0);
    assert_eq!(e4.encode_rne(464.0, Cast), 0x7E); // tie: 0x7E is even
    assert_eq!(e4.encode_rne(next_up(464.0), Cast), 0x7F); // NaN
    assert_eq!(e4.encode_rne(next_up(464.0), Saturate), 0x7E);
    assert_eq!(e4.encode_rne(-1e30, Saturate), 0xFE);
    assert_eq!(e4.encode_rne(f32::INFINITY, Cast), 0x7F);
    assert_eq!(e4.encode_rne(f32::NEG_INFINITY, Saturate), 0xFE);
    assert_eq!(e5.decode(0x7B), 57344.0);
    assert_eq!(e5.encode_rne(61440.0, Cast), 0x7C); // tie: inf (0x7C) is even
    assert_eq!(e5.encode_rne(next_down(61440.0), Cast), 0x7B);
    assert_eq!(e5.encode_rne(61440.0, Saturate), 0x7B);
    // Min normal, min subnormal and the half-way points below them.
    assert_eq!(e4.encode_rne(2f32.powi(-6), Cast), 0x08);
    assert_eq!(e4.encode_rne(2f32.powi(-9), Cast), 0x01);
    assert_eq!(e4.encode_rne(2f32.powi(-10), Cast), 0x00); // tie to even 0
    assert_eq!(e4.encode_rne(next_up(2f32.powi(-10)), Cast), 0x01);
    assert_eq!(e4.encode_rne(3.0 * 2f32.powi(-10), Cast), 0x02); // tie 1.5 -> 2
    assert_eq!(e4.encode_rne(-2f32.powi(-11), Cast), 0x80); // -0
    assert_eq!(e4.encode_rne(15.0 * 2f32.powi(-10), Cast), 0x08); // 7.5 units -> min normal
    assert_eq!(e5.encode_rne(2f32.powi(-16), Cast), 0x01);
    assert_eq!(e5.encode_rne(2f32.powi(-17), Cast), 0x00);
    assert_eq!(e5.encode_rne(2f32.powi(-14), Cast), 0x04);
    // -0 and NaN.
    assert_eq!(e4.encode_rne(-0.0, Cast), 0x80);
    assert_eq!(e5.encode_rne(f32::NAN, Saturate) & 0x7F, 0x7F);
    assert_eq!(e4.encode_rne(-f32::NAN, Saturate), 0xFF);
    // FP4: 0.25 ties to 0, 0.75 ties to 1.0 (code 2, even), 5 ties to 4, beyond 6 saturates.
    let f4 = Format::E2M1;
    assert_eq!(f4.encode_rne(0.25, Cast), 0x0);
    assert_eq!(f4.encode_rne(0.75, Cast), 0x2);
    assert_eq!(f4.encode_rne(5.0, Cast), 0x6);
    assert_eq!(f4.encode_rne(7.0, Cast), 0x7);
    assert_eq!(f4.encode_rne(-100.0, Cast), 0xF);
}

#[test]
fn stochastic_rounding_picks_a_neighbour_and_is_unbiased() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for f in [Format::E4M3, Format::E5M2, Format::E2M1] {
        for _ in 0..40 {
            let x: f32 = rng.random_range(-f.max() * 0.9..f.max() * 0.9);
            let down = f.decode(f.encode_rne(x, Overflow::Saturate));
            // The two neighbours of x in the format.
            let table: Vec<f64> = f
                .table()
                .iter()
                .map(|&v| v as f64)
                .filter(|v| v.is_finite())
                .collect();
            let lo = table
                .iter()
                .copied()
                .filter(|&v| v <= x as f64)
                .fold(f64::MIN, f64::max);
            let hi = table
                .iter()
                .copied()
                .filter(|&v| v >= x as f64)
                .fold(f64::MAX, f64::min);
            let _ = down;
            let n = 20_000u64;
            let seed: u64 = rng.random();
            let mut sum = 0f64;
            for i in 0..n {
                let q = f.decode(f.encode(x, Overflow::Saturate, Rounding::Stochastic { seed }, i))
                    as f64;
                assert!(q == lo || q == hi, "{f}: {x} -> {q} not in [{lo}, {hi}]");
                sum += q;
            }
            // E[q] = x; the mean of n draws has std <= (hi - lo) / (2 sqrt n). Five sigma:
            // the seeds are fixed, so this either always passes or always fails.
            let tol = 5.0 * (hi - lo) / (2.0 * (n as f64).sqrt());
            assert!(
                (sum / n as f64 - x as f64).abs() <= tol.max(1e-12),
                "{f}: mean {} vs {x}",
                sum / n as f64
            );
        }
    }
}

#[test]
fn slice_conversions_equal_the_scalar_rule() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let n = 300_001; // above the parallel threshold, odd length
    let x: Vec<f32> = (0..n).map(|_| rng.random_range(-600.0..600.0)).collect();
    let xb: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
    let xh: Vec<f16> = x.iter().map(|&v| f16::from_f32(v)).collect();
    let scale = 0.75;
    for f in [Format::E4M3, Format::E5M2] {
        for rounding in [Rounding::NearestEven, Rounding::Stochastic { seed: 11 }] {
            let mut d = vec![0u8; n];
            encode_slice(f, &x, scale, &mut d, Overflow::Saturate, rounding, 5);
            for i in (0..n).step_by(97) {
                assert_eq!(
                    d[i],
                    f.encode(x[i] * scale, Overflow::Saturate, rounding, 5 + i as u64),
                    "{f} {i}"
                );
            }
            let mut db = vec![0u8; n];
            encode_slice(f, &xb, scale, &mut db, Overflow::Saturate, rounding, 0);
            let mut dh = vec![0u8; n];
            encode_slice(f, &xh, scale, &mut dh, Overflow::Saturate, rounding, 0);
            for i in (0..n).step_by(89) {
                assert_eq!(
                    db[i],
                    f.encode(
                        xb[i].to_f32() * scale,
                        Overflow::Saturate,
                        rounding,
                        i as u64
                    )
                );
                assert_eq!(
                    dh[i],
                    f.encode(
                        xh[i].to_f32() * scale,
                        Overflow::Saturate,
                        rounding,
                        i as u64
                    )
                );
            }
            let mut back = vec![0f32; n];
            decode_slice(f, &d, 2.0, &mut back);
            for i in (0..n).step_by(101) {
                assert_eq!(back[i], f.decode(d[i]) * 2.0);
            }
        }
    }
    let mut p = vec![0u8; n.div_ceil(2)];
    encode_fp4_slice(&x, 0.01, &mut p, Rounding::NearestEven, 0);
    for i in (0..n).step_by(13) {
        assert_eq!(
            fp4_code(&p, i),
            Format::E2M1.encode_rne(x[i] * 0.01, Overflow::Saturate),
            "fp4 {i}"
        );
    }
    assert_eq!(p[n / 2] >> 4, 0, "odd tail leaves the high nibble zero");
}

#[test]
fn oracle_helper_agrees_with_itself() {
    // Guards the oracle: a few values computed by hand.
    assert_eq!(expected(Format::E4M3, 1.0, Overflow::Cast), 0x38);
    assert_eq!(expected(Format::E5M2, 1.0, Overflow::Cast), 0x3C);
    assert_eq!(expected(Format::E2M1, 3.0, Overflow::Cast), 0x5);
    assert_eq!(expected(Format::E8M0, 1.0, Overflow::Cast), 127);
    assert_eq!(expected(Format::E8M0, 1.5, Overflow::Cast), 128);
    assert_eq!(expected(Format::E8M0, 1.49, Overflow::Cast), 127);
}

/// Far below the smallest subnormal (more than 31 bits dropped), a value still
/// rounds up with probability x / quantum, not a probability clamped at 2^-31
/// of the mantissa (which made E[q] 8-16x too large at 2^-10 to 2^-12 of a
/// quantum).
#[test]
fn stochastic_rounding_is_unbiased_far_below_the_smallest_subnormal() {
    let n = 1u64 << 20;
    for f in [Format::E4M3, Format::E5M2, Format::E2M1] {
        // The smallest positive value: code 1.
        let quantum = f.decode(1) as f64;
        for k in [6, 10, 12] {
            for frac in [1.0f64, 0.75] {
                let x = (quantum * frac * (2f64).powi(-k)) as f32;
                let p = x as f64 / quantum;
                let seed = 0x5eed ^ (k as u64) << 8;
                let ups = (0..n)
                    .filter(|&i| {
                        let c = f.encode(x, Overflow::Saturate, Rounding::Stochastic { seed }, i);
                        assert!(c == 0 || c == 1, "{f}: {x} -> code {c}");
                        c == 1
                    })
                    .count() as f64;
                let (want, sd) = (n as f64 * p, (n as f64 * p * (1.0 - p)).sqrt());
                // Five sigma (fixed seeds: always passes or always fails).
                assert!(
                    (ups - want).abs() <= 5.0 * sd,
                    "{f}: x = {x:e} rounded up {ups} times in {n}, expected {want:.1} +- {sd:.1}"
                );
            }
        }
    }
}

/// E2M1 has no NaN: a NaN encodes to 6 with its sign bit, as the module docs say.
#[test]
fn fp4_nan_encodes_to_six_with_its_sign() {
    let f = Format::E2M1;
    for rounding in [Rounding::NearestEven, Rounding::Stochastic { seed: 3 }] {
        for overflow in [Overflow::Saturate, Overflow::Cast] {
            assert_eq!(f.encode(f32::NAN, overflow, rounding, 0), 0x7);
            assert_eq!(f.encode(-f32::NAN, overflow, rounding, 0), 0xF);
            assert_eq!(f.decode(0xF), -6.0);
        }
    }
}
