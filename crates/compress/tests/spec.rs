//! Compressor specs, dictionary defaults and config records (format doc §1.5).

use ferofs_compress::*;

fn p(s: &str) -> CompressorSpec {
    CompressorSpec::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
}

#[test]
fn parse_forms() {
    let s = p("lz4");
    assert_eq!((s.encoder, s.level, s.dict_size), (Encoder::Lz4, 1, None));
    let s = p("lz4hc");
    assert_eq!((s.encoder, s.level), (Encoder::Lz4hc, 9));
    let s = p("lz4hc,level=12");
    assert_eq!((s.encoder, s.level), (Encoder::Lz4hc, 12));
    let s = p("zstd,15");
    assert_eq!((s.encoder, s.level), (Encoder::Zstd, 15));
    let s = p("zstd,level=-3,window=64k");
    assert_eq!((s.level, s.dict_size), (-3, Some(65536)));
    let s = p("lzma,level=6,dictsize=1048576");
    assert_eq!(
        (s.encoder, s.level, s.dict_size),
        (Encoder::Lzma, 6, Some(1 << 20))
    );
    let s = p("lzma,9e");
    assert_eq!(s.level, 109);
    let s = p("lzma,level=105,dictsize=8m");
    assert_eq!((s.level, s.dict_size), (105, Some(8 << 20)));
    let s = p("deflate,level=9");
    assert_eq!((s.encoder, s.level), (Encoder::Deflate, 9));
    assert_eq!(p("deflate").level, 6);
    assert_eq!(p("zstd").level, 3);
    assert_eq!(p("lzma").level, 6);
    // Display is parseable back.
    for s in [
        "lz4hc,level=3",
        "lzma,level=109,dictsize=65536",
        "zstd,level=-1",
    ] {
        assert_eq!(p(&p(s).to_string()), p(s));
    }
}

#[test]
fn parse_errors() {
    for bad in [
        "",
        "brotli",
        "lz4hc,13",
        "lz4hc,0",
        "lz4,2",
        "lzma,10",
        "lzma,110",
        "lzma,10e",
        "zstd,23",
        "zstd,foo=1",
        "zstd,level=x",
        "deflate,0",
        "deflate,13",
        "lzma,dictsize=2048",
        "lzma,dictsize=16m",
        "zstd,dictsize=3000",
        "zstd,dictsize=2m",
        "deflate,dictsize=16384",
        "lz4,dictsize=65536",
        "zstd,dictsize=99999999999",
    ] {
        assert!(CompressorSpec::parse(bad).is_err(), "{bad:?} accepted");
    }
    let e = CompressorSpec::parse("lz4hc,13").expect_err("level");
    assert_eq!(e.to_string(), "lz4hc: level 13 out of range 1..=12");
}

#[test]
fn dictionary_defaults_follow_mkfs() {
    // LZMA: clamp(pcluster * 4, 32 KiB, 8 MiB).
    assert_eq!(p("lzma").effective_dict(4096), 32 << 10);
    assert_eq!(p("lzma").effective_dict(65536), 256 << 10);
    assert_eq!(p("lzma").effective_dict(1 << 20), 4 << 20);
    assert_eq!(p("lzma,dictsize=8m").effective_dict(4096), 8 << 20);
    // Zstd: min(1 MiB, pow2floor(pcluster * 8)).
    assert_eq!(p("zstd").effective_dict(4096), 32 << 10);
    assert_eq!(p("zstd").effective_dict(12288), 64 << 10);
    assert_eq!(p("zstd").effective_dict(131072), 1 << 20);
    assert_eq!(p("zstd").effective_dict(1 << 20), 1 << 20);
    assert_eq!(p("zstd,window=4k").effective_dict(1 << 20), 4096);
    // DEFLATE: always the 32 KiB window; LZ4: 64 KiB - 1.
    assert_eq!(p("deflate").effective_dict(4096), 32768);
    assert_eq!(p("lz4hc").effective_dict(1 << 20), 65535);
}

#[test]
fn config_records() {
    // The example from the format doc: -zlz4 -C16384 on 4 KiB blocks.
    assert_eq!(
        config_record(Algorithm::Lz4, 65535, 4),
        [0xff, 0xff, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(
        config_record(Algorithm::Lzma, 4 << 20, 1),
        [0, 0, 0x40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(
        config_record(Algorithm::Deflate, 32768, 1),
        [15, 0, 0, 0, 0, 0]
    );
    assert_eq!(
        config_record(Algorithm::Zstd, 1 << 20, 1),
        [0, 10, 0, 0, 0, 0]
    );
    assert_eq!(
        config_record(Algorithm::Zstd, 32 << 10, 1),
        [0, 5, 0, 0, 0, 0]
    );
    // A window that is not a power of two is declared rounded up, never down.
    assert_eq!(config_record(Algorithm::Zstd, 40 << 10, 1)[1], 6);
}

#[test]
fn algorithm_ids() {
    for id in 0..4u8 {
        let a = Algorithm::from_id(id).expect("id");
        assert_eq!(a.id(), id);
        assert!(a.is_built());
    }
    assert_eq!(Algorithm::from_id(4), None);
    assert_eq!(Encoder::Lz4hc.algorithm(), Algorithm::Lz4);
}
