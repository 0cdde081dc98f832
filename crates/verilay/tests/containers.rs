//! Container images and verilay: `verilay convert` of OCI layouts and registry images into
//! verilay images stored next to them (a registry on 127.0.0.1, Debian's docker-registry,
//! with skopeo and the registry's own HTTP API as the independent readers).

mod common;

use common::containers::*;
use common::registry::Registry;
use common::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Two layers: a base, and an app layer that deletes a file and makes a directory opaque.
fn two_layers(base: &Path) -> (Vec<PathBuf>, PathBuf) {
    let (l0, l1, want) = (base.join("l0"), base.join("l1"), base.join("want"));
    sh(&format!(
        "set -e; mkdir -p {0}/etc {0}/usr/lib {0}/keep {0}/opq/old; \
         echo base > {0}/etc/os-release; head -c 300000 /dev/urandom > {0}/usr/lib/blob; \
         echo gone > {0}/etc/gone; echo old > {0}/opq/old/f; echo k > {0}/keep/k; \
         ln -s ../etc/os-release {0}/usr/lib/link; \
         mkdir -p {1}/etc {1}/opq {1}/app; : > {1}/etc/.wh.gone; : > {1}/opq/.wh..wh..opq; \
         echo new > {1}/opq/new; printf '#!/bin/sh\\necho run\\n' > {1}/app/run.sh; \
         chmod 755 {1}/app/run.sh; \
         mkdir -p {2}; cp -a {0}/. {2}/; rm {2}/etc/gone; rm -r {2}/opq; \
         mkdir -p {2}/opq {2}/app; cp -a {1}/opq/new {2}/opq/; cp -a {1}/app/run.sh {2}/app/",
        l0.display(),
        l1.display(),
        want.display()
    ));
    (vec![l0, l1], want)
}

fn curl(url: &str, out: &Path) {
    sh(&format!(
        "curl -sf -H 'Accept: application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json' -o '{}' '{url}'",
        out.display()
    ));
}

/// `two_layers` in an OCI layout tagged v1: (the layout, the merged tree they make).
fn two_layer_layout(base: &Path) -> (Layout, PathBuf) {
    let (dirs, want) = two_layers(base);
    (layout(base, "v1", &dirs), want)
}

/// A temporary directory and a registry, for a test that `lacks` (its prerequisites)
/// does not skip; None where it does.
fn with_registry(lacks: fn() -> bool) -> Option<(tempfile::TempDir, Registry)> {
    if lacks() {
        return None;
    }
    Some((tempfile::tempdir().unwrap(), Registry::start(false)))
}

