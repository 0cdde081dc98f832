//! Images opened pinned and verified, from a file or remote (`oci://`, `http(s)://`), for the
//! read-side commands and mounts.
//!
//! - An image with a verity section is read only through [`VerifiedSource`]; plain EROFS only
//!   where the caller allows it, never with a pin.
//! - A remote image is never opened unpinned; an `oci://` manifest meets the signature policy
//!   before any byte is read (docs/SECURITY.md 9).

#![forbid(unsafe_code)]

use anyhow::{bail, Context};
use erofs::read::{ByteSource, FileSource, Image, Inode};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use verity::{OpenError, VerifiedSource};

/// An image as readers see it: through the verified block source when the image has a
/// verity section, else (where the caller allows it) the raw file.
pub type Img = Image<Arc<dyn ByteSource>>;

/// The signature policy files (containers-policy.json(5), containers-registries.d(5));
/// `None` for each: the default place, when there is one.
#[derive(Clone, Debug, Default)]
pub struct PolicyFiles {
    /// containers-policy.json(5).
    pub signature_policy: Option<PathBuf>,
    /// containers-registries.d(5).
    pub registries_d: Option<PathBuf>,
}

impl PolicyFiles {
    /// The policy, read now (`None`: no policy file where one was looked for).
    pub fn load(&self) -> anyhow::Result<Option<signatures::Trust>> {
        signatures::Trust::load(
            self.signature_policy.as_deref(),
            self.registries_d.as_deref(),
        )
        .map_err(anyhow::Error::msg)
    }
}

/// What an image must be: its digest, and for `oci://` images the signature policy
/// their manifest must satisfy.
#[derive(Clone, Debug, Default)]
pub struct Pin {
    /// Refused unless its digest is this (`sha256:HEX`).
    pub digest: Option<String>,
    /// The policy an `oci://` image's manifest must satisfy (loaded only for one).
    pub policy: PolicyFiles,
}

/// An opened image.
pub struct Opened {
    /// The image.
    pub img: Img,
    /// A remote image's source: what fetching cost, its cache (`None` for a file).
    pub remote: Option<Arc<remote::RemoteSource>>,
    /// The verified source under `img`, `None` for a plain EROFS image.
    pub verified: Option<Arc<VerifiedSource<Box<dyn ByteSource>>>>,
    /// What the caller should warn of ("…: mounting without a cache"), for it to say
    /// where its user sees it (a mount daemon has no terminal).
    pub warnings: Vec<String>,
}

impl Opened {
    /// Says [`warnings`](Self::warnings) on stderr, for a caller with a terminal.
    pub fn say_warnings(&self) {
        for w in &self.warnings {
            eprintln!("verilay: warning: {}", host::text::one_line(w));
        }
    }

    /// "sha256:… (pinned)", "sha256:… (not pinned)" or "none (plain EROFS image, …)".
    pub fn trust(&self) -> String {
        match &self.verified {
            Some(v) if v.is_pinned() => format!("{} (pinned)", v.digest_string()),
            Some(v) => format!("{} (not pinned)", v.digest_string()),
            None => "none (plain EROFS image, not verified)".into(),
        }
    }
}

/// Parses `sha256:HEX`, `sha512:HEX` or bare (sha256) HEX into digest bytes.
pub fn parse_digest(s: &str) -> anyhow::Result<Vec<u8>> {
    let (alg, hex) = s.split_once(':').unwrap_or(("sha256", s));
    let size = match alg {
        "sha256" => 32,
        "sha512" => 64,
        _ => bail!("--digest {s:?}: unknown algorithm {alg:?} (expected sha256:HEX)"),
    };
    match hex::decode(hex) {
        Ok(b) if b.len() == size => Ok(b),
        _ => bail!(
            "--digest {s:?}: expected {alg}: and {} hex digits",
            2 * size
        ),
    }
}

/// How an image is read.
#[derive(Clone)]
pub struct ReadOpts {
    /// The verified source fetches level-0 tree blocks ahead of large reads.
    pub readahead: bool,
    /// `O_DIRECT`: bypass the page cache for the image file.
    pub direct: bool,
    /// Hash large reads on several threads (off for the mount daemon, whose requests
    /// already run in parallel).
    pub parallel_hashing: bool,
    /// A remote image (`oci://`) over plain HTTP, from this machine only.
    pub insecure: bool,
    /// How long a remote image's server may take to connect or answer.
    pub timeout: Duration,
    /// Where a remote image's verified bytes are kept, and the directory's size limit.
    pub cache: Option<(PathBuf, u64)>,
    /// `cache` is the default directory, not one asked for: when it cannot be used (a
    /// home that is not there, say), the image opens without it.
    pub default_cache: bool,
    /// The signature policy an `oci://` image's manifest must satisfy, loaded already
    /// (`None`: the pin's policy, loaded when the image is `oci://`).
    pub trust: Option<Arc<signatures::Trust>>,
}

