//! The xattr name filter against the kernel, which trusts it: a wrong bit makes
//! `getxattr` answer ENODATA for a name the inode has. Images whose inodes carry many names
//! (every namespace, long prefixes, shared and inline entries) are mounted with `mount -t
//! erofs`, and the kernel must find every present name and no absent one. The reader's
//! own view of the filter is checked against the same trees.

mod common;

use common::{is_root, skip_unless, Rng};
use erofs::builder::{build_tree, BuildOptions, Content, Kind, Node, Silent, Tree};
use erofs::read::{FileSource, Image};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn node(kind: Kind, xattrs: Vec<(&str, &str)>) -> Node {
    common::node(
        kind,
        xattrs
            .into_iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect(),
    )
}

/// A tree whose files carry a varied set of xattrs, some shared, some with long prefixes.
fn tree() -> Tree {
    let mut t = Tree::default();
    t.add(node(
        Kind::Directory {
            children: Vec::new(),
        },
        vec![("trusted.overlay.opaque", "y")],
    ));
    let names = [
        "user.mime_type",
        "security.selinux",
        "security.capability",
        "trusted.overlay.origin",
        "trusted.overlay.redirect",
        "trusted.overlay.metacopy",
        "user.overlay.nlink",
        "security.ima",
        "system.posix_acl_access",
    ];
    let acl = "\u{2}\0\0\0\u{1}\0\u{6}\0\u{ff}\u{ff}\u{ff}\u{ff}\u{4}\0\u{4}\0\u{ff}\u{ff}\u{ff}\u{ff}\u{20}\0\u{4}\0\u{ff}\u{ff}\u{ff}\u{ff}";
    let mut children = Vec::new();
    for i in 0..200usize {
        let mut x = Vec::new();
        for (j, n) in names.iter().enumerate() {
            if (i >> j) & 1 == 1 || (i % 7 == j) {
                let v = if *n == "system.posix_acl_access" {
                    acl.to_string()
                } else if j % 2 == 0 {
                    "shared".into()
                } else {
                    format!("v{i}")
                };
                x.push((n.to_string(), v));
            }
        }
        x.sort();
        let mut nd = node(
            Kind::Regular {
                content: Content::Bytes(vec![b'x'; i]),
                extents: None,
            },
            vec![],
        );
        nd.size = i as u64;
        nd.xattrs = x
            .into_iter()
            .map(|(n, v)| (n.into_bytes(), v.into_bytes()))
            .collect();
        let id = t.add(nd);
        children.push((format!("f{i:03}").into_bytes(), id));
    }
    t.nodes[0].kind = Kind::Directory { children };
    t
}

const PROBES: &[&str] = &[
    "system.posix_acl_access",
    "system.posix_acl_default",
    "security.selinux",
    "security.capability",
    "security.ima",
    "security.evm",
    "security.SMACK64",
    "security.apparmor",
    "user.mime_type",
    "user.foo",
    "trusted.overlay.opaque",
    "trusted.overlay.redirect",
];

fn check(filter: bool) -> (usize, usize) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("img");
    let opts = BuildOptions {
        xattr_filter: filter,
        ..Default::default()
    };
    build_tree(&tree(), &opts, &path, &Silent).unwrap();
    let img = Image::open(FileSource::open(&path).unwrap()).unwrap();
    assert_eq!(img.xattr_filter_enabled(), filter);
    let root = img.inode(img.root_nid()).unwrap();
    let (mut absent, mut flagged) = (0, 0);
    for e in img.readdir(&root, 0).unwrap() {
        let e = e.unwrap();
        let ino = img.inode(e.nid).unwrap();
        let present = img.xattrs(&ino).unwrap();
        for (name, value) in &present {
            assert!(
                !img.xattr_filter_says_absent(&ino, name),
                "{:?}: filter hides present {:?}",
                e.name,
                name
            );
            assert_eq!(img.getxattr(&ino, name).unwrap().as_ref(), Some(value));
        }
        for probe in PROBES {
            if present.iter().any(|(n, _)| n == probe.as_bytes()) {
                continue;
            }
            absent += 1;
            assert_eq!(img.getxattr(&ino, probe.as_bytes()).unwrap(), None);
            if img.xattr_filter_says_absent(&ino, probe.as_bytes()) {
                flagged += 1;
            }
        }
    }
    (absent, flagged)
}

