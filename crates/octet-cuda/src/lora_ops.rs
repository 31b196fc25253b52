//! The kernels of `lora.cu`: the launches LoRA layers make besides their
//! GEMMs (the fused casts of `dy` with `du`, `d_A` from E4M3 codes, the bf16
//! transpose, and dropout's mask and masked add). The layer that uses them is
//! `octet_nn::lora::cuda`.

/// A dropout mask as the kernels draw it: element `i` of a tensor is dropped
/// when the 16 bits that `key` and `i` hash to are below `threshold`
/// (`octet_nn::lora::Dropout` makes both from the drop probability).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DropMask {
    /// Key of the mask.
    pub key: u64,
    /// Elements whose bits are below this are dropped.
    pub threshold: u16,
}

use crate::{DeviceFp8, Error, GemmOut, Gpu, Result, TensorAmax};
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaViewMut, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg,
};
use octet_fp8::Format;

/// The kernels of `lora.cu` (compiled on first use).
pub struct LoraKernels {
    /// `lora_cast_du_e5m2_r{8, 16, ..., 64}`.
    cast_du: Vec<CudaFunction>,
    /// `lora_cast_du_e4m3_r{8, 16, ..., 64}` (the forward's cast + `u`).
    cast_u: Vec<CudaFunction>,
    /// `lora_da_e4m3_mt{1..4}` (d_A from the input's E4M3 codes, ranks up to 64).
    da: Vec<CudaFunction>,
    /// The grid barrier's word of `lora_da_e4m3_mt*` (zeroed once; its low
    /// 31 bits are 0 again after every barrier). Its launches all go to the
    /// one stream, so no two use it at once.
    da_barrier: CudaSlice<u32>,
    transpose_b16: CudaFunction,
    dropout_mask: CudaFunction,
    dropout_add_f32: CudaFunction,
    dropout_add_b16: CudaFunction,
}

/// `lora_da_e4m3_mt*`'s destinations (the kernel's `DaOut`): adapter `i`'s
/// rows of the stacked `d_A` are rows `end[i - 1] .. end[i]` (from 0), written
/// to the `(rank, k)` f32 matrix at device address `out[i]`.
#[repr(C)]
#[derive(Clone, Copy)]
struct DaOut {
    out: [u64; 4],
    end: [i32; 4],
}

// SAFETY: `DaOut` is `#[repr(C)]` plain data laid out as the kernel's
// `struct DaOut { float* out[4]; int end[4]; }` (four 8-byte pointers, four
// 4-byte ints, 48 bytes, 8-byte aligned).
unsafe impl DeviceRepr for DaOut {}
const _: () = assert!(std::mem::size_of::<DaOut>() == 48);

