//! Who has a file open, from every process's descriptors: whether a file has readers is no
//! system call's answer (`i_readcount` is shown nowhere).
//!
//! - `/proc/PID/fd/N` stats as the open file; its link's mode says how it is open (owner
//!   read, owner write: fs/proc/fd.c).
//! - Processes or descriptors gone meanwhile, and this process's, are skipped.

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
