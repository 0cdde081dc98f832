//! `verilay digest FILE...`: fs-verity file digests, printed as `fsverity digest` does.

use anyhow::{bail, Context};
use std::path::PathBuf;
use verity::{digest_file, Descriptor, HashAlg, Params};

#[derive(clap::Args)]
pub struct Args {
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// sha256 or sha512.
    #[arg(long, default_value = "sha256")]
    hash_alg: String,
    /// Merkle tree block size (1024..=65536).
    #[arg(long, default_value_t = 4096)]
    block_size: u32,
    /// Salt as hex, up to 32 bytes.
    #[arg(long, value_name = "HEX")]
    salt: Option<String>,
    /// Print only the hex digest.
    #[arg(long)]
    compact: bool,
    /// Write the Merkle tree (top level first) to this file (one input file only).
    #[arg(long, value_name = "FILE")]
    out_merkle_tree: Option<PathBuf>,
    /// Write the 256-byte descriptor to this file (one input file only).
    #[arg(long, value_name = "FILE")]
    out_descriptor: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let alg = HashAlg::from_name(&a.hash_alg)
        .with_context(|| format!("unknown hash algorithm {:?}", a.hash_alg))?;
    let salt = match &a.salt {
        Some(h) => parse_hex(h).with_context(|| format!("--salt {h:?} is not hex"))?,
        None => Vec::new(),
    };
    let params = Params::new(alg, a.block_size, salt).map_err(anyhow::Error::msg)?;
    if (a.out_merkle_tree.is_some() || a.out_descriptor.is_some()) && a.files.len() != 1 {
        bail!("--out-merkle-tree and --out-descriptor take exactly one input file");
    }
    for path in &a.files {
        let file = std::fs::File::open(path).with_context(|| path.display().to_string())?;
        let size = file
            .metadata()
            .with_context(|| path.display().to_string())?
            .len();
        let (digest, tree) =
            digest_file(&params, &file, size).with_context(|| path.display().to_string())?;
        if let Some(out) = &a.out_merkle_tree {
            std::fs::write(out, tree.bytes()).with_context(|| out.display().to_string())?;
        }
        if let Some(out) = &a.out_descriptor {
            std::fs::write(out, Descriptor::new(&params, size, &tree.root).bytes)
                .with_context(|| out.display().to_string())?;
        }
        let hex = hex::encode(digest);
        if a.compact {
            outln!("{hex}");
        } else {
            outln!("{}:{hex} {}", alg.name(), path.display());
        }
    }
    Ok(0)
}

fn parse_hex(s: &str) -> anyhow::Result<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        bail!("odd number of digits");
    }
    (0..s.len())
        .step_by(2)
        .map(|i| Ok(u8::from_str_radix(&s[i..i + 2], 16)?))
        .collect()
}
