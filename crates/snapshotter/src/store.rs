//! The snapshots and their directories, as containerd 1.6's overlayfs snapshotter keeps
//! them (`overlay.go`, `bolt.go`).
//!
//! - `ROOT/metadata.json` is replaced whole by rename: a crash leaves either state.
//! - `ROOT/snapshots/ID/{fs,work}` exist before the metadata names them and after it stops:
//!   a crash leaves at most a directory [`Store::cleanup`] removes.
//! - One process owns a root (`ROOT/lock`, flock).

use containerd_snapshots::api::types::Mount;
use containerd_snapshots::{Info, Kind, Usage};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

/// The most bytes a label's key and value may have together, as containerd's
/// `labels.Validate` bounds them.
pub const MAX_LABEL_BYTES: usize = 4096;
/// The most labels one snapshot may carry: containerd sets no count, but every label is
/// kept in memory and in the metadata file, so a caller may not make that unbounded.
pub const MAX_LABELS: usize = 256;
/// The longest key, name or parent accepted (bytes): keys are namespaced paths that
/// containerd makes, never this long.
pub const MAX_KEY_BYTES: usize = 4096;
/// The most filters one List may give (containerd gives one or two); each is bounded in
/// `filter`.
pub const MAX_FILTERS: usize = 64;

/// What went wrong, as the gRPC status code containerd expects for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// No snapshot has that key (containerd's `errdefs.ErrNotFound`).
    NotFound,
    /// A snapshot with that key exists already (`ErrAlreadyExists`).
    AlreadyExists,
    /// The snapshot is of the wrong kind, or has children (`ErrFailedPrecondition`).
    FailedPrecondition,
    /// The request itself is malformed (`ErrInvalidArgument`).
    InvalidArgument,
    /// The host failed (a directory or the metadata could not be written).
    Internal,
    /// What serves a remote layer cannot be reached (a registry down, a mount failing).
    Unavailable,
}

/// A failed request: its code and a one-line message naming what failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// The gRPC status code it becomes.
    pub code: Code,
    /// What failed, on one line.
    pub message: String,
}

impl Error {
    fn new(code: Code, message: impl Into<String>) -> Error {
        Error {
            code,
            message: message.into(),
        }
    }

    fn io(what: impl std::fmt::Display, e: std::io::Error) -> Error {
        Error::new(Code::Internal, format!("{what}: {e}"))
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<Error> for containerd_snapshots::tonic::Status {
    fn from(e: Error) -> Self {
        use containerd_snapshots::tonic::Status;
        match e.code {
            Code::NotFound => Status::not_found(e.message),
            Code::AlreadyExists => Status::already_exists(e.message),
            Code::FailedPrecondition => Status::failed_precondition(e.message),
            Code::InvalidArgument => Status::invalid_argument(e.message),
            Code::Internal => Status::internal(e.message),
            Code::Unavailable => Status::unavailable(e.message),
        }
    }
}

/// A snapshot's kind, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum StoredKind {
    Active,
    View,
    Committed,
}

impl StoredKind {
    fn kind(self) -> Kind {
        match self {
            StoredKind::Active => Kind::Active,
            StoredKind::View => Kind::View,
            StoredKind::Committed => Kind::Committed,
        }
    }
}

/// One snapshot's record in `metadata.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    /// Names its directory, `snapshots/ID`.
    id: u64,
    kind: StoredKind,
    /// The parent's key, or empty.
    parent: String,
    labels: BTreeMap<String, String>,
    created: SystemTime,
    updated: SystemTime,
    /// Measured when committed; active snapshots are measured when asked.
    size: i64,
    inodes: i64,
    /// A committed layer that is a verilay image mounted lazily, not a directory of ours.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    remote: Option<RemoteLayer>,
}

/// A layer served from its verilay image: where it is mounted, and how to mount it again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteLayer {
    /// The verilay image's digest (`sha256:…`): it pins every block served.
    pub image: String,
    /// What `verilay mount` mounts (`oci://REGISTRY/REPOSITORY@ARTIFACT_DIGEST`).
    pub source: String,
    /// Its mountpoint: the snapshot's `fs`, its children's lower layer.
    pub dir: PathBuf,
}

