//! The image builder: source tree → [`tree::Tree`] → xattr plan → layout → image bytes.
//!
//! `scan` reads a host directory, `xattr` decides shared entries, long prefixes and name
//! filters, `layout` places every inode and data block, and `write` emits the bytes.

pub mod compress;
pub mod layout;
pub mod scan;
pub mod tree;
pub mod write;
pub mod xattr;

use std::path::{Path, PathBuf};

pub use scan::ExcludeFn;
pub use tree::{Content, Kind, Node, NodeId, Tree};

/// Everything a build can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O error on a named file (source or output).
    #[error("{}: {err}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        err: std::io::Error,
    },
    /// The input cannot be represented, or an option is invalid.
    #[error("{0}")]
    Input(String),
}

impl Error {
    pub(crate) fn source(path: &Path, err: std::io::Error) -> Error {
        Error::Io {
            path: path.to_path_buf(),
            err,
        }
    }

    /// A source file read failing mid-build: one that ended early shrank.
    pub(crate) fn changed(path: &Path, e: std::io::Error) -> Error {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Error::Input(format!("{}: file shrank during the build", path.display()))
        } else {
            Error::source(path, e)
        }
    }
}

/// The fs-verity parameters of both the image tree and the per-file digests.
pub fn verity_params() -> verity::Params {
    let block = 1u32 << crate::format::DIGEST_LOG_BLOCK_SIZE;
    verity::Params::new(verity::HashAlg::Sha256, block, Vec::new()).expect("valid parameters")
}

/// Progress callbacks, called from worker threads.
pub trait Progress: Sync {
    /// `entries` scanned so far (called every 1024 entries).
    fn scanned(&self, _entries: u64) {}
    /// Compressing regular files (`wrote` then counts their uncompressed bytes).
    fn compressing(&self, _total_bytes: u64) {}
    /// Writing file contents starts: `total_bytes` to write.
    fn writing(&self, _total_bytes: u64) {}
    /// `bytes` more written.
    fn wrote(&self, _bytes: u64) {}
    /// Sealing: the image's blocks are being hashed.
    fn hashing(&self, _total_bytes: u64) {}
    /// `bytes` more hashed.
    fn hashed(&self, _bytes: u64) {}
}

/// A `Progress` that reports nothing.
pub struct Silent;
impl Progress for Silent {}

/// Metadata rewrites applied to every node before layout (mkfs.erofs's `--all-root`,
/// `--force-uid`, `--uid-offset`, `-T`-style fixed timestamps).
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// Owner user id given to every node.
    pub uid: Option<u32>,
    /// Owner group id given to every node.
    pub gid: Option<u32>,
    /// Added to every uid (after `uid`), clamped to the u32 range.
    pub uid_offset: i64,
    /// Added to every gid (after `gid`), clamped to the u32 range.
    pub gid_offset: i64,
    /// Modification time (seconds, nanoseconds) given to every node.
    pub mtime: Option<(i64, u32)>,
}

/// How to build an image.
#[derive(Clone, Debug)]
pub struct BuildOptions {
    /// A power of two from 512 to 65536 (the kernel mounts up to the page size).
    pub block_size: u32,
    /// Store per-inode xattr name filters (kernel 6.6+ uses them; older ones ignore them).
    pub xattr_filter: bool,
    /// Store common xattr name prefixes once (needs kernel 6.4+ when used).
    pub long_prefixes: bool,
    /// Pack file and directory tails next to their inode.
    pub inline_data: bool,
    /// Seal the image: store every regular file's fs-verity digest and append the verity
    /// section (the image's Merkle tree). Off gives a plain EROFS image.
    pub verity: bool,
    /// Recorded as the image's build time (seconds since 1970).
    pub build_time: u64,
    /// `None` derives the UUID from the image contents (reproducible builds).
    pub uuid: Option<[u8; 16]>,
    /// Volume label, at most 15 bytes.
    pub label: Vec<u8>,
    /// Metadata rewrites applied to every node.
    pub overrides: Overrides,
    /// Compress regular files (`-z`, `-C`); `None` stores them plain.
    pub compression: Option<compress::Settings>,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            block_size: 4096,
            xattr_filter: true,
            long_prefixes: true,
            inline_data: true,
            verity: true,
            build_time: 0,
            uuid: None,
            label: Vec::new(),
            overrides: Overrides::default(),
            compression: None,
        }
    }
}

