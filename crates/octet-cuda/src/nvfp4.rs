//! NVFP4 on the device (`kernels/nvfp4.cu`), emulated: the quantizer
//! (E2M1 codes packed two per byte, E4M3 block scales in 1x16 or 16x16
//! blocks under an f32 per-tensor scale, nearest or stochastic rounding),
//! bit-exact with the CPU's `nvfp4` recipe for both copies, and a GEMM that
//! dequantizes both operands to bf16 (exact: at most 5 significant bits),
//! multiplies them with the bf16 GEMM and applies the two per-tensor factors.
//! Native FP4 GEMMs need sm_100.

use crate::{nvrtc, oom, Error, GemmDst, GemmOut, Gpu, OutType, Result};
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use octet_fp8::Rounding;

/// The compiled kernels.
pub(crate) struct NvKernels {
    scales: CudaFunction,
    encode: CudaFunction,
    dequant: CudaFunction,
    dequant_full: CudaFunction,
    finish: [CudaFunction; 2],
}

/// One NVFP4 copy: packed codes, block scale codes and the per-tensor scale.
pub struct NvCopy {
    /// Rows of this copy.
    pub rows: usize,
    /// Columns of this copy (the reduction dimension).
    pub cols: usize,
    /// Packed E2M1 codes, `ceil(cols / 2)` bytes per row.
    pub packed: CudaSlice<u8>,
    /// E4M3 block scale codes, row-major over the block grid.
    pub codes: CudaSlice<u8>,
}

/// An NVFP4 `(rows, cols)` matrix: both copies and the per-tensor encode scale.
pub struct DeviceNvfp4 {
    /// `(rows, cols)`.
    pub rowwise: NvCopy,
    /// `(cols, rows)`.
    pub colwise: NvCopy,
    /// Block height in each copy's coordinates (1 or 16; the width is 16).
    pub block_rows: usize,
    /// The per-tensor encode scale `global` (one f32; factor `1 / global`).
    pub global: CudaSlice<f32>,
}

/// Whether a `(rows, cols)` copy's packed bytes, `rows * ceil(cols / 2)`,
/// fit the u32 thread count of its encode launch.
fn packed_fits_u32(rows: usize, cols: usize) -> bool {
    rows.checked_mul(cols.div_ceil(2))
        .is_some_and(|b| b <= u32::MAX as usize)
}

impl Gpu {
    fn nv_kernels(&self) -> Result<&NvKernels> {
        if let Some(k) = self.nv.get() {
            return Ok(k);
        }
        let m = self.ctx.load_module(nvrtc::compile(
            "nvfp4",
            crate::kernel_source("nvfp4")?,
            self.arch,
        )?)?;
        let k = NvKernels {
            scales: m.load_function("nv_scales")?,
            encode: m.load_function("nv_encode")?,
            dequant: m.load_function("nv_dequant")?,
            dequant_full: m.load_function("nv_dequant_full")?,
            finish: [
                m.load_function("nv_finish_f32")?,
                m.load_function("nv_finish_bf16")?,
            ],
        };
        Ok(self.nv.get_or_init(|| k))
    }

