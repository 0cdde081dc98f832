//! Measurement through real mounts: which opens a policy measures (rule order, masks,
//! uid vs euid, the identity of the layer serving a file, exec vs open), that a file is
//! hashed once per content version (the daemon's counters), that `digest_type=verity`
//! reads no file data, and that the lists verilay writes pass `evmctl ima_measurement`
//! and `verilay log verify`.

mod common;

use common::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const UPPER_UUID: &str = "5b1c3b4e-8c57-4f0e-9d4a-3a9f0c6d2e71";

fn prerequisites() -> bool {
    skip_unless(is_root(), "needs root (mounts)")
        || skip_unless(Path::new("/dev/fuse").exists(), "needs /dev/fuse")
        || skip_unless(have("evmctl"), "needs evmctl (ima-evm-utils)")
        || skip_unless(have("mkfs.ext4"), "needs mkfs.ext4 (e2fsprogs)")
        || skip_unless(have("fsverity"), "needs fsverity")
}

fn sha256_hex(data: &[u8]) -> String {
    let out = Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(data)?;
            c.wait_with_output()
        })
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// An ext4 filesystem with a known uuid in a loop file, for the upper directory.
fn ext4_with_uuid(base: &Path) -> Mount {
    let img = base.join("upperfs.img");
    fs::File::create(&img).unwrap().set_len(64 << 20).unwrap();
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-U", UPPER_UUID])
        .arg(&img));
    let dir = base.join("upperfs");
    fs::create_dir_all(&dir).unwrap();
    run(Command::new("mount")
        .args(["-o", "loop"])
        .arg(&img)
        .arg(&dir));
    Mount { dir }
}

/// `verilay mount IMAGE [--upper U --work W] MNT --policy P --measure-log L`.
/// The FUSE engine, for what only it does.
const FUSE: [&str; 2] = ["--engine", "fuse"];

fn mount_measured(
    image: &Path,
    rw: Option<&Dirs>,
    mnt: &Path,
    policy: &Path,
    log: &Path,
    extra: &[&str],
) -> Unmount {
    fs::create_dir_all(mnt).unwrap();
    let mut cmd = verilay();
    cmd.arg("mount").arg(image);
    if let Some(d) = rw {
        cmd.arg("--upper").arg(&d.upper).arg("--work").arg(&d.work);
    }
    run(cmd
        .arg(mnt)
        .arg("--policy")
        .arg(policy)
        .arg("--measure-log")
        .arg(log)
        .args(extra));
    Unmount::fuse(mnt)
}

/// The list's entries after boot_aggregate: (pcr, template, digest field, path).
fn entries(log: &Path) -> Vec<(u32, String, String, String)> {
    let text = fs::read_to_string(log.join("ascii_runtime_measurements")).unwrap();
    let mut lines = text.lines();
    assert!(
        lines.next().unwrap().ends_with(" boot_aggregate"),
        "the list starts with boot_aggregate: {text}"
    );
    lines
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[0].parse().unwrap(),
                f[2].to_string(),
                f[3].to_string(),
                f[4].to_string(),
            )
        })
        .collect()
}

