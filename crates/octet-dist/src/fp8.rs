//! FP8 all-gather of a sharded weight: each rank quantizes its shard with the
//! one scale that the whole weight would get, and the ranks gather FP8 codes
//! plus scales instead of bf16.
//!
//! The result is byte-identical to [`octet_fp8::quantize`] of the whole
//! weight on one rank (codes, scales, block dims, amax and the
//! saturated/underflowed counts): every block's scale comes from the same
//! amax, and every element is cast alone with the same multiplier.
//!
//! Row-wise copy `(R, K)`, for the forward: each rank's shard `(S, K)` is
//! quantized with `tensor_amax = all_reduce_max(local amax)`, so per-tensor
//! scaling (current or delayed) uses the global scale; per-row, 1xN and MX
//! scaling only read complete rows; 128x128 (and NVFP4 16x16) tiles need
//! shards that are whole tiles tall, which [`fp8_row_alignment`] asks the
//! [`ShardLayout`] for (a misaligned layout is an error). Padding rows are
//! zeros: they change no amax and encode to code 0; the assembled copy drops them.
//!
//! Column-wise copy `(K, R)`, for the quantized backward's `grad_input`,
//! by [`ColwisePlan`]:
//!
//! | weight scaling | plan | extra traffic |
//! |---|---|---|
//! | per tensor (current, delayed), square tiles (128x128, 16x16) | [`ColwisePlan::TransposeLocal`]: transpose the gathered codes (and the tile grid of scales) | none |
//! | per row (`rowwise`: the column-wise scales are per *column* of `W`) | [`ColwisePlan::ColumnAmax`]: all-reduce the per-column amax (`K` floats), quantize each shard column with its global amax, gather the codes | `K` f32 + the codes again |
//! | 1xN tiles (MX 1x32) | [`ColwisePlan::GatherShards`]: quantize the shard column-wise (tiles do not straddle: shards are N-row aligned), gather codes and scales | the codes and scales again |
//!
//! A transpose is exact only under round-to-nearest-even (stochastic
//! rounding depends on the element index): other roundings are refused.

use crate::comm::{Communicator, ReduceOp};
use crate::shard::ShardLayout;
use crate::{Error, Result};
use octet_fp8::convert::{fp4_bytes, fp4_code};
use octet_fp8::quant::transpose;
use octet_fp8::{
    Format, Granularity, QuantData, QuantSpec, QuantizedTensor, Rounding, Scales, Usage,
};
use octet_tensor::{cpu, Tensor};

/// How the column-wise copy of a gathered weight is made (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColwisePlan {
    /// No column-wise copy was asked for.
    None,
    /// Transpose the gathered row-wise codes locally (per-tensor scaling, square tiles).
    TransposeLocal,
    /// All-reduce per-column amaxes, quantize shard columns, gather the codes (per-row scaling).
    ColumnAmax,
    /// Quantize shards column-wise and gather codes and scales (1xN tiles).
    GatherShards,
}

impl ColwisePlan {
    /// The plan for a column-wise copy quantized with `col` (in the copy's own coordinates).
    pub fn for_spec(col: &QuantSpec, usage: Usage) -> Result<ColwisePlan> {
        if !usage.colwise {
            return Ok(ColwisePlan::None);
        }
        Ok(match col.granularity {
            Granularity::Tensor => ColwisePlan::TransposeLocal,
            Granularity::Tile { rows, cols } if rows == cols => ColwisePlan::TransposeLocal,
            Granularity::Row => ColwisePlan::ColumnAmax,
            Granularity::Tile { rows: 1, .. } => ColwisePlan::GatherShards,
            g => {
                return Err(Error::Unsupported(format!(
                    "FP8 all-gather of a column-wise copy with {g:?} scaling (tensor, row, square or 1xN tiles only)"
                )))
            }
        })
    }
}

/// Rows a weight's shard must be a multiple of so that no scale block straddles
/// two ranks: the row-wise tile height, and for a column-wise copy gathered as
/// shards ([`ColwisePlan::GatherShards`]) its tile width. 1 for per-tensor and
/// per-row scaling.
pub fn fp8_row_alignment(row: &QuantSpec, col: &QuantSpec, usage: Usage) -> Result<usize> {
    let mut a = match row.granularity {
        Granularity::Tile { rows, .. } => rows.max(1),
        _ => 1,
    };
    match ColwisePlan::for_spec(col, usage)? {
        ColwisePlan::GatherShards | ColwisePlan::TransposeLocal => {
            if let Granularity::Tile { cols, .. } = col.granularity {
                a = lcm(a, cols.max(1));
            }
        }
        _ => {}
    }
    Ok(a)
}

