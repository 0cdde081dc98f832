//! What measuring cost, for `verilay stats`.

use crate::stats::Counter;

/// Counters for `verilay stats`: what measuring cost. Each is sharded by worker thread
/// (a cache line per shard), so opens on several threads never write one shared line.
#[derive(Default)]
pub struct Counters {
    /// Opens and execs the policy was asked about.
    pub checked: Counter,
    /// Of those, how many it said to measure.
    pub measured: Counter,
    /// File contents hashed (a cache miss), and the bytes read for it.
    pub hashed: Counter,
    /// Bytes read to hash them.
    pub bytes_hashed: Counter,
    /// Of `hashed`: upper files hashed when their last writer closed them.
    pub hashed_at_close: Counter,
    /// Measurements served by a digest computed earlier.
    pub reused: Counter,
    /// Measurements that took an image file's stored fs-verity digest.
    pub verity_digests: Counter,
    /// Entries appended to the list, and entries already in it (counted as the inbox is
    /// drained, which `verilay stats` does first).
    pub logged: Counter,
    /// Entries already in the list.
    pub duplicates: Counter,
    /// Violations recorded while mounted (open_writers, ToMToU), also counted as drained.
    pub violations: Counter,
    /// Read-only mounts: image files whose bytes an open handed to the kernel's page cache
    /// (see `readonly/measured.rs`), and those bytes.
    pub primed: Counter,
    /// Bytes those opens handed to the page cache.
    pub bytes_primed: Counter,
}
