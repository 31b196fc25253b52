//! Sharded data parallel (FSDP-style) for octet: work in progress.
