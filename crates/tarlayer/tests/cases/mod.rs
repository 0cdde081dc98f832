//! Layer tarballs written block by block (`Tar`, `Hdr`), so each case shows exactly what
//! it holds: the hostile ones the importer refuses (each with the words its error says),
//! and odd ones it reads. Shared by tarlayer's own tests and verilay's CLI tests
//! (`#[path]`), each of which uses a part.
#![allow(dead_code)]

use erofs::builder::{Node, Tree};

pub const BLOCK: usize = 512;

/// One header block: USTAR, 0644 (0755 for directories), root-owned, size 0, mtime
/// 1700000000, until changed. `seal` writes its checksum.
#[derive(Clone)]
pub struct Hdr(pub [u8; BLOCK]);

impl Hdr {
    pub fn new(name: &str, typeflag: u8) -> Hdr {
        let mut b = [0u8; BLOCK];
        b[..name.len()].copy_from_slice(name.as_bytes());
        b[156] = typeflag;
        b[257..263].copy_from_slice(b"ustar\0");
        b[263..265].copy_from_slice(b"00");
        let mode = if typeflag == b'5' { 0o755 } else { 0o644 };
        Hdr(b)
            .mode(mode)
            .octal(108, 8, 0)
            .octal(116, 8, 0)
            .size(0)
            .octal(136, 12, 1_700_000_000)
    }

    pub fn octal(mut self, at: usize, len: usize, v: u64) -> Hdr {
        let s = format!("{v:0w$o}\0", w = len - 1);
        assert_eq!(s.len(), len, "{v} does not fit {len} octal bytes");
        self.0[at..at + len].copy_from_slice(s.as_bytes());
        self
    }

    /// GNU base-256: 0x80 (or 0xff when negative), then the number in two's complement.
    pub fn base256(mut self, at: usize, len: usize, v: i128) -> Hdr {
        let bytes = v.to_be_bytes();
        self.0[at..at + len].copy_from_slice(&bytes[16 - len..]);
        self.0[at] = if v < 0 { 0xff } else { 0x80 };
        self
    }

    pub fn raw(mut self, at: usize, bytes: &[u8]) -> Hdr {
        self.0[at..at + bytes.len()].copy_from_slice(bytes);
        self
    }

    pub fn mode(self, m: u64) -> Hdr {
        self.octal(100, 8, m)
    }

    pub fn size(self, s: u64) -> Hdr {
        self.octal(124, 12, s)
    }

    pub fn link(self, target: &str) -> Hdr {
        self.raw(157, target.as_bytes())
    }

    pub fn device(self, major: u64, minor: u64) -> Hdr {
        self.octal(329, 8, major).octal(337, 8, minor)
    }

    pub fn seal(mut self) -> [u8; BLOCK] {
        self.0[148..156].fill(b' ');
        let sum: u32 = self.0.iter().map(|&b| b as u32).sum();
        self.0[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        self.0
    }
}

/// One PAX record, its length counting itself.
pub fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let body = key.len() + value.len() + 3;
    let mut len = body + 1;
    while len != body + len.to_string().len() {
        len = body + len.to_string().len();
    }
    [format!("{len} {key}=").as_bytes(), value, b"\n".as_slice()].concat()
}

/// A tarball, block by block.
#[derive(Clone, Default)]
pub struct Tar(pub Vec<u8>);

impl Tar {
    pub fn header(&mut self, h: Hdr) -> &mut Tar {
        self.0.extend_from_slice(&h.seal());
        self
    }

    /// Data and its padding to a whole block.
    pub fn data(&mut self, d: &[u8]) -> &mut Tar {
        self.0.extend_from_slice(d);
        self.0.resize(self.0.len().next_multiple_of(BLOCK), 0);
        self
    }

    /// A header sized for `d`, then `d`.
    pub fn entry(&mut self, h: Hdr, d: &[u8]) -> &mut Tar {
        self.header(h.size(d.len() as u64)).data(d)
    }

    pub fn file(&mut self, name: &str, d: &[u8]) -> &mut Tar {
        self.entry(Hdr::new(name, b'0'), d)
    }

    pub fn dir(&mut self, name: &str) -> &mut Tar {
        self.header(Hdr::new(name, b'5'))
    }

    pub fn symlink(&mut self, name: &str, target: &str) -> &mut Tar {
        self.header(Hdr::new(name, b'2').mode(0o777).link(target))
    }

    pub fn hardlink(&mut self, name: &str, target: &str) -> &mut Tar {
        self.header(Hdr::new(name, b'1').link(target))
    }

    /// A PAX header ('x' for the next entry, 'g' global).
    pub fn pax_of(&mut self, flag: u8, records: &[(&str, &[u8])]) -> &mut Tar {
        let d: Vec<u8> = records.iter().flat_map(|(k, v)| pax_record(k, v)).collect();
        self.entry(Hdr::new("PaxHeaders/entry", flag), &d)
    }

    pub fn pax(&mut self, records: &[(&str, &[u8])]) -> &mut Tar {
        self.pax_of(b'x', records)
    }

