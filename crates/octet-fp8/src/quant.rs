//! Quantized tensors and the reference quantizer.
//!
//! Every scaling recipe is one rule applied per block: the tensor is cut into
//! `block.0 x block.1` tiles (the whole tensor, a row, 1x128, 128x128, 1x32,
//! 1x16, 16x16), each tile gets a scale from its amax, and its elements are
//! cast with that scale. Edge tiles of ragged shapes are simply smaller: their
//! amax is taken over the elements that exist, so no padding is ever visible.
//!
//! A 2-D operand `(rows, cols)` is stored row-major with `cols` as the
//! reduction dimension of the GEMM that reads it ("K-major"). Its column-wise
//! copy is the transpose `(cols, rows)`, quantized in its own right, so block
//! and MX scales run along the right dimension for the backward GEMMs.

use crate::alloc::{alloc_capacity, alloc_vec};
use crate::convert::{encode_fp4_slice, encode_slice, fp4_bytes, fp4_code, ToF32};
use crate::format::{Format, Overflow, Rounding};
use crate::scale::{mx_exponent, pow2, scale_from_amax};
use crate::Error;
use rayon::prelude::*;

/// Scaling granularity: which elements share a scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Granularity {
    /// One scale for the whole tensor.
    Tensor,
    /// One scale per row (row = along the reduction dimension).
    Row,
    /// One scale per `rows x cols` tile.
    Tile {
        /// Tile height.
        rows: usize,
        /// Tile width (along the reduction dimension).
        cols: usize,
    },
}

impl Granularity {
    /// Block dims for a `(rows, cols)` tensor.
    pub fn block_dims(self, rows: usize, cols: usize) -> (usize, usize) {
        match self {
            Granularity::Tensor => (rows.max(1), cols.max(1)),
            Granularity::Row => (1, cols.max(1)),
            Granularity::Tile { rows, cols } => (rows, cols),
        }
    }
}

/// How a block's scale is chosen from its amax.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ScaleRule {
    /// `scale = max / amax` per block (see [`scale_from_amax`]), stored as f32 `scale_inv`.
    Amax {
        /// Round the scale down to a power of two.
        power_of_two: bool,
    },
    /// A given per-tensor scale (delayed scaling); stored as f32 `scale_inv`.
    Fixed(f32),
    /// MX: power-of-two scale stored as E8M0 (see [`mx_exponent`]).
    E8M0,
    /// NVFP4: E4M3 block scales under an f32 per-tensor scale.
    Nvfp4,
}

/// Everything needed to quantize one usage of a 2-D tensor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QuantSpec {
    /// Element format.
    pub format: Format,
    /// Which elements share a scale (in the coordinates of the copy being made).
    pub granularity: Granularity,
    /// How the scale is computed.
    pub rule: ScaleRule,
    /// Rounding of the elements.
    pub rounding: Rounding,
}

/// The stored scales of one quantized copy, one entry per block (row-major over the block grid).
#[derive(Clone, Debug, PartialEq)]
pub enum Scales {
    /// Dequantization factors `scale_inv`.
    F32(Vec<f32>),
    /// E8M0 codes; factor `2^(code - 127)`.
    E8M0(Vec<u8>),
    /// NVFP4: E4M3 codes (factor `decode(code)`) and the per-tensor encode
    /// scale `global` (factor `1 / global`).
    Nvfp4 {
        /// Block scale codes.
        codes: Vec<u8>,
        /// Per-tensor encode scale `6 * 448 / amax`.
        global: f32,
    },
}

impl Scales {
    /// Bytes the scales occupy.
    pub fn bytes(&self) -> usize {
        match self {
            Scales::F32(v) => 4 * v.len(),
            Scales::E8M0(v) => v.len(),
            Scales::Nvfp4 { codes, .. } => codes.len() + 4,
        }
    }
}

