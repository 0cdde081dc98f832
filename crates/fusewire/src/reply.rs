//! Typed replies, encoded straight into the transport's buffer. Every request that wants a
//! reply gets one [`Reply`]; each of its methods consumes it and sends exactly one answer,
//! and a `Reply` dropped unanswered answers EIO, so the kernel never waits forever.

use crate::abi::{self, Attr, EntryOut};
use std::time::Duration;
use zerocopy::{Immutable, IntoBytes};

/// Where a reply goes: the transport's buffer for the body, and the send.
pub trait Sink {
    /// The buffer the body is written into (a worker's buffer, or the ring entry's payload).
    fn body(&mut self) -> &mut [u8];
    /// Sends the answer: `error` is 0 or a positive errno, the body is `body()[..len]`.
    fn send(&mut self, unique: u64, error: i32, len: usize);
}

/// A name's entry: what LOOKUP, MKNOD, MKDIR, SYMLINK, LINK, CREATE and READDIRPLUS reply.
#[derive(Clone, Copy, Debug, Default)]
pub struct Entry {
    /// 0 for a negative entry (the name is absent, and the kernel may cache that).
    pub nodeid: u64,
    /// Generation: with `nodeid`, unique over the filesystem's life.
    pub generation: u64,
    /// The node's attributes.
    pub attr: Attr,
    /// How long the kernel may cache the name.
    pub entry_ttl: Duration,
    /// How long the kernel may cache the attributes.
    pub attr_ttl: Duration,
}

impl Entry {
    /// "No such name", cached by the kernel for `ttl`.
    pub fn negative(ttl: Duration) -> Entry {
        Entry {
            entry_ttl: ttl,
            ..Entry::default()
        }
    }

    fn out(&self) -> EntryOut {
        EntryOut {
            nodeid: self.nodeid,
            generation: self.generation,
            entry_valid: self.entry_ttl.as_secs(),
            attr_valid: self.attr_ttl.as_secs(),
            entry_valid_nsec: self.entry_ttl.subsec_nanos(),
            attr_valid_nsec: self.attr_ttl.subsec_nanos(),
            attr: self.attr,
        }
    }
}

/// An open file or directory: its handle, `abi::fopen` flags and, for passthrough, the
/// backing id [`crate::Channel::open_backing`] registered.
#[derive(Clone, Copy, Debug, Default)]
pub struct Open {
    /// The handle, sent back with each request on the open file.
    pub fh: u64,
    /// `abi::fopen` flags.
    pub flags: u32,
    /// The backing file, for passthrough.
    pub backing_id: Option<u32>,
}

impl Open {
    fn out(&self) -> abi::OpenOut {
        let (flags, backing_id) = match self.backing_id {
            Some(id) => (self.flags | abi::fopen::PASSTHROUGH, id as i32),
            None => (self.flags, 0),
        };
        abi::OpenOut {
            fh: self.fh,
            open_flags: flags,
            backing_id,
        }
    }
}

/// The dirent type of a mode (`DT_*` is the file type bits shifted down).
pub fn dirent_type(mode: u32) -> u32 {
    (mode & libc::S_IFMT) >> 12
}

/// The answer to one request.
pub struct Reply<'a> {
    unique: u64,
    /// The most body bytes the request allows (its size, or the buffer's).
    limit: usize,
    sink: Option<&'a mut dyn Sink>,
}

