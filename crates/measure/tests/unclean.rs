//! A list whose writer died with it open (issue 19, item 9): the next writer records the
//! gap as the kernel records a violation, recovers a torn batch or refuses, and two
//! writers never share a list. Also the files' modes and what is refused (item 13).

use measure::log::from_hex;
use measure::log::{
    Bank, DigestKind, Entry, Event, HashAlgo, Holder, Log, LogError, ASCII_SHA1, ASCII_SHA256,
    BINARY_SHA1, BINARY_SHA256, COUNT, IN_USE, LIST_FILES, LOCK, PCRS_SHA1, PCRS_SHA256,
    UNCLEAN_SHUTDOWN,
};
use measure::policy::Template;
use measure::verify::{verify, State, Violation};
use sha1::{Digest, Sha1};
use sha2::Sha256;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

fn ev(path: &[u8], d: u8) -> Event<'_> {
    static DIGESTS: [[u8; 32]; 256] = {
        let mut a = [[0u8; 32]; 256];
        let mut i = 0;
        while i < 256 {
            a[i] = [i as u8; 32];
            i += 1;
        }
        a
    };
    Event {
        template: Template::ImaNg,
        kind: DigestKind::Ima,
        algo: HashAlgo::Sha256,
        digest: &DIGESTS[d as usize],
        path,
        sig: None,
    }
}

/// A list of boot_aggregate and `n` entries on PCR 10, left as a killed writer leaves it.
fn killed_list(dir: &Path, n: u8) {
    let mut log = Log::open(dir).unwrap();
    for i in 0..n {
        let path = format!("/f{i}");
        log.append(10, &ev(path.as_bytes(), i + 1)).unwrap();
    }
    log.flush().unwrap();
    log.abandon();
}

/// The template data of the kernel's violation entry, by hand: ima-ng's `d-ng` with a
/// zero sha256 digest, then `n-ng`.
fn violation_data() -> Vec<u8> {
    let name = format!("{UNCLEAN_SHUTDOWN}\0");
    [
        &40u32.to_le_bytes()[..],
        b"sha256:\0",
        &[0; 32],
        &(name.len() as u32).to_le_bytes(),
        name.as_bytes(),
    ]
    .concat()
}

fn pcr_line(dir: &Path, file: &str, i: u32) -> String {
    let text = std::fs::read_to_string(dir.join(file)).unwrap();
    let want = format!("PCR-{i:02}: ");
    text.lines()
        .find_map(|l| l.strip_prefix(want.as_str()).map(str::to_owned))
        .unwrap()
}

/// The holder a writer names: `what` holds it and its policy may extend `pcrs`.
fn holder(what: &str, pcrs: &[u32]) -> Holder {
    Holder {
        what: what.into(),
        pcrs: pcrs.to_vec(),
    }
}

