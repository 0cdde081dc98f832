//! Requests as the kernel writes them, for the decoding tests and the fuzz seeds: one valid
//! sample of every opcode fusewire decodes.

use fusewire::abi::{self, op, InHeader};
use zerocopy::IntoBytes;

pub const UNIQUE: u64 = 42;
pub const NODE: u64 = 7;

/// One request: its opcode, first argument and the rest of its body.
#[derive(Clone, Debug)]
pub struct Sample {
    pub opcode: u32,
    pub op_in: Vec<u8>,
    pub payload: Vec<u8>,
}

pub fn header(opcode: u32, len: usize) -> InHeader {
    InHeader {
        len: len as u32,
        opcode,
        unique: UNIQUE,
        nodeid: NODE,
        uid: 1000,
        gid: 100,
        pid: 4321,
        ..Default::default()
    }
}

impl Sample {
    fn new(opcode: u32, op_in: impl IntoBytes + zerocopy::Immutable, payload: &[u8]) -> Sample {
        Sample {
            opcode,
            op_in: op_in.as_bytes().to_vec(),
            payload: payload.to_vec(),
        }
    }

    fn bare(opcode: u32, payload: &[u8]) -> Sample {
        Sample {
            opcode,
            op_in: Vec::new(),
            payload: payload.to_vec(),
        }
    }

    /// As read(2) from /dev/fuse returns it.
    pub fn dev(&self) -> Vec<u8> {
        let len = 40 + self.op_in.len() + self.payload.len();
        let mut buf = header(self.opcode, len).as_bytes().to_vec();
        buf.extend_from_slice(&self.op_in);
        buf.extend_from_slice(&self.payload);
        buf
    }

    /// As the kernel fills a ring entry: the header area, and the payload buffer.
    pub fn uring(&self, payload_buffer: usize) -> (abi::UringReqHeader, Vec<u8>) {
        let mut h = abi::UringReqHeader {
            in_out: [0; 128],
            op_in: [0; 128],
            ring_ent_in_out: abi::UringEntInOut {
                commit_id: UNIQUE,
                payload_sz: self.payload.len() as u32,
                ..Default::default()
            },
        };
        let len = 40 + self.op_in.len() + self.payload.len();
        h.in_out[..40].copy_from_slice(header(self.opcode, len).as_bytes());
        h.op_in[..self.op_in.len()].copy_from_slice(&self.op_in);
        let mut payload = self.payload.clone();
        payload.resize(payload_buffer.max(payload.len()), 0xee);
        (h, payload)
    }
}

pub fn setattr_in() -> abi::SetattrIn {
    use abi::fattr::*;
    abi::SetattrIn {
        valid: MODE | SIZE | MTIME | ATIME_NOW | FH | KILL_SUIDGID,
        fh: 9,
        size: 1234,
        mtime: 1_700_000_000,
        mtimensec: 5,
        mode: 0o100640,
        ..Default::default()
    }
}

