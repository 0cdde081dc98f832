//! Reply encoding: each typed reply's bytes, listings laid out as the kernel parses them
//! (8-byte aligned records), the xattr size-or-value rule, and exactly one answer per
//! request (EIO for one dropped unanswered).

use fusewire::abi::{self, fopen};
use fusewire::{dirent_size, Attr, DirEntry, Entry, Open, Reply, Sink};
use std::time::Duration;
use zerocopy::FromBytes;

/// A transport that keeps what was sent.
struct Recorder {
    buf: Vec<u8>,
    sent: Vec<(u64, i32, Vec<u8>)>,
}

impl Recorder {
    fn new(cap: usize) -> Recorder {
        Recorder {
            buf: vec![0xaa; cap],
            sent: Vec::new(),
        }
    }

    /// The one answer: (errno, body).
    fn only(&self) -> (i32, &[u8]) {
        assert_eq!(self.sent.len(), 1, "exactly one answer");
        let (unique, error, body) = &self.sent[0];
        assert_eq!(*unique, 9);
        (*error, body)
    }
}

impl Sink for Recorder {
    fn body(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    fn send(&mut self, unique: u64, error: i32, len: usize) {
        self.sent.push((unique, error, self.buf[..len].to_vec()));
    }
}

fn reply_with(limit: Option<usize>, f: impl FnOnce(Reply<'_>)) -> Recorder {
    let mut r = Recorder::new(64 << 10);
    f(Reply::new(9, limit, &mut r));
    r
}

#[test]
fn a_dropped_reply_answers_eio_once() {
    let r = reply_with(None, |reply| drop(reply));
    assert_eq!(r.only(), (libc::EIO, &[][..]));
    let r = reply_with(None, |reply| reply.error(libc::ENOENT));
    assert_eq!(r.only(), (libc::ENOENT, &[][..]));
    let r = reply_with(None, |reply| drop(reply.dir()));
    assert_eq!(r.only(), (libc::EIO, &[][..]), "an unfinished listing");
}

#[test]
fn entry_attr_open_create_bytes() {
    let attr = Attr {
        ino: 5,
        size: 10,
        mode: libc::S_IFREG | 0o644,
        nlink: 1,
        ..Attr::default()
    };
    let ttl = Duration::new(3, 500);
    let entry = Entry {
        nodeid: 5,
        generation: 2,
        attr,
        entry_ttl: ttl,
        attr_ttl: Duration::from_secs(7),
    };
    let r = reply_with(None, |reply| reply.entry(&entry));
    let (e, body) = r.only();
    let out = abi::EntryOut::read_from_bytes(body).expect("128 bytes");
    assert_eq!(
        (
            e,
            out.nodeid,
            out.generation,
            out.entry_valid,
            out.entry_valid_nsec,
            out.attr_valid
        ),
        (0, 5, 2, 3, 500, 7)
    );
    assert_eq!(out.attr, attr);
    let r = reply_with(None, |reply| reply.entry(&Entry::negative(ttl)));
    let out = abi::EntryOut::read_from_bytes(r.only().1).expect("negative entry");
    assert_eq!((out.nodeid, out.entry_valid), (0, 3));
    let r = reply_with(None, |reply| reply.attr(&attr, ttl));
    let out = abi::AttrOut::read_from_bytes(r.only().1).expect("104 bytes");
    assert_eq!(
        (out.attr_valid, out.attr_valid_nsec, out.attr),
        (3, 500, attr)
    );
    let open = Open {
        fh: 77,
        flags: fopen::KEEP_CACHE,
        backing_id: Some(4),
    };
    let r = reply_with(None, |reply| reply.opened(&open));
    let out = abi::OpenOut::read_from_bytes(r.only().1).expect("16 bytes");
    assert_eq!(
        (out.fh, out.open_flags, out.backing_id),
        (77, fopen::KEEP_CACHE | fopen::PASSTHROUGH, 4)
    );
    let r = reply_with(None, |reply| {
        reply.created(
            &entry,
            &Open {
                fh: 1,
                ..Open::default()
            },
        )
    });
    let body = r.only().1;
    assert_eq!(body.len(), 128 + 16);
    assert_eq!(
        abi::EntryOut::read_from_bytes(&body[..128]).unwrap().nodeid,
        5
    );
    assert_eq!(
        abi::OpenOut::read_from_bytes(&body[128..]).unwrap(),
        abi::OpenOut {
            fh: 1,
            open_flags: 0,
            backing_id: 0
        }
    );
}

#[test]
fn small_replies() {
    let r = reply_with(None, |reply| reply.written(4096));
    assert_eq!(
        abi::WriteOut::read_from_bytes(r.only().1).unwrap().size,
        4096
    );
    let r = reply_with(None, |reply| reply.lseek(1 << 40));
    assert_eq!(
        abi::LseekOut::read_from_bytes(r.only().1).unwrap().offset,
        1 << 40
    );
    let st = abi::Kstatfs {
        blocks: 5,
        bsize: 4096,
        namelen: 255,
        ..Default::default()
    };
    let r = reply_with(None, |reply| reply.statfs(&st));
    assert_eq!(abi::Kstatfs::read_from_bytes(r.only().1).unwrap(), st);
    let r = reply_with(None, |reply| reply.ok());
    assert_eq!(r.only(), (0, &[][..]));
}

#[test]
fn data_respects_the_requested_size() {
    let r = reply_with(Some(5), |reply| reply.data(b"hello"));
    assert_eq!(r.only(), (0, &b"hello"[..]));
    let r = reply_with(Some(4), |reply| reply.data(b"hello"));
    assert_eq!(r.only().0, libc::EIO, "more than the kernel asked for");
    let r = reply_with(Some(3), |reply| {
        reply.data_with(|buf| {
            assert_eq!(buf.len(), 3, "fill gets exactly the room asked for");
            buf.copy_from_slice(b"abc");
            Ok(3)
        })
    });
    assert_eq!(r.only(), (0, &b"abc"[..]));
    let r = reply_with(Some(3), |reply| reply.data_with(|_| Err(libc::EIO)));
    assert_eq!(r.only().0, libc::EIO);
}

#[test]
fn xattr_size_then_value() {
    let r = reply_with(None, |reply| reply.xattr(0, b"blue"));
    assert_eq!(
        abi::GetxattrOut::read_from_bytes(r.only().1).unwrap().size,
        4,
        "size 0 asks for the length"
    );
    let r = reply_with(None, |reply| reply.xattr(0, b""));
    assert_eq!(
        abi::GetxattrOut::read_from_bytes(r.only().1).unwrap().size,
        0
    );
    let r = reply_with(Some(4), |reply| reply.xattr(4, b"blue"));
    assert_eq!(r.only(), (0, &b"blue"[..]));
    let r = reply_with(Some(64), |reply| reply.xattr(64, b"blue"));
    assert_eq!(
        r.only(),
        (0, &b"blue"[..]),
        "a larger buffer gets just the value"
    );
    let r = reply_with(Some(3), |reply| reply.xattr(3, b"blue"));
    assert_eq!(r.only().0, libc::ERANGE);
    let r = reply_with(Some(8), |reply| reply.xattr(8, b""));
    assert_eq!(r.only(), (0, &[][..]), "an empty value");
}

/// Walks a listing as the kernel's parse_dirfile/parse_dirplusfile do.
fn parse(body: &[u8], plus: bool) -> Vec<(u64, u64, u32, Vec<u8>, u64)> {
    let mut out = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let (nodeid, d) = if plus {
            let e = abi::EntryOut::read_from_prefix(rest).unwrap().0;
            (e.nodeid, &rest[128..])
        } else {
            (0, rest)
        };
        let dirent = abi::Dirent::read_from_prefix(d).unwrap().0;
        let name = d[24..24 + dirent.namelen as usize].to_vec();
        let size = dirent_size(plus, name.len());
        assert_eq!(size % 8, 0);
        let fixed = if plus { 152 } else { 24 };
        assert!(
            rest[fixed + name.len()..size].iter().all(|&b| b == 0),
            "padding is zeroed"
        );
        out.push((dirent.ino, dirent.off, dirent.typ, name, nodeid));
        rest = &rest[size..];
    }
    out
}

#[test]
fn listings_are_aligned_and_stop_when_full() {
    for plus in [false, true] {
        let names: Vec<Vec<u8>> = (1..=17).map(|n| vec![b'a' + n as u8; n]).collect();
        let limit = 1000;
        let mut added = 0;
        let r = reply_with(Some(limit), |reply| {
            let mut dir = if plus { reply.dir_plus() } else { reply.dir() };
            for (i, name) in names.iter().enumerate() {
                let e = DirEntry {
                    ino: 100 + i as u64,
                    next: i as u64 + 1,
                    typ: libc::DT_REG as u32,
                    name,
                };
                let entry = Entry {
                    nodeid: 100 + i as u64,
                    ..Entry::default()
                };
                let fits = if plus {
                    dir.add_plus(&e, &entry)
                } else {
                    dir.add(&e)
                };
                if !fits {
                    break;
                }
                added += 1;
                assert!(dir.len() <= limit && dir.len() % 8 == 0);
            }
            dir.finish()
        });
        let (error, body) = r.only();
        assert_eq!(error, 0);
        assert!(
            added < names.len() || !plus,
            "a 1000-byte READDIRPLUS cannot hold 17 entries"
        );
        let parsed = parse(body, plus);
        assert_eq!(parsed.len(), added);
        for (i, (ino, off, typ, name, nodeid)) in parsed.into_iter().enumerate() {
            assert_eq!(
                (ino, off, typ, &name),
                (100 + i as u64, i as u64 + 1, libc::DT_REG as u32, &names[i])
            );
            assert_eq!(nodeid, if plus { 100 + i as u64 } else { 0 });
        }
    }
}

#[test]
fn an_empty_listing_ends_the_directory() {
    let r = reply_with(Some(4096), |reply| reply.dir().finish());
    assert_eq!(r.only(), (0, &[][..]));
}