/// What a build produced.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Number of inodes.
    pub inodes: u64,
    /// Number of regular files.
    pub regular_files: u64,
    /// Number of directories.
    pub directories: u64,
    /// Bytes of regular-file content read.
    pub bytes_in: u64,
    /// The whole image file, verity section included.
    pub image_bytes: u64,
    /// The EROFS part (what the kernel mounts and the digest covers).
    pub erofs_bytes: u64,
    /// The image digest: fs-verity (SHA-256, 4 KiB, no salt) of the EROFS bytes.
    pub digest: Option<Vec<u8>>,
    /// Filesystem block size, in bytes.
    pub block_size: u32,
    /// Number of shared xattr entries.
    pub shared_xattrs: u64,
    /// Number of long xattr name prefixes.
    pub long_prefixes: u64,
    /// Xattrs left out because EROFS has no handler for their namespace.
    pub skipped_xattrs: Vec<String>,
    /// The compressor (`-z` spelling), when compressing.
    pub compression: Option<String>,
    /// Regular files stored compressed (the others gained nothing from it).
    pub compressed_files: u64,
    /// Blocks the compressed files' data takes, and their uncompressed bytes.
    pub compressed_blocks: u64,
    /// Uncompressed bytes of the compressed files.
    pub compressed_bytes_in: u64,
}

/// Builds an image of the directory `src` into `out_path`.
pub fn build_dir(
    src: &Path,
    exclude: &ExcludeFn<'_>,
    opts: &BuildOptions,
    out_path: &Path,
    progress: &dyn Progress,
) -> Result<Summary, Error> {
    validate(opts)?;
    trace("start");
    let count = std::sync::atomic::AtomicU64::new(0);
    let (mut tree, stats) = scan::scan_dir(src, exclude, &|| {
        let n = count.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if n.is_multiple_of(1024) {
            progress.scanned(n);
        }
    })?;
    apply_overrides(&mut tree, &opts.overrides);
    trace("scan");
    let mut summary = build_tree(&tree, opts, out_path, progress)?;
    summary.skipped_xattrs = stats.skipped_xattrs;
    Ok(summary)
}

/// Builds an image of an in-memory tree into `out_path` (written via a temporary file
/// and renamed, so a failed build never leaves a partial image under the final name).
pub fn build_tree(
    tree: &Tree,
    opts: &BuildOptions,
    out_path: &Path,
    progress: &dyn Progress,
) -> Result<Summary, Error> {
    validate(opts)?;
    validate_tree(tree)?;
    let xplan = xattr::plan(tree, opts.xattr_filter, opts.long_prefixes);
    // The inline body's size is known only once sharing and prefixes are planned.
    if let Some(id) = xplan.per_node.iter().position(|x| x.icount().is_none()) {
        return Err(Error::Input(format!(
            "{}: its xattrs take {} bytes; an EROFS inode holds at most {}",
            tree.path_of(id),
            xplan.per_node[id].ibody_size(),
            xattr::MAX_IBODY
        )));
    }
    let bs = u64::from(opts.block_size);
    let (packed, spill) = match &opts.compression {
        Some(z) => {
            let spill = compress::Spill::create(&spill_path(out_path))?;
            let packed = compress::compress_files(tree, z, bs, opts.verity, &spill, progress)?;
            (packed, Some(spill))
        }
        None => (Vec::new(), None),
    };
    trace("compressed");
    let zsuper = opts
        .compression
        .as_ref()
        .map(|z| (*z, compress::super_fields(z, bs)));
    let lopts = layout::LayoutOptions {
        block_size: bs,
        inline_data: opts.inline_data,
        file_digests: opts.verity,
        packed: &packed,
        super_extra: zsuper.as_ref().map_or(0, |(_, f)| f.records.len() as u64),
    };
    let layout = layout::plan(tree, &xplan, &lopts)?;
    trace("plan");

    let mut label = [0u8; 16];
    label[..opts.label.len()].copy_from_slice(&opts.label);
    let params = write::SuperParams {
        xattr_filter: opts.xattr_filter,
        build_time: opts.build_time,
        uuid: opts.uuid,
        volume_name: label,
        compression: zsuper
            .zip(spill.as_ref())
            .map(|((settings, fields), spill)| write::Compressed {
                settings,
                fields,
                packed: &packed,
                spill,
            }),
    };
    let tmp = temp_path(out_path);
    let _ = std::fs::remove_file(&tmp); // a leftover of a killed build
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&tmp)
        .map_err(|e| Error::source(&tmp, e))?;
    // No fsync: like mkfs tools, the image is durable once the caller syncs. Forcing
    // writeback here would double the build time for no integrity gain: the image
    // carries its own checksums, and the rename below is what makes it visible.
    let result = write::write_image(tree, &xplan, &layout, &params, &file, &tmp, progress)
        .and_then(|w| {
            trace("unmapped");
            let digest = match w.level0 {
                Some(level0) => Some(
                    verity::appended::append(&file, &verity_params(), w.len, level0)
                        .map_err(|e| Error::source(&tmp, e))?,
                ),
                None => None,
            };
            trace("sealed");
            let total = file.metadata().map_err(|e| Error::source(&tmp, e))?.len();
            std::fs::rename(&tmp, out_path).map_err(|e| Error::source(out_path, e))?;
            Ok((w.len, total, digest))
        });
    let (erofs_bytes, image_bytes, digest) = match result {
        Ok(r) => {
            trace("written");
            r
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };

    let mut s = Summary {
        image_bytes,
        erofs_bytes,
        digest,
        block_size: opts.block_size,
        inodes: layout.order.len() as u64,
        shared_xattrs: xplan.shared_offsets.len() as u64,
        long_prefixes: xplan.prefixes.len() as u64,
        ..Default::default()
    };
    if let Some(z) = &opts.compression {
        s.compression = Some(z.compression.to_string());
        for (id, p) in packed.iter().enumerate() {
            if let Some(p) = p {
                s.compressed_files += 1;
                s.compressed_blocks += p.blocks(bs);
                s.compressed_bytes_in += tree.nodes[id].size;
            }
        }
    }
    for &id in &layout.order {
        match &tree.nodes[id].kind {
            Kind::Regular { .. } => {
                s.regular_files += 1;
                s.bytes_in += tree.nodes[id].size;
            }
            Kind::Directory { .. } => s.directories += 1,
            _ => {}
        }
    }
    Ok(s)
}

