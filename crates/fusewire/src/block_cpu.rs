//! Which CPU completes the block layer's I/O: where a single-queue disk's interrupts go.
//!
//! - A queue thread that serves a stream of cold reads hashes on the reader's CPU (the
//!   kernel queues a request there). When that CPU also takes the disk's interrupts, the
//!   thread, the reader and the completions of the very reads they wait for share one CPU
//!   while the others idle.
//! - `/proc/softirqs` counts BLOCK softirqs per CPU. The block layer raises one for each
//!   completion of a single-queue device (a virtio disk with one queue, SATA) on the CPU
//!   its interrupt hits, and for a completion it hands back to the CPU that asked (a CPU
//!   sharing no cache with the interrupt's, or `rq_affinity` 2). A multi-queue device
//!   (NVMe) completes on the asking CPU's own queue without one: no CPU stands out then.
//! - Threads that serve streams sample the counts after replying, at most every
//!   [`SAMPLE_NS`]. A window of at least [`MIN_COMPLETIONS`] gives a verdict, the CPU with
//!   more than half of them, which holds for [`VALID_NS`]: a warm stream, which does no
//!   I/O, lets it lapse.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, TryLockError};

/// How often the counts are read at most, in ns.
pub(crate) const SAMPLE_NS: u64 = 10_000_000;

/// How long a verdict holds without a new one, and how old a base may be to count from
/// (older counts say nothing of the current stream), in ns.
pub(crate) const VALID_NS: u64 = 1_000_000_000;

/// Fewer completions than this in a window are not judged (a few stray writes of
/// another process).
const MIN_COMPLETIONS: u64 = 16;

/// No verdict: no CPU took most completions, or too few were seen lately.
const NONE: usize = usize::MAX;

/// The process's sampler of `/proc/softirqs`, which every queue asks.
pub(crate) fn sampler() -> &'static Sampler {
    static SAMPLER: OnceLock<Sampler> = OnceLock::new();
    SAMPLER.get_or_init(|| Sampler::new("/proc/softirqs".into()))
}

/// Reads the counts now and then and keeps a verdict between reads. Times are ns on the
/// caller's clock (`affinity::now_ns`), so tests can give their own.
pub(crate) struct Sampler {
    /// Before this time the counts are not read again; the thread that moves it reads.
    next_ns: AtomicU64,
    verdict: AtomicUsize,
    verdict_until_ns: AtomicU64,
    reading: Mutex<Reading>,
}

/// What one sample needs, kept between samples: the file stays open and the buffers are
/// reused, so a sample costs a `pread` or two and no allocation.
struct Reading {
    path: PathBuf,
    file: Option<File>,
    text: Vec<u8>,
    now: Counts,
    /// The counts the next read is compared with, and when they were read.
    base: Option<(u64, Counts)>,
}

/// The BLOCK line: the CPU of each column and its count.
#[derive(Default, Clone)]
struct Counts {
    cpus: Vec<usize>,
    counts: Vec<u64>,
}

impl Sampler {
    pub(crate) fn new(path: PathBuf) -> Sampler {
        Sampler {
            next_ns: AtomicU64::new(0),
            verdict: AtomicUsize::new(NONE),
            verdict_until_ns: AtomicU64::new(0),
            reading: Mutex::new(Reading {
                path,
                file: None,
                text: Vec::new(),
                now: Counts::default(),
                base: None,
            }),
        }
    }

    /// The CPU that took more than half of the block completions lately, if one did.
    pub(crate) fn busiest(&self, now: u64) -> Option<usize> {
        if now >= self.verdict_until_ns.load(Ordering::Relaxed) {
            return None;
        }
        match self.verdict.load(Ordering::Relaxed) {
            NONE => None,
            cpu => Some(cpu),
        }
    }