/// All of `metadata.json`.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Metadata {
    /// The next ID tried for a new snapshot; IDs are never reused while named.
    next_id: u64,
    snapshots: BTreeMap<String, Record>,
}

/// The snapshots under one root, owned by this process while it is open.
pub struct Store {
    root: PathBuf,
    meta: Mutex<Metadata>,
    /// Held for the store's life: a second snapshotter on the root would rename over our
    /// metadata.
    _lock: File,
    /// `index=off` on every overlay mount, as containerd's overlayfs snapshotter adds
    /// it where the kernel's overlay module has the `index` parameter.
    index_off: bool,
}

impl Store {
    /// Opens (making it if need be) the store under `root`, locking it.
    pub fn open(root: &Path) -> Result<Store, Error> {
        // Private, as containerd makes its snapshotters' roots: layers hold other users'
        // files, and the work directories must not be reached around overlayfs.
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(root.join("snapshots"))
            .map_err(|e| Error::io(format!("making {}", root.join("snapshots").display()), e))?;
        let root = std::fs::canonicalize(root)
            .map_err(|e| Error::io(format!("root {}", root.display()), e))?;
        let lock_path = root.join("lock");
        let lock = File::create(&lock_path)
            .map_err(|e| Error::io(format!("opening {}", lock_path.display()), e))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(
            |e| {
                Error::new(
                    Code::Internal,
                    format!(
                        "root {}: in use by another snapshotter ({e})",
                        root.display()
                    ),
                )
            },
        )?;
        let path = root.join("metadata.json");
        let meta = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                Error::new(Code::Internal, format!("reading {}: {e}", path.display()))
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Metadata {
                next_id: 1,
                ..Metadata::default()
            },
            Err(e) => return Err(Error::io(format!("reading {}", path.display()), e)),
        };
        check_remote_records(&root, &meta)
            .map_err(|e| Error::new(Code::Internal, format!("{}: {e}", path.display())))?;
        Ok(Store {
            root,
            meta: Mutex::new(meta),
            _lock: lock,
            index_off: Path::new("/sys/module/overlay/parameters/index").exists(),
        })
    }

    /// The root, canonical.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Metadata> {
        // A panic while holding it cannot leave the metadata half-changed on disk (it is
        // written whole), so a poisoned lock is taken as it is.
        self.meta.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn dir(&self, id: u64) -> PathBuf {
        self.root.join("snapshots").join(id.to_string())
    }

    fn fs_dir(&self, id: u64) -> PathBuf {
        self.dir(id).join("fs")
    }

    /// Where snapshot `r`'s files are: its layer's mountpoint, or `snapshots/ID/fs`.
    fn fs_of(&self, r: &Record) -> PathBuf {
        match &r.remote {
            Some(l) => l.dir.clone(),
            None => self.fs_dir(r.id),
        }
    }

    /// Writes the metadata whole: a temporary file, synced, renamed over the old one, and
    /// the directory synced so the rename holds.
    fn persist(&self, meta: &Metadata) -> Result<(), Error> {
        let path = self.root.join("metadata.json");
        let tmp = self.root.join("metadata.json.tmp");
        let bytes = serde_json::to_vec(meta)
            .map_err(|e| Error::new(Code::Internal, format!("encoding metadata: {e}")))?;
        let write = || -> std::io::Result<()> {
            let mut f = File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            File::open(&self.root)?.sync_all()
        };
        write().map_err(|e| Error::io(format!("writing {}", path.display()), e))
    }

    /// Prepare (`kind` active) or View (`kind` view): a new snapshot `key` over `parent`.
    pub fn create(
        &self,
        active: bool,
        key: &str,
        parent: &str,
        labels: HashMap<String, String>,
    ) -> Result<Vec<Mount>, Error> {
        check_key("key", key)?;
        check_parent_key(parent)?;
        let labels = check_labels(labels)?;
        let mut meta = self.lock();
        if meta.snapshots.contains_key(key) {
            return Err(Error::new(
                Code::AlreadyExists,
                format!("snapshot {key:?}: already exists"),
            ));
        }
        let parent_owner = if let Some(p) = committed_parent(&meta, parent)? {
            let st = std::fs::metadata(self.fs_of(p))
                .map_err(|e| Error::io(format!("parent {parent:?}'s directory"), e))?;
            Some((st.uid(), st.gid()))
        } else {
            None
        };
        // An ID whose directory exists (left by a crash before the metadata named it) is
        // skipped; Cleanup removes that directory.
        let mut id = meta.next_id.max(1);
        while self.dir(id).symlink_metadata().is_ok() {
            id += 1;
        }
        let kind = if active {
            StoredKind::Active
        } else {
            StoredKind::View
        };
        self.make_dirs(id, kind, parent_owner)?;
        let now = SystemTime::now();
        meta.next_id = id + 1;
        meta.snapshots.insert(
            key.to_string(),
            Record {
                id,
                kind,
                parent: parent.to_string(),
                labels,
                created: now,
                updated: now,
                size: 0,
                inodes: 0,
                remote: None,
            },
        );
        if let Err(e) = self.persist(&meta) {
            meta.snapshots.remove(key);
            let _ = std::fs::remove_dir_all(self.dir(id));
            return Err(e);
        }
        self.mounts_of(&meta, key)
    }

    /// `snapshots/ID` with `fs` (owned as the parent's is) and, for an active snapshot,
    /// `work`: made under a temporary name and renamed, so `snapshots/ID` is whole.
    fn make_dirs(&self, id: u64, kind: StoredKind, owner: Option<(u32, u32)>) -> Result<(), Error> {
        let tmp = self.root.join("snapshots").join(format!("new-{id}"));
        let make = || -> std::io::Result<()> {
            let _ = std::fs::remove_dir_all(&tmp);
            std::fs::DirBuilder::new().mode(0o700).create(&tmp)?;
            std::fs::DirBuilder::new()
                .mode(0o755)
                .create(tmp.join("fs"))?;
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::lchown(tmp.join("fs"), Some(uid), Some(gid))?;
            }
            if kind == StoredKind::Active {
                std::fs::DirBuilder::new()
                    .mode(0o711)
                    .create(tmp.join("work"))?;
            }
            std::fs::rename(&tmp, self.dir(id))
        };
        make().map_err(|e| {
            let _ = std::fs::remove_dir_all(&tmp);
            Error::io(
                format!("making snapshot directory {}", self.dir(id).display()),
                e,
            )
        })
    }

    /// The parents of `key`, nearest first.
    fn parents<'m>(&self, meta: &'m Metadata, key: &str) -> Vec<&'m Record> {
        let mut ids = Vec::new();
        let mut next = meta.snapshots.get(key).map(|r| r.parent.as_str());
        // Parents are committed before children exist and cannot be removed while they
        // have any, so the chain ends; the bound holds against a hand-edited file.
        while let Some(p) = next.filter(|p| !p.is_empty() && ids.len() <= meta.snapshots.len()) {
            let Some(r) = meta.snapshots.get(p) else {
                break;
            };
            ids.push(r);
            next = Some(r.parent.as_str());
        }
        ids
    }

    fn mounts_of(&self, meta: &Metadata, key: &str) -> Result<Vec<Mount>, Error> {
        let r = meta.snapshots.get(key).ok_or_else(|| not_found(key))?;
        if r.kind == StoredKind::Committed {
            return Err(Error::new(
                Code::FailedPrecondition,
                format!("snapshot {key:?} is not active"),
            ));
        }
        let parents: Vec<String> = self
            .parents(meta, key)
            .into_iter()
            .map(|p| self.fs_of(p).to_string_lossy().into_owned())
            .collect();
        let bind = |source: String, ro: bool| {
            vec![Mount {
                r#type: "bind".into(),
                source,
                target: String::new(),
                options: vec![if ro { "ro" } else { "rw" }.into(), "rbind".into()],
            }]
        };
        // Overlayfs needs a lower layer: with none the snapshot's own directory is bound.
        if parents.is_empty() {
            return Ok(bind(
                self.fs_of(r).to_string_lossy().into_owned(),
                r.kind == StoredKind::View,
            ));
        }
        let mut options = Vec::new();
        if self.index_off {
            options.push("index=off".to_string());
        }
        if r.kind == StoredKind::Active {
            options.push(format!(
                "workdir={}",
                self.dir(r.id).join("work").to_string_lossy()
            ));
            options.push(format!("upperdir={}", self.fs_of(r).to_string_lossy()));
        } else if parents.len() == 1 {
            // A view of one layer is that layer, read-only.
            return Ok(bind(parents[0].clone(), true));
        }
        options.push(format!("lowerdir={}", parents.join(":")));
        Ok(vec![Mount {
            r#type: "overlay".into(),
            source: "overlay".into(),
            target: String::new(),
            options,
        }])
    }

    /// The mounts of an active snapshot or a view.
    pub fn mounts(&self, key: &str) -> Result<Vec<Mount>, Error> {
        let meta = self.lock();
        self.mounts_of(&meta, key)
    }

    /// Commits active snapshot `key` as `name` (its layer measured), with `labels`.
    pub fn commit(
        &self,
        name: &str,
        key: &str,
        labels: HashMap<String, String>,
    ) -> Result<(), Error> {
        check_key("name", name)?;
        check_key("key", key)?;
        let labels = check_labels(labels)?;
        let mut meta = self.lock();
        let r = meta.snapshots.get(key).ok_or_else(|| not_found(key))?;
        if r.kind != StoredKind::Active {
            return Err(Error::new(
                Code::FailedPrecondition,
                format!("snapshot {key:?} is not active"),
            ));
        }
        if meta.snapshots.contains_key(name) {
            return Err(Error::new(
                Code::AlreadyExists,
                format!("snapshot {name:?}: already exists"),
            ));
        }
        let usage = disk_usage(&self.fs_dir(r.id))
            .map_err(|e| Error::io(format!("measuring snapshot {key:?}"), e))?;
        let mut r = meta.snapshots.remove(key).expect("looked up above");
        let old = r.clone();
        r.kind = StoredKind::Committed;
        r.labels = labels;
        // A committed snapshot is a new one, as containerd's storage records it.
        r.created = SystemTime::now();
        r.updated = r.created;
        r.size = usage.size;
        r.inodes = usage.inodes;
        // Children name their parent by key: an active snapshot has none.
        meta.snapshots.insert(name.to_string(), r);
        if let Err(e) = self.persist(&meta) {
            meta.snapshots.remove(name);
            meta.snapshots.insert(key.to_string(), old);
            return Err(e);
        }
        Ok(())
    }

    /// Removes snapshot `key` and its directory, refused while it has children. A removed
    /// remote layer that no other snapshot shows is handed to `release` under the store's
    /// lock, so no snapshot made meanwhile can show it.
    pub fn remove(&self, key: &str, release: &dyn Fn(&RemoteLayer)) -> Result<(), Error> {
        check_key("key", key)?;
        let mut meta = self.lock();
        if !meta.snapshots.contains_key(key) {
            return Err(not_found(key));
        }
        if let Some((child, _)) = meta.snapshots.iter().find(|(_, r)| r.parent == key) {
            return Err(Error::new(
                Code::FailedPrecondition,
                format!("cannot remove snapshot {key:?}: it has a child ({child:?})"),
            ));
        }
        let r = meta.snapshots.remove(key).expect("looked up above");
        if let Err(e) = self.persist(&meta) {
            meta.snapshots.insert(key.to_string(), r);
            return Err(e);
        }
        if let Some(l) = r.remote {
            // One mount per directory, whichever record names it.
            let shown = meta
                .snapshots
                .values()
                .any(|o| o.remote.as_ref().is_some_and(|o| o.dir == l.dir));
            if !shown {
                release(&l);
            }
            return Ok(());
        }
        // Unnamed now: a failure here leaves a directory Cleanup removes.
        let _ = std::fs::remove_dir_all(self.dir(r.id));
        Ok(())
    }

    /// Commits `layer` as snapshot `name` over `parent` (committed, or none), with
    /// `labels`: a remote layer containerd finds by its labels and does not unpack. One
    /// already committed under `name` with the same parent and layer counts as done.
    pub fn commit_remote(
        &self,
        name: &str,
        parent: &str,
        labels: HashMap<String, String>,
        layer: RemoteLayer,
    ) -> Result<(), Error> {
        check_key("name", name)?;
        check_parent_key(parent)?;
        let labels = check_labels(labels)?;
        let mut meta = self.lock();
        if let Some(r) = meta.snapshots.get(name) {
            if r.parent == parent && r.remote.as_ref() == Some(&layer) {
                return Ok(());
            }
            return Err(Error::new(
                Code::AlreadyExists,
                format!("snapshot {name:?}: already exists"),
            ));
        }
        committed_parent(&meta, parent)?;
        let now = SystemTime::now();
        meta.snapshots.insert(
            name.to_string(),
            Record {
                // Names no directory: the layer's files are its mount's.
                id: 0,
                kind: StoredKind::Committed,
                parent: parent.to_string(),
                labels,
                created: now,
                updated: now,
                size: 0,
                inodes: 0,
                remote: Some(layer),
            },
        );
        if let Err(e) = self.persist(&meta) {
            meta.snapshots.remove(name);
            return Err(e);
        }
        Ok(())
    }

    /// Refuses what a Prepare of `key` over `parent` with `labels` would be refused for,
    /// before a remote layer is looked up for it.
    pub fn check_prepare(
        &self,
        key: &str,
        parent: &str,
        labels: &HashMap<String, String>,
    ) -> Result<(), Error> {
        check_key("key", key)?;
        check_parent_key(parent)?;
        validate_labels(labels)?;
        committed_parent(&self.lock(), parent).map(drop)
    }

    /// Every remote layer a snapshot shows, once each.
    pub fn remote_layers(&self) -> Vec<RemoteLayer> {
        let meta = self.lock();
        let mut all: Vec<RemoteLayer> = Vec::new();
        for l in meta.snapshots.values().filter_map(|r| r.remote.as_ref()) {
            if !all.contains(l) {
                all.push(l.clone());
            }
        }
        all
    }

    /// The remote layers under snapshot `key` (itself included), nearest first.
    pub fn remote_chain(&self, key: &str) -> Vec<RemoteLayer> {
        let meta = self.lock();
        let own = meta.snapshots.get(key).and_then(|r| r.remote.clone());
        own.into_iter()
            .chain(
                self.parents(&meta, key)
                    .into_iter()
                    .filter_map(|p| p.remote.clone()),
            )
            .collect()
    }

    fn info(key: &str, r: &Record) -> Info {
        Info {
            kind: r.kind.kind(),
            name: key.to_string(),
            parent: r.parent.clone(),
            labels: r.labels.clone().into_iter().collect(),
            created_at: r.created,
            updated_at: r.updated,
        }
    }

    /// The info of snapshot `key`.
    pub fn stat(&self, key: &str) -> Result<Info, Error> {
        check_key("key", key)?;
        let meta = self.lock();
        let r = meta.snapshots.get(key).ok_or_else(|| not_found(key))?;
        Ok(Store::info(key, r))
    }

    /// Updates the labels of snapshot `info.name`: with no field paths all of them become
    /// `info.labels`; `labels` does the same; `labels.X` sets X (or removes it, when absent
    /// from `info.labels`). Other fields cannot change.
    pub fn update(&self, info: Info, fieldpaths: Option<Vec<String>>) -> Result<Info, Error> {
        check_key("name", &info.name)?;
        let given = check_labels(info.labels)?;
        let mut meta = self.lock();
        let r = meta.snapshots.get(&info.name).ok_or_else(|| {
            Error::new(
                Code::NotFound,
                format!("snapshot {:?}: not found", info.name),
            )
        })?;
        let mut labels = r.labels.clone();
        let paths = fieldpaths.unwrap_or_default();
        if paths.is_empty() {
            labels = given;
        } else {
            for p in &paths {
                if p == "labels" {
                    labels = given.clone();
                } else if let Some(k) = p.strip_prefix("labels.") {
                    match given.get(k) {
                        Some(v) => labels.insert(k.to_string(), v.clone()),
                        None => labels.remove(k),
                    };
                } else {
                    return Err(Error::new(
                        Code::InvalidArgument,
                        format!("cannot update field {p:?} of snapshot {:?}", info.name),
                    ));
                }
            }
        }
        if labels.len() > MAX_LABELS {
            return Err(Error::new(
                Code::InvalidArgument,
                format!("more than {MAX_LABELS} labels on snapshot {:?}", info.name),
            ));
        }
        let r = meta.snapshots.get_mut(&info.name).expect("looked up above");
        let old = (std::mem::replace(&mut r.labels, labels), r.updated);
        r.updated = SystemTime::now();
        if let Err(e) = self.persist(&meta) {
            let r = meta.snapshots.get_mut(&info.name).expect("looked up above");
            (r.labels, r.updated) = old;
            return Err(e);
        }
        Ok(Store::info(&info.name, &meta.snapshots[&info.name]))
    }

    /// Every snapshot that one of `filters` selects (all with none), by key.
    pub fn list(&self, filters: &[String]) -> Result<Vec<Info>, Error> {
        if filters.len() > MAX_FILTERS {
            return Err(Error::new(
                Code::InvalidArgument,
                format!("{} filters: at most {MAX_FILTERS}", filters.len()),
            ));
        }
        let filters = filters
            .iter()
            .map(|f| crate::filter::parse(f))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| Error::new(Code::InvalidArgument, e))?;
        let meta = self.lock();
        Ok(meta
            .snapshots
            .iter()
            .map(|(k, r)| Store::info(k, r))
            .filter(|i| filters.is_empty() || filters.iter().any(|f| f.selects(i)))
            .collect())
    }

    /// The space and inodes snapshot `key`'s own layer uses (measured now for an active
    /// snapshot, at commit for a committed one, nothing for a view).
    pub fn usage(&self, key: &str) -> Result<Usage, Error> {
        check_key("key", key)?;
        let (kind, id, size, inodes) = {
            let meta = self.lock();
            let r = meta.snapshots.get(key).ok_or_else(|| not_found(key))?;
            (r.kind, r.id, r.size, r.inodes)
        };
        if kind == StoredKind::Active {
            return disk_usage(&self.fs_dir(id))
                .map_err(|e| Error::io(format!("measuring snapshot {key:?}"), e));
        }
        Ok(Usage { size, inodes })
    }

    /// Removes every directory under `snapshots/` that no snapshot owns, then hands the
    /// remote layers snapshots show to `release_others` (under the store's lock).
    pub fn cleanup(&self, release_others: &dyn Fn(&[RemoteLayer])) -> Result<(), Error> {
        let meta = self.lock();
        let owned: HashSet<String> = meta.snapshots.values().map(|r| r.id.to_string()).collect();
        let dir = self.root.join("snapshots");
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| Error::io(format!("reading {}", dir.display()), e))?;
        for e in entries {
            let e = e.map_err(|e| Error::io(format!("reading {}", dir.display()), e))?;
            if owned.contains(&*e.file_name().to_string_lossy()) {
                continue;
            }
            let path = e.path();
            let gone = if e.file_type().is_ok_and(|t| t.is_dir()) {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            gone.map_err(|err| Error::io(format!("removing {}", path.display()), err))?;
        }
        let shown: Vec<RemoteLayer> = meta
            .snapshots
            .values()
            .filter_map(|r| r.remote.clone())
            .collect();
        release_others(&shown);
        Ok(())
    }
}

