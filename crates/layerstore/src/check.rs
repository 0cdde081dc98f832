//! Whether a verilay image holds exactly the files of the layer blob it is bound to: the
//! blob read as `verilay convert` reads it (with its default bound on a layer's size), built
//! into an image under the state directory, and the two compared as trees
//! (`erofs::read::compare_trees`), however either was built.

use crate::served::{Binding, Verdict};
use erofs::read::{compare_trees, FileSource, Image, Which};
use std::path::Path;

/// The most bytes a layer blob may expand to (its uncompressed tar): `verilay convert`'s
/// default `--max-layer-size`.
pub const TAR_MAX: u64 = 32 << 30;

/// Why a check could not be finished (nothing is kept of it: it is tried again when next
/// asked), as against a verdict.
pub type Unfinished = String;

/// A layer blob rebuilt as an image, with the DiffID and tar size the blob has.
pub struct Rebuilt {
    /// The rebuilt image (unsealed, uncompressed), open.
    pub image: Image<FileSource>,
    /// The blob's DiffID: `sha256:…` of its uncompressed tar.
    pub diff_id: String,
    /// The size in bytes of the blob's uncompressed tar.
    pub tar_size: u64,
}

/// The layer blob at `blob` as a tree: built into `work`, with the DiffID and tar size
/// the blob has. `Ok(Err(why))` when the blob is no layer verilay reads (then no image
/// holds it).
pub fn rebuild(blob: &Path, work: &Path) -> Result<Result<Rebuilt, String>, Unfinished> {
    let (tree, stats) = match tarlayer::read_layer(blob, work, TAR_MAX, &|_| {}) {
        Ok(read) => read,
        // Our own disk failing says nothing of the blob.
        Err(e @ tarlayer::Error::Io { .. }) => return Err(e.to_string()),
        Err(e) => return Ok(Err(format!("its blob is no layer verilay reads: {e}"))),
    };
    let path = work.join("rebuilt");
    let opts = erofs::builder::BuildOptions {
        // Only the tree is compared: no seal, no compression.
        verity: false,
        ..Default::default()
    };
    match erofs::builder::build_tree(&tree, &opts, &path, &erofs::builder::Silent) {
        Ok(_) => {}
        Err(e @ erofs::builder::Error::Io { .. }) => return Err(e.to_string()),
        Err(e) => return Ok(Err(format!("its files make no image: {e}"))),
    }
    drop(tree);
    let image = FileSource::open(&path)
        .map_err(|e| e.to_string())
        .and_then(|s| Image::open(s).map_err(|e| e.to_string()))
        .map_err(|e| format!("the rebuilt image: {e}"))?;
    Ok(Ok(Rebuilt {
        image,
        diff_id: stats.diff_id,
        tar_size: stats.tar_bytes,
    }))
}

/// Whether the image file at `image` (its blob, checked against the binding's blob
/// digest), read pinned to the binding's image digest as its mount reads it, holds the
/// rebuilt layer, and the blob has the DiffID and tar size the binding claims.
pub fn judge(b: &Binding, image: &Path, layer: &Rebuilt) -> Result<Verdict, Unfinished> {
    if (&layer.diff_id, layer.tar_size) != (&b.diff_id, b.tar_size) {
        return Ok(Verdict::Differs(format!(
            "it claims DiffID {} ({} bytes of tar); the blob's is {} ({} bytes)",
            b.diff_id, b.tar_size, layer.diff_id, layer.tar_size
        )));
    }
    let pin = pin_bytes(&b.image).ok_or_else(|| format!("{:?} is no sha256 digest", b.image))?;
    let file = FileSource::open(image).map_err(|e| format!("{}: {e}", image.display()))?;
    // The blob matched its digest: an image that does not open under its pin, or breaks
    // when read, breaks the same way for its mount.
    let verified = match verity::verified::VerifiedSource::open(file, Some(&pin)) {
        Ok(v) => v,
        Err(e) => return Ok(Verdict::Differs(format!("its image does not open: {e}"))),
    };
    let x = match Image::open(verified) {
        Ok(x) => x,
        Err(e) => return Ok(Verdict::Differs(format!("its image does not open: {e}"))),
    };
    match compare_trees(&x, &layer.image) {
        Ok(None) => Ok(Verdict::Holds),
        Ok(Some(d)) => Ok(Verdict::Differs(format!("first difference: {d}"))),
        Err(e) if e.which == Which::A && !local_failure(&e.err) => {
            Ok(Verdict::Differs(format!("its image fails to read: {e}")))
        }
        Err(e) => Err(format!("comparing: {e}")),
    }
}

/// A read error that is our disk's, not the image's (an integrity failure is the image's:
/// its blob matched its digest).
fn local_failure(e: &erofs::read::Error) -> bool {
    match e {
        erofs::read::Error::Io { err, .. } => verity::verified::IntegrityError::find(err).is_none(),
        _ => false,
    }
}

