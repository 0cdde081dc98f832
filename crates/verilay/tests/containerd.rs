//! `verilay snapshotter` under a real containerd (Debian's 1.6, with runc), side by side
//! with containerd's own overlayfs snapshotter: the snapshot commands of `ctr`, an image
//! pulled from the test registry and run, and a restart of the snapshotter. Each test
//! starts its own containerd (own root, state and sockets) and snapshotter, and kills
//! them, their shims and their mounts on every path.

mod common;

use common::containerd::*;
use common::containers::{
    assert_mount_types, convert_json, fetched_under_half, layout, prerequisites, push_layout,
    stats_json, tamper_busybox, three_layers,
};
use common::registry::Registry;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Mounts what `ctr snapshots mounts` prints for `key` on `mnt`, writes `files` there, and
/// unmounts it.
fn write_through_mounts(
    s: &Setup,
    snapshotter: &str,
    key: &str,
    mnt: &Path,
    files: &[(&str, &str)],
) {
    std::fs::create_dir_all(mnt).unwrap();
    let out = run(&mut s
        .containerd
        .snapshots_cmd(snapshotter, &["mounts", &mnt.display().to_string(), key]));
    sh(&String::from_utf8(out.stdout).unwrap());
    for (name, content) in files {
        std::fs::write(mnt.join(name), content).unwrap();
    }
    run(Command::new("umount").arg(mnt));
}