fn stats(mnt: &Path) -> serde_json::Value {
    let out = run(verilay().arg("stats").arg("--json").arg(mnt));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Waits (10 s at most) until counter `name` of the mount reaches `want`: a file is
/// hashed after its close is answered, and the kernel does not wait for that answer.
fn wait_counter(mnt: &Path, name: &str, want: u64) {
    let mut got = 0;
    wait_until(
        std::time::Duration::from_secs(10),
        &format!("counter {name} to reach {want}"),
        || {
            got = stats(mnt)[name].as_u64().unwrap();
            got >= want
        },
    );
    assert_eq!(got, want, "{name}");
}

fn log_verify(log: &Path) -> serde_json::Value {
    let out = run(verilay().args(["log", "verify", "--json"]).arg(log));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn sh_ok(script: &str) {
    let out = sh(script);
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A temporary directory holding `source_tree`'s tree and an image of it.
fn fixture() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let src = source_tree(t.path());
    let image = t.path().join("img");
    build(&src, &image, &["--quiet"]);
    (t, src, image)
}

fn source_tree(base: &Path) -> PathBuf {
    let src = base.join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("a"), "alpha\n").unwrap();
    fs::write(src.join("b"), "bravo\n").unwrap();
    fs::write(src.join("owned"), "owned by 1234\n").unwrap();
    std::os::unix::fs::chown(src.join("owned"), Some(1234), Some(1234)).unwrap();
    fs::copy("/bin/true", src.join("tool")).unwrap();
    fs::set_permissions(src.join("tool"), fs::Permissions::from_mode(0o755)).unwrap();
    let big: Vec<u8> = (0..(1u32 << 20) + 12345)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    fs::write(src.join("big"), big).unwrap();
    src
}

#[test]
fn the_policy_decides_by_rule_order_mask_ids_and_the_serving_layer() {
    if prerequisites() {
        return;
    }
    let (t, _, image) = fixture();
    let base = t.path();
    let upperfs = ext4_with_uuid(base);
    let d = dirs(&upperfs.dir, "m");
    let policy = base.join("policy");
    fs::write(
        &policy,
        format!(
            "# exemptions first: the first matching rule decides\n\
             dont_measure fowner=1234\n\
             measure func=BPRM_CHECK pcr=11\n\
             measure func=FILE_CHECK mask=MAY_READ fsmagic=0xe0f5e1e2 pcr=12\n\
             measure func=FILE_CHECK mask=^MAY_WRITE fsname=ext4 pcr=13\n\
             measure func=FILE_CHECK mask=^MAY_READ fsuuid={UPPER_UUID} euid=0 pcr=14\n\
             measure func=FILE_CHECK mask=^MAY_READ fsuuid={UPPER_UUID} uid=0 pcr=15\n"
        ),
    )
    .unwrap();
    let log = base.join("log");
    let mnt = base.join("mnt");
    // allow_other: a task with effective uid 65534 opens a file below.
    let _m = mount_measured(&image, Some(&d), &mnt, &policy, &log, &["--allow-other"]);
    let m = fs::canonicalize(&mnt).unwrap();
    let m = m.display();
    // An image file read: its layer is EROFS (rule 3, exact MAY_READ).
    sh_ok(&format!("cat {m}/a >/dev/null"));
    // Opened read-write: copied up, so now served by ext4 (rule 4: contains MAY_WRITE).
    sh_ok(&format!("python3 -c 'open(\"{m}/b\", \"r+\").close()'"));
    // Owned by 1234: exempt, whatever else matches later.
    sh_ok(&format!("cat {m}/owned >/dev/null"));
    // An exec: BPRM_CHECK (rule 2); its FILE_CHECK has mask MAY_EXEC, which no rule takes.
    // Reading the same file is an open: rule 3.
    sh_ok(&format!("{m}/tool && cat {m}/tool >/dev/null"));
    // Made in the upper layer: write-only (rule 4), then read by root (rule 5, euid 0).
    sh_ok(&format!("echo hello >{m}/new && cat {m}/new >/dev/null"));
    // Real uid 0, effective uid 65534 (and so no capabilities): rule 5 no, rule 6 yes.
    sh_ok(&format!(
        "python3 -c 'import os; os.setresuid(0, 65534, 0); open(\"{m}/new\").read()'"
    ));
    let tool = fs::read("/bin/true").unwrap();
    let want: Vec<(u32, String, String, String)> = [
        (12, "alpha\n".as_bytes(), "a"),
        (13, b"bravo\n", "b"),
        (11, &tool, "tool"),
        (12, &tool, "tool"),
        (13, b"", "new"),
        (14, b"hello\n", "new"),
        (15, b"hello\n", "new"),
    ]
    .iter()
    .map(|(pcr, data, name)| {
        (
            *pcr,
            "ima-ng".to_string(),
            format!("sha256:{}", sha256_hex(data)),
            format!("{m}/{name}"),
        )
    })
    .collect();
    // Asking for the counters also writes out entries still waiting to be written.
    stats(&mnt);
    assert_eq!(entries(&log), want);
    assert!(evmctl_accepts(&log), "evmctl rejects the list");
    let v = log_verify(&log);
    assert_eq!(v["entries"], want.len() + 1);
    // What each layer reported: the image its uuid (as inspect shows), the upper ext4's.
    let s = stats(&mnt);
    let sb: serde_json::Value =
        serde_json::from_slice(&run(verilay().arg("inspect").arg("--json").arg(&image)).stdout)
            .unwrap();
    assert_eq!(
        s["layers"],
        serde_json::json!([{"fsmagic": "0xe0f5e1e2", "fsname": "erofs", "fsuuid": sb["uuid"]}])
    );
    assert_eq!(
        s["upper"],
        serde_json::json!({"fsmagic": "0xef53", "fsname": "ext4", "fsuuid": UPPER_UUID})
    );
    assert_eq!(
        sb["measured_as"],
        format!(
            "fsmagic=0xe0f5e1e2 fsname=erofs fsuuid={}",
            sb["uuid"].as_str().unwrap()
        )
    );
}

#[test]
fn an_unchanged_file_is_hashed_once_and_a_changed_one_once_more() {
    if prerequisites() {
        return;
    }
    let (t, src, image) = fixture();
    let base = t.path();
    let d = dirs(base, "c");
    let policy = base.join("policy");
    fs::write(&policy, "measure func=FILE_CHECK mask=^MAY_READ\n").unwrap();
    let log = base.join("log");
    let mnt = base.join("mnt");
    let m = {
        let _m = mount_measured(&image, Some(&d), &mnt, &policy, &log, &[]);
        let m = fs::canonicalize(&mnt).unwrap().display().to_string();
        let counters = |k: &str| stats(&mnt)[k].as_u64().unwrap();
        // Written (not measured: write-only; too small to hash at its close), then read
        // four times: hashed once.
        sh_ok(&format!("echo one >{m}/f"));
        sh_ok(&format!("for i in 1 2 3 4; do cat {m}/f >/dev/null; done"));
        assert_eq!(counters("hashed"), 1);
        assert_eq!(counters("reused"), 3);
        assert_eq!(counters("logged"), 1);
        assert_eq!(counters("duplicates"), 3);
        // Appended to through the mount: hashed once more.
        sh_ok(&format!("echo two >>{m}/f"));
        sh_ok(&format!("cat {m}/f >/dev/null; cat {m}/f >/dev/null"));
        assert_eq!(counters("hashed"), 2);
        assert_eq!(counters("logged"), 2);
        // Truncated by path, without an open: hashed at the next measured open.
        sh_ok(&format!(
            "python3 -c 'import os; os.truncate(\"{m}/f\", 2)' && cat {m}/f >/dev/null"
        ));
        assert_eq!(counters("hashed"), 3);
        assert_eq!(counters("hashed_at_close"), 0);
        // An image file never changes: one hash however often it is opened.
        sh_ok(&format!("cat {m}/big {m}/big {m}/big >/dev/null"));
        assert_eq!(counters("hashed"), 4);
        assert_eq!(counters("bytes_hashed"), 4 + 8 + 2 + (1 << 20) + 12345);
        assert_eq!(counters("logged"), 4);
        m
    };
    let digests: Vec<String> = entries(&log).into_iter().map(|e| e.2).collect();
    assert_eq!(
        digests,
        [
            &b"one\n"[..],
            b"one\ntwo\n",
            b"on",
            &fs::read(src.join("big")).unwrap()
        ]
        .iter()
        .map(|d| format!("sha256:{}", sha256_hex(d)))
        .collect::<Vec<_>>()
    );
    // Unmounted cleanly: the list is complete. A new mount continues it.
    wait_daemon_gone(&mnt);
    assert_eq!(log_verify(&log)["entries"], 5);
    {
        let _m = mount_measured(&image, Some(&d), &mnt, &policy, &log, &[]);
        sh_ok(&format!("cat {m}/a >/dev/null"));
        assert_eq!(stats(&mnt)["entries"], 6);
    }
    wait_daemon_gone(&mnt);
    assert_eq!(log_verify(&log)["entries"], 6);
    assert!(evmctl_accepts(&log), "evmctl rejects the continued list");
}

/// Writes and reopens one file 300 times as fast as it can (every third time setting its
/// times in between, as rsync does), and prints the SHA-256 of each version it wrote
/// (each 9 to 10 KiB: hashed after its close).
const REWRITE_PY: &str = r#"
import hashlib, os, sys
p = os.path.join(sys.argv[1], "r")
for i in range(300):
    data = (f"version {i}\n" * (800 + i % 50)).encode()
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, data)
    os.close(fd)
    if i % 3 == 0:
        os.utime(p, (i, i))
    fd = os.open(p, os.O_RDONLY)
    assert os.read(fd, 1 << 20) == data, i
    os.close(fd)
    print(hashlib.sha256(data).hexdigest())
