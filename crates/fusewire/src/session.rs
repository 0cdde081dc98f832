//! A served mount: INIT on the caller's mounted /dev/fuse descriptor, the transport chosen
//! from what the kernel offers, then worker threads until the mount goes away
//! ([`Session::join`]) or the caller stops it ([`Stopper::stop`]).

use crate::abi::{self, init};
use crate::affinity::QueueThreads;
use crate::channel::Channel;
use crate::decode::decode;
use crate::dev::{self, Got};
use crate::dispatch::Filesystem;
use crate::event::EventFd;
use crate::init::{negotiate, InitError, Negotiated, Wants};
use crate::request::Request;
use crate::ring_mem::QueueMem;
use crate::spawn;
use crate::spin::Activity;
use crate::split::split_dev;
use crate::stats::Stats;
use crate::uring::{possible_cpus, Server};
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use zerocopy::IntoBytes;

/// How requests are to reach the filesystem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// read(2)/write(2) on /dev/fuse, each worker on its own cloned descriptor.
    Dev,
    /// FUSE over io_uring, or an error if the kernel does not take it.
    Uring,
    /// io_uring when INIT offers it and every queue registers, else /dev/fuse.
    Auto,
}

impl Transport {
    /// Each transport's name, as options (`transport=`) and flags spell it.
    pub const NAMES: [(&'static str, Transport); 3] = [
        ("auto", Transport::Auto),
        ("uring", Transport::Uring),
        ("dev", Transport::Dev),
    ];

    /// The transport of this name (`NAMES`).
    pub fn parse(name: &str) -> Result<Transport, String> {
        Self::NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, t)| *t)
            .ok_or_else(|| format!("{name:?}: not one of auto, uring, dev"))
    }

    /// This transport's name.
    pub fn name(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(_, t)| *t == self)
            .map_or("auto", |(n, _)| n)
    }
}

/// The transport a session serves with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chosen {
    /// /dev/fuse.
    Dev {
        /// Serving threads, each on its own cloned descriptor.
        workers: usize,
    },
    /// io_uring.
    Uring {
        /// Ring queues, one per possible CPU.
        queues: usize,
        /// Serving threads per queue, each with one entry of it.
        per_queue: usize,
    },
}

impl fmt::Display for Chosen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Chosen::Dev { workers } => write!(f, "/dev/fuse ({workers} workers)"),
            Chosen::Uring { queues, per_queue } => {
                write!(f, "io_uring ({queues} queues x {per_queue} threads)")
            }
        }
    }
}

/// Serving threads each io_uring queue gets at least: a reader's readahead sends a CPU's
/// queue two READs at once, and one thread would serve them one after the other.
pub const MIN_PER_QUEUE: usize = 2;

/// The default for [`Config::poll`] over io_uring: a caller that sends its next request
/// within this long (a tool walking a tree: a few µs) finds a thread still looking for it.
/// Over /dev/fuse the default is not to look: poll(2) wakes every worker, the one on the
/// caller's CPU gets there first, while a worker looking on another CPU would take the
/// caller's requests and wake it across CPUs (slower creates, untars and walks).
pub const DEFAULT_POLL: Duration = Duration::from_micros(50);

/// The most [`Config::poll`] may be.
pub const MAX_POLL: Duration = Duration::from_millis(10);

/// How to serve.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// How requests are to arrive.
    pub transport: Transport,
    /// Threads that run the filesystem's handlers: over io_uring, spread over the CPU
    /// queues, each getting its share rounded up, and at least [`MIN_PER_QUEUE`].
    pub workers: usize,
    /// How long a thread that has served a request keeps looking for the next one
    /// (yielding its CPU to anyone who wants it) before it sleeps; over io_uring, how long
    /// after any thread's last request (see `spin`). `None`: [`DEFAULT_POLL`] over
    /// io_uring, 0 over /dev/fuse.
    pub poll: Option<Duration>,
    /// What the filesystem asks for in INIT.
    pub wants: Wants,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            transport: Transport::Auto,
            workers: 4,
            poll: None,
            wants: Wants::default(),
        }
    }
}

/// Why a session did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Opening, reading or writing /dev/fuse failed.
    #[error("/dev/fuse: {0}")]
    Io(io::Error),
    /// The kernel's INIT could not be answered.
    #[error("FUSE_INIT: {0}")]
    Init(InitError),
    /// `Transport::Uring` was asked for and the kernel did not take it.
    #[error("FUSE over io_uring: {0}")]
    UringUnavailable(String),
    /// INIT was answered, but the worker threads (or their descriptors) could not all be
    /// made.
    #[error("starting {count} workers: {error}")]
    Workers {
        /// Threads asked for.
        count: usize,
        /// The first failure.
        error: io::Error,
    },
}

