//! containerd for the tests: a containerd of the test's own (own root, state and sockets;
//! CRI off, or on with `verilay` as its snapshotter) and `verilay snapshotter` as its
//! proxy snapshotter, killed with their shims and mounts on every path; converted images.

use super::containers::{convert_json, layout, prerequisites};
use super::registry::Registry;
use super::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

pub fn containerd_prerequisites() -> bool {
    skip_unless(is_root(), "containerd runs containers as root")
        || skip_unless(have("containerd"), "needs containerd (scripts/setup)")
        || skip_unless(have("ctr"), "needs ctr (containerd, scripts/setup)")
        || skip_unless(have("runc"), "needs runc (scripts/setup)")
}

/// A child process killed (and reaped) when dropped.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `verilay snapshotter --root ROOT --address SOCKET ARGS…`, once its socket answers.
pub struct Snapshotter {
    pub child: Killed,
    pub root: PathBuf,
    pub socket: PathBuf,
    pub args: Vec<String>,
}

/// Each chunk a read touches, fetched alone (not runs ahead of a sequential reader), so
/// the bytes fetched are the bytes the containers touched.
pub const FETCH_EXACT: (&str, &str) = ("VERILAY_FETCH_EXACT", "1");

impl Snapshotter {
    pub fn start(root: &Path, socket: &Path, log: &Path) -> Snapshotter {
        Snapshotter::start_with(root, socket, log, &[])
    }

    pub fn start_with(root: &Path, socket: &Path, log: &Path, args: &[String]) -> Snapshotter {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let child = verilay()
            .arg("snapshotter")
            .arg("--root")
            .arg(root)
            .arg("--address")
            .arg(socket)
            .args(args)
            .env(FETCH_EXACT.0, FETCH_EXACT.1)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut s = Snapshotter {
            child: Killed(child),
            root: root.to_path_buf(),
            socket: socket.to_path_buf(),
            args: args.to_vec(),
        };
        wait_until(Duration::from_secs(20), "the snapshotter's socket", || {
            assert!(
                s.child.0.try_wait().unwrap().is_none(),
                "the snapshotter exited"
            );
            std::os::unix::net::UnixStream::connect(socket).is_ok()
        });
        s
    }

    /// SIGTERM, and its exit (status 0, the socket removed) within 10 s.
    pub fn stop(mut self) {
        let pid = rustix::process::Pid::from_child(&self.child.0);
        rustix::process::kill_process(pid, rustix::process::Signal::Term).unwrap();
        let mut status = None;
        wait_until(Duration::from_secs(10), "the snapshotter to exit", || {
            status = self.child.0.try_wait().unwrap();
            status.is_some()
        });
        assert!(status.unwrap().success(), "{status:?}");
        assert!(!self.socket.exists(), "the socket is removed on exit");
    }
}

/// A containerd of the test's own, with `verilay` as a proxy snapshotter on `snap_socket`.
pub struct Containerd {
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub child: Option<Killed>,
}

