//! What the format cannot hold is refused by the builder with the path it concerns,
//! never written truncated into a corrupt image.

mod common;

use common::node;
use erofs::builder::{build_tree, BuildOptions, Content, Kind, Silent, Tree};
use erofs::read::{fsck, FileSource, Image};

/// A root directory holding one empty file `big` with `n` distinct xattrs of `len` bytes.
fn tree_with_xattrs(n: usize, len: usize) -> Tree {
    let mut t = Tree::default();
    t.add(node(
        Kind::Directory {
            children: vec![(b"big".to_vec(), 1)],
        },
        Vec::new(),
    ));
    let xattrs = (0..n)
        .map(|i| (format!("user.x{i}").into_bytes(), vec![b'a' + i as u8; len]))
        .collect();
    t.add(node(
        Kind::Regular {
            content: Content::Bytes(Vec::new()),
            extents: None,
        },
        xattrs,
    ));
    t
}

/// Five values of 60,000 bytes are more than an inode's 16-bit xattr count describes:
/// the count used to wrap, giving an image whose xattrs the kernel calls corrupt.
#[test]
fn an_inode_whose_xattrs_overflow_its_count_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.img");
    let opts = BuildOptions {
        verity: false,
        ..Default::default()
    };
    let err = build_tree(&tree_with_xattrs(5, 60_000), &opts, &out, &Silent)
        .expect_err("an overflowing xattr body builds");
    let msg = err.to_string();
    assert!(msg.contains("/big") && msg.contains("at most"), "{msg}");
    assert!(!out.exists(), "a refused build leaves an image behind");

    // Just under the limit builds, and reads back whole and clean.
    build_tree(&tree_with_xattrs(4, 60_000), &opts, &out, &Silent).unwrap();
    let img = Image::open(FileSource::open(&out).unwrap()).unwrap();
    let report = fsck(&img, 10);
    assert!(report.is_clean(), "{:?}", report.problems);
    let big = img
        .inode(
            img.lookup(&img.inode(img.root_nid()).unwrap(), b"big")
                .unwrap()
                .unwrap()
                .nid,
        )
        .unwrap();
    assert_eq!(
        img.getxattr(&big, b"user.x3").unwrap().unwrap(),
        vec![b'd'; 60_000]
    );
}

/// A sparse file of an exbibyte with one byte of data needs a chunk index no image can
/// hold: refused with its path, not an allocation that aborts the build.
#[test]
fn a_chunk_index_no_image_can_hold_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.img");
    let mut t = Tree::default();
    t.add(node(
        Kind::Directory {
            children: vec![(b"hole".to_vec(), 1)],
        },
        Vec::new(),
    ));
    let size = 1u64 << 60;
    let mut f = node(
        Kind::Regular {
            content: Content::Bytes(vec![1u8; 1]),
            extents: Some(vec![(size / 2 + 1, size / 2 + 2)]),
        },
        Vec::new(),
    );
    f.size = size;
    t.add(f);
    let err = build_tree(&t, &BuildOptions::default(), &out, &Silent)
        .expect_err("an exbibyte sparse file builds");
    let msg = err.to_string();
    assert!(
        msg.contains("/hole") && msg.contains("chunk index"),
        "{msg}"
    );
    assert!(!msg.contains('\n'), "one line: {msg}");
}
