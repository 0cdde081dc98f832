//! What `verilay stats` reports of a mount: one JSON object that each part of the daemon
//! adds its members to (measuring's counters and layer identities, a remote image's
//! fetching, the xattr requests the filesystem received, the FUSE session's requests),
//! made afresh by a [`StatsSource`] each time someone asks (`mount/stats.rs` serves it on
//! a socket of its own).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A mount's statistics: one JSON object, members in the order they were added.
pub type Stats = serde_json::Map<String, serde_json::Value>;

/// Makes a mount's [`Stats`] (called on the stats socket's thread, never a worker's).
pub type StatsSource = Arc<dyn Fn() -> Stats + Send + Sync>;

/// The xattr requests a filesystem received: what the kernel still asks. A read-only
/// mount whose images hold no xattr answers the first of each with ENOSYS, after which
/// the kernel sends no more (`xattrs.rs`); these counts show it.
#[derive(Default)]
pub struct XattrRequests {
    /// GETXATTR requests.
    pub get: Counter,
    /// LISTXATTR requests.
    pub list: Counter,
}

impl XattrRequests {
    /// Adds the counts to `stats` as `xattr_requests: {getxattr, listxattr}`.
    pub fn add_to(&self, stats: &mut Stats) {
        let counts = serde_json::json!({
            "getxattr": self.get.get(),
            "listxattr": self.list.get(),
        });
        stats.insert("xattr_requests".into(), counts);
    }
}

const SHARDS: usize = 16;

#[repr(align(64))]
#[derive(Default)]
struct Shard(AtomicU64);

/// A count kept in shards, one cache line each, picked by thread: workers counting at
/// once never write one shared line.
#[derive(Default)]
pub struct Counter([Shard; SHARDS]);

thread_local! {
    /// This thread's shard, handed out round-robin on first use.
    static SHARD: usize = {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        NEXT.fetch_add(1, Ordering::Relaxed) as usize % SHARDS
    };
}

impl Counter {
    /// Adds `n` (to this thread's shard).
    pub fn add(&self, n: u64) {
        let i = SHARD.with(|s| *s);
        self.0[i].0.fetch_add(n, Ordering::Relaxed);
    }

    /// The count: every shard's, summed.
    pub fn get(&self) -> u64 {
        self.0.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
    }
}
