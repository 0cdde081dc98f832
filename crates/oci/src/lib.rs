//! OCI distribution for verilay images: `reference`, `auth`, `registry` (the HTTP API),
//! `artifact` (an image stored as one blob, its digest in an annotation). For container
//! images: `image` (manifests, indexes), `layout` (OCI layout directories), `referrers`,
//! and `conversion` (layers converted to verilay images).

#![forbid(unsafe_code)]

pub mod artifact;
pub mod auth;
pub mod conversion;
pub mod image;
pub mod layout;
pub mod reference;
pub mod referrers;
pub mod registry;

pub use reference::Reference;
pub use registry::{Error, Registry};

/// `sha256:HEX` of everything `r` yields, and how many bytes that was; `progress` is told
/// each chunk's size.
pub fn sha256_of(
    mut r: impl std::io::Read,
    progress: &dyn Fn(u64),
) -> std::io::Result<(String, u64)> {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        h.update(&buf[..n]);
        total += n as u64;
        progress(n as u64);
    }
    Ok((format!("sha256:{}", hex::encode(h.finalize())), total))
}

/// [`sha256_of`] of at most `limit` bytes of `r`, written to `to` as they are read. A blob
/// of announced size N is copied with a limit of N + 1: one that runs on shows as one
/// byte too long, without reading (or storing) the rest of it.
pub fn sha256_copy(
    r: impl std::io::Read,
    to: &std::fs::File,
    limit: u64,
    progress: &dyn Fn(u64),
) -> std::io::Result<(String, u64)> {
    struct Tee<'a, R> {
        from: R,
        to: &'a std::fs::File,
    }
    impl<R: std::io::Read> std::io::Read for Tee<'_, R> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            use std::io::Write as _;
            let n = self.from.read(buf)?;
            (&mut &*self.to).write_all(&buf[..n])?;
            Ok(n)
        }
    }
    sha256_of(
        Tee {
            from: r.take(limit),
            to,
        },
        progress,
    )
}
