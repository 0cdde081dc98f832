//! What the kernel's erofs parses, checked a structure at a time as its bytes are first served
//! (remote images; why: docs/SECURITY.md section 11).
//!
//! - The unit: an inode and all the kernel parses for it.
//! - Every inode a checked directory names is known; a page is served only once each known
//!   inode whose header lies in a served page is checked.
//! - Not checked: link counts, the superblock's inode count.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::{path_str, Budget, Fsck, MAX_DEPTH};
use crate::format;
use crate::read::{ByteSource, Image};

/// The kernel's page: the unit it reads an image file in and caches.
const PAGE_BITS: u32 = 12;
/// How much of a directory [`LazyCheck::warm`] reads ahead, in runs of at most so many
/// bytes.
const WARM_RUNS: usize = 16;
const WARM_BYTES: u64 = 1 << 20;
/// The data extents recorded of one file ([`LazyCheck::file_extent`]).
const EXTENTS: usize = 64;
/// The most bytes of an inode's header (an extended inode).
const HEADER: u64 = format::INODE_EXTENDED_SIZE as u64;

/// An image's metadata, checked as the kernel comes to read it ([`LazyCheck::serve`]).
pub struct LazyCheck<S: ByteSource> {
    img: Image<S>,
    /// One bit per page: served, so everything known in it is checked. Only ever set.
    served: Vec<AtomicU64>,
    /// Where checked files' data lies: start → (end, whether the file is executable), in
    /// bytes of the image (apart from `state`: asked before reads, never behind a check).
    extents: Mutex<BTreeMap<u64, (u64, bool)>>,
    /// The image's pages.
    pages: u64,
    state: Mutex<State>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Checked {
    Not,
    Clean,
    Refused(String),
}

/// An inode some checked entry names.
struct Known {
    /// The directory whose entry names it first (the root names itself).
    parent: u64,
    name: Box<[u8]>,
    /// What that entry says it is (`format::FT_*`).
    file_type: u8,
    depth: usize,
    checked: Checked,
}

struct State {
    budget: Budget,
    known: HashMap<u64, Known>,
    /// Known inodes not checked yet, by the pages their header touches.
    pending: HashMap<u64, Vec<u64>>,
    /// Pages refused, and why: never served.
    refused: HashMap<u64, String>,
}

impl<S: ByteSource> LazyCheck<S> {
    /// Checks the root directory and the packed inode (the kernel reads both as it
    /// mounts): their problems are the error.
    pub fn new(img: Image<S>) -> Result<LazyCheck<S>, String> {
        let pages = img.image_len().div_ceil(1 << PAGE_BITS);
        let words = usize::try_from(pages.div_ceil(64)).map_err(|_| "image too large")?;
        let root = img.root_nid();
        let mut known = HashMap::new();
        known.insert(
            root,
            Known {
                parent: root,
                name: Box::default(),
                file_type: format::FT_DIR,
                depth: 0,
                checked: Checked::Not,
            },
        );
        let packed = packed_nid(&img);
        if let Some(nid) = packed {
            known.insert(
                nid,
                Known {
                    parent: root,
                    name: b"(packed inode)".to_vec().into_boxed_slice(),
                    file_type: format::FT_REG_FILE,
                    depth: 1,
                    checked: Checked::Not,
                },
            );
        }
        let lazy = LazyCheck {
            served: (0..words).map(|_| AtomicU64::new(0)).collect(),
            pages,
            state: Mutex::new(State {
                budget: Budget::for_image(img.image_len()),
                known,
                pending: HashMap::new(),
                refused: HashMap::new(),
            }),
            extents: Mutex::new(BTreeMap::new()),
            img,
        };
        {
            let mut st = lazy.lock();
            let mut work: Vec<u64> = [root].into_iter().chain(packed).collect();
            while let Some(nid) = work.pop() {
                lazy.check(&mut st, nid, &[], &mut work)?;
            }
        }
        Ok(lazy)
    }

