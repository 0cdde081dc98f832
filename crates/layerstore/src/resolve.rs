//! A layer's verilay image found from the reference and layer digest containers/storage asks
//! about, mounted pinned (docs/SECURITY.md section 10).
//!
//! - A referrer counts only when signed under the user's policy.
//! - A reusable layer is answered only once each binding involved holds its files (`check`),
//!   recorded as served under the record's lock in that step.
//! - No lookup waits on another reference.

use crate::check;
use crate::served::{Binding, Record, Verdict};
use oci::artifact::Descriptor;
use oci::conversion::{self, ConvertedLayer};
use oci::image::{self, Parsed};
use oci::{Reference, Registry};
use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// One converted layer of an image, as the store serves it.
#[derive(Debug, Clone)]
pub struct Layer {
    /// Where its images are (the reference's registry and repository).
    pub reference: Reference,
    /// The original layer blob.
    pub source: oci::artifact::Descriptor,
    /// The layer's conversion: its verilay image and the blob it was made of.
    pub converted: ConvertedLayer,
    /// The `info` file: the fields of containers/storage's `Layer` it fills in from it.
    pub info: Vec<u8>,
}

/// A layer the store must not answer for: containers/storage would reuse for this image
/// a layer made of an image that does not hold the layer's files. Its `info` fails to
/// open, which fails podman's pull (a missing layer would let it reuse one).
#[derive(Debug, Clone)]
pub struct Refused {
    /// The reference asked about, as given.
    pub reference: String,
    /// The layer blob's digest asked about.
    pub digest: String,
    /// Why the store must not answer for it.
    pub why: String,
}

/// What the store answers for a layer it knows.
#[derive(Debug, Clone)]
pub enum Found {
    /// The layer's verilay image, to serve.
    Layer(Box<Layer>),
    /// The layer must fail for this image.
    Refused(Refused),
}

/// What the store asks of the world.
pub trait Resolver: Send + Sync + 'static {
    /// Layer `digest` of the image `reference` names: its image if it was converted, a
    /// refusal if it must not be answered for.
    fn layer(&self, reference: &str, digest: &str) -> Result<Option<Found>, String>;
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

/// What a reference resolved to: its converted layers, and what its manifests list (to
/// find a layer's DiffID in their configs when it binds none).
struct Resolution {
    layers: Vec<ConvertedLayer>,
    /// Each manifest's config and layers.
    listed: Vec<(Descriptor, Vec<Descriptor>)>,
    /// Each layer's DiffIDs, from the configs: fetched once, when first needed.
    diff_ids: OnceLock<Result<HashMap<String, Vec<String>>, String>>,
}

impl Resolution {
    /// How the manifests list layer `digest`.
    fn listing(&self, digest: &str) -> Option<&Descriptor> {
        self.listed
            .iter()
            .flat_map(|(_, layers)| layers)
            .find(|d| d.digest == digest)
    }
}

/// What each reference asked about resolved to (or why nothing could be found), and when.
type Resolved = Result<Arc<Resolution>, String>;
type Known = HashMap<String, (Instant, Resolved)>;
/// A lookup's whole budget, in periods of `--timeout`: checked before each request, so
/// one lookup ends within this plus one request's own bound however many manifests,
/// referrers and signatures a registry lists.
const LOOKUP_PERIODS: u32 = 4;
/// The largest image config read (for its DiffIDs), as a manifest.
const CONFIG_MAX: u64 = 4 << 20;
/// The most lookups checking bindings or waiting to (one checks at a time: each rebuilds
/// a layer on disk); each holds one of the store's threads.
const CHECKERS: usize = 8;
/// The most rounds of checks one lookup makes while other lookups serve new bindings of
/// its layer.
const CHECK_ROUNDS: usize = 4;