impl<'a> Reply<'a> {
    /// A reply to request `unique`, whose body may hold at most `limit` bytes (when the
    /// request says, see [`crate::Request::reply_limit`]).
    pub fn new(unique: u64, limit: Option<usize>, sink: &'a mut dyn Sink) -> Reply<'a> {
        let cap = sink.body().len();
        let limit = limit.map_or(cap, |l| l.min(cap));
        Reply {
            unique,
            limit,
            sink: Some(sink),
        }
    }

    /// The id of the request answered.
    pub fn unique(&self) -> u64 {
        self.unique
    }

    /// The most body bytes this reply may carry.
    pub fn limit(&self) -> usize {
        self.limit
    }

    fn send(mut self, error: i32, len: usize) {
        if let Some(sink) = self.sink.take() {
            sink.send(self.unique, error, len);
        }
    }

    /// Writes `f`'s bytes (at most `limit`) as the body and sends it; EIO if they do not fit.
    fn body_with(mut self, f: impl FnOnce(&mut [u8]) -> Result<usize, i32>) {
        let limit = self.limit;
        let Some(sink) = self.sink.as_mut() else {
            return;
        };
        let result = f(&mut sink.body()[..limit]);
        match result {
            Ok(n) if n <= limit => self.send(0, n),
            Ok(_) => self.send(libc::EIO, 0),
            Err(e) => self.send(e, 0),
        }
    }

    fn value<T: IntoBytes + Immutable>(self, value: &T) {
        self.bytes(value.as_bytes())
    }

    fn bytes(self, bytes: &[u8]) {
        self.body_with(|buf| {
            let dst = buf.get_mut(..bytes.len()).ok_or(libc::EIO)?;
            dst.copy_from_slice(bytes);
            Ok(bytes.len())
        })
    }

    /// A failure: `errno` is positive (ENOENT, ...).
    pub fn error(self, errno: i32) {
        self.send(errno, 0)
    }

    /// Success without a body (UNLINK, RELEASE, FLUSH, SETXATTR, ...).
    pub fn ok(self) {
        self.send(0, 0)
    }

    /// A LOOKUP's (or a create's) answer.
    pub fn entry(self, entry: &Entry) {
        self.value(&entry.out())
    }

    /// A GETATTR's or SETATTR's answer, cached for `ttl`.
    pub fn attr(self, attr: &Attr, ttl: Duration) {
        let out = abi::AttrOut {
            attr_valid: ttl.as_secs(),
            attr_valid_nsec: ttl.subsec_nanos(),
            dummy: 0,
            attr: *attr,
        };
        self.value(&out)
    }

    /// An OPEN's or OPENDIR's answer.
    pub fn opened(self, open: &Open) {
        self.value(&open.out())
    }

    /// CREATE: the new entry, then the open file.
    pub fn created(self, entry: &Entry, open: &Open) {
        let (e, o) = (entry.out(), open.out());
        self.body_with(|buf| {
            let (a, b) = (e.as_bytes(), o.as_bytes());
            let dst = buf.get_mut(..a.len() + b.len()).ok_or(libc::EIO)?;
            dst[..a.len()].copy_from_slice(a);
            dst[a.len()..].copy_from_slice(b);
            Ok(dst.len())
        })
    }

    /// READ, READLINK: the bytes (at most the request's size).
    pub fn data(self, data: &[u8]) {
        self.bytes(data)
    }

    /// READ straight into the transport's buffer: `fill` gets at most `limit` bytes of room
    /// and says how many it wrote, or an errno.
    pub fn data_with(self, fill: impl FnOnce(&mut [u8]) -> Result<usize, i32>) {
        self.body_with(fill)
    }

    /// GETXATTR / LISTXATTR: for a `requested` size of 0 the value's length, else the value
    /// itself, or ERANGE when it is longer than `requested`.
    pub fn xattr(self, requested: u32, value: &[u8]) {
        if requested == 0 {
            let Ok(size) = u32::try_from(value.len()) else {
                return self.error(libc::E2BIG);
            };
            return self.value(&abi::GetxattrOut { size, padding: 0 });
        }
        if value.len() > requested as usize {
            return self.error(libc::ERANGE);
        }
        self.bytes(value)
    }

    /// A STATFS's answer.
    pub fn statfs(self, st: &abi::Kstatfs) {
        self.value(st)
    }

    /// A WRITE's answer: `size` bytes written.
    pub fn written(self, size: u32) {
        self.value(&abi::WriteOut { size, padding: 0 })
    }

    /// An LSEEK's answer: the offset found.
    pub fn lseek(self, offset: u64) {
        self.value(&abi::LseekOut { offset })
    }

    /// A READDIR listing, filled entry by entry.
    pub fn dir(self) -> DirReply<'a> {
        DirReply {
            reply: self,
            plus: false,
            len: 0,
        }
    }

