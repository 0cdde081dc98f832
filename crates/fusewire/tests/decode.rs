//! Decoding: every opcode fusewire serves, from /dev/fuse and from a ring entry, and every
//! truncated, oversized or lying buffer is an error, never a panic.

mod common;

use common::wire::{header, samples, setattr_in, Sample, NODE, UNIQUE};
use fusewire::abi::{self, op};
use fusewire::{decode, split_dev, split_uring, DecodeError, Request, SetAttr, SetTime};
use std::time::{Duration, UNIX_EPOCH};
use zerocopy::IntoBytes;

fn dev_decode(buf: &[u8]) -> Result<Request<'_>, DecodeError> {
    decode(&split_dev(buf, true)?)
}

fn sample(opcode: u32) -> Sample {
    samples()
        .into_iter()
        .find(|s| s.opcode == opcode)
        .expect("a sample")
}

#[test]
fn every_op_decodes_from_dev() {
    let check = |opcode: u32, want: Request<'_>| {
        let buf = sample(opcode).dev();
        assert_eq!(dev_decode(&buf), Ok(want), "{}", abi::op_name(opcode));
    };
    check(
        op::INIT,
        Request::Init {
            major: 7,
            minor: 45,
            max_readahead: 131072,
            flags: 1 | 1 << 41,
        },
    );
    check(op::DESTROY, Request::Destroy);
    check(
        op::LOOKUP,
        Request::Lookup {
            parent: NODE,
            name: b"name",
        },
    );
    check(
        op::FORGET,
        Request::Forget {
            ino: NODE,
            nlookup: 3,
        },
    );
    check(op::INTERRUPT, Request::Interrupt { unique: 40 });
    check(
        op::GETATTR,
        Request::GetAttr {
            ino: NODE,
            fh: Some(11),
        },
    );
    check(op::READLINK, Request::ReadLink { ino: NODE });
    check(
        op::SYMLINK,
        Request::Symlink {
            parent: NODE,
            name: b"ln",
            target: b"target/path",
        },
    );
    check(
        op::MKNOD,
        Request::MkNod {
            parent: NODE,
            name: b"fifo",
            mode: 0o10644,
            rdev: 0,
            umask: 0o22,
        },
    );
    check(
        op::MKDIR,
        Request::MkDir {
            parent: NODE,
            name: b"sub",
            mode: 0o755,
            umask: 0o22,
        },
    );
    check(
        op::UNLINK,
        Request::Unlink {
            parent: NODE,
            name: b"gone",
        },
    );
    check(
        op::RMDIR,
        Request::RmDir {
            parent: NODE,
            name: b"gonedir",
        },
    );
    let rename = |flags| Request::Rename {
        parent: NODE,
        name: b"old",
        new_parent: 8,
        new_name: b"new",
        flags,
    };
    check(op::RENAME, rename(0));
    check(op::RENAME2, rename(1));
    check(
        op::LINK,
        Request::Link {
            ino: 12,
            new_parent: NODE,
            new_name: b"hard",
        },
    );
    check(
        op::OPEN,
        Request::Open {
            ino: NODE,
            flags: libc::O_RDWR,
            kill_suidgid: true,
        },
    );
    let create = Request::Create {
        parent: NODE,
        name: b"new",
        mode: 0o100644,
        umask: 0o22,
        flags: libc::O_WRONLY,
        kill_suidgid: false,
    };
    check(op::CREATE, create);
    check(
        op::READ,
        Request::Read {
            ino: NODE,
            fh: 3,
            offset: 4096,
            size: 8192,
            flags: 0,
            lock_owner: None,
        },
    );
    let write = Request::Write {
        ino: NODE,
        fh: 3,
        offset: 10,
        data: b"hello",
        flags: 0,
        write_flags: abi::WRITE_KILL_SUIDGID,
        lock_owner: None,
    };
    check(op::WRITE, write);
    check(
        op::FLUSH,
        Request::Flush {
            ino: NODE,
            fh: 3,
            lock_owner: 77,
        },
    );
    check(
        op::RELEASE,
        Request::Release {
            ino: NODE,
            fh: 3,
            flags: 2,
            release_flags: 1,
            lock_owner: 77,
        },
    );
    check(
        op::FSYNC,
        Request::Fsync {
            ino: NODE,
            fh: 3,
            datasync: true,
        },
    );
    check(
        op::FALLOCATE,
        Request::Fallocate {
            ino: NODE,
            fh: 3,
            offset: 0,
            length: 100,
            mode: 1,
        },
    );
    check(
        op::LSEEK,
        Request::Lseek {
            ino: NODE,
            fh: 3,
            offset: 10,
            whence: 3,
        },
    );
    check(
        op::OPENDIR,
        Request::OpenDir {
            ino: NODE,
            flags: libc::O_DIRECTORY,
        },
    );
    check(
        op::READDIR,
        Request::ReadDir {
            ino: NODE,
            fh: 3,
            offset: 4096,
            size: 8192,
        },
    );
    check(
        op::READDIRPLUS,
        Request::ReadDirPlus {
            ino: NODE,
            fh: 3,
            offset: 4096,
            size: 8192,
        },
    );
    check(
        op::RELEASEDIR,
        Request::ReleaseDir {
            ino: NODE,
            fh: 4,
            flags: 0,
        },
    );
    check(
        op::FSYNCDIR,
        Request::FsyncDir {
            ino: NODE,
            fh: 4,
            datasync: false,
        },
    );
    check(op::STATFS, Request::StatFs { ino: NODE });
    check(op::ACCESS, Request::Access { ino: NODE, mask: 4 });
    check(
        op::SETXATTR,
        Request::SetXattr {
            ino: NODE,
            name: b"user.a",
            value: b"abc",
            flags: 1,
            setxattr_flags: 0,
        },
    );
    check(
        op::GETXATTR,
        Request::GetXattr {
            ino: NODE,
            name: b"user.a",
            size: 64,
        },
    );
    check(op::LISTXATTR, Request::ListXattr { ino: NODE, size: 0 });
    check(
        op::REMOVEXATTR,
        Request::RemoveXattr {
            ino: NODE,
            name: b"user.a",
        },
    );
}

