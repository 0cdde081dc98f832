//! The verified block source over files with an appended section: every read returns the
//! right bytes or fails, whatever the range, the tree shape or readahead; any flipped byte
//! of data, tree or descriptor is caught by the reads that depend on it.

#[path = "../../erofs/tests/common/skip.rs"]
mod skip;
#[path = "../../erofs/tests/common/xorshift.rs"]
mod xorshift;

use skip::skip_unless;
use std::io::Write;
use verity::appended::{append, Section};
use verity::source::{ByteSource, FileSource};
use verity::{hash_blocks, HashAlg, IntegrityError, OpenError, Params, VerifiedSource};

fn data(n: usize, seed: u64) -> Vec<u8> {
    xorshift::xorshift(n, seed | 1)
}

/// A temp file holding `bytes` followed by its verity section; returns it and the digest.
/// `data(n, seed)` sealed with SHA-256 and 4096-byte blocks: (the data, the file, its
/// digest).
fn sealed_data(n: usize, seed: u64) -> (Vec<u8>, tempfile::NamedTempFile, Vec<u8>) {
    let params = Params::new(HashAlg::Sha256, 4096, vec![]).unwrap();
    let bytes = data(n, seed);
    let (f, digest) = sealed(&bytes, &params);
    (bytes, f, digest)
}

fn sealed(bytes: &[u8], params: &Params) -> (tempfile::NamedTempFile, Vec<u8>) {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(bytes).unwrap();
    let bs = params.block_size as usize;
    let mut level0 = vec![0u8; bytes.len().div_ceil(bs) * params.alg.digest_size()];
    hash_blocks(params, &params.padded_salt(), bytes, &mut level0);
    let digest = append(f.as_file(), params, bytes.len() as u64, level0).unwrap();
    (f, digest)
}