/// Every one of podman's three layer `diffs` is a link into the layer store at `store`.
fn assert_links_into(diffs: &[PathBuf], store: &Path) {
    assert_eq!(diffs.len(), 3, "{diffs:?}");
    for d in diffs {
        let target = std::fs::read_link(d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        assert!(
            target.starts_with(store),
            "{} -> {}",
            d.display(),
            target.display()
        );
    }
}

#[test]
fn convert_stores_each_layer_as_a_verilay_image_the_original_manifest_leads_to() {
    let Some((t, reg)) = with_registry(prerequisites) else {
        return;
    };
    let (l, want) = two_layer_layout(t.path());
    let src = format!("oci:{}:v1", l.dir.display());
    let j = convert_json(&[&src, &reg.docker("app"), "--insecure"]);
    let m = &j["manifests"][0];
    assert_eq!(m["manifest"].as_str(), Some(l.manifest.as_str()), "{j}");
    assert!(
        m["recorded"].as_str().unwrap().starts_with("tag sha256-"),
        "{j}"
    );

    // The tag names the bound manifest, an ordinary image to skopeo: the original's layers.
    let pinned = j["pinned"].as_str().unwrap();
    assert_eq!(m["bound"].as_str(), Some(pinned), "{j}");
    let inspect =
        run(Command::new("skopeo").args(["inspect", "--tls-verify=false", &reg.docker("app:v1")]));
    let seen: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    assert_eq!(seen["Digest"].as_str(), Some(pinned));
    let seen_layers: Vec<&str> = seen["Layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(seen_layers, l.layers);
    // The original is there by its own digest.
    let inspect = run(Command::new("skopeo").args([
        "inspect",
        "--tls-verify=false",
        &reg.docker(&format!("app@{}", l.manifest)),
    ]));
    let seen: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    assert_eq!(seen["Digest"].as_str(), Some(l.manifest.as_str()));
    // The bound manifest names each layer's image; it was made from the original.
    let bound = t.path().join("bound.json");
    curl(
        &format!("http://127.0.0.1:{}/v2/app/manifests/{pinned}", reg.port),
        &bound,
    );
    let bound: serde_json::Value = serde_json::from_slice(&std::fs::read(&bound).unwrap()).unwrap();
    assert_eq!(
        bound["annotations"]["dev.verilay.converted-from"].as_str(),
        Some(l.manifest.as_str())
    );
    for (i, layer) in bound["layers"].as_array().unwrap().iter().enumerate() {
        let want = &m["layers"][i];
        assert_eq!(layer["digest"], want["digest"]);
        assert_eq!(
            layer["annotations"]["dev.verilay.image.digest"],
            want["image_digest"]
        );
        assert_eq!(
            layer["annotations"]["dev.verilay.image.blob"],
            want["image_blob"]
        );
    }

    // The referrers tag schema's index, read with plain HTTP, leads to the conversion.
    let base = format!("http://127.0.0.1:{}/v2/app", reg.port);
    let idx = t.path().join("referrers.json");
    curl(
        &format!("{base}/manifests/{}", l.manifest.replacen(':', "-", 1)),
        &idx,
    );
    let idx: serde_json::Value = serde_json::from_slice(&std::fs::read(&idx).unwrap()).unwrap();
    let refs = idx["manifests"].as_array().unwrap();
    assert_eq!(refs.len(), 1, "{idx}");
    assert_eq!(
        refs[0]["artifactType"].as_str(),
        Some("application/vnd.verilay.layers.v1")
    );
    assert_eq!(refs[0]["digest"], m["conversion"]);
    let conv = t.path().join("conversion.json");
    curl(
        &format!("{base}/manifests/{}", m["conversion"].as_str().unwrap()),
        &conv,
    );
    let conv: serde_json::Value = serde_json::from_slice(&std::fs::read(&conv).unwrap()).unwrap();
    assert_eq!(
        conv["subject"]["digest"].as_str(),
        Some(l.manifest.as_str())
    );

    // Each layer: its DiffID as the config says, and an image that verifies against the
    // digest recorded for it, which `fsverity digest` of its EROFS part gives too.
    let mut images = Vec::new();
    for (i, layer) in conv["layers"].as_array().unwrap().iter().enumerate() {
        let notes = &layer["annotations"];
        assert_eq!(
            notes["dev.verilay.source.digest"].as_str(),
            Some(l.layers[i].as_str())
        );
        assert_eq!(
            notes["dev.verilay.source.diff-id"].as_str(),
            Some(l.diff_ids[i].as_str())
        );
        let img = t.path().join(format!("layer{i}.img"));
        curl(
            &format!("{base}/blobs/{}", layer["digest"].as_str().unwrap()),
            &img,
        );
        let digest = notes["dev.verilay.image.digest"].as_str().unwrap();
        run(verilay()
            .args(["verify", "--quiet", "--digest", digest])
            .arg(&img));
        images.push((img, digest.to_string()));
    }
    assert_eq!(images.len(), 2);

    // Stacked, top first, the layer images are the image's root filesystem: whiteouts
    // delete, the opaque directory hides what was below.
    if is_root() {
        let mnt = t.path().join("m");
        std::fs::create_dir_all(&mnt).unwrap();
        let mut cmd = verilay();
        cmd.arg("mount");
        for (img, d) in images.iter().rev() {
            cmd.arg("--digest").arg(d);
            let _ = img;
        }
        for (img, _) in images.iter().rev() {
            cmd.arg(img);
        }
        run(cmd.arg(&mnt));
        let _m = Unmount::fuse(&mnt);
        assert_diff_clean(&want, &mnt);
    }

    // Reproducible: the same image converted again (from the registry this time, by its
    // digest, into another repository) gives the same images, the same conversion and
    // the same bound manifest, tagged `latest` there.
    let again = convert_json(&[
        &reg.docker(&format!("app@{}", l.manifest)),
        &reg.docker("copy"),
        "--insecure",
    ]);
    assert_eq!(
        again["manifests"][0]["conversion"], m["conversion"],
        "{again}"
    );
    assert_eq!(again["pinned"], j["pinned"]);
    assert!(again["pinned_reference"]
        .as_str()
        .unwrap()
        .ends_with(&format!("/copy:latest@{pinned}")));
    // Converting a tag into its own repository moves no tag the user did not name.
    let same = convert_json(&[
        &reg.docker("copy:latest"),
        &reg.docker("copy"),
        "--insecure",
    ]);
    assert!(
        same["pinned_reference"]
            .as_str()
            .unwrap()
            .contains("/copy:latest-verilay@"),
        "{same}"
    );
    let layers = |v: &serde_json::Value| -> BTreeMap<String, String> {
        v["manifests"][0]["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                (
                    l["digest"].as_str().unwrap().to_string(),
                    l["image_digest"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    assert_eq!(layers(&again), layers(&j));
}

#[test]
fn convert_refuses_what_is_not_there_or_not_what_it_claims() {
    let Some((t, reg)) = with_registry(prerequisites) else {
        return;
    };
    let (l, _) = two_layer_layout(t.path());
    let fails = |args: &[&str], needles: &[&str]| {
        let out = verilay()
            .arg("convert")
            .args(args)
            .arg("--insecure")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        // One error line, the last (a layer converted before it says so above it).
        let errors: Vec<&str> = err.lines().filter(|l| l.contains("error")).collect();
        assert_eq!(errors.len(), 1, "{args:?}: {err}");
        assert!(err.trim_end().ends_with(errors[0]), "{args:?}: {err}");
        for n in needles {
            assert!(err.contains(n), "{args:?}: {err} lacks {n:?}");
        }
    };
    let dest = reg.docker("app");
    fails(&[&reg.docker("nothing:1"), &dest], &["nothing"]);
    fails(
        &[&format!("oci:{}:v2", l.dir.display()), &dest],
        &["no manifest named \"v2\""],
    );
    fails(
        &[&format!("oci:{}", t.path().display()), &dest],
        &["oci-layout"],
    );
    fails(&["docker.io/library/busybox", &dest], &["docker://"]);
    // A layer blob whose bytes are not what the manifest lists: named, and nothing of the
    // conversion stored.
    let blob = l
        .dir
        .join("blobs/sha256")
        .join(l.layers[1].strip_prefix("sha256:").unwrap());
    let mut bytes = std::fs::read(&blob).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 1;
    std::fs::write(&blob, bytes).unwrap();
    fails(
        &[&format!("oci:{}:v1", l.dir.display()), &dest],
        &["layer 2/2", l.layers[1].as_str(), "hashes to"],
    );
    let referrers = format!(
        "http://127.0.0.1:{}/v2/app/manifests/{}",
        reg.port,
        l.manifest.replacen(':', "-", 1)
    );
    let status = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", &referrers])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&status.stdout), "404");
}

// --- The layer store: podman pulls and runs converted images through `verilay layer-store`.

#[test]
fn podman_runs_converted_images_from_verified_lazily_fetched_layers() {
    let Some((t, reg)) = with_registry(podman_prerequisites) else {
        return;
    };
    let l = layout(t.path(), "v1", &three_layers(t.path()));
    let src = format!("oci:{}:v1", l.dir.display());
    run(verilay().args(["convert", &src, &reg.docker("app:v1"), "--insecure", "-q"]));
    let image = reg.reference("app:v1").replacen("oci://", "", 1);
    // Each chunk a read touches, fetched alone (not runs ahead of a sequential reader), so
    // the bytes fetched are the bytes the containers touched.
    let store = Store::start(t.path(), &[], &[("VERILAY_FETCH_EXACT", "1")]);
    let lazy = Podman::new(&t.path().join("lazy"), reg.port, Some(&store.dir));
    let plain = Podman::new(&t.path().join("plain"), reg.port, None);
    run(lazy.cmd().args(["pull", "-q", &image]));
    run(plain.cmd().args(["pull", "-q", &image]));

    // No layer was unpacked: each of podman's layers is the store's, by a link.
    let diffs = lazy.layer_diffs(&image);
    assert_links_into(&diffs, &store.dir);
    let plain_diffs = plain.layer_diffs(&image);
    assert!(
        plain_diffs.len() == 3 && plain_diffs.iter().all(|d| d.is_dir() && !d.is_symlink()),
        "{plain_diffs:?}"
    );

    // The same programs print the same through both.
    let py = ["python3", "-c", "import json, hashlib; print(json.dumps({'s': sum(range(10)), 'h': hashlib.sha256(b'x').hexdigest()}))"];
    let script = ["/app/run.sh"];
    for args in [&py[..], &script[..]] {
        let (code, out, err) = lazy.run(&image, args);
        assert_eq!(code, 0, "{args:?}: {err}");
        assert_eq!(
            plain.run(&image, args),
            (0, out.clone(), String::new()),
            "{args:?}"
        );
        assert!(!out.is_empty());
    }
    let (_, out, _) = lazy.run(&image, &script);
    assert!(
        out.contains("app on base") && !out.contains("gone"),
        "{out}"
    );
    // A container user other than root reads and runs from the layers too (overlayfs
    // reaches them as root, who mounted it; the store and its mounts are root's alone).
    let out = run(lazy.cmd().args([
        "run",
        "--rm",
        "--network=none",
        "--user",
        "1000:1000",
        &image,
        "/app/run.sh",
    ]));
    assert!(String::from_utf8_lossy(&out.stdout).contains("app on base"));
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let listed = as_test_user(t.path(), &format!("ls {}", store.dir.display()));
    let err = String::from_utf8_lossy(&listed.stderr);
    assert!(
        !listed.status.success() && err.contains("Permission denied"),
        "another user lists the store: {err}"
    );

    // Only what the containers touched was fetched: of the Python layer, a small part.
    let layers = store.layers();
    assert_eq!(layers.len(), 3, "{layers:?}");
    fetched_under_half(layers.iter().map(|m| stats_json(m)));

    // A container's writes land in podman's upper directory, never in a layer.
    written_in_upper(|| lazy.cmd(), &image);
    for m in &layers {
        assert!(!m.join("etc/new").exists());
    }
    assert!(layers.iter().any(|m| m.join("etc/os-release").exists()));
}

#[test]
fn the_layer_store_refuses_what_it_does_not_know_and_tampered_layers_give_eio() {
    use base64::Engine as _;
    let Some((t, reg)) = with_registry(podman_prerequisites) else {
        return;
    };
    let dirs = three_layers(t.path());
    let l = layout(t.path(), "v1", &dirs[..1]);
    let src = format!("oci:{}:v1", l.dir.display());
    let j = convert_json(&[&src, &reg.docker("app:v1"), "--insecure"]);
    // An image nobody converted is in the registry too.
    let other = t.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    let l2 = layout(&other, "v1", &dirs[2..]);
    push_layout(&reg, &l2, "plain:v1");

    // Flip one byte of busybox's data in the stored image of the base layer.
    tamper_busybox(&reg, &j);

    let store = Store::start(t.path(), &[], &[]);
    // A second store on the same state directory is refused in one line.
    let second = t.path().join("second");
    std::fs::create_dir(&second).unwrap();
    let out = verilay()
        .arg("layer-store")
        .arg(&second)
        .arg("--state")
        .arg(&store.state)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("in use by another layer store") && err.lines().count() == 1,
        "{err}"
    );
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let image = reg.reference("app:v1").replacen("oci://", "", 1);
    let layer = store.dir.join(b64(&image)).join(&l.layers[0]);
    for f in ["info", "blob", "diff"] {
        assert!(layer.join(f).exists(), "{}", layer.join(f).display());
    }
    let info: serde_json::Value =
        serde_json::from_slice(&std::fs::read(layer.join("info")).unwrap()).unwrap();
    assert_eq!(
        info["compressed-diff-digest"].as_str(),
        Some(l.layers[0].as_str())
    );
    assert_eq!(info["diff-digest"].as_str(), Some(l.diff_ids[0].as_str()));
    assert_eq!(info["compression"].as_u64(), Some(2));
    // The blob is the original layer, checked whole.
    let blob_bytes = std::fs::read(layer.join("blob")).unwrap();
    assert_eq!(format!("sha256:{}", sha256_hex(&blob_bytes)), l.layers[0]);
    // podman's use and release notices get the ENOENT a counting store gives.
    let err = std::fs::File::create(layer.join("use")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOENT), "{err}");
    let err = std::fs::remove_dir(&layer).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOENT), "{err}");

    // A conversion stored in the plain image's repository and listed as its referrer by
    // someone who may push there: a referrer is never trusted for being found, so it
    // converts none of the plain image's layers (the hostile tests forge one whose
    // subject is the plain manifest itself).
    let conv = j["manifests"][0]["conversion"].as_str().unwrap();
    let conv_file = t.path().join("foreign-conversion.json");
    curl(
        &format!("http://127.0.0.1:{}/v2/app/manifests/{conv}", reg.port),
        &conv_file,
    );
    let conv_bytes = std::fs::read_to_string(&conv_file).unwrap();
    const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
    // The registry takes a manifest only with its blobs: mounted from the app repository.
    let conv_json: serde_json::Value = serde_json::from_str(&conv_bytes).unwrap();
    let layers = conv_json["layers"].as_array().unwrap().iter();
    for blob in layers.chain([&conv_json["config"]]) {
        sh(&format!(
            "curl -sf -X POST 'http://127.0.0.1:{}/v2/plain/blobs/uploads/?mount={}&from=app'",
            reg.port,
            blob["digest"].as_str().unwrap()
        ));
    }
    reg.put_manifest(&format!("plain:{conv}"), &conv_bytes, MANIFEST);
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": MANIFEST, "digest": conv, "size": conv_bytes.len(),
                       "artifactType": "application/vnd.verilay.layers.v1"}],
    });
    reg.put_manifest(
        &format!("plain:{}", l2.manifest.replacen(':', "-", 1)),
        &index.to_string(),
        "application/vnd.oci.image.index.v1+json",
    );
    let plain_ref = reg.reference("plain:v1").replacen("oci://", "", 1);
    let foreign = store.dir.join(b64(&plain_ref)).join(&l.layers[0]);
    assert!(!foreign.exists(), "{}", foreign.display());

    // What the store does not know is not there.
    let unknown = [
        store.dir.join("not-base64!"),
        store.dir.join(b64("no registry")),
        store.dir.join(b64(&image)).join("sha256:zz"),
        store.dir.join(b64(&image)).join(&l2.layers[0]),
        store
            .dir
            .join(b64(&reg.reference("nothing:v1").replacen("oci://", "", 1)))
            .join(&l.layers[0]),
        layer.join("other"),
    ];
    for p in unknown {
        assert!(!p.exists(), "{}", p.display());
    }

    // podman: the unconverted image is pulled the ordinary way and runs; the tampered
    // layer's busybox never runs.
    let pod = Podman::new(&t.path().join("pod"), reg.port, Some(&store.dir));
    let plain = reg.reference("plain:v1").replacen("oci://", "", 1);
    run(pod.cmd().args(["pull", "-q", &plain]));
    let diffs = pod.layer_diffs(&plain);
    assert!(
        !diffs.is_empty() && diffs.iter().all(|d| d.is_dir() && !d.is_symlink()),
        "{diffs:?}"
    );
    run(pod.cmd().args(["pull", "-q", &image]));
    let (code, out, err) = pod.run(
        &image,
        &["sh", "-c", "cat /bin/busybox > /dev/null && echo read"],
    );
    assert_ne!(code, 0, "{out}{err}");
    assert!(!out.contains("read"), "{out}");
    // The same file read on the host through the layer's mount: EIO, never bytes.
    let err = std::fs::read(layer.join("diff/bin/busybox")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
}

