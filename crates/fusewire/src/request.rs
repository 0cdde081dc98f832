//! Decoding one request: the transport hands over the in header, the first (fixed)
//! argument and the rest of the body ([`Raw`]); [`decode`] checks every length against the
//! header's and returns a typed [`Request`] borrowing names and data from the buffer.

use crate::abi::{self, fattr, op, InHeader};
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use zerocopy::FromBytes;

/// A request as a transport received it, before decoding.
#[derive(Clone, Copy, Debug)]
pub struct Raw<'a> {
    pub header: InHeader,
    /// The first argument, exactly as long as the kernel sent it.
    pub op_in: &'a [u8],
    /// The rest of the arguments (names, values, data), extension headers removed.
    pub payload: &'a [u8],
}

/// Why a buffer is not a request this crate serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Fewer bytes than the header (or an argument) needs.
    Truncated {
        what: &'static str,
        need: usize,
        have: usize,
    },
    /// The header's length disagrees with what the transport received.
    Length { header: u32, received: usize },
    /// Bytes left after the last argument.
    Trailing { opcode: u32, extra: usize },
    /// A name without its terminating NUL, or an empty one.
    BadName { opcode: u32 },
    /// An argument whose value the kernel never sends (a time's nanoseconds >= 1 s, ...).
    BadValue { opcode: u32, what: &'static str },
    /// An opcode this crate does not decode (answered with ENOSYS).
    Unsupported { opcode: u32 },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated { what, need, have } => {
                write!(f, "{what}: {have} bytes where {need} are needed")
            }
            DecodeError::Length { header, received } => {
                write!(f, "header says {header} bytes, {received} received")
            }
            DecodeError::Trailing { opcode, extra } => {
                write!(
                    f,
                    "{}: {extra} bytes after the last argument",
                    abi::op_name(*opcode)
                )
            }
            DecodeError::BadName { opcode } => {
                write!(f, "{}: a name without its NUL", abi::op_name(*opcode))
            }
            DecodeError::BadValue { opcode, what } => {
                write!(f, "{}: impossible {what}", abi::op_name(*opcode))
            }
            DecodeError::Unsupported { opcode } => write!(f, "opcode {opcode} is not served"),
        }
    }
}

impl std::error::Error for DecodeError {}

impl DecodeError {
    /// The errno the kernel gets for a request that cannot be decoded.
    pub fn errno(&self) -> i32 {
        match self {
            DecodeError::Unsupported { .. } => libc::ENOSYS,
            _ => libc::EIO,
        }
    }
}

const IN_HEADER: usize = std::mem::size_of::<InHeader>();

/// Splits what one read(2) of /dev/fuse returned.
pub fn split_dev(buf: &[u8], setxattr_ext: bool) -> Result<Raw<'_>, DecodeError> {
    let (header, body) = InHeader::read_from_prefix(buf).map_err(|_| DecodeError::Truncated {
        what: "in header",
        need: IN_HEADER,
        have: buf.len(),
    })?;
    if header.len as usize != buf.len() {
        return Err(DecodeError::Length {
            header: header.len,
            received: buf.len(),
        });
    }
    let args = strip_extensions(&header, body)?;
    let first = abi::first_arg_size(header.opcode, setxattr_ext);
    if args.len() < first {
        return Err(DecodeError::Truncated {
            what: "first argument",
            need: first,
            have: args.len(),
        });
    }
    let (op_in, payload) = args.split_at(first);
    Ok(Raw {
        header,
        op_in,
        payload,
    })
}

