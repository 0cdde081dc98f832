//! Measurement: durability of entries, bounded inputs, list permissions (items 9, 11, 13).
//!
//! Item 9: a measured open is answered before its entry is written, so a daemon killed
//! then loses entries; the next mount must mark the gap as the kernel marks a violation
//! (and `log verify` must say so of the killed list itself). Item 11: a policy or a list
//! is read within bounds, whatever it is (a device, a FIFO, a huge file, hostile
//! lengths). Item 13: what a measured mount writes is its owner's alone.

use crate::common::*;
use crate::Seed;
use measure::log::{
    DigestKind, Event, HashAlgo, Log, ASCII_SHA1, ASCII_SHA256, BINARY_SHA1, BINARY_SHA256, COUNT,
    IN_USE, LIST_FILES, PCRS_SHA1, PCRS_SHA256,
};
use measure::policy::Template;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Peak RSS allowed to a command refusing a hostile input: the CLI itself needs ~10 MiB.
const RSS_BOUND_KIB: u64 = 64 << 10;

fn mounts() -> bool {
    skip_unless(is_root(), "needs root (mounts)")
        || skip_unless(Path::new("/dev/fuse").exists(), "needs /dev/fuse")
}

/// A temporary directory with an image of five small files and a policy measuring every
/// open (PCR 10).
fn fixture() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(&src).unwrap();
    for name in ["a", "b", "c", "d", "e"] {
        fs::write(src.join(name), format!("file {name}\n")).unwrap();
    }
    let image = t.path().join("img");
    build(&src, &image, &["--quiet"]);
    let policy = t.path().join("policy");
    fs::write(&policy, "measure func=FILE_CHECK\n").unwrap();
    (t, image, policy)
}

/// `verilay mount IMAGE MNT --policy P --measure-log LOG EXTRA...`, as it ended.
fn mount(image: &Path, mnt: &Path, policy: &Path, log: &Path, extra: &[&Path]) -> Output {
    fs::create_dir_all(mnt).unwrap();
    measured_mount(image, mnt, policy, log)
        .args(extra)
        .output()
        .unwrap()
}

fn mount_ok(image: &Path, mnt: &Path, policy: &Path, log: &Path, extra: &[&Path]) -> Unmount {
    let out = mount(image, mnt, policy, log, extra);
    assert!(
        out.status.success(),
        "mount failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Unmount::fuse(mnt)
}

/// The pid of the daemon serving `mnt` (its argv holds the mountpoint and --ready-fd).
fn daemon_of(mnt: &Path) -> u32 {
    let want = mnt.as_os_str().as_encoded_bytes();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(argv) = fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = argv.split(|&b| b == 0).collect();
        if args.contains(&want) && args.contains(&&b"--ready-fd"[..]) {
            return pid;
        }
    }
    panic!("no daemon serves {}", mnt.display());
}

