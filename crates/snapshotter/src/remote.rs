//! Remote layers: the layer a Prepare's labels name, found as the layer store finds it and
//! mounted lazily and verified by `verilay mount`.
//!
//! - No conversion, or a refused one: containerd unpacks the layer; what is turned down
//!   here is never recorded as served.
//! - Mounts outlive the snapshotter; a snapshot's layers are mounted again before use.

use crate::store::RemoteLayer;
use layerstore::{Found, OciResolver, Resolver};
use std::collections::HashMap;
use std::path::Path;

/// The label containerd's unpacker puts on a layer's Prepare: the chain ID to commit as.
pub const TARGET_LABEL: &str = "containerd.io/snapshot.ref";
/// The image reference CRI pulls (with `disable_snapshot_annotations = false`).
pub const IMAGE_REF_LABEL: &str = "containerd.io/snapshot/cri.image-ref";
/// The image reference as stargz-snapshotter's `ctr-remote image rpull` passes it.
pub const STARGZ_REF_LABEL: &str = "containerd.io/snapshot/remote/stargz.reference";
/// The layer blob's digest as `ctr-remote image rpull` passes it.
pub const STARGZ_LAYER_LABEL: &str = "containerd.io/snapshot/remote/stargz.digest";
/// The digest of the image manifest that lists the layer.
pub const MANIFEST_LABEL: &str = "containerd.io/snapshot/cri.manifest-digest";
/// The layer blob's digest.
pub const LAYER_LABEL: &str = "containerd.io/snapshot/cri.layer-digest";
/// Marks a snapshot served from a verilay image, as stargz-snapshotter marks its own.
pub const REMOTE_LABEL: &str = "containerd.io/snapshot/remote";

/// The name a remote layer over `parent` is committed under: its chain ID last (as
/// containerd's own layer names end), after a part of the parent's, so one chain over two
/// parents (two namespaces) is two snapshots.
pub fn snapshot_name(parent: &str, target: &str) -> String {
    let over = oci::registry::sha256_digest(parent.as_bytes());
    let hex = over.trim_start_matches("sha256:");
    format!("verilay/{}/{target}", &hex[..16])
}

/// The layer a Prepare asks for, from its labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// The chain ID containerd files the layer under.
    pub target: String,
    /// The image as containerd pulled it: by the manifest's digest when the labels give it.
    pub reference: String,
    /// The layer blob's digest.
    pub layer: String,
    /// The chain ID of the layers below (the last part of the parent's key, as containerd
    /// names committed layers), or `None` with no parent.
    pub parent_chain: Option<String>,
}

impl Wanted {
    /// The layer `labels` name over `parent`, CRI's labels or else `ctr-remote`'s; `None`
    /// when they name none (a container's own snapshot, a pull that passes no such
    /// labels). Malformed labels are an error naming the label.
    pub fn of(labels: &HashMap<String, String>, parent: &str) -> Result<Option<Wanted>, String> {
        let either = |cri: &'static str, stargz: &'static str| {
            labels
                .get_key_value(cri)
                .or_else(|| labels.get_key_value(stargz))
        };
        let (Some(target), Some((image_label, image)), Some((layer_label, layer))) = (
            labels.get(TARGET_LABEL),
            either(IMAGE_REF_LABEL, STARGZ_REF_LABEL),
            either(LAYER_LABEL, STARGZ_LAYER_LABEL),
        ) else {
            return Ok(None);
        };
        let digest = |label: &str, d: &str| match oci::reference::valid_digest(d) {
            true => Ok(()),
            false => Err(format!(
                "label {label}: {:?} is not a sha256 digest",
                d.chars().take(80).collect::<String>()
            )),
        };
        digest(TARGET_LABEL, target)?;
        digest(layer_label, layer)?;
        let named = image.split_once('@').map_or(image.as_str(), |(n, _)| n);
        let reference = match labels.get(MANIFEST_LABEL) {
            Some(m) => {
                digest(MANIFEST_LABEL, m)?;
                format!("{named}@{m}")
            }
            None => image.clone(),
        };
        layerstore::resolve::parse_reference(&reference)
            .map_err(|e| format!("label {image_label}: {e}"))?;
        Ok(Some(Wanted {
            target: target.clone(),
            reference,
            layer: layer.clone(),
            parent_chain: (!parent.is_empty())
                .then(|| parent.rsplit('/').next().unwrap_or(parent).to_string()),
        }))
    }

