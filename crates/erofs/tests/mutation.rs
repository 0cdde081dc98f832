//! Bounded, deterministic mutation testing of the reader (runs on stable, in CI).
//!
//! Valid images are truncated, bit-flipped, have fields overwritten with edge values, and get
//! crafted structural attacks (looping directories, absurd sizes, maxed xattr counts). Every
//! mutant is opened and walked with `exercise` and `fsck` in a worker thread under a hard
//! per-mutant deadline: a panic (including a debug-build overflow) or a hang fails the test
//! with the mutant's number and description.

mod common;

use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use common::{fix_checksum, fix_mtimes, have_mkfs, make_tree, mkfs, Rng, TempDir};
use erofs::format;
use erofs::read::{check_kernel_metadata, exercise, fsck, ByteSource, Image, LazyCheck};

const DEADLINE: Duration = Duration::from_secs(5);
const EXERCISE_BUDGET: u64 = 20_000;
/// The walk through the lazy check goes everywhere in these small images.
const LAZY_BUDGET: u64 = 1_000_000;
/// Per base image. Tuned so the whole test stays well under 60 s in a debug build on 2 cores.
const BIT_FLIPS: usize = 900;
const FIELD_WRITES: usize = 450;
const CRAFTED_PER_KIND: usize = 20;

/// The valid images everything starts from: verilay's builder (xattr name filters, long
/// prefixes, 4 KiB and 512 B blocks) and erofs-utils' mkfs.erofs (inline tails, 8-byte chunk
/// indexes). The single place to change image sources.
fn base_images() -> Vec<Vec<u8>> {
    use erofs::builder::{build_dir, BuildOptions, Silent};
    let tmp = TempDir::new("mutation");
    let tree = tmp.path().join("tree");
    std::fs::create_dir(&tree).unwrap();
    make_tree(&tree, false);
    fix_mtimes(&tree);
    let mut out = Vec::new();
    for bs in [4096, 512] {
        let opts = BuildOptions {
            block_size: bs,
            ..Default::default()
        };
        let path = tmp.path().join(format!("b{bs}.img"));
        build_dir(&tree, &|_| false, &opts, &path, &Silent).expect("build base image");
        out.push(std::fs::read(&path).unwrap());
    }
    if have_mkfs() {
        let uuid = "-U11111111-2222-3333-4444-555555555555";
        out.push(mkfs(&tree, &[uuid]));
        out.push(mkfs(
            &tree,
            &[uuid, "--chunksize=8192", "-Eforce-chunk-indexes"],
        ));
    }
    out
}

#[derive(Clone)]
enum Mutation {
    Truncate(usize),
    /// Flip bit `bit` of byte `off`; `fix` recomputes the superblock checksum afterwards so
    /// the mutant gets past `open` and reaches the deeper code.
    Flip {
        off: usize,
        bit: u8,
        fix: bool,
    },
    Write {
        off: usize,
        bytes: Vec<u8>,
        what: &'static str,
    },
}

impl std::fmt::Display for Mutation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mutation::Truncate(n) => write!(f, "truncate to {n} bytes"),
            Mutation::Flip { off, bit, fix } => {
                write!(
                    f,
                    "flip bit {bit} of byte {off}{}",
                    if *fix { " (checksum fixed)" } else { "" }
                )
            }
            Mutation::Write { off, bytes, what } => {
                write!(f, "write {what} {bytes:02x?} at byte {off}")
            }
        }
    }
}

struct Mutant {
    base: usize,
    m: Mutation,
}

/// Structures of a valid image, found with the reader itself, to aim mutations at.
#[derive(Default)]
struct Map {
    /// Metadata byte ranges: superblock, inodes + xattr bodies + tails, chunk indexes, dirs.
    regions: Vec<(usize, usize)>,
    /// (offset, extended) of every inode.
    inodes: Vec<(usize, bool)>,
    /// (dirent byte offset, own dir nid, parent nid).
    dirents: Vec<(usize, u64, u64)>,
    /// Inodes with an xattr body: offset of the body header.
    xattr_bodies: Vec<usize>,
    chunked: Vec<usize>,
    root: u64,
}

