//! FUSE over io_uring: the kernel has one queue per possible CPU and puts a request on the
//! queue of the CPU its sender runs on. Each queue here is one thread with one ring of
//! 128-byte SQEs: it REGISTERs its entries (IORING_OP_URING_CMD on the /dev/fuse
//! descriptor), serves each request the kernel completes itself when the filesystem calls
//! it quick and hands the others to the worker pool, and commits each answered entry back
//! with COMMIT_AND_FETCH, which also re-arms it. At unmount every
//! entry completes with -ENOTCONN and the thread ends.

use crate::abi::{self, UringCmdReq, UringReqHeader};
use crate::decode::decode;
use crate::dispatch::Filesystem;
use crate::pool::{serve_entry, Completions, InFlight};
use crate::ring_mem::{EntryPtrs, QueueMem};
use crate::split::split_uring;
use crate::stats::Stats;
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use zerocopy::IntoBytes;

type Ring = IoUring<squeue::Entry128, cqueue::Entry>;

/// The user_data of the wake-up read (entries use their index).
const WAKE: u64 = u64::MAX;

/// The number of possible CPUs, as the kernel counts its queues (`num_possible_cpus()`),
/// from a list like `0-3,6`.
pub fn possible_cpus() -> io::Result<usize> {
    let list = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    count_cpu_list(list.trim())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("cpu list {list:?}")))
}

fn count_cpu_list(list: &str) -> Option<usize> {
    let mut n = 0usize;
    for range in list.split(',') {
        let (a, b) = range.split_once('-').unwrap_or((range, range));
        let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
        n = n.checked_add(b.checked_sub(a)?.checked_add(1)?)?;
    }
    (n > 0).then_some(n)
}

fn cmd_area(qid: u16, commit_id: u64) -> [u8; 80] {
    let mut area = [0u8; 80];
    let req = UringCmdReq {
        flags: 0,
        commit_id,
        qid,
        padding: [0; 6],
    };
    area[..24].copy_from_slice(req.as_bytes());
    area
}

/// REGISTER of entry `idx`: addr points at its iovec pair [header, payload], len = 2.
fn register_sqe(fd: RawFd, qid: u16, mem: &QueueMem, idx: usize) -> squeue::Entry128 {
    let mut sqe = opcode::UringCmd80::new(types::Fd(fd), abi::URING_CMD_REGISTER)
        .cmd(cmd_area(qid, 0))
        .addr(Some(mem.iovec_pair(idx) as u64))
        .build()
        .user_data(idx as u64);
    // io-uring 0.7 has no setter for sqe->len, the u32 at byte 24 of the SQE.
    // SAFETY: Entry128 is repr(C) and begins with struct io_uring_sqe, whose `len` field
    // is the aligned u32 at offset 24 of those 128 bytes.
    unsafe {
        (&mut sqe as *mut squeue::Entry128)
            .cast::<u8>()
            .add(24)
            .cast::<u32>()
            .write(2)
    };
    sqe
}

fn commit_sqe(fd: RawFd, qid: u16, commit_id: u64, idx: usize) -> squeue::Entry128 {
    opcode::UringCmd80::new(types::Fd(fd), abi::URING_CMD_COMMIT_AND_FETCH)
        .cmd(cmd_area(qid, commit_id))
        .build()
        .user_data(idx as u64)
}

fn wake_sqe(done: &Completions, mem: &QueueMem) -> squeue::Entry128 {
    let fd = done.eventfd().fd().as_raw_fd();
    squeue::Entry128::from(
        opcode::Read::new(types::Fd(fd), mem.wake_buf(), 8)
            .build()
            .user_data(WAKE),
    )
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: cpu_set_t is plain data, zeroed is empty; sched_setaffinity(0) affects only
    // this thread, and failing leaves it unpinned (still correct, only slower).
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// One queue: its id, ring depth, memory, the filesystem (for quick requests) and the way
/// to the workers.
pub(crate) struct Queue<F> {
    pub(crate) fs: Arc<F>,
    pub(crate) stats: Arc<Stats>,
    pub(crate) fd: RawFd,
    pub(crate) qid: u16,
    pub(crate) mem: Arc<QueueMem>,
    pub(crate) done: Arc<Completions>,
    pub(crate) jobs: Sender<InFlight>,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) pin: bool,
    /// How long to look for the next request before sleeping (see `spin`).
    pub(crate) poll: std::time::Duration,
    /// A copy of each request served here (as large as the largest, made beforehand).
    pub(crate) input: Vec<u8>,
}

/// What the queue thread saw of its REGISTERs: sent to the session before serving.
pub(crate) type Registered = Result<(), io::Error>;

/// Pushes an SQE; the ring has room for every entry and the wake read, so it never fills.
fn push(ring: &mut Ring, sqe: &squeue::Entry128) -> io::Result<()> {
    // SAFETY: every SQE points at QueueMem memory, which outlives this thread's ring.
    unsafe { ring.submission().push(sqe) }.map_err(|_| io::Error::other("submission queue full"))
}

