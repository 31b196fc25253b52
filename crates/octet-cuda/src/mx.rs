//! MXFP8 on the device (`kernels/mx.cu`): the 1x32 E8M0-scaled quantizer
//! (both copies, bit-exact with the CPU's `mxfp8` recipe) and the emulated
//! GEMM: Hopper's tensor cores have no MX mode (cuBLASLt's `VEC32_UE8M0` is
//! sm_100 only), so each operand is dequantized to bf16 (exact: every MXFP8
//! value is a bf16) and multiplied by the bf16 GEMM. Labelled "emulated" in
//! `octet info` and the selftest.

use crate::{nvrtc, oom, Error, GemmDst, GemmOut, Gpu, Result};
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use octet_fp8::Format;

/// The compiled MX kernels.
pub(crate) struct MxKernels {
    quant: [CudaFunction; 2],
    dequant: [CudaFunction; 2],
}

/// An MXFP8 `(rows, cols)` matrix: both copies with their E8M0 scale codes.
pub struct DeviceMxFp8 {
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Element format.
    pub format: Format,
    /// `(rows, cols)` codes.
    pub rowwise: CudaSlice<u8>,
    /// `(cols, rows)` codes.
    pub colwise: CudaSlice<u8>,
    /// `(rows, ceil(cols/32))` E8M0 codes.
    pub row_scales: CudaSlice<u8>,
    /// `(cols, ceil(rows/32))` E8M0 codes.
    pub col_scales: CudaSlice<u8>,
    /// Non-zero when the input had a NaN or inf.
    pub nonfinite: CudaSlice<u32>,
}

fn fi(f: Format) -> Result<usize> {
    match f {
        Format::E4M3 => Ok(0),
        Format::E5M2 => Ok(1),
        other => Err(Error::Shape(format!(
            "MXFP8 takes e4m3 or e5m2, not {other}"
        ))),
    }
}

impl Gpu {
    fn mx_kernels(&self) -> Result<&MxKernels> {
        if let Some(k) = self.mx.get() {
            return Ok(k);
        }
        let m = self.ctx.load_module(nvrtc::compile(
            "mx",
            crate::kernel_source("mx")?,
            self.arch,
        )?)?;
        let k = MxKernels {
            quant: [
                m.load_function("mx_quant_bf16_e4m3")?,
                m.load_function("mx_quant_bf16_e5m2")?,
            ],
            dequant: [
                m.load_function("mx_dequant_e4m3")?,
                m.load_function("mx_dequant_e5m2")?,
            ],
        };
        Ok(self.mx.get_or_init(|| k))
    }

    /// Quantize bf16 `x (rows, cols)` to MXFP8 (both copies).
    pub fn quantize_mx(
        &self,
        x: &CudaSlice<u16>,
        rows: usize,
        cols: usize,
        format: Format,
    ) -> Result<DeviceMxFp8> {
        if rows == 0
            || cols == 0
            || rows * cols != x.len()
            || rows > i32::MAX as usize
            || cols > i32::MAX as usize
        {
            return Err(Error::Shape(format!(
                "MX quantize: {} elements for ({rows}, {cols})",
                x.len()
            )));
        }
        if rows.div_ceil(64) > 65535 {
            return Err(Error::Shape(format!(
                "MX quantize: {rows} rows exceed the grid limit (65535 x 64)"
            )));
        }
        let k = self.mx_kernels()?;
        let f = &k.quant[fi(format)?];
        let s = &self.stream;
        let n = rows * cols;
        let mut out = DeviceMxFp8 {
            rows,
            cols,
            format,
            // SAFETY: every code is written by the kernel before anyone reads it.
            rowwise: unsafe { s.alloc::<u8>(n) }.map_err(|e| oom(e, n, "row-wise MXFP8"))?,
            // SAFETY: as above.
            colwise: unsafe { s.alloc::<u8>(n) }.map_err(|e| oom(e, n, "column-wise MXFP8"))?,
            row_scales: self.alloc_zeros(rows * cols.div_ceil(32), "MX scales")?,
            col_scales: self.alloc_zeros(cols * rows.div_ceil(32), "MX scales")?,
            nonfinite: self.alloc_zeros(1, "nonfinite")?,
        };
        let (r, c, fmax) = (rows as i32, cols as i32, format.max());
        // SAFETY: argument types match mx.cu; the kernel guards rows and columns.
        unsafe {
            s.launch_builder(f)
                .arg(x)
                .arg(&r)
                .arg(&c)
                .arg(&fmax)
                .arg(&mut out.rowwise)
                .arg(&mut out.colwise)
                .arg(&mut out.row_scales)
                .arg(&mut out.col_scales)
                .arg(&mut out.nonfinite)
                .launch(LaunchConfig {
                    grid_dim: (cols.div_ceil(64) as u32, rows.div_ceil(64) as u32, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                })?;
        }
        Ok(out)
    }

    /// Dequantize one MXFP8 copy `(rows, cols)` to bf16 (exact).
    pub fn mx_dequant_bf16(
        &self,
        codes: &CudaSlice<u8>,
        scales: &CudaSlice<u8>,
        rows: usize,
        cols: usize,
        format: Format,
    ) -> Result<CudaSlice<u16>> {
        // The launch counts threads in a u32 and the kernel takes i32 dims.
        let fits = rows
            .checked_mul(cols)
            .is_some_and(|n| n > 0 && n <= i32::MAX as usize);
        if !fits || codes.len() != rows * cols || scales.len() != rows * cols.div_ceil(32) {
            return Err(Error::Shape(format!(
                "MX dequantize of ({rows}, {cols}) from {} codes and {} scales (at most 2^31 - 1 elements)",
                codes.len(),
                scales.len()
            )));
        }
        let k = self.mx_kernels()?;
        // SAFETY: every element is written by the kernel.
        let mut out = unsafe { self.stream.alloc::<u16>(rows * cols) }
            .map_err(|e| oom(e, 2 * rows * cols, "MX dequantized"))?;
        let (r, c) = (rows as i32, cols as i32);
        // SAFETY: lengths checked above; the kernel guards rows * cols.
        unsafe {
            self.stream
                .launch_builder(&k.dequant[fi(format)?])
                .arg(codes)
                .arg(scales)
                .arg(&mut out)
                .arg(&r)
                .arg(&c)
                .launch(LaunchConfig::for_num_elems((rows * cols) as u32))?;
        }
        Ok(out)
    }

    /// Emulated MXFP8 GEMM `d (m, n) = a (m, k) @ b (n, k)^T` from two MX
    /// copies (codes + E8M0 scales along k): both dequantized to bf16
    /// (exact), then the bf16 GEMM with f32 accumulation.
    #[allow(clippy::type_complexity)]
    pub fn gemm_mx_emulated<D: GemmOut>(
        &self,
        (a, a_s, a_f): (&CudaSlice<u8>, &CudaSlice<u8>, Format),
        (b, b_s, b_f): (&CudaSlice<u8>, &CudaSlice<u8>, Format),
        d: &mut impl GemmDst<D>,
        (m, n, k): (usize, usize, usize),
    ) -> Result<()> {
        let ab = self.mx_dequant_bf16(a, a_s, m, k, a_f)?;
        let bb = self.mx_dequant_bf16(b, b_s, n, k, b_f)?;
        self.gemm_bf16(&ab, &bb, d, (m, n, k))
    }
}
