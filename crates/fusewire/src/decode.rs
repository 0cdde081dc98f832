//! Decoding a [`Raw`] request into a typed [`Request`]: every argument checked against the
//! lengths the kernel sent, names NUL-terminated, nothing left over.

use crate::abi::{self, fattr, op};
use crate::request::{Request, SetAttr, SetTime};
use crate::split::{DecodeError, Raw};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use zerocopy::FromBytes;

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
