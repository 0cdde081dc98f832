//! Image reader (in progress).
