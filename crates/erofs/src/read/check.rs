//! Whole-image consistency checks (`fsck`) and a bounded walk for fuzzing (`exercise`).
//!
//! Both walk the tree with an explicit stack and a visited set: directory graphs in hostile
//! images can contain cycles and directory hardlinks, and recursion would follow them forever
//! or overflow the stack.

use std::collections::{HashMap, HashSet};

use super::{ByteSource, DirEntry, Image, Inode};
use crate::format;

mod lazy;
pub use lazy::LazyCheck;

/// Deepest directory nesting `fsck` descends into.
const MAX_DEPTH: usize = 4096;

/// Result of [`fsck`]: one line per problem, naming the path, nid and byte offset.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FsckReport {
    /// One line per problem found.
    pub problems: Vec<String>,
    /// Distinct inodes reached from the root.
    pub inodes: u64,
    /// Directories among `inodes`.
    pub dirs: u64,
    /// Non-directory inodes (regular files, symlinks, devices, FIFOs, sockets).
    pub files: u64,
    /// Data bytes read (regular files and symlinks; holes excluded).
    pub bytes: u64,
}

impl FsckReport {
    /// Whether no problem was found.
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

struct NonDir {
    path: String,
    nlink: u32,
    file_type: u8,
    refs: u64,
}

struct Fsck<'a, S: ByteSource> {
    img: &'a Image<S>,
    max: usize,
    report: FsckReport,
    /// Work units left (entries, extents, MiB of data). Honest images cost about their size;
    /// hostile ones (chunks all pointing at one block, looping directory blocks) are cut off.
    work: u64,
    data_left: u64,
    stopped: bool,
    /// Namespace bits of every xattr met, to compare with the digest footer's record.
    namespaces: u32,
    /// Regular files met, `(nid, path)`, whose digest-table claims are checked last.
    regular: Vec<(u64, String)>,
    /// Read every data extent (`fsck`), or only map them (`fsck_structure`).
    read_data: bool,
    /// Decoded bytes of compressed files left: about LZ4's best ratio (255:1) over the
    /// image, so an honest image is checked whole and one whose indexes point many
    /// extents at one cluster is cut off.
    decoded_left: u64,
}

/// Walks the whole tree from the root and checks everything the kernel relies on (and what
/// our own builder promises). Stops after `max_problems` problems.
pub fn fsck<S: ByteSource>(img: &Image<S>, max_problems: usize) -> FsckReport {
    check(img, max_problems, true, true)
}

/// [`fsck`] without reading file contents (their extents are still mapped and bounds-checked):
/// for a caller that reads the data itself and stops at its first error, as `verilay
/// extract` does, so the structure is checked before anything is written and the data is
/// read once.
pub fn fsck_structure<S: ByteSource>(img: &Image<S>, max_problems: usize) -> FsckReport {
    check(img, max_problems, false, true)
}

/// What the kernel's erofs parses, checked before it mounts the image: [`fsck_structure`]
/// without verilay's own records (the digest table's per-file claims, which cost a hash
/// of every file and are checked where they are used, and the xattr namespace record),
/// which the kernel never reads.
pub fn check_kernel_metadata<S: ByteSource>(img: &Image<S>, max_problems: usize) -> FsckReport {
    check(img, max_problems, false, false)
}

fn check<S: ByteSource>(
    img: &Image<S>,
    max_problems: usize,
    read_data: bool,
    own_records: bool,
) -> FsckReport {
    let mut f = Fsck::new(
        img,
        max_problems,
        read_data,
        Budget::for_image(img.image_len()),
    );
    f.run();
    if own_records {
        f.check_namespaces();
        f.check_claims();
    }
    f.report
}

/// What a check of an image may still spend (see `Fsck`'s fields): about the image's
/// size for an honest one, whether it is checked at once or a structure at a time.
#[derive(Clone, Copy, Debug)]
struct Budget {
    work: u64,
    data_left: u64,
    decoded_left: u64,
}

impl Budget {
    fn for_image(len: u64) -> Budget {
        Budget {
            work: len / 2 + 100_000,
            data_left: len.saturating_mul(4).saturating_add(1 << 20),
            decoded_left: len.saturating_mul(256).saturating_add(64 << 20),
        }
    }
}

fn path_str(p: &[u8]) -> String {
    String::from_utf8_lossy(p).into_owned()
}

