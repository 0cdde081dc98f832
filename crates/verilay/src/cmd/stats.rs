//! `verilay stats MOUNTPOINT`: what a mount has cost so far (opens checked and measured,
//! bytes hashed, digests reused, entries logged, xattr requests, remote fetching), asked on
//! the mount's socket (`imagefs::mount::stats`), or read from the root's `verilay.stats`
//! attribute where there is no socket or another process holds its name.

use anyhow::Context;
use imagefs::mount::stats::Answer;
use imagefs::stats::Stats;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// A verilay mountpoint.
    mountpoint: PathBuf,
    /// Print the counters as one JSON object.
    #[arg(long)]
    json: bool,
    /// Give up on a daemon that has not answered after this many seconds.
    #[arg(long, default_value_t = 10, value_name = "SECS")]
    timeout: u64,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let timeout = Duration::from_secs(a.timeout.clamp(1, 24 * 3600));
    let stats = match imagefs::mount::stats::query(&a.mountpoint, timeout)? {
        Answer::Stats(stats) => stats,
        Answer::NoSocket => from_xattr(&a.mountpoint)?,
        // The kernel, not a name anyone can bind, leads to the attribute: the mount's
        // own answer where it still answers xattrs.
        Answer::Squatted(why) => match from_xattr(&a.mountpoint) {
            Ok(stats) => {
                eprintln!("verilay: warning: {why}; read the root's verilay.stats instead");
                stats
            }
            Err(_) => anyhow::bail!("{why}"),
        },
    };
    if a.json {
        outln!("{}", serde_json::Value::Object(stats));
        return Ok(0);
    }
    for (k, v) in &stats {
        outln!("{k:<16} {v}");
    }
    Ok(0)
}

/// The statistics of a daemon without a socket (an older verilay's), from the root's
/// `verilay.stats` attribute.
fn from_xattr(mountpoint: &Path) -> anyhow::Result<Stats> {
    let mp = mountpoint.display();
    // XATTR_SIZE_MAX: the most any attribute value can be (the kernel passes no more),
    // so one call gets it whole, however many layers it describes.
    let mut buf = vec![0u8; 65536];
    let n = rustix::fs::getxattr(mountpoint, "verilay.stats", &mut buf)
        .map_err(std::io::Error::from)
        .with_context(|| format!("{mp}: not a verilay mount (no statistics)"))?;
    let v: serde_json::Value =
        serde_json::from_slice(&buf[..n]).with_context(|| format!("{mp}: statistics: not JSON"))?;
    match v {
        serde_json::Value::Object(stats) => Ok(stats),
        _ => anyhow::bail!("{mp}: statistics: not a JSON object"),
    }
}
