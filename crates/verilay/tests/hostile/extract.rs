//! `verilay extract` of hostile images, and the reader on duplicate or unsorted names (item 1).

use crate::Seed;
use std::path::Path;

/// Hostile inputs of this module for the fuzz targets.
pub fn seeds(_tmp: &Path) -> Vec<Seed> {
    Vec::new()
}