/// Waits (20 s at most) until process `pid` is gone.
fn wait_gone(pid: u32) {
    let start = Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists() {
        // A zombie's status says so; the daemon's parent (verilay mount) reaped it long ago.
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "process {pid} did not exit"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Kills the daemon of `mnt` with SIGKILL, as an OOM kill or a crash would end it, and
/// detaches the dead mount. Returns its pid.
fn kill_daemon(mnt: Unmount) -> u32 {
    let pid = daemon_of(&mnt.dir);
    run(Command::new("kill").args(["-9", &pid.to_string()]));
    wait_gone(pid);
    drop(mnt);
    pid
}

/// Unmounts and waits for the daemon to have closed its list and exited.
fn unmount(mnt: Unmount) {
    let pid = daemon_of(&mnt.dir);
    run(verilay().arg("umount").arg(&mnt.dir));
    std::mem::forget(mnt);
    wait_gone(pid);
}

fn read_through(mnt: &Path, names: &[&str]) {
    for n in names {
        let got = fs::read(mnt.join(n)).unwrap();
        assert_eq!(got, format!("file {n}\n").as_bytes());
    }
}

fn log_verify(log: &Path, args: &[&str]) -> Output {
    verilay()
        .args(["log", "verify"])
        .args(args)
        .arg(log)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn evmctl_accepts(log: &Path, ignore_violations: bool) -> bool {
    let mut cmd = Command::new("evmctl");
    cmd.arg("ima_measurement");
    if ignore_violations {
        cmd.arg("--ignore-violations");
    }
    cmd.arg("--pcrs")
        .arg(format!("sha1,{}", log.join(PCRS_SHA1).display()))
        .arg("--pcrs")
        .arg(format!("sha256,{}", log.join(PCRS_SHA256).display()))
        .arg(log.join(BINARY_SHA1))
        .output()
        .unwrap()
        .status
        .success()
}

fn ascii_lines(log: &Path) -> Vec<String> {
    fs::read_to_string(log.join(ASCII_SHA1))
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The ascii line of verilay's violation entry, as the kernel prints a violation.
fn violation_line() -> String {
    format!(
        "10 {} ima-ng sha256:{} verilay:unclean-shutdown",
        "0".repeat(40),
        "0".repeat(64)
    )
}

#[test]
fn a_killed_daemons_gap_is_recorded_as_a_violation_that_verifiers_see() {
    if mounts() || skip_unless(have("evmctl"), "needs evmctl (ima-evm-utils)") {
        return;
    }
    let (t, image, policy) = fixture();
    let (mnt, log) = (t.path().join("mnt"), t.path().join("log"));
    let m = mount_ok(&image, &mnt, &policy, &log, &[]);
    // Answered opens, whose entries wait up to 10 ms to be written: the kill loses them.
    read_through(&mnt, &["a", "b", "c"]);
    let pid = kill_daemon(m);

    // The list as the kill left it: `log verify` must not pass it as a clean list.
    let out = log_verify(&log, &[]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let holder = format!("pid {pid}, mount on {}", mnt.display());
    assert!(
        err.contains(&format!("not closed cleanly ({holder})")),
        "{err}"
    );
    let kept = ascii_lines(&log).len();
    if out.stdout.starts_with(b"verified") {
        // The kill did not tear a batch (the common case): the list verifies as it is.
        assert!(
            err.contains(&format!("events after entry {kept} may be missing")),
            "{err}"
        );
        let json: serde_json::Value =
            serde_json::from_slice(&log_verify(&log, &["--json"]).stdout).unwrap();
        assert_eq!(json["state"], "unclean");
        assert_eq!(json["holder"], holder.as_str());
    }

    // The next mount records the gap before anything else, then measures as usual.
    let m = mount_ok(&image, &mnt, &policy, &log, &[]);
    read_through(&mnt, &["d"]);
    unmount(m);
    let lines = ascii_lines(&log);
    let at = lines
        .iter()
        .position(|l| *l == violation_line())
        .unwrap_or_else(|| panic!("no violation entry in the list:\n{}", lines.join("\n")));
    assert!(
        at <= kept,
        "the violation is not right after the kept entries"
    );
    assert_eq!(lines.len(), at + 2, "{lines:?}");
    assert!(lines[at + 1].ends_with(&format!(" {}/d", mnt.display())));
    let entry = at + 1;

    // log verify reports it, and fails unless told to accept violations (as evmctl).
    let out = log_verify(&log, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stdout).contains(&format!(
            "; 1 violation(s): entry {entry} on PCR 10 (verilay:unclean-shutdown)"
        )),
        "{}",
        text(&out.stdout)
    );
    assert!(text(&out.stderr).contains("holds 1 violation(s)"));
    let out = log_verify(&log, &["--ignore-violations", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["state"], "closed");
    assert_eq!(
        json["violations"],
        serde_json::json!([{"entry": entry, "pcr": 10, "name": "verilay:unclean-shutdown"}])
    );
    // evmctl, the independent oracle: the PCR was extended with 0xff bytes, which it
    // replays only when told to ignore violations (a violation invalidates the PCR).
    assert!(!evmctl_accepts(&log, false), "evmctl missed the violation");
    assert!(evmctl_accepts(&log, true), "evmctl rejects the list");
}

#[test]
fn a_second_mount_on_the_same_list_is_refused_naming_the_holder() {
    if mounts() {
        return;
    }
    let (t, image, policy) = fixture();
    let (mnt, mnt2, log) = (
        t.path().join("mnt"),
        t.path().join("mnt2"),
        t.path().join("log"),
    );
    let m = mount_ok(&image, &mnt, &policy, &log, &[]);
    let pid = daemon_of(&mnt);
    let out = mount(&image, &mnt2, &policy, &log, &[]);
    let _m2 = Unmount::fuse(&mnt2);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "a second mount shares the list");
    assert_eq!(
        err,
        format!(
            "verilay: error: measurement list {}: the measurement list in {} is in use by another writer (pid {pid}, mount on {}); two mounts cannot share a list\n",
            log.display(),
            log.display(),
            mnt.display()
        )
    );
    // The first mount keeps measuring into a list that verifies.
    read_through(&mnt, &["a"]);
    unmount(m);
    let out = log_verify(&log, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// (start of template data, its length) of the last record of a binary list.
fn last_record_data(list: &[u8], digest_len: usize) -> (usize, usize) {
    let mut at = 0;
    let mut last = (0, 0);
    while at < list.len() {
        let u32_at = |o: usize| u32::from_le_bytes(list[o..o + 4].try_into().unwrap()) as usize;
        let name_len = u32_at(at + 4 + digest_len);
        let len_at = at + 4 + digest_len + 4 + name_len;
        let data_len = u32_at(len_at);
        last = (len_at + 4, data_len);
        at = len_at + 4 + data_len;
    }
    last
}

#[test]
fn a_list_torn_by_a_kill_is_cut_back_and_marked_a_damaged_one_is_refused() {
    if mounts() || skip_unless(have("evmctl"), "needs evmctl (ima-evm-utils)") {
        return;
    }
    let (t, image, policy) = fixture();
    let (mnt, log) = (t.path().join("mnt"), t.path().join("log"));
    let m = mount_ok(&image, &mnt, &policy, &log, &[]);
    read_through(&mnt, &["a", "b"]);
    // Flushed (stats drains the list): the count and PCR files as they stand after "b".
    run(verilay().arg("stats").arg(&mnt));
    let state: Vec<(PathBuf, Vec<u8>)> = [COUNT, PCRS_SHA1, PCRS_SHA256]
        .iter()
        .map(|n| (log.join(n), fs::read(log.join(n)).unwrap()))
        .collect();
    read_through(&mnt, &["c"]);
    run(verilay().arg("stats").arg(&mnt));
    kill_daemon(m);
    let bin = log.join(BINARY_SHA1);
    let whole = fs::read(&bin).unwrap();
    let entries = ascii_lines(&log).len();
    // The PCR files attest "c", so cutting its record is damage, not a tear: refused,
    // naming what would be dropped.
    fs::write(&bin, &whole[..whole.len() - 7]).unwrap();
    let out = mount(&image, &mnt, &policy, &log, &[]);
    drop(Unmount::fuse(&mnt));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let (data_at, data_len) = last_record_data(&whole, 20);
    let truncated = format!(
        "{BINARY_SHA1}: offset {data_at} (entry {entries}): truncated record: the template data needs {data_len} bytes, the file ends after {}",
        data_len - 7
    );
    assert!(
        err.contains(&format!(
            "{PCRS_SHA1}: matches the replay after none of the {} entries the list files agree on, so the list cannot be recovered to them (past them: {truncated})",
            entries - 1
        )),
        "{err}"
    );
    // Killed as it wrote "c"'s batch: its SHA-1 record cut short, the count and PCR
    // files not yet rewritten (the flusher writes them after the list files).
    for (p, bytes) in &state {
        fs::write(p, bytes).unwrap();
    }
    let out = log_verify(&log, &[]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        err.contains(&truncated) && err.contains("not closed cleanly"),
        "{err}"
    );
    // The next mount keeps the entries all files agree on and marks the gap after them.
    let m = mount_ok(&image, &mnt, &policy, &log, &[]);
    read_through(&mnt, &["e"]);
    unmount(m);
    let lines = ascii_lines(&log);
    assert_eq!(lines[entries - 1], violation_line(), "{lines:?}");
    assert_eq!(lines.len(), entries + 1);
    assert!(lines[entries].ends_with(&format!(" {}/e", mnt.display())));
    assert!(log_verify(&log, &["--ignore-violations"]).status.success());
    assert!(evmctl_accepts(&log, true));

    // The same cut in a list its mount closed cleanly is refused, naming file and offset.
    let list = fs::read(&bin).unwrap();
    let (data_at, data_len) = last_record_data(&list, 20);
    fs::write(&bin, &list[..list.len() - 7]).unwrap();
    let out = mount(&image, &mnt, &policy, &log, &[]);
    let _m = Unmount::fuse(&mnt);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        format!(
            "verilay: error: measurement list {dir}: not continuing the measurement list in {dir}: {BINARY_SHA1}: offset {data_at} (entry {}): truncated record: the template data needs {data_len} bytes, the file ends after {}\n",
            entries + 1,
            data_len - 7,
            dir = log.display()
        )
    );
}

/// Runs `cmd` under GNU time in its own process group, killing the group after
/// `deadline`: (output, peak RSS in KiB, whether it had to be killed).
fn bounded(cmd: &mut Command, deadline: Duration) -> (Output, u64, bool) {
    let rss = tempfile::NamedTempFile::new().unwrap();
    let program = cmd.get_program().to_owned();
    let args: Vec<_> = cmd.get_args().map(ToOwned::to_owned).collect();
    let child = Command::new("/usr/bin/time")
        .arg("-f")
        .arg("%M")
        .arg("-o")
        .arg(rss.path())
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let pgid = child.id();
    let start = Instant::now();
    let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
    let mut killed = false;
    while !waiter.is_finished() {
        if start.elapsed() > deadline {
            let _ = Command::new("kill")
                .args(["-9", "--", &format!("-{pgid}")])
                .status();
            killed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = waiter.join().unwrap();
    let kib = fs::read_to_string(rss.path())
        .unwrap_or_default()
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(u64::MAX);
    (out, kib, killed)
}

/// `cmd` must fail at once with exactly `want` as its one line, in bounded memory.
fn refused_fast(cmd: &mut Command, want: &str) {
    let (out, kib, killed) = bounded(cmd, Duration::from_secs(20));
    assert!(
        !killed,
        "still running after 20 s (peak RSS {kib} KiB): {want}"
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err, format!("{want}\n"));
    assert!(kib < RSS_BOUND_KIB, "peak RSS {kib} KiB refusing: {want}");
}

fn have_time() -> bool {
    skip_unless(
        Path::new("/usr/bin/time").exists(),
        "needs GNU time (/usr/bin/time) to measure peak RSS",
    )
}

#[test]
fn hostile_policies_fail_fast_with_one_line_in_bounded_memory() {
    if have_time() {
        return;
    }
    let (t, image, _) = fixture();
    let (mnt, log) = (t.path().join("mnt"), t.path().join("log"));
    fs::create_dir_all(&mnt).unwrap();
    let fifo = t.path().join("fifo");
    run(Command::new("mkfifo").arg(&fifo));
    let huge = t.path().join("huge");
    fs::File::create(&huge).unwrap().set_len(3 << 30).unwrap();
    let long = t.path().join("long");
    fs::write(
        &long,
        format!("measure func=FILE_CHECK fsname={}\n", "x".repeat(5000)),
    )
    .unwrap();
    let many = t.path().join("many");
    fs::write(&many, "measure func=FILE_CHECK\n".repeat(5000)).unwrap();
    let latin1 = t.path().join("latin1");
    fs::write(&latin1, b"# policy\n\nmeasure fsname=caf\xe9\n").unwrap();
    let cases: [(&Path, String); 6] = [
        (
            Path::new("/dev/zero"),
            "is a character device, not a regular file".into(),
        ),
        (&fifo, "is a FIFO, not a regular file".into()),
        (
            &huge,
            "3221225472 bytes, more than the 1048576 it may have".into(),
        ),
        (
            &long,
            "line 1: 5031 bytes long; a rule has at most 4095".into(),
        ),
        (&many, "line 4097: more than 4096 rules".into()),
        (
            &latin1,
            "line 3: not UTF-8 text (byte 28 of the file)".into(),
        ),
    ];
    for (policy, why) in cases {
        refused_fast(
            &mut measured_mount(&image, &mnt, policy, &log),
            &format!("verilay: error: policy {}: {why}", policy.display()),
        );
    }
    assert!(!log.exists(), "a refused policy started a list");
}

/// A list of boot_aggregate and three entries, closed cleanly, in `dir`.
fn small_list(dir: &Path) {
    let mut log = Log::open(dir).unwrap();
    for (i, path) in ["/x/one", "/x/two", "/x/three"].iter().enumerate() {
        let ev = Event {
            template: Template::ImaNg,
            kind: DigestKind::Ima,
            algo: HashAlgo::Sha256,
            digest: &[i as u8 + 1; 32],
            path: path.as_bytes(),
            sig: None,
        };
        log.append(10, &ev).unwrap();
    }
}

/// Offset of entry `k` (1-based) in a binary list with `digest_len`-byte digests.
fn record_at(list: &[u8], digest_len: usize, k: usize) -> usize {
    let mut at = 0;
    for _ in 1..k {
        let u32_at = |o: usize| u32::from_le_bytes(list[o..o + 4].try_into().unwrap()) as usize;
        let name_len = u32_at(at + 4 + digest_len);
        let len_at = at + 4 + digest_len + 4 + name_len;
        at = len_at + 4 + u32_at(len_at);
    }
    at
}

/// The hostile lists: (name, how to damage a good list, the error naming file and offset).
type Damage = fn(&Path) -> String;

fn damages() -> Vec<(&'static str, Damage)> {
    vec![
        ("huge-data-length", |dir| {
            let p = dir.join(BINARY_SHA1);
            let mut b = fs::read(&p).unwrap();
            let at = record_at(&b, 20, 2) + 4 + 20 + 4 + 6;
            b[at..at + 4].copy_from_slice(&0xffff_fff0u32.to_le_bytes());
            fs::write(&p, b).unwrap();
            format!("{BINARY_SHA1}: offset {at} (entry 2): template data length 4294967280 is implausible (more than 131072)")
        }),
        ("huge-name-length", |dir| {
            let p = dir.join(BINARY_SHA256);
            let mut b = fs::read(&p).unwrap();
            let at = record_at(&b, 32, 3) + 4 + 32;
            b[at..at + 4].copy_from_slice(&0x7fff_ffffu32.to_le_bytes());
            fs::write(&p, b).unwrap();
            format!("{BINARY_SHA256}: offset {at} (entry 3): template name length 2147483647 is not 1-255")
        }),
        ("truncated-record", |dir| {
            let p = dir.join(BINARY_SHA1);
            let b = fs::read(&p).unwrap();
            let at = record_at(&b, 20, 4);
            fs::write(&p, &b[..at + 10]).unwrap();
            format!("{BINARY_SHA1}: offset {} (entry 4): truncated record: the template digest needs 20 bytes, the file ends after 6", at + 4)
        }),
        ("fifo", |dir| {
            let p = dir.join(ASCII_SHA1);
            fs::remove_file(&p).unwrap();
            run(Command::new("mkfifo").arg(&p));
            format!("{ASCII_SHA1}: is a FIFO, not a regular file")
        }),
        ("symlink-to-dev-zero", |dir| {
            let p = dir.join(PCRS_SHA1);
            fs::remove_file(&p).unwrap();
            std::os::unix::fs::symlink("/dev/zero", &p).unwrap();
            format!("{PCRS_SHA1}: is a symbolic link, which is not followed")
        }),
        ("huge-sparse-list", |dir| {
            let p = dir.join(BINARY_SHA256);
            let f = fs::OpenOptions::new().write(true).open(&p).unwrap();
            f.set_len(0).unwrap();
            f.set_len(3 << 30).unwrap();
            format!("{BINARY_SHA256}: offset 36 (entry 1): template name length 0 is not 1-255")
        }),
        ("huge-pcr-file", |dir| {
            let p = dir.join(PCRS_SHA256);
            let f = fs::OpenOptions::new().write(true).open(&p).unwrap();
            f.set_len(3 << 30).unwrap();
            format!("{PCRS_SHA256}: offset 16384: 3221225472 bytes, longer than the 16384 such a file can be")
        }),
    ]
}

#[test]
fn hostile_lists_are_refused_naming_file_and_offset_in_bounded_time_and_memory() {
    if have_time() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (fix_t, image, policy) = fixture();
    let mnt = fix_t.path().join("mnt");
    fs::create_dir_all(&mnt).unwrap();
    for (name, damage) in damages() {
        let dir = t.path().join(name);
        small_list(&dir);
        let want = damage(&dir);
        refused_fast(
            verilay().args(["log", "verify"]).arg(&dir),
            &format!("verilay: error: measurement list {}: {want}", dir.display()),
        );
        if is_root() {
            // A mount does not continue it either, with the same words.
            refused_fast(
                &mut measured_mount(&image, &mnt, &policy, &dir),
                &format!(
                    "verilay: error: measurement list {d}: not continuing the measurement list in {d}: {want}",
                    d = dir.display()
                ),
            );
        }
    }
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn every_file_a_measured_mount_creates_is_its_owners_alone() {
    if mounts() {
        return;
    }
    let (t, image, policy) = fixture();
    let mnt = t.path().join("mnt");
    let log = t.path().join("new/list");
    let daemon_log = t.path().join("daemon.log");
    let m = mount_ok(
        &image,
        &mnt,
        &policy,
        &log,
        &[Path::new("--log"), &daemon_log],
    );
    read_through(&mnt, &["a"]);
    // While mounted: the lock, the in-use marker and the list files.
    let mut names: Vec<String> = fs::read_dir(&log)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert!(names.contains(&IN_USE.to_string()), "{names:?}");
    for n in &names {
        assert_eq!(mode(&log.join(n)), 0o600, "{n}");
    }
    unmount(m);
    assert_eq!(mode(&log), 0o700);
    assert_eq!(mode(&t.path().join("new")), 0o700);
    assert_eq!(mode(&daemon_log), 0o600);
    for e in fs::read_dir(&log).unwrap() {
        let e = e.unwrap();
        assert_eq!(mode(&e.path()), 0o600, "{:?}", e.file_name());
    }
}

#[test]
fn a_list_or_log_another_user_can_write_is_refused() {
    if mounts() {
        return;
    }
    let (t, image, policy) = fixture();
    let (mnt, log) = (t.path().join("mnt"), t.path().join("log"));
    let daemon_log = t.path().join("daemon.log");
    unmount(mount_ok(&image, &mnt, &policy, &log, &[]));
    let refused = |extra: &[&Path], want: String| {
        let out = mount(&image, &mnt, &policy, &log, extra);
        let _m = Unmount::fuse(&mnt);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "mounted: {want}");
        assert!(err.contains(&want), "{err}\nwanted: {want}");
    };
    let bin = log.join(BINARY_SHA1);
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o620)).unwrap();
    refused(
        &[],
        format!("{BINARY_SHA1}: writable by its group (mode 0620)"),
    );
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o600)).unwrap();
    let pcrs = log.join(PCRS_SHA256);
    std::os::unix::fs::chown(&pcrs, Some(4242), None).unwrap();
    refused(
        &[],
        format!("{PCRS_SHA256}: owned by uid 4242, not by this process's uid 0 or root"),
    );
    std::os::unix::fs::chown(&pcrs, Some(0), None).unwrap();
    fs::set_permissions(&log, fs::Permissions::from_mode(0o757)).unwrap();
    refused(
        &[],
        format!("{}: writable by others (mode 0757)", log.display()),
    );
    fs::set_permissions(&log, fs::Permissions::from_mode(0o755)).unwrap();
    // The --log file: others may not write it, and it is never reached through a symlink.
    fs::write(&daemon_log, "").unwrap();
    fs::set_permissions(&daemon_log, fs::Permissions::from_mode(0o646)).unwrap();
    let flag = Path::new("--log");
    refused(
        &[flag, &daemon_log],
        format!(
            "log file {}: writable by others (mode 0646)",
            daemon_log.display()
        ),
    );
    fs::set_permissions(&daemon_log, fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&daemon_log, Some(4242), None).unwrap();
    refused(
        &[flag, &daemon_log],
        format!("log file {}: owned by uid 4242", daemon_log.display()),
    );
    let link = t.path().join("link.log");
    std::os::unix::fs::symlink(&daemon_log, &link).unwrap();
    refused(
        &[flag, &link],
        format!(
            "log file {}: is a symbolic link, which is not followed",
            link.display()
        ),
    );
    assert_eq!(fs::metadata(&daemon_log).unwrap().uid(), 4242);
    // All put right, the list continues.
    unmount(mount_ok(&image, &mnt, &policy, &log, &[]));
    assert!(log_verify(&log, &[]).status.success());
}

/// Both engines: each measured writable mount below is made with each (the kernel
/// engine's measures through fanotify, `imagefs::measuring::fanotify`).
const ENGINES: [&str; 2] = ["fuse", "kernel"];

/// A writable mount of `image` on `engine` (upper and work directories in `base`)
/// measured as `policy` says into `log`, with the daemon's log in `base/daemon.log`.
fn mount_upper(
    engine: &str,
    base: &Path,
    image: &Path,
    policy: &str,
    log: &Path,
) -> (PathBuf, Unmount) {
    let (mnt, upper, work) = (base.join("mnt"), base.join("upper"), base.join("work"));
    fs::create_dir_all(&upper).unwrap();
    fs::create_dir_all(&work).unwrap();
    let pol = base.join("upper.policy");
    fs::write(&pol, policy).unwrap();
    let daemon_log = base.join("daemon.log");
    let m = mount_ok(
        image,
        &mnt,
        &pol,
        log,
        &[
            Path::new("--upper"),
            &upper,
            Path::new("--work"),
            &work,
            Path::new("--log"),
            &daemon_log,
            Path::new("--engine"),
            Path::new(engine),
        ],
    );
    (mnt, m)
}

fn sha256_hex(bytes: &[u8]) -> String {
    let mut h = HashAlgo::Sha256.hasher();
    h.update(bytes);
    measure::log::to_hex(&h.finish())
}

/// A list's entries after boot_aggregate as (what, name): `violation` for a violation
/// entry (checked to be written exactly as the kernel writes one: PCR 10, zero template
/// digest, ima-ng with a zero sha256 digest), else the file digest's hex.
fn entries_after_boot(log: &Path) -> Vec<(String, String)> {
    let lines = ascii_lines(log);
    assert!(lines[0].ends_with(" boot_aggregate"), "{lines:?}");
    let violation = format!("10 {} ima-ng sha256:{} ", "0".repeat(40), "0".repeat(64));
    lines[1..]
        .iter()
        .map(|l| match l.strip_prefix(&violation) {
            Some(name) => ("violation".to_string(), name.to_string()),
            None => {
                let f: Vec<&str> = l.split(' ').collect();
                assert_eq!(f.len(), 5, "{l}");
                assert_eq!((f[0], f[2]), ("10", "ima-ng"), "{l}");
                assert_ne!(
                    f[1],
                    "0".repeat(40),
                    "a violation not written as the kernel's: {l}"
                );
                let digest = f[3].strip_prefix("sha256:").unwrap();
                (digest.to_string(), f[4].to_string())
            }
        })
        .collect()
}

fn open_write(p: &Path) -> fs::File {
    fs::OpenOptions::new().write(true).open(p).unwrap()
}

/// IMA's `ima_rdwr_violation_check`: a measured open of a file a writer holds
/// ("open_writers"), and a write open of a file a measured reader holds ("ToMToU"), each
/// recorded once per event as a violation named by the file's path; then the list fails
/// `log verify` and evmctl unless violations are accepted.
#[test]
fn open_writers_and_tomtou_are_recorded_as_the_kernel_records_them() {
    if mounts() || skip_unless(have("evmctl"), "needs evmctl (ima-evm-utils)") {
        return;
    }
    for engine in ENGINES {
        open_writers_and_tomtou_on(engine);
    }
}

fn open_writers_and_tomtou_on(engine: &str) {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("prog"), b"original\n").unwrap();
    fs::write(src.join("other"), b"other\n").unwrap();
    let image = t.path().join("img");
    build(&src, &image, &["--quiet"]);
    let log = t.path().join("log");
    let (mnt, m) = mount_upper(
        engine,
        t.path(),
        &image,
        "measure func=FILE_CHECK mask=^MAY_READ\n",
        &log,
    );
    let (prog, other) = (mnt.join("prog"), mnt.join("other"));

    // open_writers: a writer (not measured: it cannot read) holds the file, then two
    // measured readers open it: one violation (the kernel's IMA_EMITTED_OPENWRITERS),
    // and the digest measured is of bytes the writer then replaces.
    let w = open_write(&prog);
    let r1 = fs::File::open(&prog).unwrap();
    let r2 = fs::File::open(&prog).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&w, b"EVIL!!!!\n", 0).unwrap();
    let mut got = Vec::new();
    std::io::Read::read_to_end(&mut &r1, &mut got).unwrap();
    assert_eq!(got, b"EVIL!!!!\n");
    drop((w, r1, r2));

    // ToMToU: a measured reader holds the file, then two writers open it: one violation
    // (IMA_MAY_EMIT_TOMTOU, set again by the next measured reader); a third writer after
    // another measured open records another.
    let r = fs::File::open(&prog).unwrap();
    let (w1, w2) = (open_write(&prog), open_write(&prog));
    drop((w1, w2));
    let r2 = fs::File::open(&prog).unwrap();
    let w3 = open_write(&prog);
    drop((r, r2, w3));

    // A file served from the image: its measured reader is counted too, so the write open
    // that copies it up records ToMToU; a reader that has closed counts no more.
    let r = fs::File::open(&other).unwrap();
    let w = open_write(&other);
    drop((r, w));
    drop(fs::File::open(&other).unwrap());
    drop(open_write(&other));
    unmount(m);

    let (p, o) = (prog.display().to_string(), other.display().to_string());
    let v = |n: &str| ("violation".to_string(), n.to_string());
    let d = |c: &[u8], n: &str| (sha256_hex(c), n.to_string());
    assert_eq!(
        entries_after_boot(&log),
        [
            v(&p),
            d(b"original\n", &p),
            d(b"EVIL!!!!\n", &p),
            v(&p),
            v(&p),
            d(b"other\n", &o),
            v(&o),
        ]
    );
    let out = log_verify(&log, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stdout).contains(&format!(
            "; 4 violation(s): entry 2 on PCR 10 ({p}), entry 5 on PCR 10 ({p}), entry 6 on PCR 10 ({p}), entry 8 on PCR 10 ({o})"
        )),
        "{}",
        text(&out.stdout)
    );
    assert!(log_verify(&log, &["--ignore-violations"]).status.success());
    assert!(!evmctl_accepts(&log, false), "evmctl missed the violations");
    assert!(evmctl_accepts(&log, true), "evmctl rejects the list");
    let daemon_log = fs::read_to_string(t.path().join("daemon.log")).unwrap();
    for cause in ["open_writers", "ToMToU"] {
        let line = format!("{p}: violation recorded (invalid_pcr, {cause})");
        assert!(daemon_log.contains(&line), "{daemon_log}");
    }
}

