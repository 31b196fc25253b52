//! Row-wise current scaling on the device (`kernels/rowwise.cu`): both FP8
//! copies with one scale per row of each copy, bit-exact with the CPU
//! reference's `rowwise` recipe, and the cuBLASLt FP8 GEMM with outer-vector
//! scales (`OUTER_VEC_32F`) that consumes them.

use crate::quantize::QuantInput;
use crate::{nvrtc, oom, Error, GemmDst, GemmOut, Gpu, Result};
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use octet_fp8::Format;

/// A `(rows, cols)` matrix quantized row-wise: codes of both copies and their scale vectors.
pub struct DeviceRowwiseFp8 {
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Element format.
    pub format: Format,
    /// `(rows, cols)` codes, one scale per row.
    pub rowwise: CudaSlice<u8>,
    /// `(cols, rows)` codes, one scale per input column.
    pub colwise: CudaSlice<u8>,
    /// `1 / scale` per row (`rows`).
    pub row_scale_inv: CudaSlice<f32>,
    /// `1 / scale` per column (`cols`).
    pub col_scale_inv: CudaSlice<f32>,
    row_amax: CudaSlice<u32>,
    col_amax: CudaSlice<u32>,
    /// Non-zero when the input had a NaN or inf.
    pub nonfinite: CudaSlice<u32>,
}

/// The compiled row-wise kernels.
pub(crate) struct RowwiseKernels {
    amax: [CudaFunction; 2],
    /// `[input bf16/f32][format e4m3/e5m2]`.
    cast: [[CudaFunction; 2]; 2],
}

impl RowwiseKernels {
    fn load(gpu: &Gpu) -> Result<RowwiseKernels> {
        let m = gpu.ctx.load_module(nvrtc::compile(
            "rowwise",
            crate::kernel_source("rowwise")?,
            gpu.arch,
        )?)?;
        let f = |n: &str| -> Result<CudaFunction> { Ok(m.load_function(n)?) };
        Ok(RowwiseKernels {
            amax: [f("rowwise_amax_bf16")?, f("rowwise_amax_f32")?],
            cast: [
                [f("rowwise_cast_bf16_e4m3")?, f("rowwise_cast_bf16_e5m2")?],
                [f("rowwise_cast_f32_e4m3")?, f("rowwise_cast_f32_e5m2")?],
            ],
        })
    }
}

/// The kernels' grid has one block row per 64 rows, at most 65535 of them.
fn check_grid(rows: usize) -> Result<()> {
    if rows.div_ceil(64) > 65535 {
        return Err(Error::Shape(format!(
            "row-wise quantize: {rows} rows exceed the grid limit (65535 x 64)"
        )));
    }
    Ok(())
}

impl Gpu {
    fn rowwise_kernels(&self) -> Result<&RowwiseKernels> {
        if let Some(k) = self.rowwise.get() {
            return Ok(k);
        }
        let k = RowwiseKernels::load(self)?;
        Ok(self.rowwise.get_or_init(|| k))
    }

    /// Buffers for a row-wise quantized `(rows, cols)` matrix.
    pub fn alloc_rowwise_fp8(
        &self,
        rows: usize,
        cols: usize,
        format: Format,
    ) -> Result<DeviceRowwiseFp8> {
        if rows == 0 || cols == 0 || rows > i32::MAX as usize || cols > i32::MAX as usize {
            return Err(Error::Shape(format!(
                "row-wise quantize of ({rows}, {cols})"
            )));
        }
        if !matches!(format, Format::E4M3 | Format::E5M2) {
            return Err(Error::Shape(format!(
                "GPU quantize supports e4m3 and e5m2, not {format}"
            )));
        }
        check_grid(rows)?;
        let n = rows * cols;
        let s = &self.stream;
        Ok(DeviceRowwiseFp8 {
            rows,
            cols,
            format,
            // SAFETY: every code is written by the cast kernel before anyone reads it.
            rowwise: unsafe { s.alloc::<u8>(n) }.map_err(|e| oom(e, n, "row-wise FP8"))?,
            // SAFETY: as above.
            colwise: unsafe { s.alloc::<u8>(n) }.map_err(|e| oom(e, n, "column-wise FP8"))?,
            row_scale_inv: self.alloc_zeros(rows, "row scales")?,
            col_scale_inv: self.alloc_zeros(cols, "column scales")?,
            row_amax: self.alloc_zeros(rows, "row amax")?,
            col_amax: self.alloc_zeros(cols, "column amax")?,
            nonfinite: self.alloc_zeros(1, "nonfinite")?,
        })
    }