/// `fsverity digest` (fsverity-utils) of `bytes`, in hex: the oracle for sealed digests.
fn fsverity_digest(bytes: &[u8], alg: HashAlg, bs: u32, salt: &[u8]) -> String {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(bytes).unwrap();
    let alg = match alg {
        HashAlg::Sha256 => "sha256",
        HashAlg::Sha512 => "sha512",
    };
    let salt: String = salt.iter().map(|b| format!("{b:02x}")).collect();
    let mut cmd = std::process::Command::new("fsverity");
    cmd.args(["digest", "--compact", "--hash-alg", alg])
        .arg(format!("--block-size={bs}"));
    if !salt.is_empty() {
        cmd.arg(format!("--salt={salt}"));
    }
    let out = cmd.arg(f.path()).output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn open(f: &tempfile::NamedTempFile, pin: Option<&[u8]>) -> VerifiedSource<FileSource> {
    VerifiedSource::open(FileSource::open(f.path()).unwrap(), pin).unwrap()
}

fn ranges(len: u64, bs: u64) -> Vec<(u64, u64)> {
    let mut r = vec![(0, len), (0, 1.min(len))];
    let mut s = 99u64;
    for _ in 0..60 {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let a = (s >> 33) % (len + 1);
        let n = ((s >> 7) % (bs * 40)).min(len - a);
        r.push((a, n));
        // Block-aligned ones take the in-place path.
        let a = a / bs * bs;
        r.push((a, (bs * ((s >> 20) % 300)).min(len - a)));
    }
    r
}

#[test]
fn reads_match_the_data_for_every_shape() {
    // Without fsverity-utils the reads are still checked, and the test counts as skipped.
    let have_fsverity = std::process::Command::new("fsverity")
        .arg("--version")
        .output()
        .is_ok();
    let oracle = !skip_unless(have_fsverity, "fsverity (fsverity-utils) missing");
    let cases = [
        (HashAlg::Sha256, 4096, vec![], 0usize),
        (HashAlg::Sha256, 4096, vec![], 1),
        (HashAlg::Sha256, 4096, vec![], 4096),
        (HashAlg::Sha256, 4096, vec![], 4097),
        (HashAlg::Sha256, 4096, vec![], 128 * 4096 + 1),
        (HashAlg::Sha256, 4096, vec![], 3 << 20),
        (HashAlg::Sha512, 1024, vec![], (1 << 20) + 77), // four levels
        (HashAlg::Sha256, 1024, b"salty".to_vec(), 300_000),
        (HashAlg::Sha512, 65536, vec![7; 32], 5 << 20),
    ];
    for (alg, bs, salt, n) in cases {
        let params = Params::new(alg, bs, salt.clone()).unwrap();
        let bytes = data(n, n as u64);
        let (f, digest) = sealed(&bytes, &params);
        // The digest is the data's fs-verity digest, as fsverity-utils computes it.
        if oracle {
            assert_eq!(
                hex(&digest),
                fsverity_digest(&bytes, alg, bs, &salt),
                "{n} bytes, {bs}-byte blocks"
            );
        }
        for readahead in [true, false] {
            let mut v = open(&f, Some(&digest));
            v.set_readahead(readahead);
            assert_eq!(v.len(), n as u64);
            assert!(v.is_pinned());
            for (a, len) in ranges(n as u64, bs as u64) {
                let mut buf = vec![0u8; len as usize];
                v.read_exact_at(&mut buf, a).unwrap();
                assert_eq!(buf, bytes[a as usize..(a + len) as usize], "{n} {a}+{len}");
            }
            let mut one = [0u8; 1];
            assert!(v.read_exact_at(&mut one, n as u64).is_err(), "past the end");
            v.verify_all(&|_| {}).unwrap();
        }
    }
}

#[test]
fn every_flipped_byte_is_caught() {
    let params = Params::new(HashAlg::Sha256, 1024, vec![]).unwrap();
    let n = 40_000 + 123; // 40 data blocks, two tree levels
    let bytes = data(n, 5);
    let (f, digest) = sealed(&bytes, &params);
    let whole = std::fs::read(f.path()).unwrap();
    let section = Section::plan(&params, n as u64);
    let bs = 1024u64;
    // A sample of positions in every region: data, padding, tree, descriptor, trailer.
    let mut positions: Vec<u64> = (0..whole.len() as u64).step_by(97).collect();
    positions.extend([
        0,
        n as u64 - 1,
        section.tree_offset,
        section.descriptor_offset + 16,
    ]);
    for at in positions {
        let mut bad = whole.clone();
        bad[at as usize] ^= 0x01;
        let path = f.path().with_extension("bad");
        std::fs::write(&path, &bad).unwrap();
        let unpinned = VerifiedSource::open(FileSource::open(&path).unwrap(), None);
        let pinned = VerifiedSource::open(FileSource::open(&path).unwrap(), Some(&digest));
        if at >= n as u64 && at < section.tree_offset {
            // Zero padding between data and tree is covered by nothing; it is never read.
            continue;
        }
        if at >= section.descriptor_offset {
            // Descriptor or trailer: a pinned open refuses it outright.
            assert!(pinned.is_err(), "byte {at} of descriptor/trailer");
        }
        let Ok(v) = unpinned else { continue };
        let full = v.verify_all(&|_| {});
        let err = full.expect_err(&format!("flipped byte {at} went unnoticed"));
        let ie = IntegrityError::find(&err).expect("an integrity error");
        if at < n as u64 {
            assert!(ie.data);
            assert_eq!(ie.offset, at / bs * bs, "names the bad block");
            // Reads of other blocks still succeed; the bad block's are refused.
            let mut buf = vec![0u8; 10];
            assert!(v.read_exact_at(&mut buf, at).is_err());
            let other = if at >= bs { 0 } else { 2 * bs };
            v.read_exact_at(&mut buf, other).unwrap();
            assert_eq!(buf, bytes[other as usize..other as usize + 10]);
            // An aligned read of the bad block leaves no unverified byte in the buffer.
            let mut block = vec![0u8; bs as usize];
            let start = at / bs * bs;
            let block = &mut block[..(n as u64 - start).min(bs) as usize];
            assert!(v.read_exact_at(block, start).is_err());
            assert!(block.iter().all(|&b| b == 0));
        } else {
            assert!(!ie.data, "tree or descriptor byte {at}");
        }
    }
}

#[test]
fn hostile_sections_are_refused_without_panicking() {
    let (bytes, f, _) = sealed_data(50_000, 9);
    let whole = std::fs::read(f.path()).unwrap();
    // No section at all.
    assert!(matches!(
        VerifiedSource::open(bytes.clone(), None),
        Err(OpenError::NoSection)
    ));
    assert!(matches!(
        VerifiedSource::open(Vec::new(), None),
        Err(OpenError::NoSection)
    ));
    // Every trailer and descriptor byte set to a few hostile values.
    let tail = whole.len() - 64 - 256;
    for at in tail..whole.len() {
        for v in [0x00u8, 0xff, 0x80, 0x01] {
            let mut bad = whole.clone();
            if bad[at] == v {
                continue;
            }
            bad[at] = v;
            if let Ok(src) = VerifiedSource::open(bad, None) {
                // Opening may succeed (an unpinned descriptor is believed); reading must
                // then either verify or fail, never panic or return wrong bytes.
                let mut buf = vec![0u8; src.len().min(1 << 16) as usize];
                if src.read_exact_at(&mut buf, 0).is_ok() {
                    assert_eq!(buf, bytes[..buf.len()]);
                }
            }
        }
    }
    // Truncations.
    for cut in [1, 64, 65, 320, 4096, whole.len() - 1] {
        let r = VerifiedSource::open(whole[..whole.len() - cut].to_vec(), None);
        assert!(r.is_err(), "cut {cut}");
    }
}

#[test]
fn concurrent_readers_agree() {
    let n = 8 << 20;
    let (bytes, f, digest) = sealed_data(n, 3);
    let v = open(&f, Some(&digest));
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let v = &v;
            let bytes = &bytes;
            s.spawn(move || {
                for (a, len) in ranges(n as u64, 4096 + t) {
                    let mut buf = vec![0u8; len as usize];
                    v.read_exact_at(&mut buf, a).unwrap();
                    assert_eq!(buf, bytes[a as usize..(a + len) as usize]);
                }
            });
        }
    });
}