    /// Quantize bf16 `x (rows, cols)` to NVFP4, both copies, with blocks of
    /// `block_rows` x 16 (1 for activations and gradients, 16 for weights).
    pub fn quantize_nvfp4(
        &self,
        x: &CudaSlice<u16>,
        rows: usize,
        cols: usize,
        block_rows: usize,
        rounding: Rounding,
    ) -> Result<DeviceNvfp4> {
        if rows == 0
            || cols == 0
            || x.len() != rows * cols
            || rows > i32::MAX as usize
            || cols > i32::MAX as usize
        {
            return Err(Error::Shape(format!(
                "NVFP4 quantize: {} elements for ({rows}, {cols})",
                x.len()
            )));
        }
        if block_rows != 1 && block_rows != 16 {
            return Err(Error::Shape(format!(
                "NVFP4 blocks are 1x16 or 16x16, not {block_rows}x16"
            )));
        }
        // One thread a packed byte of each copy, counted in a u32 by the launch.
        if !packed_fits_u32(rows, cols) || !packed_fits_u32(cols, rows) {
            return Err(Error::Shape(format!(
                "NVFP4 quantize of ({rows}, {cols}): the packed codes pass 2^32 bytes, \
                 the encode launch's limit"
            )));
        }
        let (seed, sr) = match rounding {
            Rounding::NearestEven => (0u64, 0i32),
            Rounding::Stochastic { seed } => (seed, 1),
        };
        let k = self.nv_kernels()?;
        let mut amax = self.alloc_zeros::<u32>(1, "amax")?;
        let mut nonfinite = self.alloc_zeros::<u32>(1, "nonfinite")?;
        self.launch_amax(x, &mut amax, &mut nonfinite)?;
        if self.stream.clone_dtoh(&nonfinite)?[0] != 0 {
            return Err(Error::NonFinite);
        }
        let mut global = self.alloc_zeros::<f32>(1, "global scale")?;
        let (sr_rows, sr_cols, bri) = (rows as i32, cols as i32, block_rows as i32);
        let mut copy = |transposed: bool| -> Result<NvCopy> {
            let (r, c) = if transposed {
                (cols, rows)
            } else {
                (rows, cols)
            };
            let blocks = r.div_ceil(block_rows) * c.div_ceil(16);
            let mut codes = self.alloc_zeros::<u8>(blocks, "NVFP4 scales")?;
            let mut muls = self.alloc_zeros::<f32>(blocks, "NVFP4 multipliers")?;
            let bytes = r * c.div_ceil(2);
            // SAFETY: every byte is written by the encode kernel.
            let mut packed = unsafe { self.stream.alloc::<u8>(bytes) }
                .map_err(|e| oom(e, bytes, "NVFP4 codes"))?;
            let t = i32::from(transposed);
            // SAFETY: argument types match nvfp4.cu; grids cover the blocks and bytes, guarded in the kernels.
            unsafe {
                self.stream
                    .launch_builder(&k.scales)
                    .arg(x)
                    .arg(&sr_rows)
                    .arg(&sr_cols)
                    .arg(&t)
                    .arg(&bri)
                    .arg(&amax)
                    .arg(&mut codes)
                    .arg(&mut muls)
                    .arg(&mut global)
                    .launch(LaunchConfig::for_num_elems(blocks as u32))?;
                self.stream
                    .launch_builder(&k.encode)
                    .arg(x)
                    .arg(&sr_rows)
                    .arg(&sr_cols)
                    .arg(&t)
                    .arg(&bri)
                    .arg(&muls)
                    .arg(&seed)
                    .arg(&sr)
                    .arg(&mut packed)
                    .launch(LaunchConfig::for_num_elems(bytes as u32))?;
            }
            Ok(NvCopy {
                rows: r,
                cols: c,
                packed,
                codes,
            })
        };
        let rowwise = copy(false)?;
        let colwise = copy(true)?;
        Ok(DeviceNvfp4 {
            rowwise,
            colwise,
            block_rows,
            global,
        })
    }