impl Containerd {
    /// Writes `DIR/config.toml`. With `cri`, CRI is on, pulling for the kubelet with
    /// `verilay` and the layers' labels (`disable_snapshot_annotations = false`), from the
    /// registry on that port over plain HTTP, as user `u` when `cri.1` says so (the test
    /// registry's credentials). Without, it is off (these tests then talk through ctr).
    pub fn configure(dir: &Path, snap_socket: &Path, cri: Option<(u16, bool)>) -> PathBuf {
        let socket = dir.join("c.sock");
        let config = dir.join("config.toml");
        let auth = |port: u16| {
            format!(
                "[plugins.\"io.containerd.grpc.v1.cri\".registry.configs.\"127.0.0.1:{port}\".auth]\n\
                 username = \"u\"\n  password = \"secret\"\n"
            )
        };
        let cri = match cri {
            None => "disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n".to_string(),
            Some((port, with_auth)) => format!(
                "[plugins.\"io.containerd.grpc.v1.cri\"]\n\
                 [plugins.\"io.containerd.grpc.v1.cri\".containerd]\n\
                 snapshotter = \"verilay\"\n\
                 disable_snapshot_annotations = false\n\
                 [plugins.\"io.containerd.grpc.v1.cri\".cni]\n\
                 bin_dir = \"{0}/cni/bin\"\n  conf_dir = \"{0}/cni/conf\"\n\
                 [plugins.\"io.containerd.grpc.v1.cri\".registry.mirrors.\"127.0.0.1:{port}\"]\n\
                 endpoint = [\"http://127.0.0.1:{port}\"]\n{1}",
                dir.display(),
                if with_auth { auth(port) } else { String::new() }
            ),
        };
        std::fs::write(
            &config,
            format!(
                "version = 2\nroot = \"{0}/root\"\nstate = \"{0}/state\"\n\
                 [grpc]\n  address = \"{1}\"\n[ttrpc]\n  address = \"{1}.ttrpc\"\n\
                 [proxy_plugins.verilay]\n  type = \"snapshot\"\n  address = \"{2}\"\n{cri}",
                dir.display(),
                socket.display(),
                snap_socket.display()
            ),
        )
        .unwrap();
        config
    }

    /// containerd on the config [`Containerd::configure`] wrote in `dir`.
    pub fn start_with(dir: &Path) -> Containerd {
        let socket = dir.join("c.sock");
        let config = dir.join("config.toml");
        let log = std::fs::File::create(dir.join("containerd.log")).unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut c = Containerd {
            dir: dir.to_path_buf(),
            socket,
            child: Some(Killed(child)),
        };
        wait_until(Duration::from_secs(30), "containerd to answer", || {
            let child = &mut c.child.as_mut().unwrap().0;
            assert!(child.try_wait().unwrap().is_none(), "containerd exited");
            c.ctr()
                .arg("version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
        c
    }

    pub fn ctr(&self) -> Command {
        let mut c = Command::new("timeout");
        c.arg("120").arg("ctr").arg("--address").arg(&self.socket);
        c
    }

    /// `ctr snapshots --snapshotter NAME ARGS…`.
    pub fn snapshots_cmd(&self, snapshotter: &str, args: &[&str]) -> Command {
        let mut c = self.ctr();
        c.args(["snapshots", "--snapshotter", snapshotter])
            .args(args);
        c
    }

    /// What `ctr snapshots --snapshotter NAME ARGS…` gave, failed or not.
    pub fn snapshots(&self, snapshotter: &str, args: &[&str]) -> Output {
        self.snapshots_cmd(snapshotter, args).output().unwrap()
    }

    /// The snapshotter root of containerd's overlayfs snapshotter.
    pub fn overlayfs_root(&self) -> PathBuf {
        self.dir.join("root/io.containerd.snapshotter.v1.overlayfs")
    }
}

impl Drop for Containerd {
    /// containerd, then the shims it started (they outlive it), then whatever is still
    /// mounted under its directories (a container's rootfs, a snapshot mounted by a test).
    fn drop(&mut self) {
        drop(self.child.take());
        let socket = self.socket.as_os_str().as_encoded_bytes().to_vec();
        for pid in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = pid.file_name().to_str().and_then(|p| p.parse::<i32>().ok()) else {
                continue;
            };
            let argv = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let shim = argv.starts_with(b"/usr/bin/containerd-shim")
                || argv.starts_with(b"containerd-shim");
            if shim && argv.windows(socket.len()).any(|w| w == socket.as_slice()) {
                if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::Kill);
                }
            }
        }
        let dir = self.dir.as_os_str().as_encoded_bytes().to_vec();
        let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
            .filter(|m| m.as_bytes().starts_with(&dir))
            .collect();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in mounts {
            let _ = Command::new("umount").arg("-l").arg(&m).status();
        }
    }
}

/// A containerd and a `verilay snapshotter` in a fresh directory under /tmp (socket paths
/// must stay under 108 bytes).
pub struct Setup {
    pub snapshotter: Option<Snapshotter>,
    pub containerd: Containerd,
    pub dir: tempfile::TempDir,
}

