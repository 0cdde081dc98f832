//! `verilay extract` of hostile images, and the reader on duplicate or unsorted names (item 1).
//!
//! Each hostile image is an ordinary `verilay build --no-verity --no-inline-data` image (its
//! directories then sit in their own blocks, away from the superblock's checksum) with a few
//! directory bytes patched, then sealed with `verilay seal`: `verify` passes, and only the
//! structure is hostile. `OUTSIDE` is a sibling of the target directory that nothing may
//! touch.

use crate::common::{
    as_test_user, have, is_root, lacks_test_user, run, sh, skip_unless, verilay, Unmount,
};
use crate::Seed;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

/// A temporary directory the test user can read too.
fn tempdir() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    t
}

/// `tmp/user`, where the test user may write.
fn user_dir(tmp: &Path) -> PathBuf {
    let d = tmp.join("user");
    std::fs::create_dir(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
    d
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A plain image of `src` (directories in their own blocks) at `out`; its bytes.
fn plain(src: &Path, out: &Path) -> Vec<u8> {
    run(verilay()
        .arg("build")
        .arg(src)
        .arg("-o")
        .arg(out)
        .args(["--no-verity", "--no-inline-data", "--quiet"])
        .env("SOURCE_DATE_EPOCH", "1700000000"));
    std::fs::read(out).unwrap()
}

fn inspect(img: &Path, path: &str) -> serde_json::Value {
    let out = run(verilay().arg("inspect").arg(img).arg(path).arg("--json"));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn nid(img: &Path, path: &str) -> u64 {
    inspect(img, path)["nid"].as_u64().unwrap()
}

/// One directory entry as stored: where its dirent and its name are in the image.
struct Dirent {
    at: usize,
    name_at: usize,
    name: Vec<u8>,
}

/// The entries of directory `dir` (one block, not inlined) of the plain image `img`.
fn dirents(bytes: &[u8], img: &Path, dir: &str) -> Vec<Dirent> {
    let info = inspect(img, dir);
    assert_eq!(info["layout"]["kind"], "flat_plain", "{info}");
    let block = info["layout"]["start_block"].as_u64().unwrap() as usize * 4096;
    let size = info["size"].as_u64().unwrap() as usize;
    assert!(size <= 4096, "{dir}: one block expected");
    let le16 = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]) as usize;
    let count = le16(block + 8) / 12;
    (0..count)
        .map(|i| {
            let start = le16(block + 12 * i + 8);
            let end = if i + 1 < count {
                le16(block + 12 * (i + 1) + 8)
            } else {
                let tail = &bytes[block + start..block + size];
                start + tail.iter().position(|&b| b == 0).unwrap_or(tail.len())
            };
            Dirent {
                at: block + 12 * i,
                name_at: block + start,
                name: bytes[block + start..block + end].to_vec(),
            }
        })
        .collect()
}

fn entry<'a>(ents: &'a [Dirent], name: &str) -> &'a Dirent {
    ents.iter()
        .find(|e| e.name == name.as_bytes())
        .unwrap_or_else(|| panic!("no entry {name}"))
}

/// Renames entry `from` of `dir` in place to `to` (same length).
fn rename(bytes: &mut [u8], img: &Path, dir: &str, from: &str, to: &str) {
    assert_eq!(from.len(), to.len());
    let at = entry(&dirents(bytes, img, dir), from).name_at;
    bytes[at..at + to.len()].copy_from_slice(to.as_bytes());
}

/// Points entry `name` of `dir` at inode `nid`.
fn repoint(bytes: &mut [u8], img: &Path, dir: &str, name: &str, nid: u64) {
    let at = entry(&dirents(bytes, img, dir), name).at;
    bytes[at..at + 8].copy_from_slice(&nid.to_le_bytes());
}

/// A hostile image: its EROFS bytes, and the same sealed (what the commands are given).
struct Case {
    name: &'static str,
    raw: Vec<u8>,
    image: PathBuf,
}

