//! Making and removing the kernel mount: mount(2) as root, `fusermount3` otherwise, with
//! the plan's [`Flags`] turned into mount flags (root) or fusermount3's options
//! (rootless); unmounting; and the mount table.

use super::{Access, Flags, Plan};
use anyhow::{bail, Context};
use mountopts::Atime;
use rustix::mount::MountFlags;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// FUSE's largest read request, asked for at mount.
const MAX_READ: u32 = 1 << 20;

/// A kernel mount made for a daemon that does not serve it yet: dropped, it is detached
/// again, so a setup step that fails after the mount exists leaves nothing behind.
pub struct Mounted {
    mountpoint: std::path::PathBuf,
    armed: bool,
}

impl Mounted {
    /// The mount serves: it is the user's to unmount now.
    pub fn keep(mut self) {
        self.armed = false;
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.armed {
            let _ = unmount(&self.mountpoint, true);
        }
    }
}

/// Mounts `/dev/fuse` on the plan's mountpoint as "fuse.verilay", with its options.
pub fn mount(p: &Plan) -> anyhow::Result<(OwnedFd, Mounted)> {
    let fd = if p.as_root {
        mount_root(p)?
    } else {
        mount_fusermount(p)?
    };
    Ok((
        fd,
        Mounted {
            mountpoint: p.mountpoint.clone(),
            armed: true,
        },
    ))
}

/// The mount(2) flags of the generic options. Unsaid, a root mount is like the kernel's
/// own mount of the image: set-id bits, devices and programs work.
pub(super) fn mount_flags(o: &Flags, writable: bool) -> MountFlags {
    let mut f = MountFlags::empty();
    let mut set = |on: bool, flag: MountFlags| {
        if on {
            f |= flag;
        }
    };
    set(!writable, MountFlags::RDONLY);
    set(o.nosuid, MountFlags::NOSUID);
    set(o.nodev, MountFlags::NODEV);
    set(o.noexec, MountFlags::NOEXEC);
    set(o.sync, MountFlags::SYNCHRONOUS);
    set(o.dirsync, MountFlags::DIRSYNC);
    set(o.atime == Some(Atime::Never), MountFlags::NOATIME);
    set(o.atime == Some(Atime::Relative), MountFlags::RELATIME);
    set(o.atime == Some(Atime::Strict), MountFlags::STRICTATIME);
    set(o.nodiratime, MountFlags::NODIRATIME);
    set(o.lazytime, MountFlags::LAZYTIME);
    set(o.nosymfollow, MountFlags::NOSYMFOLLOW);
    f
}

/// Opens /dev/fuse and mounts it with mount(2), so the type is "fuse.verilay" as
/// `mount -t fuse.verilay` and fstab expect. Without allow_other the kernel lets only
/// uid 0 in; allow_root is that already (root and the owner, root), and is not turned
/// into allow_other: FUSE's own check of the caller skips reads, and cached entries
/// and attributes need no request at all.
fn mount_root(p: &Plan) -> anyhow::Result<OwnedFd> {
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .context("opening /dev/fuse")?;
    let mut data = format!(
        "fd={},rootmode=40000,user_id=0,group_id=0,default_permissions,max_read={MAX_READ}",
        dev.as_raw_fd(),
    );
    if p.access == Access::All {
        data.push_str(",allow_other");
    }
    rustix::mount::mount(
        p.source.as_str(),
        &p.mountpoint,
        "fuse.verilay",
        mount_flags(&p.flags, p.writable),
        data.as_str(),
    )?;
    Ok(OwnedFd::from(dev))
}

/// fusermount3's options for the generic ones. It makes every user's mount nosuid and
/// nodev; `relatime` is the kernel's default and not said (fusermount3 before 3.14.1
/// knows no other atime option than noatime, and says so).
fn fusermount_options(p: &Plan) -> String {
    let (o, source) = (&p.flags, &p.source);
    let mut v = vec![if p.writable { "rw" } else { "ro" }, "nosuid", "nodev"];
    for (on, name) in [
        (o.noexec, "noexec"),
        (o.sync, "sync"),
        (o.dirsync, "dirsync"),
        (o.atime == Some(Atime::Never), "noatime"),
        (o.atime == Some(Atime::Strict), "strictatime"),
        (o.nodiratime, "nodiratime"),
        (o.lazytime, "lazytime"),
        (o.nosymfollow, "nosymfollow"),
        // allow_root is refused rootless (the CLI's checks): it would be allow_other.
        (p.access == Access::All, "allow_other"),
        (true, "default_permissions"),
    ] {
        if on {
            v.push(name);
        }
    }
    format!(
        "{},fsname={},subtype=verilay,max_read={MAX_READ}",
        v.join(","),
        source.replace('\\', "\\\\").replace(',', "\\,")
    )
}

