//! Checking what an image claims about itself (`verilay fsck` and `verilay verify`): the
//! file-digest table (each regular file has exactly one entry, entries are sorted by nid
//! and name only regular files, each claimed digest is the digest of the file's contents),
//! the footer's record of which xattr namespaces occur, and each inode's xattr name filter.

use super::xattr::Xattr;
use super::{ByteSource, Image, Inode};
use crate::format::{self, raw, DIGEST_ENTRY_SIZE, DIGEST_FOOTER_SIZE};
use std::collections::{HashMap, HashSet, VecDeque};
use zerocopy::little_endian::U64;
use zerocopy::IntoBytes;

/// The xattr name filter must not hide a name the inode has (the kernel trusts it).
pub(crate) fn filter_problems<S: ByteSource>(
    img: &Image<S>,
    inode: &Inode,
    list: &[Xattr],
    path: &str,
    problem: &mut dyn FnMut(String),
) {
    let Some((filter, _)) = inode.xattr_header else {
        return;
    };
    if !img.xattr_filter_enabled() {
        return;
    }
    for x in list {
        let bit = format::xattr_filter_bit(x.index, &x.suffix);
        if filter & (1 << bit) != 0 {
            problem(format!(
                "{path}: xattr {:?} (entry at byte {}) is hidden by the name filter {filter:#010x} (bit {bit}) (nid {})",
                String::from_utf8_lossy(&x.full_name()),
                x.offset,
                inode.nid
            ));
        }
    }
}

/// The footer's record of xattr namespaces, which the mount trusts to answer names in
/// absent ones without looking, against `seen`, the namespaces of every xattr met. After
/// a walk that could not reach everything (`complete` false), only a namespace met but
/// not recorded is a problem.
pub(crate) fn namespace_problems<S: ByteSource>(
    img: &Image<S>,
    seen: u32,
    complete: bool,
    problem: &mut dyn FnMut(String),
) {
    match img.digest_table() {
        Ok(Some(f)) => match f.namespaces {
            Some(recorded) if recorded != seen && (complete || seen & !recorded != 0) => problem(format!(
                "file digest table footer records xattr namespaces {recorded:#x}, but the tree has {seen:#x}"
            )),
            _ => {}
        },
        Ok(None) => {}
        Err(e) => problem(e.to_string()),
    }
}

/// The regular files of the tree, `(nid, path)`, each once (hardlinks by their first
/// path), breadth-first, with the namespace bits of every xattr met; every inode's name
/// filter is checked on the way (a problem goes to `problem`). What cannot be read is
/// skipped and said to `unwalked`: what lies behind it is not served either.
pub(crate) fn regular_files<S: ByteSource>(
    img: &Image<S>,
    namespaces: &mut u32,
    problem: &mut dyn FnMut(String),
    unwalked: &mut dyn FnMut(String),
) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    let mut queue = VecDeque::from([(img.root_nid(), b"/".to_vec())]);
    let mut seen = HashSet::new();
    // Each entry is read at most once per directory reached once; bounded by the image.
    let budget = img.image_len() / 8 + 1024;
    let mut entries = 0u64;
    while let Some((nid, path)) = queue.pop_front() {
        if !seen.insert(nid) {
            continue;
        }
        let shown = String::from_utf8_lossy(&path).into_owned();
        let inode = match img.inode(nid) {
            Ok(i) => i,
            Err(e) => {
                unwalked(format!("{shown}: {e}"));
                continue;
            }
        };
        match img.xattr_list(&inode, false) {
            Ok(list) => {
                for x in &list {
                    *namespaces |= 1u32.checked_shl(x.index.into()).unwrap_or(0);
                }
                filter_problems(img, &inode, &list, &shown, problem);
            }
            Err(e) => unwalked(format!("{shown}: {e}")),
        }
        if inode.is_reg() {
            out.push((nid, shown));
            continue;
        }
        if !inode.is_dir() {
            continue;
        }
        let dir = match img.readdir(&inode, 0) {
            Ok(d) => d,
            Err(e) => {
                unwalked(format!("{shown}: {e}"));
                continue;
            }
        };
        for e in dir {
            entries += 1;
            if entries > budget {
                unwalked("more directory entries than the image can hold; walk stopped".into());
                return out;
            }
            let e = match e {
                Ok(e) => e,
                Err(e) => {
                    unwalked(format!("{shown}: {e}"));
                    break;
                }
            };
            if e.name == b"." || e.name == b".." {
                continue;
            }
            queue.push_back((e.nid, super::child_path(&path, &e.name)));
        }
    }
    out
}

