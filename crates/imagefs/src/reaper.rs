//! Keeps a writable mount's descriptors under the process's limit: a union node holds one for
//! its upper object while the kernel keeps the inode, so big trees would hit EMFILE.
//!
//! - Past half the limit, a pass has the kernel drop the oldest names
//!   (FUSE_NOTIFY_INVAL_ENTRY); an inode looked up again keeps its number.
//! - A pass runs on its own thread: INVAL_ENTRY takes a lock a worker may hold.

use crate::ops::{NotifierSlot, Notify};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// After a pass, the kernel's FORGETs take a moment to arrive; no new pass starts before.
const SETTLE: Duration = Duration::from_millis(10);
/// How long a request out of descriptors waits for a pass.
const WAIT: Duration = Duration::from_millis(100);
/// How long a request out of descriptors keeps trying (`UnionFs::with_room`): a pass
/// may wait for the very directory that request holds, and FORGETs come on another
/// thread, so one wait is not always enough on a loaded machine.
pub(crate) const ROOM_WAIT: Duration = Duration::from_secs(2);
/// For this long after a pass starts, forgotten nodes let go of their descriptors at once.
const PRESSED: Duration = Duration::from_secs(1);

/// A name the kernel may be asked to drop: when it was last looked up, and where.
pub(crate) struct Held {
    pub seen: u64,
    pub parent: u64,
    pub name: Vec<u8>,
}

pub(crate) struct Reaper {
    /// A node descriptor numbered this high starts a pass.
    high: usize,
    /// How many held names a pass leaves.
    keep: usize,
    running: AtomicBool,
    /// When the last pass started (ms since `epoch`), for `pressed`.
    last_pass: AtomicU64,
    epoch: Instant,
    /// Lookup clock: a node's `seen` is this when the kernel last looked it up.
    clock: AtomicU64,
}

impl Reaper {
    /// For a process allowed `limit` descriptors.
    pub fn new(limit: usize) -> Reaper {
        Reaper {
            high: (limit / 2).max(64),
            keep: limit / 4,
            running: AtomicBool::new(false),
            last_pass: AtomicU64::new(u64::MAX),
            epoch: Instant::now(),
            clock: AtomicU64::new(0),
        }
    }

    /// For this process's current limit (`RLIMIT_NOFILE`, soft).
    pub fn for_this_process() -> Reaper {
        let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(1 << 20);
        Reaper::new(usize::try_from(limit).unwrap_or(usize::MAX))
    }

    pub fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    /// Whether a node's descriptor numbered `fd` calls for a pass (descriptors are
    /// numbered lowest free first, so at least this many are open).
    pub fn over(&self, fd: i32) -> bool {
        usize::try_from(fd).is_ok_and(|fd| fd >= self.high)
    }

    fn ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1)
    }

    /// Whether a pass started lately (its FORGETs are arriving).
    pub fn pressed(&self) -> bool {
        let last = self.last_pass.load(Ordering::Relaxed);
        last != u64::MAX && self.ms().saturating_sub(last) < PRESSED.as_millis() as u64
    }

    /// Waits for the pass under way, if any, and its FORGETs (at most `WAIT`: the pass
    /// may itself wait for the request that waits here, to drop a name in its directory).
    pub fn wait(&self) {
        let start = Instant::now();
        while self.running.load(Ordering::Acquire) && start.elapsed() < WAIT {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Starts a pass on its own thread unless one is under way: `held` lists the names
    /// whose nodes hold a descriptor, and all but the `keep` most recently looked up
    /// are dropped.
    pub fn start<F>(self: &Arc<Self>, notifier: &NotifierSlot, held: F)
    where
        F: FnOnce() -> Vec<Held> + Send + 'static,
    {
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        self.last_pass.store(self.ms(), Ordering::Relaxed);
        let (me, notifier) = (self.clone(), notifier.clone());
        let spawned = std::thread::Builder::new()
            .name("verilay-reaper".into())
            .spawn(move || {
                if let Some(n) = notifier.get() {
                    me.pass(&**n, held());
                }
                std::thread::sleep(SETTLE);
                me.running.store(false, Ordering::Release);
            });
        if spawned.is_err() {
            self.running.store(false, Ordering::Release);
        }
    }

    fn pass(&self, notifier: &dyn Notify, mut held: Vec<Held>) {
        let excess = held.len().saturating_sub(self.keep);
        if excess == 0 {
            return;
        }
        held.select_nth_unstable_by_key(excess - 1, |h| h.seen);
        for h in &held[..excess] {
            // A name renamed or removed since is not found: nothing to drop.
            let _ = notifier.inval_entry(h.parent, &h.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_starts_at_half_the_limit_and_leaves_a_quarter() {
        let r = Reaper::new(400);
        assert!(!r.over(199));
        assert!(r.over(200));
        assert_eq!(r.keep, 100);
        // Tiny limits still leave room for the daemon's own descriptors.
        assert!(!Reaper::new(10).over(63));
    }
}