/// Every name a filter test asks about: the kernel's table of well-known names (every
/// namespace, every filter bit), names that earn long prefixes (`trusted.overlay.`,
/// `user.overlay.`), plain ones, and one of 200 bytes.
fn name_universe() -> Vec<String> {
    let mut names: Vec<String> = [
        "security.ima",
        "security.evm",
        "security.capability",
        "security.selinux",
        "security.apparmor",
        "security.SMACK64",
        "system.posix_acl_access",
        "user.mime_type",
        "user.overlay.opaque",
        "user.overlay.redirect",
        "user.overlay.origin",
        "trusted.overlay.opaque",
        "trusted.overlay.redirect",
        "trusted.overlay.origin",
        "trusted.overlay.metacopy",
        "trusted.overlay.upper",
        "trusted.overlay.nlink",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for k in 0..12 {
        names.push(format!("user.n{k}"));
        names.push(format!("trusted.overlay.x{k}"));
    }
    for k in 0..6 {
        names.push(format!("trusted.t{k}"));
        names.push(format!("security.s{k}"));
        names.push(format!("user.overlay.y{k}"));
    }
    names.push(format!("user.{}", "l".repeat(195)));
    names
}

/// A POSIX ACL as stored (posix_acl_xattr.h): version 2, then (tag, perm, id) entries.
fn acl(named_user: Option<u32>) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    let mut entry = |tag: u16, perm: u16, id: u32| {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    };
    entry(0x01, 6, u32::MAX);
    if let Some(id) = named_user {
        entry(0x02, 4, id);
    }
    entry(0x04, 4, u32::MAX);
    if named_user.is_some() {
        entry(0x10, 4, u32::MAX);
    }
    entry(0x20, 4, u32::MAX);
    v
}

/// A value the kernel hands back unchanged for `name`: ACLs and file capabilities must be
/// well-formed, or the kernel refuses them. `shared` gives every inode the same value (the
/// builder then puts the pair in the shared pool); otherwise it is the inode's own (inline).
fn value_for(name: &str, inode: usize, shared: bool) -> Vec<u8> {
    match name {
        "system.posix_acl_access" => acl((!shared).then_some(1000 + inode as u32)),
        // VFS_CAP_REVISION_2: magic, then permitted/inheritable for both 32-bit halves.
        "security.capability" => [0x0200_0000u32, 0x3000, 0, 0, 0]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect(),
        _ if shared => b"shared value".to_vec(),
        _ => format!("{name} of {inode}").into_bytes(),
    }
}

/// 300 files and 10 directories, each with a random fifth of `names` (about 14 names per
/// inode, so a real share of filter bits stays set), half of them shared pairs.
fn kernel_tree(names: &[String]) -> (Tree, BTreeMap<String, BTreeMap<String, Vec<u8>>>) {
    let mut rng = Rng(19);
    let mut t = Tree::default();
    t.add(node(Kind::Directory { children: vec![] }, vec![]));
    let mut children = Vec::new();
    let mut want = BTreeMap::new();
    for i in 0..310usize {
        let dir = i < 10;
        let path = if dir {
            format!("d{i:02}")
        } else {
            format!("f{i:03}")
        };
        let mut xattrs = BTreeMap::new();
        for n in names {
            if rng.below(5) == 0 {
                xattrs.insert(n.clone(), value_for(n, i, rng.below(2) == 0));
            }
        }
        let mut nd = node(
            if dir {
                Kind::Directory { children: vec![] }
            } else {
                Kind::Regular {
                    content: Content::Bytes(vec![b'x'; i]),
                    extents: None,
                }
            },
            vec![],
        );
        if dir {
            nd.perm = 0o755;
        } else {
            nd.size = i as u64;
        }
        nd.xattrs = xattrs
            .iter()
            .map(|(n, v)| (n.clone().into_bytes(), v.clone()))
            .collect();
        children.push((path.clone().into_bytes(), t.add(nd)));
        want.insert(path, xattrs);
    }
    t.nodes[0].kind = Kind::Directory { children };
    (t, want)
}

/// `mount -t erofs -o ro`, unmounted when dropped.
struct KernelMount(PathBuf);

impl KernelMount {
    fn new(image: &Path, dir: &Path) -> KernelMount {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "erofs", "-o", "ro"])
            .arg(image)
            .arg(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mount -t erofs {}: {}",
            image.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        KernelMount(dir.to_path_buf())
    }
}

impl Drop for KernelMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// What the kernel answers for `name` on `path`: the value, or the errno.
fn kernel_getxattr(path: &Path, name: &str) -> Result<Vec<u8>, rustix::io::Errno> {
    let mut buf = vec![0u8; 65536];
    let n = rustix::fs::lgetxattr(path, name, &mut buf)?;
    buf.truncate(n);
    Ok(buf)
}

fn le32(img: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(img[at..at + 4].try_into().unwrap())
}