impl From<io::Error> for StartError {
    fn from(e: io::Error) -> StartError {
        StartError::Io(e)
    }
}

/// Why the io_uring queues did not start.
enum UringFailure {
    /// The kernel refused a queue's REGISTER (it then serves on /dev/fuse).
    Refused(io::Error),
    /// A thread, or its memory, could not be made.
    Threads(io::Error),
}

/// Stops a session from any thread: its threads return once their current requests are
/// answered. The mount stays; unmounting it is the caller's (requests sent meanwhile wait
/// for that).
#[derive(Clone)]
pub struct Stopper {
    stop: Arc<AtomicBool>,
    dev_stop: Arc<EventFd>,
    /// The io_uring queues, whose threads each read a wake eventfd of their own.
    uring_queues: Vec<Arc<QueueThreads>>,
}

impl Stopper {
    /// Asks every thread to end and wakes those waiting.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.dev_stop.signal();
        for queue in &self.uring_queues {
            queue.wake_all();
        }
    }
}

/// A mount being served.
pub struct Session {
    chosen: Chosen,
    /// What `Config::poll` came to for the transport chosen.
    poll: Duration,
    negotiated: Negotiated,
    channel: Channel,
    stats: Arc<Stats>,
    stopper: Stopper,
    threads: Vec<JoinHandle<io::Result<()>>>,
    /// Ring memory, freed only after every thread that the kernel could write it for ended.
    queue_mem: Vec<Arc<QueueMem>>,
}

impl Session {
    /// Answers INIT on `fd` (already mounted) and starts serving `fs`.
    pub fn start<F: Filesystem>(
        fd: OwnedFd,
        mut fs: F,
        config: &Config,
    ) -> Result<Session, StartError> {
        let dev_stop = Arc::new(EventFd::new()?);
        let (init_unique, major, minor, readahead, offered) = read_init(&fd, &dev_stop)?;
        let offers_uring = offered & init::OVER_IO_URING != 0;
        let want_uring = config.transport != Transport::Dev && offers_uring;
        if config.transport == Transport::Uring && !offers_uring {
            // Refused INIT: the kernel fails the mount's requests instead of queueing them
            // for a daemon that will not serve.
            write_reply(&fd, init_unique, libc::EPROTO, &[])?;
            return Err(StartError::UringUnavailable(
                "FUSE_INIT did not offer it (is /sys/module/fuse/parameters/enable_uring Y?)"
                    .into(),
            ));
        }
        let negotiated =
            match negotiate(major, minor, readahead, offered, &config.wants, want_uring) {
                Ok((out, negotiated)) => {
                    write_reply(&fd, init_unique, 0, out.as_bytes())?;
                    negotiated
                }
                Err(e) => {
                    // The kernel then fails every request of the mount instead of waiting.
                    write_reply(&fd, init_unique, libc::EPROTO, &[])?;
                    return Err(StartError::Init(e));
                }
            };
        let channel = Channel::new(Arc::new(fd));
        fs.init(&negotiated, &channel);
        let fs = Arc::new(fs);
        let stop = Arc::new(AtomicBool::new(false));
        let stopper = Stopper {
            stop,
            dev_stop,
            uring_queues: Vec::new(),
        };
        let mut session = Session {
            chosen: Chosen::Dev { workers: 0 },
            poll: Duration::ZERO,
            negotiated,
            channel,
            stats: Arc::new(Stats::new(0)),
            stopper,
            threads: Vec::new(),
            queue_mem: Vec::new(),
        };
        if want_uring {
            match session.start_uring(&fs, config) {
                Ok(()) => return Ok(session),
                // Unmounted while starting: the kernel refuses nothing then.
                Err(UringFailure::Refused(e)) if e.raw_os_error() == Some(libc::ENOTCONN) => {
                    return Err(StartError::Io(io::Error::new(
                        e.kind(),
                        "the mount went away before the daemon served it (unmounted while starting?)",
                    )))
                }
                Err(UringFailure::Refused(e)) if config.transport == Transport::Uring => {
                    return Err(StartError::UringUnavailable(format!(
                        "REGISTER refused: {e}"
                    )))
                }
                Err(UringFailure::Threads(error)) if config.transport == Transport::Uring => {
                    let count = config.workers.max(1);
                    return Err(StartError::Workers { count, error });
                }
                // A refused REGISTER made the kernel fall back to /dev/fuse; threads that
                // could not start there may start as /dev/fuse workers.
                Err(_) => {}
            }
        }
        session
            .start_dev(&fs, config)
            .map_err(|error| StartError::Workers {
                count: config.workers.max(1),
                error,
            })?;
        Ok(session)
    }

