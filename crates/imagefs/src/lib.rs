//! verilay's FUSE front: verified EROFS images served read-only ([`ImageFs`]: one image, or
//! a stack with overlayfs's rules) or under a writable upper directory ([`UnionFs`]),
//! mounted from a typed plan (`mount`). Both implement [`Ops`], the operations as plain
//! methods; [`Fuse`] is the one adapter from FUSE requests to those calls.

pub mod attr;
mod backing;
pub mod fuse;
pub mod imagefiles;
mod ino;
pub mod measuring;
pub mod mount;
pub mod ops;
mod paths;
mod readonly;
mod reaper;
pub mod stack;
pub mod stats;
pub mod union;
mod whole;
mod xattrs;

pub use attr::{Attr, Kind};
pub use fuse::Fuse;
pub use ops::{Logger, Ops};
pub use readonly::ImageFs;
pub use union::UnionFs;
