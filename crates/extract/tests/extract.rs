//! The walk against the tree it came from: contents, modes, times, links and holes, and
//! a target that is not an empty directory refused before anything is written.

use erofs::builder::{build_dir, BuildOptions, Silent};
use erofs::read::{ByteSource, FileSource, Image};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

fn image_of(src: &Path, out: &Path) -> extract::Img {
    build_dir(src, &|_| false, &BuildOptions::default(), out, &Silent).unwrap();
    let source: Arc<dyn ByteSource> = Arc::new(FileSource::open(out).unwrap());
    Image::open(source).unwrap()
}

fn run(img: &extract::Img, dir: &Path) -> anyhow::Result<extract::Report> {
    let top = img.inode(img.root_nid()).unwrap();
    let mut written = 0;
    let r = extract::extract(
        img,
        Path::new("test.img"),
        &top,
        b"",
        dir,
        extract::Options {
            restore_owner: false,
        },
        &mut |n| written += n,
    );
    if r.is_ok() {
        assert!(written >= 5, "progress told of {written} bytes");
    }
    r
}

#[test]
fn a_tree_comes_back_as_it_was_built() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("sub/deeper")).unwrap();
    std::fs::write(src.join("hello"), b"hello").unwrap();
    std::fs::hard_link(src.join("hello"), src.join("sub/hello-again")).unwrap();
    std::os::unix::fs::symlink("../hello", src.join("sub/link")).unwrap();
    let sparse = std::fs::File::create(src.join("sparse")).unwrap();
    sparse.set_len(64 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&sparse, b"end", (64 << 20) - 3).unwrap();
    std::fs::set_permissions(
        src.join("sub/deeper"),
        std::fs::Permissions::from_mode(0o555),
    )
    .unwrap();
    let img = image_of(&src, &t.path().join("img"));
    let out = t.path().join("out");
    let report = run(&img, &out).unwrap();
    assert_eq!(report.entries, 6);
    let diff = Command::new("diff")
        .args(["-r", "--no-dereference"])
        .arg(&src)
        .arg(&out)
        .output()
        .unwrap();
    assert!(diff.status.success(), "{diff:?}");
    let (a, b) = (
        std::fs::metadata(out.join("hello")).unwrap(),
        std::fs::metadata(out.join("sub/hello-again")).unwrap(),
    );
    assert_eq!(a.ino(), b.ino(), "the hardlink was not kept");
    let deeper = std::fs::metadata(out.join("sub/deeper")).unwrap();
    assert_eq!(deeper.mode() & 0o7777, 0o555);
    assert_eq!(
        deeper.mtime(),
        std::fs::metadata(src.join("sub/deeper")).unwrap().mtime()
    );
    let sparse = std::fs::metadata(out.join("sparse")).unwrap();
    assert!(sparse.blocks() * 512 < 1 << 20, "the hole was written");
}

#[test]
fn a_target_that_is_a_file_a_symlink_or_not_empty_is_refused_untouched() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("a"), b"a").unwrap();
    let img = image_of(&src, &t.path().join("img"));
    let full = t.path().join("full");
    std::fs::create_dir_all(&full).unwrap();
    std::fs::write(full.join("x"), b"").unwrap();
    let link = t.path().join("link");
    std::os::unix::fs::symlink(&src, &link).unwrap();
    for (dir, why) in [
        (&full, "exists and is not empty"),
        (&link, "is a symlink"),
        (&src.join("a"), "exists and is not a directory"),
    ] {
        let e = run(&img, dir).err().expect("extracted");
        assert!(format!("{e:#}").contains(why), "{}: {e:#}", dir.display());
    }
    assert_eq!(std::fs::read_dir(&full).unwrap().count(), 1);
}