/// Splits a ring entry: the header area and the payload buffer (of which the kernel used
/// `ring_ent_in_out.payload_sz` bytes).
pub fn split_uring<'a>(
    hdr: &'a abi::UringReqHeader,
    payload: &'a [u8],
) -> Result<Raw<'a>, DecodeError> {
    let (header, _) =
        InHeader::read_from_prefix(&hdr.in_out[..]).map_err(|_| DecodeError::Truncated {
            what: "in header",
            need: IN_HEADER,
            have: 0,
        })?;
    let used = hdr.ring_ent_in_out.payload_sz as usize;
    if used > payload.len() {
        return Err(DecodeError::Length {
            header: header.len,
            received: payload.len(),
        });
    }
    // The header's length counts the in header, the first argument and the payload.
    let op_in_len = (header.len as usize)
        .checked_sub(IN_HEADER + used)
        .filter(|&n| n <= abi::URING_OP_IN_OUT_SZ)
        .ok_or(DecodeError::Length {
            header: header.len,
            received: IN_HEADER + used,
        })?;
    let payload = strip_extensions(&header, &payload[..used])?;
    Ok(Raw {
        header,
        op_in: &hdr.op_in[..op_in_len],
        payload,
    })
}

/// The arguments without the extension headers the kernel appends (security context,
/// supplementary group; only sent when negotiated, and ignored here).
fn strip_extensions<'a>(header: &InHeader, args: &'a [u8]) -> Result<&'a [u8], DecodeError> {
    let ext = header.total_extlen as usize * 8;
    let keep = args.len().checked_sub(ext).ok_or(DecodeError::Truncated {
        what: "extension headers",
        need: ext,
        have: args.len(),
    })?;
    Ok(&args[..keep])
}

/// Who sent a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

/// A time a SETATTR sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetTime {
    Now,
    At(SystemTime),
}

/// The changes of a SETATTR (`None` stays as it is).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    pub ctime: Option<SystemTime>,
    /// The handle the change came through.
    pub fh: Option<u64>,
    pub lock_owner: Option<u64>,
    /// With HANDLE_KILLPRIV_V2: the caller lacks CAP_FSETID, drop setuid/setgid.
    pub kill_suidgid: bool,
}

/// One decoded request. Inode numbers are the kernel's node ids (1 is the root).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    Init {
        major: u32,
        minor: u32,
        max_readahead: u32,
        flags: u64,
    },
    Destroy,
    Lookup {
        parent: u64,
        name: &'a [u8],
    },
    Forget {
        ino: u64,
        nlookup: u64,
    },
    /// (node id, nlookup) pairs, 16 bytes each: read them with [`Request::forgets`].
    BatchForget {
        entries: &'a [u8],
    },
    Interrupt {
        unique: u64,
    },
    GetAttr {
        ino: u64,
        fh: Option<u64>,
    },
    SetAttr {
        ino: u64,
        set: SetAttr,
    },
    ReadLink {
        ino: u64,
    },
    Symlink {
        parent: u64,
        name: &'a [u8],
        target: &'a [u8],
    },
    MkNod {
        parent: u64,
        name: &'a [u8],
        mode: u32,
        rdev: u32,
        umask: u32,
    },
    MkDir {
        parent: u64,
        name: &'a [u8],
        mode: u32,
        umask: u32,
    },
    Unlink {
        parent: u64,
        name: &'a [u8],
    },
    RmDir {
        parent: u64,
        name: &'a [u8],
    },
    /// RENAME (flags 0) and RENAME2.
    Rename {
        parent: u64,
        name: &'a [u8],
        new_parent: u64,
        new_name: &'a [u8],
        flags: u32,
    },
    Link {
        ino: u64,
        new_parent: u64,
        new_name: &'a [u8],
    },
    Open {
        ino: u64,
        flags: i32,
        kill_suidgid: bool,
    },
    Create {
        parent: u64,
        name: &'a [u8],
        mode: u32,
        umask: u32,
        flags: i32,
        kill_suidgid: bool,
    },
    Read {
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
        flags: i32,
        lock_owner: Option<u64>,
    },
    Write {
        ino: u64,
        fh: u64,
        offset: u64,
        data: &'a [u8],
        flags: i32,
        write_flags: u32,
        lock_owner: Option<u64>,
    },
    Flush {
        ino: u64,
        fh: u64,
        lock_owner: u64,
    },
    Release {
        ino: u64,
        fh: u64,
        flags: i32,
        release_flags: u32,
        lock_owner: u64,
    },
    Fsync {
        ino: u64,
        fh: u64,
        datasync: bool,
    },
    Fallocate {
        ino: u64,
        fh: u64,
        offset: u64,
        length: u64,
        mode: i32,
    },
    Lseek {
        ino: u64,
        fh: u64,
        offset: u64,
        whence: u32,
    },
    OpenDir {
        ino: u64,
        flags: i32,
    },
    ReadDir {
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
    },
    ReadDirPlus {
        ino: u64,
        fh: u64,
        offset: u64,
        size: u32,
    },
    ReleaseDir {
        ino: u64,
        fh: u64,
        flags: i32,
    },
    FsyncDir {
        ino: u64,
        fh: u64,
        datasync: bool,
    },
    StatFs {
        ino: u64,
    },
    Access {
        ino: u64,
        mask: u32,
    },
    SetXattr {
        ino: u64,
        name: &'a [u8],
        value: &'a [u8],
        flags: i32,
        setxattr_flags: u32,
    },
    GetXattr {
        ino: u64,
        name: &'a [u8],
        size: u32,
    },
    ListXattr {
        ino: u64,
        size: u32,
    },
    RemoveXattr {
        ino: u64,
        name: &'a [u8],
    },
}

