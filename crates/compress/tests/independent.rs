//! Our streams checked by decoders other than the ones this crate uses: Python's `lzma`
//! module for MicroLZMA (format doc §9.3) and a window-limited zstd decoder for the
//! declared zstd window (§1.5).

mod common;
use common::*;
use ferofs_compress::*;
use std::process::Command;

fn python_has_lzma() -> bool {
    Command::new("python3")
        .args(["-c", "import lzma"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// MicroLZMA = raw LZMA1 whose first byte is !props instead of the range coder's
/// leading 0x00: Python decodes `0x00 + data[1..]` with lc/lp/pb from !data[0].
#[test]
fn microlzma_decodes_with_python_lzma() {
    if !python_has_lzma() {
        eprintln!("SKIPPED: python3 with the lzma module is not available");
        return;
    }
    let script = r#"
import lzma, sys
path, dict_size, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
data = open(path, "rb").read()
props = (~data[0]) & 0xFF
lc, lp, pb = props % 9, (props // 9) % 5, props // 45
d = lzma.LZMADecompressor(format=lzma.FORMAT_RAW, filters=[{"id": lzma.FILTER_LZMA1,
    "dict_size": dict_size, "lc": lc, "lp": lp, "pb": pb}])
sys.stdout.buffer.write(d.decompress(b"\x00" + data[1:], max_length=n))
"#;
    let dir = std::env::temp_dir().join(format!("ferofs-compress-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    for (s, cap) in [
        ("lzma,6", 4096usize),
        ("lzma,9e", 16384),
        ("lzma,0", 131072),
    ] {
        let spec = spec(s);
        let input = mixed(cap * 10, 21);
        let mut c = new_compressor(&spec, cap as u32).expect("compressor");
        let mut dst = vec![0u8; cap];
        let (consumed, written) = c.compress_destsize(&input, &mut dst);
        assert!(consumed > cap, "{s}");
        // Properties byte of the default lc=3, lp=0, pb=2: (2*5+0)*9+3 = 93 = 0x5d.
        assert_eq!(dst[0], !0x5d, "{s}: first byte is !props");
        let path = dir.join("stream");
        std::fs::write(&path, &dst[..written]).expect("write");
        let dict = spec.effective_dict(cap as u32);
        let out = Command::new("python3")
            .args(["-c", script])
            .arg(&path)
            .arg(dict.to_string())
            .arg(consumed.to_string())
            .output()
            .expect("python3");
        assert!(
            out.status.success(),
            "{s}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            out.stdout.len(),
            consumed,
            "{s}: python decoded a different length"
        );
        assert!(
            out.stdout == input[..consumed],
            "{s}: python decodes other bytes"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The window a zstd frame header declares (RFC 8878 §3.1.1.1): the window descriptor,
/// or the content size for a single-segment frame.
fn frame_window(stream: &[u8]) -> u64 {
    let fhd = stream[4];
    if fhd & 0x20 != 0 {
        // Single segment: Frame_Content_Size follows (no dictionary id here).
        let fcs_len = [1usize, 2, 4, 8][usize::from(fhd >> 6)];
        let mut v = [0u8; 8];
        v[..fcs_len].copy_from_slice(&stream[5..5 + fcs_len]);
        let fcs = u64::from_le_bytes(v);
        return if fcs_len == 2 { fcs + 256 } else { fcs };
    }
    let wd = stream[5];
    let base = 1u64 << (10 + (wd >> 3));
    base + base / 8 * u64::from(wd & 7)
}

/// Decode with libzstd limited to a `log` window, feeding the input a few bytes at a
/// time (a frame that is wholly present is decoded in one pass, which skips the check).
fn zstd_decodes_within(stream: &[u8], out_len: usize, log: u32) -> bool {
    let mut d = zstd_safe::DCtx::create();
    d.set_parameter(zstd_safe::DParameter::WindowLogMax(log))
        .expect("param");
    let mut out = vec![0u8; out_len];
    let mut output = zstd_safe::OutBuffer::around(&mut out[..]);
    let mut fed = 0;
    while fed < stream.len() {
        let end = (fed + 3).min(stream.len());
        let mut input = zstd_safe::InBuffer::around(&stream[fed..end]);
        while input.pos() < end - fed {
            match d.decompress_stream(&mut output, &mut input) {
                Ok(0) => return output.pos() == out_len,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
        fed = end;
    }
    false
}

#[test]
fn zstd_window_stays_within_the_declared_one() {
    for (cap, input) in [
        (4096usize, vec![0u8; 1 << 20]),
        (4096, text(200_000, 4)),
        (16384, mixed(4 << 20, 4)),
    ] {
        let spec = spec("zstd,19");
        let window = spec.effective_dict(cap as u32);
        let rec = config_record(Algorithm::Zstd, window, 1);
        let log = u32::from(rec[1]) + 10;
        assert_eq!(1u32 << log, window);
        let mut c = new_compressor(&spec, cap as u32).expect("compressor");
        let mut dst = vec![0u8; cap];
        let (consumed, written) = c.compress_destsize(&input, &mut dst);
        let stream = &dst[..written];
        let declared = frame_window(stream);
        assert!(
            declared <= u64::from(window),
            "frame window {declared} > {window}"
        );
        assert!(zstd_decodes_within(stream, consumed, log));
        if consumed > window as usize {
            // The frame uses the whole declared window, so the checks above can fail:
            // a decoder limited to half of it refuses the frame.
            assert_eq!(declared, u64::from(window));
            assert!(!zstd_decodes_within(stream, consumed, log - 1));
        }
    }
}

/// DEFLATE streams never reach back further than 32 KiB (windowbits 15): libdeflate
/// and miniz_oxide agree on every stream we make, whole and in pieces.
#[test]
fn deflate_two_inflaters_agree() {
    let input = mixed(2 << 20, 8);
    let spec = spec("deflate,12");
    let cap = 1 << 20;
    let mut c = new_compressor(&spec, cap as u32).expect("compressor");
    let mut dst = vec![0u8; cap];
    let (consumed, written) = c.compress_destsize(&input, &mut dst);
    let cfg = DecompressConfig::default();
    let mut whole = vec![0u8; consumed];
    decompress(Algorithm::Deflate, &dst[..written], &mut whole, false, &cfg).expect("whole");
    let mut part = vec![0u8; consumed];
    decompress(Algorithm::Deflate, &dst[..written], &mut part, true, &cfg).expect("partial");
    assert!(whole == part && whole == input[..consumed]);
}
