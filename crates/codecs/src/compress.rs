//! Compression into a fixed-size cluster, as erofs-utils' `compress_destsize`: as much input as
//! fits, never more output than asked.
//!
//! - LZ4, LZ4HC and MicroLZMA fill the cluster natively; for Zstandard and DEFLATE the longest
//!   fitting prefix is searched for.
//! - Output depends only on the input and the calls since [`Compressor::reset`]: reset at each
//!   independent unit, the bytes match on any thread.

use crate::{Algorithm, Compression, Error};

/// liblz4's default HC level (`LZ4HC_CLEVEL_DEFAULT`), mkfs.erofs's for `lz4hc`.
const LZ4HC_DEFAULT_LEVEL: i32 = 9;
/// zstd's `ZSTD_CLEVEL_DEFAULT`.
const ZSTD_DEFAULT_LEVEL: i32 = 3;
/// xz's `LZMA_PRESET_DEFAULT`.
const LZMA_DEFAULT_LEVEL: i32 = 6;
/// zlib's default.
const DEFLATE_DEFAULT_LEVEL: i32 = 6;
/// Raw DEFLATE as miniz/zlib write it: a 32 KiB window.
pub const DEFLATE_WINDOW_BITS: u8 = 15;

/// The history window the encoder uses and the image's config record must announce,
/// for physical clusters of at most `max_pcluster` bytes (erofs-utils' defaults: LZMA
/// 4 clusters, at least 32 KiB, at most 8 MiB; Zstandard 8 clusters as a power of two,
/// at most 1 MiB; DEFLATE 32 KiB; LZ4 64 KiB - 1).
pub fn window_size(algorithm: Algorithm, max_pcluster: u32) -> u32 {
    match algorithm {
        Algorithm::Lz4 => u16::MAX as u32,
        Algorithm::Lzma => (max_pcluster.saturating_mul(4)).clamp(32 * 1024, 8 << 20),
        Algorithm::Zstd => {
            let d = max_pcluster.saturating_mul(8).clamp(1 << 10, 1 << 20);
            1 << (31 - d.leading_zeros())
        }
        Algorithm::Deflate => 1 << DEFLATE_WINDOW_BITS,
    }
}

/// One thread's compressor (libzstd and zlib keep state worth reusing).
pub struct Compressor {
    compression: Compression,
    window: u32,
    zstd: Option<zstd::bulk::Compressor<'static>>,
    deflate: Option<flate2::Compress>,
    /// Room for a trial encoding a little larger than the cluster (search modes).
    scratch: Vec<u8>,
    /// Input the previous search-mode fill consumed (0: none since the last reset).
    last_used: usize,
}

impl Compressor {
    /// A compressor for clusters of one block (4 KiB windows where they depend on it).
    pub fn new(compression: Compression) -> Compressor {
        Compressor::with_max_pcluster(compression, 4096)
    }

    /// A compressor whose window suits physical clusters of at most `max_pcluster` bytes
    /// (see [`window_size`]; the image must announce the same window).
    pub fn with_max_pcluster(compression: Compression, max_pcluster: u32) -> Compressor {
        Compressor {
            compression,
            window: window_size(compression.algorithm, max_pcluster),
            zstd: None,
            deflate: None,
            scratch: Vec::new(),
            last_used: 0,
        }
    }

    /// Forgets what earlier fills learnt (the next search starts from its default guess).
    pub fn reset(&mut self) {
        self.last_used = 0;
    }

    /// What it compresses with.
    pub fn compression(&self) -> Compression {
        self.compression
    }