fn lcm(a: usize, b: usize) -> usize {
    fn gcd(a: usize, b: usize) -> usize {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    a / gcd(a, b) * b
}

/// All-gather a 2-D weight `(R, K)` sharded by `layout` as FP8: every rank
/// passes its padded shard `(S, K)` (f32 or bf16) and receives the whole
/// quantized weight with the copies `usage` asks for, exactly as
/// `octet_fp8::quantize(whole, row, col, usage, None)` would make it.
///
/// Traffic: one all-reduce of one f32 (the amax), one all-gather of each
/// rank's codes, scales and two u64 telemetry counts, plus what the
/// column-wise plan adds ([`ColwisePlan`]).
///
/// Errors: a layout that is not 2-D or not aligned to the recipe's tiles, a
/// shard of the wrong shape, a non-finite element (on that rank; the others
/// then fail with [`Error::PeerFailed`]), a column-wise scaling that cannot be gathered.
pub fn gather_fp8_weight<C: Communicator>(
    comm: &C,
    layout: &ShardLayout,
    shard: &Tensor,
    row: &QuantSpec,
    col: &QuantSpec,
    usage: Usage,
) -> Result<QuantizedTensor> {
    if layout.shape.len() != 2 {
        return Err(Error::Shape(format!(
            "FP8 all-gather needs a 2-D weight, got {:?}",
            layout.shape
        )));
    }
    if layout.world != comm.world_size() {
        return Err(Error::Config(format!(
            "layout for {} ranks used on a group of {}",
            layout.world,
            comm.world_size()
        )));
    }
    let (r_all, k) = (layout.rows, layout.row_len);
    let s = layout.shard_rows;
    if shard.shape() != [s, k] {
        return Err(Error::Shape(format!(
            "rank {} passed a shard of shape {:?}, the layout wants ({s}, {k}) (padded)",
            comm.rank(),
            shard.shape()
        )));
    }
    if !usage.rowwise && !usage.colwise {
        return Err(Error::Shape(
            "FP8 all-gather: usage asks for no copy".into(),
        ));
    }
    let align = fp8_row_alignment(row, col, usage)?;
    if !s.is_multiple_of(align) {
        return Err(Error::Unsupported(format!(
            "shards of {s} rows straddle this recipe's {align}-row scale blocks; build the layout with \
             ShardLayout::new(shape, n, fp8_row_alignment(..)) = {align}"
        )));
    }
    let plan = ColwisePlan::for_spec(col, usage)?;
    if plan == ColwisePlan::TransposeLocal && col.rounding != Rounding::NearestEven {
        return Err(Error::Unsupported(
            "a column-wise copy built by transposing needs round-to-nearest-even".into(),
        ));
    }
    let x = shard.to_f32_vec(); // exact for f32 and bf16
    let mut amax = [octet_fp8::quant::amax(&x)?];
    comm.all_reduce(&mut amax, ReduceOp::Max)?;
    let amax = amax[0];
    // The shard's own copies: row-wise always (the transpose plan reads it), column-wise for GatherShards.
    let local_usage = Usage {
        rowwise: true,
        colwise: plan == ColwisePlan::GatherShards,
    };
    let q = cpu::quantize(shard, row, col, local_usage, Some(amax))?;
    let mut payload = Vec::new();
    let q_row = q.get(octet_fp8::Layout::Rowwise)?;
    encode_piece(q_row, &mut payload);
    if let Some(qc) = &q.colwise {
        encode_piece(qc, &mut payload);
    }
    let mut col_scales = Vec::new();
    if plan == ColwisePlan::ColumnAmax {
        let (codes, scales) = column_amax_pieces(comm, &x, s, k, col)?;
        encode_piece(&codes, &mut payload);
        col_scales = scales;
    }
    let gathered = comm.all_gather(&payload)?;
    let n = comm.world_size();
    let per_rank = payload.len();
    let mut rows_pieces = Vec::with_capacity(n);
    let mut col_pieces = Vec::with_capacity(n);
    for chunk in gathered.chunks_exact(per_rank.max(1)).take(n) {
        let mut at = 0;
        rows_pieces.push(decode_piece(chunk, &mut at, s, k, row)?);
        match plan {
            ColwisePlan::GatherShards => col_pieces.push(decode_piece(chunk, &mut at, k, s, col)?),
            ColwisePlan::ColumnAmax => {
                let mut p = decode_codes_piece(chunk, &mut at, k, s, col.format)?;
                p.scales = Scales::F32(col_scales.clone());
                col_pieces.push(p);
            }
            _ => {}
        }
    }
    let rowwise = concat_rows(rows_pieces, r_all, k, row)?;
    let colwise = match plan {
        ColwisePlan::None => None,
        ColwisePlan::TransposeLocal => Some(transpose_copy(&rowwise, col)?),
        ColwisePlan::ColumnAmax | ColwisePlan::GatherShards => {
            Some(concat_cols(col_pieces, k, r_all, col)?)
        }
    };
    Ok(QuantizedTensor {
        rows: r_all,
        cols: k,
        amax,
        rowwise: usage.rowwise.then_some(rowwise),
        colwise,
    })
}

/// Per-row scaling's column-wise copy: column `c` of `W` is one row of the
/// copy, scaled by its amax over all ranks. Returns this shard's codes
/// `(K, S)` (scales left empty) and the `K` column scales (the same on every rank).
fn column_amax_pieces<C: Communicator>(
    comm: &C,
    x: &[f32],
    s: usize,
    k: usize,
    col: &QuantSpec,
) -> Result<(QuantData, Vec<f32>)> {
    let mut camax = vec![0f32; k];
    for row in x.chunks_exact(k) {
        for (m, v) in camax.iter_mut().zip(row) {
            *m = m.max(v.abs());
        }
    }
    comm.all_reduce(&mut camax, ReduceOp::Max)?;
    let xt = transpose(x, s, k); // (K, S)
                                 // One column at a time as a per-tensor block whose amax is the global column amax.
    let spec = QuantSpec {
        granularity: Granularity::Tensor,
        ..*col
    };
    let mut data = Vec::with_capacity(k * s);
    let mut scales = Vec::with_capacity(k);
    let (mut sat, mut under) = (0, 0);
    for (c, &a) in camax.iter().enumerate() {
        let q = octet_fp8::quantize(
            &xt[c * s..(c + 1) * s],
            1,
            s,
            &spec,
            &spec,
            Usage::ROW,
            Some(a),
        )?;
        let q = q.get(octet_fp8::Layout::Rowwise)?;
        data.extend_from_slice(&q.data);
        match &q.scales {
            Scales::F32(v) if v.len() == 1 => scales.push(v[0]),
            other => {
                return Err(Error::Unsupported(format!(
                    "per-row scaling with scales {other:?}"
                )))
            }
        }
        sat += q.saturated;
        under += q.underflowed;
    }
    let codes = QuantData {
        rows: k,
        cols: s,
        format: col.format,
        data,
        block: (1, s),
        scales: Scales::F32(Vec::new()),
        saturated: sat,
        underflowed: under,
    };
    Ok((codes, scales))
}

fn push_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn take<'a>(b: &'a [u8], at: &mut usize, len: usize) -> Result<&'a [u8]> {
    let s = b.get(*at..*at + len).ok_or_else(|| {
        Error::Mismatch(format!(
            "FP8 all-gather payload too short: {} bytes, needed {}",
            b.len(),
            *at + len
        ))
    })?;
    *at += len;
    Ok(s)
}

