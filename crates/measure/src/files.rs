//! Opening measuring's files without trusting what is at their paths: a list is the mount
//! owner's alone (docs/SECURITY.md section 8).
//!
//! - Files are created 0600, directories 0700; a file others could write is not continued.
//! - Every file is opened `O_NOFOLLOW` and checked with `fstat` on the descriptor.
//! - Reads open `O_NONBLOCK`, take only regular files, and are capped.

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{FileType, Mode, OFlags};
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// Mode of every file verilay creates for a list or log.
pub const FILE_MODE: u32 = 0o600;
/// Mode of a list directory verilay creates.
pub const DIR_MODE: u32 = 0o700;

/// Why a file is not used: the problem, for a message that names the file.
pub type Refusal = String;

fn kind_name(t: FileType) -> &'static str {
    match t {
        FileType::RegularFile => "a regular file",
        FileType::Directory => "a directory",
        FileType::Symlink => "a symbolic link",
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Unknown => "of an unknown type",
    }
}

/// Whether a file (or directory) with this status is the daemon's alone to write: owned
/// by the daemon's effective uid or by root, and not writable by group or others.
pub fn check_private(st: &rustix::fs::Stat) -> Result<(), Refusal> {
    let euid = rustix::process::geteuid().as_raw();
    if st.st_uid != euid && st.st_uid != 0 {
        return Err(format!(
            "owned by uid {}, not by this process's uid {euid} or root: another user could change it",
            st.st_uid
        ));
    }
    let mode = st.st_mode & 0o7777;
    if mode & 0o022 != 0 {
        return Err(format!(
            "writable by {} (mode {mode:04o}): another user could change it",
            if mode & 0o020 != 0 {
                "its group"
            } else {
                "others"
            }
        ));
    }
    Ok(())
}

/// The status of an opened descriptor, which must be of type `want`.
fn fstat_as(fd: BorrowedFd<'_>, want: FileType) -> io::Result<Result<rustix::fs::Stat, Refusal>> {
    let st = rustix::fs::fstat(fd)?;
    let t = FileType::from_raw_mode(st.st_mode);
    if t != want {
        return Ok(Err(format!("{}, not {}", is_a(t), kind_name(want))));
    }
    Ok(Ok(st))
}

fn is_a(t: FileType) -> String {
    format!("is {}", kind_name(t))
}

/// The error an `O_NOFOLLOW` open of a symlink gives, said plainly.
fn nofollow_error(e: rustix::io::Errno) -> OpenError {
    if e == rustix::io::Errno::LOOP {
        OpenError::Refused("is a symbolic link, which is not followed".into())
    } else {
        OpenError::Io(io::Error::from(e))
    }
}

/// An open refused or failed: the refusal or the system's error, for one message.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The system's error.
    #[error("{0}")]
    Io(io::Error),
    /// The file is not one to use, and why.
    #[error("{0}")]
    Refused(Refusal),
}

impl From<io::Error> for OpenError {
    fn from(e: io::Error) -> Self {
        OpenError::Io(e)
    }
}

impl OpenError {
    /// Whether the file is simply not there.
    pub fn is_not_found(&self) -> bool {
        matches!(self, OpenError::Io(e) if e.kind() == io::ErrorKind::NotFound)
    }
}

/// How a file in a list directory is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum How {
    /// Read only; never created.
    Read,
    /// Appended to (the list files); created 0600 if missing.
    Append,
    /// Read and written in place (count, PCR, lock and marker files); created 0600 if missing.
    ReadWrite,
}

/// Opens `name` in `dir` without following a symlink; it must be a regular file, and with
/// `private` one no one else can write (see [`check_private`]).
pub(crate) fn open_in(
    dir: BorrowedFd<'_>,
    name: &str,
    how: How,
    private: bool,
) -> Result<File, OpenError> {
    let flags = OFlags::NOFOLLOW
        | OFlags::CLOEXEC
        | OFlags::NOCTTY
        | match how {
            How::Read => OFlags::RDONLY | OFlags::NONBLOCK,
            How::Append => OFlags::WRONLY | OFlags::APPEND | OFlags::CREATE | OFlags::NONBLOCK,
            How::ReadWrite => OFlags::RDWR | OFlags::CREATE | OFlags::NONBLOCK,
        };
    let fd = rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(FILE_MODE))
        .map_err(nofollow_error)?;
    checked(fd, private, !matches!(how, How::Read))
}

