//! `-o` option strings (`verilay mount -o`, mount(8), fstab): the parser never panics,
//! and whatever it accepts renders to a string that parses back to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::os::unix::ffi::OsStrExt;
use mountopts::MountOptions;

fuzz_target!(|data: &[u8]| {
    if let Ok(opts) = MountOptions::parse(data) {
        let text = opts.render();
        let again = MountOptions::parse(text.as_bytes())
            .unwrap_or_else(|e| panic!("{:?} renders as {text:?}, which fails: {e}", opts));
        assert_eq!(again, opts, "{text:?} does not parse back to the same value");
    }
});