#[test]
fn dense_prefix_group_reads_never_spread_a_bad_block() {
    let n = 64 * 4096 + 100;
    let (bytes, f, digest) = sealed_data(n, 11);
    let mut whole = std::fs::read(f.path()).unwrap();
    // Block 20 is bad; blocks 16..32 form one group of the dense prefix.
    whole[20 * 4096 + 7] ^= 0x80;
    let path = f.path().with_extension("dense");
    std::fs::write(&path, &whole).unwrap();
    let v = VerifiedSource::open(FileSource::open(&path).unwrap(), Some(&digest)).unwrap();
    v.set_dense_prefix(48 * 4096);
    for block in [17u64, 19, 21, 31, 40, 60] {
        let mut buf = [0u8; 64];
        v.read_exact_at(&mut buf, block * 4096 + 100).unwrap();
        assert_eq!(
            buf[..],
            bytes[(block * 4096 + 100) as usize..][..64],
            "block {block}"
        );
    }
    for _ in 0..2 {
        let mut buf = [0u8; 64];
        let err = v.read_exact_at(&mut buf, 20 * 4096).unwrap_err();
        assert_eq!(IntegrityError::find(&err).unwrap().offset, 20 * 4096);
    }
}

/// A file in memory that flips a byte of block `bad` until told to forget it, and
/// records what it is told passed.
struct Flaky {
    file: Vec<u8>,
    bad: std::sync::Mutex<Option<u64>>,
    refetches: bool,
    verified: std::sync::Mutex<Vec<(u64, Vec<u8>)>>,
}

impl ByteSource for Flaky {
    fn len(&self) -> u64 {
        self.file.len() as u64
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        buf.copy_from_slice(&self.file[offset as usize..][..buf.len()]);
        if let Some(b) = *self.bad.lock().unwrap() {
            let at = b * 4096 + 9;
            if (offset..offset + buf.len() as u64).contains(&at) {
                buf[(at - offset) as usize] ^= 1;
            }
        }
        Ok(())
    }

    fn forget(&self, offset: u64, len: u64) {
        let mut bad = self.bad.lock().unwrap();
        if bad.is_some_and(|b| (offset..offset + len).contains(&(b * 4096))) {
            *bad = None;
        }
    }

    fn refetches(&self) -> bool {
        self.refetches
    }

