//! The uncompressed tar stream, read in 512-byte blocks with the offset of every byte,
//! so each error can name where it happened. A decoder's failure (a truncated or
//! corrupt gzip or zstd stream) is reported as such, at the uncompressed offset it
//! reached.

use crate::Fault;
use std::io::{ErrorKind, Read, Write};

pub const BLOCK: usize = 512;

/// Bytes of padding after `size` bytes of data, up to the next block.
pub fn padding(size: u64) -> u64 {
    (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64
}

pub struct Stream<R> {
    inner: R,
    /// Uncompressed bytes read so far: the offset of the next byte.
    pub offset: u64,
    /// What a read error is an error of ("the gzip stream", ...).
    source: &'static str,
    buf: Vec<u8>,
}

impl<R: Read> Stream<R> {
    /// What the stream was reading from.
    pub fn into_inner(self) -> R {
        self.inner
    }

    pub fn new(inner: R, source: &'static str) -> Self {
        Stream {
            inner,
            offset: 0,
            source,
            buf: Vec::new(),
        }
    }

    /// Fills `buf` as far as the stream goes: fewer bytes only at its end.
    fn fill(&mut self, buf: &mut [u8]) -> Result<usize, Fault> {
        let mut n = 0;
        while n < buf.len() {
            match self.inner.read(&mut buf[n..]) {
                Ok(0) => break,
                Ok(k) => {
                    n += k;
                    self.offset += k as u64;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(Fault::At(
                        self.offset,
                        format!("reading {}: {e}", self.source),
                    ))
                }
            }
        }
        Ok(n)
    }

    /// The next block, or `None` if the stream ends exactly here.
    pub fn block(&mut self) -> Result<Option<[u8; BLOCK]>, Fault> {
        let start = self.offset;
        let mut b = [0u8; BLOCK];
        match self.fill(&mut b)? {
            0 => Ok(None),
            BLOCK => Ok(Some(b)),
            _ => Err(Fault::At(
                start,
                format!(
                    "the archive ends at byte {}, inside a header block",
                    self.offset
                ),
            )),
        }
    }

    /// `n` bytes of an entry's data (or of a header's records), sent to `out` if given.
    /// `entry` is the entry's header offset, `what` names the data in errors.
    pub fn data(
        &mut self,
        n: u64,
        mut out: Option<&mut dyn Write>,
        entry: u64,
        what: &str,
    ) -> Result<(), Fault> {
        const CHUNK: usize = 1 << 16;
        let start = self.offset;
        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(CHUNK, 0);
        let mut left = n;
        while left > 0 {
            let want = left.min(CHUNK as u64) as usize;
            let got = self.fill(&mut buf[..want])?;
            if let Some(out) = out.as_mut() {
                out.write_all(&buf[..got])
                    .map_err(|e| Fault::Spill(entry, e))?;
            }
            if got < want {
                return Err(Fault::Entry(
                    entry,
                    format!(
                        "the archive ends at byte {}, inside {what} ({n} bytes from byte {start})",
                        self.offset
                    ),
                ));
            }
            left -= want as u64;
        }
        self.buf = buf;
        self.skip_padding(n, entry, what)
    }

    /// `n` bytes of an extension header's records, in memory: the caller has bounded `n`.
    pub fn small(&mut self, n: usize, entry: u64, what: &str) -> Result<Vec<u8>, Fault> {
        let start = self.offset;
        let mut v = vec![0u8; n];
        if self.fill(&mut v)? < n {
            return Err(Fault::Entry(
                entry,
                format!(
                    "the archive ends at byte {}, inside {what} ({n} bytes from byte {start})",
                    self.offset
                ),
            ));
        }
        self.skip_padding(n as u64, entry, what)?;
        Ok(v)
    }

    /// The zeros (by convention; any bytes are accepted, as every tar does) that pad
    /// `n` bytes of data to a whole block.
    fn skip_padding(&mut self, n: u64, entry: u64, what: &str) -> Result<(), Fault> {
        let pad = padding(n) as usize;
        let mut b = [0u8; BLOCK];
        if self.fill(&mut b[..pad])? < pad {
            return Err(Fault::Entry(
                entry,
                format!(
                    "the archive ends at byte {}, inside the padding after {what}",
                    self.offset
                ),
            ));
        }
        Ok(())
    }

    /// Reads to the end of the stream (so a compressed stream's own trailer and checksum
    /// are checked too), failing at the first byte that is not zero: tar pads its end
    /// with zeros to a whole record, anything else is not part of this archive.
    pub fn zeros_to_end(&mut self) -> Result<(), Fault> {
        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(1 << 16, 0);
        loop {
            let start = self.offset;
            let got = self.fill(&mut buf).map_err(|f| match f {
                Fault::At(at, what) => {
                    Fault::At(at, format!("after the end-of-archive marker: {what}"))
                }
                other => other,
            })?;
            if let Some(i) = buf[..got].iter().position(|&b| b != 0) {
                return Err(Fault::At(
                    start + i as u64,
                    "non-zero bytes after the end-of-archive marker".into(),
                ));
            }
            if got < buf.len() {
                self.buf = buf;
                return Ok(());
            }
        }
    }
}