"#;

/// For the tests of upper files' digests: the image, a policy measuring reads, and 100 kB
/// of bytes, also in the file `small` of the temporary directory.
fn upper_hash_fixture() -> (tempfile::TempDir, PathBuf, PathBuf, Vec<u8>) {
    let (t, _src, image) = fixture();
    let policy = t.path().join("policy");
    fs::write(&policy, "measure func=FILE_CHECK mask=^MAY_READ\n").unwrap();
    let small: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    fs::write(t.path().join("small"), &small).unwrap();
    (t, image, policy, small)
}

/// Runs `REWRITE_PY` on the mount `m` (its script in `base`): the list `log` holds each
/// version's own digest for the file, in order.
fn rewrite_logs_every_version(base: &Path, m: &str, log: &Path) {
    let py = base.join("rewrite.py");
    fs::write(&py, REWRITE_PY).unwrap();
    let out = run(Command::new("python3").arg(&py).arg(m));
    let want: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|h| format!("sha256:{h}"))
        .collect();
    assert_eq!(want.len(), 300);
    // Asking for the counters writes out the entries still waiting.
    stats(Path::new(m));
    let got: Vec<String> = entries(log)
        .into_iter()
        .filter(|e| e.3 == format!("{m}/r"))
        .map(|e| e.2)
        .collect();
    assert_eq!(got, want, "{m}");
}

