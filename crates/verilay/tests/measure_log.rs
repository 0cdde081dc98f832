//! Measurement lists written by `measure::log::Log`, checked by `verilay log verify` and by
//! the reference verifier, `evmctl ima_measurement` (ima-evm-utils): both accept an honest
//! list and reject tampering, and the test pins down where evmctl is blind (entries appended
//! past the PCR values; a wrong SHA-1 PCR when a SHA-256 file is given too) and verilay is not.

mod common;
use common::*;

use measure::log::{
    Bank, DigestKind, Entry, Event, HashAlgo, Log, ASCII_SHA1, ASCII_SHA256, BINARY_SHA1,
    BINARY_SHA256, COUNT, LIST_FILES, PCRS_SHA1, PCRS_SHA256,
};
use measure::policy::Template;
use std::path::Path;
use std::process::Output;

/// boot_aggregate, then ima-ng and ima-ngv2 (file hash and fs-verity digest) entries and
/// an ima-sig one without signature, on PCRs 10 and 11. Returns the entries.
fn write_list(dir: &Path) -> Vec<Entry> {
    let d256: Vec<u8> = (0..32).collect();
    let evs: [(u32, Event); 5] = [
        (
            10,
            Event {
                template: Template::ImaNg,
                kind: DigestKind::Ima,
                algo: HashAlgo::Sha256,
                digest: &d256,
                path: b"/usr/bin/tool one",
                sig: None,
            },
        ),
        (
            10,
            Event {
                template: Template::ImaNgV2,
                kind: DigestKind::Ima,
                algo: HashAlgo::Sha256,
                digest: &[0xab; 32],
                path: b"/etc/passwd",
                sig: None,
            },
        ),
        (
            10,
            Event {
                template: Template::ImaNgV2,
                kind: DigestKind::Verity,
                algo: HashAlgo::Sha512,
                digest: &[0x5a; 64],
                path: b"/bin/sh",
                sig: None,
            },
        ),
        (
            11,
            Event {
                template: Template::ImaNg,
                kind: DigestKind::Ima,
                algo: HashAlgo::Sha1,
                digest: &[0x77; 20],
                path: b"/lib/libc.so.6",
                sig: None,
            },
        ),
        (
            10,
            Event {
                template: Template::ImaSig,
                kind: DigestKind::Ima,
                algo: HashAlgo::Sha256,
                digest: &[0x11; 32],
                path: b"/sbin/init",
                sig: None,
            },
        ),
    ];
    let mut log = Log::open(dir).unwrap();
    let mut entries = vec![Entry::boot_aggregate()];
    for (pcr, e) in &evs {
        assert!(log.append(*pcr, e).unwrap());
        entries.push(Entry::new(*pcr, e));
    }
    log.sync().unwrap();
    entries
}

/// PCR `i` as the bank's PCR file holds it: the value `evmctl ima_measurement` replays
/// the list to (checked with `evmctl_accepts`), not the library's own replay.
fn pcr_of(dir: &Path, bank: Bank, i: u32) -> String {
    let file = match bank {
        Bank::Sha1 => PCRS_SHA1,
        Bank::Sha256 => PCRS_SHA256,
    };
    let text = std::fs::read_to_string(dir.join(file)).unwrap();
    let prefix = format!("PCR-{i:02}: ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("{file} has no {prefix:?}"))
        .to_string()
}

fn evmctl(dir: &Path, pcrs: &[(&str, &str)], verbose: bool) -> Output {
    let mut cmd = std::process::Command::new("evmctl");
    if verbose {
        cmd.arg("-v");
    }
    cmd.arg("ima_measurement");
    for (alg, file) in pcrs {
        cmd.arg("--pcrs")
            .arg(format!("{alg},{}", dir.join(file).display()));
    }
    cmd.arg(dir.join(BINARY_SHA1)).output().unwrap()
}

const BOTH: &[(&str, &str)] = &[("sha1", PCRS_SHA1), ("sha256", PCRS_SHA256)];
const SHA1_ONLY: &[(&str, &str)] = &[("sha1", PCRS_SHA1)];

fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn evmctl_accepts(dir: &Path, pcrs: &[(&str, &str)]) {
    let o = evmctl(dir, pcrs, false);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("Matched per TPM bank calculated digest(s)."),
        "{}",
        text(&o)
    );
}

