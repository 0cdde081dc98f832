//! Where a queue's threads run.
//!
//! - Every thread of a queue rests on its CPU: the kernel queues a request on its sender's CPU,
//!   where a waiter is woken without an interrupt.
//! - After a big READ or WRITE in the last few milliseconds, all threads but the first rest
//!   anywhere. The first moves off its CPU meanwhile only if that CPU takes most of the
//!   disk's completions (`block_cpu`): it would hash there beside the reader and the
//!   interrupts of the reads it waits for, while another CPU idles.
//! - A thread that finds a request after a quiet spell nudges every queue whose threads all
//!   sleep (`spin::Activity`).

// This module makes syscalls; each unsafe block says why it holds.
#![allow(unsafe_code)]

use crate::block_cpu::Sampler;
use crate::event::EventFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// A READ or WRITE this large keeps its thread busy for long (a 128 KiB READ of a cold
/// image hashes 32 blocks).
pub(crate) const BIG_IO: u32 = 64 * 1024;

/// How long after its last big READ or WRITE a queue counts as streaming, in ns.
const STREAMING_NS: u64 = 20_000_000;

/// The threads of one queue: their thread IDs, whether each may run anywhere (`loose`)
/// or only on the queue's CPU, when the queue last served big I/O, and which sleep.
pub(crate) struct QueueThreads {
    cpu: usize,
    /// Where the queue's threads rest: its CPU, or every CPU this process may use when
    /// that one is not among them (`taskset`, a cpuset).
    home: libc::cpu_set_t,
    anywhere: libc::cpu_set_t,
    /// `anywhere` but the queue's CPU: where the first thread streams when its CPU takes
    /// most block completions (None if that CPU is not allowed or no other is).
    away: Option<libc::cpu_set_t>,
    /// Which CPU takes most block completions lately.
    block_cpu: &'static Sampler,
    /// Whether the first thread runs on `away`; held while its mask changes, so the two
    /// always agree.
    first_away: Mutex<bool>,
    /// 0 before a thread starts and after it ended (then it counts for no nudge).
    tids: Vec<AtomicI32>,
    loose: Vec<AtomicBool>,
    last_big_ns: AtomicU64,
    /// One per thread, which only it reads: the session's stop signals each, a nudge one
    /// thread's. (A semaphore they all read woke every thread per nudge: each pending
    /// read is retried on a signal.)
    wakes: Vec<EventFd>,
    asleep: Vec<AtomicBool>,
}

impl QueueThreads {
    pub(crate) fn new(cpu: usize, threads: usize) -> std::io::Result<Self> {
        Self::judged_by(cpu, threads, crate::block_cpu::sampler())
    }

    /// As `new`, with the CPU that takes most block completions said by `block_cpu`.
    fn judged_by(cpu: usize, threads: usize, block_cpu: &'static Sampler) -> std::io::Result<Self> {
        let anywhere = allowed_cpus();
        Ok(Self {
            cpu,
            home: only(cpu, &anywhere),
            anywhere,
            away: without(cpu, &anywhere),
            block_cpu,
            first_away: Mutex::new(false),
            tids: (0..threads).map(|_| AtomicI32::new(0)).collect(),
            loose: (0..threads).map(|_| AtomicBool::new(false)).collect(),
            last_big_ns: AtomicU64::new(0),
            wakes: (0..threads)
                .map(|_| EventFd::new())
                .collect::<std::io::Result<_>>()?,
            asleep: (0..threads).map(|_| AtomicBool::new(false)).collect(),
        })
    }

    /// Thread `me`'s wake eventfd, which it keeps a read pending on.
    pub(crate) fn wake(&self, me: usize) -> &EventFd {
        &self.wakes[me]
    }

    /// Wakes every thread (the session stops).
    pub(crate) fn wake_all(&self) {
        self.wakes.iter().for_each(EventFd::signal);
    }

    /// Thread `me` goes to sleep (`true`) or woke (`false`).
    pub(crate) fn sleeping(&self, me: usize, asleep: bool) {
        self.asleep[me].store(asleep, Ordering::SeqCst);
    }

