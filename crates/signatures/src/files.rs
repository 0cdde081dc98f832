//! Reading the small files this crate trusts (policies, registries.d, keys) so that no file
//! can hold a reader: `verity::source::read_input` (opened without blocking, only a
//! regular file), at most 1 MiB of it.

use std::path::Path;

/// The most of a configuration or key file read: they are a few KiB.
pub(crate) const FILE_MAX: u64 = 1 << 20;

/// The whole of `path`, if it is a regular file of at most 1 MiB; the error is one line
/// naming the file (and keeps the I/O error's kind, so a caller can tell "not found").
pub(crate) fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    verity::source::read_input(path, FILE_MAX)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))
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
