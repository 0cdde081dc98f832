//! Where image bytes come from: the [`ByteSource`] trait lives in the `verity` crate, whose
//! verified block source is the one the reader is meant to sit on.

pub use verity::source::{ByteSource, FileSource};