/// One quantized copy: a row-major `(rows, cols)` matrix of codes with its scales.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantData {
    /// Rows of this copy.
    pub rows: usize,
    /// Columns of this copy (the reduction dimension).
    pub cols: usize,
    /// Element format.
    pub format: Format,
    /// Codes, row-major; E2M1 packs two per byte within each row (row stride `fp4_bytes(cols)`).
    pub data: Vec<u8>,
    /// Block dims `(rows, cols)` in this copy's coordinates.
    pub block: (usize, usize),
    /// One scale per block.
    pub scales: Scales,
    /// Elements whose scaled magnitude exceeded the format's max and were clamped.
    pub saturated: usize,
    /// Non-zero elements that quantized to zero.
    pub underflowed: usize,
}

impl QuantData {
    /// Bytes per row of `data`.
    pub fn row_stride(&self) -> usize {
        if self.format == Format::E2M1 {
            fp4_bytes(self.cols)
        } else {
            self.cols
        }
    }

    /// Block grid `(block rows, block cols)`.
    pub fn grid(&self) -> (usize, usize) {
        (
            self.rows.div_ceil(self.block.0),
            self.cols.div_ceil(self.block.1),
        )
    }

    /// The code of element `(r, c)`.
    #[inline]
    pub fn code(&self, r: usize, c: usize) -> u8 {
        if self.format == Format::E2M1 {
            fp4_code(&self.data[r * self.row_stride()..], c)
        } else {
            self.data[r * self.cols + c]
        }
    }

    /// Per-block dequantization factor of block `(br, bc)` (without the tensor factor).
    #[inline]
    pub fn block_factor(&self, br: usize, bc: usize) -> f32 {
        let i = br * self.grid().1 + bc;
        match &self.scales {
            Scales::F32(v) => v[i],
            Scales::E8M0(v) => Format::E8M0.decode(v[i]),
            Scales::Nvfp4 { codes, .. } => Format::E4M3.decode(codes[i]),
        }
    }

    /// Factor applied to the whole tensor after the block factors (1 except for NVFP4).
    pub fn tensor_factor(&self) -> f32 {
        match &self.scales {
            Scales::Nvfp4 { global, .. } => 1.0 / global,
            _ => 1.0,
        }
    }

    /// Bytes of codes plus scales.
    pub fn bytes(&self) -> usize {
        self.data.len() + self.scales.bytes()
    }

    /// Dequantize to f32: `(decode(q) * block_factor) * tensor_factor`,
    /// row-major `(rows, cols)`; [`Error::Alloc`] when the matrix cannot be
    /// allocated.
    pub fn dequantize(&self) -> Result<Vec<f32>, Error> {
        self.dequantize_as(false)
    }

    /// [`QuantData::dequantize`], written transposed (`(cols, rows)`) when
    /// `transposed`: the same values, without a second matrix to transpose
    /// into.
    fn dequantize_as(&self, transposed: bool) -> Result<Vec<f32>, Error> {
        let (rows, cols) = (self.rows, self.cols);
        let n = rows
            .checked_mul(cols)
            .ok_or_else(|| Error::Shape(format!("dequantize: ({rows}, {cols}) overflows usize")))?;
        let what = format_args!("the dequantized ({rows}, {cols}) {} matrix", self.format);
        let mut out = alloc_vec(n, 0f32, what)?;
        let table = self.format.table();
        let tf = self.tensor_factor();
        for r in 0..rows {
            for c in 0..cols {
                let f = self.block_factor(r / self.block.0, c / self.block.1);
                let i = if transposed {
                    c * rows + r
                } else {
                    r * cols + c
                };
                out[i] = table[self.code(r, c) as usize] * f * tf;
            }
        }
        Ok(out)
    }
}

/// Which copies a consumer needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Usage {
    /// Row-wise (K-major) data for the forward GEMM.
    pub rowwise: bool,
    /// Column-wise (transposed) data for a backward GEMM.
    pub colwise: bool,
}

impl Usage {
    /// Row-wise only.
    pub const ROW: Usage = Usage {
        rowwise: true,
        colwise: false,
    };
    /// Column-wise only.
    pub const COL: Usage = Usage {
        rowwise: false,
        colwise: true,
    };
    /// Both copies.
    pub const BOTH: Usage = Usage {
        rowwise: true,
        colwise: true,
    };
}