/// The registry side: references resolved through the OCI referrers of their manifests,
/// layers mounted by running `verilay mount` on their image artifacts.
pub struct OciResolver {
    /// Registries over plain HTTP (only on this machine), and `--insecure` for the mounts.
    pub insecure: bool,
    /// The longest one registry request may take; a lookup makes no request after 4 of these.
    pub timeout: Duration,
    /// `layers/IMAGE_HEX` (mountpoints) and `blobs/SOURCE_HEX` (original blobs).
    pub state: PathBuf,
    /// The program run as `PROGRAM mount SOURCE MOUNTPOINT --quiet ARGS…`.
    pub mount_program: PathBuf,
    /// Arguments given to every mount, after the ones the resolver adds.
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
    /// Every binding served and every verdict found (`served.json`; [`Self::open_record`]).
    record: Mutex<Record>,
    /// One check at a time, and how many lookups are checking or waiting to.
    checking: Mutex<()>,
    checkers: std::sync::atomic::AtomicUsize,
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
/// The slowest average rate a blob fetch may keep, past its first [`LOOKUP_PERIODS`]
/// periods of `--timeout`, on the bytes it has received (not on the size claimed, which
/// the registry chose): the fetch holds a blob reader (and a check holds the one check
/// lock) while it runs, and a registry that paces its bytes just above the per-period
/// floor (`oci::registry::MIN_BYTES_PER_PERIOD`) would otherwise hold them for days. 256
/// KiB/s is a 2 Mbit/s link: slower ones cannot serve layers through the store.
const BLOB_MIN_RATE: u64 = 256 << 10;
/// The threads the store's mount serves requests with.
pub const STORE_THREADS: usize = 16;
/// The record of bindings served, in the state directory.
const RECORD: &str = "served.json";
/// Where checks rebuild layers (one directory per check, removed after it).
const CHECKS: &str = "checks";

impl OciResolver {
    /// A resolver keeping its mounts, blobs and record in `state`, mounting layers with
    /// `mount_program`; plain HTTP off, 30 s requests, no signature policy.
    pub fn new(state: PathBuf, mount_program: PathBuf) -> OciResolver {
        OciResolver {
            insecure: false,
            timeout: Duration::from_secs(30),
            mount_program,
            mount_args: Vec::new(),
            measure_logs: None,
            trust: None,
            known: Mutex::new(HashMap::new()),
            resolving: Mutex::new(HashMap::new()),
            mounting: Mutex::new(HashMap::new()),
            fetching: Mutex::new(HashMap::new()),
            fetchers: Default::default(),
            record: Mutex::new(Record::empty(&state.join(RECORD))),
            checking: Mutex::new(()),
            checkers: Default::default(),
            state,
        }
    }