#[test]
fn podman_runs_a_rootfs_a_verilay_mount_serves_with_its_writes_on_top() {
    if podman_prerequisites() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let dirs = three_layers(t.path());
    let image = t.path().join("root.img");
    run(verilay()
        .arg("build")
        .arg("-q")
        .arg(&dirs[0])
        .arg("-o")
        .arg(&image));
    let mnt = t.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    run(verilay().arg("mount").arg("-q").arg(&image).arg(&mnt));
    let _unmount = common::Unmount::fuse(&mnt);
    let pod = Podman::new(&t.path().join("pod"), 1, None);
    let rootfs = format!("{}:O", mnt.display());
    let out = run(pod.cmd().args([
        "run",
        "--rm",
        "--network=none",
        "--rootfs",
        &rootfs,
        "sh",
        "-c",
        "echo written > /etc/new && cat /etc/new /etc/os-release",
    ]));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "written\nbase\n");
    assert!(!mnt.join("etc/new").exists());
    assert_eq!(
        std::fs::read_to_string(mnt.join("etc/os-release")).unwrap(),
        "base\n"
    );
}

/// On both engines (the store's `--engine`): the kernel engine's layer mounts are erofs,
/// and what the container's overlayfs opens on them is measured through fanotify.
#[test]
fn what_containers_run_from_the_store_is_measured_in_lists_evmctl_accepts() {
    if podman_prerequisites() || skip_unless(have("evmctl"), "needs evmctl (scripts/setup)") {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let reg = Registry::start(false);
    let dirs = three_layers(t.path());
    let l = layout(t.path(), "v1", &[dirs[0].clone(), dirs[2].clone()]);
    let src = format!("oci:{}:v1", l.dir.display());
    run(verilay().args(["convert", &src, &reg.docker("app:v1"), "--insecure", "-q"]));
    for (engine, fstype) in [("fuse", "fuse.verilay"), ("kernel", "erofs")] {
        let base = t.path().join(engine);
        std::fs::create_dir_all(&base).unwrap();
        let (policy, logs) = (base.join("policy"), base.join("lists"));
        std::fs::write(&policy, "measure func=BPRM_CHECK\n").unwrap();
        let p = policy.display().to_string();
        let m = logs.display().to_string();
        let extra = ["--policy", &p, "--measure-log", &m, "--engine", engine];
        let store = Store::start(&base, &extra, &[]);
        let pod = Podman::new(&base.join("pod"), reg.port, Some(&store.dir));
        let image = reg.reference("app:v1").replacen("oci://", "", 1);
        run(pod.cmd().args(["pull", "-q", &image]));
        let (code, out, err) = pod.run(&image, &["/app/run.sh"]);
        assert_eq!(
            (code, out.lines().next()),
            (0, Some("app on base")),
            "{engine}: {err}"
        );
        assert!(!store.layers().is_empty(), "{engine}: no layer mounts");
        assert_mount_types(&store.layers(), fstype, engine);

        // One list per layer, named by its image digest; the programs run are in them.
        let mut seen = String::new();
        for dir in std::fs::read_dir(&logs)
            .unwrap()
            .flatten()
            .map(|e| e.path())
        {
            assert!(evmctl_accepts(&dir), "evmctl refuses {}", dir.display());
            run(verilay().args(["log", "verify"]).arg(&dir));
            seen += &std::fs::read_to_string(dir.join("ascii_runtime_measurements")).unwrap();
        }
        for program in ["/app/run.sh", "/bin/busybox"] {
            assert!(
                seen.lines()
                    .any(|l| l.contains(" ima-ng sha256:") && l.ends_with(program)),
                "{engine}: {program} not measured: {seen}"
            );
        }
    }
}

/// A container named `w` of `image` (podman as `podman` makes it) writes /etc/new and
/// removes /etc/os-release: the new file is in its upper directory, whose path it returns.
fn written_in_upper(podman: impl Fn() -> Command, image: &str) -> PathBuf {
    let out = run(podman().args([
        "run",
        "--name",
        "w",
        "--network=none",
        image,
        "sh",
        "-c",
        "echo written > /etc/new && rm /etc/os-release && cat /etc/new",
    ]));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "written\n");
    let upper = run(podman().args(["inspect", "--format", "{{.GraphDriver.Data.UpperDir}}", "w"]));
    let new = PathBuf::from(String::from_utf8_lossy(&upper.stdout).trim()).join("etc/new");
    assert_eq!(std::fs::read_to_string(&new).unwrap(), "written\n");
    new
}

