//! Mount options, upper and work directories, worker setup (items 3, 4, 5, 10).

use crate::Seed;
use std::path::Path;

/// Hostile inputs of this module for the fuzz targets.
pub fn seeds(_tmp: &Path) -> Vec<Seed> {
    Vec::new()
}
