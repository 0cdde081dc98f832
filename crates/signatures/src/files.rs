//! Reading the small files this crate trusts (policies, registries.d, keys) so that no file
//! can hold a reader: opened without blocking (a FIFO's open would wait for a writer),
//! only a regular file, and at most 1 MiB of it.

use std::io::Read as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

/// The most of a configuration or key file read: they are a few KiB.
pub(crate) const FILE_MAX: u64 = 1 << 20;

/// The whole of `path`, if it is a regular file of at most 1 MiB; the error is one line
/// naming the file (and keeps the I/O error's kind, so a caller can tell "not found").
pub(crate) fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    let named =
        |e: std::io::Error| std::io::Error::new(e.kind(), format!("{}: {e}", path.display()));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)
        .map_err(named)?;
    if !f.metadata().map_err(named)?.is_file() {
        return Err(named(std::io::Error::other("not a regular file")));
    }
    let mut bytes = Vec::new();
    f.take(FILE_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(named)?;
    if bytes.len() as u64 > FILE_MAX {
        return Err(named(std::io::Error::other("larger than 1 MiB")));
    }
    Ok(bytes)
}

/// `$HOME/RELATIVE` if it exists, else `system`: how containers/image picks the user's
/// configuration over the system's (`os.Stat` of the user's, any kind of file).
pub(crate) fn user_or_system(relative: &str, system: &str) -> std::path::PathBuf {
    if let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        let user = Path::new(&home).join(relative);
        if std::fs::metadata(&user).is_ok() {
            return user;
        }
    }
    std::path::PathBuf::from(system)
}
