//! Every encoder x pcluster size x input kind: the stream fits the pcluster, never
//! starts with 0x00, decodes (whole and partially) to exactly the consumed prefix, and
//! the consumed prefix is (near-)maximal.

mod common;
use common::*;
use ferofs_compress::*;

/// Exact one-shot compressed size of `data` with the settings the search uses, computed
/// independently of the crate's compressor objects (DEFLATE: libdeflate, levels 10-12).
fn oneshot_size(spec: &CompressorSpec, cap: usize, data: &[u8]) -> usize {
    match spec.encoder {
        Encoder::Zstd => {
            let mut c = zstd_safe::CCtx::create();
            let wlog = spec.effective_dict(cap as u32).ilog2();
            c.set_parameter(zstd_safe::CParameter::CompressionLevel(spec.level))
                .expect("level");
            c.set_parameter(zstd_safe::CParameter::WindowLog(wlog))
                .expect("window");
            c.set_parameter(zstd_safe::CParameter::ContentSizeFlag(false))
                .expect("no content size");
            let mut out = vec![0u8; zstd_safe::compress_bound(data.len())];
            c.compress2(&mut out[..], data).expect("zstd")
        }
        Encoder::Deflate => {
            let lvl = libdeflater::CompressionLvl::new(spec.level).expect("level");
            let mut c = libdeflater::Compressor::new(lvl);
            let mut out = vec![0u8; c.deflate_compress_bound(data.len())];
            c.deflate_compress(data, &mut out).expect("deflate")
        }
        _ => unreachable!(),
    }
}

fn check(spec_str: &str) {
    let spec = spec(spec_str);
    let alg = spec.encoder.algorithm();
    for cap in CAPS {
        let mut c = new_compressor(&spec, cap as u32).expect("compressor");
        assert_eq!(c.algorithm(), alg);
        let cfg = cfg(&spec, cap);
        for (kind, input) in inputs(cap) {
            let what = format!("{spec_str} cap {cap} {kind}");
            let mut dst = vec![0xAAu8; cap];
            let (consumed, written) = c.compress_destsize(&input, &mut dst);
            if consumed == 0 {
                // Only allowed when nothing useful fits: incompressible input.
                assert_eq!(written, 0, "{what}");
                assert!(kind == "random", "{what}: nothing consumed");
                continue;
            }
            assert!(written > 0 && written <= cap, "{what}: wrote {written}");
            assert!(consumed <= input.len(), "{what}");
            assert_ne!(dst[0], 0, "{what}: stream starts with 0x00");
            let stream = &dst[..written];

            // Whole decode gives exactly the consumed prefix.
            let mut out = vec![0u8; consumed];
            decompress(alg, stream, &mut out, false, &cfg)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(out == input[..consumed], "{what}: roundtrip differs");

            // Partial decodes give the right prefixes.
            for want in [1, 100.min(consumed), consumed / 2, consumed - 1, consumed] {
                let mut part = vec![0u8; want];
                decompress(alg, stream, &mut part, true, &cfg)
                    .unwrap_or_else(|e| panic!("{what}: partial {want}: {e}"));
                assert!(part == input[..want], "{what}: partial {want} differs");
            }

            match kind {
                "random" => {
                    // No real gain is possible: at most what fits stored.
                    assert!(consumed <= cap + cap / 64, "{what}: {consumed} bytes");
                    continue;
                }
                "zeros" => assert_eq!(consumed, input.len(), "{what}: zeros not all taken"),
                _ => assert!(consumed > cap + cap / 2, "{what}: consumed only {consumed}"),
            }
            if consumed == input.len() {
                continue;
            }
            // Maximality.
            let searched = match spec.encoder {
                Encoder::Zstd => true,
                Encoder::Deflate => spec.level > 9,
                _ => false,
            };
            match spec.encoder {
                _ if searched => {
                    // zstd fills pclusters of STREAM_MIN_CAP and more piece by piece
                    // (zstd_codec.rs): not a one-shot frame, and up to about 1 % short
                    // of the longest prefix a one-shot frame could hold.
                    let pieces = spec.encoder == Encoder::Zstd && cap >= STREAM_MIN_CAP;
                    if !pieces {
                        assert_eq!(
                            oneshot_size(&spec, cap, &input[..consumed]),
                            written,
                            "{what}"
                        );
                    }
                    // DEFLATE may leave max(16, cap/512) bytes unused (search.rs).
                    let frac = if pieces {
                        100
                    } else if spec.encoder == Encoder::Deflate {
                        200
                    } else {
                        1000
                    };
                    let more = (consumed + (consumed / frac).max(300)).min(input.len());
                    let size = oneshot_size(&spec, cap, &input[..more]);
                    assert!(
                        size > cap,
                        "{what}: {more} bytes ({} more than taken) still fit in {size}",
                        more - consumed
                    );
                }
                // Native fixed-output encoders (DEFLATE 1-9: ours) fill the pcluster.
                _ => assert!(
                    cap - written <= 16 + cap / 1024,
                    "{what}: {written} of {cap} bytes used"
                ),
            }
        }
    }
}