#[test]
fn setattr_fields_follow_valid_bits() {
    let buf = sample(op::SETATTR).dev();
    let want = SetAttr {
        mode: Some(0o100640),
        size: Some(1234),
        atime: Some(SetTime::Now),
        mtime: Some(SetTime::At(UNIX_EPOCH + Duration::new(1_700_000_000, 5))),
        fh: Some(9),
        kill_suidgid: true,
        ..SetAttr::default()
    };
    assert_eq!(
        dev_decode(&buf),
        Ok(Request::SetAttr {
            ino: NODE,
            set: want
        })
    );
    // A time before 1970 travels as a negative time64_t.
    let mut s = setattr_in();
    s.mtime = (-10i64) as u64;
    let buf = Sample {
        opcode: op::SETATTR,
        op_in: s.as_bytes().to_vec(),
        payload: Vec::new(),
    }
    .dev();
    let Ok(Request::SetAttr { set, .. }) = dev_decode(&buf) else {
        panic!("setattr")
    };
    assert_eq!(
        set.mtime,
        Some(SetTime::At(
            UNIX_EPOCH - Duration::from_secs(10) + Duration::from_nanos(5)
        ))
    );
    s.mtimensec = 1_000_000_000;
    let buf = Sample {
        opcode: op::SETATTR,
        op_in: s.as_bytes().to_vec(),
        payload: Vec::new(),
    }
    .dev();
    assert!(matches!(
        dev_decode(&buf),
        Err(DecodeError::BadValue { .. })
    ));
}

#[test]
fn batch_forget_lists_every_pair() {
    let buf = sample(op::BATCH_FORGET).dev();
    let req = dev_decode(&buf).expect("batch forget");
    assert_eq!(req.forgets().collect::<Vec<_>>(), vec![(5, 2), (6, 1)]);
    assert!(!req.wants_reply());
    // A count larger than the list is truncation, not a read past the buffer.
    let mut s = sample(op::BATCH_FORGET);
    s.op_in = abi::BatchForgetIn {
        count: u32::MAX,
        dummy: 0,
    }
    .as_bytes()
    .to_vec();
    assert!(matches!(
        dev_decode(&s.dev()),
        Err(DecodeError::Truncated { .. })
    ));
}

/// Without SETXATTR_EXT the kernel sends the 8-byte compat argument.
#[test]
fn setxattr_compat_argument() {
    let s = Sample {
        opcode: op::SETXATTR,
        op_in: [3u32, 1].as_bytes().to_vec(),
        payload: b"user.a\0abc".to_vec(),
    };
    let buf = s.dev();
    let want = Request::SetXattr {
        ino: NODE,
        name: b"user.a",
        value: b"abc",
        flags: 1,
        setxattr_flags: 0,
    };
    assert_eq!(decode(&split_dev(&buf, false).unwrap()), Ok(want));
    // With SETXATTR_EXT negotiated, the same bytes are one short argument.
    assert!(decode(&split_dev(&buf, true).unwrap()).is_err());
}

