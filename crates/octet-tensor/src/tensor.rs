//! The tensor type: shape, dtype and host storage.

use crate::{alloc_collect, alloc_vec, Error, Result};
use half::bf16;
use std::borrow::Cow;

/// Element type of a high-precision tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit IEEE float.
    F32,
    /// bfloat16 (8 exponent bits, 7 mantissa bits).
    Bf16,
    /// 64-bit IEEE float: the reference dtype of gradient checks (CPU only).
    F64,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::Bf16 => 2,
            DType::F64 => 8,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Data {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
    F64(Vec<f64>),
}

/// A row-major tensor in host memory.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    shape: Vec<usize>,
    data: Data,
}

/// The element count of `shape`, or an error when the product of its dims
/// overflows `usize` (such a shape can describe no allocation).
pub fn checked_numel(shape: &[usize]) -> Result<usize> {
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| {
            Error::Shape(format!(
                "shape {shape:?}: the element count overflows {} bits",
                usize::BITS
            ))
        })
}

/// `x` rounded once to the nearest bf16, ties to even.
///
/// `half`'s `bf16::from_f64` drops the low 32 bits of the f64 before it
/// rounds, so a value just above a tie (`1 + 2^-8 + 2^-30`) rounds as the tie
/// would, down to even. Here `x` goes to f32 with round-to-odd (the
/// discarded bits leave a sticky 1 in the last place), which f32's 16 spare
/// bits over bf16 make a single correct rounding when f32 then rounds to bf16.
fn bf16_from_f64(x: f64) -> bf16 {
    let f = x as f32;
    if !f.is_finite() || f as f64 == x {
        // NaN, an overflow (inf in bf16 as well), or exact in f32.
        return bf16::from_f32(f);
    }
    let mut bits = f.to_bits();
    if (f as f64).abs() > x.abs() {
        // Rounded away from zero: step back toward zero (sign-magnitude bits).
        bits -= 1;
    }
    bf16::from_f32(f32::from_bits(bits | 1))
}

/// The element count of `shape`, or an error when `elem_bytes`-byte elements
/// of that many would exceed the largest allocation (`isize::MAX` bytes), so
/// that allocating them fails as an error rather than a "capacity overflow"
/// panic.
pub(crate) fn checked_alloc(shape: &[usize], elem_bytes: usize) -> Result<usize> {
    let n = checked_numel(shape)?;
    match n.checked_mul(elem_bytes) {
        Some(b) if isize::try_from(b).is_ok() => Ok(n),
        _ => Err(Error::Shape(format!(
            "shape {shape:?}: {n} elements of {elem_bytes} bytes exceed the largest allocation ({} bytes)",
            isize::MAX
        ))),
    }
}

/// A tensor buffer named in an [`Error::Alloc`]: "a F32 tensor of shape
/// [..]", formatted only when the allocation fails.
#[derive(Clone, Copy)]
struct What<'a> {
    kind: &'static str,
    shape: &'a [usize],
    dtype: DType,
}

impl std::fmt::Display for What<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a {:?} {} of shape {:?}",
            self.dtype, self.kind, self.shape
        )
    }
}

fn check_len(shape: &[usize], len: usize) -> Result<()> {
    let n = checked_numel(shape)?;
    if n != len {
        return Err(Error::Shape(format!(
            "{len} elements do not fill shape {shape:?} ({n} elements)"
        )));
    }
    Ok(())
}

impl Tensor {
    /// An f32 tensor from data; errors if the element count does not match the shape.
    pub fn from_f32(shape: &[usize], data: Vec<f32>) -> Result<Tensor> {
        check_len(shape, data.len())?;
        Ok(Tensor {
            shape: shape.to_vec(),
            data: Data::F32(data),
        })
    }

    /// A bf16 tensor from data.
    pub fn from_bf16(shape: &[usize], data: Vec<bf16>) -> Result<Tensor> {
        check_len(shape, data.len())?;
        Ok(Tensor {
            shape: shape.to_vec(),
            data: Data::Bf16(data),
        })
    }

    /// An f64 tensor from data.
    pub fn from_f64(shape: &[usize], data: Vec<f64>) -> Result<Tensor> {
        check_len(shape, data.len())?;
        Ok(Tensor {
            shape: shape.to_vec(),
            data: Data::F64(data),
        })
    }