/// A valid request of every opcode fusewire decodes.
pub fn samples() -> Vec<Sample> {
    let read_in = abi::ReadIn {
        fh: 3,
        offset: 4096,
        size: 8192,
        flags: libc::O_RDONLY as u32,
        ..Default::default()
    };
    let forgets = [
        abi::ForgetOne {
            nodeid: 5,
            nlookup: 2,
        },
        abi::ForgetOne {
            nodeid: 6,
            nlookup: 1,
        },
    ];
    vec![
        Sample::new(
            op::INIT,
            abi::InitIn {
                major: 7,
                minor: 45,
                max_readahead: 131072,
                flags: 1,
                flags2: 1 << 9,
                unused: [0; 11],
            },
            &[],
        ),
        Sample::bare(op::DESTROY, &[]),
        Sample::bare(op::LOOKUP, b"name\0"),
        Sample::new(op::FORGET, abi::ForgetIn { nlookup: 3 }, &[]),
        Sample::new(
            op::BATCH_FORGET,
            abi::BatchForgetIn { count: 2, dummy: 0 },
            forgets.as_bytes(),
        ),
        Sample::new(op::INTERRUPT, abi::InterruptIn { unique: 40 }, &[]),
        Sample::new(
            op::GETATTR,
            abi::GetattrIn {
                getattr_flags: abi::GETATTR_FH,
                dummy: 0,
                fh: 11,
            },
            &[],
        ),
        Sample::new(op::SETATTR, setattr_in(), &[]),
        Sample::bare(op::READLINK, &[]),
        Sample::bare(op::SYMLINK, b"ln\0target/path\0"),
        Sample::new(
            op::MKNOD,
            abi::MknodIn {
                mode: 0o10644,
                rdev: 0,
                umask: 0o22,
                padding: 0,
            },
            b"fifo\0",
        ),
        Sample::new(
            op::MKDIR,
            abi::MkdirIn {
                mode: 0o755,
                umask: 0o22,
            },
            b"sub\0",
        ),
        Sample::bare(op::UNLINK, b"gone\0"),
        Sample::bare(op::RMDIR, b"gonedir\0"),
        Sample::new(op::RENAME, abi::RenameIn { newdir: 8 }, b"old\0new\0"),
        Sample::new(
            op::RENAME2,
            abi::Rename2In {
                newdir: 8,
                flags: 1,
                padding: 0,
            },
            b"old\0new\0",
        ),
        Sample::new(op::LINK, abi::LinkIn { oldnodeid: 12 }, b"hard\0"),
        Sample::new(
            op::OPEN,
            abi::OpenIn {
                flags: libc::O_RDWR as u32,
                open_flags: abi::OPEN_KILL_SUIDGID,
            },
            &[],
        ),
        Sample::new(
            op::CREATE,
            abi::CreateIn {
                flags: libc::O_WRONLY as u32,
                mode: 0o100644,
                umask: 0o22,
                open_flags: 0,
            },
            b"new\0",
        ),
        Sample::new(op::READ, read_in, &[]),
        Sample::new(
            op::WRITE,
            abi::WriteIn {
                fh: 3,
                offset: 10,
                size: 5,
                write_flags: abi::WRITE_KILL_SUIDGID,
                ..Default::default()
            },
            b"hello",
        ),
        Sample::new(
            op::FLUSH,
            abi::FlushIn {
                fh: 3,
                lock_owner: 77,
                ..Default::default()
            },
            &[],
        ),
        Sample::new(
            op::RELEASE,
            abi::ReleaseIn {
                fh: 3,
                flags: 2,
                release_flags: 1,
                lock_owner: 77,
            },
            &[],
        ),
        Sample::new(
            op::FSYNC,
            abi::FsyncIn {
                fh: 3,
                fsync_flags: abi::FSYNC_FDATASYNC,
                padding: 0,
            },
            &[],
        ),
        Sample::new(
            op::FALLOCATE,
            abi::FallocateIn {
                fh: 3,
                offset: 0,
                length: 100,
                mode: 1,
                padding: 0,
            },
            &[],
        ),
        Sample::new(
            op::LSEEK,
            abi::LseekIn {
                fh: 3,
                offset: 10,
                whence: 3,
                padding: 0,
            },
            &[],
        ),
        Sample::new(
            op::OPENDIR,
            abi::OpenIn {
                flags: libc::O_DIRECTORY as u32,
                open_flags: 0,
            },
            &[],
        ),
        Sample::new(op::READDIR, read_in, &[]),
        Sample::new(op::READDIRPLUS, read_in, &[]),
        Sample::new(
            op::RELEASEDIR,
            abi::ReleaseIn {
                fh: 4,
                ..Default::default()
            },
            &[],
        ),
        Sample::new(
            op::FSYNCDIR,
            abi::FsyncIn {
                fh: 4,
                fsync_flags: 0,
                padding: 0,
            },
            &[],
        ),
        Sample::bare(op::STATFS, &[]),
        Sample::new(
            op::ACCESS,
            abi::AccessIn {
                mask: 4,
                padding: 0,
            },
            &[],
        ),
        Sample::new(
            op::SETXATTR,
            abi::SetxattrIn {
                size: 3,
                flags: 1,
                setxattr_flags: 0,
                padding: 0,
            },
            b"user.a\0abc",
        ),
        Sample::new(
            op::GETXATTR,
            abi::GetxattrIn {
                size: 64,
                padding: 0,
            },
            b"user.a\0",
        ),
        Sample::new(
            op::LISTXATTR,
            abi::GetxattrIn {
                size: 0,
                padding: 0,
            },
            &[],
        ),
        Sample::bare(op::REMOVEXATTR, b"user.a\0"),
    ]
}
