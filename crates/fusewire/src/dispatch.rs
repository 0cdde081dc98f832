//! The filesystem a session serves, and the one path every request takes to it whatever
//! the transport: decode, then a [`Reply`] for requests that want one.

use crate::channel::Channel;
use crate::decode::decode;
use crate::init::Negotiated;
use crate::reply::{Reply, Sink};
use crate::request::{Caller, Request};
use crate::split::{DecodeError, Raw};

/// A request's sender and id.
#[derive(Clone, Copy, Debug)]
pub struct Context {
    /// The request's id.
    pub unique: u64,
    /// Who sent it.
    pub caller: Caller,
}

/// What a session serves. Called from many threads at once.
#[allow(unused_variables)]
pub trait Filesystem: Send + Sync + 'static {
    /// Once, after INIT is agreed and before any other request: what was granted, and the
    /// channel for notifications and passthrough backing files.
    fn init(&mut self, negotiated: &Negotiated, channel: &Channel) {}
    /// Every request that wants a reply (all but FORGET, BATCH_FORGET and INTERRUPT).
    fn request(&self, ctx: &Context, req: Request<'_>, reply: Reply<'_>);
    /// The kernel dropped `nlookup` references to `ino` (FORGET, BATCH_FORGET).
    fn forget(&self, ino: u64, nlookup: u64) {}
    /// The kernel asks to abandon request `unique` (if it still runs).
    fn interrupt(&self, unique: u64) {}
}

/// Serves one split request: decode errors get their errno, FORGET and INTERRUPT no reply.
/// `unique` is the request's id when a malformed buffer still had one (0: none, the kernel
/// never uses it), for the error reply.
pub(crate) fn serve<F: Filesystem>(
    fs: &F,
    raw: Result<Raw<'_>, DecodeError>,
    unique: u64,
    sink: &mut dyn Sink,
) {
    let raw = match raw {
        Ok(raw) => raw,
        Err(e) if unique != 0 => return sink.send(unique, e.errno(), 0),
        Err(_) => return,
    };
    let h = raw.header;
    let req = match decode(&raw) {
        Ok(req) => req,
        // FORGET-like requests get no reply, even malformed.
        Err(_) if no_reply(h.opcode) => return,
        Err(e) => return sink.send(h.unique, e.errno(), 0),
    };
    // A handler that panics (a bug) has answered EIO as its Reply dropped; the panic stops
    // here, so its thread goes on serving: over io_uring a thread that ended would take its
    // ring entry with it, and the caller of the request on that entry would wait forever.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        match req {
            Request::Forget { .. } | Request::BatchForget { .. } => {
                req.forgets().for_each(|(ino, n)| fs.forget(ino, n))
            }
            Request::Interrupt { unique } => fs.interrupt(unique),
            // INIT is the session's, once; a second one is a kernel bug.
            Request::Init { .. } => sink.send(h.unique, libc::EIO, 0),
            _ => {
                let caller = Caller {
                    uid: h.uid,
                    gid: h.gid,
                    pid: h.pid,
                };
                let ctx = Context {
                    unique: h.unique,
                    caller,
                };
                let reply = Reply::new(h.unique, req.reply_limit(), sink);
                fs.request(&ctx, req, reply)
            }
        }
    }));
}

fn no_reply(opcode: u32) -> bool {
    use crate::abi::op;
    matches!(opcode, op::FORGET | op::BATCH_FORGET | op::INTERRUPT)
}