// --- Rootless: the test user's podman, and the store in podman's own namespaces.

/// The `verilaytest` account with a subordinate ID range (podman's rootless user
/// namespace maps container IDs 1 and up there) and newuidmap to set it up.
fn rootless_prerequisites() -> bool {
    let has_range = |file: &str| {
        std::fs::read_to_string(file)
            .is_ok_and(|s| s.lines().any(|l| l.starts_with("verilaytest:")))
    };
    podman_prerequisites()
        || skip_unless(
            have("newuidmap") && have("newgidmap"),
            "rootless podman needs newuidmap and newgidmap (uidmap; scripts/setup)",
        )
        || skip_unless(
            has_range("/etc/subuid") && has_range("/etc/subgid"),
            "verilaytest has no range in /etc/subuid and /etc/subgid (scripts/setup)",
        )
}

/// podman as `verilaytest`, everything its own under `dir` (owned by the user): home,
/// XDG_RUNTIME_DIR (so its pause process, and with it its user and mount namespaces, are
/// this test's alone), storage, and the same configuration as [`Podman`]'s.
struct RootlessPodman {
    dir: PathBuf,
    env: Vec<(String, String)>,
}

impl RootlessPodman {
    fn new(dir: &Path, port: u16, store: &Path) -> RootlessPodman {
        let run_dir = dir.join("run");
        std::fs::create_dir_all(&run_dir).unwrap();
        std::fs::write(
            dir.join("storage.conf"),
            format!(
                "[storage]\ndriver = \"overlay\"\ngraphroot = \"{0}/graph\"\n\
                 runroot = \"{0}/run/storage\"\n[storage.options]\n\
                 additionallayerstores = [\"{1}:ref\"]\n",
                dir.display(),
                store.display()
            ),
        )
        .unwrap();
        podman_conf(dir, port);
        sh(&format!(
            "chown -R verilaytest: '{0}' && chmod 700 '{1}'",
            dir.display(),
            run_dir.display()
        ));
        let p = |f: &str| dir.join(f).display().to_string();
        let mut env = vec![
            ("HOME".to_string(), dir.display().to_string()),
            ("USER".to_string(), "verilaytest".to_string()),
            (
                "PATH".to_string(),
                "/usr/local/bin:/usr/bin:/bin".to_string(),
            ),
            ("XDG_RUNTIME_DIR".to_string(), run_dir.display().to_string()),
            ("CONTAINERS_STORAGE_CONF".to_string(), p("storage.conf")),
            ("CONTAINERS_CONF".to_string(), p("containers.conf")),
            (
                "CONTAINERS_REGISTRIES_CONF".to_string(),
                p("registries.conf"),
            ),
            ("TMPDIR".to_string(), dir.display().to_string()),
            ("VERILAY_CACHE".to_string(), p("verilay-cache")),
        ];
        // Each pass of scripts/test: the store's layers over the transport it names.
        if let Ok(t) = std::env::var("VERILAY_TRANSPORT") {
            env.push(("VERILAY_TRANSPORT".to_string(), t));
        }
        RootlessPodman {
            dir: dir.to_path_buf(),
            env,
        }
    }

