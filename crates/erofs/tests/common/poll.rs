//! Polling with a deadline, for tests that wait on a daemon or the kernel. Shared by the
//! test helpers of several crates (`#[path]`, as skip.rs is).

use std::time::{Duration, Instant};

/// Polls `cond` every 10 ms until it holds or `timeout` passes; says whether it held.
pub fn poll_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
