//! The host plumbing the engines share: mount(2), directories and the kernel's answers, each
//! failure one line naming the path (map: docs/ARCHITECTURE.md, `crates/host`).
//!
//! - Nothing here knows images or FUSE.
//! - `text` is how text others sent reaches a terminal or a log: shown, never obeyed.
//! - `lockfile` is the one reader of `/proc/locks`, `mountinfo` of `/proc/PID/mountinfo`,
//!   `status` of `/proc/PID/status`.

pub mod fanotify;
pub mod holders;
pub mod lockfile;
pub mod mountinfo;
pub mod mounts;
pub mod objects;
pub mod private;
pub mod sparse;
pub mod status;
pub mod text;
pub mod writeback;

/// Tests that cannot run here say so (a skip CI counts), as the workspace's other tests do.
#[cfg(test)]
#[path = "../../erofs/tests/common/skip.rs"]
mod skip;