impl<'a> Request<'a> {
    /// The (node id, nlookup) pairs of a FORGET or BATCH_FORGET.
    pub fn forgets(&self) -> impl Iterator<Item = (u64, u64)> + 'a {
        let (one, batch): (Option<(u64, u64)>, &'a [u8]) = match *self {
            Request::Forget { ino, nlookup } => (Some((ino, nlookup)), &[]),
            Request::BatchForget { entries } => (None, entries),
            _ => (None, &[]),
        };
        let batch = <[abi::ForgetOne]>::ref_from_bytes(batch).unwrap_or(&[]);
        one.into_iter()
            .chain(batch.iter().map(|f| (f.nodeid, f.nlookup)))
    }

    /// Whether the kernel waits for a reply (FORGET, BATCH_FORGET and INTERRUPT get none).
    pub fn wants_reply(&self) -> bool {
        !matches!(
            self,
            Request::Forget { .. } | Request::BatchForget { .. } | Request::Interrupt { .. }
        )
    }

    /// The most bytes the reply's body may hold, when the request says (READ, the
    /// listings, GETXATTR/LISTXATTR with a size).
    pub fn reply_limit(&self) -> Option<usize> {
        match *self {
            Request::Read { size, .. }
            | Request::ReadDir { size, .. }
            | Request::ReadDirPlus { size, .. } => Some(size as usize),
            Request::GetXattr { size, .. } | Request::ListXattr { size, .. } if size > 0 => {
                Some(size as usize)
            }
            _ => None,
        }
    }
}

/// Reads arguments off the front of the payload, every length checked.
struct Args<'a> {
    opcode: u32,
    rest: &'a [u8],
}

impl<'a> Args<'a> {
    /// A NUL-terminated, non-empty name.
    fn name(&mut self) -> Result<&'a [u8], DecodeError> {
        let bad = DecodeError::BadName {
            opcode: self.opcode,
        };
        let end = self.rest.iter().position(|&b| b == 0).ok_or(bad.clone())?;
        if end == 0 {
            return Err(bad);
        }
        let (name, rest) = self.rest.split_at(end);
        self.rest = &rest[1..];
        Ok(name)
    }

    /// Exactly `len` bytes.
    fn bytes(&mut self, len: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.rest.len() < len {
            return Err(DecodeError::Truncated {
                what,
                need: len,
                have: self.rest.len(),
            });
        }
        let (b, rest) = self.rest.split_at(len);
        self.rest = rest;
        Ok(b)
    }

    /// Nothing may follow the last argument.
    fn end(self) -> Result<(), DecodeError> {
        match self.rest.len() {
            0 => Ok(()),
            extra => Err(DecodeError::Trailing {
                opcode: self.opcode,
                extra,
            }),
        }
    }
}