/// Builds `src` (made by `make`) in `tmp`, patches it with `patch`, seals it, and checks
/// that `verify` accepts it: only its structure is hostile.
fn case(
    tmp: &Path,
    name: &'static str,
    make: impl FnOnce(&Path),
    patch: impl FnOnce(&mut Vec<u8>, &Path),
) -> Case {
    let src = tmp.join(format!("{name}-src"));
    std::fs::create_dir_all(&src).unwrap();
    make(&src);
    let plain_img = tmp.join(format!("{name}-plain.img"));
    let mut raw = plain(&src, &plain_img);
    patch(&mut raw, &plain_img);
    let image = tmp.join(format!("{name}.img"));
    std::fs::write(&image, &raw).unwrap();
    run(verilay().arg("seal").arg(&image).arg("--quiet"));
    run(verilay().arg("verify").arg(&image).arg("--quiet"));
    Case { name, raw, image }
}

/// Root holds `a`, a symlink to `outside`, then directory `b` (mode 0700, one file); `b`
/// is renamed `a`: the pair that made extract write through the symlink.
fn duplicate_symlink_and_dir(tmp: &Path, outside: &Path) -> Case {
    case(
        tmp,
        "duplicate-name",
        |src| {
            std::os::unix::fs::symlink(outside, src.join("a")).unwrap();
            std::fs::create_dir(src.join("b")).unwrap();
            std::fs::write(src.join("b/evil"), "planted\n").unwrap();
            std::fs::set_permissions(src.join("b"), std::fs::Permissions::from_mode(0o700))
                .unwrap();
        },
        |raw, img| rename(raw, img, "/", "b", "a"),
    )
}

/// Two directories `d1`, `d2` each with a file, and a file `f`: the base of the cases below.
fn two_dirs(src: &Path) {
    for d in ["d1", "d2"] {
        std::fs::create_dir_all(src.join(d).join("sub")).unwrap();
        std::fs::write(src.join(d).join("file"), d).unwrap();
    }
    std::fs::write(src.join("f"), "f").unwrap();
}

/// A `two_dirs` case whose entry `name` in directory `dir` names the inode at `target`.
fn repointed(tmp: &Path, case_name: &'static str, dir: &str, name: &str, target: &str) -> Case {
    case(tmp, case_name, two_dirs, |raw, img| {
        let to = nid(img, target);
        repoint(raw, img, dir, name, to)
    })
}

/// The structural cases fsck reports, each with what its report says.
fn structural_cases(tmp: &Path) -> Vec<(Case, &'static str)> {
    vec![
        (
            // "d1" and "d2" swapped: a directory's names out of order.
            case(tmp, "unsorted", two_dirs, |raw, img| {
                rename(raw, img, "/", "d1", "d3");
                rename(raw, img, "/", "d2", "d1");
            }),
            "name \"d1\" does not sort after \"d3\"",
        ),
        (
            repointed(tmp, "dot-elsewhere", "/d1", ".", "/d2"),
            "\".\" points to nid",
        ),
        (
            repointed(tmp, "dotdot-elsewhere", "/d1/sub", "..", "/d2"),
            "\"..\" points to nid",
        ),
        (
            // d2 is d1 again: a directory hardlink.
            repointed(tmp, "dir-hardlink", "/", "d2", "/d1"),
            "reachable twice",
        ),
        (
            // d1/sub is the root: a cycle.
            repointed(tmp, "cycle", "/d1", "sub", "/"),
            "reachable twice",
        ),
        (
            // A name with a slash in a different parent than the symlink it would go
            // through ("x/evil" next to "x -> OUTSIDE").
            case(
                tmp,
                "slash-name",
                |src| {
                    std::os::unix::fs::symlink("/nonexistent-outside", src.join("x")).unwrap();
                    std::fs::write(src.join("xqevil"), "planted").unwrap();
                },
                |raw, img| rename(raw, img, "/", "xqevil", "x/evil"),
            ),
            "contains '/' or NUL",
        ),
    ]
}

/// A directory nothing may write to, beside the target.
fn outside(tmp: &Path) -> PathBuf {
    let o = tmp.join("outside");
    std::fs::create_dir_all(&o).unwrap();
    std::fs::set_permissions(&o, std::fs::Permissions::from_mode(0o755)).unwrap();
    o
}

fn assert_untouched(outside: &Path) {
    let names: Vec<_> = std::fs::read_dir(outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(names.is_empty(), "written outside the target: {names:?}");
    let mode = std::fs::metadata(outside).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o755, "outside directory chmod'ed");
}