    /// A GNU long name ('L') or link ('K'), NUL-terminated as GNU tar writes it.
    pub fn long(&mut self, flag: u8, name: &[u8]) -> &mut Tar {
        let h = Hdr::new("././@LongLink", flag).raw(257, b"ustar  \0");
        self.entry(h, &[name, b"\0"].concat())
    }

    /// The end-of-archive marker, then zeros to a 10 KiB record, as GNU tar writes it.
    pub fn end(&mut self) -> Vec<u8> {
        self.0.resize(self.0.len() + 2 * BLOCK, 0);
        self.0.resize(self.0.len().next_multiple_of(20 * BLOCK), 0);
        std::mem::take(&mut self.0)
    }
}

/// The importer on `bytes`, in this process: the tree, or the error line.
pub fn import(bytes: &[u8]) -> Result<Tree, String> {
    let tmp = tempfile::tempdir().unwrap();
    tarlayer::read_from(bytes, "layer.tar", tmp.path(), u64::MAX, &|_| {})
        .map(|(tree, _)| tree)
        .map_err(|e| e.to_string())
}

pub fn lookup<'a>(tree: &'a Tree, path: &str) -> Option<&'a Node> {
    let mut at = Tree::ROOT;
    for part in path.split('/') {
        at = tree
            .children(at)
            .iter()
            .find(|(n, _)| n == part.as_bytes())?
            .1;
    }
    Some(&tree.nodes[at])
}

pub fn names(tree: &Tree, path: &str) -> Vec<String> {
    let mut at = Tree::ROOT;
    if !path.is_empty() {
        for part in path.split('/') {
            at = tree
                .children(at)
                .iter()
                .find(|(n, _)| n == part.as_bytes())
                .unwrap()
                .1;
        }
    }
    tree.children(at)
        .iter()
        .map(|(n, _)| String::from_utf8_lossy(n).into_owned())
        .collect()
}

/// A tar of one file whose header is `h`, sized for `data`.
pub fn one(h: Hdr, data: &[u8]) -> Vec<u8> {
    Tar::default().entry(h, data).end()
}

/// Headers whose numbers the image cannot hold, or that are no numbers (item 2).
pub fn bad_numbers() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let f = || Hdr::new("f", b'0');
    let dev = || Hdr::new("dev", b'3');
    vec![
        // 4294968296 = 2^32 + 1000 was read as uid 1000.
        (
            "uid-base256-over-32-bits.tar",
            one(f().base256(108, 8, 4_294_968_296), b"x"),
            "entry at byte 0: uid 4294968296 cannot be represented",
        ),
        (
            "gid-base256-over-32-bits.tar",
            one(f().base256(116, 8, 1 << 40), b"x"),
            "gid 1099511627776 cannot be represented",
        ),
        (
            "uid-base256-negative.tar",
            one(f().base256(108, 8, -1), b"x"),
            "uid -1 cannot be represented",
        ),
        (
            "uid-minus-one.tar",
            one(f().base256(108, 8, 4_294_967_295), b"x"),
            "uid 4294967295 cannot be represented",
        ),
        (
            "pax-uid-over-32-bits.tar",
            Tar::default()
                .pax(&[("uid", b"4294967296")])
                .file("f", b"x")
                .end(),
            "entry at byte 0: uid 4294967296 cannot be represented",
        ),
        (
            "pax-gid-negative.tar",
            Tar::default().pax(&[("gid", b"-5")]).file("f", b"x").end(),
            "PAX record gid=\"-5\" is malformed",
        ),
        (
            "size-base256-negative.tar",
            Tar::default().header(f().base256(124, 12, -512)).end(),
            "negative size -512",
        ),
        (
            "mtime-base256-beyond-64-bits.tar",
            one(f().base256(136, 12, 1 << 70), b"x"),
            "the mtime field (base-256) holds 1180591620717411303424, beyond 64 bits",
        ),
        (
            "mode-not-octal.tar",
            one(f().raw(100, b"0006 44\0"), b"x"),
            "the mode field is not an octal number",
        ),
        (
            "uid-high-bit-not-base256.tar",
            one(f().raw(108, &[0x81, 0, 0, 0, 0, 0, 0, 1]), b"x"),
            "neither octal nor base-256",
        ),
        (
            "devmajor-not-octal.tar",
            one(f().raw(329, b"12x\0"), b"x"),
            "the devmajor field is not an octal number",
        ),
        (
            "devmajor-too-large.tar",
            Tar::default().header(dev().device(4096, 1)).end(),
            "device 4096:1 cannot be represented",
        ),
        (
            "devminor-too-large.tar",
            Tar::default().header(dev().base256(337, 8, 1 << 20)).end(),
            "device 0:1048576 cannot be represented",
        ),
        (
            "checksum-not-octal.tar",
            {
                let mut b = Tar::default().file("f", b"x").end();
                b[148..156].copy_from_slice(b"12z456\0 ");
                b
            },
            "entry at byte 0: the checksum field is not an octal number",
        ),
        (
            "mode-beyond-type-bits.tar",
            one(f().octal(100, 8, 0o1000644), b"x"),
            "mode 1000644 has bits beyond a file type and 07777",
        ),
        (
            "mode-says-socket.tar",
            one(f().mode(0o140755), b"x"),
            "mode 140755 says another file type than the entry's (a file)",
        ),
        (
            "mode-says-directory.tar",
            one(f().mode(0o040755), b"x"),
            "mode 40755 says another file type",
        ),
        (
            "pax-mtime-malformed.tar",
            Tar::default()
                .pax(&[("mtime", b"1700000000.5x")])
                .file("f", b"x")
                .end(),
            "PAX record mtime=\"1700000000.5x\" is malformed",
        ),
        (
            "pax-atime-malformed.tar",
            Tar::default()
                .pax(&[("atime", b"--1")])
                .file("f", b"x")
                .end(),
            "PAX record atime=\"--1\" is malformed",
        ),
        (
            "pax-mtime-beyond-64-bits.tar",
            Tar::default()
                .pax(&[("mtime", b"9223372036854775808")])
                .file("f", b"x")
                .end(),
            "PAX record mtime=\"9223372036854775808\" is malformed",
        ),
        (
            "pax-size-negative.tar",
            Tar::default().pax(&[("size", b"-1")]).file("f", b"").end(),
            "PAX record size=\"-1\" is malformed",
        ),
        (
            "pax-uname-too-long.tar",
            Tar::default()
                .pax(&[("uname", &[b'u'; 256])])
                .file("f", b"x")
                .end(),
            "PAX uname is longer than 255 bytes",
        ),
    ]
}

