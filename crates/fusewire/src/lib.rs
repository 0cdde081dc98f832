//! fusewire: verilay's FUSE request layer. It decodes the kernel's requests into typed
//! [`Request`]s, encodes typed [`Reply`]s, negotiates INIT and serves a mounted /dev/fuse
//! descriptor over either transport the kernel has: read/write on /dev/fuse (one cloned
//! descriptor per worker) or FUSE over io_uring (for each possible CPU's queue a few
//! threads, each with a ring holding one entry). Decoding and replying know nothing of the transport, so one filesystem
//! ([`Filesystem`]) serves both, and [`Stats`] say which one carried each request.

pub mod abi;
mod affinity;
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