    fn start_dev<F: Filesystem>(&mut self, fs: &Arc<F>, config: &Config) -> io::Result<()> {
        let workers = config.workers.max(1);
        self.stats = Arc::new(Stats::new(0));
        self.poll = config.poll.unwrap_or(Duration::ZERO);
        for i in 0..workers {
            self.spawn_dev_worker(fs, Some((i, workers)), self.poll)?;
        }
        self.chosen = Chosen::Dev { workers };
        Ok(())
    }

    /// Starts /dev/fuse worker `index` = (i, of how many) (`None`: the reader of FORGET
    /// and INTERRUPT beside the rings, which rests anywhere).
    fn spawn_dev_worker<F: Filesystem>(
        &mut self,
        fs: &Arc<F>,
        index: Option<(usize, usize)>,
        poll: Duration,
    ) -> io::Result<()> {
        let name = index.map_or("fuse-dev-forget".into(), |(i, _)| format!("fuse-dev-{i}"));
        let fd = dev::worker_fd(self.channel.fd())?;
        let (fs, stats, stop, stopping) = (
            fs.clone(),
            self.stats.clone(),
            self.stopper.dev_stop.clone(),
            self.stopper.stop.clone(),
        );
        let ext = self.negotiated.has(init::SETXATTR_EXT);
        let bufsize = self.negotiated.dev_buffer_size();
        let buffers = (dev::buffer(bufsize)?, dev::buffer(bufsize)?);
        let t = spawn::spawn(name, move || {
            if let Some((i, workers)) = index {
                crate::affinity::pin_worker(i, workers);
            }
            dev::worker(fd, &*fs, ext, buffers, &stats, (&stop, &stopping), poll)
        })?;
        self.threads.push(t);
        Ok(())
    }

    /// Serving threads for every possible CPU's queue (see `uring`), and a /dev/fuse
    /// reader for FORGET and INTERRUPT (which never come on the rings). Every queue must
    /// register: the kernel starts the rings only once each queue has entries. On failure
    /// every thread started is stopped and joined (none may outlive its ring memory), and
    /// the session can still start /dev/fuse workers.
    fn start_uring<F: Filesystem>(
        &mut self,
        fs: &Arc<F>,
        config: &Config,
    ) -> Result<(), UringFailure> {
        self.poll = config.poll.unwrap_or(DEFAULT_POLL);
        let queues = possible_cpus().map_err(UringFailure::Threads)?;
        let per_queue = config.workers.div_ceil(queues).max(MIN_PER_QUEUE);
        let stats = Arc::new(Stats::new(queues));
        // Before any request is served: see `Channel::store`.
        self.channel.limit_stores(per_queue - 1);
        let mut threads = Vec::new();
        let mut stopper = self.stopper.clone();
        let started = self.spawn_uring(fs, per_queue, &stats, &mut threads, &mut stopper);
        let failure = match started {
            Err(e) => Some(UringFailure::Threads(e)),
            Ok(registered) => (0..queues * per_queue)
                .filter_map(|_| registered.recv().ok())
                .find_map(Result::err)
                .map(UringFailure::Refused),
        };
        if let Some(f) = failure {
            stopper.stop();
            threads.into_iter().for_each(|t| drop(t.join()));
            // The stop was for the rings only: /dev/fuse workers may still have to run.
            self.stopper.stop.store(false, Ordering::Release);
            self.stopper.dev_stop = Arc::new(EventFd::new().map_err(UringFailure::Threads)?);
            self.channel.limit_stores(usize::MAX);
            return Err(f);
        }
        self.stopper = stopper;
        self.stats = stats;
        self.threads = threads;
        // FORGET and INTERRUPT: nobody waits for the first, the second is rare.
        self.spawn_dev_worker(fs, None, Duration::ZERO)
            .map_err(UringFailure::Threads)?;
        self.chosen = Chosen::Uring { queues, per_queue };
        Ok(())
    }

