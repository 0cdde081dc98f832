//! Finding a layer's verilay image from the reference and layer digest containers/storage
//! asks about, mounting it, and fetching the original blob.
//!
//! The chain of trust: the reference's manifest (from the registry; pinned when the
//! reference carries a digest), the verilay image its layer descriptor names (a bound
//! manifest, `oci::conversion::bind`: the annotations are part of the bytes the digest
//! covers), the layer's image artifact (its manifest by digest, computed here from those
//! annotations), and the image digest it records, which the mount pins: every byte the
//! layer's files give is checked against it. A conversion found as a referrer of a
//! manifest that binds nothing is a link anyone who may push to the repository can add:
//! it leads to images only when signed under the user's signature policy
//! (`signed_referrers`); otherwise the layer is not in the store, and podman pulls it the
//! ordinary way.

use oci::conversion::{self, ConvertedLayer};
use oci::image::{self, Parsed};
use oci::{Reference, Registry};
use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One converted layer of an image, as the store serves it.
#[derive(Debug, Clone)]
pub struct Layer {
    /// Where its images are (the reference's registry and repository).
    pub reference: Reference,
    pub source: oci::artifact::Descriptor,
    pub converted: ConvertedLayer,
    /// The `info` file: the fields of containers/storage's `Layer` it fills in from it.
    pub info: Vec<u8>,
}

/// What the store asks of the world.
pub trait Resolver: Send + Sync + 'static {
    /// Layer `digest` of the image `reference` names, if it was converted.
    fn layer(&self, reference: &str, digest: &str) -> Result<Option<Layer>, String>;
    /// Where the layer's files are once mounted (the `diff` link's target).
    fn diff_path(&self, layer: &Layer) -> PathBuf;
    /// Mounts the layer at [`Resolver::diff_path`] unless it is mounted.
    fn mount(&self, layer: &Layer) -> Result<PathBuf, String>;
    /// The original layer blob, fetched whole and checked against its digest.
    fn blob(&self, layer: &Layer) -> Result<PathBuf, String>;
}

/// A reference as containers/image names it (`HOST/REPO:TAG`, `HOST/REPO@DIGEST`,
/// `HOST/REPO:TAG@DIGEST`, with `docker://` or `//` in front or not). A digest, when
/// present, is what is fetched: the tag is then only a name.
pub fn parse_reference(s: &str) -> Result<Reference, String> {
    let s = s
        .strip_prefix("docker://")
        .or_else(|| s.strip_prefix("//"))
        .unwrap_or(s);
    let s = match s.split_once('@') {
        Some((name, digest)) => {
            let (host_path, last) = name.rsplit_once('/').unwrap_or(("", name));
            let last = last.split_once(':').map_or(last, |(repo, _tag)| repo);
            format!("{host_path}/{last}@{digest}")
        }
        None => s.to_string(),
    };
    Reference::parse(&s)
}

/// containers/storage's `archive.Compression` of a layer media type.
fn compression_of(media_type: &str) -> u8 {
    if media_type.ends_with("gzip") {
        2
    } else if media_type.ends_with("zstd") {
        4
    } else {
        0
    }
}

/// The `info` file of a layer (`storage.Layer`'s JSON fields).
pub fn info_of(l: &ConvertedLayer) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "compressed-diff-digest": l.source.digest,
        "compressed-size": l.source.size,
        "diff-digest": l.diff_id,
        "diff-size": l.tar_size,
        "compression": compression_of(&l.source.media_type),
    }))
    .expect("JSON serialises")
}

/// How long what a reference resolved to is kept (a tag may move).
const KEEP: Duration = Duration::from_secs(10);
/// The most references kept resolved at once: each holds what its manifests list, and
/// podman asks about as many references as it is given.
const KEPT_REFERENCES: usize = 256;

/// What each reference asked about resolved to (its converted layers, or why none could
/// be found), and when.
type Resolved = Result<Arc<Vec<ConvertedLayer>>, String>;
type Known = HashMap<String, (Instant, Resolved)>;
/// A lookup's whole budget, in periods of `--timeout`: checked before each request, so
/// one lookup ends within this plus one request's own bound however many manifests,
/// referrers and signatures a registry lists.
const LOOKUP_PERIODS: u32 = 4;