/// The writer's own policy does not matter to ToMToU (the kernel checks every write open
/// when the policy measures anything): a file measured from the image and copied up by
/// its writer into an upper layer no rule measures still records it.
#[test]
fn tomtou_is_recorded_when_the_writer_copies_up_into_an_unmeasured_layer() {
    if mounts() {
        return;
    }
    for engine in ENGINES {
        let (t, image, _) = fixture();
        tomtou_into_an_unmeasured_layer_on(engine, t.path(), &image);
    }
}

fn tomtou_into_an_unmeasured_layer_on(engine: &str, base: &Path, image: &Path) {
    let log = base.join("log");
    let (mnt, m) = mount_upper(
        engine,
        base,
        image,
        "measure func=FILE_CHECK fsmagic=0xe0f5e1e2\n",
        &log,
    );
    let r = fs::File::open(mnt.join("a")).unwrap();
    let w = open_write(&mnt.join("a"));
    drop((r, w));
    // Upper files are not measured: no violation for them.
    let r = fs::File::open(mnt.join("a")).unwrap();
    drop((r, open_write(&mnt.join("a"))));
    unmount(m);
    let a = mnt.join("a").display().to_string();
    assert_eq!(
        entries_after_boot(&log),
        [
            (sha256_hex(b"file a\n"), a.clone()),
            ("violation".to_string(), a)
        ]
    );
}