    /// Call before serving `[offset, offset + len)`: checks what the pages it touches
    /// hold of what is known. An error is the first problem found (the pages are then
    /// refused for good and must not be served).
    pub fn serve(&self, offset: u64, len: u64) -> Result<(), String> {
        if len == 0 {
            return Ok(());
        }
        let first = offset >> PAGE_BITS;
        let last = offset.saturating_add(len - 1) >> PAGE_BITS;
        if (first..=last).all(|p| self.is_served(p)) {
            return Ok(());
        }
        let mut st = self.lock();
        // Served while this waited, or still to be: in order, for the search below.
        let pages: Vec<u64> = (first..=last).filter(|&p| !self.is_served(p)).collect();
        if let Some(why) = pages.iter().find_map(|p| st.refused.get(p)) {
            return Err(why.clone());
        }
        let mut work: Vec<(u64, u64)> = Vec::new();
        for &p in &pages {
            for nid in st.pending.remove(&p).unwrap_or_default() {
                work.push((nid, p));
            }
        }
        while let Some((nid, page)) = work.pop() {
            let mut more = Vec::new();
            if let Err(why) = self.check(&mut st, nid, &pages, &mut more) {
                st.refused.insert(page, why.clone());
                // Left as they were: checked when next needed.
                for (nid, _) in work {
                    self.wait(&mut st, nid);
                }
                return Err(why);
            }
            work.extend(more.into_iter().map(|n| (n, page)));
        }
        for p in pages {
            if let Some(word) = self.served.get((p / 64) as usize) {
                word.fetch_or(1 << (p % 64), Ordering::Release);
            }
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while checking leaves nothing half-done that matters: at worst an
        // inode is checked again.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether page `p` was served (pages past the image count as served: nothing is
    /// read there, and an inode said to be there is checked, and refused, at once).
    fn is_served(&self, p: u64) -> bool {
        p >= self.pages
            || usize::try_from(p / 64)
                .ok()
                .and_then(|i| self.served.get(i))
                .is_none_or(|w| w.load(Ordering::Acquire) & (1 << (p % 64)) != 0)
    }

    /// The pages inode `nid`'s header may touch (none if it cannot lie in the image).
    fn header_pages(&self, nid: u64) -> Option<(u64, u64)> {
        let start = nid
            .checked_mul(1 << format::ISLOT_BITS)
            .and_then(|o| o.checked_add(self.img.meta_base))?;
        let end = start.checked_add(HEADER - 1)?;
        Some((start >> PAGE_BITS, end >> PAGE_BITS))
    }

    /// A known inode not yet checked: checked now (pushed to `work`) if its header lies
    /// in a page served or being served (`serving`), else when that page is served.
    fn wait(&self, st: &mut State, nid: u64) {
        if st.known.get(&nid).is_none_or(|k| k.checked != Checked::Not) {
            return;
        }
        if let Some((a, b)) = self.header_pages(nid) {
            for p in a..=b {
                let list = st.pending.entry(p).or_default();
                if !list.contains(&nid) {
                    list.push(nid);
                }
            }
        }
    }

    fn due(&self, nid: u64, serving: &[u64]) -> bool {
        self.header_pages(nid).is_none_or(|(a, b)| {
            (a..=b).any(|p| self.is_served(p) || serving.binary_search(&p).is_ok())
        })
    }

    /// `/a/b` of a known inode, from the entries that named it.
    fn path(st: &State, nid: u64) -> Vec<u8> {
        let mut names = Vec::new();
        let mut at = nid;
        while let Some(k) = st.known.get(&at) {
            if k.parent == at || names.len() > MAX_DEPTH {
                break;
            }
            names.push(&k.name);
            at = k.parent;
        }
        let mut path = b"/".to_vec();
        for name in names.iter().rev() {
            path = crate::read::child_path(&path, name);
        }
        path
    }

    /// Checks known inode `nid` once: itself (what `Fsck` checks of one inode), and for
    /// a directory its entries, each inode they name becoming known; those due now are
    /// pushed to `work`.
    fn check(
        &self,
        st: &mut State,
        nid: u64,
        serving: &[u64],
        work: &mut Vec<u64>,
    ) -> Result<(), String> {
        let Some(k) = st.known.get(&nid) else {
            return Ok(());
        };
        match &k.checked {
            Checked::Clean => return Ok(()),
            Checked::Refused(why) => return Err(why.clone()),
            Checked::Not => {}
        }
        let (parent, entry_type, depth) = (k.parent, k.file_type, k.depth);
        let path = Self::path(st, nid);
        let mut f = Fsck::new(&self.img, 1, false, st.budget);
        let mut children = Vec::new();
        match self.img.inode(nid) {
            Err(e) => f.problem(format!("{}: {e}", path_str(&path))),
            Ok(inode) => {
                f.check_type(&inode, entry_type, &path);
                if inode.is_dir() && entry_type == format::FT_DIR {
                    self.warm(&inode);
                    f.check_xattrs(&inode, &path);
                    f.check_dir(&inode, parent, &path, &mut |_, ent, child_path| {
                        children.push((ent, child_path));
                    });
                } else if !f.stopped {
                    f.check_file(&inode, &path);
                    if f.report.problems.is_empty() && inode.is_reg() {
                        self.record_extents(&inode);
                    }
                }
            }
        }
        st.budget = f.budget();
        let mut problem = f.report.problems.into_iter().next();
        if problem.is_none() {
            problem = self.learn(st, nid, depth, children, serving, work).err();
        }
        let k = st.known.get_mut(&nid).expect("known above");
        match problem {
            None => {
                k.checked = Checked::Clean;
                Ok(())
            }
            Some(why) => {
                k.checked = Checked::Refused(why.clone());
                Err(why)
            }
        }
    }

    /// The image bytes of the checked file's data extent holding byte `offset`, and
    /// whether that file is executable: where a reader of that file goes on reading (for
    /// read-ahead; the image's word only).
    pub fn file_extent(&self, offset: u64) -> Option<(std::ops::Range<u64>, bool)> {
        let extents = self.extents.lock().unwrap_or_else(|e| e.into_inner());
        let (&start, &(end, exec)) = extents.range(..=offset).next_back()?;
        (offset < end).then_some((start..end, exec))
    }

    /// Records where a checked regular file's data lies (its first [`EXTENTS`] stored,
    /// unencoded extents).
    fn record_extents(&self, inode: &crate::read::Inode) {
        let runs = self.stored_runs(inode, EXTENTS, u64::MAX);
        let exec = inode.mode & 0o111 != 0;
        self.extents
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(
                runs.into_iter()
                    .map(|(at, n)| (at, (at.saturating_add(n), exec))),
            );
    }

    /// Reads a directory's blocks a run at a time before its entries are parsed a block
    /// at a time: a remote image fetches each run in one request, not one per block.
    /// Only a head start (what fails here fails the check after it): at most
    /// [`WARM_RUNS`] runs of [`WARM_BYTES`].
    fn warm(&self, dir: &crate::read::Inode) {
        let mut buf = Vec::new();
        for (at, n) in self.stored_runs(dir, WARM_RUNS, WARM_BYTES) {
            buf.resize(n as usize, 0);
            if self.img.src.read_exact_at(&mut buf, at).is_err() {
                return;
            }
        }
    }

    /// Records the inodes a checked directory's entries name (each directory once).
    fn learn(
        &self,
        st: &mut State,
        dir: u64,
        depth: usize,
        children: Vec<(crate::read::DirEntry, Vec<u8>)>,
        serving: &[u64],
        work: &mut Vec<u64>,
    ) -> Result<(), String> {
        for (ent, path) in children {
            let shown = path_str(&path);
            if self.is_packed(ent.nid) {
                return Err(format!("{shown}: names the packed inode {}", ent.nid));
            }
            match st.known.get(&ent.nid) {
                None => {
                    if ent.file_type == format::FT_DIR && depth + 1 > MAX_DEPTH {
                        return Err(format!("{shown}: deeper than {MAX_DEPTH} levels"));
                    }
                    st.known.insert(
                        ent.nid,
                        Known {
                            parent: dir,
                            name: ent.name.into_boxed_slice(),
                            file_type: ent.file_type,
                            depth: depth + 1,
                            checked: Checked::Not,
                        },
                    );
                }
                Some(k) if k.file_type == format::FT_DIR || ent.file_type == format::FT_DIR => {
                    return Err(if k.file_type == ent.file_type {
                        format!(
                            "{shown}: directory nid {} is reachable twice (cycle or directory hardlink)",
                            ent.nid
                        )
                    } else {
                        format!(
                            "{shown}: dirent type {} but inode {} has type {}",
                            ent.file_type, ent.nid, k.file_type
                        )
                    });
                }
                Some(k) if k.file_type != ent.file_type => {
                    return Err(format!(
                        "{shown}: dirent type {} but inode {} has type {}",
                        ent.file_type, ent.nid, k.file_type
                    ));
                }
                Some(Known {
                    checked: Checked::Refused(why),
                    ..
                }) => return Err(why.clone()),
                Some(_) => {}
            }
            if self.due(ent.nid, serving) {
                if st.known[&ent.nid].checked == Checked::Not {
                    work.push(ent.nid);
                }
            } else {
                self.wait(st, ent.nid);
            }
        }
        Ok(())
    }

    fn is_packed(&self, nid: u64) -> bool {
        packed_nid(&self.img) == Some(nid)
    }

    /// Where `inode`'s stored, unencoded bytes lie in the image, in order, as
    /// `(offset, length)` runs of at most `longest` bytes, from at most `max` steps
    /// through its extents (holes and encoded extents take a step and give no run).
    fn stored_runs(&self, inode: &crate::read::Inode, max: usize, longest: u64) -> Vec<(u64, u64)> {
        let mut runs = Vec::new();
        let mut pos = 0;
        for _ in 0..max {
            let Ok(e) = self.img.map(inode, pos) else {
                break;
            };
            let end = e.logical.saturating_add(e.len).min(inode.size);
            if end <= pos {
                break;
            }
            let n = (end - pos).min(longest);
            if let Some(at) = e.physical.filter(|_| !e.encoded) {
                runs.push((at.saturating_add(pos - e.logical), n));
            }
            pos += n;
            if pos >= inode.size {
                break;
            }
        }
        runs
    }
}

/// The packed inode (fragments), which the kernel reads as it mounts.
fn packed_nid<S: ByteSource>(img: &Image<S>) -> Option<u64> {
    let sb = img.superblock();
    (sb.feature_incompat & crate::zformat::FEATURE_INCOMPAT_FRAGMENTS != 0 && sb.packed_nid != 0)
        .then_some(sb.packed_nid)
}