    /// Why a conversion that claims DiffID `diff_id` for the layer must not be served for
    /// it, if so: containerd files the layer under `target`, the chain ID of the DiffIDs
    /// the image's config lists, and reuses it for every later image whose chain is the
    /// same; the claim must give that chain.
    pub fn wrong_chain(&self, diff_id: &str) -> Option<String> {
        let chain = match &self.parent_chain {
            None => diff_id.to_string(),
            Some(p) => oci::registry::sha256_digest(format!("{p} {diff_id}").as_bytes()),
        };
        (chain != self.target).then(|| {
            format!(
                "its conversion claims DiffID {diff_id}, which is not the one containerd files \
                 the layer under (chain {})",
                self.target
            )
        })
    }
}

/// What a look-up found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Looked {
    /// The layer's verilay image, mounted.
    Mounted(RemoteLayer),
    /// containerd pulls and unpacks the layer, for this reason.
    Fallback(String),
}

/// Where remote layers come from.
pub trait Remote: Send + Sync {
    /// The verilay image of layer `w`, mounted; an error when the registry cannot be asked
    /// or the mount fails.
    fn look_up(&self, w: &Wanted) -> Result<Looked, String>;
    /// Mounts `l` again unless it is mounted.
    fn ensure(&self, l: &RemoteLayer) -> Result<(), String>;
    /// Detaches `l` (lazily: containers still using it keep it until they let go).
    fn release(&self, l: &RemoteLayer);
    /// Detaches every layer mount but those in `keep`.
    fn release_all_but(&self, keep: &[RemoteLayer]);
}

/// Remote layers from registries, through the layer store's resolver (its state directory
/// holds the mounts, under `layers/`, and the record of bindings served).
pub struct OciLayers {
    /// Finds, checks and mounts layers.
    pub resolver: OciResolver,
    /// Check each conversion against its layer blob before it is first served (the blob
    /// fetched whole, once): containerd reuses a layer for every image of its namespace
    /// whose chain is the same, without asking.
    pub check_first: bool,
}

impl Remote for OciLayers {
    fn look_up(&self, w: &Wanted) -> Result<Looked, String> {
        // Turned down before the binding is recorded as served: a conversion that is not
        // served takes no room in the record.
        let accept = |l: &layerstore::Layer| -> Option<String> {
            if let Some(why) = w.wrong_chain(&l.converted.diff_id) {
                return Some(why);
            }
            if !self.check_first {
                return None;
            }
            let image = &l.converted.image_digest;
            match self.resolver.verdict_of(l) {
                Ok(layerstore::Verdict::Holds) => None,
                Ok(layerstore::Verdict::Differs(why)) => Some(format!(
                    "its conversion (image {image}) does not hold the layer's files ({why})"
                )),
                // Unpacking the blob serves nothing of the conversion: safe, if slower.
                Err(e) => Some(format!(
                    "its conversion (image {image}) could not be checked ({e})"
                )),
            }
        };
        let layer = match self.resolver.layer_if(&w.reference, &w.layer, &accept)? {
            None => {
                return Ok(Looked::Fallback(
                    "no conversion binds it (in the manifest, or signed under the policy)".into(),
                ))
            }
            Some(Found::Refused(r)) => return Ok(Looked::Fallback(format!("refused: {}", r.why))),
            Some(Found::Layer(l)) => l,
        };
        let dir = self.resolver.mount(&layer)?;
        Ok(Looked::Mounted(RemoteLayer {
            image: layer.converted.image_digest.clone(),
            source: layerstore::resolve::artifact_source(&layer),
            dir,
        }))
    }