    /// Reads what the store served before (`STATE/served.json`), and clears what checks
    /// left behind. A record that cannot be read is an error: the layers it names may be
    /// in podman's storage still.
    pub fn open_record(&mut self) -> Result<(), String> {
        let record = Record::open(&self.state.join(RECORD))?;
        *self.record.get_mut().unwrap_or_else(|e| e.into_inner()) = record;
        let checks = self.state.join(CHECKS);
        match std::fs::remove_dir_all(&checks) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(format!("{}: {e}", checks.display()))
            }
            _ => Ok(()),
        }
    }

    fn record(&self) -> MutexGuard<'_, Record> {
        self.record.lock().unwrap_or_else(|e| e.into_inner())
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
    fn resolve(&self, r: &Reference, deadline: Instant) -> Result<Resolution, String> {
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
        let mut listed = Vec::new();
        for (m, bytes) in manifests {
            // Attestations and other artifacts an index lists list no layers of the image.
            if let Ok(parsed) = serde_json::from_slice::<oci::artifact::Manifest>(&bytes) {
                listed.push((parsed.config, parsed.layers));
            }
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
        Ok(Resolution {
            layers,
            listed,
            diff_ids: OnceLock::new(),
        })
    }

    /// The DiffIDs the configs of `r`'s manifests give layer blob `digest` (each config's
    /// `rootfs.diff_ids`, by position), fetched once per resolution.
    fn diff_ids(
        &self,
        r: &Reference,
        res: &Resolution,
        digest: &str,
    ) -> Result<Vec<String>, String> {
        let all = res.diff_ids.get_or_init(|| {
            let reg = self.registry(r)?;
            let mut all: HashMap<String, Vec<String>> = HashMap::new();
            let deadline = Instant::now() + self.timeout * LOOKUP_PERIODS;
            for (config, layers) in &res.listed {
                in_time(r, deadline)?;
                for (layer, diff_id) in layers.iter().zip(self.config_diff_ids(&reg, r, config)?) {
                    let ids = all.entry(layer.digest.clone()).or_default();
                    if !ids.contains(&diff_id) {
                        ids.push(diff_id);
                    }
                }
            }
            Ok(all)
        });
        match all {
            Ok(all) => Ok(all.get(digest).cloned().unwrap_or_default()),
            Err(e) => Err(e.clone()),
        }
    }

    /// `rootfs.diff_ids` of the config `d` of an image in `r`'s repository.
    fn config_diff_ids(
        &self,
        reg: &Registry,
        r: &Reference,
        d: &Descriptor,
    ) -> Result<Vec<String>, String> {
        use std::io::Read;
        let what = |e: &dyn std::fmt::Display| format!("{r}: config {}: {e}", d.digest);
        if d.size > CONFIG_MAX {
            return Err(what(&format!("{} bytes, more than {CONFIG_MAX}", d.size)));
        }
        let mut bytes = Vec::new();
        reg.get_blob(&r.repository, &d.digest)
            .map_err(|e| what(&e))?
            .take(d.size + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| what(&e))?;
        if bytes.len() as u64 != d.size || oci::registry::sha256_digest(&bytes) != d.digest {
            return Err(what(&"the registry sent other bytes"));
        }
        let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| what(&e))?;
        Ok(v.pointer("/rootfs/diff_ids")
            .and_then(|v| v.as_array())
            .map(|ids| {
                ids.iter()
                    // Kept in place, so each stays with its layer.
                    .map(|i| i.as_str().unwrap_or_default().to_string())
                    .collect()
            })
            .unwrap_or_default())
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

/// A last word on a layer the resolver found, before it is recorded as served: the reason
/// it must not be, if so.
pub type Accept<'a> = &'a dyn Fn(&Layer) -> Option<String>;

impl Resolver for OciResolver {
    fn layer(&self, reference: &str, digest: &str) -> Result<Option<Found>, String> {
        self.layer_if(reference, digest, &|_| None)
    }

    fn diff_path(&self, layer: &Layer) -> PathBuf {
        self.layer_dir(&layer.converted.image_digest)
    }

    fn mount(&self, layer: &Layer) -> Result<PathBuf, String> {
        self.mount_artifact(&artifact_source(layer), &layer.converted.image_digest)
    }

    fn blob(&self, layer: &Layer) -> Result<PathBuf, String> {
        self.blob_of(&layer.reference, &layer.source)
    }
}

impl OciResolver {
    /// [`Resolver::layer`], with `accept` asked about the layer's binding before it is
    /// recorded as served: one it turns down is refused, with its reason, and never served.
    pub fn layer_if(
        &self,
        reference: &str,
        digest: &str,
        accept: Accept<'_>,
    ) -> Result<Option<Found>, String> {
        let r = parse_reference(reference)?;
        let refuse = |why: String| {
            Ok(Some(Found::Refused(Refused {
                reference: reference.to_string(),
                digest: digest.to_string(),
                why,
            })))
        };
        // Keyed by the reference as parsed: every spelling of one shares an entry. An image
        // the store cannot look up gets no answer (podman looked it up itself, and may
        // reuse what it holds of the layer: see SECURITY.md).
        let res = self.converted(&r.to_string(), &r)?;
        let bound = res.layers.iter().find(|l| l.source.digest == digest);
        let Some(listed) = res.listing(digest) else {
            // Not a layer of this image: podman asks about it for another one.
            return Ok(None);
        };
        if let Some(l) = bound {
            if let Some(why) = accept(&layer_of(&r, l)) {
                return refuse(why);
            }
        }
        let own = bound.map(|l| Binding::of(&r.to_string(), l));
        // The DiffID podman files the layer under: the binding's claim, or the config's.
        let (nothing_served, unchecked) = {
            let record = self.record();
            (record.is_empty(), record.unchecked())
        };
        let diff_ids = match (&own, nothing_served) {
            (Some(b), _) => vec![b.diff_id.clone()],
            (None, true) => Vec::new(),
            (None, false) => match self.diff_ids(&r, &res, digest) {
                Ok(ids) => ids,
                // podman needs the config as much: without it, a layer served and not
                // found to hold its files might be the one it reuses.
                Err(e) if unchecked => {
                    return refuse(format!("the layer's DiffID cannot be found: {e}"))
                }
                Err(e) => return Err(e),
            },
        };
        match self.clear(&r, digest, listed, &diff_ids, own.as_ref()) {
            Err(why) => refuse(why),
            Ok(false) => Ok(None),
            Ok(true) => Ok(bound.map(|l| Found::Layer(Box::new(layer_of(&r, l))))),
        }
    }
}

/// The layer `l` of the image `r` names, as served.
fn layer_of(r: &Reference, l: &ConvertedLayer) -> Layer {
    Layer {
        reference: r.clone(),
        source: l.source.clone(),
        converted: l.clone(),
        info: info_of(l),
    }
}

/// What `verilay mount` mounts for `layer`: its image artifact, by the digest its binding
/// gives (which pins every block).
pub fn artifact_source(layer: &Layer) -> String {
    let artifact = conversion::layer_manifest(&layer.converted);
    let r = &layer.reference;
    format!(
        "oci://{}/{}@{}",
        r.registry,
        r.repository,
        oci::registry::sha256_digest(&artifact)
    )
}

impl OciResolver {
    /// Whether `layer`'s image holds the files of the layer blob it is bound to: checked
    /// once (the blob and the image fetched whole, the blob rebuilt and compared), the
    /// verdict kept in the record for every later question.
    pub fn verdict_of(&self, layer: &Layer) -> Result<Verdict, String> {
        let b = Binding::of(&layer.reference.to_string(), &layer.converted);
        if let Some(v) = self.record().verdict(&b) {
            return Ok(v);
        }
        let digest = &layer.source.digest;
        self.check(
            &layer.reference,
            digest,
            &layer.source,
            std::slice::from_ref(&b),
        )
        .map_err(|e| format!("layer {digest}: {e}"))?;
        self.record()
            .verdict(&b)
            .ok_or_else(|| format!("layer {digest}: checked, and no verdict recorded"))
    }

    /// Where layers are mounted, each in a directory named by its image digest's hex.
    pub fn layers_dir(&self) -> PathBuf {
        self.state.join("layers")
    }

    /// Where the layer of image `image_digest` is mounted.
    pub fn layer_dir(&self, image_digest: &str) -> PathBuf {
        self.layers_dir().join(hex_of(image_digest))
    }

    /// Mounts `source` (from [`artifact_source`]), the image artifact of verilay image
    /// `image_digest`, at [`Self::layer_dir`] unless a live mount is there.
    pub fn mount_artifact(&self, source: &str, image_digest: &str) -> Result<PathBuf, String> {
        let dir = self.layer_dir(image_digest);
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
            m.entry(image_digest.to_string()).or_default().clone()
        };
        let _one = one.lock().unwrap_or_else(|e| e.into_inner());
        match mounted(&dir) {
            Some(true) => return Ok(dir),
            Some(false) => {}
            // A mount whose daemon is gone: detached, and mounted again.
            None => drop(imagefs::mount::unmount(&dir, true)),
        }
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut cmd = Command::new(&self.mount_program);
        cmd.arg("mount").arg(source).arg(&dir).arg("--quiet");
        if self.insecure {
            cmd.arg("--insecure");
        }
        if let Some(logs) = &self.measure_logs {
            let log = logs.join(hex_of(image_digest));
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
}

impl OciResolver {
    /// The layer blob `source` from `reference`'s repository, fetched whole once for all
    /// its readers, checked, and kept under `blobs/`.
    fn blob_of(&self, reference: &Reference, source: &Descriptor) -> Result<PathBuf, String> {
        use std::sync::atomic::Ordering::Relaxed;
        let dir = self.state.join("blobs");
        let hex = hex_of(&source.digest);
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
        let fetched = self.download(reference, source, &dir).and_then(|tmp| {
            tmp.persist(&path)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(path.clone())
        });
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

/// A blob's body that fails with `TimedOut` once, past `grace`, it has taken longer than
/// `grace` plus what its bytes so far take at [`BLOB_MIN_RATE`]: a fetch ends within
/// `grace` + size / rate (and one read's own bound) whatever the size claimed.
struct AverageRate<R> {
    inner: R,
    start: Instant,
    grace: Duration,
    got: u64,
}

impl<R: std::io::Read> std::io::Read for AverageRate<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let took = self.start.elapsed();
        let earned = self.grace + Duration::from_secs_f64(self.got as f64 / BLOB_MIN_RATE as f64);
        if took > earned {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "{} bytes in {:.0} s: slower than {} KiB/s on average past 4 periods of --timeout",
                    self.got,
                    took.as_secs_f64(),
                    BLOB_MIN_RATE >> 10
                ),
            ));
        }
        let n = self.inner.read(buf)?;
        self.got += n as u64;
        Ok(n)
    }
}

