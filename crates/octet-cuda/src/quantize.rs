//! Fused quantize kernels on the device: per-tensor current scaling (amax
//! pass, then cast + transpose) and 1x128 block scaling (one pass), each
//! producing the row-wise and the column-wise FP8 copies together.
//!
//! Every kernel reproduces `octet_fp8::quantize` bit for bit: the same scale
//! rule (`scale_from_amax`: `max / amax` in f32, amax 0 gives 1, a non-finite
//! quotient gives `f32::MAX`), one f32 multiply, saturating round-to-nearest-even.

use crate::{oom, Error, Gpu, Result};
use cudarc::driver::{CudaFunction, CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};
use octet_fp8::Format;

/// A device input element type the quantize kernels take: `u16` (bf16 bits) or `f32`.
pub trait QuantInput: DeviceRepr + sealed::Sealed {
    /// Name in kernel names and messages (`bf16`, `f32`).
    const NAME: &'static str;
    /// Bytes per element.
    const BYTES: usize;
}
impl QuantInput for u16 {
    const NAME: &'static str = "bf16";
    const BYTES: usize = 2;
}
impl QuantInput for f32 {
    const NAME: &'static str = "f32";
    const BYTES: usize = 4;
}
mod sealed {
    pub trait Sealed {}
    impl Sealed for u16 {}
    impl Sealed for f32 {}
}

/// A per-tensor quantized `(rows, cols)` matrix on the device, both copies.
pub struct DeviceFp8 {
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Element format.
    pub format: Format,
    /// `(rows, cols)` codes: K-major for a GEMM that reduces over `cols`.
    pub rowwise: CudaSlice<u8>,
    /// `(cols, rows)` codes: the transpose, K-major for a GEMM that reduces over `rows`.
    pub colwise: CudaSlice<u8>,
    /// The dequantization scale `1 / scale` (one f32), shared by both copies.
    pub scale_inv: CudaSlice<f32>,
    /// The tensor's amax as f32 bits (kept on the device: delayed scaling and telemetry read it there).
    pub amax_bits: CudaSlice<u32>,
    /// Non-zero when the input had a NaN or inf.
    pub nonfinite: CudaSlice<u32>,
}

/// A tensor's amax (f32 bits) and NaN/inf flag, computed by the kernel that
/// wrote the tensor, so that current scaling needs no amax pass of its own.
pub struct TensorAmax {
    /// `max |x|` as f32 bits (NaN left out, as the amax pass leaves it out);
    /// zero before the producer runs.
    pub amax_bits: CudaSlice<u32>,
    /// Non-zero when the tensor holds a NaN or inf.
    pub nonfinite: CudaSlice<u32>,
}

/// One FP8 GEMM operand: K-major codes, their format and per-tensor `scale_inv`.
#[derive(Clone, Copy)]
pub struct Fp8Operand<'a> {
    /// Codes, row-major `(rows, k)`.
    pub data: &'a CudaSlice<u8>,
    /// Element format.
    pub format: Format,
    /// One f32: the factor that dequantizes the codes.
    pub scale_inv: &'a CudaSlice<f32>,
}

impl DeviceFp8 {
    /// The `(rows, cols)` copy as a GEMM operand (reduces over `cols`).
    pub fn rowwise_operand(&self) -> Fp8Operand<'_> {
        Fp8Operand {
            data: &self.rowwise,
            format: self.format,
            scale_inv: &self.scale_inv,
        }
    }

    /// The `(cols, rows)` copy as a GEMM operand (reduces over `rows`).
    pub fn colwise_operand(&self) -> Fp8Operand<'_> {
        Fp8Operand {
            data: &self.colwise,
            format: self.format,
            scale_inv: &self.scale_inv,
        }
    }
}

