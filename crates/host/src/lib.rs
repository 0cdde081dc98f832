//! The host's plumbing that the engines share: mounting the kernel's erofs over an image
//! file and overlayfs over erofs mounts (`mounts`), and the private directory those
//! mounts are made in before users see the result (`private`); fanotify permission
//! events (`fanotify`), who has a file open (`holders`), lock files that name their
//! holder (`lockfile`, the one reader of `/proc/locks`), objects made and finished under
//! a directory descriptor (`objects`), and the mount table
//! (`mountinfo`, the one parser of `/proc/PID/mountinfo`), a task's credentials and
//! pending signals (`status`, the one reader of `/proc/PID/status`).
//!
//! Nothing here knows images or FUSE: it is mount(2), directories and the kernel's
//! answers, each failure said in one line that names the path.

#![warn(missing_docs)]

pub mod fanotify;
pub mod holders;
pub mod lockfile;
pub mod mountinfo;
pub mod mounts;
pub mod objects;
pub mod private;
pub mod status;
