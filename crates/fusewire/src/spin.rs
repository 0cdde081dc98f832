//! Looking for the next request a moment before sleeping.
//!
//! - A caller that waits for each reply (`ls -l`, `stat` in a loop) sends its next request a
//!   few µs after the last; a thread asleep by then must be woken, and on a VM whose idle
//!   CPUs halt each wake-up costs tens of µs.
//! - So a thread keeps looking a while, yielding its CPU at every look, so a caller that
//!   wants the CPU gets it at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// When a session's threads last found a request: a thread keeps looking while any of
/// them found one lately, not only itself, so that during a burst a thread stays awake on
/// every CPU and a caller sleeping for its reply never leaves its CPU halted.
pub(crate) struct Activity {
    origin: Instant,
    /// ns after `origin`, less [`QUIET_BEFORE`]: 0, the start, is a long quiet spell.
    last: AtomicU64,
}

/// How quiet a session counts as at its start (an hour), in ns.
const QUIET_BEFORE: u64 = 3_600_000_000_000;

impl Activity {
    pub(crate) fn new() -> Activity {
        Activity {
            origin: Instant::now(),
            last: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64 + QUIET_BEFORE
    }

    /// A thread found a request: whether none had for `quiet` before (a burst begins).
    pub(crate) fn found(&self, quiet: Duration) -> bool {
        let now = self.now();
        let before = self.last.swap(now, Ordering::Relaxed);
        now.saturating_sub(before) >= quiet.as_nanos() as u64
    }

    fn quiet_for(&self) -> Duration {
        Duration::from_nanos(self.now().saturating_sub(self.last.load(Ordering::Relaxed)))
    }
}

/// Looks with `look` until it finds something, or until `for_how_long` has passed both
/// since the spin began and since any thread of `activity` found something (each says
/// so: [`Activity::found`]); `None` then, and the caller sleeps.
pub(crate) fn spin<T>(
    for_how_long: Duration,
    activity: &Activity,
    mut look: impl FnMut() -> std::io::Result<Option<T>>,
) -> std::io::Result<Option<T>> {
    if for_how_long.is_zero() {
        return Ok(None);
    }
    let start = Instant::now();
    loop {
        if let Some(found) = look()? {
            return Ok(Some(found));
        }
        if start.elapsed() >= for_how_long && activity.quiet_for() >= for_how_long {
            return Ok(None);
        }
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stops_when_found_or_when_the_time_is_up() {
        let activity = Activity::new();
        let mut n = 0;
        let found = spin(Duration::from_secs(5), &activity, || {
            n += 1;
            Ok((n == 3).then_some(n))
        });
        assert_eq!(found.unwrap(), Some(3));
        let start = Instant::now();
        let none: Option<u8> = spin(Duration::from_millis(2), &activity, || Ok(None)).unwrap();
        assert!(none.is_none() && start.elapsed() >= Duration::from_millis(2));
        let mut looked = false;
        let zero: Option<u8> = spin(Duration::ZERO, &activity, || {
            looked = true;
            Ok(None)
        })
        .unwrap();
        assert!(zero.is_none() && !looked, "a zero spin does not look");
    }

    #[test]
    fn keeps_looking_while_another_thread_finds_requests() {
        let activity = Activity::new();
        let (began_tx, began) = std::sync::mpsc::channel();
        let busy_for = Duration::from_millis(40);
        std::thread::scope(|s| {
            s.spawn(|| {
                let start = Instant::now();
                activity.found(Duration::ZERO);
                began_tx.send(start).unwrap();
                while start.elapsed() < busy_for {
                    activity.found(Duration::ZERO);
                    std::thread::sleep(Duration::from_micros(200));
                }
            });
            // The window is 50 times the finder's pace, for a loaded test machine.
            let start = began.recv().unwrap();
            let none: Option<u8> = spin(Duration::from_millis(10), &activity, || Ok(None)).unwrap();
            assert!(none.is_none());
            assert!(start.elapsed() >= busy_for, "{:?}", start.elapsed());
        });
    }

    #[test]
    fn a_burst_begins_after_a_quiet_spell() {
        let activity = Activity::new();
        let quiet = Duration::from_millis(10);
        assert!(
            activity.found(quiet),
            "the session's first request begins a burst"
        );
        assert!(!activity.found(quiet), "the next one at once does not");
        std::thread::sleep(quiet + Duration::from_millis(2));
        assert!(activity.found(quiet), "one after a quiet spell does");
    }
}