/// The first argument as `T`, exactly its size.
fn first<T: FromBytes>(raw: &Raw<'_>) -> Result<T, DecodeError> {
    let (need, have) = (std::mem::size_of::<T>(), raw.op_in.len());
    T::read_from_bytes(raw.op_in).map_err(|_| DecodeError::Truncated {
        what: abi::op_name(raw.header.opcode),
        need,
        have,
    })
}

/// SETXATTR's first argument: 16 bytes with SETXATTR_EXT, else the 8-byte compat form.
fn setxattr_in(raw: &Raw<'_>) -> Result<abi::SetxattrIn, DecodeError> {
    if raw.op_in.len() != abi::COMPAT_SETXATTR_IN_SIZE {
        return first(raw);
    }
    let [size, flags] = first::<[u32; 2]>(raw)?;
    Ok(abi::SetxattrIn {
        size,
        flags,
        ..Default::default()
    })
}

fn time(opcode: u32, secs: u64, nsecs: u32) -> Result<SystemTime, DecodeError> {
    if nsecs >= 1_000_000_000 {
        return Err(DecodeError::BadValue {
            opcode,
            what: "nanoseconds",
        });
    }
    // The kernel sends time64_t seconds as a u64: times before 1970 come as negatives.
    let secs = secs as i64;
    let d = Duration::new(secs.unsigned_abs(), 0);
    let t = if secs >= 0 {
        UNIX_EPOCH.checked_add(d)
    } else {
        UNIX_EPOCH.checked_sub(d)
    };
    t.and_then(|t| t.checked_add(Duration::from_nanos(nsecs as u64)))
        .ok_or(DecodeError::BadValue {
            opcode,
            what: "time",
        })
}

fn set_attr(opcode: u32, s: &abi::SetattrIn) -> Result<SetAttr, DecodeError> {
    let has = |bit: u32| s.valid & bit != 0;
    let set_time =
        |now: u32, at: u32, secs: u64, nsecs: u32| -> Result<Option<SetTime>, DecodeError> {
            Ok(if has(now) {
                Some(SetTime::Now)
            } else if has(at) {
                Some(SetTime::At(time(opcode, secs, nsecs)?))
            } else {
                None
            })
        };
    Ok(SetAttr {
        mode: has(fattr::MODE).then_some(s.mode),
        uid: has(fattr::UID).then_some(s.uid),
        gid: has(fattr::GID).then_some(s.gid),
        size: has(fattr::SIZE).then_some(s.size),
        atime: set_time(fattr::ATIME_NOW, fattr::ATIME, s.atime, s.atimensec)?,
        mtime: set_time(fattr::MTIME_NOW, fattr::MTIME, s.mtime, s.mtimensec)?,
        ctime: if has(fattr::CTIME) {
            Some(time(opcode, s.ctime, s.ctimensec)?)
        } else {
            None
        },
        fh: has(fattr::FH).then_some(s.fh),
        lock_owner: has(fattr::LOCKOWNER).then_some(s.lock_owner),
        kill_suidgid: has(fattr::KILL_SUIDGID),
    })
}