/// The registry side: references resolved through the OCI referrers of their manifests,
/// layers mounted by running `verilay mount` on their image artifacts.
pub struct OciResolver {
    pub insecure: bool,
    pub timeout: Duration,
    /// `layers/IMAGE_HEX` (mountpoints) and `blobs/SOURCE_HEX` (original blobs).
    pub state: PathBuf,
    /// The program and the arguments after `mount SOURCE MOUNTPOINT`.
    pub mount_program: PathBuf,
    pub mount_args: Vec<OsString>,
    /// Each layer's measurement list goes to `DIR/IMAGE_HEX` (`--measure-log`).
    pub measure_logs: Option<PathBuf>,
    /// The signature policy (podman's `policy.json`): every manifest fetched must satisfy
    /// it, and a conversion found as a referrer is used only when signed under it.
    pub trust: Option<signatures::Trust>,
    known: Mutex<Known>,
    /// Each reference's lookup lock.
    resolving: Mutex<HashMap<String, Arc<Mutex<()>>>>,
    /// Each layer image's mount lock.
    mounting: Mutex<HashMap<String, Arc<Mutex<()>>>>,
    /// One fetch per original blob however many read it (`blobs/HEX` → its lock), and
    /// how many readers are fetching or waiting for one.
    fetching: Mutex<HashMap<String, Arc<Mutex<Fetched>>>>,
    fetchers: std::sync::atomic::AtomicUsize,
}

/// How the last fetch of a blob ended, for the readers that waited for it: a failure
/// (and when) is theirs too, rather than a fetch again each, one after another.
type Fetched = Option<(Instant, String)>;

/// The most readers fetching or waiting for original blobs at once: each holds one of the
/// store's threads ([`STORE_THREADS`]), and the rest must stay free for lookups of other
/// references.
pub const BLOB_READERS: usize = 4;
/// The largest original blob the store fetches whole (`verilay pull`'s default limit).
const BLOB_MAX: u64 = 32 << 30;
/// The threads the store's mount serves requests with.
pub const STORE_THREADS: usize = 16;

impl OciResolver {
    pub fn new(state: PathBuf, mount_program: PathBuf) -> OciResolver {
        OciResolver {
            insecure: false,
            timeout: Duration::from_secs(30),
            state,
            mount_program,
            mount_args: Vec::new(),
            measure_logs: None,
            trust: None,
            known: Mutex::new(HashMap::new()),
            resolving: Mutex::new(HashMap::new()),
            mounting: Mutex::new(HashMap::new()),
            fetching: Mutex::new(HashMap::new()),
            fetchers: Default::default(),
        }
    }

    fn registry(&self, r: &Reference) -> Result<Registry, String> {
        Registry::connect(r, self.insecure, self.timeout).map_err(|e| e.to_string())
    }

    /// Every converted layer of the image(s) `r` names (each platform of an index).
    fn converted(&self, key: &str, r: &Reference) -> Resolved {
        let cached = || {
            let known = self.known.lock().unwrap_or_else(|e| e.into_inner());
            known
                .get(key)
                .filter(|(at, _)| at.elapsed() < KEEP)
                .map(|(_, found)| found.clone())
        };
        if let Some(found) = cached() {
            return found;
        }
        // One lookup of a reference at a time: the others wait for it and take its answer
        // (an error too), rather than each asking the registry again.
        let one = {
            let mut r = self.resolving.lock().unwrap_or_else(|e| e.into_inner());
            if r.len() >= KEPT_REFERENCES {
                r.retain(|_, v| Arc::strong_count(v) > 1);
            }
            r.entry(key.to_string()).or_default().clone()
        };
        let _one = one.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = cached() {
            return found;
        }
        let found = self
            .resolve(r, Instant::now() + self.timeout * LOOKUP_PERIODS)
            .map(Arc::new);
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        known.retain(|_, (at, _)| at.elapsed() < KEEP);
        if known.len() >= KEPT_REFERENCES {
            let oldest = known
                .iter()
                .min_by_key(|(_, (at, _))| *at)
                .map(|(k, _)| k.clone());
            known.remove(&oldest.expect("not empty"));
        }
        known.insert(key.to_string(), (Instant::now(), found.clone()));
        found
    }

