//! `verilay build SRC -o IMAGE`: options in the spirit of mkfs.erofs.

use crate::progress;
use anyhow::{bail, Context};
use erofs::builder::{self, BuildOptions, Overrides};
use indicatif::ProgressBar;
use regex::bytes::Regex;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    /// Directory, or container layer tarball (tar, tar.gz, tar.zst), to build the image
    /// from. A layer's whiteouts (`.wh.NAME`, `.wh..wh..opq`) are kept as overlayfs reads
    /// them, so images of layers stack with `verilay mount`.
    src: PathBuf,
    /// Image file to write (replaced atomically).
    #[arg(short, long, value_name = "IMAGE")]
    output: PathBuf,
    /// Block size in bytes (power of two, 512..=65536; the kernel mounts up to its page size).
    #[arg(short = 'b', long, default_value_t = 4096)]
    block_size: u32,
    /// Leave out the per-inode xattr name filters (kernel 6.6+ feature).
    #[arg(long)]
    no_xattr_filter: bool,
    /// Never store long xattr name prefixes (keeps images mountable on kernels before 6.4).
    #[arg(long)]
    no_long_prefixes: bool,
    /// Do not pack file tails next to inodes (like mkfs.erofs -E noinline_data).
    #[arg(long)]
    no_inline_data: bool,
    /// Write a plain EROFS image: no per-file digests and no verity section (such an
    /// image cannot be verified or pinned).
    #[arg(long)]
    no_verity: bool,
    /// Make every file owned by root (uid 0, gid 0).
    #[arg(long)]
    all_root: bool,
    /// Set every file's owner to UID.
    #[arg(long, value_name = "UID")]
    force_uid: Option<u32>,
    /// Set every file's group to GID.
    #[arg(long, value_name = "GID")]
    force_gid: Option<u32>,
    /// Add N to every uid (may be negative).
    #[arg(
        long,
        value_name = "N",
        allow_hyphen_values = true,
        default_value_t = 0
    )]
    uid_offset: i64,
    /// Add N to every gid (may be negative).
    #[arg(
        long,
        value_name = "N",
        allow_hyphen_values = true,
        default_value_t = 0
    )]
    gid_offset: i64,
    /// Give every file this timestamp: SECONDS[.NANOSECONDS] since 1970.
    #[arg(long, value_name = "TIME")]
    mtime: Option<String>,
    /// Build time recorded in the image (seconds since 1970). Defaults to
    /// $SOURCE_DATE_EPOCH, which also makes the UUID reproducible, or the current time.
    #[arg(long, value_name = "SECONDS")]
    build_time: Option<u64>,
    /// Filesystem UUID (otherwise random, or derived from the contents when reproducible).
    #[arg(short = 'U', long)]
    uuid: Option<String>,
    /// Volume label, at most 15 bytes.
    #[arg(short = 'L', long)]
    label: Option<String>,
    /// Leave out this path (relative to SRC) and everything below it. Repeatable.
    #[arg(long, value_name = "PATH")]
    exclude_path: Vec<String>,
    /// Leave out paths (relative to SRC, no leading /) matching this regex. Repeatable.
    #[arg(long, value_name = "REGEX")]
    exclude_regex: Vec<String>,
    #[command(flatten)]
    compression: CompressArgs,
    /// No progress bar and no summary line.
    #[arg(short, long)]
    quiet: bool,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    json: bool,
}

/// A build's progress on a bar.
pub(crate) struct Bar(pub(crate) ProgressBar);

