//! The workers behind the io_uring queues: a queue thread hands each request (its ring
//! entry) to the pool, so a handler that blocks (a remote fetch, hashing) stalls neither
//! its CPU's queue nor the other requests; the worker writes the reply into the entry and
//! hands it back to the owning queue, which commits it.

use crate::abi::{OutHeader, UringReqHeader};
use crate::dispatch::{serve, Filesystem};
use crate::event::EventFd;
use crate::reply::Sink;
use crate::ring_mem::{EntryPtrs, QueueMem};
use crate::split::split_uring;
use crate::stats::Stats;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use zerocopy::IntoBytes;

/// Entries a queue's workers have answered, waiting to be committed by the queue thread.
pub(crate) struct Completions {
    done: Mutex<Vec<usize>>,
    wake: EventFd,
}

impl Completions {
    pub(crate) fn new() -> std::io::Result<Completions> {
        Ok(Completions {
            done: Mutex::new(Vec::new()),
            wake: EventFd::new()?,
        })
    }

    /// An answered entry; `quiet`: answered on the queue's own thread, which looks for it
    /// without being woken.
    fn push(&self, idx: usize, quiet: bool) {
        self.done
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(idx);
        if !quiet {
            self.wake.signal();
        }
    }

    /// Takes the answered entries.
    pub(crate) fn take(&self, into: &mut Vec<usize>) {
        into.append(&mut self.done.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// Wakes the queue thread without an answer (shutdown).
    pub(crate) fn wake(&self) {
        self.wake.signal();
    }

    pub(crate) fn eventfd(&self) -> &EventFd {
        &self.wake
    }
}

/// A ring entry holding a request, owned by whoever holds this until it is answered.
pub(crate) struct InFlight {
    pub(crate) qid: usize,
    pub(crate) idx: usize,
    pub(crate) entry: EntryPtrs,
    /// Keeps the entry's memory alive, whatever the queue thread does meanwhile (held,
    /// never read).
    #[allow(dead_code)]
    pub(crate) mem: Arc<QueueMem>,
    pub(crate) done: Arc<Completions>,
    /// Served on the queue's own thread (no wake-up needed when answered).
    pub(crate) quiet: bool,
}

// SAFETY: an InFlight is created once per request the kernel handed to the queue (one CQE)
// and moved, never copied, to one worker: only its holder touches the entry's memory
// until it goes back through `Completions`.
unsafe impl Send for InFlight {}

/// The reply side of an entry: the body goes into the entry's payload, the out header into
/// its header, and the entry back to its queue. Dropped unanswered, it answers EIO (a ring
/// entry must always be committed, or the kernel loses it).
struct UringSink {
    job: Option<InFlight>,
}

impl UringSink {
    fn answer(&mut self, unique: u64, error: i32, len: usize) {
        let Some(job) = self.job.take() else { return };
        let len = len.min(job.entry.payload_size);
        let out = OutHeader {
            len: (16 + len) as u32,
            error: -error,
            unique,
        };
        // SAFETY: this worker holds the entry (see InFlight); the header is live memory
        // of QueueMem, kept alive by job.mem.
        let header = unsafe { &mut *job.entry.header };
        header.in_out.fill(0);
        header.in_out[..16].copy_from_slice(out.as_bytes());
        header.ring_ent_in_out.payload_sz = len as u32;
        job.done.push(job.idx, job.quiet);
    }
}

impl Sink for UringSink {
    fn body(&mut self) -> &mut [u8] {
        match &self.job {
            // SAFETY: as in `answer`; the request's input was copied out before the
            // handler ran, so the payload is free for the reply.
            Some(job) => unsafe {
                std::slice::from_raw_parts_mut(job.entry.payload, job.entry.payload_size)
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
        if let Some(job) = &self.job {
            // SAFETY: as in `answer`.
            let unique = unsafe { (*job.entry.header).ring_ent_in_out.commit_id };
            self.answer(unique, libc::EIO, 0);
        }
    }
}

/// One worker: takes entries until every queue has gone.
/// `input` holds a copy of each request (as large as the largest, made before the thread).
pub(crate) fn worker<F: Filesystem>(
    fs: &F,
    jobs: &Mutex<Receiver<InFlight>>,
    stats: &Stats,
    input: &mut Vec<u8>,
) {
    loop {
        let job = match jobs.lock().unwrap_or_else(|p| p.into_inner()).recv() {
            Ok(job) => job,
            Err(_) => return,
        };
        serve_entry(fs, job, stats, input);
    }
}

/// Copies the request out of the entry (the reply overwrites the payload), then serves it.
pub(crate) fn serve_entry<F: Filesystem>(
    fs: &F,
    job: InFlight,
    stats: &Stats,
    input: &mut Vec<u8>,
) {
    // SAFETY: this worker holds the entry; the kernel finished writing it before the CQE.
    let header: UringReqHeader = unsafe { job.entry.header.read() };
    let used = (header.ring_ent_in_out.payload_sz as usize).min(job.entry.payload_size);
    input.clear();
    // SAFETY: used <= payload_size, the payload's length; held as above.
    input.extend_from_slice(unsafe { std::slice::from_raw_parts(job.entry.payload, used) });
    let raw = split_uring(&header, input);
    let (opcode, unique) = match &raw {
        Ok(r) => (r.header.opcode, r.header.unique),
        Err(_) => (0, header.ring_ent_in_out.commit_id),
    };
    stats.count_queue(job.qid, opcode);
    if !job.quiet {
        stats.count_pooled(opcode);
    }
    let mut sink = UringSink { job: Some(job) };
    serve(fs, raw, unique, &mut sink);
}