    /// The converted layers of `r` from the registry, within `deadline`.
    fn resolve(&self, r: &Reference, deadline: Instant) -> Result<Vec<ConvertedLayer>, String> {
        let reg = self.registry(r)?;
        let (bytes, media_type) = reg
            .get_manifest(&r.repository, r.target_str())
            .map_err(|e| e.to_string())?;
        let digest = oci::registry::sha256_digest(&bytes);
        if matches!(r.target, oci::reference::Target::Digest(_)) && digest != r.target_str() {
            return Err(format!(
                "{r}: the registry sent another manifest than the one named"
            ));
        }
        // The manifest the store serves layers of must be one podman would pull: fetched
        // by tag, it may differ from podman's.
        if let Some(t) = &self.trust {
            t.check(&reg, r, &digest)?;
        }
        let manifests = match image::parse(&bytes, &media_type).map_err(|e| format!("{r}: {e}"))? {
            Parsed::Manifest(_) => vec![(digest, bytes)],
            // As `verilay convert` converts them: the linux manifests, each fetched by
            // the digest the index (fetched by digest, or by tag) lists.
            Parsed::Index(i) => {
                let mut v = Vec::new();
                let mut seen = std::collections::HashSet::new();
                for d in i.manifests {
                    if d.platform.as_ref().is_some_and(|p| p.os != "linux")
                        || !seen.insert(d.digest.clone())
                    {
                        continue;
                    }
                    if seen.len() > INDEX_MANIFESTS_MAX {
                        return Err(format!(
                            "{r}: the index lists more than {INDEX_MANIFESTS_MAX} linux manifests"
                        ));
                    }
                    if !oci::reference::valid_digest(&d.digest) {
                        return Err(format!("{r}: {:?} is not a sha256 digest", d.digest));
                    }
                    in_time(r, deadline)?;
                    let (bytes, _) = reg
                        .get_manifest(&r.repository, &d.digest)
                        .map_err(|e| e.to_string())?;
                    if oci::registry::sha256_digest(&bytes) != d.digest {
                        return Err(format!(
                            "{r}: the registry sent another manifest than {}",
                            d.digest
                        ));
                    }
                    v.push((d.digest, bytes));
                }
                v
            }
        };
        let mut layers: Vec<ConvertedLayer> = Vec::new();
        for (m, bytes) in manifests {
            let mut bound =
                conversion::bound_layers(&bytes).map_err(|e| format!("{r}: {m}: {e}"))?;
            if bound.is_empty() {
                bound = self.signed_referrers(&reg, r, &m, deadline)?;
            }
            // Two platforms of one index may share a layer, never with two images.
            for l in bound {
                let image = l.image_digest.clone();
                if let Err(o) = conversion::add_layer(&mut layers, l) {
                    return Err(format!(
                        "{r}: layer {} is bound to two different images ({} and {image})",
                        o.source.digest, o.image_digest
                    ));
                }
            }
        }
        Ok(layers)
    }
}

/// The most referrers of one manifest looked at.
const REFERRERS_MAX: usize = 16;
/// The most manifests of an index fetched (each up to 4 MiB, held until resolved).
const INDEX_MANIFESTS_MAX: usize = 32;

impl OciResolver {
    /// The layers of the conversions of manifest `m` found as its referrers and signed
    /// under the policy (a sigstore signature the policy's key verifies, for the
    /// conversion's own digest in `r`'s repository); none without a policy. A referrer
    /// is a link anyone who may push can add: unsigned, or signed by another key, it is
    /// passed over with a log line. Signed conversions that disagree on a layer are an
    /// error, never "the first".
    fn signed_referrers(
        &self,
        reg: &Registry,
        r: &Reference,
        m: &str,
        deadline: Instant,
    ) -> Result<Vec<ConvertedLayer>, String> {
        let Some(trust) = &self.trust else {
            return Ok(Vec::new());
        };
        // A bad referrer (or list) is passed over: podman then pulls the ordinary way.
        let mut found = match reg.referrers(&r.repository, m, conversion::CONVERSION_TYPE) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("verilay layer-store: {r}: the referrers of {m}: {e}: passed over");
                return Ok(Vec::new());
            }
        };
        let mut seen = std::collections::HashSet::new();
        found.retain(|d| seen.insert(d.digest.clone()));
        let mut layers: Vec<ConvertedLayer> = Vec::new();
        for d in found.iter().take(REFERRERS_MAX) {
            if !oci::reference::valid_digest(&d.digest) {
                continue;
            }
            in_time(r, deadline)?;
            let bytes = match reg.get_manifest(&r.repository, &d.digest) {
                Ok((b, _)) => b,
                Err(e) => {
                    eprintln!(
                        "verilay layer-store: {r}: referrer {}: {e}: passed over",
                        d.digest
                    );
                    continue;
                }
            };
            if oci::registry::sha256_digest(&bytes) != d.digest
                || conversion::subject_of(&bytes).as_deref() != Some(m)
            {
                eprintln!(
                    "verilay layer-store: {r}: referrer {} is not a conversion of {m}: passed over",
                    d.digest
                );
                continue;
            }
            // Judged as the image podman asked about is: a tag's own scope and identity
            // (a key trusted only for another tag of the repository is not enough); by
            // digest, the repository's. The subject check above binds it to `m`.
            let at = match r.target {
                oci::reference::Target::Tag(_) => r.clone(),
                oci::reference::Target::Digest(_) => Reference {
                    target: oci::reference::Target::Digest(d.digest.clone()),
                    ..r.clone()
                },
            };
            match trust.check(reg, &at, &d.digest) {
                Ok(a) if a.signed => {}
                Ok(_) => {
                    eprintln!("verilay layer-store: {r}: conversion {} of {m} is not signed under the policy ({}): passed over", d.digest, trust.policy.origin());
                    continue;
                }
                Err(e) => {
                    eprintln!(
                        "verilay layer-store: conversion {} of {m}: {e}: passed over",
                        d.digest
                    );
                    continue;
                }
            }
            let listed = match conversion::layers_of(&bytes) {
                Ok(l) => l,
                Err(e) => {
                    eprintln!(
                        "verilay layer-store: {r}: conversion {}: {e}: passed over",
                        d.digest
                    );
                    continue;
                }
            };
            for l in listed {
                if let Err(o) = conversion::add_layer(&mut layers, l) {
                    return Err(format!(
                        "{r}: signed conversions of {m} bind layer {} to two different images",
                        o.source.digest
                    ));
                }
            }
        }
        Ok(layers)
    }
}