    /// Compresses the longest prefix of `src` whose encoding fits in `dst`: returns
    /// (input bytes consumed, output bytes written). Consuming 0 bytes is not an error.
    pub fn fill(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(usize, usize), Error> {
        if src.is_empty() || dst.is_empty() {
            return Ok((0, 0));
        }
        // liblz4 and the searches count in `int`; a cluster's input never needs more.
        let src = &src[..src.len().min(i32::MAX as usize / 2)];
        let level = self.compression.level;
        match (self.compression.algorithm, self.compression.hc) {
            (Algorithm::Lz4, false) => Ok(lzzzz::lz4::compress_fill(src, dst).unwrap_or((0, 0))),
            (Algorithm::Lz4, true) => {
                Ok(
                    lzzzz::lz4_hc::compress_fill(src, dst, level.unwrap_or(LZ4HC_DEFAULT_LEVEL))
                        .unwrap_or((0, 0)),
                )
            }
            (Algorithm::Zstd, _) => self.fill_zstd(src, dst),
            (Algorithm::Deflate, _) => self.fill_deflate(src, dst),
            (Algorithm::Lzma, _) => self.fill_lzma(src, dst),
        }
    }

    fn fill_zstd(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(usize, usize), Error> {
        let guess = self.guess(dst.len());
        let err = |e: std::io::Error| Error::Compressor(Algorithm::Zstd, e.to_string());
        if self.zstd.is_none() {
            let mut c =
                zstd::bulk::Compressor::new(self.compression.level.unwrap_or(ZSTD_DEFAULT_LEVEL))
                    .map_err(err)?;
            c.set_parameter(zstd::zstd_safe::CParameter::WindowLog(
                self.window.trailing_zeros(),
            ))
            .map_err(err)?;
            self.zstd = Some(c);
        }
        let c = self.zstd.as_mut().expect("set above");
        // zstd writes a frame header and block headers even for stored data: 32 bytes of
        // slack let a trial that just overflows be told apart from one that fits.
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize(dst.len() + 32, 0);
        let result = search_fit(src.len(), dst.len(), guess, 1, |m| {
            // A failed trial (output too small) is "does not fit".
            c.compress_to_buffer(&src[..m], &mut scratch[..])
                .ok()
                .filter(|&n| n > 0 && n <= dst.len())
                .inspect(|&n| dst[..n].copy_from_slice(&scratch[..n]))
        });
        self.scratch = scratch;
        self.last_used = result.0;
        Ok(result)
    }

    fn fill_deflate(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(usize, usize), Error> {
        let guess = self.guess(dst.len());
        let level = self.compression.level.unwrap_or(DEFLATE_DEFAULT_LEVEL) as u32;
        let c = self
            .deflate
            .get_or_insert_with(|| flate2::Compress::new(flate2::Compression::new(level), false));
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize(dst.len() + 9, 0);
        let result = search_fit(src.len(), dst.len(), guess, 22 - 2 * level as usize, |m| {
            c.reset();
            let status = c.compress(&src[..m], &mut scratch, flate2::FlushCompress::Finish);
            let n = c.total_out() as usize;
            let done = matches!(status, Ok(flate2::Status::StreamEnd)) && c.total_in() == m as u64;
            (done && n > 0 && n <= dst.len()).then(|| {
                dst[..n].copy_from_slice(&scratch[..n]);
                n
            })
        });
        self.scratch = scratch;
        self.last_used = result.0;
        // The kernel finds where a cluster's data starts by skipping leading zero bytes. A
        // stream that opens with a non-final stored block has a zero first byte; bit 3 is
        // then unused padding (DEFLATE skips to a byte boundary), so set it, as
        // erofs-utils does.
        if result.1 > 0 && dst[0] == 0 {
            dst[0] = 1 << 3;
        }
        Ok(result)
    }

    /// Where a search starts: a little under what the previous cluster took (data nearby
    /// compresses alike, so this usually fits at once and one more trial finishes),
    /// else 4 clusters' worth.
    fn guess(&self, dst_len: usize) -> usize {
        match self.last_used {
            0 => dst_len.saturating_mul(4),
            last => last * 15 / 16,
        }
    }

    #[allow(unsafe_code)] // calls liblzma
    fn fill_lzma(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(usize, usize), Error> {
        use liblzma_sys as x;
        let preset = self.compression.level.unwrap_or(LZMA_DEFAULT_LEVEL) as u32;
        let fail = |what: &str, ret| Error::Compressor(Algorithm::Lzma, format!("{what}: {ret}"));
        // SAFETY: `lzma_stream` and `lzma_options_lzma` are plain C structs whose all-zero
        // value is their documented initial state (`LZMA_STREAM_INIT`); the preset fills
        // the options before use. The stream only reads `src` and writes `dst` within the
        // lengths given, both of which outlive it, and `lzma_end` frees it on every path.
        unsafe {
            let mut opts: x::lzma_options_lzma = std::mem::zeroed();
            if x::lzma_lzma_preset(&mut opts, preset) != 0 {
                return Err(fail("preset", preset));
            }
            opts.dict_size = self.window;
            let mut strm: x::lzma_stream = std::mem::zeroed();
            let ret = x::lzma_microlzma_encoder(&mut strm, &opts);
            if ret != x::LZMA_OK {
                x::lzma_end(&mut strm);
                return Err(fail("init", ret));
            }
            strm.next_in = src.as_ptr();
            strm.avail_in = src.len();
            strm.next_out = dst.as_mut_ptr();
            strm.avail_out = dst.len();
            let ret = x::lzma_code(&mut strm, x::LZMA_FINISH);
            let (used, wrote) = (strm.total_in as usize, strm.total_out as usize);
            x::lzma_end(&mut strm);
            if ret != x::LZMA_STREAM_END {
                return Err(fail("encode", ret));
            }
            Ok((used, wrote))
        }
    }
}

/// The longest prefix of `n` input bytes whose trial encoding fits in `dst_len` bytes, by
/// erofs-utils' search: start at `guess`, then guess from the ratio so far, bisect on
/// misses, and stop once the
/// output is within `close` bytes of full. `trial(m)` encodes `m` bytes into the
/// destination and returns the encoded size if it fits (the last fitting trial's output
/// must be the one left there, so a fitting trial is never followed by a kept miss).
/// On data that does not shrink the result may be shorter than the longest fit.
fn search_fit(
    n: usize,
    dst_len: usize,
    guess: usize,
    close: usize,
    mut trial: impl FnMut(usize) -> Option<usize>,
) -> (usize, usize) {
    let (mut fit, mut fit_size) = (0usize, 0usize); // longest prefix known to fit
    let mut miss = n + 1; // shortest prefix known not to fit
    let mut m = guess;
    loop {
        m = m.max(fit + 1).min(miss - 1);
        match trial(m) {
            Some(size) => {
                fit = m;
                fit_size = size;
                if miss <= fit + 1 || size + close >= dst_len {
                    break;
                }
                m = dst_len * m / size;
            }
            None => {
                miss = m;
                // No more input than output space, and still too long: the data does not
                // shrink, so no prefix will save space; what fitted so far will do (the
                // bisection to the last byte costs ten trials a cluster on such data).
                if miss <= fit + 1 || miss <= dst_len {
                    break;
                }
                m = (fit + miss) / 2;
            }
        }
    }
    (fit, fit_size)
}

/// Pseudo-random test data, shared with the other crates' tests.
#[cfg(test)]
#[path = "../../erofs/tests/common/xorshift.rs"]
mod xorshift;

#[cfg(test)]
mod tests {
    use super::*;

    fn text(n: usize) -> Vec<u8> {
        let words = [
            "erofs ", "cluster ", "verity ", "layer ", "merkle ", "block\n",
        ];
        let mut out = Vec::with_capacity(n + 16);
        let mut s = 7u32;
        while out.len() < n {
            s = s.wrapping_mul(1_103_515_245).wrapping_add(12345);
            out.extend_from_slice(words[(s >> 16) as usize % words.len()].as_bytes());
        }
        out.truncate(n);
        out
    }

    fn random(n: usize) -> Vec<u8> {
        super::xorshift::xorshift(n, 0x9E37_79B9_7F4A_7C15)
    }

    fn all() -> Vec<Compression> {
        [
            "lz4",
            "lz4hc",
            "lz4hc,12",
            "zstd",
            "zstd,19",
            "lzma",
            "lzma,9",
            "deflate",
            "deflate,9",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect()
    }

    /// Decodes with the codec's own library, never verilay's reader.
    #[allow(unsafe_code)] // calls liblzma
    fn decode(c: Compression, src: &[u8], size: usize, window: u32) -> Vec<u8> {
        let mut out = vec![0u8; size];
        match c.algorithm {
            Algorithm::Lz4 => {
                let n = lzzzz::lz4::decompress(src, &mut out).expect("lz4 decodes");
                assert_eq!(n, size);
            }
            Algorithm::Zstd => {
                let mut d = zstd::bulk::Decompressor::new().unwrap();
                d.set_parameter(zstd::zstd_safe::DParameter::WindowLogMax(
                    window.trailing_zeros(),
                ))
                .unwrap();
                let v = d
                    .decompress(src, size)
                    .expect("zstd decodes within its window");
                assert_eq!(v.len(), size);
                out = v;
            }
            Algorithm::Deflate => {
                let mut d = flate2::Decompress::new(false);
                d.decompress(src, &mut out, flate2::FlushDecompress::Finish)
                    .expect("deflate decodes");
                assert_eq!(d.total_out() as usize, size);
            }
            Algorithm::Lzma => {
                use liblzma_sys as x;
                // SAFETY: zeroed is LZMA_STREAM_INIT; buffers outlive the stream.
                unsafe {
                    let mut s: x::lzma_stream = std::mem::zeroed();
                    let r =
                        x::lzma_microlzma_decoder(&mut s, src.len() as u64, size as u64, 1, window);
                    assert_eq!(r, x::LZMA_OK);
                    s.next_in = src.as_ptr();
                    s.avail_in = src.len();
                    s.next_out = out.as_mut_ptr();
                    s.avail_out = size;
                    let r = x::lzma_code(&mut s, x::LZMA_FINISH);
                    let n = s.total_out as usize;
                    x::lzma_end(&mut s);
                    assert_eq!(r, x::LZMA_STREAM_END);
                    assert_eq!(n, size);
                }
            }
        }
        out
    }

    #[test]
    fn fills_never_overflow_and_round_trip() {
        for c in all() {
            for pcluster in [4096usize, 65536] {
                let window = window_size(c.algorithm, pcluster as u32);
                let mut z = Compressor::with_max_pcluster(c, pcluster as u32);
                for input in [
                    text(1 << 20),
                    text(5000),
                    random(100_000),
                    vec![0u8; 3 << 20],
                ] {
                    // Room beyond dst catches a compressor writing past what it was given.
                    let mut buf = vec![0xAAu8; pcluster + 64];
                    let (used, wrote) = z.fill(&input, &mut buf[..pcluster]).unwrap();
                    assert!(wrote <= pcluster, "{c}: wrote {wrote} > {pcluster}");
                    assert!(
                        buf[pcluster..].iter().all(|&b| b == 0xAA),
                        "{c}: wrote past dst"
                    );
                    assert!(used <= input.len());
                    if used == 0 {
                        continue;
                    }
                    assert_ne!(buf[0], 0, "{c}: the kernel would skip a leading zero byte");
                    let back = decode(c, &buf[..wrote], used, window);
                    assert!(
                        back == input[..used],
                        "{c}: round trip of {used} bytes differs"
                    );
                }
            }
        }
    }

    #[test]
    fn text_fills_the_cluster_and_random_does_not_shrink() {
        for c in all() {
            let mut z = Compressor::with_max_pcluster(c, 4096);
            let mut buf = vec![0u8; 4096];
            let (used, wrote) = z.fill(&text(1 << 20), &mut buf).unwrap();
            assert!(
                used > 2 * 4096,
                "{c}: text gave only {used} bytes into a cluster"
            );
            assert!(wrote > 3500, "{c}: text filled only {wrote} bytes");
            // Incompressible input: what fits is no more than about a cluster's worth.
            let (used, _) = z.fill(&random(1 << 20), &mut buf).unwrap();
            assert!(used <= 4096, "{c}: {used} random bytes in 4096");
        }
    }

    #[test]
    fn fills_after_a_reset_are_independent_of_earlier_calls() {
        for c in all() {
            let a = text(300_000);
            let b = random(50_000);
            let mut fresh = Compressor::new(c);
            let mut one = vec![0u8; 4096];
            let r1 = fresh.fill(&a, &mut one).unwrap();
            let mut used = Compressor::new(c);
            let mut two = vec![0u8; 4096];
            used.fill(&b, &mut two).unwrap();
            used.fill(&a[1000..], &mut two).unwrap();
            used.reset();
            let r2 = used.fill(&a, &mut two).unwrap();
            assert_eq!(r1, r2, "{c}");
            assert_eq!(one[..r1.1], two[..r2.1], "{c}");
        }
    }

    #[test]
    fn small_and_empty_inputs() {
        for c in all() {
            let mut z = Compressor::new(c);
            let mut buf = vec![0u8; 4096];
            assert_eq!(z.fill(&[], &mut buf).unwrap(), (0, 0));
            let (used, wrote) = z.fill(b"x", &mut buf).unwrap();
            assert_eq!(used, 1, "{c}");
            assert_eq!(
                decode(c, &buf[..wrote], 1, window_size(c.algorithm, 4096)),
                b"x"
            );
        }
    }

    #[test]
    fn windows_match_erofs_utils() {
        assert_eq!(window_size(Algorithm::Zstd, 4096), 32 * 1024);
        assert_eq!(window_size(Algorithm::Zstd, 1 << 20), 1 << 20);
        assert_eq!(window_size(Algorithm::Lzma, 4096), 32 * 1024);
        assert_eq!(window_size(Algorithm::Lzma, 65536), 256 * 1024);
        assert_eq!(window_size(Algorithm::Lzma, 1 << 20), 4 << 20);
    }
}