/// The same requests to both snapshotters, and the same outcome of each: output (paths
/// aside) on success, the class of error on failure. Removal and cleanup happen in
/// containerd's garbage collection, which calls the snapshotter's Remove and Cleanup:
/// both roots must lose the same directories.
#[test]
fn ctr_snapshots_commands_match_overlayfs() {
    if containerd_prerequisites() {
        return;
    }
    let s = Setup::start();
    // Views carry no `containerd.io/gc.root` label (ctr gives one only to what it
    // prepares): containerd's garbage collection, which runs every few milliseconds,
    // would remove them between steps. A prepared snapshot refers to them before they
    // exist (`HOLD`), so they stay until removed.
    let steps: &[&[&str]] = &[
        &["prepare", "holder", ""],
        &["HOLD"],
        &["prepare", "a", ""],
        &["prepare", "a", ""],
        &["mounts", "/mnt/x", "a"],
        &["WRITE", "a"],
        &["usage", "a"],
        &["commit", "b", "a"],
        &["commit", "b2", "a"],
        &["usage", "b"],
        &["mounts", "/mnt/x", "b"],
        &["prepare", "c", "b"],
        &["mounts", "/mnt/x", "c"],
        &["view", "v", "b"],
        &["mounts", "/mnt/x", "v"],
        &["view", "v0", ""],
        &["mounts", "/mnt/x", "v0"],
        &["prepare", "d", "nope"],
        &["view", "e", "c"],
        &["prepare", "e", "c"],
        &["usage", "v"],
        &["usage", "v0"],
        &["WRITE", "c"],
        &["usage", "c"],
        &["info", "c"],
        &["commit", "c2", "c"],
        &["view", "v2", "c2"],
        &["mounts", "/mnt/x", "v2"],
        &["usage", "c2"],
        &["commit", "x", "v2"],
        &["label", "b", "foo=bar"],
        &["label", "b", "foo="],
        &["label", "b", "k=v"],
        &["info", "b"],
        &["info", "v2"],
        &["info", "nope"],
        &["ls"],
        &["tree"],
        &["rm", "b"],
        &["rm", "v2", "v", "v0"],
        &["rm", "c2"],
        &["rm", "b"],
        &["info", "b"],
        &["ls"],
    ];
    let mut outcomes = [Vec::new(), Vec::new()];
    for (i, sn) in ["overlayfs", "verilay"].iter().enumerate() {
        for step in steps {
            if step[0] == "HOLD" {
                let refs: Vec<String> = ["v", "v0", "v2"]
                    .iter()
                    .map(|v| format!("containerd.io/gc.ref.snapshot.{sn}/{v}={v}"))
                    .collect();
                let mut args = vec!["label", "holder"];
                args.extend(refs.iter().map(String::as_str));
                run(&mut s.containerd.snapshots_cmd(sn, &args));
                continue;
            }
            if step[0] == "WRITE" {
                let mnt = s.dir.path().join(format!("mnt-{sn}"));
                write_through_mounts(&s, sn, step[1], &mnt, &[(step[1], "written\n")]);
                continue;
            }
            let mut out = s.containerd.snapshots(sn, step);
            if step[0] == "label" {
                // ctr prints the labels in Go's map order, which is random.
                let printed = String::from_utf8_lossy(&out.stdout).into_owned();
                let mut labels: Vec<&str> = printed.trim_end().split(',').collect();
                labels.sort();
                out.stdout = labels.join(",").into_bytes();
            }
            let outcome = s.outcome(&out);
            outcomes[i].push(format!("{}: {outcome}", step.join(" ")));
        }
    }
    assert_eq!(outcomes[0], outcomes[1], "{}", s.logs());
    // The comparison means something only if the steps did what they say.
    let joined = outcomes[1].join("\n");
    for want in [
        "prepare a : error: already exists",
        "mounts /mnt/x a: ok: mount -t bind ROOT/snapshots/2/fs /mnt/x -o rw,rbind",
        "usage b: ok: KEY SIZE    INODES \nb   8.0 KiB 2",
        "prepare d nope: error: not found",
        "view e c: error: invalid argument",
        "commit x v2: error: failed precondition",
        "rm b: error: failed precondition",
        "info nope: error: not found",
        "mounts /mnt/x v: ok: mount -t bind ROOT/snapshots/2/fs /mnt/x -o ro,rbind",
        "lowerdir=ROOT/snapshots/3/fs:ROOT/snapshots/2/fs",
        "\"k\": \"v\"",
    ] {
        assert!(joined.contains(want), "missing {want:?} in:\n{joined}");
    }
    // containerd's garbage collection removes what `rm` left to it from both: all but
    // the holder.
    let dirs = |root: &Path| -> Vec<String> {
        let mut d: Vec<String> = std::fs::read_dir(root.join("snapshots"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        d.sort();
        d
    };
    let ours = std::fs::canonicalize(&s.snapshotter.as_ref().unwrap().root).unwrap();
    let collected = || [dirs(&ours), dirs(&s.containerd.overlayfs_root())];
    // containerd 1.6's scheduler drops a deletion made while a collection runs (the
    // event is older than the collection's end), leaving it to whatever deletes next;
    // a proxy snapshotter's slower collection widens that window. Deleting a lease with
    // --sync asks for a collection and waits for it.
    let kick = || {
        let id = format!("kick-{}", std::process::id());
        run(s.containerd.ctr().args(["leases", "create", "--id", &id]));
        run(s.containerd.ctr().args(["leases", "rm", "--sync", &id]));
    };
    let mut next_kick = std::time::Instant::now() + Duration::from_secs(2);
    poll_until(Duration::from_secs(30), || {
        let done = collected() == [["1"], ["1"]];
        if !done && std::time::Instant::now() >= next_kick {
            kick();
            next_kick = std::time::Instant::now() + Duration::from_secs(2);
        }
        done
    });
    assert_eq!(collected(), [["1"], ["1"]], "{}", s.logs());
}

/// An image pushed to the test registry, pulled and run through each snapshotter: the
/// same output; then the snapshotter restarted on the same root: the snapshots it had
/// answer as before, and the image runs again.
#[test]
fn an_image_runs_as_on_overlayfs_and_after_a_restart() {
    if containerd_prerequisites()
        || prerequisites()
        || skip_unless(have("busybox"), "needs busybox-static (scripts/setup)")
    {
        return;
    }
    let mut s = Setup::start();
    let reg = Registry::start(false);
    let l = layout(s.dir.path(), "v1", &image_layers(s.dir.path()));
    push_layout(&reg, &l, "app:v1");
    let image = format!("127.0.0.1:{}/app:v1", reg.port);
    let script = "cat /etc/os-release /app/file; ls /etc; echo written > /tmp/new; \
                  cat /tmp/new; rm /etc/os-release; ls -a /etc /tmp; ls -ln /app";
    let ctr_run = |s: &Setup, sn: &str, id: &str| -> String {
        let (code, out, err) = s.ctr_run(sn, &image, id, &["sh", "-c", script]);
        assert_eq!(code, 0, "{err}");
        out
    };
    for sn in ["overlayfs", "verilay"] {
        run(s.containerd.ctr().args([
            "image",
            "pull",
            "--plain-http",
            "--snapshotter",
            sn,
            &image,
        ]));
    }
    let plain = ctr_run(&s, "overlayfs", "plain");
    assert!(
        plain.contains("base\napp\n") && plain.contains("written"),
        "{plain}"
    );
    assert!(!plain.contains("gone"), "{plain}");
    let ours = ctr_run(&s, "verilay", "verilay");
    assert_eq!(ours, plain, "{}", s.logs());
    // The layers are verilay's: two committed snapshots, the image's files in them.
    let root = std::fs::canonicalize(&s.snapshotter.as_ref().unwrap().root).unwrap();
    let meta = std::fs::read_to_string(root.join("metadata.json")).unwrap();
    assert_eq!(meta.matches("\"kind\":\"committed\"").count(), 2, "{meta}");
    assert!(root.join("snapshots/1/fs/bin/busybox").is_file());
    // The top layer's deletion, as containerd applies it: an overlayfs whiteout (a 0/0
    // character device) in that layer's own directory.
    let gone = std::fs::symlink_metadata(root.join("snapshots/2/fs/etc/gone")).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(
        &gone.file_type()
    ));
    assert_eq!(std::os::unix::fs::MetadataExt::rdev(&gone), 0);

    // A snapshot left active, then a restart: what the backend answers is unchanged.
    let top =
        String::from_utf8(run(&mut s.containerd.snapshots_cmd("verilay", &["ls"])).stdout).unwrap();
    let chain = top
        .lines()
        .filter(|l| l.contains("Committed"))
        .find(|l| l.split_whitespace().count() == 3)
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no committed snapshot with a parent in:\n{top}"))
        .to_string();
    run(&mut s
        .containerd
        .snapshots_cmd("verilay", &["prepare", "kept", &chain]));
    let answers = |s: &Setup| -> Vec<String> {
        [
            "ls",
            "mounts /mnt/x kept",
            "usage kept",
            &format!("usage {chain}"),
            "info kept",
        ]
        .iter()
        .map(|a| {
            let args: Vec<&str> = a.split(' ').collect();
            s.outcome(&s.containerd.snapshots("verilay", &args))
        })
        .collect()
    };
    let before = answers(&s);
    assert!(before.iter().all(|a| a.starts_with("ok")), "{before:?}");
    s.restart_snapshotter();
    // containerd redials the proxy with a backoff of at most 3 s; until then it answers
    // `unavailable`.
    let mut after = Vec::new();
    poll_until(Duration::from_secs(20), || {
        after = answers(&s);
        after == before
    });
    assert_eq!(after, before, "{}", s.logs());
    assert_eq!(ctr_run(&s, "verilay", "again"), plain, "{}", s.logs());
}

/// One snapshotter to a root and to a socket: a second is refused with a one-line error
/// naming what is in use, and the first serves on; SIGTERM stops it, removing its socket.
#[test]
fn a_root_and_a_socket_serve_one_snapshotter() {
    let dir = tempfile::Builder::new()
        .prefix("verilay-snap-")
        .tempdir_in("/tmp")
        .unwrap();
    let (root, socket) = (dir.path().join("root"), dir.path().join("s.sock"));
    let first = Snapshotter::start(&root, &socket, &dir.path().join("log"));
    let second = |root: &Path, socket: &Path| {
        let out = verilay()
            .arg("snapshotter")
            .arg("--root")
            .arg(root)
            .arg("--address")
            .arg(socket)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.lines().count(), 1, "{err}");
        err
    };
    let err = second(&root, &dir.path().join("other.sock"));
    assert!(err.contains("in use by another snapshotter"), "{err}");
    assert!(!dir.path().join("other.sock").exists());
    let err = second(&dir.path().join("root2"), &socket);
    assert!(err.contains("in use"), "{err}");
    assert!(std::os::unix::net::UnixStream::connect(&socket).is_ok());
    first.stop();
}