/// Archives cut short, or not ending as a tar ends (item 8).
pub fn bad_ends() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let two = || {
        let mut t = Tar::default();
        t.file("a", &[b'a'; 1000]).file("b", b"b");
        t
    };
    let full = two().end();
    let mut bad_sum = full.clone();
    bad_sum[BLOCK * 3] ^= 1; // the name of "b"
    let mut garbage = full.clone();
    garbage.extend_from_slice(b"trailing garbage");
    let mut late_garbage = full.clone();
    *late_garbage.last_mut().unwrap() = 1;
    let mut lone_zero = two().0;
    lone_zero.extend_from_slice(&[0; BLOCK]);
    let mut zero_then_header = two().0;
    zero_then_header.extend_from_slice(&[0; BLOCK]);
    zero_then_header.extend_from_slice(&Hdr::new("c", b'0').seal());
    zero_then_header.extend_from_slice(&[0; 2 * BLOCK]);
    vec![
        (
            "no-end-marker.tar",
            two().0,
            "at byte 2560: the archive ends without its end-of-archive marker",
        ),
        (
            "one-zero-block.tar",
            lone_zero,
            "at byte 3072: the archive ends after one zero block",
        ),
        (
            "zero-block-then-header.tar",
            zero_then_header,
            "at byte 3072: a header after the lone zero block at byte 2560",
        ),
        (
            "cut-in-header.tar",
            full[..BLOCK * 3 + 100].to_vec(),
            "at byte 1536: the archive ends at byte 1636, inside a header block",
        ),
        (
            "cut-in-data.tar",
            full[..BLOCK + 700].to_vec(),
            "entry at byte 0: the archive ends at byte 1212, inside this entry's data (1000 bytes from byte 512)",
        ),
        (
            "cut-in-padding.tar",
            full[..BLOCK + 1010].to_vec(),
            "entry at byte 0: the archive ends at byte 1522, inside the padding after this entry's data",
        ),
        (
            "bad-checksum.tar",
            bad_sum,
            "entry at byte 1536: bad header checksum",
        ),
        (
            "trailing-garbage.tar",
            garbage,
            "at byte 10240: non-zero bytes after the end-of-archive marker",
        ),
        (
            "garbage-in-the-padding.tar",
            late_garbage,
            "at byte 10239: non-zero bytes after the end-of-archive marker",
        ),
        (
            // The original report: a PAX size past the end gave an empty image.
            "pax-size-past-the-end.tar",
            Tar::default()
                .pax(&[("size", b"1000000")])
                .file("f", b"short")
                .end(),
            "entry at byte 0: the archive ends at byte 10240, inside this entry's data (1000000 bytes from byte 1536)",
        ),
        (
            "pax-header-cut.tar",
            Tar::default()
                .pax(&[("path", &[b'p'; 3000])])
                .0[..BLOCK * 3]
                .to_vec(),
            "entry at byte 0: the archive ends at byte 1536, inside the PAX records (3011 bytes from byte 512)",
        ),
        (
            "extension-header-without-entry.tar",
            Tar::default().pax(&[("uid", b"5")]).end(),
            "entry at byte 0: extension headers with no entry after them",
        ),
    ]
}

