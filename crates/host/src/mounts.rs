//! The kernel's own filesystems, mounted with the new mount API (fsopen, fsconfig,
//! fsmount, move_mount): erofs over an image file (a file-backed mount, Linux 6.12+) and
//! overlayfs over erofs mounts, made detached and attached where they belong once the
//! caller is ready (see [`Detached`]).

use anyhow::{bail, Context as _};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::mount::{
    FsMountFlags, FsOpenFlags, MountAttrFlags, MountFlags, MoveMountFlags, UnmountFlags,
};
use std::path::Path;

/// Whether the kernel can mount erofs over a regular file: erofs is known (built in or
/// loadable) and the kernel is 6.12 or later, which added file-backed mounts. `Err`
/// says why not.
pub fn file_backed_erofs() -> Result<(), String> {
    let (major, minor) = kernel_version()?;
    if (major, minor) < (6, 12) {
        return Err(format!(
            "Linux {major}.{minor} has no file-backed erofs mounts (6.12+)"
        ));
    }
    if filesystem_known("erofs") {
        return Ok(());
    }
    // mount(2) would load the module itself; asking first lets "no erofs" be said.
    let _ = std::process::Command::new("modprobe")
        .args(["-q", "erofs"])
        .stdin(std::process::Stdio::null())
        .status();
    if filesystem_known("erofs") {
        Ok(())
    } else {
        Err("the kernel has no erofs (modprobe erofs failed)".into())
    }
}

/// Whether this process is in the first user namespace (its uid map is the identity over
/// every id), where root may mount erofs: in any other, even uid 0 may not.
pub fn in_first_user_namespace() -> bool {
    std::fs::read_to_string("/proc/self/uid_map").is_ok_and(|m| {
        let fields: Vec<&str> = m.split_whitespace().collect();
        fields == ["0", "0", "4294967295"]
    })
}

/// The running kernel's major and minor version.
fn kernel_version() -> Result<(u32, u32), String> {
    let uname = rustix::system::uname();
    let release = uname.release().to_string_lossy().into_owned();
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let mut next = || parts.next().and_then(|p| p.parse::<u32>().ok());
    match (next(), next()) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => Err(format!("kernel release {release:?}: no version")),
    }
}

/// Whether `/proc/filesystems` lists `name`.
fn filesystem_known(name: &str) -> bool {
    std::fs::read_to_string("/proc/filesystems")
        .is_ok_and(|t| t.lines().any(|l| l.split_whitespace().last() == Some(name)))
}

/// A mount made with the new mount API and not attached anywhere yet: nobody can reach
/// it until [`Detached::attach`] puts it on a directory, so whatever must watch it
/// (a fanotify mark) is in place before its first user. Dropped unattached, it is gone.
pub struct Detached {
    fd: OwnedFd,
}

impl Detached {
    /// The mount's root (an `O_PATH` descriptor, as fsmount gives it).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The mount's root opened for reading: what calls that refuse `O_PATH` descriptors
    /// take (a fanotify mark on it marks the mount).
    pub fn open_root(&self) -> anyhow::Result<OwnedFd> {
        rustix::fs::openat(
            self.fd.as_fd(),
            ".",
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .context("opening the new mount's root")
    }

    /// Sets how far the kernel reads ahead in the files of the filesystem mounted here,
    /// in KiB: its backing device info's `read_ahead_kb` (a file-backed erofs mount has
    /// one of its own), named by `FS_IOC_GETFSSYSFSPATH` (Linux 6.8+).
    #[allow(unsafe_code)] // ioctl(FS_IOC_GETFSSYSFSPATH), a syscall
    pub fn set_read_ahead(&self, kib: u32) -> anyhow::Result<()> {
        let root = self.open_root()?;
        // struct fs_sysfs_path { __u8 len; __u8 name[128]; }, read by
        // _IOR(0x15, 1, struct fs_sysfs_path).
        const FS_IOC_GETFSSYSFSPATH: libc::c_ulong = (2 << 30) | (129 << 16) | (0x15 << 8) | 1;
        let mut path = [0u8; 129];
        // SAFETY: the kernel writes at most the 129 bytes of `path`, which outlives the call.
        let r = unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(&root),
                FS_IOC_GETFSSYSFSPATH,
                path.as_mut_ptr(),
            )
        };
        if r != 0 {
            bail!(
                "asking the filesystem for its sysfs name: {}",
                std::io::Error::last_os_error()
            );
        }
        let name = &path[1..1 + usize::from(path[0]).min(128)];
        // "erofs/erofs-24": the device info is named as the filesystem's directory.
        let name = std::str::from_utf8(name)
            .ok()
            .and_then(|n| n.rsplit('/').next())
            .filter(|n| !n.is_empty() && !n.starts_with('.'))
            .with_context(|| format!("sysfs name {:?}", String::from_utf8_lossy(name)))?;
        let knob = Path::new("/sys/class/bdi").join(name).join("read_ahead_kb");
        std::fs::write(&knob, kib.to_string())
            .with_context(|| format!("writing {}", knob.display()))
    }

    /// Attaches the mount on `target`.
    pub fn attach(self, target: &Path) -> anyhow::Result<()> {
        rustix::mount::move_mount(
            self.fd.as_fd(),
            "",
            rustix::fs::CWD,
            target,
            MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
        )
        .with_context(|| format!("attaching the mount on {}", target.display()))
    }
}

