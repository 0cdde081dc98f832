//! Which CPU completes the block layer's I/O: where a disk's interrupts go.
//!
//! - A queue thread that serves a stream of cold reads hashes on the reader's CPU (the
//!   kernel queues a request there). When that CPU also takes the disk's interrupts, the
//!   thread, the reader and the completions of the very reads they wait for share one CPU
//!   while the others idle.
//! - `/proc/softirqs` counts BLOCK softirqs per CPU. The counts' growth over the last
//!   moments of streaming names that CPU, if one takes most of them.
//! - It is sampled at most every [`SAMPLE_NS`], only while a queue streams, and judged
//!   only on [`MIN_COMPLETIONS`] or more; a sample older than [`STALE_NS`] starts over.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// How often the counts are read at most, in ns.
const SAMPLE_NS: u64 = 10_000_000;

/// Counts older than this say nothing of the current stream, in ns.
const STALE_NS: u64 = 1_000_000_000;

/// Fewer completions than this are not judged (a few stray writes of another process).
const MIN_COMPLETIONS: u64 = 16;

/// No CPU takes most completions (or none were seen).
const NONE: usize = usize::MAX;

/// The CPU that took most of the block completions lately, if one took more than half.
/// Every queue of the process asks the same sampler.
pub(crate) fn busiest() -> Option<usize> {
    static SAMPLER: OnceLock<Sampler> = OnceLock::new();
    SAMPLER
        .get_or_init(|| Sampler::new(|| std::fs::read_to_string("/proc/softirqs").ok()))
        .busiest()
}

/// Each CPU's count of BLOCK softirqs, by CPU number.
type Counts = Vec<(usize, u64)>;

/// Reads the counts now and then and keeps its verdict between reads.
pub(crate) struct Sampler {
    read: fn() -> Option<String>,
    origin: Instant,
    /// ns after `origin` before which the counts are not read again.
    next_ns: AtomicU64,
    verdict: AtomicUsize,
    /// The counts the next read is compared with, and when they were read (ns).
    base: Mutex<Option<(u64, Counts)>>,
}

impl Sampler {
    pub(crate) fn new(read: fn() -> Option<String>) -> Sampler {
        Sampler {
            read,
            origin: Instant::now(),
            next_ns: AtomicU64::new(0),
            verdict: AtomicUsize::new(NONE),
            base: Mutex::new(None),
        }
    }

    pub(crate) fn busiest(&self) -> Option<usize> {
        let now = self.origin.elapsed().as_nanos() as u64;
        if now >= self.next_ns.load(Ordering::Relaxed) {
            // One thread reads; the others take the verdict as it stands.
            if let Ok(mut base) = self.base.try_lock() {
                self.next_ns.store(now + SAMPLE_NS, Ordering::Relaxed);
                self.sample(now, &mut base);
            }
        }
        match self.verdict.load(Ordering::Relaxed) {
            NONE => None,
            cpu => Some(cpu),
        }
    }

    fn sample(&self, now: u64, base: &mut Option<(u64, Counts)>) {
        let Some(counts) = (self.read)().as_deref().and_then(parse_block) else {
            // No /proc (a sandbox): no verdict, threads stay where they rest.
            self.verdict.store(NONE, Ordering::Relaxed);
            return;
        };
        let fresh = base
            .as_ref()
            .filter(|(at, _)| now.saturating_sub(*at) < STALE_NS);
        match fresh.map(|(_, before)| grown(before, &counts)) {
            Some(growth) if growth.iter().map(|&(_, n)| n).sum::<u64>() >= MIN_COMPLETIONS => {
                self.verdict
                    .store(majority(&growth).unwrap_or(NONE), Ordering::Relaxed);
                *base = Some((now, counts));
            }
            // Too few yet: the base stays, so the next read sees more of them.
            Some(_) => {}
            None => *base = Some((now, counts)),
        }
    }
}

/// Each CPU's count in `after` less its count in `before` (a CPU missing from `before`,
/// or a count that went back, grew by none).
fn grown(before: &[(usize, u64)], after: &[(usize, u64)]) -> Counts {
    after
        .iter()
        .map(|&(cpu, n)| {
            let was = before
                .iter()
                .find(|&&(c, _)| c == cpu)
                .map_or(n, |&(_, b)| b);
            (cpu, n.saturating_sub(was))
        })
        .collect()
}

/// The CPU with more than half of the counts, if one has.
fn majority(counts: &[(usize, u64)]) -> Option<usize> {
    let total: u64 = counts.iter().map(|&(_, n)| n).sum();
    let &(cpu, most) = counts.iter().max_by_key(|&&(_, n)| n)?;
    (most > 0 && most * 2 > total).then_some(cpu)
}

