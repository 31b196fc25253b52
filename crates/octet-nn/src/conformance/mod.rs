//! Conformance: the GPU against the CPU reference on the same inputs.
//!
//! Quantize must be bit-exact (codes and scales) with `octet_fp8::quantize`;
//! GEMMs must agree with `octet_tensor::cpu` within f32 accumulation-order
//! noise. Inputs are fresh pseudo-random data (never all zeros, except the one
//! case that tests amax = 0), outputs are poisoned before each run so an
//! element the GPU never writes shows up as a mismatch.

use cudarc::driver::CudaSlice;
use half::bf16;
use octet_cuda::{Error, Gpu, Result};
use octet_fp8::{
    Format, Granularity, Layout, QuantData, QuantSpec, Rounding, ScaleRule, Scales, Usage,
};

use octet_cuda::probe::every_code_product;
pub use octet_cuda::testdata::{bf16_bits, random_bf16, random_f32, random_wide_f32};

mod casts;
mod decode;
mod family;
mod gemm;
mod linear;
mod lora;
mod model;
mod shard;
mod tol;
mod weight_only;

use casts::*;
use decode::*;
use family::*;
use gemm::*;
use linear::*;
pub use model::*;
use shard::*;
pub use tol::*;
use weight_only::*;

/// One conformance case.
#[derive(Clone, Debug)]
pub struct CaseResult {
    /// What was checked.
    pub name: String,
    /// Whether it passed.
    pub pass: bool,
    /// The worst error seen (bytes differing with the first bad index, or relative error), as text.
    pub worst: String,
}

fn spec(format: Format, granularity: Granularity, power_of_two: bool) -> QuantSpec {
    QuantSpec {
        format,
        granularity,
        rule: ScaleRule::Amax { power_of_two },
        rounding: Rounding::NearestEven,
    }
}

/// Compare one GPU copy (codes + f32 scales) with the CPU's; returns (pass, text).
fn compare_copy(got: &[u8], got_scales: &[f32], want: &QuantData, what: &str) -> (bool, String) {
    let (bad, text) = byte_diff(got, &want.data);
    let scales_ok = match &want.scales {
        Scales::F32(v) => f32_bits_equal(got_scales, v),
        _ => false,
    };
    (
        bad == 0 && scales_ok,
        format!(
            "{what}: {text}, scales {}",
            if scales_ok { "equal" } else { "DIFFER" }
        ),
    )
}

fn host_data(
    gpu: &Gpu,
    rows: usize,
    cols: usize,
    format: Format,
    data: &CudaSlice<u8>,
    scale_inv: &CudaSlice<f32>,
) -> Result<QuantData> {
    Ok(QuantData {
        rows,
        cols,
        format,
        data: gpu.download(data)?,
        block: (rows, cols),
        scales: Scales::F32(gpu.download(scale_inv)?),
        saturated: 0,
        underflowed: 0,
    })
}

/// Host copy of a device per-tensor quantized tensor's `layout` copy as a CPU [`QuantData`].
pub fn to_host(gpu: &Gpu, q: &octet_cuda::DeviceFp8, layout: Layout) -> Result<QuantData> {
    match layout {
        Layout::Rowwise => host_data(gpu, q.rows, q.cols, q.format, &q.rowwise, &q.scale_inv),
        Layout::Colwise => host_data(gpu, q.cols, q.rows, q.format, &q.colwise, &q.scale_inv),
    }
}

/// The conformance suite: quantize bit-exact against the CPU, FP8 and bf16
/// GEMMs within tolerance, weight-only products, the layers, the training and
/// LoRA models, and the bad-input errors (about a minute on an H100). See [`selftest_groups`] for the groups skipped on a
/// GPU without FP8 GEMMs.
pub fn selftest(gpu: &Gpu) -> Result<Vec<CaseResult>> {
    Ok(selftest_groups(gpu, Scope::All)?.0)
}

/// A group of conformance cases.
pub(crate) type Group = fn(&Gpu, &mut Vec<CaseResult>) -> Result<()>;

/// On a GPU without FP8 GEMMs, a case that `needs` them is recorded as
/// skipped (returns `true`: the caller goes on to its next case). Groups
/// guard their FP8 cases with it, so that the cases after one still run.
pub(crate) fn skip_without_fp8_gemm(
    gpu: &Gpu,
    needs: bool,
    name: impl Into<String>,
    out: &mut Vec<CaseResult>,
) -> bool {
    let skip = needs && !gpu.fp8_gemm;
    if skip {
        out.push(CaseResult {
            name: name.into(),
            pass: false,
            worst: Error::Unsupported("needs FP8 GEMMs".into()).to_string(),
        });
    }
    skip
}