fn evmctl_rejects(dir: &Path, pcrs: &[(&str, &str)], says: &str) {
    let o = evmctl(dir, pcrs, false);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(says),
        "{}",
        text(&o)
    );
}

fn verilay_verify(dir: &Path) -> Output {
    verilay().args(["log", "verify"]).arg(dir).output().unwrap()
}

/// `verilay log verify` exits 1 with exactly one line: the error.
fn verilay_rejects(dir: &Path, error: &str) {
    let o = verilay_verify(dir);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(o.stdout.is_empty(), "{}", text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        format!(
            "verilay: error: measurement list {}: {error}\n",
            dir.display()
        )
    );
}

/// Log::open refuses to continue the list, and writes nothing.
fn open_refuses(dir: &Path, error: &str) {
    let before: Vec<Vec<u8>> = LIST_FILES
        .iter()
        .map(|f| std::fs::read(dir.join(f)).unwrap_or_default())
        .collect();
    let Err(e) = Log::open(dir) else {
        panic!("Log::open continued a tampered list ({error})")
    };
    assert_eq!(
        e.to_string(),
        format!(
            "not continuing the measurement list in {}: {error}",
            dir.display()
        )
    );
    let after: Vec<Vec<u8>> = LIST_FILES
        .iter()
        .map(|f| std::fs::read(dir.join(f)).unwrap_or_default())
        .collect();
    assert!(before == after, "a refused open changed the list");
}

/// Offset of entry K (1-based) in the SHA-1 binary list.
fn record_offset(entries: &[Entry], k: usize) -> u64 {
    entries[..k - 1]
        .iter()
        .map(|e| e.binary_record(Bank::Sha1).len() as u64)
        .sum()
}

fn fresh(t: &Path, name: &str) -> (std::path::PathBuf, Vec<Entry>) {
    let dir = t.join(name);
    let entries = write_list(&dir);
    (dir, entries)
}

fn flip_path_byte_of_entry_2(dir: &Path, entries: &[Entry]) -> String {
    let path = dir.join(BINARY_SHA1);
    let mut d = std::fs::read(&path).unwrap();
    let i = d.windows(9).position(|w| w == b"/usr/bin/").unwrap();
    d[i + 1] ^= 0x20; // "/usr" -> "/Usr"
    std::fs::write(&path, d).unwrap();
    format!(
        "{BINARY_SHA1}: offset {} (entry 2): template digest does not match its data",
        record_offset(entries, 2) + 4
    )
}

/// Replaces the first two hex digits of the PCR-10 line.
fn change_pcr10(dir: &Path, file: &str) -> (String, String) {
    let path = dir.join(file);
    let s = std::fs::read_to_string(&path).unwrap();
    let line = s.lines().nth(10).unwrap();
    let old = line.strip_prefix("PCR-10: ").unwrap().to_string();
    let new = format!(
        "{}{}",
        if &old[..2] == "ff" { "00" } else { "ff" },
        &old[2..]
    );
    std::fs::write(&path, s.replace(&old, &new)).unwrap();
    (old, new)
}

/// A copy of entry 4 appended to all four lists and the count bumped: consistent
/// everywhere except that the PCR values do not include it.
fn append_copy(dir: &Path, entries: &[Entry]) -> u64 {
    let end = std::fs::metadata(dir.join(BINARY_SHA1)).unwrap().len();
    let e = &entries[3];
    for (file, bytes) in [
        (BINARY_SHA1, e.binary_record(Bank::Sha1)),
        (ASCII_SHA1, e.ascii_bytes(Bank::Sha1)),
        (BINARY_SHA256, e.binary_record(Bank::Sha256)),
        (ASCII_SHA256, e.ascii_bytes(Bank::Sha256)),
    ] {
        let mut d = std::fs::read(dir.join(file)).unwrap();
        d.extend(bytes);
        std::fs::write(dir.join(file), d).unwrap();
    }
    std::fs::write(dir.join(COUNT), format!("{}\n", entries.len() + 1)).unwrap();
    end
}

