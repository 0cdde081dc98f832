//! fusewire: verilay's FUSE request layer: typed [`Request`]s decoded, typed [`Reply`]s
//! encoded, INIT negotiated, a /dev/fuse descriptor served over read/write (a cloned
//! descriptor per worker) or io_uring (`uring`). Decoding and replying know nothing of the
//! transport: one [`Filesystem`] serves both; [`Stats`] say which carried each request.

pub mod abi;
mod affinity;
mod block_cpu;
mod channel;
mod decode;
mod dev;
mod dispatch;
mod event;
mod init;
mod reply;
mod request;
mod ring_mem;
mod session;
mod spawn;
mod spin;
mod split;
mod stats;
mod uring;

pub use abi::Attr;
pub use channel::{Backing, Channel};
pub use decode::decode;
pub use dispatch::{Context, Filesystem};
pub use init::{negotiate, InitError, Negotiated, Wants};
pub use reply::{dirent_size, dirent_type, DirEntry, DirReply, Entry, Open, Reply, Sink};
pub use request::{Caller, Request, SetAttr, SetTime};
pub use session::{
    Chosen, Config, Session, StartError, Stopper, Transport, DEFAULT_POLL, MAX_POLL, MIN_PER_QUEUE,
};
pub use split::{split_dev, split_uring, DecodeError, Raw};
pub use stats::Stats;
pub use uring::possible_cpus;