/// Each CPU's BLOCK count from the text of `/proc/softirqs`: a header of `CPU<n>` columns,
/// then one line per softirq, `NAME:` and a count per column.
/// By hand: procfs (0.18) reads the per-CPU softirq time of /proc/stat, which sums every
/// kind of softirq, but not /proc/softirqs.
fn parse_block(text: &str) -> Option<Counts> {
    let mut lines = text.lines();
    let cpus = lines
        .next()?
        .split_whitespace()
        .map(|c| c.strip_prefix("CPU")?.parse().ok())
        .collect::<Option<Vec<usize>>>()?;
    let counts = lines
        .find_map(|l| l.trim_start().strip_prefix("BLOCK:"))?
        .split_whitespace()
        .map(|n| n.parse().ok())
        .collect::<Option<Vec<u64>>>()?;
    (!cpus.is_empty() && counts.len() == cpus.len()).then(|| cpus.into_iter().zip(counts).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = "                    CPU0       CPU1       \n          HI:          1          0\n       TIMER:     103420     101005\n      NET_TX:          2          1\n       BLOCK:          0      81481\n    IRQ_POLL:          0          0\n";

    #[test]
    fn the_block_line_is_read_per_cpu_by_the_header_columns() {
        assert_eq!(parse_block(TWO), Some(vec![(0, 0), (1, 81481)]));
        let gap = "   CPU0   CPU2   CPU3\n BLOCK:  5 6 7\n";
        assert_eq!(parse_block(gap), Some(vec![(0, 5), (2, 6), (3, 7)]));
        for bad in [
            "",
            "CPU0 CPU1\n",
            "CPU0 CPU1\n BLOCK: 1\n",
            "CPU0 CPU1\n BLOCK: 1 x\n",
            "CPU0 CPUx\n BLOCK: 1 2\n",
            "CPU0\n BLOCK: 99999999999999999999999\n",
        ] {
            assert_eq!(parse_block(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_cpu_with_more_than_half_of_the_completions_is_the_busiest() {
        assert_eq!(majority(&[(0, 3), (1, 60)]), Some(1));
        assert_eq!(majority(&[(0, 60), (1, 3), (2, 3)]), Some(0));
        assert_eq!(majority(&[(0, 30), (1, 30)]), None, "a tie");
        assert_eq!(majority(&[(0, 20), (1, 20), (2, 30)]), None, "no majority");
        assert_eq!(majority(&[(0, 0), (1, 0)]), None);
        assert_eq!(majority(&[]), None);
        assert_eq!(
            grown(&[(0, 10), (1, 100)], &[(0, 12), (1, 90), (2, 4)]),
            vec![(0, 2), (1, 0), (2, 0)],
            "a count that went back or a new CPU grew by none"
        );
    }

    /// A sampler over counts the test sets: CPU 1 has `COUNT`, CPU 0 none.
    static COUNT: AtomicU64 = AtomicU64::new(0);
    fn counts() -> Option<String> {
        Some(format!(
            "CPU0 CPU1\nBLOCK: 0 {}\n",
            COUNT.load(Ordering::SeqCst)
        ))
    }

    #[test]
    fn the_verdict_needs_enough_completions_since_a_recent_read() {
        let s = Sampler::new(counts);
        let wait = || std::thread::sleep(std::time::Duration::from_nanos(SAMPLE_NS + 1_000_000));
        assert_eq!(s.busiest(), None, "the first read is a base");
        COUNT.fetch_add(MIN_COMPLETIONS - 1, Ordering::SeqCst);
        wait();
        assert_eq!(s.busiest(), None, "too few completions");
        COUNT.fetch_add(1, Ordering::SeqCst);
        assert_eq!(s.busiest(), None, "not read again this soon");
        wait();
        assert_eq!(s.busiest(), Some(1), "enough since the base");
        wait();
        assert_eq!(s.busiest(), Some(1), "none since: the verdict stands");
        std::thread::sleep(std::time::Duration::from_nanos(STALE_NS));
        COUNT.fetch_add(1000, Ordering::SeqCst);
        assert_eq!(
            s.busiest(),
            Some(1),
            "a stale base is read anew, and the verdict stands meanwhile"
        );
        wait();
        assert_eq!(s.busiest(), Some(1));

        let none = Sampler::new(|| None);
        assert_eq!(none.busiest(), None, "no /proc/softirqs: no verdict");
    }

    /// The oracle is the kernel: reads that miss the page cache complete as BLOCK
    /// softirqs, which this machine's /proc/softirqs must show on some CPU.
    #[test]
    fn this_machine_counts_block_completions_per_cpu() {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let read = || parse_block(&std::fs::read_to_string("/proc/softirqs").unwrap()).unwrap();
        let before = read();
        assert!(
            before.len() >= libc_nprocs(),
            "a column per possible CPU: {before:?}"
        );
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
        let growth: u64 = grown(&before, &read()).iter().map(|&(_, n)| n).sum();
        assert!(
            growth >= 64,
            "64 direct reads, {growth} completions counted"
        );
    }

    #[repr(align(4096))]
    struct AlignedBlock([u8; 4096]);

    fn libc_nprocs() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}
