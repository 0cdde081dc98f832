//! The host's plumbing that the engines share. Nothing here knows images or FUSE: it is
//! mount(2), directories and the kernel's answers, each failure one line naming the path.
//!
//! - `mounts`: the kernel's erofs over an image file, overlayfs over erofs mounts; `private`:
//!   the directory they are made in before users see the result.
//! - `fanotify`: permission events; `holders`: who has a file open.
//! - `lockfile`: lock files naming their holder (the one reader of `/proc/locks`).
//! - `objects`: objects made and finished under a directory descriptor; `sparse`: file
//!   contents copied into them with holes kept.
//! - `mountinfo` (the one parser of `/proc/PID/mountinfo`) and `status` (the one reader of
//!   `/proc/PID/status`: credentials, pending signals).

pub mod fanotify;
pub mod holders;
pub mod lockfile;
pub mod mountinfo;
pub mod mounts;
pub mod objects;
pub mod private;
pub mod sparse;
pub mod status;

/// Tests that cannot run here say so (a skip CI counts), as the workspace's other tests do.
#[cfg(test)]
#[path = "../../erofs/tests/common/skip.rs"]
mod skip;