/// The FUSE engine's: a small upper file is hashed after its last writer closes it, so
/// the measured open that follows (a copy's reopen, after its times and mode are set)
/// finds the digest ready. A change behind the mount's back still makes the next open
/// hash again, big files wait for their open, and a file rewritten and reopened at full
/// speed never has an older version's digest logged.
#[test]
fn a_file_is_hashed_as_its_writer_closes_it_and_never_logged_stale() {
    if prerequisites() {
        return;
    }
    let (t, image, policy, small) = upper_hash_fixture();
    let base = t.path();
    let mut changed = small.clone();
    changed[5000] ^= 1;
    for threads in ["1", "2"] {
        let d = dirs(base, &format!("h{threads}"));
        let log = base.join(format!("log{threads}"));
        let mnt = base.join(format!("mnt{threads}"));
        let _m = mount_measured(
            &image,
            Some(&d),
            &mnt,
            &policy,
            &log,
            &["--threads", threads, FUSE[0], FUSE[1]],
        );
        let m = fs::canonicalize(&mnt).unwrap().display().to_string();
        let b = base.display();
        let counters = |k: &str| stats(&mnt)[k].as_u64().unwrap();
        // Copied in, times and mode set by path (no open, as rsync does), then read:
        // hashed once, after the close.
        sh_ok(&format!(
            "cp {b}/small {m}/s && python3 -c 'import os; os.utime(\"{m}/s\", (1, 1)); \
             os.chmod(\"{m}/s\", 0o600)'"
        ));
        wait_counter(&mnt, "hashed_at_close", 1);
        sh_ok(&format!("cat {m}/s >/dev/null"));
        assert_eq!(counters("hashed"), 1);
        assert_eq!(counters("hashed_at_close"), 1);
        assert_eq!(counters("reused"), 1);
        // One byte changed in the upper directory, size unchanged: hashed again at open.
        fs::write(d.upper.join("s"), &changed).unwrap();
        sh_ok(&format!("cat {m}/s >/dev/null"));
        assert_eq!(counters("hashed"), 2);
        assert_eq!(counters("hashed_at_close"), 1);
        // Bigger than 256 KiB, and smaller than 8 KiB: hashed at their open (an empty
        // file without reading).
        sh_ok(&format!(
            "cat {b}/small {b}/small {b}/small >{m}/big && cat {m}/big >/dev/null"
        ));
        sh_ok(&format!(
            "head -c 8191 {b}/small >{m}/t && cat {m}/t >/dev/null"
        ));
        sh_ok(&format!(": >{m}/e && cat {m}/e"));
        assert_eq!(counters("hashed"), 5);
        assert_eq!(counters("hashed_at_close"), 1);
        assert_eq!(counters("bytes_hashed"), 2 * 100_000 + 300_000 + 8191);
        let big = [&small[..], &small[..], &small[..]].concat();
        let want: Vec<String> = [&small[..], &changed[..], &big[..], &small[..8191], b""]
            .iter()
            .map(|d| format!("sha256:{}", sha256_hex(d)))
            .collect();
        let got: Vec<String> = entries(&log).into_iter().map(|e| e.2).collect();
        assert_eq!(got, want);
        // A mode changed by path after a reading open kept the digest: reused, not hashed.
        let reused = counters("reused");
        sh_ok(&format!(
            "python3 -c 'import os; os.chmod(\"{m}/t\", 0o600)' && cat {m}/t >/dev/null"
        ));
        assert_eq!(counters("hashed"), 5);
        assert_eq!(counters("reused"), reused + 1);
        // Rewritten and reopened at full speed: every version's own digest, in order.
        rewrite_logs_every_version(base, &m, &log);
        let hashed = counters("hashed");
        // One hash per version, or two when the reopen came before the writer's release
        // was handled (then the open hashes without keeping, and the close again).
        assert!(hashed <= 4 + 2 * 300, "{hashed} hashes for 300 versions");
        assert!(evmctl_accepts(&log), "evmctl rejects the list");
    }
}

/// The kernel engine's digests of upper files: kept while no writer has the file and its
/// change cookie holds, so a file read twice is hashed once; hashed again after a change
/// behind the mount's back that keeps the size; and a file rewritten and reopened at
/// full speed never has an older version's digest logged.
#[test]
fn the_kernel_engine_hashes_each_version_of_an_upper_file_and_logs_none_stale() {
    if prerequisites() {
        return;
    }
    let (t, image, policy, small) = upper_hash_fixture();
    let base = t.path();
    let d = dirs(base, "k");
    let (log, mnt) = (base.join("log"), base.join("mnt"));
    let kernel = ["--engine", "kernel"];
    let _m = mount_measured(&image, Some(&d), &mnt, &policy, &log, &kernel);
    let m = fs::canonicalize(&mnt).unwrap().display().to_string();
    let counters = |k: &str| stats(&mnt)[k].as_u64().unwrap();
    sh_ok(&format!(
        "cp {}/small {m}/s && cat {m}/s >/dev/null && cat {m}/s >/dev/null",
        base.display()
    ));
    assert_eq!((counters("hashed"), counters("reused")), (1, 1));
    let mut changed = small.clone();
    changed[5000] ^= 1;
    fs::write(d.upper.join("s"), &changed).unwrap();
    sh_ok(&format!("cat {m}/s >/dev/null"));
    assert_eq!(counters("hashed"), 2);
    rewrite_logs_every_version(base, &m, &log);
    assert!(evmctl_accepts(&log), "evmctl rejects the list");
}

