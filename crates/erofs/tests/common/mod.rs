//! Shared helpers for the reader tests: temp dirs, a tiny PRNG, a source tree with every
//! file type, and images made by `mkfs.erofs` (erofs-utils) from it.
#![allow(dead_code)]

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

pub const MKFS: &str = "mkfs.erofs";

mod skip;
pub use skip::skip_unless;

/// A builder node of `kind` with mode 0644, owned by root, mtime 1_700_000_000, size 0 and
/// `xattrs` (name, value).
pub fn node(kind: erofs::builder::Kind, xattrs: Vec<(Vec<u8>, Vec<u8>)>) -> erofs::builder::Node {
    erofs::builder::Node {
        kind,
        perm: 0o644,
        uid: 0,
        gid: 0,
        mtime: 1_700_000_000,
        mtime_nsec: 0,
        size: 0,
        xattrs,
    }
}

/// Whether `mkfs.erofs` can be run; when not, the test is recorded as skipped.
pub fn have_mkfs() -> bool {
    let ok = Command::new(MKFS).arg("--help").output().is_ok();
    !skip_unless(ok, "mkfs.erofs (erofs-utils) not found")
}

pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p =
            std::env::temp_dir().join(format!("verilay-erofs-{tag}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// splitmix64: deterministic, no dependencies.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

pub fn is_root() -> bool {
    // Not a probe file named by the process ID: tests run in parallel threads of one
    // process, and one thread's cleanup removed another's probe before it was read (a
    // full run as root counted a test as skipped).
    rustix::process::geteuid().is_root()
}

pub fn set_mtime(path: &Path, secs: i64, nsec: i64) {
    let t = rustix::fs::Timespec {
        tv_sec: secs,
        tv_nsec: nsec as _,
    };
    let ts = rustix::fs::Timestamps {
        last_access: t,
        last_modification: t,
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        path,
        &ts,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .expect("utimensat");
}

fn setxattr(path: &Path, name: &str, value: &[u8]) {
    rustix::fs::lsetxattr(path, name, value, rustix::fs::XattrFlags::empty()).expect("lsetxattr");
}

fn write(path: &Path, data: &[u8]) {
    fs::write(path, data).expect("write");
}

fn try_cmd(cmd: &str, args: &[&str]) -> bool {
    Command::new(cmd)
        .args(args)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// A tree with every file type, sizes around block boundaries, a directory spanning several
/// blocks, special names, hardlinks, long and short symlinks, xattrs (inline and shared),
/// ACLs, odd modes, owners and mtimes. `big` adds 64–300 KiB files and a 650-entry directory.
pub fn make_tree(root: &Path, big: bool) {
    // Without root the tree lacks devices, trusted.* xattrs and foreign owners: the test
    // goes on, checking less, and counts as skipped.
    skip_unless(
        is_root(),
        "not root: the tree has no device nodes, trusted.* xattrs or other owners",
    );
    let mut rng = Rng(42);
    let sizes: &[usize] = if big {
        &[
            0,
            1,
            100,
            511,
            4095,
            4096,
            4097,
            8191,
            8192,
            12293,
            65536,
            100_000,
            300 * 1024,
        ]
    } else {
        &[0, 1, 100, 4095, 4096, 4097, 9000]
    };
    for (i, &sz) in sizes.iter().enumerate() {
        write(&root.join(format!("f{i:02}")), &rng.bytes(sz));
    }
    let many = root.join("many");
    fs::create_dir(&many).unwrap();
    let n = if big { 650 } else { 240 };
    for i in 0..n {
        let name = format!("entry-{i:04}-{}", "x".repeat(i % 37));
        if i % 50 == 7 {
            fs::create_dir(many.join(&name)).unwrap();
            write(&many.join(&name).join("inner"), b"inner");
        } else {
            write(&many.join(&name), &rng.bytes(i % 300));
        }
    }
    for name in ["!bang", "-dash", ".hidden", "ünïcødé", "UPPER", "a b c"] {
        write(&root.join(name), name.as_bytes());
    }
    // 254, not 255: mkfs.erofs 1.5 fails ("Could not format the device") on 255-byte names.
    write(&root.join("n".repeat(254)), b"long name");
    let deep = root.join("a/b/c/d/e/f");
    fs::create_dir_all(&deep).unwrap();
    write(&deep.join("bottom"), b"bottom of the tree\n");
    symlink("f01", root.join("link-short")).unwrap();
    symlink("t".repeat(3000), root.join("link-long")).unwrap();
    symlink("/nonexistent/target", root.join("a/dangling")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        root.join("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from(0o640),
        0,
    )
    .expect("mkfifo");
    if is_root() {
        // May fail without CAP_MKNOD (containers); the tree is still useful without devices.
        use rustix::fs::{makedev, FileType};
        for (name, kind, mode, dev) in [
            ("cdev", FileType::CharacterDevice, 0o600, makedev(1, 3)),
            ("whiteout", FileType::CharacterDevice, 0, makedev(0, 0)),
            ("bdev", FileType::BlockDevice, 0o660, makedev(259, 300000)),
        ] {
            let _ = rustix::fs::mknodat(
                rustix::fs::CWD,
                root.join(name),
                kind,
                rustix::fs::Mode::from(mode),
                dev,
            );
        }
    }
    write(&root.join("hard1"), b"hardlinked content");
    fs::hard_link(root.join("hard1"), root.join("hard2")).unwrap();
    fs::hard_link(root.join("hard1"), root.join("a/hard3")).unwrap();
    let sparse = fs::File::create(root.join("sparse")).unwrap();
    sparse
        .set_len(if big { 1 << 20 } else { 64 << 10 })
        .unwrap();
    drop(sparse);

    // Xattrs: inline, a 1000-byte value, an empty value, and one on >2 inodes so mkfs shares it.
    setxattr(&root.join("f02"), "user.foo", b"bar");
    setxattr(&root.join("f03"), "user.big", &rng.bytes(1000));
    setxattr(&root.join("f04"), "user.empty", b"");
    for f in ["f01", "f02", "f05", "hard1", "a"] {
        setxattr(&root.join(f), "user.common", b"shared value");
    }
    setxattr(&root.join("a"), "user.dirattr", b"on a directory");
    if is_root() {
        setxattr(&root.join("a/b"), "trusted.overlay.opaque", b"y");
        // Enough trusted.overlay.* names for a builder to choose a long prefix.
        for i in (0..n).step_by(n / 16) {
            let name = format!("entry-{i:04}-{}", "x".repeat(i % 37));
            setxattr(
                &many.join(name),
                "trusted.overlay.redirect",
                format!("/objects/{i:04}").as_bytes(),
            );
        }
    }
    let path = |p: &str| root.join(p).to_string_lossy().into_owned();
    if try_cmd("setfacl", &["-m", "u:1234:rwx", &path("f05")]) {
        let _ = try_cmd("setfacl", &["-d", "-m", "g:55:rx", &path("a/b")]);
    }

    let chmod =
        |p: &str, m: u32| fs::set_permissions(root.join(p), fs::Permissions::from_mode(m)).unwrap();
    chmod("f00", 0o4755);
    chmod("f01", 0o600);
    chmod("f02", 0);
    fs::create_dir(root.join("sticky")).unwrap();
    chmod("sticky", 0o1777);
    if is_root() {
        std::os::unix::fs::lchown(root.join("f03"), Some(1000), Some(100)).unwrap();
        std::os::unix::fs::lchown(root.join("f04"), Some(70000), Some(70001)).unwrap();
        std::os::unix::fs::lchown(root.join("link-short"), Some(5), Some(6)).unwrap();
        std::os::unix::fs::lchown(root.join("a/b"), Some(65536), Some(0)).unwrap();
    }
    // Old mtimes force extended inodes with full nanoseconds; set directories last since
    // creating entries updates their mtime.
    set_mtime(&root.join("f00"), 1_000_000_000, 123_456_789);
    set_mtime(&root.join("link-short"), 1_500_000_000, 0);
    set_mtime(&root.join("hard1"), 1_234_567_890, 999_999_999);
    set_mtime(&root.join("a/b/c"), -1_000, 5);
    set_mtime(&root.join("a"), 1_234_567_890, 500_000_000);
}

/// Builds an image of `tree` with `mkfs.erofs` and `args`; panics with mkfs's output on
/// failure (the caller has checked that mkfs exists).
pub fn mkfs(tree: &Path, args: &[&str]) -> Vec<u8> {
    let out = tree.with_extension(format!("img{}", args.join("").len()));
    let res = Command::new(MKFS)
        .arg("--quiet")
        .args(args)
        .arg(&out)
        .arg(tree)
        .output()
        .expect("run mkfs.erofs");
    assert!(
        res.status.success(),
        "mkfs.erofs {args:?} failed: {}{}",
        String::from_utf8_lossy(&res.stdout),
        String::from_utf8_lossy(&res.stderr)
    );
    let img = fs::read(&out).expect("read image");
    let _ = fs::remove_file(&out);
    img
}

/// Recomputes the superblock checksum after a test changed bytes of the first block (only
/// when the image claims SB_CHKSUM). Returns false if the image is too short or odd.
pub fn fix_checksum(img: &mut [u8]) -> bool {
    use erofs::format;
    if img.len() < 1024 + 128 {
        return false;
    }
    let compat = u32::from_le_bytes(img[1032..1036].try_into().unwrap());
    if compat & format::FEATURE_COMPAT_SB_CHKSUM == 0 {
        return true;
    }
    let bits = img[1036];
    if !(9..=16).contains(&bits) {
        return false;
    }
    match format::superblock_checksum(img, 1usize << bits) {
        Some(c) => {
            img[1028..1032].copy_from_slice(&c.to_le_bytes());
            true
        }
        None => false,
    }
}

/// Gives every entry below `root` (and `root`) a deterministic, distinct mtime, so images
/// built from the tree are byte-for-byte repeatable (mutation numbers stay meaningful).
pub fn fix_mtimes(root: &Path) {
    let mut paths = vec![root.to_path_buf()];
    let mut i = 0;
    while i < paths.len() {
        let p = paths[i].clone();
        if fs::symlink_metadata(&p).unwrap().is_dir() {
            let mut kids: Vec<PathBuf> = fs::read_dir(&p)
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            kids.sort();
            paths.extend(kids);
        }
        i += 1;
    }
    // Children first, so setting a file's time never disturbs its directory's afterwards.
    for (n, p) in paths.iter().enumerate().rev() {
        set_mtime(
            p,
            1_500_000_000 + 7 * n as i64,
            (n as i64 * 1_000_003) % 1_000_000_000,
        );
    }
}
