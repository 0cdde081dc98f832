//! Measurement: durability of entries, bounded inputs, list permissions (items 9, 11, 13).

use crate::Seed;
use std::path::Path;

/// Hostile inputs of this module for the fuzz targets.
pub fn seeds(_tmp: &Path) -> Vec<Seed> {
    Vec::new()
}