/// A hardlink made through the mount and then executed: OPEN carries no path, so the
/// list names the name learnt last, which a link is (before, it named the file's first
/// name, a path other than the one executed).
#[test]
fn an_exec_through_a_new_hardlink_is_listed_under_that_name() {
    if mounts() {
        return;
    }
    for engine in ENGINES {
        exec_through_a_new_hardlink_on(engine);
    }
}

fn exec_through_a_new_hardlink_on(engine: &str) {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    fs::create_dir_all(src.join("usr/bin")).unwrap();
    fs::create_dir_all(src.join("var/tmp")).unwrap();
    fs::write(src.join("usr/bin/tool"), "#!/bin/sh\necho benign\n").unwrap();
    fs::set_permissions(src.join("usr/bin/tool"), fs::Permissions::from_mode(0o755)).unwrap();
    let image = t.path().join("img");
    build(&src, &image, &["--quiet"]);
    let log = t.path().join("log");
    let (mnt, m) = mount_upper(engine, t.path(), &image, "measure func=BPRM_CHECK\n", &log);
    let scratch = mnt.join("var/tmp/scratch.log");
    let evil = b"#!/bin/sh\necho EVIL\n";
    fs::write(&scratch, evil).unwrap();
    fs::set_permissions(&scratch, fs::Permissions::from_mode(0o755)).unwrap();
    let tool = mnt.join("usr/bin/tool");
    fs::remove_file(&tool).unwrap();
    fs::hard_link(&scratch, &tool).unwrap();
    let out = run(&mut Command::new(&tool));
    assert_eq!(out.stdout, b"EVIL\n");
    unmount(m);
    assert_eq!(
        entries_after_boot(&log),
        [(sha256_hex(evil), tool.display().to_string())]
    );
}