/// Where remote layers are mounted: `ROOT/remote/layers/IMAGE_HEX` (the layer store's
/// resolver, with state `ROOT/remote`, mounts them there).
pub fn remote_layer_dir(root: &Path, image: &str) -> PathBuf {
    root.join("remote/layers")
        .join(image.strip_prefix("sha256:").unwrap_or(image))
}

/// Every remote record names its own image's mountpoint under the root and a registry
/// source: what a hand-edited file names is unmounted and mounted as root.
fn check_remote_records(root: &Path, meta: &Metadata) -> Result<(), String> {
    for (key, r) in &meta.snapshots {
        let Some(l) = &r.remote else { continue };
        let valid = oci::reference::valid_digest(&l.image);
        if !valid || l.dir != remote_layer_dir(root, &l.image) || !l.source.starts_with("oci://") {
            return Err(format!(
                "snapshot {key:?}: a remote layer record that is not this root's ({} at {})",
                l.image,
                l.dir.display()
            ));
        }
    }
    Ok(())
}

/// The record of `parent`, which must be a committed snapshot (`None` for no parent).
fn committed_parent<'m>(meta: &'m Metadata, parent: &str) -> Result<Option<&'m Record>, Error> {
    if parent.is_empty() {
        return Ok(None);
    }
    let p = meta
        .snapshots
        .get(parent)
        .ok_or_else(|| Error::new(Code::NotFound, format!("parent {parent:?}: not found")))?;
    if p.kind != StoredKind::Committed {
        return Err(Error::new(
            Code::InvalidArgument,
            format!("parent {parent:?} is not a committed snapshot"),
        ));
    }
    Ok(Some(p))
}

