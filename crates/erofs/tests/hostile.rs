//! Hand-crafted tiny images: directory parsing edge cases and hostile inputs. Each test
//! starts from one valid 6-block image and breaks exactly one thing.

use erofs::format::{self, Dirent, DiskInode, Superblock};
use erofs::read::{exercise, fsck, Error, Image, Inode};

const BS: usize = 4096;
const ROOT: u64 = 36;
const SUB: u64 = 40;
const FILE: u64 = 44;
const BIG: u64 = 48;
const LINK: u64 = 52;
const XFILE: u64 = 56;
const CHUNKED: u64 = 60;
const EPOCH: u64 = 1_600_000_000;
/// Shared xattr id 896 → byte 3584 of block 0 (xattr_blkaddr 0).
const SHARED_ID: u32 = 896;

fn ioff(nid: u64) -> usize {
    nid as usize * 32
}

fn put16(img: &mut [u8], off: usize, v: u16) {
    img[off..off + 2].copy_from_slice(&v.to_le_bytes());
}
fn put32(img: &mut [u8], off: usize, v: u32) {
    img[off..off + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(img: &mut [u8], off: usize, v: u64) {
    img[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// Serialises a directory block (entries must be given sorted); returns the used size.
fn write_dir(img: &mut [u8], at: usize, ents: &[(&[u8], u64, u8)]) -> usize {
    let mut nameoff = ents.len() * 12;
    for (i, (name, nid, ft)) in ents.iter().enumerate() {
        Dirent {
            nid: *nid,
            nameoff: nameoff as u16,
            file_type: *ft,
        }
        .encode(&mut img[at + i * 12..]);
        img[at + nameoff..at + nameoff + name.len()].copy_from_slice(name);
        nameoff += name.len();
    }
    nameoff
}

fn inode(mode: u16, layout: u16, size: u64, i_u: u32, nlink: u32) -> DiskInode {
    DiskInode {
        extended: false,
        format: format::inode_format(false, layout),
        mode,
        nlink,
        size,
        i_u,
        ..Default::default()
    }
}

fn root_entries() -> Vec<(&'static [u8], u64, u8)> {
    vec![
        (b".", ROOT, format::FT_DIR),
        (b"..", ROOT, format::FT_DIR),
        (b"big", BIG, format::FT_REG_FILE),
        (b"chunked", CHUNKED, format::FT_REG_FILE),
        (b"file", FILE, format::FT_REG_FILE),
        (b"link", LINK, format::FT_SYMLINK),
        (b"sub", SUB, format::FT_DIR),
        (b"xfile", XFILE, format::FT_REG_FILE),
    ]
}

/// The valid base image:
/// block 0: superblock, inodes 36.., shared xattr at 3584; block 1: root dir; block 2: sub dir;
/// blocks 3–4: "big" (4106 bytes); block 5: data of the chunked file (chunks 0 and 2; 1 is a hole).
fn base() -> Vec<u8> {
    let mut img = vec![0u8; 6 * BS];
    let root_size = write_dir(&mut img, BS, &root_entries());
    set_root_size(&mut img, root_size as u64);
    let sub_size = write_dir(
        &mut img,
        2 * BS,
        &[(b".", SUB, format::FT_DIR), (b"..", ROOT, format::FT_DIR)],
    );
    inode(format::S_IFDIR | 0o755, 0, root_size as u64, 1, 3).encode(&mut img[ioff(ROOT)..]);
    inode(format::S_IFDIR | 0o700, 0, sub_size as u64, 2, 2).encode(&mut img[ioff(SUB)..]);
    inode(format::S_IFREG | 0o644, 2, 5, u32::MAX, 1).encode(&mut img[ioff(FILE)..]);
    img[ioff(FILE) + 32..ioff(FILE) + 37].copy_from_slice(b"hello");
    inode(format::S_IFREG | 0o600, 0, 4106, 3, 1).encode(&mut img[ioff(BIG)..]);
    for (i, b) in img[3 * BS..3 * BS + 4106].iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    inode(format::S_IFLNK | 0o777, 2, 4, 0, 1).encode(&mut img[ioff(LINK)..]);
    img[ioff(LINK) + 32..ioff(LINK) + 36].copy_from_slice(b"file");
    // xfile: body = header(12) + 1 shared id (4) + inline "user.foo"="bar" (12) = 28 bytes.
    let mut x = inode(format::S_IFREG | 0o644, 0, 0, 0, 1);
    x.xattr_icount = (28 - 12) / 4 + 1;
    x.encode(&mut img[ioff(XFILE)..]);
    let body = ioff(XFILE) + 32;
    put32(&mut img, body, 0); // filter 0: "maybe present" for every name
    img[body + 4] = 1;
    put32(&mut img, body + 12, SHARED_ID);
    img[body + 16..body + 28]
        .copy_from_slice(&[3, 1, 3, 0, b'f', b'o', b'o', b'b', b'a', b'r', 0, 0]);
    // Shared entry "user.shared" = "s".
    let sh = SHARED_ID as usize * 4;
    img[sh..sh + 12].copy_from_slice(&[6, 1, 1, 0, b's', b'h', b'a', b'r', b'e', b'd', b's', 0]);
    // chunked: extended, 3 chunks of one block, 4-byte map [5, hole, 5].
    let mut c = inode(
        format::S_IFREG | 0o644,
        format::LAYOUT_CHUNK_BASED,
        3 * BS as u64,
        0,
        1,
    );
    c.extended = true;
    c.format = format::inode_format(true, format::LAYOUT_CHUNK_BASED);
    c.mtime = 42;
    c.mtime_nsec = 7;
    c.encode(&mut img[ioff(CHUNKED)..]);
    let idx = ioff(CHUNKED) + 64;
    put32(&mut img, idx, 5);
    put32(&mut img, idx + 4, format::NULL_ADDR);
    put32(&mut img, idx + 8, 5);
    img[5 * BS..6 * BS].fill(0xC5);
    let sb = Superblock {
        feature_compat: format::FEATURE_COMPAT_MTIME,
        blkszbits: 12,
        root_nid: ROOT as u16,
        inos: 7,
        epoch: EPOCH,
        fixed_nsec: 99,
        blocks: 6,
        feature_incompat: format::FEATURE_INCOMPAT_CHUNKED_FILE,
        ..Default::default()
    };
    img[1024..1024 + 128].copy_from_slice(&sb.encode());
    img
}

fn set_root_size(img: &mut [u8], size: u64) {
    put32(img, ioff(ROOT) + 8, size as u32);
}

/// The base image with sub's directory block holding only `ents`, sized to fit them.
fn with_sub_entries(ents: &[(&[u8], u64, u8)]) -> Vec<u8> {
    let mut m = base();
    m[2 * BS..3 * BS].fill(0);
    let used = write_dir(&mut m, 2 * BS, ents);
    put32(&mut m, ioff(SUB) + 8, used as u32);
    m
}

/// fsck of `img` (reporting up to `max` problems) reports one containing `want`.
fn assert_fsck_finds(img: &Image<Vec<u8>>, max: usize, want: &str) {
    let r = fsck(img, max);
    assert!(
        r.problems.iter().any(|p| p.contains(want)),
        "no problem with {want:?} in {:#?}",
        r.problems
    );
}

/// getxattr of `name` on `inode` answers `want`.
fn assert_xattr(img: &Image<Vec<u8>>, inode: &Inode, name: &[u8], want: Option<&[u8]>) {
    assert_eq!(
        img.getxattr(inode, name).unwrap().as_deref(),
        want,
        "{}",
        String::from_utf8_lossy(name)
    );
}

fn open(img: Vec<u8>) -> Image<Vec<u8>> {
    Image::open(img).unwrap_or_else(|e| panic!("open: {e}"))
}

fn corrupt_msg(r: Result<impl std::fmt::Debug, Error>) -> String {
    match r {
        Err(e @ Error::Corrupt { .. }) => {
            let s = e.to_string();
            assert!(
                s.contains("at byte ") && !s.contains('\n'),
                "not one line with an offset: {s}"
            );
            s
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

fn unsupported_msg(r: Result<impl std::fmt::Debug, Error>) -> String {
    match r {
        Err(e @ Error::Unsupported { .. }) => e.to_string(),
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

fn readdir_all(img: &Image<Vec<u8>>, nid: u64) -> Result<Vec<Vec<u8>>, Error> {
    let d = img.inode(nid)?;
    img.readdir(&d, 0)?.map(|e| e.map(|e| e.name)).collect()
}

fn with_checksum(mut img: Vec<u8>) -> Vec<u8> {
    let compat = u32::from_le_bytes(img[1032..1036].try_into().unwrap());
    put32(&mut img, 1032, compat | format::FEATURE_COMPAT_SB_CHKSUM);
    let c = format::superblock_checksum(&img, BS).unwrap();
    put32(&mut img, 1028, c);
    img
}

// ---------------------------------------------------------------------------------------
// The valid image

#[test]
fn base_image_reads_and_checks_clean() {
    let img = open(base());
    let root = img.inode(ROOT).unwrap();
    assert!(root.is_dir());
    assert_eq!(root.mtime, EPOCH as i64);
    assert_eq!(root.mtime_nsec, 99);
    let names = readdir_all(&img, ROOT).unwrap();
    let want: Vec<Vec<u8>> = root_entries().iter().map(|e| e.0.to_vec()).collect();
    assert_eq!(names, want);
    for (name, nid, _) in root_entries() {
        assert_eq!(
            img.lookup(&root, name).unwrap().map(|e| e.nid),
            Some(nid),
            "{name:?}"
        );
    }
    assert_eq!(img.lookup(&root, b"filf").unwrap(), None);
    assert_eq!(img.lookup(&root, b"a").unwrap(), None);
    assert_eq!(img.lookup(&root, b"zzz").unwrap(), None);

    let file = img.inode(FILE).unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(img.read(&file, 0, &mut buf).unwrap(), 5);
    assert_eq!(&buf[..5], b"hello");
    assert_eq!(img.read(&file, 2, &mut buf[..2]).unwrap(), 2);
    assert_eq!(&buf[..2], b"ll");
    assert_eq!(img.read(&file, 5, &mut buf).unwrap(), 0);
    assert_eq!(img.read(&file, u64::MAX, &mut buf).unwrap(), 0);

    let big = img.inode(BIG).unwrap();
    let mut data = vec![0u8; 5000];
    assert_eq!(img.read(&big, 0, &mut data).unwrap(), 4106);
    assert!(data[..4106]
        .iter()
        .enumerate()
        .all(|(i, &b)| b == (i % 251) as u8));

    let link = img.inode(LINK).unwrap();
    assert_eq!(img.readlink(&link).unwrap(), b"file");
    assert!(matches!(
        img.readlink(&file),
        Err(Error::NotASymlink { nid: FILE, .. })
    ));
    assert!(matches!(
        img.readdir(&file, 0),
        Err(Error::NotADirectory { nid: FILE, .. })
    ));
    assert!(matches!(
        img.lookup(&file, b"x"),
        Err(Error::NotADirectory { .. })
    ));

    let ch = img.inode(CHUNKED).unwrap();
    assert_eq!((ch.mtime, ch.mtime_nsec), (42, 7));
    let mut all = vec![0u8; 3 * BS];
    assert_eq!(img.read(&ch, 0, &mut all).unwrap(), 3 * BS);
    assert!(all[..BS].iter().all(|&b| b == 0xC5));
    assert!(
        all[BS..2 * BS].iter().all(|&b| b == 0),
        "hole reads as zeros"
    );
    assert!(all[2 * BS..].iter().all(|&b| b == 0xC5));
    let info = img.layout_info(&ch);
    assert_eq!(info.chunk_count, 3);
    assert_eq!(info.chunk_size, Some(BS as u64));
    let hole = img.map(&ch, BS as u64 + 5).unwrap();
    assert_eq!(
        (hole.logical, hole.len, hole.physical),
        (BS as u64, BS as u64, None)
    );

    let x = img.inode(XFILE).unwrap();
    assert_eq!(
        img.listxattr(&x).unwrap(),
        vec![b"user.foo".to_vec(), b"user.shared".to_vec()]
    );
    assert_xattr(&img, &x, b"user.foo", Some(b"bar"));
    assert_xattr(&img, &x, b"user.shared", Some(b"s"));
    assert_xattr(&img, &x, b"user.fo", None);
    assert_xattr(&img, &x, b"trusted.foo", None);
    assert_xattr(&img, &x, b"system.foo", None);
    assert_xattr(&img, &file, b"user.foo", None);

    let report = fsck(&img, 50);
    assert!(report.is_clean(), "{:#?}", report.problems);
    assert_eq!((report.inodes, report.dirs, report.files), (7, 2, 5));
    assert!(exercise(&img, 10_000) > 0);
}

#[test]
fn readdir_offsets_are_kernel_positions_and_resumable() {
    let img = open(base());
    let root = img.inode(ROOT).unwrap();
    let ents: Vec<_> = img.readdir(&root, 0).unwrap().map(Result::unwrap).collect();
    for (i, e) in ents.iter().enumerate() {
        // Positions are logical: block index in the directory * bs + 12 * dirent index.
        assert_eq!(e.offset, (12 * i) as u64);
        let rest: Vec<_> = img
            .readdir(&root, e.next_offset)
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(rest.as_slice(), &ents[i + 1..]);
    }
    assert_eq!(ents.last().unwrap().next_offset, root.size);
    // A position inside a dirent rounds up to the next one (kernel dir.c).
    let r: Vec<_> = img
        .readdir(&root, 13)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(r.first().unwrap().name, b"big");
    // A position inside the name area has nothing more in this block.
    assert_eq!(img.readdir(&root, 100).unwrap().count(), 0);
    assert_eq!(img.readdir(&root, u64::MAX).unwrap().count(), 0);
}

#[test]
fn checksum_is_verified() {
    let img = with_checksum(base());
    open(img.clone());
    let mut bad = img.clone();
    bad[ioff(FILE) + 33] ^= 1; // inside the covered first block
    assert!(corrupt_msg(Image::open(bad)).contains("checksum"));
    // Bytes outside the first block are not covered.
    let mut ok = img;
    ok[3 * BS] ^= 1;
    open(ok);
}

// ---------------------------------------------------------------------------------------
// Superblock

#[test]
fn superblock_rejections() {
    let mut m = base();
    m[1024] ^= 0xFF;
    assert!(corrupt_msg(Image::open(m)).contains("bad magic"));

    for bits in [0u8, 8, 17, 255] {
        let mut m = base();
        m[1024 + 0x0C] = bits;
        unsupported_msg(Image::open(m));
    }
    let mut m = base();
    put32(&mut m, 1024 + 0x50, 0x100); // not yet defined
    assert!(unsupported_msg(Image::open(m)).contains("incompatible features 0x100"));
    let mut m = base();
    put32(&mut m, 1024 + 0x50, 0x80); // 48BIT
    unsupported_msg(Image::open(m));
    let mut m = base();
    m[1024 + 0x5A] = 1;
    assert!(unsupported_msg(Image::open(m)).contains("dirblkbits"));
    // COMPR_CFGS with an unknown algorithm bit.
    let mut m = base();
    put32(&mut m, 1024 + 0x50, 0x2);
    put16(&mut m, 1024 + 0x54, 1 << 5);
    assert!(unsupported_msg(Image::open(m)).contains("compression algorithms 0x20"));
    let mut m = base();
    m[1024 + 0x0D] = 255; // 128 + 16 * 255 bytes of superblock
    corrupt_msg(Image::open(m));

    // Root must be a directory.
    let mut m = base();
    put16(&mut m, 1024 + 0x0E, FILE as u16);
    assert!(corrupt_msg(Image::open(m)).contains("not a directory"));
    // Root nid past the end.
    let mut m = base();
    put16(&mut m, 1024 + 0x0E, u16::MAX);
    corrupt_msg(Image::open(m));

    // Every truncation fails cleanly or opens.
    let full = base();
    for len in [0, 1, 1023, 1024, 1100, 1151, 1152, 1183, 1184, 4095, 4096] {
        let r = Image::open(full[..len].to_vec());
        if len < 1184 {
            corrupt_msg(r);
        }
    }
}

#[test]
fn long_prefix_table() {
    let mut m = base();
    put32(
        &mut m,
        1024 + 0x50,
        format::FEATURE_INCOMPAT_CHUNKED_FILE | format::FEATURE_INCOMPAT_XATTR_PREFIXES,
    );
    m[1024 + 0x5B] = 1;
    put32(&mut m, 1024 + 0x5C, 3072 / 4);
    put16(&mut m, 3072, 9);
    m[3074] = format::XATTR_INDEX_TRUSTED;
    m[3075..3083].copy_from_slice(b"overlay.");
    // Inline entry becomes long-prefix 0 + "rdr" → trusted.overlay.rdr.
    let e = ioff(XFILE) + 32 + 16;
    m[e..e + 12].copy_from_slice(&[3, 0x80, 3, 0, b'r', b'd', b'r', b'/', b'x', b'y', 0, 0]);
    let img = open(m.clone());
    let x = img.inode(XFILE).unwrap();
    assert_eq!(img.listxattr(&x).unwrap()[0], b"trusted.overlay.rdr");
    assert_xattr(&img, &x, b"trusted.overlay.rdr", Some(b"/xy"));
    assert_xattr(&img, &x, b"trusted.rdr", None);
    assert_xattr(&img, &x, b"user.overlay.rdr", None);
    // Filter bit is computed from the base index and the full suffix.
    let bit = format::xattr_filter_bit(format::XATTR_INDEX_TRUSTED, b"overlay.rdr");
    let mut f = m.clone();
    put32(&mut f, 1024 + 0x08, format::FEATURE_COMPAT_XATTR_FILTER);
    put32(
        &mut f,
        ioff(XFILE) + 32,
        !(1u32 << bit) & !(1 << format::xattr_filter_bit(1, b"shared")),
    );
    let img = open(f);
    let x = img.inode(XFILE).unwrap();
    assert_xattr(&img, &x, b"trusted.overlay.rdr", Some(b"/xy"));
    assert!(fsck(&img, 10).is_clean());
    // An out-of-range long prefix index is skipped, as the kernel does.
    let mut o = m.clone();
    o[e + 1] = 0x85;
    let img = open(o);
    let x = img.inode(XFILE).unwrap();
    assert_eq!(img.listxattr(&x).unwrap(), vec![b"user.shared".to_vec()]);
    // Record length 0 or > 256 is refused at open.
    let mut z = m.clone();
    put16(&mut z, 3072, 0);
    corrupt_msg(Image::open(z));
    let mut z = m;
    put32(&mut z, 1024 + 0x5C, u32::MAX);
    corrupt_msg(Image::open(z));
}

// ---------------------------------------------------------------------------------------
// Inodes

#[test]
fn inode_rejections() {
    let bad = |f: &dyn Fn(&mut Vec<u8>), nid: u64| {
        let mut m = base();
        f(&mut m);
        open(m).inode(nid)
    };
    // i_format bit 4 (6.15 NLINK_1 / DOT_OMITTED) and higher.
    unsupported_msg(bad(&|m| put16(m, ioff(FILE), 0x10 | 4), FILE));
    unsupported_msg(bad(&|m| put16(m, ioff(FILE), 0x8000), FILE));
    // Compressed layout: the inode opens, its data (here no map header) does not.
    let mut m = base();
    put16(&mut m, ioff(FILE), 1 << 1);
    let img = open(m);
    let ino = img.inode(FILE).unwrap();
    assert!(img.read(&ino, 0, &mut [0u8; 16]).is_err());
    // Reserved layouts.
    unsupported_msg(bad(&|m| put16(m, ioff(FILE), 5 << 1), FILE));
    unsupported_msg(bad(&|m| put16(m, ioff(FILE), 7 << 1), FILE));
    // Unknown file type.
    assert!(corrupt_msg(bad(&|m| put16(m, ioff(FILE) + 4, 0o644), FILE)).contains("file type"));
    assert!(corrupt_msg(bad(&|m| put16(m, ioff(FILE) + 4, 0o170644), FILE)).contains("file type"));
    // Negative size (extended).
    assert!(
        corrupt_msg(bad(&|m| put64(m, ioff(CHUNKED) + 8, u64::MAX), CHUNKED)).contains("negative")
    );
    // Extended i_nb (48-bit start block on 6.15+).
    unsupported_msg(bad(&|m| put16(m, ioff(CHUNKED) + 6, 1), CHUNKED));
    // Metabox nid bit and nids past the end.
    let img = open(base());
    unsupported_msg(img.inode(1 << 63));
    corrupt_msg(img.inode(u64::MAX >> 1));
    corrupt_msg(img.inode((6 * BS / 32) as u64));
    // A slot of 32 zero bytes: a compact inode with mode 0, an invalid type.
    assert!(corrupt_msg(img.inode((5 * BS / 32) as u64 - 1)).contains("file type"));
}

#[test]
fn compact_mtime_adds_epoch() {
    let mut m = base();
    put32(&mut m, ioff(FILE) + 0x0C, 1000);
    let img = open(m);
    let f = img.inode(FILE).unwrap();
    assert_eq!((f.mtime, f.mtime_nsec), (EPOCH as i64 + 1000, 99));
}

#[test]
fn data_layout_rejections() {
    // FLAT_PLAIN data past the end of the image.
    let mut m = base();
    put32(&mut m, ioff(BIG) + 0x10, 5);
    assert!(corrupt_msg(open(m).inode(BIG)).contains("past the end"));
    // A size that does not fit the blocks either.
    let mut m = base();
    put32(&mut m, ioff(BIG) + 8, u32::MAX);
    corrupt_msg(open(m).inode(BIG));
    // FLAT_INLINE tail crossing a block: inode at 4032, tail at 4064, 40 bytes.
    let mut m = base();
    let nid = 4032 / 32;
    inode(format::S_IFREG | 0o644, 2, 40, 0, 1).encode(&mut m[ioff(nid)..]);
    assert!(corrupt_msg(open(m).inode(nid)).contains("crosses a block boundary"));
    // ... but a tail starting exactly at the next block is fine.
    let mut m = base();
    let nid = 4064 / 32;
    inode(format::S_IFREG | 0o644, 2, 40, 0, 1).encode(&mut m[ioff(nid)..]);
    let img = open(m);
    assert_eq!(img.inode(nid).unwrap().size, 40);
    // Symlink targets above 4095 bytes are refused without allocating them.
    let mut m = base();
    put32(&mut m, ioff(LINK) + 8, 5000);
    put16(&mut m, ioff(LINK), 0); // FLAT_PLAIN at block 0: inside the image
    let img = open(m);
    let l = img.inode(LINK).unwrap();
    assert!(corrupt_msg(img.readlink(&l)).contains("exceeds 4095"));
}

#[test]
fn chunk_rejections() {
    let ch = ioff(CHUNKED);
    // Absurd sizes: the index array would run past the image.
    for size in [u64::MAX >> 1, 1 << 62, 1 << 40] {
        let mut m = base();
        put64(&mut m, ch + 8, size);
        assert!(
            corrupt_msg(open(m).inode(CHUNKED)).contains("chunk index array"),
            "size {size}"
        );
    }
    // 2^40 bytes in one 2^43-byte chunk: the index fits, the data does not.
    let mut m = base();
    put64(&mut m, ch + 8, 1 << 40);
    put16(&mut m, ch + 0x10, 31);
    let img = open(m.clone());
    let c = img.inode(CHUNKED).unwrap();
    let mut buf = [0u8; 64];
    assert!(corrupt_msg(img.read(&c, 0, &mut buf)).contains("chunk 0 data"));
    // ... and as one huge hole it reads zeros at any offset, instantly.
    put32(&mut m, ch + 64, format::NULL_ADDR);
    let img = open(m);
    let c = img.inode(CHUNKED).unwrap();
    buf.fill(1);
    assert_eq!(img.read(&c, (1 << 40) - 10, &mut buf).unwrap(), 10);
    assert!(buf[..10].iter().all(|&b| b == 0));
    // Unknown chunk format bits (0x40 = 48-bit indexes).
    let mut m = base();
    put16(&mut m, ch + 0x10, 0x40);
    unsupported_msg(open(m).inode(CHUNKED));
    // A block address past the end.
    let mut m = base();
    put32(&mut m, ch + 64 + 8, 6);
    let img = open(m);
    let c = img.inode(CHUNKED).unwrap();
    let mut all = vec![0u8; 3 * BS];
    assert!(corrupt_msg(img.read(&c, 0, &mut all)).contains("chunk 2"));
    // 8-byte indexes: device_id must be 0, startblk_hi must be 0, hole = lo 0xFFFFFFFF.
    let mut m = base();
    put16(&mut m, ch + 0x10, format::CHUNK_FORMAT_INDEXES);
    let idx = ch + 64;
    m[idx..idx + 24].fill(0);
    put32(&mut m, idx + 4, 5);
    put32(&mut m, idx + 12, format::NULL_ADDR);
    put16(&mut m, idx + 8 + 2, 9); // device id on a hole: ignored
    put32(&mut m, idx + 20, 5);
    let img = open(m.clone());
    let c = img.inode(CHUNKED).unwrap();
    let mut all = vec![0u8; 3 * BS];
    img.read(&c, 0, &mut all).unwrap();
    assert!(all[BS..2 * BS].iter().all(|&b| b == 0) && all[2 * BS] == 0xC5);
    put16(&mut m, idx + 16 + 2, 1);
    let img = open(m.clone());
    let c = img.inode(CHUNKED).unwrap();
    assert!(unsupported_msg(img.read(&c, 0, &mut all)).contains("device"));
    put16(&mut m, idx + 16 + 2, 0);
    put16(&mut m, idx + 16, 1);
    let img = open(m);
    let c = img.inode(CHUNKED).unwrap();
    unsupported_msg(img.read(&c, 0, &mut all));
}

// ---------------------------------------------------------------------------------------
// Directories (reference §9.5)

fn root_dir_error(f: &dyn Fn(&mut Vec<u8>)) -> String {
    let mut m = base();
    f(&mut m);
    let img = open(m);
    corrupt_msg(readdir_all(&img, ROOT))
}

#[test]
fn dirent_nameoff_checks() {
    let s = root_dir_error(&|m| put16(m, BS + 8, 7));
    assert!(s.contains("nameoff 7 outside [12,"), "{s}");
    let s = root_dir_error(&|m| put16(m, BS + 8, 19));
    assert!(s.contains("nameoff 19 is not a multiple of 12"), "{s}");
    assert!(
        s.starts_with(&format!(
            "corrupt image at byte {BS}: directory 36 block 0 dirent 0"
        )),
        "{s}"
    );
    let s = root_dir_error(&|m| put16(m, BS + 8, 0));
    assert!(s.contains("outside"), "{s}");
    // nameoff0 at or past the used size of the block.
    let used = u16::from_le_bytes([base()[ioff(ROOT) + 8], base()[ioff(ROOT) + 9]]);
    let s = root_dir_error(&move |m| put16(m, BS + 8, used));
    assert!(s.contains("outside"), "{s}");
    let s = root_dir_error(&|m| put16(m, BS + 8, 4092));
    assert!(s.contains("outside"), "{s}");
    // The trailing dirent's nameoff past the block (upstream d18a3b5d337f).
    let last = BS + 7 * 12 + 8;
    let s = root_dir_error(&move |m| put16(m, last, used));
    assert!(
        s.contains("dirent 7: nameoff") && s.contains("past the block"),
        "{s}"
    );
    let s = root_dir_error(&move |m| put16(m, last, u16::MAX));
    assert!(s.contains("past the block"), "{s}");
    // Decreasing nameoffs.
    let s = root_dir_error(&|m| put16(m, BS + 3 * 12 + 8, 97));
    assert!(s.contains("does not increase"), "{s}");
    // A block too small for one dirent.
    let s = root_dir_error(&|m| set_root_size(m, 11));
    assert!(s.contains("less than one dirent"), "{s}");
}

#[test]
fn dirent_name_checks() {
    let base_used = u16::from_le_bytes([base()[ioff(ROOT) + 8], base()[ioff(ROOT) + 9]]) as usize;
    // An empty trailing name: the last nameoff points at zero padding.
    let s = root_dir_error(&move |m| {
        set_root_size(m, base_used as u64 + 4);
        put16(m, BS + 7 * 12 + 8, base_used as u16);
    });
    // "xfile" becomes part of "sub"'s name ("subxfile"), then an empty name.
    assert!(s.contains("empty name"), "{s}");
    // '/' and NUL inside names.
    let s = root_dir_error(&move |m| m[BS + base_used - 2] = b'/');
    assert!(s.contains("contains '/' or NUL"), "{s}");
    let s = root_dir_error(&|m| {
        let off = u16::from_le_bytes([m[BS + 4 * 12 + 8], m[BS + 4 * 12 + 9]]) as usize;
        m[BS + off + 1] = 0; // "f\0le"
    });
    assert!(s.contains("contains '/' or NUL"), "{s}");
    // Names up to 255 bytes are fine, 256 are not.
    for (len, ok) in [(255usize, true), (256, false), (3000, false)] {
        let mut m = base();
        let name = vec![b'z'; len];
        let mut ents: Vec<(&[u8], u64, u8)> = root_entries();
        ents.push((&name, FILE, format::FT_REG_FILE));
        m[BS..2 * BS].fill(0);
        let used = write_dir(&mut m, BS, &ents);
        set_root_size(&mut m, used.min(BS) as u64);
        if used > BS {
            // Name runs to the end of the block without a NUL.
            set_root_size(&mut m, BS as u64);
        }
        let img = open(m);
        let r = readdir_all(&img, ROOT);
        if ok {
            assert_eq!(r.unwrap().last().unwrap().len(), 255);
            let root = img.inode(ROOT).unwrap();
            assert_eq!(img.lookup(&root, &name).unwrap().unwrap().nid, FILE);
        } else {
            assert!(corrupt_msg(r).contains("exceeds 255"), "len {len}");
        }
    }
}

/// Byte offset in block 1 (the root directory) of the name of dirent `i`.
fn root_name_at(m: &[u8], i: usize) -> usize {
    BS + u16::from_le_bytes([m[BS + i * 12 + 8], m[BS + i * 12 + 9]]) as usize
}

/// Every lookup in the root answers `Corrupt` (its only block is refused), and fsck says so.
fn root_block_refused(img: &Image<Vec<u8>>, want: &str) {
    let root = img.inode(ROOT).unwrap();
    for (name, _, _) in root_entries() {
        let s = corrupt_msg(img.lookup(&root, name));
        assert!(s.contains(want), "lookup {name:?}: {s}");
    }
    let r = fsck(img, 50);
    assert!(
        r.problems.iter().any(|p| p.contains(want)),
        "{:#?}",
        r.problems
    );
}

#[test]
fn unsorted_names_are_refused_by_readdir_lookup_and_fsck() {
    let mut m = base();
    // Swap the bytes of "file" and "link" (same length): order becomes ... link, file ...
    let (a, b) = (root_name_at(&m, 4), root_name_at(&m, 5));
    m[a..a + 4].copy_from_slice(b"link");
    m[b..b + 4].copy_from_slice(b"file");
    // Keep types consistent with the renamed targets.
    m[BS + 4 * 12 + 10] = format::FT_REG_FILE;
    m[BS + 5 * 12 + 10] = format::FT_SYMLINK;
    let img = open(m);
    let s = corrupt_msg(readdir_all(&img, ROOT));
    let want = "name \"file\" does not sort after \"link\"";
    assert!(
        s.starts_with(&format!(
            "corrupt image at byte {}: directory 36 block 0 dirent 5: {want}",
            BS + 5 * 12
        )),
        "{s}"
    );
    // Listing stops at the bad entry: what came before was in order.
    let listed: Vec<_> = img
        .readdir(&img.inode(ROOT).unwrap(), 0)
        .unwrap()
        .map_while(|e| e.ok())
        .map(|e| e.name)
        .collect();
    assert_eq!(listed.len(), 0, "the block is refused whole: {listed:?}");
    root_block_refused(&img, want);
}

#[test]
fn duplicate_names_are_refused_by_readdir_lookup_and_fsck() {
    // "link" renamed "file": two entries of one name, a file then a symlink.
    let mut m = base();
    let b = root_name_at(&m, 5);
    m[b..b + 4].copy_from_slice(b"file");
    let img = open(m);
    let s = corrupt_msg(readdir_all(&img, ROOT));
    let want = "dirent 5: name \"file\" does not sort after \"file\"";
    assert!(s.contains(want), "{s}");
    root_block_refused(&img, want);

    // ".." given twice (the second one instead of "big", pointing at its file).
    let mut m = base();
    let mut ents = root_entries();
    ents[2].0 = b"..";
    m[BS..2 * BS].fill(0);
    let used = write_dir(&mut m, BS, &ents);
    set_root_size(&mut m, used as u64);
    let img = open(m);
    let s = corrupt_msg(readdir_all(&img, ROOT));
    assert!(
        s.contains("dirent 2: name \"..\" does not sort after \"..\""),
        "{s}"
    );
}

/// `base()` with the sub directory (nid 40) in two appended blocks, 6 and 7.
fn two_block_sub(first: &[(&[u8], u64, u8)], second: &[(&[u8], u64, u8)]) -> Image<Vec<u8>> {
    let mut m = base();
    m.resize(8 * BS, 0);
    write_dir(&mut m, 6 * BS, first);
    let used = write_dir(&mut m, 7 * BS, second);
    inode(format::S_IFDIR | 0o700, 0, (BS + used) as u64, 6, 2).encode(&mut m[ioff(SUB)..]);
    open(m)
}

#[test]
fn names_must_increase_across_directory_blocks() {
    let head: Vec<(&[u8], u64, u8)> = vec![
        (b".", SUB, format::FT_DIR),
        (b"..", ROOT, format::FT_DIR),
        (b"m", FILE, format::FT_REG_FILE),
    ];
    // The valid case first: both blocks list, and lookups reach the second one.
    let img = two_block_sub(&head, &[(b"z", BIG, format::FT_REG_FILE)]);
    assert_eq!(readdir_all(&img, SUB).unwrap().len(), 4);
    let sub = img.inode(SUB).unwrap();
    assert_eq!(img.lookup(&sub, b"z").unwrap().unwrap().nid, BIG);
    assert!(fsck(&img, 50).problems.iter().all(|p| !p.contains("sort")));
    for (second, shown) in [(&b"m"[..], "m"), (b"a", "a")] {
        let img = two_block_sub(&head, &[(second, BIG, format::FT_REG_FILE)]);
        let want = format!(
            "corrupt image at byte {}: directory 40 block 1 dirent 0: name {shown:?} does not sort after \"m\" (names must be unique and sorted), the last name of block 0",
            7 * BS
        );
        assert_eq!(corrupt_msg(readdir_all(&img, SUB)), want);
        // A readdir resumed at the second block reads the first block's last name too.
        let sub = img.inode(SUB).unwrap();
        let mut rd = img.readdir(&sub, BS as u64).unwrap();
        assert_eq!(corrupt_msg(rd.next().unwrap()), want);
        assert!(rd.next().is_none(), "an iterator ends after its error");
        assert_fsck_finds(&img, 50, &want);
    }
}

#[test]
fn dot_must_be_the_directory_itself() {
    // sub's "." names the root: the reader refuses it wherever it meets the block.
    let m = with_sub_entries(&[(b".", ROOT, format::FT_DIR), (b"..", ROOT, format::FT_DIR)]);
    let img = open(m);
    let s = corrupt_msg(readdir_all(&img, SUB));
    assert!(
        s.contains("dirent 0: \".\" points to nid 36, not to the directory itself"),
        "{s}"
    );
    let sub = img.inode(SUB).unwrap();
    corrupt_msg(img.lookup(&sub, b".."));
    assert!(fsck(&img, 50)
        .problems
        .iter()
        .any(|p| p.contains("not to the directory itself")));
}

#[test]
fn directory_cycles_and_hardlinks_terminate() {
    // sub gets "loop" → root: a cycle root → sub → root.
    let mut m = with_sub_entries(&[
        (b".", SUB, format::FT_DIR),
        (b"..", ROOT, format::FT_DIR),
        (b"loop", ROOT, format::FT_DIR),
    ]);
    put16(&mut m, ioff(SUB) + 6, 3);
    let img = open(m);
    assert_fsck_finds(&img, 50, "reachable twice");
    assert!(exercise(&img, 100_000) < 100_000);
    let sub = img.inode(SUB).unwrap();
    assert_eq!(img.lookup(&sub, b"loop").unwrap().unwrap().nid, ROOT);

    // sub contains itself.
    let m = with_sub_entries(&[
        (b".", SUB, format::FT_DIR),
        (b"..", ROOT, format::FT_DIR),
        (b"me", SUB, format::FT_DIR),
    ]);
    let img = open(m);
    assert_fsck_finds(&img, 50, "reachable twice");
    exercise(&img, 100_000);

    // A wrong "..", dirent type mismatches and a bad nlink are reported (a wrong "." is
    // refused by the reader itself: `dot_must_be_the_directory_itself`).
    let mut m = with_sub_entries(&[
        (b".", SUB, format::FT_DIR),
        (b"..", SUB, format::FT_REG_FILE),
    ]);
    m[BS + 2 * 12 + 10] = format::FT_SYMLINK; // "big" is a regular file
    put16(&mut m, ioff(FILE) + 6, 2);
    let img = open(m);
    let r = fsck(&img, 50);
    let all = r.problems.join("\n");
    for want in [
        "\"..\" points to nid 40 instead of 36",
        "\"..\" has dirent type 1 instead of directory",
        "dirent type 7",
        "nlink 2 but 1 entries",
    ] {
        assert!(all.contains(want), "missing {want:?} in:\n{all}");
    }
}

#[test]
fn looping_directory_blocks_are_bounded() {
    // A chunked directory of 16384 blocks that all map one block: every block parses, and
    // names repeat from the second block on, which readdir refuses; lookups parse a few blocks.
    const N: usize = 16384;
    let mut m = base();
    let blk = m.len() / BS;
    m.resize(m.len() + BS, 0);
    let at = m.len();
    m.resize(at + 64 + 4 * N, 0);
    let nid = (at / 32) as u64;
    write_dir(
        &mut m,
        blk * BS,
        &[(b".", nid, format::FT_DIR), (b"..", ROOT, format::FT_DIR)],
    );
    let mut d = inode(
        format::S_IFDIR | 0o755,
        format::LAYOUT_CHUNK_BASED,
        (N * BS) as u64,
        0,
        2,
    );
    d.extended = true;
    d.format = format::inode_format(true, format::LAYOUT_CHUNK_BASED);
    d.encode(&mut m[at..]);
    for i in 0..N {
        put32(&mut m, at + 64 + 4 * i, blk as u32);
    }
    // Root's "sub" entry now points at the looping directory.
    put64(&mut m, BS + 6 * 12, nid);
    let img = open(m);
    assert_fsck_finds(
        &img,
        50,
        "block 1 dirent 0: name \".\" does not sort after \"..\"",
    );
    let spent = exercise(&img, 20_000);
    assert!(spent < 30_000, "budget overrun: {spent}");
    let dir = img.inode(nid).unwrap();
    let listed: Vec<_> = img.readdir(&dir, 0).unwrap().collect();
    assert_eq!(listed.len(), 3, "two entries, then the error");
    assert!(listed[2].is_err());
    assert_eq!(img.lookup(&dir, b"..").unwrap().unwrap().nid, ROOT);
}

// ---------------------------------------------------------------------------------------
// Xattrs

#[test]
fn xattr_body_checks() {
    let body = ioff(XFILE) + 32;
    let x = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut m = base();
        f(&mut m);
        let img = open(m);
        let i = img.inode(XFILE).unwrap();
        (
            img.listxattr(&i),
            img.getxattr(&i, b"user.zzz"),
            img.xattrs(&i),
        )
    };
    // Entry overflowing its body.
    let (l, g, a) = x(&|m| m[body + 16] = 200);
    assert!(corrupt_msg(l).contains("overflows the body"));
    corrupt_msg(g);
    corrupt_msg(a);
    let (l, _, _) = x(&|m| put16(m, body + 18, u16::MAX));
    corrupt_msg(l);
    // More shared ids than the body holds (2026 hardening), including 255.
    for n in [5u8, 255] {
        let (l, g, _) = x(&|m| m[body + 4] = n);
        assert!(corrupt_msg(l).contains("do not fit"));
        corrupt_msg(g);
    }
    // Shared id pointing past the image.
    let (l, _, _) = x(&|m| put32(m, body + 12, u32::MAX));
    assert!(corrupt_msg(l).contains("shared xattr id"));
    // icount maxed out: the 256 KiB body runs past the image.
    let (l, g, _) = x(&|m| put16(m, ioff(XFILE) + 2, u16::MAX));
    corrupt_msg(l);
    corrupt_msg(g);
    // icount 1: a header-only body is "not supported yet" (EOPNOTSUPP) for xattr calls,
    // but the inode itself stays usable.
    let mut m = base();
    put16(&mut m, ioff(FILE) + 2, 1);
    let img = open(m);
    let f = img.inode(FILE).unwrap();
    assert!(unsupported_msg(img.listxattr(&f)).contains("icount 1"));
    unsupported_msg(img.getxattr(&f, b"user.foo"));
    assert_eq!(img.read(&f, 0, &mut [0u8; 5]).unwrap(), 5);
    assert!(!fsck(&img, 10).is_clean());
    // Unknown name indexes are invisible (no kernel handler), not errors.
    let (l, _, _) = x(&|m| m[body + 17] = 5);
    assert_eq!(l.unwrap(), vec![b"user.shared".to_vec()]);
    // Xattr body starting past the image (inode in the last slot).
    let mut m = base();
    let last = (6 * BS - 32) as u64 / 32;
    let mut i = inode(format::S_IFREG, 0, 0, 0, 1);
    i.xattr_icount = 2;
    i.encode(&mut m[ioff(last)..]);
    corrupt_msg(open(m).inode(last));
}

#[test]
fn xattr_filter_fast_path() {
    let filter_at = ioff(XFILE) + 32;
    let foo = format::xattr_filter_bit(format::XATTR_INDEX_USER, b"foo");
    let shared = format::xattr_filter_bit(format::XATTR_INDEX_USER, b"shared");
    let correct = format::xattr_filter_value([foo, shared]);
    let build = |filter: u32, compat: u32, reserved: u8| {
        let mut m = base();
        put32(&mut m, 1024 + 0x08, compat);
        m[1024 + 0x68] = reserved;
        put32(&mut m, filter_at, filter);
        open(m)
    };
    let on = format::FEATURE_COMPAT_XATTR_FILTER;

    // Correct filter: present names found; absent names answered from the filter.
    let img = build(correct, on, 0);
    let x = img.inode(XFILE).unwrap();
    assert_xattr(&img, &x, b"user.foo", Some(b"bar"));
    assert_xattr(&img, &x, b"user.shared", Some(b"s"));
    assert!(img.xattr_filter_says_absent(&x, b"system.posix_acl_access"));
    assert!(!img.xattr_filter_says_absent(&x, b"user.foo"));
    assert!(fsck(&img, 10).is_clean());

    // The fast path does not scan: with a corrupt body, a filtered-out name still answers
    // None, while a name whose bit is clear hits the corruption.
    let mut m = base();
    put32(&mut m, 1024 + 0x08, on);
    put32(&mut m, filter_at, correct);
    m[filter_at + 16] = 200;
    let img = open(m);
    let x = img.inode(XFILE).unwrap();
    assert_xattr(&img, &x, b"system.posix_acl_access", None);
    corrupt_msg(img.getxattr(&x, b"user.foo"));

    // A lying filter hides the xattr, exactly like the kernel; listxattr still shows it and
    // fsck reports it.
    let img = build(correct | (1 << foo), on, 0);
    let x = img.inode(XFILE).unwrap();
    assert_xattr(&img, &x, b"user.foo", None);
    assert!(img.listxattr(&x).unwrap().contains(&b"user.foo".to_vec()));
    assert_fsck_finds(&img, 10, "hidden by the name filter");

    // Reserved byte set, or compat bit clear: the filter is ignored.
    for img in [build(u32::MAX, on, 1), build(u32::MAX, 0, 0)] {
        let x = img.inode(XFILE).unwrap();
        assert_xattr(&img, &x, b"user.foo", Some(b"bar"));
        assert!(!img.xattr_filter_says_absent(&x, b"user.foo"));
        assert!(fsck(&img, 10).is_clean());
    }
    // All-ones on an inode with xattrs hides everything (the classic writer bug).
    let img = build(u32::MAX, on, 0);
    let x = img.inode(XFILE).unwrap();
    assert_xattr(&img, &x, b"user.foo", None);
    assert_eq!(fsck(&img, 10).problems.len(), 2);
}
