//! Splitting what a transport received into a [`Raw`] request: the in header, the first
//! (fixed) argument and the rest, every length checked against the header's.

use crate::abi::{self, InHeader};
use zerocopy::FromBytes;

/// A request as a transport received it, before decoding.
#[derive(Clone, Copy, Debug)]
pub struct Raw<'a> {
    /// The in header.
    pub header: InHeader,
    /// The first argument, exactly as long as the kernel sent it.
    pub op_in: &'a [u8],
    /// The rest of the arguments (names, values, data), extension headers removed.
    pub payload: &'a [u8],
}

/// Why a buffer is not a request this crate serves.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Fewer bytes than the header (or an argument) needs.
    #[error("{what}: {have} bytes where {need} are needed")]
    Truncated {
        /// What was cut short.
        what: &'static str,
        /// Bytes it needs.
        need: usize,
        /// Bytes there are.
        have: usize,
    },
    /// The header's length disagrees with what the transport received.
    #[error("header says {header} bytes, {received} received")]
    Length {
        /// The header's `len`.
        header: u32,
        /// Bytes the transport received.
        received: usize,
    },
    /// Bytes left after the last argument.
    #[error("{}: {extra} bytes after the last argument", abi::op_name(*.opcode))]
    Trailing {
        /// The request's opcode.
        opcode: u32,
        /// Bytes left over.
        extra: usize,
    },
    /// A name without its terminating NUL, or an empty one.
    #[error("{}: a name without its NUL", abi::op_name(*.opcode))]
    BadName {
        /// The request's opcode.
        opcode: u32,
    },
    /// An argument whose value the kernel never sends (a time's nanoseconds >= 1 s, ...).
    #[error("{}: impossible {what}", abi::op_name(*.opcode))]
    BadValue {
        /// The request's opcode.
        opcode: u32,
        /// The argument.
        what: &'static str,
    },
    /// An opcode this crate does not decode (answered with ENOSYS).
    #[error("opcode {opcode} is not served")]
    Unsupported {
        /// The opcode.
        opcode: u32,
    },
}

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