    /// Quantize `x (rows, cols)` row-wise into `out` (both copies): the amax
    /// pass, then the cast. `check_finite` waits for the NaN/inf flag and
    /// returns [`Error::NonFinite`] if it is set.
    pub fn quantize_rowwise_into<T: QuantInput>(
        &self,
        x: &CudaSlice<T>,
        out: &mut DeviceRowwiseFp8,
        check_finite: bool,
    ) -> Result<()> {
        let (rows, cols) = (out.rows, out.cols);
        if rows == 0 || cols == 0 || rows > i32::MAX as usize || cols > i32::MAX as usize {
            return Err(Error::Shape(format!(
                "row-wise quantize of ({rows}, {cols})"
            )));
        }
        if x.len() != rows * cols {
            return Err(Error::Shape(format!(
                "quantize: {} elements for ({rows}, {cols})",
                x.len()
            )));
        }
        // The fields are public: buffers of another shape would be written
        // past their ends, and another format would be cast as E4M3.
        if out.rowwise.len() != rows * cols
            || out.colwise.len() != rows * cols
            || out.row_scale_inv.len() != rows
            || out.col_scale_inv.len() != cols
            || out.row_amax.len() != rows
            || out.col_amax.len() != cols
            || out.nonfinite.is_empty()
        {
            return Err(Error::Shape(format!(
                "row-wise quantize: output buffers of the wrong size for ({rows}, {cols}): {} \
                 row-wise and {} column-wise codes, {} row and {} column scales, {} row and {} \
                 column amaxes",
                out.rowwise.len(),
                out.colwise.len(),
                out.row_scale_inv.len(),
                out.col_scale_inv.len(),
                out.row_amax.len(),
                out.col_amax.len()
            )));
        }
        if !matches!(out.format, Format::E4M3 | Format::E5M2) {
            return Err(Error::Shape(format!(
                "GPU quantize supports e4m3 and e5m2, not {}",
                out.format
            )));
        }
        check_grid(rows)?;
        let k = self.rowwise_kernels()?;
        let ti = usize::from(T::BYTES == 4);
        let fi = usize::from(out.format == Format::E5M2);
        let s = &self.stream;
        s.memset_zeros(&mut out.row_amax)?;
        s.memset_zeros(&mut out.col_amax)?;
        s.memset_zeros(&mut out.nonfinite)?;
        let cfg = LaunchConfig {
            grid_dim: (cols.div_ceil(64) as u32, rows.div_ceil(64) as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (r, c) = (rows as i32, cols as i32);
        let fmax = out.format.max();
        // SAFETY: argument types match rowwise.cu; the kernels guard rows and columns.
        unsafe {
            s.launch_builder(&k.amax[ti])
                .arg(x)
                .arg(&r)
                .arg(&c)
                .arg(&mut out.row_amax)
                .arg(&mut out.col_amax)
                .arg(&mut out.nonfinite)
                .launch(cfg)?;
            s.launch_builder(&k.cast[ti][fi])
                .arg(x)
                .arg(&r)
                .arg(&c)
                .arg(&out.row_amax)
                .arg(&out.col_amax)
                .arg(&fmax)
                .arg(&mut out.rowwise)
                .arg(&mut out.colwise)
                .arg(&mut out.row_scale_inv)
                .arg(&mut out.col_scale_inv)
                .launch(cfg)?;
        }
        if check_finite && s.clone_dtoh(&out.nonfinite)?[0] != 0 {
            return Err(Error::NonFinite);
        }
        Ok(())
    }

    /// `d (m, n) = diag(a_scale) (a (m, k) @ b (n, k)^T) diag(b_scale)` from
    /// row-wise FP8 codes (both K-major) and their per-row `scale_inv` vectors
    /// (`m` and `n` long), as one cuBLASLt GEMM with outer-vector scaling.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_fp8_rowwise<D: GemmOut>(
        &self,
        (a, a_fmt, a_scale): (&CudaSlice<u8>, Format, &CudaSlice<f32>),
        (b, b_fmt, b_scale): (&CudaSlice<u8>, Format, &CudaSlice<f32>),
        d: &mut impl GemmDst<D>,
        (m, n, k): (usize, usize, usize),
    ) -> Result<()> {
        if a_scale.len() != m || b_scale.len() != n {
            return Err(Error::Shape(format!(
                "row-wise GEMM: {} and {} scales for m={m}, n={n}",
                a_scale.len(),
                b_scale.len()
            )));
        }
        self.blas()?
            .gemm_fp8_outer(a, a_fmt, a_scale, b, b_fmt, b_scale, d, (m, n, k))
    }
}