#[test]
fn lz4() {
    check("lz4");
}
#[test]
fn lz4hc_9() {
    check("lz4hc");
}
#[test]
fn lz4hc_12() {
    check("lz4hc,12");
}
#[test]
fn lzma_6() {
    check("lzma,6");
}
#[test]
fn lzma_0() {
    check("lzma,0");
}
#[test]
fn deflate_6() {
    check("deflate,6");
}
#[test]
fn deflate_1() {
    check("deflate,1");
}
#[test]
fn deflate_9() {
    check("deflate,9");
}
/// libdeflate's near-optimal parser with the prefix search.
#[test]
fn deflate_12() {
    check("deflate,12");
}
#[test]
fn zstd_3() {
    check("zstd,3");
}
#[test]
fn zstd_15() {
    check("zstd,15");
}
#[test]
fn zstd_neg5() {
    check("zstd,-5");
}

/// The builder's loop: consecutive pclusters over a long mixed input with one
/// compressor (contexts and search state reused), each decoding back.
#[test]
fn consecutive_pclusters() {
    let data = mixed(3 << 20, 9);
    for s in SPECS {
        let spec = spec(s);
        for cap in [4096usize, 65536] {
            let mut c = new_compressor(&spec, cap as u32).expect("compressor");
            let cfg = cfg(&spec, cap);
            let mut dst = vec![0u8; cap];
            let (mut pos, mut compressed) = (0, 0);
            while pos < data.len() {
                let src = &data[pos..data.len().min(pos + (4 << 20))];
                let (consumed, written) = c.compress_destsize(src, &mut dst);
                if consumed <= cap {
                    pos += cap.min(src.len()); // stored uncompressed
                    continue;
                }
                let mut out = vec![0u8; consumed];
                decompress(
                    spec.encoder.algorithm(),
                    &dst[..written],
                    &mut out,
                    false,
                    &cfg,
                )
                .unwrap_or_else(|e| panic!("{s} {cap} at {pos}: {e}"));
                assert!(out == src[..consumed], "{s} {cap} at {pos}: differs");
                pos += consumed;
                compressed += 1;
            }
            assert!(compressed > 0, "{s} {cap}");
        }
    }
}

/// A stream that libdeflate (levels 10-12) opens with a non-final stored block (first
/// byte 0x00) is patched to start with a non-zero byte (a padding bit) and still
/// decodes with both inflaters.
#[test]
fn deflate_leading_stored_block() {
    let mut data = random(100_000, 5);
    data.extend_from_slice(&text(3_000_000, 6));
    let spec = spec("deflate,10");
    let cap = 1 << 20;
    let mut c = new_compressor(&spec, cap as u32).expect("compressor");
    let mut dst = vec![0u8; cap];
    let (consumed, written) = c.compress_destsize(&data, &mut dst);
    assert!(consumed > 1_000_000, "consumed {consumed}");
    // What libdeflate itself makes of that prefix: a stream opening with 0x00.
    let lvl = libdeflater::CompressionLvl::new(10).expect("level");
    let mut raw = vec![0u8; consumed + consumed / 8 + 1024];
    let n = libdeflater::Compressor::new(lvl)
        .deflate_compress(&data[..consumed], &mut raw)
        .expect("deflate");
    assert_eq!(
        raw[0], 0,
        "precondition: libdeflate starts with a stored block"
    );
    assert_eq!(n, written);
    assert_eq!(dst[0], 0x08, "padding bit set");
    assert!(dst[1..written] == raw[1..n], "only the first byte differs");
    let mut out = vec![0u8; consumed];
    let cfg = DecompressConfig::default();
    decompress(Algorithm::Deflate, &dst[..written], &mut out, false, &cfg).expect("whole");
    assert!(out == data[..consumed]);
    let mut part = vec![0u8; 150_000];
    decompress(Algorithm::Deflate, &dst[..written], &mut part, true, &cfg).expect("partial");
    assert!(part == data[..150_000]);
}