/// Which cases [`selftest_groups`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every group.
    All,
    /// The FP8 conversions and the weight-only products alone (`octet
    /// selftest --only weight-only`): the checks a GPU without FP8 GEMMs
    /// runs in full, in a fraction of the time.
    WeightOnly,
}

/// What [`Error::Unsupported`] displays first (checked by a unit test).
const UNSUPPORTED: &str = "not supported on this GPU: ";

/// [`selftest`], and the names of the cases and groups skipped because they
/// need FP8 GEMMs, which this GPU lacks (Ampere, or `OCTET_FP8_GEMM=off`).
/// There the groups skip their FP8 cases one by one
/// (`skip_without_fp8_gemm`); a group that still stops on
/// [`Error::Unsupported`] is skipped from there on (its name is listed), and
/// one case checks that an FP8 GEMM is refused. A group that fails with any
/// other error is a failed case named after it.
pub fn selftest_groups(gpu: &Gpu, scope: Scope) -> Result<(Vec<CaseResult>, Vec<String>)> {
    let mut out = Vec::new();
    let mut skipped = Vec::new();
    let groups: &[(&'static str, Group)] = if scope == Scope::WeightOnly {
        &[
            ("FP8 conversion cases", conversion_cases),
            ("weight-only product cases", mixed_cases),
        ]
    } else {
        &[
            ("FP8 conversion cases", conversion_cases),
            ("quantize cases", quantize_cases),
            ("1x128 block cases", block_cases),
            ("block variant cases", block_variant_cases),
            ("transpose cases", transpose_cases),
            ("FP8 GEMM cases", gemm_fp8_cases),
            ("bf16 GEMM cases", gemm_bf16_cases),
            ("bad-input cases", error_cases),
            ("weight-only product cases", mixed_cases),
            ("decoding cases", decode_cases),
            ("row-wise cases", rowwise_cases),
            ("delayed scaling cases", delayed_cases),
            ("block-scaled GEMM cases", block_gemm_cases),
            ("linear layer cases", linear_cases),
            ("fast accumulation cases", fast_accum_cases),
            ("MXFP8 cases", mx_cases),
            ("NVFP4 cases", nvfp4_cases),
            ("telemetry cases", telemetry_cases),
            ("training model cases", model_cases),
            ("model family cases", family_cases),
            ("LoRA fused cast cases", lora::fused_cases),
            ("LoRA d_A cases", lora::da_cases),
            ("LoRA layer cases", lora::layer_cases),
            ("LoRA FP8-saved input cases", lora::fp8_saved_layer_cases),
            ("LoRA dropout cases", lora::dropout_cases),
            ("LoRA model cases", lora::model_cases),
            ("LoRA model family cases", lora::family_model_cases),
            ("LoRA stored-checkpoint cases", lora::stored_cases),
            ("activation recomputation cases", recompute_cases),
            ("sharded model cases (NCCL, one rank)", sharded_cases),
        ]
    };
    for &(name, group) in groups {
        match group(gpu, &mut out) {
            Ok(()) => {}
            Err(Error::Unsupported(_)) if !gpu.fp8_gemm => skipped.push(name.to_string()),
            Err(e) => out.push(CaseResult {
                name: name.into(),
                pass: false,
                worst: e.to_string(),
            }),
        }
    }
    if !gpu.fp8_gemm {
        let (refused, kept): (Vec<CaseResult>, Vec<CaseResult>) = out
            .into_iter()
            .partition(|c| !c.pass && c.worst.starts_with(UNSUPPORTED));
        out = kept;
        skipped.extend(refused.into_iter().map(|c| c.name));
    }
    if !gpu.fp8_gemm {
        let (a, sa) = (gpu.upload(&[0u8; 256])?, gpu.upload(&[1f32])?);
        let mut d = gpu.upload(&[0f32; 256])?;
        let r = gpu.blas()?.gemm_fp8(
            &a,
            Format::E4M3,
            &sa,
            &a,
            Format::E4M3,
            &sa,
            &mut d,
            (16, 16, 16),
            false,
        );
        out.push(CaseResult {
            name: "FP8 GEMM refused without FP8 tensor cores".into(),
            pass: matches!(r, Err(Error::Unsupported(_))),
            worst: match r {
                Err(e) => e.to_string(),
                Ok(()) => "it ran".into(),
            },
        });
    }
    Ok((out, skipped))
}

pub(crate) fn download_f32<D: octet_cuda::GemmOut>(
    gpu: &Gpu,
    d: &CudaSlice<D>,
) -> Result<Vec<f32>> {
    Ok(gpu.download(d)?.into_iter().map(D::to_f32).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_errors_start_with_the_prefix_the_selftest_skips() {
        assert!(Error::Unsupported("FP8 GEMM".into())
            .to_string()
            .starts_with(UNSUPPORTED));
    }
}
