//! The launch shapes of the small-M weight-only kernels: rows of weights a
//! block, blocks an SM and shared memory per shape, and which 16-token shapes a
//! device takes (by its DRAM bandwidth an SM).

/// Shared memory limits of the device, in bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SmemLimits {
    /// One SM's shared memory.
    pub per_sm: u32,
    /// The most one block may ask for (opt-in).
    pub per_block: u32,
    /// What the system reserves a block.
    pub reserved: u32,
}

/// The dynamic shared memory of a small-M launch of `blocks` blocks that
/// each need `need` bytes, on `sms` SMs.
///
/// The block scheduler does not spread a launch of few blocks evenly: with
/// room for four blocks an SM, a launch of 256 blocks (4096x4096) on the
/// H100's 132 SMs ran at 0.74 of copy bandwidth for 1-4 tokens, and the same
/// kernel with room for two blocks an SM at 0.81-0.83 for 5-8 tokens. So where
/// `ceil(blocks / sms)` blocks an SM would do, each block asks for enough
/// shared memory that no SM can take more.
pub(crate) fn small_smem(need: u32, blocks: u32, sms: u32, lim: SmemLimits) -> u32 {
    let per_sm = blocks.div_ceil(sms.max(1)).max(1);
    // 128 bytes under the share, for the allocation granularity.
    let cap = (lim.per_sm / per_sm)
        .saturating_sub(lim.reserved + 128)
        .min(lim.per_block);
    need.max(cap)
}

/// A launch shape of the small-M kernel (`mixed_small_m` in `kernels/mixed.cu`).
pub(super) struct SmallCfg {
    /// Up to this many tokens a block (the kernel's name: `n4`, `n8`, `n16`).
    pub(super) tokens: u32,
    /// Warps a block, splitting K.
    pub(super) warps: u32,
    /// Slots of each warp's cp.async ring.
    pub(super) stages: u32,
    /// Tiles of 16 weight rows a block (1, 2 or 4): every warp multiplies each
    /// x tile it copies with this many tiles of codes, so x's traffic
    /// through L2 per weight byte falls by this factor.
    pub(super) row_tiles: u32,
    /// Stepped copies over tiled codes at two token groups too (`ST` in
    /// `mixed.cu`; one group always steps): fixed per-lane offsets instead of
    /// each piece's address worked out again in every block. Fixed in the
    /// kernel's instantiation; the tests check the two agree.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(super) stepped: bool,
}

impl SmallCfg {
    /// Tokens a block: the kernel's groups of 8 (one or two).
    pub(super) const fn group(&self) -> u32 {
        self.tokens.div_ceil(8) * 8
    }

    /// Weight rows a block.
    pub(super) const fn rows(&self) -> u32 {
        16 * self.row_tiles
    }

    /// Dynamic shared memory with `xrows` token rows a slot: `rows()` x 128
    /// codes and `xrows` x 128 bf16 of x, a slot per stage per warp.
    pub(super) const fn smem(&self, xrows: u32) -> u32 {
        self.warps * self.stages * (self.rows() * 128 + xrows * 256)
    }
}

/// The small-M shapes, by the launch's largest token group, measured on the
/// H100: up to 4 tokens, a third stage keeps three blocks an SM (72 KiB) and
/// was faster on every weight; at 5 to 8 tokens it would cost a block an SM.
/// At 9 to 16 tokens 4 warps and 3 stages read 0.71-0.74 / 0.80-0.86 /
/// 0.91-0.94 of copy on the three weights of `bench mixed`, against
/// 0.63-0.71 / 0.73-0.81 / 0.87-0.93 with 2 stages.
pub(super) const SMALL_CFG: [SmallCfg; 3] = [
    SmallCfg {
        tokens: 4,
        warps: 8,
        stages: 3,
        row_tiles: 1,
        stepped: false,
    },
    SmallCfg {
        tokens: 8,
        warps: 8,
        stages: 2,
        row_tiles: 1,
        stepped: false,
    },
    SmallCfg {
        tokens: 16,
        warps: 4,
        stages: 3,
        row_tiles: 1,
        stepped: false,
    },
];

/// The 16-token shape for f16 x when the launch has at most two blocks an
/// SM (4096 weight rows on the H100): 6 warps x 3 stages. With one
/// conversion a pair of codes the warps are lighter, and a launch of few
/// blocks reads more with more of them: on the H100, 4096x4096 at 12-16
/// tokens 0.82-0.83 -> 0.85-0.86 of copy; bf16 x gained nothing from it.
/// Where the GPU takes `SMALL_FEW` (`Shapes16`), that goes first.
pub(super) const SMALL_F16_FEW: SmallCfg = SmallCfg {
    tokens: 16,
    warps: 6,
    stages: 3,
    row_tiles: 1,
    stepped: false,
};