    /// One copy dequantized to bf16: `code * block scale`, times `1 / global` when `with_global`.
    pub fn nv_dequant_bf16(
        &self,
        c: &NvCopy,
        block_rows: usize,
        global: Option<&CudaSlice<f32>>,
    ) -> Result<CudaSlice<u16>> {
        // The codes grid depends on the block height the copy was quantized
        // with: another height makes the kernel index past `codes`.
        let fits = matches!(block_rows, 1 | 16)
            && c.rows > 0
            && c.cols > 0
            && c.rows <= i32::MAX as usize
            && c.cols <= i32::MAX as usize
            && c.rows * c.cols <= u32::MAX as usize
            && c.packed.len() == c.rows * c.cols.div_ceil(2)
            && c.codes.len() == c.rows.div_ceil(block_rows) * c.cols.div_ceil(16);
        if !fits {
            return Err(Error::Shape(format!(
                "NVFP4 dequantize of ({}, {}) in {block_rows}x16 blocks: {} packed bytes and {} \
                 block scales do not fit (block_rows must be the copy's, 1 or 16; at most 2^32 \
                 elements, the launch's u32 count)",
                c.rows,
                c.cols,
                c.packed.len(),
                c.codes.len()
            )));
        }
        if let Some(g) = global {
            if g.len() != 1 {
                return Err(Error::Shape(format!(
                    "NVFP4 dequantize: the global scale has {} values, not 1",
                    g.len()
                )));
            }
        }
        let k = self.nv_kernels()?;
        let n = c.rows * c.cols;
        // SAFETY: every element is written by the kernel.
        let mut out = unsafe { self.stream.alloc::<u16>(n) }
            .map_err(|e| oom(e, 2 * n, "NVFP4 dequantized"))?;
        let (r, cc, br) = (c.rows as i32, c.cols as i32, block_rows as i32);
        // SAFETY: buffers sized by the copy's dims; the kernel guards rows * cols.
        unsafe {
            match global {
                None => self
                    .stream
                    .launch_builder(&k.dequant)
                    .arg(&c.packed)
                    .arg(&c.codes)
                    .arg(&r)
                    .arg(&cc)
                    .arg(&br)
                    .arg(&mut out)
                    .launch(LaunchConfig::for_num_elems(n as u32))?,
                Some(g) => self
                    .stream
                    .launch_builder(&k.dequant_full)
                    .arg(&c.packed)
                    .arg(&c.codes)
                    .arg(&r)
                    .arg(&cc)
                    .arg(&br)
                    .arg(g)
                    .arg(&mut out)
                    .launch(LaunchConfig::for_num_elems(n as u32))?,
            };
        }
        Ok(out)
    }

    /// Emulated NVFP4 GEMM `d (m, n) = a (m, k) @ b (n, k)^T` from two copies
    /// whose rows are `m` and `n` long... along `k`: exact dequantize to bf16,
    /// bf16 GEMM into f32, then `* (1/global_a) * (1/global_b)`.
    #[allow(clippy::type_complexity)]
    pub fn gemm_nvfp4_emulated<D: GemmOut>(
        &self,
        (a, a_br, a_g): (&NvCopy, usize, &CudaSlice<f32>),
        (b, b_br, b_g): (&NvCopy, usize, &CudaSlice<f32>),
        d: &mut impl GemmDst<D>,
        (m, n, k): (usize, usize, usize),
    ) -> Result<()> {
        if (a.rows, a.cols, b.rows, b.cols) != (m, k, n, k) || d.len() != m * n {
            return Err(Error::Shape(format!(
                "NVFP4 GEMM: a ({}, {}), b ({}, {}) for m={m} n={n} k={k}",
                a.rows, a.cols, b.rows, b.cols
            )));
        }
        if a_g.len() != 1 || b_g.len() != 1 || m * n > i32::MAX as usize {
            return Err(Error::Shape(format!(
                "NVFP4 GEMM: global scales of {} and {} values (1 each) for m={m} n={n} \
                 (m * n at most 2^31 - 1)",
                a_g.len(),
                b_g.len()
            )));
        }
        let ad = self.nv_dequant_bf16(a, a_br, None)?;
        let bd = self.nv_dequant_bf16(b, b_br, None)?;
        let mut acc = self.alloc_zeros::<f32>(m * n, "NVFP4 accumulator")?;
        self.gemm_bf16(&ad, &bd, &mut acc, (m, n, k))?;
        let kern = &self.nv_kernels()?.finish[usize::from(D::OUT == OutType::Bf16)];
        let ni = (m * n) as i32;
        let add = i32::from(d.beta() != 0.0);
        let (dptr, _write) = d.device_ptr_mut(&self.stream);
        // SAFETY: acc and d hold m * n elements; the globals one each.
        unsafe {
            self.stream
                .launch_builder(kern)
                .arg(&acc)
                .arg(a_g)
                .arg(b_g)
                .arg(&dptr)
                .arg(&ni)
                .arg(&add)
                .launch(LaunchConfig::for_num_elems((m * n) as u32))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    /// 2^32 packed bytes is one too many for the encode launch's u32 count:
    /// `bytes as u32` wrapped there, leaving codes unwritten.
    #[test]
    fn packed_bytes_fit_the_launch_count() {
        assert!(super::packed_fits_u32(1 << 16, (1 << 17) - 2));
        assert!(!super::packed_fits_u32(1 << 16, 1 << 17));
        assert!(!super::packed_fits_u32(usize::MAX, 4));
    }
}
