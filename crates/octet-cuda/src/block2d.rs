//! DeepSeek-style block scaling on the device for the GEMMs: the 128x128
//! weight quantizer (`kernels/block2d.cu`, both copies, bit-exact with the
//! CPU's `blk128x128`), the scale-grid transpose that puts 1x128 scales in
//! the layout cuBLASLt's `VEC128_32F` mode reads, and the block-scaled GEMM.
//!
//! Scale layouts cuBLASLt reads (established by the selftest's block GEMM
//! cases against the CPU reference): 1x128 scales of an `(rows, k)` operand as
//! `(k / 128, rows)`, rows contiguous (the transpose of the CPU's row-major
//! grid); 128x128 scales as the CPU's row-major `(rows / 128, k / 128)` grid.

use crate::{nvrtc, oom, Error, GemmDst, GemmOut, Gpu, Result};
use cudarc::driver::{CudaFunction, CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};
use octet_fp8::Format;

/// `transpose_u8_v4_many`'s list (block2d.cu's `struct TransposeMany`):
/// input and output addresses, rows and columns of up to 4 matrices.
#[repr(C)]
#[derive(Clone, Copy)]
struct TransposeMany {
    input: [u64; 4],
    out: [u64; 4],
    rows: [i32; 4],
    cols: [i32; 4],
}

// SAFETY: `#[repr(C)]` plain data laid out as block2d.cu's twin (eight
// 8-byte addresses, eight 4-byte ints; 96 bytes, no padding).
unsafe impl DeviceRepr for TransposeMany {}
const _: () = assert!(std::mem::size_of::<TransposeMany>() == 96);

/// The compiled kernels.
pub(crate) struct Block2dKernels {
    quant: [CudaFunction; 2],
    transpose: CudaFunction,
    pad_cols: CudaFunction,
    pad_cols_u8: CudaFunction,
    transpose_u8: CudaFunction,
    transpose_u8_v4: CudaFunction,
    transpose_u8_v4_many: CudaFunction,
    /// 8 elements per thread (`cols % 8 == 0`, block width `% 8 == 0`).
    dequant8: [CudaFunction; 2],
    dequant: [CudaFunction; 2],
}

/// A `(rows, cols)` matrix quantized with 128x128 blocks: both copies and their scale grids.
pub struct DeviceBlock2dFp8 {
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Element format.
    pub format: Format,
    /// `(rows, cols)` codes.
    pub rowwise: CudaSlice<u8>,
    /// `(ceil(rows/128), ceil(cols/128))` scale_inv, row-major.
    pub row_scale_inv: CudaSlice<f32>,
    /// `(cols, rows)` codes.
    pub colwise: CudaSlice<u8>,
    /// `(ceil(cols/128), ceil(rows/128))` scale_inv, row-major (the transposed grid).
    pub col_scale_inv: CudaSlice<f32>,
    /// Non-zero when the input had a NaN or inf.
    pub nonfinite: CudaSlice<u32>,
}

/// The 128x128 quantizer's grid has one block row per 128 rows, at most 65535 of them.
fn check_grid(rows: usize) -> Result<()> {
    if rows.div_ceil(128) > 65535 {
        return Err(Error::Shape(format!(
            "block quantize: {rows} rows exceed the grid limit (65535 x 128)"
        )));
    }
    Ok(())
}

/// The transpose kernels take i32 dims and a grid of one block row per
/// `tile` rows, at most 65535 of them: beyond either the launch would fail
/// or the dims wrap, so refuse it with the shape.
fn check_transpose_grid(rows: usize, cols: usize, tile: usize) -> Result<()> {
    if rows == 0 || cols == 0 || rows * cols > i32::MAX as usize || rows.div_ceil(tile) > 65535 {
        return Err(Error::Shape(format!(
            "transpose of ({rows}, {cols}): needs 1 to 2^31-1 elements and at most 65535 x {tile} rows"
        )));
    }
    Ok(())
}

impl Gpu {
    fn block2d_kernels(&self) -> Result<&Block2dKernels> {
        if let Some(k) = self.block2d.get() {
            return Ok(k);
        }
        let m = self.ctx.load_module(nvrtc::compile(
            "block2d",
            crate::kernel_source("block2d")?,
            self.arch,
        )?)?;
        let k = Block2dKernels {
            quant: [
                m.load_function("block128x128_bf16_e4m3")?,
                m.load_function("block128x128_bf16_e5m2")?,
            ],
            transpose: m.load_function("transpose_f32")?,
            pad_cols: m.load_function("pad_cols_f32")?,
            pad_cols_u8: m.load_function("pad_cols_u8")?,
            transpose_u8: m.load_function("transpose_u8")?,
            transpose_u8_v4: m.load_function("transpose_u8_v4")?,
            transpose_u8_v4_many: m.load_function("transpose_u8_v4_many")?,
            dequant8: [
                m.load_function("dequant8_e4m3")?,
                m.load_function("dequant8_e5m2")?,
            ],
            dequant: [
                m.load_function("dequant_e4m3")?,
                m.load_function("dequant_e5m2")?,
            ],
        };
        Ok(self.block2d.get_or_init(|| k))
    }