#[test]
fn a_killed_writer_leaves_a_marked_list_and_the_next_records_a_violation() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    killed_list(dir, 3);
    // Before anyone continues it: it verifies, but says it was not closed.
    let r = verify(dir).unwrap();
    assert_eq!(r.entries, 4);
    assert_eq!(r.violations, []);
    assert!(
        matches!(&r.state, State::Unclean { holder } if holder == &format!("pid {}", std::process::id())),
        "{:?}",
        r.state
    );
    let pcr10_sha1 = from_hex(pcr_line(dir, PCRS_SHA1, 10).as_bytes()).unwrap();
    let pcr10_sha256 = from_hex(pcr_line(dir, PCRS_SHA256, 10).as_bytes()).unwrap();

    let log = Log::open(dir).unwrap();
    let rec = log.recovery().expect("a recovery");
    assert_eq!(rec.kept, 4);
    assert_eq!(rec.violations, [(5, 10)]);
    assert_eq!(rec.problem, None);
    assert_eq!(log.entries(), 5);
    // The PCR extended with 0xff bytes, in both banks (ima_add_template_entry).
    let want1: [u8; 20] = Sha1::new()
        .chain_update(&pcr10_sha1)
        .chain_update([0xff; 20])
        .finalize()
        .into();
    let want2: [u8; 32] = Sha256::new()
        .chain_update(&pcr10_sha256)
        .chain_update([0xff; 32])
        .finalize()
        .into();
    assert_eq!(log.pcr(Bank::Sha1, 10), want1);
    assert_eq!(log.pcr(Bank::Sha256, 10), want2);
    drop(log);
    // The record, byte for byte: zero template digests in both banks.
    let data = violation_data();
    for (file, size) in [(BINARY_SHA1, 20), (BINARY_SHA256, 32)] {
        let bytes = std::fs::read(dir.join(file)).unwrap();
        let record = [
            &10u32.to_le_bytes()[..],
            &vec![0; size],
            &6u32.to_le_bytes(),
            b"ima-ng",
            &(data.len() as u32).to_le_bytes(),
            &data,
        ]
        .concat();
        assert!(bytes.ends_with(&record), "{file}");
    }
    let ascii = std::fs::read_to_string(dir.join(ASCII_SHA1)).unwrap();
    assert_eq!(
        ascii.lines().last().unwrap(),
        format!(
            "10 {} ima-ng sha256:{} {UNCLEAN_SHUTDOWN}",
            "0".repeat(40),
            "0".repeat(64)
        )
    );
    let ascii = std::fs::read_to_string(dir.join(ASCII_SHA256)).unwrap();
    assert!(ascii.ends_with(&format!(" {UNCLEAN_SHUTDOWN}\n")));
    assert!(ascii
        .lines()
        .last()
        .unwrap()
        .starts_with(&format!("10 {} ", "0".repeat(64))));
    // Closed cleanly now, and the violation is reported.
    let r = verify(dir).unwrap();
    assert_eq!(r.entries, 5);
    assert_eq!(r.state, State::Closed);
    assert_eq!(
        r.violations,
        [Violation {
            entry: 5,
            pcr: 10,
            name: UNCLEAN_SHUTDOWN.into()
        }]
    );
    // A later writer continues without another.
    let log = Log::open(dir).unwrap();
    assert!(log.recovery().is_none());
    assert_eq!(log.entries(), 5);
}

#[test]
fn violations_go_on_every_pcr_the_dead_writer_could_extend() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let holder = holder("mount on /m", &[12, 10]);
    let mut log = Log::open_as(dir, &holder).unwrap();
    log.append(11, &ev(b"/on-11", 1)).unwrap();
    log.flush().unwrap();
    log.abandon();
    match verify(dir).unwrap().state {
        State::Unclean { holder } => {
            assert_eq!(holder, format!("pid {}, mount on /m", std::process::id()))
        }
        s => panic!("{s:?}"),
    }
    // 10 (IMA's own and the dead writer's), 11 (used by the list), 12 (its policy's).
    let log = Log::open(dir).unwrap();
    assert_eq!(
        log.recovery().unwrap().violations,
        [(3, 10), (4, 11), (5, 12)]
    );
    drop(log);
    let r = verify(dir).unwrap();
    let pcrs: Vec<u32> = r.violations.iter().map(|v| v.pcr).collect();
    assert_eq!(pcrs, [10, 11, 12]);
}

