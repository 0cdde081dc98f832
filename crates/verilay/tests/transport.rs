//! How requests reach the daemon: a mount asked for FUSE over io_uring is served on its
//! rings (every CPU's queue carries requests, /dev/fuse none but what never comes on a
//! ring), one asked for /dev/fuse on /dev/fuse alone, and each says so, in `verilay mount`'s
//! words and in `verilay stats`. The rest of the suite runs once per transport
//! (scripts/test); this file proves the io_uring pass is not silently the fallback.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// True (and a SKIP line) unless root has turned FUSE over io_uring on.
fn lacks_uring() -> bool {
    let enabled = std::fs::read_to_string(ENABLE_URING).unwrap_or_default();
    skip_unless(
        enabled.trim() == "Y",
        "FUSE over io_uring is off (scripts/setup turns on enable_uring)",
    )
}

fn possible_cpus() -> usize {
    let list = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    list.trim()
        .split(',')
        .map(|r| match r.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1,
            None => 1,
        })
        .sum()
}

fn online_cpus() -> Vec<usize> {
    let list = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    list.trim()
        .split(',')
        .flat_map(|r| {
            let (a, b) = r.split_once('-').unwrap_or((r, r));
            a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap()
        })
        .collect()
}

/// A small tree of files to read, as an image.
fn image(base: &Path) -> PathBuf {
    let src = base.join("src");
    for d in 0..4 {
        let dir = src.join(format!("d{d}"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..50 {
            std::fs::write(
                dir.join(format!("f{f}")),
                format!("{d}/{f}\n").repeat(f + 1),
            )
            .unwrap();
        }
    }
    let image = base.join("tree.img");
    build(&src, &image, &["--quiet"]);
    image
}

/// Mounts `image` on `mnt` over `transport`: what `verilay mount` said on stderr.
fn mount(image: &Path, mnt: &Path, transport: &str) -> (Unmount, String) {
    std::fs::create_dir_all(mnt).unwrap();
    let out = run(verilay()
        .args(["mount", "--transport", transport])
        .arg(image)
        .arg(mnt)
        .env_remove("VERILAY_TRANSPORT"));
    (
        Unmount::fuse(mnt),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Walks and reads the whole mount from a process on each online CPU (the kernel puts a
/// request on the queue of the CPU its sender runs on), each on names the others have
/// not looked up.
fn read_from_every_cpu(mnt: &Path) {
    for (i, cpu) in online_cpus().into_iter().enumerate() {
        let dir = mnt.join(format!("d{}", i % 4));
        let out = run(Command::new("taskset")
            .args(["-c", &cpu.to_string(), "sh", "-c"])
            .arg(format!(
                "ls -lR '{0}' >/dev/null && cat '{0}'/* >/dev/null",
                dir.display()
            )));
        assert!(out.status.success());
    }
}

fn stats(mnt: &Path) -> serde_json::Value {
    let out = run(verilay().args(["stats", "--json"]).arg(mnt));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `/tmp/verilay-transport{suffix}-PID`, emptied, and the test image built in it: (the
/// directory, the image).
fn fresh_base(suffix: &str) -> (PathBuf, PathBuf) {
    let base = PathBuf::from(format!(
        "/tmp/verilay-transport{suffix}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let image = image(&base);
    (base, image)
}

#[test]
fn an_io_uring_mount_is_served_on_its_rings_and_a_dev_mount_on_dev_fuse() {
    if skip_unless(is_root(), "needs root (mount(2) of FUSE, taskset)")
        || skip_unless(have("taskset"), "taskset missing")
        || lacks_uring()
    {
        return;
    }
    let (base, image) = fresh_base("");

    let mnt = base.join("uring");
    let (_m, said) = mount(&image, &mnt, "uring");
    assert!(said.contains("served over io_uring ("), "{said}");
    read_from_every_cpu(&mnt);
    let s = stats(&mnt);
    assert!(
        s["transport"].as_str().unwrap().starts_with("io_uring ("),
        "{s}"
    );
    let queues: Vec<u64> = s["fuse_requests"]["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q.as_u64().unwrap())
        .collect();
    // One queue per possible CPU, as the kernel has them; every online CPU's carried the
    // reads its pinned reader sent. /dev/fuse carries only FORGETs and INTERRUPTs.
    assert_eq!(queues.len(), possible_cpus(), "{s}");
    for cpu in online_cpus() {
        assert!(queues[cpu] > 0, "queue {cpu} served nothing: {s}");
    }
    let on_rings: u64 = queues.iter().sum();
    let on_dev = s["fuse_requests"]["dev"].as_u64().unwrap();
    assert!(on_rings >= 100 && on_dev < on_rings / 10, "{s}");

    let mnt = base.join("dev");
    let (_m, said) = mount(&image, &mnt, "dev");
    assert!(said.contains("served over /dev/fuse ("), "{said}");
    read_from_every_cpu(&mnt);
    let s = stats(&mnt);
    assert!(
        s["transport"].as_str().unwrap().starts_with("/dev/fuse ("),
        "{s}"
    );
    assert_eq!(s["fuse_requests"]["queues"], serde_json::json!([]), "{s}");
    assert!(s["fuse_requests"]["dev"].as_u64().unwrap() >= 100, "{s}");
    drop(_m);
    let _ = std::fs::remove_dir_all(&base);
}

/// `-o transport=` is the same choice, a wrong name is refused before anything is
/// mounted, and `$VERILAY_TRANSPORT` is the default a flag overrides.
#[test]
fn the_transport_is_chosen_by_flag_option_or_environment_and_a_wrong_one_refused() {
    if skip_unless(is_root(), "needs root (mount(2) of FUSE)") {
        return;
    }
    let (base, image) = fresh_base("-opt");
    let mnt = base.join("m");
    std::fs::create_dir_all(&mnt).unwrap();
    for (args, env, expect) in [
        (vec!["-o", "transport=dev"], None, "/dev/fuse ("),
        (vec![], Some("dev"), "/dev/fuse ("),
        (vec!["--transport", "dev"], Some("uring"), "/dev/fuse ("),
    ] {
        let mut cmd = verilay();
        cmd.arg("mount").args(&args).arg(&image).arg(&mnt);
        match env {
            Some(e) => cmd.env("VERILAY_TRANSPORT", e),
            None => cmd.env_remove("VERILAY_TRANSPORT"),
        };
        let out = run(&mut cmd);
        let _m = Unmount::fuse(&mnt);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            said.contains(&format!("served over {expect}")),
            "{args:?} {env:?}: {said}"
        );
        drop(_m);
        wait_daemon_gone(&mnt);
    }
    for (args, env, needle) in [
        (
            vec!["--transport", "fast"],
            None,
            "not one of auto, uring, dev",
        ),
        (vec!["-o", "transport=fast"], None, "transport=fast"),
        (vec![], Some("fast"), "VERILAY_TRANSPORT"),
        (
            vec!["--transport", "dev", "-o", "transport=uring"],
            None,
            "both given",
        ),
    ] {
        let mut cmd = verilay();
        cmd.arg("mount").args(&args).arg(&image).arg(&mnt);
        match env {
            Some(e) => cmd.env("VERILAY_TRANSPORT", e),
            None => cmd.env_remove("VERILAY_TRANSPORT"),
        };
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?} {env:?}: {err}");
        assert!(daemons_of(&mnt).is_empty());
    }
    let _ = std::fs::remove_dir_all(&base);
}

/// A writable mount over io_uring makes and removes names, opens and copies up on the
/// rings: /dev/fuse carries only FORGETs.
#[test]
fn names_are_made_and_removed_on_the_rings_of_a_writable_mount() {
    if skip_unless(is_root(), "needs root (mount(2) of FUSE)") || lacks_uring() {
        return;
    }
    let (base, image) = fresh_base("-rw");
    let (mnt, upper, work) = (base.join("mnt"), base.join("upper"), base.join("work"));
    for d in [&mnt, &upper, &work] {
        std::fs::create_dir_all(d).unwrap();
    }
    run(verilay()
        .args(["mount", "--transport", "uring", "--upper"])
        .arg(&upper)
        .arg("--work")
        .arg(&work)
        .arg(&image)
        .arg(&mnt)
        .env_remove("VERILAY_TRANSPORT"));
    let _m = Unmount::fuse(&mnt);
    let d = mnt.join("d0");
    for i in 0..50 {
        std::fs::write(d.join(format!("new{i}")), b"x").unwrap();
        std::fs::create_dir(d.join(format!("dir{i}"))).unwrap();
        std::os::unix::fs::symlink("new0", d.join(format!("link{i}"))).unwrap();
    }
    // Opening files the upper directory has, to read or to write, copies nothing up.
    for i in 0..50 {
        drop(std::fs::File::open(d.join(format!("new{i}"))).unwrap());
        drop(
            std::fs::OpenOptions::new()
                .append(true)
                .open(d.join(format!("new{i}")))
                .unwrap(),
        );
    }
    for i in 0..50 {
        std::fs::remove_file(d.join(format!("new{i}"))).unwrap();
        std::fs::remove_dir(d.join(format!("dir{i}"))).unwrap();
        std::fs::remove_file(d.join(format!("link{i}"))).unwrap();
    }
    // A write open of a file only the image has copies it up.
    drop(
        std::fs::OpenOptions::new()
            .append(true)
            .open(d.join("f1"))
            .unwrap(),
    );
    let s = stats(&mnt);
    let on_rings: u64 = s["fuse_requests"]["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q.as_u64().unwrap())
        .sum();
    let on_dev = s["fuse_requests"]["dev"].as_u64().unwrap();
    // FORGETs of the removed names come on /dev/fuse, as many as the kernel drops.
    assert!(on_rings >= 600 && on_dev < on_rings / 4, "{s}");
    drop(_m);
    let _ = std::fs::remove_dir_all(&base);
}

/// How long serving threads look for the next request before sleeping: 50 µs over
/// io_uring and 0 over /dev/fuse unless `--poll-us` or `-o poll_us=` says otherwise (0:
/// never), as `verilay stats` reports; a value past 10 ms or not a number is refused
/// before anything is mounted.
#[test]
fn serving_threads_look_for_requests_as_long_as_asked() {
    if skip_unless(is_root(), "needs root (mount(2) of FUSE)") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let image = image(t.path());
    let mnt = t.path().join("m");
    std::fs::create_dir_all(&mnt).unwrap();
    for (args, expect) in [
        (vec![], None),
        (vec!["--poll-us", "0"], Some(0)),
        (vec!["-o", "poll_us=200"], Some(200)),
        (vec!["--poll-us", "50"], Some(50)),
    ] {
        run(verilay().arg("mount").args(&args).arg(&image).arg(&mnt));
        let m = Unmount::fuse(&mnt);
        // Served as before: the tree reads back whole.
        read_from_every_cpu(&mnt);
        let s = stats(&mnt);
        let uring = s["transport"]
            .as_str()
            .is_some_and(|t| t.contains("io_uring"));
        let expect = expect.unwrap_or(if uring { 50 } else { 0 });
        assert_eq!(s["poll_us"].as_u64(), Some(expect), "{args:?}: {s}");
        drop(m);
        wait_daemon_gone(&mnt);
    }
    for (args, needle) in [
        (vec!["--poll-us", "10001"], "at most 10000"),
        (vec!["-o", "poll_us=1ms"], "poll_us=1ms"),
        (
            vec!["--poll-us", "5", "-o", "poll_us=5"],
            "-o poll_us= both given",
        ),
    ] {
        let out = verilay()
            .arg("mount")
            .args(&args)
            .arg(&image)
            .arg(&mnt)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(daemons_of(&mnt).is_empty());
    }
}