/// A file name holding a newline: the ascii lists print it as the kernel's `%s` does
/// (`ima_show_template_string`), raw, so the entry's line spans two; the binary lists
/// hold it as is; verilay's own one-line report escapes it.
#[test]
fn a_name_with_a_newline_is_listed_as_the_kernel_lists_it() {
    if mounts() || skip_unless(have("evmctl"), "needs evmctl (ima-evm-utils)") {
        return;
    }
    for engine in ENGINES {
        a_name_with_a_newline_on(engine);
    }
}

fn a_name_with_a_newline_on(engine: &str) {
    let (t, image, _) = fixture();
    let log = t.path().join("log");
    let (mnt, m) = mount_upper(
        engine,
        t.path(),
        &image,
        "measure func=FILE_CHECK mask=^MAY_READ\n",
        &log,
    );
    let odd = mnt.join("two\nlines");
    fs::write(&odd, b"x\n").unwrap();
    drop(fs::File::open(&odd).unwrap());
    // A violation on it too, so `log verify` has its name to report.
    let w = open_write(&odd);
    drop((fs::File::open(&odd).unwrap(), w));
    unmount(m);
    let name = odd.display().to_string();
    let ascii = fs::read_to_string(log.join(ASCII_SHA256)).unwrap();
    assert!(
        ascii.contains(&format!(" sha256:{} {name}\n", sha256_hex(b"x\n"))),
        "{ascii}"
    );
    assert!(ascii.contains(&format!(" sha256:{} {name}\n", "0".repeat(64))));
    let bin = fs::read(log.join(BINARY_SHA1)).unwrap();
    assert!(bin
        .windows(name.len() + 1)
        .any(|w| w == format!("{name}\0").as_bytes()));
    let out = log_verify(&log, &["--ignore-violations"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report = text(&out.stdout);
    assert_eq!(report.lines().count(), 1, "{report}");
    assert!(report.contains(&name.replace('\n', "\\n")), "{report}");
    assert!(evmctl_accepts(&log, true));
}

/// Whether either engine's mount is on `mnt` (FUSE's, or the kernel engine's erofs or
/// overlayfs).
fn mounted(mnt: &Path) -> bool {
    let want = mnt.as_os_str().as_encoded_bytes();
    fs::read("/proc/self/mountinfo")
        .unwrap()
        .split(|&b| b == b'\n')
        .any(|l| {
            let f: Vec<&[u8]> = l.split(|&b| b == b' ').collect();
            let fstype = f.iter().position(|x| *x == b"-").and_then(|i| f.get(i + 1));
            f.get(4) == Some(&want)
                && fstype
                    .is_some_and(|t| t.starts_with(b"fuse") || *t == b"erofs" || *t == b"overlay")
        })
}

/// The marker of a writer that died with a list open, measuring into PCR 11 only.
fn dead_pcr11_marker(dir: &Path) {
    fs::write(dir.join(IN_USE), "pid 1, mount on /gone\npcrs: 11\n").unwrap();
}

/// A mount continuing a list whose last writer died, itself killed while it records the
/// gap (at each fsync in turn, as `strace` injects): the next mount must still record a
/// violation on every PCR the first dead writer could extend, not only the second's.
#[test]
fn a_death_while_recording_a_gap_still_leaves_it_owed_on_the_first_writers_pcrs() {
    if mounts() || skip_unless(have("strace"), "needs strace (fault injection)") {
        return;
    }
    let (t, image, policy) = fixture();
    let mnt = t.path().join("mnt");
    let mut killed = 0;
    for when in 1..=12 {
        let log = t.path().join(format!("log{when}"));
        small_list(&log);
        dead_pcr11_marker(&log);
        fs::create_dir_all(&mnt).unwrap();
        // strace follows the daemon too, so it ends only when the daemon does: a mount
        // that came up (past the recovery's fsyncs) is unmounted to end it.
        let mut strace = Command::new("strace")
            .args(["-f", "-qq", "-o", "/dev/null", "-e", "trace=fsync", "-e"])
            .arg(format!("inject=fsync:signal=KILL:when={when}"))
            .arg(env!("CARGO_BIN_EXE_verilay"))
            .arg("mount")
            .arg(&image)
            .arg(&mnt)
            .arg("--policy")
            .arg(&policy)
            .arg("--measure-log")
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut ended = None;
        wait_until(
            Duration::from_secs(20),
            "the mount to end or come up",
            || {
                ended = strace.try_wait().unwrap();
                ended.is_some() || mounted(&mnt)
            },
        );
        if ended.is_none() {
            // Under strace the daemon may still be finishing its setup as the mount
            // appears (the mount is busy a moment): unmounted once it lets go.
            let pid = daemon_of(&mnt);
            wait_until(Duration::from_secs(20), "the mount to unmount", || {
                verilay()
                    .arg("umount")
                    .arg(&mnt)
                    .output()
                    .is_ok_and(|o| o.status.success())
            });
            wait_gone(pid);
            strace.wait().unwrap();
            break;
        }
        killed += 1;
        drop(Unmount {
            dir: mnt.clone(),
            fuse: true,
        });
        wait_daemon_gone(&mnt);
        let m = mount_ok(&image, &mnt, &policy, &log, &[]);
        unmount(m);
        let pcr11 = format!(
            "11 {} ima-ng sha256:{} verilay:unclean-shutdown",
            "0".repeat(40),
            "0".repeat(64)
        );
        let lines = ascii_lines(&log);
        assert!(
            lines.contains(&pcr11),
            "killed at fsync {when}: PCR 11 of the first dead writer got no violation:\n{}",
            lines.join("\n")
        );
        assert!(log_verify(&log, &["--ignore-violations"]).status.success());
    }
    assert!(killed > 0, "no fsync was injected into");
}

/// A mount that fails once it has marked its list in use (a FIFO where a PCR file goes,
/// refused) puts the list back as it was: the next mount records no violation.
#[test]
fn a_mount_that_fails_opening_its_list_leaves_no_false_gap() {
    if mounts() {
        return;
    }
    let (t, image, policy) = fixture();
    let (mnt, log) = (t.path().join("mnt"), t.path().join("log"));
    fs::create_dir_all(&log).unwrap();
    run(Command::new("mkfifo").arg(log.join(PCRS_SHA1)));
    let out = mount(&image, &mnt, &policy, &log, &[]);
    drop(Unmount {
        dir: mnt.clone(),
        fuse: true,
    });
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        err.contains(&format!("{PCRS_SHA1}: is a FIFO, not a regular file")),
        "{err}"
    );
    assert!(
        !log.join(IN_USE).exists(),
        "the failed mount left its marker"
    );
    fs::remove_file(log.join(PCRS_SHA1)).unwrap();
    let m = mount_ok(&image, &mnt, &policy, &log, &[]);
    read_through(&mnt, &["a"]);
    unmount(m);
    let out = log_verify(&log, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(ascii_lines(&log).len(), 2);
}

/// An image whose file `sparse` is 2^50 bytes of holes (and `a`, a small file) (a chunk-based inode patched, the image
/// sealed again): a valid image whose ima-ng measurement would hash zeros for days, as
/// the kernel's IMA would too.
fn huge_sparse_image(base: &Path) -> PathBuf {
    let src = base.join("sparse-src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("a"), "file a\n").unwrap();
    let f = fs::File::create(src.join("sparse")).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &[b'A'; 4096], 0).unwrap();
    f.set_len(512 << 10).unwrap();
    // An owner past 16 bits makes the inode extended, whose size field has 64 bits.
    std::os::unix::fs::chown(src.join("sparse"), Some(70000), None).unwrap();
    let image = base.join("huge.img");
    build(&src, &image, &["--quiet"]);
    let out = run(verilay()
        .args(["inspect", "--json"])
        .arg(&image)
        .arg("/sparse"));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["layout"]["kind"], "chunk_based", "{v}");
    assert_eq!(v["layout"]["chunks"], 128, "{v}");
    let at = v["inode"]["offset"].as_u64().unwrap() as usize;
    let mut b = fs::read(&image).unwrap();
    let trailer = &b[b.len() - 64..];
    let erofs = u64::from_le_bytes(trailer[16..24].try_into().unwrap()) as usize;
    b.truncate(erofs);
    b[at + 8..at + 16].copy_from_slice(&(1u64 << 50).to_le_bytes());
    // Chunks of 2^31 blocks: 128 of them cover 2^50 bytes; every one a hole.
    b[at + 16..at + 18].copy_from_slice(&31u16.to_le_bytes());
    let index = (at + 64).next_multiple_of(4);
    for i in 0..128 {
        b[index + 4 * i..index + 4 * i + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    }
    let block_size = 1usize << b[1024 + 12];
    if u32::from_le_bytes(b[1032..1036].try_into().unwrap()) & 1 != 0 {
        let sum = erofs::format::superblock_checksum(&b, block_size).unwrap();
        b[1028..1032].copy_from_slice(&sum.to_le_bytes());
    }
    fs::write(&image, &b).unwrap();
    run(verilay().args(["seal", "--quiet"]).arg(&image));
    image
}

/// Kills a process this test started if it is still there when dropped (a daemon that
/// did not stop must not spin on after the test).
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if Path::new(&format!("/proc/{}", self.0)).exists() {
            let _ = Command::new("kill")
                .args(["-9", &self.0.to_string()])
                .status();
        }
    }
}