impl<'a, S: ByteSource> Fsck<'a, S> {
    fn new(img: &'a Image<S>, max_problems: usize, read_data: bool, budget: Budget) -> Self {
        Fsck {
            img,
            max: max_problems.max(1),
            report: FsckReport::default(),
            work: budget.work,
            data_left: budget.data_left,
            stopped: false,
            namespaces: 0,
            regular: Vec::new(),
            read_data,
            decoded_left: budget.decoded_left,
        }
    }

    /// What is left to spend.
    fn budget(&self) -> Budget {
        Budget {
            work: self.work,
            data_left: self.data_left,
            decoded_left: self.decoded_left,
        }
    }

    fn problem(&mut self, what: String) {
        if self.stopped {
            return;
        }
        self.report.problems.push(what);
        if self.report.problems.len() >= self.max {
            self.report
                .problems
                .push(format!("stopping after {} problems", self.max));
            self.stopped = true;
        }
    }

    fn spend(&mut self, units: u64) -> bool {
        if self.work < units {
            self.work = 0;
            if !self.stopped {
                self.problem("work limit exceeded (looping or absurdly shared structures?); check incomplete".into());
                self.stopped = true;
            }
            return false;
        }
        self.work -= units;
        true
    }

    fn charge_bytes(&mut self, n: u64) -> bool {
        if self.data_left < n {
            self.data_left = 0;
            self.spend(u64::MAX);
            return false;
        }
        self.data_left -= n;
        true
    }

    fn run(&mut self) {
        let img = self.img;
        let root = img.root_nid();
        let mut visited: HashSet<u64> = HashSet::from([root]);
        let mut nondirs: HashMap<u64, NonDir> = HashMap::new();
        // (nid, parent nid, path, depth)
        let mut stack: Vec<(u64, u64, Vec<u8>, usize)> = vec![(root, root, b"/".to_vec(), 0)];
        while let Some((nid, parent, path, depth)) = stack.pop() {
            if self.stopped {
                break;
            }
            let dir = match img.inode(nid) {
                Ok(d) => d,
                Err(e) => {
                    self.problem(format!("{}: {e}", path_str(&path)));
                    continue;
                }
            };
            self.report.dirs += 1;
            self.check_xattrs(&dir, &path);
            self.check_dir(&dir, parent, &path, &mut |f, ent, child_path| {
                if let Some(nd) = nondirs.get_mut(&ent.nid) {
                    nd.refs += 1;
                    if nd.file_type != ent.file_type {
                        let t = nd.file_type;
                        f.problem(format!(
                            "{}: dirent type {} but inode {} has type {t}",
                            path_str(&child_path),
                            ent.file_type,
                            ent.nid
                        ));
                    }
                    return;
                }
                let child = match img.inode(ent.nid) {
                    Ok(c) => c,
                    Err(e) => {
                        f.problem(format!("{}: {e}", path_str(&child_path)));
                        return;
                    }
                };
                f.check_type(&child, ent.file_type, &child_path);
                if child.is_dir() {
                    if !visited.insert(child.nid) {
                        f.problem(format!(
                            "{}: directory nid {} is reachable twice (cycle or directory hardlink)",
                            path_str(&child_path),
                            child.nid
                        ));
                    } else if depth + 1 > MAX_DEPTH {
                        f.problem(format!(
                            "{}: deeper than {MAX_DEPTH} levels",
                            path_str(&child_path)
                        ));
                    } else {
                        stack.push((child.nid, nid, child_path, depth + 1));
                    }
                } else {
                    f.report.files += 1;
                    f.check_file(&child, &child_path);
                    nondirs.insert(
                        child.nid,
                        NonDir {
                            path: path_str(&child_path),
                            nlink: child.nlink,
                            file_type: child.file_type(),
                            refs: 1,
                        },
                    );
                }
            });
        }
        if self.stopped {
            self.report.inodes = (visited.len() + nondirs.len()) as u64;
            return;
        }
        let mut links: Vec<(&u64, &NonDir)> = nondirs.iter().collect();
        links.sort_by_key(|(nid, _)| **nid);
        for (nid, nd) in links {
            if u64::from(nd.nlink) != nd.refs {
                let msg = format!(
                    "{}: nlink {} but {} entries point at nid {nid}",
                    nd.path, nd.nlink, nd.refs
                );
                self.problem(msg);
            }
        }
        self.report.inodes = (visited.len() + nondirs.len()) as u64;
        self.check_packed_inode(&visited, &nondirs);
        let inos = img.superblock().inos;
        if inos != self.report.inodes {
            self.problem(format!(
                "warning: superblock inos {inos} but {} inodes are reachable from the root",
                self.report.inodes
            ));
        }
    }