/// Headers that would make the importer allocate without bound, and names past what
/// Linux and EROFS hold (item 11).
pub fn unbounded() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let huge = |flag: u8, name: &str| {
        Tar::default()
            .header(Hdr::new(name, flag).base256(124, 12, 1 << 60))
            .data(&[b'x'; BLOCK])
            .end()
    };
    let xattr = |name: &str, len: usize| {
        Tar::default()
            .pax(&[(&format!("SCHILY.xattr.{name}"), &vec![b'v'; len])])
            .file("f", b"x")
            .end()
    };
    let many: Vec<(String, Vec<u8>)> = (0..6000)
        .map(|i| (format!("SCHILY.xattr.user.{i:08}"), b"v".to_vec()))
        .collect();
    let many: Vec<(&str, &[u8])> = many
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_slice()))
        .collect();
    let big: Vec<(String, Vec<u8>)> = (0..5)
        .map(|i| (format!("SCHILY.xattr.user.{i}"), vec![b'v'; 60000]))
        .collect();
    let big: Vec<(&str, &[u8])> = big
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_slice()))
        .collect();
    vec![
        (
            "pax-size-2-60.tar",
            huge(b'x', "PaxHeaders/f"),
            "entry at byte 0: a PAX header of 1152921504606846976 bytes (at most 1048576)",
        ),
        (
            "pax-global-size-2-60.tar",
            huge(b'g', "GlobalHead"),
            "a PAX header of 1152921504606846976 bytes",
        ),
        (
            "gnu-longname-size-2-60.tar",
            huge(b'L', "././@LongLink"),
            "a GNU long name of 1152921504606846976 bytes (at most 4096: PATH_MAX)",
        ),
        (
            "gnu-longlink-size-2-40.tar",
            Tar::default()
                .header(Hdr::new("././@LongLink", b'K').base256(124, 12, 1 << 40))
                .end(),
            "a GNU long link of 1099511627776 bytes",
        ),
        (
            "pax-header-over-1-mib.tar",
            Tar::default()
                .pax(&[("comment", &vec![b'c'; 1 << 20])])
                .file("f", b"x")
                .end(),
            "a PAX header of 1048593 bytes (at most 1048576)",
        ),
        (
            "gnu-longname-over-path-max.tar",
            Tar::default().long(b'L', &[b'n'; 4096]).file("f", b"x").end(),
            "a GNU long name of 4097 bytes",
        ),
        (
            "pax-path-over-path-max.tar",
            Tar::default()
                .pax(&[("path", &[b'a'; 4096])])
                .file("f", b"x")
                .end(),
            "a path of 4096 bytes (at most 4095: PATH_MAX)",
        ),
        (
            "name-over-255.tar",
            Tar::default()
                .pax(&[("path", &[b'a'; 256])])
                .file("f", b"x")
                .end(),
            "path has an invalid name (over 255 bytes",
        ),
        (
            "symlink-target-over-path-max.tar",
            Tar::default()
                .pax(&[("linkpath", &[b'a'; 4096])])
                .symlink("l", "x")
                .end(),
            "symlink target is empty or too long",
        ),
        (
            "xattr-name-over-255.tar",
            xattr(&format!("user.{}", "n".repeat(251)), 1),
            "is too large (256 byte name, 1 byte value; at most 255 and 65535)",
        ),
        (
            "xattr-value-over-64-kib.tar",
            xattr("user.big", 65536),
            "xattr user.big is too large (8 byte name, 65536 byte value",
        ),
        (
            "xattr-names-over-list-max.tar",
            Tar::default().pax(&many).file("f", b"x").end(),
            "6000 xattrs too many or too large for one file (84000 bytes of names, at most 65536",
        ),
        (
            "xattrs-over-an-inode.tar",
            Tar::default().pax(&big).file("f", b"x").end(),
            "5 xattrs too many or too large for one file (35 bytes of names, at most 65536; 300060 bytes encoded, at most 262136)",
        ),
    ]
}

