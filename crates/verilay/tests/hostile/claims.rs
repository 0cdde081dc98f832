//! Forged file-digest claims and bytes outside the tree (items 6 and 7).

use crate::Seed;
use std::path::Path;

/// Hostile inputs of this module for the fuzz targets.
pub fn seeds(_tmp: &Path) -> Vec<Seed> {
    Vec::new()
}
