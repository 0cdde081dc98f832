//! Container images for the tests: OCI layouts made by hand, podman with storage of its
//! own, and `verilay layer-store` as podman's additional layer store.

use super::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

pub fn prerequisites() -> bool {
    skip_unless(
        have("docker-registry"),
        "needs docker-registry (scripts/setup)",
    ) || skip_unless(have("skopeo"), "needs skopeo (scripts/setup)")
        || skip_unless(have("curl"), "needs curl (scripts/setup)")
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// An OCI image layout made by hand from layer directories (bottom first), each packed as
/// a gzip tarball (whiteouts are files named `.wh.*`, as image builders write them):
/// what `skopeo copy` would write, with known DiffIDs. Returns the layout's manifest
/// digest and the DiffIDs.
pub struct Layout {
    pub dir: PathBuf,
    pub manifest: String,
    pub diff_ids: Vec<String>,
    pub layers: Vec<String>,
}

pub fn layout(base: &Path, tag: &str, layer_dirs: &[PathBuf]) -> Layout {
    let packed: Vec<Packed> = layer_dirs
        .iter()
        .enumerate()
        .map(|(i, l)| pack(base, &format!("layer{i}"), l))
        .collect();
    layout_of(base, tag, &packed)
}

/// A layer directory packed as [`layout`] packs it: its gzip tarball and DiffID. GNU tar
/// records atime and ctime (`--xattrs` writes PAX headers), so one directory packed twice
/// gives two blobs: images meant to share a layer share one `Packed`.
#[derive(Clone)]
pub struct Packed {
    pub gz: Vec<u8>,
    pub diff_id: String,
}

pub fn pack(base: &Path, name: &str, dir: &Path) -> Packed {
    std::fs::create_dir_all(base).unwrap();
    let tar = base.join(format!("{name}.tar"));
    sh(&format!(
        "tar --sort=name --mtime=@1700000000 --owner=0 --group=0 --numeric-owner \
         --xattrs -C '{}' -cf '{}' .",
        dir.display(),
        tar.display()
    ));
    let raw = std::fs::read(&tar).unwrap();
    let diff_id = format!("sha256:{}", sha256_hex(&raw));
    sh(&format!("gzip -n -f '{}'", tar.display()));
    let gz = std::fs::read(base.join(format!("{name}.tar.gz"))).unwrap();
    Packed { gz, diff_id }
}

/// An OCI image layout in `base/layout` of packed layers (bottom first).
pub fn layout_of(base: &Path, tag: &str, packed: &[Packed]) -> Layout {
    let dir = base.join("layout");
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let put = |bytes: &[u8]| -> String {
        let hex = sha256_hex(bytes);
        std::fs::write(blobs.join(&hex), bytes).unwrap();
        format!("sha256:{hex}")
    };
    let diff_ids: Vec<String> = packed.iter().map(|p| p.diff_id.clone()).collect();
    let layers: Vec<(String, usize)> = packed.iter().map(|p| (put(&p.gz), p.gz.len())).collect();
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    });
    let config = serde_json::to_vec(&config).unwrap();
    let config_digest = put(&config);
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": config_digest, "size": config.len()},
        "layers": layers.iter().map(|(d, n)| serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": d, "size": n,
        })).collect::<Vec<_>>(),
    });
    let manifest = serde_json::to_vec(&manifest).unwrap();
    let manifest_digest = put(&manifest);
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest, "size": manifest.len(),
            "annotations": {"org.opencontainers.image.ref.name": tag},
        }],
    });
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
    Layout {
        dir,
        manifest: manifest_digest,
        diff_ids,
        layers: layers.into_iter().map(|(d, _)| d).collect(),
    }
}

pub fn podman_prerequisites() -> bool {
    prerequisites()
        || lacks_test_user()
        || skip_unless(is_root(), "the layer store test runs podman as root")
        || skip_unless(have("podman"), "needs podman (scripts/setup)")
        || skip_unless(have("runc"), "needs runc (scripts/setup)")
        || skip_unless(have("busybox"), "needs busybox-static (scripts/setup)")
}

/// podman with its own storage (graphroot, runroot) and configuration, all under `dir`:
/// runc, the rlimits this machine allows, plain HTTP to the test registry, and, given a
/// store, `additionallayerstores = ["STORE:ref"]`.
pub struct Podman {
    pub dir: PathBuf,
}