/// Rootless: the setuid `fusermount3` opens /dev/fuse, mounts it, and hands the
/// descriptor back over a socket (libfuse's `_FUSE_COMMFD` protocol).
fn mount_fusermount(p: &Plan) -> anyhow::Result<OwnedFd> {
    use rustix::net::{
        recvmsg, socketpair, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags,
        SocketFlags, SocketType,
    };
    let (ours, theirs) = socketpair(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .context("socketpair")?;
    rustix::io::fcntl_setfd(&theirs, rustix::io::FdFlags::empty()).context("socketpair")?;
    let child = Command::new("fusermount3")
        .arg("-o")
        .arg(fusermount_options(p))
        .arg("--")
        .arg(operand(&p.mountpoint))
        .env("_FUSE_COMMFD", theirs.as_raw_fd().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running fusermount3 (is the fuse3 package installed?)")?;
    drop(theirs);
    let mut space = [0u8; rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut byte = [0u8; 1];
    let got = recvmsg(
        &ours,
        &mut [std::io::IoSliceMut::new(&mut byte)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    );
    let fd = match got {
        Ok(_) => control.drain().find_map(|m| match m {
            RecvAncillaryMessage::ScmRights(mut fds) => fds.next(),
            _ => None,
        }),
        Err(_) => None,
    };
    let out = child
        .wait_with_output()
        .context("waiting for fusermount3")?;
    match fd {
        Some(fd) if out.status.success() => Ok(fd),
        _ => {
            let err = String::from_utf8_lossy(&out.stderr);
            let last = err
                .trim()
                .lines()
                .last()
                .unwrap_or("failed without a message");
            // fusermount3 names itself in its messages; say it once.
            bail!("fusermount3: {}", last.trim_start_matches("fusermount3: "))
        }
    }
}

/// How long an unmount that finds the mount busy tries again.
const BUSY_PATIENCE: Duration = Duration::from_secs(1);

/// Unmounts `mountpoint` (`lazy`: detached): as root itself, trying a busy mount again for a
/// moment; otherwise with `fusermount3 -u`.
pub fn unmount(mountpoint: &Path, lazy: bool) -> anyhow::Result<()> {
    if rustix::process::geteuid().is_root() {
        let flags = if lazy {
            rustix::mount::UnmountFlags::DETACH
        } else {
            rustix::mount::UnmountFlags::empty()
        };
        // A measured kernel-engine mount's fanotify thread closes the file it was handed
        // for an open just after answering it, so the opener, woken by the answer, can
        // reach umount while that file still holds the mount for an instant: busy is
        // tried again for a moment before it is an error.
        let deadline = Instant::now() + BUSY_PATIENCE;
        let mut result = rustix::mount::unmount(mountpoint, flags);
        while result == Err(rustix::io::Errno::BUSY) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            result = rustix::mount::unmount(mountpoint, flags);
        }
        return result.map_err(|e| match e {
            rustix::io::Errno::BUSY => {
                anyhow::anyhow!("{}: busy (try --lazy)", mountpoint.display())
            }
            rustix::io::Errno::INVAL => {
                anyhow::anyhow!("{}: not a mount point", mountpoint.display())
            }
            e => anyhow::anyhow!("unmounting {}: {e}", mountpoint.display()),
        });
    }
    let mut cmd = Command::new("fusermount3");
    cmd.arg("-u").arg("-q");
    if lazy {
        cmd.arg("-z");
    }
    let out = cmd
        .arg("--")
        .arg(operand(mountpoint))
        .stdin(Stdio::null())
        .output()
        .context("running fusermount3 -u")?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!(
            "unmounting {}: {}",
            mountpoint.display(),
            err.trim().lines().last().unwrap_or("fusermount3 failed")
        );
    }
    Ok(())
}

/// The filesystem types of the mounts at `path`, bottom first.
fn mounts_at(path: &Path) -> Vec<String> {
    let Ok(canon) = std::fs::canonicalize(path) else {
        return Vec::new();
    };
    host::mountinfo::at(&canon)
        .into_iter()
        .map(|m| m.fs_type)
        .collect()
}

/// Whether `path` is the mount point of some mount.
pub fn is_mount_point(path: &Path) -> anyhow::Result<bool> {
    std::fs::canonicalize(path)?;
    Ok(!mounts_at(path).is_empty())
}

/// After a daemon failed or was stopped: detaches a verilay mount it left on `mountpoint`
/// (nothing was mounted there before it started; a dead daemon's mount only says
/// "Transport endpoint is not connected").
pub fn detach_leftover(mountpoint: &Path) {
    if mounts_at(mountpoint).iter().any(|t| t == "fuse.verilay") {
        let _ = unmount(mountpoint, true);
    }
}

/// A writable mount holds one descriptor per upper object the kernel has cached, so the
/// daemon takes all the descriptors it may: the hard limit, and as root the system's
/// maximum (`fs.nr_open`). Past half of them, it has the kernel drop the names it looked
/// up longest ago (imagefs's `reaper`), so a low limit costs lookups, not EMFILE.
pub fn raise_descriptor_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let now = getrlimit(Resource::Nofile);
    let system_max = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    if let Some(max) = system_max.filter(|&m| now.maximum.is_some_and(|h| m > h)) {
        let all = Rlimit {
            current: Some(max),
            maximum: Some(max),
        };
        if setrlimit(Resource::Nofile, all).is_ok() {
            return;
        }
    }
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: now.maximum,
            maximum: now.maximum,
        },
    );
}

