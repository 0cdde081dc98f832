//! `verilay log verify DIR [--json] [--ignore-violations]`: replays a measurement list
//! against its PCR files (`measure::verify`). A list that verifies may still be incomplete:
//! violation entries fail it unless `--ignore-violations` (as in evmctl), and a list whose
//! mount died with it open always fails (events after its last entry may be lost).

use anyhow::Context;
use measure::log::to_hex;
use measure::verify::{Report, State};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Subcommand)]
enum Cmd {
    /// Replay a measurement list and check every entry, both template banks, the ascii
    /// lists and the PCR files; exit 1 with the first problem, for violation entries
    /// (unless --ignore-violations), or when the list was not closed cleanly.
    Verify(VerifyArgs),
}

#[derive(clap::Args)]
struct VerifyArgs {
    /// The directory holding binary_runtime_measurements, pcrs_sha1, ...
    dir: PathBuf,
    /// Print the result as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Accept violation entries (they are still reported), as evmctl's option does.
    #[arg(long)]
    ignore_violations: bool,
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
        outln!("{}", json(&report));
    } else {
        outln!("{}", text(&report));
    }
    let dir = a.dir.display();
    if let State::Unclean { holder } = &report.state {
        eprintln!(
            "verilay: error: measurement list {dir} was not closed cleanly ({holder}): events after entry {} may be missing",
            report.entries
        );
        return Ok(1);
    }
    if !report.violations.is_empty() && !a.ignore_violations {
        eprintln!(
            "verilay: error: measurement list {dir} holds {} violation(s): events may be missing (--ignore-violations accepts them)",
            report.violations.len()
        );
        return Ok(1);
    }
    Ok(0)
}

fn state_name(s: &State) -> (&'static str, Option<&str>) {
    match s {
        State::Closed => ("closed", None),
        State::Open { holder } => ("open", Some(holder)),
        State::Unclean { holder } => ("unclean", Some(holder)),
    }
}

fn json(r: &Report) -> serde_json::Value {
    let pcrs: Vec<serde_json::Value> = r
        .pcrs
        .iter()
        .map(
            |(i, s1, s2)| serde_json::json!({"index": i, "sha1": to_hex(s1), "sha256": to_hex(s2)}),
        )
        .collect();
    let violations: Vec<serde_json::Value> = r
        .violations
        .iter()
        .map(|v| serde_json::json!({"entry": v.entry, "pcr": v.pcr, "name": v.name}))
        .collect();
    let (state, holder) = state_name(&r.state);
    serde_json::json!({
        "entries": r.entries,
        "pcrs": pcrs,
        "violations": violations,
        "state": state,
        "holder": holder,
    })
}

fn text(r: &Report) -> String {
    let mut line = format!("verified {} entries", r.entries);
    for (i, s1, s2) in &r.pcrs {
        line += &format!("; PCR {i} sha1 {} sha256 {}", to_hex(s1), to_hex(s2));
    }
    if !r.violations.is_empty() {
        let each: Vec<String> = r
            .violations
            .iter()
            .map(|v| {
                format!(
                    "entry {} on PCR {} ({})",
                    v.entry,
                    v.pcr,
                    printable(&v.name)
                )
            })
            .collect();
        line += &format!("; {} violation(s): {}", r.violations.len(), each.join(", "));
    }
    match &r.state {
        State::Closed => {}
        State::Open { holder } => line += &format!("; open ({holder}): entries may still be added"),
        State::Unclean { holder } => {
            line += &format!(
                "; not closed cleanly ({holder}): events after entry {} may be missing",
                r.entries
            )
        }
    }
    line
}

/// A name on the one line this prints: control characters (a newline a file's name may
/// hold, which the list itself keeps raw as the kernel does) and backslashes escaped, so
/// the line stays one and reads back unambiguously (`--json` gives the name as it is).
fn printable(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_control() || c == '\\' {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}