/// Which copy of a [`QuantizedTensor`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// The `(rows, cols)` copy.
    Rowwise,
    /// The `(cols, rows)` transposed copy.
    Colwise,
}

/// A quantized 2-D tensor `(rows, cols)` with the copies its consumers asked for.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizedTensor {
    /// Logical rows.
    pub rows: usize,
    /// Logical columns.
    pub cols: usize,
    /// Amax of the whole source tensor (for delayed scaling and telemetry).
    pub amax: f32,
    /// `(rows, cols)` copy, if made.
    pub rowwise: Option<QuantData>,
    /// `(cols, rows)` copy, if made.
    pub colwise: Option<QuantData>,
}

impl QuantizedTensor {
    /// The copy for `layout`, or an error naming what was not made.
    pub fn get(&self, layout: Layout) -> Result<&QuantData, Error> {
        match layout {
            Layout::Rowwise => self.rowwise.as_ref(),
            Layout::Colwise => self.colwise.as_ref(),
        }
        .ok_or(Error::MissingUsage(layout))
    }

    /// Bytes held (codes and scales of every copy made).
    pub fn bytes(&self) -> usize {
        self.rowwise.as_ref().map_or(0, QuantData::bytes)
            + self.colwise.as_ref().map_or(0, QuantData::bytes)
    }

    /// Keep only the copies in `keep` (drops the others' memory).
    pub fn retain(mut self, keep: Usage) -> QuantizedTensor {
        if !keep.rowwise {
            self.rowwise = None;
        }
        if !keep.colwise {
            self.colwise = None;
        }
        self
    }

    /// Dequantize to a row-major `(rows, cols)` f32 matrix from whichever
    /// copy exists (row-wise first); [`Error::Alloc`] when the matrix cannot
    /// be allocated.
    pub fn dequantize(&self) -> Result<Vec<f32>, Error> {
        if let Some(q) = &self.rowwise {
            return q.dequantize();
        }
        self.get(Layout::Colwise)?.dequantize_as(true)
    }
}

/// Numerics telemetry of one quantization: how much of the tensor the format lost.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Telemetry {
    /// Amax of the source tensor.
    pub amax: f32,
    /// Share of elements clamped to the format's max.
    pub saturated: f64,
    /// Share of non-zero elements flushed to zero.
    pub underflowed: f64,
}

impl QuantizedTensor {
    /// Telemetry from the row-wise copy (the column-wise one if only it was made).
    pub fn telemetry(&self) -> Telemetry {
        let n = (self.rows * self.cols).max(1) as f64;
        let q = self.rowwise.as_ref().or(self.colwise.as_ref());
        Telemetry {
            amax: self.amax,
            saturated: q.map_or(0.0, |q| q.saturated as f64 / n),
            underflowed: q.map_or(0.0, |q| q.underflowed as f64 / n),
        }
    }
}

/// Row-major transpose of a `(rows, cols)` matrix.
///
/// Tiled (32x32) so that reads and writes both stay in cache lines, and split
/// across threads by bands of output rows.
///
/// Aborts the process if the output cannot be allocated: where the size
/// follows user input, use [`try_transpose`].
pub fn transpose<T: Copy + Default + Send + Sync>(x: &[T], rows: usize, cols: usize) -> Vec<T> {
    let mut out = vec![T::default(); rows * cols];
    transpose_into(x, rows, cols, &mut out, |v| v);
    out
}

/// [`transpose`], or [`Error::Alloc`] when the output cannot be allocated
/// (and [`Error::Shape`] when `x` does not hold `rows * cols` elements).
pub fn try_transpose<T: Copy + Default + Send + Sync>(
    x: &[T],
    rows: usize,
    cols: usize,
) -> Result<Vec<T>, Error> {
    if rows.checked_mul(cols) != Some(x.len()) {
        return Err(Error::Shape(format!(
            "transpose: {} elements for shape ({rows}, {cols})",
            x.len()
        )));
    }
    let what = format_args!("the ({cols}, {rows}) transpose of a matrix");
    let mut out = alloc_vec(x.len(), T::default(), what)?;
    transpose_into(x, rows, cols, &mut out, |v| v);
    Ok(out)
}