impl Podman {
    pub fn new(dir: &Path, port: u16, store: Option<&Path>) -> Podman {
        std::fs::create_dir_all(dir).unwrap();
        let als = store.map_or(String::new(), |s| {
            format!(
                "[storage.options]\nadditionallayerstores = [\"{}:ref\"]\n",
                s.display()
            )
        });
        std::fs::write(
            dir.join("storage.conf"),
            format!(
                "[storage]\ndriver = \"overlay\"\ngraphroot = \"{0}/graph\"\nrunroot = \"{0}/run\"\n{als}",
                dir.display()
            ),
        )
        .unwrap();
        podman_conf(dir, port);
        Podman {
            dir: dir.to_path_buf(),
        }
    }

    pub fn cmd(&self) -> Command {
        let mut c = Command::new("podman");
        c.env("CONTAINERS_STORAGE_CONF", self.dir.join("storage.conf"))
            .env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .env(
                "CONTAINERS_REGISTRIES_CONF",
                self.dir.join("registries.conf"),
            )
            .env("TMPDIR", &self.dir);
        c
    }

    /// `podman run --rm IMAGE ARGS…`: (exit code, stdout, stderr).
    pub fn run(&self, image: &str, args: &[&str]) -> (i32, String, String) {
        podman_run(self.cmd(), &[], image, args)
    }

    /// The image's layers' `diff` in podman's own storage, bottom first.
    pub fn layer_diffs(&self, image: &str) -> Vec<PathBuf> {
        let out = run(self.cmd().args([
            "image",
            "inspect",
            "--format",
            "{{.GraphDriver.Data.LowerDir}}:{{.GraphDriver.Data.UpperDir}}",
            image,
        ]));
        // LowerDir lists the layers below the top one, top first; UpperDir is the top's.
        let text = String::from_utf8_lossy(&out.stdout);
        let mut v: Vec<PathBuf> = text
            .trim()
            .split(':')
            .filter(|s| !s.is_empty() && *s != "<no value>")
            .map(PathBuf::from)
            .collect();
        if let Some(top) = v.pop() {
            v.reverse();
            v.push(top);
        }
        v
    }
}

/// `podman` (the command `podman`, set up by the caller) `run --rm --network=none EXTRA…
/// IMAGE ARGS…`: (exit code, stdout, stderr).
pub fn podman_run(
    mut podman: Command,
    extra: &[&str],
    image: &str,
    args: &[&str],
) -> (i32, String, String) {
    let out = podman
        .args(["run", "--rm", "--network=none"])
        .args(extra)
        .arg(image)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

impl Drop for Podman {
    fn drop(&mut self) {
        let _ = self.cmd().args(["rm", "-a", "-f"]).output();
        let _ = self.cmd().args(["rmi", "-a", "-f"]).output();
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.join("graph/overlay"))
            .status();
    }
}

/// `verilay layer-store STORE` in the foreground until dropped (SIGTERM: it unmounts
/// itself and detaches the layers it mounted).
pub struct Store {
    pub child: std::process::Child,
    pub dir: PathBuf,
    pub state: PathBuf,
}

impl Store {
    pub fn start(base: &Path, extra: &[&str], env: &[(&str, &str)]) -> Store {
        let (dir, state) = (base.join("store"), base.join("state"));
        std::fs::create_dir_all(&dir).unwrap();
        let child = verilay()
            .arg("layer-store")
            .arg(&dir)
            .arg("--state")
            .arg(&state)
            .arg("--cache")
            .arg(base.join("cache"))
            .arg("--insecure")
            .args(extra)
            .envs(env.iter().copied())
            .stderr(std::fs::File::create(base.join("store.log")).unwrap())
            .spawn()
            .unwrap();
        let store = Store { child, dir, state };
        wait_until(Duration::from_secs(20), "the store to mount", || {
            std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap()
                .contains(&format!(" {} ", store.dir.display()))
        });
        store
    }

    /// The layer mounts the store made.
    pub fn layers(&self) -> Vec<PathBuf> {
        layer_mounts(&self.state)
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(self.child.id() as i32).unwrap(),
            rustix::process::Signal::Term,
        );
        let _ = self.child.wait();
        for l in self.layers() {
            let _ = verilay().args(["umount", "--lazy"]).arg(l).status();
        }
    }
}

