//! Opens arbitrary bytes as an EROFS image and walks everything with bounded effort.
//! Any panic (including an arithmetic overflow: cargo-fuzz builds with debug assertions),
//! hang or out-of-memory is a bug in the reader.
#![no_main]

use erofs::format;
use erofs::read::{exercise, fsck, Image};
use libfuzzer_sys::fuzz_target;

const BUDGET: u64 = 20_000;

fn walk(data: &[u8]) {
    if let Ok(img) = Image::open(data) {
        exercise(&img, BUDGET);
        let _ = fsck(&img, 20);
        // verilay's per-file digest table and the integrity-report walker.
        for nid in [img.root_nid(), 0, 36, 1 << 20] {
            let _ = img.claimed_file_digest(nid);
            if let Ok(ino) = img.inode(nid) {
                let _ = img.file_digest(&ino);
            }
        }
        let _ = img.owners(0, data.len() as u64, 64);
    }
}

/// Mutated superblock blocks almost never keep a valid crc32c; fix it so the fuzzer reaches
/// the inode, directory and xattr parsers behind `open`.
fn with_fixed_checksum(data: &[u8]) -> Option<Vec<u8>> {
    let sb = data.get(1024..1024 + 128)?;
    let compat = u32::from_le_bytes(sb[8..12].try_into().ok()?);
    if compat & format::FEATURE_COMPAT_SB_CHKSUM == 0 {
        return None;
    }
    let bits = sb[12];
    if !(9..=16).contains(&bits) {
        return None;
    }
    let crc = format::superblock_checksum(data, 1usize << bits)?;
    let mut fixed = data.to_vec();
    fixed[1028..1032].copy_from_slice(&crc.to_le_bytes());
    Some(fixed)
}

fuzz_target!(|data: &[u8]| {
    walk(data);
    if let Some(fixed) = with_fixed_checksum(data) {
        walk(&fixed);
    }
});
