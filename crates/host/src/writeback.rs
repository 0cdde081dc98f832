//! Starting a file's writeback early: `sync_file_range(2)` with `SYNC_FILE_RANGE_WRITE`.
//!
//! - It only starts writing the range's dirty pages out; it waits for nothing and
//!   promises nothing about durability (an `fsync` still does that).
//! - No crate wraps it (rustix and nix do not): one syscall, here.

// This module makes a syscall; its unsafe block says why it holds.
#![allow(unsafe_code)]

use std::os::fd::AsRawFd;

/// Starts writing out the dirty pages of `len` bytes of `file` at `offset`, without
/// waiting: a writer of many bytes then has them reach the disk as it goes, not in one
/// flush when it syncs. Failing (an old kernel, a filesystem without it) changes nothing
/// but when the bytes are written.
pub fn start(file: &impl AsRawFd, offset: u64, len: u64) {
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return;
    };
    // SAFETY: sync_file_range reads only its integer arguments; the descriptor is open
    // for as long as `file` is borrowed.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE);
    }
}
