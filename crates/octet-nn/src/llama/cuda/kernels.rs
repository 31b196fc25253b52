//! The GPU model's kernels: which source (`octet_cuda::kernel_source`) each
//! comes from, and their loading per head width.

use super::*;

pub(super) struct Fns {
    pub(super) embed_fwd: CudaFunction,
    pub(super) embed_bwd: CudaFunction,
    pub(super) norm_fwd: CudaFunction,
    /// The vectorized forward for hidden sizes that are multiples of 4, up to
    /// [`NORM_FWD_V4_MAX`] (`rmsnorm_fwd_v4` in norm.cu).
    pub(super) norm_fwd_v4: CudaFunction,
    pub(super) norm_bwd: CudaFunction,
    pub(super) norm_bwd_v4: CudaFunction,
    pub(super) norm_bwd_b16: CudaFunction,
    pub(super) norm_bwd_b16_v4: CudaFunction,
    pub(super) sum_partials: CudaFunction,
    pub(super) head_norm_fwd: CudaFunction,
    pub(super) head_norm_bwd: CudaFunction,
    pub(super) bias_add: CudaFunction,
    pub(super) rope_fwd: CudaFunction,
    pub(super) rope_bwd: CudaFunction,
    pub(super) swiglu_fwd: CudaFunction,
    pub(super) swiglu_bwd: CudaFunction,
    /// SwiGLU keeping its inputs in FP8: `[scalar, 8 columns a thread]` of forward, backward.
    pub(super) swiglu_fwd_q: [CudaFunction; 2],
    pub(super) swiglu_bwd_q: [CudaFunction; 2],
    pub(super) add: CudaFunction,
    /// Up to [`ADD_MANY`] gradients into the flat buffer in one launch.
    pub(super) add_many: CudaFunction,
    pub(super) add_bf16: CudaFunction,
    pub(super) to_bf16: CudaFunction,
    pub(super) xent: CudaFunction,
    pub(super) sumsq: CudaFunction,
    pub(super) adamw: CudaFunction,
    /// `adamw` over up to [`ADAM_MANY`] tensors without amax in one launch.
    pub(super) adamw_many: CudaFunction,
    pub(super) attn_delta: CudaFunction,
    pub(super) attn: Attn,
}

/// Head dims of the mma.sync attention kernels (`attn_*_tc{d}` in attention.cu).
pub const ATTN_TC_DIMS: [usize; 4] = [16, 32, 64, 128];

/// Head dims of the sm_90a wgmma attention kernels (`attn_*_wg{d}` in attention.cu).
pub const ATTN_WG_DIMS: [usize; 2] = [64, 128];

/// Every kernel the GPU model loads, by the kernel family it is loaded from
/// (a name of `octet_cuda::KERNEL_SOURCES`, one module each): `load_fns`
/// takes each function from the module this table names, so a kernel moved
/// to another file is a change here, which a host test checks against the
/// `__global__`s of every source.
pub const TRAIN_KERNELS: [(&str, &[&str]); 8] = [
    ("embed", &["embed_fwd", "embed_bwd"]),
    (
        "norm",
        &[
            "rmsnorm_fwd",
            "rmsnorm_fwd_v4",
            "rmsnorm_bwd",
            "rmsnorm_bwd_v4",
            "rmsnorm_bwd_b16",
            "rmsnorm_bwd_b16_v4",
            "sum_partials",
            "head_norm_fwd",
            "head_norm_bwd",
        ],
    ),
    (
        "rope",
        &["rope_fwd", "rope_fwd_v4", "rope_bwd", "rope_bwd_v4"],
    ),
    (
        "swiglu",
        &[
            "swiglu_fwd",
            "swiglu_bwd",
            "swiglu_fwd_q",
            "swiglu_fwd_q_v8",
            "swiglu_bwd_q",
            "swiglu_bwd_q_v8",
        ],
    ),
    (
        "elementwise",
        &[
            "add_inplace",
            "add_many",
            "add_bf16_inplace",
            "to_bf16",
            "bias_add",
        ],
    ),
    ("loss", &["cross_entropy"]),
    ("optim", &["sumsq_partial", "adamw", "adamw_many"]),
    (
        "attention",
        &[
            "attn_delta",
            "attn_fwd",
            "attn_bwd_dkdv",
            "attn_bwd_dq",
            "attn_fwd_tc16",
            "attn_dkdv_tc16",
            "attn_dq_tc16",
            "attn_fwd_tc32",
            "attn_dkdv_tc32",
            "attn_dq_tc32",
            "attn_fwd_tc64",
            "attn_dkdv_tc64",
            "attn_dq_tc64",
            "attn_fwd_tc128",
            "attn_dkdv_tc128",
            "attn_dq_tc128",
            "attn_fwd_wg64",
            "attn_dkdv_wg64_1",
            "attn_dq_wg64_1",
            "attn_fwd_wg128",
            "attn_dkdv_wg128_1",
            "attn_dq_wg128_1",
        ],
    ),
];