fn stats_measured(mnt: &Path) -> u64 {
    let out = verilay()
        .args(["stats", "--json"])
        .arg(mnt)
        .output()
        .unwrap();
    serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .ok()
        .and_then(|v| v["measured"].as_u64())
        .unwrap_or(0)
}

/// An opener of `file` killed while its measured open hashes: it dies of SIGKILL (the FUSE
/// engine's once its open is answered, the kernel engine's at once: fanotify does not
/// wait), the hash stops for it (the daemon says so in `daemon_log`), and the mount still
/// serves.
fn opener_killed_mount_serves_on(mnt: &Path, file: &Path, daemon_log: &Path) {
    let opener = start_opener(mnt, file, 1);
    run(Command::new("kill").args(["-9", &opener.id().to_string()]));
    let status = ended(opener, "SIGKILL");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
    wait_until(Duration::from_secs(10), "the hash to stop", || {
        fs::read_to_string(daemon_log).is_ok_and(|l| l.contains("the opener is being killed"))
    });
    read_through(mnt, &["a"]);
}

/// Starts `head -c 1 FILE` (an open the policy measures) and waits until the daemon is
/// measuring it.
fn start_opener(mnt: &Path, file: &Path, measured: u64) -> std::process::Child {
    let child = Command::new("head")
        .args(["-c", "1"])
        .arg(file)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(10), "the open to be measured", || {
        stats_measured(mnt) >= measured
    });
    child
}