fn extract(image: &Path, dir: &Path, extra: &[&str]) -> Output {
    verilay()
        .arg("extract")
        .arg(image)
        .arg(dir)
        .arg("--quiet")
        .args(extra)
        .output()
        .unwrap()
}

/// Extract failed with one line containing `want`.
/// `tmp/img`, built from `tmp/src` as `fill` makes it.
fn image_of(tmp: &Path, fill: impl FnOnce(&Path)) -> PathBuf {
    let src = tmp.join("src");
    std::fs::create_dir(&src).unwrap();
    fill(&src);
    let img = tmp.join("img");
    crate::common::build(&src, &img, &["--quiet"]);
    img
}

fn refused(out: &Output, want: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "not one line: {err}");
    assert!(err.contains(want), "missing {want:?}: {err}");
}

#[test]
fn duplicate_name_symlink_then_directory_writes_nothing_outside() {
    let t = tempdir();
    let out = outside(t.path());
    let c = duplicate_symlink_and_dir(t.path(), &out);
    let dir = t.path().join("target");
    let r = extract(&c.image, &dir, &[]);
    assert_untouched(&out);
    refused(&r, "not extracted, fsck finds the image unsound");
    refused(&r, "name \"a\" does not sort after \"a\"");
    assert!(!dir.exists(), "refused before writing anything");
    let fsck = verilay().arg("fsck").arg(&c.image).output().unwrap();
    assert_eq!(fsck.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&fsck.stdout).contains("name \"a\" does not sort after \"a\""),
        "{}",
        String::from_utf8_lossy(&fsck.stdout)
    );
}

#[test]
fn structural_problems_are_refused_before_anything_is_written() {
    let t = tempdir();
    for (c, want) in structural_cases(t.path()) {
        let dir = t.path().join(format!("{}-out", c.name));
        let r = extract(&c.image, &dir, &[]);
        assert!(!dir.exists(), "{}: something was written", c.name);
        refused(&r, want);
        refused(&r, "not extracted");
        let fsck = verilay().arg("fsck").arg(&c.image).output().unwrap();
        let report = String::from_utf8_lossy(&fsck.stdout);
        assert_eq!(fsck.status.code(), Some(1), "{}: {report}", c.name);
        assert!(report.contains(want), "{}: fsck: {report}", c.name);
    }
}

#[test]
fn mount_of_a_duplicate_name_image_fails_the_listing_and_logs_it() {
    if skip_unless(
        is_root() || have("fusermount3"),
        "FUSE mounts need root or fusermount3",
    ) {
        return;
    }
    let t = tempdir();
    let out = outside(t.path());
    let c = duplicate_symlink_and_dir(t.path(), &out);
    let mnt = t.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let log = t.path().join("integrity.log");
    run(verilay()
        .arg("mount")
        .arg(&c.image)
        .arg(&mnt)
        .arg("--log")
        .arg(&log));
    let _m = Unmount::fuse(&mnt);
    // The kernel's erofs code would list "a" twice; the reader refuses the block: EUCLEAN
    // ("Structure needs cleaning", the kernel's EFSCORRUPTED) for the listing and the name.
    let err = std::fs::read_dir(&mnt)
        .and_then(|d| d.collect::<Result<Vec<_>, _>>())
        .expect_err("listing a directory with two entries named \"a\"");
    assert_eq!(err.raw_os_error(), Some(117), "{err}");
    let err = std::fs::symlink_metadata(mnt.join("a")).expect_err("lookup of \"a\"");
    assert_eq!(err.raw_os_error(), Some(117), "{err}");
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.lines().any(|l| l.contains("readdir of / (inode ")
            && l.contains(": corrupt image at byte")
            && l.contains("name \"a\" does not sort after \"a\"")),
        "{logged}"
    );
    assert_untouched(&out);
}

#[test]
fn a_target_that_is_a_symlink_is_refused() {
    let t = tempdir();
    let out = outside(t.path());
    let img = image_of(t.path(), |src| std::fs::write(src.join("f"), "f").unwrap());
    let link = t.path().join("link");
    std::os::unix::fs::symlink(&out, &link).unwrap();
    for dir in [link.clone(), link.join("")] {
        refused(&extract(&img, &dir, &[]), "is a symlink");
    }
    assert_untouched(&out);
    // An existing, empty directory is fine; a non-empty one is not.
    let empty = t.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    run(verilay()
        .arg("extract")
        .arg(&img)
        .arg(&empty)
        .arg("--quiet"));
    assert_eq!(std::fs::read(empty.join("f")).unwrap(), b"f");
    refused(&extract(&img, &empty, &[]), "exists and is not empty");
}

