//! FUSE_INIT: what the filesystem wants, against what the kernel offers, gives the answer
//! and what both then hold to ([`Negotiated`]).

use crate::abi::{self, init};

/// What a filesystem asks of the kernel at INIT. Capabilities the kernel lacks are done
/// without; [`Negotiated::granted`] says which were agreed.
#[derive(Clone, Copy, Debug)]
pub struct Wants {
    /// `abi::init` flags (ASYNC_READ, DO_READDIRPLUS, POSIX_ACL, HANDLE_KILLPRIV_V2, ...).
    /// PASSTHROUGH here also sets the stack depth the kernel needs for it; OVER_IO_URING
    /// and INIT_EXT are the session's to ask, not the filesystem's.
    pub flags: u64,
    /// Largest WRITE (bytes); the kernel never takes less than 4 KiB.
    pub max_write: u32,
    /// Largest readahead (bytes; the kernel's offer caps it).
    pub max_readahead: u32,
    /// Pages per request (reads, writes, listings): 256 = 1 MiB.
    pub max_pages: u16,
    /// The kernel's background queue and congestion threshold (`None`: its defaults).
    pub background: Option<(u16, u16)>,
    /// Granularity of the times the filesystem reports (ns; 1 = exact).
    pub time_gran: u32,
}

impl Default for Wants {
    fn default() -> Wants {
        Wants {
            flags: init::ASYNC_READ | init::PARALLEL_DIROPS | init::MAX_PAGES,
            max_write: 1 << 20,
            max_readahead: 1 << 20,
            max_pages: 256,
            background: None,
            time_gran: 1,
        }
    }
}

/// What the kernel and the filesystem agreed on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Negotiated {
    /// The protocol minor version in use (the lower of the kernel's and this crate's).
    pub minor: u32,
    /// Everything the kernel offered.
    pub offered: u64,
    /// What was asked and offered (the flags of the INIT reply).
    pub granted: u64,
    /// The largest WRITE, in bytes.
    pub max_write: u32,
    /// The largest readahead, in bytes.
    pub max_readahead: u32,
    /// The most pages in one request.
    pub max_pages: u16,
}

impl Negotiated {
    /// Whether the INIT flag `flag` was granted.
    pub fn has(&self, flag: u64) -> bool {
        self.granted & flag != 0
    }

    /// The payload each ring entry needs: the kernel refuses a REGISTER with less than
    /// max(8 KiB, max_write, max_pages pages).
    pub fn ring_payload_size(&self) -> usize {
        let pages = if self.has(init::MAX_PAGES) {
            self.max_pages.max(1)
        } else {
            32
        } as usize;
        (abi::MIN_READ_BUFFER)
            .max(self.max_write.max(4096) as usize)
            .max(pages * 4096)
    }

    /// A /dev/fuse read buffer that takes every request: the largest payload, a 64 KiB
    /// xattr value, and the headers before them.
    pub fn dev_buffer_size(&self) -> usize {
        self.ring_payload_size().max(64 << 10) + 4096
    }
}

/// An INIT this crate cannot answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InitError {
    /// Not protocol 7, or older than 7.36.
    #[error(
        "the kernel speaks FUSE {major}.{minor}; 7.{} or later is needed",
        abi::MIN_KERNEL_MINOR_VERSION
    )]
    Version {
        /// The kernel's major version.
        major: u32,
        /// The kernel's minor version.
        minor: u32,
    },
    /// The first request on /dev/fuse was not INIT.
    #[error("the first request is {} ({opcode}), not INIT", abi::op_name(*.opcode))]
    NotInit {
        /// The first request's opcode.
        opcode: u32,
    },
}

/// The kernel's INIT request, the filesystem's wants and whether the session asks for
/// io_uring: the reply to write, and what holds from then on.
pub fn negotiate(
    major: u32,
    minor: u32,
    max_readahead: u32,
    offered: u64,
    wants: &Wants,
    uring: bool,
) -> Result<(abi::InitOut, Negotiated), InitError> {
    if major != abi::KERNEL_VERSION || minor < abi::MIN_KERNEL_MINOR_VERSION {
        return Err(InitError::Version { major, minor });
    }
    // ABORT_ERROR: after an abort through fusectl, reads of /dev/fuse fail ECONNABORTED
    // (not ENODEV), which the session takes as the end it is.
    let mut ask = wants.flags & !(init::OVER_IO_URING | init::INIT_EXT) | init::ABORT_ERROR;
    if uring {
        ask |= init::OVER_IO_URING;
    }
    // INIT_EXT says flags2 is meant: without it the kernel ignores every bit past 31.
    let granted = offered & ask | offered & init::INIT_EXT;
    let max_pages = wants.max_pages.max(1);
    let max_write = wants.max_write.clamp(4096, max_pages as u32 * 4096);
    let max_readahead = wants.max_readahead.min(max_readahead);
    let (max_background, congestion_threshold) = wants.background.unwrap_or((0, 0));
    let out = abi::InitOut {
        major: abi::KERNEL_VERSION,
        minor: abi::KERNEL_MINOR_VERSION.min(minor),
        max_readahead,
        flags: granted as u32,
        flags2: (granted >> 32) as u32,
        max_background,
        congestion_threshold,
        max_write,
        time_gran: wants.time_gran.max(1),
        max_pages,
        // Passthrough files may not sit on a stacked filesystem themselves.
        max_stack_depth: u32::from(granted & init::PASSTHROUGH != 0),
        ..Default::default()
    };
    let negotiated = Negotiated {
        minor: out.minor,
        offered,
        granted,
        max_write,
        max_readahead,
        max_pages,
    };
    Ok((out, negotiated))
}