pub fn layer_mounts(state: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(state.join("layers"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// The test-only containers.conf (this machine refuses crun and podman's default
/// rlimits) and a registries.conf letting podman reach the test registry over HTTP.
pub fn podman_conf(dir: &Path, port: u16) {
    std::fs::write(
        dir.join("containers.conf"),
        "[containers]\ndefault_ulimits = [\"nofile=1024:1024\", \"nproc=1024:1024\"]\n\
         netns = \"none\"\n[engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\n\
         events_logger = \"file\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("registries.conf"),
        format!("[[registry]]\nlocation = \"127.0.0.1:{port}\"\ninsecure = true\n"),
    )
    .unwrap();
}

pub fn convert_json(args: &[&str]) -> serde_json::Value {
    let out = run(verilay().arg("convert").args(args).arg("--json"));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Three layers: busybox as the base (with a file the top layer deletes), a Python
/// installation (this machine's interpreter, its libraries and standard library, and
/// 25 MB of data no program reads, as images carry), and an app layer with a script.
pub fn three_layers(base: &Path) -> Vec<PathBuf> {
    let (l0, l1, l2) = (base.join("base"), base.join("python"), base.join("app"));
    sh(&format!(
        "set -e; mkdir -p {0}/bin {0}/etc {0}/tmp; cp \"$(command -v busybox)\" {0}/bin/busybox; \
         for c in sh cat echo ls head wc true rm mkdir sha256sum; do ln -s busybox {0}/bin/$c; done; \
         echo base > {0}/etc/os-release; echo gone > {0}/etc/gone; chmod 1777 {0}/tmp; \
         mkdir -p {1}/usr/bin {1}/lib/x86_64-linux-gnu {1}/lib64 {1}/usr/lib; \
         cp /usr/bin/python3.11 {1}/usr/bin/python3; \
         for l in $(ldd /usr/bin/python3.11 | grep -o '/[^ ]*'); do cp -L \"$l\" {1}$l; done; \
         tar -C /usr/lib --exclude=test --exclude=tests --exclude=dist-packages \
             --exclude=__pycache__ --exclude=idlelib --exclude=tkinter --exclude=ensurepip \
             --exclude=lib2to3 --exclude=pydoc_data --exclude=config-3.11-x86_64-linux-gnu \
             -cf - python3.11 | tar -C {1}/usr/lib -xf -; \
         mkdir -p {1}/usr/share/data; head -c 25000000 /dev/urandom > {1}/usr/share/data/unread; \
         mkdir -p {2}/app {2}/etc; : > {2}/etc/.wh.gone; \
         printf '#!/bin/sh\\necho \"app on $(cat /etc/os-release)\"; ls /etc\\n' > {2}/app/run.sh; \
         chmod 755 {2}/app/run.sh",
        l0.display(),
        l1.display(),
        l2.display()
    ));
    vec![l0, l1, l2]
}

pub fn stats_json(mnt: &Path) -> serde_json::Value {
    let out = run(verilay().arg("stats").arg("--json").arg(mnt));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The layer mounts' `verilay stats` say less than half of their images was fetched.
pub fn fetched_under_half(stats: impl Iterator<Item = serde_json::Value>) {
    let (mut fetched, mut size) = (0u64, 0u64);
    for s in stats {
        fetched += s["remote_bytes_fetched"]
            .as_u64()
            .unwrap_or_else(|| panic!("{s}"));
        size += s["remote_image_bytes"]
            .as_u64()
            .unwrap_or_else(|| panic!("{s}"));
    }
    assert!(fetched * 2 < size, "fetched {fetched} of {size} bytes");
}

/// Flips one byte of `/bin/busybox`'s data (in its 101st block) in the stored verilay image
/// of the first layer of the conversion `convert --json` reported as `converted`.
pub fn tamper_busybox(reg: &super::registry::Registry, converted: &serde_json::Value) {
    let blob = reg.blob_file(
        converted["manifests"][0]["layers"][0]["image_blob"]
            .as_str()
            .unwrap(),
    );
    let inspect = run(verilay()
        .arg("inspect")
        .arg("--json")
        .arg(&blob)
        .arg("/bin/busybox"));
    let info: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    let at = info["layout"]["start_block"].as_u64().unwrap() * 4096 + 100 * 4096 + 7;
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[at as usize] ^= 0x40;
    std::fs::write(&blob, bytes).unwrap();
}

/// `skopeo copy` of layout `l` (tag v1) to `name` (`REPO:TAG`) in `reg`, as it is.
pub fn push_layout(reg: &super::registry::Registry, l: &Layout, name: &str) {
    run(std::process::Command::new("skopeo").args([
        "copy",
        "--dest-tls-verify=false",
        &format!("oci:{}:v1", l.dir.display()),
        &reg.docker(name),
    ]));
}

/// Each of `mounts` is a mount of type `fstype` (`what` names the case in failures).
pub fn assert_mount_types(mounts: &[PathBuf], fstype: &str, what: &str) {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    for m in mounts {
        let at = format!(" {} ", m.display());
        let line = table
            .lines()
            .find(|l| l.contains(&at))
            .unwrap_or_else(|| panic!("{what}: {} is not a mount", m.display()));
        assert!(line.contains(&format!(" - {fstype} ")), "{what}: {line}");
    }
}
