//! A directory of the daemon's own for mounts no user is meant to see: made under
//! `/run/verilay/engine` (root's alone, 0700), named by the process and a counter, and
//! removed when dropped (its mounts must be detached by then).

use anyhow::Context;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
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
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let base = Path::new(BASE);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(base)
            .with_context(|| format!("making {BASE}"))?;
        // Made by someone else (or loosened): it must be root's and shut to others.
        std::fs::set_permissions(base, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("{BASE}: setting its mode"))?;
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