/// Phase timings on stderr when `VERILAY_TRACE` is set (for profiling builds).
pub(crate) fn trace(phase: &str) {
    use std::sync::OnceLock;
    static START: OnceLock<Option<std::time::Instant>> = OnceLock::new();
    if let Some(start) =
        START.get_or_init(|| std::env::var_os("VERILAY_TRACE").map(|_| std::time::Instant::now()))
    {
        eprintln!(
            "verilay: trace: {phase} done at {:.3} s",
            start.elapsed().as_secs_f64()
        );
    }
}

/// Where compressed clusters wait until the layout is known (unlinked once open).
fn spill_path(out: &Path) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".zspill{}", std::process::id()));
    out.with_file_name(name)
}

fn temp_path(out: &Path) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp{}", std::process::id()));
    out.with_file_name(name)
}

fn validate(opts: &BuildOptions) -> Result<(), Error> {
    let bs = opts.block_size;
    if !bs.is_power_of_two() || !(512..=65536).contains(&bs) {
        return Err(Error::Input(format!(
            "block size {bs} is not a power of two from 512 to 65536"
        )));
    }
    if let Some(z) = &opts.compression {
        let p = z.pcluster;
        if p == 0 || !p.is_multiple_of(bs) || p > crate::zformat::PCLUSTER_MAX_SIZE {
            return Err(Error::Input(format!(
                "physical cluster size {p} is not a multiple of the block size ({bs}) up to {} bytes",
                crate::zformat::PCLUSTER_MAX_SIZE
            )));
        }
    }
    if opts.label.len() > 15 {
        return Err(Error::Input(format!(
            "volume label is {} bytes; EROFS kernels reliably accept at most 15",
            opts.label.len()
        )));
    }
    Ok(())
}

/// Checks what the format cannot represent, so writing never has to fail on it.
fn validate_tree(tree: &Tree) -> Result<(), Error> {
    if !tree.nodes.first().is_some_and(|n| n.is_dir()) {
        return Err(Error::Input(
            "the root of an image must be a directory".into(),
        ));
    }
    for node in &tree.nodes {
        for (name, value) in &node.xattrs {
            if crate::format::split_xattr_name(name).is_none() {
                return Err(Error::Input(format!(
                    "xattr {} has no EROFS namespace",
                    String::from_utf8_lossy(name)
                )));
            }
            if value.len() > u16::MAX as usize || name.len() > 255 {
                return Err(Error::Input(format!(
                    "xattr {} is too large",
                    String::from_utf8_lossy(name)
                )));
            }
        }
        if let Kind::Directory { children } = &node.kind {
            for (name, _) in children {
                if name.is_empty()
                    || name.len() > crate::format::NAME_LEN
                    || name.contains(&b'/')
                    || name.contains(&0)
                    || name == b"."
                    || name == b".."
                {
                    return Err(Error::Input(format!(
                        "invalid file name {:?}",
                        String::from_utf8_lossy(name)
                    )));
                }
            }
        }
        if let Kind::Symlink { target } = &node.kind {
            if target.is_empty() || target.len() > 4095 {
                return Err(Error::Input(
                    "symlink target must be 1 to 4095 bytes".into(),
                ));
            }
        }
    }
    Ok(())
}

/// Applies the overrides `o` to every node of the tree.
pub fn apply_overrides(tree: &mut Tree, o: &Overrides) {
    for node in &mut tree.nodes {
        if let Some(uid) = o.uid {
            node.uid = uid;
        }
        if let Some(gid) = o.gid {
            node.gid = gid;
        }
        node.uid = (node.uid as i64 + o.uid_offset).clamp(0, u32::MAX as i64) as u32;
        node.gid = (node.gid as i64 + o.gid_offset).clamp(0, u32::MAX as i64) as u32;
        if let Some((s, ns)) = o.mtime {
            node.mtime = s;
            node.mtime_nsec = ns;
        }
    }
}