impl builder::Progress for Bar {
    fn scanned(&self, entries: u64) {
        self.0.set_position(entries);
    }
    fn compressing(&self, total: u64) {
        progress::bytes(&self.0, "compressing", total);
    }
    fn writing(&self, total: u64) {
        progress::bytes(&self.0, "copying", total);
    }
    fn wrote(&self, bytes: u64) {
        self.0.inc(bytes);
    }
    fn hashing(&self, total: u64) {
        progress::bytes(&self.0, "hashing", total);
    }
    fn hashed(&self, bytes: u64) {
        self.0.inc(bytes);
    }
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let start = Instant::now();
    // Bad compression flags are usage errors (exit 2), like the flags clap rejects.
    let compression = match a.compression.settings(a.block_size) {
        Ok(c) => c,
        Err(msg) => {
            eprintln!("verilay: error: {msg}");
            return Ok(2);
        }
    };
    let env_epoch = match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(v) => Some(
            v.trim()
                .parse::<u64>()
                .with_context(|| format!("SOURCE_DATE_EPOCH={v:?} is not a number"))?,
        ),
        Err(_) => None,
    };
    let fixed_time = a.build_time.or(env_epoch);
    let build_time = match fixed_time {
        Some(t) => t,
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs(),
    };
    let uuid = match (&a.uuid, fixed_time) {
        (Some(u), _) => Some(parse_uuid(u)?),
        (None, Some(_)) => None,
        (None, None) => Some(random_uuid()?),
    };
    let mut overrides = Overrides {
        uid: a.force_uid,
        gid: a.force_gid,
        uid_offset: a.uid_offset,
        gid_offset: a.gid_offset,
        mtime: a.mtime.as_deref().map(parse_time).transpose()?,
    };
    if a.all_root {
        overrides.uid = Some(0);
        overrides.gid = Some(0);
    }
    let opts = BuildOptions {
        block_size: a.block_size,
        xattr_filter: !a.no_xattr_filter,
        long_prefixes: !a.no_long_prefixes,
        inline_data: !a.no_inline_data,
        verity: !a.no_verity,
        build_time,
        uuid,
        label: a.label.clone().unwrap_or_default().into_bytes(),
        overrides,
        compression,
    };

    let exclude_paths: Vec<Vec<u8>> = a
        .exclude_path
        .iter()
        .map(|p| p.trim_matches('/').as_bytes().to_vec())
        .collect();
    let exclude_regexes = a
        .exclude_regex
        .iter()
        .map(|r| Regex::new(r).with_context(|| format!("--exclude-regex {r:?}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let exclude = |rel: &[u8]| {
        exclude_paths.iter().any(|p| p == rel) || exclude_regexes.iter().any(|r| r.is_match(rel))
    };

    let pb = progress::bar(a.quiet || a.json);
    progress::counting(&pb, "scanning");
    let bar = Bar(pb);
    super::registry::check_output(&a.output)?;
    let building = || format!("building {}", a.output.display());
    let is_tar = tarlayer::is_archive(&a.src);
    match std::fs::metadata(&a.src) {
        Ok(m) if !is_tar && !m.is_dir() => {
            bail!(
                "{}: neither a directory nor a layer tarball (tar, tar.gz, tar.zst){}",
                a.src.display(),
                match m.len() {
                    n if m.is_file() && n < 512 =>
                        format!(": {n} bytes, shorter than one tar header (512 bytes)"),
                    _ => String::new(),
                }
            )
        }
        _ => {}
    }
    let summary = if is_tar {
        if !a.exclude_path.is_empty() || !a.exclude_regex.is_empty() {
            bail!("--exclude-path and --exclude-regex apply to directories, not to tar layers");
        }
        // Contents are spilled next to the output, where the image will need room anyway.
        let spill_dir = match a.output.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => std::path::Path::new("."),
        };
        let (mut tree, stats) = tarlayer::read_layer(&a.src, spill_dir, u64::MAX, &|n| {
            builder::Progress::scanned(&bar, n)
        })
        .with_context(building)?;
        builder::apply_overrides(&mut tree, &opts.overrides);
        let mut s = builder::build_tree(&tree, &opts, &a.output, &bar).with_context(building)?;
        s.skipped_xattrs = stats.skipped_xattrs;
        s
    } else {
        builder::build_dir(&a.src, &exclude, &opts, &a.output, &bar).with_context(building)?
    };
    bar.0.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();

    for s in summary.skipped_xattrs.iter().take(5) {
        eprintln!("verilay: warning: skipped xattr without an EROFS namespace: {s}");
    }
    if summary.skipped_xattrs.len() > 5 {
        eprintln!(
            "verilay: warning: ... and {} more skipped xattrs",
            summary.skipped_xattrs.len() - 5
        );
    }
    let digest = summary
        .digest
        .as_ref()
        .map(|d| format!("sha256:{}", verity::verified::hex(d)));
    if a.json {
        let j = serde_json::json!({
            "image": a.output,
            "digest": digest,
            "erofs_bytes": summary.erofs_bytes,
            "inodes": summary.inodes,
            "regular_files": summary.regular_files,
            "directories": summary.directories,
            "bytes_in": summary.bytes_in,
            "image_bytes": summary.image_bytes,
            "block_size": summary.block_size,
            "shared_xattrs": summary.shared_xattrs,
            "long_prefixes": summary.long_prefixes,
            "skipped_xattrs": summary.skipped_xattrs.len(),
            "compression": summary.compression,
            "pcluster_size": compression.map(|z| z.pcluster),
            "compressed_files": summary.compressed_files,
            "ratio": ratio(&summary),
            "seconds": secs,
        });
        outln!("{j}");
    } else if !a.quiet {
        let compressed = match &summary.compression {
            Some(c) => format!(
                ", {c}: {} files compressed, ratio {:.2}",
                summary.compressed_files,
                ratio(&summary)
            ),
            None => String::new(),
        };
        eprintln!(
            "{}: {} inodes ({} files, {} directories), {} in, image {}{compressed}, {:.2} s",
            a.output.display(),
            summary.inodes,
            summary.regular_files,
            summary.directories,
            progress::human(summary.bytes_in),
            progress::human(summary.image_bytes),
            secs
        );
    }
    // The digest is the build's result: on stdout, for `DIGEST=$(verilay build -q …)`.
    if let (Some(d), false) = (&digest, a.json) {
        outln!("{d}");
    }
    Ok(0)
}