/// A 1x128 block-scaled `(rows, cols)` matrix on the device, both copies,
/// laid out as `octet_fp8::quantize` lays out `Granularity::Tile { rows: 1, cols: 128 }`.
pub struct DeviceBlockFp8 {
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Element format.
    pub format: Format,
    /// `(rows, cols)` codes.
    pub rowwise: CudaSlice<u8>,
    /// `(rows, ceil(cols / 128))` f32 `scale_inv`, one per 1x128 block of a row.
    pub row_scale_inv: CudaSlice<f32>,
    /// `(cols, rows)` codes.
    pub colwise: CudaSlice<u8>,
    /// `(cols, ceil(rows / 128))` f32 `scale_inv`, one per 1x128 block of a row of the transpose.
    pub col_scale_inv: CudaSlice<f32>,
    /// Non-zero when the input had a NaN or inf.
    pub nonfinite: CudaSlice<u32>,
}

fn check_shape(rows: usize, cols: usize, len: usize) -> Result<()> {
    if rows == 0 || cols == 0 || rows > i32::MAX as usize || cols > i32::MAX as usize {
        return Err(Error::Shape(format!(
            "quantize: shape ({rows}, {cols}) is empty or exceeds 32-bit dims"
        )));
    }
    if len != rows * cols {
        return Err(Error::Shape(format!(
            "quantize: {len} elements for ({rows}, {cols})"
        )));
    }
    Ok(())
}

impl Gpu {
    fn amax_kernel<T: QuantInput>(&self) -> &CudaFunction {
        if T::BYTES == 2 {
            &self.k.amax_bf16
        } else {
            &self.k.amax_f32
        }
    }

    fn cast_kernel<T: QuantInput>(&self, format: Format) -> Result<&CudaFunction> {
        Ok(match (T::BYTES, format) {
            (2, Format::E4M3) => &self.k.cast_bf16_e4m3,
            (2, Format::E5M2) => &self.k.cast_bf16_e5m2,
            (_, Format::E4M3) => &self.k.cast_f32_e4m3,
            (_, Format::E5M2) => &self.k.cast_f32_e5m2,
            (_, f) => {
                return Err(Error::Shape(format!(
                    "GPU quantize supports e4m3 and e5m2, not {f}"
                )))
            }
        })
    }

