//! `verilay extract IMAGE DIR`: the `extract` crate's walk, with a progress bar and a
//! summary line.

use super::image::{open, resolve};
use crate::progress;
use anyhow::Context;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    image: PathBuf,
    #[command(flatten)]
    pin: super::image::Pin,
    #[command(flatten)]
    remote: super::registry::Remote,
    /// Directory to create (or an empty existing one; not a symlink to one).
    dir: PathBuf,
    /// Extract only this path of the image: a directory's contents, or one file (into DIR
    /// under its own name). Symlinks in PATH are not followed.
    #[arg(long, value_name = "PATH")]
    path: Option<String>,
    /// Extract as an ordinary user's extract always does, for an image not trusted with
    /// privilege: everything owned by the user running extract, no set-id bits, no device
    /// nodes (overlayfs whiteouts, 0/0, are kept), no `trusted.*` or `security.*` xattrs.
    #[arg(long)]
    no_same_owner: bool,
    /// No progress bar and no summary line.
    #[arg(short, long)]
    quiet: bool,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let opened = open(&a.image, &a.pin, &a.remote, false)?;
    let trust = opened.trust();
    let img = opened.img;
    let top = match &a.path {
        Some(p) => resolve(&img, p).with_context(|| a.image.display().to_string())?,
        None => img.inode(img.root_nid())?,
    };
    let top_name = match &a.path {
        Some(p) if !top.is_dir() => p.rsplit('/').find(|c| !c.is_empty()).unwrap_or(p),
        _ => "",
    };
    let pb = progress::bar(a.quiet);
    progress::bytes(&pb, "extracting", img.image_len());
    let opts = extract::Options {
        restore_owner: rustix::process::geteuid().is_root() && !a.no_same_owner,
    };
    let report = extract::extract(
        &img,
        &a.image,
        &top,
        top_name.as_bytes(),
        &a.dir,
        opts,
        &mut |n| pb.inc(n),
    )?;
    pb.finish_and_clear();
    if let Some(w) = report.skipped.warning() {
        eprintln!("verilay: warning: {w}");
    }
    if !a.quiet {
        eprintln!(
            "{}: {} entries extracted to {}, every byte verified, digest {trust}",
            a.image.display(),
            report.entries,
            a.dir.components().collect::<PathBuf>().display()
        );
    }
    Ok(0)
}