    fn verified(&self, offset: u64, bytes: &[u8]) {
        self.verified.lock().unwrap().push((offset, bytes.to_vec()));
    }
}

#[test]
fn a_source_is_told_exactly_the_bytes_that_passed_and_a_refetching_one_gets_a_second_try() {
    let (bytes, f, digest) = sealed_data(300 * 4096 + 123, 5);
    let file = std::fs::read(f.path()).unwrap();
    for refetches in [true, false] {
        let flaky = Flaky {
            file: file.clone(),
            bad: std::sync::Mutex::new(Some(20)),
            refetches,
            verified: Default::default(),
        };
        let v = VerifiedSource::open(&flaky, Some(&digest)).unwrap();
        let mut got = vec![0u8; bytes.len()];
        let r = v.read_exact_at(&mut got, 0);
        if !refetches {
            assert_eq!(
                IntegrityError::find(&r.unwrap_err()).unwrap().offset,
                20 * 4096
            );
            continue;
        }
        r.unwrap();
        assert!(got == bytes, "read back differs");
        // Every byte of the file was reported once it passed, and only as the file has it.
        let mut covered = vec![false; file.len()];
        for (offset, b) in flaky.verified.lock().unwrap().iter() {
            let at = *offset as usize;
            assert!(
                b[..] == file[at..at + b.len()],
                "reported bytes at {at} differ"
            );
            covered[at..at + b.len()].iter_mut().for_each(|c| *c = true);
        }
        assert_eq!(covered.iter().position(|c| !c), None, "not all reported");
    }
}

/// A file in memory that records the ranges read from it, and which of them were asked
/// for as verity section bytes.
struct Counting {
    file: Vec<u8>,
    reads: std::sync::Mutex<Vec<(u64, usize)>>,
    tree_reads: std::sync::Mutex<Vec<(u64, usize)>>,
}

impl Counting {
    fn new(file: Vec<u8>) -> Counting {
        Counting {
            file,
            reads: Default::default(),
            tree_reads: Default::default(),
        }
    }
}

impl ByteSource for Counting {
    fn len(&self) -> u64 {
        self.file.len() as u64
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.reads.lock().unwrap().push((offset, buf.len()));
        buf.copy_from_slice(&self.file[offset as usize..][..buf.len()]);
        Ok(())
    }

    fn read_tree_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.tree_reads.lock().unwrap().push((offset, buf.len()));
        buf.copy_from_slice(&self.file[offset as usize..][..buf.len()]);
        Ok(())
    }
}

#[test]
fn verity_section_bytes_are_read_apart_from_data_bytes() {
    // Big reads (tree readahead), small ones, and a tree loaded whole: every read of the
    // section is asked for as one, so a file keeps its data stream's readahead.
    let (bytes, f, digest) = sealed_data((1 << 12) * 4096 + 100, 9);
    let src = Counting::new(std::fs::read(f.path()).unwrap());
    let v = VerifiedSource::open(&src, Some(&digest)).unwrap();
    let data_size = v.section().data_size;
    let mut big = vec![0u8; 1 << 20];
    let mut small = [0u8; 10];
    for at in [0u64, 1 << 20, 5 << 20] {
        v.read_exact_at(&mut big, at).unwrap();
        assert_eq!(big[..], bytes[at as usize..][..1 << 20]);
    }
    v.read_exact_at(&mut small, data_size - 10).unwrap();
    assert_eq!(small[..], bytes[bytes.len() - 10..]);
    v.load_tree(u64::MAX).unwrap();
    let reads = src.reads.lock().unwrap().clone();
    let tree_reads = src.tree_reads.lock().unwrap().clone();
    assert!(
        reads.iter().all(|&(o, n)| o + n as u64 <= data_size),
        "section bytes read as data: {reads:?}"
    );
    assert!(
        tree_reads.iter().all(|&(o, _)| o >= data_size),
        "data read as section bytes: {tree_reads:?}"
    );
    // The trailer and padding at open, the tree blocks the reads needed, the load.
    assert!(tree_reads.len() >= 4, "{tree_reads:?}");
}

