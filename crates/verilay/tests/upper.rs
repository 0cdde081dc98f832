//! `verilay mount IMAGE --upper DIR --work DIR`: the same changes made through verilay and
//! through the kernel's overlayfs (over the kernel's erofs mount of the same image) give
//! the same merged tree and the same markers in the upper directory; and each one mounts
//! what the other wrote.

mod common;
use common::*;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn prerequisites() -> bool {
    skip_unless(is_root(), "needs root (kernel mounts, chown)")
        || skip_unless(Path::new("/dev/fuse").exists(), "/dev/fuse missing")
}

fn lower_tree(src: &Path) {
    sh(&format!(
        "set -e; mkdir -p {0} && cd {0}
         mkdir -p olddir replaced sub/deep keepdir
         echo keep > keep.txt; echo gone > gone.txt; echo a > olddir/a; echo b > olddir/b
         echo old > replaced/old; echo m > mode.txt; echo o > owned.txt; echo r > renamed.txt
         echo 0123456789 > trunc.txt; echo deep > sub/deep/file; echo k > keepdir/k
         echo acl > acl.txt; setfacl -m u:1234:r-- acl.txt; setfattr -n user.lower -v 1 keep.txt
         head -c 300000 /dev/urandom > big.bin; cp /usr/bin/sleep prog
         mkdir -p emptied/e twin left right; echo e > emptied/e/f; echo t > twin/t
         echo l > left/l; echo r > right/r",
        src.display()
    ));
}

/// A temporary directory with the image of `lower_tree` and the kernel's erofs mount of it.
fn lower_fixture() -> (tempfile::TempDir, PathBuf, Mount) {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    lower_tree(&src);
    let image = t.path().join("lower.img");
    build(&src, &image, &["--quiet"]);
    let lower = Mount::erofs(&image, &t.path().join("lower"));
    (t, image, lower)
}

/// `lower_fixture` for a test that needs only `prerequisites`; None, with the skip
/// recorded, where they are missing.
fn prepared_lower() -> Option<(tempfile::TempDir, PathBuf, Mount)> {
    if prerequisites() {
        return None;
    }
    Some(lower_fixture())
}

/// For a test that needs only `prerequisites`: a temporary directory and its `src` path
/// (not made); None, with the skip recorded, where they are missing.
fn prepared_src() -> Option<(tempfile::TempDir, PathBuf)> {
    if prerequisites() {
        return None;
    }
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    Some((t, src))
}