/// Grows this process's descriptor table now, while the daemon has one thread: the kernel
/// grows a table that threads share only after an RCU grace period (`expand_files` →
/// `synchronize_rcu`, milliseconds each), once per doubling, which a fresh writable mount
/// would pay several times in its first creates. Up to 65,536 slots (512 KiB of kernel
/// memory), at most the limit.
pub fn reserve_descriptor_table() {
    use rustix::process::{getrlimit, Resource};
    const SLOTS: u64 = 1 << 16;
    let slots = getrlimit(Resource::Nofile)
        .current
        .map_or(SLOTS, |l| l.min(SLOTS));
    let Ok(null) = std::fs::File::open("/dev/null") else {
        return;
    };
    // The copy lands at the lowest free slot at or above this: the table grows to hold it,
    // and a table never shrinks.
    let top = i32::try_from(slots.saturating_sub(1)).unwrap_or(0);
    drop(rustix::io::fcntl_dupfd_cloexec(&null, top));
}

/// Aborts the FUSE connection of the mount on device `dev` through fusectl: every request
/// waiting and every later one fails with ENOTCONN, and the session's reads end.
pub fn abort_connection(dev: u64) -> anyhow::Result<()> {
    // fusectl names a connection by the kernel's dev_t (major << 20 | minor); a FUSE
    // mount's device is anonymous (major 0), so that is its minor.
    let minor = rustix::fs::minor(dev);
    let path = format!("/sys/fs/fuse/connections/{minor}/abort");
    std::fs::write(&path, b"1").with_context(|| format!("aborting the connection: {path}"))
}

/// The kernel caps FUSE readahead at the mount's bdi setting (128 KiB by default) whatever
/// INIT negotiated; let it read as far ahead as the session asked for
/// ([`crate::fuse::READ_AHEAD`]). Root only; best effort.
pub fn raise_readahead(mountpoint: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::metadata(mountpoint) else {
        return;
    };
    let dev = m.dev();
    let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
    let _ = std::fs::write(
        format!("/sys/class/bdi/{major}:{minor}/read_ahead_kb"),
        (crate::fuse::READ_AHEAD / 1024).to_string(),
    );
}

/// The daemon's hold on its mountpoint: a shared flock on the directory under the mount
/// (opened before mounting), kept until the daemon exits, so `verilay umount` can wait for
/// that ([`wait_for_daemon`]). Best effort: `None` if the directory cannot be locked.
pub fn hold_mountpoint(mountpoint: &Path) -> Option<OwnedFd> {
    use rustix::fs::{flock, open, FlockOperation, Mode, OFlags};
    let fd = open(
        mountpoint,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    // An unmount waiting on this directory holds it exclusively for an instant.
    let deadline = Instant::now() + Duration::from_millis(200);
    loop {
        match flock(&fd, FlockOperation::NonBlockingLockShared) {
            Ok(()) => return Some(fd),
            Err(rustix::io::Errno::WOULDBLOCK) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(_) => return None,
        }
    }
}

/// After an unmount: waits until no daemon holds the directory that was under the mount
/// ([`hold_mountpoint`]), i.e. until its daemon has finished (its measurement list
/// closed) and exited; gives up after `timeout`, naming the daemon.
pub fn wait_for_daemon(mountpoint: &Path, timeout: Duration) -> anyhow::Result<()> {
    use rustix::fs::{flock, open, FlockOperation, Mode, OFlags};
    let Ok(dir) = open(
        mountpoint,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return Ok(());
    };
    let start = Instant::now();
    loop {
        match flock(&dir, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {
                let _ = flock(&dir, FlockOperation::Unlock);
                return Ok(());
            }
            Err(rustix::io::Errno::WOULDBLOCK) => {}
            Err(_) => return Ok(()),
        }
        if start.elapsed() >= timeout {
            let daemon = match host::lockfile::flock_holder(&dir) {
                Some(pid) => format!("its daemon (process {pid})"),
                None => "its daemon".into(),
            };
            bail!(
                "unmounted {}, but {daemon} has not exited after {:.3} s (--timeout): \
                 its measurement list may not be closed yet",
                mountpoint.display(),
                timeout.as_secs_f64()
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A path as a command-line operand: one starting with `-` gets `./` before it (the same
/// file), so no parser takes it for a flag.
pub fn operand(p: &Path) -> std::path::PathBuf {
    use std::os::unix::ffi::OsStrExt;
    if p.as_os_str().as_bytes().starts_with(b"-") {
        Path::new(".").join(p)
    } else {
        p.to_path_buf()
    }
}
