//! FUSE over io_uring: a kernel queue per possible CPU, served by a few threads, each with a
//! ring of its own holding one entry (IORING_OP_URING_CMD); placement: `affinity`.
//!
//! - A thread answers in place with COMMIT_AND_FETCH, re-arming its entry in the same syscall.
//! - One entry per thread: a long request holds only its own entry.
//! - At unmount every entry completes with -ENOTCONN and its thread ends.

// This module makes syscalls; each unsafe block says why it holds.
#![allow(unsafe_code)]

use crate::abi::{self, OutHeader, UringCmdReq, UringReqHeader};
use crate::affinity::{QueueThreads, BIG_IO};
use crate::dispatch::{serve, Filesystem};
use crate::event::EventFd;
use crate::reply::Sink;
use crate::ring_mem::{EntryPtrs, QueueMem};
use crate::split::{split_uring, Raw};
use crate::stats::Stats;
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Duration;
use zerocopy::IntoBytes;

type Ring = IoUring<squeue::Entry128, cqueue::Entry>;

/// The user_data of the entry's commands and of the wake read.
const ENTRY: u64 = 0;
const WAKE: u64 = 1;

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
        .user_data(ENTRY);
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

fn commit_sqe(fd: RawFd, qid: u16, commit_id: u64) -> squeue::Entry128 {
    opcode::UringCmd80::new(types::Fd(fd), abi::URING_CMD_COMMIT_AND_FETCH)
        .cmd(cmd_area(qid, commit_id))
        .build()
        .user_data(ENTRY)
}

fn wake_sqe(wake: &EventFd, mem: &QueueMem) -> squeue::Entry128 {
    let fd = wake.fd().as_raw_fd();
    squeue::Entry128::from(
        opcode::Read::new(types::Fd(fd), mem.wake_buf(), 8)
            .build()
            .user_data(WAKE),
    )
}

/// One serving thread: its queue, its entry's memory and the session's stop flag (its
/// wake eventfd says when to look at it).
pub(crate) struct Server<F> {
    pub(crate) fs: Arc<F>,
    pub(crate) stats: Arc<Stats>,
    pub(crate) fd: RawFd,
    pub(crate) qid: u16,
    /// One entry (index 0), and the 8 bytes the wake read lands in.
    pub(crate) mem: Arc<QueueMem>,
    pub(crate) stopping: Arc<AtomicBool>,
    /// How long to look for the next request before sleeping (see `spin`).
    pub(crate) poll: Duration,
    /// Shared by every thread of every queue: each looks while any of them is busy.
    pub(crate) activity: Arc<crate::spin::Activity>,
    /// Where this queue's threads may run; this one is `index` among them.
    pub(crate) threads: Arc<QueueThreads>,
    /// Every queue (this one too), to nudge those whose threads all sleep.
    pub(crate) queues: Arc<[Arc<QueueThreads>]>,
    pub(crate) index: usize,
    /// A copy of each request served here (as large as the largest, made beforehand).
    pub(crate) input: Vec<u8>,
}

/// What a thread saw of its REGISTER: sent to the session before serving.
pub(crate) type Registered = Result<(), io::Error>;

/// Pushes an SQE; the ring has room for the entry's command and the wake read.
fn push(ring: &mut Ring, sqe: &squeue::Entry128) -> io::Result<()> {
    // SAFETY: every SQE points at QueueMem memory, which outlives this thread's ring
    // (the session frees it after joining the thread).
    unsafe { ring.submission().push(sqe) }.map_err(|_| io::Error::other("submission queue full"))
}

fn completions(ring: &mut Ring) -> Vec<(u64, i32)> {
    ring.completion()
        .map(|c| (c.user_data(), c.result()))
        .collect()
}

impl<F: Filesystem> Server<F> {
    /// Registers the entry, reports how that went, then serves until the entry ends
    /// (unmount) or the session stops.
    pub(crate) fn run(mut self, registered: Sender<Registered>) -> io::Result<()> {
        self.threads.started(self.index);
        let result = self.run_started(registered);
        self.threads.ended(self.index);
        result
    }

