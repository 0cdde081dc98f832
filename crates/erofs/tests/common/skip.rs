//! Skips that count: one helper for every test of the workspace that cannot run here (no
//! root, a missing tool). libtest has no "skipped" result, so a test that returns early is
//! reported as passed; `scripts/test` sets `VERILAY_SKIP_LOG` to a file, each skip appends
//! `<test binary>\t<test name>\t<reason>` to it, and the summary counts those tests as
//! skipped, not passed (and CI fails on any). Shared by the erofs and verilay test helpers
//! (`#[path]`), so the line format `scripts/test` reads is written in one place.

use std::io::Write;

/// True (the caller returns) when `cond` is false: the test is recorded as skipped, with
/// `why`. A test that goes on after a skip, checking less, is counted as skipped too.
/// Without `VERILAY_SKIP_LOG`, `VERILAY_REQUIRE_ALL=1` turns a skip into a failure (for
/// `cargo test` run by hand where nothing may be skipped).
pub fn skip_unless(cond: bool, why: &str) -> bool {
    if cond {
        return false;
    }
    let test = std::thread::current()
        .name()
        .unwrap_or("<not a test thread>")
        .to_string();
    eprintln!("SKIP {test}: {why}");
    match std::env::var_os("VERILAY_SKIP_LOG") {
        Some(log) => record_skip(&log, &test, why),
        None if std::env::var_os("VERILAY_REQUIRE_ALL").is_some() => {
            panic!("required test prerequisite missing: {why}")
        }
        None => {}
    }
    true
}

/// Appends one line to the skip log in a single write (O_APPEND: lines of tests running in
/// parallel, or in other test binaries, never interleave).
fn record_skip(log: &std::ffi::OsStr, test: &str, why: &str) {
    let exe = std::env::current_exe().expect("the test binary's path");
    let binary = exe.file_name().unwrap_or_default().to_string_lossy();
    let line = format!("{binary}\t{test}\t{}\n", why.replace(['\t', '\n'], " "));
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .and_then(|mut f| f.write_all(line.as_bytes()))
        .unwrap_or_else(|e| panic!("recording a skip in {log:?}: {e}"));
}
