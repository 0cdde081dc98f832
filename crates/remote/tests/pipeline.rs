//! The fetch pipeline against a range server of its own: chunks handed over as they arrive,
//! several ranges in flight ahead of a sequential reader, sparse readers fetching what they
//! read, memory held to its bound.

use remote::RemoteSource;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use verity::source::ByteSource;

/// What the server saw.
#[derive(Default)]
struct Seen {
    requests: AtomicU64,
    bytes: AtomicU64,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
}

/// How the server answers a range: after `delay`, and, for a range of at least
/// `stall_from` bytes, its first half, then `stall`, then the rest; with `extra`, one
/// byte more than asked (its Content-Length says so); with `shift: (at, by)`, a range
/// starting at byte `at` gets the bytes `by` further on (its Content-Range says so); with
/// `flip: (at, from)`, byte `at` comes wrong in ranges of at least `from` bytes; with
/// `cut_from`, a range of at least that many bytes ends halfway, the connection closed.
#[derive(Clone, Copy, Default)]
struct Pace {
    delay: Duration,
    stall_from: u64,
    stall: Duration,
    extra: bool,
    shift: Option<(u64, u64)>,
    flip: Option<(u64, u64)>,
    cut_from: Option<u64>,
}

/// A server of `data` at `http://127.0.0.1:PORT/img` (HEAD, and GET with one range),
/// HTTP/1.1 with keep-alive, a thread per connection.
fn serve(data: Arc<Vec<u8>>, pace: Pace) -> (String, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/img", listener.local_addr().unwrap());
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let (data, seen) = (data.clone(), s.clone());
            std::thread::spawn(move || {
                let _ = connection(conn, &data, &seen, pace);
            });
        }
    });
    (url, seen)
}