fn survey(bytes: &[u8]) -> Map {
    let img = Image::open(bytes).expect("base image must open");
    let mut map = Map {
        root: img.root_nid(),
        ..Default::default()
    };
    map.regions.push((1024, 128));
    let mut seen = HashSet::new();
    let mut stack = vec![(img.root_nid(), img.root_nid())];
    while let Some((nid, parent)) = stack.pop() {
        if !seen.insert(nid) {
            continue;
        }
        let ino = img.inode(nid).unwrap();
        let info = img.layout_info(&ino);
        let off = info.inode_offset as usize;
        map.regions
            .push((off, (info.inode_size + info.xattr_size) as usize));
        map.inodes.push((off, ino.extended));
        if info.xattr_size > 0 {
            map.xattr_bodies.push(info.xattr_offset as usize);
        }
        if let Some((t, len)) = info.tail {
            map.regions.push((t as usize, len as usize));
        }
        if let Some((idx, unit)) = info.chunk_index {
            map.regions
                .push((idx as usize, (info.chunk_count * unit) as usize));
            map.chunked.push(off);
        }
        if ino.is_symlink() {
            if let Some(p) = img.map(&ino, 0).unwrap().physical {
                map.regions.push((p as usize, ino.size as usize));
            }
        }
        if ino.is_dir() {
            let bs = u64::from(img.block_size());
            let mut pos = 0;
            while pos < ino.size {
                let e = img.map(&ino, pos).unwrap();
                let p = e.physical.unwrap() + (pos - e.logical);
                map.regions
                    .push((p as usize, (ino.size - pos).min(bs) as usize));
                pos += bs;
            }
            for ent in img.readdir(&ino, 0).unwrap() {
                let ent = ent.unwrap();
                let e = img.map(&ino, ent.offset).unwrap();
                let at = e.physical.unwrap() + (ent.offset - e.logical);
                map.dirents.push((at as usize, nid, parent));
                if ent.name != b"." && ent.name != b".." {
                    stack.push((ent.nid, nid));
                }
            }
        }
    }
    let xa = img.superblock().xattr_blkaddr as usize * img.block_size() as usize;
    if img.superblock().xattr_blkaddr != 0 {
        map.regions.push((xa, img.block_size() as usize));
    }
    map.regions.retain(|&(o, l)| l > 0 && o + l <= bytes.len());
    map
}

fn le(v: u64, width: usize) -> Vec<u8> {
    v.to_le_bytes()[..width].to_vec()
}

