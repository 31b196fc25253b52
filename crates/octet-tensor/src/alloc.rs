//! Fallible allocation of the buffers whose sizes follow user input (batch,
//! sequence length, LoRA rank, model width): a request the allocator cannot
//! meet is an [`Error::Alloc`] naming the bytes and the buffer, not an abort.

use crate::{Error, Result};
use std::fmt::Display;

/// The error for `n` elements of `T` that could not be reserved.
fn alloc_error<T>(n: usize, what: impl Display) -> Error {
    Error::Alloc {
        bytes: n as u128 * std::mem::size_of::<T>() as u128,
        what: what.to_string(),
    }
}

/// An empty vector with room for exactly `n` elements, or [`Error::Alloc`]
/// (naming `what`) when the allocator cannot provide it.
pub fn alloc_capacity<T>(n: usize, what: impl Display) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| alloc_error::<T>(n, what))?;
    Ok(v)
}

/// `n` copies of `fill`, or [`Error::Alloc`] (naming `what`) when the
/// allocator cannot provide them.
pub fn alloc_vec<T: Clone>(n: usize, fill: T, what: impl Display) -> Result<Vec<T>> {
    let mut v = alloc_capacity(n, what)?;
    v.resize(n, fill);
    Ok(v)
}

/// The items of `iter` collected into one allocation of its exact length,
/// or [`Error::Alloc`] (naming `what`) when the allocator cannot provide it.
pub fn alloc_collect<I>(iter: I, what: impl Display) -> Result<Vec<I::Item>>
where
    I: ExactSizeIterator,
{
    let mut v = alloc_capacity(iter.len(), what)?;
    v.extend(iter);
    Ok(v)
}

/// `bytes` in the largest binary unit that keeps it at least 1, one decimal.
pub(crate) fn human_bytes(bytes: u128) -> String {
    const UNITS: [&str; 7] = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_read_in_binary_units() {
        assert_eq!(human_bytes(512), "512 bytes");
        assert_eq!(human_bytes(8 << 30), "8.0 GiB");
        assert_eq!(human_bytes(3 << 61), "6.0 EiB");
    }
}