const PY: &[&str] = &[
    "python3",
    "-c",
    "import json, hashlib; print(json.dumps({'s': sum(range(10)), 'h': hashlib.sha256(b'x').hexdigest()}))",
];

/// A converted image pulled with `ctr-remote image rpull`: no layer blob reaches
/// containerd, every layer is a verilay mount, containers print what they print on
/// containerd's overlayfs snapshotter, only what they touched was fetched, and their
/// writes land in their own snapshots. An image nobody converted is pulled and unpacked
/// as usual; a tampered layer gives EIO, never its bytes.
#[test]
fn a_converted_image_runs_from_verified_lazily_fetched_layers() {
    if remote_prerequisites() {
        return;
    }
    let s = Setup::start_with(&["--insecure"]);
    let reg = Registry::start(false);
    let dirs = three_layers(s.dir.path());
    let layers = converted(s.dir.path(), &reg, "app:v1", &dirs);
    let image = format!("127.0.0.1:{}/app:v1", reg.port);

    let out = s.rpull("verilay", &image);
    assert!(out.status.success(), "{out:?}\n{}", s.logs());
    let content = s.content();
    for l in &layers {
        assert!(
            !content.contains(l.as_str()),
            "layer {l} was fetched:\n{content}\n{}",
            s.logs()
        );
    }
    let mounts = s.layer_mounts();
    assert_eq!(mounts.len(), 3, "{mounts:?}\n{}", s.logs());
    assert_eq!(
        s.log().matches(": served from verilay image ").count(),
        3,
        "{}",
        s.log()
    );

    let script: &[&str] = &["/app/run.sh"];
    let mut ours = Vec::new();
    for (i, args) in [PY, script].iter().enumerate() {
        let (code, out, err) = s.ctr_run("verilay", &image, &format!("v{i}"), args);
        assert_eq!(code, 0, "{args:?}: {err}\n{}", s.logs());
        ours.push(out);
    }
    assert!(
        ours[1].contains("app on base") && !ours[1].contains("gone"),
        "{ours:?}"
    );
    fetched_under_half(mounts.iter().map(|m| stats_json(m)));

    // A container's writes are in its own snapshot's directory, never in a layer.
    let id = format!("w-{}", std::process::id());
    run(s.containerd.ctr().args([
        "run",
        "--snapshotter",
        "verilay",
        &image,
        &id,
        "sh",
        "-c",
        "echo written > /etc/new && rm /etc/os-release",
    ]));
    let snapshots = s.root().join("snapshots");
    let written: Vec<PathBuf> = std::fs::read_dir(&snapshots)
        .unwrap()
        .map(|e| e.unwrap().path().join("fs/etc/new"))
        .filter(|p| p.exists())
        .collect();
    assert_eq!(written.len(), 1, "{written:?}");
    assert_eq!(std::fs::read_to_string(&written[0]).unwrap(), "written\n");
    for m in &mounts {
        assert!(!m.join("etc/new").exists());
    }
    assert_eq!(
        std::fs::read_to_string(
            mounts
                .iter()
                .map(|m| m.join("etc/os-release"))
                .find(|p| p.exists())
                .unwrap()
        )
        .unwrap(),
        "base\n"
    );
    let _ = s.containerd.ctr().args(["task", "rm", "-f", &id]).output();
    let _ = s.containerd.ctr().args(["container", "rm", &id]).status();

    // The same image through containerd's overlayfs snapshotter: the same output.
    run(s.containerd.ctr().args([
        "image",
        "pull",
        "--plain-http",
        "--snapshotter",
        "overlayfs",
        &image,
    ]));
    for (i, args) in [PY, script].iter().enumerate() {
        let (code, out, err) = s.ctr_run("overlayfs", &image, &format!("o{i}"), args);
        assert_eq!((code, &out), (0, &ours[i]), "{args:?}: {err}");
    }

    // An image nobody converted: containerd pulls and unpacks it, and it runs.
    let plain = s.dir.path().join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    let l = layout(&plain, "v1", &dirs[..1]);
    push_layout(&reg, &l, "plain:v1");
    let plain_image = format!("127.0.0.1:{}/plain:v1", reg.port);
    let out = s.rpull("verilay", &plain_image);
    assert!(out.status.success(), "{out:?}\n{}", s.logs());
    assert!(
        s.log().contains("containerd pulls and unpacks it"),
        "{}",
        s.log()
    );
    assert!(s.content().contains(&l.layers[0]));
    let (code, out, err) = s.ctr_run("verilay", &plain_image, "p", &["cat", "/etc/os-release"]);
    assert_eq!((code, out.as_str()), (0, "base\n"), "{err}");
    assert_eq!(s.layer_mounts().len(), 3);

    // A converted layer whose stored image was altered: reading the altered block fails
    // with EIO in the container and on the host, never giving its bytes.
    let bad = s.dir.path().join("bad");
    sh(&format!(
        "set -e; mkdir -p {0}; cp -a {1}/. {0}/; echo other > {0}/etc/marker",
        bad.display(),
        dirs[0].display()
    ));
    let sub = s.dir.path().join("badimg");
    std::fs::create_dir_all(&sub).unwrap();
    let lb = layout(&sub, "v1", &[bad]);
    let j = convert_json(&[
        &format!("oci:{}:v1", lb.dir.display()),
        &reg.docker("bad:v1"),
        "--insecure",
    ]);
    tamper_busybox(&reg, &j);
    let bad_image = format!("127.0.0.1:{}/bad:v1", reg.port);
    let out = s.rpull("verilay", &bad_image);
    assert!(out.status.success(), "{out:?}\n{}", s.logs());
    let (code, out, err) = s.ctr_run(
        "verilay",
        &bad_image,
        "t",
        &[
            "sh",
            "-c",
            "cat /etc/marker && cat /bin/busybox > /dev/null && echo read",
        ],
    );
    // Its own file is read; the altered block is not.
    assert_ne!(code, 0, "{out}{err}");
    assert_eq!(out, "other\n", "{err}");
    let bad_mount = s
        .layer_mounts()
        .into_iter()
        .find(|m| m.join("etc/marker").exists())
        .unwrap();
    let e = std::fs::read(bad_mount.join("bin/busybox")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
}

/// `verilay cache ls --json` of the setup's cache: (digest, in use) of each entry.
fn cached(s: &Setup) -> Vec<(String, bool)> {
    let out = run(verilay()
        .args(["cache", "ls", "--json", "--cache"])
        .arg(s.dir.path().join("cache")));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["digest"].as_str().unwrap().to_string(),
                v["in_use"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// A container keeps reading its remote layers while the snapshotter restarts, and after
/// a restart that finds a layer unmounted (mounted again); a new container of the image
/// starts. Once the image and its containers are gone, containerd's garbage collection
/// removes the snapshots, the snapshotter detaches the layers, and `verilay cache prune`
/// then removes their cached bytes, which it kept while they were in use.
#[test]
fn restarts_keep_containers_reading_and_removal_frees_the_layers() {
    if remote_prerequisites() {
        return;
    }
    let mut s = Setup::start_with(&["--insecure"]);
    let reg = Registry::start(false);
    converted(s.dir.path(), &reg, "app:v1", &image_layers(s.dir.path()));
    let image = format!("127.0.0.1:{}/app:v1", reg.port);
    let out = s.rpull("verilay", &image);
    assert!(out.status.success(), "{out:?}\n{}", s.logs());
    let mounts = s.layer_mounts();
    assert_eq!(mounts.len(), 2, "{}", s.logs());
    let id = format!("long-{}", std::process::id());
    run(s.containerd.ctr().args([
        "run",
        "-d",
        "--snapshotter",
        "verilay",
        &image,
        &id,
        "sh",
        "-c",
        "sleep 600",
    ]));
    let mut execs = 0;
    let mut read = |s: &Setup| -> String {
        execs += 1;
        let out = s
            .containerd
            .ctr()
            .args(["task", "exec", "--exec-id", &format!("e{execs}"), &id])
            .args(lingering(&["cat", "/etc/os-release", "/app/file"]))
            .output()
            .unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    assert_eq!(read(&s), "base\napp\n");
    let answers = |s: &Setup| s.containerd.snapshots("verilay", &["ls"]).status.success();

    // Restarted with the layers mounted: the container reads on, a new one starts.
    s.restart_snapshotter();
    poll_until(Duration::from_secs(20), || answers(&s));
    assert_eq!(read(&s), "base\napp\n", "{}", s.logs());
    let (code, out, err) = s.ctr_run("verilay", &image, "new", &["cat", "/app/file"]);
    assert_eq!((code, out.as_str()), (0, "app\n"), "{err}\n{}", s.logs());

    // Restarted after a layer was detached (its daemon stays for the container that
    // holds it): mounted again, and both the old container and a new one read.
    let s_root = s.root();
    let snap = s.snapshotter.take().unwrap();
    snap.stop();
    run(Command::new("umount").arg("-l").arg(&mounts[1]));
    assert!(!is_mount_point(&mounts[1]));
    let args: Vec<String> = ["--insecure", "--cache"]
        .iter()
        .map(|a| a.to_string())
        .chain([s.dir.path().join("cache").display().to_string()])
        .collect();
    s.snapshotter = Some(Snapshotter::start_with(
        &s_root,
        &s.dir.path().join("snap.sock"),
        &s.dir.path().join("snapshotter.log"),
        &args,
    ));
    // It mounts its layers again in the background, answering meanwhile.
    poll_until(Duration::from_secs(20), || answers(&s));
    poll_until(Duration::from_secs(20), || is_mount_point(&mounts[1]));
    assert!(is_mount_point(&mounts[1]), "{}", s.logs());
    assert_eq!(read(&s), "base\napp\n", "{}", s.logs());
    let (code, out, err) = s.ctr_run("verilay", &image, "new2", &["cat", "/app/file"]);
    assert_eq!((code, out.as_str()), (0, "app\n"), "{err}\n{}", s.logs());

    // In use: the cache keeps every layer's bytes.
    let before = cached(&s);
    assert!(
        before.len() >= 2 && before.iter().all(|(_, used)| *used),
        "{before:?}"
    );
    run(verilay()
        .args(["cache", "prune", "--cache"])
        .arg(s.dir.path().join("cache")));
    assert_eq!(cached(&s), before);

    // Gone from containerd: the layers are detached and their bytes prunable.
    let _ = s
        .containerd
        .ctr()
        .args(["task", "kill", "-s", "KILL", &id])
        .output();
    poll_until(Duration::from_secs(20), || {
        s.containerd
            .ctr()
            .args(["task", "rm", "-f", &id])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    run(s.containerd.ctr().args(["container", "rm", &id]));
    run(s.containerd.ctr().args(["image", "rm", "--sync", &image]));
    poll_until(Duration::from_secs(30), || s.layer_mounts().is_empty());
    assert_eq!(s.layer_mounts(), Vec::<PathBuf>::new(), "{}", s.logs());
    poll_until(Duration::from_secs(10), || {
        cached(&s).iter().all(|(_, u)| !u)
    });
    run(verilay()
        .args(["cache", "prune", "--cache"])
        .arg(s.dir.path().join("cache")));
    assert_eq!(cached(&s), vec![], "{}", s.logs());
}

fn is_mount_point(p: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(p), std::fs::metadata(p.parent().unwrap())) {
        (Ok(a), Ok(b)) => a.dev() != b.dev(),
        _ => false,
    }
}

/// `ImageService.PullImage` of CRI v1 on containerd's socket, as the kubelet pulls:
/// the image's reference as CRI resolved it, or the error.
fn cri_pull(socket: &Path, image: &str) -> Result<String, String> {
    use k8s_cri::v1::image_service_client::ImageServiceClient;
    use k8s_cri::v1::{ImageSpec, PullImageRequest};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let socket = socket.to_path_buf();
    rt.block_on(async move {
        let channel = tonic::transport::Endpoint::try_from("http://[::]:0")
            .unwrap()
            .timeout(Duration::from_secs(120))
            .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                let socket = socket.clone();
                async move {
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                        tokio::net::UnixStream::connect(socket).await?,
                    ))
                }
            }))
            .await
            .map_err(|e| e.to_string())?;
        let reply = ImageServiceClient::new(channel)
            .pull_image(PullImageRequest {
                image: Some(ImageSpec {
                    image: image.to_string(),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .map_err(|e| e.to_string())?;
        Ok(reply.into_inner().image_ref)
    })
}

/// The kubelet's pull: CRI's PullImage on containerd configured with `snapshotter =
/// "verilay"` and `disable_snapshot_annotations = false`. Every layer is served from its
/// verilay image (the labels name the manifest containerd pulled), no layer blob reaches
/// the content store, and a container of the image runs from them.
#[test]
fn a_cri_pull_serves_every_layer_from_its_verilay_image() {
    if remote_prerequisites() {
        return;
    }
    let reg = Registry::start(false);
    let s = Setup::start_cri(&["--insecure"], Some((reg.port, false)));
    let layers = converted(s.dir.path(), &reg, "app:v1", &image_layers(s.dir.path()));
    let image = format!("127.0.0.1:{}/app:v1", reg.port);
    let pulled =
        cri_pull(&s.containerd.socket, &image).unwrap_or_else(|e| panic!("{e}\n{}", s.logs()));
    assert!(pulled.starts_with("sha256:"), "{pulled}");
    let log = s.log();
    assert_eq!(
        log.matches(": served from verilay image ").count(),
        2,
        "{}",
        s.logs()
    );
    // CRI named the manifest it pulled, and that is what was looked up.
    assert!(log.contains("/app:v1@sha256:"), "{log}");
    let k8s = |args: &[&str]| {
        let mut c = s.containerd.ctr();
        c.args(["--namespace", "k8s.io"]).args(args);
        c
    };
    let content = String::from_utf8(run(&mut k8s(&["content", "ls", "-q"])).stdout).unwrap();
    for l in &layers {
        assert!(
            !content.contains(l.as_str()),
            "layer {l} was fetched:\n{content}"
        );
    }
    let cat = ["cat", "/etc/os-release", "/app/file"];
    let (code, out, err) = s.ctr_run_in("k8s.io", "verilay", &image, "cri", &cat);
    assert_eq!((code, out.as_str()), (0, "base\napp\n"), "{err}");
}

/// A registry that wants credentials, given to CRI in containerd's config.toml as users
/// give them: the snapshotter, given that config, finds and mounts the layers with them,
/// and the container reads through them.
#[test]
fn cri_credentials_in_containerds_config_reach_the_layers() {
    if remote_prerequisites() {
        return;
    }
    let reg = Registry::start(true);
    let s = Setup::start_cri(&["--insecure"], Some((reg.port, true)));
    let auth = s.dir.path().join("push-auth.json");
    std::fs::write(
        &auth,
        format!(
            r#"{{"auths":{{"127.0.0.1:{}":{{"auth":"dTpzZWNyZXQ="}}}}}}"#,
            reg.port
        ),
    )
    .unwrap();
    let l = layout(s.dir.path(), "v1", &image_layers(s.dir.path()));
    run(verilay()
        .env("REGISTRY_AUTH_FILE", &auth)
        .args(["convert", "--insecure", "-q"])
        .arg(format!("oci:{}:v1", l.dir.display()))
        .arg(reg.docker("private/app:v1")));
    let image = format!("127.0.0.1:{}/private/app:v1", reg.port);
    cri_pull(&s.containerd.socket, &image).unwrap_or_else(|e| panic!("{e}\n{}", s.logs()));
    assert_eq!(
        s.log().matches(": served from verilay image ").count(),
        2,
        "{}",
        s.logs()
    );
    let cat = ["cat", "/etc/os-release", "/app/file"];
    let (code, out, err) = s.ctr_run_in("k8s.io", "verilay", &image, "auth", &cat);
    assert_eq!((code, out.as_str()), (0, "base\napp\n"), "{err}");
    // The credentials file the snapshotter wrote is root's alone.
    let written = s.root().join("remote/auth.json");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&written).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

/// `--policy` and `--measure-log`, on each engine: what containers run from the remote
/// layers is measured, one list per layer (named by its image digest), which evmctl
/// accepts; the kernel engine's layer mounts are erofs.
#[test]
fn what_containers_run_from_remote_layers_is_measured() {
    if remote_prerequisites() || skip_unless(have("evmctl"), "needs evmctl (scripts/setup)") {
        return;
    }
    let reg = Registry::start(false);
    let t = tempfile::tempdir().unwrap();
    converted(t.path(), &reg, "app:v1", &image_layers(t.path()));
    let image = format!("127.0.0.1:{}/app:v1", reg.port);
    for (engine, fstype) in [("fuse", "fuse.verilay"), ("kernel", "erofs")] {
        let base = t.path().join(engine);
        std::fs::create_dir_all(&base).unwrap();
        let (policy, logs) = (base.join("policy"), base.join("lists"));
        std::fs::write(&policy, "measure func=BPRM_CHECK\n").unwrap();
        let (p, m) = (policy.display().to_string(), logs.display().to_string());
        let s = Setup::start_with(&[
            "--insecure",
            "--policy",
            &p,
            "--measure-log",
            &m,
            "--engine",
            engine,
        ]);
        let out = s.rpull("verilay", &image);
        assert!(out.status.success(), "{out:?}\n{}", s.logs());
        let (code, out, err) = s.ctr_run("verilay", &image, engine, &["sh", "-c", "cat /app/file"]);
        assert_eq!(
            (code, out.as_str()),
            (0, "app\n"),
            "{engine}: {err}\n{}",
            s.logs()
        );
        let layers = s.layer_mounts();
        assert_eq!(layers.len(), 2, "{engine}");
        assert_mount_types(&layers, fstype, engine);
        let mut seen = String::new();
        let lists: Vec<PathBuf> = std::fs::read_dir(&logs)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        assert_eq!(lists.len(), 2, "{engine}: {lists:?}");
        for dir in lists {
            assert!(evmctl_accepts(&dir), "evmctl refuses {}", dir.display());
            seen += &std::fs::read_to_string(dir.join("ascii_runtime_measurements")).unwrap();
        }
        assert!(
            seen.lines()
                .any(|l| l.contains(" ima-ng sha256:") && l.ends_with("/bin/busybox")),
            "{engine}: busybox not measured: {seen}"
        );
    }
}