    /// Another queue's thread found a request after a quiet spell: if every thread here
    /// sleeps, one is woken to look on this CPU while the session is busy, so the CPU does
    /// not sit idle for the scheduler to move the caller onto (see the module's comment).
    pub(crate) fn nudge(&self) {
        let mut sleeper = None;
        for (j, tid) in self.tids.iter().enumerate() {
            if tid.load(Ordering::SeqCst) == 0 {
                continue;
            }
            if !self.asleep[j].load(Ordering::SeqCst) {
                return;
            }
            sleeper.get_or_insert(j);
        }
        if let Some(j) = sleeper {
            self.wakes[j].signal();
        }
    }

    /// Called by thread `me` as it starts: it rests on the queue's CPU.
    pub(crate) fn started(&self, me: usize) {
        // SAFETY: gettid has no arguments and cannot fail.
        let tid = unsafe { libc::gettid() };
        self.tids[me].store(tid, Ordering::SeqCst);
        set_affinity(0, &self.home);
    }

    /// Called by thread `me` as it ends: no nudge waits for it, and its thread ID, which
    /// another thread may get next, is not moved again.
    pub(crate) fn ended(&self, me: usize) {
        self.tids[me].store(0, Ordering::SeqCst);
    }

    /// Thread `me` starts big I/O: the queue streams, and its other threads but the
    /// first may run anywhere from now, not only once a sibling is busy (by then the
    /// kernel has queued its READ on the busy CPU).
    pub(crate) fn begin_big(&self, me: usize) {
        self.last_big_ns.store(now_ns(), Ordering::SeqCst);
        for (j, tid) in self.tids.iter().enumerate().skip(1) {
            let tid = tid.load(Ordering::SeqCst);
            if j != me && tid != 0 && !self.loose[j].swap(true, Ordering::SeqCst) {
                set_affinity(tid, &self.anywhere);
            }
        }
        let Some(away) = &self.away else { return };
        let first = self.tids[0].load(Ordering::SeqCst);
        if first == 0 || self.block_cpu.busiest(now_ns()) != Some(self.cpu) {
            return;
        }
        // Busy (the first thread moving itself home): the next big I/O looks again.
        if let Ok(mut is_away) = self.first_away.try_lock() {
            if !*is_away {
                set_affinity(first, away);
                *is_away = true;
            }
        }
    }

    /// Thread `me` is about to wait for its next request: on the queue's CPU unless the
    /// queue streams; then the others anywhere, and the first elsewhere if `begin_big`
    /// moved it. (A race with a sibling's `begin_big` can leave one on the wrong CPUs a
    /// while: slower, never wrong.)
    /// The first comes home when streaming ends or the verdict lapses, not when the
    /// verdict names another CPU: where completions follow the CPU that asked, that is
    /// what its move brings about.
    pub(crate) fn rest(&self, me: usize) {
        let now = now_ns();
        let since = now.saturating_sub(self.last_big_ns.load(Ordering::SeqCst));
        let streaming = since < STREAMING_NS;
        if streaming {
            // After the reply: no caller waits for this.
            self.block_cpu.sample(now);
        }
        if me == 0 {
            if self.away.is_some() {
                let mut is_away = self.first_away.lock().unwrap_or_else(|p| p.into_inner());
                if *is_away && (!streaming || self.block_cpu.busiest(now).is_none()) {
                    set_affinity(0, &self.home);
                    *is_away = false;
                }
            }
            return;
        }
        if self.loose[me].load(Ordering::SeqCst) != streaming {
            self.loose[me].store(streaming, Ordering::SeqCst);
            let set = if streaming { self.anywhere } else { self.home };
            set_affinity(0, &set);
        }
    }
}

/// Nanoseconds since the first call (never 0 after it, so `last_big_ns` 0 is "never").
fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    start.elapsed().as_nanos() as u64 + STREAMING_NS
}

/// /dev/fuse worker `i` of `workers` rests on the i-th of the CPUs the process may use
/// (round robin), when there are workers enough for every such CPU.
/// One queue feeds every worker and poll(2) wakes them all: a worker on the caller's CPU
/// gets there first (the caller gives the CPU up as it waits), while one on another CPU,
/// halted, wakes tens of µs later to find nothing. Unpinned, the scheduler would put both
/// where they happened to run (see `dev::next_request`).
pub(crate) fn pin_worker(i: usize, workers: usize) {
    let allowed = allowed_cpus();
    let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
        // SAFETY: every CPU asked about is within the set's size.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &allowed) })
        .collect();
    if !cpus.is_empty() && workers >= cpus.len() {
        set_affinity(0, &only(cpus[i % cpus.len()], &allowed));
    }
}

