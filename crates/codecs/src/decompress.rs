//! Decoding one physical cluster into exactly `dst.len()` bytes.
//!
//! - The caller strips EROFS's leading zero padding (`z_erofs_fixup_insize`): only the
//!   reader knows the block size and whether the superblock announces it.
//! - A codec may be asked for a prefix of the stream (a partly referenced cluster, as the
//!   kernel decodes it): trailing input is no error; too little output always is.

use crate::{Algorithm, Error};

/// Largest window a Zstandard frame may ask for: the kernel's `Z_EROFS_ZSTD_MAX_DICT_SIZE`
/// (1 MiB); a frame asking for more is refused rather than allocated.
const ZSTD_WINDOW_LOG_MAX: u32 = 20;
/// Largest LZMA dictionary (the kernel's `Z_EROFS_LZMA_MAX_DICT_SIZE`, 8 MiB).
const LZMA_MAX_DICT_SIZE: usize = 8 << 20;
/// liblzma's smallest dictionary.
const LZMA_MIN_DICT_SIZE: usize = 4096;

/// Decodes `src` (one cluster's stored bytes, EROFS framing) into `dst`, which is exactly
/// as long as the decoded data wanted (a prefix of the cluster's output when the cluster
/// holds more). Never writes past `dst` and never allocates more than the codec's window.
pub fn decompress(algorithm: Algorithm, src: &[u8], dst: &mut [u8]) -> Result<(), Error> {
    if dst.is_empty() {
        return Ok(());
    }
    if src.is_empty() {
        return Err(Error::Corrupt(algorithm, "no input".into()));
    }
    let written = match algorithm {
        Algorithm::Lz4 => lz4(src, dst)?,
        Algorithm::Lzma => lzma(src, dst)?,
        Algorithm::Deflate => deflate(src, dst)?,
        Algorithm::Zstd => zstd(src, dst)?,
    };
    if written != dst.len() {
        return Err(Error::Corrupt(
            algorithm,
            format!("decoded {written} bytes, expected {}", dst.len()),
        ));
    }
    Ok(())
}

fn corrupt(algorithm: Algorithm, e: impl std::fmt::Display) -> Error {
    Error::Corrupt(algorithm, e.to_string())
}

/// An LZ4 block (no frame). The partial decoder stops when `dst` is full, which is what the
/// kernel does for legacy images that compressed extra data into a cluster.
fn lz4(src: &[u8], dst: &mut [u8]) -> Result<usize, Error> {
    let n = dst.len();
    lzzzz::lz4::decompress_partial(src, dst, n).map_err(|e| corrupt(Algorithm::Lz4, e))
}

/// Raw DEFLATE (no zlib header), 32 KiB window at most.
fn deflate(src: &[u8], dst: &mut [u8]) -> Result<usize, Error> {
    let mut d = flate2::Decompress::new(false);
    loop {
        let (before_in, before_out) = (d.total_in(), d.total_out());
        let (i, o) = (before_in as usize, before_out as usize);
        let status = d
            .decompress(&src[i..], &mut dst[o..], flate2::FlushDecompress::None)
            .map_err(|e| corrupt(Algorithm::Deflate, e))?;
        let out = d.total_out() as usize;
        let stuck = d.total_in() == before_in && d.total_out() == before_out;
        if out == dst.len() || status == flate2::Status::StreamEnd || stuck {
            return Ok(out);
        }
    }
}

/// A Zstandard frame, its window capped at the kernel's limit.
fn zstd(src: &[u8], dst: &mut [u8]) -> Result<usize, Error> {
    use zstd::stream::raw::{DParameter, Decoder, InBuffer, Operation, OutBuffer};
    let bad = |e: std::io::Error| corrupt(Algorithm::Zstd, e);
    let mut d = Decoder::new().map_err(bad)?;
    d.set_parameter(DParameter::WindowLogMax(ZSTD_WINDOW_LOG_MAX))
        .map_err(bad)?;
    let want = dst.len();
    let mut input = InBuffer::around(src);
    let mut output = OutBuffer::around(dst);
    loop {
        let (in_before, out_before) = (input.pos(), output.pos());
        let hint = d.run(&mut input, &mut output).map_err(bad)?;
        let done = output.pos() == want;
        let stuck = input.pos() == in_before && output.pos() == out_before;
        // hint 0: the frame is complete.
        if done || hint == 0 || stuck {
            return Ok(output.pos());
        }
    }
}