fn mutations(bytes: &[u8], map: &Map, rng: &mut Rng) -> Vec<Mutation> {
    let len = bytes.len();
    let mut out = Vec::new();

    // Truncations: every block boundary, every 256 bytes of the first 8 KiB, every 8 bytes
    // around the superblock and root inode, and the last few bytes.
    let mut cuts: Vec<usize> = (0..len).step_by(4096).collect();
    cuts.extend((0..8192.min(len)).step_by(256));
    cuts.extend((1016..1400.min(len)).step_by(8));
    cuts.extend((1..8).map(|d| len.saturating_sub(d)));
    cuts.sort_unstable();
    cuts.dedup();
    out.extend(cuts.into_iter().map(Mutation::Truncate));

    // Positions biased toward metadata: 80% inside a surveyed region, 20% anywhere.
    let pick = |rng: &mut Rng, align: usize| -> usize {
        let off = if rng.below(5) > 0 {
            let (o, l) = map.regions[rng.below(map.regions.len() as u64) as usize];
            o + rng.below(l as u64) as usize
        } else {
            rng.below(len as u64) as usize
        };
        (off / align * align).min(len - align)
    };
    for _ in 0..BIT_FLIPS {
        let off = pick(rng, 1);
        out.push(Mutation::Flip {
            off,
            bit: rng.below(8) as u8,
            fix: rng.below(10) != 0,
        });
    }
    for _ in 0..FIELD_WRITES {
        let width = [2usize, 4, 8][rng.below(3) as usize];
        let off = pick(rng, width);
        let max = if width == 8 {
            u64::MAX
        } else {
            (1u64 << (8 * width)) - 1
        };
        let (v, what) = match rng.below(8) {
            0 => (0, "zero"),
            1 => (max, "all-ones"),
            2 => (max >> 1, "max-signed"),
            3 => (max / 2 + 1, "top-bit"),
            4 => (1, "one"),
            5 => (rng.below(64), "small"),
            6 => (if width == 8 { 1 << 40 } else { max - 1 }, "large"),
            _ => (rng.next() & max, "random"),
        };
        out.push(write(off, le(v, width), what));
    }

    // Crafted structural attacks.
    let sample = |rng: &mut Rng, n: usize| -> Vec<usize> {
        (0..CRAFTED_PER_KIND.min(n))
            .map(|_| rng.below(n as u64) as usize)
            .collect()
    };
    for i in sample(rng, map.dirents.len()) {
        let (at, own, parent) = map.dirents[i];
        for (target, what) in [
            (map.root, "dirent → root"),
            (parent, "dirent → parent"),
            (own, "dirent → itself"),
        ] {
            out.push(write(at, le(target, 8), what));
            let mut ent = le(target, 8);
            ent.extend_from_slice(&bytes[at + 8..at + 10]);
            ent.push(format::FT_DIR);
            out.push(write(at, ent, "dirent → dir loop typed DIR"));
        }
        out.push(write(at + 8, le(rng.below(4096), 2), "nameoff"));
        out.push(write(at, le(1 << 63, 8), "metabox nid"));
    }
    for i in sample(rng, map.inodes.len()) {
        let (off, extended) = map.inodes[i];
        if extended {
            for v in [u64::MAX >> 1, 1 << 40, 1 << 62, u64::MAX] {
                out.push(write(off + 8, le(v, 8), "i_size (extended)"));
            }
            out.push(write(off + 0x2C, le(u32::MAX.into(), 4), "nlink max"));
        } else {
            out.push(write(off + 8, le(u32::MAX.into(), 4), "i_size (compact)"));
            out.push(write(off + 0x0C, le(u32::MAX.into(), 4), "compact mtime"));
        }
        out.push(write(off + 2, le(0xFFFF, 2), "xattr icount max"));
        out.push(write(off + 2, le(1, 2), "xattr icount 1"));
        out.push(write(off + 0x10, le(u32::MAX.into(), 4), "i_u max"));
        out.push(write(
            off,
            le(format::LAYOUT_CHUNK_BASED as u64 * 2 + extended as u64, 2),
            "layout → chunks",
        ));
        out.push(write(
            off,
            le(format::LAYOUT_FLAT_INLINE as u64 * 2 + extended as u64, 2),
            "layout → inline",
        ));
    }
    for i in sample(rng, map.xattr_bodies.len()) {
        let body = map.xattr_bodies[i];
        out.push(write(body + 4, vec![255], "h_shared_count 255"));
        out.push(write(body, le(u32::MAX.into(), 4), "filter all-ones"));
        out.push(write(
            body + 12,
            le(u32::MAX.into(), 4),
            "first shared id / entry max",
        ));
    }
    for &off in map.chunked.iter().take(CRAFTED_PER_KIND) {
        for fmt in [0x1Fu64, 0x3F, 0x20, 0x40, 0xFFFF] {
            out.push(write(off + 0x10, le(fmt, 2), "chunk format"));
        }
    }
    out
}

fn write(off: usize, bytes: Vec<u8>, what: &'static str) -> Mutation {
    Mutation::Write { off, bytes, what }
}

fn apply(base: &[u8], m: &Mutation) -> Vec<u8> {
    match m {
        Mutation::Truncate(n) => base[..*n].to_vec(),
        Mutation::Flip { off, bit, fix } => {
            let mut v = base.to_vec();
            v[*off] ^= 1 << bit;
            if *fix {
                fix_checksum(&mut v);
            }
            v
        }
        Mutation::Write { off, bytes, .. } => {
            let mut v = base.to_vec();
            let end = (*off + bytes.len()).min(v.len());
            v[*off..end].copy_from_slice(&bytes[..end - off]);
            fix_checksum(&mut v);
            v
        }
    }
}

/// Opens and walks one mutant; returns whether it opened.
fn run_one(bytes: Vec<u8>) -> bool {
    let bytes: Arc<[u8]> = bytes.into();
    let Ok(img) = Image::open(bytes.clone()) else {
        return false;
    };
    exercise(&img, EXERCISE_BUDGET);
    let report = fsck(&img, 20);
    for p in &report.problems {
        assert!(!p.contains('\n'), "multi-line problem: {p}");
    }
    lazy_check_agrees(&img, &bytes);
    true
}

/// An image's bytes as the kernel engine serves them: each read first passes the lazy
/// check, and a refusal is an I/O error.
struct Gated {
    bytes: Arc<[u8]>,
    lazy: LazyCheck<Arc<[u8]>>,
    refused: AtomicBool,
}

impl ByteSource for Gated {
    fn len(&self) -> u64 {
        self.bytes.len()
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        if let Err(why) = self.lazy.serve(offset, buf.len() as u64) {
            self.refused.store(true, Ordering::Relaxed);
            return Err(std::io::Error::other(why));
        }
        self.bytes.read_exact_at(buf, offset)
    }
}

