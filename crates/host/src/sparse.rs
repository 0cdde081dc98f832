//! Sparse copies: a file's bytes written into a new file whose holes stay holes.
//!
//! - The length is set first, so every byte never written (holes, trailing ones too) reads
//!   as zeros and takes no block.
//! - A run the source maps as a hole is never read; data is written at its own offset.

use rustix::fd::BorrowedFd;
use rustix::io::Errno;
use std::io;

/// A run of the source from the offset it was asked for: up to `end`, data or a hole.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// Where the run ends (exclusive); past the file's size counts as its size.
    pub end: u64,
    /// Whether it holds data (false: a hole, read as zeros).
    pub data: bool,
}

/// What [`write_sparse`] does with a chunk of data that reads as all zeros.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Zeros {
    /// Leaves it a hole: for a source that cannot tell its holes from zeros.
    Hole,
    /// Writes it: the source's map says it is data.
    Write,
}

/// Writes a `size`-byte source into `f`, a new empty regular file: sets its length, then
/// asks `runs(offset)` for each run and copies the data ones through `buf`, a chunk at a
/// time, with `read(offset, buf)` (bytes read; 0 before the end is an error) and a write
/// at the same offset, leaving chunks of zeros unwritten as `zeros` says.
pub fn write_sparse(
    f: BorrowedFd<'_>,
    size: u64,
    buf: &mut [u8],
    zeros: Zeros,
    runs: &mut dyn FnMut(u64) -> io::Result<Run>,
    read: &mut dyn FnMut(u64, &mut [u8]) -> io::Result<usize>,
) -> io::Result<()> {
    rustix::fs::ftruncate(f, size)?;
    let mut pos = 0;
    while pos < size {
        let run = runs(pos)?;
        let end = run.end.min(size);
        if end <= pos {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the extent map at byte {pos} did not advance"),
            ));
        }
        while run.data && pos < end {
            let want = (end - pos).min(buf.len() as u64) as usize;
            let got = read(pos, &mut buf[..want])?;
            if got == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("short read at byte {pos} of {size}"),
                ));
            }
            let chunk = &buf[..got];
            if zeros == Zeros::Write || chunk.iter().any(|&b| b != 0) {
                write_all_at(f, chunk, pos)?;
            }
            pos += got as u64;
        }
        pos = end;
    }
    Ok(())
}

fn write_all_at(f: BorrowedFd<'_>, mut bytes: &[u8], mut at: u64) -> io::Result<()> {
    while !bytes.is_empty() {
        match rustix::io::pwrite(f, bytes, at) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                bytes = &bytes[n..];
                at += n as u64;
            }
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::SeekFrom;
    use std::os::fd::AsFd;

    const MIB: u64 = 1 << 20;

    /// The next data at or after `at` and the hole that ends it, as SEEK_DATA and
    /// SEEK_HOLE say (`None`: no data from there on).
    fn data_then_hole(f: &std::fs::File, at: u64) -> Option<(u64, u64)> {
        let data = match rustix::fs::seek(f, SeekFrom::Data(at as i64)) {
            Ok(d) => d,
            Err(Errno::NXIO) => return None,
            Err(e) => panic!("SEEK_DATA: {e}"),
        };
        Some((
            data,
            rustix::fs::seek(f, SeekFrom::Hole(data as i64)).unwrap(),
        ))
    }

    /// `write_sparse` of a 3 MiB source into a new file, whose only data must then be the
    /// middle MiB; the file, or None (a recorded skip) where the filesystem keeps no holes.
    fn copy_checked(
        zeros: Zeros,
        runs: &mut dyn FnMut(u64) -> io::Result<Run>,
        read: &mut dyn FnMut(u64, &mut [u8]) -> io::Result<usize>,
    ) -> Option<std::fs::File> {
        let f = tempfile::tempfile().unwrap();
        f.set_len(3 * MIB).unwrap();
        let holes = data_then_hole(&f, 0).is_none();
        if crate::skip::skip_unless(holes, "the temporary directory keeps no holes") {
            return None;
        }
        f.set_len(0).unwrap();
        let mut buf = vec![0u8; 64 << 10];
        write_sparse(f.as_fd(), 3 * MIB, &mut buf, zeros, runs, read).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 3 * MIB);
        assert_eq!(data_then_hole(&f, 0), Some((MIB, 2 * MIB)));
        assert_eq!(data_then_hole(&f, 2 * MIB), None);
        Some(f)
    }

    #[test]
    fn zeros_read_from_a_source_without_a_map_stay_holes_trailing_ones_too() {
        // 1 MiB of zeros, 1 MiB of data, 1 MiB of zeros.
        let mut src = vec![0u8; 3 * MIB as usize];
        src[MIB as usize..2 * MIB as usize].fill(0xa5);
        let mut read = |at: u64, b: &mut [u8]| {
            let n = b.len().min(src.len() - at as usize);
            b[..n].copy_from_slice(&src[at as usize..at as usize + n]);
            Ok(n)
        };
        let mut all = |_| {
            Ok(Run {
                end: u64::MAX,
                data: true,
            })
        };
        let Some(f) = copy_checked(Zeros::Hole, &mut all, &mut read) else {
            return;
        };
        let mut back = vec![0u8; src.len()];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut back, 0).unwrap();
        assert!(back == src);
    }

    #[test]
    fn a_mapped_hole_is_never_read_and_mapped_zeros_are_written_when_asked() {
        // A hole, then 1 MiB of data that reads as zeros, then a trailing hole.
        let mut runs = |at: u64| {
            let data = (MIB..2 * MIB).contains(&at);
            Ok(Run {
                end: (at / MIB + 1) * MIB,
                data,
            })
        };
        let mut read = |at: u64, b: &mut [u8]| {
            assert!((MIB..2 * MIB).contains(&at), "read at {at}, in a hole");
            let n = b.len().min((2 * MIB - at) as usize);
            b[..n].fill(0);
            Ok(n)
        };
        copy_checked(Zeros::Write, &mut runs, &mut read);
    }

    #[test]
    fn a_source_that_ends_early_or_a_map_that_does_not_advance_is_an_error() {
        let f = tempfile::tempfile().unwrap();
        let error = |end: fn(u64) -> u64, got: usize| {
            let mut runs = |at| {
                Ok(Run {
                    end: end(at),
                    data: true,
                })
            };
            let mut read = |_, _: &mut [u8]| Ok(got);
            let mut buf = vec![0u8; 4096];
            let e = write_sparse(f.as_fd(), 10, &mut buf, Zeros::Hole, &mut runs, &mut read);
            e.unwrap_err().kind()
        };
        assert_eq!(error(|_| u64::MAX, 0), io::ErrorKind::UnexpectedEof);
        assert_eq!(error(|at| at, 1), io::ErrorKind::InvalidData);
    }
}