/// The opened descriptor as a file, if it is a regular file (and private, if asked). A
/// file to be written must have one link: another name for it could be any file its
/// planter could not write (`/etc/shadow` hard-linked as a root mount's lock file).
fn checked(fd: OwnedFd, private: bool, written: bool) -> Result<File, OpenError> {
    let st = fstat_as(fd.as_fd(), FileType::RegularFile)?.map_err(OpenError::Refused)?;
    if private {
        check_private(&st).map_err(OpenError::Refused)?;
    }
    if written && st.st_nlink > 1 {
        return Err(OpenError::Refused(format!(
            "has {} hard links: another name for it could be any file",
            st.st_nlink
        )));
    }
    // Regular files ignore O_NONBLOCK; the flag only kept a FIFO's open from waiting.
    Ok(File::from(fd))
}

/// Opens (creating it 0700, with any missing parents, if asked) the directory `path`, not
/// following a symlink in its last component; with `private`, one no one else can write.
pub(crate) fn open_dir(path: &Path, create: bool, private: bool) -> Result<OwnedFd, OpenError> {
    if create {
        use std::os::unix::fs::DirBuilderExt;
        match std::fs::DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(path)
        {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e.into()),
        }
    }
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::open(path, flags, Mode::empty()).map_err(|e| {
        if e == rustix::io::Errno::NOTDIR {
            // O_NOFOLLOW|O_DIRECTORY on a symlink says ENOTDIR; say which.
            match std::fs::symlink_metadata(path) {
                Ok(m) if m.file_type().is_symlink() => nofollow_error(rustix::io::Errno::LOOP),
                _ => OpenError::Io(io::Error::from(e)),
            }
        } else {
            nofollow_error(e)
        }
    })?;
    let st = fstat_as(fd.as_fd(), FileType::Directory)?.map_err(OpenError::Refused)?;
    if private {
        check_private(&st).map_err(OpenError::Refused)?;
    }
    Ok(fd)
}

/// Reads a whole file of at most `cap` bytes: `Err(Some(size))` when it holds more (the
/// size known from fstat, or `cap + 1` for a file that grew while read).
pub(crate) fn read_capped(f: &mut File, cap: u64) -> io::Result<Result<Vec<u8>, u64>> {
    let size = f.metadata()?.len();
    if size > cap {
        return Ok(Err(size));
    }
    let mut buf = Vec::with_capacity(size as usize);
    f.take(cap + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > cap {
        return Ok(Err(buf.len() as u64));
    }
    Ok(Ok(buf))
}

/// A whole regular file of at most `cap` bytes, for input such as a policy: a symlink is
/// followed (a policy may live anywhere), but a FIFO, device, directory or socket is
/// refused without waiting for or reading it, and so is a larger file, before reading.
pub fn read_regular(path: &Path, cap: u64) -> Result<Vec<u8>, OpenError> {
    let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY;
    let fd = rustix::fs::open(path, flags, Mode::empty()).map_err(io::Error::from)?;
    let mut f = checked(fd, false, false)?;
    match read_capped(&mut f, cap)? {
        Ok(bytes) => Ok(bytes),
        Err(size) => Err(OpenError::Refused(format!(
            "{size} bytes, more than the {cap} it may have"
        ))),
    }
}

/// Opens a log file to append to, as the mount's `--log FILE`: created 0600 if missing,
/// never through a symlink, and refused if it is not a regular file or someone else
/// could write it.
pub fn open_private_append(path: &Path) -> Result<File, OpenError> {
    let flags = OFlags::WRONLY
        | OFlags::APPEND
        | OFlags::CREATE
        | OFlags::NOFOLLOW
        | OFlags::NONBLOCK
        | OFlags::CLOEXEC
        | OFlags::NOCTTY;
    let fd =
        rustix::fs::open(path, flags, Mode::from_raw_mode(FILE_MODE)).map_err(nofollow_error)?;
    checked(fd, true, true)
}

/// Printable text of a small file written by verilay (a lock holder, a marker), for a
/// message: one line, control characters escaped, cut short.
pub(crate) fn show_text(bytes: &[u8]) -> String {
    const MAX: usize = 200;
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(MAX)]);
    let one_line: String = text
        .trim_end()
        .lines()
        .collect::<Vec<_>>()
        .join(", ")
        .chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect();
    if bytes.len() > MAX {
        format!("{one_line}...")
    } else {
        one_line
    }
}