    /// One directory's own entries: "." is itself, ".." is `parent`, names unique and
    /// sorted (`readdir` refuses others), nlink 2 + its subdirectories (as their entries
    /// say; [`Self::check_type`] holds each to its inode). `each` gets every other entry
    /// and its path.
    fn check_dir(
        &mut self,
        dir: &Inode,
        parent: u64,
        path: &[u8],
        each: &mut dyn FnMut(&mut Self, DirEntry, Vec<u8>),
    ) {
        let img = self.img;
        let nid = dir.nid;
        let bs = u64::from(img.block_size());
        let mut seen_dot = false;
        let mut seen_dotdot = false;
        let mut subdirs: u64 = 0;
        let iter = match img.readdir(dir, 0) {
            Ok(it) => it,
            Err(e) => {
                self.problem(format!("{}: {e}", path_str(path)));
                return;
            }
        };
        for ent in iter {
            if self.stopped || !self.spend(1) {
                break;
            }
            let ent = match ent {
                Ok(e) => e,
                Err(e) => {
                    self.problem(format!("{}: {e}", path_str(path)));
                    break;
                }
            };
            // Each new block was read and parsed whole: what it holds of the
            // directory (a small one's entries sit inline, in a few bytes).
            if ent.offset % bs == 0
                && !self.charge_bytes(bs.min(dir.size.saturating_sub(ent.offset)))
            {
                break;
            }
            // readdir refuses repeated and unsorted names (the kernel binary-searches
            // them), so each name here is new.
            let shown = String::from_utf8_lossy(&ent.name).into_owned();
            let want_dir = ent.file_type == format::FT_DIR;
            if ent.name == b"." || ent.name == b".." {
                let dot = ent.name == b".";
                let target = if dot { nid } else { parent };
                if dot {
                    seen_dot = true;
                } else {
                    seen_dotdot = true;
                }
                if ent.nid != target {
                    self.problem(format!(
                        "{}: {shown:?} points to nid {} instead of {target} (nid {nid})",
                        path_str(path),
                        ent.nid
                    ));
                }
                if !want_dir {
                    self.problem(format!(
                        "{}: {shown:?} has dirent type {} instead of directory (nid {nid})",
                        path_str(path),
                        ent.file_type
                    ));
                }
                continue;
            }
            if want_dir {
                subdirs += 1;
            }
            let child_path = super::child_path(path, &ent.name);
            each(self, ent, child_path);
        }
        if !seen_dot {
            self.problem(format!("{}: no \".\" entry (nid {nid})", path_str(path)));
        }
        if !seen_dotdot {
            self.problem(format!("{}: no \"..\" entry (nid {nid})", path_str(path)));
        }
        // nlink = 2 + subdirectories is what find(1)'s leaf optimisation relies on.
        if u64::from(dir.nlink) != 2 + subdirs {
            self.problem(format!(
                "{}: directory nlink {} but it has {subdirs} subdirectories (expected {}) (nid {nid})",
                path_str(path),
                dir.nlink,
                2 + subdirs
            ));
        }
    }

    /// An entry's type is its inode's.
    fn check_type(&mut self, inode: &Inode, entry_type: u8, path: &[u8]) {
        if inode.file_type() != entry_type {
            self.problem(format!(
                "{}: dirent type {} but inode {} has type {} (mode {:#o})",
                path_str(path),
                entry_type,
                inode.nid,
                inode.file_type(),
                inode.mode
            ));
        }
    }