/// `-z` and `-C`, as `build` and `convert` take them.
#[derive(clap::Args)]
pub(crate) struct CompressArgs {
    /// Compress regular files, as mkfs.erofs -z spells it: lz4, lz4hc, zstd, lzma or
    /// deflate, each but lz4 with an optional `,LEVEL` (zstd,19). A file compression does
    /// not save a block for is stored plain.
    #[arg(short = 'z', long = "compress", value_name = "ALG[,LEVEL]")]
    compress: Option<String>,
    /// With -z: the physical cluster size in bytes, a multiple of the block size up to
    /// 1 MiB (mkfs.erofs -C; default the block size). Larger clusters compress better
    /// and cost more to read at random.
    #[arg(short = 'C', long = "pcluster-size", value_name = "BYTES")]
    pcluster_size: Option<String>,
}

impl CompressArgs {
    /// The settings for images of `bs`-byte blocks; the error is a usage error's line.
    pub(crate) fn settings(&self, bs: u32) -> Result<Option<builder::compress::Settings>, String> {
        compression_settings(self.compress.as_deref(), self.pcluster_size.as_deref(), bs)
    }
}

fn compression_settings(
    compress: Option<&str>,
    pcluster_size: Option<&str>,
    bs: u32,
) -> Result<Option<builder::compress::Settings>, String> {
    let Some(z) = compress else {
        return match pcluster_size {
            Some(_) => Err("-C (--pcluster-size) needs -z (--compress)".into()),
            None => Ok(None),
        };
    };
    let compression: codecs::Compression = z.parse().map_err(|e| format!("-z {z}: {e}"))?;
    let pcluster = match pcluster_size {
        None => bs,
        Some(c) => {
            let max = erofs::zformat::PCLUSTER_MAX_SIZE;
            let bad = || {
                format!("-C {c}: the physical cluster size must be a multiple of the block size ({bs}) up to {max} bytes")
            };
            let p: u32 = c.parse().map_err(|_| bad())?;
            if p == 0 || !p.is_multiple_of(bs.max(1)) || p > max {
                return Err(bad());
            }
            p
        }
    };
    Ok(Some(builder::compress::Settings {
        compression,
        pcluster,
    }))
}

/// Content bytes per image byte: how much smaller the image is than what it holds.
fn ratio(s: &builder::Summary) -> f64 {
    s.bytes_in as f64 / s.erofs_bytes.max(1) as f64
}

fn parse_time(s: &str) -> anyhow::Result<(i64, u32)> {
    let (secs, nsec) = s.split_once('.').unwrap_or((s, "0"));
    let secs: i64 = secs
        .parse()
        .with_context(|| format!("--mtime {s:?}: seconds are not a number"))?;
    if nsec.is_empty() || nsec.len() > 9 || !nsec.bytes().all(|b| b.is_ascii_digit()) {
        bail!("--mtime {s:?}: expected SECONDS[.NANOSECONDS] with up to 9 fraction digits");
    }
    let nsec: u32 = format!("{nsec:0<9}").parse()?;
    Ok((secs, nsec))
}

fn parse_uuid(s: &str) -> anyhow::Result<[u8; 16]> {
    let hex: String = s.chars().filter(|&c| c != '-').collect();
    if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("--uuid {s:?} is not a UUID (expected 32 hex digits, dashes optional)");
    }
    let mut u = [0u8; 16];
    for (i, b) in u.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)?;
    }
    Ok(u)
}

fn random_uuid() -> anyhow::Result<[u8; 16]> {
    use std::io::Read;
    let mut u = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut u))
        .context("reading /dev/urandom")?;
    u[6] = (u[6] & 0x0F) | 0x40;
    u[8] = (u[8] & 0x3F) | 0x80;
    Ok(u)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_uuids() {
        assert_eq!(parse_time("12").unwrap(), (12, 0));
        assert_eq!(parse_time("12.5").unwrap(), (12, 500_000_000));
        assert_eq!(parse_time("-1.000000001").unwrap(), (-1, 1));
        assert!(parse_time("1.").is_err());
        assert!(parse_time("x").is_err());
        assert_eq!(
            parse_uuid("00112233-4455-6677-8899-aabbccddeeff").unwrap()[15],
            0xff
        );
        assert!(parse_uuid("0011").is_err());
    }
}
