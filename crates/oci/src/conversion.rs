//! A container image converted to verilay images: one sealed image per layer, listed in
//! order in an artifact manifest whose subject is the image's manifest, each annotated
//! with the layer it came from. A client holding the image's manifest finds it among that
//! manifest's referrers (see `referrers`); the layer store maps a layer digest to its
//! verilay image with it.

use crate::artifact::{self, Descriptor, Manifest, DIGEST_ANNOTATION, LAYER_TYPE};
use std::collections::BTreeMap;

/// The artifact type of a conversion manifest.
pub const CONVERSION_TYPE: &str = "application/vnd.verilay.layers.v1";
/// The original layer blob's digest (`sha256:…`, as the image manifest lists it).
pub const SOURCE_DIGEST: &str = "dev.verilay.source.digest";
pub const SOURCE_SIZE: &str = "dev.verilay.source.size";
pub const SOURCE_MEDIA_TYPE: &str = "dev.verilay.source.media-type";
/// The layer's DiffID: `sha256:…` of its uncompressed tar.
pub const SOURCE_DIFF_ID: &str = "dev.verilay.source.diff-id";
/// Bytes of the uncompressed tar.
pub const SOURCE_TAR_SIZE: &str = "dev.verilay.source.tar-size";

/// One layer and the verilay image made of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvertedLayer {
    /// The original layer blob.
    pub source: Descriptor,
    pub diff_id: String,
    pub tar_size: u64,
    /// The verilay image's blob (`sha256:…` of the image file, and its size).
    pub image_blob: String,
    pub image_size: u64,
    /// The image digest (fs-verity digest of its EROFS part): what a mount pins.
    pub image_digest: String,
}

/// The conversion manifest of the image manifest `subject`, whose layers became `layers`
/// (in the manifest's order).
pub fn manifest(subject: &Descriptor, layers: &[ConvertedLayer]) -> Vec<u8> {
    let layers = layers
        .iter()
        .map(|l| {
            let notes = BTreeMap::from([
                (DIGEST_ANNOTATION.to_string(), l.image_digest.clone()),
                (SOURCE_DIGEST.to_string(), l.source.digest.clone()),
                (SOURCE_SIZE.to_string(), l.source.size.to_string()),
                (SOURCE_MEDIA_TYPE.to_string(), l.source.media_type.clone()),
                (SOURCE_DIFF_ID.to_string(), l.diff_id.clone()),
                (SOURCE_TAR_SIZE.to_string(), l.tar_size.to_string()),
            ]);
            let mut d = Descriptor::of(LAYER_TYPE, b"");
            d.digest = l.image_blob.clone();
            d.size = l.image_size;
            d.annotations = notes;
            d
        })
        .collect();
    let subject = Descriptor {
        annotations: BTreeMap::new(),
        artifact_type: None,
        platform: None,
        ..subject.clone()
    };
    let m = Manifest {
        schema_version: 2,
        media_type: Some(artifact::MANIFEST_TYPE.into()),
        artifact_type: Some(CONVERSION_TYPE.into()),
        config: artifact::empty_config(),
        layers,
        subject: Some(subject),
        annotations: BTreeMap::new(),
    };
    serde_json::to_vec_pretty(&m).expect("a manifest serialises")
}

/// The verilay image artifact of one converted layer (`artifact::manifest`, titled by the
/// layer it came from): stored by digest next to the conversion, it makes each layer's
/// image mountable on its own (`verilay mount oci://HOST/REPO@DIGEST`), and anyone holding
/// the conversion computes the same bytes, so its digest.
pub fn layer_manifest(l: &ConvertedLayer) -> Vec<u8> {
    let hex = l.source.digest.trim_start_matches("sha256:");
    let title = format!("layer-{hex}.verilay");
    artifact::manifest(&l.image_blob, l.image_size, &l.image_digest, &title)
}

/// The digest of the image manifest a conversion manifest's `subject` names, if any.
pub fn subject_of(bytes: &[u8]) -> Option<String> {
    let m: Manifest = serde_json::from_slice(bytes).ok()?;
    m.subject.map(|s| s.digest)
}

/// The layers a conversion manifest lists; an error says why `bytes` is not one (every
/// field checked: what the layer store serves comes from here).
pub fn layers_of(bytes: &[u8]) -> Result<Vec<ConvertedLayer>, String> {
    let m: Manifest =
        serde_json::from_slice(bytes).map_err(|e| format!("not a conversion manifest: {e}"))?;
    if m.artifact_type.as_deref() != Some(CONVERSION_TYPE) {
        return Err(format!(
            "artifactType {:?}, not {CONVERSION_TYPE}",
            m.artifact_type.as_deref().unwrap_or("")
        ));
    }
    m.layers
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let note = |k: &str| {
                d.annotations
                    .get(k)
                    .cloned()
                    .ok_or_else(|| format!("layer {i}: no {k} annotation"))
            };
            let digest = |k: &str| {
                let v = note(k)?;
                match crate::reference::valid_digest(&v) {
                    true => Ok(v),
                    false => Err(format!("layer {i}: {k} {v:?} is not a sha256 digest")),
                }
            };
            let number = |k: &str| {
                let v = note(k)?;
                v.parse::<u64>()
                    .map_err(|_| format!("layer {i}: {k} {v:?} is not a number"))
            };
            if d.media_type != LAYER_TYPE {
                return Err(format!("layer {i}: media type {:?}", d.media_type));
            }
            if !crate::reference::valid_digest(&d.digest) {
                return Err(format!(
                    "layer {i}: blob {:?} is not a sha256 digest",
                    d.digest
                ));
            }
            let mut source = Descriptor::of(&note(SOURCE_MEDIA_TYPE)?, b"");
            source.digest = digest(SOURCE_DIGEST)?;
            source.size = number(SOURCE_SIZE)?;
            Ok(ConvertedLayer {
                source,
                diff_id: digest(SOURCE_DIFF_ID)?,
                tar_size: number(SOURCE_TAR_SIZE)?,
                image_blob: d.digest.clone(),
                image_size: d.size,
                image_digest: digest(DIGEST_ANNOTATION)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conversion_round_trips_and_a_bad_one_is_named() {
        let h = |c: char| format!("sha256:{}", c.to_string().repeat(64));
        let mut src = Descriptor::of("application/vnd.oci.image.layer.v1.tar+gzip", b"");
        src.digest = h('1');
        src.size = 10;
        let l = ConvertedLayer {
            source: src,
            diff_id: h('2'),
            tar_size: 20,
            image_blob: h('3'),
            image_size: 30,
            image_digest: h('4'),
        };
        let subject = Descriptor::of(crate::image::OCI_MANIFEST, b"{}");
        let bytes = manifest(&subject, std::slice::from_ref(&l));
        assert_eq!(layers_of(&bytes).unwrap(), vec![l.clone()]);
        assert_eq!(subject_of(&bytes), Some(subject.digest.clone()));
        let one = layer_manifest(&l);
        assert_eq!(layer_manifest(&l), one);
        let image = artifact::image_of(&one, artifact::MANIFEST_TYPE).unwrap();
        assert_eq!(image.blob.digest, l.image_blob);
        assert_eq!(image.digest.as_deref(), Some(l.image_digest.as_str()));
        let m: Manifest = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(m.subject.unwrap().digest, subject.digest);
        let bad = String::from_utf8(bytes)
            .unwrap()
            .replace(&h('2'), "sha256:zz");
        assert!(layers_of(bad.as_bytes()).unwrap_err().contains("diff-id"));
        assert!(layers_of(&artifact::manifest(&h('5'), 1, &h('6'), "x")).is_err());
    }
}
