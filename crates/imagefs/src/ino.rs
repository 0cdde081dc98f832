//! Inode numbers of image objects: the root is FUSE's inode 1, every other object is
//! `(layer << 48 | nid) + 2` for the topmost layer holding it (so a single image's are
//! nid + 2). Stable across mounts, collision-free, and decoded without a table.

use crate::ops::Errno;
use crate::stack::Obj;

/// Bits of an inode number below the layer index.
const LAYER_SHIFT: u32 = 48;

/// The inode number of an image object: 1 for the root, else `(layer << 48 | nid) + 2`.
pub(crate) fn obj_ino(o: Obj, root: Obj) -> u64 {
    if o == root {
        1
    } else {
        ((u64::from(o.layer) << LAYER_SHIFT) | o.nid) + 2
    }
}

/// The object inode number `ino` stands for in a mount of `layers` images whose root is
/// `root`; EIO for numbers never given out.
pub(crate) fn ino_obj(ino: u64, root: Obj, layers: usize) -> Result<Obj, Errno> {
    let n = match ino {
        1 => return Ok(root),
        0 => return Err(Errno::IO),
        n => n - 2,
    };
    let layer = n >> LAYER_SHIFT;
    if layer >= layers as u64 {
        return Err(Errno::IO);
    }
    Ok(Obj {
        layer: layer as u16,
        nid: n & ((1 << LAYER_SHIFT) - 1),
    })
}

/// Whether an image object's nid fits in an inode number (one that does not cannot be
/// given out unambiguously).
pub(crate) fn fits(o: Obj) -> bool {
    o.nid < 1 << LAYER_SHIFT
}