    /// A tensor of `dtype` from f32 values (rounded to nearest even for
    /// bf16; `data` itself when `dtype` is f32); [`Error::Alloc`] when a
    /// conversion's buffer cannot be allocated.
    pub fn from_f32_as(shape: &[usize], data: Vec<f32>, dtype: DType) -> Result<Tensor> {
        Tensor::from_f32(shape, data)?.into_dtype(dtype)
    }

    /// Zeros; errors if the element count of `shape` overflows `usize` or
    /// its bytes exceed the largest allocation, and [`Error::Alloc`] when
    /// the allocator cannot provide them.
    pub fn zeros(shape: &[usize], dtype: DType) -> Result<Tensor> {
        let n = checked_alloc(shape, dtype.size())?;
        let what = What {
            kind: "tensor",
            shape,
            dtype,
        };
        let data = match dtype {
            DType::F32 => Data::F32(alloc_vec(n, 0.0, what)?),
            DType::Bf16 => Data::Bf16(alloc_vec(n, bf16::ZERO, what)?),
            DType::F64 => Data::F64(alloc_vec(n, 0.0, what)?),
        };
        Ok(Tensor {
            shape: shape.to_vec(),
            data,
        })
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The dtype.
    pub fn dtype(&self) -> DType {
        match self.data {
            Data::F32(_) => DType::F32,
            Data::Bf16(_) => DType::Bf16,
            Data::F64(_) => DType::F64,
        }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes of the elements.
    pub fn bytes(&self) -> usize {
        self.numel() * self.dtype().size()
    }

    /// The shape as a matrix `(rows, cols)`: all leading dims flattened into rows.
    pub fn dims2(&self) -> Result<(usize, usize)> {
        match self.shape.split_last() {
            Some((&c, lead)) if !lead.is_empty() => Ok((lead.iter().product(), c)),
            _ => Err(Error::Shape(format!(
                "expected at least 2 dims, got {:?}",
                self.shape
            ))),
        }
    }

    /// The values as f32 (exact for f32 and bf16; rounded from f64).
    ///
    /// Aborts the process if the copy cannot be allocated: where the size
    /// follows user input, use [`Tensor::try_to_f32_vec`] or
    /// [`Tensor::f32_values`].
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match &self.data {
            Data::F32(v) => v.clone(),
            Data::Bf16(v) => v.iter().map(|x| x.to_f32()).collect(),
            Data::F64(v) => v.iter().map(|&x| x as f32).collect(),
        }
    }

    /// The values as f64 (exact for every dtype).
    ///
    /// Aborts the process if the copy cannot be allocated: where the size
    /// follows user input, use [`Tensor::try_to_f64_vec`].
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match &self.data {
            Data::F32(v) => v.iter().map(|&x| x as f64).collect(),
            Data::Bf16(v) => v.iter().map(|x| x.to_f64()).collect(),
            Data::F64(v) => v.clone(),
        }
    }

