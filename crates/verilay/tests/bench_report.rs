//! `bench/run --report DIR` (issue 40): a real benchmark run (`digest --quick`, the cheapest
//! with a peer) writes one self-contained HTML page, which headless Chromium renders from
//! the file system; every table and plot the run made must be on the rendered page, every
//! plot decoded, and a peer that is missing must be named as not measured, cell by cell,
//! with its target NOT MEASURED and never PASS.

mod common;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `bench/run digest --quick --out OUT --report OUT/report` with `env`; returns OUT's
/// digest.json and what the run printed.
fn bench_run(dir: &Path, env: &[(&str, &str)]) -> (Value, String) {
    let out = dir.join("out");
    let mut cmd = Command::new(repo().join("bench/run"));
    cmd.args(["digest", "--quick", "--out"])
        .arg(&out)
        .arg("--report")
        .arg(out.join("report"))
        .env("VERILAY", env!("CARGO_BIN_EXE_verilay"))
        // Its own data directory: the 256 MiB file and scratch space go away with `dir`.
        .env("VERILAY_BENCH_DATA", dir.join("data"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let run = cmd.output().expect("bench/run starts");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(run.status.success(), "bench/run failed:\n{printed}");
    let json = std::fs::read_to_string(out.join("digest.json")).unwrap();
    (serde_json::from_str(&json).unwrap(), printed)
}

/// What Chromium saw of the report once it loaded: a copy of the page with a script that
/// writes its counts into the DOM, dumped with `--dump-dom`. The report itself has no
/// script, so the copy is what is instrumented.
fn rendered(report: &Path) -> String {
    let page = std::fs::read_to_string(report.join("index.html")).unwrap();
    let probe = r#"<script>
window.addEventListener("load", () => {
  const imgs = [...document.images];
  const b = document.body.dataset;
  b.tables = document.querySelectorAll("table.result").length;
  b.images = imgs.length;
  b.decoded = imgs.filter(i => i.complete && i.naturalWidth > 0).length;
  b.missingRows = document.querySelectorAll("table.result tr.missing").length;
  b.headers = [...document.querySelectorAll("table.result")]
    .map(t => [...t.rows[0].cells].map(c => c.textContent).join("|")).join(";");
  b.rows = [...document.querySelectorAll("table.result tr:not(.missing)")]
    .filter(r => r.cells[0].tagName == "TD")
    .map(r => [...r.cells].map(c => c.textContent).join("|")).join(";");
  b.targets = [...document.querySelectorAll("ul.targets li")]
    .map(l => l.textContent.replace(/\s+/g, " ")).join(";");
  b.done = "yes";
});
</script>"#;
    let check = report.join("check.html");
    std::fs::write(&check, page.replace("</body>", &format!("{probe}</body>"))).unwrap();
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new("timeout")
        .arg("120")
        .arg("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=5000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("file://{}", check.display()))
        .output()
        .expect("chromium starts");
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        dom.contains("data-done=\"yes\""),
        "chromium did not render the report ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    dom
}

/// The value of the body's data-NAME attribute in the dumped DOM.
fn attr(dom: &str, name: &str) -> String {
    let key = format!("data-{name}=\"");
    let start = dom
        .find(&key)
        .unwrap_or_else(|| panic!("no {key} in the DOM"))
        + key.len();
    let end = start + dom[start..].find('"').unwrap();
    dom[start..end]
        .replace("&amp;", "&")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
}

fn count(dom: &str, name: &str) -> usize {
    attr(dom, name).parse().unwrap()
}

fn prerequisites() -> bool {
    skip_unless(
        have("chromium"),
        "chromium missing (scripts/setup installs it)",
    ) || skip_unless(
        Command::new("/usr/bin/python3")
            .args(["-c", "import matplotlib"])
            .status()
            .is_ok_and(|s| s.success()),
        "python3-matplotlib missing (scripts/setup installs it)",
    ) || skip_unless(have("fsverity"), "fsverity missing")
}

#[test]
fn the_report_shows_every_table_plot_and_target_of_the_run() {
    if prerequisites() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (data, printed) = bench_run(t.path(), &[]);
    let report = t.path().join("out/report");
    let dom = rendered(&report);

    let tables = data["tables"].as_array().unwrap();
    assert!(!tables.is_empty(), "the run kept no table:\n{printed}");
    assert_eq!(count(&dom, "tables"), tables.len(), "tables on the page");
    let headers: Vec<String> = tables
        .iter()
        .map(|t| {
            t["headers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| h.as_str().unwrap().to_string())
                .collect::<Vec<_>>()
                .join("|")
        })
        .collect();
    assert_eq!(attr(&dom, "headers"), headers.join(";"));
    // Every row the run printed is on the page, cell for cell, and no other.
    let rows: Vec<String> = tables
        .iter()
        .flat_map(|t| t["rows"].as_array().unwrap())
        .map(|row| {
            row.as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_str().unwrap())
                .collect::<Vec<_>>()
                .join("|")
        })
        .collect();
    assert_eq!(attr(&dom, "rows"), rows.join(";"));
    // And those are the tables the run printed: every header and row of the JSON is a line
    // of its output, word for word (the columns are padded with spaces there).
    let words = |s: &str| s.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    let lines: Vec<Vec<String>> = printed.lines().map(words).collect();
    for t in tables {
        for line in std::iter::once(&t["headers"]).chain(t["rows"].as_array().unwrap()) {
            let cells: Vec<String> = line
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|c| words(c.as_str().unwrap()))
                .collect();
            assert!(
                lines.contains(&cells),
                "{cells:?} is not a line the run printed:\n{printed}"
            );
        }
    }

    // One plot per PNG the run wrote, each decoded by the browser.
    let pngs = std::fs::read_dir(t.path().join("out"))
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            let name = name.to_string_lossy();
            name.starts_with("digest") && name.ends_with(".png")
        })
        .count();
    assert!(pngs >= 1, "the run drew no plot:\n{printed}");
    assert_eq!(count(&dom, "images"), pngs, "plots on the page");
    assert_eq!(count(&dom, "decoded"), pngs, "plots the browser decoded");

    // Every target line, with its verdict; fsverity is there, so nothing is NOT MEASURED.
    let targets = data["targets"].as_array().unwrap();
    let shown = attr(&dom, "targets");
    assert_eq!(shown.split(';').count(), targets.len(), "{shown}");
    for target in targets {
        let line = format!(
            "{} {}: ",
            target["verdict"].as_str().unwrap(),
            target["target"].as_str().unwrap()
        );
        assert!(shown.contains(&line), "{line} is not on the page: {shown}");
        assert_ne!(target["verdict"], "NOT MEASURED", "{target}");
    }
    assert!(shown.contains("PASS 256MiB same digest"), "{shown}");
    assert_eq!(count(&dom, "missing-rows"), 0);

    // The host, the kernel, the revision and the peer's version and package.
    let page = std::fs::read_to_string(report.join("index.html")).unwrap();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert!(
        page.contains(&format!("Linux {}; ", kernel.trim())),
        "the kernel is not named"
    );
    let revision = data["verilay_revision"].as_str().unwrap();
    assert!(
        page.contains(&format!("revision {revision}")),
        "no revision"
    );
    let fsverity = &data["peer_lookups"][0];
    assert_eq!(fsverity["peer"], "fsverity");
    let version = fsverity["version"].as_str().unwrap();
    assert!(version.starts_with("1."), "fsverity's version: {version}");
    assert!(
        page.contains(&format!("<td>{version}</td>")),
        "fsverity's version is not in the report"
    );
    assert!(page.contains("Debian package fsverity "), "no package");
    assert!(!page.contains("src=\"http") && !page.contains("href=\"http"));
}

