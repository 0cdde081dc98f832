//! Compression into a fixed-size physical cluster ("destination size" mode, as
//! erofs-utils' `compress_destsize`): as much input as fits, never more output than asked.

use crate::{Compression, Error};

/// One thread's compressor (liblz4/libzstd/liblzma keep state worth reusing).
pub struct Compressor {
    compression: Compression,
}

impl Compressor {
    pub fn new(compression: Compression) -> Compressor {
        Compressor { compression }
    }

    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// Compresses the longest prefix of `src` whose encoding fits in `dst`: returns
    /// (input bytes consumed, output bytes written). Consuming 0 bytes is not an error.
    pub fn fill(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(usize, usize), Error> {
        let _ = (src, dst);
        Err(Error::Compressor(
            self.compression.algorithm,
            "not built yet".into(),
        ))
    }
}