impl Setup {
    pub fn start() -> Setup {
        Setup::start_with(&[])
    }

    /// With `snapshotter_args` for the snapshotter, `--cache` (a directory of the test's)
    /// among them.
    pub fn start_with(snapshotter_args: &[&str]) -> Setup {
        Setup::start_cri(snapshotter_args, None)
    }

    /// With CRI on (`Containerd::configure`); with credentials in its config, the
    /// snapshotter is given that config (`--containerd-config`).
    pub fn start_cri(snapshotter_args: &[&str], cri: Option<(u16, bool)>) -> Setup {
        let dir = tempfile::Builder::new()
            .prefix("verilay-ctd-")
            .tempdir_in("/tmp")
            .unwrap();
        let root = dir.path().join("snapshotter");
        let socket = dir.path().join("snap.sock");
        let mut args: Vec<String> = snapshotter_args.iter().map(|a| a.to_string()).collect();
        args.extend([
            "--cache".into(),
            dir.path().join("cache").display().to_string(),
        ]);
        let config = Containerd::configure(dir.path(), &socket, cri);
        if cri.is_some_and(|(_, auth)| auth) {
            args.extend(["--containerd-config".into(), config.display().to_string()]);
        }
        let snapshotter =
            Snapshotter::start_with(&root, &socket, &dir.path().join("snapshotter.log"), &args);
        let containerd = Containerd::start_with(dir.path());
        Setup {
            snapshotter: Some(snapshotter),
            containerd,
            dir,
        }
    }

    pub fn restart_snapshotter(&mut self) {
        let s = self.snapshotter.take().unwrap();
        let (root, socket, args) = (s.root.clone(), s.socket.clone(), s.args.clone());
        s.stop();
        self.snapshotter = Some(Snapshotter::start_with(
            &root,
            &socket,
            &self.dir.path().join("snapshotter.log"),
            &args,
        ));
    }

    /// Both snapshotters' roots made one word, and times made one word, so outputs of the
    /// same request to each compare equal.
    pub fn normalize(&self, out: &str) -> String {
        let root = std::fs::canonicalize(&self.snapshotter.as_ref().unwrap().root).unwrap();
        let times = regex::Regex::new(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z").unwrap();
        let out = out
            .replace(
                &self.containerd.overlayfs_root().display().to_string(),
                "ROOT",
            )
            .replace(&root.display().to_string(), "ROOT");
        times.replace_all(&out, "TIME").into_owned()
    }

    /// What `ctr snapshots …` gave, as compared: success and stdout, or failure and the
    /// error's class (the words after its last colon: `not found`, `invalid argument`…).
    pub fn outcome(&self, out: &Output) -> String {
        if out.status.success() {
            format!(
                "ok: {}",
                self.normalize(&String::from_utf8_lossy(&out.stdout))
            )
        } else {
            let err = String::from_utf8_lossy(&out.stderr);
            let class = err
                .trim()
                .rsplit(": ")
                .next()
                .unwrap_or_default()
                .to_string();
            format!("error: {class}")
        }
    }

    /// Debugging help for a failed assertion: both logs.
    pub fn logs(&self) -> String {
        let read = |f: &str| std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default();
        format!(
            "snapshotter log:\n{}\ncontainerd log (tail):\n{}",
            read("snapshotter.log"),
            read("containerd.log")
                .lines()
                .rev()
                .take(30)
                .collect::<Vec<_>>()
                .join("\n")
        )
    }
}

/// Two layers: busybox with a few files, and one that adds a file and deletes one.
pub fn image_layers(base: &Path) -> Vec<PathBuf> {
    let (l0, l1) = (base.join("base"), base.join("top"));
    sh(&format!(
        "set -e; mkdir -p {0}/bin {0}/etc {0}/tmp; cp \"$(command -v busybox)\" {0}/bin/busybox; \
         for c in sh cat echo ls rm; do ln -s busybox {0}/bin/$c; done; \
         echo base > {0}/etc/os-release; echo gone > {0}/etc/gone; chmod 1777 {0}/tmp; \
         mkdir -p {1}/etc {1}/app; echo app > {1}/app/file; : > {1}/etc/.wh.gone",
        l0.display(),
        l1.display()
    ));
    vec![l0, l1]
}

/// `args` run by the image's sh, which stays a second after they end and exits with their
/// status: ctr can lose the output of a process (a container's or an exec's) that exits as
/// soon as it has printed (containerd's IO copy races the exit; seen once under the
/// suite's load). `sleep` is busybox's own applet, which its sh runs without a link.
pub fn lingering(args: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = ["sh", "-c", "\"$@\"; s=$?; sleep 1; exit $s", "sh"]
        .map(String::from)
        .to_vec();
    v.extend(args.iter().map(|a| a.to_string()));
    v
}

pub fn remote_prerequisites() -> bool {
    containerd_prerequisites()
        || prerequisites()
        || skip_unless(have("busybox"), "needs busybox-static (scripts/setup)")
        || skip_unless(
            have("ctr-remote"),
            "needs ctr-remote (stargz-snapshotter, scripts/setup)",
        )
}

impl Setup {
    /// `ctr-remote image rpull`: a pull that passes the layers' labels.
    pub fn rpull(&self, snapshotter: &str, image: &str) -> Output {
        self.rpull_in("default", snapshotter, image)
    }

