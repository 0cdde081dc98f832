//! Progress bars on a terminal, nothing otherwise (or with `--quiet`).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

pub fn bar(quiet: bool) -> ProgressBar {
    let pb = ProgressBar::hidden();
    if !quiet && std::io::stderr().is_terminal() {
        pb.set_draw_target(ProgressDrawTarget::stderr_with_hz(10));
    }
    pb
}

pub fn counting(pb: &ProgressBar, what: &str) {
    pb.set_style(ProgressStyle::with_template("{spinner} {msg} {pos}").expect("valid template"));
    pb.set_message(what.to_string());
}

pub fn bytes(pb: &ProgressBar, what: &str, total: u64) {
    pb.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb.set_length(total);
    pb.set_position(0);
}

/// Human-readable size, binary units.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}