/// Waits (10 s at most) for `child` to end; its status.
fn ended(mut child: std::process::Child, what: &str) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{what}: the opener is still waiting for its open after 10 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A measured open hashing a 2^50-byte file keeps the daemon stoppable: the hash stops
/// (the open fails with EIO, and the daemon says why) when the opener is killed, when the
/// mount is lazily unmounted, and when the daemon gets SIGTERM.
#[test]
fn a_hash_that_would_take_days_stops_at_unmount_sigterm_or_the_openers_kill() {
    if mounts() {
        return;
    }
    for engine in ENGINES {
        a_hash_that_would_take_days_on(engine);
    }
}

fn a_hash_that_would_take_days_on(engine: &str) {
    let (t, _, policy) = fixture();
    let image = huge_sparse_image(t.path());
    let (mnt, log) = (t.path().join("mnt"), t.path().join("log"));
    let daemon_log = t.path().join("daemon.log");
    let flag = Path::new("--log");
    let file = mnt.join("sparse");
    let extra = [flag, &daemon_log, Path::new("--engine"), Path::new(engine)];

    // The opener killed: its open is answered (EIO), so it dies; the mount serves on.
    let m = mount_ok(&image, &mnt, &policy, &log, &extra);
    let daemon = KillOnDrop(daemon_of(&mnt));
    opener_killed_mount_serves_on(&mnt, &file, &daemon_log);

    // A lazy unmount: the open fails, the daemon finishes and exits.
    let opener = start_opener(&mnt, &file, 3);
    run(verilay().args(["umount", "--lazy"]).arg(&mnt));
    std::mem::forget(m);
    let out = ended(opener, "lazy unmount");
    assert_eq!(out.code(), Some(1));
    wait_gone(daemon.0);

    // SIGTERM to the daemon: the same.
    let m = mount_ok(&image, &mnt, &policy, &log, &extra);
    let daemon = KillOnDrop(daemon_of(&mnt));
    let opener = start_opener(&mnt, &file, 1);
    run(Command::new("kill").args(["-TERM", &daemon.0.to_string()]));
    std::mem::forget(m);
    let out = ended(opener, "SIGTERM");
    assert_eq!(out.code(), Some(1));
    wait_gone(daemon.0);

    let said = fs::read_to_string(&daemon_log).unwrap();
    let path = file.display();
    for why in [
        "the opener is being killed",
        "the mount was unmounted",
        "the mount was unmounted",
    ] {
        let line = format!("measuring {path}: hash stopped after ");
        assert!(
            said.lines().any(|l| l.contains(&line) && l.ends_with(why)),
            "no line says the hash stopped because {why}:\n{said}"
        );
    }
    // Both lists were closed cleanly: nothing measured was lost.
    assert!(log_verify(&log, &[]).status.success());
}