#[test]
fn every_op_decodes_the_same_from_a_ring_entry() {
    for s in samples().into_iter().filter(|s| s.opcode != op::INIT) {
        let dev = s.dev();
        let (hdr, payload) = s.uring(8192);
        let raw = split_uring(&hdr, &payload).expect("split ring entry");
        assert_eq!(decode(&raw), dev_decode(&dev), "{}", abi::op_name(s.opcode));
    }
}

/// Every strict prefix of a request (with the header's length saying so) is an error.
#[test]
fn truncated_requests_are_errors() {
    for s in samples() {
        let full = s.dev();
        for cut in 0..full.len() {
            let mut buf = full[..cut].to_vec();
            if cut >= 40 {
                set_len(&mut buf, cut as u32);
            }
            assert_undecodable(&buf, s.opcode, &format!("cut to {cut} bytes"));
        }
    }
}

/// Sets the header's length field (its first four bytes).
fn set_len(buf: &mut [u8], len: u32) {
    buf[..4].copy_from_slice(&len.to_ne_bytes());
}

/// A request of `opcode` changed as `how` says does not decode.
fn assert_undecodable(buf: &[u8], opcode: u32, how: &str) {
    assert!(
        dev_decode(buf).is_err(),
        "{} {how} decoded",
        abi::op_name(opcode)
    );
}

#[test]
fn oversized_requests_are_errors() {
    for s in samples() {
        for extra in 1..=9 {
            let mut buf = s.dev();
            buf.extend(std::iter::repeat_n(b'x', extra));
            let len = buf.len() as u32;
            set_len(&mut buf, len);
            assert_undecodable(&buf, s.opcode, &format!("with {extra} extra bytes"));
        }
    }
}

#[test]
fn header_lengths_must_match_what_was_received() {
    let mut buf = sample(op::LOOKUP).dev();
    set_len(&mut buf, 1000);
    assert_eq!(
        split_dev(&buf, true).err(),
        Some(DecodeError::Length {
            header: 1000,
            received: buf.len()
        })
    );
    set_len(&mut buf, 10);
    assert!(split_dev(&buf, true).is_err());
    // Extension headers longer than the body.
    let mut buf = sample(op::LOOKUP).dev();
    buf[36..38].copy_from_slice(&100u16.to_ne_bytes());
    assert!(matches!(
        split_dev(&buf, true),
        Err(DecodeError::Truncated { .. })
    ));
}

#[test]
fn ring_entries_with_lying_lengths_are_errors() {
    let s = sample(op::GETXATTR);
    let (mut hdr, payload) = s.uring(64);
    hdr.ring_ent_in_out.payload_sz = 65;
    assert!(
        split_uring(&hdr, &payload).is_err(),
        "payload_sz past the buffer"
    );
    let (mut hdr, payload) = s.uring(64);
    hdr.in_out[..4].copy_from_slice(&(40u32 + 129 + 7).to_ne_bytes());
    assert!(
        split_uring(&hdr, &payload).is_err(),
        "a first argument longer than op_in"
    );
    hdr.in_out[..4].copy_from_slice(&10u32.to_ne_bytes());
    assert!(
        split_uring(&hdr, &payload).is_err(),
        "a header length shorter than the payload"
    );
}

#[test]
fn unknown_and_empty_names() {
    let buf = Sample {
        opcode: 4000,
        op_in: Vec::new(),
        payload: Vec::new(),
    }
    .dev();
    let e = dev_decode(&buf).unwrap_err();
    assert_eq!(e, DecodeError::Unsupported { opcode: 4000 });
    assert_eq!(e.errno(), libc::ENOSYS);
    let buf = Sample {
        opcode: op::LOOKUP,
        op_in: Vec::new(),
        payload: b"\0".to_vec(),
    }
    .dev();
    assert_eq!(
        dev_decode(&buf),
        Err(DecodeError::BadName { opcode: op::LOOKUP })
    );
    let buf = Sample {
        opcode: op::READLINK,
        op_in: vec![0; 8],
        payload: Vec::new(),
    }
    .dev();
    assert!(dev_decode(&buf).is_err(), "bytes where READLINK has none");
    let h = header(op::STATFS, 40);
    assert_eq!(dev_decode(h.as_bytes()), Ok(Request::StatFs { ino: NODE }));
    assert_eq!(h.unique, UNIQUE);
}