#[test]
fn a_loaded_tree_leaves_reads_of_data_blocks_alone_and_a_bad_one_is_refused() {
    // Three levels: 2^15 data blocks, 256 level-0 blocks, 2 level-1 blocks, 1 top.
    let (bytes, f, digest) = sealed_data((1 << 15) * 4096, 8);
    let file = std::fs::read(f.path()).unwrap();
    let src = Counting::new(file.clone());
    let v = VerifiedSource::open(&src, Some(&digest)).unwrap();
    let section = *v.section();
    v.load_tree(u64::MAX).unwrap();
    src.reads.lock().unwrap().clear();
    src.tree_reads.lock().unwrap().clear();
    let mut buf = [0u8; 100];
    for block in [0u64, 5000, (1 << 15) - 1] {
        v.read_exact_at(&mut buf, block * 4096 + 7).unwrap();
        assert_eq!(buf[..], bytes[(block * 4096 + 7) as usize..][..100]);
    }
    let reads = src.reads.lock().unwrap().clone();
    let tree_reads = src.tree_reads.lock().unwrap().clone();
    assert!(
        reads.iter().all(|&(o, _)| o < section.data_size) && tree_reads.is_empty(),
        "tree read again after loading it: {reads:?} {tree_reads:?}"
    );
    // A tree block that fails its parent's hash fails the load.
    let mut bad = file.clone();
    bad[(section.tree_offset + section.tree_size - 4096 + 3) as usize] ^= 1;
    let src = Counting::new(bad);
    let v = VerifiedSource::open(&src, Some(&digest)).unwrap();
    let e = v.load_tree(u64::MAX).unwrap_err();
    assert!(IntegrityError::find(&e).is_some(), "{e}");
    // Too big a tree is left to be read as needed.
    let v = VerifiedSource::open(&src, Some(&digest)).unwrap();
    v.load_tree(4096).unwrap();
}

/// `bytes` with the bytes at `stale` offsets flipped until the verified source forgets
/// them: a remote image's chunks, fetched through a bad network and kept in memory.
struct Stale {
    bytes: Vec<u8>,
    stale: std::sync::Mutex<Vec<u64>>,
}

impl ByteSource for Stale {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        buf.copy_from_slice(&self.bytes[offset as usize..][..buf.len()]);
        for &o in self.stale.lock().unwrap().iter() {
            if (offset..offset + buf.len() as u64).contains(&o) {
                buf[(o - offset) as usize] ^= 1;
            }
        }
        Ok(())
    }

    fn forget(&self, offset: u64, len: u64) {
        self.stale
            .lock()
            .unwrap()
            .retain(|o| !(offset..offset + len).contains(o));
    }
}

#[test]
fn a_failed_read_forgets_every_block_it_fetched_so_the_next_read_fetches_them_again() {
    let n = 2 << 20;
    let (bytes, f, digest) = sealed_data(n, 13);
    let whole = std::fs::read(f.path()).unwrap();
    let tree = VerifiedSource::open(FileSource::open(f.path()).unwrap(), None)
        .unwrap()
        .section()
        .tree_offset;
    // 512 data blocks: level 1 is one block, then level 0's four (top level first).
    let level0 = tree + 4096;
    for bad in [
        vec![5 * 4096 + 1, 100 * 4096 + 1, 200 * 4096 + 1],
        vec![level0 + 1, level0 + 4096 + 1],
    ] {
        let source = Stale {
            bytes: whole.clone(),
            stale: std::sync::Mutex::new(bad.clone()),
        };
        let mut v = VerifiedSource::open(source, Some(&digest)).unwrap();
        v.set_parallel_hashing(false);
        let mut buf = vec![0u8; 1 << 20];
        let err = v.read_exact_at(&mut buf, 0).unwrap_err();
        assert!(IntegrityError::find(&err).is_some(), "{err}");
        v.read_exact_at(&mut buf, 0)
            .unwrap_or_else(|e| panic!("bad bytes at {bad:?} outlived the failed read: {e}"));
        assert!(buf == bytes[..1 << 20]);
    }
}