impl OciResolver {
    /// The blob `source` from `reference`'s repository, fetched whole into a temporary
    /// file in `dir` and checked: removed on any failure, and unless the caller keeps it.
    fn download(
        &self,
        reference: &Reference,
        source: &Descriptor,
        dir: &Path,
    ) -> Result<tempfile::NamedTempFile, String> {
        // The size is the manifest's claim, and the blob is written before it is checked.
        if source.size > BLOB_MAX {
            return Err(format!(
                "the blob is {} bytes, more than the {BLOB_MAX} the store fetches",
                source.size
            ));
        }
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let reg = self.registry(reference)?;
        let reader = reg
            .get_blob(&reference.repository, &source.digest)
            .map_err(|e| e.to_string())?;
        let tmp =
            tempfile::NamedTempFile::new_in(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        // One byte more than listed is read, to see a blob that runs on.
        let limit = source.size.saturating_add(1);
        let reader = AverageRate {
            inner: reader,
            start: Instant::now(),
            grace: self.timeout * LOOKUP_PERIODS,
            got: 0,
        };
        let got = oci::sha256_copy(reader, tmp.as_file(), limit, &|_| {})
            .map_err(|e| format!("fetching: {e}"))?;
        if got != (source.digest.clone(), source.size) {
            return Err(format!(
                "the blob fetched ({} bytes) hashes to {}, not to {}",
                got.1, got.0, source.digest
            ));
        }
        Ok(tmp)
    }

    /// Whether the store may answer for layer `digest` of `r`, which binds it as `own`
    /// (or not at all) and whose DiffIDs for it are `diff_ids`; `listed` is how `r` lists
    /// it. podman may reuse for it a layer made of any binding served for that blob or
    /// claiming one of those DiffIDs: unless `own` is the only one, each of them (and
    /// `own`, which is about to be served beside them) must first be found to hold the
    /// layer's files. `Ok(true)`: answer as always, `own` recorded as served first;
    /// `Ok(false)`: `own` cannot be recorded, so it is not served (the others hold the
    /// layer: podman may reuse them, or pull it); `Err`: refused, and why.
    fn clear(
        &self,
        r: &Reference,
        digest: &str,
        listed: &Descriptor,
        diff_ids: &[String],
        own: Option<&Binding>,
    ) -> Result<bool, String> {
        for _ in 0..CHECK_ROUNDS {
            let pending = {
                let mut record = self.record();
                let mut judged: Vec<Binding> = record
                    .relevant(digest, diff_ids)
                    .into_iter()
                    .map(|e| e.binding)
                    .filter(|b| own.is_none_or(|o| !b.same(o)))
                    .collect();
                if !judged.is_empty() {
                    judged.extend(own.cloned());
                }
                for b in &judged {
                    if let Some(Verdict::Differs(why)) = record.verdict(b) {
                        return Err(refusal(digest, b, own, &why));
                    }
                }
                judged.retain(|b| record.verdict(b).is_none());
                if judged.is_empty() {
                    // Decided and recorded under one lock: no binding is served between.
                    let Some(own) = own else { return Ok(true) };
                    return match record.serve(own) {
                        Ok(true) => Ok(true),
                        Ok(false) => {
                            eprintln!("verilay layer-store: layer {digest} of {r}: not served: the record of layers served is full of layers not found to hold their files");
                            Ok(false)
                        }
                        Err(e) => {
                            eprintln!(
                                "verilay layer-store: layer {digest} of {r}: not served: {e}"
                            );
                            Ok(false)
                        }
                    };
                }
                judged
            };
            self.check(r, digest, listed, &pending)
                .map_err(|e| format!("layer {digest}: {e}"))?;
        }
        Err(format!(
            "layer {digest}: other images keep binding it to new images: try again"
        ))
    }

    /// Checks each of `pending` against its layer blob and records the verdict. Blobs
    /// come from `r`'s repository for layer `digest` (`r` lists it as `listed`: podman
    /// pulls it from there), else from that of the reference that bound them.
    fn check(
        &self,
        r: &Reference,
        digest: &str,
        listed: &Descriptor,
        pending: &[Binding],
    ) -> Result<(), String> {
        use std::sync::atomic::Ordering::Relaxed;
        struct Leave<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Relaxed);
            }
        }
        let _counted = Leave(&self.checkers);
        if self.checkers.fetch_add(1, Relaxed) >= CHECKERS {
            return Err(format!(
                "{CHECKERS} lookups are already checking layers or waiting to: try again"
            ));
        }
        let _one = self.checking.lock().unwrap_or_else(|e| e.into_inner());
        // Judged by another lookup while this one waited: kept.
        let pending: Vec<&Binding> = pending
            .iter()
            .filter(|b| self.record().verdict(b).is_none())
            .collect();
        let mut layers: Vec<&str> = pending.iter().map(|b| b.layer.as_str()).collect();
        layers.sort();
        layers.dedup();
        for layer in layers {
            let group: Vec<&Binding> = pending
                .iter()
                .copied()
                .filter(|b| b.layer == layer)
                .collect();
            let Some(&b) = group.first() else { continue };
            let fail = |e: String| {
                format!(
                    "image {} (bound by {}) could not be checked against the layer's blob: {e}",
                    b.image, b.reference
                )
            };
            let (from, source) = if layer == digest {
                (r.clone(), listed.clone())
            } else {
                let from = parse_reference(&b.reference).map_err(fail)?;
                let mut d = Descriptor::of(&b.media_type, b"");
                d.digest = b.layer.clone();
                d.size = b.layer_size;
                (from, d)
            };
            for b in &group {
                eprintln!(
                    "verilay layer-store: layer {layer}: checking image {} (bound by {}) against the layer's blob",
                    b.image, b.reference
                );
            }
            let blob = self.blob_of(&from, &source).map_err(fail)?;
            let checks = self.state.join(CHECKS);
            std::fs::create_dir_all(&checks)
                .map_err(|e| fail(format!("{}: {e}", checks.display())))?;
            // Removed with everything in it once this layer is judged, or on any failure.
            let work = tempfile::TempDir::new_in(&checks)
                .map_err(|e| fail(format!("{}: {e}", checks.display())))?;
            let rebuilt = check::rebuild(&blob, work.path()).map_err(fail)?;
            for b in group {
                let fail = |e: String| {
                    format!(
                        "image {} (bound by {}) could not be checked against the layer's blob: {e}",
                        b.image, b.reference
                    )
                };
                let verdict = match &rebuilt {
                    Err(why) => Verdict::Differs(why.clone()),
                    Ok(rebuilt) => {
                        let from = parse_reference(&b.reference).map_err(fail)?;
                        let mut d = Descriptor::of(oci::artifact::LAYER_TYPE, b"");
                        d.digest = b.image_blob.clone();
                        d.size = b.image_size;
                        let image = self.download(&from, &d, work.path()).map_err(fail)?;
                        check::judge(b, image.path(), rebuilt).map_err(fail)?
                    }
                };
                let served = {
                    let mut record = self.record();
                    record.set_verdict(b, verdict.clone()).map_err(fail)?;
                    record.is_served(b)
                };
                let then = match served {
                    true => "every other image's request for the layer is refused",
                    false => "it is not served",
                };
                match verdict {
                    Verdict::Holds => eprintln!(
                        "verilay layer-store: layer {layer}: image {} (bound by {}) holds the layer's files: reusing it is harmless",
                        b.image, b.reference
                    ),
                    Verdict::Differs(why) => eprintln!(
                        "verilay layer-store: layer {layer}: image {} (bound by {}) does not hold the layer's files ({why}): {then}",
                        b.image, b.reference
                    ),
                }
            }
        }
        Ok(())
    }
}

