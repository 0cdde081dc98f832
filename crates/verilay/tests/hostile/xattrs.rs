//! Hidden xattrs set or removed through a mount (item 12).

use crate::Seed;
use std::path::Path;

/// Hostile inputs of this module for the fuzz targets.
pub fn seeds(_tmp: &Path) -> Vec<Seed> {
    Vec::new()
}