#[test]
fn a_torn_batch_is_cut_back_to_what_all_files_agree_on() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    {
        let mut log = Log::open(dir).unwrap();
        log.append(10, &ev(b"/a", 1)).unwrap();
        log.flush().unwrap();
        // The next batch: its records written, the count and PCRs not yet (killed
        // between the writes), and the SHA-1 list cut in the middle of the last record.
        log.append(10, &ev(b"/b", 2)).unwrap();
        log.append(10, &ev(b"/c", 3)).unwrap();
        log.abandon();
    }
    // abandon() wrote nothing of the second batch: write it as a torn flush would have.
    let b = Entry::new(10, &ev(b"/b", 2));
    let c = Entry::new(10, &ev(b"/c", 3));
    let append = |file: &str, bytes: &[u8]| {
        use std::io::Write;
        std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join(file))
            .unwrap()
            .write_all(bytes)
            .unwrap();
    };
    let whole1 = [b.binary_record(Bank::Sha1), c.binary_record(Bank::Sha1)].concat();
    append(BINARY_SHA1, &whole1[..whole1.len() - 7]);
    append(
        ASCII_SHA1,
        &[b.ascii_bytes(Bank::Sha1), c.ascii_bytes(Bank::Sha1)].concat(),
    );
    append(BINARY_SHA256, &b.binary_record(Bank::Sha256));
    let before_sha1 = std::fs::metadata(dir.join(BINARY_SHA1)).unwrap().len();

    // verify names the torn record and says the list was not closed.
    let e = verify(dir).unwrap_err().to_string();
    assert!(
        e.contains("not closed cleanly") && e.starts_with(ASCII_SHA256),
        "{e}"
    );
    let log = Log::open(dir).unwrap();
    let rec = log.recovery().unwrap().clone();
    // Entries 1-2 were in all four files (and the PCR files matched after 2); /b was in
    // three of them: dropped, with everything after it.
    assert_eq!(rec.kept, 2);
    assert_eq!(rec.violations, [(3, 10)]);
    let p = rec.problem.as_deref().unwrap();
    assert!(
        p.starts_with(&format!("{ASCII_SHA256}: offset "))
            && p.ends_with("(entry 3): the file ends inside the entry's line"),
        "{p}"
    );
    let cut: Vec<&str> = rec.cut.iter().map(|c| c.0).collect();
    assert_eq!(cut, [BINARY_SHA1, ASCII_SHA1, BINARY_SHA256]);
    let sha1_cut = rec.cut.iter().find(|c| c.0 == BINARY_SHA1).unwrap();
    assert_eq!(sha1_cut.1 + sha1_cut.2, before_sha1);
    let msg = rec.to_string();
    assert!(
        msg.contains("events after entry 2 may be missing") && msg.contains("entry 3 on PCR 10"),
        "{msg}"
    );
    drop(log);
    let r = verify(dir).unwrap();
    assert_eq!((r.entries, r.violations.len()), (3, 1));
    assert_eq!(r.state, State::Closed);
}

#[test]
fn a_damaged_list_is_refused_even_after_a_kill() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    killed_list(dir, 4);
    // A change in entry 2 of a list whose PCR files cover all five entries: cutting back
    // to entry 1 would drop entries the PCR files attest, so it is refused.
    let path = dir.join(BINARY_SHA1);
    let mut bytes = std::fs::read(&path).unwrap();
    let i = bytes.windows(3).position(|w| w == b"/f0").unwrap();
    bytes[i + 2] = b'X';
    std::fs::write(&path, &bytes).unwrap();
    let before = std::fs::read(&path).unwrap();
    let e = Log::open(dir).err().expect("refused").to_string();
    assert!(
        e.contains(&format!(
            "{PCRS_SHA1}: matches the replay after none of the 1 entries the list files agree on"
        )) && e.contains("(entry 2): template digest does not match its data"),
        "{e}"
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "a refused open cut the list"
    );
    assert!(dir.join(IN_USE).exists(), "the marker stays");
    // A count claiming more than the files agree on is refused too.
    std::fs::write(&path, &before).unwrap();
    let t2 = tempfile::tempdir().unwrap();
    killed_list(t2.path(), 2);
    std::fs::write(t2.path().join(COUNT), "9\n").unwrap();
    let e = Log::open(t2.path()).err().expect("refused").to_string();
    assert!(
        e.contains(&format!(
            "{COUNT}: offset 0: says `9`, more than the 3 entries the list files agree on"
        )),
        "{e}"
    );
}