/// The same for an upper file of 2^43 bytes of holes (what ext4 allows), made through a
/// writable mount: killing the opener stops its hash, and SIGTERM stops the daemon.
#[test]
fn a_hash_of_a_huge_sparse_upper_file_stops_at_sigterm_or_the_openers_kill() {
    if mounts() {
        return;
    }
    for engine in ENGINES {
        a_huge_sparse_upper_file_on(engine);
    }
}

fn a_huge_sparse_upper_file_on(engine: &str) {
    let (t, image, _) = fixture();
    let log = t.path().join("log");
    let policy = "measure func=FILE_CHECK mask=^MAY_READ\n";
    let (mnt, m) = mount_upper(engine, t.path(), &image, policy, &log);
    let daemon = KillOnDrop(daemon_of(&mnt));
    let file = mnt.join("huge");
    fs::File::create(&file).unwrap().set_len(1 << 43).unwrap();

    opener_killed_mount_serves_on(&mnt, &file, &t.path().join("daemon.log"));

    let opener = start_opener(&mnt, &file, 3);
    run(Command::new("kill").args(["-TERM", &daemon.0.to_string()]));
    std::mem::forget(m);
    assert_eq!(ended(opener, "SIGTERM").code(), Some(1));
    wait_gone(daemon.0);
    let said = fs::read_to_string(t.path().join("daemon.log")).unwrap();
    for why in ["the opener is being killed", "the mount was unmounted"] {
        let line = format!("measuring {}: hash stopped after ", file.display());
        assert!(
            said.lines().any(|l| l.contains(&line) && l.ends_with(why)),
            "no line says the hash stopped because {why}:\n{said}"
        );
    }
    assert!(log_verify(&log, &[]).status.success());
}

/// A list directory in the `measure_list` fuzz target's form (see its documentation).
fn encode_list(dir: &Path) -> Vec<u8> {
    let marker = fs::read(dir.join(IN_USE)).ok();
    let mut out = vec![u8::from(marker.is_some())];
    for name in LIST_FILES {
        let b = fs::read(dir.join(name)).unwrap_or_default();
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        out.extend_from_slice(&b);
    }
    out.extend_from_slice(&marker.unwrap_or_default());
    out
}

/// Hostile inputs of this module for the fuzz targets.
pub fn seeds(tmp: &Path) -> Vec<Seed> {
    let mut v = Vec::new();
    let policies: [(&str, Vec<u8>); 8] = [
        (
            "talos",
            b"dont_measure fsmagic=0xe0f5e1e2\nmeasure func=FILE_CHECK mask=^MAY_READ uid=0\nmeasure func=FILE_CHECK mask=^MAY_READ euid=0\n".to_vec(),
        ),
        (
            "verity",
            b"measure func=FILE_CHECK digest_type=verity\nmeasure func=BPRM_CHECK pcr=11 template=ima-sigv2 fowner>999 fsuuid=5b1c3b4e-8c57-4f0e-9d4a-3a9f0c6d2e71 # c\n".to_vec(),
        ),
        ("long-line", format!("measure fsname={}\n", "x".repeat(5000)).into_bytes()),
        ("many-rules", b"measure\n".repeat(4100)),
        ("latin1", b"measure fsname=caf\xe9\n".to_vec()),
        ("control", b"measure\r func=FILE_CHECK\0\n\tdont_measure\x0b\n".to_vec()),
        (
            "refused",
            b"appraise func=MMAP_CHECK template=ima-modsig obj_type=x\n".to_vec(),
        ),
        ("pcr-range", b"measure pcr=24\nmeasure uid=4294967295\n".to_vec()),
    ];
    for (name, bytes) in policies {
        v.push(Seed {
            target: "policy",
            name: name.into(),
            bytes,
        });
    }
    let lists = tmp.join("measure-lists");
    let mut list = |name: &str, make: &dyn Fn(&Path)| {
        let dir = lists.join(name);
        make(&dir);
        v.push(Seed {
            target: "measure_list",
            name: name.into(),
            bytes: encode_list(&dir),
        });
    };
    list("clean", &|d| small_list(d));
    list("killed", &|d| {
        small_list(d);
        let mut log = Log::open(d).unwrap();
        log.append(
            11,
            &Event {
                template: Template::ImaNgV2,
                kind: DigestKind::Verity,
                algo: HashAlgo::Sha256,
                digest: &[9; 32],
                path: b"/x/v",
                sig: None,
            },
        )
        .unwrap();
        log.flush().unwrap();
        log.abandon();
    });
    list("recovered", &|d| {
        small_list(d);
        let log = Log::open(d).unwrap();
        log.abandon();
        drop(Log::open(d).unwrap());
    });
    list("torn", &|d| {
        small_list(d);
        Log::open(d).unwrap().abandon();
        let p = d.join(BINARY_SHA256);
        let b = fs::read(&p).unwrap();
        fs::write(&p, &b[..b.len() - 5]).unwrap();
    });
    for (name, damage) in damages() {
        if matches!(
            name,
            "fifo" | "symlink-to-dev-zero" | "huge-sparse-list" | "huge-pcr-file"
        ) {
            // Not representable as bytes (the target writes regular files).
            continue;
        }
        list(name, &|d| {
            small_list(d);
            damage(d);
        });
    }
    v
}