#[test]
fn the_kernel_finds_every_present_name_and_no_absent_one() {
    if skip_unless(is_root(), "mount -t erofs needs root") {
        return;
    }
    let names = name_universe();
    let (tree, want) = kernel_tree(&names);
    let dir = tempfile::tempdir().unwrap();
    for filter in [true, false] {
        let image = dir.path().join(format!("img-{filter}"));
        let opts = BuildOptions {
            xattr_filter: filter,
            ..Default::default()
        };
        let summary = build_tree(&tree, &opts, &image, &Silent).unwrap();
        assert!(
            summary.shared_xattrs > 20 && summary.long_prefixes > 0,
            "{summary:?}"
        );
        // The superblock as the kernel reads it (erofs_fs.h): the filter is used only with
        // EROFS_FEATURE_COMPAT_XATTR_FILTER set and xattr_filter_reserved zero.
        let bytes = std::fs::read(&image).unwrap();
        assert_eq!(le32(&bytes, 1024 + 8) & 4 != 0, filter, "XATTR_FILTER bit");
        assert_eq!(bytes[1024 + 0x68], 0, "xattr_filter_reserved");
        let mnt = KernelMount::new(&image, &dir.path().join(format!("mnt-{filter}")));
        let (mut present, mut absent) = (0, 0);
        for (path, xattrs) in &want {
            let p = mnt.0.join(path);
            for name in &names {
                let got = kernel_getxattr(&p, name);
                match xattrs.get(name) {
                    Some(value) => {
                        present += 1;
                        assert_eq!(
                            got.as_ref(),
                            Ok(value),
                            "filter={filter}: the kernel's answer for {path} {name}"
                        );
                    }
                    None => {
                        absent += 1;
                        assert_eq!(
                            got,
                            Err(rustix::io::Errno::NODATA),
                            "filter={filter}: {path} has no {name}"
                        );
                    }
                }
            }
        }
        assert!(
            present > 3000 && absent > 12000,
            "{present} present, {absent} absent"
        );
    }
    // The reader agrees and answers most absent names from the filter alone.
    let image = dir.path().join("img-true");
    let img = Image::open(FileSource::open(&image).unwrap()).unwrap();
    let root = img.inode(img.root_nid()).unwrap();
    let (mut absent, mut flagged) = (0, 0);
    for (path, xattrs) in &want {
        let ino = img
            .inode(img.lookup(&root, path.as_bytes()).unwrap().unwrap().nid)
            .unwrap();
        for name in names.iter().filter(|n| !xattrs.contains_key(*n)) {
            absent += 1;
            flagged += img.xattr_filter_says_absent(&ino, name.as_bytes()) as usize;
        }
    }
    assert!(
        flagged * 100 >= absent * 30,
        "only {flagged} of {absent} absent names flagged"
    );
}

#[test]
fn without_filter_nothing_is_flagged() {
    let (absent, flagged) = check(false);
    assert!(absent > 500);
    assert_eq!(flagged, 0);
}

/// The digest footer records which xattr namespaces occur anywhere. The mount trusts it to
/// answer every `security.*` name of an unlabelled image with "not supported", so `fsck`
/// holds it against the xattrs actually present.
#[test]
fn the_namespace_record_matches_the_tree_and_fsck_checks_it() {
    use erofs::format::{XATTR_INDEX_POSIX_ACL_DEFAULT, XATTR_INDEX_SECURITY, XATTR_INDEX_USER};
    use erofs::read::fsck;
    let dir = tempfile::tempdir().unwrap();
    let build = |t: &Tree, name: &str| {
        let path = dir.path().join(name);
        build_tree(t, &BuildOptions::default(), &path, &Silent).unwrap();
        path
    };
    let labelled = build(&tree(), "labelled");
    let img = Image::open(FileSource::open(&labelled).unwrap()).unwrap();
    assert!(!img.namespace_absent(XATTR_INDEX_SECURITY).unwrap());
    assert!(!img.namespace_absent(XATTR_INDEX_USER).unwrap());
    assert!(img.namespace_absent(XATTR_INDEX_POSIX_ACL_DEFAULT).unwrap());
    assert!(fsck(&img, 10).is_clean());

    let mut t = tree();
    for n in &mut t.nodes {
        n.xattrs.retain(|(name, _)| !name.starts_with(b"security."));
    }
    let unlabelled = build(&t, "unlabelled");
    let img = Image::open(FileSource::open(&unlabelled).unwrap()).unwrap();
    assert!(img.namespace_absent(XATTR_INDEX_SECURITY).unwrap());
    assert!(!img.namespace_absent(XATTR_INDEX_USER).unwrap());
    assert!(fsck(&img, 10).is_clean());

    // A footer that denies the labels the tree holds.
    let mut bytes = std::fs::read(&labelled).unwrap();
    let img = Image::open(FileSource::open(&labelled).unwrap()).unwrap();
    let at = img.erofs_len() as usize - 64 + 32;
    bytes[at] &= !(1 << XATTR_INDEX_SECURITY);
    std::fs::write(&labelled, &bytes).unwrap();
    let img = Image::open(FileSource::open(&labelled).unwrap()).unwrap();
    assert!(img.namespace_absent(XATTR_INDEX_SECURITY).unwrap());
    let r = fsck(&img, 10);
    assert!(
        r.problems
            .iter()
            .any(|p| p.contains("records xattr namespaces 0x12, but the tree has 0x52")),
        "{:#?}",
        r.problems
    );
}
