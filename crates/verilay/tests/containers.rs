//! Container images and verilay: `verilay convert` of OCI layouts and registry images into
//! verilay images stored next to them (a registry on 127.0.0.1, Debian's docker-registry,
//! with skopeo and the registry's own HTTP API as the independent readers).

mod common;

use common::registry::Registry;
use common::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn prerequisites() -> bool {
    skip_unless(
        have("docker-registry"),
        "needs docker-registry (scripts/setup)",
    ) || skip_unless(have("skopeo"), "needs skopeo (scripts/setup)")
        || skip_unless(have("curl"), "needs curl (scripts/setup)")
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// An OCI image layout made by hand from layer directories (bottom first), each packed as
/// a gzip tarball (whiteouts are files named `.wh.*`, as image builders write them):
/// what `skopeo copy` would write, with known DiffIDs. Returns the layout's manifest
/// digest and the DiffIDs.
struct Layout {
    dir: PathBuf,
    manifest: String,
    diff_ids: Vec<String>,
    layers: Vec<String>,
}

fn layout(base: &Path, tag: &str, layer_dirs: &[PathBuf]) -> Layout {
    let dir = base.join("layout");
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let put = |bytes: &[u8]| -> String {
        let hex = sha256_hex(bytes);
        std::fs::write(blobs.join(&hex), bytes).unwrap();
        format!("sha256:{hex}")
    };
    let (mut diff_ids, mut layers) = (Vec::new(), Vec::new());
    for (i, l) in layer_dirs.iter().enumerate() {
        let tar = base.join(format!("layer{i}.tar"));
        sh(&format!(
            "tar --sort=name --mtime=@1700000000 --owner=0 --group=0 --numeric-owner \
             --xattrs -C '{}' -cf '{}' .",
            l.display(),
            tar.display()
        ));
        let raw = std::fs::read(&tar).unwrap();
        diff_ids.push(format!("sha256:{}", sha256_hex(&raw)));
        sh(&format!("gzip -n -f '{}'", tar.display()));
        let gz = std::fs::read(base.join(format!("layer{i}.tar.gz"))).unwrap();
        layers.push((put(&gz), gz.len()));
    }
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

fn convert_json(args: &[&str]) -> serde_json::Value {
    let out = run(verilay().arg("convert").args(args).arg("--json"));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn curl(url: &str, out: &Path) {
    sh(&format!(
        "curl -sf -H 'Accept: application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json' -o '{}' '{url}'",
        out.display()
    ));
}

#[test]
fn convert_stores_each_layer_as_a_verilay_image_the_original_manifest_leads_to() {
    if prerequisites() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let reg = Registry::start(false);
    let (dirs, want) = two_layers(t.path());
    let l = layout(t.path(), "v1", &dirs);
    let src = format!("oci:{}:v1", l.dir.display());
    let j = convert_json(&[&src, &reg.docker("app"), "--insecure"]);
    let m = &j["manifests"][0];
    assert_eq!(m["manifest"].as_str(), Some(l.manifest.as_str()), "{j}");
    assert!(
        m["recorded"].as_str().unwrap().starts_with("tag sha256-"),
        "{j}"
    );

    // The original is in the registry as skopeo sees it, under the layout's tag.
    let inspect =
        run(Command::new("skopeo").args(["inspect", "--tls-verify=false", &reg.docker("app:v1")]));
    let seen: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    assert_eq!(seen["Digest"].as_str(), Some(l.manifest.as_str()));
    let seen_layers: Vec<&str> = seen["Layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(seen_layers, l.layers);

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

    // Reproducible: the same image converted again (from the registry this time, into
    // another repository) gives the same images and the same conversion.
    let again = convert_json(&[&reg.docker("app:v1"), &reg.docker("copy"), "--insecure"]);
    assert_eq!(
        again["manifests"][0]["conversion"], m["conversion"],
        "{again}"
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
    if prerequisites() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let reg = Registry::start(false);
    let (dirs, _) = two_layers(t.path());
    let l = layout(t.path(), "v1", &dirs);
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