/// Paths, links, whiteouts and extension headers a careful importer refuses (the class
/// around items 2, 8 and 11).
pub fn bad_entries() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let wh = |name: &str| Tar::default().dir("d").file(name, b"").end();
    vec![
        (
            "through-symlink.tar",
            Tar::default()
                .symlink("a", "/etc")
                .file("a/passwd", b"root::0:0::/:/bin/sh\n")
                .end(),
            "entry at byte 512: the path goes through a, which this layer made a symlink",
        ),
        (
            "through-file.tar",
            Tar::default().file("a", b"x").file("a/b", b"y").end(),
            "the path goes through a, which this layer made a file",
        ),
        (
            "hardlink-through-symlink.tar",
            Tar::default()
                .dir("d")
                .file("d/f", b"x")
                .symlink("s", "d")
                .hardlink("h", "s/f")
                .end(),
            "hardlink to \"s/f\", which is not an earlier file",
        ),
        (
            // GNU tar: "Cannot open: File exists", d/x kept. containerd: d/x gone.
            "file-over-a-full-directory.tar",
            Tar::default()
                .dir("d")
                .file("d/x", b"x")
                .file("d", b"f")
                .end(),
            "\"d\" replaces a directory of this layer that has entries",
        ),
        (
            "symlink-over-a-full-directory.tar",
            Tar::default().file("d/x", b"x").symlink("d", "/etc").end(),
            "\"d\" replaces a directory of this layer that has entries",
        ),
        (
            "hardlink-over-a-full-directory.tar",
            Tar::default()
                .file("f", b"f")
                .file("d/x", b"x")
                .hardlink("d", "f")
                .end(),
            "\"d\" replaces a directory of this layer that has entries",
        ),
        (
            "hardlink-to-later.tar",
            Tar::default().hardlink("h", "f").file("f", b"x").end(),
            "hardlink to \"f\", which is not an earlier file",
        ),
        (
            "hardlink-to-root.tar",
            Tar::default().hardlink("h", "./").end(),
            "hardlink to \"\", which is not an earlier file but a directory",
        ),
        (
            "hardlink-to-whiteout.tar",
            Tar::default().file(".wh.x", b"").hardlink("h", "x").end(),
            "which is not an earlier file but a whiteout",
        ),
        (
            "hardlink-dotdot.tar",
            Tar::default().file("f", b"x").hardlink("h", "../f").end(),
            "path climbs out with \"..\"",
        ),
        (
            "hardlink-with-data.tar",
            Tar::default()
                .file("f", b"x")
                .entry(
                    Hdr::new("h", b'1').link("f"),
                    &Hdr::new("evil", b'0').seal(),
                )
                .end(),
            "a hardlink entry with 512 bytes of data",
        ),
        (
            "directory-with-data.tar",
            Tar::default()
                .entry(Hdr::new("d/", b'5'), &Hdr::new("hidden", b'0').seal())
                .end(),
            "a directory entry with 512 bytes of data",
        ),
        (
            "root-as-file.tar",
            Tar::default().file("./", b"x").end(),
            "the root is given as a file",
        ),
        (
            "pax-path-with-nul.tar",
            Tar::default()
                .pax(&[("path", b"a\0b")])
                .file("f", b"x")
                .end(),
            "a NUL byte in a key or name",
        ),
        (
            "gnu-longname-with-nul.tar",
            Tar::default().long(b'L', b"a\0b").file("f", b"x").end(),
            "an empty GNU long name, or one with a NUL byte inside",
        ),
        (
            "pax-path-and-longname-disagree.tar",
            Tar::default()
                .pax(&[("path", b"one")])
                .long(b'L', b"two")
                .file("f", b"x")
                .end(),
            "PAX path \"one\" and GNU long name \"two\" disagree",
        ),
        (
            "two-pax-headers.tar",
            Tar::default()
                .pax(&[("uid", b"0")])
                .pax(&[("uid", b"5")])
                .file("f", b"x")
                .end(),
            "entry at byte 1024: a second PAX header for one entry",
        ),
        (
            "two-longnames.tar",
            Tar::default()
                .long(b'L', b"one")
                .long(b'L', b"two")
                .file("f", b"x")
                .end(),
            "a second GNU long name for one entry",
        ),
        (
            "global-header-sets-uid.tar",
            Tar::default()
                .pax_of(b'g', &[("uid", b"0")])
                .file("f", b"x")
                .end(),
            "a PAX global header sets uid",
        ),
        (
            "pax-sparse.tar",
            Tar::default()
                .pax(&[("GNU.sparse.major", b"1")])
                .file("f", b"x")
                .end(),
            "sparse entries (tar -S) are not supported",
        ),
        (
            "whiteout-of-dot.tar",
            wh("d/.wh.."),
            "a whiteout that names no file",
        ),
        (
            "whiteout-of-dotdot.tar",
            wh("d/.wh..."),
            "a whiteout that names no file",
        ),
        (
            "whiteout-of-nothing.tar",
            wh("d/.wh."),
            "a whiteout that names no file",
        ),
        (
            "opaque-at-the-top.tar",
            wh(".wh..wh..opq"),
            ".wh..wh..opq at the top of the layer",
        ),
        (
            "aufs-metadata.tar",
            wh(".wh..wh.plnk"),
            "AUFS metadata (.wh..wh.*), which no OCI layer holds",
        ),
        (
            "whiteout-directory.tar",
            Tar::default().dir("d/.wh.x").end(),
            "a whiteout that is a directory",
        ),
        (
            "unknown-type.tar",
            Tar::default().header(Hdr::new("v", b'V')).end(),
            "unsupported entry type \"V\"",
        ),
    ]
}

/// The case of `disagreeing_headers` named `name`.
pub fn disagreeing(name: &str) -> Vec<u8> {
    disagreeing_headers()
        .into_iter()
        .find(|(n, _, _)| *n == name)
        .unwrap_or_else(|| panic!("no case {name}"))
        .1
}