fn not_found(key: &str) -> Error {
    Error::new(Code::NotFound, format!("snapshot {key:?}: not found"))
}

/// A parent key, when there is one, bounded as keys are.
fn check_parent_key(parent: &str) -> Result<(), Error> {
    match parent.is_empty() {
        true => Ok(()),
        false => check_key("parent", parent),
    }
}

fn check_key(what: &str, key: &str) -> Result<(), Error> {
    if key.is_empty() {
        return Err(Error::new(
            Code::InvalidArgument,
            format!("{what} is empty"),
        ));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(Error::new(
            Code::InvalidArgument,
            format!("{what} is longer than {MAX_KEY_BYTES} bytes"),
        ));
    }
    Ok(())
}

/// Labels as containerd bounds them (key and value at most 4096 bytes together), and at
/// most [`MAX_LABELS`] of them; those with empty values dropped.
fn check_labels(labels: HashMap<String, String>) -> Result<BTreeMap<String, String>, Error> {
    validate_labels(&labels)?;
    // An empty value is no label, as containerd's bolt storage writes labels.
    Ok(labels.into_iter().filter(|(_, v)| !v.is_empty()).collect())
}

/// Refuses labels [`check_labels`] would refuse.
fn validate_labels(labels: &HashMap<String, String>) -> Result<(), Error> {
    if labels.len() > MAX_LABELS {
        return Err(Error::new(
            Code::InvalidArgument,
            format!("{} labels: at most {MAX_LABELS}", labels.len()),
        ));
    }
    for (k, v) in labels {
        if k.len() + v.len() > MAX_LABEL_BYTES {
            let shown: String = k.chars().take(64).collect();
            return Err(Error::new(
                Code::InvalidArgument,
                format!(
                    "label {shown:?}: key and value greater than maximum size ({MAX_LABEL_BYTES} bytes)"
                ),
            ));
        }
    }
    Ok(())
}

/// Size (allocated blocks, 512 bytes each) and inodes under `dir`, itself included, each
/// inode counted once however many links it has, as containerd's `fs.DiskUsage` counts.
/// Symbolic links are not followed; nothing below another filesystem is counted.
pub fn disk_usage(dir: &Path) -> std::io::Result<Usage> {
    let top = std::fs::symlink_metadata(dir)?;
    let dev = top.dev();
    let mut seen = HashSet::new();
    let mut usage = Usage::default();
    let mut stack = vec![(dir.to_path_buf(), top)];
    while let Some((path, st)) = stack.pop() {
        if !seen.insert(st.ino()) {
            continue;
        }
        usage.inodes += 1;
        usage.size += (st.blocks() * 512) as i64;
        if st.is_dir() {
            for e in std::fs::read_dir(&path)? {
                let e = e?;
                let m = e.metadata()?;
                if m.dev() == dev {
                    stack.push((e.path(), m));
                }
            }
        }
    }
    Ok(usage)
}