    /// Launch the amax reduction of `x` into `amax_bits` (f32 bits, max-accumulated:
    /// zero it first) and `nonfinite` (or-accumulated flag).
    pub fn launch_amax<T: QuantInput>(
        &self,
        x: &CudaSlice<T>,
        amax_bits: &mut CudaSlice<u32>,
        nonfinite: &mut CudaSlice<u32>,
    ) -> Result<()> {
        if amax_bits.is_empty() || nonfinite.is_empty() {
            return Err(Error::Shape(format!(
                "amax pass: {} amax and {} flag words, needs at least one each",
                amax_bits.len(),
                nonfinite.len()
            )));
        }
        let n = x.len() as u64;
        // Each thread takes 4 x 8 elements per step; at most 8 blocks per SM
        // (a grid-stride loop covers the rest), at least one block.
        let blocks = (n / (32 * 256) + 1).min(self.sm_count.max(1) as u64 * 8) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(self.amax_kernel::<T>());
        b.arg(x).arg(&n).arg(amax_bits).arg(nonfinite);
        // SAFETY: argument types match the kernel signature; the kernel bounds-checks `n`.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Launch the cast + transpose kernel: scale from `amax_bits`, write both
    /// copies and `scale_inv`. `reverse` walks the tiles last-to-first.
    #[allow(clippy::too_many_arguments)]
    pub fn launch_cast<T: QuantInput>(
        &self,
        x: &CudaSlice<T>,
        (rows, cols): (usize, usize),
        format: Format,
        amax_bits: &CudaSlice<u32>,
        rowwise: &mut CudaSlice<u8>,
        colwise: &mut CudaSlice<u8>,
        scale_inv: &mut CudaSlice<f32>,
        reverse: bool,
    ) -> Result<()> {
        check_shape(rows, cols, x.len())?;
        if rowwise.len() != rows * cols
            || colwise.len() != rows * cols
            || scale_inv.is_empty()
            || amax_bits.is_empty()
        {
            return Err(Error::Shape(
                "quantize: output buffers of the wrong size".into(),
            ));
        }
        let kernel = self.cast_kernel::<T>(format)?;
        let (r, c, rev) = (rows as i32, cols as i32, i32::from(reverse));
        let cfg = LaunchConfig {
            grid_dim: (cols.div_ceil(64) as u32, rows.div_ceil(64) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        if rows.div_ceil(64) > 65535 {
            return Err(Error::Shape(format!(
                "quantize: {rows} rows exceed the grid limit (65535 x 64)"
            )));
        }
        let mut b = self.stream.launch_builder(kernel);
        b.arg(x)
            .arg(&r)
            .arg(&c)
            .arg(amax_bits)
            .arg(rowwise)
            .arg(colwise)
            .arg(scale_inv)
            .arg(&rev);
        // SAFETY: argument types match; every output element is written by exactly one thread.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Buffers for a per-tensor quantized `(rows, cols)` tensor (codes undefined until quantized into).
    pub fn alloc_fp8(&self, rows: usize, cols: usize, format: Format) -> Result<DeviceFp8> {
        let amax = self.alloc_amax()?;
        self.alloc_fp8_with(rows, cols, format, amax)
    }

    /// [`Gpu::alloc_fp8`] keeping the given amax and flag buffers.
    fn alloc_fp8_with(
        &self,
        rows: usize,
        cols: usize,
        format: Format,
        amax: TensorAmax,
    ) -> Result<DeviceFp8> {
        check_shape(rows, cols, rows * cols)?;
        let s = &self.stream;
        let n = rows * cols;
        // SAFETY: the codes are written by the cast kernel before anyone reads them.
        let rowwise = unsafe { s.alloc::<u8>(n) }.map_err(|e| oom(e, n, "row-wise FP8"))?;
        // SAFETY: as above.
        let colwise = unsafe { s.alloc::<u8>(n) }.map_err(|e| oom(e, n, "column-wise FP8"))?;
        Ok(DeviceFp8 {
            rows,
            cols,
            format,
            rowwise,
            colwise,
            scale_inv: self.alloc_zeros(1, "scale_inv")?,
            amax_bits: amax.amax_bits,
            nonfinite: amax.nonfinite,
        })
    }

    /// A zeroed [`TensorAmax`] for a producer kernel to max-accumulate into.
    pub fn alloc_amax(&self) -> Result<TensorAmax> {
        Ok(TensorAmax {
            amax_bits: self.alloc_zeros(1, "amax")?,
            nonfinite: self.alloc_zeros(1, "flag")?,
        })
    }

    /// Per-tensor current scaling of `x (rows, cols)` whose amax the kernel
    /// that wrote `x` already computed (`amax`): one pass, the cast +
    /// transpose of [`Gpu::quantize_tensorwise`] (4 B of traffic per bf16
    /// element instead of 6). The same codes and scale when `amax` is the
    /// tensor's amax, which the selftest checks through the training model.
    pub fn quantize_tensorwise_known<T: QuantInput>(
        &self,
        x: &CudaSlice<T>,
        rows: usize,
        cols: usize,
        format: Format,
        amax: TensorAmax,
    ) -> Result<DeviceFp8> {
        check_shape(rows, cols, x.len())?;
        let mut out = self.alloc_fp8_with(rows, cols, format, amax)?;
        self.quantize_tensorwise_known_into(x, &mut out)?;
        Ok(out)
    }

    /// The cast + transpose of `x` into `out` with the scale from `out`'s amax.
    fn cast_with_own_amax<T: QuantInput>(
        &self,
        x: &CudaSlice<T>,
        out: &mut DeviceFp8,
    ) -> Result<()> {
        self.launch_cast(
            x,
            (out.rows, out.cols),
            out.format,
            &out.amax_bits,
            &mut out.rowwise,
            &mut out.colwise,
            &mut out.scale_inv,
            self.reverse_cast,
        )
    }

    /// Per-tensor current scaling of a `(rows, cols)` bf16 (`u16` bits) or f32
    /// matrix to E4M3 or E5M2: row-wise and column-wise copies, with the CPU
    /// reference's scale rule. Two kernels: amax (one read), then cast +
    /// transpose (one read, two writes).
    ///
    /// With `check_finite`, a NaN/inf in `x` is reported as [`Error::NonFinite`]
    /// (one 4-byte device-to-host read, which waits for the kernels); without,
    /// nothing synchronises (for benchmarks and pipelines that check later).
    pub fn quantize_tensorwise<T: QuantInput>(
        &self,
        x: &CudaSlice<T>,
        rows: usize,
        cols: usize,
        format: Format,
        check_finite: bool,
    ) -> Result<DeviceFp8> {
        let mut out = self.alloc_fp8(rows, cols, format)?;
        self.quantize_tensorwise_into(x, &mut out, check_finite)?;
        Ok(out)
    }

    /// [`Gpu::quantize_tensorwise`] with both outputs filled with `poison` first
    /// (conformance tests use it to catch elements the kernel never writes).
    pub fn quantize_tensorwise_poisoned<T: QuantInput>(
        &self,
        x: &CudaSlice<T>,
        rows: usize,
        cols: usize,
        format: Format,
        poison: u8,
    ) -> Result<DeviceFp8> {
        let mut out = self.alloc_fp8(rows, cols, format)?;
        let p = vec![poison; rows * cols];
        self.stream.memcpy_htod(&p, &mut out.rowwise)?;
        self.stream.memcpy_htod(&p, &mut out.colwise)?;
        self.stream.memcpy_htod(&[f32::NAN], &mut out.scale_inv)?;
        self.quantize_tensorwise_into(x, &mut out, true)?;
        Ok(out)
    }

    /// Zero the amax and the non-finite flag of `q` (the amax kernel max-accumulates into them).
    pub fn memset_quantize_state(&self, q: &mut DeviceFp8) -> Result<()> {
        self.stream.memset_zeros(&mut q.amax_bits)?;
        self.stream.memset_zeros(&mut q.nonfinite)?;
        Ok(())
    }

    /// Quantize into preallocated buffers (what a training step does: no allocation per call).
    pub fn quantize_tensorwise_into<T: QuantInput>(
        &self,
        x: &CudaSlice<T>,
        out: &mut DeviceFp8,
        check_finite: bool,
    ) -> Result<()> {
        check_shape(out.rows, out.cols, x.len())?;
        self.memset_quantize_state(out)?;
        self.launch_amax(x, &mut out.amax_bits, &mut out.nonfinite)?;
        self.cast_with_own_amax(x, out)?;
        if check_finite && self.stream.clone_dtoh(&out.nonfinite)?[0] != 0 {
            return Err(Error::NonFinite);
        }
        Ok(())
    }

    /// [`Gpu::quantize_tensorwise_into`] when `out`'s amax buffer already
    /// holds `x`'s amax (the kernel that produced `x` wrote it, as in the
    /// training step, or an earlier quantize of the same `x` did): the cast +
    /// transpose pass alone, 4 B of traffic per bf16 element.
    pub fn quantize_tensorwise_known_into<T: QuantInput>(
        &self,
        x: &CudaSlice<T>,
        out: &mut DeviceFp8,
    ) -> Result<()> {
        check_shape(out.rows, out.cols, x.len())?;
        self.cast_with_own_amax(x, out)
    }

    /// Current per-tensor scaling of `x (rows, cols)` into the row-wise copy
    /// only (the column-wise one is a one-byte placeholder): for operands that
    /// no GEMM reads transposed (LoRA inputs and gradients). Same codes and
    /// scale as [`Gpu::quantize_tensorwise`]'s row-wise copy, one byte less
    /// written per element.
    pub fn quantize_tensorwise_rowwise<T: QuantInput>(
        &self,
        x: &CudaSlice<T>,
        rows: usize,
        cols: usize,
        format: Format,
    ) -> Result<DeviceFp8> {
        self.quantize_tensorwise_rowwise_known(x, rows, cols, format, None)
    }

    /// A row-wise-only [`DeviceFp8`] of `x (rows, cols)` before its codes are
    /// cast: placeholders for the codes and the column-wise copy, a fresh
    /// `scale_inv`, and the tensor's amax (`amax` from the kernel that wrote
    /// `x`, or the amax pass run here).
    pub(crate) fn rowwise_fp8_shell<T: QuantInput>(
        &self,
        x: &CudaSlice<T>,
        (rows, cols): (usize, usize),
        format: Format,
        amax: Option<TensorAmax>,
    ) -> Result<DeviceFp8> {
        let mut out = DeviceFp8 {
            rows,
            cols,
            format,
            rowwise: self.alloc_zeros(1, "placeholder")?,
            colwise: self.alloc_zeros(1, "placeholder")?,
            scale_inv: self.alloc_zeros(1, "scale_inv")?,
            amax_bits: self.alloc_zeros(1, "amax")?,
            nonfinite: self.alloc_zeros(1, "nonfinite flag")?,
        };
        match amax {
            Some(a) => (out.amax_bits, out.nonfinite) = (a.amax_bits, a.nonfinite),
            None => self.launch_amax(x, &mut out.amax_bits, &mut out.nonfinite)?,
        }
        Ok(out)
    }

    /// [`Gpu::quantize_tensorwise_rowwise`] with the amax of `x` already
    /// computed by the kernel that wrote it (`amax`; `None`: the amax pass runs).
    pub fn quantize_tensorwise_rowwise_known<T: QuantInput>(
        &self,
        x: &CudaSlice<T>,
        rows: usize,
        cols: usize,
        format: Format,
        amax: Option<TensorAmax>,
    ) -> Result<DeviceFp8> {
        check_shape(rows, cols, x.len())?;
        let s = &self.stream;
        // SAFETY: the codes are written by the cast kernel below.
        let mut rowwise = unsafe { s.alloc::<u8>(rows * cols) }
            .map_err(|e| oom(e, rows * cols, "row-wise FP8"))?;
        let mut out = self.rowwise_fp8_shell(x, (rows, cols), format, amax)?;
        let kernel = self.cast_kernel::<T>(format)?;
        if rows.div_ceil(64) > 65535 {
            return Err(Error::Shape(format!(
                "quantize: {rows} rows exceed the grid limit (65535 x 64)"
            )));
        }
        let (r, c, rev) = (rows as i32, cols as i32, i32::from(self.reverse_cast));
        let null: u64 = 0;
        let mut b = s.launch_builder(kernel);
        b.arg(x)
            .arg(&r)
            .arg(&c)
            .arg(&out.amax_bits)
            .arg(&mut rowwise)
            .arg(&null)
            .arg(&mut out.scale_inv)
            .arg(&rev);
        // SAFETY: argument types match; a null column-wise pointer makes the
        // kernel stop after the row-wise codes, each written by one thread.
        unsafe {
            b.launch(LaunchConfig {
                grid_dim: (cols.div_ceil(64) as u32, rows.div_ceil(64) as u32, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }?;
        out.rowwise = rowwise;
        Ok(out)
    }

    /// Delayed scaling of a bf16 `(rows, cols)` matrix in one pass: cast both
    /// copies with the given `scale` (a one-element device buffer, set from the
    /// amax history) and record this tensor's amax in `out.amax_bits` (and
    /// NaN/inf in `out.nonfinite`) for the next history update. 2 B read and
    /// 2 B written per element: no amax pass, because the scale is known first.
    pub fn quantize_given_scale_into(
        &self,
        x: &CudaSlice<u16>,
        scale: &CudaSlice<f32>,
        out: &mut DeviceFp8,
        check_finite: bool,
    ) -> Result<()> {
        check_shape(out.rows, out.cols, x.len())?;
        if scale.is_empty() {
            return Err(Error::Shape("quantize: empty scale buffer".into()));
        }
        let n = out.rows * out.cols;
        if out.rowwise.len() != n
            || out.colwise.len() != n
            || out.scale_inv.is_empty()
            || out.amax_bits.is_empty()
            || out.nonfinite.is_empty()
        {
            return Err(Error::Shape(format!(
                "quantize: output buffers of the wrong size for ({}, {}): {} row-wise and {} \
                 column-wise codes (a row-wise-only tensor cannot take both copies)",
                out.rows,
                out.cols,
                out.rowwise.len(),
                out.colwise.len()
            )));
        }
        let kernel = match out.format {
            Format::E4M3 => &self.k.given_bf16_e4m3,
            Format::E5M2 => &self.k.given_bf16_e5m2,
            f => {
                return Err(Error::Shape(format!(
                    "GPU quantize supports e4m3 and e5m2, not {f}"
                )))
            }
        };
        if out.rows.div_ceil(64) > 65535 {
            return Err(Error::Shape(format!(
                "quantize: {} rows exceed the grid limit (65535 x 64)",
                out.rows
            )));
        }
        self.memset_quantize_state(out)?;
        let (r, c, rev) = (
            out.rows as i32,
            out.cols as i32,
            i32::from(self.reverse_cast),
        );
        let cfg = LaunchConfig {
            grid_dim: (
                out.cols.div_ceil(64) as u32,
                out.rows.div_ceil(64) as u32,
                1,
            ),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(kernel);
        b.arg(x)
            .arg(&r)
            .arg(&c)
            .arg(&mut out.amax_bits)
            .arg(scale)
            .arg(&mut out.nonfinite)
            .arg(&mut out.rowwise)
            .arg(&mut out.colwise)
            .arg(&mut out.scale_inv)
            .arg(&rev);
        // SAFETY: argument types match the kernel; every output element is written by one thread.
        unsafe { b.launch(cfg) }?;
        if check_finite && self.stream.clone_dtoh(&out.nonfinite)?[0] != 0 {
            return Err(Error::NonFinite);
        }
        Ok(())
    }

    /// Buffers for a 1x128 block-scaled `(rows, cols)` tensor.
    pub fn alloc_block_fp8(
        &self,
        rows: usize,
        cols: usize,
        format: Format,
    ) -> Result<DeviceBlockFp8> {
        check_shape(rows, cols, rows * cols)?;
        let n = rows * cols;
        let s = &self.stream;
        // SAFETY: written by the kernel before anyone reads them.
        let rowwise = unsafe { s.alloc::<u8>(n) }.map_err(|e| oom(e, n, "row-wise FP8"))?;
        // SAFETY: as above.
        let colwise = unsafe { s.alloc::<u8>(n) }.map_err(|e| oom(e, n, "column-wise FP8"))?;
        Ok(DeviceBlockFp8 {
            rows,
            cols,
            format,
            rowwise,
            colwise,
            row_scale_inv: self.alloc_zeros(rows * cols.div_ceil(128), "row scales")?,
            col_scale_inv: self.alloc_zeros(cols * rows.div_ceil(128), "column scales")?,
            nonfinite: self.alloc_zeros(1, "flag")?,
        })
    }

    /// 1x128 block scaling of a bf16 (`u16` bits) `(rows, cols)` matrix: row-wise
    /// copy with one scale per 128 elements of a row, column-wise copy with one
    /// scale per 128 elements of a column, in one pass over `x` (2 B read and
    /// 2 B written per element). `power_of_two` rounds scales down to powers of two.
    pub fn quantize_block1x128(
        &self,
        x: &CudaSlice<u16>,
        rows: usize,
        cols: usize,
        format: Format,
        power_of_two: bool,
        check_finite: bool,
    ) -> Result<DeviceBlockFp8> {
        let mut out = self.alloc_block_fp8(rows, cols, format)?;
        self.quantize_block1x128_into(x, &mut out, power_of_two, check_finite)?;
        Ok(out)
    }

    /// [`Gpu::quantize_block1x128`] into preallocated buffers.
    pub fn quantize_block1x128_into(
        &self,
        x: &CudaSlice<u16>,
        out: &mut DeviceBlockFp8,
        power_of_two: bool,
        check_finite: bool,
    ) -> Result<()> {
        self.block1x128_impl(x, out, power_of_two, check_finite, false)
    }

    /// The 1x128 kernel variant that stores column-wise codes straight from
    /// registers (no shared-memory staging): same bytes, kept for the
    /// benchmark's A/B. E4M3 only.
    #[doc(hidden)]
    pub fn quantize_block1x128_direct_into(
        &self,
        x: &CudaSlice<u16>,
        out: &mut DeviceBlockFp8,
    ) -> Result<()> {
        self.block1x128_impl(x, out, false, false, true)
    }

    fn block1x128_impl(
        &self,
        x: &CudaSlice<u16>,
        out: &mut DeviceBlockFp8,
        power_of_two: bool,
        check_finite: bool,
        direct: bool,
    ) -> Result<()> {
        let (rows, cols) = (out.rows, out.cols);
        check_shape(rows, cols, x.len())?;
        // The fields are public: buffers of another shape would be written
        // past their ends.
        let n = rows * cols;
        if out.rowwise.len() != n
            || out.colwise.len() != n
            || out.row_scale_inv.len() != rows * cols.div_ceil(128)
            || out.col_scale_inv.len() != cols * rows.div_ceil(128)
            || out.nonfinite.is_empty()
        {
            return Err(Error::Shape(format!(
                "1x128 quantize: output buffers of the wrong size for ({rows}, {cols}): {} row-wise \
                 and {} column-wise codes, {} row and {} column scales (want {n}, {n}, {} and {})",
                out.rowwise.len(),
                out.colwise.len(),
                out.row_scale_inv.len(),
                out.col_scale_inv.len(),
                rows * cols.div_ceil(128),
                cols * rows.div_ceil(128)
            )));
        }
        if rows.div_ceil(128) > 65535 {
            return Err(Error::Shape(format!(
                "quantize: {rows} rows exceed the grid limit (65535 x 128)"
            )));
        }
        let kernel = match out.format {
            Format::E4M3 if direct => &self.k.block_direct_bf16_e4m3,
            Format::E4M3 => &self.k.block_bf16_e4m3,
            Format::E5M2 if !direct => &self.k.block_bf16_e5m2,
            f => {
                return Err(Error::Shape(format!(
                    "GPU quantize supports e4m3 and e5m2, not {f}"
                )))
            }
        };
        self.stream.memset_zeros(&mut out.nonfinite)?;
        let (r, c, p2) = (rows as i32, cols as i32, i32::from(power_of_two));
        let cfg = LaunchConfig {
            grid_dim: (cols.div_ceil(128) as u32, rows.div_ceil(128) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(kernel);
        b.arg(x)
            .arg(&r)
            .arg(&c)
            .arg(&p2)
            .arg(&mut out.rowwise)
            .arg(&mut out.row_scale_inv)
            .arg(&mut out.colwise)
            .arg(&mut out.col_scale_inv)
            .arg(&mut out.nonfinite);
        // SAFETY: argument types match the kernel; buffers have the sizes alloc_block_fp8 gave them.
        unsafe { b.launch(cfg) }?;
        if check_finite && self.stream.clone_dtoh(&out.nonfinite)?[0] != 0 {
            return Err(Error::NonFinite);
        }
        Ok(())
    }
}
