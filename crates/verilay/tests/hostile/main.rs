//! Hostile inputs (issue 19): every case is built from scratch by the test that uses it,
//! never a binary fixture. Each module holds the attacks on one input an attacker may
//! control: an image, a layer tarball, mount options, the upper and work directories, a
//! policy or measurement list, xattrs set through a mount. Each module also hands its
//! cases to the fuzz targets as seeds (`seeds`), so the bounded fuzz run in `fuzz.rs`
//! starts from every attack known so far.

#[path = "../common/mod.rs"]
mod common;

mod claims;
mod compressed;
mod extract;
mod fuzz;
mod measure;
mod mount;
mod registry;
mod signed;
mod tar;
mod xattrs;

use std::path::Path;

/// One hostile input for a fuzz target (a binary in `fuzz/fuzz_targets/`).
pub struct Seed {
    /// The fuzz target's name.
    pub target: &'static str,
    /// The seed's file name in the target's corpus.
    pub name: String,
    /// The input itself.
    pub bytes: Vec<u8>,
}

/// Every module's seeds, made in `tmp`.
pub fn all_seeds(tmp: &Path) -> Vec<Seed> {
    let mut v = Vec::new();
    v.extend(claims::seeds(tmp));
    v.extend(compressed::seeds(tmp));
    v.extend(extract::seeds(tmp));
    v.extend(measure::seeds(tmp));
    v.extend(mount::seeds(tmp));
    v.extend(tar::seeds(tmp));
    v.extend(xattrs::seeds(tmp));
    v
}
