//! Request counters, per channel a request came on: /dev/fuse, and each io_uring queue.
//! They prove which transport served a mount (a uring mount's lookups and reads land on
//! its queues; FORGET and INTERRUPT always come on /dev/fuse) and where.

use crate::abi::{self, op};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

type Row = Box<[AtomicU64]>;

fn row() -> Row {
    (0..op::COUNTED).map(|_| AtomicU64::new(0)).collect()
}

/// Counts requests by opcode, for /dev/fuse and for each ring queue.
#[derive(Debug)]
pub struct Stats {
    dev: Row,
    queues: Box<[Row]>,
}

impl Stats {
    pub(crate) fn new(queues: usize) -> Stats {
        Stats {
            dev: row(),
            queues: (0..queues).map(|_| row()).collect(),
        }
    }

    fn slot(opcode: u32) -> usize {
        (opcode as usize).min(op::COUNTED - 1)
    }

    pub(crate) fn count_dev(&self, opcode: u32) {
        self.dev[Self::slot(opcode)].fetch_add(1, Relaxed);
    }

    pub(crate) fn count_queue(&self, qid: usize, opcode: u32) {
        if let Some(q) = self.queues.get(qid) {
            q[Self::slot(opcode)].fetch_add(1, Relaxed);
        }
    }

    /// Requests that came on /dev/fuse.
    pub fn dev_requests(&self) -> u64 {
        self.dev.iter().map(|c| c.load(Relaxed)).sum()
    }

    /// Requests each ring queue served (empty for a /dev/fuse session).
    pub fn queue_requests(&self) -> Vec<u64> {
        self.queues
            .iter()
            .map(|q| q.iter().map(|c| c.load(Relaxed)).sum())
            .collect()
    }

    /// How many `opcode` requests came on /dev/fuse and on each queue.
    pub fn by_opcode(&self, opcode: u32) -> (u64, Vec<u64>) {
        let s = Self::slot(opcode);
        (
            self.dev[s].load(Relaxed),
            self.queues.iter().map(|q| q[s].load(Relaxed)).collect(),
        )
    }
}

/// One line per channel: `dev: LOOKUP=3 GETATTR=1`, `q0: ...`.
impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let line = |f: &mut fmt::Formatter<'_>, label: &str, row: &Row| {
            write!(f, "{label}:")?;
            for (opcode, c) in row.iter().enumerate() {
                let n = c.load(Relaxed);
                if n > 0 {
                    write!(f, " {}={n}", abi::op_name(opcode as u32))?;
                }
            }
            writeln!(f)
        };
        line(f, "dev", &self.dev)?;
        for (q, r) in self.queues.iter().enumerate() {
            line(f, &format!("q{q}"), r)?;
        }
        Ok(())
    }
}