    /// `podman ARGS…` as the test user, in its environment alone.
    fn cmd(&self) -> Command {
        let mut c = Command::new("runuser");
        c.args(["-u", "verilaytest", "--", "env", "-i"])
            .args(self.env.iter().map(|(k, v)| format!("{k}={v}")))
            .arg("podman")
            .current_dir(&self.dir);
        c
    }

    /// `podman unshare ARGS…`: in podman's user and mount namespaces, as their root.
    fn unshare(&self, args: &[&str]) -> std::process::Output {
        self.cmd().arg("unshare").args(args).output().unwrap()
    }

    /// `podman run --rm IMAGE ARGS…` with `extra` options first: (exit code, stdout,
    /// stderr).
    fn run(&self, extra: &[&str], image: &str, args: &[&str]) -> (i32, String, String) {
        podman_run(self.cmd(), extra, image, args)
    }
}

impl Drop for RootlessPodman {
    fn drop(&mut self) {
        let _ = self.cmd().args(["rm", "-a", "-f"]).output();
        let _ = self.cmd().args(["rmi", "-a", "-f"]).output();
        // Its pause process holds the namespaces (and the overlay mounts in them).
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("run/libpod/tmp/pause.pid")) {
            if let Some(pid) = pid
                .trim()
                .parse()
                .ok()
                .and_then(rustix::process::Pid::from_raw)
            {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::Kill);
            }
        }
    }
}

