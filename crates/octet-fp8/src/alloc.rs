//! Fallible allocation of the quantizer's buffers, whose sizes follow the
//! tensors quantized (and so the batch, sequence length and model width of
//! the run): a request the allocator cannot meet is an [`Error::Alloc`]
//! naming the bytes and the buffer, not a process abort.
//!
//! The tensor crate's allocation helpers are these, with the error
//! converted into its own `Error::Alloc` (the same message).

use crate::Error;
use std::fmt::Display;

/// An empty vector with room for exactly `n` elements, or [`Error::Alloc`]
/// (naming `what`) when the allocator cannot provide it.
pub fn alloc_capacity<T>(n: usize, what: impl Display) -> Result<Vec<T>, Error> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| Error::Alloc {
        bytes: n as u128 * std::mem::size_of::<T>() as u128,
        what: what.to_string(),
    })?;
    Ok(v)
}

/// `n` copies of `fill`, or [`Error::Alloc`] (naming `what`) when the
/// allocator cannot provide them.
pub fn alloc_vec<T: Clone>(n: usize, fill: T, what: impl Display) -> Result<Vec<T>, Error> {
    let mut v = alloc_capacity(n, what)?;
    v.resize(n, fill);
    Ok(v)
}

/// `bytes` in the largest binary unit that keeps it at least 1, one decimal.
pub fn human_bytes(bytes: u128) -> String {
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
    fn a_request_beyond_any_address_space_is_an_error_naming_the_bytes() {
        let e = alloc_vec(1usize << 60, 0f32, "a test buffer").unwrap_err();
        assert!(matches!(e, Error::Alloc { bytes, .. } if bytes == 1 << 62));
        assert_eq!(
            e.to_string(),
            "out of memory: cannot allocate 4611686018427387904 bytes (4.0 EiB) for a test \
             buffer; lower --batch, --seq or --rank, or use a smaller model"
        );
        // Past `isize::MAX` bytes (a capacity overflow): the same error.
        let e = alloc_capacity::<f64>(1usize << 62, "x").unwrap_err();
        assert!(matches!(e, Error::Alloc { bytes, .. } if bytes == 1 << 65));
        assert_eq!(alloc_vec(3, 1u8, "z").unwrap(), [1, 1, 1]);
    }

    #[test]
    fn byte_counts_read_in_binary_units() {
        assert_eq!(human_bytes(512), "512 bytes");
        assert_eq!(human_bytes(8 << 30), "8.0 GiB");
        assert_eq!(human_bytes(3 << 61), "6.0 EiB");
    }
}
