//! `verilay fsck IMAGE`: exit 0 when clean, 1 with one line per problem.

use super::image::open;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    image: PathBuf,
    #[command(flatten)]
    pin: super::image::Pin,
    #[command(flatten)]
    remote: super::registry::Remote,
    /// Stop after this many problems.
    #[arg(long, default_value_t = 100)]
    max_problems: usize,
    /// No summary line when clean.
    #[arg(short, long)]
    quiet: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let img = match open(&a.image, &a.pin, &a.remote, true) {
        Ok(o) => o.img,
        Err(e) => {
            // An image that does not even open (or that its policy refuses) is a problem
            // to report, not a usage error; named once.
            let name = a.image.display().to_string();
            let why = host::text::one_line(&format!("{e:#}")).into_owned();
            if why.starts_with(&format!("{name}: ")) {
                outln!("{why}");
            } else {
                outln!("{name}: {why}");
            }
            return Ok(1);
        }
    };
    let report = erofs::read::fsck(&img, a.max_problems);
    if a.json {
        let j = serde_json::json!({
            "image": a.image,
            "clean": report.is_clean(),
            "problems": report.problems,
            "inodes": report.inodes,
            "directories": report.dirs,
            "files": report.files,
            "data_bytes": report.bytes,
        });
        outln!("{j}");
    } else {
        for p in &report.problems {
            outln!("{}: {}", a.image.display(), host::text::one_line(p));
        }
        if report.is_clean() && !a.quiet {
            eprintln!(
                "{}: clean, {} inodes ({} directories, {} other), {} data bytes read",
                a.image.display(),
                report.inodes,
                report.dirs,
                report.files,
                report.bytes
            );
        }
    }
    Ok(if report.is_clean() { 0 } else { 1 })
}