/// Headers that GNU tar, Go's archive/tar (what Docker, containerd and podman read
/// layers with) and Python's tarfile read differently, in path, type, size, owner or
/// mode: refused, never read one of the ways. `readers_disagree_on_each_refused_header`
/// shows what GNU tar and Python make of them; what Go makes of them is in the comments
/// (its `reader.go`, `format.go` and `strconv.go`).
pub fn disagreeing_headers() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let f = |name: &str| Hdr::new(name, b'0');
    let gnu = |name: &str| Hdr::new(name, b'0').raw(257, b"ustar  \0");
    let v7 = |name: &str, flag: u8| Hdr::new(name, flag).raw(257, &[0; 8]);
    // 124 slashes and "usr/bin" fill star's 131-byte prefix; 24 spaces run on into its
    // atime field, which USTAR counts as the rest of a 155-byte prefix.
    let long_prefix = ["/".repeat(124), "usr/bin".into(), " ".repeat(24)].concat();
    let with_f = || {
        let mut t = Tar::default();
        t.file("f", b"x");
        t
    };
    vec![
        (
            // Go: a 131-byte star prefix, "usr/bin/sudo". GNU tar, Python: all 155 bytes.
            "star-prefix-past-131-bytes.tar",
            one(
                f("sudo")
                    .raw(345, long_prefix.as_bytes())
                    .raw(508, b"tar\0"),
                b"evil\n",
            ),
            "entry at byte 0: the prefix of a star header (\"tar\\0\" at byte 508) runs past its 131 bytes",
        ),
        (
            // Go (its pre-1.8 fallback), Python: "etc/passwd". GNU tar: "passwd".
            "gnu-header-text-in-atime.tar",
            one(gnu("passwd").raw(345, b"etc\0"), b"evil\n"),
            "a GNU header with bytes in its atime field (at byte 345)",
        ),
        (
            // GNU tar, Go: "f", a time. Python: "14530000000/f".
            "gnu-header-numeric-atime.tar",
            one(gnu("f").raw(345, b"14530000000\0"), b"x"),
            "a GNU header with bytes in its atime field (at byte 345)",
        ),
        (
            // GNU tar, Go: "f". Python: "etc/f".
            "v7-header-with-prefix.tar",
            one(v7("f", b'0').raw(345, b"etc"), b"x"),
            "a V7 header (no USTAR magic) with bytes at 345",
        ),
        (
            // GNU tar, Go: device 0:0 (a whiteout). Python: 1:3.
            "v7-device-numbers.tar",
            Tar::default().header(v7("c", b'3').device(1, 3)).end(),
            "a V7 device with numbers 1:3",
        ),
        (
            // GNU tar, Go: uid 1000 (GNU skips one NUL). Python: uid 0.
            "uid-leading-nul.tar",
            one(f("f").raw(108, b"\x000001750"), b"x"),
            "the uid field starts with a NUL",
        ),
        (
            // Go: uid 1000 (it trims spaces and NULs first). GNU tar, Python: uid 0.
            "uid-space-nul-digits.tar",
            one(f("f").raw(108, b" \0 1750\0"), b"x"),
            "the uid field is not an octal number",
        ),
        (
            // GNU tar: "Blanks in header", mtime -1. Go, Python: 0.
            "mtime-blank.tar",
            one(f("f").raw(136, &[b' '; 12]), b"x"),
            "the mtime field is blank",
        ),
        (
            // GNU tar, Go: a good checksum. Python: a bad one (it reads 0).
            "checksum-leading-nul.tar",
            {
                // "%06o\0 " becomes "\0%06o ": the same digits, the same sum.
                let mut b = Tar::default().file("f", b"x").end();
                b.copy_within(148..154, 149);
                b[148] = 0;
                b[155] = b' ';
                b
            },
            "the checksum field starts with a NUL",
        ),
        (
            // GNU tar: a directory (then it reads the data as a header). Go, Python: a
            // file "evil/" (containerd writes it to "evil").
            "file-with-trailing-slash.tar",
            one(f("evil/"), b"data\n"),
            "entry at byte 0: a file named \"evil/\": a path ending in \"/\" or \"/.\" names a directory",
        ),
        (
            // As above, the path from a PAX record (Python strips the slash).
            "pax-path-file-trailing-slash.tar",
            Tar::default().pax(&[("path", b"f/")]).file("f", b"x").end(),
            "a file named \"f/\"",
        ),
        (
            // As above, the path from a GNU long name.
            "longname-file-trailing-slash.tar",
            Tar::default().long(b'L', b"d/").file("d", b"").end(),
            "a file named \"d/\"",
        ),
        (
            // GNU tar: fails to open "f/." as a file. Go: "f/." (containerd writes "f").
            "file-named-dot.tar",
            one(f("f/."), b"x"),
            "a file named \"f/.\"",
        ),
        (
            // The prefix alone names a V7 file "d/": GNU tar, Go: a directory. Python
            // looks at the name field alone: a file.
            "v7-file-named-by-prefix.tar",
            Tar::default().header(Hdr::new("", 0).raw(345, b"d")).end(),
            "typeflag NUL with a trailing slash",
        ),
        (
            // GNU tar, Go: a directory. Python 3.11: a file "d/" (it looks at the
            // header's name field, "d").
            "v7-file-longname-trailing-slash.tar",
            Tar::default()
                .long(b'L', b"d/")
                .header(Hdr::new("d", 0))
                .end(),
            "typeflag NUL with a trailing slash",
        ),
        (
            // GNU tar, Go, Python 3.11: a directory. Newer Python (no V7 check after
            // an extension header): a file "d/".
            "v7-file-trailing-slash-after-pax.tar",
            Tar::default()
                .pax(&[("uid", b"5")])
                .header(Hdr::new("d/", 0))
                .end(),
            "typeflag NUL with a trailing slash",
        ),
        (
            // GNU tar, Python: a file. containerd, Docker: "unhandled tar header type".
            "contiguous-file.tar",
            one(Hdr::new("f", b'7'), b"x"),
            "typeflag '7' (a contiguous file)",
        ),
        (
            // GNU tar: a symlink "l". Go, Python: "l/".
            "symlink-trailing-slash.tar",
            Tar::default().symlink("l/", "t").end(),
            "a symlink named \"l/\"",
        ),
        (
            // GNU tar: a hardlink "h". Go, Python: "h/".
            "hardlink-named-with-trailing-slash.tar",
            with_f().hardlink("h/", "f").end(),
            "a hardlink named \"h/\"",
        ),
        (
            // GNU tar: "Cannot hard link to 'f/': Not a directory". Go: "f/" (containerd
            // links to "f").
            "hardlink-to-trailing-slash.tar",
            with_f().hardlink("h", "f/").end(),
            "entry at byte 1024: a hardlink to \"f/\": a target ending in \"/\" or \"/.\" names a directory",
        ),
        (
            "hardlink-to-dot.tar",
            with_f().hardlink("h", "f/.").end(),
            "a hardlink to \"f/.\"",
        ),
        (
            // GNU tar, Go: uid 1000 (the header's). Python: uid 0.
            "pax-empty-uid.tar",
            Tar::default()
                .pax(&[("uid", b"")])
                .entry(f("f").octal(108, 8, 1000), b"x")
                .end(),
            "PAX record uid is empty",
        ),
        (
            // GNU tar: 9 (it keeps the first). Go: 7 (the header's). Python: 0.
            "pax-empty-gid-after-a-value.tar",
            Tar::default()
                .pax(&[("gid", b"9"), ("gid", b"")])
                .entry(f("f").octal(116, 8, 7), b"x")
                .end(),
            "PAX record gid is empty",
        ),
        (
            // GNU tar, Python: an empty name. Go: "f".
            "pax-empty-path.tar",
            Tar::default().pax(&[("path", b"")]).file("f", b"x").end(),
            "PAX record path is empty",
        ),
        (
            // GNU tar, Go: 1 byte of data. Python: 0, and a header in the data.
            "pax-empty-size.tar",
            Tar::default().pax(&[("size", b"")]).file("f", b"x").end(),
            "PAX record size is empty",
        ),
        (
            // All read uid 7, but GNU tar fails on the header's uid ("out of uid_t range").
            "pax-uid-over-a-header-uid-beyond-32-bits.tar",
            Tar::default()
                .pax(&[("uid", b"7")])
                .entry(f("f").base256(108, 8, 1 << 40), b"x")
                .end(),
            "the header's uid 1099511627776 is beyond uid_t",
        ),
        (
            // Python: 1 byte. GNU tar, Go: fail on the header's negative size.
            "pax-size-over-a-negative-header-size.tar",
            Tar::default()
                .pax(&[("size", b"1")])
                .header(f("f").base256(124, 12, -1))
                .data(b"x")
                .end(),
            "negative size -1",
        ),
        (
            // Go, Python: mtime 1. GNU tar: fails on it and keeps the header's mtime.
            "pax-mtime-plus-sign.tar",
            Tar::default().pax(&[("mtime", b"+1")]).file("f", b"x").end(),
            "PAX record mtime=\"+1\" is malformed",
        ),
        (
            // Not kept, but GNU tar fails on it ("Malformed extended header").
            "pax-empty-atime.tar",
            Tar::default().pax(&[("atime", b"")]).file("f", b"x").end(),
            "PAX record atime is empty",
        ),
        (
            // GNU tar, Go: "f". Python: fails (a global header must have a header
            // after it).
            "global-header-at-the-end.tar",
            Tar::default()
                .pax_of(b'g', &[("comment", b"git")])
                .file("f", b"x")
                .pax_of(b'g', &[("comment", b"git")])
                .end(),
            "entry at byte 2048: extension headers with no entry after them",
        ),
    ]
}

