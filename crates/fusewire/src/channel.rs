//! What a filesystem sends the kernel unasked, on the session's /dev/fuse descriptor
//! whatever the transport (io_uring carries only requests and their replies):
//! notifications (invalidations, pages handed over) and passthrough backing files.

// This module makes syscalls; each unsafe block says why it holds.
#![allow(unsafe_code)]

use crate::abi::{self, notify};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use zerocopy::{Immutable, IntoBytes};

/// The session's /dev/fuse descriptor, shared by everything that talks to the kernel.
#[derive(Clone, Debug)]
pub struct Channel {
    fd: Arc<OwnedFd>,
    stores: Arc<StoreSlots>,
}

/// How many stores may be under way at once (see [`Channel::store`]).
#[derive(Debug)]
struct StoreSlots {
    limit: AtomicUsize,
    busy: AtomicUsize,
}

/// A store's slot, given back when it ends.
struct StoreSlot<'a>(&'a StoreSlots);

impl Drop for StoreSlot<'_> {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

impl StoreSlots {
    fn take(&self) -> Option<StoreSlot<'_>> {
        let limit = self.limit.load(Ordering::Acquire);
        self.busy
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                (b < limit).then_some(b + 1)
            })
            .ok()
            .map(|_| StoreSlot(self))
    }
}

impl Channel {
    pub(crate) fn new(fd: Arc<OwnedFd>) -> Channel {
        let stores = Arc::new(StoreSlots {
            limit: AtomicUsize::new(usize::MAX),
            busy: AtomicUsize::new(0),
        });
        Channel { fd, stores }
    }

    /// At most `limit` stores at once (the session sets it for its transport, before it
    /// serves a request; see [`Channel::store`]).
    pub(crate) fn limit_stores(&self, limit: usize) {
        self.stores.limit.store(limit, Ordering::Release);
    }

    /// Whether [`Channel::store`] would be let through now (another may take the slot
    /// first): lets a caller skip preparing data for a store that would be refused.
    pub fn may_store(&self) -> bool {
        self.stores.busy.load(Ordering::Acquire) < self.stores.limit.load(Ordering::Acquire)
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }

    /// Drops the kernel's cached attributes of `ino`, and its cached pages from `offset`
    /// on for `len` bytes (0: to the end; a negative offset leaves the pages alone).
    pub fn inval_inode(&self, ino: u64, offset: i64, len: i64) -> io::Result<()> {
        let out = abi::NotifyInvalInodeOut {
            ino,
            off: offset,
            len,
        };
        self.notify(notify::INVAL_INODE, &out, &[])
    }

    /// Drops the kernel's cached entry `name` in `parent` (and a negative one).
    pub fn inval_entry(&self, parent: u64, name: &[u8]) -> io::Result<()> {
        self.entry_notice(parent, name, 0)
    }

    /// Marks the cached entry stale without dropping it (HAS_EXPIRE_ONLY kernels).
    pub fn expire_entry(&self, parent: u64, name: &[u8]) -> io::Result<()> {
        self.entry_notice(parent, name, abi::EXPIRE_ONLY)
    }

    fn entry_notice(&self, parent: u64, name: &[u8], flags: u32) -> io::Result<()> {
        let namelen = name_len(name)?;
        let out = abi::NotifyInvalEntryOut {
            parent,
            namelen,
            flags,
        };
        self.notify(notify::INVAL_ENTRY, &out, &[name, b"\0"])
    }

    /// Tells the kernel `child` was deleted as `name` from `parent` (drops the entry and,
    /// for a directory, makes it dead).
    pub fn delete(&self, parent: u64, child: u64, name: &[u8]) -> io::Result<()> {
        let namelen = name_len(name)?;
        let out = abi::NotifyDeleteOut {
            parent,
            child,
            namelen,
            padding: 0,
        };
        self.notify(notify::DELETE, &out, &[name, b"\0"])
    }