#[test]
fn empty_inputs() {
    for s in SPECS {
        let spec = spec(s);
        let mut c = new_compressor(&spec, 4096).expect("compressor");
        let mut dst = vec![0u8; 4096];
        assert_eq!(c.compress_destsize(&[], &mut dst), (0, 0), "{s}");
        assert_eq!(c.compress_destsize(b"abc", &mut []), (0, 0), "{s}");
        // A short input is taken whole.
        let (consumed, written) = c.compress_destsize(b"hello hello hello", &mut dst);
        assert_eq!(consumed, 17, "{s}");
        let mut out = vec![0u8; 17];
        let cfg = cfg(&spec, 4096);
        decompress(
            spec.encoder.algorithm(),
            &dst[..written],
            &mut out,
            false,
            &cfg,
        )
        .unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(&out, b"hello hello hello");
    }
}

/// After `begin_stream`, a used compressor gives exactly the streams a fresh one gives,
/// whatever it compressed before (the builder relies on this for identical images at
/// any thread count). Histories: random data (ratio ~1), then highly repetitive text.
#[test]
fn begin_stream_forgets_history() {
    for s in ["lz4", "lz4hc,9", "lzma,6", "deflate,6", "zstd,3"] {
        for cap in [4096usize, 65536] {
            let spec = spec(s);
            let input = text(cap * 6, 5);
            let run = |c: &mut Box<dyn FixedOutputCompressor>| {
                let mut out = Vec::new();
                let mut pos = 0;
                let mut dst = vec![0u8; cap];
                while pos < input.len() && out.len() < 4 {
                    let (n, w) = c.compress_destsize(&input[pos..], &mut dst);
                    assert!(n > 0, "{s} {cap}");
                    out.push((n, dst[..w].to_vec()));
                    pos += n;
                }
                out
            };
            let mut fresh = new_compressor(&spec, cap as u32).expect("compressor");
            let want = run(&mut fresh);
            for history in [random(cap * 3, 9), vec![b'a'; cap * 40]] {
                let mut c = new_compressor(&spec, cap as u32).expect("compressor");
                let mut dst = vec![0u8; cap];
                let _ = c.compress_destsize(&history, &mut dst);
                c.begin_stream();
                assert!(run(&mut c) == want, "{s} at {cap}: history leaked");
            }
        }
    }
}

/// lz4hc levels 1 and 2 run as level 3 (liblz4 1.10's "lz4mid" strategy for those
/// levels fills fixed-size outputs worse than plain lz4 on real text): same streams.
#[test]
fn lz4hc_low_levels_run_as_level_3() {
    let input = text(1 << 20, 3);
    let cap = 4096;
    let pack = |s: &str| {
        let mut c = new_compressor(&spec(s), cap as u32).expect("compressor");
        let mut out = Vec::new();
        let mut pos = 0;
        let mut dst = vec![0u8; cap];
        while pos < input.len() {
            let (n, w) = c.compress_destsize(&input[pos..], &mut dst);
            assert!(n > 0, "{s}");
            out.push((n, dst[..w].to_vec()));
            pos += n;
        }
        out
    };
    let want = pack("lz4hc,3");
    for s in ["lz4hc,1", "lz4hc,2"] {
        assert!(pack(s) == want, "{s} differs from lz4hc,3");
    }
}

/// Zstandard frames carry no content size (EROFS knows the decoded size from the
/// index): the frame header descriptor after the magic has Frame_Content_Size_flag 0
/// and Single_Segment_flag 0, so a window descriptor byte follows it.
#[test]
fn zstd_frames_without_content_size() {
    for cap in [4096usize, 131072] {
        let mut c = new_compressor(&spec("zstd,3"), cap as u32).expect("compressor");
        let input = text(cap * 8, 3);
        let mut dst = vec![0u8; cap];
        let (consumed, written) = c.compress_destsize(&input, &mut dst);
        assert!(consumed > cap && written > 6, "cap {cap}");
        assert_eq!(dst[..4], [0x28, 0xb5, 0x2f, 0xfd]);
        assert_eq!(dst[4] & 0xE0, 0, "cap {cap}: FHD {:#04x}", dst[4]);
    }
}