pub fn all_cases() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    [
        bad_numbers(),
        bad_ends(),
        unbounded(),
        bad_entries(),
        disagreeing_headers(),
    ]
    .concat()
}

/// Every number the image can hold, given the ways writers give it: PAX records
/// (uid, gid, mtime with nanoseconds and before the epoch, size, linkpath, path) and
/// base-256 header fields. `bin/id` (`id` is the host's /usr/bin/id) is setuid, owned by
/// uid 3000000 through PAX while its header says root.
pub fn numbers_tar(id: &[u8]) -> Vec<u8> {
    let long_target = format!("{}/sized", "d".repeat(200));
    let mut t = Tar::default();
    t.dir("bin")
        .pax(&[
            ("uid", b"3000000"),
            ("gid", b"3000001"),
            ("uname", b"no-such-user"),
            ("gname", b"root"),
            ("mtime", b"1700000000.123456789"),
            ("atime", b"1700000001.5"),
            ("ctime", b"1700000002"),
        ])
        .entry(Hdr::new("bin/id", b'0').mode(0o4755), id)
        .entry(
            Hdr::new("big-ids", b'0')
                .base256(108, 8, 2_147_483_653)
                .base256(116, 8, 4_294_967_294),
            b"x",
        )
        .entry(
            Hdr::new("negative-mtime", b'0').base256(136, 12, -86400),
            b"x",
        )
        .pax(&[("mtime", b"-0.5")])
        .file("half-second-before-epoch", b"x");
    // PAX size decides where the next header is; the header's size says 0.
    t.pax(&[("size", b"5000")])
        .header(Hdr::new("sized", b'0'))
        .data(&[b'z'; 5000]);
    t.pax(&[("linkpath", b"sized")])
        .header(Hdr::new("hard", b'1').link("wrong"))
        .pax(&[("path", long_target.as_bytes())])
        .file("placeholder", b"long")
        .pax(&[("linkpath", long_target.as_bytes())])
        .symlink("long-link", "wrong")
        // Old Go (so old Docker) wrote the file type into the mode.
        .entry(Hdr::new("typed-mode", b'0').mode(0o100640), b"x")
        .pax_of(b'g', &[("comment", b"git archive writes its commit here")])
        .file("after-global", b"x");
    t.end()
}