    /// Hands the kernel `data` as the page cache of `ino` at `offset`. The kernel locks
    /// each page to fill it, so a store waits for any page a READ in flight holds: call it
    /// only for an inode no open handle reads (as its open is served), so it waits at most
    /// for a READ from a handle opened meanwhile, which some free thread must serve. Over
    /// /dev/fuse any worker serves it; over io_uring only the threads of the READ's CPU's
    /// queue, so at most all but one of a queue's threads store at once, and a store past
    /// that is refused with `WouldBlock` (the pages are left to the READ).
    pub fn store(&self, ino: u64, offset: u64, data: &[u8]) -> io::Result<()> {
        let Some(_slot) = self.stores.take() else {
            return Err(io::ErrorKind::WouldBlock.into());
        };
        let size =
            u32::try_from(data.len()).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        let out = abi::NotifyStoreOut {
            nodeid: ino,
            offset,
            size,
            padding: 0,
        };
        self.notify(notify::STORE, &out, &[data])
    }

    /// Writes one notification: out header (unique 0, the code in `error`), its struct,
    /// then `tail` (names, data), in one writev(2) as the kernel wants it.
    fn notify<T: IntoBytes + Immutable>(
        &self,
        code: i32,
        out: &T,
        tail: &[&[u8]],
    ) -> io::Result<()> {
        let body = out.as_bytes();
        let len = 16 + body.len() + tail.iter().map(|t| t.len()).sum::<usize>();
        let len = u32::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        let header = abi::OutHeader {
            len,
            error: code,
            unique: 0,
        };
        let mut parts: Vec<&[u8]> = vec![header.as_bytes(), body];
        parts.extend_from_slice(tail);
        write_all_parts(self.fd.as_raw_fd(), &parts)
    }

    /// Registers an open file as a passthrough backing file (needs CAP_SYS_ADMIN and a
    /// session that negotiated PASSTHROUGH); the registration ends when the
    /// [`Backing`] is dropped.
    pub fn open_backing(&self, file: BorrowedFd<'_>) -> io::Result<Backing> {
        let map = abi::BackingMap {
            fd: file.as_raw_fd(),
            flags: 0,
            padding: 0,
        };
        // SAFETY: the ioctl reads a fuse_backing_map from the pointer, which stays valid
        // for the call; the kernel returns the new id or -1.
        let id = unsafe { libc::ioctl(self.fd.as_raw_fd(), abi::DEV_IOC_BACKING_OPEN as _, &map) };
        if id < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Backing {
            id: id as u32,
            channel: self.clone(),
        })
    }
}

fn name_len(name: &[u8]) -> io::Result<u32> {
    if name.is_empty() || name.contains(&0) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    u32::try_from(name.len()).map_err(|_| io::Error::from_raw_os_error(libc::ENAMETOOLONG))
}

/// One writev(2) of `parts`; /dev/fuse takes a message whole or not at all.
pub(crate) fn write_all_parts(fd: i32, parts: &[&[u8]]) -> io::Result<()> {
    let iov: Vec<libc::iovec> = parts
        .iter()
        .map(|p| libc::iovec {
            iov_base: p.as_ptr() as *mut libc::c_void,
            iov_len: p.len(),
        })
        .collect();
    // SAFETY: every iovec points at a live slice of the stated length, read-only for writev.
    let n = unsafe { libc::writev(fd, iov.as_ptr(), iov.len() as i32) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A registered passthrough backing file: its id goes in [`crate::Open::backing_id`].
#[derive(Debug)]
pub struct Backing {
    id: u32,
    channel: Channel,
}

impl Backing {
    /// The id the kernel gave it, for `Open::backing_id`.
    pub fn id(&self) -> u32 {
        self.id
    }
}

impl Drop for Backing {
    fn drop(&mut self) {
        let id = self.id;
        // SAFETY: the ioctl reads a u32 backing id from the pointer, valid for the call.
        // A failure (the connection is gone) leaves nothing to release.
        unsafe {
            libc::ioctl(
                self.channel.fd.as_raw_fd(),
                abi::DEV_IOC_BACKING_CLOSE as _,
                &id,
            )
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stores_past_the_limit_are_refused_until_one_ends() {
        let slots = StoreSlots {
            limit: AtomicUsize::new(1),
            busy: AtomicUsize::new(0),
        };
        let first = slots.take().expect("the first store may go");
        assert!(slots.take().is_none(), "a second at once is refused");
        drop(first);
        assert!(slots.take().is_some(), "the slot came back");
        slots.limit.store(2, Ordering::Release);
        let (_a, _b) = (slots.take().unwrap(), slots.take().unwrap());
        assert!(slots.take().is_none());
    }
}
