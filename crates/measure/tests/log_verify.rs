//! `measure::verify` against lists written by `measure::log::Log`, and against every way of
//! damaging them: single-byte changes and truncations anywhere in the directory, hostile
//! lengths, self-consistent forgeries that only the PCR files (or the field checks) catch,
//! and entries appended past the PCR values. Each must be an error naming the file, the
//! offset and the entry, never a panic, and `Log::open` must refuse to continue such a list.

use measure::log::{
    Bank, DigestKind, Entry, Event, HashAlgo, Log, ASCII_SHA1, ASCII_SHA256, BINARY_SHA1,
    BINARY_SHA256, COUNT, LIST_FILES, LOCK, PCRS_SHA1, PCRS_SHA256,
};
use measure::policy::Template;
use measure::verify::{verify, State};
use sha1::{Digest, Sha1};
use sha2::Sha256;
use std::collections::BTreeMap;
use std::path::Path;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Writes the standard list (boot_aggregate and five entries of every template, on PCRs 10
/// and 11) with the Log API; returns the entries as they should be in it.
fn standard(dir: &Path) -> Vec<Entry> {
    let d256: Vec<u8> = (0..32).collect();
    let ev = |template, kind, algo, digest, path, sig| Event {
        template,
        kind,
        algo,
        digest,
        path,
        sig,
    };
    let evs: [(u32, Event); 5] = [
        (
            10,
            ev(
                Template::ImaNg,
                DigestKind::Ima,
                HashAlgo::Sha256,
                &d256,
                b"/usr/bin/tool one",
                None,
            ),
        ),
        (
            10,
            ev(
                Template::ImaNgV2,
                DigestKind::Ima,
                HashAlgo::Sha1,
                &[0xab; 20],
                b"/etc/passwd",
                None,
            ),
        ),
        (
            11,
            ev(
                Template::ImaNgV2,
                DigestKind::Verity,
                HashAlgo::Sha512,
                &[0x5a; 64],
                b"/bin/sh",
                None,
            ),
        ),
        (
            10,
            ev(
                Template::ImaSig,
                DigestKind::Ima,
                HashAlgo::Sha256,
                &d256,
                b"/lib/x.so",
                None,
            ),
        ),
        (
            10,
            ev(
                Template::ImaSigV2,
                DigestKind::Verity,
                HashAlgo::Sha256,
                &[0x22; 32],
                b"/opt/app",
                Some(b"\x06\x01\x02"),
            ),
        ),
    ];
    let mut log = Log::open(dir).unwrap();
    let mut entries = vec![Entry::boot_aggregate()];
    for (pcr, e) in &evs {
        assert!(log.append(*pcr, e).unwrap());
        entries.push(Entry::new(*pcr, e));
    }
    log.sync().unwrap();
    assert_eq!(log.entries(), 6);
    entries
}

/// Offset of each entry's record in the SHA-1 binary list.
fn offsets(entries: &[Entry]) -> Vec<u64> {
    let mut at = 0;
    entries
        .iter()
        .map(|e| {
            let o = at;
            at += e.binary_record(Bank::Sha1).len() as u64;
            o
        })
        .collect()
}

/// An entry with arbitrary template data and honest template digests.
fn forged(pcr: u32, name: &str, data: Vec<u8>) -> Entry {
    Entry {
        pcr,
        template_name: name.to_string().into(),
        sha1: Sha1::digest(&data).into(),
        sha256: Sha256::digest(&data).into(),
        data,
    }
}

fn field(bytes: &[u8]) -> Vec<u8> {
    [&(bytes.len() as u32).to_le_bytes()[..], bytes].concat()
}

/// Writes a whole, self-consistent directory for ENTRIES, PCRs replayed here (not by the
/// library): what a forger who rewrote everything would produce.
fn write_dir(dir: &Path, entries: &[Entry]) {
    let mut p1 = vec![[0u8; 20]; 24];
    let mut p2 = vec![[0u8; 32]; 24];
    let mut files: Vec<Vec<u8>> = vec![Vec::new(); 4];
    for e in entries {
        files[0].extend(e.binary_record(Bank::Sha1));
        files[1].extend(e.ascii_bytes(Bank::Sha1));
        files[2].extend(e.binary_record(Bank::Sha256));
        files[3].extend(e.ascii_bytes(Bank::Sha256));
        let i = e.pcr as usize;
        p1[i] = Sha1::new()
            .chain_update(p1[i])
            .chain_update(e.sha1)
            .finalize()
            .into();
        p2[i] = Sha256::new()
            .chain_update(p2[i])
            .chain_update(e.sha256)
            .finalize()
            .into();
    }
    for (name, data) in [BINARY_SHA1, ASCII_SHA1, BINARY_SHA256, ASCII_SHA256]
        .iter()
        .zip(files)
    {
        std::fs::write(dir.join(name), data).unwrap();
    }
    let text = |p: &[&[u8]]| -> String {
        p.iter()
            .enumerate()
            .map(|(i, v)| format!("PCR-{i:02}: {}\n", hex(v)))
            .collect()
    };
    let p1: Vec<&[u8]> = p1.iter().map(|v| &v[..]).collect();
    let p2: Vec<&[u8]> = p2.iter().map(|v| &v[..]).collect();
    std::fs::write(dir.join(PCRS_SHA1), text(&p1)).unwrap();
    std::fs::write(dir.join(PCRS_SHA256), text(&p2)).unwrap();
    std::fs::write(dir.join(COUNT), format!("{}\n", entries.len())).unwrap();
}

fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

/// verify fails with exactly WANT, and Log::open refuses with it and writes nothing.
fn rejects(dir: &Path, want: &str) {
    let err = verify(dir).unwrap_err();
    assert_eq!(err.to_string(), want);
    let before = snapshot(dir);
    let Err(e) = Log::open(dir) else {
        panic!("Log::open continued a list that fails: {want}")
    };
    assert_eq!(
        e.to_string(),
        format!(
            "not continuing the measurement list in {}: {want}",
            dir.display()
        )
    );
    assert_eq!(snapshot(dir), before, "a refused open wrote to {dir:?}");
}

/// One record of `standard`'s list as the kernel would write it, spelled out here from
/// ima_template_lib.c and ima_fs.c, not by the measure crate: the template's fields, and
/// what its ascii line shows after the template name.
struct KernelRecord {
    pcr: u32,
    template: &'static str,
    fields: Vec<Vec<u8>>,
    ascii: String,
}

impl KernelRecord {
    /// Template data: every field as u32 length + bytes; the template digests hash it whole
    /// (`ima_calc_field_array_hash`).
    fn data(&self) -> Vec<u8> {
        self.fields
            .iter()
            .flat_map(|f| [&(f.len() as u32).to_le_bytes()[..], f].concat())
            .collect()
    }

    /// The binary record (`ima_measurements_show`) with the bank's template digest.
    fn binary(&self, digest: &[u8]) -> Vec<u8> {
        let data = self.data();
        [
            &self.pcr.to_le_bytes()[..],
            digest,
            &(self.template.len() as u32).to_le_bytes(),
            self.template.as_bytes(),
            &(data.len() as u32).to_le_bytes(),
            &data,
        ]
        .concat()
    }
}

/// `standard`'s six entries (boot_aggregate first), as the kernel writes them.
fn kernel_records() -> Vec<KernelRecord> {
    let d256: Vec<u8> = (0..32).collect();
    // d-ng / d-ngv2: "[kind:]algo:" NUL digest; n-ng: the path with ' ' as '_', NUL.
    let digest = |prefix: &str, d: &[u8]| [prefix.as_bytes(), b"\0", d].concat();
    let path = |p: &str| [p.as_bytes(), b"\0"].concat();
    let rec = |pcr, template, fields, ascii: String| KernelRecord {
        pcr,
        template,
        fields,
        ascii,
    };
    vec![
        rec(
            10,
            "ima-ng",
            vec![digest("sha256:", &[0; 32]), path("boot_aggregate")],
            format!("sha256:{} boot_aggregate", "0".repeat(64)),
        ),
        rec(
            10,
            "ima-ng",
            vec![digest("sha256:", &d256), path("/usr/bin/tool_one")],
            format!("sha256:{} /usr/bin/tool_one", hex(&d256)),
        ),
        rec(
            10,
            "ima-ngv2",
            vec![digest("ima:sha1:", &[0xab; 20]), path("/etc/passwd")],
            format!("ima:sha1:{} /etc/passwd", "ab".repeat(20)),
        ),
        rec(
            11,
            "ima-ngv2",
            vec![digest("verity:sha512:", &[0x5a; 64]), path("/bin/sh")],
            format!("verity:sha512:{} /bin/sh", "5a".repeat(64)),
        ),
        // An empty sig field still gets its space (ima_ascii_measurements_show).
        rec(
            10,
            "ima-sig",
            vec![digest("sha256:", &d256), path("/lib/x.so"), vec![]],
            format!("sha256:{} /lib/x.so ", hex(&d256)),
        ),
        rec(
            10,
            "ima-sigv2",
            vec![
                digest("verity:sha256:", &[0x22; 32]),
                path("/opt/app"),
                vec![6, 1, 2],
            ],
            format!("verity:sha256:{} /opt/app 060102", "22".repeat(32)),
        ),
    ]
}

/// The seven files of a list of `records`, computed with the sha1/sha2 crates directly.
fn kernel_files(records: &[KernelRecord]) -> Vec<(String, Vec<u8>)> {
    let mut pcr1 = [[0u8; 20]; 24];
    let mut pcr256 = [[0u8; 32]; 24];
    let mut files: BTreeMap<&str, Vec<u8>> = BTreeMap::new();
    for r in records {
        let (t1, t256) = (Sha1::digest(r.data()), Sha256::digest(r.data()));
        let i = r.pcr as usize;
        pcr1[i] = Sha1::new()
            .chain_update(pcr1[i])
            .chain_update(t1)
            .finalize()
            .into();
        pcr256[i] = Sha256::new()
            .chain_update(pcr256[i])
            .chain_update(t256)
            .finalize()
            .into();
        let line = |t: &[u8]| format!("{:2} {} {} {}\n", r.pcr, hex(t), r.template, r.ascii);
        files.entry(BINARY_SHA1).or_default().extend(r.binary(&t1));
        files
            .entry(BINARY_SHA256)
            .or_default()
            .extend(r.binary(&t256));
        files
            .entry(ASCII_SHA1)
            .or_default()
            .extend(line(&t1).bytes());
        files
            .entry(ASCII_SHA256)
            .or_default()
            .extend(line(&t256).bytes());
    }
    let bank = |p: &[&[u8]]| -> Vec<u8> {
        p.iter()
            .enumerate()
            .flat_map(|(i, v)| format!("PCR-{i:02}: {}\n", hex(v)).into_bytes())
            .collect()
    };
    files.insert(
        PCRS_SHA1,
        bank(&pcr1.iter().map(|p| &p[..]).collect::<Vec<_>>()),
    );
    files.insert(
        PCRS_SHA256,
        bank(&pcr256.iter().map(|p| &p[..]).collect::<Vec<_>>()),
    );
    files.insert(COUNT, format!("{}\n", records.len()).into_bytes());
    files.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// PCR `i` of a bank file written by `kernel_files`, in hex.
fn pcr_in(files: &[(String, Vec<u8>)], bank: &str, i: u32) -> String {
    let text = &files.iter().find(|(n, _)| n == bank).unwrap().1;
    let line = String::from_utf8_lossy(text)
        .lines()
        .nth(i as usize)
        .unwrap()
        .to_string();
    line.split(": ").nth(1).unwrap().to_string()
}

#[test]
fn a_written_list_verifies() {
    let t = tempfile::tempdir().unwrap();
    standard(t.path());
    // Byte for byte the list the kernel's formats give, hashed here, not by the crate.
    let want = kernel_files(&kernel_records());
    let mut got = snapshot(t.path());
    // The writer's lock file is not part of the list.
    got.retain(|(name, _)| name != LOCK);
    let names = |v: &[(String, Vec<u8>)]| v.iter().map(|f| f.0.clone()).collect::<Vec<_>>();
    assert_eq!(names(&got), names(&want));
    for ((name, bytes), (_, want_bytes)) in got.iter().zip(&want) {
        assert!(
            bytes == want_bytes,
            "{name} differs from the kernel's format:\n{}\nwant:\n{}",
            String::from_utf8_lossy(bytes),
            String::from_utf8_lossy(want_bytes)
        );
    }
    // The first line as a kernel without a TPM shows it (LKML, "ima: ... boot_aggregate").
    let ascii = &want.iter().find(|(n, _)| n == ASCII_SHA1).unwrap().1;
    assert!(ascii.starts_with(
        format!(
            "10 0adefe762c149c7cec19da62f0da1297fcfbffff ima-ng sha256:{} boot_aggregate\n",
            "0".repeat(64)
        )
        .as_bytes()
    ));
    // verify() and a continuing Log agree with those PCR values.
    let report = verify(t.path()).unwrap();
    assert_eq!(report.entries, 6);
    let pcrs: Vec<(u32, String, String)> = [10, 11]
        .into_iter()
        .map(|i| {
            (
                i,
                pcr_in(&want, PCRS_SHA1, i),
                pcr_in(&want, PCRS_SHA256, i),
            )
        })
        .collect();
    let reported: Vec<(u32, String, String)> = report
        .pcrs
        .iter()
        .map(|(i, a, b)| (*i, hex(a), hex(b)))
        .collect();
    assert_eq!(reported, pcrs);
    let log = Log::open(t.path()).unwrap();
    assert_eq!(log.entries(), 6);
    assert_eq!(hex(&log.pcr(Bank::Sha256, 11)), pcrs[1].2);
    assert_eq!(report.violations, []);
    assert_eq!(report.state, State::Closed);
}

#[test]
fn a_changed_path_is_named_by_offset_and_entry() {
    let t = tempfile::tempdir().unwrap();
    let entries = standard(t.path());
    let off = offsets(&entries);
    let path = t.path().join(BINARY_SHA1);
    let mut d = std::fs::read(&path).unwrap();
    let i = d.windows(9).position(|w| w == b"/usr/bin/").unwrap();
    assert!(i as u64 > off[1] && (i as u64) < off[2]);
    d[i + 5] ^= 0x20;
    std::fs::write(&path, d).unwrap();
    rejects(
        t.path(),
        &format!(
            "{BINARY_SHA1}: offset {} (entry 2): template digest does not match its data",
            off[1] + 4
        ),
    );
}

#[test]
fn every_single_byte_change_and_every_truncation_is_caught() {
    use std::os::unix::fs::FileExt;
    let t = tempfile::tempdir().unwrap();
    standard(t.path());
    for name in LIST_FILES {
        let path = t.path().join(name);
        let good = std::fs::read(&path).unwrap();
        // Changed in place (no truncating rewrite, which ext4 flushes on close: slow).
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        for i in 0..good.len() {
            for flip in [0x01u8, 0x80] {
                f.write_all_at(&[good[i] ^ flip], i as u64).unwrap();
                assert!(
                    verify(t.path()).is_err(),
                    "{name}: byte {i} ^ {flip:#x} not detected"
                );
                assert!(Log::open(t.path()).is_err());
            }
            f.write_all_at(&good[i..i + 1], i as u64).unwrap();
        }
        // Every cut inside the binary lists; a spread of cuts elsewhere.
        let step = if name.starts_with("binary") { 1 } else { 7 };
        for len in (0..good.len()).step_by(step) {
            f.set_len(len as u64).unwrap();
            assert!(
                verify(t.path()).is_err(),
                "{name} truncated to {len} bytes not detected"
            );
            assert!(Log::open(t.path()).is_err());
        }
        f.set_len(0).unwrap();
        f.write_all_at(&good, 0).unwrap();
        assert_eq!(verify(t.path()).unwrap().entries, 6);
    }
}

#[test]
fn truncation_and_hostile_lengths() {
    let t = tempfile::tempdir().unwrap();
    let entries = standard(t.path());
    let off = offsets(&entries);
    let path = t.path().join(BINARY_SHA1);
    let good = std::fs::read(&path).unwrap();
    let last = &entries[5];
    let data_at = off[5] + 4 + 20 + 4 + last.template_name.len() as u64 + 4;

    std::fs::write(&path, &good[..good.len() - 10]).unwrap();
    rejects(
        t.path(),
        &format!(
            "{BINARY_SHA1}: offset {data_at} (entry 6): truncated record: the template data needs {} bytes, the file ends after {}",
            last.data.len(),
            last.data.len() - 10
        ),
    );
    std::fs::write(&path, &good[..off[3] as usize + 2]).unwrap();
    rejects(
        t.path(),
        &format!(
            "{BINARY_SHA1}: offset {} (entry 4): truncated record: the PCR index needs 4 bytes, the file ends after 2",
            off[3]
        ),
    );
    // Cut at a record boundary: the SHA-256 list now holds more.
    std::fs::write(&path, &good[..off[3] as usize]).unwrap();
    let off256 = entries[..3]
        .iter()
        .map(|e| e.binary_record(Bank::Sha256).len() as u64)
        .sum::<u64>();
    rejects(
        t.path(),
        &format!(
            "{BINARY_SHA256}: offset {off256} (entry 4): the list holds more entries than the 3 of {BINARY_SHA1}"
        ),
    );

    // Lengths that would allocate gigabytes are refused before anything is read.
    let e2 = off[1] as usize;
    let name_len_at = e2 + 24;
    let data_len_at = name_len_at + 4 + entries[1].template_name.len();
    let cases: [(usize, [u8; 4], String); 3] = [
        (
            data_len_at,
            0xffff_fff0u32.to_le_bytes(),
            format!(
                "offset {data_len_at} (entry 2): template data length 4294967280 is implausible (more than 131072)"
            ),
        ),
        (
            name_len_at,
            1_000_000_000u32.to_le_bytes(),
            format!("offset {name_len_at} (entry 2): template name length 1000000000 is not 1-255"),
        ),
        (
            e2,
            99u32.to_le_bytes(),
            format!("offset {e2} (entry 2): PCR index 99 does not exist (0-23)"),
        ),
    ];
    for (at, bytes, want) in cases {
        let mut bad = good.clone();
        bad[at..at + 4].copy_from_slice(&bytes);
        std::fs::write(&path, &bad).unwrap();
        rejects(t.path(), &format!("{BINARY_SHA1}: {want}"));
    }

    // Garbage instead of a list.
    let garbage: Vec<u8> = (0..5000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&path, &garbage).unwrap();
    assert!(verify(t.path()).is_err());
    // A PCR file far larger than any.
    std::fs::write(&path, &good).unwrap();
    std::fs::write(t.path().join(PCRS_SHA1), vec![b'0'; 1 << 20]).unwrap();
    rejects(
        t.path(),
        &format!(
            "{PCRS_SHA1}: offset 16384: 1048576 bytes, longer than the 16384 such a file can be"
        ),
    );
}

#[test]
fn forgeries_consistent_everywhere_but_the_pcrs() {
    let t = tempfile::tempdir().unwrap();
    let mut entries = standard(t.path());
    let pcrs = [
        std::fs::read(t.path().join(PCRS_SHA1)).unwrap(),
        std::fs::read(t.path().join(PCRS_SHA256)).unwrap(),
    ];
    let honest_10 = Log::open(t.path()).unwrap().pcr(Bank::Sha1, 10);
    // Entry 2 replaced by a well-formed entry for another file, every list file and digest
    // rewritten to match: only the PCR values tell.
    entries[1] = Entry::new(
        10,
        &Event {
            template: Template::ImaNg,
            kind: DigestKind::Ima,
            algo: HashAlgo::Sha256,
            digest: &[0xee; 32],
            path: b"/usr/bin/tool_one",
            sig: None,
        },
    );
    write_dir(t.path(), &entries);
    let forged_10 = Log::open(t.path()).unwrap().pcr(Bank::Sha1, 10);
    std::fs::write(t.path().join(PCRS_SHA1), &pcrs[0]).unwrap();
    std::fs::write(t.path().join(PCRS_SHA256), &pcrs[1]).unwrap();
    rejects(
        t.path(),
        &format!(
            "{PCRS_SHA1}: offset {} (PCR-10): replaying all 6 entries gives {}, the file has {}",
            10 * 49 + 8,
            hex(&forged_10),
            hex(&honest_10)
        ),
    );
}

#[test]
fn entries_past_the_pcr_values_are_not_covered() {
    let t = tempfile::tempdir().unwrap();
    let mut entries = standard(t.path());
    let pcrs = [
        std::fs::read(t.path().join(PCRS_SHA1)).unwrap(),
        std::fs::read(t.path().join(PCRS_SHA256)).unwrap(),
    ];
    let end = std::fs::metadata(t.path().join(BINARY_SHA1)).unwrap().len();
    // A copy of a valid entry appended to every list, the count updated: evmctl stops at
    // the first entry where the PCRs match and accepts this; verify does not.
    entries.push(entries[2].clone());
    entries.push(entries[3].clone());
    write_dir(t.path(), &entries);
    std::fs::write(t.path().join(PCRS_SHA1), &pcrs[0]).unwrap();
    std::fs::write(t.path().join(PCRS_SHA256), &pcrs[1]).unwrap();
    rejects(
        t.path(),
        &format!(
            "{BINARY_SHA1}: offset {end} (entry 7): entries 7-8 are not covered: the PCR files match the replay after entry 6, so only 6 of the 8 entries are verified"
        ),
    );
    // Appended to the SHA-1 list alone, the lists disagree first.
    let t = tempfile::tempdir().unwrap();
    let entries = standard(t.path());
    let rec = entries[5].binary_record(Bank::Sha1);
    let path = t.path().join(BINARY_SHA1);
    let mut d = std::fs::read(&path).unwrap();
    d.extend(&rec);
    std::fs::write(&path, d).unwrap();
    let end256 = std::fs::metadata(t.path().join(BINARY_SHA256))
        .unwrap()
        .len();
    rejects(
        t.path(),
        &format!("{BINARY_SHA256}: offset {end256} (entry 7): the list ends after 6 entries, {BINARY_SHA1} holds more"),
    );
}

#[test]
fn malformed_fields_with_honest_digests() {
    let t = tempfile::tempdir().unwrap();
    let entries = standard(t.path());
    let off = offsets(&entries);
    let e2 = off[1];
    let d32 = [0x33u8; 32];
    let ng = |d: &[u8], n: &[u8]| [field(d), field(n)].concat();
    // (template, data, offset of the problem relative to the template data, message)
    let cases: Vec<(&str, Vec<u8>, u64, String)> = vec![
        (
            "ima-ng",
            ng(&[&b"sha256\0"[..], &d32].concat(), b"/x\0"),
            4,
            "d-ng prefix `sha256` does not end with ':'".into(),
        ),
        (
            "ima-ng",
            ng(&[&b"sha256:"[..], &d32].concat(), b"/x\0"),
            4,
            "d-ng field has no NUL after its prefix".into(),
        ),
        (
            "ima-ng",
            ng(&[&b"sha1:\0"[..], &d32].concat(), b"/x\0"),
            4 + 6,
            "a sha1 digest is 20 bytes, this one is 32".into(),
        ),
        (
            "ima-ng",
            ng(&[&b"md9:\0"[..], &d32[..16]].concat(), b"/x\0"),
            4,
            "unknown hash algorithm `md9`".into(),
        ),
        (
            "ima-ng",
            ng(&[&b"ima:sha256:\0"[..], &d32].concat(), b"/x\0"),
            4,
            "d-ng prefix `ima:sha256:` is not `algo:`".into(),
        ),
        (
            "ima-ngv2",
            ng(&[&b"sha256:\0"[..], &d32].concat(), b"/x\0"),
            4,
            "d-ngv2 prefix `sha256:` is not `type:algo:`".into(),
        ),
        (
            "ima-ngv2",
            ng(&[&b"blob:sha256:\0"[..], &d32].concat(), b"/x\0"),
            4,
            "digest type `blob` is neither ima nor verity".into(),
        ),
        (
            "ima-ngv2",
            ng(&[&b"verity:sha1:\0"[..], &d32[..20]].concat(), b"/x\0"),
            4,
            "fs-verity digests are sha256 or sha512, not `sha1`".into(),
        ),
        (
            "ima-ng",
            ng(&[&b"sha256:\0"[..], &d32].concat(), b"/x"),
            4 + 40 + 4,
            "n-ng field does not end with NUL".into(),
        ),
        (
            "ima-ng",
            ng(&[&b"sha256:\0"[..], &d32].concat(), b"/a\0b\0"),
            4 + 40 + 4 + 2,
            "path has a NUL before its end".into(),
        ),
        (
            "ima-ng",
            ng(
                &[&b"sha256:\0"[..], &d32].concat(),
                &[&[b'a'; 4097][..], b"\0"].concat(),
            ),
            4 + 40 + 4,
            "path of 4097 bytes is longer than 4096".into(),
        ),
        (
            "ima-ng",
            ng(&[&b"sha256:\0"[..], &d32].concat(), b"/a b\0"),
            4 + 40 + 4 + 2,
            "path contains a space (the kernel writes spaces as '_')".into(),
        ),
        (
            "ima-ng",
            [ng(&[&b"sha256:\0"[..], &d32].concat(), b"/x\0"), field(b"")].concat(),
            4 + 40 + 4 + 3,
            "4 bytes after the last field of ima-ng".into(),
        ),
        (
            "ima-sig",
            ng(&[&b"sha256:\0"[..], &d32].concat(), b"/x\0"),
            4 + 40 + 4 + 3,
            "template data ends after 2 of the 3 fields of ima-sig".into(),
        ),
        (
            "ima-ng",
            [
                field(&[&b"sha256:\0"[..], &d32].concat()),
                1000u32.to_le_bytes().to_vec(),
                b"/x\0".to_vec(),
            ]
            .concat(),
            4 + 40,
            "field length 1000 runs past the template data (3 bytes left)".into(),
        ),
    ];
    for (name, data, rel, msg) in cases {
        let mut es = entries.clone();
        es[1] = forged(10, name, data);
        write_dir(t.path(), &es);
        let data_at = e2 + 4 + 20 + 4 + name.len() as u64 + 4;
        rejects(
            t.path(),
            &format!("{BINARY_SHA1}: offset {} (entry 2): {msg}", data_at + rel),
        );
    }

    let mut es = entries.clone();
    es[1] = forged(
        10,
        "ima-buf",
        ng(&[&b"sha256:\0"[..], &d32].concat(), b"/x\0"),
    );
    write_dir(t.path(), &es);
    rejects(
        t.path(),
        &format!(
            "{BINARY_SHA1}: offset {} (entry 2): template `ima-buf` is not one verilay writes (ima-ng, ima-ngv2, ima-sig, ima-sigv2)",
            e2 + 28
        ),
    );

    let mut es = entries.clone();
    es[0] = es[1].clone();
    write_dir(t.path(), &es);
    rejects(
        t.path(),
        &format!("{BINARY_SHA1}: offset 38 (entry 1): the first entry is `/usr/bin/tool_one`, not boot_aggregate"),
    );
}

#[test]
fn ascii_count_and_pcr_files_are_checked() {
    let t = tempfile::tempdir().unwrap();
    let entries = standard(t.path());
    let sha1_line_3 = entries[2].ascii_line(Bank::Sha1);
    let start3 = entries[..2]
        .iter()
        .map(|e| e.ascii_bytes(Bank::Sha256).len())
        .sum::<usize>();
    let path = t.path().join(ASCII_SHA256);
    let good = std::fs::read(&path).unwrap();
    let text = String::from_utf8(good.clone()).unwrap();
    let at = text.find("/etc/passwd").unwrap();
    assert!(at > start3);
    std::fs::write(&path, text.replace("/etc/passwd", "/etc/shadow")).unwrap();
    let line3 = entries[2].ascii_line(Bank::Sha256);
    rejects(
        t.path(),
        &format!(
            "{ASCII_SHA256}: offset {} (entry 3): differs from the binary list, whose entry renders as `{}...`",
            at + 5,
            &line3[..80]
        ),
    );
    // The SHA-1 ascii list shows the SHA-1 digest: the legacy file.
    assert!(sha1_line_3.starts_with(&format!("10 {} ima-ngv2 ima:sha1:", hex(&entries[2].sha1))));
    std::fs::write(&path, [&good[..], b"\n"].concat()).unwrap();
    rejects(
        t.path(),
        &format!(
            "{ASCII_SHA256}: offset {} (entry 7): data after the line of the last entry (6)",
            good.len()
        ),
    );
    std::fs::write(&path, &good).unwrap();

    std::fs::write(t.path().join(COUNT), "5\n").unwrap();
    rejects(
        t.path(),
        &format!("{COUNT}: offset 0: says `5`, the list holds 6 entries"),
    );
    std::fs::write(t.path().join(COUNT), "6\n").unwrap();

    let pcr_path = t.path().join(PCRS_SHA256);
    let good = std::fs::read_to_string(&pcr_path).unwrap();
    // An unused PCR that is not zero: evmctl skips unused PCRs, verify does not.
    std::fs::write(&pcr_path, good.replacen("PCR-03: 00", "PCR-03: 01", 1)).unwrap();
    rejects(
        t.path(),
        &format!(
            "{PCRS_SHA256}: offset {} (PCR-03): replaying all 6 entries gives {}, the file has 01{}",
            3 * 73 + 8,
            "00".repeat(32),
            "00".repeat(31)
        ),
    );
    std::fs::write(&pcr_path, good.replacen("PCR-05: ", "PCR-5: ", 1)).unwrap();
    rejects(
        t.path(),
        &format!(
            "{PCRS_SHA256}: offset {} (PCR-05): expected a line starting `PCR-05: `, found `PCR-5: {}`",
            5 * 73,
            "00".repeat(32)
        ),
    );
    std::fs::write(
        &pcr_path,
        good.replacen(&"00".repeat(32), &"00".repeat(20), 1),
    )
    .unwrap();
    rejects(
        t.path(),
        &format!(
            "{PCRS_SHA256}: offset 8 (PCR-00): expected 64 hex digits of a sha256 PCR, found `{}`",
            "00".repeat(20)
        ),
    );
    let lines: Vec<&str> = good.lines().collect();
    std::fs::write(&pcr_path, lines[..23].join("\n") + "\n").unwrap();
    rejects(
        t.path(),
        &format!(
            "{PCRS_SHA256}: offset {} (PCR-23): the file ends after 23 lines; a PCR file has 24",
            23 * 73
        ),
    );
    std::fs::remove_file(&pcr_path).unwrap();
    rejects(
        t.path(),
        &format!("{PCRS_SHA256}: cannot open: No such file or directory (os error 2)"),
    );
}

#[test]
fn empty_and_missing_lists() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("new");
    // A directory that does not exist yet is created and started.
    let log = Log::open(&dir).unwrap();
    assert_eq!(log.entries(), 1);
    drop(log);
    assert_eq!(verify(&dir).unwrap().entries, 1);
    // Four empty list files: a new list, nothing to verify yet...
    write_dir(&dir, &[]);
    let err = verify(&dir).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("{BINARY_SHA1}: offset 0 (entry 1): the list is empty; every list starts with boot_aggregate")
    );
    // ... which Log::open starts afresh.
    let log = Log::open(&dir).unwrap();
    assert_eq!(log.entries(), 1);
    drop(log);
    assert_eq!(verify(&dir).unwrap().entries, 1);
    // A list file alone, the others missing: refused, not restarted.
    std::fs::remove_file(dir.join(BINARY_SHA256)).unwrap();
    rejects(
        &dir,
        &format!("{BINARY_SHA256}: cannot open: No such file or directory (os error 2)"),
    );
}