/// What a user does to the merged tree.
const CHANGES: &str = "set -e
    echo more >> keep.txt
    echo new > newfile
    mkdir -p newdir/sub && echo x > newdir/sub/x
    rm gone.txt
    rm -r olddir
    rm -r replaced && mkdir replaced && echo r > replaced/r
    chmod 0600 mode.txt
    chown 1234:5678 owned.txt
    setfattr -n user.added -v yes keep.txt
    ln -s newfile link
    ln newfile hard
    mv renamed.txt moved.txt
    truncate -s 3 trunc.txt
    mkfifo fifo
    dd if=/dev/zero of=big.bin bs=4096 seek=10 count=2 conv=notrunc status=none
    setfacl -m u:4321:rw- keep.txt
    ls -lR > /dev/null
    mkdir acldir && setfacl -d -m u:1234:rwx,g::r-x,o::--- acldir
    touch acldir/f && mkdir acldir/sub && (umask 077; touch acldir/g)
    (umask 027; touch umasked; mkdir umaskeddir)
    echo k2 > keepdir/k2
    chmod 0640 sub/deep/file
    mv keepdir keptdir
    mkdir moved && mv sub/deep moved/deep && echo more > moved/deep/extra
    mkdir fresh && echo f > fresh/f && mv fresh olddir
    exchange() { python3 -c 'import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.renameat2(-100, sys.argv[1].encode(), -100, sys.argv[2].encode(), 2):
    sys.exit(os.strerror(ctypes.get_errno()))' \"$1\" \"$2\"; }
    exchange prog newfile
    exchange left right
    exchange keptdir moved/deep
    rm -r emptied/e && mv -T twin emptied
    mkdir newsub && echo n > newsub/n && mv -T newsub sub
    exchange newdir owned.txt
    touch -d '2020-01-01 00:00:00' keep.txt newdir";

/// The merged tree as the user sees it: names, types, modes, owners, sizes, link counts
/// (`ls`, without times: the two runs make their changes at different moments), contents,
/// xattrs and ACLs.
fn view(root: &Path) -> String {
    let ls = run(Command::new("ls")
        .args(["-lRAn", "--time-style=+", "."])
        .current_dir(root));
    let sums = run(Command::new("sh")
        .arg("-c")
        .arg("find . -type f -print0 | sort -z | xargs -0 sha256sum")
        .current_dir(root));
    // Block totals differ by design: overlayfs adds its own xattrs (origin, impure) to
    // the directories it copies up, which may take an extra block on the host.
    let ls: String = String::from_utf8_lossy(&ls.stdout)
        .lines()
        .filter(|l| !l.starts_with("total "))
        .map(|l| format!("{l}\n"))
        .collect();
    format!(
        "{}\n{}\n{:?}\n{:?}",
        ls,
        String::from_utf8_lossy(&sums.stdout),
        xattr_dump(root),
        acl_dump(root)
    )
}

/// The upper directory's entries and overlayfs markers (whiteouts, opaque directories,
/// redirects).
fn markers(upper: &Path) -> String {
    let out = run(Command::new("sh")
        .arg("-c")
        .arg(
            "find . -mindepth 1 -printf '%P %y %m %U:%G\\n' | sort; \
             for d in $(find . -type d); do v=$(getfattr --only-values -n trusted.overlay.opaque $d 2>/dev/null); \
             [ -n \"$v\" ] && echo \"opaque $d $v\"; \
             v=$(getfattr --only-values -n trusted.overlay.redirect $d 2>/dev/null); \
             [ -n \"$v\" ] && echo \"redirect $d $v\"; done; true",
        )
        .current_dir(upper));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn changes_through_verilay_match_kernel_overlayfs_both_ways() {
    let Some((t, image, lower)) = prepared_lower() else {
        return;
    };

    let ours = dirs(t.path(), "ours");
    let theirs = dirs(t.path(), "theirs");
    let (ours_view, theirs_view) = {
        let v = verilay_mount(&image, &ours, &t.path().join("v"));
        let k = overlay_mount(&lower.dir, &theirs, &t.path().join("k"));
        sh(&format!("cd {} && {CHANGES}", v.dir.display()));
        sh(&format!("cd {} && {CHANGES}", k.dir.display()));
        let (a, b) = (view(&v.dir), view(&k.dir));
        assert_eq!(a, b, "the merged trees differ");
        // Spot checks that the comparison is about something.
        assert!(a.contains("newdir"), "{a}");
        assert!(!a.contains("gone.txt"), "{a}");
        (a, b)
    };
    assert_eq!(
        markers(&ours.upper),
        markers(&theirs.upper),
        "the upper directories differ"
    );
    // Each mounts the other's upper directory.
    let v = verilay_mount(&image, &theirs, &t.path().join("v2"));
    assert_eq!(view(&v.dir), theirs_view, "verilay over overlayfs's upper");
    drop(v);
    let k = overlay_mount(&lower.dir, &ours, &t.path().join("k2"));
    assert_eq!(view(&k.dir), ours_view, "overlayfs over verilay's upper");
}

/// Open descriptors around a copy-up, a running program, and locks: a read-only descriptor
/// opened before another one's write copies the file up reads the new bytes; no open of a
/// program being run may change it (ETXTBSY), whether it comes from the image or not; and
/// whole-file and byte-range locks conflict between processes as on any filesystem.
const OPEN_FILES: &str = r#"
import os, subprocess, sys
m = sys.argv[1]
out = []
p = os.path.join(m, 'big.bin')
a = os.open(p, os.O_RDONLY)
os.pread(a, 4096, 0)
b = os.open(p, os.O_RDWR)
os.pwrite(b, b'X' * 4096, 0); os.pwrite(b, b'Y' * 4096, 200000); os.close(b)
out.append(('earlier descriptor', os.pread(a, 1, 0), os.pread(a, 1, 200000)))
c = os.open(p, os.O_RDONLY)
out.append(('later descriptor', os.pread(c, 1, 0), os.pread(c, 1, 200000)))
new = os.path.join(m, 'newprog')
with open('/usr/bin/sleep', 'rb') as s, open(new, 'wb') as d:
    d.write(s.read())
os.chmod(new, 0o755)
for exe in (os.path.join(m, 'prog'), new):
    size = os.stat(exe).st_size
    proc = subprocess.Popen([exe, '30'])
    for fl in (os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_TRUNC):
        try:
            os.close(os.open(exe, fl))
            out.append((exe[len(m):], fl, 'opened'))
        except OSError as e:
            out.append((exe[len(m):], fl, e.errno))
    out.append((exe[len(m):], 'unchanged', os.stat(exe).st_size == size, 'running', proc.poll() is None))
    proc.kill(); proc.wait()
import fcntl
TRY = 'import fcntl, sys; f = open(sys.argv[1], "r+"); ' \
      'fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB) if sys.argv[2] == "flock" else ' \
      'fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 10, int(sys.argv[2]))'
for name in ('keep.txt', 'newfile'):
    path = os.path.join(m, name)
    if not os.path.exists(path):
        open(path, 'w').close()
    held = open(path, 'r+')
    fcntl.flock(held, fcntl.LOCK_EX)
    fcntl.lockf(held, fcntl.LOCK_EX, 10, 0)
    for what in ('flock', '5', '20'):
        r = subprocess.run([sys.executable, '-c', TRY, path, what], capture_output=True)
        out.append((name, 'lock', what, 'taken' if r.returncode == 0 else 'busy'))
    held.close()
    r = subprocess.run([sys.executable, '-c', TRY, path, 'flock'], capture_output=True)
    out.append((name, 'lock after close', 'taken' if r.returncode == 0 else 'busy'))
print(out)
"#;

#[test]
fn open_files_and_running_programs_behave_as_in_overlayfs() {
    // The FUSE engine: kernel overlayfs (the kernel engine) copies a running image
    // program up empty on O_TRUNC, which this test holds the FUSE engine to avoid.
    let Some((t, image, lower)) = prepared_lower() else {
        return;
    };
    let saw = |dir: &Path| {
        let out = run(Command::new("python3").args(["-c", OPEN_FILES]).arg(dir));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let theirs = {
        let k = overlay_mount(&lower.dir, &dirs(t.path(), "kernel"), &t.path().join("k"));
        saw(&k.dir)
    };
    let ours = {
        let v = verilay_mount_fuse(&image, &dirs(t.path(), "verilay"), &t.path().join("v"));
        saw(&v.dir)
    };
    assert!(
        theirs.contains("(\'earlier descriptor\', b\'X\', b\'Y\')"),
        "{theirs}"
    );
    assert!(!theirs.contains("opened"), "{theirs}");
    for lock in [
        "(\'keep.txt\', \'lock\', \'flock\', \'busy\')",
        "(\'keep.txt\', \'lock\', \'5\', \'busy\')",
        "(\'keep.txt\', \'lock\', \'20\', \'taken\')",
        "(\'newfile\', \'lock after close\', \'taken\')",
    ] {
        assert!(theirs.contains(lock), "{lock} in {theirs}");
    }
    // One difference, ours: overlayfs copies an image program up without its data for
    // O_TRUNC before it refuses the open with ETXTBSY, and the file is left empty.
    let quirk = "(\'/prog\', \'unchanged\', False, \'running\', True)";
    assert!(theirs.contains(quirk), "{theirs}");
    assert_eq!(
        ours,
        theirs.replace(quirk, "(\'/prog\', \'unchanged\', True, \'running\', True)")
    );
}

/// Preallocation, hole punching and zeroing through the mount, on a host filesystem whose
/// free space is full of an old pattern: every read gives zeros or what was written, never
/// the pattern (seed 2). Modes FUSE does not forward, and unknown ones, are refused.
const FALLOCATE_CHECKS: &str = r#"
import ctypes, errno, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
KEEP, PUNCH, COLLAPSE, ZERO, INSERT = 1, 2, 8, 16, 32
M = 1 << 20
m = sys.argv[1]
def fa(fd, mode, off, ln):
    if libc.fallocate(fd, mode, off, ln) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
def check(name):
    with open(os.path.join(m, name), 'rb') as f:
        d = f.read()
    assert b'STALE' not in d, name + ': old data exposed'
    return d
def new(name):
    return os.open(os.path.join(m, name), os.O_CREAT | os.O_RDWR, 0o644)
def verify():
    assert check('pre') == bytes(32 * M)
    assert check('keep') == bytes(32 * M)
    d = check('punch')
    assert d[:M] == b'D' * M and d[M:2 * M] == bytes(M) and d[2 * M:] == b'D' * 6 * M
    d = check('zero')
    assert len(d) == 7 * M and d[:3 * M] == b'D' * 3 * M and d[3 * M:] == bytes(4 * M)
    d = check('lowerfile')
    assert d[:M] == bytes(M) and d[M:4 * M] == b'L' * 3 * M and d[4 * M:] == bytes(8 * M), len(d)
if sys.argv[2] == 'write':
    fd = new('pre'); fa(fd, 0, 0, 32 * M); os.close(fd)
    fd = new('keep'); fa(fd, KEEP, 0, 32 * M)
    assert os.fstat(fd).st_size == 0
    os.ftruncate(fd, 32 * M); os.close(fd)
    fd = new('punch'); os.write(fd, b'D' * 8 * M); fa(fd, PUNCH | KEEP, M, M); os.close(fd)
    fd = new('zero'); os.write(fd, b'D' * 4 * M); fa(fd, ZERO, 3 * M, 4 * M); os.close(fd)
    fd = os.open(os.path.join(m, 'lowerfile'), os.O_RDWR)
    fa(fd, PUNCH | KEEP, 0, M); fa(fd, 0, 4 * M, 8 * M); os.close(fd)
    for mode in (COLLAPSE, INSERT, 0x100):
        fd = os.open(os.path.join(m, 'pre'), os.O_RDWR)
        try:
            fa(fd, mode, 0, M)
            raise SystemExit('fallocate mode %#x accepted' % mode)
        except OSError as e:
            assert e.errno == errno.EOPNOTSUPP, e
        os.close(fd)
verify()
"#;

#[test]
fn fallocate_never_shows_old_data_on_ext4_or_xfs() {
    // The FUSE engine: it refuses collapse and insert ranges, which kernel overlayfs
    // (the kernel engine) passes to the host filesystem.
    if prerequisites() {
        return;
    }
    for (fs, size) in [("ext4", "160M"), ("xfs", "320M")] {
        if skip_unless(have(&format!("mkfs.{fs}")), &format!("mkfs.{fs} missing")) {
            continue;
        }
        let t = tempfile::tempdir().unwrap();
        let base = t.path();
        // A host filesystem whose free blocks all hold the pattern (freed without discard).
        sh(&format!(
            "set -e; cd {0}; truncate -s {size} host.img; mkfs.{fs} -q host.img; mkdir host
             mount -o loop,nodiscard host.img host
             python3 -c \"
f = open('host/fill', 'wb')
try:
    while True:
        f.write(b'STALE' * 209715)
except OSError:
    pass
\" 2>/dev/null || true
             sync; rm host/fill; sync; mkdir host/up host/wk src
             head -c 4194304 /dev/zero | tr '\\0' L > src/lowerfile",
            base.display()
        ));
        let host = Unmount {
            dir: base.join("host"),
            fuse: false,
        };
        let image = base.join("lower.img");
        build(&base.join("src"), &image, &["--quiet"]);
        let d = Dirs {
            upper: host.dir.join("up"),
            work: host.dir.join("wk"),
        };
        let m = verilay_mount_fuse(&image, &d, &base.join("m"));
        let py = |phase: &str| {
            run(Command::new("python3")
                .arg("-c")
                .arg(FALLOCATE_CHECKS)
                .arg(&m.dir)
                .arg(phase));
        };
        py("write");
        // Again from the host's disk, not the page cache.
        sh("sync; echo 3 > /proc/sys/vm/drop_caches");
        py("verify");
        drop(m);
    }
}

const CRASH_WRITER: &str = r#"
import os, sys
m = sys.argv[1]
i = 0
try:
    while True:
        p = os.path.join(m, 'lower', 'f%03d' % (i % 200))
        fd = os.open(p, os.O_WRONLY | os.O_APPEND)
        os.write(fd, b'appended %d\n' % i)
        os.fsync(fd)
        os.close(fd)
        n = os.path.join(m, 'new', 'n%05d' % i)
        fd = os.open(n, os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(fd, b'new %d\n' % i * 100)
        os.fsync(fd)
        os.close(fd)
        print(i, flush=True)
        i += 1
except OSError:
    pass
"#;

#[test]
fn a_killed_daemon_loses_no_acknowledged_write_and_leaves_no_half_copy() {
    // The FUSE engine, whose daemon the writes pass through (the kernel engine's never
    // do).
    let Some(t) = tempdir_unless(prerequisites()) else {
        return;
    };
    let base = t.path();
    sh(&format!(
        "set -e; mkdir -p {0}/src/lower {0}/src/new; cd {0}/src/lower
         for i in $(seq -w 0 199); do head -c 65536 /dev/urandom > f$i; done",
        base.display()
    ));
    let image = base.join("lower.img");
    build(&base.join("src"), &image, &["--quiet"]);
    let d = dirs(base, "c");
    let mnt = base.join("m");
    let m = verilay_mount_fuse(&image, &d, &mnt);
    let mut writer = Command::new("python3")
        .arg("-c")
        .arg(CRASH_WRITER)
        .arg(&m.dir)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The writer prints each write it had acknowledged; kill the daemon mid-run, after 30.
    let acks = std::sync::Arc::new(std::sync::Mutex::new(Vec::<usize>::new()));
    let reader = {
        let acks = acks.clone();
        let out = writer.stdout.take().unwrap();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(out).lines() {
                if let Ok(i) = line.unwrap().trim().parse() {
                    acks.lock().unwrap().push(i);
                }
            }
        })
    };
    wait_until(
        std::time::Duration::from_secs(60),
        "30 acknowledged writes",
        || acks.lock().unwrap().len() >= 30,
    );
    let daemons = daemons_of(&m.dir);
    assert!(!daemons.is_empty(), "no daemon serves {}", m.dir.display());
    for pid in daemons {
        run(Command::new("kill").args(["-KILL", &pid.to_string()]));
    }
    writer.wait().unwrap();
    reader.join().unwrap();
    let acked = acks.lock().unwrap().clone();
    assert!(
        acked.len() > 20,
        "too few writes before the kill: {}",
        acked.len()
    );
    drop(m);
    let _ = Command::new("umount").arg("-l").arg(&mnt).status();

    let m = verilay_mount_fuse(&image, &d, &mnt);
    let original =
        |i: usize| std::fs::read(base.join(format!("src/lower/f{:03}", i % 200))).unwrap();
    for &i in &acked {
        let f = std::fs::read(m.dir.join(format!("lower/f{:03}", i % 200))).unwrap();
        assert!(
            f.starts_with(&original(i)),
            "f{:03}: the copy-up lost data",
            i % 200
        );
        let line = format!("appended {i}\n");
        assert!(
            String::from_utf8_lossy(&f[65536..]).contains(&line),
            "acknowledged append {i} is missing"
        );
        let n = std::fs::read(m.dir.join(format!("new/n{i:05}"))).unwrap();
        assert_eq!(n, format!("new {i}\n").repeat(100).into_bytes(), "n{i:05}");
    }
    // No copy-up is ever half done: every lower file reads whole, copied or not.
    for i in 0..200 {
        let f = std::fs::read(m.dir.join(format!("lower/f{i:03}"))).unwrap();
        assert!(f.starts_with(&original(i)), "f{i:03} is a partial copy");
    }
    // Nothing is left behind in the work directory after the next mount.
    assert_eq!(
        std::fs::read_dir(d.work.join("verilay")).unwrap().count(),
        0
    );
}

/// An fsx-style exerciser: random writes, reads, truncates, preallocation, hole punching,
/// zeroing, mmap reads and writes and reopens on one file through the mount, checked
/// against an in-memory copy after every operation.
fn exercise_file(path: &Path, seed: u64, ops: usize, initial: Vec<u8>) {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;
    const MAX_LEN: u64 = 256 * 1024;
    let mut rng = xorshift::XorShift(seed | 1);
    let mut next = move || rng.next_u64();
    let mut model = initial;
    let open = || {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap()
    };
    let mut f = open();
    let fallocate = |f: &std::fs::File, mode: i32, off: u64, len: u64| {
        let flags = rustix::fs::FallocateFlags::from_bits_retain(mode as u32);
        rustix::fs::fallocate(f, flags, off, len)
    };
    for op in 0..ops {
        let size = model.len() as u64;
        let off = next() % MAX_LEN;
        let len = 1 + next() % (64 * 1024);
        let what = next() % 10;
        let ctx = || format!("op {op} ({what}) at {off}+{len}, size {size}");
        match what {
            0 | 1 => {
                // write
                let data: Vec<u8> = (0..len).map(|i| (op as u64 + i) as u8 | 1).collect();
                f.write_all_at(&data, off).unwrap();
                let end = (off + len) as usize;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[off as usize..end].copy_from_slice(&data);
            }
            2 | 3 => {
                // read
                if size == 0 {
                    continue;
                }
                let off = off % size;
                let len = len.min(size - off);
                let mut buf = vec![0u8; len as usize];
                f.read_exact_at(&mut buf, off).unwrap();
                assert!(
                    buf == model[off as usize..(off + len) as usize],
                    "read mismatch: {}",
                    ctx()
                );
            }
            4 => {
                // truncate
                let new = next() % MAX_LEN;
                f.set_len(new).unwrap();
                model.resize(new as usize, 0);
            }
            5 => {
                // preallocate, keeping or growing the size
                let keep = next() % 2 == 0;
                fallocate(&f, if keep { 1 } else { 0 }, off, len).unwrap();
                if !keep && (off + len) as usize > model.len() {
                    model.resize((off + len) as usize, 0);
                }
            }
            6 | 7 => {
                // punch a hole (keeps the size) or zero a range (may grow it)
                let punch = what == 6;
                fallocate(&f, if punch { 2 | 1 } else { 16 }, off, len).unwrap();
                let end = (off + len) as usize;
                if !punch && end > model.len() {
                    model.resize(end, 0);
                }
                let end = end.min(model.len());
                if (off as usize) < end {
                    model[off as usize..end].fill(0);
                }
            }
            8 => {
                // mmap: read the whole file, write a byte range
                if size == 0 {
                    continue;
                }
                #[allow(unsafe_code)] // mmap, a syscall
                // SAFETY: the map is private to this test; nothing else writes the file
                // while it exists, and it is dropped before the next operation.
                let mut map = unsafe { memmap2::MmapMut::map_mut(&f).unwrap() };
                assert!(map[..] == model[..], "mmap read mismatch: {}", ctx());
                let off = (off % size) as usize;
                let end = (off + len as usize).min(size as usize);
                for (i, b) in map[off..end].iter_mut().enumerate() {
                    *b = (i as u8) ^ 0x5a;
                }
                map.flush().unwrap();
                for (i, b) in model[off..end].iter_mut().enumerate() {
                    *b = (i as u8) ^ 0x5a;
                }
            }
            _ => {
                // close and reopen, checking the size on the way
                assert_eq!(f.metadata().unwrap().len(), size, "size: {}", ctx());
                drop(f);
                f = open();
                let _ = f.as_raw_fd();
            }
        }
    }
    let got = std::fs::read(path).unwrap();
    assert!(got == model, "final contents differ");
}

#[test]
fn an_fsx_style_run_finds_no_miscompare_on_new_and_copied_up_files() {
    let Some((t, src)) = prepared_src() else {
        return;
    };
    std::fs::create_dir_all(&src).unwrap();
    let lower: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(src.join("lower"), &lower).unwrap();
    let image = t.path().join("lower.img");
    build(&src, &image, &["--quiet"]);
    let d = dirs(t.path(), "fsx");
    let m = verilay_mount(&image, &d, &t.path().join("m"));
    std::fs::write(m.dir.join("new"), b"").unwrap();
    exercise_file(&m.dir.join("new"), 0x9e37_79b9, 100_000, Vec::new());
    exercise_file(&m.dir.join("lower"), 0x1234_5678, 100_000, lower);
}

#[test]
fn a_rootless_upper_keeps_ownership_in_the_override_xattr() {
    if prerequisites() || lacks_test_user() {
        return;
    }
    let base = PathBuf::from(format!(
        "/tmp/verilay-rootless-upper-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&base);
    // An image whose files belong to someone else (as a container image's belong to root).
    sh(&format!(
        "set -e; mkdir -p {0}/src/shared {0}/up {0}/work {0}/mnt; cd {0}/src
         echo theirs > shared/file; chown -R 1234:1234 shared; chmod 0777 shared; chmod 0666 shared/file",
        base.display()
    ));
    std::fs::copy(env!("CARGO_BIN_EXE_verilay"), base.join("verilay")).unwrap();
    build(&base.join("src"), &base.join("img"), &["--quiet"]);
    sh(&format!(
        "chown verilaytest {0} {0}/up {0}/work {0}/mnt {0}/img {0}/verilay",
        base.display()
    ));
    let as_user = |args: &str| as_test_user_ok(&base, args);
    let mount = "./verilay mount img --upper up --work work mnt --quiet";
    as_user(mount);
    // Copy-up of someone else's file: the tree still shows their ownership and mode.
    as_user("echo mine >> mnt/shared/file && echo new > mnt/shared/new");
    assert_eq!(
        as_user("stat -c '%u:%g %a' mnt/shared/file mnt/shared mnt/shared/new"),
        format!(
            "1234:1234 666\n1234:1234 777\n{0}:{0} 644\n",
            as_user("id -u").trim()
        )
    );
    assert_eq!(as_user("cat mnt/shared/file"), "theirs\nmine\n");
    // On the host the copy is the user's own, carrying the shown owner in the xattr, which
    // the mount hides.
    let host = std::fs::metadata(base.join("up/shared/file")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_ne!(host.uid(), 1234);
    let xattr = Command::new("getfattr")
        .args(["--only-values", "-n", "user.containers.override_stat"])
        .arg(base.join("up/shared/file"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&xattr.stdout), "1234:1234:0100666");
    assert!(!as_user("getfattr -d -m - mnt/shared/file").contains("override"));
    // It survives a remount.
    as_user("./verilay umount mnt");
    as_user(mount);
    assert_eq!(
        as_user("stat -c '%u:%g %a' mnt/shared/file"),
        "1234:1234 666\n"
    );
    as_user("./verilay umount mnt");
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn a_copied_up_file_keeps_its_inode_number_across_remounts() {
    let Some((t, image, _lower)) = prepared_lower() else {
        return;
    };
    let d = dirs(t.path(), "ino");
    let mnt = t.path().join("m");
    let ino = |p: &Path| std::fs::symlink_metadata(p).unwrap().ino();
    let before = {
        let m = verilay_mount(&image, &d, &mnt);
        let before = ino(&m.dir.join("keep.txt"));
        sh(&format!(
            "echo more >> '{}'",
            m.dir.join("keep.txt").display()
        ));
        assert_eq!(
            ino(&m.dir.join("keep.txt")),
            before,
            "copy-up keeps the number"
        );
        std::fs::write(m.dir.join("made.txt"), b"new").unwrap();
        before
    };
    // The lazy unmount returns at once; the directories are free once the daemon is gone.
    wait_daemon_gone(&mnt);
    let m = verilay_mount(&image, &d, &mnt);
    assert_eq!(
        ino(&m.dir.join("keep.txt")),
        before,
        "and keeps it after a remount"
    );
    assert_eq!(
        std::fs::read_to_string(m.dir.join("keep.txt")).unwrap(),
        "keep\nmore\n"
    );
    // The record is the mount's own: not among the file's xattrs.
    let list = run(Command::new("getfattr")
        .args(["-d", "-m", "-"])
        .arg(m.dir.join("keep.txt")));
    assert!(!String::from_utf8_lossy(&list.stdout).contains("origin"));
    assert_ne!(ino(&m.dir.join("made.txt")), before);
}

#[test]
fn a_hostile_redirect_is_an_error_not_a_loop() {
    // The FUSE engine's reading of redirects (kernel overlayfs answers EACCES).
    let Some((t, image, _lower)) = prepared_lower() else {
        return;
    };
    let d = dirs(t.path(), "hostile");
    // Redirects overlayfs would refuse: one that climbs, one with an empty part, a
    // relative one with a slash, one with a name longer than NAME_MAX; and a valid one
    // for contrast.
    let long_name = format!("/{}", "n".repeat(256));
    for (dir, to) in [
        ("up", "/sub/.."),
        ("empty", "//sub"),
        ("slash", "sub/deep"),
        ("long", long_name.as_str()),
        ("good", "/sub"),
    ] {
        std::fs::create_dir(d.upper.join(dir)).unwrap();
        setfattr(&d.upper.join(dir), "trusted.overlay.redirect", to);
    }
    let m = verilay_mount_fuse(&image, &d, &t.path().join("m"));
    for dir in ["up", "empty", "slash", "long"] {
        let err = std::fs::read_dir(m.dir.join(dir)).map(|_| ()).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(5), "{dir}: {err}");
    }
    let good: Vec<_> = std::fs::read_dir(m.dir.join("good"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(good, vec![std::ffi::OsString::from("deep")]);
    assert_eq!(std::fs::read(m.dir.join("keep.txt")).unwrap(), b"keep\n");
}

/// The pid of the daemon serving `mnt`.
fn daemon_of(mnt: &Path) -> String {
    let out = run(Command::new("pgrep").arg("-f").arg(mnt));
    let pid = String::from_utf8_lossy(&out.stdout);
    pid.lines().next().unwrap().trim().to_string()
}

/// The daemon's descriptors now: one per upper object the kernel has cached, at least.
fn descriptors_of(mnt: &Path) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", daemon_of(mnt)))
        .unwrap()
        .count()
}

/// A line of `/proc/PID/FILE` starting with `key`, its first number.
fn proc_number(pid: &str, file: &str, key: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).unwrap();
    let line = text.lines().find(|l| l.starts_with(key)).unwrap();
    line[key.len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn the_daemon_grows_its_descriptor_table_before_its_threads_start() {
    // Grown later, each doubling waits for an RCU grace period (10-20 ms) in the middle
    // of some request: a fresh mount's first few hundred creates paid five.
    let Some((t, image, _lower)) = prepared_lower() else {
        return;
    };
    let d = dirs(t.path(), "table");
    let m = verilay_mount(&image, &d, &t.path().join("m"));
    let pid = daemon_of(&m.dir);
    let limit = proc_number(&pid, "limits", "Max open files");
    let slots = proc_number(&pid, "status", "FDSize:");
    assert!(
        slots >= limit.min(1 << 16),
        "{slots} descriptor slots for a limit of {limit}"
    );
}

#[test]
fn a_tree_of_more_objects_than_descriptors_is_written_whole() {
    if prerequisites() || skip_unless(have("prlimit"), "prlimit missing") {
        return;
    }
    // A node holds its upper object's descriptor while the kernel caches it, and the
    // kernel caches everything it looked up: under 256 descriptors, 3,000 files in 400
    // directories would fail with EMFILE unless the kernel is made to drop old names.
    let (t, image, _lower) = lower_fixture();
    let src = t.path().join("src");
    sh(&format!(
        "set -e; for d in $(seq 400); do mkdir -p {0}/d$((d % 20))/e$d; done; \
         for f in $(seq 3000); do k=$((f % 400 + 1)); echo file $f > {0}/d$((k % 20))/e$k/f$f; done; \
         ln {0}/d1/e1/f400 {0}/d2/linked",
        src.display()
    ));
    let d = dirs(t.path(), "limit");
    let mnt = t.path().join("m");
    std::fs::create_dir_all(&mnt).unwrap();
    // Measured too: the list names a file by the path its node knows, also when its
    // node (or a directory's above it) was dropped and looked up again.
    let policy = t.path().join("policy");
    std::fs::write(&policy, "measure func=FILE_CHECK mask=^MAY_READ\n").unwrap();
    let list = t.path().join("list");
    run(Command::new("prlimit")
        .arg("--nofile=256:256")
        .arg(env!("CARGO_BIN_EXE_verilay"))
        .arg("mount")
        .arg(&image)
        .arg("--upper")
        .arg(&d.upper)
        .arg("--work")
        .arg(&d.work)
        .arg(&mnt)
        .arg("--policy")
        .arg(&policy)
        .arg("--measure-log")
        .arg(&list));
    let m = Unmount::fuse(&mnt);
    // A file opened first and held open through it all keeps working.
    let held = m.dir.join("held");
    let mut f = std::fs::File::create(&held).unwrap();
    let first = std::fs::metadata(&held).unwrap().ino();
    run(Command::new("cp")
        .arg("-a")
        .arg(&src)
        .arg(m.dir.join("copy")));
    let now = descriptors_of(&mnt);
    assert!(now < 256, "{now} descriptors");
    use std::io::Write;
    f.write_all(b"still here\n").unwrap();
    drop(f);
    assert_eq!(std::fs::read(&held).unwrap(), b"still here\n");
    assert_eq!(std::fs::metadata(&held).unwrap().ino(), first);
    assert_diff_clean(&src, &m.dir.join("copy"));
    let linked = |p: &str| std::fs::metadata(m.dir.join("copy").join(p)).unwrap();
    assert_eq!(linked("d1/e1/f400").ino(), linked("d2/linked").ino());
    assert_eq!(linked("d2/linked").nlink(), 2);
    // Names the kernel was made to drop are found again: rename, remove, append.
    sh(&format!(
        "set -e; cd {}/copy; mv d1 moved; rm d3/e3/f2; echo more >> d4/e4/f3",
        m.dir.display()
    ));
    sh(&format!(
        "set -e; cd {}; mv d1 moved; rm d3/e3/f2; echo more >> d4/e4/f3",
        src.display()
    ));
    assert_diff_clean(&src, &m.dir.join("copy"));
    let now = descriptors_of(&mnt);
    assert!(now < 256, "{now} descriptors");
    // Read now (the copy only wrote them), one of them in the renamed directory.
    let read = ["copy/d4/e4/f3", "copy/moved/e1/f400"].map(|p| m.dir.join(p));
    assert_eq!(std::fs::read(&read[0]).unwrap(), b"file 3\nmore\n");
    assert_eq!(std::fs::read(&read[1]).unwrap(), b"file 400\n");
    run(verilay().arg("stats").arg(&mnt));
    let ascii = std::fs::read_to_string(list.join("ascii_runtime_measurements_sha256")).unwrap();
    for f in &read {
        let sum = String::from_utf8_lossy(&run(Command::new("sha256sum").arg(f)).stdout)
            .split(' ')
            .next()
            .unwrap()
            .to_string();
        let line = format!("sha256:{sum} {}", f.display());
        assert!(
            ascii.lines().any(|l| l.ends_with(&line)),
            "no entry ending {line:?}"
        );
    }
    drop(m);
    // All of it is in the upper directory.
    assert_diff_clean(&src, &d.upper.join("copy"));
}

#[test]
fn hardlinks_in_an_image_stay_together_when_copied_up() {
    // The FUSE engine: kernel overlayfs without index=on (the kernel engine) breaks hard
    // links apart on copy-up.
    let Some(t) = tempdir_unless(prerequisites()) else {
        return;
    };
    sh(&format!(
        "set -e; mkdir -p {0}/src/sub {0}/src/other; cd {0}/src; echo shared > a; ln a sub/b; ln a other/c; echo lone > d",
        t.path().display()
    ));
    let image = t.path().join("lower.img");
    build(&t.path().join("src"), &image, &["--quiet"]);
    let d = dirs(t.path(), "hl");
    let mnt = t.path().join("m");
    let check = |m: &Path| {
        for name in ["a", "sub/b", "other/c"] {
            assert_eq!(
                std::fs::read_to_string(m.join(name)).unwrap(),
                "shared\nmore\n",
                "{name}"
            );
        }
        let out = run(Command::new("stat")
            .args(["-c", "%i %h"])
            .args(["a", "sub/b", "other/c"])
            .current_dir(m));
        let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        assert!(lines.iter().all(|l| l == &lines[0]), "{lines:?}");
        assert!(lines[0].ends_with(" 3"), "{lines:?}");
    };
    {
        let m = verilay_mount_fuse(&image, &d, &mnt);
        sh(&format!("echo more >> {}/a", m.dir.display()));
        check(&m.dir);
        assert_eq!(std::fs::read_to_string(m.dir.join("d")).unwrap(), "lone\n");
    }
    // In the upper directory they are plain hardlinks, so they stay together after a remount.
    use std::os::unix::fs::MetadataExt;
    let ino = |p: &str| std::fs::metadata(d.upper.join(p)).unwrap().ino();
    assert_eq!(ino("a"), ino("sub/b"));
    assert_eq!(ino("a"), ino("other/c"));
    wait_daemon_gone(&mnt);
    let m = verilay_mount_fuse(&image, &d, &mnt);
    check(&m.dir);
}

/// The steps of `merged_directory_times_match_kernel_overlayfs`, each run in the merged root.
const DIR_TIME_STEPS: &[&str] = &[
    "stat d e >/dev/null",
    "ls d e >/dev/null",
    "echo more >> d/l",
    "echo more >> d/f",
    "echo more >> d/g",
    "mv d/h d/h2",
    "rm d/r",
    "echo n > d/new",
    "mv d/f e/f",
    "echo more >> e/k",
    "ls d e >/dev/null",
];

/// atime, mtime and ctime (seconds and nanoseconds) of `p`.
fn times(p: &Path) -> [(i64, i64); 3] {
    let m = std::fs::metadata(p).unwrap();
    [
        (m.atime(), m.atime_nsec()),
        (m.mtime(), m.mtime_nsec()),
        (m.ctime(), m.ctime_nsec()),
    ]
}

/// Runs `DIR_TIME_STEPS` in `merged`; after each step, checks that the merged directories
/// show exactly the times of their upper directories, and returns, per step and directory,
/// whether its mtime is still the image's (a copy-up keeps it; a change in it does not).
fn dir_times_through(merged: &Path, upper: &Path, image_mtime: (i64, i64)) -> Vec<String> {
    let mut kept = Vec::new();
    for step in DIR_TIME_STEPS {
        sh(&format!("cd {} && {step}", merged.display()));
        for dir in ["d", "e"] {
            let shown = times(&merged.join(dir));
            if upper.join(dir).exists() {
                assert_eq!(
                    shown,
                    times(&upper.join(dir)),
                    "after `{step}`, {dir}: merged (atime, mtime, ctime) differ from the upper \
                     directory's"
                );
            }
            kept.push(format!("{step}: {dir} {}", shown[1] == image_mtime));
        }
    }
    kept
}

#[test]
fn merged_directory_times_match_kernel_overlayfs() {
    let Some((t, src)) = prepared_src() else {
        return;
    };
    sh(&format!(
        "set -e; mkdir -p {0}/d {0}/e && cd {0} && for f in f g h r; do echo $f > d/$f; done
         echo k > e/k && echo l > d/l && ln d/l e/l && touch -d '2001-02-03 04:05:06.5' d e",
        src.display()
    ));
    let image = t.path().join("lower.img");
    build(&src, &image, &["--quiet"]);
    let lower = Mount::erofs(&image, &t.path().join("lower"));
    let image_mtime = times(&lower.dir.join("d"))[1];
    assert_eq!(image_mtime, times(&lower.dir.join("e"))[1]);

    let theirs = dirs(t.path(), "theirs");
    let k = overlay_mount(&lower.dir, &theirs, &t.path().join("k"));
    let kernel = dir_times_through(&k.dir, &theirs.upper, image_mtime);
    let ours = dirs(t.path(), "ours");
    let v = verilay_mount(&image, &ours, &t.path().join("v"));
    let verilay = dir_times_through(&v.dir, &ours.upper, image_mtime);
    assert_eq!(
        verilay, kernel,
        "which steps keep the directories' image mtime"
    );
    // Spot check that the comparison is about something: a copy-up keeps the time.
    assert!(
        kernel.contains(&"echo more >> d/f: d true".to_string()),
        "{kernel:?}"
    );
    assert!(
        kernel.contains(&"mv d/h d/h2: d false".to_string()),
        "{kernel:?}"
    );
}