#[test]
fn a_missing_peer_is_not_measured_cell_by_cell_and_never_passes() {
    if prerequisites() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let (data, printed) = bench_run(t.path(), &[("FSVERITY", "/nonexistent/fsverity")]);
    let why = "$FSVERITY = /nonexistent/fsverity is not an executable program";
    // Named at the top of the run, before the benchmark starts.
    let top = printed.split("=== digest").next().unwrap();
    assert!(
        top.contains(&format!("fsverity: NOT MEASURED, because {why}")),
        "{printed}"
    );
    for target in data["targets"].as_array().unwrap() {
        assert_eq!(target["verdict"], "NOT MEASURED", "{target}");
        assert!(target["detail"].as_str().unwrap().contains(why), "{target}");
    }
    assert!(!printed.contains("PASS"), "{printed}");

    let dom = rendered(&t.path().join("out/report"));
    // fsverity's row of the table says so, and the targets do too.
    assert_eq!(count(&dom, "missing-rows"), 1);
    assert!(dom.contains(&format!("not measured, because {why}")));
    let shown = attr(&dom, "targets");
    assert!(
        shown.contains("NOT MEASURED 256MiB vs fsverity time"),
        "{shown}"
    );
    assert!(!shown.contains("PASS"), "{shown}");
    assert_eq!(count(&dom, "decoded"), count(&dom, "images"));
}
