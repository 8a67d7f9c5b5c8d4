//! Every encoder fills a fixed output, never starts a stream with 0x00, and decodes
//! back to exactly the consumed prefix; corrupt streams are errors, not panics.

use ferofs_compress::*;

fn text(n: usize) -> Vec<u8> {
    let words = [
        "erofs ",
        "pcluster ",
        "kernel ",
        "compress ",
        "block ",
        "read-only ",
        "image\n",
        "fixed-size ",
    ];
    let mut v = Vec::with_capacity(n);
    let mut x: u64 = 12345;
    while v.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(words[(x % 8) as usize].as_bytes());
        if x.is_multiple_of(5) {
            v.extend_from_slice(format!("{}", x % 1000).as_bytes());
        }
    }
    v.truncate(n);
    v
}

fn random(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E3779B97F4A7C15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn mixed(n: usize) -> Vec<u8> {
    let mut v = Vec::new();
    while v.len() < n {
        v.extend_from_slice(&text(3000));
        v.extend_from_slice(&random(1000));
        v.extend_from_slice(&[0u8; 2000]);
    }
    v.truncate(n);
    v
}

const SPECS: [&str; 7] = [
    "lz4",
    "lz4hc",
    "lz4hc,12",
    "lzma,6",
    "deflate,9",
    "zstd,3",
    "zstd,15",
];

#[test]
fn fill_and_roundtrip() {
    for spec in SPECS {
        let spec = CompressorSpec::parse(spec).expect("spec");
        for cap in [4096usize, 16384, 65536, 1 << 20] {
            let mut c = new_compressor(&spec, cap as u32).expect("compressor");
            let cfg = DecompressConfig {
                lzma_dict: spec.effective_dict(cap as u32),
            };
            for (kind, input) in [
                ("text", text(cap * 8)),
                ("zeros", vec![0u8; cap * 4]),
                ("mixed", mixed(cap * 6)),
                ("random", random(cap * 2)),
            ] {
                let mut dst = vec![0u8; cap];
                let (consumed, written) = c.compress_destsize(&input, &mut dst);
                if kind == "random" {
                    // Incompressible: either nothing useful, or no real gain.
                    assert!(
                        consumed <= written + cap / 8 || consumed == 0,
                        "{spec} {kind}: {consumed} into {written}"
                    );
                    continue;
                }
                assert!(
                    consumed > cap,
                    "{spec} {cap} {kind}: consumed only {consumed}"
                );
                assert!(written <= cap && written > 0, "{spec} {kind}");
                assert_ne!(dst[0], 0, "{spec} {kind}: stream starts with 0");
                let mut out = vec![0u8; consumed];
                decompress(
                    spec.encoder.algorithm(),
                    &dst[..written],
                    &mut out,
                    false,
                    &cfg,
                )
                .unwrap_or_else(|e| panic!("{spec} {cap} {kind}: {e}"));
                assert!(
                    out == input[..consumed],
                    "{spec} {cap} {kind}: roundtrip differs"
                );
                // Partial decode of a prefix.
                let mut half = vec![0u8; consumed / 2];
                decompress(
                    spec.encoder.algorithm(),
                    &dst[..written],
                    &mut half,
                    true,
                    &cfg,
                )
                .expect("partial");
                assert!(
                    half == input[..consumed / 2],
                    "{spec} {kind}: partial differs"
                );
                // A prefix search must be near-maximal: the compressed size is close to cap.
                assert!(
                    written * 100 >= cap * 95 || consumed == input.len(),
                    "{spec} {cap} {kind}: only {written} of {cap} used"
                );
            }
        }
    }
}

#[test]
fn corrupt_streams_are_errors() {
    for spec in SPECS {
        let spec = CompressorSpec::parse(spec).expect("spec");
        let mut c = new_compressor(&spec, 4096).expect("compressor");
        let input = text(40000);
        let mut dst = vec![0u8; 4096];
        let (consumed, written) = c.compress_destsize(&input, &mut dst);
        let cfg = DecompressConfig {
            lzma_dict: spec.effective_dict(4096),
        };
        let alg = spec.encoder.algorithm();
        let mut x: u64 = 7;
        for i in 0..300 {
            let mut bad = dst[..written].to_vec();
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let at = (x as usize) % bad.len();
            bad[at] ^= 1 << (i % 8);
            if i % 3 == 0 {
                bad.truncate(at.max(1));
            }
            let mut out = vec![0u8; consumed];
            // Must not panic; a result either way is fine, but a "success" must be exact.
            if decompress(alg, &bad, &mut out, false, &cfg).is_ok() && bad.len() == written {
                // bit flips inside literals can decode to other bytes: allowed.
            }
        }
        let mut out = vec![0u8; consumed + 100];
        assert!(
            decompress(alg, &dst[..written], &mut out, false, &cfg).is_err(),
            "{spec}: longer output must fail"
        );
        assert!(decompress(alg, &[], &mut out, false, &cfg).is_err());
    }
}

#[test]
fn spec_parsing() {
    let s = CompressorSpec::parse("lz4hc,level=12").expect("ok");
    assert_eq!((s.encoder, s.level), (Encoder::Lz4hc, 12));
    let s = CompressorSpec::parse("zstd,19").expect("ok");
    assert_eq!((s.encoder, s.level), (Encoder::Zstd, 19));
    let s = CompressorSpec::parse("lzma,level=9,dictsize=1m").expect("ok");
    assert_eq!(s.dict_size, Some(1 << 20));
    assert!(CompressorSpec::parse("lz4hc,13").is_err());
    assert!(CompressorSpec::parse("brotli").is_err());
    assert!(CompressorSpec::parse("zstd,foo=1").is_err());
    assert_eq!(
        config_record(Algorithm::Lz4, 0, 4),
        vec![0xff, 0xff, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(config_record(Algorithm::Zstd, 1 << 20, 1)[1], 10);
    assert_eq!(config_record(Algorithm::Deflate, 32768, 1)[0], 15);
}