    fn ensure(&self, l: &RemoteLayer) -> Result<(), String> {
        let dir = self.resolver.mount_artifact(&l.source, &l.image)?;
        // The record names where it was mounted: another state directory is another store.
        match dir == l.dir {
            true => Ok(()),
            false => Err(format!(
                "mounted at {}, not at {} where its snapshot is",
                dir.display(),
                l.dir.display()
            )),
        }
    }

    fn release(&self, l: &RemoteLayer) {
        layerstore::resolve::detach(&l.dir);
    }

    fn release_all_but(&self, keep: &[RemoteLayer]) {
        let keep: Vec<&Path> = keep.iter().map(|k| k.dir.as_path()).collect();
        layerstore::resolve::detach_all_but(&self.resolver.layers_dir(), &keep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_labels_name_the_layer_or_are_refused_by_name() {
        let d = |c: char| format!("sha256:{}", c.to_string().repeat(64));
        let mut labels: HashMap<String, String> = [
            (TARGET_LABEL, d('a')),
            (IMAGE_REF_LABEL, "127.0.0.1:5000/app:v1".into()),
            (LAYER_LABEL, d('b')),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let w = Wanted::of(&labels, "").unwrap().unwrap();
        assert_eq!(w.reference, "127.0.0.1:5000/app:v1");
        // The first layer's chain is its DiffID; a layer over others, as containerd
        // computes it (sha256 of "PARENT_CHAIN DIFF_ID").
        assert_eq!(w.wrong_chain(&d('a')), None);
        assert!(w.wrong_chain(&d('b')).unwrap().contains("claims DiffID"));
        let chain = "sha256:ccd722928bd92476ba1745586fed6e45a102504185ad88cd89e01ff116fd146c";
        labels.insert(TARGET_LABEL.into(), chain.into());
        let w = Wanted::of(&labels, &format!("default/3/{}", d('a')))
            .unwrap()
            .unwrap();
        assert_eq!(w.wrong_chain(&d('b')), None);
        assert!(w.wrong_chain(&d('a')).is_some());
        labels.insert(TARGET_LABEL.into(), d('a'));
        labels.insert(MANIFEST_LABEL.into(), d('c'));
        let w = Wanted::of(&labels, "").unwrap().unwrap();
        assert_eq!(w.reference, format!("127.0.0.1:5000/app:v1@{}", d('c')));
        assert_eq!((w.target, w.layer), (d('a'), d('b')));
        for (label, bad, why) in [
            (LAYER_LABEL, "sha256:zz", "is not a sha256 digest"),
            (MANIFEST_LABEL, "md5:00", "is not a sha256 digest"),
            (IMAGE_REF_LABEL, "app", IMAGE_REF_LABEL),
        ] {
            let mut l = labels.clone();
            l.insert(label.into(), bad.into());
            let e = Wanted::of(&l, "").unwrap_err();
            assert!(e.contains(label) && e.contains(why), "{e}");
        }
        labels.remove(IMAGE_REF_LABEL);
        assert_eq!(Wanted::of(&labels, ""), Ok(None));
        // ctr-remote's labels, when CRI's are not there.
        labels.remove(LAYER_LABEL);
        labels.remove(MANIFEST_LABEL);
        labels.insert(STARGZ_REF_LABEL.into(), "127.0.0.1:5000/app:v1".into());
        labels.insert(STARGZ_LAYER_LABEL.into(), d('e'));
        let w = Wanted::of(&labels, "").unwrap().unwrap();
        assert_eq!(
            (w.reference.as_str(), w.layer),
            ("127.0.0.1:5000/app:v1", d('e'))
        );
        labels.insert(STARGZ_LAYER_LABEL.into(), "x".into());
        assert!(Wanted::of(&labels, "")
            .unwrap_err()
            .contains(STARGZ_LAYER_LABEL));
    }
}
