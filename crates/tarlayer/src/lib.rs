//! A container layer tarball (plain, gzip or zstd) read into an image tree that stacks as the
//! layer means it to.
//!
//! - Deletions become overlayfs's lower-layer whiteouts and opaque markers.
//! - File contents are copied once, into one unlinked spill file.
//! - The tar is untrusted: what the readers would read apart, or the image cannot hold, is
//!   refused naming the offset (docs/SECURITY.md section 4).

#![forbid(unsafe_code)]

mod header;
mod pax;
mod stream;
mod tree;

use erofs::builder::{Content, Kind, Node, Tree};
use header::Header;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;
use std::sync::Arc;
use stream::{Stream, BLOCK};
use tree::Layer;

use upper::overlay::{TAR_OPAQUE_MARKER, TAR_WHITEOUT_PREFIX};

/// Largest PAX extended header read ('x' or 'g'): 1 MiB, the cap of Go's archive/tar,
/// so any layer Docker, containerd or BuildKit can read, this reads too. What one entry
/// can carry is far less (a path, a link target, and xattrs one EROFS inode holds:
/// `pax::XATTR_INODE_MAX`), and the cap is checked before anything is allocated.
const PAX_HEADER_MAX: i64 = 1 << 20;
/// Largest GNU long name or link target ('L', 'K'): PATH_MAX with its NUL.
const LONG_NAME_MAX: i64 = 4096;

/// Why a layer was not read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading the tar, or making the spill file, failed.
    #[error("{path}: {err}")]
    Io {
        /// The tar, or the spill directory.
        path: String,
        /// The system's error.
        #[source]
        err: std::io::Error,
    },
    /// A malformed or hostile entry: names the tar and the entry's header offset (in the
    /// uncompressed stream).
    #[error("{path}: entry at byte {offset}: {what}")]
    Entry {
        /// The tar.
        path: String,
        /// Where the entry's first header starts.
        offset: u64,
        /// What is wrong with it.
        what: String,
    },
    /// The archive itself is broken at `offset` (in the uncompressed stream): truncated,
    /// unterminated, followed by garbage, or a compressed stream that fails.
    #[error("{path}: at byte {offset}: {what}")]
    Archive {
        /// The tar.
        path: String,
        /// Where the stream breaks.
        offset: u64,
        /// What is wrong there.
        what: String,
    },
}

/// An error before the tar's name is attached to it.
#[derive(Debug)]
pub(crate) enum Fault {
    /// The entry whose first header is at this offset.
    Entry(u64, String),
    /// The stream at this offset.
    At(u64, String),
    /// Our own disk failed (writing the spill file) at the entry at this offset: says
    /// nothing of the tar.
    Spill(u64, std::io::Error),
}

impl Fault {
    fn named(self, path: &str) -> Error {
        let path = path.to_string();
        match self {
            Fault::Entry(offset, what) => Error::Entry { path, offset, what },
            Fault::At(offset, what) => Error::Archive { path, offset, what },
            Fault::Spill(offset, err) => Error::Io {
                path: format!("{path}: entry at byte {offset}: writing the spill file"),
                err,
            },
        }
    }
}

/// What a layer held, besides its tree.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Entries read (extension headers are part of the entry they precede).
    pub entries: u64,
    /// `.wh.NAME` entries.
    pub whiteouts: u64,
    /// `.wh..wh..opq` entries.
    pub opaque_dirs: u64,
    /// Bytes of file content.
    pub bytes: u64,
    /// Xattrs left out because EROFS has no namespace for them.
    pub skipped_xattrs: Vec<String>,
    /// `sha256:HEX` of the uncompressed tar, end-of-archive padding included: the layer's
    /// DiffID, as an image config lists it.
    pub diff_id: String,
    /// Bytes of the uncompressed tar.
    pub tar_bytes: u64,
}