    /// `ctr-remote image rpull` into containerd namespace `ns`.
    pub fn rpull_in(&self, ns: &str, snapshotter: &str, image: &str) -> Output {
        let mut c = Command::new("timeout");
        c.arg("120")
            .arg("ctr-remote")
            .arg("--address")
            .arg(&self.containerd.socket)
            .args(["--namespace", ns])
            .args([
                "image",
                "rpull",
                "--plain-http",
                "--snapshotter",
                snapshotter,
                image,
            ]);
        c.output().unwrap()
    }

    /// `ctr run --rm --snapshotter SN IMAGE ID ARGS…`: (exit code, stdout, stderr).
    pub fn ctr_run(&self, sn: &str, image: &str, id: &str, args: &[&str]) -> (i32, String, String) {
        self.ctr_run_in("default", sn, image, id, args)
    }

    /// [`Setup::ctr_run`] in containerd namespace `ns` (CRI's is `k8s.io`).
    pub fn ctr_run_in(
        &self,
        ns: &str,
        sn: &str,
        image: &str,
        id: &str,
        args: &[&str],
    ) -> (i32, String, String) {
        let out = self
            .containerd
            .ctr()
            .args(["--namespace", ns, "run", "--rm", "--snapshotter", sn, image])
            .arg(format!("{id}-{}", std::process::id()))
            .args(lingering(args))
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    pub fn root(&self) -> PathBuf {
        std::fs::canonicalize(&self.snapshotter.as_ref().unwrap().root).unwrap()
    }

    /// The remote layers' mountpoints.
    pub fn layer_mounts(&self) -> Vec<PathBuf> {
        let dir = self.root().join("remote/layers");
        let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
            .map(|d| d.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default();
        v.sort();
        v
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("snapshotter.log")).unwrap_or_default()
    }

    /// The digests in containerd's content store.
    pub fn content(&self) -> String {
        String::from_utf8(run(self.containerd.ctr().args(["content", "ls", "-q"])).stdout).unwrap()
    }
}

/// Pushes `dirs` as image `name` (`REPO:TAG`) and converts it in place: the tag then names
/// the bound manifest. Returns the layer blobs' digests.
pub fn converted(base: &Path, reg: &Registry, name: &str, dirs: &[PathBuf]) -> Vec<String> {
    let sub = base.join(name.replace([':', '/'], "-"));
    std::fs::create_dir_all(&sub).unwrap();
    let l = layout(&sub, "v1", dirs);
    let src = format!("oci:{}:v1", l.dir.display());
    convert_json(&[&src, &reg.docker(name), "--insecure"]);
    l.layers
}