impl<F: Filesystem> Queue<F> {
    /// Registers every entry, reports how that went, then serves until every entry has
    /// ended (unmount) or the session stops.
    pub(crate) fn run(mut self, registered: Sender<Registered>) -> io::Result<()> {
        if self.pin {
            pin_to_cpu(self.qid as usize);
        }
        let depth = self.mem.depth();
        let mut ring: Ring = match IoUring::builder().build((depth + 1).next_power_of_two() as u32)
        {
            Ok(r) => r,
            Err(e) => {
                let _ = registered.send(Err(io::Error::new(
                    e.kind(),
                    format!("io_uring_setup: {e}"),
                )));
                return Ok(());
            }
        };
        match self.register(&mut ring) {
            Ok(early) => {
                let _ = registered.send(Ok(()));
                let mut input = std::mem::take(&mut self.input);
                self.serve(&mut ring, early, &mut input)
            }
            Err(e) => {
                let _ = registered.send(Err(e));
                Ok(())
            }
        }
    }

    /// REGISTERs the entries and arms the wake-up read. A refused REGISTER completes at
    /// once, with an error; a registered entry completes only when a request comes (which
    /// may already happen once the last queue registered): those are returned to serve.
    fn register(&self, ring: &mut Ring) -> io::Result<Vec<(u64, i32)>> {
        for idx in 0..self.mem.depth() {
            push(ring, &register_sqe(self.fd, self.qid, &self.mem, idx))?;
        }
        push(ring, &wake_sqe(&self.done, &self.mem))?;
        ring.submit()?;
        let early: Vec<(u64, i32)> = ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        match early
            .iter()
            .find(|&&(user_data, res)| user_data != WAKE && res < 0)
        {
            Some(&(_, res)) => Err(io::Error::from_raw_os_error(-res)),
            None => Ok(early),
        }
    }

    /// Whether the filesystem calls the request in `entry` quick (a request that does not
    /// decode is not: the pool answers its error).
    fn is_quick(&self, entry: &EntryPtrs) -> bool {
        // SAFETY: the kernel filled the entry before completing the command, and it is
        // this thread's until handed to a worker; the payload is read, never written, here.
        let (header, payload) = unsafe {
            let header: UringReqHeader = entry.header.read();
            let used = (header.ring_ent_in_out.payload_sz as usize).min(entry.payload_size);
            (header, std::slice::from_raw_parts(entry.payload, used))
        };
        split_uring(&header, payload)
            .ok()
            .and_then(|raw| decode(&raw).ok())
            .is_some_and(|req| self.fs.quick(&req))
    }

    fn serve(
        &self,
        ring: &mut Ring,
        early: Vec<(u64, i32)>,
        input: &mut Vec<u8>,
    ) -> io::Result<()> {
        let depth = self.mem.depth();
        let mut commit_ids = vec![0u64; depth];
        let (mut ended, mut in_flight, mut stopping) = (0usize, 0usize, false);
        let mut answered = Vec::new();
        let mut cqes = early;
        while ended < depth && !(stopping && in_flight == 0) {
            if cqes.is_empty() && in_flight == 0 {
                // Commits go out first: their callers wait for them. Not while the pool
                // works on this queue's requests: they want the CPU (a cold read of a
                // compressed file took 0.35 s instead of 0.26 with the queue looking),
                // and their answers wake the queue anyway.
                ring.submit()?;
                cqes = crate::spin::spin(self.poll, || {
                    let found: Vec<(u64, i32)> = ring
                        .completion()
                        .map(|c| (c.user_data(), c.result()))
                        .collect();
                    Ok((!found.is_empty()).then_some(found))
                })?
                .unwrap_or_default();
            }
            if cqes.is_empty() {
                match ring.submit_and_wait(1) {
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                    Err(e) => return Err(e),
                }
                cqes = ring
                    .completion()
                    .map(|c| (c.user_data(), c.result()))
                    .collect();
            }
            for (user_data, res) in std::mem::take(&mut cqes) {
                if user_data == WAKE {
                    self.done.take(&mut answered);
                    for idx in answered.drain(..) {
                        push(ring, &commit_sqe(self.fd, self.qid, commit_ids[idx], idx))?;
                        in_flight -= 1;
                    }
                    stopping = self.stop.load(Ordering::Acquire);
                    // Re-armed even when stopping: answers still in the workers wake us.
                    push(ring, &wake_sqe(&self.done, &self.mem))?;
                    continue;
                }
                let idx = user_data as usize;
                if idx >= depth || res < 0 {
                    // -ENOTCONN at teardown; any other error also ends the entry.
                    ended += 1;
                    continue;
                }
                let entry = self.mem.entry(idx);
                // SAFETY: the kernel filled the entry before completing the command, and
                // it is this thread's until handed to a worker below.
                commit_ids[idx] = unsafe { (*entry.header).ring_ent_in_out.commit_id };
                in_flight += 1;
                let quick = self.is_quick(&entry);
                let job = InFlight {
                    qid: self.qid as usize,
                    idx,
                    entry,
                    mem: self.mem.clone(),
                    done: self.done.clone(),
                    quiet: quick,
                };
                if quick {
                    serve_entry(&*self.fs, job, &self.stats, input);
                } else if self.jobs.send(job).is_err() {
                    return Err(io::Error::other("the worker pool is gone"));
                }
            }
            // Entries answered here (quietly, without the wake-up) go back at once.
            self.done.take(&mut answered);
            for idx in answered.drain(..) {
                push(ring, &commit_sqe(self.fd, self.qid, commit_ids[idx], idx))?;
                in_flight -= 1;
            }
        }
        // Commits pushed in the last round still go out: their callers wait for them.
        ring.submit()?;
        Ok(())
    }
}
