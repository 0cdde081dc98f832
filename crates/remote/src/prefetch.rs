//! `--prefetch`: background threads fetch the whole image, a step at a time, each step in
//! one request straight into a buffer of its own, check it against the tree and store it
//! in the cache, while readers come first.
//!
//! - [`WORKERS`] threads: several steps are in flight while others are hashed and stored,
//!   so the link stays busy across its round trip and the hashing runs on every CPU.
//! - Each thread's steps start at [`FIT_FIRST_STEP`] where the whole image fits the
//!   cache's size limit, else at [`FIRST_STEP`] (a cache that is full at once, other mounts
//!   holding its room, costs a step per thread fetched for nothing); they grow fourfold up
//!   to [`STEP`] while they come within a second (each step costs a round trip, however
//!   short), and halve when one takes over four (a slow link, which readers share: the
//!   steps in flight at first are kept short for it).
//! - A step's buffer is aligned as its bytes are in the file
//!   (`verity::source::aligned_for`), so its store goes around the page cache
//!   (`cache::Cache::store`).
//! - What came of a failed fetch is checked and kept; the rest is fetched after a wait.
//!   The prefetch never marks the server down for readers (see `RemoteSource::fetch`).
//! - They wait while a reader's fetch is under way, and hash at a low CPU priority
//!   ([`NICE`]).
//! - They stop when the cache is full (or absent). A block that fails its hash is read
//!   again through the verified source, which fetches it anew, and skipped if it fails
//!   again; so are bytes the server answers for others.

use crate::{RemoteSource, BACKGROUND};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use verity::source::ByteSource;
use verity::verified::{IntegrityError, VerifiedSource};