/// A reader that hashes what it passes on (the uncompressed tar, for its DiffID).
struct Hashing<R> {
    inner: R,
    hash: sha2::Sha256,
    bytes: u64,
    /// The most bytes the uncompressed tar may have: a few KB of zstd can expand to
    /// terabytes of zeros, and every byte costs disk (spilled, then built).
    max: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use sha2::Digest as _;
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        if self.bytes > self.max {
            return Err(std::io::Error::other(format!(
                "the uncompressed layer is larger than the limit of {} bytes",
                self.max
            )));
        }
        Ok(n)
    }
}

/// How the tar is compressed, from its first bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Compression {
    None,
    Gzip,
    Zstd,
}

/// The compression whose magic `magic` starts with; `None` for anything else.
pub(crate) fn detect(magic: &[u8]) -> Compression {
    if magic.starts_with(&[0x1f, 0x8b]) {
        Compression::Gzip
    } else if magic.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Compression::Zstd
    } else {
        Compression::None
    }
}

/// Whether `path` looks like a tar (any compression): what `verilay build` checks to tell
/// a layer from a directory.
pub fn is_archive(path: &Path) -> bool {
    let Ok(mut f) = verity::source::open_input(path, false) else {
        return false;
    };
    let mut head = [0u8; 512];
    let mut n = 0;
    while n < head.len() {
        match f.read(&mut head[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    match detect(&head[..n]) {
        // USTAR's magic, or a V7 header's good checksum.
        // A file cut inside its first header still shows the magic: read as a tar, it is
        // refused naming the truncation.
        Compression::None => {
            (n >= 262 && &head[257..262] == b"ustar") || (n == 512 && header::checksum_ok(&head))
        }
        _ => true,
    }
}

/// Extension headers read since the last entry, for the entry that follows them.
#[derive(Default)]
struct Pending {
    /// Offset of the first of them: the entry's errors name it.
    first: Option<u64>,
    pax: Option<pax::Local>,
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
    /// Offset of the last extension header ('x', 'g', 'L', 'K') since the last entry:
    /// Python's tarfile fails on one with no entry after it, and newer ones never take
    /// a V7 file after one for a directory.
    extension: Option<u64>,
}

/// The archive, header by header, into `layer`.
struct Reader<'a, R> {
    stream: Stream<R>,
    layer: Layer,
    spill: Arc<File>,
    spill_len: u64,
    progress: &'a dyn Fn(u64),
}

impl<R: Read> Reader<'_, R> {
    fn read_all(&mut self) -> Result<(), Fault> {
        let mut pending = Pending::default();
        loop {
            let at = self.stream.offset;
            let Some(block) = self.stream.block()? else {
                return Err(Fault::At(
                    at,
                    "the archive ends without its end-of-archive marker (two zero blocks)".into(),
                ));
            };
            if block == [0; BLOCK] {
                if let Some(first) = pending.first.or(pending.extension) {
                    return Err(Fault::Entry(
                        first,
                        "extension headers with no entry after them".into(),
                    ));
                }
                return self.end(at);
            }
            let h = header::parse(&block).map_err(|e| Fault::Entry(at, e))?;
            match h.typeflag {
                b'x' | b'g' => self.pax_header(at, &h, &mut pending)?,
                b'L' | b'K' => self.long_name(at, &h, &mut pending)?,
                _ => {
                    let p = std::mem::take(&mut pending);
                    let first = p.first.unwrap_or(at);
                    self.entry(first, h, p)?;
                    if self.layer.stats.entries.is_multiple_of(1024) {
                        (self.progress)(self.layer.stats.entries);
                    }
                }
            }
        }
    }

    /// After the first zero block at `at`: a second one, then nothing but zero padding.
    fn end(&mut self, at: u64) -> Result<(), Fault> {
        let second = self.stream.offset;
        match self.stream.block()? {
            None => Err(Fault::At(
                second,
                "the archive ends after one zero block: its end-of-archive marker is two".into(),
            )),
            Some(b) if b != [0; BLOCK] => Err(Fault::At(
                second,
                format!("a header after the lone zero block at byte {at}"),
            )),
            Some(_) => self.stream.zeros_to_end(),
        }
    }

    /// A PAX extended header: 'x' for the next entry, 'g' for all that follow.
    fn pax_header(&mut self, at: u64, h: &Header, pending: &mut Pending) -> Result<(), Fault> {
        let bad = |what: String| Fault::Entry(at, what);
        if !(0..=PAX_HEADER_MAX).contains(&h.size) {
            return Err(bad(format!(
                "a PAX header of {} bytes (at most {PAX_HEADER_MAX})",
                h.size
            )));
        }
        let data = self.stream.small(h.size as usize, at, "the PAX records")?;
        let records = pax::records(&data).map_err(bad)?;
        if h.typeflag == b'g' {
            // GNU tar applies a global header's records to every later entry, Go's
            // archive/tar (so containerd and Docker) ignores them: the same layer would
            // give two trees. Records that change nothing (a comment, as git archive
            // writes) are fine; any this importer would honour is refused.
            if pending.first.is_some() {
                return Err(bad(
                    "a PAX global header between an entry and its extension headers".into(),
                ));
            }
            if let Some((key, _)) = records.iter().find(|(k, _)| pax::is_meaningful(k)) {
                return Err(bad(format!(
                    "a PAX global header sets {}, which GNU tar applies to every later entry and Go's archive/tar ignores",
                    String::from_utf8_lossy(key)
                )));
            }
            pending.extension = Some(at);
            return Ok(());
        }
        if pending.pax.is_some() {
            // Go's archive/tar keeps the second, GNU tar merges both.
            return Err(bad("a second PAX header for one entry".into()));
        }
        pending.pax = Some(pax::interpret(records).map_err(bad)?);
        pending.first.get_or_insert(at);
        pending.extension = Some(at);
        Ok(())
    }

    /// A GNU long name ('L') or long link target ('K') for the next entry.
    fn long_name(&mut self, at: u64, h: &Header, pending: &mut Pending) -> Result<(), Fault> {
        let bad = |what: String| Fault::Entry(at, what);
        let what = if h.typeflag == b'L' {
            "GNU long name"
        } else {
            "GNU long link"
        };
        if !(0..=LONG_NAME_MAX).contains(&h.size) {
            return Err(bad(format!(
                "a {what} of {} bytes (at most {LONG_NAME_MAX}: PATH_MAX)",
                h.size
            )));
        }
        let mut data = self.stream.small(h.size as usize, at, what)?;
        while data.last() == Some(&0) {
            data.pop();
        }
        if data.is_empty() || data.contains(&0) {
            return Err(bad(format!(
                "an empty {what}, or one with a NUL byte inside"
            )));
        }
        let slot = if h.typeflag == b'L' {
            &mut pending.long_name
        } else {
            &mut pending.long_link
        };
        if slot.replace(data).is_some() {
            return Err(bad(format!("a second {what} for one entry")));
        }
        pending.first.get_or_insert(at);
        pending.extension = Some(at);
        Ok(())
    }

    /// One entry with what its extension headers said; `first` is the offset of its
    /// first header, which its errors name.
    fn entry(&mut self, first: u64, h: Header, p: Pending) -> Result<(), Fault> {
        let bad = |what: String| Fault::Entry(first, what);
        self.layer.stats.entries += 1;
        let l = p.pax.unwrap_or_default();
        let path = overridden("path", l.path, "GNU long name", p.long_name, h.name).map_err(bad)?;
        let link = overridden(
            "linkpath",
            l.linkpath,
            "GNU long link",
            p.long_link,
            h.linkname,
        )
        .map_err(bad)?;
        // Negative even under a PAX size: GNU tar and Go's archive/tar fail on it.
        let header_size =
            u64::try_from(h.size).map_err(|_| bad(format!("negative size {}", h.size)))?;
        let size = l.size.unwrap_or(header_size);
        let ty = EntryType::of(
            h.typeflag,
            &path,
            h.name_field_ends_in_slash,
            p.extension.is_some(),
        )
        .map_err(bad)?;
        if ty != EntryType::Regular && size != 0 {
            // GNU tar would read the data that Go's archive/tar takes for the next header.
            return Err(bad(format!(
                "{} entry with {size} bytes of data",
                ty.name()
            )));
        }
        let (mtime, mtime_nsec) = l.mtime.unwrap_or((h.mtime, 0));
        let mut xattrs = Vec::new();
        for (name, value) in l.xattrs {
            if erofs::format::split_xattr_name(&name).is_none() {
                let name = String::from_utf8_lossy(&name).into_owned();
                self.layer.stats.skipped_xattrs.push(name);
            } else {
                xattrs.push((name, value));
            }
        }
        let mut node = Node {
            kind: Kind::Fifo,
            perm: ty.perm(h.mode).map_err(bad)?,
            uid: id("uid", l.uid, h.uid).map_err(bad)?,
            gid: id("gid", l.gid, h.gid).map_err(bad)?,
            mtime,
            mtime_nsec,
            size: 0,
            xattrs,
        };
        let parts = components(&path).map_err(bad)?;
        let Some((name, parents)) = parts.split_last() else {
            if ty != EntryType::Dir {
                return Err(bad(format!("the root is given as {}", ty.name())));
            }
            self.layer.set_root(node);
            return Ok(());
        };
        if ty != EntryType::Dir && names_a_directory(&path) {
            return Err(bad(format!(
                "{} named {:?}: a path ending in \"/\" or \"/.\" names a directory (GNU tar makes one of a file so named, or drops the slash, or fails; Go's archive/tar and Python's tarfile keep the name)",
                ty.name(),
                String::from_utf8_lossy(&path)
            )));
        }
        if let Some(marker) = Marker::of(name).map_err(bad)? {
            if ty == EntryType::Dir {
                // Its entries would then have to be something.
                return Err(bad("a whiteout that is a directory".into()));
            }
            if parents.is_empty() && marker == Marker::Opaque {
                // Kernel overlayfs ignores an opaque root; containerd would delete
                // everything the layers below have.
                return Err(bad(".wh..wh..opq at the top of the layer".into()));
            }
            self.stream.data(size, None, first, "this entry's data")?;
            let parent = self.layer.dir(parents).map_err(bad)?;
            match marker {
                Marker::Opaque => self.layer.opaque(parent),
                Marker::Whiteout(hidden) => self.layer.whiteout(parent, hidden, node),
            }
            return Ok(());
        }
        let parent = self.layer.dir(parents).map_err(bad)?;
        node.kind = match ty {
            EntryType::Regular => {
                let start = self.spill_len;
                let out = &mut &*self.spill;
                self.stream
                    .data(size, Some(out), first, "this entry's data")?;
                self.spill_len += size;
                self.layer.stats.bytes += size;
                node.size = size;
                Kind::Regular {
                    content: Content::Span {
                        file: self.spill.clone(),
                        offset: start,
                    },
                    extents: None,
                }
            }
            EntryType::Dir => Kind::Directory {
                children: Vec::new(),
            },
            EntryType::Symlink => {
                if link.is_empty() || link.len() > pax::PATH_MAX {
                    return Err(bad("symlink target is empty or too long".into()));
                }
                // Linux symlinks are 0777 whatever the header says (there is no lchmod).
                node.perm = 0o777;
                node.size = link.len() as u64;
                Kind::Symlink { target: link }
            }
            EntryType::Link => {
                let target = components(&link).map_err(bad)?;
                if !target.is_empty() && names_a_directory(&link) {
                    return Err(bad(format!(
                        "a hardlink to {:?}: a target ending in \"/\" or \"/.\" names a directory (GNU tar fails on it, containerd drops the slash)",
                        String::from_utf8_lossy(&link)
                    )));
                }
                return self.layer.link(parent, name.clone(), &target).map_err(bad);
            }
            EntryType::Char | EntryType::Block => {
                let (major, minor) = device(h.devmajor, h.devminor).map_err(bad)?;
                if ty == EntryType::Char {
                    Kind::CharDevice { major, minor }
                } else {
                    Kind::BlockDevice { major, minor }
                }
            }
            EntryType::Fifo => Kind::Fifo,
        };
        self.layer.add(parent, name.clone(), node).map_err(bad)
    }
}

/// A name that is no file but a deletion (OCI whiteouts).
#[derive(Debug, PartialEq, Eq)]
enum Marker {
    /// `.wh..wh..opq`: nothing of the directory below shows through.
    Opaque,
    /// `.wh.NAME`: NAME below is deleted.
    Whiteout(Vec<u8>),
}

impl Marker {
    fn of(name: &[u8]) -> Result<Option<Marker>, String> {
        if name == TAR_OPAQUE_MARKER {
            return Ok(Some(Marker::Opaque));
        }
        let Some(hidden) = name.strip_prefix(TAR_WHITEOUT_PREFIX) else {
            return Ok(None);
        };
        if hidden.starts_with(TAR_WHITEOUT_PREFIX) {
            return Err("AUFS metadata (.wh..wh.*), which no OCI layer holds".into());
        }
        if matches!(hidden, b"" | b"." | b"..") {
            return Err("a whiteout that names no file".into());
        }
        Ok(Some(Marker::Whiteout(hidden.to_vec())))
    }
}

/// A path or link target from a PAX record, a GNU long name or the header, in that
/// order (POSIX and GNU tar put PAX first, Go's archive/tar the GNU name: both given and
/// different, the entry is refused).
fn overridden(
    pax_key: &str,
    pax: Option<Vec<u8>>,
    gnu_what: &str,
    gnu: Option<Vec<u8>>,
    header: Vec<u8>,
) -> Result<Vec<u8>, String> {
    match (pax, gnu) {
        (Some(p), Some(g)) if p != g => Err(format!(
            "PAX {pax_key} {:?} and {gnu_what} {:?} disagree",
            String::from_utf8_lossy(&p),
            String::from_utf8_lossy(&g)
        )),
        (Some(v), _) | (None, Some(v)) => Ok(v),
        (None, None) => Ok(header),
    }
}

/// A uid or gid: the PAX record's or the header's. Linux ids are 32 bits, and
/// 4294967295 is (uid_t)-1, "no id", which chown(2) takes as "leave unchanged".
fn id(what: &str, pax: Option<u64>, header: i64) -> Result<u32, String> {
    if pax.is_some() && !(0..=i64::from(u32::MAX)).contains(&header) {
        return Err(format!(
            "the header's {what} {header} is beyond uid_t, which GNU tar fails on even under a PAX {what}"
        ));
    }
    let v = match pax {
        Some(v) => i128::from(v),
        None => i128::from(header),
    };
    u32::try_from(v)
        .ok()
        .filter(|&v| v != u32::MAX)
        .ok_or_else(|| format!("{what} {v} cannot be represented (Linux ids are 0 to 4294967294)"))
}

/// Device numbers as EROFS stores them (the kernel's new_encode_dev: 12-bit major,
/// 20-bit minor).
fn device(major: i64, minor: i64) -> Result<(u32, u32), String> {
    if !(0..=0xFFF).contains(&major) || !(0..=0xF_FFFF).contains(&minor) {
        return Err(format!(
            "device {major}:{minor} cannot be represented (major 0 to 4095, minor 0 to 1048575)"
        ));
    }
    Ok((major as u32, minor as u32))
}

/// Whether a path can only name a directory: it ends in "/" or "/." (or is "."). GNU
/// tar strips trailing slashes and makes a directory of a file so named; Go's
/// archive/tar and Python's tarfile keep the name as it is (and containerd cleans it).
fn names_a_directory(path: &[u8]) -> bool {
    matches!(path.rsplit(|&b| b == b'/').next(), Some(b"" | b"."))
}

/// The components of an archive path: empty and `.` parts dropped (so a leading `/`
/// too, as GNU tar and containerd take it); `..` refused.
fn components(raw: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    if raw.len() > pax::PATH_MAX {
        return Err(format!(
            "a path of {} bytes (at most {}: PATH_MAX)",
            raw.len(),
            pax::PATH_MAX
        ));
    }
    let mut out = Vec::new();
    for c in raw.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err("path climbs out with \"..\"".into()),
            c if c.len() > erofs::format::NAME_LEN || c.contains(&0) => {
                return Err("path has an invalid name (over 255 bytes, or a NUL byte)".into())
            }
            c => out.push(c.to_vec()),
        }
    }
    Ok(out)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EntryType {
    Regular,
    Link,
    Symlink,
    Char,
    Block,
    Dir,
    Fifo,
}