    fn run_started(&mut self, registered: Sender<Registered>) -> io::Result<()> {
        // A request reaches this thread as task work it must run (copying the request into
        // the entry). Cooperatively: a thread looking for its next request (see `spin`) on
        // another CPU is not sent an interrupt but sees the ring's TASKRUN flag and enters
        // the kernel itself; a sleeping one is woken as ever.
        let built = IoUring::builder()
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .build(2);
        let mut ring: Ring = match built {
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

    /// REGISTERs the entry and arms the wake read. A refused REGISTER completes at once,
    /// with an error; a registered entry completes only when a request comes (which may
    /// already happen once the last queue registered): that is returned to serve.
    fn register(&self, ring: &mut Ring) -> io::Result<Vec<(u64, i32)>> {
        push(ring, &register_sqe(self.fd, self.qid, &self.mem, 0))?;
        push(ring, &wake_sqe(self.threads.wake(self.index), &self.mem))?;
        ring.submit()?;
        let early = completions(ring);
        match early
            .iter()
            .find(|&&(user_data, res)| user_data == ENTRY && res < 0)
        {
            Some(&(_, res)) => Err(io::Error::from_raw_os_error(-res)),
            None => Ok(early),
        }
    }

    fn serve(
        &self,
        ring: &mut Ring,
        early: Vec<(u64, i32)>,
        input: &mut Vec<u8>,
    ) -> io::Result<()> {
        let mut cqes = early;
        loop {
            if cqes.is_empty() {
                // The commit goes out first: its caller waits for it.
                ring.submit()?;
                self.threads.rest(self.index);
                // Every thread looks while the session is busy: the kernel hands a
                // request to the entry committed last, so were only each queue's first
                // looking, a walker's requests would go to a sleeping thread, and the
                // walker be woken on the idle other CPU after every reply.
                cqes = crate::spin::spin(self.poll, &self.activity, || {
                    if ring.submission().taskrun() {
                        // Runs the task work, which posts the request's completion.
                        ring.submit()?;
                    }
                    let found = completions(ring);
                    Ok((!found.is_empty()).then_some(found))
                })?
                .unwrap_or_default();
            }
            if cqes.is_empty() {
                self.threads.sleeping(self.index, true);
                let slept = ring.submit_and_wait(1);
                self.threads.sleeping(self.index, false);
                match slept {
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                    Err(e) => return Err(e),
                }
                cqes = completions(ring);
            }
            // A request first (its caller waits), then the stop.
            cqes.sort_by_key(|&(user_data, _)| user_data);
            for (user_data, res) in std::mem::take(&mut cqes) {
                if user_data == WAKE {
                    if self.stopping.load(Ordering::Acquire) {
                        // The answer to a request served in this batch goes out first.
                        ring.submit()?;
                        return Ok(());
                    }
                    // A nudge (or a stop of an earlier, failed start): re-arm, then look
                    // for requests while the session is busy.
                    push(ring, &wake_sqe(self.threads.wake(self.index), &self.mem))?;
                    continue;
                }
                if res < 0 {
                    // -ENOTCONN at teardown; any other error also ends the entry.
                    return Ok(());
                }
                let entry = self.mem.entry(0);
                // SAFETY: the kernel filled the entry before completing the command, and
                // it is this thread's until committed.
                let commit_id = unsafe { (*entry.header).ring_ent_in_out.commit_id };
                let served = Served {
                    qid: self.qid as usize,
                    stats: &self.stats,
                    threads: &self.threads,
                    index: self.index,
                };
                serve_entry(&*self.fs, entry, served, input, || self.busy());
                push(ring, &commit_sqe(self.fd, self.qid, commit_id))?;
            }
        }
    }
}

impl<F> Server<F> {
    /// A request other than big I/O came (a caller may wait for each answer): the session
    /// is busy, and if it was quiet before, queues whose threads all sleep are nudged.
    /// Big READs and WRITEs do not count: threads looking on another CPU meanwhile would
    /// only compete with the hashing thread let loose there.
    fn busy(&self) {
        // With --poll-us 0 no thread looks: a nudged one would only go back to sleep.
        if self.poll.is_zero() {
            return;
        }
        if self.activity.found(self.poll) {
            self.queues
                .iter()
                .filter(|q| !Arc::ptr_eq(q, &self.threads))
                .for_each(|q| q.nudge());
        }
    }
}

/// The reply side of an entry: the body goes into the entry's payload, the out header into
/// its header. Dropped unanswered, it answers EIO (a ring entry must always be committed
/// with an answer, or the kernel loses the request).
struct UringSink {
    entry: Option<EntryPtrs>,
}

impl UringSink {
    fn answer(&mut self, unique: u64, error: i32, len: usize) {
        let Some(entry) = self.entry.take() else {
            return;
        };
        let len = len.min(entry.payload_size);
        let out = OutHeader {
            len: (16 + len) as u32,
            error: -error,
            unique,
        };
        // SAFETY: this thread holds the entry until it commits it; the header is live
        // QueueMem memory.
        let header = unsafe { &mut *entry.header };
        header.in_out.fill(0);
        header.in_out[..16].copy_from_slice(out.as_bytes());
        header.ring_ent_in_out.payload_sz = len as u32;
    }
}

impl Sink for UringSink {
    fn body(&mut self) -> &mut [u8] {
        match &self.entry {
            // SAFETY: as in `answer`; the request's input was copied out before the
            // handler ran, so the payload is free for the reply.
            Some(entry) => unsafe {
                std::slice::from_raw_parts_mut(entry.payload, entry.payload_size)
            },
            None => &mut [],
        }
    }

    fn send(&mut self, unique: u64, error: i32, len: usize) {
        self.answer(unique, error, len)
    }
}

impl Drop for UringSink {
    fn drop(&mut self) {
        if let Some(entry) = &self.entry {
            // SAFETY: as in `answer`.
            let unique = unsafe { (*entry.header).ring_ent_in_out.commit_id };
            self.answer(unique, libc::EIO, 0);
        }
    }
}

/// Where a request is served: the queue (for the stats) and the thread among its own.
struct Served<'a> {
    qid: usize,
    stats: &'a Stats,
    threads: &'a QueueThreads,
    index: usize,
}

/// Copies the request out of the entry (the reply overwrites the payload), then serves it
/// (after `small`, unless it is big I/O).
fn serve_entry<F: Filesystem>(
    fs: &F,
    entry: EntryPtrs,
    at: Served,
    input: &mut Vec<u8>,
    small: impl FnOnce(),
) {
    // SAFETY: this thread holds the entry; the kernel finished writing it before the CQE.
    let header: UringReqHeader = unsafe { entry.header.read() };
    let used = (header.ring_ent_in_out.payload_sz as usize).min(entry.payload_size);
    input.clear();
    // SAFETY: used <= payload_size, the payload's length; held as above.
    input.extend_from_slice(unsafe { std::slice::from_raw_parts(entry.payload, used) });
    let raw = split_uring(&header, input);
    let (opcode, unique) = match &raw {
        Ok(r) => (r.header.opcode, r.header.unique),
        Err(_) => (0, header.ring_ent_in_out.commit_id),
    };
    at.stats.count_queue(at.qid, opcode);
    let big = raw.as_ref().is_ok_and(is_big_io);
    if big {
        at.threads.begin_big(at.index);
    } else {
        small();
    }
    let mut sink = UringSink { entry: Some(entry) };
    serve(fs, raw, unique, &mut sink);
}

/// A READ or WRITE of at least [`BIG_IO`] bytes (both carry the size at the same offset).
fn is_big_io(raw: &Raw) -> bool {
    use crate::abi::op;
    matches!(raw.header.opcode, op::READ | op::WRITE)
        && raw
            .op_in
            .get(16..20)
            .is_some_and(|size| u32::from_le_bytes(size.try_into().unwrap_or_default()) >= BIG_IO)
}
