//! The reader against images made by erofs-utils' `mkfs.erofs`, compared field by field with
//! the source tree they were made from.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use common::{have_mkfs, make_tree, mkfs, Rng, TempDir};
use erofs::format;
use erofs::read::{exercise, fsck, DirEntry, Image, Inode};

/// Image variants: default (inline tails), no inline data, and both chunk index formats.
const VARIANTS: &[&[&str]] = &[
    &[],
    &["-Enoinline_data"],
    &["--chunksize=4096"],
    &["--chunksize=16384", "-Eforce-chunk-indexes"],
    // Every mtime = epoch: (almost) all inodes compact.
    &["-T1600000000"],
];

fn src_xattrs(path: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut list = vec![Default::default(); 65536];
    let n = rustix::fs::llistxattr(path, &mut list).expect("llistxattr");
    #[allow(clippy::unnecessary_cast)]
    let list: Vec<u8> = list[..n].iter().map(|&c| c as u8).collect();
    for name in list.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        // Names without a kernel EROFS handler are dropped by mkfs and invisible anyway.
        if format::split_xattr_name(name).is_none() {
            continue;
        }
        let mut v = vec![0u8; 65536];
        let cname = std::ffi::CString::new(name).unwrap();
        let n = rustix::fs::lgetxattr(path, cname.as_c_str(), &mut v).expect("lgetxattr");
        v.truncate(n);
        out.insert(name.to_vec(), v);
    }
    out
}

struct Walk<'a> {
    img: &'a Image<Vec<u8>>,
    variant: String,
    /// `-T`: every inode carries this mtime instead of the source's.
    fixed_mtime: Option<i64>,
    compact: usize,
    inodes: usize,
    bytes: u64,
    xattrs: usize,
    rng: Rng,
}