impl EntryType {
    /// The type of an entry (not an extension header), from its typeflag.
    /// `name_field_ends_in_slash` is whether the header's own name field does, and
    /// `after_extension` whether an extension header came just before.
    fn of(
        typeflag: u8,
        path: &[u8],
        name_field_ends_in_slash: bool,
        after_extension: bool,
    ) -> Result<Self, String> {
        Ok(match typeflag {
            0 => Self::v7_file(path, name_field_ends_in_slash, after_extension)?,
            b'0' => EntryType::Regular,
            b'1' => EntryType::Link,
            b'2' => EntryType::Symlink,
            b'3' => EntryType::Char,
            b'4' => EntryType::Block,
            b'5' => EntryType::Dir,
            b'6' => EntryType::Fifo,
            b'7' => {
                return Err(
                    "typeflag '7' (a contiguous file): GNU tar and Python's tarfile extract a file, containerd and Docker refuse it".into(),
                )
            }
            b'S' => return Err("sparse entries (tar -S) are not supported".into()),
            t => {
                return Err(format!(
                    "unsupported entry type {:?}",
                    (t as char).escape_default().to_string()
                ))
            }
        })
    }

    /// V7's typeflag NUL: a file, or a directory when its name ends in '/'. GNU tar and
    /// Go's archive/tar look at the whole path (a long name's, a PAX path's, the prefix
    /// joined); Python's tarfile at the header's name field alone, and newer ones not at
    /// all after an extension header. Where they could differ, the entry is refused.
    fn v7_file(
        path: &[u8],
        name_field_ends_in_slash: bool,
        after_extension: bool,
    ) -> Result<Self, String> {
        let slash = path.ends_with(b"/");
        if slash != name_field_ends_in_slash || (slash && after_extension) {
            return Err(format!(
                "typeflag NUL with a trailing slash in {:?} where GNU tar and Go's archive/tar (by the whole path) and Python's tarfile (by the header's name field, and not after an extension header) would not all make a directory",
                String::from_utf8_lossy(path)
            ));
        }
        Ok(if slash {
            EntryType::Dir
        } else {
            EntryType::Regular
        })
    }

