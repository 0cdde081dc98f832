//! Measured opens of a writable mount: which layer's identity and content key a node is
//! measured as, handles that can write (their close marks the file changed, and may
//! hash it), and measured readers (counted for IMA's violations).

use super::io::IMAGE_HANDLE;
use super::nodes::Node;
use super::UnionFs;
use crate::backing::host_xattr;
use crate::measuring::{Content, ContentKey, Cookie, ImageFile, Opening, PositionalReader, Setup};
use crate::ops::Errno;
use crate::paths::measured_path;
use erofs::read::ByteSource;
use measure::policy::FsIdentity;
use rustix::fd::{AsFd, BorrowedFd};
use rustix::fs::{self as rfs, Mode, OFlags};
use std::sync::atomic::Ordering;

/// With a policy, what a handle is remembered as (`UnionFs::measured_fhs`).
#[derive(Clone, Copy)]
pub(super) enum Handle {
    Writer {
        key: ContentKey,
        hash_at_close: bool,
    },
    Reader,
}

impl<S: ByteSource + 'static> UnionFs<S> {
    /// With a policy: the digest kept for node `id`'s content, before its attributes
    /// change (a chmod, chown or utimes keeps it). A file made through the mount and not
    /// yet read or hashed has none to look for (`fresh`).
    pub(super) fn kept_digest(&self, id: u64) -> Option<Kept<'_>> {
        let s = self.hook.setup.as_ref()?;
        let (_, key, cookie, _) = self
            .with_node(id, |n| match n.io.fresh.load(Ordering::Acquire) {
                true => Ok(None),
                false => self.measured_as(s, n, None),
            })
            .ok()??;
        s.measuring.keeps(key).then_some((s, key, cookie?))
    }

    /// Node `id`'s attributes changed and its content did not: the `kept` digest moves on
    /// to the file's cookie now.
    pub(super) fn carry_digest(&self, id: u64, kept: Kept<'_>) {
        let (s, key, before) = kept;
        let now = self.with_node(id, |n| match &n.upper {
            Some(fd) => rfs::fstat(fd.as_fd()),
            None => Err(Errno::STALE),
        });
        if let Ok(st) = now {
            s.measuring
                .touched(key, before, crate::measuring::cookie(&st));
        }
    }

    /// The path the measurement list names for node `id`: the mountpoint joined with the
    /// names from the root down (borrowed from the nodes, joined once; bounded as the
    /// kernel's, see `crate::measured_path`).
    pub(super) fn measured_path(&self, setup: &Setup, id: u64) -> Vec<u8> {
        let guard = self.nodes.guard();
        measured_path(setup, id, |at| {
            self.nodes.get(&at, &guard).map(|n| (n.parent, &n.name[..]))
        })
    }

    /// What a node's content is measured as: its layer's identity, and its content key
    /// and cookie. `None` when no rule can measure that layer (nothing more to do).
    /// `made`: the upper file's stat when the caller just made it (saves taking another).
    pub(super) fn measured_as<'s>(
        &self,
        s: &'s Setup,
        n: &Node,
        made: Option<&rustix::fs::Stat>,
    ) -> Result<Option<MeasuredAs<'s>>, Errno> {
        let fs = match (&n.upper, &n.lower) {
            (Some(_), _) => s.upper.as_ref().ok_or(Errno::IO)?,
            (None, Some(r)) => &s.layers[r.top.layer as usize],
            _ => return Err(Errno::STALE),
        };
        if !s.measuring.may_measure(fs) {
            return Ok(None);
        }
        Ok(Some(match (&n.upper, &n.lower) {
            (Some(fd), _) => {
                let st = match made {
                    Some(st) => *st,
                    None => rfs::fstat(fd.as_fd())?,
                };
                let key = ContentKey::Upper {
                    dev: st.st_dev,
                    ino: st.st_ino,
                };
                // Rootless, the owner shown lives in the override xattr (see `attr`).
                let owner = self.as_root.then_some((st.st_uid, st.st_gid));
                (fs, key, Some(crate::measuring::cookie(&st)), owner)
            }
            (None, Some(r)) => {
                let key = ContentKey::Image {
                    layer: r.top.layer,
                    nid: r.top.nid,
                };
                (fs, key, None, Some((r.inode.uid, r.inode.gid)))
            }
            _ => return Err(Errno::STALE),
        }))
    }

    /// With a policy: measures the open of node `id` by `pid` with `flags`, and says what
    /// its handle must be remembered as: a writer (its close marks the file changed) or
    /// a measured reader (its close is counted, for IMA's violations).
    pub(super) fn measure_open(
        &self,
        id: u64,
        flags: i32,
        pid: u32,
        fh: u64,
        made: Option<&rustix::fs::Stat>,
    ) -> Result<Option<Handle>, Errno> {
        let Some(s) = &self.hook.setup else {
            return Ok(None);
        };
        let guard = self.nodes.guard();
        let n = self.nodes.get(&id, &guard).ok_or(Errno::STALE)?;
        let writes = crate::measuring::writes(flags);
        let Some((fs, key, cookie, owner)) = self.measured_as(s, n, made)? else {
            if writes {
                let path = || self.measured_path(s, id);
                s.write_opened(&n.io.opens, path, &self.log, &self.name)?;
            }
            return Ok(None);
        };
        let owner = match owner {
            Some(o) => o,
            None => self.attr(id, n).map(|a| (a.uid, a.gid))?,
        };
        if writes {
            // Counted before measuring, so the measurement keeps no digest; the handle is
            // remembered (for its close) once measured. Nothing below fails before that
            // but the measurement, which undoes the count.
            n.io.opens.writer_opened();
            s.measuring.changed(key);
        } else {
            n.io.fresh.store(false, Ordering::Release);
        }
        let o = Opening {
            flags,
            pid,
            owner,
            fs,
            key,
            cookie,
            opens: Some(&n.io.opens),
        };
        match self.measure_content(s, &o, id, n, fh) {
            Ok(m) if writes => Ok(Some(Handle::Writer {
                key,
                hash_at_close: m.hash_at_close,
            })),
            Ok(m) => Ok(m.reader.then_some(Handle::Reader)),
            Err(e) => {
                if writes {
                    n.io.opens.writer_closed();
                }
                Err(e)
            }
        }
    }

    /// `measure_open` for a handle just opened: on failure the handle is closed again.
    /// A measured reader served from the image (no descriptor, `fh` 0) gets a handle of
    /// its own, so its close can be counted.
    pub(super) fn measured(
        &self,
        id: u64,
        flags: i32,
        pid: u32,
        fh: u64,
        made: Option<&rustix::fs::Stat>,
    ) -> Result<u64, Errno> {
        match self.measure_open(id, flags, pid, fh, made) {
            Ok(None) => Ok(fh),
            Ok(Some(h)) => {
                let fh = match fh {
                    0 => IMAGE_HANDLE | self.next_fh.fetch_add(1, Ordering::Relaxed),
                    fh => fh,
                };
                self.measured_fhs.pin().insert(fh, (id, h));
                Ok(fh)
            }
            Err(e) => {
                if fh != 0 {
                    self.files.pin().remove(&fh);
                }
                Err(e)
            }
        }
    }

    /// Measures opening `o` of node `id` (`n`), whose content is read through its new
    /// handle `fh` when that can read.
    fn measure_content(
        &self,
        s: &Setup,
        o: &Opening<'_>,
        id: u64,
        n: &Node,
        fh: u64,
    ) -> Result<crate::measuring::Measured, Errno> {
        let files = self.files.pin();
        let content = UnionContent {
            fs: self,
            node: n,
            id,
            setup: s,
            handle: files
                .get(&fh)
                .map(|f| f.as_fd())
                .filter(|_| o.flags & libc::O_ACCMODE != libc::O_WRONLY),
        };
        s.measure(o, &content, &self.log, &self.name)
    }

    /// With a policy: the handle `fh` (still readable through `handle`, if given) is
    /// closed; a writer's close marks its file changed, and the last writer's close may
    /// hash the file (`Measuring::closed`).
    pub(super) fn measure_release(&self, fh: u64, handle: Option<BorrowedFd<'_>>) {
        let Some(s) = &self.hook.setup else {
            return;
        };
        let Some((id, h)) = self.measured_fhs.pin().remove(&fh).copied() else {
            return;
        };
        if let Handle::Writer { key, .. } = h {
            s.measuring.changed(key);
        }
        let _ = self.with_node(id, |n| match h {
            Handle::Reader => {
                if n.io.opens.reader_closed() {
                    s.measuring.released();
                }
                Ok(())
            }
            Handle::Writer { key, hash_at_close } => {
                self.writer_closed(s, (id, n), key, hash_at_close, handle)
            }
        });
    }

    /// A handle that could write node `id` (`n`, content `key`) closed; the last one's
    /// close hashes the file if `hash_at_close` and its size is in range.
    fn writer_closed(
        &self,
        s: &Setup,
        (id, n): (u64, &Node),
        key: ContentKey,
        hash_at_close: bool,
        handle: Option<BorrowedFd<'_>>,
    ) -> Result<(), Errno> {
        let last = n.io.opens.writer_closed();
        if last {
            s.measuring.released();
        }
        let Some(fd) = n.upper.as_ref().filter(|_| last && hash_at_close) else {
            return Ok(());
        };
        let st = rfs::fstat(fd.as_fd())?;
        let now = ContentKey::Upper {
            dev: st.st_dev,
            ino: st.st_ino,
        };
        if now != key {
            return Ok(());
        }
        if crate::measuring::HASH_AT_CLOSE.contains(&(st.st_size as u64)) {
            n.io.fresh.store(false, Ordering::Release);
        }
        // Only once it hashes (the file's size is in range) does it need to know whether
        // the closed handle can read.
        s.measuring.closed(key, crate::measuring::cookie(&st), || {
            let readable = |h: &BorrowedFd<'_>| {
                rfs::fcntl_getfl(h).is_ok_and(|m| m & OFlags::ACCMODE != OFlags::WRONLY)
            };
            let content = UnionContent {
                fs: self,
                node: n,
                id,
                setup: s,
                handle: handle.filter(readable),
            };
            content.upper_reader(fd.as_fd())
        });
        Ok(())
    }

    /// With a policy: node `id`'s content changed without an open (a truncation by path).
    pub(super) fn measure_changed(&self, id: u64) {
        let Some(s) = &self.hook.setup else {
            return;
        };
        if let Ok(Some((_, key, _, _))) = self.with_node(id, |n| self.measured_as(s, n, None)) {
            s.measuring.changed(key);
        }
    }
}