/// Checks the table's claims for `files` (from [`regular_files`] or fsck's own walk;
/// `complete` when that walk reached the whole tree, so an entry for any other inode is
/// a problem). Images without a table have no claims to check.
pub(crate) fn check_claims<S: ByteSource>(
    img: &Image<S>,
    files: &[(u64, String)],
    complete: bool,
    problem: &mut dyn FnMut(String),
) {
    let footer = match img.digest_table() {
        Ok(Some(f)) => f,
        Ok(None) => return,
        Err(e) => return problem(format!("file digest table: {e}")),
    };
    // One unit per data block or hole run of each file, each standing for at least 4
    // bytes of image (a chunk index entry): one unit per image byte lets every honest
    // image through, while files sharing the same blocks cannot multiply the work
    // without limit.
    let mut budget = img.image_len().saturating_add(1 << 20);
    for (nid, path) in files {
        let inode = match img.inode(*nid) {
            Ok(i) => i,
            Err(e) => {
                problem(format!("{path}: {e}"));
                continue;
            }
        };
        let checked = img
            .content_digest_within(&inode, &mut budget)
            .and_then(|d| d.map(|d| img.check_claim(&inode, d)).transpose());
        match checked {
            Ok(Some(())) => {}
            Ok(None) => {
                return problem(
                    "files share more data than the image can hold; digest check stopped".into(),
                )
            }
            Err(e) => problem(format!("{path}: {e}")),
        }
    }
    // The padding between the last entry and the footer: zeros, and read, so every block
    // of the table passes through the (verifying) source.
    let pad_at = footer.table_offset + footer.entries * DIGEST_ENTRY_SIZE;
    let pad_end = img.erofs_len() - DIGEST_FOOTER_SIZE;
    if pad_end - pad_at >= u64::from(img.block_size()) {
        problem(format!(
            "file digest table: its entries end at byte {pad_at}, a block or more before its footer"
        ));
    }
    let mut pad = vec![0u8; (pad_end - pad_at).min(1 << 20) as usize];
    match img.read_at(&mut pad, pad_at, || "file digest table padding".into()) {
        Ok(()) => {
            if let Some(i) = pad.iter().position(|&b| b != 0) {
                problem(format!(
                    "file digest table: byte {} between the entries and the footer is not zero",
                    pad_at + i as u64
                ));
            }
        }
        Err(e) => problem(format!("file digest table: {e}")),
    }
    let regular: HashMap<u64, &str> = files.iter().map(|(n, p)| (*n, p.as_str())).collect();
    let mut prev: Option<u64> = None;
    for i in 0..footer.entries {
        let at = footer.table_offset + i * DIGEST_ENTRY_SIZE;
        let mut nid = U64::ZERO;
        let nid_at = at + core::mem::offset_of!(raw::DigestEntry, nid) as u64;
        if let Err(e) = img.read_at(nid.as_mut_bytes(), nid_at, || {
            "file digest table entry".into()
        }) {
            return problem(format!("file digest table: {e}"));
        }
        let nid = nid.get();
        if prev.is_some_and(|p| p >= nid) {
            problem(format!(
                "file digest table entry {i} at byte {at}: nid {nid} is not after the previous entry's"
            ));
        }
        prev = Some(nid);
        if complete && !regular.contains_key(&nid) {
            problem(format!(
                "file digest table entry {i} at byte {at} names inode {nid}, which is no regular file of the tree"
            ));
        }
    }
}

/// What [`Image::check_claims`] found.
#[derive(Debug, Default)]
pub struct ClaimsReport {
    /// Claims that do not hold.
    pub problems: Vec<String>,
    /// Parts of the tree the reader refuses (structure: see `fsck`), whose claims were not
    /// checked; nothing there can be served either.
    pub unchecked: Vec<String>,
}

impl<S: ByteSource> Image<S> {
    /// Every claim the image makes about itself that does not hold, at most `max` of
    /// them: file digests, the namespace record, name filters (a walk of the tree and its
    /// xattrs, no file data read).
    pub fn check_claims(&self, max: usize) -> ClaimsReport {
        let mut r = ClaimsReport::default();
        let mut problems = Vec::new();
        let mut sink = |p: String| {
            if problems.len() < max {
                problems.push(p);
            }
        };
        let mut namespaces = 0;
        let files = regular_files(self, &mut namespaces, &mut sink, &mut |p| {
            if r.unchecked.len() < max {
                r.unchecked.push(p)
            }
        });
        let complete = r.unchecked.is_empty();
        namespace_problems(self, namespaces, complete, &mut sink);
        check_claims(self, &files, complete, &mut sink);
        r.problems = problems;
        r
    }
}