    fn name(self) -> &'static str {
        match self {
            EntryType::Regular => "a file",
            EntryType::Link => "a hardlink",
            EntryType::Symlink => "a symlink",
            EntryType::Char => "a character device",
            EntryType::Block => "a block device",
            EntryType::Dir => "a directory",
            EntryType::Fifo => "a FIFO",
        }
    }

    /// The permission bits of a header's mode. Old writers (Go before 1.10, so old
    /// Docker layers) put the file type in the mode too; a type there must be the
    /// entry's (a hardlink's is its target's), and nothing may lie beyond it.
    fn perm(self, mode: i64) -> Result<u16, String> {
        use erofs::format::*;
        if !(0..=0o177777).contains(&mode) {
            return Err(format!(
                "mode {mode:o} has bits beyond a file type and 07777"
            ));
        }
        let fmt = mode as u16 & S_IFMT;
        let expected = match self {
            EntryType::Regular => S_IFREG,
            EntryType::Dir => S_IFDIR,
            EntryType::Symlink => S_IFLNK,
            EntryType::Char => S_IFCHR,
            EntryType::Block => S_IFBLK,
            EntryType::Fifo => S_IFIFO,
            EntryType::Link => fmt,
        };
        let known = [
            0, S_IFREG, S_IFDIR, S_IFLNK, S_IFCHR, S_IFBLK, S_IFIFO, S_IFSOCK,
        ];
        if fmt != 0 && (fmt != expected || !known.contains(&fmt)) {
            return Err(format!(
                "mode {mode:o} says another file type than the entry's ({})",
                self.name()
            ));
        }
        Ok(mode as u16 & 0o7777)
    }
}

