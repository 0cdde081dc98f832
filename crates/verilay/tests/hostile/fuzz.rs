//! A bounded, coverage-guided fuzz run of every target in `fuzz/`, starting from the
//! committed seeds and every hostile case of this suite (`crate::all_seeds`).
//!
//! libFuzzer is built on stable Rust with the sanitizer-coverage flags cargo-fuzz uses
//! with `-s none` (the targets are safe code, so AddressSanitizer would only slow them),
//! plus debug assertions and overflow checks: an arithmetic overflow on hostile input
//! fails the run. `VERILAY_FUZZ_SECONDS` sets each target's time (default 20 s). A crash
//! is kept in `fuzz/artifacts/TARGET/`; replay it by running the target binary on it.

use crate::common::{have, skip_unless};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn host_triple() -> String {
    let out = Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("rustc -vV");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        .expect("rustc -vV names the host")
}

/// Builds every fuzz target once per test run; the directory holding the binaries.
fn built() -> PathBuf {
    static BUILT: Mutex<Option<PathBuf>> = Mutex::new(None);
    let mut b = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = &*b {
        return p.clone();
    }
    let triple = host_triple();
    let target_dir = fuzz_dir().join("target/stable");
    let flags = [
        "--cfg fuzzing",
        "-Cpasses=sancov-module",
        "-Cllvm-args=-sanitizer-coverage-level=4",
        "-Cllvm-args=-sanitizer-coverage-inline-8bit-counters",
        "-Cllvm-args=-sanitizer-coverage-pc-table",
        "-Cllvm-args=-sanitizer-coverage-trace-compares",
        "-Cdebug-assertions",
        "-Coverflow-checks",
    ]
    .join(" ");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // --target keeps the flags off build scripts and proc macros, as cargo-fuzz does.
    let out = Command::new(cargo)
        .args(["build", "--release", "--bins", "--target", &triple])
        .arg("--target-dir")
        .arg(&target_dir)
        .current_dir(fuzz_dir())
        .env("RUSTFLAGS", flags)
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET")
        .output()
        .expect("spawning cargo");
    assert!(
        out.status.success(),
        "building the fuzz targets failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = target_dir.join(triple).join("release");
    *b = Some(dir.clone());
    dir
}

/// The suite's hostile cases, made once per test run.
fn hostile_seeds() -> &'static [crate::Seed] {
    static SEEDS: OnceLock<(tempfile::TempDir, Vec<crate::Seed>)> = OnceLock::new();
    let (_, seeds) = SEEDS.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let seeds = crate::all_seeds(tmp.path());
        (tmp, seeds)
    });
    seeds
}

/// Committed seeds of `target`: `fuzz/seeds/TARGET/`, and for the two image targets the
/// images directly in `fuzz/seeds/` (`fuzz/make_seeds.sh` made them).
fn committed_seeds(target: &str) -> Vec<PathBuf> {
    let mut dirs = vec![fuzz_dir().join("seeds").join(target)];
    if target == "read_image" || target == "verified_source" {
        dirs.push(fuzz_dir().join("seeds"));
    }
    if target == "tar_layer" {
        dirs.push(fuzz_dir().join("seeds/tar"));
    }
    let mut files = Vec::new();
    for d in dirs {
        for e in std::fs::read_dir(&d).into_iter().flatten() {
            let p = e.unwrap().path();
            if p.is_file() {
                files.push(p);
            }
        }
    }
    files
}

fn fuzz(target: &str) {
    if skip_unless(
        have("c++"),
        "a C++ compiler (build-essential) builds libFuzzer",
    ) {
        return;
    }
    let bin = built().join(target);
    let tmp = tempfile::tempdir().unwrap();
    let seeds = tmp.path().join("seeds");
    let corpus = tmp.path().join("corpus");
    std::fs::create_dir_all(&seeds).unwrap();
    std::fs::create_dir_all(&corpus).unwrap();
    let mut n = 0;
    for f in committed_seeds(target) {
        std::fs::copy(&f, seeds.join(format!("c{n}"))).unwrap();
        n += 1;
    }
    for s in hostile_seeds().iter().filter(|s| s.target == target) {
        std::fs::write(seeds.join(format!("h{n}-{}", s.name)), &s.bytes).unwrap();
        n += 1;
    }
    assert!(n > 0, "no seeds for fuzz target {target}");
    let secs: u64 = std::env::var("VERILAY_FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let artifacts = fuzz_dir().join("artifacts").join(target);
    std::fs::create_dir_all(&artifacts).unwrap();
    let out = Command::new(&bin)
        .arg(&corpus)
        .arg(&seeds)
        .arg(format!("-max_total_time={secs}"))
        .arg("-timeout=10")
        .arg("-rss_limit_mb=2048")
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg("-print_final_stats=1")
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    let log = String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = log.lines().rev().take(40).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    assert!(
        out.status.success(),
        "fuzz target {target} found a failure (input kept in {}):\n{}",
        artifacts.display(),
        tail.join("\n")
    );
    let runs: u64 = log
        .lines()
        .find_map(|l| l.strip_prefix("stat::number_of_executed_units:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    assert!(runs > n, "fuzz target {target} ran only {runs} inputs");
    println!("fuzz {target}: {runs} inputs in {secs} s from {n} seeds");
}

#[test]
fn fuzz_read_image() {
    fuzz("read_image");
}

#[test]
fn fuzz_verified_source() {
    fuzz("verified_source");
}

#[test]
fn fuzz_tar_layer() {
    fuzz("tar_layer");
}

#[test]
fn fuzz_policy() {
    fuzz("policy");
}

#[test]
fn fuzz_measure_list() {
    fuzz("measure_list");
}

#[test]
fn fuzz_oci_manifest() {
    fuzz("oci_manifest");
}

#[test]
fn fuzz_mount_options() {
    fuzz("mount_options");
}