fn connection(conn: TcpStream, data: &[u8], seen: &Seen, pace: Pace) -> std::io::Result<()> {
    let mut out = conn.try_clone()?;
    let mut lines = BufReader::new(conn);
    loop {
        let mut first = String::new();
        if lines.read_line(&mut first)? == 0 {
            return Ok(());
        }
        let mut range = None;
        loop {
            let mut h = String::new();
            lines.read_line(&mut h)?;
            if h.trim().is_empty() {
                break;
            }
            if let Some(v) = h.to_ascii_lowercase().strip_prefix("range: bytes=") {
                let (a, b) = v.trim().split_once('-').unwrap();
                range = Some((a.parse::<u64>().unwrap(), b.parse::<u64>().unwrap()));
            }
        }
        let len = data.len() as u64;
        if first.starts_with("HEAD") {
            write!(out, "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n\r\n")?;
            continue;
        }
        let (a, b) = range.expect("every GET asks for a range");
        let b = if pace.extra { b + 1 } else { b };
        let (a, b) = match pace.shift {
            Some((at, by)) if at == a => (a + by, b + by),
            _ => (a, b),
        };
        let mut body = data[a as usize..=b.min(len - 1) as usize].to_vec();
        if let Some((at, from)) = pace.flip {
            if (a..a + body.len() as u64).contains(&at) && body.len() as u64 >= from {
                body[(at - a) as usize] ^= 1;
            }
        }
        seen.requests.fetch_add(1, Ordering::SeqCst);
        let now = seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        seen.max_in_flight.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(pace.delay);
        write!(
            out,
            "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\nContent-Range: bytes {a}-{}/{len}\r\n\r\n",
            body.len(),
            a + body.len() as u64 - 1
        )?;
        let halved = pace
            .cut_from
            .or((pace.stall_from > 0).then_some(pace.stall_from));
        let half = if halved.is_some_and(|from| body.len() as u64 >= from) {
            body.len() / 2
        } else {
            body.len()
        };
        out.write_all(&body[..half])?;
        out.flush()?;
        if pace.cut_from.is_some_and(|c| body.len() as u64 >= c) {
            seen.in_flight.fetch_sub(1, Ordering::SeqCst);
            return Ok(());
        }
        if half < body.len() {
            std::thread::sleep(pace.stall);
            out.write_all(&body[half..])?;
        }
        seen.bytes.fetch_add(body.len() as u64, Ordering::SeqCst);
        seen.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `len` bytes that never repeat a 4 KiB block.
fn data(len: usize) -> Arc<Vec<u8>> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    Arc::new(
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect(),
    )
}

fn open(url: &str) -> Arc<RemoteSource> {
    match RemoteSource::open(url, false, Duration::from_secs(20), None) {
        Ok(o) => o.source.shared(),
        Err(e) => panic!("{url}: {e}"),
    }
}

#[test]
fn a_chunk_is_handed_to_its_reader_before_the_rest_of_its_range_arrives() {
    let stall = Duration::from_secs(3);
    let bytes = data(8 << 20);
    let (url, _) = serve(
        bytes.clone(),
        Pace {
            stall_from: 1 << 20,
            stall,
            ..Pace::default()
        },
    );
    let src = open(&url);
    // One reader asks for 2 MiB: one request, whose second half comes after the stall.
    let big = {
        let src = src.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 2 << 20];
            let t = Instant::now();
            src.read_exact_at(&mut buf, 0).unwrap();
            (buf, t.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    // Another wants its first 4 KiB, which came before the stall.
    let t = Instant::now();
    let mut small = vec![0u8; 4096];
    src.read_exact_at(&mut small, 0).unwrap();
    let waited = t.elapsed();
    assert_eq!(small, bytes[..4096]);
    assert!(
        waited < stall / 2,
        "the first chunk waited {waited:?}, as long as its whole range ({stall:?} stall)"
    );
    let (buf, whole) = big.join().unwrap();
    assert_eq!(buf, bytes[..2 << 20]);
    assert!(whole >= stall, "the range itself came in {whole:?}");
}

#[test]
fn a_sequential_reader_keeps_several_ranges_in_flight_and_fetches_each_byte_once() {
    let len = 96 << 20;
    let bytes = data(len);
    let (url, seen) = serve(
        bytes.clone(),
        Pace {
            delay: Duration::from_millis(20),
            ..Pace::default()
        },
    );
    let src = open(&url);
    let mut buf = vec![0u8; 128 << 10];
    for at in (0..len).step_by(buf.len()) {
        src.read_exact_at(&mut buf, at as u64).unwrap();
        assert!(buf == bytes[at..at + buf.len()], "bytes at {at}");
    }
    // Readahead may still be fetching past the end of the reads: until it is done.
    let deadline = Instant::now() + Duration::from_secs(10);
    while (seen.in_flight.load(Ordering::SeqCst) > 0
        || src.counters.fetched.load(Ordering::SeqCst) != seen.bytes.load(Ordering::SeqCst))
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    let (served, most) = (
        seen.bytes.load(Ordering::SeqCst),
        seen.max_in_flight.load(Ordering::SeqCst),
    );
    assert!(
        most >= 3,
        "at most {most} ranges were in flight at once ({} requests)",
        seen.requests.load(Ordering::SeqCst)
    );
    assert!(
        served <= len as u64 + (len as u64 >> 6),
        "{served} bytes served for {len} read"
    );
    assert_eq!(src.counters.fetched.load(Ordering::SeqCst), served);
}

#[test]
fn a_sparse_reader_fetches_the_chunks_it_reads() {
    let len = 64 << 20;
    let bytes = data(len);
    let (url, seen) = serve(bytes.clone(), Pace::default());
    let src = open(&url);
    let mut buf = vec![0u8; 4096];
    // 200 reads of 4 KiB, at least 64 chunks apart: nothing sequential, nothing dense.
    let mut at = 0u64;
    for k in 0..200u64 {
        at = (at + (64 + k % 7) * 4096 * 3) % (len as u64 - 4096);
        src.read_exact_at(&mut buf, at).unwrap();
        assert!(buf == bytes[at as usize..at as usize + 4096]);
    }
    let served = seen.bytes.load(Ordering::SeqCst);
    assert!(
        served <= 200 * 2 * 4096,
        "{served} bytes served for 200 reads of 4 KiB"
    );
    assert_eq!(seen.max_in_flight.load(Ordering::SeqCst), 1);
}

#[test]
fn memory_holds_at_most_its_bound_of_fetched_chunks() {
    let len = 192 << 20;
    let bytes = data(len);
    let (url, _) = serve(bytes.clone(), Pace::default());
    let src = open(&url);
    let mut buf = vec![0u8; 1 << 20];
    let mut most = 0;
    for at in (0..len).step_by(buf.len()) {
        src.read_exact_at(&mut buf, at as u64).unwrap();
        most = most.max(src.held_bytes());
    }
    assert!(
        most <= remote::HELD_MAX + (2 * remote::AHEAD_MAX + remote::MAX_RUN) * remote::CHUNK,
        "{most} bytes held"
    );
    assert!(
        most >= 64 << 20,
        "only {most} bytes ever held: the bound is not reached"
    );
}

#[test]
fn a_range_whose_every_byte_came_is_kept_though_the_server_sent_more() {
    let bytes = data(4 << 20);
    let (url, seen) = serve(
        bytes.clone(),
        Pace {
            extra: true,
            ..Pace::default()
        },
    );
    let src = open(&url);
    let mut buf = vec![0u8; 64 << 10];
    src.read_exact_at(&mut buf, 8192).unwrap();
    assert!(buf == bytes[8192..8192 + buf.len()]);
    // No second try (for nothing: a range of no bytes), and the server is not down.
    assert_eq!(seen.requests.load(Ordering::SeqCst), 1);
    src.read_exact_at(&mut buf, 1 << 20).unwrap();
    assert!(buf == bytes[1 << 20..(1 << 20) + buf.len()]);
}

#[test]
fn a_range_answered_with_other_bytes_is_refused_by_its_content_range() {
    let bytes = data(1 << 20);
    let (url, seen) = serve(
        bytes.clone(),
        Pace {
            shift: Some((8192, 4096)),
            ..Pace::default()
        },
    );
    let src = open(&url);
    let mut buf = vec![0u8; 4096];
    let e = src
        .read_exact_at(&mut buf, 8192)
        .expect_err("the bytes after the range's, handed up as its own");
    assert!(e.to_string().contains("Content-Range"), "{e}");
    // Refused at once, not tried again, and the server is not taken for down.
    assert_eq!(seen.requests.load(Ordering::SeqCst), 1);
    src.read_exact_at(&mut buf, 64 << 10).unwrap();
    assert!(buf == bytes[64 << 10..(64 << 10) + 4096]);
}

#[test]
fn a_sequential_reader_waits_for_the_chunks_it_reads_not_for_its_whole_run() {
    // Ranges of 240 KiB or more stall for 3 s halfway. A reader going 4 KiB at a time
    // fetches its neighbourhood (up to 224 KiB), then, sequential at chunk 64, would fetch
    // a run as long as what it read (260 KiB) and wait for all of it.
    let stall = Duration::from_secs(3);
    let bytes = data(8 << 20);
    let (url, _) = serve(
        bytes.clone(),
        Pace {
            stall_from: 240 << 10,
            stall,
            ..Pace::default()
        },
    );
    let src = open(&url);
    let mut buf = vec![0u8; 4096];
    let start = Instant::now();
    for i in 0..=64u64 {
        src.read_exact_at(&mut buf, i * 4096).unwrap();
        assert!(buf == bytes[i as usize * 4096..][..4096], "chunk {i}");
    }
    let took = start.elapsed();
    assert!(
        took < stall / 2,
        "{took:?} for 65 chunks: a read waited for bytes it did not ask for"
    );
}

/// `data` sealed as an image is, followed by its verity section: the file's bytes, and
/// its digest.
fn sealed(data: &[u8]) -> (Arc<Vec<u8>>, Vec<u8>) {
    use std::io::{Read as _, Seek as _, Write as _};
    use verity::{hash_blocks, HashAlg, Params};
    let params = Params::new(HashAlg::Sha256, 4096, vec![]).unwrap();
    let mut f = tempfile::tempfile().unwrap();
    f.write_all(data).unwrap();
    let mut level0 = vec![0u8; data.len().div_ceil(4096) * 32];
    hash_blocks(&params, &params.padded_salt(), data, &mut level0);
    let digest = verity::appended::append(&f, &params, data.len() as u64, level0).unwrap();
    let mut bytes = Vec::new();
    f.rewind().unwrap();
    f.read_to_end(&mut bytes).unwrap();
    (Arc::new(bytes), digest)
}

/// A prefetch of a sealed image of `n` bytes from a server answering as `pace` says, with
/// a cache, run until it is done (within 60 s).
struct Prefetched {
    plain: Arc<Vec<u8>>,
    image_len: u64,
    seen: Arc<Seen>,
    remote: Arc<RemoteSource>,
    verified: Arc<verity::VerifiedSource<Arc<RemoteSource>>>,
    progress: Arc<remote::prefetch::Progress>,
    /// The requests it made.
    requests: u64,
    _cache: tempfile::TempDir,
}

fn prefetched(n: usize, pace: Pace) -> Prefetched {
    let plain = data(n);
    let (image, digest) = sealed(&plain);
    let (url, seen) = serve(image.clone(), pace);
    let dir = tempfile::tempdir().unwrap();
    let image_len = Vec::len(&image) as u64;
    let cache = remote::cache::Cache::open(
        dir.path(),
        &format!("sha256:{}", verity::verified::hex(&digest)),
        image_len,
        u64::MAX,
    )
    .unwrap();
    let remote = match RemoteSource::open(&url, false, Duration::from_secs(20), None) {
        Ok(o) => o.source.with_cache(cache).shared(),
        Err(e) => panic!("{url}: {e}"),
    };
    let verified = Arc::new(
        verity::VerifiedSource::open(remote.clone(), Some(&digest)).expect("the sealed image"),
    );
    verified.load_tree(u64::MAX).unwrap();
    let before = seen.requests.load(Ordering::SeqCst);
    let progress = remote::prefetch::start(remote.clone(), verified.clone()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while progress.done.load(Ordering::SeqCst) < n as u64 {
        assert!(Instant::now() < deadline, "the prefetch did not finish");
        std::thread::sleep(Duration::from_millis(20));
    }
    let requests = seen.requests.load(Ordering::SeqCst) - before;
    Prefetched {
        plain,
        image_len,
        seen,
        remote,
        verified,
        progress,
        requests,
        _cache: dir,
    }
}

impl Prefetched {
    fn served_at_most(&self, most: u64) {
        let served = self.seen.bytes.load(Ordering::SeqCst);
        let image = self.image_len;
        assert!(
            served <= most,
            "{served} bytes served for an image of {image}"
        );
    }

    /// Every byte is in the cache and reads back right without a request.
    fn all_cached(&self) {
        let n = Vec::len(&self.plain) as u64;
        assert!(self.remote.cached(0, n), "not all cached");
        let before = self.seen.requests.load(Ordering::SeqCst);
        let mut back = vec![0u8; n as usize];
        self.verified.read_exact_at(&mut back, 0).unwrap();
        assert!(back[..] == self.plain[..], "read back differs");
        assert_eq!(self.seen.requests.load(Ordering::SeqCst), before);
    }
}

#[test]
fn a_prefetch_fetches_each_byte_once_in_steps_in_flight_together_and_caches_them_all() {
    let p = prefetched(
        64 << 20,
        Pace {
            delay: Duration::from_millis(20),
            ..Pace::default()
        },
    );
    assert_eq!(p.progress.failures.load(Ordering::SeqCst), 0);
    // The whole image fits the cache: steps of 4, then 16 MiB (1, 4, 16 MiB otherwise:
    // a dozen requests).
    assert!(p.requests <= 9, "{} requests for 64 MiB", p.requests);
    let most = p.seen.max_in_flight.load(Ordering::SeqCst);
    assert!(most >= 3, "at most {most} steps in flight at once");
    p.served_at_most(p.image_len + (1 << 20));
    p.all_cached();
}

/// A link on which long requests never complete (each ends halfway): what came of each
/// is kept, so the prefetch gets through, fetching each byte about once.
#[test]
fn a_prefetch_keeps_what_came_of_a_fetch_that_failed() {
    let p = prefetched(
        8 << 20,
        Pace {
            cut_from: Some(256 << 10),
            ..Pace::default()
        },
    );
    assert!(p.progress.failures.load(Ordering::SeqCst) >= 1);
    p.served_at_most(p.image_len * 3 / 2);
    p.all_cached();
}

/// A byte that comes wrong in long ranges (a proxy's fault): its block is fetched again
/// alone and passes; the blocks around it are not fetched again.
#[test]
fn a_prefetch_fetches_a_bad_block_again_alone() {
    let at = (3 << 20) + 5000;
    let p = prefetched(
        8 << 20,
        Pace {
            flip: Some((at, 64 << 10)),
            ..Pace::default()
        },
    );
    assert_eq!(p.progress.failures.load(Ordering::SeqCst), 0);
    p.served_at_most(p.image_len + (1 << 20));
    p.all_cached();
}

/// Bytes wanted whole at once (the tree, at open) come in pieces on several connections
/// at once, not in a reader's runs one after another, and each byte once.
#[test]
fn bytes_wanted_whole_come_in_pieces_at_once() {
    let n = 6usize << 20;
    let bytes = data(n + 4096);
    let (url, seen) = serve(
        bytes.clone(),
        Pace {
            delay: Duration::from_millis(300),
            ..Pace::default()
        },
    );
    let remote = open(&url);
    remote.fetch_in_pieces(0, n as u64);
    let most = seen.max_in_flight.load(Ordering::SeqCst);
    assert!(most >= 3, "at most {most} requests in flight at once");
    let before = seen.requests.load(Ordering::SeqCst);
    let mut buf = vec![0u8; n];
    remote.read_exact_at(&mut buf, 0).unwrap();
    assert!(buf[..] == bytes[..n], "read back differs");
    assert_eq!(seen.requests.load(Ordering::SeqCst), before, "read again");
    let served = seen.bytes.load(Ordering::SeqCst);
    assert!(
        served <= n as u64 + (64 << 10),
        "{served} bytes served for {n}"
    );
}