    /// Starts `per_queue` serving threads for each queue (into `threads`, the queues, whose
    /// wake eventfds stop them, in `stopper`): the channel on which each says whether it
    /// registered.
    fn spawn_uring<F: Filesystem>(
        &mut self,
        fs: &Arc<F>,
        per_queue: usize,
        stats: &Arc<Stats>,
        threads: &mut Vec<JoinHandle<io::Result<()>>>,
        stopper: &mut Stopper,
    ) -> io::Result<mpsc::Receiver<crate::uring::Registered>> {
        let activity = Arc::new(Activity::new());
        let queues = (0..stats.queue_requests().len())
            .map(|qid| QueueThreads::new(qid, per_queue).map(Arc::new))
            .collect::<io::Result<Vec<_>>>()?;
        let queues: Arc<[Arc<QueueThreads>]> = queues.into();
        // Stoppable before any thread starts, so a failure midway stops those started.
        stopper.uring_queues = queues.to_vec();
        let (reg_tx, reg_rx) = mpsc::channel();
        let payload = self.negotiated.ring_payload_size();
        for (qid, queue_threads) in queues.iter().enumerate() {
            for i in 0..per_queue {
                let mem = Arc::new(QueueMem::new(1, payload)?);
                self.queue_mem.push(mem.clone());
                let server = Server {
                    fs: fs.clone(),
                    stats: stats.clone(),
                    fd: self.channel.fd().as_raw_fd(),
                    qid: u16::try_from(qid).map_err(|_| io::Error::other("too many CPUs"))?,
                    mem,
                    stopping: self.stopper.stop.clone(),
                    poll: self.poll,
                    activity: activity.clone(),
                    threads: queue_threads.clone(),
                    queues: queues.clone(),
                    index: i,
                    input: dev::buffer(payload)?,
                };
                let reg_tx = reg_tx.clone();
                let name = format!("fuse-ring-{qid}-{i}");
                threads.push(spawn::spawn(name, move || server.run(reg_tx))?);
            }
        }
        Ok(reg_rx)
    }

    /// The transport serving.
    pub fn transport(&self) -> Chosen {
        self.chosen
    }

    /// How long the serving threads look for the next request before they sleep.
    pub fn poll(&self) -> Duration {
        self.poll
    }

    /// What INIT agreed on.
    pub fn negotiated(&self) -> &Negotiated {
        &self.negotiated
    }

    /// Notifications and passthrough backing files.
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// Requests counted per /dev/fuse and per ring queue.
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// A handle that stops the session from any thread.
    pub fn stopper(&self) -> Stopper {
        self.stopper.clone()
    }

    /// Waits until every thread has ended: the mount went away, or [`Stopper::stop`].
    /// The first thread error, if any.
    pub fn join(mut self) -> io::Result<()> {
        let mut first = Ok(());
        for t in self.threads.drain(..) {
            let r = t
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("a session thread panicked")));
            if first.is_ok() {
                first = r;
            }
        }
        self.queue_mem.clear();
        first
    }
}

/// Reads the first request, which must be INIT: (unique, major, minor, readahead, flags).
fn read_init(fd: &OwnedFd, stop: &EventFd) -> Result<(u64, u32, u32, u32, u64), StartError> {
    let mut buf = vec![0u8; abi::MIN_READ_BUFFER.max(64 << 10)];
    let (nobody, not_yet) = (Activity::new(), AtomicBool::new(false));
    let stop = (stop, &not_yet);
    let n = match dev::next_request(fd.as_raw_fd(), stop, &mut buf, Duration::ZERO, &nobody)? {
        Got::Request(n) => n,
        Got::Gone | Got::Stopped => return Err(io::Error::from_raw_os_error(libc::ENODEV).into()),
    };
    let raw =
        split_dev(&buf[..n], false).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    match decode(&raw) {
        Ok(Request::Init {
            major,
            minor,
            max_readahead,
            flags,
        }) => Ok((raw.header.unique, major, minor, max_readahead, flags)),
        _ => Err(StartError::Init(InitError::NotInit {
            opcode: raw.header.opcode,
        })),
    }
}

fn write_reply(fd: &OwnedFd, unique: u64, error: i32, body: &[u8]) -> io::Result<()> {
    let header = abi::OutHeader {
        len: (16 + body.len()) as u32,
        error: -error,
        unique,
    };
    crate::channel::write_all_parts(fd.as_raw_fd(), &[header.as_bytes(), body])
}

impl Drop for Session {
    /// A session dropped without [`Session::join`] stops its threads and waits for them,
    /// so no thread outlives the ring memory it uses.
    fn drop(&mut self) {
        if self.threads.is_empty() {
            return;
        }
        self.stopper.stop();
        self.threads.drain(..).for_each(|t| drop(t.join()));
    }
}