/// The transpose of the `(rows, cols)` matrix `x` in f32, for the
/// column-wise copy: one buffer of `rows * cols` f32, or [`Error::Alloc`].
/// The conversion is exact, so this is the transpose of the f32 values.
fn transposed_f32<T: ToF32>(x: &[T], rows: usize, cols: usize) -> Result<Vec<f32>, Error> {
    let n = rows
        .checked_mul(cols)
        .ok_or_else(|| Error::Shape(format!("quantize: ({rows}, {cols}) overflows usize")))?;
    let what = format_args!("the ({cols}, {rows}) transposed input of a column-wise FP8 copy");
    let mut out = alloc_vec(n, 0f32, what)?;
    transpose_into(x, rows, cols, &mut out, ToF32::to_f32_exact);
    Ok(out)
}

/// `out (cols, rows)[c, r] = f(x (rows, cols)[r, c])`, tiled (32x32) and split
/// across threads by bands of output rows. `out` holds `rows * cols` elements.
fn transpose_into<T: Copy + Sync, U: Send>(
    x: &[T],
    rows: usize,
    cols: usize,
    out: &mut [U],
    f: impl Fn(T) -> U + Sync,
) {
    const B: usize = 32;
    if rows == 0 || cols == 0 {
        return;
    }
    out.par_chunks_mut(B * rows)
        .enumerate()
        .for_each(|(band, o)| {
            let c0 = band * B;
            let c1 = (c0 + B).min(cols);
            for r0 in (0..rows).step_by(B) {
                for r in r0..(r0 + B).min(rows) {
                    for c in c0..c1 {
                        o[(c - c0) * rows + r] = f(x[r * cols + c]);
                    }
                }
            }
        });
}

/// Amax of `x`, or an error naming the first NaN/inf element.
pub fn amax<T: ToF32>(x: &[T]) -> Result<f32, Error> {
    let mut m = 0f32;
    for (i, &v) in x.iter().enumerate() {
        let v = v.to_f32_exact();
        if !v.is_finite() {
            return Err(Error::NonFinite { index: i, value: v });
        }
        m = m.max(v.abs());
    }
    Ok(m)
}

/// Quantize a row-major `(rows, cols)` tensor into the copies `usage` asks for.
///
/// `row_spec` describes the row-wise copy and `col_spec` the column-wise one
/// (in the transpose's coordinates). `tensor_amax` overrides the locally
/// computed amax where a per-tensor amax is needed (per-tensor current
/// scaling, the NVFP4 global scale): pass the all-reduced amax here when the
/// tensor is sharded, so every rank scales as one rank would.
///
/// Errors: empty tensor, length mismatch, a usage with no copy, a non-finite
/// input element (the first one is named), a format the spec cannot use, and
/// [`Error::Alloc`] when a copy (or the column-wise copy's transposed input)
/// cannot be allocated.
pub fn quantize<T: ToF32>(
    x: &[T],
    rows: usize,
    cols: usize,
    row_spec: &QuantSpec,
    col_spec: &QuantSpec,
    usage: Usage,
    tensor_amax: Option<f32>,
) -> Result<QuantizedTensor, Error> {
    if rows == 0 || cols == 0 {
        return Err(Error::Empty { rows, cols });
    }
    if rows.checked_mul(cols) != Some(x.len()) {
        return Err(Error::Shape(format!(
            "quantize: {} elements for shape ({rows}, {cols})",
            x.len()
        )));
    }
    if !usage.rowwise && !usage.colwise {
        return Err(Error::Shape("quantize: usage asks for no copy".into()));
    }
    let local = amax(x)?;
    let amax = match tensor_amax {
        Some(a) if !a.is_finite() || a < local => return Err(Error::BadAmax(a)),
        Some(a) => a,
        None => local,
    };
    let rowwise = usage
        .rowwise
        .then(|| quantize_copy(x, rows, cols, row_spec, amax))
        .transpose()?;
    let colwise = if usage.colwise {
        let xt = transposed_f32(x, rows, cols)?;
        Some(quantize_copy(&xt, cols, rows, col_spec, amax)?)
    } else {
        None
    };
    Ok(QuantizedTensor {
        rows,
        cols,
        amax,
        rowwise,
        colwise,
    })
}