/// The first and shortest step, and what steps are multiples of.
pub const FIRST_STEP: u64 = 1 << 20;
/// The first step where the whole image fits the cache: one round trip less to full steps.
pub const FIT_FIRST_STEP: u64 = 4 << 20;
/// The longest step: one request, and the buffer each thread holds (shorter steps cost a
/// registry more CPU per byte: 8 MiB steps took it 0.2-0.3 CPU-s more per GiB here).
pub const STEP: u64 = 16 << 20;
/// Prefetch threads: with [`STEP`], up to 96 MiB in flight, enough for a link of 1 GB/s
/// and 50 ms round trips while some threads hash and store (at 50 ms, six took a 1 GiB
/// prefetch 1.8-2.0 s where four took 2.1-2.2 s, both storing around the page cache).
pub const WORKERS: usize = 6;
/// The prefetch threads' nice value. A nice-0 task gets ten times their share of a busy
/// CPU; at 19 (a fiftieth) the prefetch of a 1 GiB image at 10 ms RTT took 1.8-2.5 s,
/// where at 10 it took 1.6-1.8 s, as at 0: a registry and a proxy on the same 2 CPUs
/// starved it.
pub const NICE: i32 = 10;
/// A step that took less than this: the next is four times as long (at most [`STEP`]);
/// more than `SLOW`, half as long (at least [`FIRST_STEP`]).
const FAST: Duration = Duration::from_secs(1);
const SLOW: Duration = Duration::from_secs(4);
/// How long to wait after a failed fetch, at first and at most (it doubles in between).
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
pub fn start<S: ByteSource + 'static>(
    remote: Arc<RemoteSource>,
    verified: Arc<VerifiedSource<S>>,
) -> std::io::Result<Arc<Progress>> {
    let progress = Arc::new(Progress::default());
    progress.total.store(verified.len(), Ordering::Relaxed);
    let next = Arc::new(AtomicU64::new(0));
    for k in 0..WORKERS {
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
fn run<S: ByteSource>(
    remote: &RemoteSource,
    verified: &VerifiedSource<S>,
    progress: &Progress,
    next: &AtomicU64,
) {
    BACKGROUND.with(|b| b.set(true));
    // A low priority for this thread's hashing (Linux: per thread).
    let _ = rustix::process::setpriority_process(None, NICE);
    let len = verified.len();
    let mut buf = Vec::new();
    let mut n = if remote.cache().is_some_and(|c| c.fits_whole()) {
        FIT_FIRST_STEP
    } else {
        FIRST_STEP
    };
    loop {
        let at = next.fetch_add(n, Ordering::Relaxed);
        if at >= len {
            return;
        }
        let here = n.min(len - at);
        if let Some((from, end)) = missing(remote, at, here) {
            if !remote.background_turn() {
                // The cache is full: the rest is left to readers.
                return;
            }
            let started = Instant::now();
            let mut pos = from;
            let mut backoff = FIRST_BACKOFF;
            while pos < end {
                match fetch_span(remote, verified, &mut buf, pos, end, progress) {
                    Ok(()) => pos = end,
                    // What came before the failure is kept; the rest is tried again after
                    // a wait, which doubles only while tries bring nothing (one that
                    // brought bytes had a working link cut it short).
                    Err((reached, _)) => {
                        if reached > pos {
                            backoff = FIRST_BACKOFF;
                        }
                        pos = reached;
                        progress.failures.fetch_add(1, Ordering::Relaxed);
                        std::thread::sleep(backoff);
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        if !remote.background_turn() {
                            return;
                        }
                    }
                }
            }
            // A step that came fast: the next is four times as long; a slow one (a slow
            // link, or one that failed), half as long: each try of a request has a time
            // limit.
            let took = started.elapsed();
            if took < FAST {
                n = (4 * n).min(STEP);
            } else if took > SLOW {
                n = (n / 2).max(FIRST_STEP);
            }
        }
        progress.done.fetch_add(here, Ordering::Relaxed);
    }
}

/// The part of `[at, at + n)` the cache lacks, to the [`FIRST_STEP`] (readers may have read
/// some of it), as `(from, end)`; `None` if it has all.
fn missing(remote: &RemoteSource, at: u64, n: u64) -> Option<(u64, u64)> {
    let piece = |k: u64| {
        let a = at + k * FIRST_STEP;
        (a, FIRST_STEP.min(at + n - a))
    };
    let lacks = |k: &u64| {
        let (a, m) = piece(*k);
        !remote.cached(a, m)
    };
    let pieces = n.div_ceil(FIRST_STEP);
    let first = (0..pieces).find(lacks)?;
    let last = (0..pieces).rev().find(lacks).unwrap_or(first);
    let (a, m) = piece(last);
    Some((piece(first).0, a + m))
}

/// Fetches `[pos, end)` in one request into `buf`, checks and stores it. A bad block is
/// read again through the verified source, which fetches it anew (the wrong bytes may have
/// come from a proxy), and passed over if it fails again; so are bytes the server answers
/// for other bytes than asked. A failed fetch: `Err` with where the bytes checked and kept
/// end (a slow link's partial answer is not fetched again).
fn fetch_span<S: ByteSource>(
    remote: &RemoteSource,
    verified: &VerifiedSource<S>,
    buf: &mut Vec<u8>,
    mut pos: u64,
    end: u64,
    progress: &Progress,
) -> Result<(), (u64, std::io::Error)> {
    let bs = u64::from(verified.params().block_size);
    let wrong = |e: &std::io::Error| e.kind() == std::io::ErrorKind::InvalidData;
    while pos < end {
        let want = (end - pos) as usize;
        // Aligned as its bytes are in the file (a step resumed after a short answer or a
        // bad block may start anywhere in a unit).
        let buf = verity::source::aligned_for(buf, want, pos);
        let (fetched, taken) = remote.fetch_into(pos, buf);
        // Whole blocks only, unless all came (the data's short last block).
        let whole = if taken == want {
            want
        } else {
            taken / bs as usize * bs as usize
        };
        // A bad block is read again alone; the blocks after it are checked from the same
        // buffer, not fetched again.
        let mut at = 0;
        while at < whole {
            let Err(e) = verified.check_fetched(pos + at as u64, &buf[at..whole]) else {
                break;
            };
            let Some(bad) = IntegrityError::find(&e)
                .filter(|i| i.data)
                .map(|i| i.offset)
            else {
                return Err((pos + at as u64, e));
            };
            // The blocks before it were kept.
            let n = bs.min(end - bad);
            let from = (bad - pos) as usize;
            match verified.read_exact_at(&mut buf[from..from + n as usize], bad) {
                Ok(()) => {}
                Err(e) if wrong(&e) => {
                    progress.failures.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => return Err((bad, e)),
            }
            at = from + n as usize;
        }
        pos += whole as u64;
        match fetched {
            Ok(()) => {}
            Err(e) if wrong(&e) => {
                progress.failures.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            Err(e) => return Err((pos, e)),
        }
    }
    Ok(())
}