#[test]
fn two_writers_never_share_a_list() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let holder = holder("mount on /first", &[10]);
    let first = Log::open_as(dir, &holder).unwrap();
    let start = std::time::Instant::now();
    let e = Log::open(dir).err().expect("a second writer is refused");
    assert!(start.elapsed() >= std::time::Duration::from_secs(2));
    assert!(matches!(e, LogError::InUse { .. }));
    assert_eq!(
        e.to_string(),
        format!(
            "the measurement list in {} is in use by another writer (pid {}, mount on /first); two mounts cannot share a list",
            dir.display(),
            std::process::id()
        )
    );
    // verify reads it meanwhile, and says who has it open.
    match verify(dir).unwrap().state {
        State::Open { holder } => assert!(holder.ends_with("mount on /first"), "{holder}"),
        s => panic!("{s:?}"),
    }
    // Once the first lets go, the second gets it (waiting for a closing writer).
    let closer = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        drop(first);
    });
    let second = Log::open(dir).unwrap();
    closer.join().unwrap();
    assert!(second.recovery().is_none());
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn every_file_is_private_and_what_others_can_write_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("a/b");
    let log = Log::open(&dir).unwrap();
    // A directory verilay makes is 0700, parents too; every file 0600.
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&t.path().join("a")), 0o700);
    for name in LIST_FILES.into_iter().chain([LOCK, IN_USE]) {
        assert_eq!(mode(&dir.join(name)), 0o600, "{name}");
    }
    drop(log);
    let refused = |why: &str| {
        let e = Log::open(&dir).err().expect("refused").to_string();
        assert!(e.contains(why), "{e}");
    };
    for (name, m) in [(COUNT, 0o620), (BINARY_SHA256, 0o602), (LOCK, 0o666)] {
        let p = dir.join(name);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(m)).unwrap();
        refused(&format!("{name}: writable by"));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o770)).unwrap();
    refused(&format!(
        "{}: writable by its group (mode 0770)",
        dir.display()
    ));
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    // A symlink in the directory is never followed, for reading or writing.
    let count = dir.join(COUNT);
    let elsewhere = t.path().join("elsewhere");
    std::fs::rename(&count, &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &count).unwrap();
    refused(&format!(
        "{COUNT}: is a symbolic link, which is not followed"
    ));
    let e = verify(&dir).unwrap_err().to_string();
    assert_eq!(
        e,
        format!("{COUNT}: is a symbolic link, which is not followed")
    );
    std::fs::remove_file(&count).unwrap();
    std::fs::rename(&elsewhere, &count).unwrap();
    // A directory that is a symlink is not either.
    let link = t.path().join("link");
    std::os::unix::fs::symlink(&dir, &link).unwrap();
    let e = Log::open(&link).err().expect("refused").to_string();
    assert!(
        e.contains("is a symbolic link, which is not followed"),
        "{e}"
    );
    // Owned by someone else (as root: chown to another uid).
    if rustix::process::geteuid().is_root() {
        let p = dir.join(PCRS_SHA1);
        std::os::unix::fs::chown(&p, Some(4242), None).unwrap();
        refused(&format!(
            "{PCRS_SHA1}: owned by uid 4242, not by this process's uid 0 or root"
        ));
        std::os::unix::fs::chown(&p, Some(0), None).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().uid(), 0);
    }
    assert_eq!(Log::open(&dir).unwrap().entries(), 1);
}

#[test]
fn fifos_and_devices_in_a_list_are_refused_without_waiting() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    drop(Log::open(dir).unwrap());
    for name in [BINARY_SHA1, ASCII_SHA256, PCRS_SHA1, COUNT] {
        let p = dir.join(name);
        let saved = std::fs::read(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &p,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        // Would block forever in open(2) without O_NONBLOCK.
        let e = verify(dir).unwrap_err().to_string();
        assert_eq!(e, format!("{name}: is a FIFO, not a regular file"));
        let e = Log::open(dir).err().expect("refused").to_string();
        assert!(e.ends_with("is a FIFO, not a regular file"), "{e}");
        std::fs::remove_file(&p).unwrap();
        std::fs::write(&p, saved).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    assert_eq!(verify(dir).unwrap().entries, 1);
}
