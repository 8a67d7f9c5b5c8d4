//! Bad streams are errors, never panics or runaway allocations: truncation, bit flips,
//! garbage, wrong output sizes, bad config.

mod common;
use common::*;
use ferofs_compress::*;

const ALL: [Algorithm; 4] = [
    Algorithm::Lz4,
    Algorithm::Lzma,
    Algorithm::Deflate,
    Algorithm::Zstd,
];

fn encoder_for(alg: Algorithm) -> &'static str {
    match alg {
        Algorithm::Lz4 => "lz4hc",
        Algorithm::Lzma => "lzma,6",
        Algorithm::Deflate => "deflate,6",
        Algorithm::Zstd => "zstd,3",
    }
}

/// A valid stream of `cap` bytes at most from text, with its decoded length and input.
fn sample(alg: Algorithm, cap: usize) -> (Vec<u8>, usize, Vec<u8>, DecompressConfig) {
    let spec = spec(encoder_for(alg));
    let input = text(cap * 12, 11);
    let mut c = new_compressor(&spec, cap as u32).expect("compressor");
    let mut dst = vec![0u8; cap];
    let (consumed, written) = c.compress_destsize(&input, &mut dst);
    assert!(consumed > cap, "{alg:?}");
    dst.truncate(written);
    (dst, consumed, input, cfg(&spec, cap))
}

#[test]
fn truncated_streams_fail() {
    for alg in ALL {
        let (stream, consumed, _, cfg) = sample(alg, 4096);
        for cut in (0..stream.len()).step_by(7).chain([stream.len() - 1]) {
            let mut out = vec![0u8; consumed];
            let r = decompress(alg, &stream[..cut], &mut out, false, &cfg);
            assert!(
                r.is_err(),
                "{alg:?}: truncated to {cut} of {} decoded",
                stream.len()
            );
            let r = decompress(alg, &stream[..cut], &mut out, true, &cfg);
            assert!(r.is_err(), "{alg:?}: partial, truncated to {cut} decoded");
        }
        let mut out = vec![0u8; consumed];
        let e = decompress(alg, &[], &mut out, false, &cfg).expect_err("empty");
        assert_eq!(e.kind, ErrorKind::Empty);
        assert_eq!(e.alg, alg);
    }
}

#[test]
fn wrong_output_sizes_fail_whole_decodes() {
    for alg in ALL {
        let (stream, consumed, input, cfg) = sample(alg, 16384);
        // Longer than the stream holds: Short (or a codec error), whole or partial.
        for partial in [false, true] {
            let mut out = vec![0u8; consumed + 1];
            let e = decompress(alg, &stream, &mut out, partial, &cfg).expect_err("longer");
            assert_eq!(e.alg, alg);
        }
        // Shorter: fine as a prefix, an error as a whole extent.
        let mut out = vec![0u8; consumed - 1];
        let e = decompress(alg, &stream, &mut out, false, &cfg).expect_err("shorter");
        assert!(
            matches!(e.kind, ErrorKind::TooLong | ErrorKind::Corrupt(_)),
            "{alg:?}: {e}"
        );
        decompress(alg, &stream, &mut out, true, &cfg).expect("prefix");
        assert!(out == input[..consumed - 1]);
        // Zero-length output.
        let mut none = [0u8; 0];
        assert!(
            decompress(alg, &stream, &mut none, false, &cfg).is_err(),
            "{alg:?}"
        );
    }
}

#[test]
fn bit_flips_never_panic() {
    for alg in ALL {
        let (stream, consumed, input, cfg) = sample(alg, 4096);
        let mut rng = Rng(0x5eed ^ alg.id() as u64);
        let (mut errors, mut same) = (0, 0);
        for i in 0..1500 {
            let mut bad = stream.clone();
            for _ in 0..1 + i % 3 {
                let at = rng.below(bad.len());
                bad[at] ^= 1 << rng.below(8);
            }
            let mut out = vec![0u8; consumed];
            match decompress(alg, &bad, &mut out, i % 2 == 0, &cfg) {
                Err(e) => {
                    assert_eq!(e.alg, alg);
                    assert!(!e.to_string().is_empty());
                    errors += 1;
                }
                // LZ4 and DEFLATE have no checksum: a flipped literal decodes to
                // another byte. Still exactly the requested size.
                Ok(()) => same += usize::from(out == input[..consumed]),
            }
        }
        assert!(errors > 0, "{alg:?}: no flip was detected");
        let _ = same;
    }
}

#[test]
fn garbage_never_panics() {
    let mut rng = Rng(42);
    let cfg = DecompressConfig { lzma_dict: 1 << 20 };
    for alg in ALL {
        for len in [1usize, 2, 4, 5, 6, 13, 64, 300, 4096, 70000] {
            for _ in 0..20 {
                let mut junk: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                // Also try junk behind a plausible header.
                if rng.below(2) == 0 {
                    match alg {
                        Algorithm::Zstd if len >= 4 => {
                            junk[..4].copy_from_slice(&[0x28, 0xb5, 0x2f, 0xfd])
                        }
                        Algorithm::Lzma => junk[0] = !0x5d,
                        _ => {}
                    }
                }
                for out_len in [1usize, 4096, 1 << 20] {
                    let mut out = vec![0u8; out_len];
                    let _ = decompress(alg, &junk, &mut out, false, &cfg);
                    let _ = decompress(alg, &junk, &mut out, true, &cfg);
                }
            }
        }
    }
}

#[test]
fn zstd_rejects_other_frames() {
    let cfg = DecompressConfig::default();
    // A skippable frame (magic 0x184D2A50, 4-byte length, payload) holds no data.
    let mut skippable = vec![0x50, 0x2a, 0x4d, 0x18, 4, 0, 0, 0, 1, 2, 3, 4];
    let mut out = vec![0u8; 16];
    let e = decompress(Algorithm::Zstd, &skippable, &mut out, true, &cfg).expect_err("skip");
    assert!(matches!(e.kind, ErrorKind::Corrupt(_)), "{e}");
    skippable[0] = 0x28;
    assert!(decompress(Algorithm::Zstd, &skippable, &mut out, true, &cfg).is_err());
}

#[test]
fn lzma_dictionary_limits() {
    let (stream, consumed, input, _) = sample(Algorithm::Lzma, 4096);
    let mut out = vec![0u8; consumed];
    for bad in [1024u32, 16 << 20] {
        let cfg = DecompressConfig { lzma_dict: bad };
        let e = decompress(Algorithm::Lzma, &stream, &mut out, false, &cfg).expect_err("dict");
        assert!(matches!(e.kind, ErrorKind::BadConfig(_)), "{e}");
    }
    // 0 (unknown) means the maximum, which decodes anything valid.
    let cfg = DecompressConfig { lzma_dict: 0 };
    decompress(Algorithm::Lzma, &stream, &mut out, false, &cfg).expect("dict 0");
    assert!(out == input[..consumed]);
}

#[test]
fn errors_say_what_and_where() {
    let e = DecompressError {
        alg: Algorithm::Zstd,
        kind: ErrorKind::Short {
            produced: 10,
            wanted: 20,
        },
    };
    assert_eq!(e.to_string(), "zstd: stream decodes to 10 bytes, 20 wanted");
}
