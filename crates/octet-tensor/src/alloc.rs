//! Fallible allocation of the buffers whose sizes follow user input (batch,
//! sequence length, LoRA rank, model width): a request the allocator cannot
//! meet is an [`Error::Alloc`](crate::Error::Alloc) naming the bytes and the buffer, not an abort.
//! The helpers are `octet_fp8::alloc`'s, their error converted.

use crate::Result;
use std::fmt::Display;

/// An empty vector with room for exactly `n` elements, or [`Error::Alloc`](crate::Error::Alloc)
/// (naming `what`) when the allocator cannot provide it.
pub fn alloc_capacity<T>(n: usize, what: impl Display) -> Result<Vec<T>> {
    Ok(octet_fp8::alloc::alloc_capacity(n, what)?)
}

/// `n` copies of `fill`, or [`Error::Alloc`](crate::Error::Alloc) (naming `what`) when the
/// allocator cannot provide them.
pub fn alloc_vec<T: Clone>(n: usize, fill: T, what: impl Display) -> Result<Vec<T>> {
    Ok(octet_fp8::alloc::alloc_vec(n, fill, what)?)
}

/// The items of `iter` collected into one allocation of its exact length,
/// or [`Error::Alloc`](crate::Error::Alloc) (naming `what`) when the allocator cannot provide it.
pub fn alloc_collect<I>(iter: I, what: impl Display) -> Result<Vec<I::Item>>
where
    I: ExactSizeIterator,
{
    let mut v = alloc_capacity(iter.len(), what)?;
    v.extend(iter);
    Ok(v)
}