/// Why layer `digest` is refused: binding `b` does not hold it (`why`). `own` is the
/// binding of the image asking, if any.
fn refusal(digest: &str, b: &Binding, own: Option<&Binding>, why: &str) -> String {
    if own.is_some_and(|o| o.same(b)) {
        return format!(
            "layer {digest}: this image binds it to image {}, which does not hold its files ({why}), and other images were served the layer",
            b.image
        );
    }
    format!(
        "layer {digest} was served as image {} (bound by {}), which does not hold its files ({why}): podman would reuse that layer for this image",
        b.image, b.reference
    )
}

/// Detaches the layer mount on `dir` if there is one (lazily: a container still using it
/// keeps it until it lets go), and removes `dir`.
pub fn detach(dir: &Path) {
    if mounted(dir) != Some(false) {
        let _ = imagefs::mount::unmount(dir, true);
    }
    let _ = std::fs::remove_dir(dir);
}

/// Detaches every layer mount in `layers` (a resolver's [`OciResolver::layers_dir`]) but
/// those on `keep`. Only directories: a link there is followed by nothing.
pub fn detach_all_but(layers: &Path, keep: &[&Path]) {
    let Ok(entries) = std::fs::read_dir(layers) else {
        return;
    };
    for e in entries.flatten() {
        let dir = e.file_type().is_ok_and(|t| t.is_dir());
        if dir && !keep.contains(&e.path().as_path()) {
            detach(&e.path());
        }
    }
}

/// Whether a live mount is on `dir` (its device is not its parent's); `None` for a
/// mount whose daemon is gone (stat fails with ENOTCONN).
pub fn mounted(dir: &Path) -> Option<bool> {
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
