//! Hostile layer tarballs: PAX records, base-256 numbers, truncation (items 2, 8, 11).

use crate::Seed;
use std::path::Path;

/// Hostile inputs of this module for the fuzz targets.
pub fn seeds(_tmp: &Path) -> Vec<Seed> {
    Vec::new()
}
