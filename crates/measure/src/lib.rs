//! IMA-style measurement of file opens, done in userspace: verilay decides per open
//! whether a file is measured (`policy`: IMA's policy syntax and first-match rules),
//! and appends what it measured to a measurement list in the kernel's own formats
//! (`log`: templates, SHA-1 and SHA-256 template banks, PCR extension), which
//! `evmctl ima_measurement` and `verify` replay.

#![forbid(unsafe_code)]

pub mod files;
pub mod format;
pub mod log;
pub mod policy;
pub mod verify;
