//! `verilay cache ls|prune`: the persistent cache of remote images (`remote::cache`).

use anyhow::Context;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
    /// The cache directory (default: as `verilay mount` uses, $VERILAY_CACHE, else
    /// /var/cache/verilay for root, else ~/.cache/verilay).
    #[arg(long, global = true, value_name = "DIR")]
    cache: Option<PathBuf>,
    /// One JSON object per line.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(clap::Subcommand)]
enum Action {
    /// List cached images, least recently used first: digest, bytes cached of the
    /// image, whether complete (then the file is the image) or in use, and the file.
    Ls,
    /// Remove cached images no mount uses, least recently used first.
    Prune {
        /// Keep the most recently used ones that fit in SIZE (bytes, or K, M, G, T);
        /// without it every image not in use is removed.
        #[arg(long, value_name = "SIZE", value_parser = mountopts::parse_size)]
        max_size: Option<u64>,
    },
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let dir = a
        .cache
        .or_else(remote::cache::default_dir)
        .context("no cache directory: give --cache DIR (or set VERILAY_CACHE or HOME)")?;
    let entries = match a.action {
        Action::Ls => remote::cache::list(&dir),
        Action::Prune { max_size } => remote::cache::prune(&dir, max_size.unwrap_or(0)),
    }
    .map_err(anyhow::Error::msg)?;
    for e in &entries {
        if a.json {
            outln!("{}", serde_json::to_string(e)?);
            continue;
        }
        let state = match (e.complete, e.in_use) {
            (true, true) => "complete, in use",
            (true, false) => "complete",
            (false, true) => "partial, in use",
            (false, false) => "partial",
        };
        outln!(
            "{}  {}/{} bytes ({})  {}",
            e.digest,
            e.cached_bytes,
            e.image_bytes,
            state,
            e.path.display()
        );
    }
    Ok(0)
}
