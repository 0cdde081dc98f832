//! Helpers of the fusewire tests: counted skips (the workspace's one helper), root, real
//! mounts with mount(2), the io_uring switch, polling with a deadline.
#![allow(dead_code)]
// These helpers make syscalls (mount(2) and the like); each unsafe block says why it holds.
#![allow(unsafe_code)]

pub mod memfs;
pub mod wire;

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

#[path = "../../../erofs/tests/common/skip.rs"]
mod skip;
#[allow(unused_imports)]
pub use skip::skip_unless;
#[path = "../../../erofs/tests/common/poll.rs"]
mod poll;
#[allow(unused_imports)]
pub use poll::poll_until;

pub fn is_root() -> bool {
    // SAFETY: geteuid(2) takes nothing and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Mount tests run one at a time: they count this process's session threads and switch
/// the kernel's io_uring parameter.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Opens /dev/fuse and mounts it at `dir` as root would (what verilay does itself).
pub fn mount_fuse(dir: &Path) -> io::Result<OwnedFd> {
    // SAFETY: open(2) of a NUL-terminated literal path.
    let fd = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let data = format!(
        "fd={},rootmode=40000,user_id=0,group_id=0,allow_other",
        fd.as_raw_fd()
    );
    let (data, target) = (
        CString::new(data)?,
        CString::new(dir.as_os_str().as_bytes())?,
    );
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_RDONLY;
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    let r = unsafe {
        libc::mount(
            c"fusewire".as_ptr(),
            target.as_ptr(),
            c"fuse.fusewire".as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// A mountpoint that is unmounted (detached) before its directory is removed, so a test
/// that fails with the mount still up leaves neither a mount nor a hang in the cleanup.
pub struct Mountpoint {
    dir: tempfile::TempDir,
}

impl Mountpoint {
    pub fn new() -> Mountpoint {
        Mountpoint {
            dir: tempfile::tempdir().expect("mountpoint"),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Mountpoint {
    fn drop(&mut self) {
        let _ = unmount(self.dir.path());
    }
}

/// Detaches the mount at `dir` (the connection ends when its last user goes).
pub fn unmount(dir: &Path) -> io::Result<()> {
    let target = CString::new(dir.as_os_str().as_bytes())?;
    // SAFETY: target is a NUL-terminated string that outlives the call.
    if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

const URING_PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// Turns FUSE over io_uring on for new mounts, and back to what it was when dropped.
pub struct UringEnabled {
    old: String,
}

impl UringEnabled {
    /// `None` when this kernel has no such parameter.
    pub fn new() -> Option<UringEnabled> {
        let old = std::fs::read_to_string(URING_PARAM).ok()?;
        std::fs::write(URING_PARAM, "Y").ok()?;
        Some(UringEnabled {
            old: old.trim().to_string(),
        })
    }
}

impl Drop for UringEnabled {
    fn drop(&mut self) {
        let _ = std::fs::write(URING_PARAM, &self.old);
    }
}

/// Names of this process's threads that a session started.
pub fn session_threads() -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .filter(|c| c.starts_with("fuse-"))
        .collect()
}

/// Runs `sh -c script` with `args`; its stdout, or a panic with its stderr.
pub fn sh(script: &str, args: &[&Path]) -> String {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .args(args)
        .output()
        .expect("running sh");
    assert!(
        out.status.success(),
        "sh -c {script:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