/// The lazy check finds a problem in an image walked through it (as the kernel would walk
/// it, reading each structure's bytes first) exactly when the whole check of what the
/// kernel parses does, but for what only a whole check can see (a file's link count
/// against the entries naming it, the superblock's inode count).
fn lazy_check_agrees(img: &Image<Arc<[u8]>>, bytes: &Arc<[u8]>) {
    let whole: Vec<String> = check_kernel_metadata(img, 20)
        .problems
        .into_iter()
        .filter(|p| {
            !(p.contains(" entries point at nid")
                || p.contains("superblock inos")
                || p.starts_with("stopping after"))
        })
        .collect();
    let found = match Image::open(bytes.clone()).map(LazyCheck::new) {
        Err(_) => return,
        Ok(Err(why)) => Some(why),
        Ok(Ok(lazy)) => {
            let gated = Gated {
                bytes: bytes.clone(),
                lazy,
                refused: AtomicBool::new(false),
            };
            let walked = Image::open(&gated).map(|g| exercise(&g, LAZY_BUDGET));
            (walked.is_err() || gated.refused.load(Ordering::Relaxed))
                .then(|| "a read refused".to_string())
        }
    };
    assert_eq!(
        found.is_some(),
        !whole.is_empty(),
        "the lazy check found {found:?}, the whole check {whole:?}"
    );
}

enum Msg {
    Start(usize, usize),
    Done(usize, usize, Result<bool, String>),
    Exit,
}

#[test]
fn mutants_never_panic_or_hang() {
    let started = Instant::now();
    let bases = base_images();
    let mut mutants = Vec::new();
    for (b, bytes) in bases.iter().enumerate() {
        // The unmutated image must be clean, or the test proves nothing.
        let img = Image::open(bytes.as_slice()).unwrap();
        let r = fsck(&img, 10);
        assert!(r.is_clean(), "base image {b}: {:?}", r.problems);
        let map = survey(bytes);
        let mut rng = Rng(0x5EED + b as u64);
        mutants.extend(
            mutations(bytes, &map, &mut rng)
                .into_iter()
                .map(|m| Mutant { base: b, m }),
        );
    }
    let bases = Arc::new(bases);
    let mutants = Arc::new(mutants);
    let next = Arc::new(AtomicUsize::new(0));
    let workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 4);
    let (tx, rx) = mpsc::channel();
    for w in 0..workers {
        let (bases, mutants, next, tx) = (bases.clone(), mutants.clone(), next.clone(), tx.clone());
        std::thread::spawn(move || {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(mt) = mutants.get(i) else { break };
                let _ = tx.send(Msg::Start(w, i));
                let bytes = apply(&bases[mt.base], &mt.m);
                let r = catch_unwind(AssertUnwindSafe(|| run_one(bytes))).map_err(|e| {
                    e.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default()
                });
                let _ = tx.send(Msg::Done(w, i, r));
            }
            let _ = tx.send(Msg::Exit);
        });
    }
    drop(tx);
    // On failure, keep the base image and the mutant for a regression test.
    let describe = |i: usize| {
        let mt = &mutants[i];
        let dir = std::env::temp_dir();
        let base_path = dir.join(format!("verilay-mutation-base{}.img", mt.base));
        let mutant_path = dir.join(format!("verilay-mutant-{i}.img"));
        let _ = std::fs::write(&base_path, &bases[mt.base]);
        let _ = std::fs::write(&mutant_path, apply(&bases[mt.base], &mt.m));
        format!(
            "mutant #{i} (base {}: {}; saved as {})",
            mt.base,
            mt.m,
            mutant_path.display()
        )
    };
    let mut running: Vec<Option<(usize, Instant)>> = vec![None; workers];
    let (mut exited, mut ran, mut opened) = (0, 0usize, 0usize);
    while exited < workers {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(Msg::Start(w, i)) => running[w] = Some((i, Instant::now())),
            Ok(Msg::Done(w, i, r)) => {
                running[w] = None;
                ran += 1;
                match r {
                    Ok(o) => opened += o as usize,
                    Err(msg) => panic!("panic on {}: {msg}", describe(i)),
                }
            }
            Ok(Msg::Exit) => exited += 1,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        for (i, t) in running.iter().flatten() {
            if t.elapsed() > DEADLINE {
                panic!("hang on {}: still running after {DEADLINE:?}", describe(*i));
            }
        }
    }
    assert_eq!(ran, mutants.len(), "not every mutant ran");
    println!(
        "{ran} mutants of {} base images ran ({opened} opened) on {workers} threads in {:.1?}",
        bases.len(),
        started.elapsed()
    );
}
