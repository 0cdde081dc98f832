//! A directory of the daemon's own for mounts no user is meant to see: made under
//! `/run/verilay/engine` (refused unless a directory of root's; shut to others, 0700),
//! named by the process and a counter, and removed when dropped (its mounts must be
//! detached by then).

use anyhow::Context;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// Where private directories are made.
pub const BASE: &str = "/run/verilay/engine";

/// A private directory, removed (with the empty directories made in it) when dropped.
pub struct PrivateDir {
    path: PathBuf,
}

impl PrivateDir {
    /// A new, empty directory under [`BASE`].
    pub fn new() -> anyhow::Result<PrivateDir> {
        PrivateDir::new_in(Path::new(BASE))
    }

    /// A new, empty directory under `base`, which must be a directory (not a link to
    /// one) of this process's user; it is made if missing and shut to others.
    fn new_in(base: &Path) -> anyhow::Result<PrivateDir> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let show = base.display();
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(base)
            .with_context(|| format!("making {show}"))?;
        let meta = std::fs::symlink_metadata(base).with_context(|| show.to_string())?;
        let me = rustix::process::geteuid().as_raw();
        if !meta.is_dir() || meta.uid() != me {
            anyhow::bail!(
                "{show}: not a directory of uid {me} (a {} of uid {}): refused",
                if meta.is_dir() {
                    "directory"
                } else {
                    "non-directory"
                },
                meta.uid()
            );
        }
        // Loosened by someone: shut to others again.
        std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("{show}: setting its mode"))?;
        let pid = std::process::id();
        loop {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let path = base.join(format!("{pid}.{n}"));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(PrivateDir { path }),
                // Left by an earlier process of the same pid: take the next name.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => {}
                Err(e) => return Err(e).with_context(|| format!("making {}", path.display())),
            }
        }
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// An empty directory `name` inside.
    pub fn subdir(&self, name: &str) -> anyhow::Result<PathBuf> {
        let p = self.path.join(name);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&p)
            .with_context(|| format!("making {}", p.display()))?;
        Ok(p)
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        // Only empty directories go: a mount still there keeps its directory (and the
        // directory its parent), never anything under it.
        if let Ok(entries) = std::fs::read_dir(&self.path) {
            for e in entries.flatten() {
                let _ = std::fs::remove_dir(e.path());
            }
        }
        let _ = std::fs::remove_dir(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_that_is_a_link_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let base = t.path().join("base");
        let dir = PrivateDir::new_in(&base).unwrap();
        assert!(dir.path().starts_with(&base));
        let sub = dir.subdir("layer-0").unwrap();
        assert!(sub.is_dir());
        drop(dir);
        assert_eq!(std::fs::read_dir(&base).unwrap().count(), 0);
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&base, &link).unwrap();
        let e = PrivateDir::new_in(&link).err().unwrap().to_string();
        assert!(e.contains("a non-directory of uid"), "{e}");
    }

    #[test]
    fn a_base_of_another_user_is_refused() {
        if crate::skip::skip_unless(rustix::process::geteuid().is_root(), "needs root (chown)") {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let theirs = t.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(1234), Some(1234)).unwrap();
        let e = PrivateDir::new_in(&theirs).err().unwrap().to_string();
        assert!(e.contains("a directory of uid 1234"), "{e}");
    }
}
