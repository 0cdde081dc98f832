//! `--prefetch`: background threads read the whole image through the verified source, so
//! every block is checked and cached, while readers come first.
//!
//! - A few threads (one per CPU, at most [`WORKERS`]) take steps in turn, so hashing runs on
//!   every CPU while the source's readahead keeps the network busy.
//! - They wait while a reader's fetch is under way, at the lowest CPU priority.
//! - They stop when the cache is full (or absent); a step whose bytes fail their hash is
//!   skipped.

use crate::{RemoteSource, BACKGROUND};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use verity::source::ByteSource;

/// Bytes read per step: little past a full cache is fetched for nothing (the source's
/// readahead fetches further ahead, as long as the cache has room).
const STEP: u64 = 1 << 20;
/// The most prefetch threads.
pub const WORKERS: usize = 4;
/// How long to wait after a failed step, at first and at most (it doubles in between).
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// How far a prefetch has come, for `verilay stats`.
#[derive(Default, Debug)]
pub struct Progress {
    /// Bytes of the verified data found in the cache or read so far, of `total`.
    pub done: AtomicU64,
    /// Bytes to prefetch: the verified data's length.
    pub total: AtomicU64,
    /// Steps whose read failed: a failed fetch is tried again after a wait, bytes that
    /// fail their hash are passed over.
    pub failures: AtomicU64,
}

/// Starts prefetching `verified` (the checked view of `remote`'s image, whose data is its
/// first `verified.len()` bytes); returns its progress.
/// A thread that cannot be made leaves the image to be fetched as read (`Err`).
pub fn start(
    remote: Arc<RemoteSource>,
    verified: Arc<dyn ByteSource>,
) -> std::io::Result<Arc<Progress>> {
    let progress = Arc::new(Progress::default());
    progress.total.store(verified.len(), Ordering::Relaxed);
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(WORKERS);
    let next = Arc::new(AtomicU64::new(0));
    for k in 0..workers {
        let (remote, verified, p, next) = (
            remote.clone(),
            verified.clone(),
            progress.clone(),
            next.clone(),
        );
        let spawned = std::thread::Builder::new()
            .name("prefetch".into())
            .spawn(move || run(&remote, &*verified, &p, &next));
        // The first thread is needed; the others only make it faster.
        if let Err(e) = spawned {
            if k == 0 {
                return Err(e);
            }
            break;
        }
    }
    Ok(progress)
}

/// One worker: takes the next step from `next` until the image is done.
fn run(remote: &RemoteSource, verified: &dyn ByteSource, progress: &Progress, next: &AtomicU64) {
    BACKGROUND.with(|b| b.set(true));
    // Lowest priority for this thread's hashing (Linux: per thread).
    let _ = rustix::process::setpriority_process(None, 19);
    let len = verified.len();
    let mut buf = vec![0u8; STEP as usize];
    let mut backoff = FIRST_BACKOFF;
    let mut at = next.fetch_add(STEP, Ordering::Relaxed);
    while at < len {
        let n = STEP.min(len - at);
        if !remote.cached(at, n) {
            if !remote.background_turn() {
                // The cache is full: the rest is left to readers.
                return;
            }
            match verified.read_exact_at(&mut buf[..n as usize], at) {
                Ok(()) => backoff = FIRST_BACKOFF,
                // Bytes that fail their hash after the source's second fetch: the server
                // keeps them wrong, and trying again brings nothing. Readers of them get
                // EIO; the prefetch goes on.
                Err(e) if verity::verified::IntegrityError::find(&e).is_some() => {
                    progress.failures.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {
                    progress.failures.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
            }
        }
        progress.done.fetch_add(n, Ordering::Relaxed);
        at = next.fetch_add(STEP, Ordering::Relaxed);
    }
}