/// A digest kept for a node's content before a change of its attributes: the setup, the
/// content key and the cookie it was kept for (see `kept_digest`).
pub(super) type Kept<'s> = (&'s Setup, ContentKey, Cookie);

/// A layer's identity, a content key, the upper file's cookie, and the owner the mount
/// shows when known without more work (see `measured_as`).
pub(super) type MeasuredAs<'s> = (
    &'s FsIdentity,
    ContentKey,
    Option<Cookie>,
    Option<(u32, u32)>,
);

/// A union node's content, for measuring.
struct UnionContent<'a, S: ByteSource> {
    fs: &'a UnionFs<S>,
    node: &'a Node,
    id: u64,
    setup: &'a Setup,
    /// The upper file's descriptor the open being measured just made (or the one just
    /// closed), if it can read.
    handle: Option<BorrowedFd<'a>>,
}

impl<'a, S: ByteSource + 'static> UnionContent<'a, S> {
    /// The upper file's bytes (`upper` is the node's `O_PATH` descriptor): through the
    /// open's own descriptor when it can read (positional reads leave its offset alone),
    /// else through a new one.
    fn upper_reader(&self, upper: BorrowedFd<'_>) -> std::io::Result<Box<dyn std::io::Read + 'a>> {
        if let Some(h) = self.handle {
            return Ok(Box::new(PositionalReader { fd: h, at: 0 }));
        }
        Ok(Box::new(std::fs::File::from(rfs::open(
            UnionFs::<S>::real_path(upper).as_c_str(),
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )?)))
    }

    /// The node's image file, while it has no upper copy.
    fn image_file(&self) -> Option<ImageFile<'a, S>> {
        match (&self.node.upper, &self.node.lower) {
            (None, Some(r)) => Some(ImageFile {
                image: self.fs.stack.image(r.top.layer),
                inode: &r.inode,
            }),
            _ => None,
        }
    }
}