    /// Reads the counts if none was read for [`SAMPLE_NS`], and judges the window since
    /// the base if it holds enough completions.
    pub(crate) fn sample(&self, now: u64) {
        let next = self.next_ns.load(Ordering::Relaxed);
        if now < next
            || self
                .next_ns
                .compare_exchange(next, now + SAMPLE_NS, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        let mut r = match self.reading.try_lock() {
            Ok(r) => r,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        let r = &mut *r;
        if !r.read() {
            // No /proc/softirqs (a sandbox): no verdict, threads stay where they rest.
            r.base = None;
            return;
        }
        let fresh = r
            .base
            .as_ref()
            .filter(|(at, b)| now.saturating_sub(*at) < VALID_NS && b.cpus == r.now.cpus);
        let Some((_, base)) = fresh else {
            r.base = Some((now, r.now.clone()));
            return;
        };
        let grown = (r.now.cpus.iter().copied()).zip(
            (r.now.counts.iter())
                .zip(&base.counts)
                .map(|(n, b)| n.saturating_sub(*b)),
        );
        if grown.clone().map(|(_, n)| n).sum::<u64>() < MIN_COMPLETIONS {
            // Too few yet: the base stays, so the next read sees more of them.
            return;
        }
        self.verdict
            .store(majority(grown).unwrap_or(NONE), Ordering::Relaxed);
        self.verdict_until_ns
            .store(now + VALID_NS, Ordering::Relaxed);
        if let Some((at, base)) = &mut r.base {
            *at = now;
            base.counts.clone_from(&r.now.counts);
        }
    }
}

impl Reading {
    /// Reads the file into `now`; false if it cannot be read or parsed.
    fn read(&mut self) -> bool {
        if self.file.is_none() {
            self.file = File::open(&self.path).ok();
        }
        let Some(file) = &self.file else { return false };
        self.text.clear();
        let mut chunk = [0u8; 4096];
        loop {
            match file.read_at(&mut chunk, self.text.len() as u64) {
                Ok(0) => break,
                Ok(n) => self.text.extend_from_slice(&chunk[..n]),
                Err(_) => return false,
            }
        }
        std::str::from_utf8(&self.text)
            .ok()
            .is_some_and(|t| parse_block(t, &mut self.now))
    }
}

/// The CPU with more than half of the counts, if one has.
fn majority(counts: impl Iterator<Item = (usize, u64)> + Clone) -> Option<usize> {
    let total: u64 = counts.clone().map(|(_, n)| n).sum();
    let (cpu, most) = counts.max_by_key(|&(_, n)| n)?;
    (most > 0 && most * 2 > total).then_some(cpu)
}

/// Each CPU's BLOCK count from the text of `/proc/softirqs`, into `out`: a header of
/// `CPU<n>` columns, then one line per softirq, `NAME:` and a count per column.
/// By hand: procfs (0.18) reads the per-CPU softirq time of /proc/stat, which sums every
/// kind of softirq, but not /proc/softirqs.
fn parse_block(text: &str, out: &mut Counts) -> bool {
    out.cpus.clear();
    out.counts.clear();
    let mut lines = text.lines();
    let Some(header) = lines.next() else {
        return false;
    };
    for c in header.split_whitespace() {
        match c.strip_prefix("CPU").and_then(|n| n.parse().ok()) {
            Some(cpu) => out.cpus.push(cpu),
            None => return false,
        }
    }
    let Some(block) = lines.find_map(|l| l.trim_start().strip_prefix("BLOCK:")) else {
        return false;
    };
    for n in block.split_whitespace() {
        match n.parse() {
            Ok(n) => out.counts.push(n),
            Err(_) => return false,
        }
    }
    !out.cpus.is_empty() && out.counts.len() == out.cpus.len()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const TWO: &str = "                    CPU0       CPU1       \n          HI:          1          0\n       TIMER:     103420     101005\n      NET_TX:          2          1\n       BLOCK:          0      81481\n    IRQ_POLL:          0          0\n";

    fn parse(text: &str) -> Option<Vec<(usize, u64)>> {
        let mut c = Counts::default();
        parse_block(text, &mut c).then(|| c.cpus.into_iter().zip(c.counts).collect())
    }

    #[test]
    fn the_block_line_is_read_per_cpu_by_the_header_columns() {
        assert_eq!(parse(TWO), Some(vec![(0, 0), (1, 81481)]));
        let gap = "   CPU0   CPU2   CPU3\n BLOCK:  5 6 7\n";
        assert_eq!(parse(gap), Some(vec![(0, 5), (2, 6), (3, 7)]));
        for bad in [
            "",
            "CPU0 CPU1\n",
            "CPU0 CPU1\n BLOCK: 1\n",
            "CPU0 CPU1\n BLOCK: 1 x\n",
            "CPU0 CPUx\n BLOCK: 1 2\n",
            "CPU0\n BLOCK: 99999999999999999999999\n",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_cpu_with_more_than_half_of_the_completions_is_the_busiest() {
        assert_eq!(majority([(0, 3), (1, 60)].into_iter()), Some(1));
        assert_eq!(majority([(0, 60), (1, 3), (2, 3)].into_iter()), Some(0));
        assert_eq!(majority([(0, 30), (1, 30)].into_iter()), None, "a tie");
        assert_eq!(
            majority([(0, 20), (1, 20), (2, 30)].into_iter()),
            None,
            "no majority"
        );
        assert_eq!(majority([(0, 0), (1, 0)].into_iter()), None);
        assert_eq!(majority([].into_iter()), None);
    }

    /// A sampler over a file the test writes: CPU 0's and CPU 1's counts.
    pub(crate) struct Fake {
        pub(crate) sampler: Sampler,
        dir: tempfile::TempDir,
    }

    impl Fake {
        pub(crate) fn new() -> Fake {
            let dir = tempfile::tempdir().unwrap();
            let sampler = Sampler::new(dir.path().join("softirqs"));
            let f = Fake { sampler, dir };
            f.set(0, 0);
            f
        }

        pub(crate) fn set(&self, cpu0: u64, cpu1: u64) {
            std::fs::write(
                self.dir.path().join("softirqs"),
                format!("    CPU0  CPU1\n  TIMER: 9 9\n  BLOCK: {cpu0} {cpu1}\n"),
            )
            .unwrap();
        }
    }

    #[test]
    fn a_verdict_needs_enough_completions_in_a_recent_window_and_lapses() {
        const MS: u64 = 1_000_000;
        let f = Fake::new();
        let s = &f.sampler;
        s.sample(0);
        assert_eq!(s.busiest(0), None, "the first read is a base");
        f.set(0, MIN_COMPLETIONS - 1);
        s.sample(11 * MS);
        assert_eq!(s.busiest(11 * MS), None, "too few completions");
        f.set(0, MIN_COMPLETIONS);
        s.sample(15 * MS);
        assert_eq!(s.busiest(15 * MS), None, "not read again this soon");
        s.sample(22 * MS);
        assert_eq!(s.busiest(22 * MS), Some(1), "enough since the base");
        assert_eq!(
            s.busiest(22 * MS + VALID_NS - 1),
            Some(1),
            "it holds a while"
        );
        assert_eq!(s.busiest(22 * MS + VALID_NS), None, "then lapses");

        f.set(100, MIN_COMPLETIONS + 10);
        s.sample(40 * MS);
        assert_eq!(
            s.busiest(40 * MS),
            Some(0),
            "the window since the last verdict"
        );
        f.set(110, MIN_COMPLETIONS + 20);
        s.sample(60 * MS);
        assert_eq!(s.busiest(60 * MS), None, "no CPU took most");

        // A base older than VALID_NS is read anew, not counted from.
        f.set(1000, MIN_COMPLETIONS + 20);
        s.sample(60 * MS + VALID_NS);
        f.set(1000, MIN_COMPLETIONS + 60);
        s.sample(80 * MS + VALID_NS);
        assert_eq!(s.busiest(80 * MS + VALID_NS), Some(1));

        let none = Sampler::new("/nonexistent/softirqs".into());
        none.sample(0);
        none.sample(20 * MS);
        assert_eq!(none.busiest(20 * MS), None, "no file: no verdict");
    }

    /// The oracle is the kernel: this machine's /proc/softirqs has a column per possible
    /// CPU, and direct reads of a single-queue disk count as BLOCK softirqs.
    #[test]
    fn this_machine_counts_block_completions_per_cpu() {
        use std::io::Write;
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let read = || parse(&std::fs::read_to_string("/proc/softirqs").unwrap()).unwrap();
        let before = read();
        let possible = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
        let cpus: Vec<usize> = before.iter().map(|&(c, _)| c).collect();
        assert_eq!(cpus, cpu_list(possible.trim()), "a column per possible CPU");

        // /var/tmp: on a disk, where /tmp may be a tmpfs.
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let path = dir.path().join("f");
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&vec![7u8; 1 << 20]).unwrap();
        f.sync_all().unwrap();
        // O_DIRECT: every read goes to the disk, bypassing the page cache.
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .unwrap();
        let mut buf = AlignedBlock([0; 4096]);
        for i in 0..64 {
            std::os::unix::fs::FileExt::read_at(&f, &mut buf.0, i * 4096).unwrap();
        }
        let after = read();
        let growth: u64 = (after.iter().zip(&before))
            .map(|(a, b)| a.1.saturating_sub(b.1))
            .sum();
        let dev = f.metadata().unwrap().dev();
        let queues = hardware_queues(libc::major(dev), libc::minor(dev));
        assert!(
            queues != Some(1) || growth >= 64,
            "64 direct reads of a single-queue disk, {growth} BLOCK softirqs counted"
        );
        // Where the file's disk is not one single-queue device (NVMe, a device mapper),
        // the block layer completes reads without the softirq and no count need grow.
    }

    #[repr(align(4096))]
    struct AlignedBlock([u8; 4096]);

    /// "0-3,5" as [0, 1, 2, 3, 5].
    fn cpu_list(s: &str) -> Vec<usize> {
        s.split(',')
            .flat_map(|r| {
                let (a, b) = r.split_once('-').unwrap_or((r, r));
                a.parse::<usize>().unwrap()..=b.parse().unwrap()
            })
            .collect()
    }

    /// The hardware queues of the disk holding device `major:minor` (a partition's disk).
    fn hardware_queues(major: u32, minor: u32) -> Option<usize> {
        let dev = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).ok()?;
        let disk = if dev.join("partition").exists() {
            dev.parent()?.to_path_buf()
        } else {
            dev
        };
        Some(std::fs::read_dir(disk.join("mq")).ok()?.count())
    }
}