/// A grid-stride launch over `work` items: 256 threads a block, at most
/// 4096 blocks.
fn elementwise_grid(work: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (work.div_ceil(256).clamp(1, 4096) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl Gpu {
    fn lora_kernels(&self) -> Result<&LoraKernels> {
        if let Some(k) = self.lora_k.get() {
            return Ok(k);
        }
        let m = self.ctx.load_module(crate::nvrtc::compile(
            "lora",
            crate::kernel_source("lora")?,
            self.arch,
        )?)?;
        let k = LoraKernels {
            cast_du: (1..=8)
                .map(|i| m.load_function(&format!("lora_cast_du_e5m2_r{}", 8 * i)))
                .collect::<std::result::Result<Vec<_>, _>>()?,
            cast_u: (1..=8)
                .map(|i| m.load_function(&format!("lora_cast_du_e4m3_r{}", 8 * i)))
                .collect::<std::result::Result<Vec<_>, _>>()?,
            da: (1..=4)
                .map(|i| m.load_function(&format!("lora_da_e4m3_mt{i}")))
                .collect::<std::result::Result<Vec<_>, _>>()?,
            da_barrier: self.stream.alloc_zeros::<u32>(1)?,
            transpose_b16: m.load_function("transpose_b16")?,
            dropout_mask: m.load_function("dropout_mask_b16")?,
            dropout_add_f32: m.load_function("dropout_add_f32")?,
            dropout_add_b16: m.load_function("dropout_add_b16")?,
        };
        Ok(self.lora_k.get_or_init(|| k))
    }

    /// `x` (bf16 bits) with the elements `dropout` drops zeroed (the others
    /// as they are): a new buffer.
    pub fn dropout_mask(&self, x: &CudaSlice<u16>, dropout: DropMask) -> Result<CudaSlice<u16>> {
        let k = self.lora_kernels()?;
        let n = x.len();
        // SAFETY: the kernel writes every element.
        let mut out = unsafe { self.alloc_uninit::<u16>(n, "dropout-masked input")? };
        let (nl, key, thr) = (n as i64, dropout.key, u32::from(dropout.threshold));
        // SAFETY: n elements in and out; fresh allocations are 256-byte
        // aligned for the kernel's 16-byte accesses.
        unsafe {
            self.stream
                .launch_builder(&k.dropout_mask)
                .arg(x)
                .arg(&nl)
                .arg(&key)
                .arg(&thr)
                .arg(&mut out)
                .launch(elementwise_grid(n.div_ceil(8)))?;
        }
        Ok(out)
    }

    /// `d (+)= mask * t` elementwise: written when `fresh`, added otherwise
    /// (`d` f32, or bf16 rounded once), `t` f32 of `d`'s length.
    pub fn dropout_add<D: GemmOut>(
        &self,
        t: &CudaSlice<f32>,
        dropout: DropMask,
        d: &mut CudaSlice<D>,
        fresh: bool,
    ) -> Result<()> {
        if t.len() != d.len() {
            return Err(Error::Shape(format!(
                "dropout add of {} elements into {}",
                t.len(),
                d.len()
            )));
        }
        let k = self.lora_kernels()?;
        let f = match D::OUT {
            crate::gemm::OutType::F32 => &k.dropout_add_f32,
            crate::gemm::OutType::Bf16 => &k.dropout_add_b16,
        };
        let n = t.len();
        let (nl, key) = (n as i64, dropout.key);
        let (thr, fr) = (u32::from(dropout.threshold), i32::from(fresh));
        // SAFETY: both buffers hold n elements of the kernel's types (D is
        // f32 or bf16 bits, as OUT says).
        unsafe {
            self.stream
                .launch_builder(f)
                .arg(t)
                .arg(&nl)
                .arg(&key)
                .arg(&thr)
                .arg(d)
                .arg(&fr)
                .launch(elementwise_grid(n.div_ceil(4)))?;
        }
        Ok(())
    }

    /// `(cols, rows)` = the transpose of a 16-bit `(rows, cols)` matrix (bf16 bits).
    pub fn transpose_bf16(
        &self,
        x: &CudaSlice<u16>,
        rows: usize,
        cols: usize,
    ) -> Result<CudaSlice<u16>> {
        if x.len() != rows * cols || rows * cols > i32::MAX as usize {
            return Err(Error::Shape(format!(
                "transpose of ({rows}, {cols}) from {} elements",
                x.len()
            )));
        }
        let k = self.lora_kernels()?;
        // SAFETY: the kernel writes every element.
        let mut out = unsafe { self.alloc_uninit::<u16>(rows * cols, "transposed bf16")? };
        let (r, c) = (rows as i32, cols as i32);
        // SAFETY: lengths checked above; the kernel guards the element count.
        unsafe {
            self.stream
                .launch_builder(&k.transpose_b16)
                .arg(x)
                .arg(&r)
                .arg(&c)
                .arg(&mut out)
                .launch(LaunchConfig {
                    grid_dim: ((rows * cols).div_ceil(256).max(1) as u32, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                })?;
        }
        Ok(out)
    }

    /// Whether [`Gpu::lora_cast_du`] takes a `(m, n)` gradient and rank `r`:
    /// `n` a multiple of 64, `m` of 16, `r` of 8 up to 64.
    pub fn lora_cast_du_fits(m: usize, n: usize, r: usize) -> bool {
        n.is_multiple_of(64)
            && m.is_multiple_of(16)
            && m > 0
            && n > 0
            && r.is_multiple_of(8)
            && (8..=64).contains(&r)
            && m.max(r) * n <= i32::MAX as usize
    }

    /// One read of a LoRA layer's output gradient `dy (m, n)` (bf16 bits)
    /// for both its products in the `quantized` backward: its row-wise E5M2
    /// codes with current per-tensor scaling (the bytes and `scale_inv` of
    /// [`Gpu::quantize_tensorwise_rowwise_known`]; `amax` from the kernel
    /// that wrote `dy`, or `None` for an amax pass) and the adapter's
    /// `du^T = s B^T dy^T` (`(r, m)`, bf16, f32 sums) into `dut`, given
    /// `B^T (r, n)` (see [`Gpu::transpose_bf16`]).
    pub fn lora_cast_du(
        &self,
        dy: &CudaSlice<u16>,
        (m, n): (usize, usize),
        amax: Option<TensorAmax>,
        (bt, r, s): (&CudaSlice<u16>, usize, f32),
        dut: &mut CudaViewMut<'_, u16>,
    ) -> Result<DeviceFp8> {
        self.lora_cast_product(Format::E5M2, dy, (m, n), amax, (bt, r, s), dut)
    }

    /// The forward's [`Gpu::lora_cast_du`]: one read of a LoRA group's input
    /// `x (m, k)` (bf16 bits) for its row-wise E4M3 codes with current
    /// per-tensor scaling (the bytes of
    /// [`Gpu::quantize_tensorwise_rowwise_known`]) and the adapters'
    /// `u^T = A x^T` (`(r, m)`, bf16, f32 sums) into `ut`, given the stacked
    /// `A (r, k)`. Same shape rules as [`Gpu::lora_cast_du_fits`] (with `k`
    /// for `n`).
    pub fn lora_cast_u(
        &self,
        x: &CudaSlice<u16>,
        (m, k): (usize, usize),
        amax: Option<TensorAmax>,
        (a, r): (&CudaSlice<u16>, usize),
        ut: &mut CudaViewMut<'_, u16>,
    ) -> Result<DeviceFp8> {
        self.lora_cast_product(Format::E4M3, x, (m, k), amax, (a, r, 1.0), ut)
    }

    /// Whether [`Gpu::lora_da_e4m3`] takes `m` tokens of width `k` and `r`
    /// adapter rows: `m` and `k` multiples of 16, `r` from 1 to 64.
    pub fn lora_da_fits(m: usize, k: usize, r: usize) -> bool {
        m.is_multiple_of(16)
            && k.is_multiple_of(16)
            && m > 0
            && k > 0
            && (1..=64).contains(&r)
            && m.max(r) * k <= i32::MAX as usize
    }

    /// The adapters' weight gradients `d_A = du^T x` from the row-wise E4M3
    /// codes of `x (m, k)` that the forward kept (`xq`, per tensor), without
    /// a bf16 copy of `x`: `du^T` stacks the adapters' rows (`ranks`, at most
    /// 4 adapters, `r = sum of ranks`, bf16 `(r, m)`), and each adapter gets
    /// its own `(rank, k)` f32 result. The codes' exact values times `du^T`
    /// with f32 sums on the tensor cores, over fixed ranges of tokens added
    /// in order, then times `xq`'s one dequantization factor: the result does
    /// not depend on timing. Shapes as [`Gpu::lora_da_fits`].
    pub fn lora_da_e4m3(
        &self,
        dut: &CudaSlice<u16>,
        ranks: &[usize],
        xq: &DeviceFp8,
        (m, k): (usize, usize),
    ) -> Result<Vec<CudaSlice<f32>>> {
        let r: usize = ranks.iter().sum();
        if !Self::lora_da_fits(m, k, r)
            || ranks.is_empty()
            || ranks.len() > 4
            || ranks.contains(&0)
            || dut.len() != r * m
            || xq.format != Format::E4M3
            || (xq.rows, xq.cols) != (m, k)
            || xq.rowwise.len() != m * k
        {
            return Err(Error::Shape(format!(
                "LoRA d_A from FP8: du^T of {} elements as ({r}, {m}) for ranks {ranks:?}, {} input of {} codes as ({m}, {k}); needs E4M3 row-wise codes, m % 16 == 0, k % 16 == 0, 1 to 4 adapters of rank >= 1, r in 1..=64",
                dut.len(),
                xq.format,
                xq.rowwise.len()
            )));
        }
        let kernels = self.lora_kernels()?;
        // At most one block of 256 features an SM (each keeps 16-24 KB of
        // loads in flight), all in one wave, which the grid barrier of more
        // than one split needs: few splits, so that their f32 sums stay a
        // small part of the traffic; each split a whole number of 16-token
        // steps.
        let cols = k.div_ceil(256);
        let want = (self.sm_count.max(1) as usize / cols).max(1);
        let splits = want.clamp(1, m / 16);
        let per = (m.div_ceil(splits)).div_ceil(16) * 16;
        let splits = m.div_ceil(per);
        // SAFETY: the kernel writes every element of every output (each
        // block its split's part, then the reduction every output row).
        let mut outs = ranks
            .iter()
            .map(|&ri| unsafe { self.alloc_uninit::<f32>(ri * k, "d_lora_A") })
            .collect::<Result<Vec<CudaSlice<f32>>>>()?;
        // One split writes the outputs directly; `part` is then not read.
        let mut part: CudaSlice<f32> =
            unsafe { self.alloc_uninit(if splits > 1 { splits * r * k } else { 4 }, "d_A parts")? };
        let mut dst = DaOut {
            out: [0; 4],
            end: [r as i32; 4],
        };
        let mut guards = Vec::with_capacity(outs.len());
        let mut end = 0;
        for (i, (o, &ri)) in outs.iter_mut().zip(ranks).enumerate() {
            let (ptr, guard) = o.device_ptr_mut(&self.stream);
            guards.push(guard);
            end += ri;
            dst.out[i] = ptr;
            dst.end[i] = end as i32;
        }
        for i in ranks.len()..4 {
            dst.out[i] = dst.out[0];
        }
        let (ri, mi, ki, ti) = (r as i32, m as i32, k as i32, per as i32);
        let cfg = LaunchConfig {
            grid_dim: (cols as u32, splits as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: shapes checked above (16-byte copies inside rows of k % 16
        // == 0 codes and of du^T's m % 16 == 0 tokens, 16-byte stores inside
        // rows of k; fresh allocations are 256-byte aligned); `dst` holds the
        // outputs' addresses, alive until after the launch, its unused
        // entries never selected (their `end` is r). More than one split
        // waits at a grid barrier: launched cooperatively, so that every
        // block is resident (the grid is at most one block an SM).
        unsafe {
            let mut launch = self.stream.launch_builder(&kernels.da[r.div_ceil(16) - 1]);
            launch
                .arg(dut)
                .arg(&ri)
                .arg(&xq.rowwise)
                .arg(&mi)
                .arg(&ki)
                .arg(&ti)
                .arg(&xq.scale_inv)
                .arg(&mut part)
                // The kernel writes the word (atomics); it is never read here.
                .arg(&kernels.da_barrier)
                .arg(&dst);
            if splits > 1 {
                launch.launch_cooperative(cfg)?;
            } else {
                launch.launch(cfg)?;
            }
        }
        drop(guards);
        Ok(outs)
    }

    /// `lora_cast_du` in `format`: codes of `dy` and `s bt dy^T`.
    fn lora_cast_product(
        &self,
        format: Format,
        dy: &CudaSlice<u16>,
        (m, n): (usize, usize),
        amax: Option<TensorAmax>,
        (bt, r, s): (&CudaSlice<u16>, usize, f32),
        dut: &mut CudaViewMut<'_, u16>,
    ) -> Result<DeviceFp8> {
        if !Self::lora_cast_du_fits(m, n, r)
            || dy.len() != m * n
            || bt.len() != r * n
            || dut.len() != r * m
        {
            return Err(Error::Shape(format!(
                "LoRA cast+du: dy of {} elements as ({m}, {n}), B^T of {} as ({r}, {n}), du^T of {} as ({r}, {m}); needs n % 64 == 0, m % 16 == 0, r in 8, 16, ..., 64",
                dy.len(),
                bt.len(),
                dut.len()
            )));
        }
        let kernels = self.lora_kernels()?;
        let kernel = match format {
            Format::E5M2 => &kernels.cast_du[r / 8 - 1],
            Format::E4M3 => &kernels.cast_u[r / 8 - 1],
            _ => {
                return Err(Error::Shape(format!(
                    "LoRA cast + product in {format}: E4M3 or E5M2 only"
                )))
            }
        };
        let mut out = self.rowwise_fp8_shell(dy, (m, n), format, amax)?;
        // SAFETY: the kernel writes every code.
        out.rowwise = unsafe { self.alloc_uninit::<u8>(m * n, "row-wise FP8")? };
        let (mi, ni) = (m as i32, n as i32);
        // SAFETY: shapes checked above (every thread's 16-byte accesses are
        // inside its rows; fresh allocations are 256-byte aligned).
        unsafe {
            self.stream
                .launch_builder(kernel)
                .arg(dy)
                .arg(&mi)
                .arg(&ni)
                .arg(&out.amax_bits)
                .arg(bt)
                .arg(&s)
                .arg(&mut out.rowwise)
                .arg(&mut out.scale_inv)
                .arg(dut)
                .launch(LaunchConfig {
                    grid_dim: ((m / 16) as u32, 1, 1),
                    block_dim: (128, 1, 1),
                    shared_mem_bytes: 0,
                })?;
        }
        Ok(out)
    }
}