/// An upper directory made elsewhere can hold a copied-up file whose ctime and mtime are
/// its image file's (debugfs sets a ctime), with other bytes of the same size: overlayfs
/// shows it with the image layer's device and nid, as if it were the image's. The kernel
/// engine still measures the bytes it serves (the upper directory holds the file).
#[test]
fn a_copied_up_file_forged_to_look_pristine_is_measured_by_its_bytes() {
    if prerequisites() || skip_unless(have("debugfs"), "needs debugfs (e2fsprogs)") {
        return;
    }
    let (t, _src, image) = fixture();
    let base = t.path();
    let upperfs = ext4_with_uuid(base);
    let d = dirs(&upperfs.dir, "f");
    let policy = base.join("policy");
    fs::write(&policy, "measure func=FILE_CHECK\n").unwrap();
    let (log, mnt) = (base.join("log"), base.join("mnt"));
    let kernel = ["--engine", "kernel"];
    // Copied up by a chmod: the upper file names its origin, the image's /a.
    let m = mount_measured(&image, Some(&d), &mnt, &policy, &log, &kernel);
    sh_ok(&format!("chmod 600 {}/a", mnt.display()));
    // Not lazily: the daemon holds the upper filesystem until it exits.
    m.now();
    let shown: serde_json::Value = serde_json::from_slice(
        &run(verilay().args(["inspect", "--json"]).arg(&image).arg("/a")).stdout,
    )
    .unwrap();
    let (sec, nsec) = (
        shown["mtime"].as_i64().unwrap(),
        shown["mtime_nsec"].as_i64().unwrap(),
    );
    let forged = b"EVIL!\n";
    assert_eq!(forged.len(), b"alpha\n".len());
    fs::write(d.upper.join("a"), forged).unwrap();
    run(Command::new("touch")
        .arg("-d")
        .arg(format!("@{sec}.{nsec:09}"))
        .arg(d.upper.join("a")));
    // The ctime, on the unmounted filesystem (ext4's extra field: nanoseconds << 2).
    run(Command::new("umount").arg(&upperfs.dir));
    let img = base.join("upperfs.img");
    for (field, value) in [
        ("ctime", format!("@{sec}")),
        ("ctime_extra", (nsec << 2).to_string()),
    ] {
        run(Command::new("debugfs")
            .arg("-w")
            .arg("-R")
            .arg(format!("set_inode_field /f-upper/a {field} {value}"))
            .arg(&img));
    }
    run(Command::new("mount")
        .args(["-o", "loop"])
        .arg(&img)
        .arg(&upperfs.dir));

    let _m = mount_measured(&image, Some(&d), &mnt, &policy, &log, &kernel);
    let st = fs::metadata(mnt.join("a")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        (
            st.ctime(),
            st.ctime_nsec(),
            st.mtime(),
            st.mtime_nsec(),
            st.ino()
        ),
        (sec, nsec, sec, nsec, shown["nid"].as_u64().unwrap()),
        "the forgery does not look pristine"
    );
    assert_eq!(fs::read(mnt.join("a")).unwrap(), forged);
    stats(&mnt);
    let got: Vec<String> = entries(&log)
        .into_iter()
        .filter(|e| e.3.ends_with("/mnt/a"))
        .map(|e| e.2)
        .collect();
    assert_eq!(got, [format!("sha256:{}", sha256_hex(forged))]);
}

#[test]
fn verity_digests_are_measured_without_reading_file_data() {
    if prerequisites() {
        return;
    }
    let (t, src, image) = fixture();
    let base = t.path();
    let policy = base.join("policy");
    fs::write(&policy, "measure func=FILE_CHECK digest_type=verity\n").unwrap();
    let log = base.join("log");
    let mnt = base.join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    // Mounted the way mount(8) does it: the helper name, and -o options.
    let helper = base.join("mount.fuse.verilay");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_verilay"), &helper).unwrap();
    run(Command::new(&helper)
        .arg(&image)
        .arg(&mnt)
        .arg("-o")
        .arg(format!(
            "ro,policy={},measure_log={}",
            policy.display(),
            log.display()
        )));
    let _m = Unmount::fuse(&mnt);
    let m = fs::canonicalize(&mnt).unwrap().display().to_string();
    // Opened, not read: the measurement itself must not read the file.
    sh_ok(&format!("exec 3<{m}/big; exec 3<&-"));
    // Written out by the mount on its own, without `verilay stats` asking.
    wait_until(
        std::time::Duration::from_secs(2),
        "the entry in the list's files",
        || {
            fs::read_to_string(log.join("ascii_runtime_measurements"))
                .unwrap()
                .lines()
                .count()
                >= 2
        },
    );
    let s = stats(&mnt);
    assert_eq!(s["verity_digests"], 1);
    assert_eq!(s["hashed"], 0);
    assert_eq!(s["bytes_hashed"], 0);
    let out = run(Command::new("fsverity").arg("digest").arg(src.join("big")));
    let fsverity = String::from_utf8_lossy(&out.stdout);
    let want = fsverity.split_whitespace().next().unwrap().to_string();
    assert_eq!(
        entries(&log),
        vec![(
            10,
            "ima-ngv2".to_string(),
            format!("verity:{want}"),
            format!("{m}/big")
        )]
    );
    assert!(evmctl_accepts(&log), "evmctl rejects an ima-ngv2 list");
}