    fn check_file(&mut self, inode: &Inode, path: &[u8]) {
        let img = self.img;
        let p = path_str(path);
        self.check_xattrs(inode, path);
        if inode.is_symlink() {
            match img.readlink(inode) {
                Ok(t) if t.is_empty() => {
                    self.problem(format!("{p}: empty symlink target (nid {})", inode.nid))
                }
                // The VFS stops at the first NUL: the target would silently change.
                Ok(t) if t.contains(&0) => self.problem(format!(
                    "{p}: symlink target contains NUL (nid {})",
                    inode.nid
                )),
                Ok(t) => self.report.bytes += t.len() as u64,
                Err(e) => self.problem(format!("{p}: {e}")),
            }
            return;
        }
        if inode.is_reg() {
            self.regular.push((inode.nid, p.clone()));
        } else {
            if inode.size != 0 {
                self.problem(format!(
                    "{p}: special file with size {} (nid {})",
                    inode.size, inode.nid
                ));
            }
            return;
        }
        if inode.layout == crate::zformat::LAYOUT_COMPRESSED_FULL
            || inode.layout == crate::zformat::LAYOUT_COMPRESSED_COMPACT
        {
            self.check_compressed(inode, &p);
            return;
        }
        let mut buf = vec![0u8; 1 << 16];
        let mut pos = 0u64;
        while pos < inode.size {
            if self.stopped || !self.spend(1) {
                return;
            }
            let ext = match img.map(inode, pos) {
                Ok(e) => e,
                Err(e) => {
                    self.problem(format!("{p}: {e}"));
                    return;
                }
            };
            let end = ext.logical.saturating_add(ext.len).min(inode.size);
            if end <= pos {
                self.problem(format!(
                    "{p}: empty mapping at offset {pos} (nid {})",
                    inode.nid
                ));
                return;
            }
            if ext.physical.is_some() && self.read_data {
                // map() already checked the extent lies in the image; reading proves the
                // source (later: the verifier) can deliver it.
                let mut at = pos;
                while at < end {
                    let n = (end - at).min(buf.len() as u64);
                    if !self.charge_bytes(n) {
                        return;
                    }
                    if let Err(e) = img.read(inode, at, &mut buf[..n as usize]) {
                        self.problem(format!("{p}: {e}"));
                        return;
                    }
                    self.report.bytes += n;
                    at += n;
                }
            }
            pos = end;
        }
    }

    /// The packed inode (fragments) is in no directory but counts in `inos`, and its
    /// data is what the fragments of other files are read from.
    fn check_packed_inode(&mut self, visited: &HashSet<u64>, nondirs: &HashMap<u64, NonDir>) {
        let sb = self.img.superblock();
        let nid = sb.packed_nid;
        if sb.feature_incompat & crate::zformat::FEATURE_INCOMPAT_FRAGMENTS == 0 || nid == 0 {
            return;
        }
        if visited.contains(&nid) || nondirs.contains_key(&nid) {
            self.problem(format!("packed inode {nid} is also in the tree"));
            return;
        }
        self.report.inodes += 1;
        match self.img.inode(nid) {
            Ok(ino) if ino.is_reg() => {
                // Not a file of the tree: the digest table has no claim for it.
                let files = self.regular.len();
                self.check_file(&ino, b"(packed inode)");
                self.regular.truncate(files);
            }
            Ok(ino) => self.problem(format!(
                "packed inode {nid} is not a regular file (mode {:#o})",
                ino.mode
            )),
            Err(e) => self.problem(format!("packed inode: {e}")),
        }
    }

    /// Every extent maps, and (with data) every cluster decodes to its extent's length.
    fn check_compressed(&mut self, inode: &Inode, p: &str) {
        if self.stopped || !self.spend(1) {
            return;
        }
        let mut budget = self.decoded_left;
        match self.img.zcheck(inode, self.read_data, &mut budget) {
            Ok(_) if self.read_data => self.report.bytes += inode.size,
            Ok(_) => {}
            Err(e) => self.problem(format!("{p}: {e}")),
        }
        self.decoded_left = budget;
    }

    /// The digest table's claims, which a measuring mount logs (`claims.rs`).
    fn check_claims(&mut self) {
        if self.stopped {
            return;
        }
        let mut found = Vec::new();
        let files = std::mem::take(&mut self.regular);
        super::claims::check_claims(self.img, &files, true, &mut |p| found.push(p));
        for p in found {
            self.problem(p);
        }
    }

    /// The footer's namespace record is what the mount trusts to answer `security.*` with
    /// "not supported", so it must match the xattrs actually present.
    fn check_namespaces(&mut self) {
        if self.stopped {
            return;
        }
        let mut found = Vec::new();
        super::claims::namespace_problems(self.img, self.namespaces, true, &mut |p| found.push(p));
        for p in found {
            self.problem(p);
        }
    }