impl Default for ReadOpts {
    fn default() -> Self {
        ReadOpts {
            readahead: true,
            direct: false,
            parallel_hashing: true,
            insecure: false,
            timeout: Duration::from_secs(30),
            cache: None,
            default_cache: false,
            trust: None,
        }
    }
}

/// Whether an image operand is a remote image (`oci://`, `http(s)://`), not a file.
pub fn is_remote(image: &Path) -> bool {
    image.to_str().is_some_and(remote::is_remote)
}

/// Whether any image operand is an `oci://` image, whose manifest the signature policy
/// must satisfy.
pub fn any_oci(images: &[PathBuf]) -> bool {
    images
        .iter()
        .any(|i| i.to_str().is_some_and(|s| s.starts_with("oci://")))
}

/// Opens an image (a file, or a remote image) for reading. Images with a verity section
/// are always read through the verified source; a plain EROFS image is accepted only when
/// `allow_plain` and never with a pinned digest.
pub fn open(path: &Path, pin: &Pin, allow_plain: bool, opts: &ReadOpts) -> anyhow::Result<Opened> {
    let name = path.display();
    let mut warnings = Vec::new();
    let (source, pin_bytes, remote) = match path.to_str().filter(|p| remote::is_remote(p)) {
        Some(spec) => {
            let (remote, pin) = remote_source(spec, pin, opts, &mut warnings)?;
            (
                Box::new(remote.clone()) as Box<dyn ByteSource>,
                Some(pin),
                Some(remote),
            )
        }
        None => (
            Box::new(file_source(path, opts.direct)?) as Box<dyn ByteSource>,
            pin.digest.as_deref().map(parse_digest).transpose()?,
            None,
        ),
    };
    match VerifiedSource::open(source, pin_bytes.as_deref()) {
        Ok(mut v) => {
            v.set_readahead(opts.readahead);
            v.set_parallel_hashing(opts.parallel_hashing);
            if let Some(remote) = &remote {
                // The image's first bytes (superblock, root, the first inodes) come on a
                // readahead thread meanwhile: the mount's first reads need them.
                remote.fetch_ahead(0, REMOTE_HEAD_AHEAD);
                // The whole tree (1/128 of the image) at once instead of each tree block
                // when a read needs it, with the data's last block before it (a verilay
                // image ends its EROFS area with the file-digest table, whose footer the
                // mount reads next), in pieces on several connections at once. Only a head
                // start: what fails here is fetched and checked again when a read needs it.
                let s = v.section();
                if s.tree_size <= REMOTE_TREE_AT_ONCE && v.len() > 0 {
                    let bs = u64::from(v.params().block_size);
                    let last = (v.len() - 1) / bs * bs;
                    remote.fetch_in_pieces(last, s.tree_offset + s.tree_size - last);
                }
                let _ = v.load_tree(REMOTE_TREE_AT_ONCE);
            }
            let v = Arc::new(v);
            let img =
                Image::open(v.clone() as Arc<dyn ByteSource>).with_context(|| format!("{name}"))?;
            // The inode area (everything before the shared xattrs) is read in groups, from
            // a file; over the network each block is fetched when needed.
            if remote.is_none() {
                let sb = img.superblock();
                v.set_dense_prefix(u64::from(sb.xattr_blkaddr) << sb.blkszbits);
            }
            Ok(Opened {
                img,
                remote,
                verified: Some(v),
                warnings,
            })
        }
        Err(OpenError::NoSection) if allow_plain && pin_bytes.is_none() => {
            let img = Image::open(Arc::new(file_source(path, false)?) as Arc<dyn ByteSource>)
                .with_context(|| format!("{name}"))?;
            Ok(Opened {
                img,
                remote: None,
                verified: None,
                warnings,
            })
        }
        Err(e) => Err(open_error(path, e)),
    }
}

/// The largest Merkle tree of a remote image fetched whole at open (an 8 GiB image's).
const REMOTE_TREE_AT_ONCE: u64 = 64 << 20;

/// How much of a remote image's start is fetched while its tree comes: a mount reads the
/// superblock and the root's inode and entries from there (12 KiB in a Linux tree's
/// image). Fewer chunks than make a reader after them dense or sequential to the remote
/// source (8 and 16): where file data follows a small image's head, a reader of it fetches
/// as it would have.
const REMOTE_HEAD_AHEAD: u64 = 16 << 10;