/// Just `cpu` if `allowed` holds it, else all of `allowed`.
fn only(cpu: usize, allowed: &libc::cpu_set_t) -> libc::cpu_set_t {
    // SAFETY: cpu_set_t is plain data and all zeroes is the empty set; the CPU is checked
    // to fit in it.
    unsafe {
        if cpu >= libc::CPU_SETSIZE as usize || !libc::CPU_ISSET(cpu, allowed) {
            return *allowed;
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        set
    }
}

/// `allowed` without `cpu`, if `cpu` is in it and others are.
fn without(cpu: usize, allowed: &libc::cpu_set_t) -> Option<libc::cpu_set_t> {
    let mut set = *allowed;
    // SAFETY: cpu is checked to fit in the set; CPU_COUNT reads a live set.
    unsafe {
        if cpu >= libc::CPU_SETSIZE as usize || !libc::CPU_ISSET(cpu, allowed) {
            return None;
        }
        libc::CPU_CLR(cpu, &mut set);
        (libc::CPU_COUNT(&set) > 0).then_some(set)
    }
}

/// The CPUs this process may run on (all of them if that cannot be read).
fn allowed_cpus() -> libc::cpu_set_t {
    // SAFETY: as in `only`; sched_getaffinity writes at most the size given.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            for cpu in 0..libc::CPU_SETSIZE as usize {
                libc::CPU_SET(cpu, &mut set);
            }
        }
        set
    }
}

