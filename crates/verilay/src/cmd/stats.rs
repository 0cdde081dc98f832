//! `verilay stats MOUNTPOINT`: what measuring has cost a mount so far (opens checked,
//! files hashed and bytes read for it, digests reused, entries logged), read from the
//! daemon as the mount root's `verilay.stats` attribute.

use anyhow::Context;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// A verilay mountpoint.
    mountpoint: PathBuf,
    /// Print the counters as one JSON object.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let mp = a.mountpoint.display();
    // XATTR_SIZE_MAX: the most any attribute value can be (the kernel passes no more),
    // so one call gets it whole, however many layers it describes.
    let mut buf = vec![0u8; 65536];
    let n = rustix::fs::getxattr(&a.mountpoint, "verilay.stats", &mut buf)
        .map_err(std::io::Error::from)
        .with_context(|| format!("{mp}: not a verilay mount (no statistics)"))?;
    let text = std::str::from_utf8(&buf[..n]).context("statistics: not UTF-8")?;
    let v: serde_json::Value =
        serde_json::from_str(text).with_context(|| format!("{mp}: statistics: not JSON"))?;
    if a.json {
        outln!("{v}");
        return Ok(0);
    }
    let Some(map) = v.as_object() else {
        anyhow::bail!("{mp}: statistics: not a JSON object");
    };
    for (k, v) in map {
        outln!("{k:<16} {v}");
    }
    Ok(0)
}