/// Whether a lookup of `r` may make another request.
fn in_time(r: &Reference, deadline: Instant) -> Result<(), String> {
    match Instant::now() < deadline {
        true => Ok(()),
        false => Err(format!(
            "{r}: the lookup took longer than {LOOKUP_PERIODS} times --timeout"
        )),
    }
}

fn hex_of(digest: &str) -> &str {
    digest.trim_start_matches("sha256:")
}

impl Resolver for OciResolver {
    fn layer(&self, reference: &str, digest: &str) -> Result<Option<Layer>, String> {
        let r = parse_reference(reference)?;
        // Keyed by the reference as parsed: every spelling of one shares an entry.
        let layers = self.converted(&r.to_string(), &r)?;
        Ok(layers
            .iter()
            .find(|l| l.source.digest == digest)
            .map(|l| Layer {
                reference: r.clone(),
                source: l.source.clone(),
                converted: l.clone(),
                info: info_of(l),
            }))
    }

    fn diff_path(&self, layer: &Layer) -> PathBuf {
        self.state
            .join("layers")
            .join(hex_of(&layer.converted.image_digest))
    }

    fn mount(&self, layer: &Layer) -> Result<PathBuf, String> {
        let dir = self.diff_path(layer);
        // Every lookup through the `diff` link asks: the mounted case costs two stats.
        if mounted(&dir) == Some(true) {
            return Ok(dir);
        }
        // One mount of a layer at a time (two lookups must not both mount it); other
        // layers' mounts do not wait for this one.
        let one = {
            let mut m = self.mounting.lock().unwrap_or_else(|e| e.into_inner());
            if m.len() >= 1024 {
                m.retain(|_, v| Arc::strong_count(v) > 1);
            }
            m.entry(layer.converted.image_digest.clone())
                .or_default()
                .clone()
        };
        let _one = one.lock().unwrap_or_else(|e| e.into_inner());
        match mounted(&dir) {
            Some(true) => return Ok(dir),
            Some(false) => {}
            // A mount whose daemon is gone: detached, and mounted again.
            None => drop(imagefs::mount::unmount(&dir, true)),
        }
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let artifact = conversion::layer_manifest(&layer.converted);
        let r = &layer.reference;
        let source = format!(
            "oci://{}/{}@{}",
            r.registry,
            r.repository,
            oci::registry::sha256_digest(&artifact)
        );
        let mut cmd = Command::new(&self.mount_program);
        cmd.arg("mount").arg(&source).arg(&dir).arg("--quiet");
        if self.insecure {
            cmd.arg("--insecure");
        }
        if let Some(logs) = &self.measure_logs {
            let log = logs.join(hex_of(&layer.converted.image_digest));
            std::fs::create_dir_all(&log).map_err(|e| format!("{}: {e}", log.display()))?;
            cmd.arg("--measure-log").arg(log);
        }
        cmd.args(&self.mount_args);
        let out = cmd
            .output()
            .map_err(|e| format!("running {}: {e}", self.mount_program.display()))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            return Err(format!("{source}: {}", err.trim()));
        }
        Ok(dir)
    }

    fn blob(&self, layer: &Layer) -> Result<PathBuf, String> {
        use std::sync::atomic::Ordering::Relaxed;
        let dir = self.state.join("blobs");
        let hex = hex_of(&layer.source.digest);
        let path = dir.join(hex);
        if path.exists() {
            return Ok(path);
        }
        struct Leave<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Relaxed);
            }
        }
        let _counted = Leave(&self.fetchers);
        if self.fetchers.fetch_add(1, Relaxed) >= BLOB_READERS {
            return Err(format!(
                "{BLOB_READERS} readers are already fetching or waiting for blobs: try again"
            ));
        }
        let one = {
            let mut f = self.fetching.lock().unwrap_or_else(|e| e.into_inner());
            // Failures are remembered only while some reader may still be told them.
            if f.len() >= 1024 {
                f.retain(|_, v| Arc::strong_count(v) > 1);
            }
            f.entry(hex.to_string()).or_default().clone()
        };
        let mut last = one.lock().unwrap_or_else(|e| e.into_inner());
        if path.exists() {
            return Ok(path); // fetched by the reader this one waited for
        }
        if let Some((at, e)) = &*last {
            if at.elapsed() < self.timeout {
                return Err(e.clone()); // the fetch this one waited for failed
            }
        }
        let fetched = self.fetch_blob(layer, &dir, &path);
        match &fetched {
            Ok(_) => {
                self.fetching
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(hex);
            }
            Err(e) => *last = Some((Instant::now(), e.clone())),
        }
        fetched
    }
}