impl Walk<'_> {
    fn ctx(&self, p: &Path) -> String {
        format!("[{}] {}", self.variant, p.display())
    }

    fn compare_inode(&mut self, path: &Path, ino: &Inode) {
        let ctx = self.ctx(path);
        let meta = fs::symlink_metadata(path).unwrap();
        assert_eq!(u32::from(ino.mode), meta.mode(), "{ctx}: mode");
        assert_eq!(ino.uid, meta.uid(), "{ctx}: uid");
        assert_eq!(ino.gid, meta.gid(), "{ctx}: gid");
        assert_eq!(u64::from(ino.nlink), meta.nlink(), "{ctx}: nlink");
        if let Some(t) = self.fixed_mtime {
            assert_eq!(ino.mtime, t, "{ctx}: -T mtime");
        } else {
            assert_eq!(ino.mtime, meta.mtime(), "{ctx}: mtime seconds");
        }
        if !ino.extended {
            self.compact += 1;
        } else if self.fixed_mtime.is_none() {
            // Compact inodes take the superblock's fixed nanoseconds; extended ones are exact.
            assert_eq!(
                i64::from(ino.mtime_nsec),
                meta.mtime_nsec(),
                "{ctx}: mtime nsec"
            );
        }
        assert_eq!(ino.is_dir(), meta.is_dir(), "{ctx}: is_dir");
        assert_eq!(
            ino.file_type(),
            format::file_type_of(meta.mode() as u16).unwrap(),
            "{ctx}: type"
        );
        let ft = meta.file_type();
        use std::os::unix::fs::FileTypeExt;
        if ft.is_char_device() || ft.is_block_device() {
            let rdev = meta.rdev();
            assert_eq!(
                ino.rdev,
                (rustix::fs::major(rdev), rustix::fs::minor(rdev)),
                "{ctx}: rdev"
            );
        }
        if !meta.is_dir() {
            assert_eq!(ino.size, meta.len(), "{ctx}: size");
        }
        if meta.is_file() {
            self.compare_content(path, ino);
        }
        if meta.file_type().is_symlink() {
            let want = fs::read_link(path).unwrap();
            assert_eq!(
                self.img.readlink(ino).unwrap(),
                want.as_os_str().as_bytes(),
                "{ctx}: symlink"
            );
        } else {
            assert!(
                self.img.readlink(ino).is_err(),
                "{ctx}: readlink on a non-symlink"
            );
        }
        // Xattrs: same set and values, listxattr order inline-then-shared is not checked
        // against the source (which has its own order), only as a set.
        let want = src_xattrs(path);
        let got: BTreeMap<Vec<u8>, Vec<u8>> = self.img.xattrs(ino).unwrap().into_iter().collect();
        assert_eq!(got, want, "{ctx}: xattrs");
        let listed = self.img.listxattr(ino).unwrap();
        assert_eq!(listed.len(), want.len(), "{ctx}: listxattr");
        for (name, value) in &want {
            assert_eq!(
                self.img.getxattr(ino, name).unwrap().as_ref(),
                Some(value),
                "{ctx}: getxattr {name:?}"
            );
            assert!(
                !self.img.xattr_filter_says_absent(ino, name),
                "{ctx}: filter hides {name:?}"
            );
        }
        for absent in [
            &b"user.absent"[..],
            b"system.posix_acl_default",
            b"security.selinux",
            b"bogus.name",
        ] {
            if !want.contains_key(absent) {
                assert_eq!(
                    self.img.getxattr(ino, absent).unwrap(),
                    None,
                    "{ctx}: absent {absent:?}"
                );
            }
        }
        self.xattrs += want.len();
        self.inodes += 1;
    }

    fn compare_content(&mut self, path: &Path, ino: &Inode) {
        let ctx = self.ctx(path);
        let want = fs::read(path).unwrap();
        // Sequential reads in an odd chunk size cross every block and extent boundary.
        let mut got = Vec::with_capacity(want.len());
        let mut buf = vec![0u8; 4093];
        loop {
            let n = self.img.read(ino, got.len() as u64, &mut buf).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        assert!(
            got == want,
            "{ctx}: content differs ({} vs {} bytes)",
            got.len(),
            want.len()
        );
        // Random preads, including past EOF.
        for _ in 0..8 {
            let off = self.rng.below(want.len() as u64 + 10);
            let len = self.rng.below(20_000) as usize;
            let mut b = vec![0xAAu8; len];
            let n = self.img.read(ino, off, &mut b).unwrap();
            let expect = want
                .get(off as usize..)
                .map_or(&[][..], |t| &t[..t.len().min(len)]);
            assert_eq!(&b[..n], expect, "{ctx}: pread {off}+{len}");
        }
        self.bytes += want.len() as u64;
    }

    fn compare_dir(&mut self, src: &Path, dir: &Inode, parent: u64) -> Vec<(PathBuf, Inode)> {
        let ctx = self.ctx(src);
        let mut names: Vec<Vec<u8>> = fs::read_dir(src)
            .unwrap()
            .map(|e| e.unwrap().file_name().as_bytes().to_vec())
            .collect();
        names.push(b".".to_vec());
        names.push(b"..".to_vec());
        names.sort();
        let ents: Vec<DirEntry> = self
            .img
            .readdir(dir, 0)
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let got: Vec<Vec<u8>> = ents.iter().map(|e| e.name.clone()).collect();
        // readdir order is the on-disk order, which must be memcmp-sorted for lookups.
        assert_eq!(got, names, "{ctx}: readdir names/order");
        let bs = u64::from(self.img.block_size());
        for (i, e) in ents.iter().enumerate() {
            assert_eq!(e.offset % bs % 12, 0, "{ctx}: offset {}", e.offset);
            assert!(e.next_offset > e.offset, "{ctx}: next_offset");
            if let Some(next) = ents.get(i + 1) {
                // Resuming from any returned position yields exactly the rest.
                if i % 37 == 0 || next.offset / bs != e.offset / bs {
                    let resumed: Vec<DirEntry> = self
                        .img
                        .readdir(dir, e.next_offset)
                        .unwrap()
                        .take(2)
                        .map(Result::unwrap)
                        .collect();
                    assert_eq!(
                        resumed.first(),
                        Some(next),
                        "{ctx}: resume after {:?}",
                        e.name
                    );
                }
            } else {
                assert_eq!(
                    self.img.readdir(dir, e.next_offset).unwrap().count(),
                    0,
                    "{ctx}: resume at end"
                );
            }
            let found = self.img.lookup(dir, &e.name).unwrap();
            assert_eq!(
                found.as_ref(),
                Some(e),
                "{ctx}: lookup {:?}",
                String::from_utf8_lossy(&e.name)
            );
        }
        for absent in [&b"zzzz-absent"[..], b"entry-", b"\x01", b"~", b"a/b", b""] {
            assert_eq!(
                self.img.lookup(dir, absent).unwrap(),
                None,
                "{ctx}: lookup {absent:?}"
            );
        }
        let find = |n: &[u8]| ents.iter().find(|e| e.name == n).unwrap();
        assert_eq!(find(b".").nid, dir.nid, "{ctx}: '.'");
        assert_eq!(find(b"..").nid, parent, "{ctx}: '..'");
        let mut children = Vec::new();
        for e in &ents {
            if e.name == b"." || e.name == b".." {
                continue;
            }
            let p = src.join(std::ffi::OsStr::from_bytes(&e.name));
            let ino = self.img.inode(e.nid).unwrap();
            assert_eq!(
                e.file_type,
                ino.file_type(),
                "{ctx}: dirent type of {}",
                p.display()
            );
            self.compare_inode(&p, &ino);
            if ino.is_dir() {
                children.push((p, ino));
            }
        }
        children
    }
}

