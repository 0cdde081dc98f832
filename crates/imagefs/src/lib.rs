//! verilay's FUSE front: verified EROFS images served over FUSE, read-only ([`ImageFs`]:
//! one image as the kernel's erofs shows it, or a stack with overlayfs's rules) or under a
//! writable upper directory ([`UnionFs`]), and mounted from a typed plan (`mount`).
//!
//! Both filesystems implement [`Ops`], the operations a mount serves as plain methods;
//! [`Fuse`] is the one adapter that turns FUSE requests into those calls and their
//! results into replies. Shared by both: attributes (`attr`), where an object's bytes
//! come from (`backing`), inode numbers (`ino`), paths for log lines and measurements
//! (`paths`), which xattrs are shown (`xattrs`), overlayfs's rules over images (`stack`),
//! measured opens (`measuring`) and what `verilay stats` reports (`stats`).

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
mod xattrs;

pub use attr::{Attr, Kind};
pub use fuse::Fuse;
pub use ops::{Logger, Ops};
pub use readonly::ImageFs;
pub use union::UnionFs;