    fn check_xattrs(&mut self, inode: &Inode, path: &[u8]) {
        let img = self.img;
        // Bodies are read whole: charge them like data so a hostile image cannot make us
        // re-read a 256 KiB body through thousands of inodes.
        let cost = inode.xattr_size + 260 * inode.xattr_header.map_or(0, |(_, n)| u64::from(n));
        if !self.charge_bytes(cost) {
            return;
        }
        let list = match img.xattr_list(inode, false) {
            Ok(l) => l,
            Err(e) => {
                self.problem(format!("{}: {e}", path_str(path)));
                return;
            }
        };
        for x in &list {
            self.namespaces |= 1u32.checked_shl(x.index.into()).unwrap_or(0);
        }
        let mut found = Vec::new();
        super::claims::filter_problems(img, inode, &list, &path_str(path), &mut |p| found.push(p));
        for p in found {
            self.problem(p);
        }
    }
}

/// Exercises every reader entry point over the tree, bounded by `budget` work units (about
/// one per entry, lookup, xattr or KiB read), so any input finishes quickly. Errors are
/// expected on hostile input and ignored; only panics and hangs are bugs. Returns the units
/// spent. Used by the fuzz target and the mutation test.
pub fn exercise<S: ByteSource>(img: &Image<S>, budget: u64) -> u64 {
    let mut spent = 0u64;
    let mut visited: HashSet<u64> = HashSet::new();
    let mut stack = vec![img.root_nid()];
    let mut buf = vec![0u8; 8192];
    while let Some(nid) = stack.pop() {
        if spent >= budget {
            break;
        }
        if !visited.insert(nid) {
            continue;
        }
        spent += 1;
        let Ok(inode) = img.inode(nid) else { continue };
        let _ = img.layout_info(&inode).to_string();
        spent += exercise_xattrs(img, &inode);
        if inode.is_dir() {
            let mut resume = None;
            if let Ok(rd) = img.readdir(&inode, 0) {
                let bs = u64::from(img.block_size());
                for (i, ent) in rd.enumerate() {
                    spent += 1;
                    if spent >= budget {
                        break;
                    }
                    let Ok(ent) = ent else { break };
                    if ent.offset % bs == 0 {
                        spent += bs / 4096;
                    }
                    if i == 2 {
                        resume = Some(ent.next_offset);
                    }
                    // Lookups cost a few block parses each: sample them.
                    if i % 16 == 0 {
                        spent += 4;
                        let _ = img.lookup(&inode, &ent.name);
                    }
                    if !visited.contains(&ent.nid) && stack.len() < 1 << 16 {
                        stack.push(ent.nid);
                    }
                }
            }
            if let Some(off) = resume {
                if let Ok(rd) = img.readdir(&inode, off) {
                    spent += rd.take(4).count() as u64;
                }
            }
            for probe in [&b"~~~~"[..], b"", b"!", b"a/b", &[0xFF; 256]] {
                spent += 4;
                let _ = img.lookup(&inode, probe);
            }
            let _ = img
                .readdir(&inode, inode.size.saturating_sub(1))
                .map(|rd| rd.take(2).count());
            let _ = img.readdir(&inode, 5).map(|rd| rd.take(2).count());
            let _ = img.read(&inode, 0, &mut buf[..64]);
        } else {
            let _ = img.readlink(&inode);
            let _ = img.lookup(&inode, b"x");
            let _ = img.readdir(&inode, 0).map(|rd| rd.count());
            let mut pos = 0u64;
            while pos < inode.size && spent < budget {
                match img.read(&inode, pos, &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        spent += 1 + n as u64 / 1024;
                        pos += n as u64;
                    }
                }
            }
            for off in [
                inode.size.saturating_sub(1),
                inode.size,
                inode.size / 2 + 1,
                u64::MAX - 1,
            ] {
                spent += 1;
                let _ = img.read(&inode, off, &mut buf[..100]);
                let _ = img.map(&inode, off);
            }
        }
    }
    spent
}

fn exercise_xattrs<S: ByteSource>(img: &Image<S>, inode: &Inode) -> u64 {
    let mut spent = 1;
    if let Ok(names) = img.listxattr(inode) {
        for n in names.iter().take(64) {
            spent += 1;
            let _ = img.getxattr(inode, n);
        }
    }
    if let Ok(all) = img.xattrs(inode) {
        spent += all.len() as u64 + all.iter().map(|(_, v)| v.len() as u64 / 1024).sum::<u64>();
    }
    for probe in [
        &b"system.posix_acl_access"[..],
        b"system.posix_acl_default",
        b"security.selinux",
        b"trusted.overlay.redirect",
        b"user.foo",
        b"system.foo",
    ] {
        spent += 1;
        let _ = img.xattr_filter_says_absent(inode, probe);
        let _ = img.getxattr(inode, probe);
    }
    spent
}