/// The erofs image in the regular file `file`, mounted read-only with `flags` besides.
pub fn erofs(file: &Path, flags: MountFlags) -> anyhow::Result<Detached> {
    let name = file.display();
    let fs = Context::open("erofs")?;
    fs.set("source", file.as_os_str())
        .and_then(|()| fs.create(flags | MountFlags::RDONLY))
        .map_err(|e| match e {
            (rustix::io::Errno::NOTBLK, _) => anyhow::anyhow!(
                "{name}: the kernel refuses a file-backed erofs mount over this file (ENOTBLK)"
            ),
            (e, why) => anyhow::anyhow!("mounting erofs from {name}: {e}{why}"),
        })?;
    fs.mount(flags | MountFlags::RDONLY)
        .with_context(|| format!("mounting erofs from {name}"))
}

/// overlayfs with `flags`: `lowers` (top first) under `upper` (an upper and a work
/// directory, `redirect_dir=on` as verilay's FUSE engine writes renamed directories, and
/// `uuid=null`),
/// or read-only over two or more lowers when there is none. `xino=off`: a file's
/// `st_dev` is its layer's, which tells the layers apart.
pub fn overlay(
    lowers: &[&Path],
    upper: Option<(&Path, &Path)>,
    flags: MountFlags,
) -> anyhow::Result<Detached> {
    if lowers.is_empty() || (upper.is_none() && lowers.len() < 2) {
        bail!("a read-only overlay needs at least two lower directories");
    }
    let mut lowerdir = String::new();
    for (i, l) in lowers.iter().enumerate() {
        if i > 0 {
            lowerdir.push(':');
        }
        lowerdir.push_str(&escape(l)?);
    }
    let flags = match upper {
        Some(_) => flags,
        None => flags | MountFlags::RDONLY,
    };
    let fs = Context::open("overlay")?;
    let mut options = vec![("lowerdir", lowerdir), ("xino", "off".into())];
    if let Some((u, w)) = upper {
        options.push(("upperdir", escape(u)?));
        options.push(("workdir", escape(w)?));
        options.push(("redirect_dir", "on".into()));
        // No trusted.overlay.uuid on the upper directory (a new one per mount): the
        // FUSE engine writes none, and an upper directory is the same either way.
        options.push(("uuid", "null".into()));
    }
    for (key, value) in &options {
        fs.set(key, std::ffi::OsStr::new(value))
            .map_err(|(e, why)| anyhow::anyhow!("overlayfs option {key}={value}: {e}{why}"))?;
    }
    fs.create(flags)
        .map_err(|(e, why)| anyhow::anyhow!("mounting overlayfs: {e}{why}"))?;
    fs.mount(flags).context("mounting overlayfs")
}

/// `path` as overlayfs takes a layer's path: `\\`, `,` and `:` escaped with a backslash
/// (overlayfs unescapes each layer's path); a path that is not UTF-8 is refused.
fn escape(path: &Path) -> anyhow::Result<String> {
    let s = path.to_str().with_context(|| {
        format!(
            "{}: not UTF-8, which overlayfs options cannot hold",
            path.display()
        )
    })?;
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '\\' | ',' | ':') {
            out.push('\\');
        }
        out.push(c);
    }
    Ok(out)
}

/// A filesystem context (fsopen), whose errors carry the kernel's own message.
struct Context {
    fd: OwnedFd,
}

/// An error, and the kernel's message for it (": …", or nothing).
type Refusal = (rustix::io::Errno, String);

