//! The ids of the task behind a request, for the policy's uid, euid, gid and egid rules.

use measure::policy::TaskIds;
use std::sync::Mutex;

/// The ids of the task behind a request (the request carries only its fsuid and fsgid):
/// from its pidfd (`PIDFD_GET_INFO`, Linux 6.13+) when its real, effective and saved ids
/// agree (then whether it may set ids changes nothing), else from /proc, which also has
/// its capabilities. A task gone by now has every id u32::MAX, so no id rule matches it.
pub(super) fn task_ids_of(pid: u32) -> TaskIds {
    task_ids_pidfd(pid).unwrap_or_else(|| task_ids_proc(pid))
}

/// Pidfds of recent requesters, one slot per `pid % PIDFD_SLOTS`: a storm of opens by one
/// task costs one ioctl each instead of pidfd_open, ioctl and close. A pidfd names one
/// task for good, and its ioctl succeeds only while that task has not been reaped, which
/// is exactly while no other task can hold its id; so a hit that answers is the
/// requester itself.
const PIDFD_SLOTS: usize = 64;
static PIDFDS: [Mutex<Option<(u32, rustix::fd::OwnedFd)>>; PIDFD_SLOTS] =
    [const { Mutex::new(None) }; PIDFD_SLOTS];

fn task_ids_pidfd(pid: u32) -> Option<TaskIds> {
    let mut slot = PIDFDS[pid as usize % PIDFD_SLOTS]
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some((had, fd)) = slot.as_ref() {
        if *had == pid {
            if let Some(ids) = pidfd_ids(fd) {
                return Some(ids);
            }
        }
    }
    // A request's pid is a thread's (creds are per thread): PIDFD_THREAD (O_EXCL).
    const PIDFD_THREAD: u32 = 0o200;
    let p = rustix::process::Pid::from_raw(i32::try_from(pid).ok()?)?;
    let fd = rustix::process::pidfd_open(
        p,
        rustix::process::PidfdFlags::from_bits_retain(PIDFD_THREAD),
    )
    .ok()?;
    let ids = pidfd_ids(&fd);
    *slot = Some((pid, fd));
    ids
}

/// The task's ids from its pidfd (`PIDFD_GET_INFO`), when its real, effective and saved
/// ids agree; `None` otherwise, or when the task is gone or the kernel lacks the ioctl.
#[allow(unsafe_code)] // ioctl(PIDFD_GET_INFO), a syscall
fn pidfd_ids(fd: &rustix::fd::OwnedFd) -> Option<TaskIds> {
    use rustix::fd::AsRawFd;
    // _IOWR(0xFF, 11, struct pidfd_info), the 64-byte first version of the struct.
    const PIDFD_GET_INFO: libc::c_ulong = 0xC040_FF0B;
    const PIDFD_INFO_CREDS: u64 = 1 << 1;
    let mut info = [0u8; 64];
    info[..8].copy_from_slice(&PIDFD_INFO_CREDS.to_ne_bytes());
    // SAFETY: the ioctl reads and writes at most 64 bytes (the size encoded in the request
    // number) of `info`, which is that large, and `fd` is open for the whole call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), PIDFD_GET_INFO, info.as_mut_ptr()) };
    let word = |at: usize| u32::from_ne_bytes(info[at..at + 4].try_into().expect("4 bytes"));
    let mask = u64::from_ne_bytes(info[..8].try_into().expect("8 bytes"));
    if r != 0 || mask & PIDFD_INFO_CREDS == 0 {
        return None;
    }
    // struct pidfd_info: mask, cgroupid, pid, tgid, ppid, ruid, rgid, euid, egid, suid,
    // sgid, fsuid, fsgid.
    let (uid, gid, euid, egid, suid, sgid) =
        (word(28), word(32), word(36), word(40), word(44), word(48));
    if uid != euid || uid != suid || gid != egid || gid != sgid {
        return None;
    }
    Some(TaskIds {
        uid,
        euid,
        suid,
        gid,
        egid,
        sgid,
        cap_setuid: false,
        cap_setgid: false,
    })
}

fn task_ids_proc(pid: u32) -> TaskIds {
    // A task gone has ids no rule names.
    let s = host::status::of(pid).unwrap_or_default();
    TaskIds {
        uid: s.uid[0],
        euid: s.uid[1],
        suid: s.uid[2],
        gid: s.gid[0],
        egid: s.gid[1],
        sgid: s.gid[2],
        cap_setgid: s.cap_eff & (1 << 6) != 0,
        cap_setuid: s.cap_eff & (1 << 7) != 0,
    }
}
