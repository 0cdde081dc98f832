//! Who has a file open: a look through every process's descriptors, for the rare
//! question no system call answers (whether a file has readers: the kernel's
//! `i_readcount` is shown nowhere).
//!
//! What holds: `/proc/PID/fd/N` stats as the file it is open on (the device and inode
//! its filesystem shows), and its link's own mode says how it is open (owner read for a
//! readable handle, owner write for a writable one, fs/proc/fd.c). A process or
//! descriptor gone meanwhile is skipped; this process's descriptors are not looked at.

use std::os::unix::fs::{MetadataExt, PermissionsExt};

/// Whether some other process has the file shown as `(dev, ino)` open read-only now.
/// Costs a stat of every descriptor of every process: ask only when it matters.
pub fn open_read_only_elsewhere(dev: u64, ino: u64) -> bool {
    let me = std::process::id().to_string();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return false;
    };
    for p in procs.flatten() {
        let name = p.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let link = fd.path();
            let Ok(how) = std::fs::symlink_metadata(&link) else {
                continue;
            };
            let mode = how.permissions().mode();
            if mode & 0o200 != 0 || mode & 0o400 == 0 {
                continue;
            }
            if std::fs::metadata(&link).is_ok_and(|m| (m.dev(), m.ino()) == (dev, ino)) {
                return true;
            }
        }
    }
    false
}
