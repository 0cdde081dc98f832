//! Image builder (in progress).
