//! The parts of the `verilay` command that are worth testing and fuzzing on their own;
//! the commands themselves live in the binary (`main.rs`, `cmd/`).

pub mod mount_options;