/// The 16-token shapes with more weight rows a block: 64 rows (4 warps x 2
/// slots) and 32 (4 x 3), for launches that still have a block for every SM
/// with them (`wide_shape`). At 16 tokens a block of 16 rows reads 2 bytes of
/// x through L2 for every byte of codes; with 32 rows 1, with 64 rows 0.5.
/// On the H200 (bf16 x, tiled codes, 12-16 tokens), 32 rows lifted
/// 4096x14336 from 0.67-0.69 to 0.72-0.73 of copy and 8192x28672 from
/// 0.74-0.77 to 0.87-0.88; 64 rows lifted 4096x14336 to 0.78-0.80. Only on
/// GPUs with the H200's DRAM bandwidth an SM (`Shapes16`).
pub(super) const SMALL_WIDE: [SmallCfg; 2] = [
    SmallCfg {
        tokens: 16,
        warps: 4,
        stages: 2,
        row_tiles: 4,
        stepped: false,
    },
    SmallCfg {
        tokens: 16,
        warps: 4,
        stages: 3,
        row_tiles: 2,
        stepped: false,
    },
];

/// The 16-token shape for a launch whose 32-row blocks fill more than half
/// of the SMs but not all of them (`few_shape`): 8 warps x 2 stages x 32
/// rows, 128 KiB, one block an SM, stepped copies. The table's 16-row blocks
/// come two to an SM there, 4 warps each; one block of 8 warps reads x once
/// for 32 rows. On the H200, 4096x4096 at 12-16 tokens (128 blocks on 132
/// SMs): 0.58-0.59 -> 0.67-0.70 of copy with bf16 x, 0.60-0.62 -> 0.69-0.71
/// with f16 x. On the H100 it read 0.80 against the table's 0.81-0.82 (bf16
/// x), so it goes with the wide shapes only (`Shapes16`).
pub(super) const SMALL_FEW: SmallCfg = SmallCfg {
    tokens: 16,
    warps: 8,
    stages: 2,
    row_tiles: 2,
    stepped: true,
};

/// Whether a 16-token launch of `groups` token groups over `n` weight rows
/// takes `SMALL_FEW`: its blocks (`groups x ceil(n / 32)`) more than half of
/// the `sms` SMs and fewer than all.
pub(super) fn few_shape(groups: u32, n: u32, sms: u32) -> bool {
    let blocks = groups * n.div_ceil(SMALL_FEW.rows());
    2 * blocks > sms && blocks < sms
}

/// Which of `SMALL_WIDE` a small-M launch of `groups` token groups over `n`
/// weight rows takes: the one with the most rows whose blocks (`groups x
/// ceil(n / rows)`) still give every one of the `sms` SMs one, if any.
pub(super) fn wide_shape(groups: u32, n: u32, sms: u32) -> Option<usize> {
    SMALL_WIDE
        .iter()
        .position(|c| groups * n.div_ceil(c.rows()) >= sms)
}

/// Whether two `SMALL_F16_FEW` blocks (108 KiB each at 16 tokens) fit one
/// SM, which its rule assumes: on the H100 and H200 (228 KiB an SM), not on
/// sm_80/87 (164 KiB) nor sm_86/89/120 (100 KiB, less than one block may
/// take), which keep the table's shape.
pub(super) fn few_fits(lim: SmemLimits) -> bool {
    let need = SMALL_F16_FEW.smem(SMALL_F16_FEW.tokens);
    need <= lim.per_block && 2 * (need + lim.reserved) <= lim.per_sm
}

/// Peak DRAM bandwidth an SM, in GB/s, from which 16-token launches take the
/// shapes that read x once for more weight rows (`SMALL_WIDE`, `SMALL_FEW`).
///
/// At 16 tokens the table's 16-row blocks read 2 bytes of x through L2 for
/// every byte of codes, so an SM keeping up with DRAM pulls three times its
/// share of DRAM bandwidth out of L2. On the H200 (4.8 TB/s peak, 36 GB/s an
/// SM) cutting that traffic lifted 9-16 tokens by 0.09-0.13 of copy; on the
/// H100 (3.35 TB/s, 25 GB/s an SM) every way of cutting it measured level or
/// lower. The threshold lies between the two GPUs measured.
pub(crate) const WIDE_DRAM_GBPS_PER_SM: f64 = 31.0;

/// Whether a device's 16-token launches take the shapes that read x once
/// for more weight rows: the wide ones (`SMALL_WIDE`, where their blocks fill
/// every SM) and the few-block one (`SMALL_FEW`, where 32-row blocks fill
/// more than half of the SMs but not all).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shapes16 {
    /// `SMALL_WIDE`: where peak DRAM bandwidth reaches
    /// `WIDE_DRAM_GBPS_PER_SM` an SM.
    pub wide: bool,
    /// `SMALL_FEW`: with `wide`, where the device's shared memory holds its
    /// block.
    pub few: bool,
}

/// The 16-token shapes of a device with peak DRAM bandwidth `dram_gbps`
/// (GB/s; `None` where the driver does not report it) over `sms` SMs: both
/// wide and few-block where it reaches [`WIDE_DRAM_GBPS_PER_SM`] an SM,
/// else the table's (`MixedKernels::shapes16` drops the few-block one where
/// its block does not fit).
pub(crate) fn shapes16(dram_gbps: Option<f64>, sms: i32) -> Shapes16 {
    let on = dram_gbps.is_some_and(|g| g >= WIDE_DRAM_GBPS_PER_SM * sms.max(1) as f64);
    Shapes16 { wide: on, few: on }
}