#[test]
fn a_bad_policy_or_a_tampered_list_stops_the_mount() {
    if prerequisites() {
        return;
    }
    let (t, _, image) = fixture();
    let base = t.path();
    let mnt = base.join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    let policy = base.join("policy");
    let log = base.join("log");
    let mount = || {
        measured_mount(&image, &mnt, &policy, &log)
            .output()
            .unwrap()
    };
    fs::write(
        &policy,
        "dont_measure fsmagic=0x9fa0\nmeasure func=MMAP_CHECK\n",
    )
    .unwrap();
    let out = mount();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "policy {}: line 2: `func=MMAP_CHECK`",
            policy.display()
        )),
        "{err}"
    );
    assert!(!is_mounted(&mnt));
    // A list whose PCR values do not match it is not continued.
    fs::write(&policy, "measure func=FILE_CHECK\n").unwrap();
    {
        let _m = mount_measured(&image, None, &mnt, &policy, &log, &[]);
        sh_ok(&format!("cat {}/a >/dev/null", mnt.display()));
    }
    wait_daemon_gone(&mnt);
    let pcrs = log.join("pcrs_sha256");
    let text = fs::read_to_string(&pcrs).unwrap();
    let tampered: Vec<String> = text
        .lines()
        .map(|l| match l.strip_prefix("PCR-10: ") {
            Some(h) => format!(
                "PCR-10: {}{}",
                if h.starts_with('0') { '1' } else { '0' },
                &h[1..]
            ),
            None => l.to_string(),
        })
        .collect();
    fs::write(&pcrs, tampered.join("\n") + "\n").unwrap();
    let out = mount();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("measurement list"), "{err}");
    assert!(!is_mounted(&mnt));
}

fn is_mounted(p: &Path) -> bool {
    let canon = fs::canonicalize(p).unwrap();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(canon.to_str().unwrap()))
}

/// Files of `sizes` bytes named `f<size>`, each with its own pattern.
fn sized_files(dir: &Path, sizes: &[usize]) -> Vec<(PathBuf, Vec<u8>)> {
    fs::create_dir_all(dir).unwrap();
    sizes
        .iter()
        .map(|&n| {
            // An LCG: no repeats, so a window of the bytes is found once in the image.
            let mut x = n as u64 | 1;
            let data: Vec<u8> = (0..n)
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (x >> 56) as u8
                })
                .collect();
            let p = dir.join(format!("f{n}"));
            fs::write(&p, &data).unwrap();
            (p, data)
        })
        .collect()
}

/// `sized_files` in BASE/src, an image of them in BASE/img and a policy measuring every
/// open by stored fs-verity digest in BASE/policy: (files, image, policy).
fn verity_fixture(base: &Path, sizes: &[usize]) -> (Vec<(PathBuf, Vec<u8>)>, PathBuf, PathBuf) {
    let files = sized_files(&base.join("src"), sizes);
    let image = base.join("img");
    build(&base.join("src"), &image, &["--quiet"]);
    let policy = base.join("policy");
    fs::write(&policy, "measure func=FILE_CHECK digest_type=verity\n").unwrap();
    (files, image, policy)
}

/// Maps `path` a page further than its size: the bytes past the end must be zeros.
#[allow(unsafe_code)] // mmap, a syscall
fn mapped_past_the_end(path: &Path) -> Vec<u8> {
    let f = fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as usize;
    let pages = len.div_ceil(4096) * 4096;
    // SAFETY: a private read-only map of a file on a read-only mount; nothing changes it,
    // and only the last partial page is read past the end (no SIGBUS there).
    let map = unsafe { memmap2::MmapOptions::new().len(pages).map(&f).unwrap() };
    map[..pages].to_vec()
}

