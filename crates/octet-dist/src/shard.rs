//! Sharding a parameter on its first dimension.
//!
//! Layout: a tensor of shape `(R, rest...)` is seen as `R` rows of `W =
//! prod(rest)` elements (a vector `(R)` has rows of one element). With `n`
//! ranks and a row alignment `a`, every rank's shard has
//! `S = round_up(ceil(R / n), a)` rows and rank `r` owns rows
//! `[r * S, min((r + 1) * S, R))`. The last ranks may own fewer rows, or none;
//! their shards are padded inside with zero rows to `S`, so every collective
//! carries equal counts (as NCCL requires), and the padded full tensor has
//! `n * S >= R` rows, of which the first `R` are the tensor.
//!
//! The alignment exists for FP8 block scaling: a 128x128 weight tile must not
//! straddle two ranks, so such weights are sharded with `a = 128` (see
//! [`crate::fp8_row_alignment`]). Everything else uses `a = 1`.

use crate::{Error, Result};

/// Where the rows of one parameter live across ranks (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardLayout {
    /// Full shape of the parameter.
    pub shape: Vec<usize>,
    /// Rows `R` (the first dimension).
    pub rows: usize,
    /// Elements per row `W` (the product of the other dimensions; 1 for a vector).
    pub row_len: usize,
    /// Ranks `n`.
    pub world: usize,
    /// Rows per shard `S`, padding included.
    pub shard_rows: usize,
}

impl ShardLayout {
    /// The layout of a `shape` tensor over `world` ranks, shards a multiple of `align` rows.
    pub fn new(shape: &[usize], world: usize, align: usize) -> Result<ShardLayout> {
        if world == 0 || align == 0 {
            return Err(Error::Config(format!(
                "sharding needs at least one rank and an alignment of at least 1 (got {world} ranks, alignment {align})"
            )));
        }
        let (&rows, rest) = shape.split_first().ok_or_else(|| {
            Error::Shape("a scalar (shape []) cannot be sharded on its first dimension".into())
        })?;
        if rows == 0 {
            return Err(Error::Shape(format!(
                "cannot shard an empty tensor {shape:?}"
            )));
        }
        let shard_rows = rows.div_ceil(world).div_ceil(align) * align;
        Ok(ShardLayout {
            shape: shape.to_vec(),
            rows,
            row_len: rest.iter().product(),
            world,
            shard_rows,
        })
    }

    /// Rows `[start, end)` of the full tensor that `rank` owns (empty for a padding-only rank).
    pub fn owned_rows(&self, rank: usize) -> (usize, usize) {
        let start = (rank * self.shard_rows).min(self.rows);
        let end = ((rank + 1) * self.shard_rows).min(self.rows);
        (start, end)
    }

    /// Rows `rank` owns.
    pub fn owned_len(&self, rank: usize) -> usize {
        let (s, e) = self.owned_rows(rank);
        e - s
    }

    /// Shape of `rank`'s unpadded shard: `(owned rows, rest...)`.
    pub fn owned_shape(&self, rank: usize) -> Vec<usize> {
        let mut s = self.shape.clone();
        s[0] = self.owned_len(rank);
        s
    }

    /// Elements of one padded shard, `S * W`.
    pub fn shard_numel(&self) -> usize {
        self.shard_rows * self.row_len
    }

    /// Elements of the full tensor, `R * W`.
    pub fn numel(&self) -> usize {
        self.rows * self.row_len
    }

    fn check_rank(&self, rank: usize) -> Result<()> {
        if rank >= self.world {
            return Err(Error::Config(format!(
                "rank {rank} out of range for {} ranks",
                self.world
            )));
        }
        Ok(())
    }

    /// `rank`'s shard of the full row-major tensor `full`, padded with `pad` to `S` rows.
    pub fn shard<T: Copy>(&self, full: &[T], rank: usize, pad: T) -> Result<Vec<T>> {
        self.check_rank(rank)?;
        if full.len() != self.numel() {
            return Err(Error::Shape(format!(
                "sharding {} elements with a layout for shape {:?} ({} elements)",
                full.len(),
                self.shape,
                self.numel()
            )));
        }
        let (s, e) = self.owned_rows(rank);
        let mut out = Vec::with_capacity(self.shard_numel());
        out.extend_from_slice(&full[s * self.row_len..e * self.row_len]);
        out.resize(self.shard_numel(), pad);
        Ok(out)
    }