/// zstd at 128 KiB (pieces): a whole stream consumed pcluster by pcluster, through data
/// whose ratio swings (text, random, zeros, mixed, then text again), at levels 3 and 19.
/// Every pcluster fits, decodes to exactly what it consumed, and the compressible parts
/// pack near what one-shot frames hold. At level 3 one frame ends before an overflowing
/// piece (an empty last block) and still decodes.
#[test]
fn zstd_pieces_follow_a_stream() {
    let cap = STREAM_MIN_CAP;
    let mut data = text(cap * 10, 7);
    data.extend(random(cap * 3, 8));
    data.extend(vec![0u8; cap * 5]);
    data.extend(mixed(cap * 6, 9));
    data.extend(text(cap * 6, 10));
    for level in [3, 19] {
        let spec = spec(&format!("zstd,level={level}"));
        let mut c = new_compressor(&spec, cap as u32).expect("compressor");
        c.begin_stream();
        let cfg = cfg(&spec, cap);
        let (mut pos, mut pclusters, mut stored) = (0usize, 0usize, 0usize);
        let mut packed = 0u64;
        let before = PIECE_CONSUMED.load(std::sync::atomic::Ordering::Relaxed);
        let early = PIECE_EARLY_ENDS.load(std::sync::atomic::Ordering::Relaxed);
        // Bounded: each round consumes at least one byte.
        while pos < data.len() {
            let src = &data[pos..(pos + (8 << 20)).min(data.len())];
            let mut dst = vec![0u8; cap];
            let (consumed, written) = c.compress_destsize(src, &mut dst);
            let what = format!("level {level} at {pos}");
            if consumed == 0 {
                // Incompressible here: the caller stores a pcluster's worth.
                assert_eq!(written, 0, "{what}");
                pos += cap.min(src.len());
                stored += 1;
                continue;
            }
            assert!(written > 0 && written <= cap, "{what}: wrote {written}");
            assert!(
                consumed > cap || consumed == src.len(),
                "{what}: {consumed}"
            );
            let mut out = vec![0u8; consumed];
            decompress(Algorithm::Zstd, &dst[..written], &mut out, false, &cfg)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(out == src[..consumed], "{what}: roundtrip differs");
            pos += consumed;
            packed += consumed as u64;
            pclusters += 1;
        }
        // Most of it went through the pieces (counters only grow; other tests add).
        let after = PIECE_CONSUMED.load(std::sync::atomic::Ordering::Relaxed);
        assert!(
            after - before >= packed / 2,
            "level {level}: pieces not used"
        );
        // The random stretch is stored (about 3 pclusters), the rest compresses.
        assert!((2..=4).contains(&stored), "level {level}: {stored} stored");
        assert!(pclusters >= 4, "level {level}: {pclusters} pclusters");
        if level == 3 {
            // A frame ended early (less than SMALL_ROOM left at an overflow) is among
            // those that decoded above.
            let ends = PIECE_EARLY_ENDS.load(std::sync::atomic::Ordering::Relaxed) - early;
            assert!(ends >= 1, "level 3: no frame ended early");
        }
    }
}

/// Refits (ztailpacking's cut back to whole blocks): for every encoder, a file end that
/// compresses to more than a whole number of blocks is compressed again into the blocks
/// below; the new stream fits them, decodes to exactly the prefix it consumed, and that
/// prefix is longer than the room (else storing would do) and shorter than the whole.
/// zstd goes piece by piece from 32 KiB of room and by the search below; both are here.
#[test]
fn refits_cut_a_stream_back_to_whole_blocks() {
    const BS: usize = 4096;
    for spec_str in [
        "lz4",
        "lz4hc,9",
        "lzma,6",
        "deflate,6",
        "deflate,12",
        "zstd,3",
        "zstd,15",
    ] {
        let spec = spec(spec_str);
        let alg = spec.encoder.algorithm();
        let cap = 128 << 10;
        let cfg = cfg(&spec, cap);
        let mut c = new_compressor(&spec, cap as u32).expect("compressor");
        let mut refits = 0;
        // Whole inputs of about 2, 6, 20 and 60 KiB of output.
        for (i, len) in [6_000usize, 20_000, 70_000, 200_000]
            .into_iter()
            .enumerate()
        {
            let input = mixed(len, 40 + i as u64);
            c.begin_stream();
            let mut dst = vec![0u8; cap];
            let (consumed, written) = c.compress_destsize(&input, &mut dst);
            assert_eq!(consumed, len, "{spec_str} {len}: the whole fits");
            if written <= BS || written % BS == 0 {
                continue;
            }
            let room = written / BS * BS;
            let mut again = vec![0u8; room];
            let (c2, w2) = c.refit(&input, &mut again, written);
            let what = format!("{spec_str} {len} -> {written}, refit into {room}");
            assert!(w2 > 0 && w2 <= room, "{what}: wrote {w2}");
            assert!(c2 > room && c2 < len, "{what}: consumed {c2}");
            let mut out = vec![0u8; c2];
            decompress(alg, &again[..w2], &mut out, false, &cfg)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(out == input[..c2], "{what}: roundtrip differs");
            refits += 1;
        }
        assert!(refits >= 2, "{spec_str}: only {refits} refits exercised");
    }
}
