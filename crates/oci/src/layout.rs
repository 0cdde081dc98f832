//! An OCI image layout directory (`oci:DIR[:TAG]`, as skopeo and umoci write it):
//! `oci-layout`, `index.json` naming manifests by `org.opencontainers.image.ref.name`,
//! and `blobs/sha256/HEX`.

use crate::artifact::Descriptor;
use crate::image::Index;
use std::fs::File;
use std::path::{Path, PathBuf};

/// The annotation that names a manifest in `index.json` (the tag of `oci:DIR:TAG`).
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";
/// The most of `index.json` or a manifest read.
const JSON_MAX: u64 = 4 << 20;

/// An OCI image layout directory, checked to be one.
pub struct Layout {
    dir: PathBuf,
}

impl Layout {
    /// The layout at `dir`; an error names the file that makes it none.
    pub fn open(dir: &Path) -> Result<Layout, String> {
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(format!("{}: not a directory", dir.display())),
            Err(e) => return Err(format!("{}: {e}", dir.display())),
        }
        let marker = dir.join("oci-layout");
        let text = read_small(&marker)?;
        let v: serde_json::Value = serde_json::from_slice(&text)
            .map_err(|e| format!("{}: not JSON: {e}", marker.display()))?;
        if v.get("imageLayoutVersion")
            .and_then(|v| v.as_str())
            .is_none()
        {
            return Err(format!(
                "{}: no imageLayoutVersion: not an OCI image layout",
                marker.display()
            ));
        }
        Ok(Layout {
            dir: dir.to_path_buf(),
        })
    }

    /// The descriptor `index.json` lists under `tag` (its ref.name), or its only entry
    /// when no tag is given.
    pub fn find(&self, tag: Option<&str>) -> Result<Descriptor, String> {
        let path = self.dir.join("index.json");
        let index: Index = serde_json::from_slice(&read_small(&path)?)
            .map_err(|e| format!("{}: not an image index: {e}", path.display()))?;
        let named = |d: &&Descriptor| d.annotations.get(REF_NAME).map(String::as_str) == tag;
        let found: Vec<&Descriptor> = match tag {
            Some(_) => index.manifests.iter().filter(named).collect(),
            None => index.manifests.iter().collect(),
        };
        match found.as_slice() {
            [one] => Ok((*one).clone()),
            [] => Err(format!(
                "{}: no manifest named {:?}",
                path.display(),
                tag.unwrap_or("")
            )),
            _ => Err(format!(
                "{}: {} manifests{}: name one (oci:DIR:TAG)",
                path.display(),
                found.len(),
                tag.map(|t| format!(" named {t:?}")).unwrap_or_default()
            )),
        }
    }

    /// The path of blob `digest` (`sha256:HEX` only; anything else could name a path
    /// outside the layout).
    pub fn blob_path(&self, digest: &str) -> Result<PathBuf, String> {
        if !crate::reference::valid_digest(digest) {
            return Err(format!("{digest:?} is not a sha256 digest"));
        }
        Ok(self
            .dir
            .join("blobs/sha256")
            .join(&digest["sha256:".len()..]))
    }

    /// A small blob (a manifest, a config), whole; the caller checks its digest.
    pub fn small_blob(&self, digest: &str) -> Result<Vec<u8>, String> {
        read_small(&self.blob_path(digest)?)
    }

    /// A blob, open for reading; the caller checks its digest.
    pub fn blob(&self, digest: &str) -> Result<File, String> {
        let p = self.blob_path(digest)?;
        verity::source::open_input(&p, false).map_err(|e| format!("{}: {e}", p.display()))
    }
}

fn read_small(p: &Path) -> Result<Vec<u8>, String> {
    verity::source::read_input(p, JSON_MAX).map_err(|e| format!("{}: {e}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layout_names_its_manifests_and_keeps_blobs_inside() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(
            t.path().join("oci-layout"),
            r#"{"imageLayoutVersion":"1.0.0"}"#,
        )
        .unwrap();
        let d = |n: char, tag: &str| {
            format!(
                r#"{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:{}","size":1,
                "annotations":{{"{REF_NAME}":"{tag}"}}}}"#,
                n.to_string().repeat(64)
            )
        };
        std::fs::write(
            t.path().join("index.json"),
            format!(
                r#"{{"schemaVersion":2,"manifests":[{},{}]}}"#,
                d('a', "1"),
                d('b', "2")
            ),
        )
        .unwrap();
        let l = Layout::open(t.path()).unwrap();
        assert!(l.find(Some("2")).unwrap().digest.ends_with('b'));
        assert!(l.find(Some("3")).unwrap_err().contains("no manifest named"));
        assert!(l.find(None).unwrap_err().contains("2 manifests"));
        assert!(l.blob_path("sha256:../../etc/passwd").is_err());
        assert!(Layout::open(&t.path().join("none")).is_err());
    }
}
