//! A hostile measurement-list directory must be verified or refused with the file and the
//! offset, never panic, hang or allocate by an unchecked length; and a list that a mount
//! would continue (a clean one, or one whose writer died, recovered to what its files
//! agree on) must verify once continued and closed.
//!
//! Input: a flags byte (bit 0: the in-use marker is there, as a killed writer leaves it),
//! then each of the seven files in the order of `measure::log::LIST_FILES`, as a
//! little-endian u32 length and that many bytes (a length past the end takes what is left;
//! files not reached are empty); what follows the last file is the marker's text. The
//! hostile suite's seeds (`crates/verilay/tests/hostile/measure.rs`) are written in this
//! form.
#![no_main]

use libfuzzer_sys::fuzz_target;
use measure::log::{DigestKind, Event, HashAlgo, Log, IN_USE, LIST_FILES};
use measure::policy::Template;
use std::path::PathBuf;

/// A directory of this process's own, on tmpfs when there is one (every open syncs).
fn scratch() -> PathBuf {
    let base = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    base.join(format!("measure_list_fuzz.{}", std::process::id()))
}

fn split(data: &[u8]) -> (u8, Vec<&[u8]>, &[u8]) {
    let Some((&flags, mut rest)) = data.split_first() else {
        return (0, vec![&[][..]; LIST_FILES.len()], &[]);
    };
    let mut parts = Vec::with_capacity(LIST_FILES.len());
    for _ in LIST_FILES {
        let len = match rest.get(..4) {
            Some(b) => u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize,
            None => 0,
        };
        rest = rest.get(4..).unwrap_or(&[]);
        let (part, after) = rest.split_at(len.min(rest.len()));
        parts.push(part);
        rest = after;
    }
    (flags, parts, rest)
}

fuzz_target!(|data: &[u8]| {
    let dir = scratch();
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (flags, parts, marker) = split(data);
    for (name, bytes) in LIST_FILES.iter().zip(&parts) {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    if flags & 1 != 0 {
        std::fs::write(dir.join(IN_USE), marker).unwrap();
    }
    let _ = measure::verify::verify(&dir);
    let Ok(mut log) = Log::open(&dir) else {
        return;
    };
    let ev = Event {
        template: Template::ImaNg,
        kind: DigestKind::Ima,
        algo: HashAlgo::Sha256,
        digest: &[0x42; 32],
        path: b"/fuzzed",
        sig: None,
    };
    log.append(10, &ev).unwrap();
    log.close().unwrap();
    drop(log);
    if let Err(e) = measure::verify::verify(&dir) {
        panic!("a list continued and closed does not verify: {e}");
    }
});