/// Image: `a/big`, directory `d` (mode 0700) holding `z`, then `z-big`. The big files (48
/// MiB each) keep extract busy after `d` is filled, whichever order it writes in: the
/// window in which the test swaps `d`, or the target, for a symlink to `outside`.
fn race_image(tmp: &Path) -> PathBuf {
    let src = tmp.join("race-src");
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::create_dir_all(src.join("d")).unwrap();
    let data: Vec<u8> = (0..48u32 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(src.join("a/big"), &data).unwrap();
    std::fs::write(src.join("z-big"), &data).unwrap();
    std::fs::write(src.join("d/z"), "z").unwrap();
    std::fs::set_permissions(src.join("d"), std::fs::Permissions::from_mode(0o700)).unwrap();
    let img = tmp.join("race.img");
    crate::common::build(&src, &img, &["--quiet"]);
    img
}

/// Starts extract into `dir`; once `dir/d/z` exists, moves `swap` aside and puts a symlink
/// to `outside` in its place while extract still runs. Returns extract's output and where
/// `swap` was moved.
fn extract_while_swapping(
    img: &Path,
    dir: &Path,
    swap: &Path,
    outside: &Path,
) -> (Output, PathBuf) {
    let mut child = verilay()
        .arg("extract")
        .arg(img)
        .arg(dir)
        .arg("--quiet")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let watch = dir.join("d/z");
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::symlink_metadata(&watch).is_err() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            watch.display()
        );
        std::thread::yield_now();
    }
    let moved = swap.with_extension("moved");
    std::fs::rename(swap, &moved).unwrap();
    std::os::unix::fs::symlink(outside, swap).unwrap();
    // Extract must still be running, or the swap proves nothing.
    let won = child.try_wait().unwrap().is_none();
    let out = child.wait_with_output().unwrap();
    assert!(won, "extract finished before the swap");
    (out, moved)
}

#[test]
fn a_directory_swapped_for_a_symlink_during_extract_is_not_followed() {
    let t = tempdir();
    let out = outside(t.path());
    let img = race_image(t.path());

    // A subdirectory extract made and filled: its mode, given last, must not go through
    // the symlink; extract stops there with one line.
    let dir = t.path().join("target");
    let (r, moved) = extract_while_swapping(&img, &dir, &dir.join("d"), &out);
    assert_untouched(&out);
    refused(
        &r,
        &format!("{}: replaced while extracting", dir.join("d").display()),
    );
    assert_eq!(std::fs::read(moved.join("z")).unwrap(), b"z");

    // The target itself: everything goes on into the directory opened at the start.
    let dir = t.path().join("target2");
    let (r, moved) = extract_while_swapping(&img, &dir, &dir, &out);
    assert_untouched(&out);
    assert!(r.status.success(), "{}", stderr(&r));
    assert_eq!(
        std::fs::metadata(moved.join("z-big")).unwrap().len(),
        48 << 20
    );
    assert_eq!(mode(&moved.join("d")) & 0o7777, 0o700);
}

/// Files hardlinked across directories that end up read-only (0555) and unsearchable (0):
/// every name is made while all directories are still 0700, and modes come last.
fn hardlink_tree(src: &Path) {
    sh(&format!(
        "cd '{}' && mkdir a-closed b-ro c && echo one > a-closed/one && echo two > c/two && \
         ln a-closed/one b-ro/one && ln c/two b-ro/two && ln c/two c/two-again && \
         chmod 0 a-closed && chmod 555 b-ro",
        src.display()
    ));
}

fn assert_hardlinks(dir: &Path) {
    let ino = |p: &str| std::fs::symlink_metadata(dir.join(p)).unwrap().ino();
    // Reading through a 0 directory needs root; compare what anyone can stat.
    let md = |p: &str| std::fs::symlink_metadata(dir.join(p)).unwrap();
    assert_eq!(md("a-closed").permissions().mode() & 0o7777, 0);
    assert_eq!(md("b-ro").permissions().mode() & 0o7777, 0o555);
    assert_eq!(ino("b-ro/two"), ino("c/two"));
    assert_eq!(ino("c/two-again"), ino("c/two"));
    assert_eq!(md("c/two").nlink(), 3);
}

