//! `verilay seal IMAGE`: appends a verity section to a plain EROFS image (one made by
//! `mkfs.erofs`, or by `verilay build --no-verity`) and prints its digest, so verilay can
//! verify and pin it. `--replace` seals again an image whose EROFS part was edited.

use crate::progress;
use anyhow::{bail, Context};
use erofs::read::{FileSource, Image};
use std::fs::OpenOptions;
use std::io::Read;
use std::path::PathBuf;
use verity::appended::{Section, TRAILER_SIZE};

#[derive(clap::Args)]
pub struct Args {
    image: PathBuf,
    /// Replace the verity section an already sealed image has.
    #[arg(long)]
    replace: bool,
    /// No progress bar and no summary line.
    #[arg(short, long)]
    quiet: bool,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let name = a.image.display().to_string();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&a.image)
        .with_context(|| name.clone())?;
    let len = file.metadata().with_context(|| name.clone())?.len();
    // The EROFS part's size comes from its superblock; the image need not be sound
    // otherwise (sealing only proves which bytes it holds).
    let erofs_len = Image::open_for_diagnosis(FileSource::new(
        file.try_clone().with_context(|| name.clone())?,
    )?)
    .with_context(|| name.clone())?
    .erofs_len();
    if erofs_len == 0 || erofs_len > len {
        bail!("{name}: the superblock claims {erofs_len} bytes, the file has {len}");
    }
    if len > erofs_len {
        let sealed = sealed_section(&file, len)?;
        match sealed {
            Some(s) if s.data_size == erofs_len && a.replace => {}
            Some(_) if a.replace => {
                bail!("{name}: its verity section does not follow its EROFS part ({erofs_len} bytes)")
            }
            Some(_) => bail!("{name}: already sealed (--replace seals it again)"),
            None => bail!(
                "{name}: {} bytes follow the EROFS part ({erofs_len} bytes) and are not a verity section",
                len - erofs_len
            ),
        }
    }
    let params = erofs::builder::verity_params();
    let pb = progress::bar(a.quiet || a.json);
    progress::bytes(&pb, "sealing", erofs_len);
    let reader = Counting {
        inner: std::io::BufReader::with_capacity(1 << 20, &file),
        pb: &pb,
    };
    let tree = verity::Tree::build(&params, reader, erofs_len).with_context(|| name.clone())?;
    pb.finish_and_clear();
    let digest = verity::appended::append_tree(&file, &params, erofs_len, &tree)
        .with_context(|| name.clone())?;
    file.sync_all().with_context(|| name.clone())?;
    let digest = format!("sha256:{}", verity::verified::hex(&digest));
    if a.json {
        outln!(
            "{}",
            serde_json::json!({ "image": a.image, "digest": digest, "erofs_bytes": erofs_len })
        );
    } else {
        outln!("{digest}");
        if !a.quiet {
            eprintln!(
                "{name}: sealed {} of EROFS, digest {digest}",
                progress::human(erofs_len)
            );
        }
    }
    Ok(0)
}

/// The section a file of `len` bytes ends with, if its trailer says it has one.
fn sealed_section(file: &std::fs::File, len: u64) -> anyhow::Result<Option<Section>> {
    use std::os::unix::fs::FileExt;
    if len < TRAILER_SIZE {
        return Ok(None);
    }
    let mut t = [0u8; TRAILER_SIZE as usize];
    file.read_exact_at(&mut t, len - TRAILER_SIZE)?;
    Section::decode_trailer(&t).map_err(anyhow::Error::msg)
}

/// A reader that moves a progress bar.
struct Counting<'a, R> {
    inner: R,
    pb: &'a indicatif::ProgressBar,
}

impl<R: Read> Read for Counting<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.pb.inc(n as u64);
        Ok(n)
    }
}
