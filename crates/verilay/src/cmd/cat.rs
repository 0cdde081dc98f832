//! `verilay cat IMAGE PATH...`: file contents, verified, on stdout.

use super::image::{resolve, Pin, ReadOpts};
use anyhow::{bail, Context};
use std::io::Write;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    image: PathBuf,
    /// Paths of regular files inside the image.
    #[arg(required = true)]
    paths: Vec<String>,
    #[command(flatten)]
    pin: Pin,
    #[command(flatten)]
    remote: super::registry::Remote,
    /// Read the image with O_DIRECT, bypassing the page cache.
    #[arg(long)]
    direct_io: bool,
    /// Read Merkle tree blocks one at a time, when first needed (for benchmarks).
    #[arg(long, hide = true)]
    no_readahead: bool,
}

/// Reads per call: large enough for tree readahead and parallel hashing to pay off.
const CHUNK: usize = 1 << 20;

pub fn run(a: Args) -> anyhow::Result<i32> {
    let opts = ReadOpts {
        readahead: !a.no_readahead,
        direct: a.direct_io,
        insecure: a.remote.insecure,
        timeout: a.remote.timeout()?,
        ..ReadOpts::default()
    };
    let opened = opening::open(&a.image, &a.pin.to_open(), false, &opts)?;
    opened.say_warnings();
    let img = opened.img;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut buf = vec![0u8; CHUNK];
    for p in &a.paths {
        let inode = resolve(&img, p)?;
        if !inode.is_reg() {
            bail!("{p}: not a regular file");
        }
        let mut off = 0u64;
        while off < inode.size {
            let n = img
                .read(&inode, off, &mut buf)
                .with_context(|| format!("{}: {p}", a.image.display()))?;
            if let Err(e) = out.write_all(&buf[..n]) {
                if e.kind() == std::io::ErrorKind::BrokenPipe {
                    return Ok(0);
                }
                bail!("writing output: {e}");
            }
            off += n as u64;
        }
    }
    out.flush().ok();
    Ok(0)
}