    /// Buffers for a 128x128-block quantized `(rows, cols)` matrix.
    pub fn alloc_block2d_fp8(
        &self,
        rows: usize,
        cols: usize,
        format: Format,
    ) -> Result<DeviceBlock2dFp8> {
        if rows == 0 || cols == 0 || rows > i32::MAX as usize || cols > i32::MAX as usize {
            return Err(Error::Shape(format!("block quantize of ({rows}, {cols})")));
        }
        check_grid(rows)?;
        if !matches!(format, Format::E4M3 | Format::E5M2) {
            return Err(Error::Shape(format!(
                "GPU quantize supports e4m3 and e5m2, not {format}"
            )));
        }
        let (n, g) = (rows * cols, rows.div_ceil(128) * cols.div_ceil(128));
        let s = &self.stream;
        Ok(DeviceBlock2dFp8 {
            rows,
            cols,
            format,
            // SAFETY: every code is written by the kernel before anyone reads it.
            rowwise: unsafe { s.alloc::<u8>(n) }.map_err(|e| oom(e, n, "row-wise FP8"))?,
            row_scale_inv: self.alloc_zeros(g, "block scales")?,
            // SAFETY: as above.
            colwise: unsafe { s.alloc::<u8>(n) }.map_err(|e| oom(e, n, "column-wise FP8"))?,
            col_scale_inv: self.alloc_zeros(g, "block scales")?,
            nonfinite: self.alloc_zeros(1, "nonfinite")?,
        })
    }