/// What evmctl says when the list does not replay to a bank's PCRs.
const PCR_MISMATCH: &str = "Failed to match per TPM bank or SHA1 padded TPM digest(s).";

/// A temporary directory for a test that needs evmctl; None, with the skip recorded,
/// where it is missing.
fn evmctl_tempdir() -> Option<tempfile::TempDir> {
    if skip_unless(have("evmctl"), "needs evmctl (ima-evm-utils)") {
        return None;
    }
    Some(tempfile::tempdir().unwrap())
}

#[test]
fn verilay_log_verify_reports_and_rejects() {
    let Some(t) = evmctl_tempdir() else {
        return;
    };
    let (dir, entries) = fresh(t.path(), "good");
    assert_eq!(entries.len(), 6);
    evmctl_accepts(&dir, BOTH);
    let (p10_1, p10_2) = (pcr_of(&dir, Bank::Sha1, 10), pcr_of(&dir, Bank::Sha256, 10));
    let (p11_1, p11_2) = (pcr_of(&dir, Bank::Sha1, 11), pcr_of(&dir, Bank::Sha256, 11));
    let o = verilay_verify(&dir);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        format!("verified 6 entries; PCR 10 sha1 {p10_1} sha256 {p10_2}; PCR 11 sha1 {p11_1} sha256 {p11_2}\n")
    );

    let o = verilay()
        .args(["log", "verify", "--json"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        j,
        serde_json::json!({
            "entries": 6,
            "pcrs": [
                {"index": 10, "sha1": p10_1, "sha256": p10_2},
                {"index": 11, "sha1": p11_1, "sha256": p11_2},
            ],
            "violations": [],
            "state": "closed",
            "holder": null,
        })
    );

    let (dir, entries) = fresh(t.path(), "flip");
    let err = flip_path_byte_of_entry_2(&dir, &entries);
    verilay_rejects(&dir, &err);
    open_refuses(&dir, &err);

    for (file, line_len) in [(PCRS_SHA1, 49), (PCRS_SHA256, 73)] {
        let (dir, _) = fresh(t.path(), file);
        let (old, new) = change_pcr10(&dir, file);
        let err = format!(
            "{file}: offset {} (PCR-10): replaying all 6 entries gives {old}, the file has {new}",
            10 * line_len + 8
        );
        verilay_rejects(&dir, &err);
        open_refuses(&dir, &err);
    }

    let (dir, entries) = fresh(t.path(), "appended");
    let end = append_copy(&dir, &entries);
    let err = format!(
        "{BINARY_SHA1}: offset {end} (entry 7): entry 7 is not covered: the PCR files match the replay after entry 6, so only 6 of the 7 entries are verified"
    );
    verilay_rejects(&dir, &err);
    open_refuses(&dir, &err);

    let (dir, entries) = fresh(t.path(), "truncated");
    let cut = record_offset(&entries, 5) + 30;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(BINARY_SHA1))
        .unwrap();
    f.set_len(cut).unwrap();
    let name_at = record_offset(&entries, 5) + 28;
    let err = format!(
        "{BINARY_SHA1}: offset {name_at} (entry 5): truncated record: the template name needs 6 bytes, the file ends after 2"
    );
    verilay_rejects(&dir, &err);
    open_refuses(&dir, &err);

    // Not a list at all.
    let missing = t.path().join("missing");
    let o = verilay_verify(&missing);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        format!(
            "verilay: error: measurement list {}: cannot open the directory: No such file or directory (os error 2)\n",
            missing.display()
        )
    );
}