/// `verilay layer-store` as the test user inside `podman unshare`: the store and the
/// layers it mounts are in podman's mount namespace, owned by podman's user namespace.
/// Stopped (SIGTERM: it unmounts itself and its layers) when dropped.
struct RootlessStore {
    child: std::process::Child,
    pid: PathBuf,
    dir: PathBuf,
    state: PathBuf,
}

impl RootlessStore {
    fn start(pod: &RootlessPodman, env: &[(&str, &str)]) -> RootlessStore {
        let (dir, state, pid) = (
            pod.dir.join("store"),
            pod.dir.join("state"),
            pod.dir.join("store.pid"),
        );
        std::fs::create_dir_all(&dir).unwrap();
        sh(&format!("chown verilaytest: '{}'", dir.display()));
        let log = std::fs::File::create(pod.dir.join("store.log")).unwrap();
        let child = pod
            .cmd()
            .arg("unshare")
            .args(["sh", "-c", "echo $$ > \"$0\" && exec \"$@\""])
            .arg(&pid)
            .arg("env")
            .args(env.iter().map(|(k, v)| format!("{k}={v}")))
            .arg(env!("CARGO_BIN_EXE_verilay"))
            .arg("layer-store")
            .arg(&dir)
            .arg("--state")
            .arg(&state)
            .arg("--cache")
            .arg(pod.dir.join("cache"))
            .arg("--insecure")
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let store = RootlessStore {
            child,
            pid,
            dir,
            state,
        };
        let needle = format!(" {} ", store.dir.display());
        let mounted = poll_until(Duration::from_secs(30), || {
            String::from_utf8_lossy(&pod.unshare(&["cat", "/proc/self/mountinfo"]).stdout)
                .contains(&needle)
        });
        assert!(
            mounted,
            "the store did not mount: {}",
            std::fs::read_to_string(pod.dir.join("store.log")).unwrap_or_default()
        );
        store
    }

