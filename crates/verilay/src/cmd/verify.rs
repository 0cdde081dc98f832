//! `verilay verify IMAGE [--digest sha256:…]`: every block of the image checked against its
//! Merkle tree; the first bad one is named by offset and owner.

use super::image::{open_verified, Pin};
use crate::progress;
use erofs::read::{ByteSource, ClaimsReport, FileSource, Image};
use std::path::PathBuf;
use std::time::Instant;
use verity::IntegrityError;

#[derive(clap::Args)]
pub struct Args {
    image: PathBuf,
    #[command(flatten)]
    pin: Pin,
    /// No progress bar and no summary line.
    #[arg(short, long)]
    quiet: bool,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let start = Instant::now();
    let v = open_verified(&a.image, &a.pin)?;
    let name = a.image.display();
    let pb = progress::bar(a.quiet || a.json);
    progress::bytes(&pb, "verifying", v.len());
    let result = v.verify_all(&|n| pb.inc(n));
    pb.finish_and_clear();
    // Every byte is the pinned one; what the image claims about its files must hold too.
    let claims = match &result {
        Ok(()) => claims(&v),
        Err(_) => ClaimsReport::default(),
    };
    let secs = start.elapsed().as_secs_f64();
    let trust = if v.is_pinned() {
        "pinned"
    } else {
        "not pinned"
    };
    match result {
        Ok(()) if !claims.problems.is_empty() => {
            if a.json {
                outln!(
                    "{}",
                    serde_json::json!({
                        "image": a.image,
                        "ok": false,
                        "digest": v.digest_string(),
                        "pinned": v.is_pinned(),
                        "claims": claims.problems,
                        "unchecked": claims.unchecked,
                    })
                );
                return Ok(1);
            }
            for p in &claims.problems {
                eprintln!("{name}: {}", host::text::one_line(p));
            }
            anyhow::bail!(
                "{name}: every block verifies, but what the image claims about its files does not hold ({} problems above)",
                claims.problems.len()
            )
        }
        Ok(()) => {
            if a.json {
                outln!(
                    "{}",
                    serde_json::json!({
                        "image": a.image,
                        "ok": true,
                        "digest": v.digest_string(),
                        "pinned": v.is_pinned(),
                        "bytes": v.len(),
                        "seconds": secs,
                        "unchecked": claims.unchecked,
                    })
                );
            } else if !a.quiet {
                for p in &claims.unchecked {
                    eprintln!(
                        "{name}: warning: not walked, so not checked (`verilay fsck` tells more): {}",
                        host::text::one_line(p)
                    );
                }
                eprintln!(
                    "{name}: OK, {} verified in {secs:.2} s, digest {} ({trust})",
                    progress::human(v.len()),
                    v.digest_string()
                );
            }
            Ok(0)
        }
        Err(e) => {
            let Some(bad) = IntegrityError::find(&e) else {
                anyhow::bail!("{name}: {e}");
            };
            let held = if bad.data {
                owners(&a.image, bad.offset, v.params().block_size as u64)
            } else {
                vec!["the verity section's Merkle tree".to_string()]
            };
            const SHOW: usize = 4;
            let mut owner = held[..held.len().min(SHOW)].join(", ");
            if held.len() > SHOW {
                owner.push_str(&format!(" and {} more", held.len() - SHOW));
            }
            if a.json {
                outln!(
                    "{}",
                    serde_json::json!({
                        "image": a.image,
                        "ok": false,
                        "offset": bad.offset,
                        "what": bad.what,
                        "holds": held,
                        "digest": v.digest_string(),
                        "pinned": v.is_pinned(),
                    })
                );
                return Ok(1);
            }
            anyhow::bail!("{name}: {bad}; it holds {owner}")
        }
    }
}

/// What the image claims about itself that does not hold (file digests, the namespace
/// record, name filters), and what the reader refuses to walk (nothing there is served).
fn claims(v: &verity::VerifiedSource<FileSource>) -> ClaimsReport {
    match Image::open(v) {
        Ok(img) => img.check_claims(20),
        Err(e) => ClaimsReport {
            unchecked: vec![format!("the EROFS structure does not open: {e}")],
            ..Default::default()
        },
    }
}

/// Names what a bad block held by walking the raw image (the only way left to read it):
/// "the data of /a", or "the superblock", "the inode of /", ...
fn owners(path: &std::path::Path, offset: u64, len: u64) -> Vec<String> {
    match FileSource::open(path).map(Image::open_for_diagnosis) {
        Ok(Ok(img)) => img.owners(offset, len, 4096),
        _ if offset < 1024 + 128 => vec!["the superblock".to_string()],
        _ => vec!["metadata (the image cannot be walked)".to_string()],
    }
}
