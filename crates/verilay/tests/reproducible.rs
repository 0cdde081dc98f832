//! Same tree + SOURCE_DATE_EPOCH → byte-identical images, whatever the build time and
//! whatever order the directories are read in.

mod common;
use common::*;
use std::path::Path;

/// Writes the same tree with names created in the given order. On tmpfs, readdir returns
/// entries newest first, so two creation orders give two readdir orders.
fn make(root: &Path, reverse: bool) {
    let mut names: Vec<String> = (0..300)
        .map(|i| format!("n{:03}", (i * 7919) % 300))
        .collect();
    if reverse {
        names.reverse();
    }
    std::fs::create_dir_all(root.join("d")).unwrap();
    for n in &names {
        std::fs::write(root.join("d").join(n), n.repeat(50)).unwrap();
        std::fs::write(root.join(n), n).unwrap();
    }
    // The same 20 files get hardlinks in both trees, created in the trees' own order.
    for n in names.iter().filter(|n| n.as_str() < "n020") {
        std::fs::hard_link(root.join(n), root.join("d").join(format!("link_{n}"))).unwrap();
    }
    sh(&format!(
        "cd '{}' && find . -exec touch -h -d '2020-01-01 00:00:00.25' {{}} + && chmod -R u=rwX,go=rX .",
        root.display()
    ));
}

fn readdir_names(p: &Path) -> Vec<String> {
    std::fs::read_dir(p)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn builds_are_byte_identical() {
    let t = tempfile::tempdir().unwrap();
    // Without root the two trees may list in the same order: the test checks less, and
    // counts as skipped.
    let root = !skip_unless(
        is_root(),
        "not root: no private tmpfs to make readdir orders differ",
    );
    let base = if root {
        // A private tmpfs makes the readdir orders really differ.
        let m = t.path().join("tmpfs");
        std::fs::create_dir_all(&m).unwrap();
        sh(&format!("mount -t tmpfs tmpfs '{}'", m.display()));
        m
    } else {
        t.path().to_path_buf()
    };
    let a = base.join("a");
    let b = base.join("b");
    make(&a, false);
    make(&b, true);
    if root {
        assert_ne!(
            readdir_names(&a),
            readdir_names(&b),
            "tmpfs should list the two trees in different orders"
        );
    }
    let out = t.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    build(&a, &out.join("a1"), &["--quiet"]);
    // Not a wait: the behaviour under test. The second build starts in a later second, so
    // an image that recorded the clock (not SOURCE_DATE_EPOCH) would differ.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    build(&b, &out.join("b1"), &["--quiet"]);
    let ia = std::fs::read(out.join("a1")).unwrap();
    let ib = std::fs::read(out.join("b1")).unwrap();
    if root {
        sh(&format!("umount '{}'", base.display()));
    }
    assert!(
        ia == ib,
        "images differ ({} vs {} bytes)",
        ia.len(),
        ib.len()
    );
}
