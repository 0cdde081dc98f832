//! The xattr name filter as built and as read: every present name passes the filter (the
//! kernel trusts it, so a wrong bit hides an xattr), and absent names are mostly answered
//! without a scan.

use erofs::build::{build_tree, BuildOptions, Content, Kind, Node, Silent, Tree};
use erofs::read::{FileSource, Image};

fn node(kind: Kind, xattrs: Vec<(&str, &str)>) -> Node {
    Node {
        kind,
        perm: 0o644,
        uid: 0,
        gid: 0,
        mtime: 1_700_000_000,
        mtime_nsec: 0,
        size: 0,
        xattrs: xattrs
            .into_iter()
            .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect(),
    }
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

#[test]
fn filter_never_hides_present_names_and_flags_most_absent_ones() {
    let (absent, flagged) = check(true);
    assert!(absent > 500, "too few absent probes: {absent}");
    // With a handful of names per inode, most absent names land on a set bit.
    assert!(
        flagged * 100 >= absent * 60,
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
