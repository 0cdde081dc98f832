//! The compressors EROFS reads: the builder fills a physical cluster with as much input as
//! fits ([`Compressor::fill`]); the reader decodes one into exactly its decoded size
//! ([`decompress()`]). Framing is EROFS's: LZ4 blocks, MicroLZMA, raw DEFLATE, Zstandard
//! frames, as the kernel's `decompressor*.c` expect them.

mod compress;
mod decompress;

pub use compress::{window_size, Compressor, DEFLATE_WINDOW_BITS};
pub use decompress::decompress;

use std::fmt;
use std::str::FromStr;

/// A compression algorithm, by its EROFS number (`Z_EROFS_COMPRESSION_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algorithm {
    /// LZ4 blocks, no frame (LZ4HC's output too: the same decoder reads it).
    Lz4 = 0,
    /// MicroLZMA.
    Lzma = 1,
    /// Raw DEFLATE.
    Deflate = 2,
    /// Zstandard frames.
    Zstd = 3,
}

impl Algorithm {
    /// Every algorithm, in order of its EROFS number.
    pub const ALL: [Algorithm; 4] = [
        Algorithm::Lz4,
        Algorithm::Lzma,
        Algorithm::Deflate,
        Algorithm::Zstd,
    ];

    /// The number stored in `h_algorithmtype` and as a bit of `available_compr_algs`.
    pub fn erofs_id(self) -> u8 {
        self as u8
    }

    /// The algorithm numbered `id` in EROFS, if there is one.
    pub fn from_erofs_id(id: u8) -> Option<Algorithm> {
        Algorithm::ALL.get(usize::from(id)).copied()
    }

    /// The name `-z` gives it (`lz4`, `lzma`, `deflate`, `zstd`).
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Lz4 => "lz4",
            Algorithm::Lzma => "lzma",
            Algorithm::Deflate => "deflate",
            Algorithm::Zstd => "zstd",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What to compress with, spelt as `mkfs.erofs -z` spells it: `lz4`, `lz4hc[,LEVEL]`,
/// `zstd[,LEVEL]`, `lzma[,LEVEL]`, `deflate[,LEVEL]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compression {
    /// The algorithm.
    pub algorithm: Algorithm,
    /// LZ4's high-compression variant (the same decoder reads it).
    pub hc: bool,
    /// The compressor's level; `None` is the compressor's default.
    pub level: Option<i32>,
}

impl Compression {
    /// The levels each compressor accepts (lz4 takes none).
    pub fn levels(&self) -> Option<std::ops::RangeInclusive<i32>> {
        match (self.algorithm, self.hc) {
            (Algorithm::Lz4, false) => None,
            (Algorithm::Lz4, true) => Some(1..=12),
            (Algorithm::Zstd, _) => Some(1..=22),
            (Algorithm::Lzma, _) => Some(0..=9),
            (Algorithm::Deflate, _) => Some(0..=9),
        }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.algorithm.name())?;
        if self.hc {
            f.write_str("hc")?;
        }
        if let Some(l) = self.level {
            write!(f, ",{l}")?;
        }
        Ok(())
    }
}

impl FromStr for Compression {
    type Err = String;

    fn from_str(s: &str) -> Result<Compression, String> {
        let (name, level) = match s.split_once(',') {
            Some((n, l)) => (n, Some(l)),
            None => (s, None),
        };
        let (algorithm, hc) = match name {
            "lz4" => (Algorithm::Lz4, false),
            "lz4hc" => (Algorithm::Lz4, true),
            "zstd" => (Algorithm::Zstd, false),
            "lzma" => (Algorithm::Lzma, false),
            "deflate" => (Algorithm::Deflate, false),
            _ => {
                return Err(format!(
                    "unknown compressor {name:?} (lz4, lz4hc, zstd, lzma, deflate)"
                ))
            }
        };
        let mut c = Compression {
            algorithm,
            hc,
            level: None,
        };
        if let Some(l) = level {
            let Some(range) = c.levels() else {
                return Err(format!("{name} takes no level"));
            };
            let l: i32 = l
                .parse()
                .map_err(|_| format!("{name}: level {l:?} is not a number"))?;
            if !range.contains(&l) {
                return Err(format!(
                    "{name}: level {l} is out of range ({}..={})",
                    range.start(),
                    range.end()
                ));
            }
            c.level = Some(l);
        }
        Ok(c)
    }
}

/// Why a cluster could not be compressed or decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// The input does not decode to the size asked for (corrupt or hostile data).
    #[error("{0} data does not decode: {1}")]
    Corrupt(Algorithm, String),
    /// The compressor failed (out of memory, or a bug).
    #[error("{0} compressor failed: {1}")]
    Compressor(Algorithm, String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_round_trip() {
        for s in [
            "lz4",
            "lz4hc",
            "lz4hc,9",
            "zstd",
            "zstd,19",
            "lzma,6",
            "deflate,9",
        ] {
            let c: Compression = s.parse().unwrap();
            assert_eq!(c.to_string(), s);
        }
    }

    #[test]
    fn bad_spellings_are_errors() {
        for s in [
            "",
            "lz5",
            "lz4,1",
            "zstd,0",
            "zstd,23",
            "lzma,x",
            "deflate,10",
            "zstd,",
        ] {
            assert!(s.parse::<Compression>().is_err(), "{s} parsed");
        }
    }

    #[test]
    fn ids_match_erofs() {
        for a in Algorithm::ALL {
            assert_eq!(Algorithm::from_erofs_id(a.erofs_id()), Some(a));
        }
        assert_eq!(Algorithm::from_erofs_id(4), None);
    }
}