/// `sha256:HEX` as bytes.
fn pin_bytes(digest: &str) -> Option<Vec<u8>> {
    let hex = digest.strip_prefix("sha256:").filter(|h| h.len() == 64)?;
    (0..64)
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gzip tar of `files` (path, contents), as an image builder writes one.
    fn layer(dir: &Path, name: &str, files: &[(&str, &str)]) -> std::path::PathBuf {
        let src = dir.join(format!("{name}.d"));
        for (p, c) in files {
            let p = src.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, c).unwrap();
        }
        let out = dir.join(format!("{name}.tar.gz"));
        let ok = std::process::Command::new("tar")
            .args([
                "--sort=name",
                "--mtime=@1700000000",
                "--owner=0",
                "--group=0",
            ])
            .args(["--numeric-owner", "--format=gnu", "-czf"])
            .arg(&out)
            .arg("-C")
            .arg(&src)
            .arg(".")
            .status()
            .unwrap()
            .success();
        assert!(ok);
        out
    }

    /// The image `verilay convert` makes of a blob (sealed, compressed or not).
    fn convert(blob: &Path, work: &Path, name: &str, z: bool) -> (std::path::PathBuf, String) {
        let (tree, _) = tarlayer::read_layer(blob, work, TAR_MAX, &|_| {}).unwrap();
        let opts = erofs::builder::BuildOptions {
            compression: z.then(|| erofs::builder::compress::Settings {
                compression: "lz4hc".parse().unwrap(),
                pcluster: 4096,
            }),
            ..Default::default()
        };
        let out = work.join(name);
        let s = erofs::builder::build_tree(&tree, &opts, &out, &erofs::builder::Silent).unwrap();
        (
            out,
            format!("sha256:{}", verity::verified::hex(&s.digest.unwrap())),
        )
    }

    #[test]
    fn a_layer_naming_the_spill_file_in_its_entries_still_gets_a_verdict() {
        let d = tempfile::tempdir().unwrap();
        let blob = d.path().join("l.tar");
        let script = "import tarfile,sys\n\
            t=tarfile.open(sys.argv[1],'w',format=tarfile.GNU_FORMAT)\n\
            i=tarfile.TarInfo('a');i.type=tarfile.LNKTYPE;i.linkname='writing the spill file'\n\
            t.addfile(i);t.close()";
        let ok = std::process::Command::new("python3")
            .args(["-c", script])
            .arg(&blob)
            .status()
            .unwrap()
            .success();
        assert!(ok);
        match rebuild(&blob, d.path()) {
            Ok(Err(why)) => assert!(why.contains("spill file"), "{why}"),
            Ok(Ok(_)) => panic!("a hardlink to nothing was read"),
            Err(e) => panic!("counted as our own failure: {e}"),
        }
    }

    #[test]
    fn an_image_holds_its_layer_or_the_first_difference_is_named() {
        let d = tempfile::tempdir().unwrap();
        let genuine = [("etc/msg", "genuine\n"), ("bin/sh", "#!")];
        let blob = layer(d.path(), "d", &genuine);
        let rebuilt = rebuild(&blob, d.path()).unwrap().unwrap();
        let binding = |image: &str| Binding {
            layer: "sha256:0".into(),
            layer_size: 0,
            media_type: String::new(),
            diff_id: rebuilt.diff_id.clone(),
            tar_size: rebuilt.tar_size,
            image: image.into(),
            image_blob: String::new(),
            image_size: 0,
            reference: String::new(),
        };
        // An honest conversion, with or without compression: it holds the layer.
        for z in [false, true] {
            let (x, digest) = convert(&blob, d.path(), &format!("x{z}"), z);
            assert_eq!(
                judge(&binding(&digest), &x, &rebuilt).unwrap(),
                Verdict::Holds
            );
            // A false DiffID claim differs, whatever the files.
            let mut b = binding(&digest);
            b.diff_id = format!("sha256:{}", "1".repeat(64));
            assert!(
                matches!(judge(&b, &x, &rebuilt).unwrap(), Verdict::Differs(w) if w.contains("DiffID"))
            );
        }
        // Other files: the first difference, by path.
        let other = layer(
            d.path(),
            "e",
            &[("etc/msg", "attacker\n"), ("bin/sh", "#!")],
        );
        let (x, digest) = convert(&other, d.path(), "evil", false);
        let v = judge(&binding(&digest), &x, &rebuilt).unwrap();
        assert!(
            matches!(&v, Verdict::Differs(w) if w.contains("/etc/msg")),
            "{v:?}"
        );
        // Pinned to another digest: it does not open.
        let v = judge(
            &binding(&format!("sha256:{}", "2".repeat(64))),
            &x,
            &rebuilt,
        )
        .unwrap();
        assert!(
            matches!(&v, Verdict::Differs(w) if w.contains("does not open")),
            "{v:?}"
        );
        // A blob that is no layer: no image holds it.
        let junk = d.path().join("junk");
        std::fs::write(&junk, vec![7u8; 1000]).unwrap();
        assert!(rebuild(&junk, d.path()).unwrap().is_err());
    }
}