/// Held by the tests that drop the kernel's caches, which run in parallel otherwise: one
/// test's drop would make another's warm reads cold.
static DROPS_CACHES: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_measured_open_hands_small_files_to_the_page_cache_verified() {
    if prerequisites() {
        return;
    }
    let _drops = DROPS_CACHES.lock().unwrap_or_else(|p| p.into_inner());
    let t = tempfile::tempdir().unwrap();
    let base = t.path();
    let sizes = [1, 4095, 4096, 5000, 128 << 10, (128 << 10) + 1];
    let (files, image, policy) = verity_fixture(base, &sizes);
    let mnt = base.join("mnt");
    // The FUSE engine's own work (small files handed to the page cache at OPEN): the
    // kernel engine has no OPEN to do it at.
    let _m = mount_measured(&image, None, &mnt, &policy, &base.join("log"), &FUSE);
    let small: Vec<usize> = sizes.into_iter().filter(|&n| n <= 128 << 10).collect();
    let read_all = || {
        for (p, want) in &files {
            let at = mnt.join(p.file_name().unwrap());
            assert!(
                fs::read(&at).unwrap() == *want,
                "{} reads back wrong",
                at.display()
            );
            let mapped = mapped_past_the_end(&at);
            assert!(
                mapped[..want.len()] == want[..],
                "{} maps wrong",
                at.display()
            );
            assert!(
                mapped[want.len()..].iter().all(|&b| b == 0),
                "{}: the page past the end is not zeros",
                at.display()
            );
        }
    };

    sh_ok("sync; echo 3 > /proc/sys/vm/drop_caches");
    read_all();
    let s = stats(&mnt);
    // Every small file's first open hands its bytes over, on both transports.
    let each = small.len();
    assert_eq!(s["primed"], each, "{s}");
    let bytes: usize = small.iter().sum();
    assert_eq!(s["bytes_primed"], bytes, "{s}");

    // The kernel keeps the inodes and their pages: nothing is handed over again.
    read_all();
    assert_eq!(stats(&mnt)["primed"], each);

    // Dropped and looked up again: handed over once more.
    sh_ok("sync; echo 3 > /proc/sys/vm/drop_caches");
    read_all();
    assert_eq!(stats(&mnt)["primed"], 2 * each);
}

#[test]
fn a_tampered_small_file_is_never_handed_over() {
    if prerequisites() {
        return;
    }
    let _drops = DROPS_CACHES.lock().unwrap_or_else(|p| p.into_inner());
    let t = tempfile::tempdir().unwrap();
    let base = t.path();
    let (files, image, policy) = verity_fixture(base, &[6000]);
    let mut bytes = fs::read(&image).unwrap();
    let at = bytes
        .windows(64)
        .position(|w| w == &files[0].1[..64])
        .expect("the file's bytes in the image");
    bytes[at + 10] ^= 0x40;
    fs::write(&image, &bytes).unwrap();
    let mnt = base.join("mnt");
    let _m = mount_measured(&image, None, &mnt, &policy, &base.join("log"), &[]);
    sh_ok("sync; echo 3 > /proc/sys/vm/drop_caches");
    let err = fs::read(mnt.join("f6000")).expect_err("a tampered file read back");
    assert_eq!(err.raw_os_error(), Some(EIO), "{err}");
    assert_eq!(stats(&mnt)["primed"], 0);
}

const EIO: i32 = 5;

/// `race.py SRC MNT WHO`: opens, drops the file's pages (fadvise), reads (WHO 0 maps)
/// and compares, over and over.
const RACE_PY: &str = r#"
import mmap, os, sys
src, mnt, who = sys.argv[1], sys.argv[2], int(sys.argv[3])
names = ["f100", "f4096", "f9000", "f70000", "f131072"]
want = {n: open(os.path.join(src, n), "rb").read() for n in names}
for i in range(400):
    n = names[(i + who) % len(names)]
    fd = os.open(os.path.join(mnt, n), os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    if who == 0:
        got = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)[:]
    else:
        got = os.pread(fd, 1 << 20, 0)
    os.close(fd)
    if got != want[n]:
        sys.exit(f"{n}: wrong bytes at round {i}")
"#;

/// Storing into the page cache takes the inode's page locks; readers (read and mmap),
/// opens and evictions of the same files at once, on one worker and on the default
/// number, must neither hang nor read anything but the files' bytes.
#[test]
fn handing_files_over_races_nothing_into_a_hang_or_wrong_bytes() {
    let Some(t) = tempdir_unless(prerequisites()) else {
        return;
    };
    let base = t.path();
    let (_, image, policy) = verity_fixture(base, &[100, 4096, 9000, 70000, 131072]);
    for threads in ["1", "2"] {
        let mnt = base.join(format!("mnt{threads}"));
        let log = base.join(format!("log{threads}"));
        // The FUSE engine's stores (see a_measured_open_hands_small_files_…).
        let _m = mount_measured(
            &image,
            None,
            &mnt,
            &policy,
            &log,
            &["--engine", "fuse", "--threads", threads],
        );
        let src = base.join("src").display().to_string();
        let m = mnt.display().to_string();
        // Five processes at once (see RACE_PY); every open can be a first one again.
        let py = base.join("race.py");
        fs::write(&py, RACE_PY).unwrap();
        let all = format!(
            "pids=''; for k in 0 1 2 3 4; do python3 {} {src} {m} $k & pids=\"$pids $!\"; done; \
             for p in $pids; do wait $p || exit 1; done",
            py.display()
        );
        let mut sh = Command::new("sh");
        sh.arg("-c").arg(&all);
        racers_end(
            sh,
            &mnt,
            &base.join("race.err"),
            &format!("--threads {threads}"),
        );
        let s = stats(&mnt);
        assert!(s["primed"].as_u64().unwrap() > 0, "{s}");
    }
}