/// Opens `bytes`, compares every inode with the source tree, runs fsck and exercise.
fn walk_image(
    tree: &Path,
    bytes: Vec<u8>,
    variant: &str,
    fixed_mtime: Option<i64>,
) -> (Image<Vec<u8>>, Inode, erofs::read::FsckReport, Stats) {
    let img = Image::open(bytes).unwrap_or_else(|e| panic!("[{variant}] open: {e}"));
    let root = img.inode(img.root_nid()).unwrap();
    let mut w = Walk {
        img: &img,
        variant: variant.to_string(),
        fixed_mtime,
        compact: 0,
        inodes: 0,
        bytes: 0,
        xattrs: 0,
        rng: Rng(7),
    };
    w.compare_inode(tree, &root);
    let mut stack = vec![(tree.to_path_buf(), root.clone(), root.nid)];
    while let Some((p, d, parent)) = stack.pop() {
        for (cp, ci) in w.compare_dir(&p, &d, parent) {
            stack.push((cp, ci, d.nid));
        }
    }
    let report = fsck(&img, 100);
    assert!(
        report.is_clean(),
        "[{variant}] fsck: {:#?}",
        report.problems
    );
    let spent = exercise(&img, 1 << 20);
    println!(
        "[{variant}] {} inodes ({} compact), {} data bytes, {} xattrs compared; fsck: {} inodes {} dirs {} files {} bytes; exercise {spent} units",
        w.inodes, w.compact, w.bytes, w.xattrs, report.inodes, report.dirs, report.files, report.bytes
    );
    let stats = Stats {
        compact: w.compact,
        xattrs: w.xattrs,
    };
    (img, root, report, stats)
}

struct Stats {
    compact: usize,
    xattrs: usize,
}

fn check_variant(tree: &Path, args: &[&str]) {
    let bytes = mkfs(tree, args);
    let fixed_mtime = args
        .iter()
        .find_map(|a| a.strip_prefix("-T"))
        .map(|t| t.parse().unwrap());
    let (img, root, report, w) = walk_image(tree, bytes, &format!("{args:?}"), fixed_mtime);
    // The variants must really exercise the layouts they are meant to.
    let big = img
        .inode(img.lookup(&root, b"f09").unwrap().unwrap().nid)
        .unwrap();
    let small = img
        .inode(img.lookup(&root, b"f02").unwrap().unwrap().nid)
        .unwrap();
    let info = img.layout_info(&big);
    println!("  f09: {info}\n  f02: {}", img.layout_info(&small));
    let (layout, unit) = match args.first().copied() {
        None | Some("-T1600000000") => (format::LAYOUT_FLAT_INLINE, None),
        Some("-Enoinline_data") => (format::LAYOUT_FLAT_PLAIN, None),
        Some("--chunksize=4096") => (format::LAYOUT_CHUNK_BASED, Some(4)),
        _ => (format::LAYOUT_CHUNK_BASED, Some(8)),
    };
    assert_eq!(big.layout, layout, "[{args:?}] layout of f09");
    assert_eq!(
        info.chunk_index.map(|(_, u)| u),
        unit,
        "[{args:?}] chunk index size"
    );
    if unit.is_none() {
        assert_eq!(small.layout, layout, "[{args:?}] layout of f02");
    }
    assert!(w.xattrs >= 10 && report.files > 600, "tree too small?");
    if fixed_mtime.is_some() {
        assert!(w.compact > 600, "-T should give compact inodes");
    }
}

/// Where mkfs.erofs runs: a temp dir (named after `name`) with `make_tree`'s tree (`big`
/// or not) in `tree`; None, with the skip recorded, where it does not.
fn mkfs_and_tree(name: &str, big: bool) -> Option<(TempDir, std::path::PathBuf)> {
    if !have_mkfs() {
        return None;
    }
    let tmp = TempDir::new(name);
    let tree = tmp.path().join("tree");
    fs::create_dir(&tree).unwrap();
    make_tree(&tree, big);
    Some((tmp, tree))
}

#[test]
fn mkfs_erofs_images_match_source_tree() {
    let Some((_tmp, tree)) = mkfs_and_tree("reader", true) else {
        return;
    };
    for args in VARIANTS {
        check_variant(&tree, args);
    }
}

#[test]
fn file_source_reads_like_memory() {
    let Some((tmp, tree)) = mkfs_and_tree("filesrc", false) else {
        return;
    };
    let bytes = mkfs(&tree, &[]);
    let path = tmp.path().join("x.img");
    fs::write(&path, &bytes).unwrap();
    let file_img = Image::open(erofs::read::FileSource::open(&path).unwrap()).unwrap();
    let mem_img = Image::open(std::sync::Arc::<[u8]>::from(bytes)).unwrap();
    let a = fsck(&file_img, 10);
    let b = fsck(&mem_img, 10);
    assert!(a.is_clean(), "{:?}", a.problems);
    assert_eq!(a, b);
    // Many threads share one Image.
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| assert_eq!(fsck(&file_img, 10), a));
        }
    });
}