#[test]
fn a_refetching_source_gets_a_second_try_at_the_descriptor_too() {
    let (bytes, f, digest) = sealed_data(300 * 4096 + 123, 6);
    let file = std::fs::read(f.path()).unwrap();
    // The descriptor starts a block: a byte flipped in it fails the pin.
    let descriptor_block = (file.len() as u64 - 320) / 4096;
    for refetches in [true, false] {
        let flaky = Flaky {
            file: file.clone(),
            bad: std::sync::Mutex::new(Some(descriptor_block)),
            refetches,
            verified: Default::default(),
        };
        match VerifiedSource::open(&flaky, Some(&digest)) {
            Ok(v) if refetches => {
                let mut got = vec![0u8; bytes.len()];
                v.read_exact_at(&mut got, 0).unwrap();
                assert!(got == bytes, "read back differs");
            }
            Err(verity::OpenError::PinMismatch { .. }) if !refetches => {}
            r => panic!("refetches {refetches}: {:?}", r.map(|_| ())),
        }
    }
}

/// Bytes a caller fetched itself (a prefetch's step) are checked against the tree and
/// handed to the source as verified; a bad block is refused, and only the blocks before it
/// handed on.
#[test]
fn bytes_fetched_by_the_caller_are_checked_and_reported_verified() {
    let (bytes, f, digest) = sealed_data(300 * 4096 + 123, 6);
    let file = std::fs::read(f.path()).unwrap();
    // A source whose block 3 would be wrong if read: what passes came from the caller.
    let src = Flaky {
        file: file.clone(),
        bad: std::sync::Mutex::new(Some(3)),
        refetches: false,
        verified: Default::default(),
    };
    let v = VerifiedSource::open(&src, Some(&digest)).unwrap();
    src.verified.lock().unwrap().clear();
    // Steps of 64 blocks, the last reaching the data's short end.
    for at in (0..bytes.len()).step_by(64 * 4096) {
        let step = &bytes[at..(at + 64 * 4096).min(bytes.len())];
        v.check_fetched(at as u64, step).unwrap();
    }
    let mut covered = vec![false; bytes.len()];
    // Tree blocks are reported too, as the reads check them.
    for (offset, b) in src.verified.lock().unwrap().iter() {
        let at = *offset as usize;
        if at >= bytes.len() {
            continue;
        }
        let data = &b[..b.len().min(bytes.len() - at)];
        assert!(data == &bytes[at..at + data.len()], "bytes at {at} differ");
        covered[at..at + data.len()]
            .iter_mut()
            .for_each(|c| *c = true);
    }
    assert_eq!(covered.iter().position(|c| !c), None, "not all reported");

    src.verified.lock().unwrap().clear();
    let mut wrong = bytes[64 * 4096..128 * 4096].to_vec();
    wrong[5 * 4096 + 9] ^= 1;
    let e = v.check_fetched(64 * 4096, &wrong).unwrap_err();
    assert_eq!(IntegrityError::find(&e).unwrap().offset, 69 * 4096);
    // The five blocks before the bad one are reported, nothing from it on.
    let data_reported: Vec<(u64, usize)> = src
        .verified
        .lock()
        .unwrap()
        .iter()
        .filter(|(at, _)| *at < bytes.len() as u64)
        .map(|(at, b)| (*at, b.len()))
        .collect();
    assert_eq!(data_reported, [(64 * 4096, 5 * 4096)]);
    for (at, n) in [
        (100u64, 4096usize),
        (4096, 100),
        (0, 0),
        (299 * 4096, 2 * 4096),
    ] {
        let e = v
            .check_fetched(at, &bytes[..n.min(bytes.len())])
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{at}+{n}: {e}");
    }
}

