//! Decoding one physical cluster into exactly `dst.len()` bytes.

use crate::{Algorithm, Error};

/// Decodes `src` (one cluster's stored bytes, EROFS framing) into `dst`, which is exactly
/// as long as the decoded data wanted (a prefix of the cluster's output when the cluster
/// holds more). Never writes past `dst` and never allocates more than the codec's window.
pub fn decompress(algorithm: Algorithm, src: &[u8], dst: &mut [u8]) -> Result<(), Error> {
    let _ = (src, dst);
    Err(Error::Corrupt(algorithm, "not built yet".into()))
}