    /// Quantize bf16 `x (rows, cols)` with 128x128 blocks into `out` (both copies, one pass).
    pub fn quantize_block128x128_into(
        &self,
        x: &CudaSlice<u16>,
        out: &mut DeviceBlock2dFp8,
        check_finite: bool,
    ) -> Result<()> {
        let (rows, cols) = (out.rows, out.cols);
        if rows == 0
            || cols == 0
            || rows > i32::MAX as usize
            || cols > i32::MAX as usize
            || x.len() != rows * cols
        {
            return Err(Error::Shape(format!(
                "quantize: {} elements for ({rows}, {cols})",
                x.len()
            )));
        }
        check_grid(rows)?;
        // The fields are public: buffers of another shape would be written
        // past their ends.
        let (n, g) = (rows * cols, rows.div_ceil(128) * cols.div_ceil(128));
        if out.rowwise.len() != n
            || out.colwise.len() != n
            || out.row_scale_inv.len() != g
            || out.col_scale_inv.len() != g
            || out.nonfinite.is_empty()
        {
            return Err(Error::Shape(format!(
                "128x128 quantize: output buffers of the wrong size for ({rows}, {cols}): {} \
                 row-wise and {} column-wise codes, {} and {} block scales (want {n}, {n}, {g}, {g})",
                out.rowwise.len(),
                out.colwise.len(),
                out.row_scale_inv.len(),
                out.col_scale_inv.len()
            )));
        }
        let fi = match out.format {
            Format::E4M3 => 0,
            Format::E5M2 => 1,
            other => {
                return Err(Error::Shape(format!(
                    "GPU quantize supports e4m3 and e5m2, not {other}"
                )))
            }
        };
        let k = self.block2d_kernels()?;
        let f = &k.quant[fi];
        let s = &self.stream;
        s.memset_zeros(&mut out.nonfinite)?;
        let (r, c, fmax) = (rows as i32, cols as i32, out.format.max());
        // SAFETY: argument types match block2d.cu; the kernel guards rows and columns;
        // the grid is the tile grid the scale buffers were sized for.
        unsafe {
            s.launch_builder(f)
                .arg(x)
                .arg(&r)
                .arg(&c)
                .arg(&fmax)
                .arg(&mut out.rowwise)
                .arg(&mut out.colwise)
                .arg(&mut out.row_scale_inv)
                .arg(&mut out.col_scale_inv)
                .arg(&mut out.nonfinite)
                .launch(LaunchConfig {
                    grid_dim: (cols.div_ceil(128) as u32, rows.div_ceil(128) as u32, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                })?;
        }
        if check_finite && s.clone_dtoh(&out.nonfinite)?[0] != 0 {
            return Err(Error::NonFinite);
        }
        Ok(())
    }

    /// `out (cols, rows) = input (rows, cols)^T` for f32 (scale grids).
    pub fn transpose_f32(
        &self,
        input: &CudaSlice<f32>,
        rows: usize,
        cols: usize,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        if input.len() != rows * cols || out.len() != rows * cols {
            return Err(Error::Shape(format!("transpose of ({rows}, {cols})")));
        }
        check_transpose_grid(rows, cols, 32)?;
        let k = self.block2d_kernels()?;
        let (r, c) = (rows as i32, cols as i32);
        // SAFETY: lengths checked above; the kernel guards rows and columns.
        unsafe {
            self.stream
                .launch_builder(&k.transpose)
                .arg(input)
                .arg(out)
                .arg(&r)
                .arg(&c)
                .launch(LaunchConfig {
                    grid_dim: (cols.div_ceil(32) as u32, rows.div_ceil(32) as u32, 1),
                    block_dim: (32, 8, 1),
                    shared_mem_bytes: 0,
                })?;
        }
        Ok(())
    }

    /// `(cols, rows)` FP8 codes = the transpose of `input (rows, cols)`, in a new
    /// buffer (the column-wise copy of a per-tensor FP8 matrix: same codes, same scale).
    pub fn transpose_u8(
        &self,
        input: &CudaSlice<u8>,
        rows: usize,
        cols: usize,
    ) -> Result<CudaSlice<u8>> {
        if input.len() != rows * cols || rows * cols > i32::MAX as usize {
            return Err(Error::Shape(format!(
                "transpose of ({rows}, {cols}) from {} bytes",
                input.len()
            )));
        }
        let k = self.block2d_kernels()?;
        // SAFETY: every element is written by the kernel below.
        let mut out = unsafe { self.stream.alloc::<u8>(rows * cols) }
            .map_err(|e| oom(e, rows * cols, "transposed FP8 codes"))?;
        let (r, c) = (rows as i32, cols as i32);
        // 4-byte accesses need both dims multiples of 4 and a 4-byte aligned
        // input (the output is a fresh allocation).
        let in_aligned = {
            let (ptr, _read) = cudarc::driver::DevicePtr::device_ptr(input, &self.stream);
            ptr % 4 == 0
        };
        let v4 = rows.is_multiple_of(4) && cols.is_multiple_of(4) && in_aligned;
        check_transpose_grid(rows, cols, if v4 { 64 } else { 32 })?;
        let (kern, cfg) = if v4 {
            let grid = (cols.div_ceil(64) as u32, rows.div_ceil(64) as u32, 1);
            (&k.transpose_u8_v4, (grid, (256, 1, 1)))
        } else {
            let grid = (cols.div_ceil(32) as u32, rows.div_ceil(32) as u32, 1);
            (&k.transpose_u8, (grid, (32, 8, 1)))
        };
        // SAFETY: lengths checked above; the kernels guard rows and columns.
        unsafe {
            self.stream
                .launch_builder(kern)
                .arg(input)
                .arg(&mut out)
                .arg(&r)
                .arg(&c)
                .launch(LaunchConfig {
                    grid_dim: cfg.0,
                    block_dim: cfg.1,
                    shared_mem_bytes: 0,
                })?;
        }
        Ok(out)
    }

    /// [`Gpu::transpose_u8`] of each `(codes, rows, cols)`: one launch for
    /// up to 4 whose dims are multiples of 4 (the frozen codes of the LoRA
    /// adapters that read one input), else one each.
    pub fn transpose_u8_many(
        &self,
        inputs: &[(&CudaSlice<u8>, usize, usize)],
    ) -> Result<Vec<CudaSlice<u8>>> {
        let fits = |&(input, rows, cols): &(&CudaSlice<u8>, usize, usize)| {
            let (ptr, _read) = cudarc::driver::DevicePtr::device_ptr(input, &self.stream);
            input.len() == rows * cols
                && check_transpose_grid(rows, cols, 64).is_ok()
                && rows.is_multiple_of(4)
                && cols.is_multiple_of(4)
                && ptr % 4 == 0
        };
        if inputs.len() < 2 || inputs.len() > 4 || !inputs.iter().all(fits) {
            return inputs
                .iter()
                .map(|&(input, rows, cols)| self.transpose_u8(input, rows, cols))
                .collect();
        }
        let k = self.block2d_kernels()?;
        let mut list = TransposeMany {
            input: [0; 4],
            out: [0; 4],
            rows: [0; 4],
            cols: [0; 4],
        };
        let mut outs = Vec::with_capacity(inputs.len());
        for (i, &(input, rows, cols)) in inputs.iter().enumerate() {
            // SAFETY: every element is written by the kernel below.
            let mut out = unsafe { self.stream.alloc::<u8>(rows * cols) }
                .map_err(|e| oom(e, rows * cols, "transposed FP8 codes"))?;
            list.input[i] = cudarc::driver::DevicePtr::device_ptr(input, &self.stream).0;
            list.out[i] = cudarc::driver::DevicePtrMut::device_ptr_mut(&mut out, &self.stream).0;
            list.rows[i] = rows as i32;
            list.cols[i] = cols as i32;
            outs.push(out);
        }
        let most = |f: fn(&(&CudaSlice<u8>, usize, usize)) -> usize| {
            inputs.iter().map(f).max().unwrap_or(0)
        };
        let grid = (
            most(|x| x.2).div_ceil(64) as u32,
            most(|x| x.1).div_ceil(64) as u32,
            inputs.len() as u32,
        );
        // SAFETY: every list entry checked above (lengths, dims multiples of
        // 4, 4-byte aligned inputs; the outputs are fresh allocations of
        // rows * cols, alive after the launch); the kernel guards each
        // matrix's rows and columns.
        unsafe {
            self.stream
                .launch_builder(&k.transpose_u8_v4_many)
                .arg(&list)
                .launch(LaunchConfig {
                    grid_dim: grid,
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                })?;
        }
        Ok(outs)
    }

    /// Dequantize one FP8 copy `(rows, cols)` with f32 `scale_inv` per
    /// `block` (row-major grid) to bf16: `code * scale_inv` in f32, rounded once.
    pub fn dequant_bf16(
        &self,
        codes: &CudaSlice<u8>,
        scales: &CudaSlice<f32>,
        (rows, cols): (usize, usize),
        (br, bc): (usize, usize),
        format: Format,
    ) -> Result<CudaSlice<u16>> {
        let grid = rows.div_ceil(br.max(1)) * cols.div_ceil(bc.max(1));
        // The launch counts threads in a u32 and the kernel takes i32 dims.
        let fits = rows
            .checked_mul(cols)
            .is_some_and(|n| n > 0 && n <= i32::MAX as usize)
            && br <= i32::MAX as usize
            && bc <= i32::MAX as usize;
        if !fits || codes.len() != rows * cols || scales.len() != grid || br == 0 || bc == 0 {
            return Err(Error::Shape(format!(
                "dequantize of ({rows}, {cols}) in {br}x{bc} blocks"
            )));
        }
        let fi = match format {
            Format::E4M3 => 0,
            Format::E5M2 => 1,
            other => {
                return Err(Error::Shape(format!(
                    "dequantize takes e4m3 or e5m2, not {other}"
                )))
            }
        };
        let k = self.block2d_kernels()?;
        // SAFETY: every element is written by the kernel.
        let mut out = unsafe { self.stream.alloc::<u16>(rows * cols) }
            .map_err(|e| oom(e, 2 * rows * cols, "dequantized copy"))?;
        let (r, c, bri, bci) = (rows as i32, cols as i32, br as i32, bc as i32);
        // Eight elements a thread where a group of 8 stays in one row and one
        // scale block (8-byte aligned codes, 16-byte aligned output: the
        // buffers are allocation-aligned and each group starts at a multiple of 8).
        let wide = cols % 8 == 0 && bc % 8 == 0;
        let (f, threads) = if wide {
            (&k.dequant8[fi], (rows * cols / 8) as u32)
        } else {
            (&k.dequant[fi], (rows * cols) as u32)
        };
        // SAFETY: lengths checked above; the kernels guard rows * cols.
        unsafe {
            self.stream
                .launch_builder(f)
                .arg(codes)
                .arg(scales)
                .arg(&mut out)
                .arg(&r)
                .arg(&c)
                .arg(&bri)
                .arg(&bci)
                .launch(LaunchConfig::for_num_elems(threads))?;
        }
        Ok(out)
    }

    /// Block-scaled FP8 GEMM `d (m, n) = a (m, k) @ b (n, k)^T` (see [`crate::gemm::Blas::gemm_fp8_block`]);
    /// 1x128 scales in `(ceil(k/128), rows)` layout, 128x128 ones as octet
    /// stores them, row-major `(ceil(rows/128), ceil(k/128))`.
    ///
    /// cuBLASLt needs k a multiple of 128 and reads a 128x128 grid with its
    /// rows padded to a multiple of 4 blocks. Where k is not one, both
    /// operands' codes are copied for the call with zero columns up to the
    /// next multiple of 128 (the scale grids already have the partial block;
    /// the zeros add nothing, so the product is unchanged); where the k
    /// blocks are not a multiple of 4, the 128x128 grids are copied padded.
    /// Neither happens at widths that are multiples of 512.
    #[allow(clippy::type_complexity)]
    pub fn gemm_fp8_block<D: GemmOut>(
        &self,
        a: (&CudaSlice<u8>, Format, &CudaSlice<f32>, bool),
        b: (&CudaSlice<u8>, Format, &CudaSlice<f32>, bool),
        d: &mut impl GemmDst<D>,
        (m, n, k): (usize, usize, usize),
    ) -> Result<()> {
        if k == 0 || k % 16 != 0 {
            return Err(Error::Shape(format!(
                "block-scaled FP8 GEMM needs k a multiple of 16, got m={m} n={n} k={k}"
            )));
        }
        let kp = k.next_multiple_of(128);
        let widen = |codes: &CudaSlice<u8>, rows: usize| -> Result<Option<CudaSlice<u8>>> {
            if kp == k {
                return Ok(None);
            }
            self.pad_codes(codes, rows, k, kp).map(Some)
        };
        let (ca, cb) = (widen(a.0, m)?, widen(b.0, n)?);
        let kb = kp / 128;
        let pad =
            |grid: &CudaSlice<f32>, two_d: bool, rows: usize| -> Result<Option<CudaSlice<f32>>> {
                if !two_d || kb % 4 == 0 {
                    return Ok(None);
                }
                self.pad_scale_grid(grid, rows.div_ceil(128), kb).map(Some)
            };
        let (pa, pb) = (pad(a.2, a.3, m)?, pad(b.2, b.3, n)?);
        self.blas()?.gemm_fp8_block(
            (
                ca.as_ref().unwrap_or(a.0),
                a.1,
                pa.as_ref().unwrap_or(a.2),
                a.3,
            ),
            (
                cb.as_ref().unwrap_or(b.0),
                b.1,
                pb.as_ref().unwrap_or(b.2),
                b.3,
            ),
            d,
            (m, n, kp),
        )
    }

    /// `(rows, cols)` FP8 codes copied with zero columns up to `stride`.
    fn pad_codes(
        &self,
        codes: &CudaSlice<u8>,
        rows: usize,
        cols: usize,
        stride: usize,
    ) -> Result<CudaSlice<u8>> {
        let k = self.block2d_kernels()?;
        self.pad_cols(
            &k.pad_cols_u8,
            codes,
            (rows, cols, stride),
            "padded FP8 operand",
        )
    }

    /// A row-major `(rows, cols)` f32 grid copied with each row padded by
    /// zeros to a multiple of 4 columns (cuBLASLt's 128x128 scale layout).
    fn pad_scale_grid(
        &self,
        grid: &CudaSlice<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<CudaSlice<f32>> {
        let k = self.block2d_kernels()?;
        let stride = cols.next_multiple_of(4);
        self.pad_cols(&k.pad_cols, grid, (rows, cols, stride), "padded scale grid")
    }

    /// `out (rows, stride)` = `input (rows, cols)` with zero columns on the
    /// right, by `f` (`pad_cols_f32` or `pad_cols_u8`, matching `T`).
    fn pad_cols<T: DeviceRepr>(
        &self,
        f: &CudaFunction,
        input: &CudaSlice<T>,
        (rows, cols, stride): (usize, usize, usize),
        what: &str,
    ) -> Result<CudaSlice<T>> {
        if input.len() != rows * cols || stride < cols || rows * stride > i32::MAX as usize {
            return Err(Error::Shape(format!(
                "{what}: {} values are not ({rows}, {cols}) padded to {stride} columns",
                input.len()
            )));
        }
        // SAFETY: the kernel writes all rows * stride values.
        let mut out = unsafe { self.stream.alloc::<T>(rows * stride) }
            .map_err(|e| oom(e, std::mem::size_of::<T>() * rows * stride, what))?;
        let (r, c, st) = (rows as i32, cols as i32, stride as i32);
        // SAFETY: lengths checked above; the kernel guards rows * stride.
        unsafe {
            self.stream
                .launch_builder(f)
                .arg(input)
                .arg(&mut out)
                .arg(&r)
                .arg(&c)
                .arg(&st)
                .launch(LaunchConfig::for_num_elems((rows * stride) as u32))?;
        }
        Ok(out)
    }
}