/// `cross.py MNT`: four openers on CPU 0 and four readers that open each file on CPU 1
/// and read it on CPU 0, all through the same files at once.
const CROSS_PY: &str = r#"
import os, sys, multiprocessing as mp
mnt = sys.argv[1]
names = sorted(os.listdir(mnt))
def opener(k, go):
    os.sched_setaffinity(0, {0})
    go.wait()
    for n in names[k::4]:
        os.close(os.open(os.path.join(mnt, n), os.O_RDONLY))
def reader(k, go):
    go.wait()
    for n in names[k::4]:
        os.sched_setaffinity(0, {1})
        fd = os.open(os.path.join(mnt, n), os.O_RDONLY)
        os.sched_setaffinity(0, {0})
        os.read(fd, 4096)
        os.close(fd)
go = mp.Event()
ps = [mp.Process(target=f, args=(k, go)) for f in (opener, reader) for k in range(4)]
for p in ps: p.start()
go.set()
for p in ps:
    p.join()
    if p.exitcode: sys.exit(f"a process failed: {p.exitcode}")
"#;

/// Over io_uring a READ is served by the queue of the CPU it was sent from. A reader that
/// opens on one CPU while another opener's store is under way there, then reads on the
/// other CPU, sends that READ to a queue whose threads may all be storing into pages it
/// holds: the transport must not let stores take a whole queue (this hung in the first
/// of 20 rounds when every thread could store).
#[test]
fn a_reader_moving_between_cpus_cannot_hang_the_stores_of_measured_opens() {
    if prerequisites()
        || skip_unless(
            std::thread::available_parallelism().map_or(0, |n| n.get()) >= 2,
            "needs two CPUs (the reader moves between them)",
        )
    {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let base = t.path();
    let sizes: Vec<usize> = (0..300).map(|i| 100_000 + i).collect();
    let (_, image, policy) = verity_fixture(base, &sizes);
    let py = base.join("cross.py");
    fs::write(&py, CROSS_PY).unwrap();
    let mut primed = 0;
    for round in 0..5 {
        // A fresh mount: every open of a file is a first one again.
        let mnt = base.join(format!("mnt{round}"));
        // The FUSE engine's stores (see a_measured_open_hands_small_files_…).
        let _m = mount_measured(&image, None, &mnt, &policy, &base.join("log"), &FUSE);
        let mut py3 = Command::new("python3");
        py3.arg(&py).arg(&mnt);
        racers_end(
            py3,
            &mnt,
            &base.join("cross.err"),
            &format!("round {round}"),
        );
        primed += stats(&mnt)["primed"].as_u64().unwrap();
    }
    // Stores still happen, only fewer at once.
    assert!(primed > 0);
}

/// Runs `cmd` (processes racing on `mnt`, their errors to `err`) and asserts that it ends
/// within a minute and succeeds; `what` names the case in the failure.
fn racers_end(mut cmd: Command, mnt: &Path, err: &Path, what: &str) {
    let mut child = cmd
        .stdout(std::process::Stdio::null())
        .stderr(fs::File::create(err).unwrap())
        .spawn()
        .unwrap();
    let mut status = None;
    if !poll_until(std::time::Duration::from_secs(60), || {
        status = child.try_wait().unwrap();
        status.is_some()
    }) {
        // Stuck workers never come back: abort the connection, which fails every
        // waiting request, so the racers (and this test) can end.
        abort_fuse_connection(mnt);
        let _ = child.wait();
        panic!("{what}: the racers hung (connection aborted)");
    }
    let status = status.unwrap();
    assert!(
        status.success(),
        "{what}: {status}\n{}",
        fs::read_to_string(err).unwrap_or_default()
    );
}

/// Aborts the FUSE connection behind mountpoint `mnt` (fusectl, mounted if need be).
fn abort_fuse_connection(mnt: &Path) {
    // From mountinfo: a stat of the mountpoint could wait on the stuck daemon itself.
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mnt = mnt.display().to_string();
    let Some(minor) = info.lines().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.get(4) == Some(&mnt.as_str())).then(|| f[2].split(':').nth(1).unwrap().to_string())
    }) else {
        return;
    };
    let ctl = Path::new("/sys/fs/fuse/connections");
    if fs::read_dir(ctl)
        .map(|mut d| d.next().is_none())
        .unwrap_or(true)
    {
        let _ = Command::new("mount")
            .args(["-t", "fusectl", "none"])
            .arg(ctl)
            .status();
    }
    let _ = fs::write(ctl.join(minor).join("abort"), "1");
}
