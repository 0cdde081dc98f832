//! `verilay log verify DIR [--json]`: replays a measurement list written by a measured mount
//! and checks it against its PCR files (`measure::verify`), stricter than `evmctl
//! ima_measurement`: every entry must be covered by the PCR values.

use anyhow::Context;
use measure::log::to_hex;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Replay a measurement list and check every entry, both template banks, the ascii
    /// lists and the PCR files; exit 1 with the first problem.
    Verify(VerifyArgs),
}

#[derive(clap::Args)]
struct VerifyArgs {
    /// The directory holding binary_runtime_measurements, pcrs_sha1, ...
    dir: PathBuf,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    match a.cmd {
        Cmd::Verify(v) => verify(v),
    }
}

fn verify(a: VerifyArgs) -> anyhow::Result<i32> {
    // The file names in verify's errors are relative to the directory: name it too.
    let report = measure::verify::verify(&a.dir)
        .with_context(|| format!("measurement list {}", a.dir.display()))?;
    if a.json {
        let pcrs: Vec<serde_json::Value> = report
            .pcrs
            .iter()
            .map(|(i, s1, s2)| {
                serde_json::json!({"index": i, "sha1": to_hex(s1), "sha256": to_hex(s2)})
            })
            .collect();
        outln!(
            "{}",
            serde_json::json!({"entries": report.entries, "pcrs": pcrs})
        );
    } else {
        let mut line = format!("verified {} entries", report.entries);
        for (i, s1, s2) in &report.pcrs {
            line += &format!("; PCR {i} sha1 {} sha256 {}", to_hex(s1), to_hex(s2));
        }
        outln!("{line}");
    }
    Ok(0)
}
