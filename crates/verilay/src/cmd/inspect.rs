//! `verilay inspect IMAGE [PATH]`: the superblock, or one inode in detail.

use super::image::{mode_string, open, resolve, show_bytes};
use erofs::format::*;
use erofs::zformat;
use serde_json::json;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    image: PathBuf,
    /// Path inside the image (absolute or relative to its root).
    path: Option<String>,
    #[command(flatten)]
    pin: super::image::Pin,
    #[command(flatten)]
    remote: super::registry::Remote,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let opened = open(&a.image, &a.pin, &a.remote, true)?;
    let img = &opened.img;
    let v = match &a.path {
        None => {
            let mut v = superblock(img);
            v["image_bytes"] = json!(std::fs::metadata(&a.image)?.len());
            v["digest"] = json!(opened.trust());
            v["erofs_bytes"] = json!(img.erofs_len());
            v["file_digests"] = json!(img.digest_table()?.map(|t| t.entries));
            // What a measurement policy sees for files served from this image.
            let digest = opened.verified.as_ref().map(|s| s.digest()).unwrap_or(&[]);
            let id = imagefs::measuring::image_identity(img.superblock().uuid, digest);
            v["measured_as"] = json!(super::measuring::describe(&id));
            v
        }
        Some(p) => inode(img, p)?,
    };
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_text(&v, 0);
    }
    Ok(0)
}

fn superblock(img: &super::image::Img) -> serde_json::Value {
    let sb = img.superblock();
    let uuid = measure::policy::uuid_text(&sb.uuid);
    let label_len = sb.volume_name.iter().position(|&b| b == 0).unwrap_or(16);
    let mut compat = Vec::new();
    for (bit, name) in [
        (FEATURE_COMPAT_SB_CHKSUM, "sb_chksum"),
        (FEATURE_COMPAT_MTIME, "mtime"),
        (FEATURE_COMPAT_XATTR_FILTER, "xattr_filter"),
    ] {
        if sb.feature_compat & bit != 0 {
            compat.push(name);
        }
    }
    let mut incompat = Vec::new();
    for (bit, name) in [
        (FEATURE_INCOMPAT_CHUNKED_FILE, "chunked_file"),
        (FEATURE_INCOMPAT_XATTR_PREFIXES, "xattr_prefixes"),
        (zformat::FEATURE_INCOMPAT_LZ4_0PADDING, "lz4_0padding"),
        (zformat::FEATURE_INCOMPAT_COMPR_CFGS, "compr_cfgs"),
        (zformat::FEATURE_INCOMPAT_COMPR_HEAD2, "compr_head2"),
        (zformat::FEATURE_INCOMPAT_ZTAILPACKING, "ztailpacking"),
        (zformat::FEATURE_INCOMPAT_FRAGMENTS, "fragments"),
    ] {
        if sb.feature_incompat & bit != 0 {
            incompat.push(name);
        }
    }
    let z = img.zconfig();
    // Compression is in use when a compressed inode can be: any compression feature, or
    // the legacy LZ4 image with none (its max distance field set).
    let zbits = zformat::FEATURE_INCOMPAT_LZ4_0PADDING | zformat::FEATURE_INCOMPAT_COMPR_CFGS;
    let compression = (sb.feature_incompat & zbits != 0 || sb.available_compr_algs != 0).then(|| {
        let algs: Vec<&str> = codecs::Algorithm::ALL
            .iter()
            .filter(|a| z.algs & (1 << a.erofs_id()) != 0)
            .map(|a| a.name())
            .collect();
        json!({
            "algorithms": algs,
            "config_records": z.records,
            "lz4_max_distance": z.lz4_max_distance,
            "lz4_max_pcluster_bytes": u64::from(z.lz4_max_pclusterblks) * u64::from(img.block_size()),
        })
    });
    json!({
        "image_bytes": img.image_len(),
        "block_size": img.block_size(),
        "blocks": sb.blocks,
        "inodes": sb.inos,
        "root_nid": img.root_nid(),
        "uuid": uuid,
        "label": String::from_utf8_lossy(&sb.volume_name[..label_len]),
        "epoch": sb.epoch as i64,
        "fixed_nsec": sb.fixed_nsec,
        "build_time": sb.epoch as i64 + sb.build_time as i64,
        "meta_blkaddr": sb.meta_blkaddr,
        "xattr_blkaddr": sb.xattr_blkaddr,
        "xattr_prefixes": sb.xattr_prefix_count,
        "features_compat": compat,
        "features_incompat": incompat,
        "compression": compression,
        "checksum": format!("0x{:08x}", sb.checksum),
    })
}