    /// The layer mounts the store made (directories; mounted in podman's namespace).
    fn layers(&self) -> Vec<PathBuf> {
        layer_mounts(&self.state)
    }
}

impl Drop for RootlessStore {
    fn drop(&mut self) {
        let pid = std::fs::read_to_string(&self.pid)
            .ok()
            .and_then(|p| p.trim().parse().ok())
            .and_then(rustix::process::Pid::from_raw);
        let signal = |s| pid.map(|p| rustix::process::kill_process(p, s));
        signal(rustix::process::Signal::Term);
        // A store whose mount another namespace still holds would wait for it for good.
        if !poll_until(Duration::from_secs(20), || {
            self.child.try_wait().is_ok_and(|s| s.is_some())
        }) {
            signal(rustix::process::Signal::Kill);
        }
        let _ = self.child.wait();
    }
}

#[test]
fn rootless_podman_runs_converted_images_through_a_store_in_its_user_namespace() {
    if rootless_prerequisites() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let reg = Registry::start(false);
    let dirs = three_layers(t.path());
    // A file the image's root alone may read.
    sh(&format!(
        "echo rootonly > '{0}/etc/secret' && chmod 600 '{0}/etc/secret'",
        dirs[2].display()
    ));
    let l = layout(t.path(), "v1", &dirs);
    let src = format!("oci:{}:v1", l.dir.display());
    run(verilay().args(["convert", &src, &reg.docker("app:v1"), "--insecure", "-q"]));
    let image = reg.reference("app:v1").replacen("oci://", "", 1);
    let pod = RootlessPodman::new(
        &t.path().join("user"),
        reg.port,
        &t.path().join("user/store"),
    );
    let store = RootlessStore::start(&pod, &[("VERILAY_FETCH_EXACT", "1")]);

    // The pull takes each layer from the store, and its use and release notices get the
    // ENOENT of a counting store (anything else podman warns about).
    let pulled = run(pod.cmd().args(["pull", "-q", &image]));
    let err = String::from_utf8_lossy(&pulled.stderr);
    assert!(!err.contains("Additional Layer Store"), "{err}");
    let inspect = run(pod.cmd().args([
        "image",
        "inspect",
        "--format",
        "{{.GraphDriver.Data.LowerDir}}:{{.GraphDriver.Data.UpperDir}}",
        &image,
    ]));
    let diffs: Vec<PathBuf> = String::from_utf8_lossy(&inspect.stdout)
        .trim()
        .split(':')
        .filter(|s| !s.is_empty() && *s != "<no value>")
        .map(PathBuf::from)
        .collect();
    assert_links_into(&diffs, &store.dir);

    // Programs run from the layers.
    let as_root = |args: &[&str]| pod.run(&[], &image, args);
    let (code, out, err) = as_root(&["/app/run.sh"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("app on base") && !out.contains("gone"),
        "{out}"
    );
    let py = "import hashlib; print(sum(range(10)), hashlib.sha256(b'x').hexdigest()[:8])";
    let (code, out, err) = as_root(&["python3", "-c", py]);
    assert_eq!((code, out.as_str()), (0, "45 2d711642\n"), "{err}");
    // The image's owners are the container's: root's files are root's (not the overflow
    // ID of an owner the user namespace does not map), so its root reads a file of mode
    // 600 and another container user may not.
    let script = "stat -c %u:%g /etc/secret /bin/busybox && cat /etc/secret";
    let (code, out, err) = as_root(&["sh", "-c", script]);
    assert_eq!((code, out.as_str()), (0, "0:0\n0:0\nrootonly\n"), "{err}");
    let (code, out, err) = pod.run(
        &["--user", "1000:1000"],
        &image,
        &["sh", "-c", "/app/run.sh && cat /etc/secret"],
    );
    assert!(
        code != 0 && out.contains("app on base"),
        "{code} {out}{err}"
    );
    assert!(err.contains("Permission denied"), "{err}");

    // The layers are mounted in podman's namespace only, and fetched as read: of the
    // Python layer's unread data, nothing.
    let host = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let ns =
        String::from_utf8_lossy(&pod.unshare(&["cat", "/proc/self/mountinfo"]).stdout).into_owned();
    let layers = store.layers();
    assert_eq!(layers.len(), 3, "{layers:?}");
    let mut stats = Vec::new();
    for m in &layers {
        let at = format!(" {} ", m.display());
        assert!(ns.contains(&at) && !host.contains(&at), "{}", m.display());
        let out = pod.unshare(&[
            env!("CARGO_BIN_EXE_verilay"),
            "stats",
            "--json",
            &m.display().to_string(),
        ]);
        let s: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        // Served over the transport this pass of scripts/test names.
        let want = match std::env::var("VERILAY_TRANSPORT").as_deref() {
            Ok("uring") => Some("io_uring"),
            Ok("dev") => Some("/dev/fuse"),
            _ => None,
        };
        if let Some(want) = want {
            let transport = s["transport"].as_str().unwrap_or_default();
            assert!(transport.starts_with(want), "{s}");
        }
        stats.push(s);
    }
    fetched_under_half(stats.into_iter());

    // A container's writes land in podman's upper directory, owned on the host by the
    // user (the container's root), never in a layer.
    let new = written_in_upper(|| pod.cmd(), &image);
    let uid = std::fs::metadata(&pod.dir).unwrap().uid();
    assert_eq!(std::fs::metadata(&new).unwrap().uid(), uid);
    let mut seen = String::new();
    for m in &layers {
        let etc = m.join("etc").display().to_string();
        seen += &String::from_utf8_lossy(&pod.unshare(&["ls", "-a", &etc]).stdout);
    }
    assert!(
        seen.contains("os-release") && !seen.contains("new"),
        "{seen}"
    );
    drop(store);
}
