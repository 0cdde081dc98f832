//! New objects: made in the upper directory, in place of a whiteout where the images have
//! the name (a directory made so is opaque), owned as the caller (or, rootless, shown so).

use super::nodes::{FileIo, Node};
use super::owner::rootless_shown;
use super::{cname, errno, is_dir_mode, libc_trunc, now, UnionFs};
use crate::attr::Attr;
use crate::ops::{Caller, Created, Errno, Register};
use erofs::read::ByteSource;
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self as rfs, AtFlags, OFlags};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use upper::overlay;
use upper::{Contents, Meta, Stat};

/// What the caller asked a new object to be: type and permission bits, the umask to apply
/// (unless a default ACL replaces it), and a device number.
pub(super) struct Want {
    pub mode: u32,
    pub umask: u32,
    pub rdev: (u32, u32),
}

impl<S: ByteSource + 'static> UnionFs<S> {
    /// Makes a new object `name` in `parent`: in place of a whiteout (a directory made so
    /// is opaque, hiding the images' one), else fresh. Returns its id, attributes, the
    /// descriptor the creation opened (if any) and the host's stat of it.
    pub(super) fn make(
        &self,
        caller: &Caller,
        parent: u64,
        name: &[u8],
        want: Want,
        contents: Contents<'_>,
    ) -> Result<(u64, Attr, Option<OwnedFd>, rustix::fs::Stat), Errno> {
        let pfd = self.upper_dir(parent)?;
        let (meta, inherits) = self.new_meta(caller, parent, pfd.as_fd(), want)?;
        let (st, file) = self.place(pfd.as_fd(), name, meta, contents, inherits)?;
        let fd = self.with_room(|| self.open_entry(pfd.as_fd(), name, &st))?;
        let id = self.upper_id(&st, || None);
        let io = FileIo::default();
        io.fresh.store(true, Ordering::Relaxed);
        let node = Node {
            parent,
            name: name.to_vec(),
            lower: None,
            upper: Some(Arc::new(fd)),
            merge: false,
            lookups: Arc::new(AtomicU64::new(0)),
            io: Arc::new(io),
        };
        let attr = Attr::of_stat(id, &st);
        self.remember(id, node);
        Ok((id, attr, file, st))
    }

    /// What a new object in `parent` (upper directory `pfd`) is made with, and whether
    /// the parent's default ACL decides its mode.
    fn new_meta(
        &self,
        caller: &Caller,
        parent: u64,
        pfd: BorrowedFd<'_>,
        want: Want,
    ) -> Result<(Meta, bool), Errno> {
        let Want { mode, umask, rdev } = want;
        let (uid, gid) = self.owner(caller, pfd);
        // A default ACL on the parent takes the umask's place (POSIX.1e), and the host
        // applies it when the object is made there; otherwise the umask applies.
        let mut buf = [0u8; 1];
        let inherits = matches!(
            rfs::fgetxattr(pfd, "system.posix_acl_default", &mut buf),
            Ok(_) | Err(rustix::io::Errno::RANGE)
        );
        let mut mode = if inherits {
            mode
        } else {
            mode & !(umask & 0o777)
        };
        let dir_mode = is_dir_mode(mode);
        if dir_mode && gid != caller.gid && self.as_root {
            mode |= 0o2000; // directories inherit set-group-id
        }
        let mut meta = Meta {
            mode,
            uid,
            gid,
            mtime: now(),
            rdev,
            xattrs: Vec::new(),
        };
        if !self.as_root {
            rootless_shown(&mut meta, caller);
        }
        // A directory made in a merged one is opaque, as overlayfs makes it (with
        // redirect_dir): over a whiteout it must be, so the images' one stays hidden, and
        // it is made so before it appears.
        if dir_mode && self.with_node(parent, |p| Ok(!p.lower_chain().is_empty()))? {
            meta.xattrs.push(self.opaque());
        }
        Ok((meta, inherits))
    }

    /// The opaque marker, in the mount's namespace.
    fn opaque(&self) -> (Vec<u8>, Vec<u8>) {
        (
            self.upper.ns.opaque().as_bytes().to_vec(),
            overlay::OPAQUE.to_vec(),
        )
    }

    /// Makes `name` in `pfd`. The kernel looked the name up and found nothing, so it is
    /// free in the upper directory too, or holds a whiteout (the images have the name):
    /// only then does the object go through the work directory.
    fn place(
        &self,
        pfd: BorrowedFd<'_>,
        name: &[u8],
        mut meta: Meta,
        mut contents: Contents<'_>,
        inherits: bool,
    ) -> Result<(Stat, Option<OwnedFd>), Errno> {
        // Nothing is left of a creation that ran out of descriptors: it can start over.
        let fresh = self.with_room(|| {
            self.upper
                .create_fresh(pfd, name, &meta, contents.reborrow(), inherits)
                .map_err(errno)
        });
        match fresh {
            Err(Errno::EXIST) => {
                let existing = self.upper.stat(pfd, name).map_err(errno)?;
                if !existing.as_ref().is_some_and(upper::is_whiteout) {
                    return Err(Errno::EXIST);
                }
                let opaque = self.opaque();
                if is_dir_mode(meta.mode) && !meta.xattrs.contains(&opaque) {
                    meta.xattrs.push(opaque);
                }
                let st = self
                    .upper
                    .replace(pfd, name, &meta, contents)
                    .map_err(errno)?;
                Ok((st, None))
            }
            made => made,
        }
    }

    pub(super) fn make_node(
        &self,
        caller: &Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        rdev: u32,
    ) -> Result<Attr, Errno> {
        let dev = (rfs::major(u64::from(rdev)), rfs::minor(u64::from(rdev)));
        // A 0/0 character device is a whiteout in the upper directory; overlayfs refuses
        // to make one through the mount, and so do we.
        if overlay::is_whiteout(mode, dev) {
            return Err(Errno::PERM);
        }
        let _l = self.lock();
        let contents = if rfs::FileType::from_raw_mode(mode) == rfs::FileType::RegularFile {
            Contents::File {
                size: 0,
                read: &mut |_, _| Ok(0),
            }
        } else {
            Contents::Special
        };
        let want = Want {
            mode,
            umask,
            rdev: dev,
        };
        let (_, a, _, _) = self.make(caller, parent, name, want, contents)?;
        Ok(a)
    }

    pub(super) fn make_dir(
        &self,
        caller: &Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
    ) -> Result<Attr, Errno> {
        let _l = self.lock();
        let mode = rfs::FileType::Directory.as_raw_mode() | (mode & 0o7777);
        let want = Want {
            mode,
            umask,
            rdev: (0, 0),
        };
        let (_, a, _, _) = self.make(caller, parent, name, want, Contents::Dir)?;
        Ok(a)
    }

    pub(super) fn make_symlink(
        &self,
        caller: &Caller,
        parent: u64,
        name: &[u8],
        target: &[u8],
    ) -> Result<Attr, Errno> {
        let _l = self.lock();
        let mode = rfs::FileType::Symlink.as_raw_mode() | 0o777;
        let want = Want {
            mode,
            umask: 0,
            rdev: (0, 0),
        };
        let (_, a, _, _) = self.make(caller, parent, name, want, Contents::Symlink(target))?;
        Ok(a)
    }

    /// Makes regular file `name` in `parent` and opens it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn create_file(
        &self,
        caller: &Caller,
        parent: u64,
        name: &[u8],
        mode: u32,
        umask: u32,
        flags: i32,
        register: Register<'_>,
    ) -> Result<Created, Errno> {
        let (id, attr, fh, st) = {
            let _l = self.lock();
            let mode = rfs::FileType::RegularFile.as_raw_mode() | (mode & 0o7777);
            let mut empty = |_: u64, _: &mut [u8]| Ok(0);
            let want = Want {
                mode,
                umask,
                rdev: (0, 0),
            };
            let contents = Contents::File {
                size: 0,
                read: &mut empty,
            };
            let (id, a, file, st) = self.make(caller, parent, name, want, contents)?;
            (id, a, self.new_handle(id, file, flags)?, st)
        };
        // Measured as made: the file is new and empty, and the open is its creation.
        let fh = self.measured(id, flags, caller.pid, fh, Some(&st))?;
        Ok(Created {
            attr,
            fh,
            passthrough: self.passthrough_of(id, fh, register),
        })
    }

    /// The handle of a file just made (`file`: the descriptor its creation opened): that
    /// descriptor, unless the caller wants synchronous writes (which only open can ask
    /// for), else one opened now.
    fn new_handle(&self, id: u64, file: Option<OwnedFd>, flags: i32) -> Result<u64, Errno> {
        let o = OFlags::from_bits_truncate(flags as u32);
        if let Some(f) = file.filter(|_| !o.intersects(OFlags::SYNC | OFlags::DSYNC)) {
            if o.contains(OFlags::APPEND) {
                rfs::fcntl_setfl(&f, OFlags::APPEND)?;
            }
            let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
            self.files.pin().insert(fh, f);
            return Ok(fh);
        }
        let n = self.node(id)?;
        let fd = n.upper.as_ref().ok_or(Errno::IO)?;
        self.with_room(|| self.open_real(fd.as_fd(), flags & !libc_trunc()))
    }

    /// Gives node `ino` the new name `newname` in `newparent`.
    pub(super) fn link_name(
        &self,
        ino: u64,
        newparent: u64,
        newname: &[u8],
    ) -> Result<Attr, Errno> {
        let _l = self.lock();
        let fd = self.copy_up(ino)?;
        let dpfd = self.upper_dir(newparent)?;
        let to = cname(newname)?;
        if let Some(st) = self.upper.stat(dpfd.as_fd(), newname).map_err(errno)? {
            if upper::is_whiteout(&st) {
                rfs::unlinkat(dpfd.as_fd(), to.as_c_str(), AtFlags::empty())?;
            }
        }
        rfs::linkat(
            rfs::CWD,
            Self::real_path(fd.as_fd()).as_c_str(),
            dpfd.as_fd(),
            to.as_c_str(),
            AtFlags::SYMLINK_FOLLOW,
        )?;
        let mut n = self.node(ino)?;
        // OPEN carries no path: a file with several names is measured under the one
        // learnt last, by a lookup or, as here, a link (see docs/SECURITY.md).
        (n.parent, n.name) = (newparent, newname.to_vec());
        self.remember(ino, n.clone());
        self.attr(ino, &n)
    }
}