/// Decodes a request; every argument is checked against the lengths the kernel sent.
pub fn decode<'a>(raw: &Raw<'a>) -> Result<Request<'a>, DecodeError> {
    let h = &raw.header;
    let (opcode, ino) = (h.opcode, h.nodeid);
    let mut args = Args {
        opcode,
        rest: raw.payload,
    };
    let req = match opcode {
        op::INIT => {
            let i: abi::InitIn = first(raw)?;
            let flags = i.flags as u64 | (i.flags2 as u64) << 32;
            Request::Init {
                major: i.major,
                minor: i.minor,
                max_readahead: i.max_readahead,
                flags,
            }
        }
        op::DESTROY => Request::Destroy,
        op::LOOKUP => Request::Lookup {
            parent: ino,
            name: args.name()?,
        },
        op::FORGET => {
            let f: abi::ForgetIn = first(raw)?;
            Request::Forget {
                ino,
                nlookup: f.nlookup,
            }
        }
        op::BATCH_FORGET => {
            let b: abi::BatchForgetIn = first(raw)?;
            let len = (b.count as usize).checked_mul(std::mem::size_of::<abi::ForgetOne>());
            let len = len.ok_or(DecodeError::BadValue {
                opcode,
                what: "count",
            })?;
            Request::BatchForget {
                entries: args.bytes(len, "forget list")?,
            }
        }
        op::INTERRUPT => Request::Interrupt {
            unique: first::<abi::InterruptIn>(raw)?.unique,
        },
        op::GETATTR => {
            let g: abi::GetattrIn = first(raw)?;
            Request::GetAttr {
                ino,
                fh: (g.getattr_flags & abi::GETATTR_FH != 0).then_some(g.fh),
            }
        }
        op::SETATTR => Request::SetAttr {
            ino,
            set: set_attr(opcode, &first(raw)?)?,
        },
        op::READLINK => Request::ReadLink { ino },
        op::SYMLINK => Request::Symlink {
            parent: ino,
            name: args.name()?,
            target: args.name()?,
        },
        op::MKNOD => {
            let m: abi::MknodIn = first(raw)?;
            let name = args.name()?;
            Request::MkNod {
                parent: ino,
                name,
                mode: m.mode,
                rdev: m.rdev,
                umask: m.umask,
            }
        }
        op::MKDIR => {
            let m: abi::MkdirIn = first(raw)?;
            Request::MkDir {
                parent: ino,
                name: args.name()?,
                mode: m.mode,
                umask: m.umask,
            }
        }
        op::UNLINK => Request::Unlink {
            parent: ino,
            name: args.name()?,
        },
        op::RMDIR => Request::RmDir {
            parent: ino,
            name: args.name()?,
        },
        op::RENAME | op::RENAME2 => {
            let (new_parent, flags) = if opcode == op::RENAME {
                (first::<abi::RenameIn>(raw)?.newdir, 0)
            } else {
                let r: abi::Rename2In = first(raw)?;
                (r.newdir, r.flags)
            };
            let name = args.name()?;
            let new_name = args.name()?;
            Request::Rename {
                parent: ino,
                name,
                new_parent,
                new_name,
                flags,
            }
        }
        op::LINK => {
            let l: abi::LinkIn = first(raw)?;
            Request::Link {
                ino: l.oldnodeid,
                new_parent: ino,
                new_name: args.name()?,
            }
        }
        op::OPEN => {
            let o: abi::OpenIn = first(raw)?;
            let kill_suidgid = o.open_flags & abi::OPEN_KILL_SUIDGID != 0;
            Request::Open {
                ino,
                flags: o.flags as i32,
                kill_suidgid,
            }
        }
        op::CREATE => {
            let c: abi::CreateIn = first(raw)?;
            let name = args.name()?;
            let kill_suidgid = c.open_flags & abi::OPEN_KILL_SUIDGID != 0;
            let flags = c.flags as i32;
            Request::Create {
                parent: ino,
                name,
                mode: c.mode,
                umask: c.umask,
                flags,
                kill_suidgid,
            }
        }
        op::READ => {
            let r: abi::ReadIn = first(raw)?;
            let lock_owner = (r.read_flags & 2 != 0).then_some(r.lock_owner);
            let (fh, offset, size, flags) = (r.fh, r.offset, r.size, r.flags as i32);
            Request::Read {
                ino,
                fh,
                offset,
                size,
                flags,
                lock_owner,
            }
        }
        op::WRITE => {
            let w: abi::WriteIn = first(raw)?;
            let data = args.bytes(w.size as usize, "write data")?;
            let lock_owner = (w.write_flags & 2 != 0).then_some(w.lock_owner);
            let (fh, offset, flags, write_flags) = (w.fh, w.offset, w.flags as i32, w.write_flags);
            Request::Write {
                ino,
                fh,
                offset,
                data,
                flags,
                write_flags,
                lock_owner,
            }
        }
        op::FLUSH => {
            let f: abi::FlushIn = first(raw)?;
            Request::Flush {
                ino,
                fh: f.fh,
                lock_owner: f.lock_owner,
            }
        }
        op::RELEASE | op::RELEASEDIR => {
            let r: abi::ReleaseIn = first(raw)?;
            let (fh, flags) = (r.fh, r.flags as i32);
            if opcode == op::RELEASEDIR {
                Request::ReleaseDir { ino, fh, flags }
            } else {
                let (release_flags, lock_owner) = (r.release_flags, r.lock_owner);
                Request::Release {
                    ino,
                    fh,
                    flags,
                    release_flags,
                    lock_owner,
                }
            }
        }
        op::FSYNC | op::FSYNCDIR => {
            let f: abi::FsyncIn = first(raw)?;
            let (fh, datasync) = (f.fh, f.fsync_flags & abi::FSYNC_FDATASYNC != 0);
            if opcode == op::FSYNC {
                Request::Fsync { ino, fh, datasync }
            } else {
                Request::FsyncDir { ino, fh, datasync }
            }
        }
        op::FALLOCATE => {
            let f: abi::FallocateIn = first(raw)?;
            let (fh, offset, length, mode) = (f.fh, f.offset, f.length, f.mode as i32);
            Request::Fallocate {
                ino,
                fh,
                offset,
                length,
                mode,
            }
        }
        op::LSEEK => {
            let l: abi::LseekIn = first(raw)?;
            Request::Lseek {
                ino,
                fh: l.fh,
                offset: l.offset,
                whence: l.whence,
            }
        }
        op::OPENDIR => Request::OpenDir {
            ino,
            flags: first::<abi::OpenIn>(raw)?.flags as i32,
        },
        op::READDIR | op::READDIRPLUS => {
            let r: abi::ReadIn = first(raw)?;
            let (fh, offset, size) = (r.fh, r.offset, r.size);
            if opcode == op::READDIR {
                Request::ReadDir {
                    ino,
                    fh,
                    offset,
                    size,
                }
            } else {
                Request::ReadDirPlus {
                    ino,
                    fh,
                    offset,
                    size,
                }
            }
        }
        op::STATFS => Request::StatFs { ino },
        op::ACCESS => Request::Access {
            ino,
            mask: first::<abi::AccessIn>(raw)?.mask,
        },
        op::SETXATTR => {
            let s = setxattr_in(raw)?;
            let name = args.name()?;
            let value = args.bytes(s.size as usize, "xattr value")?;
            let (flags, setxattr_flags) = (s.flags as i32, s.setxattr_flags);
            Request::SetXattr {
                ino,
                name,
                value,
                flags,
                setxattr_flags,
            }
        }
        op::GETXATTR => {
            let g: abi::GetxattrIn = first(raw)?;
            Request::GetXattr {
                ino,
                name: args.name()?,
                size: g.size,
            }
        }
        op::LISTXATTR => Request::ListXattr {
            ino,
            size: first::<abi::GetxattrIn>(raw)?.size,
        },
        op::REMOVEXATTR => Request::RemoveXattr {
            ino,
            name: args.name()?,
        },
        _ => return Err(DecodeError::Unsupported { opcode }),
    };
    if opcode_without_first(opcode) && !raw.op_in.is_empty() {
        return Err(DecodeError::Trailing {
            opcode,
            extra: raw.op_in.len(),
        });
    }
    args.end()?;
    Ok(req)
}

/// Opcodes whose first argument is empty: any bytes there are not ours to ignore.
fn opcode_without_first(opcode: u32) -> bool {
    abi::first_arg_size(opcode, false) == 0
}