/// Failing leaves the thread where it was: still correct, only slower.
fn set_affinity(tid: libc::pid_t, set: &libc::cpu_set_t) {
    // SAFETY: set is a live cpu_set_t of the size given; tid is a thread of this process
    // (or 0, the caller).
    unsafe {
        libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), set);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_cpu::{self, tests::Fake};
    use std::sync::{mpsc, Arc, Barrier};
    use std::time::Duration;

    fn affinity_of(tid: libc::pid_t) -> libc::cpu_set_t {
        // SAFETY: as in `allowed_cpus`.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(
                libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
                0
            );
            set
        }
    }

    fn same(a: &libc::cpu_set_t, b: &libc::cpu_set_t) -> bool {
        (0..libc::CPU_SETSIZE as usize)
            // SAFETY: every CPU checked is within the sets' size.
            .all(|c| unsafe { libc::CPU_ISSET(c, a) == libc::CPU_ISSET(c, b) })
    }

    fn nproc_at_least_two(set: &libc::cpu_set_t) -> bool {
        // SAFETY: a live set.
        unsafe { libc::CPU_COUNT(set) >= 2 }
    }

    #[test]
    fn threads_rest_on_the_queue_cpu_and_all_but_the_first_anywhere_while_it_streams() {
        let q = Arc::new(QueueThreads::judged_by(0, 2, &fake_block_cpu().sampler).unwrap());
        let (tids_tx, tids) = mpsc::channel();
        let (go_tx, go) = mpsc::channel::<()>();
        let done = Arc::new(Barrier::new(2));
        // The second thread: starts, then rests whenever told to, reporting its TID.
        let worker = {
            let (q, done) = (q.clone(), done.clone());
            std::thread::spawn(move || {
                q.started(1);
                // SAFETY: gettid cannot fail.
                tids_tx.send(unsafe { libc::gettid() }).unwrap();
                while go.recv().is_ok() {
                    q.rest(1);
                    done.wait();
                }
            })
        };
        let second = tids.recv().unwrap();
        q.started(0);
        let pinned = only(0, &q.anywhere);
        assert!(
            nproc_at_least_two(&q.anywhere),
            "a test of where threads run needs 2 CPUs"
        );
        assert!(
            same(&affinity_of(0), &pinned),
            "the first thread rests on CPU 0"
        );
        assert!(same(&affinity_of(second), &pinned), "so does the second");

        q.begin_big(0);
        assert!(
            same(&affinity_of(second), &q.anywhere),
            "loose once the queue streams"
        );
        assert!(same(&affinity_of(0), &pinned), "the first stays");
        go_tx.send(()).unwrap();
        done.wait();
        assert!(
            same(&affinity_of(second), &q.anywhere),
            "and rests anywhere meanwhile"
        );

        std::thread::sleep(std::time::Duration::from_nanos(STREAMING_NS * 2));
        go_tx.send(()).unwrap();
        done.wait();
        assert!(
            same(&affinity_of(second), &pinned),
            "back on CPU 0 once streaming ends"
        );
        drop(go_tx);
        worker.join().unwrap();
    }

    /// A sampler whose counts the test sets, for the life of the test process.
    fn fake_block_cpu() -> &'static Fake {
        Box::leak(Box::new(Fake::new()))
    }

    /// Thread 1 serves a big read and rests, sampling after its reply (on a thread of its
    /// own: resting moves the caller).
    fn serve_big_as_second_thread(q: &QueueThreads) {
        std::thread::scope(|s| {
            s.spawn(|| {
                q.begin_big(1);
                q.rest(1);
            });
        });
    }

    #[test]
    fn the_first_thread_streams_off_its_cpu_while_that_cpu_takes_most_completions() {
        let fake = fake_block_cpu();
        // The test's thread is the queue's first; thread 1's calls are made for it.
        std::thread::spawn(move || {
            let q = QueueThreads::judged_by(0, 2, &fake.sampler).unwrap();
            q.started(0);
            assert!(nproc_at_least_two(&q.anywhere), "needs 2 CPUs");
            let home = only(0, &q.anywhere);
            let elsewhere = without(0, &q.anywhere).expect("CPU 0 and another allowed");
            let on = |set: &libc::cpu_set_t| same(&affinity_of(0), set);
            let serve = || serve_big_as_second_thread(&q);
            let next_sample =
                || std::thread::sleep(Duration::from_nanos(block_cpu::SAMPLE_NS + 1_000_000));
            serve();
            assert!(on(&home), "no verdict yet: on CPU 0");

            fake.set(100, 0);
            next_sample();
            serve();
            assert!(on(&home), "the verdict comes after the reply");
            serve();
            assert!(on(&elsewhere), "CPU 0 takes the completions: off it");
            q.rest(0);
            assert!(on(&elsewhere), "and stays off while the queue streams");

            fake.set(100, 200);
            next_sample();
            serve();
            q.rest(0);
            assert!(
                on(&elsewhere),
                "completions that followed it do not bring it home mid-stream"
            );
            std::thread::sleep(Duration::from_nanos(STREAMING_NS * 2));
            q.rest(0);
            assert!(on(&home), "home once streaming ends");
            serve();
            assert!(on(&home), "completions elsewhere: it stays home");

            fake.set(300, 200);
            next_sample();
            serve();
            serve();
            assert!(on(&elsewhere), "off again");
            // A long warm stream: no completions, the verdict lapses.
            let start = Instant::now();
            while start.elapsed() < Duration::from_nanos(block_cpu::VALID_NS + 50_000_000) {
                serve();
                q.rest(0);
                std::thread::sleep(Duration::from_millis(5));
            }
            assert!(on(&home), "home when the verdict lapses, though it streams");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn the_first_thread_stays_home_when_its_cpu_is_the_only_one_allowed() {
        let fake = fake_block_cpu();
        fake.set(0, 0);
        std::thread::spawn(move || {
            // SAFETY: all zeroes is the empty set; CPU 0 fits in it.
            let zero = unsafe {
                let mut zero: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(0, &mut zero);
                zero
            };
            set_affinity(0, &zero);
            let q = QueueThreads::judged_by(0, 2, &fake.sampler).unwrap();
            q.started(0);
            for n in [100, 200, 300] {
                fake.set(n, 0);
                std::thread::sleep(Duration::from_nanos(block_cpu::SAMPLE_NS + 1_000_000));
                serve_big_as_second_thread(&q);
            }
            assert_eq!(fake.sampler.busiest(now_ns()), Some(0), "CPU 0 is busiest");
            assert!(same(&affinity_of(0), &zero), "but the only CPU allowed");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn no_cpu_is_left_when_the_queue_cpu_is_the_only_one_allowed() {
        // SAFETY: all zeroes is the empty set; CPUs 0 and 1 fit in it.
        let (one, two) = unsafe {
            let mut one: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(0, &mut one);
            let mut two = one;
            libc::CPU_SET(1, &mut two);
            (one, two)
        };
        assert!(without(0, &one).is_none());
        let left = without(0, &two).unwrap();
        // SAFETY: a live set.
        assert!(unsafe { libc::CPU_ISSET(1, &left) && !libc::CPU_ISSET(0, &left) });
        assert!(
            without(5, &two).is_none(),
            "a CPU not in the set: it rests anywhere"
        );
    }

    /// What a read of thread `me`'s wake eventfd gives: the signals since the last read,
    /// or None if there were none.
    fn take_wake(q: &QueueThreads, me: usize) -> Option<u64> {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from a non-blocking eventfd we own.
        let n = unsafe {
            libc::read(
                std::os::fd::AsRawFd::as_raw_fd(&q.wake(me).fd()),
                (&mut v as *mut u64).cast(),
                8,
            )
        };
        (n == 8).then_some(v)
    }

    #[test]
    fn a_nudge_wakes_one_thread_of_a_queue_only_when_all_its_threads_sleep() {
        let q = QueueThreads::new(0, 2).unwrap();
        q.nudge();
        assert_eq!(take_wake(&q, 0), None, "no thread started: no nudge");
        // Both threads started (without moving this one to CPU 0).
        q.tids.iter().for_each(|t| t.store(1, Ordering::SeqCst));
        q.nudge();
        assert_eq!(take_wake(&q, 0), None, "both threads awake: no nudge");
        q.sleeping(1, true);
        q.nudge();
        assert_eq!(take_wake(&q, 1), None, "one still awake: no nudge");
        q.sleeping(0, true);
        q.nudge();
        assert_eq!(
            (take_wake(&q, 0), take_wake(&q, 1)),
            (Some(1), None),
            "both asleep: one is woken, and only one"
        );
        q.sleeping(0, false);
        q.nudge();
        assert_eq!(take_wake(&q, 1), None, "a thread woke: no nudge");
        q.sleeping(0, true);
        q.ended(0);
        q.sleeping(0, false);
        q.nudge();
        assert_eq!(
            (take_wake(&q, 0), take_wake(&q, 1)),
            (None, Some(1)),
            "the one left, asleep, is woken after the other ended"
        );
        q.wake_all();
        assert_eq!(
            (take_wake(&q, 0), take_wake(&q, 1)),
            (Some(1), Some(1)),
            "a stop wakes all"
        );
    }

    #[test]
    fn dev_workers_rest_one_per_cpu_when_there_are_enough() {
        let allowed = allowed_cpus();
        assert!(nproc_at_least_two(&allowed), "needs 2 CPUs");
        let second = (1..libc::CPU_SETSIZE as usize)
            // SAFETY: within the set's size.
            .find(|&c| unsafe { libc::CPU_ISSET(c, &allowed) })
            .unwrap();
        let on = |i, workers| {
            std::thread::spawn(move || {
                pin_worker(i, workers);
                affinity_of(0)
            })
            .join()
            .unwrap()
        };
        assert!(same(&on(1, 2), &only(second, &allowed)), "worker 1 of 2");
        assert!(same(&on(3, 4), &only(second, &allowed)), "worker 3 of 4");
        assert!(same(&on(0, 1), &allowed), "a lone worker rests anywhere");
    }

    #[test]
    fn threads_rest_within_the_cpus_the_process_may_use() {
        // SAFETY: as in `allowed_cpus`.
        let (zero, mut one) = unsafe {
            let mut one: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(1, &mut one);
            (only(0, &one), one)
        };
        assert!(same(&zero, &one), "CPU 0 not allowed: anywhere allowed");
        // SAFETY: as above.
        unsafe { libc::CPU_SET(0, &mut one) };
        let zero = only(0, &one);
        // SAFETY: a live set.
        assert!(unsafe { libc::CPU_ISSET(0, &zero) && !libc::CPU_ISSET(1, &zero) });
        assert!(
            same(&only(libc::CPU_SETSIZE as usize, &one), &one),
            "past the set's size"
        );
    }
}
