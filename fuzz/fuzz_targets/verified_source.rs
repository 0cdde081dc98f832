//! Opens arbitrary bytes as a file with a verity section and reads through the verified
//! source: any panic, hang or huge allocation is a bug. Whatever a read returns must be
//! exactly the underlying bytes (the source never invents or alters data).
#![no_main]

use libfuzzer_sys::fuzz_target;
use verity::source::ByteSource;
use verity::VerifiedSource;

fuzz_target!(|data: &[u8]| {
    let Ok(v) = VerifiedSource::open(data, None) else {
        return;
    };
    let len = v.len();
    for (at, n) in [(0, 4096), (0, 1), (len / 2, 70_000), (len.saturating_sub(3), 3)] {
        let n = n.min(len.saturating_sub(at)) as usize;
        let mut buf = vec![0u8; n];
        if v.read_exact_at(&mut buf, at).is_ok() {
            assert_eq!(buf, data[at as usize..at as usize + n]);
        }
    }
    let _ = v.verify_all(&|_| {});
});