impl OciResolver {
    /// The original blob of `layer` fetched whole into `dir`, checked, and named `path`.
    fn fetch_blob(&self, layer: &Layer, dir: &Path, path: &Path) -> Result<PathBuf, String> {
        // The size is the manifest's claim, and the blob is written before it is checked.
        if layer.source.size > BLOB_MAX {
            return Err(format!(
                "the blob is {} bytes, more than the {BLOB_MAX} the store fetches",
                layer.source.size
            ));
        }
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let reg = self.registry(&layer.reference)?;
        let reader = reg
            .get_blob(&layer.reference.repository, &layer.source.digest)
            .map_err(|e| e.to_string())?;
        // Named only once whole and checked; removed on any failure before that.
        let tmp =
            tempfile::NamedTempFile::new_in(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        // One byte more than listed is read, to see a blob that runs on.
        let limit = layer.source.size.saturating_add(1);
        let got = oci::sha256_copy(reader, tmp.as_file(), limit, &|_| {})
            .map_err(|e| format!("fetching: {e}"))?;
        if got != (layer.source.digest.clone(), layer.source.size) {
            return Err(format!(
                "the blob fetched ({} bytes) hashes to {}, not to {}",
                got.1, got.0, layer.source.digest
            ));
        }
        tmp.persist(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(path.to_path_buf())
    }
}

/// Whether a live mount is on `dir` (its device is not its parent's); `None` for a
/// mount whose daemon is gone (stat fails with ENOTCONN).
fn mounted(dir: &Path) -> Option<bool> {
    use std::os::unix::fs::MetadataExt;
    let parent = std::fs::metadata(dir.parent()?).ok()?;
    match std::fs::metadata(dir) {
        Ok(m) => Some(m.dev() != parent.dev()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(false),
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_as_containers_image_gives_them() {
        let d = format!("sha256:{}", "a".repeat(64));
        let r = parse_reference("127.0.0.1:5000/app:v1").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str()),
            ("127.0.0.1:5000", "app")
        );
        let r = parse_reference(&format!("//127.0.0.1:5000/ns/app:v1@{d}")).unwrap();
        assert_eq!(r.repository, "ns/app");
        assert_eq!(r.target_str(), d);
        assert!(parse_reference("app").is_err());
        assert_eq!(
            compression_of("application/vnd.oci.image.layer.v1.tar+gzip"),
            2
        );
        assert_eq!(
            compression_of("application/vnd.oci.image.layer.v1.tar+zstd"),
            4
        );
        assert_eq!(compression_of("application/vnd.oci.image.layer.v1.tar"), 0);
    }
}