fn take_u64(b: &[u8], at: &mut usize) -> Result<u64> {
    let s = take(b, at, 8)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Ok(u64::from_le_bytes(a))
}

fn take_f32s(b: &[u8], at: &mut usize, n: usize) -> Result<Vec<f32>> {
    Ok(take(b, at, 4 * n)?
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Wire form of one copy: saturated, underflowed (u64), codes, scales
/// (f32 little-endian, or scale codes; NVFP4 adds its f32 global scale).
fn encode_piece(q: &QuantData, out: &mut Vec<u8>) {
    push_u64(out, q.saturated as u64);
    push_u64(out, q.underflowed as u64);
    out.extend_from_slice(&q.data);
    match &q.scales {
        Scales::F32(v) => v
            .iter()
            .for_each(|f| out.extend_from_slice(&f.to_le_bytes())),
        Scales::E8M0(c) => out.extend_from_slice(c),
        Scales::Nvfp4 { codes, global } => {
            out.extend_from_slice(codes);
            out.extend_from_slice(&global.to_le_bytes());
        }
    }
}

fn row_stride(format: Format, cols: usize) -> usize {
    if format == Format::E2M1 {
        fp4_bytes(cols)
    } else {
        cols
    }
}

/// Read back a `(rows, cols)` copy quantized with `spec`.
fn decode_piece(
    b: &[u8],
    at: &mut usize,
    rows: usize,
    cols: usize,
    spec: &QuantSpec,
) -> Result<QuantData> {
    let mut q = decode_codes_piece(b, at, rows, cols, spec.format)?;
    q.block = spec.granularity.block_dims(rows, cols);
    let nblocks = rows.div_ceil(q.block.0) * cols.div_ceil(q.block.1);
    q.scales = match spec.rule {
        octet_fp8::ScaleRule::Amax { .. } | octet_fp8::ScaleRule::Fixed(_) => {
            Scales::F32(take_f32s(b, at, nblocks)?)
        }
        octet_fp8::ScaleRule::E8M0 => Scales::E8M0(take(b, at, nblocks)?.to_vec()),
        octet_fp8::ScaleRule::Nvfp4 => {
            let codes = take(b, at, nblocks)?.to_vec();
            let global = take_f32s(b, at, 1)?[0];
            Scales::Nvfp4 { codes, global }
        }
    };
    Ok(q)
}

/// Counts and codes of a `(rows, cols)` copy, scales left empty.
fn decode_codes_piece(
    b: &[u8],
    at: &mut usize,
    rows: usize,
    cols: usize,
    format: Format,
) -> Result<QuantData> {
    let saturated = take_u64(b, at)? as usize;
    let underflowed = take_u64(b, at)? as usize;
    let data = take(b, at, rows * row_stride(format, cols))?.to_vec();
    Ok(QuantData {
        rows,
        cols,
        format,
        data,
        block: (1, cols),
        scales: Scales::F32(Vec::new()),
        saturated,
        underflowed,
    })
}

/// Scales that must be the same on every rank (per-tensor) compared bitwise.
fn same_everywhere(v: &[f32], what: &str) -> Result<f32> {
    let first = v.first().copied().unwrap_or(1.0);
    if v.iter().any(|x| x.to_bits() != first.to_bits()) {
        return Err(Error::Mismatch(format!(
            "ranks quantized with different {what}: {v:?} (the amax was not reduced)"
        )));
    }
    Ok(first)
}

/// Stack the ranks' `(S, K)` row-wise pieces into the `(R, K)` copy (dropping padding rows).
fn concat_rows(
    pieces: Vec<QuantData>,
    rows: usize,
    cols: usize,
    spec: &QuantSpec,
) -> Result<QuantData> {
    let format = spec.format;
    let stride = row_stride(format, cols);
    let block = spec.granularity.block_dims(rows, cols);
    let per_tensor = spec.granularity == Granularity::Tensor;
    let grid_rows = rows.div_ceil(block.0);
    let grid_cols = cols.div_ceil(block.1);
    let (mut data, mut sat, mut under) = (Vec::new(), 0, 0);
    let (mut f32s, mut codes, mut globals) = (Vec::new(), Vec::new(), Vec::new());
    for p in pieces {
        data.extend_from_slice(&p.data);
        sat += p.saturated;
        under += p.underflowed;
        match p.scales {
            Scales::F32(v) => f32s.extend(v),
            Scales::E8M0(c) => codes.extend(c),
            Scales::Nvfp4 { codes: c, global } => {
                codes.extend(c);
                globals.push(global);
            }
        }
    }
    data.truncate(rows * stride);
    let nblocks = grid_rows * grid_cols;
    let scales = match spec.rule {
        octet_fp8::ScaleRule::Amax { .. } | octet_fp8::ScaleRule::Fixed(_) if per_tensor => {
            Scales::F32(vec![same_everywhere(&f32s, "per-tensor scales")?])
        }
        octet_fp8::ScaleRule::Amax { .. } | octet_fp8::ScaleRule::Fixed(_) => {
            f32s.truncate(nblocks);
            Scales::F32(f32s)
        }
        octet_fp8::ScaleRule::E8M0 => {
            codes.truncate(nblocks);
            Scales::E8M0(codes)
        }
        octet_fp8::ScaleRule::Nvfp4 => {
            codes.truncate(nblocks);
            Scales::Nvfp4 {
                codes,
                global: same_everywhere(&globals, "NVFP4 global scales")?,
            }
        }
    };
    Ok(QuantData {
        rows,
        cols,
        format,
        data,
        block,
        scales,
        saturated: sat,
        underflowed: under,
    })
}

/// Join the ranks' `(K, S)` column-wise pieces side by side into the `(K, R)` copy.
fn concat_cols(
    pieces: Vec<QuantData>,
    rows: usize,
    cols: usize,
    spec: &QuantSpec,
) -> Result<QuantData> {
    let format = spec.format;
    let block = spec.granularity.block_dims(rows, cols);
    let (sat, under) = pieces
        .iter()
        .fold((0, 0), |(s, u), p| (s + p.saturated, u + p.underflowed));
    let mut data = Vec::with_capacity(rows * row_stride(format, cols));
    let mut codes_out: Vec<u8> = Vec::new();
    // Element codes row by row, then repacked (FP4 pieces are whole bytes: S is a multiple of the even tile width).
    for i in 0..rows {
        let mut row: Vec<u8> = Vec::with_capacity(cols);
        for p in &pieces {
            row.extend((0..p.cols).map(|c| p.code(i, c)));
        }
        row.truncate(cols);
        pack_row(&row, format, &mut data);
    }
    let gc = cols.div_ceil(block.1);
    let scales = match (&spec.granularity, pieces.first().map(|p| &p.scales)) {
        // Per-row scales of the copy (per column of W): computed identically on every rank.
        (Granularity::Row, Some(Scales::F32(v))) => Scales::F32(v.clone()),
        _ => {
            let mut f32s = Vec::new();
            let mut globals = Vec::new();
            for i in 0..rows.div_ceil(block.0) {
                let (mut rf, mut rc) = (Vec::new(), Vec::new());
                for p in &pieces {
                    let pg = p.cols.div_ceil(p.block.1);
                    match &p.scales {
                        Scales::F32(v) => rf.extend_from_slice(&v[i * pg..(i + 1) * pg]),
                        Scales::E8M0(c) => rc.extend_from_slice(&c[i * pg..(i + 1) * pg]),
                        Scales::Nvfp4 { codes, global } => {
                            rc.extend_from_slice(&codes[i * pg..(i + 1) * pg]);
                            globals.push(*global);
                        }
                    }
                }
                rf.truncate(gc);
                rc.truncate(gc);
                f32s.extend(rf);
                codes_out.extend(rc);
            }
            match spec.rule {
                octet_fp8::ScaleRule::E8M0 => Scales::E8M0(codes_out),
                octet_fp8::ScaleRule::Nvfp4 => Scales::Nvfp4 {
                    codes: codes_out,
                    global: same_everywhere(&globals, "NVFP4 global scales")?,
                },
                _ => Scales::F32(f32s),
            }
        }
    };
    Ok(QuantData {
        rows,
        cols,
        format,
        data,
        block,
        scales,
        saturated: sat,
        underflowed: under,
    })
}

/// Append one row of element codes in `format`'s packing (FP4: two per byte, low nibble first).
fn pack_row(codes: &[u8], format: Format, out: &mut Vec<u8>) {
    if format == Format::E2M1 {
        for pair in codes.chunks(2) {
            out.push(pair[0] | (pair.get(1).copied().unwrap_or(0) << 4));
        }
    } else {
        out.extend_from_slice(codes);
    }
}

/// The column-wise copy of `q` by transposition: exact for per-tensor scales
/// and square tiles (same blocks, same multipliers, elementwise RNE casts).
fn transpose_copy(q: &QuantData, col: &QuantSpec) -> Result<QuantData> {
    let (rows, cols) = (q.rows, q.cols);
    let data = if q.format == Format::E2M1 {
        let mut t = Vec::with_capacity(cols * fp4_bytes(rows));
        let stride = fp4_bytes(cols);
        for c in 0..cols {
            let codes: Vec<u8> = (0..rows)
                .map(|r| fp4_code(&q.data[r * stride..], c))
                .collect();
            pack_row(&codes, q.format, &mut t);
        }
        t
    } else {
        transpose(&q.data, rows, cols)
    };
    let block = col.granularity.block_dims(cols, rows);
    let (gr, gc) = q.grid();
    let scales = match &q.scales {
        Scales::F32(v) if v.len() == 1 => Scales::F32(v.clone()),
        Scales::F32(v) => Scales::F32(transpose(v, gr, gc)),
        Scales::E8M0(c) => Scales::E8M0(transpose(c, gr, gc)),
        Scales::Nvfp4 { codes, global } => Scales::Nvfp4 {
            codes: transpose(codes, gr, gc),
            global: *global,
        },
    };
    Ok(QuantData {
        rows: cols,
        cols: rows,
        format: q.format,
        data,
        block,
        scales,
        saturated: q.saturated,
        underflowed: q.underflowed,
    })
}

#[cfg(test)]
mod tests;
