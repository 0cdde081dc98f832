//! Remote executables read whole at the first read of their start, on either engine: exec
//! and the dynamic loader read a program's first page first, then its pages fault in
//! scattered order, each a round trip to the registry (python3's start: ~10 sequential
//! requests of its 6.6 MB binary at 10 ms RTT).
//!
//! - At most [`MAX`] bytes each, [`IN_FLIGHT`] at once in the process: an image decides
//!   neither how large nor how many the buffers are.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The largest executable read whole.
pub(crate) const MAX: u64 = 16 << 20;
/// Executables remembered as read whole, per image or mount.
const KEPT: usize = 4096;
/// Whole reads under way at once in this process; others read as usual.
const IN_FLIGHT: usize = 4;
static READING: AtomicUsize = AtomicUsize::new(0);

/// Which executables were read whole (by a key: an inode, or an extent's start).
#[derive(Default)]
pub(crate) struct ReadWhole(Mutex<HashSet<u64>>);

/// A whole read under way, counted until dropped.
pub(crate) struct Reading(());

impl Drop for Reading {
    fn drop(&mut self) {
        READING.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ReadWhole {
    /// Whether the executable `key` of `size` bytes is to be read whole now: the first
    /// time, if it is small enough and a whole read may start.
    pub(crate) fn start(&self, key: u64, size: u64) -> Option<Reading> {
        if size > MAX {
            return None;
        }
        let mut read = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if read.len() >= KEPT || read.contains(&key) {
            return None;
        }
        if READING.fetch_add(1, Ordering::Relaxed) >= IN_FLIGHT {
            READING.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        read.insert(key);
        Some(Reading(()))
    }
}