impl<S: ByteSource + 'static> Content for UnionContent<'_, S> {
    fn path(&self) -> Vec<u8> {
        self.fs.measured_path(self.setup, self.id)
    }

    fn reader(&self, size: Option<u64>) -> std::io::Result<(Box<dyn std::io::Read + '_>, u64)> {
        match (&self.node.upper, &self.node.lower) {
            (Some(fd), _) => {
                let size = match size {
                    Some(s) => s,
                    None => rfs::fstat(fd.as_fd())?.st_size as u64,
                };
                Ok((self.upper_reader(fd.as_fd())?, size))
            }
            _ => match self.image_file() {
                Some(f) => Ok(f.reader()),
                None => Err(std::io::Error::from_raw_os_error(
                    Errno::STALE.raw_os_error(),
                )),
            },
        }
    }

    fn verity_digest(&self) -> std::io::Result<Option<[u8; 32]>> {
        match self.image_file() {
            Some(f) => f.verity_digest(),
            None => Ok(None),
        }
    }

    fn ima_xattr(&self) -> Option<Vec<u8>> {
        match (&self.node.upper, &self.node.lower) {
            (Some(fd), _) => {
                let path = UnionFs::<S>::real_path(fd.as_fd());
                host_xattr(path.as_c_str(), c"security.ima").ok()?
            }
            _ => self.image_file()?.ima_xattr(),
        }
    }
}