/// A remote image's source and its pin: `pin.digest`, or what a manifest named by its
/// own digest records. Nothing else says which bytes the network may bring.
fn remote_source(
    spec: &str,
    pin: &Pin,
    opts: &ReadOpts,
    warnings: &mut Vec<String>,
) -> anyhow::Result<(Arc<remote::RemoteSource>, Vec<u8>)> {
    // Loaded before the registry is asked anything: a bad policy fails at once.
    let trust = match &opts.trust {
        Some(t) => Some(t.clone()),
        None if spec.starts_with("oci://") => pin.policy.load()?.map(Arc::new),
        None => None,
    };
    let opened = remote::RemoteSource::open(spec, opts.insecure, opts.timeout, trust.as_deref())
        .map_err(anyhow::Error::msg)?;
    let digest = match (pin.digest.as_deref(), opened.pinned.as_deref()) {
        (Some(given), Some(noted)) if !given.eq_ignore_ascii_case(noted) => {
            bail!("{spec}: the pinned manifest records image digest {noted}, not --digest {given}")
        }
        (Some(given), _) => given.to_string(),
        (None, Some(noted)) => noted.to_string(),
        (None, None) => bail!(
            "{spec}: a remote image is mounted pinned only: give --digest, or name the manifest by its digest (…@sha256:…)"
        ),
    };
    let pin = parse_digest(&digest)?;
    let mut source = opened.source;
    if let Some((dir, limit)) = &opts.cache {
        // The server's length sizes (or resets) the entry and decides what is pruned for
        // it: it must be the one the pinned descriptor allows before the cache hears it.
        check_length(spec, &source, &pin)?;
        let key = format!(
            "{}:{}",
            if pin.len() == 64 { "sha512" } else { "sha256" },
            hex::encode(&pin)
        );
        match remote::cache::Cache::open(dir, &key, source.len(), *limit) {
            Ok(cache) => source = source.with_cache(cache),
            // A cache only saves fetches: with no room for it, the image opens without.
            Err(e) if no_room(&e) || opts.default_cache => {
                warnings.push(format!("{e}: mounting without a cache"))
            }
            Err(e) => return Err(anyhow::Error::msg(e)),
        }
    }
    Ok((source.shared(), pin))
}

/// Whether opening a cache entry failed for want of room (a full or read-only
/// filesystem, a quota, an image larger than a file there may be), not for a refusal.
fn no_room(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        StorageFull | QuotaExceeded | ReadOnlyFilesystem | FileTooLarge
    )
}

/// Whether the remote image's length is the one its pinned descriptor allows, by its
/// tail (one small request).
fn check_length(spec: &str, source: &remote::RemoteSource, pin: &[u8]) -> anyhow::Result<()> {
    use verity::verified::{check_tail, TAIL_SIZE};
    let len = source.len();
    if len < TAIL_SIZE {
        return Err(open_error(Path::new(spec), OpenError::NoSection));
    }
    // Read as any read is (no cache is attached yet): the chunk stays in memory, where
    // opening the verified source finds the tail again rather than fetch it twice.
    let mut tail = [0u8; TAIL_SIZE as usize];
    source
        .read_exact_at(&mut tail, len - TAIL_SIZE)
        .map_err(anyhow::Error::msg)?;
    check_tail(&tail, len, Some(pin))
        .map(drop)
        .map_err(|e| open_error(Path::new(spec), e))
}

/// The verified source alone, without parsing the EROFS image on top (`verify` must be
/// able to name a bad superblock rather than fail to open it).
pub fn open_verified(path: &Path, pin: &Pin) -> anyhow::Result<VerifiedSource<FileSource>> {
    let pin_bytes = pin.digest.as_deref().map(parse_digest).transpose()?;
    VerifiedSource::open(file_source(path, false)?, pin_bytes.as_deref())
        .map_err(|e| open_error(path, e))
}

/// The image file, optionally for direct I/O.
fn file_source(path: &Path, direct: bool) -> anyhow::Result<FileSource> {
    let name = path.display();
    if direct {
        FileSource::open_direct(path).with_context(|| format!("opening {name} for direct I/O"))
    } else {
        FileSource::open(path).with_context(|| format!("opening {name}"))
    }
}

fn open_error(path: &Path, e: OpenError) -> anyhow::Error {
    let name = path.display();
    match e {
        OpenError::NoSection => anyhow::anyhow!(
            "{name}: no verity section, so nothing can be verified (was it built by `verilay build`?)"
        ),
        e => anyhow::anyhow!("{name}: {e}"),
    }
}

/// Resolves an absolute or relative path from the root, one lookup per component
/// (symlinks are not followed: the image's own tree is what is resolved).
pub fn resolve(img: &Img, path: &str) -> anyhow::Result<Inode> {
    let mut inode = img.inode(img.root_nid())?;
    for comp in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
        if !inode.is_dir() {
            bail!("{path}: a component before {comp:?} is not a directory");
        }
        match img.lookup(&inode, comp.as_bytes())? {
            Some(e) => inode = img.inode(e.nid)?,
            None => bail!("{path}: no such file or directory in the image"),
        }
    }
    Ok(inode)
}