/// MicroLZMA (liblzma's framing for EROFS: a raw LZMA1 stream whose first byte carries the
/// properties), decoded by liblzma itself.
#[allow(unsafe_code)] // calls liblzma
fn lzma(src: &[u8], dst: &mut [u8]) -> Result<usize, Error> {
    use liblzma_sys as x;
    // No match reaches further back than the output: a dictionary as large as the output
    // is as good as the encoder's, and keeps memory at the output's size.
    let dict = dst
        .len()
        .clamp(LZMA_MIN_DICT_SIZE, LZMA_MAX_DICT_SIZE)
        .next_multiple_of(16) as u32;
    let (init, ret, written);
    // SAFETY: an all-zero lzma_stream is LZMA_STREAM_INIT. The stream's buffers point into
    // `src` and `dst`, which outlive it, with their true lengths, so liblzma reads and
    // writes only inside them; lzma_end frees what the decoder allocated, on every path.
    unsafe {
        let mut strm: x::lzma_stream = std::mem::zeroed();
        init = x::lzma_microlzma_decoder(&mut strm, src.len() as u64, dst.len() as u64, 0, dict);
        if init == x::LZMA_OK {
            strm.next_in = src.as_ptr();
            strm.avail_in = src.len();
            strm.next_out = dst.as_mut_ptr();
            strm.avail_out = dst.len();
            ret = x::lzma_code(&mut strm, x::LZMA_FINISH);
            written = dst.len() - strm.avail_out;
        } else {
            ret = init;
            written = 0;
        }
        x::lzma_end(&mut strm);
    }
    match (init, ret) {
        (x::LZMA_OK, x::LZMA_STREAM_END | x::LZMA_OK) => Ok(written),
        (x::LZMA_OK, r) => Err(corrupt(Algorithm::Lzma, format!("liblzma error {r}"))),
        (r, _) => Err(Error::Compressor(
            Algorithm::Lzma,
            format!("decoder init failed ({r})"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Text-like, compressible, and not periodic enough to be trivial.
    fn sample(n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n);
        let mut x = 0x1234_5678u32;
        while v.len() < n {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            let word = ["erofs ", "verity ", "cluster ", "lz4 ", "\n", "zstd "][x as usize % 6];
            v.extend_from_slice(word.as_bytes());
        }
        v.truncate(n);
        v
    }

    fn lz4_block(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        lzzzz::lz4::compress_to_vec(data, &mut out, lzzzz::lz4::ACC_LEVEL_DEFAULT).unwrap();
        out
    }

    fn raw_deflate(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    /// With the window the kernel accepts, as an EROFS writer must.
    fn zstd_frame(data: &[u8]) -> Vec<u8> {
        let mut c = zstd::bulk::Compressor::new(3).unwrap();
        c.set_parameter(zstd::stream::raw::CParameter::WindowLog(20))
            .unwrap();
        c.compress(data).unwrap()
    }

    #[allow(unsafe_code)] // calls liblzma
    fn microlzma(data: &[u8]) -> Vec<u8> {
        use liblzma_sys as x;
        let mut out = vec![0u8; data.len() + 1024];
        let written;
        // SAFETY: test-only encoder call; buffers are valid for their stated lengths.
        unsafe {
            let mut opts: x::lzma_options_lzma = std::mem::zeroed();
            assert_eq!(x::lzma_lzma_preset(&mut opts, 6), 0);
            opts.dict_size = 1 << 16;
            let mut strm: x::lzma_stream = std::mem::zeroed();
            assert_eq!(x::lzma_microlzma_encoder(&mut strm, &opts), x::LZMA_OK);
            strm.next_in = data.as_ptr();
            strm.avail_in = data.len();
            strm.next_out = out.as_mut_ptr();
            strm.avail_out = out.len();
            assert_eq!(x::lzma_code(&mut strm, x::LZMA_FINISH), x::LZMA_STREAM_END);
            assert_eq!(strm.avail_in, 0);
            written = out.len() - strm.avail_out;
            x::lzma_end(&mut strm);
        }
        out.truncate(written);
        out
    }

    type Encoder = fn(&[u8]) -> Vec<u8>;

    fn encoders() -> Vec<(Algorithm, Encoder)> {
        vec![
            (Algorithm::Lz4, lz4_block),
            (Algorithm::Lzma, microlzma),
            (Algorithm::Deflate, raw_deflate),
            (Algorithm::Zstd, zstd_frame),
        ]
    }

    #[test]
    fn round_trips_whole_and_prefix() {
        for (alg, enc) in encoders() {
            for n in [1, 100, 4096, 65536, 300_000] {
                let data = sample(n);
                let packed = enc(&data);
                let mut out = vec![0u8; n];
                decompress(alg, &packed, &mut out).unwrap_or_else(|e| panic!("{alg} {n}: {e}"));
                assert_eq!(out, data, "{alg} {n}");
                // A prefix, as for a partially referenced cluster.
                let k = n / 3 + 1;
                let mut part = vec![0u8; k];
                decompress(alg, &packed, &mut part).unwrap_or_else(|e| panic!("{alg} {k}: {e}"));
                assert_eq!(part, data[..k], "{alg} prefix {k}");
            }
        }
    }

    #[test]
    fn trailing_bytes_after_the_stream_are_ignored() {
        for (alg, enc) in encoders() {
            let data = sample(5000);
            let mut packed = enc(&data);
            packed.extend_from_slice(&[0xAB; 300]);
            let mut out = vec![0u8; data.len()];
            decompress(alg, &packed, &mut out).unwrap_or_else(|e| panic!("{alg}: {e}"));
            assert_eq!(out, data);
        }
    }

    #[test]
    fn asking_more_than_the_stream_holds_is_corrupt() {
        for (alg, enc) in encoders() {
            let data = sample(5000);
            let packed = enc(&data);
            let mut out = vec![0u8; data.len() + 1];
            let e = decompress(alg, &packed, &mut out).unwrap_err();
            assert!(matches!(e, Error::Corrupt(a, _) if a == alg), "{alg}: {e}");
        }
    }

    #[test]
    fn truncated_input_is_corrupt() {
        for (alg, enc) in encoders() {
            let data = sample(20000);
            let packed = enc(&data);
            for cut in [0, 1, packed.len() / 2, packed.len() - 1] {
                let mut out = vec![0u8; data.len()];
                // The last byte may hold only an end marker (DEFLATE's end-of-block code):
                // then every byte is out already, and right.
                match decompress(alg, &packed[..cut], &mut out) {
                    Ok(()) => assert!(cut + 1 == packed.len() && out == data, "{alg} {cut}"),
                    Err(e) => assert!(matches!(e, Error::Corrupt(a, _) if a == alg), "{e}"),
                }
            }
        }
    }

    #[test]
    fn garbage_never_panics() {
        let mut x = 0x9E37_79B9u32;
        for (alg, enc) in encoders() {
            let good = enc(&sample(3000));
            for round in 0..300 {
                let mut bytes = good.clone();
                // Flip a few bytes (more as rounds go on), sometimes replace all of them.
                for _ in 0..=round % 7 {
                    x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    let i = x as usize % bytes.len();
                    bytes[i] ^= (x >> 24) as u8 | 1;
                }
                if round % 50 == 0 {
                    bytes.iter_mut().for_each(|b| *b = (x >> 3) as u8);
                }
                let mut out = vec![0u8; 3000];
                // Either an error or exactly 3000 bytes; never a panic or a write past `out`.
                let _ = decompress(alg, &bytes, &mut out);
            }
        }
    }

    #[test]
    fn a_bomb_fills_only_dst() {
        // 64 MiB of zeros in a few KiB: the decoder must stop at dst, not inflate it all.
        let zeros = vec![0u8; 64 << 20];
        for (alg, enc) in encoders() {
            if alg == Algorithm::Lzma {
                continue; // the test encoder's buffer sizing is for ordinary data
            }
            let packed = enc(&zeros);
            assert!(packed.len() < 1 << 20, "{alg}: {}", packed.len());
            let mut out = vec![1u8; 4096];
            decompress(alg, &packed, &mut out).unwrap_or_else(|e| panic!("{alg}: {e}"));
            assert!(out.iter().all(|&b| b == 0), "{alg}");
        }
    }

    #[test]
    fn zstd_window_over_the_kernel_limit_is_refused() {
        // A frame made with a 2 MiB window and no content size: the kernel would refuse it.
        let data = sample(3 << 20);
        let mut c = zstd::stream::raw::Encoder::new(3).unwrap();
        use zstd::stream::raw::CParameter;
        c.set_parameter(CParameter::WindowLog(21)).unwrap();
        c.set_parameter(CParameter::ContentSizeFlag(false)).unwrap();
        let mut w = zstd::stream::zio::Writer::new(Vec::new(), c);
        w.write_all(&data).unwrap();
        w.finish().unwrap();
        let packed = w.into_inner().0;
        let mut out = vec![0u8; data.len()];
        let e = decompress(Algorithm::Zstd, &packed, &mut out).unwrap_err();
        assert!(matches!(e, Error::Corrupt(Algorithm::Zstd, _)), "{e}");
    }

    #[test]
    fn empty_dst_and_empty_src() {
        for alg in Algorithm::ALL {
            decompress(alg, &[], &mut []).unwrap();
            assert!(decompress(alg, &[], &mut [0u8; 4]).is_err());
        }
    }
}