/// Reads the layer at `path` (tar, .tar.gz or .tar.zst, told apart by content) into a
/// tree, copying file contents into an unlinked file in `spill_dir`. `progress` is called
/// with the number of entries read, every 1024 entries.
pub fn read_layer(
    path: &Path,
    spill_dir: &Path,
    max: u64,
    progress: &dyn Fn(u64),
) -> Result<(Tree, Stats), Error> {
    let name = path.display().to_string();
    let file = verity::source::open_input(path, false).map_err(|err| Error::Io {
        path: name.clone(),
        err,
    })?;
    read_from(file, &name, spill_dir, max, progress)
}

/// [`read_layer`] from any reader; `name` is what errors call it. An uncompressed tar of
/// more than `max` bytes is an error.
pub fn read_from<R: Read>(
    input: R,
    name: &str,
    spill_dir: &Path,
    max: u64,
    progress: &dyn Fn(u64),
) -> Result<(Tree, Stats), Error> {
    let ioerr = |err| Error::Io {
        path: name.to_string(),
        err,
    };
    // The magic is read whole first: a reader may hand over fewer bytes at a time.
    let mut input = input;
    let mut head = [0u8; 4];
    let mut got = 0;
    while got < head.len() {
        match input.read(&mut head[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ioerr(e)),
        }
    }
    let kind = detect(&head[..got]);
    let input = BufReader::with_capacity(
        1 << 16,
        std::io::Cursor::new(head).take(got as u64).chain(input),
    );
    let (input, source): (Box<dyn Read + '_>, _) = match kind {
        Compression::None => (Box::new(input), "the tar"),
        Compression::Gzip => (
            Box::new(flate2::bufread::MultiGzDecoder::new(input)),
            "the gzip stream",
        ),
        Compression::Zstd => (
            Box::new(zstd::Decoder::with_buffer(input).map_err(ioerr)?),
            "the zstd stream",
        ),
    };
    let hashing = Hashing {
        inner: input,
        hash: sha2::Sha256::default(),
        bytes: 0,
        max,
    };
    let stream = Stream::new(hashing, source);
    let spill = tempfile::tempfile_in(spill_dir).map_err(|err| Error::Io {
        path: spill_dir.display().to_string(),
        err,
    })?;
    let mut r = Reader {
        stream,
        layer: Layer::new(),
        spill: Arc::new(spill),
        spill_len: 0,
        progress,
    };
    r.read_all().map_err(|f| f.named(name))?;
    let mut stats = r.layer.stats.clone();
    // read_all reads to the end of the stream (zeros after the marker included).
    let hashing = r.stream.into_inner();
    use sha2::Digest as _;
    stats.diff_id = format!("sha256:{:x}", hashing.hash.finalize());
    stats.tar_bytes = hashing.bytes;
    Ok((r.layer.into_tree(), stats))
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};

    /// Hands over one byte per read, as a pipe may.
    struct Trickle(std::io::Cursor<Vec<u8>>);

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(1);
            self.0.read(&mut buf[..n])
        }
    }

    #[test]
    fn a_compressed_layer_handed_over_a_byte_at_a_time_is_read_as_compressed() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("f"), b"hello").unwrap();
        let tar = std::process::Command::new("tar")
            .args(["--format=gnu", "-cf", "-", "-C"])
            .arg(t.path())
            .arg("f")
            .output()
            .unwrap();
        assert!(tar.status.success());
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar.stdout).unwrap();
        let gz = gz.finish().unwrap();
        let read = super::read_from(
            Trickle(std::io::Cursor::new(gz)),
            "layer.tar.gz",
            t.path(),
            1 << 20,
            &|_| {},
        );
        let (_, stats) = read.unwrap();
        assert_eq!(stats.tar_bytes, tar.stdout.len() as u64);
    }
}