/// A tar of 200 files of many sizes, some with PAX records and GNU long names; the
/// offset where its end-of-archive marker ends, and that of the 116th file's headers.
pub fn two_hundred_files() -> (Vec<u8>, usize, usize) {
    let mut t = Tar::default();
    let mut before_116 = 0;
    t.dir("dir");
    for i in 0..200usize {
        if i == 115 {
            before_116 = t.0.len();
        }
        let data = vec![b'a' + (i % 26) as u8; (i * 37) % 1500];
        match i % 10 {
            3 => t.pax(&[
                ("path", format!("dir/{}-{i}", "p".repeat(150)).as_bytes()),
                ("mtime", b"1700000000.5"),
            ]),
            7 => t.long(b'L', format!("dir/{}-{i}", "g".repeat(120)).as_bytes()),
            _ => &mut t,
        };
        t.file(&format!("dir/f{i}"), &data);
    }
    let len = t.0.len() + 2 * BLOCK;
    (t.end(), len, before_116)
}

pub fn lookup_id(tree: &Tree, path: &str) -> usize {
    let mut at = Tree::ROOT;
    for part in path.split('/') {
        at = tree
            .children(at)
            .iter()
            .find(|(n, _)| n == part.as_bytes())
            .unwrap()
            .1;
    }
    at
}

/// The top layer of `whiteouts_stack_as_overlayfs_reads_them`.
pub fn whiteouts_top() -> Vec<u8> {
    Tar::default()
        // The layer's root says opaque: overlayfs never reads that on a root.
        .pax(&[("SCHILY.xattr.trusted.overlay.opaque", b"y")])
        .dir("./")
        // Deleted, then made again as a directory (its parent implied): only the new.
        .file(".wh.d", b"")
        .file("d/new", b"new")
        // Made opaque before its own entry: it stays opaque.
        .file("e/.wh..wh..opq", b"")
        .dir("e")
        .file("e/mine", b"mine")
        // A file of this layer, then a whiteout of it: whiteouts hide lower layers only.
        .file("f", b"top f")
        .file(".wh.f", b"")
        // Deleted, then a directory again: nothing of the lower one shows.
        .file(".wh.g", b"")
        .dir("g")
        .file("g/top", b"top")
        .end()
}

/// Headers odd in ways GNU tar, Go's archive/tar and Python's tarfile all read alike:
/// the importer reads them so too (GNU tar and Python as oracles; Go's reading in the
/// comments).
pub fn headers_all_readers_agree_on() -> Vec<(&'static str, Vec<u8>)> {
    let f = |name: &str| Hdr::new(name, b'0');
    // A signed-char checksum (old BSD tars): the UTF-8 é counts as two negative bytes.
    let signed = {
        let mut b = f("caf\u{e9}").size(1).0;
        b[148..156].fill(b' ');
        let sum: i32 = b.iter().map(|&c| c as i8 as i32).sum();
        b[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        let mut t = Tar::default();
        t.0.extend_from_slice(&b);
        t.data(b"x").end()
    };
    vec![
        // A V7 file (typeflag NUL) named with a slash, from the header alone: a directory.
        (
            "v7-directory.tar",
            Tar::default()
                .header(Hdr::new("d/", 0).mode(0o750))
                .file("d/f", b"x")
                .end(),
        ),
        // A star header whose prefix ends within its 131 bytes.
        (
            "star-short-prefix.tar",
            one(f("f").raw(345, b"usr\0").raw(508, b"tar\0"), b"x"),
        ),
        // A USTAR prefix of all 155 bytes, no NUL: there is no star trailer.
        (
            "ustar-155-byte-prefix.tar",
            one(f("f").raw(345, &[b'p'; 155]), b"x"),
        ),
        // A GNU header with no atime and a ctime that is no number (Go falls back to
        // the prefix, which is empty).
        (
            "gnu-ctime-not-a-time.tar",
            one(f("f").raw(257, b"ustar  \0").raw(357, b"junk"), b"x"),
        ),
        // Digits ended by a NUL, then anything (all three stop at the NUL); leading and
        // trailing spaces; spaces then NULs, read as 0.
        (
            "octal-terminators.tar",
            Tar::default()
                .header(
                    f("f")
                        .raw(100, b"644\0junk")
                        .raw(108, b"   1750 ")
                        .raw(116, b"  \0\0\0\0\0\0")
                        .raw(124, b" 1  \0\0\0\0\0\0\0\0"),
                )
                .data(b"x")
                .end(),
        ),
        ("signed-checksum.tar", signed),
        // GNU base-256 ids, beyond what 7 octal digits hold.
        (
            "base256-ids.tar",
            one(
                f("f")
                    .base256(108, 8, 3_000_000)
                    .base256(116, 8, 4_294_967_294),
                b"x",
            ),
        ),
    ]
}