impl Context {
    fn open(fstype: &str) -> anyhow::Result<Context> {
        let fd = rustix::mount::fsopen(fstype, FsOpenFlags::FSOPEN_CLOEXEC)
            .with_context(|| format!("fsopen({fstype})"))?;
        Ok(Context { fd })
    }

    fn set(&self, key: &str, value: &std::ffi::OsStr) -> Result<(), Refusal> {
        rustix::mount::fsconfig_set_string(self.fd.as_fd(), key, value)
            .map_err(|e| (e, self.message()))
    }

    /// Sets the superblock flags among `flags` and creates the superblock.
    fn create(&self, flags: MountFlags) -> Result<(), Refusal> {
        for (flag, key) in [
            (MountFlags::RDONLY, "ro"),
            (MountFlags::SYNCHRONOUS, "sync"),
            (MountFlags::DIRSYNC, "dirsync"),
            (MountFlags::LAZYTIME, "lazytime"),
        ] {
            if flags.contains(flag) {
                rustix::mount::fsconfig_set_flag(self.fd.as_fd(), key)
                    .map_err(|e| (e, self.message()))?;
            }
        }
        rustix::mount::fsconfig_create(self.fd.as_fd()).map_err(|e| (e, self.message()))
    }

    /// The mount of the created superblock, with the mount attributes among `flags`.
    fn mount(&self, flags: MountFlags) -> anyhow::Result<Detached> {
        let mut attrs = MountAttrFlags::empty();
        for (flag, attr) in [
            (MountFlags::RDONLY, MountAttrFlags::MOUNT_ATTR_RDONLY),
            (MountFlags::NOSUID, MountAttrFlags::MOUNT_ATTR_NOSUID),
            (MountFlags::NODEV, MountAttrFlags::MOUNT_ATTR_NODEV),
            (MountFlags::NOEXEC, MountAttrFlags::MOUNT_ATTR_NOEXEC),
            (MountFlags::NOATIME, MountAttrFlags::MOUNT_ATTR_NOATIME),
            (
                MountFlags::STRICTATIME,
                MountAttrFlags::MOUNT_ATTR_STRICTATIME,
            ),
            (
                MountFlags::NODIRATIME,
                MountAttrFlags::MOUNT_ATTR_NODIRATIME,
            ),
            (
                MountFlags::NOSYMFOLLOW,
                MountAttrFlags::MOUNT_ATTR_NOSYMFOLLOW,
            ),
        ] {
            if flags.contains(flag) {
                attrs |= attr;
            }
        }
        let fd = rustix::mount::fsmount(self.fd.as_fd(), FsMountFlags::FSMOUNT_CLOEXEC, attrs)
            .map_err(|e| anyhow::anyhow!("fsmount: {e}{}", self.message()))?;
        Ok(Detached { fd })
    }

    /// The kernel's messages about this context (`fs/fs_context.c`: lines of "e …",
    /// "w …"), as ": …", or nothing. Read without waiting, at most 1 KiB.
    fn message(&self) -> String {
        let mut out = Vec::new();
        let mut buf = [0u8; 1024];
        while out.len() < 1024 {
            match rustix::io::read(&self.fd, &mut buf) {
                Ok(n) if n > 0 => {
                    let line = String::from_utf8_lossy(&buf[..n]);
                    out.push(line.get(2..).unwrap_or("").trim().to_string());
                }
                _ => break,
            }
        }
        if out.is_empty() {
            String::new()
        } else {
            format!(" ({})", out.join("; "))
        }
    }
}

/// Detaches the mount on `target` at once; the kernel frees it when its last user goes.
pub fn detach(target: &Path) -> anyhow::Result<()> {
    rustix::mount::unmount(target, UnmountFlags::DETACH)
        .with_context(|| format!("detaching {}", target.display()))
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    #[test]
    fn the_running_kernel_has_a_version() {
        let (major, _) = super::kernel_version().unwrap();
        assert!(major >= 3);
    }

    #[test]
    fn overlay_paths_are_escaped_and_one_lower_needs_an_upper() {
        let escaped = super::escape(Path::new(r"/a:b,c\d")).unwrap();
        assert_eq!(escaped, r"/a\:b\,c\\d");
        let t = tempfile::tempdir().unwrap();
        let flags = rustix::mount::MountFlags::empty();
        let e = super::overlay(&[t.path()], None, flags).err().unwrap();
        assert!(e.to_string().contains("at least two"), "{e}");
    }
}