/// The superblock checksum against erofs-utils: for images `mkfs.erofs` made with option
/// sets that change the superblock and what follows it in block 0 (compression configs,
/// feature bits, uuid, times, counts), `format::superblock_checksum` gives the stored crc.
/// (verilay's own images are checked by the kernel, which verifies the crc at mount:
/// kernel_mount.rs in the verilay crate.)
#[test]
fn superblock_checksum_reproduces_mkfs_erofs() {
    let Some((_tmp, tree)) = mkfs_and_tree("crc", false) else {
        return;
    };
    let variants: &[&[&str]] = &[
        &[],
        &["-T0", "-U01234567-89ab-cdef-0123-456789abcdef"],
        &["--all-root", "-x-1"],
        &[
            "--all-root",
            "-T1",
            "-Eforce-inode-compact",
            "-Enoinline_data",
        ],
        &["-Eforce-inode-extended", "--chunksize=8192"],
        &["-zlz4"],
        &["-zlz4hc,9", "-Eztailpacking", "-C16384"],
        &[
            "-zlz4",
            "-Elegacy-compress",
            "--force-uid=7",
            "--force-gid=8",
        ],
    ];
    let mut crcs = std::collections::BTreeSet::new();
    for args in variants {
        let img = mkfs(&tree, args);
        let le32 = |at: usize| u32::from_le_bytes(img[at..at + 4].try_into().unwrap());
        // erofs_fs.h: EROFS_FEATURE_COMPAT_SB_CHKSUM, and the checksum at offset 4.
        assert_ne!(le32(1024 + 8) & 1, 0, "mkfs.erofs {args:?}: no SB_CHKSUM");
        let stored = le32(1024 + 4);
        let block_size = 1usize << img[1024 + 12];
        assert_eq!(
            format::superblock_checksum(&img, block_size),
            Some(stored),
            "mkfs.erofs {args:?}"
        );
        crcs.insert(stored);
    }
    assert_eq!(
        crcs.len(),
        variants.len(),
        "the variants' crcs should differ"
    );
}

/// verilay's own builder, read back by the reader: every block size class, with and without
/// inline tails, xattr name filters and long prefixes.
#[test]
fn builder_images_match_source_tree() {
    use erofs::builder::{build_dir, BuildOptions, Silent};
    let tmp = TempDir::new("builder");
    let tree = tmp.path().join("tree");
    fs::create_dir(&tree).unwrap();
    make_tree(&tree, true);
    // mkfs.erofs 1.5 cannot take it, our builder must.
    fs::write(tree.join("N".repeat(255)), b"longest name").unwrap();
    let variants = [
        (4096, true, true, true),
        (4096, false, true, false),
        (512, true, true, true),
        (1024, false, false, false),
        (65536, true, true, true),
    ];
    for (bs, inline, filter, prefixes) in variants {
        let opts = BuildOptions {
            block_size: bs,
            inline_data: inline,
            xattr_filter: filter,
            long_prefixes: prefixes,
            ..Default::default()
        };
        let out = tmp.path().join(format!("b{bs}.img"));
        let variant =
            format!("builder bs={bs} inline={inline} filter={filter} prefixes={prefixes}");
        build_dir(&tree, &|_| false, &opts, &out, &Silent)
            .unwrap_or_else(|e| panic!("[{variant}] build: {e}"));
        let bytes = fs::read(&out).unwrap();
        let (img, _, report, w) = walk_image(&tree, bytes, &variant, None);
        assert_eq!(img.block_size(), bs, "[{variant}]");
        assert_eq!(
            img.xattr_filter_enabled(),
            filter,
            "[{variant}] filter feature"
        );
        if prefixes && common::is_root() {
            assert!(
                img.superblock().xattr_prefix_count > 0,
                "[{variant}] no long prefix used"
            );
        }
        // The filter must actually answer "absent" for names an inode does not have.
        let root = img.inode(img.root_nid()).unwrap();
        let f02 = img
            .inode(img.lookup(&root, b"f02").unwrap().unwrap().nid)
            .unwrap();
        let probes = [
            "system.posix_acl_access",
            "system.posix_acl_default",
            "security.selinux",
        ];
        let absent = probes
            .iter()
            .any(|n| img.xattr_filter_says_absent(&f02, n.as_bytes()));
        assert_eq!(absent, filter, "[{variant}] filter fast path");
        assert!(w.xattrs >= 10 && report.files > 600, "tree too small?");
    }
}