#[test]
fn evmctl_accepts_the_list_and_rejects_tampering() {
    let Some(t) = evmctl_tempdir() else {
        return;
    };
    let (dir, _) = fresh(t.path(), "good");
    evmctl_accepts(&dir, BOTH);
    evmctl_accepts(&dir, SHA1_ONLY);
    evmctl_accepts(&dir, &[("sha256", PCRS_SHA256)]);
    // evmctl replays every entry and finds the PCRs match exactly after the last one.
    let o = evmctl(&dir, BOTH, true);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // evmctl logs everything, entries included, on stderr.
    let out = String::from_utf8_lossy(&o.stderr);
    for want in [
        "sha1 PCR-10: succeed at entry 6",
        "sha256 PCR-10: succeed at entry 6",
        "sha1 PCR-11: succeed at entry 6",
        "10 0adefe762c149c7cec19da62f0da1297fcfbffff ima-ng sha256:0000000000000000000000000000000000000000000000000000000000000000 boot_aggregate\n",
        "ima-ngv2 verity:sha512:",
        " /usr/bin/tool_one\n",
    ] {
        assert!(out.contains(want), "missing {want:?} in {}", text(&o));
    }
    // The ascii list shows what evmctl shows for each entry (evmctl prints no trailing
    // space for an empty signature, the kernel does).
    let ascii = std::fs::read_to_string(dir.join(ASCII_SHA1)).unwrap();
    for line in ascii.lines() {
        assert!(
            out.contains(line.trim_end()),
            "{line:?} not in {}",
            text(&o)
        );
    }

    let (dir, entries) = fresh(t.path(), "flip");
    let err = flip_path_byte_of_entry_2(&dir, &entries);
    evmctl_rejects(&dir, BOTH, "Failed to verify template data digest.");
    evmctl_rejects(&dir, SHA1_ONLY, "Failed to verify template data digest.");
    verilay_rejects(&dir, &err);

    // A wrong SHA-256 PCR: both reject.
    let (dir, _) = fresh(t.path(), "pcr256");
    change_pcr10(&dir, PCRS_SHA256);
    evmctl_rejects(&dir, BOTH, PCR_MISMATCH);
    assert_eq!(verilay_verify(&dir).status.code(), Some(1));

    // A wrong SHA-1 PCR: evmctl rejects it given the SHA-1 file alone, but with both files
    // it reports a match: its verdict is the comparison of the last bank it checked
    // (`err` in ima_measurement(), evmctl.c 1.4 and 1.6.2 alike). verilay rejects.
    let (dir, _) = fresh(t.path(), "pcr1");
    change_pcr10(&dir, PCRS_SHA1);
    evmctl_rejects(&dir, SHA1_ONLY, PCR_MISMATCH);
    evmctl_accepts(&dir, BOTH);
    assert_eq!(verilay_verify(&dir).status.code(), Some(1));

    // An entry appended past the PCR values: evmctl stops at the first entry where the
    // PCRs match and never looks at it; verilay reports it as not covered.
    let (dir, entries) = fresh(t.path(), "appended");
    append_copy(&dir, &entries);
    evmctl_accepts(&dir, BOTH);
    evmctl_accepts(&dir, SHA1_ONLY);
    let o = verilay_verify(&dir);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("(entry 7): entry 7 is not covered"),
        "{}",
        text(&o)
    );

    // Cut mid-record: both reject, verilay with a clear line, no panic.
    let (dir, entries) = fresh(t.path(), "truncated");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(BINARY_SHA1))
        .unwrap();
    f.set_len(record_offset(&entries, 5) + 30).unwrap();
    evmctl_rejects(&dir, BOTH, "Unable to read template name");
    let o = verilay_verify(&dir);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.starts_with(&format!(
            "verilay: error: measurement list {}: binary_runtime_measurements: offset ",
            dir.display()
        )) && err.contains("(entry 5): truncated record")
            && err.lines().count() == 1
            && !err.contains("panicked"),
        "{err}"
    );
}
