//! Starting the session's threads one at a time, each only while the address space has room
//! for it: a started thread that cannot allocate aborts the daemon (Rust aborts on a failed
//! allocation), so under a tight `ulimit -v` the mount fails with an error first.

// This module makes syscalls; each unsafe block says why it holds.
#![allow(unsafe_code)]

use std::io;
use std::sync::mpsc;
use std::thread::{Builder, JoinHandle};

/// Address space left free before each thread starts: its stack (2 MiB by default), its
/// signal stack, and room for the allocations it makes as it starts, with margin.
const ROOM: usize = 16 << 20;

/// Starts `f` on a thread named `name` once there is room for it, and returns only after
/// the thread is running and has allocated once (so nothing of its start is left to fail).
pub(crate) fn spawn<T: Send + 'static>(
    name: String,
    f: impl FnOnce() -> T + Send + 'static,
) -> io::Result<JoinHandle<T>> {
    ensure_room(ROOM)?;
    let (started, wait) = mpsc::sync_channel(1);
    let thread = Builder::new().name(name).spawn(move || {
        // glibc gives a thread its own arena at its first malloc: done here, while the
        // starter waits, rather than while it starts the next thread.
        drop(std::hint::black_box(Vec::<u8>::with_capacity(64)));
        let _ = started.send(());
        f()
    })?;
    wait.recv()
        .map_err(|_| io::Error::other("a thread ended as it started"))?;
    Ok(thread)
}

/// Whether `bytes` of address space can still be mapped (`ulimit -v`), by mapping them
/// (reserved only: no memory is committed) and unmapping them again.
fn ensure_room(bytes: usize) -> io::Result<()> {
    // SAFETY: a fresh anonymous PROT_NONE mapping the kernel places; nothing else refers
    // to it, and it is unmapped below with the same address and length.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: p and bytes are exactly the mapping made above, unused by anything.
    unsafe { libc::munmap(p, bytes) };
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_started_thread_runs_and_returns() {
        let t = super::spawn("t".into(), || 7).unwrap();
        assert_eq!(t.join().unwrap(), 7);
    }
}