/// Compile (or fetch from the cache) the training model's kernel families
/// ([`TRAIN_KERNELS`]: one module each) and load their kernels for head dim `d`.
pub(super) fn load_fns(gpu: &Gpu, d: usize) -> Result<Fns> {
    let modules = TRAIN_KERNELS
        .iter()
        .map(|&(family, _)| {
            let src = octet_cuda::kernel_source(family)?;
            Ok((
                family,
                gpu.ctx
                    .load_module(nvrtc::compile(family, src, gpu.arch)?)?,
            ))
        })
        .collect::<Result<HashMap<_, _>>>()?;
    let l = |n: &str| -> Result<CudaFunction> {
        let (family, _) = TRAIN_KERNELS
            .iter()
            .find(|(_, names)| names.contains(&n))
            .ok_or_else(|| {
                Error::Toolkit(format!("kernel {n} is in no family of TRAIN_KERNELS"))
            })?;
        Ok(modules[family].load_function(n)?)
    };
    let f = Fns {
        embed_fwd: l("embed_fwd")?,
        embed_bwd: l("embed_bwd")?,
        norm_fwd: l("rmsnorm_fwd")?,
        norm_fwd_v4: l("rmsnorm_fwd_v4")?,
        norm_bwd: l("rmsnorm_bwd")?,
        norm_bwd_v4: l("rmsnorm_bwd_v4")?,
        norm_bwd_b16: l("rmsnorm_bwd_b16")?,
        norm_bwd_b16_v4: l("rmsnorm_bwd_b16_v4")?,
        sum_partials: l("sum_partials")?,
        head_norm_fwd: l("head_norm_fwd")?,
        head_norm_bwd: l("head_norm_bwd")?,
        bias_add: l("bias_add")?,
        rope_fwd: l(if (d / 2).is_multiple_of(4) {
            "rope_fwd_v4"
        } else {
            "rope_fwd"
        })?,
        rope_bwd: l(if (d / 2).is_multiple_of(4) {
            "rope_bwd_v4"
        } else {
            "rope_bwd"
        })?,
        swiglu_fwd: l("swiglu_fwd")?,
        swiglu_bwd: l("swiglu_bwd")?,
        swiglu_fwd_q: [l("swiglu_fwd_q")?, l("swiglu_fwd_q_v8")?],
        swiglu_bwd_q: [l("swiglu_bwd_q")?, l("swiglu_bwd_q_v8")?],
        add: l("add_inplace")?,
        add_many: l("add_many")?,
        add_bf16: l("add_bf16_inplace")?,
        to_bf16: l("to_bf16")?,
        xent: l("cross_entropy")?,
        sumsq: l("sumsq_partial")?,
        adamw: l("adamw")?,
        adamw_many: l("adamw_many")?,
        attn_delta: l("attn_delta")?,
        attn: if ATTN_TC_DIMS.contains(&d) {
            // 4 warps, 64 rows a block; bf16 tiles of pitch D + 8 (p bytes a
            // row). Forward: two stages of K, V (64 rows each; Q passes through
            // them into registers). dK/dV: K, V (64 rows each) + two stages of
            // Q, dO (32) and of lse, delta (32 f32 each). dQ: Q, dO (64) + two
            // stages of K, V (32).
            let p = 2 * (d + 8);
            let k = |name: String, smem: usize| -> Result<AttnKernel> {
                Ok(AttnKernel {
                    f: l(&name)?,
                    threads: 128,
                    rows: 64,
                    smem,
                })
            };
            // On sm_90a, for D in {64, 128}, the wgmma kernels: 64 rows a
            // warpgroup; 64-row tiles of 128 D bytes, plus 1 KiB to align the
            // swizzled tiles. Forward (two warpgroups): Q (two tiles) + two
            // stages of K, V. dK/dV (one warpgroup): K, V + two stages of Q,
            // dO and of lse, delta (64 f32 each). dQ (one warpgroup): Q, dO +
            // two stages of K, V. `OCTET_ATTN=mma` keeps the mma.sync kernels
            // (the ones other GPUs run).
            let wgmma = gpu.arch == "sm_90a"
                && ATTN_WG_DIMS.contains(&d)
                && !octet_cuda::env_switch("OCTET_ATTN", "mma")?;
            let tile = 64 * d * 2;
            let wg = |name: String, nwg: usize, smem: usize| -> Result<AttnKernel> {
                Ok(AttnKernel {
                    f: l(&name)?,
                    threads: 128 * nwg as u32,
                    rows: 64 * nwg,
                    smem: smem + 1024,
                })
            };
            // The backward blocks are one warpgroup (see ATTN_WG_BWD in attention.cu).
            if wgmma {
                Attn {
                    fwd: wg(format!("attn_fwd_wg{d}"), 2, 6 * tile + 64)?,
                    dkdv: wg(format!("attn_dkdv_wg{d}_1"), 1, 6 * tile + 1024 + 64)?,
                    dq: wg(format!("attn_dq_wg{d}_1"), 1, 6 * tile + 64)?,
                    tensor_cores: true,
                    tma: true,
                }
            } else {
                Attn {
                    fwd: k(format!("attn_fwd_tc{d}"), 256 * p)?,
                    dkdv: k(format!("attn_dkdv_tc{d}"), 256 * p + 512)?,
                    dq: k(format!("attn_dq_tc{d}"), 256 * p)?,
                    tensor_cores: true,
                    tma: false,
                }
            }
        } else {
            let (s0, s1, s2) = attn_smem(d);
            let k = |name: &str, smem: usize| -> Result<AttnKernel> {
                Ok(AttnKernel {
                    f: l(name)?,
                    threads: 256,
                    rows: TILE,
                    smem,
                })
            };
            Attn {
                fwd: k("attn_fwd", s0)?,
                dkdv: k("attn_bwd_dkdv", s1)?,
                dq: k("attn_bwd_dq", s2)?,
                tensor_cores: false,
                tma: false,
            }
        },
    };
    use cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as MAXSMEM;
    for a in [&f.attn.fwd, &f.attn.dkdv, &f.attn.dq] {
        a.f.set_attribute(MAXSMEM, a.smem as i32)?;
    }
    Ok(f)
}
