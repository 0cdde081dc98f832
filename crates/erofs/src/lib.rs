//! EROFS images: the on-disk format, a builder that writes kernel-mountable images, and a
//! reader that parses untrusted images through a byte source without ever panicking.
//!
//! Data flows one way: `build` turns a source tree into image bytes; `read` turns image
//! bytes (from any [`read::ByteSource`]) back into inodes, directories, data and xattrs.

pub mod builder;
pub mod format;
pub mod read;
pub mod zformat;