#[test]
fn hardlinks_into_read_only_and_unsearchable_directories() {
    let t = tempdir();
    let img = image_of(t.path(), hardlink_tree);
    let dir = t.path().join("as-root");
    run(verilay().arg("extract").arg(&img).arg(&dir).arg("--quiet"));
    assert_hardlinks(&dir);
    let ino = |p: &str| std::fs::symlink_metadata(dir.join(p)).unwrap().ino();
    assert_eq!(ino("a-closed/one"), ino("b-ro/one"));
    if lacks_test_user() {
        return;
    }
    let out = as_test_user(
        &user_dir(t.path()),
        &format!(
            "{} extract ../img as-user --quiet",
            env!("CARGO_BIN_EXE_verilay")
        ),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_hardlinks(&t.path().join("user/as-user"));
}

#[test]
fn path_option_follows_no_symlink_and_keeps_links_inside() {
    let t = tempdir();
    let out = outside(t.path());
    let img = image_of(t.path(), |src| {
        sh(&format!(
            "cd '{}' && mkdir d e && echo f > d/f && ln d/f e/f && ln -s d l && ln -s '{}' escape",
            src.display(),
            out.display()
        ));
    });

    // Through a symlink of the image: refused, not followed.
    for p in ["l/f", "escape/x"] {
        let dir = t.path().join(format!("x-{}", p.replace('/', "_")));
        refused(&extract(&img, &dir, &["--path", p]), "is not a directory");
        assert!(!dir.exists());
    }
    // A symlink itself: made inside DIR under its name, as it is.
    let dir = t.path().join("link");
    let done = extract(&img, &dir, &["--path", "/escape"]);
    assert!(
        done.status.success(),
        "extract --path /escape: {}",
        stderr(&done)
    );
    assert!(std::fs::symlink_metadata(&dir).unwrap().is_dir());
    assert_eq!(std::fs::read_link(dir.join("escape")).unwrap(), out);
    // A file hardlinked outside the extracted path: a file of its own, same content.
    let dir = t.path().join("sub");
    let done = extract(&img, &dir, &["--path", "e"]);
    assert!(done.status.success(), "extract --path e: {}", stderr(&done));
    let md = std::fs::symlink_metadata(dir.join("f")).unwrap();
    assert!(md.is_file());
    assert_eq!(md.nlink(), 1);
    assert_eq!(std::fs::read(dir.join("f")).unwrap(), b"f\n");
    assert_untouched(&out);
}

/// Image: a setuid-root and a setgid file, a device (1:3, like /dev/null, mode 0666), a
/// whiteout (0:0), a file with a capability, and xattrs in every namespace.
fn privileged_image(tmp: &Path) -> PathBuf {
    let src = tmp.join("priv-src");
    std::fs::create_dir(&src).unwrap();
    sh(&format!(
        "cd '{}' && echo x > suid && chmod 4755 suid && echo x > sgid && chown 0:100 sgid && \
         chmod 2755 sgid && mknod dev c 1 3 && chmod 666 dev && mknod wh c 0 0 && \
         echo x > cap && setfattr -n security.capability -v 0x0100000200200000000000000000000000000000 cap && \
         mkdir opaque && setfattr -n trusted.overlay.opaque -v y opaque && \
         setfattr -n user.note -v hi opaque && setfattr -n security.test -v t suid",
        src.display()
    ));
    let img = tmp.join("priv.img");
    crate::common::build(&src, &img, &["--quiet"]);
    img
}

fn xattr(p: &Path, name: &str) -> Option<Vec<u8>> {
    let out = std::process::Command::new("getfattr")
        .args(["-h", "--only-values", "-n", name])
        .arg(p)
        .output()
        .unwrap();
    out.status.success().then_some(out.stdout)
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode()
}

/// What an extract that does not restore owners must give: no set-id bits, no device, the
/// whiteout, `user.*` only, and a warning that says so.
fn assert_unprivileged(dir: &Path, out: &Output, uid: u32) {
    assert!(out.status.success(), "{}", stderr(out));
    let warn = stderr(out);
    for want in ["set-id bits", "1 device nodes", "xattrs", "not restored"] {
        assert!(warn.contains(want), "missing {want:?}: {warn}");
    }
    assert_eq!(mode(&dir.join("suid")) & 0o7777, 0o755);
    assert_eq!(mode(&dir.join("sgid")) & 0o7777, 0o755);
    assert_eq!(std::fs::metadata(dir.join("suid")).unwrap().uid(), uid);
    assert!(
        std::fs::symlink_metadata(dir.join("dev")).is_err(),
        "device made"
    );
    assert_eq!(std::fs::symlink_metadata(dir.join("wh")).unwrap().rdev(), 0);
    assert_eq!(
        xattr(&dir.join("opaque"), "user.note").as_deref(),
        Some(&b"hi"[..])
    );
    assert_eq!(xattr(&dir.join("opaque"), "trusted.overlay.opaque"), None);
    assert_eq!(xattr(&dir.join("cap"), "security.capability"), None);
    assert_eq!(xattr(&dir.join("suid"), "security.test"), None);
}

fn lacks_privileged_image_tools() -> bool {
    skip_unless(is_root(), "making device nodes and setuid files needs root")
        || skip_unless(have("getfattr"), "getfattr (attr) missing")
}

/// A temporary directory and the privileged image made in it; None, with the skip
/// recorded, where the tools to make it are missing.
fn privileged_fixture() -> Option<(tempfile::TempDir, PathBuf)> {
    if lacks_privileged_image_tools() {
        return None;
    }
    let t = tempdir();
    let img = privileged_image(t.path());
    Some((t, img))
}

#[test]
fn as_root_privilege_is_restored_as_the_image_says() {
    let Some((t, img)) = privileged_fixture() else {
        return;
    };
    // A faithful copy, as tar as root makes one.
    let dir = t.path().join("root");
    run(verilay().arg("extract").arg(&img).arg(&dir).arg("--quiet"));
    assert_eq!(mode(&dir.join("suid")) & 0o7777, 0o4755);
    assert_eq!(mode(&dir.join("sgid")) & 0o7777, 0o2755);
    assert_eq!(std::fs::metadata(dir.join("sgid")).unwrap().gid(), 100);
    let dev = std::fs::symlink_metadata(dir.join("dev")).unwrap();
    assert_eq!(
        (dev.rdev(), dev.mode() & 0o7777),
        (rustix::fs::makedev(1, 3), 0o666)
    );
    assert!(xattr(&dir.join("cap"), "security.capability").is_some());
    assert_eq!(
        xattr(&dir.join("opaque"), "trusted.overlay.opaque").as_deref(),
        Some(&b"y"[..])
    );
}

#[test]
fn no_same_owner_extracts_as_an_ordinary_user_does() {
    let Some((t, img)) = privileged_fixture() else {
        return;
    };
    let dir = t.path().join("no-same-owner");
    let out = extract(&img, &dir, &["--no-same-owner"]);
    assert_unprivileged(&dir, &out, 0);
}

#[test]
fn an_ordinary_user_gets_no_set_id_bits_devices_or_privileged_xattrs() {
    if lacks_privileged_image_tools() || lacks_test_user() {
        return;
    }
    let t = tempdir();
    privileged_image(t.path());
    let out = as_test_user(
        &user_dir(t.path()),
        &format!(
            "{} extract ../priv.img out --quiet",
            env!("CARGO_BIN_EXE_verilay")
        ),
    );
    let dir = t.path().join("user/out");
    let uid = std::fs::metadata(&dir).unwrap().uid();
    assert_ne!(uid, 0);
    assert_unprivileged(&dir, &out, uid);
}

/// Hostile inputs of this module for the fuzz targets.
pub fn seeds(tmp: &Path) -> Vec<Seed> {
    let out = outside(tmp);
    let mut cases = vec![duplicate_symlink_and_dir(tmp, &out)];
    cases.extend(structural_cases(tmp).into_iter().map(|(c, _)| c));
    let mut seeds = Vec::new();
    for c in cases {
        seeds.push(Seed {
            target: "read_image",
            name: format!("extract-{}", c.name),
            bytes: c.raw,
        });
        seeds.push(Seed {
            target: "verified_source",
            name: format!("extract-{}", c.name),
            bytes: std::fs::read(&c.image).unwrap(),
        });
    }
    seeds
}