#[test]
fn a_file_reads_section_bytes_through_an_open_file_description_of_its_own() {
    use std::io::{Seek as _, SeekFrom};
    use std::os::fd::AsRawFd as _;
    let (_, f, digest) = sealed_data(64 * 4096, 10);
    let path = f.path().canonicalize().unwrap();
    let fds_on_file = || -> Vec<i32> {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| {
                let e = e.ok()?;
                (std::fs::read_link(e.path()).ok()? == path)
                    .then(|| e.file_name().to_str()?.parse().ok())
                    .flatten()
            })
            .collect()
    };
    let v = VerifiedSource::open(FileSource::open(&path).unwrap(), Some(&digest)).unwrap();
    let mut buf = vec![0u8; 8 * 4096];
    for at in [0u64, 16 * 4096, 40 * 4096] {
        v.read_exact_at(&mut buf, at).unwrap();
    }
    let main = v.inner().file().as_raw_fd();
    let ours = f.as_file().as_raw_fd();
    let fds: Vec<i32> = fds_on_file().into_iter().filter(|&fd| fd != ours).collect();
    assert_eq!(fds.len(), 2, "the file and its twin, opened once: {fds:?}");
    let twin = *fds.iter().find(|&&fd| fd != main).unwrap();
    // Not a dup: moving the file's offset leaves the twin's alone.
    let mut file = v.inner().file();
    file.seek(SeekFrom::Start(12345)).unwrap();
    let pos = |fd: i32| -> String {
        std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}"))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("pos:").map(|p| p.trim().to_string()))
            .unwrap()
    };
    assert_eq!(pos(main), "12345");
    assert_eq!(pos(twin), "0");
}

/// The kernel reads further ahead of a file source's sequential reader than of a plain
/// descriptor's (the source advises sequential reads: twice the device's window, whatever
/// it is), as `fincore` counts the file's cached bytes beyond what was read.
#[test]
fn a_file_source_is_read_ahead_further_than_a_plain_descriptor() {
    // On disk (the build's, beside the test binary): tmpfs has no readahead to see.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("stream");
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(&data(32 << 20, 11)).unwrap();
    f.sync_all().unwrap();
    let ahead_most = |read: &dyn Fn(&mut [u8], u64)| -> u64 {
        let drop = std::fs::File::open(&path).unwrap();
        rustix::fs::fadvise(&drop, 0, 0, rustix::fs::Advice::DontNeed).unwrap();
        // Reads no larger than a device's window (128 KiB is the kernel's default): the
        // window, not the read's size, then sets how far the kernel reads ahead.
        let mut buf = vec![0u8; 64 << 10];
        let mut most = 0;
        for i in 0..256u64 {
            read(&mut buf, i << 16);
            let out = std::process::Command::new("fincore")
                .args(["-b", "-n", "-o", "RES"])
                .arg(&path)
                .output()
                .expect("fincore (util-linux)");
            let cached: u64 = String::from_utf8(out.stdout)
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            most = most.max(cached.saturating_sub((i + 1) << 16));
        }
        most
    };
    let plain = std::fs::File::open(&path).unwrap();
    let plain_ahead =
        ahead_most(&|buf, at| std::os::unix::fs::FileExt::read_exact_at(&plain, buf, at).unwrap());
    let source = FileSource::open(&path).unwrap();
    let source_ahead = ahead_most(&|buf, at| source.read_exact_at(buf, at).unwrap());
    assert!(plain_ahead > 0, "no readahead seen at all");
    assert!(
        source_ahead > plain_ahead,
        "read ahead {source_ahead} bytes, a plain descriptor {plain_ahead}"
    );
}

#[test]
fn at_most_max_twins_sources_hold_a_second_description_and_a_dropped_one_frees_its() {
    use std::os::fd::AsRawFd as _;
    let (_, f, digest) = sealed_data(16 * 4096, 12);
    let path = f.path().canonicalize().unwrap();
    let fds_on_file = || {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| std::fs::read_link(e.path()).is_ok_and(|l| l == path))
            })
            .count()
            - 1 // the tempfile's own
    };
    let n = verity::source::MAX_TWINS + 5;
    let sources: Vec<_> = (0..n)
        .map(|_| VerifiedSource::open(FileSource::open(&path).unwrap(), Some(&digest)).unwrap())
        .collect();
    let mut buf = vec![0u8; 4096];
    for v in &sources {
        v.read_exact_at(&mut buf, 0).unwrap();
    }
    // Other tests of this process may hold some of the twins meanwhile, never more.
    let twins = fds_on_file() - n;
    assert!(
        (1..=verity::source::MAX_TWINS).contains(&twins),
        "{twins} second descriptions for {n} sources"
    );
    drop(sources);
    assert_eq!(fds_on_file(), 0);
    let v = VerifiedSource::open(FileSource::open(&path).unwrap(), Some(&digest)).unwrap();
    v.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(
        fds_on_file(),
        2,
        "a freed second description is not taken again"
    );
    let _ = v.inner().file().as_raw_fd();
}