    /// What an allocation of this tensor's elements as `dtype` is for, in
    /// an [`Error::Alloc`].
    fn copy_what(&self, dtype: DType) -> What<'_> {
        What {
            kind: "copy of a tensor",
            shape: &self.shape,
            dtype,
        }
    }

    /// The values as f32 (as [`Tensor::to_f32_vec`]), or [`Error::Alloc`]
    /// when the copy cannot be allocated.
    pub fn try_to_f32_vec(&self) -> Result<Vec<f32>> {
        let what = self.copy_what(DType::F32);
        match &self.data {
            Data::F32(v) => alloc_collect(v.iter().copied(), what),
            Data::Bf16(v) => alloc_collect(v.iter().map(|x| x.to_f32()), what),
            Data::F64(v) => alloc_collect(v.iter().map(|&x| x as f32), what),
        }
    }

    /// The values as f64 (as [`Tensor::to_f64_vec`]), or [`Error::Alloc`]
    /// when the copy cannot be allocated.
    pub fn try_to_f64_vec(&self) -> Result<Vec<f64>> {
        let what = self.copy_what(DType::F64);
        match &self.data {
            Data::F32(v) => alloc_collect(v.iter().map(|&x| x as f64), what),
            Data::Bf16(v) => alloc_collect(v.iter().map(|x| x.to_f64()), what),
            Data::F64(v) => alloc_collect(v.iter().copied(), what),
        }
    }

    /// The values as f32 for reading: the tensor's own data when it is f32
    /// (no copy), else a converted copy, or [`Error::Alloc`] when that copy
    /// cannot be allocated.
    pub fn f32_values(&self) -> Result<Cow<'_, [f32]>> {
        match &self.data {
            Data::F32(v) => Ok(Cow::Borrowed(v)),
            _ => self.try_to_f32_vec().map(Cow::Owned),
        }
    }

    /// A copy of the tensor, or [`Error::Alloc`] when it cannot be allocated
    /// (`clone` aborts the process instead).
    pub fn try_clone(&self) -> Result<Tensor> {
        let what = self.copy_what(self.dtype());
        let data = match &self.data {
            Data::F32(v) => Data::F32(alloc_collect(v.iter().copied(), what)?),
            Data::Bf16(v) => Data::Bf16(alloc_collect(v.iter().copied(), what)?),
            Data::F64(v) => Data::F64(alloc_collect(v.iter().copied(), what)?),
        };
        Ok(Tensor {
            shape: self.shape.clone(),
            data,
        })
    }

    /// The f32 data, if this is an f32 tensor.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            Data::F32(v) => Some(v),
            _ => None,
        }
    }

    /// The bf16 data, if this is a bf16 tensor.
    pub fn as_bf16(&self) -> Option<&[bf16]> {
        match &self.data {
            Data::Bf16(v) => Some(v),
            _ => None,
        }
    }

    /// The f64 data, if this is an f64 tensor.
    pub fn as_f64(&self) -> Option<&[f64]> {
        match &self.data {
            Data::F64(v) => Some(v),
            _ => None,
        }
    }

    /// Convert to `dtype` (round to nearest even when narrowing).
    ///
    /// Aborts the process if the copy cannot be allocated: where the size
    /// follows user input, use [`Tensor::try_to_dtype`] or
    /// [`Tensor::into_dtype`].
    pub fn to_dtype(&self, dtype: DType) -> Tensor {
        if self.dtype() == dtype {
            return self.clone();
        }
        let data = match dtype {
            DType::F32 => Data::F32(self.to_f32_vec()),
            DType::F64 => Data::F64(self.to_f64_vec()),
            DType::Bf16 => Data::Bf16(match &self.data {
                // From f64, round once (see `bf16_from_f64`).
                Data::F64(v) => v.iter().map(|&x| bf16_from_f64(x)).collect(),
                _ => self.to_f32_vec().into_iter().map(bf16::from_f32).collect(),
            }),
        };
        Tensor {
            shape: self.shape.clone(),
            data,
        }
    }

    /// Convert to `dtype` (as [`Tensor::to_dtype`]), or [`Error::Alloc`]
    /// when the converted copy cannot be allocated.
    pub fn try_to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if self.dtype() == dtype {
            return self.try_clone();
        }
        let what = self.copy_what(dtype);
        let data = match (dtype, &self.data) {
            (DType::F32, _) => Data::F32(self.try_to_f32_vec()?),
            (DType::F64, _) => Data::F64(self.try_to_f64_vec()?),
            // From f64, round once (see `bf16_from_f64`).
            (DType::Bf16, Data::F64(v)) => {
                Data::Bf16(alloc_collect(v.iter().map(|&x| bf16_from_f64(x)), what)?)
            }
            (DType::Bf16, Data::F32(v)) => {
                Data::Bf16(alloc_collect(v.iter().map(|&x| bf16::from_f32(x)), what)?)
            }
            // Same dtype: returned above.
            (DType::Bf16, Data::Bf16(_)) => return self.try_clone(),
        };
        Ok(Tensor {
            shape: self.shape.clone(),
            data,
        })
    }

    /// Convert to `dtype`, consuming the tensor: no copy when it already is
    /// `dtype`, else as [`Tensor::try_to_dtype`].
    pub fn into_dtype(self, dtype: DType) -> Result<Tensor> {
        if self.dtype() == dtype {
            return Ok(self);
        }
        self.try_to_dtype(dtype)
    }

    /// The same data under another shape with the same element count.
    pub fn reshape(self, shape: &[usize]) -> Result<Tensor> {
        check_len(shape, self.numel())?;
        Ok(Tensor {
            shape: shape.to_vec(),
            data: self.data,
        })
    }
}
