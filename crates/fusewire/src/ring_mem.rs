//! The memory of one io_uring queue's entries: per entry a `fuse_uring_req_header`, a
//! payload buffer and the iovec pair REGISTER points at. The kernel writes these addresses
//! whenever it hands the entry a request, for the connection's life, so the session holds
//! the memory until the serving thread is joined.

// This module makes syscalls; each unsafe block says why it holds.
#![allow(unsafe_code)]

use crate::abi::UringReqHeader;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::io;
use std::ptr::NonNull;

/// One zeroed heap allocation, used through raw pointers only (the kernel writes it too).
struct Buffer {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Buffer {
    fn new(size: usize, align: usize) -> io::Result<Buffer> {
        let layout = Layout::from_size_align(size.max(1), align)
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
        Ok(Buffer { ptr, layout })
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: ptr was allocated by alloc_zeroed with this very layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Where one entry's buffers are.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EntryPtrs {
    pub(crate) header: *mut UringReqHeader,
    pub(crate) payload: *mut u8,
    pub(crate) payload_size: usize,
}

/// All entries of one queue, and the 8 bytes the queue's wake-up read lands in.
pub(crate) struct QueueMem {
    headers: Buffer,
    payloads: Vec<Buffer>,
    iovecs: Buffer,
    wake: Buffer,
    payload_size: usize,
}

// SAFETY: the buffers are plain memory reached through raw pointers; who may touch an
// entry's memory at a time (the kernel, or the entry's serving thread) is decided by the
// ring protocol (an entry is its thread's from completion to commit), never by sharing
// references.
unsafe impl Send for QueueMem {}
// SAFETY: as above; QueueMem itself hands out only raw pointers.
unsafe impl Sync for QueueMem {}

impl QueueMem {
    pub(crate) fn new(depth: usize, payload_size: usize) -> io::Result<QueueMem> {
        let header_size = std::mem::size_of::<UringReqHeader>();
        let headers = Buffer::new(header_size * depth, 64)?;
        let payloads = (0..depth)
            .map(|_| Buffer::new(payload_size, 4096))
            .collect::<io::Result<Vec<_>>>()?;
        let iov_size = std::mem::size_of::<[libc::iovec; 2]>();
        let iovecs = Buffer::new(iov_size * depth, 8)?;
        let mem = QueueMem {
            headers,
            payloads,
            iovecs,
            wake: Buffer::new(8, 8)?,
            payload_size,
        };
        for i in 0..depth {
            let e = mem.entry(i);
            let pair = [
                libc::iovec {
                    iov_base: e.header.cast(),
                    iov_len: header_size,
                },
                libc::iovec {
                    iov_base: e.payload.cast(),
                    iov_len: payload_size,
                },
            ];
            // SAFETY: entry i's iovec pair lies inside the iovecs allocation (depth pairs),
            // suitably aligned, and nothing else uses it yet.
            unsafe { mem.iovec_pair(i).write(pair) };
        }
        Ok(mem)
    }

    pub(crate) fn depth(&self) -> usize {
        self.payloads.len()
    }

    /// Entry `i`'s buffers (i < depth).
    pub(crate) fn entry(&self, i: usize) -> EntryPtrs {
        assert!(i < self.depth(), "entry {i} of {}", self.depth());
        // SAFETY: i < depth, so the header lies inside the headers allocation.
        let header = unsafe { self.headers.ptr.as_ptr().cast::<UringReqHeader>().add(i) };
        let payload = self.payloads[i].ptr.as_ptr();
        EntryPtrs {
            header,
            payload,
            payload_size: self.payload_size,
        }
    }

    /// The iovec pair REGISTER of entry `i` points at.
    pub(crate) fn iovec_pair(&self, i: usize) -> *mut [libc::iovec; 2] {
        assert!(i < self.depth());
        // SAFETY: i < depth, so the pair lies inside the iovecs allocation.
        unsafe { self.iovecs.ptr.as_ptr().cast::<[libc::iovec; 2]>().add(i) }
    }

    /// Where the queue's eventfd read lands.
    pub(crate) fn wake_buf(&self) -> *mut u8 {
        self.wake.ptr.as_ptr()
    }
}