    /// `rank`'s unpadded shard (only the rows it owns).
    pub fn owned<'a, T>(&self, full: &'a [T], rank: usize) -> Result<&'a [T]> {
        self.check_rank(rank)?;
        if full.len() != self.numel() {
            return Err(Error::Shape(format!(
                "{} elements for shape {:?}",
                full.len(),
                self.shape
            )));
        }
        let (s, e) = self.owned_rows(rank);
        Ok(&full[s * self.row_len..e * self.row_len])
    }

    /// Pad `rank`'s unpadded shard `owned` with `pad` to `S` rows.
    pub fn pad<T: Copy>(&self, owned: &[T], rank: usize, pad: T) -> Result<Vec<T>> {
        self.check_rank(rank)?;
        let want = self.owned_len(rank) * self.row_len;
        if owned.len() != want {
            return Err(Error::Shape(format!(
                "rank {rank} holds {} elements of {:?}, its shard has {want}",
                owned.len(),
                self.shape
            )));
        }
        let mut out = Vec::with_capacity(self.shard_numel());
        out.extend_from_slice(owned);
        out.resize(self.shard_numel(), pad);
        Ok(out)
    }

    /// The full tensor from the `n` padded shards concatenated in rank order
    /// (what an all-gather returns): drops the padding.
    pub fn unshard<T: Copy>(&self, gathered: &[T]) -> Result<Vec<T>> {
        if gathered.len() != self.world * self.shard_numel() {
            return Err(Error::Shape(format!(
                "unshard: {} elements, expected {} ranks x {} for shape {:?}",
                gathered.len(),
                self.world,
                self.shard_numel(),
                self.shape
            )));
        }
        // Padding rows sit at the end of each shard; owned rows are contiguous in rank order.
        let mut out = Vec::with_capacity(self.numel());
        for r in 0..self.world {
            let base = r * self.shard_numel();
            out.extend_from_slice(&gathered[base..base + self.owned_len(r) * self.row_len]);
        }
        Ok(out)
    }

    /// The full tensor padded to `n * S` rows (the send buffer of a reduce-scatter).
    pub fn pad_full<T: Copy>(&self, full: &[T], pad: T) -> Result<Vec<T>> {
        let mut out = Vec::with_capacity(self.world * self.shard_numel());
        for r in 0..self.world {
            out.extend(self.shard(full, r, pad)?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uneven_rows_round_trip_with_padding_inside() {
        for (shape, n, align) in [
            (vec![10, 3], 4, 1),
            (vec![7], 3, 1),
            (vec![3, 2], 4, 1),
            (vec![300, 5], 3, 128),
            (vec![1, 1], 2, 1),
            (vec![5, 2, 3], 2, 1),
        ] {
            let l = ShardLayout::new(&shape, n, align).unwrap();
            let full: Vec<i32> = (0..l.numel() as i32).collect();
            let shards: Vec<Vec<i32>> = (0..n).map(|r| l.shard(&full, r, -1).unwrap()).collect();
            assert!(shards.iter().all(|s| s.len() == l.shard_numel()));
            assert_eq!(l.shard_rows % align, 0);
            let owned: usize = (0..n).map(|r| l.owned_len(r)).sum();
            assert_eq!(owned, l.rows, "{shape:?} over {n}");
            let gathered: Vec<i32> = shards.concat();
            assert_eq!(l.unshard(&gathered).unwrap(), full, "{shape:?} over {n}");
            assert_eq!(l.pad_full(&full, -1).unwrap(), gathered);
            for r in 0..n {
                let o = l.owned(&full, r).unwrap();
                assert_eq!(l.pad(o, r, -1).unwrap(), shards[r]);
                assert_eq!(l.owned_shape(r)[0] * l.row_len, o.len());
            }
        }
        // 10 rows over 4 ranks: 3, 3, 3, 1 (padded with two rows).
        let l = ShardLayout::new(&[10, 3], 4, 1).unwrap();
        assert_eq!(l.shard_rows, 3);
        assert_eq!(
            (0..4).map(|r| l.owned_len(r)).collect::<Vec<_>>(),
            [3, 3, 3, 1]
        );
        // 3 rows over 4 ranks: the last rank holds only padding.
        let l = ShardLayout::new(&[3, 2], 4, 1).unwrap();
        assert_eq!(l.owned_rows(3), (3, 3));
        // 300 rows, 3 ranks, 128-aligned: 128, 128, 44.
        let l = ShardLayout::new(&[300, 5], 3, 128).unwrap();
        assert_eq!(
            (0..3).map(|r| l.owned_len(r)).collect::<Vec<_>>(),
            [128, 128, 44]
        );
    }

    #[test]
    fn bad_layouts_and_sizes_are_errors() {
        assert!(ShardLayout::new(&[4, 4], 0, 1).is_err());
        assert!(ShardLayout::new(&[4, 4], 2, 0).is_err());
        assert!(ShardLayout::new(&[], 2, 1).is_err());
        assert!(ShardLayout::new(&[0, 3], 2, 1).is_err());
        let l = ShardLayout::new(&[4, 4], 2, 1).unwrap();
        assert!(l.shard(&[0f32; 15], 0, 0.0).is_err());
        assert!(l.shard(&[0f32; 16], 2, 0.0).is_err());
        assert!(l.unshard(&[0f32; 15]).is_err());
        assert!(l.pad(&[0f32; 4], 0, 0.0).is_err());
    }
}