    /// A READDIRPLUS listing, filled entry by entry.
    pub fn dir_plus(self) -> DirReply<'a> {
        DirReply {
            reply: self,
            plus: true,
            len: 0,
        }
    }
}

impl Drop for Reply<'_> {
    fn drop(&mut self) {
        if let Some(sink) = self.sink.take() {
            sink.send(self.unique, libc::EIO, 0);
        }
    }
}

/// A directory listing being written: each entry is a `fuse_dirent` (after an `EntryOut`
/// for READDIRPLUS) followed by its name, padded to 8 bytes, as the kernel parses them.
pub struct DirReply<'a> {
    reply: Reply<'a>,
    plus: bool,
    len: usize,
}

/// One listed name: `next` is the offset the kernel passes to continue after it.
#[derive(Clone, Copy, Debug)]
pub struct DirEntry<'n> {
    /// Inode number.
    pub ino: u64,
    /// Offset of the next entry.
    pub next: u64,
    /// `DT_*`, see [`dirent_type`].
    pub typ: u32,
    /// The name.
    pub name: &'n [u8],
}

/// The size of one record: the fixed part and the name, rounded up to 8 bytes.
pub fn dirent_size(plus: bool, namelen: usize) -> usize {
    let fixed = std::mem::size_of::<abi::Dirent>()
        + if plus {
            std::mem::size_of::<EntryOut>()
        } else {
            0
        };
    (fixed + namelen).next_multiple_of(8)
}

impl DirReply<'_> {
    /// Adds a READDIR entry; false (and nothing added) when it does not fit.
    pub fn add(&mut self, e: &DirEntry<'_>) -> bool {
        debug_assert!(!self.plus, "a READDIRPLUS listing takes add_plus");
        self.push(e, None)
    }

    /// Adds a READDIRPLUS entry with its lookup result (nodeid 0 for "." and "..", which
    /// the kernel does not look up); false when it does not fit.
    pub fn add_plus(&mut self, e: &DirEntry<'_>, entry: &Entry) -> bool {
        debug_assert!(self.plus, "a READDIR listing takes add");
        self.push(e, Some(entry.out()))
    }

    fn push(&mut self, e: &DirEntry<'_>, entry: Option<EntryOut>) -> bool {
        let limit = self.reply.limit;
        let Some(sink) = self.reply.sink.as_mut() else {
            return false;
        };
        let Ok(namelen) = u32::try_from(e.name.len()) else {
            return false;
        };
        let size = dirent_size(entry.is_some(), e.name.len());
        let end = self.len + size;
        if e.name.is_empty() || end > limit {
            return false;
        }
        let rec = &mut sink.body()[self.len..end];
        rec.fill(0);
        let mut at = 0;
        if let Some(entry) = entry {
            rec[..128].copy_from_slice(entry.as_bytes());
            at = 128;
        }
        let d = abi::Dirent {
            ino: e.ino,
            off: e.next,
            namelen,
            typ: e.typ,
        };
        rec[at..at + 24].copy_from_slice(d.as_bytes());
        rec[at + 24..at + 24 + e.name.len()].copy_from_slice(e.name);
        self.len = end;
        true
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing was written yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sends the listing (empty: the end of the directory).
    pub fn finish(self) {
        let len = self.len;
        self.reply.send(0, len)
    }

    /// Sends an error instead (nothing of the listing).
    pub fn error(self, errno: i32) {
        self.reply.error(errno)
    }
}
