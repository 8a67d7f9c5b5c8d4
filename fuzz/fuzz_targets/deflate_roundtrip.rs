//! ferofs's own DEFLATE encoder (levels 1-9, fixed output size): whatever it writes
//! must inflate, with an independent inflater (miniz_oxide) and with ours, to exactly
//! the prefix it says it consumed.
#![no_main]
use ferofs_compress::{
    decompress, new_compressor, Algorithm, CompressorSpec, DecompressConfig, FixedOutputCompressor,
};
use libfuzzer_sys::fuzz_target;
use std::sync::Mutex;

type Enc = Option<Box<dyn FixedOutputCompressor>>;

/// One encoder per level, reused: each call is independent of the ones before (the
/// encoder's contract), and building one costs more than a small input.
static ENCODERS: Mutex<[Enc; 9]> =
    Mutex::new([None, None, None, None, None, None, None, None, None]);

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let level = 1 + i32::from(data[0] % 9);
    let cap = 16 + (usize::from(data[1]) | usize::from(data[2]) << 8) % 65536;
    let src = &data[3..];
    let mut dst = vec![0u8; cap];
    let (used, written) = {
        let mut encs = ENCODERS.lock().unwrap_or_else(|p| p.into_inner());
        let c = encs[(level - 1) as usize].get_or_insert_with(|| {
            let spec = CompressorSpec::parse(&format!("deflate,level={level}")).expect("spec");
            new_compressor(&spec, 1 << 20).expect("compressor")
        });
        c.begin_stream();
        c.compress_destsize(src, &mut dst)
    };
    assert!(
        used <= src.len() && written <= cap,
        "({used}, {written}) out of range"
    );
    if written == 0 {
        assert_eq!(used, 0);
        return;
    }
    let stream = &dst[..written];
    assert_ne!(stream[0], 0, "stream starts with a zero byte");
    let got = miniz_oxide::inflate::decompress_to_vec_with_limit(stream, used + 1)
        .unwrap_or_else(|e| panic!("miniz_oxide rejects our stream: {e:?}"));
    assert!(got == src[..used], "stream inflates to other bytes");
    let mut out = vec![0u8; used];
    decompress(
        Algorithm::Deflate,
        stream,
        &mut out,
        false,
        &DecompressConfig::default(),
    )
    .unwrap_or_else(|e| panic!("our inflater rejects our stream: {e}"));
    assert!(out == src[..used]);
});