fn inode(img: &super::image::Img, path: &str) -> anyhow::Result<serde_json::Value> {
    let ino = resolve(img, path)?;
    let info = img.layout_info(&ino);
    let layout = match ino.layout {
        LAYOUT_FLAT_PLAIN => "flat_plain",
        LAYOUT_FLAT_INLINE => "flat_inline",
        LAYOUT_CHUNK_BASED => "chunk_based",
        zformat::LAYOUT_COMPRESSED_FULL => "compressed_full",
        zformat::LAYOUT_COMPRESSED_COMPACT => "compressed_compact",
        _ => "unknown",
    };
    let xattrs: Vec<serde_json::Value> = img
        .xattrs(&ino)?
        .into_iter()
        .map(|(n, v)| json!({ "name": String::from_utf8_lossy(&n), "value": show_bytes(&v), "size": v.len() }))
        .collect();
    let mut v = json!({
        "path": path,
        "nid": ino.nid,
        "mode": format!("{:o}", ino.mode),
        "type": mode_string(ino.mode),
        "uid": ino.uid,
        "gid": ino.gid,
        "nlink": ino.nlink,
        "size": ino.size,
        "mtime": ino.mtime,
        "mtime_nsec": ino.mtime_nsec,
        "inode": { "version": if ino.extended { "extended" } else { "compact" }, "offset": info.inode_offset, "size": info.inode_size },
        "layout": {
            "kind": layout,
            "start_block": info.start_block,
            "blocks": info.blocks,
            "inline_tail": info.tail.map(|(off, len)| json!({ "offset": off, "len": len })),
            "chunk_size": info.chunk_size,
            "chunks": info.chunk_count,
        },
        "xattr_body": { "offset": info.xattr_offset, "size": info.xattr_size },
        "xattrs": xattrs,
    });
    if let Some(z) = &info.compressed {
        v["compression"] = json!({
            "algorithms": z.algorithms,
            "lcluster_size": z.lcluster_size,
            "indexes": if z.compact { "compact" } else { "full" },
            "big_pclusters": z.big_pclusters,
            "extents": z.extents,
            "largest_pcluster": z.max_cluster,
            "inline_tail": z.inline_tail.map(|(off, len)| json!({ "offset": off, "len": len })),
            "fragment_offset": z.fragment,
            "stored_bytes": z.stored,
            // Stored over logical size, as `compsize` shows it.
            "ratio": if ino.size == 0 { 0.0 } else { ((z.stored as f64 / ino.size as f64) * 1000.0).round() / 1000.0 },
        });
    } else if ino.layout == zformat::LAYOUT_COMPRESSED_FULL
        || ino.layout == zformat::LAYOUT_COMPRESSED_COMPACT
    {
        // Say why, rather than show nothing.
        img.zmap(&ino, 0)?;
    }
    if ino.mode & S_IFMT == S_IFCHR || ino.mode & S_IFMT == S_IFBLK {
        v["rdev"] = json!(format!("{}:{}", ino.rdev.0, ino.rdev.1));
    }
    if ino.is_reg() {
        let digest = img.file_digest(&ino)?;
        v["fsverity_digest"] = json!(format!("sha256:{}", verity::verified::hex(&digest)));
    }
    if ino.is_symlink() {
        v["target"] = json!(String::from_utf8_lossy(&img.readlink(&ino)?));
    }
    Ok(v)
}

fn print_text(v: &serde_json::Value, indent: usize) {
    if let Some(map) = v.as_object() {
        for (k, val) in map {
            match val {
                serde_json::Value::Object(_) => {
                    outln!("{:indent$}{k}:", "");
                    print_text(val, indent + 2);
                }
                serde_json::Value::Array(items)
                    if items.iter().all(|i| i.is_object()) && !items.is_empty() =>
                {
                    outln!("{:indent$}{k}:", "");
                    for i in items {
                        let line: Vec<String> = i
                            .as_object()
                            .into_iter()
                            .flatten()
                            .map(|(k, v)| format!("{k}={}", plain(v)))
                            .collect();
                        outln!("{:indent$}  - {}", "", line.join(" "));
                    }
                }
                _ => outln!("{:indent$}{k}: {}", "", plain(val)),
            }
        }
    }
}

fn plain(v: &serde_json::Value) -> String {
    match v {
        // A label, an xattr name or a link target from the image: one line, shown.
        serde_json::Value::String(s) => host::text::one_line(s).into_owned(),
        serde_json::Value::Null => "-".into(),
        serde_json::Value::Array(a) => a.iter().map(plain).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}