/// What a block stores: an f32 `scale_inv`, or a scale code (E8M0 or E4M3).
#[derive(Clone, Copy)]
enum Stored {
    F32(f32),
    Code(u8),
}

/// Quantize one `(rows, cols)` copy. Inputs are known finite; `amax` is the tensor amax.
fn quantize_copy<T: ToF32>(
    x: &[T],
    rows: usize,
    cols: usize,
    spec: &QuantSpec,
    amax: f32,
) -> Result<QuantData, Error> {
    let f = spec.format;
    match (spec.rule, f) {
        (_, Format::E8M0) => {
            return Err(Error::Unsupported(
                "E8M0 is a scale format, not an element format".into(),
            ))
        }
        (ScaleRule::Nvfp4, Format::E2M1) => {}
        (ScaleRule::Nvfp4, f) => {
            return Err(Error::Unsupported(format!(
                "the NVFP4 scale rule quantizes to E2M1 elements, not {f}"
            )))
        }
        (_, Format::E2M1) => {
            return Err(Error::Unsupported(
                "E2M1 elements go with the NVFP4 scale rule only".into(),
            ))
        }
        _ => {}
    }
    let block = spec.granularity.block_dims(rows, cols);
    if block.0 == 0 || block.1 == 0 {
        return Err(Error::Shape("quantize: zero-sized block".into()));
    }
    if f == Format::E2M1 && block.1 % 2 == 1 && block.1 < cols {
        return Err(Error::Shape(format!(
            "quantize: FP4 blocks need an even width, got {}",
            block.1
        )));
    }
    let (gr, gc) = (rows.div_ceil(block.0), cols.div_ceil(block.1));
    let stride = if f == Format::E2M1 {
        fp4_bytes(cols)
    } else {
        cols
    };
    let overflow = || Error::Shape(format!("quantize: ({rows}, {cols}) overflows usize"));
    let blocks = gr.checked_mul(gc).ok_or_else(overflow)?;
    let codes_len = rows.checked_mul(stride).ok_or_else(overflow)?;
    // NVFP4's per-tensor encode scale: `448 * 6 / amax` rounded once, as
    // Transformer Engine computes it (`448 / amax` then `* 6` rounds twice and
    // is an ulp off for about a quarter of amaxes); capped at the largest f32;
    // 6 (a unit E4M3 scale) for an all-zero tensor. `amax` is finite.
    let global = match spec.rule {
        ScaleRule::Nvfp4 if amax == 0.0 => Format::E2M1.max(),
        ScaleRule::Nvfp4 => (Format::E4M3.max() * Format::E2M1.max() / amax).min(f32::MAX),
        _ => 1.0,
    };
    // Phase 1, per block (in parallel): the amax, the multiplier applied
    // before the cast, and what is stored (an f32 scale_inv or a scale code).
    let mut per_block = alloc_vec(
        blocks,
        (0f32, Stored::F32(0.0)),
        format_args!("the {gr}x{gc} block scales of a ({rows}, {cols}) FP8 copy"),
    )?;
    per_block
        .par_iter_mut()
        .enumerate()
        .try_for_each(|(b, out)| {
            let (br, bc) = (b / gc, b % gc);
            let (r0, r1) = (br * block.0, ((br + 1) * block.0).min(rows));
            let (c0, c1) = (bc * block.1, ((bc + 1) * block.1).min(cols));
            // A per-tensor block takes the tensor amax, which may be a
            // cross-rank (all-reduced) one. Inputs are finite (checked by the caller).
            let bmax = if spec.granularity == Granularity::Tensor {
                amax
            } else {
                (r0..r1)
                    .flat_map(|r| &x[r * cols + c0..r * cols + c1])
                    .fold(0f32, |m, v| m.max(v.to_f32_exact().abs()))
            };
            *out = match spec.rule {
                ScaleRule::Amax { power_of_two } => {
                    let s =
                        scale_from_amax(bmax, f, 0, power_of_two).ok_or(Error::BadAmax(bmax))?;
                    (s, Stored::F32(1.0 / s))
                }
                ScaleRule::Fixed(s) => {
                    // Its inverse is stored: below about 2.9e-39 that is infinite.
                    if !(s.is_finite() && s > 0.0 && (1.0 / s).is_finite()) {
                        return Err(Error::BadScale(s));
                    }
                    (s, Stored::F32(1.0 / s))
                }
                ScaleRule::E8M0 => {
                    let e = mx_exponent(bmax, f).ok_or(Error::BadAmax(bmax))?;
                    (pow2(-e), Stored::Code((e + 127) as u8))
                }
                ScaleRule::Nvfp4 => {
                    let code = Format::E4M3
                        .encode_rne(bmax / Format::E2M1.max() * global, Overflow::Saturate);
                    let d = Format::E4M3.decode(code);
                    // Capped at the largest f32, as Transformer Engine does:
                    // with a tiny amax `global` is capped too, and global / d
                    // would be infinite (0 * inf = NaN, which E2M1 saturates).
                    let mul = if d == 0.0 {
                        0.0
                    } else {
                        (global / d).min(f32::MAX)
                    };
                    (mul, Stored::Code(code))
                }
            };
            Ok::<(), Error>(())
        })?;
    // Phase 2, per row (in parallel): cast each block's stretch, and count
    // telemetry: values that only saturation kept finite (a plain cast would
    // have overflowed; a value within rounding of max is not counted) and
    // non-zero values that became zero.
    let max_code = u32::from(f.encode_rne(f.max(), Overflow::Cast));
    let mut data = alloc_vec(
        codes_len,
        0u8,
        format_args!("the ({rows}, {cols}) {f} codes of an FP8 copy"),
    )?;
    let (saturated, underflowed) = data
        .par_chunks_mut(stride)
        .enumerate()
        .map(|(r, row)| {
            let (mut sat, mut under) = (0usize, 0usize);
            for bc in 0..gc {
                let (c0, c1) = (bc * block.1, ((bc + 1) * block.1).min(cols));
                let mul = per_block[(r / block.0) * gc + bc].0;
                let src = &x[r * cols + c0..r * cols + c1];
                let base = (r * cols + c0) as u64;
                if f == Format::E2M1 {
                    // FP4 blocks start on even columns (block widths are even): pairs never straddle.
                    encode_fp4_slice(
                        src,
                        mul,
                        &mut row[c0 / 2..fp4_bytes(c1)],
                        spec.rounding,
                        base,
                    );
                } else {
                    encode_slice(
                        f,
                        src,
                        mul,
                        &mut row[c0..c1],
                        Overflow::Saturate,
                        spec.rounding,
                        base,
                    );
                }
                for (j, v) in src.iter().enumerate() {
                    let v = v.to_f32_exact();
                    let scaled = v * mul;
                    sat += usize::from(match f {
                        // Half-way from 6 to the next binade (8) rounds up: 7 and above overflow.
                        Format::E2M1 => scaled.abs() >= 7.0,
                        _ => u32::from(f.encode_rne(scaled, Overflow::Cast) & 0x7F) > max_code,
                    });
                    let mag = if f == Format::E2M1 {
                        fp4_code(row, c0 + j) & 0x7
                    } else {
                        row[c0 + j] & 0x7F
                    };
                    under += usize::from(v != 0.0 && mag == 0);
                }
            }
            (sat, under)
        })
        .reduce(|| (0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    // Each rule stores one kind of scale: collect that kind (the other
    // would be empty).
    let what = format_args!("the {gr}x{gc} stored scales of a ({rows}, {cols}) FP8 copy");
    let scales = match spec.rule {
        ScaleRule::Amax { .. } | ScaleRule::Fixed(_) => {
            let mut v = alloc_capacity(blocks, what)?;
            v.extend(per_block.iter().filter_map(|(_, s)| match s {
                Stored::F32(v) => Some(*v),
                Stored::Code(_) => None,
            }));
            Scales::F32(v)
        }
        ScaleRule::E8M0 | ScaleRule::Nvfp4 => {
            let mut codes = alloc_capacity(blocks, what)?;
            codes.extend(per_block.iter().filter_map(|(_, s)| match s {
                Stored::Code(c) => Some(*c),
                Stored::F32(_) => None,
            }));
            match spec.rule {
                ScaleRule::E8M0 => Scales::E8M0(codes),
                _ => Scales::Nvfp4 { codes, global },
            }
        }
    };
    Ok(QuantData {
        rows,
        cols,
        format: f,
        data,
        block,
        scales,
        saturated,
        underflowed,
    })
}

#[cfg(test)]
mod alloc_tests {
    //! The quantizer's buffers follow the input's size, which exists, so no
    //! small input reaches an impossible allocation through [`quantize`]:
    //! these call its steps with a declared shape far larger than the (empty)
    //! data, beyond any address space, so the reservation fails at once.
    use super::*;

    /// The bytes and message of an [`Error::Alloc`].
    fn alloc_err(e: Error) -> (u128, String) {
        let msg = e.to_string();
        match e {
            Error::Alloc { bytes, .. } => (bytes, msg),
            other => panic!("expected an allocation error, got {other:?}"),
        }
    }

    #[test]
    fn a_copy_whose_codes_cannot_be_allocated_is_an_error() {
        let spec = QuantSpec {
            format: Format::E4M3,
            granularity: Granularity::Tensor,
            rule: ScaleRule::Amax {
                power_of_two: false,
            },
            rounding: Rounding::NearestEven,
        };
        // One per-tensor block (its amax is the given one), then 2^62 code bytes.
        let e = quantize_copy::<f32>(&[], 1 << 31, 1 << 31, &spec, 1.0).unwrap_err();
        let (bytes, msg) = alloc_err(e);
        assert_eq!(bytes, 1 << 62);
        assert!(
            msg.contains("for the (2147483648, 2147483648) e4m3 codes of an FP8 copy"),
            "{msg}"
        );
        assert!(
            msg.contains("(4.0 EiB)") && msg.contains("--batch"),
            "{msg}"
        );
        // 1x1 tiles: the 2^62 blocks' scales fail first.
        let tiles = QuantSpec {
            granularity: Granularity::Tile { rows: 1, cols: 1 },
            ..spec
        };
        let e = quantize_copy::<f32>(&[], 1 << 31, 1 << 31, &tiles, 1.0).unwrap_err();
        let (bytes, msg) = alloc_err(e);
        assert_eq!(
            bytes,
            (1 << 62) * std::mem::size_of::<(f32, Stored)>() as u128
        );
        assert!(msg.contains("block scales"), "{msg}");
    }

    #[test]
    fn a_column_wise_source_that_cannot_be_allocated_is_an_error() {
        let (bytes, msg) = alloc_err(transposed_f32::<f32>(&[], 1 << 30, 1 << 30).unwrap_err());
        assert_eq!(bytes, 1 << 62);
        assert!(
            msg.contains("transposed input of a column-wise FP8 copy"),
            "{msg}"
        );
        // The transpose itself: a length mismatch is a shape error, and the
        // values are those of `transpose`.
        assert!(matches!(
            try_transpose(&[1u8; 3], 2, 2),
            Err(Error::Shape(_))
        ));
        let x: Vec<half::bf16> = (0..35 * 70)
            .map(|i| half::bf16::from_f32(i as f32))
            .collect();
        assert_eq!(try_transpose(&x, 35, 70).unwrap(), transpose(&x, 35, 70));
        let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
        assert_eq!(transposed_f32(&x, 35, 70).unwrap(), transpose(&xf, 35, 70));
    }
}
